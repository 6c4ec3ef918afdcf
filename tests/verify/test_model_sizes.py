"""The real-model size table: counted from the real classes, not copied from a model card.

Each component in ``model_configs.COMPONENTS`` is built on the meta device from its
published config (no weights, no hub) and its parameters counted. The counts, bytes,
configs and sources must equal ``labkit/model_sizes.json``, which the pages render.
After a deliberate change (a config, a diffusers or transformers upgrade) rewrite it with
``make verify-refresh`` (which sets INFRALENS_REFRESH_VERSIONS=1).
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import pytest
from model_configs import (
    CLIP_L14_VISION,
    COMPONENTS,
    FLUX_AE_ORIGINAL,
    FLUX_DEV_ORIGINAL,
    FLUX_DEV_TRANSFORMER,
    FLUX_VAE,
    OPEN_CLIP_TEXT_ORIGINAL,
    PUBLISHED,
    PUBLISHED_RTOL,
    QWEN_IMAGE_PUBLISHED,
    QWEN_IMAGE_TRANSFORMER,
    SD3_CLIPG_CONFIG_ORIGINAL,
    SD3_CLIPL_CONFIG_ORIGINAL,
    SD3_MEDIUM_CHECKPOINT_SHAPES,
    SD3_MEDIUM_TRANSFORMER,
    SD3_T5_CONFIG_ORIGINAL,
    SD15_LDM_ORIGINAL,
    SD15_SAFETY_NOTE,
    SD15_UNET,
    SD15_VAE,
    SD35_LARGE_TRANSFORMER,
    SDXL_SGM_ORIGINAL,
    SDXL_UNET,
    SDXL_VAE,
    T5_FP16_NOTE,
    T5_XXL,
    build,
    installed_versions,
    record,
)
from sizes import (
    _pattern,
    atlas_record,
    flux_1024_record,
    layerwise_casting_record,
    wan_vae_decode_record,
)

from labkit import model_sizes

RECORD = Path(model_sizes.__file__).with_name(model_sizes.DATA_FILE)
IDS = [f"{c.pipeline}/{c.component}" for c in COMPONENTS]


@pytest.fixture(scope="module")
def fresh() -> dict:
    """Counted now; written to the data file under INFRALENS_REFRESH_VERSIONS=1."""
    counted = record()
    # added fields (another page reads the components: only add, never rename)
    counted["layerwise_casting"] = layerwise_casting_record()
    counted["flux_1024px"] = flux_1024_record()
    counted["wan_vae_decode_720p"] = wan_vae_decode_record()
    counted["atlas"] = atlas_record()  # docs/handbook/models.md
    if os.environ.get("INFRALENS_REFRESH_VERSIONS") == "1":
        RECORD.write_text(
            json.dumps(counted, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    return counted


@pytest.fixture(scope="module")
def recorded(fresh) -> dict:
    return model_sizes.load()


def _row(data: dict, pipeline: str, component: str) -> dict:
    (row,) = [
        r for r in data["components"] if (r["pipeline"], r["component"]) == (pipeline, component)
    ]
    return row


@pytest.mark.parametrize("component", COMPONENTS, ids=IDS)
def test_recorded_sizes_match_the_real_classes(component, fresh, recorded):
    """Each component built from its config on the meta device has exactly the parameter count the data file records, and its bytes are params × 4 (fp32) or × 2 (fp16, bf16)."""
    now = _row(fresh, component.pipeline, component.component)
    then = _row(recorded, component.pipeline, component.component)
    assert then["params"] == now["params"], "run `make verify-refresh`"
    assert then["bytes"] == {
        k: now["params"] * n for k, n in {"fp32": 4, "fp16": 2, "bf16": 2}.items()
    }
    assert then == now, "config, source or published figure changed: run `make verify-refresh`"


def test_data_file_lists_exactly_the_configured_components(fresh, recorded):
    """The data file (`labkit/model_sizes.json`) holds one row per configured component, in the same order, and nothing else."""
    assert [(r["pipeline"], r["component"]) for r in recorded["components"]] == [
        (r["pipeline"], r["component"]) for r in fresh["components"]
    ]
    assert {k: v for k, v in recorded.items() if k != "components"} == {
        k: v for k, v in fresh.items() if k != "components"
    }


@pytest.mark.parametrize("key", list(PUBLISHED), ids=[f"{p}/{c}" for p, c in PUBLISHED])
def test_counts_agree_with_published_totals(key, fresh):
    """Each counted size agrees with its published, rounded total (a paper, README, blog, release post, model card or docs) within the stated relative tolerance."""
    pipeline, _ = key
    published = PUBLISHED[key]
    counted = sum(_row(fresh, pipeline, name)["params"] for name in published.covers)
    assert counted == pytest.approx(published.params, rel=PUBLISHED_RTOL), (
        f"{key}: counted {counted:,} vs published {published.figure} ({published.source})"
    )


def test_recorded_versions_match_installed(fresh, recorded):
    """The data file names the diffusers, transformers and torch versions that are installed."""
    assert recorded["versions"] == installed_versions(), (
        f"recorded {recorded['versions']} but {installed_versions()} is installed: "
        "run `make verify-refresh`"
    )


def _with_defaults(cls, config: dict) -> dict:
    """``config`` completed with the class's defaults, tuples as lists, sample_size dropped."""
    defaults = {
        name: p.default
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    full = {**defaults, **config}
    full.pop("sample_size", None)  # no learned positions in these models: counts ignore it
    return json.loads(json.dumps(full))  # tuples -> lists


@pytest.mark.parametrize(
    ("original", "unet", "vae"),
    [(SD15_LDM_ORIGINAL, SD15_UNET, SD15_VAE), (SDXL_SGM_ORIGINAL, SDXL_UNET, SDXL_VAE)],
    ids=["SD 1.5", "SDXL"],
)
def test_unet_and_vae_configs_are_diffusers_conversion_of_the_original_yaml(original, unet, vae):
    """diffusers' own single-file conversion of the original SD 1.5 and SDXL YAML configs gives the UNet and VAE configs counted in the table."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from diffusers.loaders.single_file_utils import (
        create_unet_diffusers_config_from_ldm,
        create_vae_diffusers_config_from_ldm,
    )

    derived_unet = create_unet_diffusers_config_from_ldm(original, {})
    derived_vae = create_vae_diffusers_config_from_ldm(original, {})
    assert _with_defaults(UNet2DConditionModel, derived_unet) == _with_defaults(
        UNet2DConditionModel, unet
    )
    assert _with_defaults(AutoencoderKL, derived_vae) == _with_defaults(AutoencoderKL, vae)


def test_flux_and_sd3_configs_follow_the_reference_parameters():
    """The Flux.1-dev configs follow from Black Forest Labs' `FluxParams` and `AutoEncoderParams`, and the SD3 Medium transformer's from the checkpoint shapes diffusers recognises it by: diffusers' `infer_diffusers_model_type` names a checkpoint of the counted SD3 Medium shapes `sd3` and one of the counted SD3.5 Large depth (38 blocks: diffusers looks for block 37, so 37 blocks would not do) `sd35_large`."""
    import torch
    from diffusers.loaders.single_file_utils import infer_diffusers_model_type

    def checkpoint(cfg):  # the original checkpoint's keys diffusers reads, with the counted shapes
        hidden, last = cfg["caption_projection_dim"], cfg["num_layers"] - 1
        shapes = {
            "joint_blocks.0.context_block.adaLN_modulation.1.bias": (6 * hidden,),
            "pos_embed": (1, cfg["pos_embed_max_size"] ** 2, hidden),
            f"joint_blocks.{last}.x_block.mlp.fc1.weight": (4 * hidden, hidden),
        }
        return {k: torch.empty(s, device="meta") for k, s in shapes.items()}

    assert infer_diffusers_model_type(checkpoint(SD3_MEDIUM_TRANSFORMER)) == "sd3"
    assert infer_diffusers_model_type(checkpoint(SD35_LARGE_TRANSFORMER)) == "sd35_large"
    shallower = {**SD35_LARGE_TRANSFORMER, "num_layers": SD35_LARGE_TRANSFORMER["num_layers"] - 1}
    assert infer_diffusers_model_type(checkpoint(shallower)) != "sd35_large"
    medium = checkpoint(SD3_MEDIUM_TRANSFORMER)
    assert (
        medium["joint_blocks.0.context_block.adaLN_modulation.1.bias"].shape[-1]
        == (SD3_MEDIUM_CHECKPOINT_SHAPES["adaLN_modulation_width"])
    )
    assert medium["pos_embed"].shape[1] == SD3_MEDIUM_CHECKPOINT_SHAPES["pos_embed_patches"]
    f, flux = FLUX_DEV_ORIGINAL, FLUX_DEV_TRANSFORMER
    assert flux["num_attention_heads"] == f["num_heads"]
    assert flux["num_attention_heads"] * flux["attention_head_dim"] == f["hidden_size"]
    assert (flux["num_layers"], flux["num_single_layers"]) == (f["depth"], f["depth_single_blocks"])
    assert flux["in_channels"] == f["in_channels"] == f["out_channels"]
    assert flux["joint_attention_dim"] == f["context_in_dim"]
    assert flux["pooled_projection_dim"] == f["vec_in_dim"]
    assert (
        flux["axes_dims_rope"] == f["axes_dim"] and flux["guidance_embeds"] == f["guidance_embed"]
    )
    ae = FLUX_AE_ORIGINAL
    assert FLUX_VAE["block_out_channels"] == [ae["ch"] * m for m in ae["ch_mult"]]
    assert FLUX_VAE["layers_per_block"] == ae["num_res_blocks"]
    assert FLUX_VAE["latent_channels"] == ae["z_channels"]
    assert (FLUX_VAE["scaling_factor"], FLUX_VAE["shift_factor"]) == (
        ae["scale_factor"],
        ae["shift_factor"],
    )

    sd3 = SD3_MEDIUM_TRANSFORMER
    hidden = SD3_MEDIUM_CHECKPOINT_SHAPES["adaLN_modulation_width"] // 6
    depth = hidden // 64  # sd3_impls.py BaseModel
    assert (sd3["num_layers"], sd3["num_attention_heads"], sd3["caption_projection_dim"]) == (
        depth,
        depth,
        hidden,
    )
    assert sd3["num_attention_heads"] * sd3["attention_head_dim"] == hidden
    assert sd3["pos_embed_max_size"] ** 2 == SD3_MEDIUM_CHECKPOINT_SHAPES["pos_embed_patches"]
    assert sd3["pooled_projection_dim"] == 768 + 1280  # pooled CLIP-L + CLIP-G


def test_qwen_image_config_is_the_published_one_and_the_class_defaults():
    """The counted Qwen-Image config is the published `transformer/config.json` without its metadata and `pooled_projection_dim`, which `QwenImageTransformer2DModel.__init__` does not take; what remains equals the class's defaults."""
    from diffusers import QwenImageTransformer2DModel

    parameters = inspect.signature(QwenImageTransformer2DModel.__init__).parameters
    assert "pooled_projection_dim" not in parameters
    assert QWEN_IMAGE_PUBLISHED["_class_name"] == QwenImageTransformer2DModel.__name__
    defaults = {k: parameters[k].default for k in QWEN_IMAGE_TRANSFORMER}
    assert {k: list(v) if isinstance(v, tuple) else v for k, v in defaults.items()} == (
        QWEN_IMAGE_TRANSFORMER
    )


def test_text_encoder_configs_follow_open_clip_and_sd3():
    """The CLIP text configs match OpenCLIP's ViT-L-14 and ViT-bigG-14 model configs, and the CLIP and T5 configs match Stability AI's SD3 reference code."""
    from model_configs import CLIP_BIGG_TEXT, CLIP_L_TEXT

    for ours, name, sd3 in [
        (CLIP_L_TEXT, "ViT-L-14", SD3_CLIPL_CONFIG_ORIGINAL),
        (CLIP_BIGG_TEXT, "ViT-bigG-14", SD3_CLIPG_CONFIG_ORIGINAL),
    ]:
        oc = OPEN_CLIP_TEXT_ORIGINAL[name]
        assert (
            ours["hidden_size"],
            ours["num_attention_heads"],
            ours["num_hidden_layers"],
            ours["max_position_embeddings"],
            ours["vocab_size"],
            ours["projection_dim"],
            ours["intermediate_size"],
        ) == (
            oc["width"],
            oc["heads"],
            oc["layers"],
            oc["context_length"],
            oc["vocab_size"],
            oc["embed_dim"],
            4 * oc["width"],
        )
        assert {k: ours[k] for k in sd3} == sd3
    assert {k: T5_XXL[k] for k in SD3_T5_CONFIG_ORIGINAL} == SD3_T5_CONFIG_ORIGINAL
    assert T5_XXL["d_kv"] * T5_XXL["num_heads"] == T5_XXL["d_model"]


def test_atlas_text_encoder_configs_follow_their_sources():
    """The atlas's text-encoder configs follow their originals: UMT5-XXL's is Wan's umt5_xxl mapped to `UMT5Config` (a position-bucket table in every layer, as Wan's shared_pos=False builds it, and the parameter count Wan's T5Encoder layout gives); LTX-2's Gemma 3 config has Google DeepMind's Gemma3_12B shape and its SigLIP encoder; ByT5's is byt5-small as Google's gin file states it, its vocabulary the tokenizer's 384 plus the 1,126 tokens Glyph-SDXL-v2 adds; FLUX.2 [klein] 9B's Qwen3-8B differs from the 4B config in width and its untied head only."""
    import torch
    from model_configs import (
        BYT5_GLYPH_SDXL_V2,
        BYT5_SMALL_GIN,
        BYT5_SMALL_QUOTED,
        GEMMA3_12B_FOR_LTX,
        GEMMA3_12B_ORIGINAL,
        GLYPH_SDXL_V2_ADDED_TOKENS,
        QWEN3_4B_QUOTED,
        QWEN3_8B_QUOTED,
        UMT5_XXL,
        UMT5_XXL_ORIGINAL,
    )
    from transformers import ByT5Tokenizer, UMT5Config, UMT5EncoderModel

    w = UMT5_XXL_ORIGINAL
    assert (UMT5_XXL["vocab_size"], UMT5_XXL["d_model"], UMT5_XXL["d_ff"], UMT5_XXL["num_heads"]) == (w["vocab_size"], w["dim"], w["dim_ffn"], w["num_heads"])  # fmt: skip
    assert UMT5_XXL["d_kv"] * UMT5_XXL["num_heads"] == w["dim_attn"]
    assert (UMT5_XXL["num_layers"], UMT5_XXL["relative_attention_num_buckets"]) == (w["encoder_layers"], w["num_buckets"])  # fmt: skip
    assert w["shared_pos"] is False and UMT5_XXL["feed_forward_proj"] == "gated-gelu"
    with torch.device("meta"):
        umt5 = UMT5EncoderModel(UMT5Config(**UMT5_XXL))
    assert all(block.layer[0].SelfAttention.has_relative_attention_bias for block in umt5.encoder.block)  # fmt: skip
    # Wan's T5Encoder: token embedding; per block 2 norms, q k v o, gate fc1 fc2, a bucket table; a final norm
    d, a, f, L = w["dim"], w["dim_attn"], w["dim_ffn"], w["encoder_layers"]
    wan = w["vocab_size"] * d + L * (2 * d + 4 * d * a + 3 * d * f + w["num_buckets"] * w["num_heads"]) + d  # fmt: skip
    assert sum(p.numel() for p in umt5.parameters()) == wan

    text, vision, g = GEMMA3_12B_FOR_LTX["text_config"], GEMMA3_12B_FOR_LTX["vision_config"], GEMMA3_12B_ORIGINAL  # fmt: skip
    assert (text["hidden_size"], text["intermediate_size"], text["num_attention_heads"], text["head_dim"], text["num_key_value_heads"], text["num_hidden_layers"]) == (g["embed_dim"], g["hidden_dim"], g["num_heads"], g["head_dim"], g["num_kv_heads"], g["num_layers"])  # fmt: skip
    assert (text["sliding_window"], text["rope_local_base_freq"], text["rope_theta"], text["rope_scaling"]["factor"]) == (g["sliding_window_size"], g["local_base_frequency"], g["global_base_frequency"], g["global_scale_factor"])  # fmt: skip
    v = g["vision"]
    assert (vision["patch_size"], vision["hidden_size"], vision["num_hidden_layers"], vision["intermediate_size"], vision["num_attention_heads"], vision["image_size"]) == (v["patch_size"], v["width"], v["depth"], v["mlp_dim"], v["num_heads"], g["image_height"])  # fmt: skip
    assert GEMMA3_12B_FOR_LTX["mm_tokens_per_image"] == g["num_mm_tokens_per_image"]

    b = BYT5_SMALL_QUOTED
    assert (b["d_model"], b["d_ff"], b["num_layers"], b["num_decoder_layers"]) == (BYT5_SMALL_GIN["d_model"], BYT5_SMALL_GIN["d_ff"], BYT5_SMALL_GIN["encoder_layers"], BYT5_SMALL_GIN["decoder_layers"])  # fmt: skip
    assert (
        len(ByT5Tokenizer()) == b["vocab_size"] == 384
    )  # 256 bytes, 3 special tokens, 125 extra ids
    added = sum(GLYPH_SDXL_V2_ADDED_TOKENS.values())
    assert added == 1126 and BYT5_GLYPH_SDXL_V2 == {**b, "vocab_size": 384 + added}

    changed = {k for k in QWEN3_4B_QUOTED if QWEN3_4B_QUOTED[k] != QWEN3_8B_QUOTED[k]}
    assert QWEN3_8B_QUOTED.keys() == QWEN3_4B_QUOTED.keys()
    assert changed == {"hidden_size", "intermediate_size", "tie_word_embeddings"}


def test_flux2_text_encoder_counted_with_its_stored_lm_head(tmp_path):
    """A Mistral3 checkpoint that stores its own `lm_head` loads untied although its config names no top-level `tie_word_embeddings` (the installed `Mistral3Config` defaults it to True): a tiny `Mistral3ForConditionalGeneration` saved with two different matrices and reloaded by `from_pretrained` keeps both, while the same config built directly shares one. So FLUX.2 [dev]'s text encoder is counted with `tie_word_embeddings` False: its quoted config plus that one key."""
    import json

    import torch
    from model_configs import MISTRAL3_FLUX2, MISTRAL3_FLUX2_QUOTED
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    assert "tie_word_embeddings" not in MISTRAL3_FLUX2_QUOTED
    assert MISTRAL3_FLUX2 == {**MISTRAL3_FLUX2_QUOTED, "tie_word_embeddings": False}
    assert Mistral3Config().tie_word_embeddings is True
    tiny = dict(
        text_config=dict(
            model_type="mistral",
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
        ),
        vision_config=dict(
            model_type="pixtral",
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            head_dim=8,
            image_size=28,
            patch_size=14,
        ),
    )
    torch.manual_seed(0)
    model = Mistral3ForConditionalGeneration(Mistral3Config(**tiny, tie_word_embeddings=False))
    embed = model.model.language_model.embed_tokens.weight
    assert model.lm_head.weight is not embed and not torch.equal(model.lm_head.weight, embed)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved.pop("tie_word_embeddings")  # as the quoted config: no top-level key
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded = Mistral3ForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.config.tie_word_embeddings is True  # the class default, read from the file
    assert loaded.lm_head.weight is not loaded.model.language_model.embed_tokens.weight
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    with torch.device("meta"):
        built = Mistral3ForConditionalGeneration(Mistral3Config(**tiny))
    assert built.lm_head.weight is built.model.language_model.embed_tokens.weight
    counts = [sum(p.numel() for p in m.parameters()) for m in (loaded, built)]
    assert counts[0] - counts[1] == embed.numel()


def test_flux_fp8_layerwise_casting_keeps_the_modulation_in_bf16(fresh, recorded):
    """diffusers' own `enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn)` on the real Flux.1-dev transformer (meta device) skips every module whose name contains `norm`, which includes the AdaLN modulation Linears (`norm1.linear`, `norm1_context.linear`, `norm.linear`): 3.25 B parameters stay bf16, and the weights are about 15.1 GB, not half of bf16's 23.8 GB."""
    lc = fresh["layerwise_casting"]["Flux.1-dev/transformer"]
    assert recorded["layerwise_casting"] == fresh["layerwise_casting"], "run `make verify-refresh`"
    (flux,) = [c for c in COMPONENTS if (c.pipeline, c.component) == ("Flux.1-dev", "transformer")]
    under_norm = {_pattern(n) for n, _ in build(flux).named_parameters() if "norm" in n.rsplit(".", 1)[0]}  # fmt: skip
    assert under_norm and under_norm <= set(lc["kept"])  # every module named `norm`: kept in bf16
    total = _row(fresh, "Flux.1-dev", "transformer")["params"]
    assert lc["cast_params"] + lc["kept_params"] == total
    modulation = sum(v for k, v in lc["kept"].items() if k.endswith(("norm1.linear", "norm1_context.linear", "norm.linear")))  # fmt: skip
    assert modulation > 0.99 * (lc["kept_params"] - lc["kept"]["norm_out.linear"] - lc["kept"]["proj_out"])  # fmt: skip
    assert round(lc["kept_params"] / 1e9, 2) == 3.25
    assert round(lc["bytes"] / 1e9, 1) == 15.1 and lc["bytes"] == lc["cast_params"] + 2 * lc["kept_params"]  # fmt: skip


def test_flux_1024px_taylorseer_share_and_factor_bytes(fresh, recorded):
    """At 1024 px one Flux.1-dev transformer call is about 74 TFLOPs, of which the 57 attention modules that `TaylorSeerCacheConfig()` hooks by default hold 42%; their stored Taylor factors (orders 0 and 1, bf16) take 3.2 GB."""
    fx = fresh["flux_1024px"]
    assert recorded["flux_1024px"] == fx, "run `make verify-refresh`"
    assert round(fx["flops"] / 1e12) == 74 and fx["taylorseer_hooked_modules"] == 19 + 38
    assert round(100 * fx["taylorseer_hooked_flops"] / fx["flops"]) == 42
    # 57 modules x 2 orders x (4096 + 512 tokens) x 3072 channels x 2 bytes
    assert fx["taylorseer_factor_bytes"] == 57 * 2 * (4096 + 512) * 3072 * 2


def test_t5_rows_note_the_float32_wo_layers_of_an_fp16_load(fresh, recorded, tmp_path):
    """Loaded with `dtype=torch.float16`, transformers keeps T5's `wo` weights (`_keep_in_fp32_modules`) in float32 and with `torch.bfloat16` does not (a tiny `T5EncoderModel` saved and reloaded here), so T5-XXL's 1,006,632,960 `wo` weights, counted on the meta device, make its fp16 weights 11.54 GB, not the table's two bytes per weight, and its pipeline's fp16 total 2.01 GB more than the fp16 / bf16 total row, as the T5 rows' notes say."""
    import torch
    from transformers import T5Config, T5EncoderModel

    tiny = T5Config(vocab_size=32, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2, feed_forward_proj="gated-gelu")  # fmt: skip
    T5EncoderModel(tiny).save_pretrained(tmp_path)
    for dtype, wo_dtype in [(torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16)]:
        model = T5EncoderModel.from_pretrained(tmp_path, dtype=dtype)
        assert model.encoder.block[0].layer[1].DenseReluDense.wo.weight.dtype == wo_dtype
    with torch.device("meta"):
        xxl = T5EncoderModel(T5Config(**T5_XXL))
    wo = sum(p.numel() for n, p in xxl.named_parameters() if n.endswith(".wo.weight"))
    fp16_bytes = 2 * sum(p.numel() for p in xxl.parameters()) + 2 * wo
    assert f"{wo:,}" in T5_FP16_NOTE and f"{fp16_bytes / 1e9:.2f} GB" in T5_FP16_NOTE
    t5_rows = [r for r in recorded["components"] if r["class"] == "T5EncoderModel"]
    assert t5_rows and all(
        r["note"] == T5_FP16_NOTE or "see that row" in r["note"] for r in t5_rows
    )
    # the pipeline totals (SD3 Medium, Flux.1-dev) sum 2 bytes a weight: fp16 adds 2 per `wo`
    assert all(f"{2 * wo / 1e9:.2f} GB" in r["note"] and "total" in r["note"] for r in t5_rows)
    assert [r["note"] for r in t5_rows] == [
        r["note"] for r in fresh["components"] if r["class"] == "T5EncoderModel"
    ]


#: the diffusers pipeline class each table pipeline runs in
PIPELINE_CLASSES = {
    "SD 1.5": "StableDiffusionPipeline",
    "SDXL": "StableDiffusionXLPipeline",
    "SD3 Medium": "StableDiffusion3Pipeline",
    "Flux.1-dev": "FluxPipeline",
    "SD3.5 Large": "StableDiffusion3Pipeline",
    "Qwen-Image": "QwenImagePipeline",
    "Wan 2.1 T2V 14B": "WanPipeline",
    "Wan 2.1 T2V 1.3B": "WanPipeline",
}
#: optional components a checkpoint ships: SD 1.5's model_index.json has a safety_checker
SHIPPED_OPTIONAL = {"SD 1.5": ["safety_checker"]}


def test_total_rows_name_what_a_partly_counted_pipeline_leaves_out(recorded):
    """A pipeline's total row sums only the rows shown: where the table leaves out a component with weights that its diffusers pipeline class requires or its checkpoint ships (SD 1.5's safety checker, 304.0 M parameters; the text encoders or VAEs of SD3.5 Large, Qwen-Image and Wan 2.1), a note on its rows names it after "Not in this table or its total:"."""
    import diffusers
    import torch
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig

    from labkit.model_sizes import markdown_table

    table = markdown_table(None, totals=True)
    pipelines = dict.fromkeys(r["pipeline"] for r in recorded["components"])
    assert set(pipelines) == set(PIPELINE_CLASSES)
    partial = {}
    for pipeline in pipelines:
        cls = getattr(diffusers, PIPELINE_CLASSES[pipeline])
        weighted = {name for name, kind in cls._get_signature_types().items() if any(isinstance(t, type) and issubclass(t, torch.nn.Module) for t in (kind if isinstance(kind, tuple) else (kind,)))}  # fmt: skip
        shipped = set(SHIPPED_OPTIONAL.get(pipeline, []))
        required = weighted - set(cls._optional_components) | shipped
        rows = [r for r in recorded["components"] if r["pipeline"] == pipeline]
        missing = sorted(required - {r["component"] for r in rows})
        assert f"| {pipeline} | **total** |" in table
        if not missing:
            continue
        partial[pipeline] = missing
        said = [n.split("Not in this table or its total:", 1)[1] for n in (r.get("note") or "" for r in rows) if "Not in this table or its total:" in n]  # fmt: skip
        words = {m.rstrip("_23").replace("_", " ").replace("vae", "VAE") for m in missing}
        assert len(said) == 1 and all(w in said[0] for w in words), (pipeline, words)
    assert list(partial) == ["SD 1.5", "SD3.5 Large", "Qwen-Image", "Wan 2.1 T2V 14B", "Wan 2.1 T2V 1.3B"]  # fmt: skip
    assert partial["SD 1.5"] == ["safety_checker"]
    with torch.device("meta"):
        safety = StableDiffusionSafetyChecker(CLIPConfig(vision_config=CLIP_L14_VISION, projection_dim=768))  # fmt: skip
    n = sum(p.numel() for p in safety.parameters())
    assert all(s in SD15_SAFETY_NOTE for s in [f"{n / 1e6:.1f} M", f"{4 * n / 1e9:.2f} GB", f"{2 * n / 1e9:.2f} GB"])  # fmt: skip
    assert _row(recorded, "SD 1.5", "unet")["note"] == SD15_SAFETY_NOTE


def _pattern_of(name: str) -> str:
    """'blocks.7.norm2.weight' -> 'blocks.*.norm2.weight': one name for every block's copy."""
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


def test_a_16_bit_load_keeps_float32_weights_only_in_t5_and_wan(recorded, tmp_path):
    """Loaded by `from_pretrained` with `dtype=torch.float16` or `torch.bfloat16`, a tiny model of each class in the table (saved and reloaded here) holds every weight in that dtype except T5's `wo` in fp16 and, in both, the `time_embedder`, `norm2` and `scale_shift_table` weights that diffusers keeps in float32 in `WanTransformer3DModel` (`_keep_in_fp32_modules`): 29,184,000 weights of the meta-device Wan 2.1 14B transformer, so 28.64 GB and 28.89 GB for its total in 16 bits, 0.06 GB above the table's column, as the Wan rows' notes say; `from_single_file` (the same tiny transformer in Wan's original key layout) keeps none of them in float32."""
    import torch
    from diffusers import QwenImageTransformer2DModel
    from tiny import (
        tiny_flux_transformer,
        tiny_sd3_transformer,
        tiny_text_encoder,
        tiny_unet,
        tiny_vae,
        tiny_wan_transformer,
        tiny_wan_vae,
    )
    from transformers import T5Config, T5EncoderModel

    t5 = T5Config(vocab_size=32, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2, feed_forward_proj="gated-gelu")  # fmt: skip
    qwen = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=(8, 4, 4))  # fmt: skip
    makers = {
        "UNet2DConditionModel": tiny_unet,
        "AutoencoderKL": tiny_vae,
        "CLIPTextModel": tiny_text_encoder,
        "CLIPTextModelWithProjection": lambda: tiny_text_encoder(with_projection=True),
        "T5EncoderModel": lambda: T5EncoderModel(t5),
        "SD3Transformer2DModel": tiny_sd3_transformer,
        "FluxTransformer2DModel": tiny_flux_transformer,
        "QwenImageTransformer2DModel": lambda: QwenImageTransformer2DModel(**qwen),
        "WanTransformer3DModel": tiny_wan_transformer,
        "AutoencoderKLWan": tiny_wan_vae,
    }
    assert set(makers) == {c.cls for c in COMPONENTS}  # a new class in the table needs one here
    kept = {}  # (class, dtype) -> names of the weights a load of that dtype keeps in float32
    for name, make in makers.items():
        model = make()
        model.save_pretrained(tmp_path / name)
        for dtype in (torch.float16, torch.bfloat16):
            loaded = type(model).from_pretrained(tmp_path / name, dtype=dtype)
            dtypes = {n: p.dtype for n, p in loaded.named_parameters()}
            assert set(dtypes.values()) <= {dtype, torch.float32}, (name, dtype)
            kept[name, dtype] = {_pattern_of(n) for n, d in dtypes.items() if d == torch.float32}
    assert {k for k, v in kept.items() if v} == {("T5EncoderModel", torch.float16), ("WanTransformer3DModel", torch.float16), ("WanTransformer3DModel", torch.bfloat16)}  # fmt: skip
    wan = kept["WanTransformer3DModel", torch.bfloat16]
    assert wan == kept["WanTransformer3DModel", torch.float16]
    named = ("time_embedder", "norm2", "scale_shift_table")  # the note's names, each kept
    assert all(any(m in p.split(".") for m in named) for p in wan)
    assert all(any(m in p.split(".") for p in wan) for m in named)
    for c in (c for c in COMPONENTS if c.cls == "WanTransformer3DModel"):
        in_fp32 = sum(p.numel() for n, p in build(c).named_parameters() if _pattern_of(n) in wan)
        params = _row(recorded, c.pipeline, c.component)["params"]
        total = sum(r["params"] for r in recorded["components"] if r["pipeline"] == c.pipeline)
        assert f"{in_fp32:,}" in c.note and f"{2 * (params + in_fp32) / 1e9:.2f} GB" in c.note
        if c.pipeline == "Wan 2.1 T2V 14B":
            assert in_fp32 == 29_184_000 and f"{2 * (total + in_fp32) / 1e9:.2f} GB" in c.note
            assert (round(2 * (params + in_fp32) / 1e9, 2), round(2 * params / 1e9, 2)) == (28.64, 28.58)  # fmt: skip
        assert _row(recorded, c.pipeline, c.component)["note"] == c.note
        assert "`from_pretrained`" in c.note and "not `from_single_file`" in c.note
    # the same tiny transformer in Wan's original layout: diffusers' converter maps it back exactly
    from diffusers import WanTransformer3DModel
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
    from safetensors.torch import save_file

    folder = tmp_path / "WanTransformer3DModel"
    weights = WanTransformer3DModel.from_pretrained(folder).state_dict()
    swaps = [("condition_embedder.time_embedder.linear_1", "time_embedding.0"), ("condition_embedder.time_embedder.linear_2", "time_embedding.2"), ("condition_embedder.text_embedder.linear_1", "text_embedding.0"), ("condition_embedder.text_embedder.linear_2", "text_embedding.2"), ("condition_embedder.time_proj", "time_projection.1"), ("attn1", "self_attn"), ("attn2", "cross_attn"), (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."), ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"), ("proj_out", "head.head"), ("norm2", "norm@"), ("norm3", "norm2"), ("norm@", "norm3")]  # fmt: skip
    original = {}
    for key, value in weights.items():
        for ours, theirs in swaps:
            key = key.replace(ours, theirs)
        key = "head.modulation" if key == "scale_shift_table" else key.replace(".scale_shift_table", ".modulation")  # fmt: skip
        original[key] = value.contiguous()
    assert set(convert_wan_transformer_to_diffusers(dict(original))) == set(weights)
    save_file(original, tmp_path / "wan_original.safetensors")
    for dtype in (torch.float16, torch.bfloat16):
        single = WanTransformer3DModel.from_single_file(tmp_path / "wan_original.safetensors", config=str(folder), torch_dtype=dtype)  # fmt: skip
        assert {p.dtype for p in single.parameters()} == {dtype}
