"""The VAE / latent diffusion page against the real AutoencoderKL and pipelines.

Every model is built in code from a tiny random config with the real block
structure (a few channels per block), so shapes, call order and the encode/decode
arithmetic are the real ones; no weights are loaded. Pipeline claims run the
pipeline's own ``__call__`` (or the method named) on these tiny parts.
"""

from __future__ import annotations

import pytest
import torch
from tiny import (
    HEIGHT,
    WIDTH,
    images,
    narrow_vae,
    start_latents,
    tiny_flux_parts,
    tiny_sd3_parts,
    tiny_sd_pipeline,
    tiny_sdxl_pipeline,
    tiny_vae,
)


def record_decode(vae):
    """Wrap ``vae.decode`` to record its input latents."""
    seen, decode = [], vae.decode
    vae.decode = lambda z, *a, **k: seen.append(z.clone()) or decode(z, *a, **k)
    return seen


@pytest.fixture(scope="module")
def published_vaes():
    """``AutoencoderKL`` on the meta device from SD 1.5's, SDXL's, SD3's and Flux.1's published
    VAE configs (``model_configs``), with each config; built once for the module."""
    from diffusers import AutoencoderKL
    from model_configs import FLUX_VAE, SD3_VAE, SD15_VAE, SDXL_VAE

    built = []
    for config in (SD15_VAE, SDXL_VAE, SD3_VAE, FLUX_VAE):
        with torch.device("meta"):
            built.append((config, AutoencoderKL(**config)))
    return built


@pytest.mark.parametrize("blocks", [1, 2, 3, 4])
def test_shape_contract(blocks, published_vaes):
    """`AutoencoderKL` maps `(B, 3, H, W)` to latents `(B, latent_channels, H/f, W/f)` and back, with `f = 2 ** (len(block_out_channels) - 1)`, which `StableDiffusionPipeline` stores as `vae_scale_factor`: 8 for the four blocks, `block_out_channels=(128, 256, 512, 512)`, of the SD 1.x, SDXL, SD3 and Flux.1 VAEs."""
    vae = narrow_vae((8, 16, 16, 16)[:blocks])
    f = 2 ** (blocks - 1)
    with torch.no_grad():
        latents = vae.encode(images()).latent_dist.sample(torch.Generator().manual_seed(0))
        assert latents.shape == (2, 4, 32 // f, 32 // f)
        assert vae.decode(latents).sample.shape == (2, 3, 32, 32)
    assert tiny_sd_pipeline(vae=vae).vae_scale_factor == f
    if blocks == 4:  # the published SD 1.x, SDXL, SD3 and Flux.1 VAE configs: f = 8
        for _, real in published_vaes:
            assert list(real.config.block_out_channels) == [128, 256, 512, 512]
            halving = [block.downsamplers is not None for block in real.encoder.down_blocks]
            assert halving == [True, True, True, False]  # four blocks, all but the last halve


def test_sixteen_channel_latents():
    """With `latent_channels=16`, as in SD3 and Flux.1, the latents are `(B, 16, H/8, W/8)`, four times the numbers of SD 1.x's at the same size."""
    with torch.no_grad():
        latents = narrow_vae(latent_channels=16).encode(images()).latent_dist.mode()
    assert latents.shape == (2, 16, 4, 4)


def test_latent_dist_mean_std_sample_mode():
    """`vae.encode(images).latent_dist` is a `DiagonalGaussianDistribution` with `.mean` and `.std` of latent shape; `.mode()` is the mean and `.sample(generator)` is `mean + std * noise`."""
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    with torch.no_grad():
        dist = narrow_vae().encode(images()).latent_dist
    assert isinstance(dist, DiagonalGaussianDistribution)
    assert dist.mean.shape == dist.std.shape == (2, 4, 4, 4)
    torch.testing.assert_close(dist.mode(), dist.mean)
    noise = torch.randn(dist.mean.shape, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(
        dist.sample(torch.Generator().manual_seed(5)), dist.mean + dist.std * noise
    )


def test_config_defaults():
    """`AutoencoderKL`'s config defaults to `scaling_factor=0.18215` (SD 1.x), `shift_factor=None` and `force_upcast=True`."""
    from diffusers import AutoencoderKL

    config = AutoencoderKL().config
    assert config.scaling_factor == 0.18215
    assert config.shift_factor is None
    assert config.force_upcast is True


class _BuiltFromError(Exception):
    """Raised by the ``from_config`` spy with the config ``from_single_file`` built."""


def _single_file_config(monkeypatch, checkpoint, **kwargs):
    """The config ``AutoencoderKL.from_single_file(checkpoint, **kwargs)`` passes to
    ``from_config``, and the repo it asked ``load_config`` for (None on the original-config
    path). ``load_config`` answers with SD 1.5's published VAE config, offline."""
    from diffusers import AutoencoderKL
    from model_configs import SD15_VAE

    asked = []

    def load_config(*args, **kw):
        asked.append(kw.get("pretrained_model_name_or_path"))
        return dict(SD15_VAE)

    def from_config(cls, config, **kw):
        raise _BuiltFromError(dict(config))

    monkeypatch.setattr(AutoencoderKL, "load_config", load_config)
    monkeypatch.setattr(AutoencoderKL, "from_config", classmethod(from_config))
    with pytest.raises(_BuiltFromError) as built:
        AutoencoderKL.from_single_file(checkpoint, **kwargs)
    return built.value.args[0], (asked[0] if asked else None)


def test_single_file_reads_scale_factor_only_from_an_original_config(tmp_path, monkeypatch):
    """`AutoencoderKL.from_single_file` takes the factor from the original config's `scale_factor` only when given `original_config=` (0.18215 if absent, 0.5 if the checkpoint carries Playground's `edm_mean` and `edm_std`): SDXL's `sd_xl_base.yaml` first stage (`ch: 128`, `ch_mult: [1, 2, 4, 4]`, `scale_factor: 0.13025`) becomes `block_out_channels=[128, 256, 512, 512]` with `scaling_factor=0.13025`. Without it, the factor comes from the `vae` config of the diffusers repo it matches the checkpoint to (SD 1.5's for a bare VAE file), or from the repo named by `config=`. A `scaling_factor=` keyword overrides any of them."""
    import copy

    from model_configs import SDXL_SGM_ORIGINAL  # sd_xl_base.yaml, transcribed
    from tiny import single_file_vae_config

    source, sdxl = single_file_vae_config(tmp_path, monkeypatch, SDXL_SGM_ORIGINAL)
    assert source == "original" and sdxl["scaling_factor"] == 0.13025
    assert sdxl["block_out_channels"] == [128, 256, 512, 512] and sdxl["latent_channels"] == 4
    plain = copy.deepcopy(SDXL_SGM_ORIGINAL)
    del plain["model"]["params"]["scale_factor"]
    assert single_file_vae_config(tmp_path, monkeypatch, plain)[1]["scaling_factor"] == 0.18215
    source, (repo, subfolder) = single_file_vae_config(tmp_path, monkeypatch)
    assert source == "repo" and subfolder == "vae" and "stable-diffusion-v1-5" in repo
    override = single_file_vae_config(tmp_path, monkeypatch, SDXL_SGM_ORIGINAL, scaling_factor=0.5)
    assert override[1]["scaling_factor"] == 0.5
    assert single_file_vae_config(tmp_path, monkeypatch, config="my-org/my-vae")[1][0] == "my-org/my-vae"  # fmt: skip
    monkeypatch.undo()
    bare = {"encoder.conv_in.weight": torch.zeros(1)}
    playground = {**bare, "edm_mean": torch.zeros(1, 4, 1, 1), "edm_std": torch.ones(1, 4, 1, 1)}
    config, repo = _single_file_config(monkeypatch, playground, original_config=SDXL_SGM_ORIGINAL)
    assert repo is None and config["scaling_factor"] == 0.5  # not the yaml's 0.13025
    assert config["latents_mean"] is not None and config["latents_std"] is not None
    config, repo = _single_file_config(monkeypatch, bare, scaling_factor=0.25)  # no original
    assert "stable-diffusion-v1-5" in repo and config["scaling_factor"] == 0.25


def test_single_file_config_reads_the_named_repos_top_level_config(tmp_path):
    """Given `config=`, `AutoencoderKL.from_single_file` reads that repo's top-level `config.json`, or the one in `subfolder=`, not its `vae` folder: pointed at a pipeline-layout repo without `subfolder="vae"` it raises `OSError`. A `scaling_factor=` keyword overrides that config too."""
    import json

    from diffusers import AutoencoderKL
    from safetensors.torch import save_file

    vae = narrow_vae()
    checkpoint = tmp_path / "vae.safetensors"
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, str(checkpoint))
    pipeline_repo, flat_repo = tmp_path / "pipeline", tmp_path / "flat"
    vae.register_to_config(scaling_factor=0.3)
    vae.save_pretrained(pipeline_repo / "vae")  # a pipeline's layout: the VAE's config in vae/
    (pipeline_repo / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))  # fmt: skip
    vae.register_to_config(scaling_factor=0.4)
    vae.save_pretrained(flat_repo)  # a VAE repo: config.json at the top

    def load(repo, **kwargs):
        return AutoencoderKL.from_single_file(str(checkpoint), config=str(repo), local_files_only=True, **kwargs)  # fmt: skip

    with pytest.raises(OSError, match=r"config\.json"):
        load(pipeline_repo)
    assert load(pipeline_repo, subfolder="vae").config.scaling_factor == 0.3
    assert load(flat_repo).config.scaling_factor == 0.4
    assert load(flat_repo, scaling_factor=0.6).config.scaling_factor == 0.6


def test_sd_decodes_latents_over_scaling_factor_and_never_encodes(record_calls):
    """`StableDiffusionPipeline` never runs the VAE encoder for text-to-image, and for an image output decodes once after the loop: `vae.decode(latents / vae.config.scaling_factor)` (with `output_type="latent"`, not at all)."""
    pipe = tiny_sd_pipeline()
    pipe.vae.register_to_config(scaling_factor=0.25)
    encoder = record_calls(pipe.vae.encoder)
    seen = record_decode(pipe.vae)
    run = dict(
        prompt_embeds=torch.randn(1, 77, 32, generator=torch.Generator().manual_seed(1)),
        num_inference_steps=2, height=HEIGHT, width=WIDTH, guidance_scale=1.0,
        latents=start_latents(),
    )  # fmt: skip
    latents = pipe(**run, output_type="latent").images
    pipe(**run, output_type="pt")
    assert encoder.calls == [] and len(seen) == 1
    torch.testing.assert_close(seen[0], latents / 0.25)


def test_autoencoderkl_decode_adds_no_randomness_to_text_to_image():
    """`AutoencoderKL`'s decode draws no noise in text-to-image: through `StableDiffusionPipeline.__call__` (DDIM, eta 0), the same `latents` with another `generator` give the same image. The pipeline passes its `generator` to `vae.decode`, and a `ConsistencyDecoderVAE` in its place samples there, so its images differ."""
    from tiny import decode_randomness, tiny_consistency_decoder_vae

    assert decode_randomness(tiny_vae()) == (0.0, 0.0)
    other_seed, same_seed = decode_randomness(tiny_consistency_decoder_vae())
    assert other_seed > 1e-2 and same_seed == 0.0


def test_decoding_undivided_latents_raises_nothing():
    """Forgetting the division raises no error: `AutoencoderKL.decode` accepts latents at any scale, and latents not divided by `scaling_factor` decode, with no error or warning, to an image of the same shape, a different one."""
    import warnings

    pipe = tiny_sd_pipeline()
    latents = start_latents()
    sf = pipe.vae.config.scaling_factor  # 0.18215, the default
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        right = pipe.vae.decode(latents / sf).sample
        forgot = pipe.vae.decode(latents).sample
    assert forgot.shape == right.shape
    assert (forgot - right).abs().max() > 1e-3


def test_sd_img2img_encodes_then_scales():
    """`StableDiffusionImg2ImgPipeline.prepare_latents` multiplies `latent_dist.sample(generator)` by `vae.config.scaling_factor` before `scheduler.add_noise`."""
    from diffusers import StableDiffusionImg2ImgPipeline

    pipe = StableDiffusionImg2ImgPipeline(**tiny_sd_pipeline().components)
    pipe.vae.register_to_config(scaling_factor=0.25)
    noised, add_noise = [], pipe.scheduler.add_noise
    pipe.scheduler.add_noise = lambda x, n, t: noised.append(x.clone()) or add_noise(x, n, t)
    image = images(1, HEIGHT)
    pipe.prepare_latents(image, torch.tensor([300]), 1, 1, torch.float32, "cpu", torch.Generator().manual_seed(0))  # fmt: skip
    with torch.no_grad():
        dist = pipe.vae.encode(image).latent_dist
    noise = torch.randn(dist.mean.shape, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(noised[0], (dist.mean + dist.std * noise) * 0.25)


def test_sd3_shift_then_scale():
    """`StableDiffusion3Pipeline` never runs the VAE encoder for text-to-image: it samples 16-channel latents and decodes `vae.decode(latents / scaling_factor + shift_factor)`; `StableDiffusion3Img2ImgPipeline.prepare_latents` encodes `(latent_dist.sample() - shift_factor) * scaling_factor`."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        StableDiffusion3Img2ImgPipeline,
        StableDiffusion3Pipeline,
    )

    parts = tiny_sd3_parts()
    vae = parts["vae"]
    sf, shift = 1.5305, 0.0609
    pipe = StableDiffusion3Pipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    seen = record_decode(pipe.vae)
    encoded = []
    hook = pipe.vae.encoder.register_forward_hook(lambda *a: encoded.append(1))
    g = torch.Generator().manual_seed(1)
    run = dict(
        prompt_embeds=torch.randn(1, 10, 32, generator=g),
        pooled_prompt_embeds=torch.randn(1, 16, generator=g),
        guidance_scale=1.0, num_inference_steps=2, height=HEIGHT, width=WIDTH,
        generator=torch.Generator().manual_seed(2),
    )  # fmt: skip
    latents = pipe(**run, output_type="latent").images
    assert latents.shape == (1, 16, HEIGHT // 2, WIDTH // 2)
    run["generator"] = torch.Generator().manual_seed(2)
    pipe(**run, output_type="pt")
    torch.testing.assert_close(seen[0], latents / sf + shift)
    assert encoded == []  # text-to-image: decode only
    hook.remove()

    img2img = StableDiffusion3Img2ImgPipeline(
        **{**parts, "scheduler": FlowMatchEulerDiscreteScheduler()}
    )
    noised, scale_noise = [], img2img.scheduler.scale_noise
    img2img.scheduler.scale_noise = lambda x, t, n: noised.append(x.clone()) or scale_noise(x, t, n)
    image = images(1, HEIGHT)
    img2img.prepare_latents(image, torch.tensor([500.0]), 1, 1, torch.float32, "cpu", torch.Generator().manual_seed(0))  # fmt: skip
    with torch.no_grad():
        dist = vae.encode(image).latent_dist
    noise = torch.randn(dist.mean.shape, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(noised[0], (dist.mean + dist.std * noise - shift) * sf)


def test_sd3_inpaint_decodes_without_adding_the_shift_back():
    """`StableDiffusion3InpaintPipeline` decodes without adding `shift_factor` back: through `__call__` (same `generator`, `output_type="latent"` then `"pt"`) it hands `vae.decode` `latents / scaling_factor`, where `StableDiffusion3Img2ImgPipeline` and `FluxImg2ImgPipeline` hand it `latents / scaling_factor + shift_factor` (Flux.1's unpacked first)."""
    from diffusers import (
        FluxImg2ImgPipeline,
        FluxPipeline,
        StableDiffusion3Img2ImgPipeline,
        StableDiffusion3InpaintPipeline,
    )

    image = images(1, HEIGHT) * 0.5 + 0.5  # in [0, 1], as the image processor expects
    mask = torch.zeros(1, 1, HEIGHT, WIDTH)
    mask[..., : HEIGHT // 2, :] = 1.0
    g = torch.Generator().manual_seed(1)
    sd3 = dict(prompt_embeds=torch.randn(1, 10, 32, generator=g), pooled_prompt_embeds=torch.randn(1, 16, generator=g))  # fmt: skip
    flux = dict(prompt_embeds=torch.randn(1, 10, 32, generator=g), pooled_prompt_embeds=torch.randn(1, 24, generator=g))  # fmt: skip
    runs = (
        (StableDiffusion3InpaintPipeline, tiny_sd3_parts(), dict(**sd3, mask_image=mask)),
        (StableDiffusion3Img2ImgPipeline, tiny_sd3_parts(), sd3),
        (FluxImg2ImgPipeline, tiny_flux_parts(), flux),
    )
    undone = {}
    for cls, parts, kwargs in runs:
        pipe = cls(**parts)
        pipe.set_progress_bar_config(disable=True)
        seen = record_decode(pipe.vae)
        run = dict(**kwargs, image=image, strength=0.6, guidance_scale=1.0, num_inference_steps=2,
                   height=HEIGHT, width=WIDTH)  # fmt: skip
        with torch.no_grad():
            latents = pipe(**run, generator=torch.Generator().manual_seed(2), output_type="latent").images  # fmt: skip
            pipe(**run, generator=torch.Generator().manual_seed(2), output_type="pt")
        if latents.ndim == 3:  # Flux.1's packed tokens
            latents = FluxPipeline._unpack_latents(latents, HEIGHT, WIDTH, pipe.vae_scale_factor)
        config = pipe.vae.config
        assert not torch.allclose(latents / config.scaling_factor, latents / config.scaling_factor + config.shift_factor)  # fmt: skip
        if torch.allclose(seen[0], latents / config.scaling_factor + config.shift_factor):
            undone[cls.__name__] = True
        else:
            torch.testing.assert_close(seen[0], latents / config.scaling_factor)
            undone[cls.__name__] = False
    assert undone == {
        "StableDiffusion3InpaintPipeline": False,
        "StableDiffusion3Img2ImgPipeline": True,
        "FluxImg2ImgPipeline": True,
    }


def test_flux_uses_the_same_lines():
    """`FluxPipeline` never runs the VAE encoder for text-to-image; its state is packed tokens `(B, (H/16)(W/16), 64)`, not a latent grid: after the loop it unpacks them to `(B, 16, H/8, W/8)` and decodes `latents / scaling_factor + shift_factor`; `FluxImg2ImgPipeline._encode_vae_image` returns `(latent_dist.sample() - shift_factor) * scaling_factor`."""
    from diffusers import FluxImg2ImgPipeline, FluxPipeline

    parts = tiny_flux_parts()
    pipe = FluxPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    seen = record_decode(pipe.vae)
    encoded = []
    hook = pipe.vae.encoder.register_forward_hook(lambda *a: encoded.append(1))
    g = torch.Generator().manual_seed(1)
    run = dict(
        prompt_embeds=torch.randn(1, 10, 32, generator=g),
        pooled_prompt_embeds=torch.randn(1, 24, generator=g),
        guidance_scale=1.0, num_inference_steps=2, height=HEIGHT, width=WIDTH,
    )  # fmt: skip
    f = pipe.vae_scale_factor  # 2 for this two-block VAE (8 for Flux's)
    packed = pipe(**run, generator=torch.Generator().manual_seed(2), output_type="latent").images
    assert packed.shape == (1, (HEIGHT // (2 * f)) * (WIDTH // (2 * f)), 64)
    pipe(**run, generator=torch.Generator().manual_seed(2), output_type="pt")
    grid = FluxPipeline._unpack_latents(packed, HEIGHT, WIDTH, f)
    assert seen[0].shape == (1, 16, HEIGHT // f, WIDTH // f)
    torch.testing.assert_close(seen[0], grid / 0.3611 + 0.1159)
    assert encoded == []  # text-to-image: decode only
    hook.remove()

    img2img = FluxImg2ImgPipeline(**parts)
    image = images(1, HEIGHT)
    got = img2img._encode_vae_image(image, torch.Generator().manual_seed(0))
    with torch.no_grad():
        dist = parts["vae"].encode(image).latent_dist
    noise = torch.randn(dist.mean.shape, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(got, (dist.mean + dist.std * noise - 0.1159) * 0.3611)


def test_every_latent_depends_on_the_whole_image():
    """A latent position is not a code for its 8 x 8 patch alone: in a tiny `AutoencoderKL`, changing one corner pixel changes `latent_dist.mean` at the opposite corner, through the encoder's mid-block self-attention and, with that removed (`mid_block_add_attention=False`), through GroupNorm's statistics over the whole feature map; with both removed the change stays within the convolutions' reach."""
    x = images(1, 64)
    moved = x.clone()
    moved[0, :, 0, 0] += 1.0  # one pixel, top-left corner

    def change(vae):
        with torch.no_grad():
            before, after = vae.encode(x).latent_dist.mean, vae.encode(moved).latent_dist.mean
        return (after - before).abs()[0].amax(0)  # (H/f, W/f): largest change per position

    full, no_attention = narrow_vae((8, 16)), narrow_vae((8, 16), mid_block_add_attention=False)
    assert change(full)[-1, -1] > 0 and change(no_attention)[-1, -1] > 0  # far corner moved
    for module in list(no_attention.encoder.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.GroupNorm):
                setattr(module, name, torch.nn.Identity())
    local = change(no_attention)
    assert local[-1, -1] == 0 and local[:8, :8].sum() > 0  # only the corner's neighbourhood


def test_tiled_decoding_is_not_exact():
    """`enable_tiling()` changes the decoded image, not only the memory: each tile is decoded alone (its convolutions, GroupNorms and attention see only that tile) and the tiles are blended over their overlap, so the result differs from the whole-image decode, also with the decoder's attention and every GroupNorm removed (the convolutions pad at each tile's edge)."""
    latents = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    plain = narrow_vae((8, 16), sample_size=16, mid_block_add_attention=False)
    for module in list(plain.decoder.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.GroupNorm):
                setattr(module, name, torch.nn.Identity())
    for vae in (narrow_vae((8, 16), sample_size=16), plain):
        with torch.no_grad():
            whole = vae.decode(latents).sample
            vae.enable_tiling()
            tiled = vae.decode(latents).sample
        assert tiled.shape == whole.shape and (tiled - whole).abs().max() > 1e-3


def test_decoder_widest_activation_is_at_output_resolution():
    """With SD's channel ratios (its `block_out_channels=(128, 256, 512, 512)`, scaled down here), `AutoencoderKL`'s decoder has its widest activations `(B, block_out_channels[1], H, W)` at the output resolution, from the last upsampler's output on (the last up block's first resnet normalises that width before reducing it), and the last up block runs `block_out_channels[0]` channels there; the input latents are `(B, latent_channels, H/8, W/8)`."""
    block_out_channels, size = (8, 16, 32, 32), 64
    vae = narrow_vae(block_out_channels, norm_num_groups=8)
    shapes = {}
    hooks = [
        module.register_forward_hook(
            # the first call's output shape (a SiLU runs twice per resnet); return None
            lambda m, a, out, name=name: shapes.__setitem__(
                name, shapes.get(name, tuple(out.shape))
            )
        )
        for name, module in vae.decoder.named_modules()
        if name  # every module, at any depth
    ]
    with torch.no_grad():
        vae.decode(torch.randn(1, 4, size // 8, size // 8))
    for hook in hooks:
        hook.remove()
    numel = {name: torch.Size(shape).numel() for name, shape in shapes.items()}
    widest = {n for n, k in numel.items() if k == max(numel.values())}
    assert {"up_blocks.2.upsamplers.0", "up_blocks.3.resnets.0.norm1"} <= widest
    assert {shapes[n] for n in widest} == {(1, block_out_channels[1], size, size)}
    assert shapes["up_blocks.3"] == (1, block_out_channels[0], size, size)


def test_vae_parameters_are_a_small_fraction_of_the_denoisers():
    """The VAE's parameters are a small fraction of the denoiser's, under a tenth, for each pipeline in the size table that lists its VAE (`labkit/model_sizes.json`, counted from the published configs)."""
    from labkit import model_sizes

    params = {(r["pipeline"], r["component"]): r["params"] for r in model_sizes.rows()}
    with_vae = {pipeline for pipeline, component in params if component == "vae"}
    assert len(with_vae) >= 4
    for pipeline in with_vae:
        denoiser = params.get((pipeline, "unet")) or params[(pipeline, "transformer")]
        assert params[(pipeline, "vae")] < denoiser / 10, pipeline


def test_first_unet_level_attends_over_one_token_per_latent_position(sd_pipe):
    """At SD 1.x's first UNet level one head's self-attention scores are `(H/8)(W/8)` squared: through `StableDiffusionPipeline.__call__`, `attn1` of the first `CrossAttnDownBlock2D` runs over one token per latent position, `block_out_channels[0]` wide."""
    unet = sd_pipe.unet
    assert type(unet.down_blocks[0]).__name__ == "CrossAttnDownBlock2D"
    attn1 = unet.down_blocks[0].attentions[0].transformer_blocks[0].attn1
    seen = []
    hook = attn1.register_forward_pre_hook(
        lambda m, a, k: seen.append(tuple((a[0] if a else k["hidden_states"]).shape)),
        with_kwargs=True,
    )
    try:
        sd_pipe(prompt_embeds=torch.randn(1, 77, 32), num_inference_steps=1, guidance_scale=1.0,
                height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
    finally:
        hook.remove()
    f = sd_pipe.vae_scale_factor
    assert seen == [(1, (HEIGHT // f) * (WIDTH // f), unet.config.block_out_channels[0])]


def test_vae_slicing_decodes_one_image_at_a_time(record_calls):
    """After `vae.enable_slicing()`, `vae.decode` on a batch of `B` latents runs the decoder `B` times on one image each, with the same result."""
    vae = narrow_vae()
    latents = torch.randn(3, 4, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = vae.decode(latents).sample
        vae.enable_slicing()
        decoder = record_calls(vae.decoder)
        sliced = vae.decode(latents).sample
    assert [args[0].shape[0] for args, _ in decoder.calls] == [1, 1, 1]
    torch.testing.assert_close(sliced, whole, atol=1e-5, rtol=1e-5)


def test_vae_tiling_bounds_each_decoder_call(record_calls):
    """After `vae.enable_tiling()`, latents larger than `tile_latent_min_size` (`sample_size / f`) are decoded in overlapping tiles of at most that many latents a side, blended into the full `(B, 3, H, W)` image, so one decoder call's activations are set by the tile, not the image."""
    vae = narrow_vae((8, 16), sample_size=16)  # f = 2: tiles of 8 x 8 latents, 16 x 16 pixels
    vae.enable_tiling()
    assert vae.tile_latent_min_size == 8
    decoder = record_calls(vae.decoder)
    with torch.no_grad():
        image = vae.decode(torch.randn(1, 4, 16, 16)).sample
    assert image.shape == (1, 3, 32, 32)
    sides = [max(args[0].shape[-2:]) for args, _ in decoder.calls]
    assert len(sides) > 1 and max(sides) <= 8


def sdxl_pipeline():
    """``tiny_sdxl_pipeline`` with a default EulerDiscreteScheduler (its own betas)."""
    from diffusers import EulerDiscreteScheduler

    return tiny_sdxl_pipeline(EulerDiscreteScheduler(), force_zeros_for_empty_prompt=True)


def test_sdxl_decodes_in_float32_when_the_vae_is_float16_and_force_upcast(
    record_calls, monkeypatch
):
    """In a float16 `StableDiffusionXLPipeline` whose VAE has `force_upcast=True` (the default), `__call__` decodes float32 latents with a float32 VAE, doubling the decoder's activation bytes, through `upcast_vae()`, which warns that it is deprecated and names `pipe.vae.to(torch.float32)` instead; that replacement alone does not give a float32 decode: the same call then raises a dtype error or, where `torch.backends.mps.is_available()` (the pipeline's own condition, patched both ways), casts the VAE back to float16 and decodes in float16."""
    from diffusers.utils import logging

    logging.set_verbosity_error()  # diffusers' notes about modules kept in float32 on .to()
    pipe = sdxl_pipeline().to(torch.float16)
    assert pipe.vae.config.force_upcast is True
    decoder = record_calls(pipe.vae.decoder)
    prompt_embeds = torch.randn(1, 77, 32, generator=torch.Generator().manual_seed(1)).half()
    pooled = torch.randn(1, 16, generator=torch.Generator().manual_seed(2)).half()
    run = dict(
        prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled, num_inference_steps=2,
        guidance_scale=1.0, height=HEIGHT, width=WIDTH, output_type="pt",
    )  # fmt: skip
    with pytest.warns(FutureWarning, match=r"upcast_vae.*pipe\.vae\.to\(torch\.float32\)"):
        pipe(**run)
    assert len(decoder.calls) == 1 and decoder.calls[0][0][0].dtype == torch.float32
    assert pipe.vae.dtype == torch.float16  # cast back after the decode
    pipe.vae.to(torch.float32)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="should be the same"):
        pipe(**run)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    pipe(**run)  # no error: the pipeline undoes the user's float32 cast
    assert len(decoder.calls) == 2 and decoder.calls[1][0][0].dtype == torch.float16
    assert pipe.vae.dtype == torch.float16


def test_flux_latent_output_is_packed_and_normalised_so_a_decoder_service_must_undo_both():
    """`FluxPipeline(..., output_type="latent")` returns the loop's packed tokens `(B, (H/16)(W/16), 64)`, still scaled and shifted: a separate decode step must `_unpack_latents`, compute `latents / scaling_factor + shift_factor`, then `vae.decode` and postprocess, which reproduces the pipeline's own image exactly."""
    from diffusers import FluxPipeline

    parts = tiny_flux_parts()
    pipe = FluxPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    g = torch.Generator().manual_seed(1)
    run = dict(
        prompt_embeds=torch.randn(1, 10, 32, generator=g),
        pooled_prompt_embeds=torch.randn(1, 24, generator=g),
        guidance_scale=1.0, num_inference_steps=2, height=HEIGHT, width=WIDTH,
    )  # fmt: skip
    with torch.no_grad():
        packed = pipe(
            **run, generator=torch.Generator().manual_seed(2), output_type="latent"
        ).images
        image = pipe(**run, generator=torch.Generator().manual_seed(2), output_type="pt").images
        f = pipe.vae_scale_factor
        assert packed.shape == (1, (HEIGHT // (2 * f)) * (WIDTH // (2 * f)), 64)
        grid = FluxPipeline._unpack_latents(packed, HEIGHT, WIDTH, f)  # (B, 16, H/f, W/f)
        config = pipe.vae.config
        decoded = pipe.vae.decode(grid / config.scaling_factor + config.shift_factor).sample
        naive = pipe.vae.decode(grid).sample  # forgetting the normalisation
    ours = pipe.image_processor.postprocess(decoded, output_type="pt")
    torch.testing.assert_close(ours, image)
    assert (pipe.image_processor.postprocess(naive, output_type="pt") - image).abs().amax() > 1e-3


def test_sdxl_uses_per_channel_latents_mean_and_std_when_the_vae_config_sets_them():
    """When the VAE's config sets both `latents_mean` and `latents_std` (one value per channel), `StableDiffusionXLPipeline` decodes `latents * latents_std / scaling_factor + latents_mean` instead of `latents / scaling_factor`; with only `latents_mean` set it decodes `latents / scaling_factor`; `AutoencoderKL` defaults both to None."""
    from tiny import sdxl_call, tiny_sdxl_pipeline, tiny_vae

    assert tiny_vae().config.latents_mean is None and tiny_vae().config.latents_std is None
    mean, std = [0.1, -0.2, 0.3, 0.0], [1.0, 2.0, 0.5, 1.5]
    seen = {}
    vaes = (("plain", tiny_vae()), ("stats", tiny_vae(latents_mean=mean, latents_std=std)),
            ("mean only", tiny_vae(latents_mean=mean)))  # fmt: skip
    for name, vae in vaes:
        pipe = tiny_sdxl_pipeline(vae=vae)
        seen[name] = record_decode(pipe.vae)
        with torch.no_grad():
            sdxl_call(pipe, torch.float32, output_type="np")
    sf = 0.18215  # AutoencoderKL's default scaling_factor
    latents = seen["plain"][0] * sf  # the loop's final latents (same seed, same loop)
    m, s = torch.tensor(mean).view(1, 4, 1, 1), torch.tensor(std).view(1, 4, 1, 1)
    torch.testing.assert_close(seen["stats"][0], latents * s / sf + m)
    torch.testing.assert_close(seen["mean only"][0], seen["plain"][0])


def test_wan_and_flux2_vaes_normalise_per_channel():
    """`AutoencoderKLWan`'s defaults carry 16 `latents_mean` and 16 `latents_std` values, one per latent channel (`z_dim=16`); `AutoencoderKLFlux2` defaults to 32 latent channels (Flux.1's `AutoencoderKL` has 16) and carries a `BatchNorm2d` over the 2 x 2-patchified 128 channels, whose running mean and variance `Flux2Pipeline` uses in place of `scaling_factor` and `shift_factor` (see the next test)."""
    from diffusers import AutoencoderKLFlux2, AutoencoderKLWan
    from model_configs import FLUX_VAE

    with torch.device("meta"):
        wan = AutoencoderKLWan()
        flux2 = AutoencoderKLFlux2()
    assert wan.config.z_dim == len(wan.config.latents_mean) == len(wan.config.latents_std) == 16
    assert FLUX_VAE["latent_channels"] == 16 and flux2.config.latent_channels == 32
    assert isinstance(flux2.bn, torch.nn.BatchNorm2d) and flux2.bn.num_features == 4 * 32
    assert not flux2.bn.affine and flux2.bn.track_running_stats


def test_flux2_pipeline_decodes_with_the_batchnorm_running_statistics():
    """`Flux2Pipeline` (tiny random `Flux2Transformer2DModel` and `AutoencoderKLFlux2`, prompt_embeds given) hands `vae.decode` its packed tokens unpacked to the patchified grid, times `sqrt(bn.running_var + batch_norm_eps)` plus `bn.running_mean`, then unpatchified; `AutoencoderKLFlux2` has no `scaling_factor` or `shift_factor` to use, and its own `encode` and `decode` never run the `BatchNorm2d`."""
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2Pipeline,
        Flux2Transformer2DModel,
    )

    torch.manual_seed(0)
    vae = AutoencoderKLFlux2(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                             up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4,
                             norm_num_groups=4, layers_per_block=1)  # fmt: skip
    transformer = Flux2Transformer2DModel(in_channels=16, num_layers=1, num_single_layers=1,
                                          attention_head_dim=16, num_attention_heads=2,
                                          joint_attention_dim=32, timestep_guidance_channels=32,
                                          axes_dims_rope=(4, 4, 4, 4))  # fmt: skip
    pipe = Flux2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None,
                         tokenizer=None, transformer=transformer)  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    assert "scaling_factor" not in vae.config and "shift_factor" not in vae.config
    vae.bn.running_mean.normal_()
    vae.bn.running_var.uniform_(0.5, 2.0)
    seen = record_decode(vae)
    bn_runs = []
    hook = vae.bn.register_forward_hook(lambda *a: bn_runs.append(1))
    run = dict(prompt_embeds=torch.randn(1, 6, 32), height=16, width=16, num_inference_steps=1)
    with torch.no_grad():
        packed = pipe(
            **run, generator=torch.Generator().manual_seed(0), output_type="latent"
        ).images
        pipe(**run, generator=torch.Generator().manual_seed(0), output_type="pt")
        vae.encode(torch.zeros(1, 3, 16, 16))
    hook.remove()
    assert bn_runs == []  # the pipeline reads the layer's statistics; nothing runs the layer
    # vae_scale_factor 2 here: 8 x 8 latents of 4 channels, 4 x 4 tokens of 4 x 2 x 2 = 16
    assert packed.shape == (1, 16, 16)
    grid = packed.transpose(1, 2).reshape(1, 16, 4, 4)  # tokens in raster order
    std = torch.sqrt(vae.bn.running_var + vae.config.batch_norm_eps).view(1, -1, 1, 1)
    expected = Flux2Pipeline._unpatchify_latents(grid * std + vae.bn.running_mean.view(1, -1, 1, 1))
    assert seen[0].shape == (1, 4, 8, 8)
    torch.testing.assert_close(seen[0], expected)


def test_tiling_and_slicing_do_nothing_at_batch_1_up_to_the_vaes_sample_size(
    record_calls, published_vaes
):
    """`vae.enable_tiling()` tiles only latents with a side larger than `tile_latent_min_size` (`sample_size / f`): 64 latents (512 px) for SD 1.x's published VAE config and 128 (1024 px) for SDXL's, SD3's and Flux.1's, so at each family's default size it changes nothing. Through `StableDiffusionPipeline.__call__`, a tiled and sliced VAE decodes one image whose latents have exactly that side in one decoder call, and larger ones in several; `vae.enable_slicing()` leaves a batch of 1 as one call."""
    from tiny import real_vae_tiling

    for (config, vae), side in zip(published_vaes, (64, 128, 128, 128), strict=True):
        assert vae.tile_latent_min_size == side == config["sample_size"] // 8
    # each family's default size (its denoiser's sample_size, or FluxPipeline's
    # default_sample_size, times 8) decoded on the meta device, then one latent more:
    # only the larger reaches tiled_decode
    defaults = {name: (px, tiled) for name, (_, px, tiled) in real_vae_tiling().items()}
    assert defaults == {"SD 1.5": (512, [65]), "SDXL": (1024, [129]), "SD3": (1024, [129]), "Flux.1": (1024, [129])}  # fmt: skip
    pipe = tiny_sd_pipeline()  # tiny VAE: f = 2, sample_size 16: tiles of 8 latents
    pipe.vae.enable_tiling()
    pipe.vae.enable_slicing()
    assert pipe.vae.tile_latent_min_size == HEIGHT // 2
    decoder = record_calls(pipe.vae.decoder)
    calls = []
    for size in (HEIGHT, 2 * HEIGHT):  # latents of 8 (the limit) and 16 a side
        before = len(decoder.calls)
        with torch.no_grad():
            pipe(prompt_embeds=torch.randn(1, 77, 32), num_inference_steps=1, guidance_scale=1.0,
                 height=size, width=size, output_type="pt")  # fmt: skip
        calls.append(len(decoder.calls) - before)
    assert calls[0] == 1 and calls[1] > 1


def test_sdxl_upcast_casts_the_whole_vae_each_decode_and_sd_sd3_flux_ignore_force_upcast(
    record_calls,
):
    """An fp16 `StableDiffusionXLPipeline` whose VAE has `force_upcast=True` casts the whole VAE to float32 before the decode and back to float16 after it, on every call that decodes, so the decoder's weights are float32 during the decode too (twice their float16 bytes). `StableDiffusionPipeline`, `StableDiffusion3Pipeline` and `FluxPipeline` do not read `force_upcast`: with the same default config, their float16 VAE decodes float16 latents with float16 weights."""
    from diffusers.utils import logging
    from tiny import FLUX_VAE_FACTORS, dit_embeds, tiny_flux_pipeline, tiny_sd3_pipeline_16ch

    logging.set_verbosity_error()  # diffusers' notes about float16 on the CPU
    half = torch.float16

    def decode_dtypes(pipe, output_type="pt", **kwargs):
        """(input dtype, weight dtype) of each decoder call, and the VAE's `.to` casts."""
        seen, casts, to = [], [], pipe.vae.to
        hook = pipe.vae.decoder.register_forward_pre_hook(
            lambda m, a: seen.append((a[0].dtype, m.conv_in.weight.dtype))
        )
        pipe.vae.to = lambda *a, **k: casts.append(k.get("dtype")) or to(*a, **k)
        try:
            with torch.no_grad():
                pipe(**kwargs, num_inference_steps=1, guidance_scale=1.0, height=HEIGHT,
                     width=WIDTH, output_type=output_type)  # fmt: skip
        finally:
            hook.remove()
            del pipe.vae.to
        return seen, casts

    sdxl = sdxl_pipeline().to(half)
    embeds = dict(prompt_embeds=torch.randn(1, 77, 32).half(), pooled_prompt_embeds=torch.randn(1, 16).half())  # fmt: skip
    with pytest.warns(FutureWarning, match="upcast_vae"):
        seen, casts = decode_dtypes(sdxl, **embeds)
    assert seen == [(torch.float32, torch.float32)] and casts == [torch.float32, half]
    assert decode_dtypes(sdxl, output_type="latent", **embeds) == ([], [])  # no decode, no cast
    (t3, p3) = dit_embeds(1)
    others = [
        (tiny_sd_pipeline(), dict(prompt_embeds=torch.randn(1, 77, 32).half())),
        (tiny_sd3_pipeline_16ch(), dict(prompt_embeds=t3.half(), pooled_prompt_embeds=p3.half())),
        (tiny_flux_pipeline(vae_config=FLUX_VAE_FACTORS), dict(prompt_embeds=t3.half(), pooled_prompt_embeds=p3.half())),
    ]  # fmt: skip
    for pipe, kwargs in others:
        pipe.to(half)
        assert pipe.vae.config.force_upcast is True
        seen, casts = decode_dtypes(pipe, **kwargs)
        assert seen == [(half, half)] and casts == [], type(pipe).__name__
