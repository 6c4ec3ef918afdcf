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
from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN
from model_configs import (
    COMPONENTS,
    FLUX_AE_ORIGINAL,
    FLUX_DEV_ORIGINAL,
    FLUX_DEV_TRANSFORMER,
    FLUX_VAE,
    OPEN_CLIP_TEXT_ORIGINAL,
    PUBLISHED,
    PUBLISHED_RTOL,
    SD3_CLIPG_CONFIG_ORIGINAL,
    SD3_CLIPL_CONFIG_ORIGINAL,
    SD3_MEDIUM_CHECKPOINT_SHAPES,
    SD3_MEDIUM_TRANSFORMER,
    SD3_T5_CONFIG_ORIGINAL,
    SD15_LDM_ORIGINAL,
    SD15_UNET,
    SD15_VAE,
    SDXL_SGM_ORIGINAL,
    SDXL_UNET,
    SDXL_VAE,
    T5_XXL,
    build,
    installed_versions,
    record,
)

from labkit import model_sizes

RECORD = Path(model_sizes.__file__).with_name(model_sizes.DATA_FILE)
IDS = [f"{c.pipeline}/{c.component}" for c in COMPONENTS]


def _flux_transformer():
    """The real Flux.1-dev transformer from its published config, on the meta device."""
    (flux,) = [c for c in COMPONENTS if (c.pipeline, c.component) == ("Flux.1-dev", "transformer")]
    return build(flux)


def _pattern(name: str) -> str:
    """'transformer_blocks.7.norm1.linear.weight' -> 'transformer_blocks.*.norm1.linear'."""
    parts = name.split(".")[:-1]
    return ".".join("*" if p.isdigit() else p for p in parts)


def layerwise_casting_record() -> dict:
    """Flux.1-dev's transformer after diffusers' own `enable_layerwise_casting` (fp8 storage).

    Runs the real method on the meta-device model, so the skip patterns are the ones
    diffusers applies (DEFAULT_SKIP_MODULES_PATTERN plus the class's
    `_skip_layerwise_casting_patterns`, matched by re.search on each module's name; a match
    skips the whole subtree). The kept parameters are counted at 2 bytes: the model loaded
    with `dtype=torch.bfloat16`.
    """
    import torch

    model = _flux_transformer()
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    cast, kept = 0, {}
    for name, p in model.named_parameters():
        if p.dtype == torch.float8_e4m3fn:
            cast += p.numel()
        else:
            kept[_pattern(name)] = kept.get(_pattern(name), 0) + p.numel()
    return {
        "Flux.1-dev/transformer": {
            "storage_dtype": "float8_e4m3fn",
            "compute_dtype": "bfloat16",
            "skip_patterns": sorted(
                {*DEFAULT_SKIP_MODULES_PATTERN, *type(model)._skip_layerwise_casting_patterns}
            ),
            "cast_params": cast,
            "kept_params": sum(kept.values()),
            "kept": dict(sorted(kept.items(), key=lambda kv: -kv[1])),
            "bytes": cast + 2 * sum(kept.values()),
        }
    }


#: Flux.1-dev at 1024 x 1024 px: (1024 / 8 / 2) ** 2 image tokens, 512 T5 tokens
FLUX_1024 = {"image_tokens": 4096, "text_tokens": 512}


def flux_1024_record() -> dict:
    """One Flux.1-dev transformer call at 1024 px on the meta device: its FLOPs, the share
    in the modules TaylorSeer hooks by default, and the bytes of TaylorSeer's stored factors.

    FLOPs: torch's FlopCounterMode, per module. Factors: diffusers' own
    `TaylorSeerCacheConfig()` hooks, run for two computed steps (orders 0 and 1 stored).
    """
    import torch
    from diffusers import TaylorSeerCacheConfig
    from diffusers.hooks.taylorseer_cache import TaylorSeerState
    from torch.utils.flop_counter import FlopCounterMode

    model = _flux_transformer()
    n_img, n_txt = FLUX_1024["image_tokens"], FLUX_1024["text_tokens"]
    cfg = model.config
    with torch.device("meta"):
        inputs = dict(
            hidden_states=torch.randn(1, n_img, cfg.in_channels),
            encoder_hidden_states=torch.randn(1, n_txt, cfg.joint_attention_dim),
            pooled_projections=torch.randn(1, cfg.pooled_projection_dim),
            guidance=torch.tensor([3.5]),
            img_ids=torch.randn(n_img, 3),
            txt_ids=torch.randn(n_txt, 3),
        )
    counter = FlopCounterMode(display=False, depth=None)
    with torch.no_grad(), counter:
        model(timestep=torch.tensor([1.0], device="meta"), **inputs)
    counts = counter.get_flop_counts()
    total = sum(counts["Global"].values())
    model.enable_cache(TaylorSeerCacheConfig())
    hooked = [n for n, m in model.named_modules() if getattr(m, "_diffusers_hook", None) and m._diffusers_hook.get_hook("taylorseer_cache")]  # fmt: skip
    hooked_flops = sum(sum(counts[f"{type(model).__name__}.{n}"].values()) for n in hooked)
    states = []
    original = TaylorSeerState.update

    def update(self, outputs):
        states.append(self) if self not in states else None
        return original(self, outputs)

    TaylorSeerState.update = update
    try:
        with torch.no_grad(), model.cache_context("cond"):
            for t in (1.0, 0.9):  # steps 0 and 1: both computed (disable_cache_before_step=3)
                model(timestep=torch.tensor([t], device="meta"), **inputs)
    finally:
        TaylorSeerState.update = original
    factor_bytes = sum(
        f.numel() * f.element_size() for s in states for fs in s.taylor_factors.values() for f in fs.values()
    )  # fmt: skip
    return {
        **FLUX_1024,
        "flops": total,
        "taylorseer_hooked_modules": len(hooked),
        "taylorseer_hooked_flops": hooked_flops,
        "taylorseer_factor_bytes": factor_bytes,
        "taylorseer_config": "TaylorSeerCacheConfig() defaults: max_order=1, taylor_factors_dtype=torch.bfloat16",
    }


@pytest.fixture(scope="module")
def fresh() -> dict:
    """Counted now; written to the data file under INFRALENS_REFRESH_VERSIONS=1."""
    counted = record()
    # added fields (another page reads the components: only add, never rename)
    counted["layerwise_casting"] = layerwise_casting_record()
    counted["flux_1024px"] = flux_1024_record()
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
    """Each counted size agrees with its published, rounded total (paper, README, model card or docs) within the stated relative tolerance."""
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
    """The Flux.1-dev configs follow from Black Forest Labs' `FluxParams` and `AutoEncoderParams`, and the SD3 Medium transformer's from the checkpoint shapes diffusers recognises it by."""
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


def test_flux_fp8_layerwise_casting_keeps_the_modulation_in_bf16(fresh, recorded):
    """diffusers' own `enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn)` on the real Flux.1-dev transformer (meta device) skips every module whose name contains `norm`, which includes the AdaLN modulation Linears (`norm1.linear`, `norm1_context.linear`, `norm.linear`): 3.25 B parameters stay bf16, and the weights are about 15.1 GB, not half of bf16's 23.8 GB."""
    lc = fresh["layerwise_casting"]["Flux.1-dev/transformer"]
    assert recorded["layerwise_casting"] == fresh["layerwise_casting"], "run `make verify-refresh`"
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
