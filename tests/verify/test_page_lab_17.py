"""Lab 17 (rebuild the pipeline) against the real StableDiffusionPipeline.

``code/lab-17-rebuild-the-pipeline/rebuild_diffusers.py`` is the lab's loop with its five
blanks filled, written against a pipeline's own parts (``encode_prompt``, ``unet``,
``scheduler``, ``vae``, ``image_processor``). These tests run it on a tiny random
StableDiffusionPipeline with a real CLIP tokenizer and text encoder (``tiny.py``) and
compare it with ``pipe(...)`` for the same prompt and generator; then they plant each
blank's classic mistake in a copy of it and show that the output changes.
"""

from __future__ import annotations

import pytest
import torch
from tiny import SD_SCHEDULER, tiny_sd_pipeline, tiny_text_encoder, tiny_tokenizer

from infralens_docs.registry import ROOT
from labkit.blanks import load_function

SOURCE = ROOT / "code/lab-17-rebuild-the-pipeline/rebuild_diffusers.py"
PROMPTS = ["a red disc", "a blue square"]
STEPS, GUIDANCE = 4, 7.5


@pytest.fixture(scope="module")
def pipe():
    return tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer())


def with_scheduler(pipe, name):
    """The same pipeline with SD 1.5's scheduler config on DDIM or Euler."""
    from diffusers import DDIMScheduler, EulerDiscreteScheduler

    scheduler = {"ddim": DDIMScheduler, "euler": EulerDiscreteScheduler}[name]
    pipe.scheduler = scheduler.from_config(DDIMScheduler(**SD_SCHEDULER).config)
    return pipe


def real(pipe):
    return pipe(
        PROMPTS, num_inference_steps=STEPS, guidance_scale=GUIDANCE,
        generator=torch.Generator().manual_seed(0), output_type="np",
    ).images  # fmt: skip


def rebuilt(pipe, edit=None):
    pipeline = load_function(SOURCE, "pipeline", edit)
    return pipeline(pipe, PROMPTS, STEPS, GUIDANCE, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("scheduler", ["ddim", "euler"])
def test_the_rebuilt_loop_returns_what_the_pipeline_returns(pipe, scheduler):
    """The lab's loop, written against a StableDiffusionPipeline's own parts, returns the images pipe(...) returns for the same prompt and generator, with DDIM and with Euler."""
    pipe = with_scheduler(pipe, scheduler)
    ours, theirs = rebuilt(pipe), real(pipe)
    assert ours.shape == theirs.shape == (2, 16, 16, 3)
    torch.testing.assert_close(torch.from_numpy(ours), torch.from_numpy(theirs), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "edit",
    [
        ("[negative_prompt_embeds, prompt_embeds]", "[prompt_embeds, negative_prompt_embeds]"),
        ("pipe.scheduler.scale_model_input(latent_model_input, t)", "latent_model_input"),
        ("(noise_pred_text - noise_pred_uncond)", "(noise_pred_uncond - noise_pred_text)"),
        ("latents, return_dict=False)[0]", "latents, return_dict=False)[1]"),
        ("latents / pipe.vae.config.scaling_factor", "latents"),
    ],
    ids=["1 order", "2 scale_model_input", "3 guidance sign", "4 x0 carried", "5 scaling_factor"],
)
def test_each_blanks_classic_mistake_changes_the_real_pipelines_output(pipe, edit):
    """Each of the five blanks matters in the real pipeline with Euler: its classic mistake (swapped order, no scale_model_input, flipped guidance sign, pred_original_sample carried, no division by scaling_factor) changes the images."""
    pipe = with_scheduler(pipe, "euler")
    assert abs(rebuilt(pipe, edit) - real(pipe)).max() > 1e-3
