"""docs/handbook/models.md (the model atlas): each sentence about the table, checked against
the installed diffusers and the atlas that ``test_model_sizes`` recounts on the meta device
and holds equal to ``labkit/model_sizes.json`` (``atlas_record``)."""

from __future__ import annotations

import importlib.util

import pytest

from labkit import model_sizes


@pytest.fixture(scope="module")
def atlas() -> dict[str, dict]:
    return {row["family"]: row for row in model_sizes.atlas()}


def test_flux3_is_the_only_modular_only_family(atlas):
    """FLUX.3 is the one family here with a modular pipeline only (`Flux3ModularPipeline`; there is no `pipelines/flux3`)."""
    import diffusers

    def has(package: str) -> bool:
        return importlib.util.find_spec(f"diffusers.{package}") is not None

    for row in atlas.values():
        classic, modular = (
            has(f"pipelines.{row['folder']}"),
            has(f"modular_pipelines.{row['folder']}"),
        )
        assert row["kind"] == {(True, False): "classic", (True, True): "classic + modular", (False, True): "modular only"}[classic, modular]  # fmt: skip
        assert hasattr(diffusers, row["pipeline"])
    assert [f for f, r in atlas.items() if r["kind"] == "modular only"] == ["FLUX.3"]
    assert atlas["FLUX.3"]["pipeline"] == "Flux3ModularPipeline"
    assert issubclass(diffusers.Flux3ModularPipeline, diffusers.ModularPipeline)


def test_image_dits_see_4096_tokens_at_1024(atlas):
    """Every image DiT here sees 4,096 tokens at 1024 × 1024."""
    images = [r for r in atlas.values() if not r["frames"] and r["tokens"] is not None]
    assert len(images) >= 9
    for r in images:
        assert r["size"] == [1024, 1024] and r["tokens"] == 4096, r["family"]
        # the token count is the latent grid over the patch (and the pipeline's 2 x 2 packing)
        _, ph, pw = r["patch"]
        assert (r["latent_shape"][-2] // ph) * (r["latent_shape"][-1] // pw) == 4096


def test_schedulers_the_pipelines_annotate(atlas):
    """Every family after SDXL annotates `FlowMatchEulerDiscreteScheduler`; SD 1.5 and SDXL accept any of `KarrasDiffusionSchedulers`."""
    import inspect

    import diffusers

    families = list(atlas)
    assert families[:2] == ["SD 1.5", "SDXL"]
    for name in families[:2]:
        ann = inspect.signature(getattr(diffusers, atlas[name]["pipeline"]).__init__).parameters["scheduler"].annotation  # fmt: skip
        assert ann.__name__ == "KarrasDiffusionSchedulers" == atlas[name]["scheduler"]
    assert {atlas[f]["scheduler"] for f in families[2:]} == {"FlowMatchEulerDiscreteScheduler"}


def test_latent_channels_and_compression(atlas):
    """Latent channels went from 4 in SD 1.5 to 16, 32, 48, 64, and 128 in LTX-2's video VAE, and spatial compression from 8× to 16× and 32×."""
    assert atlas["SD 1.5"]["latent_channels"] == 4
    assert sorted({r["latent_channels"] for r in atlas.values()}) == [4, 16, 32, 48, 64, 128]
    assert max(atlas.values(), key=lambda r: r["latent_channels"])["family"] == "LTX-2"
    assert sorted({r["spatial_compression"] for r in atlas.values()}) == [8, 16, 32]
    assert atlas["LTX-2"]["spatial_compression"] == 32


def test_video_token_range(atlas):
    """The video rows run from 14,080 tokens (LTX-2) to 111,600 (HunyuanVideo 1.5)."""
    video = {f: r["tokens"] for f, r in atlas.items() if r["frames"]}
    assert min(video.values()) == video["LTX-2"] == 14_080
    assert max(video.values()) == video["HunyuanVideo 1.5 720p"] == 111_600
    for r in (atlas["LTX-2"], atlas["HunyuanVideo 1.5 720p"]):
        t, h, w = r["latent_shape"][2:]
        assert t == (r["frames"] - 1) // r["temporal_compression"] + 1
        assert (h, w) == (r["size"][0] // r["spatial_compression"], r["size"][1] // r["spatial_compression"])  # fmt: skip
        assert r["tokens"] == t * h * w  # patch 1 x 1 x 1


def test_bigger_number_is_not_bigger_model(atlas):
    """FLUX.3's denoiser, built from the class defaults, counts fewer parameters than FLUX.2 dev's, and Qwen-Image 2.1's fewer than Qwen-Image's."""
    assert "class defaults" in atlas["FLUX.3"]["denoiser_source"]
    assert atlas["FLUX.3"]["denoiser_params"] < atlas["FLUX.2 dev"]["denoiser_params"]
    assert atlas["Qwen-Image 2.1"]["denoiser_params"] < atlas["Qwen-Image"]["denoiser_params"]


def test_published_totals_agree(atlas):
    """Where a family publishes its denoiser's size (FLUX.2 dev, Z-Image), the count agrees with it within the size table's tolerance."""
    rtol = model_sizes.load()["published_rtol"]
    published = {f: r for f, r in atlas.items() if r["published"]}
    assert set(published) == {"FLUX.2 dev", "Z-Image"}
    for r in published.values():
        assert r["denoiser_params"] == pytest.approx(r["published_params"], rel=rtol)


def test_wan22_a14b_runs_two_denoisers_of_one_config():
    """Wan 2.2 A14B runs two denoisers of one config, `transformer` and `transformer_2`."""
    import inspect

    import diffusers

    params = inspect.signature(diffusers.WanPipeline.__init__).parameters
    assert {"transformer", "transformer_2", "boundary_ratio"} <= set(params)
    from model_configs import ATLAS

    (a14b,) = [f for f in ATLAS if f.name == "Wan 2.2 T2V A14B"]
    assert a14b.denoisers == 2 and "transformer_2" in a14b.denoiser.source


def test_embedded_guidance_is_a_denoiser_input():
    """A denoiser config with `guidance_embeds=True` is marked embedded: the denoiser takes the scale as an input (`guidance`) and has layers to embed it."""
    import inspect

    from model_configs import ATLAS, build

    rows = {r["family"]: r for r in model_sizes.atlas()}
    # the flag as the built denoiser's config holds it (class default included), per family
    embedded = [f for f in ATLAS if rows[f.name]["guidance"].get("guidance_embeds") is True]
    assert {f.name for f in embedded} == {"FLUX.1-dev", "FLUX.2 dev"}
    for f in embedded:
        model = build(f.denoiser)
        assert "guidance" in inspect.signature(model.forward).parameters
        assert any("guidance" in name for name, _ in model.named_modules())
    for f in ATLAS:  # and no other: a denoiser that embeds guidance says so in its config
        if f not in embedded and f.denoiser.library == "diffusers":
            assert f.denoiser.config.get("guidance_embeds", False) is False


def test_flux2_klein_is_distilled_runs_no_cfg():
    """FLUX.2 klein's pipeline has an `is_distilled` flag; with it set, the pipeline runs no classifier-free guidance."""
    import torch
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )

    torch.manual_seed(0)
    transformer = Flux2Transformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, timestep_guidance_channels=32, axes_dims_rope=(4, 4, 4, 4), guidance_embeds=False)  # fmt: skip
    vae = AutoencoderKLFlux2(block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4, norm_num_groups=4)  # fmt: skip
    calls = {}
    for distilled in (False, True):
        pipe = Flux2KleinPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None, tokenizer=None, transformer=transformer, is_distilled=distilled)  # fmt: skip
        seen = []
        hook = transformer.register_forward_pre_hook(lambda module, args, seen=seen: seen.append(1))
        try:
            pipe(prompt_embeds=torch.randn(1, 8, 32), negative_prompt_embeds=torch.randn(1, 8, 32), height=32, width=32, num_inference_steps=2, guidance_scale=4.0, output_type="latent")  # fmt: skip
        finally:
            hook.remove()
        calls[distilled] = len(seen)
    assert calls == {False: 4, True: 2}  # 2 steps: two calls each with CFG, one without
    rows = {r["family"]: r for r in model_sizes.atlas()}
    assert [f for f, r in rows.items() if "is_distilled" in r["guidance"]] == ["FLUX.2 klein 4B", "FLUX.2 klein 9B"]  # fmt: skip


def test_text_encoders_counted_or_named(atlas):
    """Text encoder: the classes the pipeline's `__init__` annotates (FLUX.3: its default blocks' `expected_components`), counted where the size table counts them, else the checkpoint a public conversion script loads."""
    sizes = {(r["pipeline"], r["component"]): r for r in model_sizes.rows()}
    from model_configs import ATLAS

    for fam in ATLAS:
        row = atlas[fam.name]
        assert row["text_encoders"]
        if fam.encoders_of:
            assert set(row["text_encoder_params"]) == set(row["text_encoders"])
            for name, params in row["text_encoder_params"].items():
                assert sizes[fam.encoders_of, name]["params"] == params
                assert sizes[fam.encoders_of, name]["class"] == row["text_encoders"][name]
        else:
            assert not row["text_encoder_params"]
            assert (row["text_encoder_named"] is None) == (row["text_encoder_source"] is None)
            if row["text_encoder_named"]:
                assert "scripts/convert_" in row["text_encoder_source"]


def test_wan_ships_unipc(atlas):
    """Wan's conversion script ships `UniPCMultistepScheduler`, not the annotated class."""
    from diffusers import UniPCMultistepScheduler

    wan = [r for f, r in atlas.items() if f.startswith("Wan")]
    assert len(wan) == 3
    for r in wan:
        assert r["scheduler"] == "FlowMatchEulerDiscreteScheduler"
        assert r["shipped_scheduler"].startswith("UniPCMultistepScheduler, flow_shift=")
        shift = float(r["shipped_scheduler"].rsplit("=", 1)[1])
        s = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000, flow_shift=shift)  # fmt: skip
        assert s.config.flow_shift == shift and s.config.use_flow_sigmas
    assert {f for f, r in atlas.items() if r["shipped_scheduler"]} == {"Wan 2.1 T2V 14B", "Wan 2.2 T2V A14B", "Wan 2.2 TI2V 5B", "HunyuanVideo 1.5 720p", "LTX-2", "Z-Image"}  # fmt: skip


def test_video_rows_count_the_default_frames(atlas):
    """Video rows count the frames the pipeline makes by default (LTX-2: 121, for a checkpoint without a `duration_head`) at 1280 wide, 704 high where 720 rows do not make whole tokens."""
    import inspect

    import diffusers

    video = {f: r for f, r in atlas.items() if r["frames"]}
    assert set(video) == {"HunyuanVideo 1.5 720p", "LTX-2", "Wan 2.1 T2V 14B", "Wan 2.2 T2V A14B", "Wan 2.2 TI2V 5B"}  # fmt: skip
    for r in video.values():
        call = inspect.signature(getattr(diffusers, r["pipeline"]).__call__).parameters
        default = call["num_frames"].default
        if r["family"] == "LTX-2":
            assert default is None
            source = inspect.getsource(diffusers.LTX2Pipeline.__call__)
            assert (
                'num_frames is None and getattr(self, "duration_head", None) is not None' in source
            )
            assert "num_frames = 121" in source
            default = 121
        assert r["frames"] == default
        h, w = r["size"]
        stride = r["spatial_compression"] * r["patch"][1]
        assert w == 1280 and h == (720 if 720 % stride == 0 else 704) and h % stride == 0
