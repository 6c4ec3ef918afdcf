"""Lab 05 (VAE latent space) against the real AutoencoderKL and StableDiffusionPipeline.

No weights: every ``AutoencoderKL`` here is built in code from a tiny random config
(a few channels per block), which keeps the architecture, and with it every shape,
of the real one. The decoder walk the starter prints for SD's VAE is recomputed here
from module hooks on a tiny decoder with the same number of blocks.
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
)

LAB05 = "code/lab-05-vae-latent-space/vae_latents.py"


@pytest.mark.parametrize("blocks", [1, 2, 3, 4])
def test_latents_are_downsampled_by_two_per_extra_block(blocks):
    """`vae.encode` maps `(B, 3, H, W)` to latents `(B, latent_channels, H/f, W/f)` with `f = 2 ** (len(block_out_channels) - 1)`, 8 for SD's four blocks, `vae.decode` maps them back to `(B, 3, H, W)`, and `StableDiffusionPipeline.vae_scale_factor` is that same `f`."""
    vae = narrow_vae((8, 16, 16, 16)[:blocks])
    f = 2 ** (blocks - 1)
    x = images()
    with torch.no_grad():
        latents = vae.encode(x).latent_dist.mean
        decoded = vae.decode(latents).sample
    assert latents.shape == (2, 4, 32 // f, 32 // f)
    assert decoded.shape == x.shape
    assert tiny_sd_pipeline(vae=vae).vae_scale_factor == f


def test_sixteen_latent_channels():
    """`latent_channels=16` (the SD3 and Flux.1 layout) gives latents `(B, 16, H/8, W/8)`; the encoder's last convolution outputs twice that, a mean and a log-variance per channel."""
    vae = narrow_vae(latent_channels=16)
    with torch.no_grad():
        latents = vae.encode(images()).latent_dist.mean
    assert latents.shape == (2, 16, 4, 4)
    assert vae.encoder.conv_out.out_channels == 32


def test_scaling_factor_default_and_shift_factor():
    """`AutoencoderKL`'s default `vae.config.scaling_factor` is 0.18215 (SD 1.x's value), and its config also has `shift_factor`, `None` by default (SD3 and Flux.1 set one)."""
    from diffusers import AutoencoderKL

    config = AutoencoderKL().config
    assert config.scaling_factor == 0.18215
    assert "shift_factor" in config and config.shift_factor is None


def test_latent_dist_is_a_diagonal_gaussian():
    """`vae.encode(x).latent_dist` is a `DiagonalGaussianDistribution`: `.mode()` returns its `.mean`, and `.sample(generator)` returns `mean + std * noise` with `std = exp(logvar / 2)`, so two `.sample(generator)` draws with different generators give different latents."""
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    vae = narrow_vae()
    with torch.no_grad():
        dist = vae.encode(images()).latent_dist
    assert isinstance(dist, DiagonalGaussianDistribution)
    torch.testing.assert_close(dist.mode(), dist.mean)
    torch.testing.assert_close(dist.std, torch.exp(0.5 * dist.logvar))
    noise = torch.randn(dist.mean.shape, generator=torch.Generator().manual_seed(3))
    sample = dist.sample(torch.Generator().manual_seed(3))
    torch.testing.assert_close(sample, dist.mean + dist.std * noise)
    assert not torch.allclose(sample, dist.sample(torch.Generator().manual_seed(4)))


def test_decoder_walk_matches_the_starter(run_lab):
    """The starter's `decoder_activation_shapes` gives the output shape of every module of diffusers' VAE `Decoder` (`conv_in`, `mid_block`, each `up_blocks.i.resnets.j` and `upsamplers.0`, `conv_norm_out`, `conv_out`), as hooks on a real four-block decoder record them; with SD's channel ratios (its `(128, 256, 512, 512)`, scaled down here) the widest is the last upsampler's, `(1, block_out_channels[1], H, W)`, and the last up block runs `block_out_channels[0]` channels at the output resolution."""
    walk_fn = run_lab(LAB05)["decoder_activation_shapes"]
    block_out_channels, size = (8, 16, 32, 32), 64
    vae = narrow_vae(block_out_channels, layers_per_block=2, norm_num_groups=8)
    expected = dict(walk_fn(block_out_channels, 2, 4, size))
    recorded = {}
    modules = dict(vae.decoder.named_modules())
    hooks = [
        modules[name].register_forward_hook(
            lambda m, a, out, name=name: recorded.__setitem__(name, tuple(out.shape))
        )
        for name in expected
        if name != "input"
    ]
    with torch.no_grad():
        vae.decode(torch.randn(expected["input"]))
    for hook in hooks:
        hook.remove()
    assert recorded == {name: shape for name, shape in expected.items() if name != "input"}
    widest = max(recorded, key=lambda name: torch.Size(recorded[name]).numel())
    assert widest == "up_blocks.2.upsamplers.0"
    assert recorded[widest] == (1, block_out_channels[1], size, size)
    assert recorded["up_blocks.3.resnets.2"] == (1, block_out_channels[0], size, size)


def test_decoder_mid_block_attention_has_one_head_at_latent_resolution(monkeypatch):
    """The decoder's mid block runs self-attention with one head over the `(H/8) * (W/8)` latent positions, before any upsampling."""
    import torch.nn.functional as F  # noqa: N812

    vae = narrow_vae((8, 16, 32, 32), norm_num_groups=8)
    assert vae.decoder.mid_block.attentions[0].heads == 1
    sdpa, queries = F.scaled_dot_product_attention, []

    def recording(query, *args, **kwargs):
        queries.append(tuple(query.shape))
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    with torch.no_grad():
        vae.decode(torch.randn(1, 4, 8, 8))
    assert queries == [(1, 1, 8 * 8, 32)]  # (B, heads, (H/8)(W/8), block_out_channels[-1])


def test_pipeline_decodes_latents_divided_by_scaling_factor():
    """For an image output `StableDiffusionPipeline` decodes `vae.decode(latents / vae.config.scaling_factor)` once after the loop, whatever `scaling_factor` the VAE's config holds (with `output_type="latent"`, not at all)."""
    pipe = tiny_sd_pipeline()
    pipe.vae.register_to_config(scaling_factor=0.5)
    seen = []
    decode = pipe.vae.decode
    pipe.vae.decode = lambda z, *a, **k: seen.append(z.clone()) or decode(z, *a, **k)
    run = dict(num_inference_steps=2, height=HEIGHT, width=WIDTH, guidance_scale=1.0)
    embeds = torch.randn(1, 77, 32, generator=torch.Generator().manual_seed(1))
    latents = pipe(prompt_embeds=embeds, latents=start_latents(), output_type="latent", **run)
    image = pipe(prompt_embeds=embeds, latents=start_latents(), output_type="pt", **run)
    assert len(seen) == 1 and image.images.shape == (1, 3, HEIGHT, WIDTH)
    torch.testing.assert_close(seen[0], latents.images / 0.5)


def test_prepare_latents_draws_unit_variance_noise_with_ddim():
    """`StableDiffusionPipeline.prepare_latents` starts from unit-variance noise with DDIM, whose `init_noise_sigma` is 1: it multiplies the drawn noise by `scheduler.init_noise_sigma`, which `EulerDiscreteScheduler` sets above 1."""
    from diffusers import DDIMScheduler, EulerDiscreteScheduler
    from tiny import SD_SCHEDULER

    noise = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    ddim = DDIMScheduler(**SD_SCHEDULER)
    for scheduler in (ddim, EulerDiscreteScheduler.from_config(ddim.config)):
        pipe = tiny_sd_pipeline(scheduler)
        pipe.scheduler.set_timesteps(2)
        latents = pipe.prepare_latents(1, 4, HEIGHT, WIDTH, torch.float32, "cpu", torch.Generator().manual_seed(0))  # fmt: skip
        sigma = pipe.scheduler.init_noise_sigma
        torch.testing.assert_close(latents, noise * sigma)
        assert (sigma == 1.0) == isinstance(scheduler, DDIMScheduler), (
            type(scheduler).__name__,
            sigma,
        )


def test_img2img_encodes_a_sample_times_scaling_factor():
    """`StableDiffusionImg2ImgPipeline.prepare_latents` encodes the image, draws `latent_dist.sample(generator)` and multiplies it by `vae.config.scaling_factor` before adding noise."""
    from diffusers import StableDiffusionImg2ImgPipeline

    pipe = StableDiffusionImg2ImgPipeline(**tiny_sd_pipeline().components)
    pipe.vae.register_to_config(scaling_factor=0.5)
    noised = []
    add_noise = pipe.scheduler.add_noise
    pipe.scheduler.add_noise = lambda x, n, t: noised.append(x.clone()) or add_noise(x, n, t)
    image = images(1, HEIGHT)
    timestep = torch.tensor([500])
    pipe.prepare_latents(image, timestep, 1, 1, torch.float32, "cpu", torch.Generator().manual_seed(0))  # fmt: skip
    with torch.no_grad():
        dist = pipe.vae.encode(image).latent_dist
    noise = torch.randn(dist.mean.shape, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(noised[0], (dist.mean + dist.std * noise) * 0.5)


def test_text_to_image_never_encodes(sd_pipe, record_calls):
    """`StableDiffusionPipeline` never runs the VAE encoder for text-to-image: it starts from noise of latent shape and calls only the decoder, once for an image output."""
    encoder, decoder = record_calls(sd_pipe.vae.encoder), record_calls(sd_pipe.vae.decoder)
    sd_pipe(
        prompt_embeds=torch.randn(1, 77, 32, generator=torch.Generator().manual_seed(1)),
        num_inference_steps=2, height=HEIGHT, width=WIDTH, output_type="pt", guidance_scale=1.0,
    )  # fmt: skip
    assert encoder.calls == [] and len(decoder.calls) == 1


def test_autoencoderkl_decode_draws_no_noise():
    """`AutoencoderKL`'s decode draws no noise: through `StableDiffusionPipeline.__call__` (DDIM, eta 0), the same `latents` with another `generator` give the same image. The pipeline passes its `generator` to `vae.decode`, and a `ConsistencyDecoderVAE` in its place samples there, so its images differ."""
    from tiny import decode_randomness, narrow_vae, tiny_consistency_decoder_vae

    assert decode_randomness(narrow_vae((8, 16))) == (0.0, 0.0)
    other_seed, same_seed = decode_randomness(tiny_consistency_decoder_vae())
    assert other_seed > 1e-2 and same_seed == 0.0


def test_sd_vae_config_from_the_original_yaml(tmp_path, monkeypatch):
    """`AutoencoderKL.from_single_file(..., original_config=...)` turns SD 1.x's original VAE config (`ch: 128`, `ch_mult: [1, 2, 4, 4]`, `num_res_blocks: 2`, `z_channels: 4`, `scale_factor: 0.18215`) into `block_out_channels=[128, 256, 512, 512]`, `layers_per_block=2`, `latent_channels=4`, `scaling_factor=0.18215`; SDXL's, identical but for `scale_factor: 0.13025`, into `scaling_factor=0.13025`. Without `original_config=` it reads no original config."""
    from model_configs import SD15_LDM_ORIGINAL, SDXL_SGM_ORIGINAL  # the YAMLs, transcribed
    from tiny import single_file_vae_config

    def through_from_single_file(original, _checkpoint):
        source, config = single_file_vae_config(tmp_path, monkeypatch, original)
        assert source == "original"
        return config

    assert single_file_vae_config(tmp_path, monkeypatch)[0] == "repo"

    for original, scale_factor in ((SD15_LDM_ORIGINAL, 0.18215), (SDXL_SGM_ORIGINAL, 0.13025)):
        first_stage = original["model"]["params"]["first_stage_config"]["params"]
        assert (
            first_stage["ddconfig"]
            == SD15_LDM_ORIGINAL["model"]["params"]["first_stage_config"]["params"]["ddconfig"]
        )  # SDXL's VAE layout is SD 1.x's
        config = through_from_single_file(original, {})
        assert config["block_out_channels"] == [128, 256, 512, 512]
        assert config["layers_per_block"] == 2 and config["latent_channels"] == 4
        assert config["scaling_factor"] == scale_factor


def test_unet_defaults_are_sd_1x_layout():
    """`UNet2DConditionModel()` built with its defaults has SD 1.x's level layout: `block_out_channels=(320, 640, 1280, 1280)`, a 4-channel `conv_in` and a `CrossAttnDownBlock2D` first, so attention already runs at the `H/8` level; not every default is SD 1.x's (`cross_attention_dim` is 1280, SD 1.x's is 768)."""
    from diffusers import UNet2DConditionModel
    from model_configs import SD15_UNET

    with torch.device("meta"):
        unet = UNet2DConditionModel()  # every argument at its default
    assert list(unet.config.block_out_channels) == SD15_UNET["block_out_channels"]
    assert [b.resnets[0].out_channels for b in unet.down_blocks] == [320, 640, 1280, 1280]
    assert unet.conv_in.in_channels == SD15_UNET["in_channels"] == 4
    assert [type(b).__name__ for b in unet.down_blocks] == SD15_UNET["down_block_types"]
    assert unet.config.cross_attention_dim == 1280 != SD15_UNET["cross_attention_dim"]


def test_first_level_self_attention_has_one_token_per_latent_position(sd_pipe):
    """In a `CrossAttnDownBlock2D` first level, self-attention (`attn1`) runs over `(H/8) * (W/8)` tokens, one per latent position, each `block_out_channels[0]` wide."""
    unet = sd_pipe.unet
    attn1 = unet.down_blocks[0].attentions[0].transformer_blocks[0].attn1
    seen = []
    hook = attn1.register_forward_pre_hook(
        lambda m, a, k: seen.append(tuple((a[0] if a else k["hidden_states"]).shape)),
        with_kwargs=True,
    )
    with torch.no_grad():
        unet(start_latents(), 10, encoder_hidden_states=torch.zeros(1, 77, 32))
    hook.remove()
    assert seen == [(1, 8 * 8, unet.config.block_out_channels[0])]


def test_sd3_subtracts_shift_factor_before_scaling_and_adds_it_back():
    """`StableDiffusion3Img2ImgPipeline` and `StableDiffusion3Pipeline` use `shift_factor` as well: `StableDiffusion3Img2ImgPipeline.prepare_latents` encodes `(latent_dist.sample() - shift_factor) * scaling_factor`, and `StableDiffusion3Pipeline` decodes `vae.decode(latents / scaling_factor + shift_factor)`."""
    from diffusers import StableDiffusion3Img2ImgPipeline, StableDiffusion3Pipeline

    parts = tiny_sd3_parts()
    sf, shift = 1.5305, 0.0609
    img2img = StableDiffusion3Img2ImgPipeline(**parts)
    noised = []
    scale_noise = img2img.scheduler.scale_noise
    img2img.scheduler.scale_noise = lambda x, t, n: noised.append(x.clone()) or scale_noise(x, t, n)
    image = images(1, HEIGHT)
    img2img.prepare_latents(image, torch.tensor([500.0]), 1, 1, torch.float32, "cpu", torch.Generator().manual_seed(0))  # fmt: skip
    with torch.no_grad():
        dist = parts["vae"].encode(image).latent_dist
    noise = torch.randn(dist.mean.shape, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(noised[0], (dist.mean + dist.std * noise - shift) * sf)

    pipe = StableDiffusion3Pipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    seen = []
    decode = pipe.vae.decode
    pipe.vae.decode = lambda z, *a, **k: seen.append(z.clone()) or decode(z, *a, **k)
    g = torch.Generator().manual_seed(1)
    run = dict(
        prompt_embeds=torch.randn(1, 10, 32, generator=g),
        pooled_prompt_embeds=torch.randn(1, 16, generator=g),
        guidance_scale=1.0, num_inference_steps=2, height=HEIGHT, width=WIDTH,
    )  # fmt: skip
    start = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(2))
    latents = pipe(**run, latents=start, output_type="latent").images
    assert latents.shape == (1, 16, HEIGHT // 2, WIDTH // 2)  # (B, 16, H/f, W/f)
    pipe(**run, latents=start, output_type="pt")
    torch.testing.assert_close(seen[0], latents / sf + shift)


def test_flux_pipelines_use_the_same_shift_and_scale_lines():
    """`FluxImg2ImgPipeline` and `FluxPipeline` use the same two lines: `FluxImg2ImgPipeline._encode_vae_image` returns `(latent_dist.sample() - shift_factor) * scaling_factor`, and `FluxPipeline` unpacks its `(B, N, 64)` tokens to `(B, 16, H/8, W/8)` and decodes `latents / scaling_factor + shift_factor`."""
    from diffusers import FluxImg2ImgPipeline, FluxPipeline

    parts = tiny_flux_parts()
    vae = parts["vae"]
    image = images(1, HEIGHT)
    got = FluxImg2ImgPipeline(**parts)._encode_vae_image(image, torch.Generator().manual_seed(0))
    with torch.no_grad():
        dist = vae.encode(image).latent_dist
    noise = torch.randn(dist.mean.shape, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(got, (dist.mean + dist.std * noise - 0.1159) * 0.3611)

    pipe = FluxPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    seen, decode = [], pipe.vae.decode
    pipe.vae.decode = lambda z, *a, **k: seen.append(z.clone()) or decode(z, *a, **k)
    g = torch.Generator().manual_seed(1)
    run = dict(
        prompt_embeds=torch.randn(1, 10, 32, generator=g),
        pooled_prompt_embeds=torch.randn(1, 24, generator=g), guidance_scale=1.0,
        num_inference_steps=2, height=HEIGHT, width=WIDTH,
    )  # fmt: skip
    packed = pipe(**run, generator=torch.Generator().manual_seed(2), output_type="latent").images
    pipe(**run, generator=torch.Generator().manual_seed(2), output_type="pt")
    assert packed.shape[-1] == 64
    grid = FluxPipeline._unpack_latents(packed, HEIGHT, WIDTH, pipe.vae_scale_factor)
    torch.testing.assert_close(seen[0], grid / 0.3611 + 0.1159)
