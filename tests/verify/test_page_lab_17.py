"""Lab 17 (rebuild the pipeline) against the real StableDiffusionPipeline.

``code/lab-17-rebuild-the-pipeline/rebuild_diffusers.py`` is the lab's loop with its five
blanks filled, written against a pipeline's own parts (``encode_prompt``, ``unet``,
``scheduler``, ``vae``, ``prepare_extra_step_kwargs``, ``image_processor``). These tests run
it on a tiny random StableDiffusionPipeline with a real CLIP tokenizer and text encoder
(``tiny.py``) and compare it with ``pipe(...)`` for the same prompt and generator, over
four schedulers and three guidance scales; then they plant each blank's classic mistake in
a copy of it and show that the output changes. The last tests call the schedulers the page
names: what ``step`` returns, and Euler's warning when ``scale_model_input`` was skipped.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny import SD_SCHEDULER, logged_messages, tiny_sd_pipeline, tiny_text_encoder, tiny_tokenizer

from infralens_docs.registry import ROOT
from labkit.blanks import load_function

SOURCE = ROOT / "code/lab-17-rebuild-the-pipeline/rebuild_diffusers.py"
PROMPTS = ["a red disc", "a blue square"]
STEPS, GUIDANCE = 4, 7.5
#: the schedulers the page names for the rebuilt loop: two deterministic, two that draw
#: noise in step (Euler Ancestral, the one SDXL-Turbo ships with; DDPM)
SCHEDULERS = ["DDIMScheduler", "EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler", "DDPMScheduler"]  # fmt: skip
#: the schedulers whose step outputs the page describes, and the fields each returns
STEP_FIELDS = {
    "DDIMScheduler": ["prev_sample", "pred_original_sample"],
    "EulerDiscreteScheduler": ["prev_sample", "pred_original_sample"],
    "DPMSolverMultistepScheduler": ["prev_sample"],
    "UniPCMultistepScheduler": ["prev_sample"],
}


@pytest.fixture(scope="module")
def pipe():
    return tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer())


def sd_scheduler(name):
    """diffusers' scheduler ``name`` with SD 1.5's scheduler config."""
    import diffusers

    return getattr(diffusers, name).from_config(diffusers.DDIMScheduler(**SD_SCHEDULER).config)


def with_scheduler(pipe, name):
    """The same pipeline with SD 1.5's scheduler config on the scheduler ``name``."""
    pipe.scheduler = sd_scheduler(name)
    return pipe


def real(pipe, guidance_scale=GUIDANCE):
    return pipe(
        PROMPTS, num_inference_steps=STEPS, guidance_scale=guidance_scale,
        generator=torch.Generator().manual_seed(0), output_type="np",
    ).images  # fmt: skip


def rebuilt(pipe, edit=None, guidance_scale=GUIDANCE, source=SOURCE):
    pipeline = load_function(source, "pipeline", edit)
    generator = torch.Generator().manual_seed(0)
    return pipeline(pipe, PROMPTS, STEPS, guidance_scale, generator=generator)


@pytest.mark.parametrize("guidance_scale", [7.5, 1.0, 0.0])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_the_rebuilt_loop_returns_what_the_pipeline_returns(pipe, scheduler, guidance_scale):
    """The lab's loop, written against a StableDiffusionPipeline's own parts, returns bit for bit the images pipe(...) returns for the same prompts and generator on the CPU, with DDIM, Euler, Euler Ancestral and DDPM, at guidance_scale 7.5, 1.0 and 0.0."""
    pipe = with_scheduler(pipe, scheduler)
    ours, theirs = rebuilt(pipe, guidance_scale=guidance_scale), real(pipe, guidance_scale)
    assert ours.shape == theirs.shape == (2, 16, 16, 3)
    np.testing.assert_array_equal(ours, theirs)


def test_guidance_scale_zero_is_the_prompt_alone_not_the_unconditional_image(pipe):
    """At guidance_scale 1 or below, StableDiffusionPipeline runs one undoubled batch of the prompt's rows, so guidance_scale=0 gives the prompted image, not the unconditional one that the formula gives at 0."""
    pipe = with_scheduler(pipe, "DDIMScheduler")
    rows = []
    hook = pipe.unet.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    try:
        at_zero, at_one = real(pipe, 0.0), real(pipe, 1.0)
    finally:
        hook.remove()
    assert rows == [len(PROMPTS)] * 2 * STEPS  # B rows per step, never 2B
    np.testing.assert_array_equal(at_zero, at_one)  # both: the prompt's prediction alone
    always_guided = ("guide = guidance_scale > 1", "guide = True")  # the formula at any scale
    assert np.abs(rebuilt(pipe, always_guided, guidance_scale=0.0) - at_zero).max() > 1e-3


@pytest.mark.parametrize(
    "edit",
    [
        ("[negative_prompt_embeds, prompt_embeds]", "[prompt_embeds, negative_prompt_embeds]"),
        ("pipe.scheduler.scale_model_input(latent_model_input, t)", "latent_model_input"),
        ("(noise_pred_text - noise_pred_uncond)", "(noise_pred_uncond - noise_pred_text)"),
        ("latents = out[0]", "latents = out[1]"),
        ("latents / pipe.vae.config.scaling_factor", "latents"),
    ],
    ids=["1 order", "2 scale_model_input", "3 guidance sign", "4 x0 carried", "5 scaling_factor"],
)
def test_each_blanks_classic_mistake_changes_the_real_pipelines_output(pipe, edit):
    """Each of the five blanks matters in the real pipeline with Euler: its classic mistake (swapped order, no scale_model_input, flipped guidance sign, pred_original_sample carried, no division by scaling_factor) changes the images."""
    pipe = with_scheduler(pipe, "EulerDiscreteScheduler")
    assert abs(rebuilt(pipe, edit) - real(pipe)).max() > 1e-3


def test_euler_step_warns_when_scale_model_input_was_skipped(pipe):
    """diffusers' EulerDiscreteScheduler.step logs a warning when scale_model_input was not called before it ("The `scale_model_input` function should be called before `step` to ensure correct denoising"); the loop that calls it logs none."""
    pipe = with_scheduler(pipe, "EulerDiscreteScheduler")
    skipped = ("pipe.scheduler.scale_model_input(latent_model_input, t)", "latent_model_input")
    with logged_messages() as without:
        rebuilt(pipe, skipped)
    with logged_messages() as with_it:
        rebuilt(pipe)
    warning = "The `scale_model_input` function should be called before `step` to ensure correct denoising."  # fmt: skip
    assert any(warning in message for message in without), without
    assert not any(warning in message for message in with_it), with_it


@pytest.mark.parametrize("name", list(STEP_FIELDS))
def test_what_step_returns(name):
    """scheduler.step returns prev_sample first ([0], as the pipeline reads it) and, with DDIM and Euler, pred_original_sample too; DPMSolverMultistepScheduler and UniPCMultistepScheduler return prev_sample alone."""
    scheduler = sd_scheduler(name)
    scheduler.set_timesteps(STEPS)
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 4, 8, 8, generator=generator) * scheduler.init_noise_sigma
    for t in scheduler.timesteps:
        scheduler.scale_model_input(latents, t)
        out = scheduler.step(torch.randn(2, 4, 8, 8, generator=generator), t, latents)
        assert list(out.keys()) == STEP_FIELDS[name]
        assert out[0] is out.prev_sample and out.prev_sample.shape == latents.shape
        latents = out.prev_sample
