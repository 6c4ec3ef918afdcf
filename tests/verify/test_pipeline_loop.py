"""The loop and CFG claims of labs 04 and 11, checked on the real StableDiffusionPipeline.

No weights: the UNet and VAE are tiny, randomly initialised from small configs, and
the prompt embeddings are passed in directly (no tokenizer or text encoder), so the
real ``StableDiffusionPipeline.__call__`` runs on the CPU in a fraction of a second.
A forward hook on the UNet records what each call receives.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="StableDiffusionPipeline needs transformers")

from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    StableDiffusionPipeline,
    UNet2DConditionModel,
)

from labkit.schedulers import DDIMScheduler as NumpyDDIMScheduler

EMBED_DIM = 32  # SD 1.x: 768; tiny here
HEIGHT = WIDTH = 16  # pixels; the tiny VAE downsamples by 2, so latents are (B, 4, 8, 8)


@pytest.fixture(scope="module")
def pipe():
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=EMBED_DIM,
        attention_head_dim=4,
    )
    vae = AutoencoderKL(
        block_out_channels=(32, 64),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        sample_size=HEIGHT,
    )
    # SD 1.x's scheduler config, as the checkpoints ship it (leading spacing)
    scheduler = DDIMScheduler(
        beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, set_alpha_to_one=False
    )
    pipeline = StableDiffusionPipeline(
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


@pytest.fixture
def unet_calls(pipe):
    calls = []

    def record(module, args, kwargs):
        calls.append((args[0].detach().clone(), kwargs["encoder_hidden_states"].detach().clone()))

    handle = pipe.unet.register_forward_pre_hook(record, with_kwargs=True)
    yield calls
    handle.remove()


def embeds(seed: int) -> torch.Tensor:
    return torch.randn(1, 77, EMBED_DIM, generator=torch.Generator().manual_seed(seed))


def run(pipe, guidance_scale: float, steps: int = 4, **kwargs):
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    return pipe(
        prompt_embeds=embeds(1),
        negative_prompt_embeds=embeds(2),
        num_inference_steps=steps,
        guidance_scale=guidance_scale,
        height=HEIGHT,
        width=WIDTH,
        latents=latents,
        output_type="latent",
        **kwargs,
    ).images


def test_cfg_doubles_the_batch_uncond_first(pipe, unet_calls):
    run(pipe, guidance_scale=7.5, steps=4)
    assert len(unet_calls) == 4  # one UNet call per step, even with CFG
    for sample, hidden in unet_calls:
        assert sample.shape == (2, 4, 8, 8)  # (2B, 4, H/8, W/8) with the tiny VAE's /2
        assert hidden.shape == (2, 77, EMBED_DIM)
        torch.testing.assert_close(hidden[:1], embeds(2))  # negative (uncond) half first
        torch.testing.assert_close(hidden[1:], embeds(1))
        torch.testing.assert_close(sample[:1], sample[1:])  # the same latents, twice


@pytest.mark.parametrize("guidance_scale", [1.0, 0.0])
def test_guidance_scale_at_most_one_skips_the_uncond_branch(pipe, unet_calls, guidance_scale):
    """guidance_scale <= 1 is not "unconditional": the pipeline runs the cond branch alone."""
    run(pipe, guidance_scale=guidance_scale, steps=3)
    assert [s.shape[0] for s, _ in unet_calls] == [1, 1, 1]
    for _, hidden in unet_calls:
        torch.testing.assert_close(hidden, embeds(1))


def test_pipeline_rewrites_the_sd_scheduler_config(pipe):
    """The pipeline forces steps_offset=1 and clip_sample=False on an SD scheduler."""
    assert pipe.scheduler.config.steps_offset == 1
    assert pipe.scheduler.config.clip_sample is False


def test_the_labs_loop_reproduces_the_pipeline(pipe):
    """Lab 04's guided step + lab 11's loop, written with the NumPy DDIM scheduler,
    produce the pipeline's final latents from the same UNet and starting latents."""
    guidance_scale, steps = 5.0, 6
    expected = run(pipe, guidance_scale=guidance_scale, steps=steps)

    c = pipe.scheduler.config
    scheduler = NumpyDDIMScheduler(
        beta_schedule=c.beta_schedule,
        beta_start=c.beta_start,
        beta_end=c.beta_end,
        set_alpha_to_one=c.set_alpha_to_one,
        steps_offset=c.steps_offset,
        clip_sample=c.clip_sample,
    )
    scheduler.set_timesteps(steps)
    prompt_embeds = torch.cat([embeds(2), embeds(1)])  # (2B, 77, D): negative first
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0)).numpy()
    latents = latents.astype(np.float64) * scheduler.init_noise_sigma
    for t in scheduler.timesteps:
        latent_model_input = np.concatenate([latents] * 2)  # (2B, 4, 8, 8)
        latent_model_input = scheduler.scale_model_input(latent_model_input, t)
        with torch.no_grad():
            noise_pred = (
                pipe.unet(
                    torch.from_numpy(latent_model_input).float(),
                    int(t),
                    encoder_hidden_states=prompt_embeds,
                )
                .sample.double()
                .numpy()
            )
        noise_pred_uncond, noise_pred_text = np.split(noise_pred, 2)  # chunk(2)
        noise_pred = noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)
        latents = scheduler.step(noise_pred, t, latents).prev_sample
    np.testing.assert_allclose(latents, expected.double().numpy(), rtol=1e-4, atol=1e-4)
