"""docs/handbook/models.md (the model atlas): each sentence about the table, checked against
the installed diffusers and the atlas that ``test_model_sizes`` recounts on the meta device
and holds equal to ``labkit/model_sizes.json`` (``atlas_record``)."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest

from labkit import model_sizes


@pytest.fixture(scope="module")
def atlas() -> dict[str, dict]:
    return {row["family"]: row for row in model_sizes.atlas()}


class _StopCallError(Exception):
    pass


def _call_until_prepare_latents(pipe, **kwargs) -> dict:
    """Run the pipeline's own ``__call__`` until it calls ``prepare_latents``; return that call's
    arguments (the call stops there: no denoiser, no VAE run)."""
    import inspect

    seen = {}

    def prepare_latents(*args, **kw):
        seen.update(inspect.signature(type(pipe).prepare_latents).bind(pipe, *args, **kw).arguments)
        raise _StopCallError

    object.__setattr__(pipe, "prepare_latents", prepare_latents)
    try:
        pipe(**kwargs)
    except _StopCallError:
        pass
    return seen


def _video_pipelines() -> dict:
    """LTX2Pipeline, WanPipeline and HunyuanVideo15Pipeline with no weights: stand-ins for the
    parts ``__call__`` reads before ``prepare_latents`` (a transformer's config, LTX-2's connectors)."""
    import types

    import torch
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        ClassifierFreeGuidance,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline,
        LTX2Pipeline,
        WanPipeline,
    )

    def stand_in(**config):
        return types.SimpleNamespace(config=types.SimpleNamespace(**config), dtype=torch.float32)

    e, m = torch.zeros(1, 4, 8), torch.ones(1, 4)
    ltx2 = LTX2Pipeline(scheduler=None, vae=None, audio_vae=None, text_encoder=None, tokenizer=None, connectors=None, transformer=None, vocoder=None)  # fmt: skip
    object.__setattr__(ltx2, "connectors", lambda p, mask, padding_side=None: (p, p, mask))
    object.__setattr__(ltx2, "transformer", stand_in(in_channels=128))
    wan = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler())  # fmt: skip
    object.__setattr__(wan, "transformer", stand_in(in_channels=16, patch_size=(1, 2, 2)))
    with torch.device("meta"):  # its __init__ reads the VAE's config
        hy_vae = AutoencoderKLHunyuanVideo15()
    hy = HunyuanVideo15Pipeline(text_encoder=None, tokenizer=None, transformer=None, vae=hy_vae, scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder_2=None, tokenizer_2=None, guider=ClassifierFreeGuidance())  # fmt: skip
    object.__setattr__(hy, "transformer", stand_in(in_channels=65))
    both = dict(prompt_embeds=e, negative_prompt_embeds=e)
    return {
        "LTX2Pipeline": (
            ltx2,
            dict(**both, prompt_attention_mask=m, negative_prompt_attention_mask=m),
        ),
        "WanPipeline": (wan, both),
        "HunyuanVideo15Pipeline": (
            hy,
            dict(
                **both,
                prompt_embeds_mask=m,
                prompt_embeds_2=e,
                prompt_embeds_mask_2=m,
                negative_prompt_embeds_mask=m,
                negative_prompt_embeds_2=e,
                negative_prompt_embeds_mask_2=m,
            ),
        ),
    }


def test_guidance_arguments_and_defaults(atlas):
    """Guidance: `__call__`'s `guidance_scale`, `true_cfg_scale`, `stg_scale` and `modality_scale` arguments (and their `audio_` forms) with their signature's defaults, and the pipeline's `guider` component where it has one (FLUX.3's blocks, HunyuanVideo 1.5); the defaults `LTX2Pipeline.__call__` sets when none is passed turn on its classifier-free, spatio-temporal and modality guidance."""
    import inspect
    import re

    import diffusers

    name = re.compile(r"^(audio_)?(guidance|true_cfg|stg|modality)_scale$")
    for r in atlas.values():
        if r["kind"] == "modular only":
            continue
        call = inspect.signature(getattr(diffusers, r["pipeline"]).__call__).parameters
        shown = {k: v for k, v in r["guidance"].items() if k not in ("guider", "is_distilled", "guidance_embeds")}  # fmt: skip
        assert shown == {k: p.default for k, p in call.items() if name.match(k)}, r["family"]
    # read from the signature (LTX-2's observed below): the page's Guidance bullet says so
    page = (Path(__file__).parents[2] / "docs/handbook/models.md").read_text()
    assert "(and their `audio_` forms) with their signature's defaults" in page
    # the pipeline's `guider` component where it has one: FLUX.3's blocks and HunyuanVideo 1.5 only
    assert [f for f, r in atlas.items() if "guider" in r["guidance"]] == ["FLUX.3", "HunyuanVideo 1.5 720p"]  # fmt: skip
    # LTX-2's, as its __call__ sets them when none is passed: CFG, STG and modality guidance
    ltx2, kwargs = _video_pipelines()["LTX2Pipeline"]
    _call_until_prepare_latents(ltx2, **kwargs)
    observed = {k: getattr(ltx2, k) for k in ("guidance_scale", "stg_scale", "modality_scale", "audio_guidance_scale", "audio_stg_scale", "audio_modality_scale")}  # fmt: skip
    assert {k: atlas["LTX-2"]["guidance"][k] for k in observed} == observed
    assert ltx2.do_classifier_free_guidance and ltx2.do_spatio_temporal_guidance and ltx2.do_modality_isolation_guidance  # fmt: skip


def test_flux3_is_the_only_modular_only_family(atlas):
    """FLUX.3 is the one family here with a modular pipeline only: `Flux3ModularPipeline` and `Flux3DistilledModularPipeline` (the distilled one's blocks have no `guider`); there is no `pipelines/flux3`."""
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
    flux3 = atlas["FLUX.3"]
    # every modular pipeline diffusers exports from modular_pipelines/flux3 is on the row
    import diffusers.modular_pipelines.flux3 as flux3_module

    exported = set()
    for n in dir(flux3_module):
        obj = getattr(flux3_module, n)
        if isinstance(obj, type) and issubclass(obj, diffusers.ModularPipeline):
            assert getattr(diffusers, n) is obj  # exported by diffusers itself
            exported.add(n)
    assert exported == {flux3["pipeline"], *flux3["variants"]} == {"Flux3ModularPipeline", "Flux3DistilledModularPipeline"}  # fmt: skip
    for name in exported:  # the guider each one's default blocks declare, as the row shows it
        cls = getattr(diffusers, name)
        specs = {c.name: c for c in getattr(diffusers, cls.default_blocks_name)().expected_components}  # fmt: skip
        shown = flux3["guidance"] if name == flux3["pipeline"] else flux3["variants"][name]
        assert ("guider" in specs) == ("guider" in shown), name
    assert "guider" not in flux3["variants"]["Flux3DistilledModularPipeline"]


def test_sixteen_checkpoints():
    """This table answers them for sixteen models diffusers 0.42.1 runs."""
    import diffusers

    rows = model_sizes.atlas()
    assert len(rows) == 16 and diffusers.__version__ == "0.42.1"
    assert all(hasattr(diffusers, r["pipeline"]) for r in rows)


def test_image_dits_see_4096_tokens_at_1024(atlas):
    """Counted so, every image DiT here has 4,096 image tokens at 1024 × 1024: at 1024 px the own `prepare_latents` of `StableDiffusion3Pipeline`, `FluxPipeline`, `Flux2Pipeline`, `Flux2KleinPipeline`, `ZImagePipeline`, `QwenImagePipeline` and `QwenImage21Pipeline`, and the `Flux3PrepareLatentsStep` of `Flux3ModularPipeline`'s and `Flux3DistilledModularPipeline`'s default blocks, make 4,096 packed tokens, or a latent grid that the denoiser's patch cuts into 4,096; the FLUX pipelines (FLUX.3's blocks too) and `QwenImagePipeline` pack 2 × 2 latent pixels into one token."""
    import inspect

    import diffusers
    import torch

    images = [r for r in atlas.values() if not r["frames"] and r["tokens"] is not None]
    assert len(images) >= 9
    for r in images:
        assert r["size"] == [1024, 1024] and r["tokens"] == 4096, r["family"]
        # the token count is the latent grid over the patch (and the pipeline's 2 x 2 packing)
        _, ph, pw = r["patch"]
        assert (r["latent_shape"][-2] // ph) * (r["latent_shape"][-1] // pw) == 4096
    # the latents each classic pipeline's own prepare_latents makes at 1024 px, on meta (no
    # __init__: its VAE scale factor is the compression the atlas observed by encoding)
    given = dict(images=None, batch_size=1, height=1024, width=1024, dtype=torch.float32, device=torch.device("meta"), generator=None)  # fmt: skip
    modular = [r["family"] for r in images if r["kind"] == "modular only"]
    assert modular == ["FLUX.3"]  # its blocks: counted by the arithmetic above only
    packed = set()  # the pipelines whose prepare_latents packs 2 x 2 latent pixels into a token
    for r in images:
        if r["kind"] == "modular only":
            continue
        cls = getattr(diffusers, r["pipeline"])
        pipe = cls.__new__(cls)
        object.__setattr__(pipe, "vae_scale_factor", r["spatial_compression"])
        args = dict(given, num_channels_latents=r["latent_channels"], num_latents_channels=r["latent_channels"])  # fmt: skip
        names = [n for n in inspect.signature(cls.prepare_latents).parameters if n not in ("self", "latents")]  # fmt: skip
        out = pipe.prepare_latents(**{n: args[n] for n in names})
        latents = out[0] if isinstance(out, tuple) else out
        if latents.dim() == 3:  # packed: (batch, tokens, channels)
            tokens = latents.shape[1]
            if latents.shape[2] == 4 * r["latent_channels"]:
                packed.add(r["pipeline"])
        else:  # (batch, channels, h, w): the denoiser's patch cuts it
            _, ph, pw = r["patch"]
            tokens = (latents.shape[-2] // ph) * (latents.shape[-1] // pw)
        assert tokens == 4096, r["family"]
    # FLUX.3: the latents step of each modular pipeline's default blocks, run at 1024 px
    from diffusers.modular_pipelines import PipelineState

    def walk(block):
        yield block
        for sub in getattr(block, "sub_blocks", {}).values():
            yield from walk(sub)

    (flux3,) = [r for r in images if r["kind"] == "modular only"]
    for name in (flux3["pipeline"], *flux3["variants"]):
        blocks = getattr(diffusers, getattr(diffusers, name).default_blocks_name)()
        steps = {type(b).__name__: b for b in walk(blocks) if type(b).__name__ == "Flux3PrepareLatentsStep"}  # fmt: skip
        pipe, state = blocks.init_pipeline(), PipelineState()
        for k, v in dict(height=1024, width=1024, batch_size=1, num_images_per_prompt=1, dtype=torch.float32, generator=None, latents=None).items():  # fmt: skip
            state.set(k, v)
        _, state = steps["Flux3PrepareLatentsStep"](pipe, state)
        latents = state.get("latents")  # packed: (batch, tokens, channels)
        assert latents.shape == (1, 4096, 4 * flux3["latent_channels"]), name
        packed.add(name)
    assert packed == {"FluxPipeline", "Flux2Pipeline", "Flux2KleinPipeline", "QwenImagePipeline", "Flux3ModularPipeline", "Flux3DistilledModularPipeline"}  # fmt: skip


def test_schedulers_the_pipelines_annotate(atlas):
    """Every family after SDXL annotates `FlowMatchEulerDiscreteScheduler`, and SD 1.5 and SDXL annotate `KarrasDiffusionSchedulers`."""
    import inspect

    import diffusers

    families = list(atlas)
    assert families[:2] == ["SD 1.5", "SDXL"]
    for name in families[:2]:
        ann = inspect.signature(getattr(diffusers, atlas[name]["pipeline"]).__init__).parameters["scheduler"].annotation  # fmt: skip
        assert ann.__name__ == "KarrasDiffusionSchedulers" == atlas[name]["scheduler"]
    assert {atlas[f]["scheduler"] for f in families[2:]} == {"FlowMatchEulerDiscreteScheduler"}


def test_flux3_blocks_create_their_scheduler(atlas):
    """The table shows the settings FLUX.3's blocks create its scheduler with, in both its pipelines, and the scheduler a public script or repository ships with a checkpoint; other rows name the class only. The guider `Flux3ModularPipeline`'s blocks create has the row's `guidance_scale`."""
    import diffusers

    # the Scheduler cell of each row, as the page renders it (the last column)
    table = model_sizes.atlas_table().splitlines()
    cells = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[-1] for line in table if line.startswith("| ") and not line.startswith("| Family")}  # fmt: skip
    assert set(cells) == set(atlas)
    for family, r in atlas.items():
        if r["shipped_scheduler"]:
            cls, _, settings = r["shipped_scheduler"].partition(", ")
            assert cells[family] == f"`{cls}` ({settings})", family
        else:  # no settings, no claim where they live
            assert cells[family] == f"`{r['scheduler']}`", family

    flux3 = atlas["FLUX.3"]
    cls, _, settings = flux3["shipped_scheduler"].partition(", ")
    assert cls == flux3["scheduler"] == "FlowMatchEulerDiscreteScheduler"
    expected = {k: float(v) for k, v in (kv.split("=") for kv in settings.split(", "))}
    assert expected == {"shift": 6.93}
    for name in (flux3["pipeline"], *flux3["variants"]):
        pipeline_cls = getattr(diffusers, name)
        pipe = getattr(diffusers, pipeline_cls.default_blocks_name)().init_pipeline()
        assert type(pipe) is pipeline_cls
        pipe.load_components(names=["scheduler"])  # created from the blocks' config, no hub
        assert type(pipe.scheduler).__name__ == cls
        assert {k: pipe.scheduler.config[k] for k in expected} == expected, name
        # and no setting the cell leaves out: the whole config is the one built from the cell
        built = getattr(diffusers, cls)(**expected).config
        assert {k: v for k, v in pipe.scheduler.config.items() if not k.startswith("_")} == {k: v for k, v in built.items() if not k.startswith("_")}, name  # fmt: skip
        # its guider, created the same way (the distilled one has none)
        if name == flux3["pipeline"]:
            pipe.load_components(names=["guider"])
            assert type(pipe.guider).__name__ == flux3["guidance"]["guider"]
            assert pipe.guider.guidance_scale == flux3["guidance"]["guidance_scale"] == 3.5


def test_latent_channels_and_compression(atlas):
    """Latent channels went from 4 in SD 1.5 to 16, 32, 48, 64 (Qwen-Image 2.1, class defaults), and 128 in LTX-2's video VAE, and spatial compression from 8× to 16× and 32×."""
    from model_configs import CLASS_DEFAULTS

    (sixty_four,) = [r for r in atlas.values() if r["latent_channels"] == 64]
    assert sixty_four["family"] == "Qwen-Image 2.1" and CLASS_DEFAULTS in sixty_four["vae_source"]
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
    """FLUX.2 klein 4B's denoiser counts about a third of FLUX.1-dev's parameters, both built from public configs."""
    from model_configs import CLASS_DEFAULTS

    klein, flux1 = atlas["FLUX.2 klein 4B"], atlas["FLUX.1-dev"]
    assert 0.30 < klein["denoiser_params"] / flux1["denoiser_params"] < 0.37
    for r in (klein, flux1):
        assert CLASS_DEFAULTS not in r["denoiser_source"] and "@" in r["denoiser_source"]


def test_published_totals_agree(atlas):
    """Where the atlas has a published size for a family's denoiser (the size table's figure for the same component, FLUX.2 dev's model card, Z-Image's README), the count agrees with it within the size table's tolerance."""
    from model_configs import ATLAS, PUBLISHED

    rtol = model_sizes.load()["published_rtol"]
    published = {f: r for f, r in atlas.items() if r["published"]}
    assert set(published) == {"SD 1.5", "SDXL", "SD3.5 Large", "FLUX.1-dev", "FLUX.2 dev", "Z-Image", "Qwen-Image", "Wan 2.1 T2V 14B"}  # fmt: skip
    for fam in ATLAS:  # every size-table figure for a denoiser the atlas reuses is carried over
        p = PUBLISHED.get((fam.denoiser.pipeline, fam.denoiser.component))
        if p is not None and p.covers == (fam.denoiser.component,):
            assert atlas[fam.name]["published_params"] == p.params, fam.name
    for r in published.values():
        assert r["denoiser_params"] == pytest.approx(r["published_params"], rel=rtol)


def test_wan22_a14b_runs_two_denoisers_of_one_config():
    """Wan 2.2 A14B runs two denoisers of one config, `transformer` and `transformer_2`: `WanPipeline` with the conversion script's `boundary_ratio` (0.875) calls the first at high noise, the second after, both at the row's `guidance_scale` when no other scale is passed."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from model_configs import ATLAS

    (a14b,) = [f for f in ATLAS if f.name == "Wan 2.2 T2V A14B"]
    assert a14b.denoisers == 2 and "transformer_2" in a14b.denoiser.source
    torch.manual_seed(0)
    tiny = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, text_dim=16, freq_dim=16, ffn_dim=16, num_layers=1, rope_max_seq_len=32)  # fmt: skip
    transformer, transformer_2 = WanTransformer3DModel(**tiny), WanTransformer3DModel(**tiny)
    # the conversion script's Wan2.2-T2V-A14B pipeline: boundary_ratio=0.875
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(), transformer=transformer, transformer_2=transformer_2, boundary_ratio=0.875)  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    seen = []
    hooks = [m.register_forward_pre_hook(lambda module, args, i=i: seen.append(i)) for i, m in enumerate((transformer, transformer_2))]  # fmt: skip
    try:
        pipe(prompt_embeds=torch.randn(1, 4, 16), negative_prompt_embeds=torch.randn(1, 4, 16), height=16, width=16, num_frames=5, num_inference_steps=4, output_type="latent")  # fmt: skip
    finally:
        for h in hooks:
            h.remove()
    assert (
        seen == [0, 0] + [1] * 6
    )  # high-noise steps on `transformer`, the rest on `transformer_2`
    # the scale each denoiser ran at, as __call__ set it (guidance_scale_2=None: guidance_scale)
    row = {r["family"]: r for r in model_sizes.atlas()}["Wan 2.2 T2V A14B"]["guidance"]
    assert pipe._guidance_scale == pipe._guidance_scale_2 == row["guidance_scale"]
    assert "guidance_scale_2" not in row  # no cell shows the None that __call__ replaces


def test_embedded_guidance_is_a_denoiser_input():
    """A denoiser config with `guidance_embeds=True` is marked embedded: the denoiser takes the scale as an input (`guidance`) and has layers to embed it; `Flux2Pipeline` passes `guidance_scale` to it as `guidance` every step."""
    import torch
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2Pipeline,
        Flux2Transformer2DModel,
        FluxTransformer2DModel,
    )
    from model_configs import ATLAS

    rows = {r["family"]: r for r in model_sizes.atlas()}
    # the flag as the built denoiser's config holds it (class default included), per family
    embedded = [f for f in ATLAS if rows[f.name]["guidance"].get("guidance_embeds") is True]
    assert {f.name for f in embedded} == {"FLUX.1-dev", "FLUX.2 dev"}
    assert {f.denoiser.cls for f in embedded} == {"FluxTransformer2DModel", "Flux2Transformer2DModel"}  # fmt: skip
    for f in ATLAS:  # and no other: a denoiser that embeds guidance says so in its config
        if f not in embedded and f.denoiser.library == "diffusers":
            assert rows[f.name]["guidance"].get("guidance_embeds", False) is False
    # the flag adds the embedding layers (tiny configs of the two classes, on the meta device)
    tiny = {
        FluxTransformer2DModel: dict(
            patch_size=1,
            in_channels=16,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            axes_dims_rope=(4, 6, 6),
        ),
        Flux2Transformer2DModel: dict(
            patch_size=1,
            in_channels=16,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            timestep_guidance_channels=32,
            axes_dims_rope=(4, 4, 4, 4),
        ),
    }
    for cls, config in tiny.items():
        with torch.device("meta"):
            off, on = ({n for n, _ in cls(**config, guidance_embeds=g).named_parameters()} for g in (False, True))  # fmt: skip
        assert off < on and all("guidance_embedder" in n for n in on - off), cls.__name__
    # and FLUX.2 dev's pipeline passes the scale to the denoiser as `guidance`, every step
    torch.manual_seed(0)
    transformer = Flux2Transformer2DModel(**tiny[Flux2Transformer2DModel], guidance_embeds=True)
    vae = AutoencoderKLFlux2(block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4, norm_num_groups=4)  # fmt: skip
    pipe = Flux2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None, tokenizer=None, transformer=transformer)  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    seen = []
    hook = transformer.register_forward_pre_hook(lambda m, a, k: seen.append(k.get("guidance")), with_kwargs=True)  # fmt: skip
    try:
        pipe(prompt_embeds=torch.randn(1, 8, 32), height=32, width=32, num_inference_steps=2, guidance_scale=2.5, output_type="latent")  # fmt: skip
    finally:
        hook.remove()
    assert len(seen) == 2 and all(g.tolist() == [2.5] for g in seen)


def test_qwen_image_true_cfg_needs_a_negative_prompt(atlas):
    """Qwen-Image's default `true_cfg_scale` runs classifier-free guidance only when a negative prompt is passed: a tiny `QwenImagePipeline` called at its default runs the transformer once a step without one, twice with one, and the table's cell says so."""
    import torch
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )

    # the one row whose default true_cfg_scale is above 1 (and so would guide)
    above = [f for f, r in atlas.items() if (r["guidance"].get("true_cfg_scale") or 0) > 1]
    assert above == ["Qwen-Image"] and atlas["Qwen-Image"]["pipeline"] == "QwenImagePipeline"
    (line,) = [line for line in model_sizes.atlas_table().splitlines() if line.startswith("| Qwen-Image |")]  # fmt: skip
    assert f"`true_cfg_scale={atlas['Qwen-Image']['guidance']['true_cfg_scale']}` (only with a negative prompt)" in line  # fmt: skip
    torch.manual_seed(0)
    transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=1, attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=(8, 4, 4)).eval()  # fmt: skip
    vae = AutoencoderKLQwenImage(base_dim=2, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True], latents_mean=[0.0] * 16, latents_std=[1.0] * 16).eval()  # fmt: skip
    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None, tokenizer=None, transformer=transformer)  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    seen = []
    hook = transformer.register_forward_pre_hook(lambda module, args: seen.append(1))
    e, mask = torch.randn(1, 4, 16), torch.ones(1, 4, dtype=torch.long)
    calls = {}
    try:
        for negative in (False, True):
            seen.clear()
            kwargs = dict(negative_prompt_embeds=e, negative_prompt_embeds_mask=mask) if negative else {}  # fmt: skip
            with torch.no_grad():  # true_cfg_scale not passed: __call__'s default
                pipe(prompt_embeds=e, prompt_embeds_mask=mask, height=32, width=32, num_inference_steps=2, output_type="latent", **kwargs)  # fmt: skip
            calls[negative] = len(seen)
    finally:
        hook.remove()
    assert calls == {False: 2, True: 4}  # 2 steps: one call each without, two with


def test_flux2_klein_is_distilled_runs_no_cfg():
    """FLUX.2 klein's pipeline, `Flux2KleinPipeline`, has an `is_distilled` flag; with it set, the pipeline runs no classifier-free guidance."""
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


def test_text_encoders_counted_from_public_configs(atlas):
    """Text encoder: the classes the pipeline's `__init__` annotates (FLUX.3: its default blocks' `expected_components`), counted on the meta device wherever a public repository states their config: the size table's for SD 1.5 to FLUX.1-dev, LTX-2's and Wan's own code for theirs, and for FLUX.2, Z-Image, Qwen-Image and HunyuanVideo 1.5 the configs into which musubi-tuner, a third-party trainer, loads their text encoders' weights. No row uses class defaults: FLUX.3 and Qwen-Image 2.1, whose Qwen3-VL checkpoints no public repository we could read names, show the class only: every other row counts each annotated text encoder, built as that class (or, where it annotates a union or a base class, as one class it admits) from a config whose source names a repository at a commit."""
    import re
    import typing

    import diffusers
    import transformers
    from model_configs import ATLAS, CLASS_DEFAULTS, MUSUBI

    sizes = {(r["pipeline"], r["component"]): r for r in model_sizes.rows()}
    by_source = {"size table": [], "own code": [], "musubi-tuner": []}
    for fam in ATLAS:
        row = atlas[fam.name]
        assert row["text_encoders"] and not (fam.encoders_of and fam.encoders), fam.name
        if fam.name in ("FLUX.3", "Qwen-Image 2.1"):  # named by no public source: class only
            assert not row["text_encoder_params"] and not row["text_encoder_named"]
            assert set(row["text_encoders"].values()) == {"Qwen3VLForConditionalGeneration"}
            continue
        # every annotated text encoder counted, and nothing else
        assert set(row["text_encoder_params"]) == set(row["text_encoders"]), fam.name
        if fam.encoders_of:
            by_source["size table"].append(fam.name)
            for name, params in row["text_encoder_params"].items():
                assert sizes[fam.encoders_of, name]["params"] == params
                assert sizes[fam.encoders_of, name]["class"] == row["text_encoders"][name]
            continue
        sources = row["text_encoder_sources"]
        assert set(sources) == set(row["text_encoders"]), fam.name
        assert all(re.match(r"[\w.-]+/[\w.-]+@[0-9a-f]{12} \S+", s) for s in sources.values())
        assert not any(CLASS_DEFAULTS in s for s in sources.values())
        kind = "musubi-tuner" if all(s.startswith(MUSUBI) for s in sources.values()) else "own code"
        if kind == "own code":  # the family's own repository
            owner = {"LTX-2": "Lightricks/LTX-2@", "Wan": "Wan-Video/Wan2.1@"}
            assert all(s.startswith(owner["Wan" if fam.name.startswith("Wan") else fam.name]) for s in sources.values())  # fmt: skip
        by_source[kind].append(fam.name)
        # the recorded count is the class built from that config: test_model_sizes recounts it
        for c in fam.encoders:
            assert row["text_encoder_classes"][c.component] == c.cls
            assert row["text_encoder_sources"][c.component] == c.source
            # the annotated class, or one the annotation admits (a union's member, a subclass)
            cls = getattr(diffusers, fam.pipeline)
            hint = inspect.signature(cls.__init__).parameters[c.component].annotation
            allowed = [a for a in (typing.get_args(hint) or (hint,)) if a is not type(None)]
            assert any(issubclass(getattr(transformers, c.cls), a) for a in allowed), fam.name
    # the page's Text encoder cells show each count, its Sources fold each config's source
    table = model_sizes.atlas_table().splitlines()
    sources = model_sizes.atlas_table(sources=True).splitlines()
    for family, row in atlas.items():
        (line,) = [line for line in table if line.startswith(f"| {family} |")]
        cell = line.strip("|").split(" | ")[2]
        assert cell.count(" B)") + cell.count(" M)") == len(row["text_encoder_params"]), family
        assert all(f"{model_sizes.format_params(n)})" in cell for n in row["text_encoder_params"].values())  # fmt: skip
        (listed,) = [s for s in sources if s.startswith(f"- {family}: ")]
        shown = row["text_encoder_sources"].values()
        assert all(model_sizes._literal_markdown(s) in listed for s in shown), family
    assert by_source["size table"] == ["SD 1.5", "SDXL", "SD3.5 Large", "FLUX.1-dev"]
    assert by_source["own code"] == ["LTX-2", "Wan 2.1 T2V 14B", "Wan 2.2 T2V A14B", "Wan 2.2 TI2V 5B"]  # fmt: skip
    assert by_source["musubi-tuner"] == ["FLUX.2 dev", "FLUX.2 klein 4B", "FLUX.2 klein 9B", "Z-Image", "Qwen-Image", "HunyuanVideo 1.5 720p"]  # fmt: skip


def test_cells_resting_on_the_third_party_trainer(atlas):
    """No table cell names musubi-tuner, a third-party trainer; the Sources entries name it where a cell rests on it: the text encoders of FLUX.2, Z-Image, Qwen-Image and HunyuanVideo 1.5, and Qwen-Image's denoiser config: every source a row records (denoiser, VAE, text encoders, shipped scheduler, published size) is searched for the trainer's repository, and so is each row's rendered table line and Sources entry."""
    trainer = "kohya-ss/musubi-tuner"
    on = set()
    for family, r in atlas.items():
        for field in ("denoiser_source", "vae_source", "shipped_scheduler_source", "published_source", "text_encoder_source"):  # fmt: skip
            if trainer in (r[field] or ""):
                on.add((family, "text encoder" if field.startswith("text_encoder") else field.split("_")[0]))  # fmt: skip
        on.update((family, "text encoder") for s in r["text_encoder_sources"].values() if trainer in s)  # fmt: skip
    assert {f for f, _ in on if _ == "text encoder"} == {"FLUX.2 dev", "FLUX.2 klein 4B", "FLUX.2 klein 9B", "Z-Image", "Qwen-Image", "HunyuanVideo 1.5 720p"}  # fmt: skip
    assert {(f, c) for f, c in on if c != "text encoder"} == {("Qwen-Image", "denoiser")}
    # the keys searched are every source field of a row
    assert {k for r in atlas.values() for k in r if k.endswith("_source")} == {"denoiser_source", "vae_source", "shipped_scheduler_source", "published_source", "text_encoder_source"}  # fmt: skip
    # as the page renders them: no table cell names the trainer, the Sources entries of those rows do
    table = model_sizes.atlas_table().lower()
    assert "musubi" not in table and "kohya" not in table
    sources = model_sizes.atlas_table(sources=True).splitlines()
    for family, r in atlas.items():
        (listed,) = [s for s in sources if s.startswith(f"- {family}: ")]
        assert (trainer in listed) == (family in {f for f, _ in on}), family
        for field in ("denoiser_source", "text_encoder_source"):
            if trainer in (r[field] or ""):
                assert r[field] in listed, (family, field)
    # the page's Sources fold says so, in these words
    page = " ".join((Path(__file__).parents[2] / "docs/handbook/models.md").read_text().split())
    assert test_cells_resting_on_the_third_party_trainer.__doc__.split(": every source")[0] in page


def test_zimage_encoder_counted_as_automodel_builds_it(atlas):
    """Z-Image's annotation is `PreTrainedModel`, any transformers model; it is counted as `Qwen3Model`, the class its repository's `AutoModel` loads: `AutoModel` builds a `Qwen3Model` from the counted config (on the meta device), and `Qwen3ForCausalLM`, whose head shares the embedding in that config, counts the same."""
    import torch
    import transformers
    from model_configs import ATLAS, QWEN3_4B_QUOTED

    assert atlas["Z-Image"]["text_encoders"] == {"text_encoder": "PreTrainedModel"}
    (encoder,) = {f.name: f for f in ATLAS}["Z-Image"].encoders
    assert encoder.config == QWEN3_4B_QUOTED and "AutoModel.from_pretrained" in encoder.source
    config = transformers.Qwen3Config(**QWEN3_4B_QUOTED)
    with torch.device("meta"):
        auto = transformers.AutoModel.from_config(config)
        causal = transformers.Qwen3ForCausalLM(config)
    assert type(auto) is transformers.Qwen3Model and atlas["Z-Image"]["text_encoder_classes"] == {"text_encoder": "Qwen3Model"}  # fmt: skip
    counts = [sum(p.numel() for p in m.parameters()) for m in (auto, causal)]
    assert counts[0] == counts[1] == atlas["Z-Image"]["text_encoder_params"]["text_encoder"]


def _text_width(component) -> int:
    """The width of the hidden states a counted text encoder hands on (its text model's)."""
    import transformers

    config = getattr(transformers, component.cls).config_class(**component.config)
    text = config.get_text_config()
    return getattr(text, "hidden_size", None) or text.d_model


def test_encoder_widths_match_the_denoisers(atlas):
    """The encoders counted from musubi-tuner's, LTX-2's and Wan's configs fit their denoisers' configs: each config's text-input width is its encoder's hidden size, three times over for FLUX.2's `joint_attention_dim`. For LTX-2 that width (`caption_channels`, 3840) is not what the encoder stage hands on: `LTX2Pipeline._get_gemma_prompt_embeds` stacks all of Gemma 3's hidden states (49 × 3840 for the 12B), shown here on a tiny Gemma 3."""
    import types

    import diffusers
    import torch
    import transformers
    from model_configs import ATLAS, COMPONENTS, GEMMA3_12B_FOR_LTX

    #: the denoiser config key that takes each text encoder's output
    takes = {
        "UNet2DConditionModel": {
            "text_encoder": "cross_attention_dim",
            "text_encoder_2": "cross_attention_dim",
        },
        "SD3Transformer2DModel": {
            "text_encoder": "pooled_projection_dim",
            "text_encoder_2": "pooled_projection_dim",
            "text_encoder_3": "joint_attention_dim",
        },
        "FluxTransformer2DModel": {
            "text_encoder": "pooled_projection_dim",
            "text_encoder_2": "joint_attention_dim",
        },
        "Flux2Transformer2DModel": {"text_encoder": "joint_attention_dim"},
        "ZImageTransformer2DModel": {"text_encoder": "cap_feat_dim"},
        "QwenImageTransformer2DModel": {"text_encoder": "joint_attention_dim"},
        "HunyuanVideo15Transformer3DModel": {
            "text_encoder": "text_embed_dim",
            "text_encoder_2": "text_embed_2_dim",
        },
        "LTX2VideoTransformer3DModel": {"text_encoder": "caption_channels"},
        "WanTransformer3DModel": {"text_encoder": "text_dim"},
    }
    checked, fit = [], {}
    for fam in ATLAS:  # every row with counted encoders, the size table's too
        encoders = fam.encoders or [c for c in COMPONENTS if (c.pipeline, c.library) == (fam.encoders_of, "transformers")]  # fmt: skip
        if not encoders:
            continue
        cls = getattr(diffusers, fam.denoiser.cls)
        defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()}
        config = {**defaults, **fam.denoiser.config}
        times = 3 if fam.denoiser.cls == "Flux2Transformer2DModel" else 1
        fit[fam.name] = all(config[takes[fam.denoiser.cls][c.component]] == times * _text_width(c) for c in encoders)  # fmt: skip
        checked += [(fam.name, c.component) for c in fam.encoders]
    assert len(checked) == sum(len(r["text_encoder_sources"]) for r in atlas.values())
    # the sentence holds for every row counted from those configs; of the size table's rows, SDXL's
    # and SD3.5 Large's configs take their two CLIP encoders' widths summed (768 + 1280 = 2048)
    assert {f for f, ok in fit.items() if not ok} == {"SDXL", "SD3.5 Large"}
    assert all(fit[f.name] for f in ATLAS if f.encoders)

    # LTX-2's encoder stage: the pipeline's own function on a tiny Gemma 3 with 2 layers
    gemma = transformers.Gemma3Config(
        text_config=dict(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            sliding_window=4,
        ),
        vision_config=dict(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        ),
        mm_tokens_per_image=4,
    )
    torch.manual_seed(0)
    encoder = transformers.Gemma3ForConditionalGeneration(gemma).eval()

    class Tokenizer:  # a stand-in: max_length token ids per prompt, none padded
        padding_side, pad_token, eos_token = "left", 0, 1

        def __call__(self, prompt, max_length, **kwargs):
            ids = torch.arange(2, 2 + max_length).repeat(len(prompt), 1)
            return types.SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids))

    pipe = types.SimpleNamespace(tokenizer=Tokenizer(), text_encoder=encoder, _execution_device=torch.device("cpu"))  # fmt: skip
    with torch.no_grad():
        prompt_embeds, _ = diffusers.LTX2Pipeline._get_gemma_prompt_embeds(pipe, "a cat", max_sequence_length=4)  # fmt: skip
    assert prompt_embeds.shape == (1, 4, (2 + 1) * 16)  # every layer's output and the embedding
    text = GEMMA3_12B_FOR_LTX["text_config"]
    (ltx2,) = [f for f in ATLAS if f.name == "LTX-2"]
    ltx2_config = {**{k: p.default for k, p in inspect.signature(diffusers.LTX2VideoTransformer3DModel.__init__).parameters.items()}, **ltx2.denoiser.config}  # fmt: skip
    assert ltx2_config["caption_channels"] == text["hidden_size"] == 3840
    assert text["num_hidden_layers"] + 1 == 49  # Gemma 3 12B's hidden states, stacked
    assert 49 * text["hidden_size"] != ltx2_config["caption_channels"]


def test_text_encoder_larger_than_denoiser_in_two_rows(atlas):
    """Nor is the denoiser always the largest part: in two rows the counted text encoder is larger, FLUX.2 klein 4B's (4.02 B against 3.88 B) and Wan 2.2 TI2V 5B's (5.68 B against 5.00 B)."""
    larger = {}
    for family, r in atlas.items():
        encoders = sum(r["text_encoder_params"].values())
        if encoders > r["denoisers"] * r["denoiser_params"]:
            larger[family] = (model_sizes.format_params(encoders), model_sizes.format_params(r["denoiser_params"]))  # fmt: skip
    assert larger == {"FLUX.2 klein 4B": ("4.02 B", "3.88 B"), "Wan 2.2 TI2V 5B": ("5.68 B", "5.00 B")}  # fmt: skip
    # the Text encoder and Parameters cells show those numbers
    table = model_sizes.atlas_table().splitlines()
    for family, (encoder, denoiser) in larger.items():
        (line,) = [line for line in table if line.startswith(f"| {family} |")]
        cells = line.strip("|").split(" | ")
        assert f"({encoder})" in cells[2] and cells[4].strip() == denoiser


#: the scheduler each source builds, transcribed (huggingface/diffusers@58eb52c0803e scripts/...;
#: Tongyi-MAI/Z-Image@c7ec13578cc2 src/utils/loader.py with src/config/model.py's defaults)
_WAN = dict(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000)
SOURCE_SCHEDULERS = {
    # convert_wan_to_diffusers.py __main__: flow_shift 5.0 for TI2V, else 3.0
    "Wan 2.1 T2V 14B": ("UniPCMultistepScheduler", dict(_WAN, flow_shift=3.0)),
    "Wan 2.2 T2V A14B": ("UniPCMultistepScheduler", dict(_WAN, flow_shift=3.0)),
    "Wan 2.2 TI2V 5B": ("UniPCMultistepScheduler", dict(_WAN, flow_shift=5.0)),
    # convert_ltx2_to_diffusers.py main(), a checkpoint that is not distilled
    "LTX-2": (
        "FlowMatchEulerDiscreteScheduler",
        dict(
            use_dynamic_shifting=True,
            base_shift=0.95,
            max_shift=2.05,
            base_image_seq_len=1024,
            max_image_seq_len=4096,
            shift_terminal=0.1,
        ),
    ),
    # convert_hunyuan_video1_5_to_diffusers.py SCHEDULER_CONFIGS['720p_t2v']
    "HunyuanVideo 1.5 720p": ("FlowMatchEulerDiscreteScheduler", dict(shift=9.0)),
    "Z-Image": (
        "FlowMatchEulerDiscreteScheduler",
        dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False),
    ),
}


def test_wan_ships_unipc(atlas):
    """Wan's conversion script ships `UniPCMultistepScheduler`, not the annotated class; every Scheduler cell with settings (Wan, LTX-2, HunyuanVideo 1.5, Z-Image) names every setting its source changes from the class defaults: the scheduler built from the cell has the source's config."""
    import ast

    import diffusers

    wan = [r for f, r in atlas.items() if f.startswith("Wan")]
    assert len(wan) == 3
    for r in wan:
        assert r["scheduler"] == "FlowMatchEulerDiscreteScheduler"
        assert r["shipped_scheduler"].startswith("UniPCMultistepScheduler, ")
    shipped = {f for f, r in atlas.items() if r["shipped_scheduler"]}
    assert shipped == {
        *SOURCE_SCHEDULERS,
        "FLUX.3",
    }  # FLUX.3: test_flux3_blocks_create_their_scheduler
    # the Scheduler cell as the page renders it: `Class` (key=value, ...)
    table = model_sizes.atlas_table().splitlines()
    cells = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[-1] for line in table if line.startswith("| ") and not line.startswith("| Family")}  # fmt: skip
    for family, (cls, source) in SOURCE_SCHEDULERS.items():
        name, _, settings = cells[family].partition(" (")
        assert name == f"`{cls}`", family
        kwargs = {k: ast.literal_eval(v) for k, v in (kv.split("=", 1) for kv in settings.rstrip(")").split(", "))}  # fmt: skip
        built, expected = (getattr(diffusers, cls)(**kw).config for kw in (kwargs, source))
        assert {k: v for k, v in built.items() if not k.startswith("_")} == {k: v for k, v in expected.items() if not k.startswith("_")}, family  # fmt: skip


def test_blocks_are_the_built_block_lists(atlas):
    """Parameters and Blocks: the denoiser built from its config, its parameters and its block lists (each `nn.ModuleList` attribute of the denoiser itself, by name; lists inside other submodules are not counted: SD 1.5's and SDXL's `mid_block` (2 resnets, 1 attention), FLUX.3's `mode_blocks`, 5 `image` and 5 `image_cond` blocks, and HunyuanVideo 1.5's 2-block token refiner in `context_embedder`): Z-Image's `ZImageTransformer2DModel` has 30 `layers` and two refiner stacks of 2 (`noise_refiner`, `context_refiner`)."""
    import torch
    from model_configs import ATLAS, build

    def block_lists(model) -> tuple[dict[str, int], dict[str, int]]:
        """(the denoiser's own ModuleList attributes, the outermost ModuleLists inside its submodules)"""
        lists = {n: len(m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)}  # fmt: skip
        outer = {n: k for n, k in lists.items() if not any(n.startswith(p + ".") for p in lists)}
        return {n: k for n, k in outer.items() if "." not in n}, {n: k for n, k in outer.items() if "." in n}  # fmt: skip

    fams = {f.name: f for f in ATLAS}
    model = build(fams["Z-Image"].denoiser)  # on the meta device
    lists, nested = block_lists(model)
    assert atlas["Z-Image"]["blocks"] == lists == {"noise_refiner": 2, "context_refiner": 2, "layers": 30}  # fmt: skip
    assert not nested
    assert atlas["Z-Image"]["denoiser_params"] == sum(p.numel() for p in model.parameters())
    assert atlas["SD 1.5"]["blocks"] == {"down_blocks": 4, "up_blocks": 4}
    # the page's Blocks bullet names each block list the cells leave out
    page = (Path(__file__).parents[2] / "docs/handbook/models.md").read_text()
    (bullet,) = [line for line in page.splitlines() if line.startswith("- **Parameters** and **Blocks**")]  # fmt: skip
    # HunyuanVideo 1.5's token refiner: a block list inside `context_embedder`, not in the cell
    lists, nested = block_lists(build(fams["HunyuanVideo 1.5 720p"].denoiser))
    assert atlas["HunyuanVideo 1.5 720p"]["blocks"] == lists == {"transformer_blocks": 54}
    assert nested == {"context_embedder.token_refiner.refiner_blocks": 2}
    assert "`context_embedder`" in bullet
    # FLUX.3's per-mode blocks: ModuleLists inside the `mode_blocks` ModuleDict, not in the cell
    lists, nested = block_lists(build(fams["FLUX.3"].denoiser))
    assert atlas["FLUX.3"]["blocks"] == lists == {"txt_mode_blocks": 5, "single_transformer_blocks": 28}  # fmt: skip
    assert nested == {"mode_blocks.image": 5, "mode_blocks.image_cond": 5}
    assert "`mode_blocks`, 5 `image` and 5 `image_cond` blocks" in bullet
    # every row's denoiser: the lists inside submodules are exactly the ones the bullet names
    unet_mid = {"mid_block.attentions": 1, "mid_block.resnets": 2}
    named = {"SD 1.5": unet_mid, "SDXL": unet_mid, "FLUX.3": nested, "HunyuanVideo 1.5 720p": {"context_embedder.token_refiner.refiner_blocks": 2}}  # fmt: skip
    for fam in ATLAS:
        assert block_lists(build(fam.denoiser))[1] == named.get(fam.name, {}), fam.name
    assert "SD 1.5's and SDXL's `mid_block` (2 resnets, 1 attention)" in bullet


def test_video_rows_count_the_default_frames(atlas):
    """Video rows count the frames the pipeline makes by default (LTX-2: 121, for a checkpoint without a `duration_head`) at 1280 wide, 704 high where 720 rows do not make whole tokens: the `num_frames` that `LTX2Pipeline`, `WanPipeline` and `HunyuanVideo15Pipeline` pass to `prepare_latents` when none is given."""
    video = {f: r for f, r in atlas.items() if r["frames"]}
    assert set(video) == {"HunyuanVideo 1.5 720p", "LTX-2", "Wan 2.1 T2V 14B", "Wan 2.2 T2V A14B", "Wan 2.2 TI2V 5B"}  # fmt: skip
    pipelines = _video_pipelines()
    assert {r["pipeline"] for r in video.values()} == set(pipelines)
    made = {}  # the num_frames each pipeline's __call__ passes to prepare_latents when none is given
    for name, (pipe, kwargs) in pipelines.items():
        made[name] = _call_until_prepare_latents(pipe, **kwargs)["num_frames"]
    assert made["LTX2Pipeline"] == 121 and pipelines["LTX2Pipeline"][0].duration_head is None
    for r in video.values():
        assert r["frames"] == made[r["pipeline"]], r["family"]
        h, w = r["size"]
        stride = r["spatial_compression"] * r["patch"][1]
        assert w == 1280 and h == (720 if 720 % stride == 0 else 704) and h % stride == 0


def test_zimage_sources_release_turbo(atlas):
    """Z-Image's denoiser config and shift come from Tongyi-MAI's repository, which releases Z-Image-Turbo and runs it with `guidance_scale` 0, not the pipeline's default."""
    z = atlas["Z-Image"]
    assert "Tongyi-MAI/Z-Image@" in z["denoiser_source"] and "Tongyi-MAI/Z-Image@" in z["shipped_scheduler_source"]  # fmt: skip
    assert (
        "Z-Image-Turbo" in z["denoiser_source"] and "`guidance_scale=0.0`" in z["denoiser_source"]
    )
    assert z["guidance"]["guidance_scale"] != 0.0  # the table's cell: ZImagePipeline's default
