"""Lab 11 (scheduler loop reading) against the real StableDiffusionPipeline and schedulers.

The lab's loop, written with labkit's NumPy schedulers, must reproduce the real
pipeline's loop on a tiny random UNet (``tiny.py``): the same `init_noise_sigma`,
`scale_model_input`, `step` and number of calls.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import (
    ControlNetModel,
    DDIMScheduler,
    DDPMScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    StableDiffusionControlNetPipeline,
)
from tiny import (
    HEIGHT,
    SD_BETAS,
    WIDTH,
    embeds,
    start_latents,
    tiny_sd_pipeline,
    tiny_unet,
    tiny_vae,
)

from labkit.schedulers import EulerDiscreteScheduler as NumpyEuler

SCHEDULERS = [DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler, FlowMatchEulerDiscreteScheduler]


def test_the_labs_schedulers_have_order_one():
    """`DDPMScheduler`, `DDIMScheduler`, `EulerDiscreteScheduler` and `FlowMatchEulerDiscreteScheduler` all have `order = 1`, and `set_timesteps(n)` gives exactly `n` timesteps: one denoiser call per step."""
    for cls in SCHEDULERS:
        scheduler = cls()
        scheduler.set_timesteps(10)
        assert cls.order == 1 and len(scheduler.timesteps) == 10, cls.__name__


@pytest.mark.parametrize("steps", [3, 7])
def test_the_pipeline_calls_the_unet_once_per_timestep(record_calls, steps):
    """`StableDiffusionPipeline` with an Euler scheduler calls the UNet `len(scheduler.timesteps)` times, each with the current `t`."""
    pipe = tiny_sd_pipeline(scheduler=EulerDiscreteScheduler(**SD_BETAS))
    unet = record_calls(pipe.unet)
    pipe(
        prompt_embeds=embeds(1),
        num_inference_steps=steps,
        guidance_scale=1.0,
        height=HEIGHT,
        width=WIDTH,
        latents=start_latents(),
        output_type="latent",
    )
    assert len(unet.calls) == steps == len(pipe.scheduler.timesteps)
    assert [float(args[1]) for args, _ in unet.calls] == pipe.scheduler.timesteps.tolist()


def test_the_labs_euler_loop_reproduces_the_pipeline():
    """The lab's loop (`latents = noise * init_noise_sigma`, then `scale_model_input`, the call and `step(...).prev_sample` per `t`) with labkit's Euler scheduler reproduces `StableDiffusionPipeline`'s final `latents` with `EulerDiscreteScheduler` from the same starting noise."""
    pipe = tiny_sd_pipeline(scheduler=EulerDiscreteScheduler(**SD_BETAS))
    steps = 8
    expected = pipe(
        prompt_embeds=embeds(1),
        num_inference_steps=steps,
        guidance_scale=1.0,
        height=HEIGHT,
        width=WIDTH,
        latents=start_latents(),
        output_type="latent",
    ).images
    c = pipe.scheduler.config  # after the pipeline's own config rewrites (steps_offset=1)
    scheduler = NumpyEuler(
        beta_schedule=c.beta_schedule,
        beta_start=c.beta_start,
        beta_end=c.beta_end,
        timestep_spacing=c.timestep_spacing,
        steps_offset=c.steps_offset,
    )
    scheduler.set_timesteps(steps)
    latents = start_latents().numpy().astype(np.float64) * scheduler.init_noise_sigma
    for t in scheduler.timesteps:
        model_input = scheduler.scale_model_input(latents, t)
        with torch.no_grad():
            noise_pred = pipe.unet(
                torch.from_numpy(model_input).float(), float(t), encoder_hidden_states=embeds(1)
            ).sample
        latents = scheduler.step(noise_pred.double().numpy(), t, latents).prev_sample
    np.testing.assert_allclose(latents, expected.double().numpy(), rtol=1e-4, atol=1e-4)


def test_euler_keeps_a_step_index_that_step_advances():
    """`EulerDiscreteScheduler.step` advances an internal `step_index` and `set_timesteps` resets it, so one instance must not serve two loops at once."""
    scheduler = EulerDiscreteScheduler(**SD_BETAS)
    scheduler.set_timesteps(5)
    assert scheduler.step_index is None
    sample = torch.zeros(1, 4, 2, 2)
    scheduler.step(torch.zeros_like(sample), scheduler.timesteps[0], sample)
    scheduler.step(torch.zeros_like(sample), scheduler.timesteps[1], sample)
    assert scheduler.step_index == 2
    scheduler.set_timesteps(5)
    assert scheduler.step_index is None


def test_generator_reaches_only_schedulers_whose_step_takes_it():
    """`prepare_extra_step_kwargs` passes `generator` and `eta` to `scheduler.step` only if its signature has them: DDPM gets `generator`, DDIM gets both, Euler gets `generator` only, flow matching gets `generator` only."""
    expected = {
        DDPMScheduler: {"generator"},
        DDIMScheduler: {"eta", "generator"},
        EulerDiscreteScheduler: {"generator"},
        FlowMatchEulerDiscreteScheduler: {"generator"},
    }
    for cls, keys in expected.items():
        pipe = tiny_sd_pipeline(scheduler=cls())
        kwargs = pipe.prepare_extra_step_kwargs(torch.Generator(), 0.0)
        assert set(kwargs) == keys, cls.__name__


def test_controlnet_runs_every_step_and_feeds_residuals_to_the_unet(record_calls):
    """In `StableDiffusionControlNetPipeline` the ControlNet runs once per step on the current latents, and its outputs enter the UNet call as `down_block_additional_residuals` (one tensor per skip connection) and `mid_block_additional_residual`."""
    unet = tiny_unet()
    controlnet = ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=(8, 16))
    pipe = StableDiffusionControlNetPipeline(
        vae=tiny_vae(),
        text_encoder=None,
        tokenizer=None,
        unet=unet,
        controlnet=controlnet,
        scheduler=DDIMScheduler(**SD_BETAS),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    control_calls, unet_calls = record_calls(pipe.controlnet), record_calls(pipe.unet)
    pipe(
        prompt_embeds=embeds(1),
        image=torch.rand(1, 3, HEIGHT, WIDTH),
        num_inference_steps=3,
        guidance_scale=1.0,
        height=HEIGHT,
        width=WIDTH,
        latents=start_latents(),
        output_type="latent",
    )
    assert len(control_calls.calls) == len(unet_calls.calls) == 3
    latents_seen = [args[0] for args, _ in control_calls.calls]
    assert not torch.equal(latents_seen[0], latents_seen[1])  # the current latents each step
    for _, kwargs in unet_calls.calls:
        down = kwargs["down_block_additional_residuals"]
        assert isinstance(down, tuple | list) and len(down) == len(
            controlnet.controlnet_down_blocks
        )
        assert kwargs["mid_block_additional_residual"].shape[0] == 1
