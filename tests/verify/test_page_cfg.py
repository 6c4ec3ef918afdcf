"""Classifier-free guidance (docs/handbook/cfg.md) against the installed diffusers.

Everything runs on the real classes with tiny random-config parts built in code:
``StableDiffusionPipeline`` (tiny UNet and VAE, plus a tiny ``CLIPTextModel`` and a
``CLIPTokenizer`` built from an in-memory vocabulary where the text path matters),
``StableDiffusion3Pipeline`` (tiny ``SD3Transformer2DModel``),
``StableDiffusionControlNetPipeline`` and a tiny ``CLIPVisionModelWithProjection`` for
IP-Adapter. Hooks record what the denoiser receives and returns and what
``scheduler.step`` is given; defaults are observed through each ``__call__``. Only
documentation text (docstrings, source comments) that a sentence quotes is read with
``inspect``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import warnings

import numpy as np
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    StableDiffusion3Pipeline,
    StableDiffusionPipeline,
)
from diffusers.models.embeddings import (
    ImageProjection,
    IPAdapterPlusImageProjection,
    MultiIPAdapterImageProjection,
)
from diffusers.pipelines.stable_diffusion import pipeline_stable_diffusion as sd_module
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import rescale_noise_cfg
from tiny import (
    EMBED_DIM,
    HEIGHT,
    POOLED_DIM,
    SD_SCHEDULER,
    WIDTH,
    embeds,
    flux_prompt_embeds,
    guided,
    logged_messages,
    random_ip_adapter,
    sdxl_modular_inputs,
    spy_step,
    start_latents,
    tiny_clip_with_projection,
    tiny_controlnet,
    tiny_controlnet_pipeline,
    tiny_flux_pipeline,
    tiny_image_encoder,
    tiny_modular_sdxl,
    tiny_sd3_pipeline,
    tiny_sd_pipeline,
    tiny_sdxl_pipeline,
    tiny_text_encoder,
    tiny_text_time_unet,
    tiny_tokenizer,
    tiny_unet,
)
from transformers import CLIPImageProcessor

PROMPT, NEGATIVE = embeds(1), embeds(2)  # (1, 77, EMBED_DIM) stand-in prompt_embeds


# ---------------------------------------------------------------- builders (this page only)


def cfg_text_encoder():
    """``tiny_text_encoder`` with exactly the tokenizer's 54 ids and a 37-wide MLP."""
    return tiny_text_encoder(vocab_size=2 + 2 * 26, intermediate_size=37)


@pytest.fixture(scope="module")
def text_pipe():
    """The tiny StableDiffusionPipeline with a tiny CLIP text encoder and tokenizer."""
    return tiny_sd_pipeline(text_encoder=cfg_text_encoder(), tokenizer=tiny_tokenizer())


@pytest.fixture(scope="module")
def sdxl_pipe():
    """The tiny StableDiffusionXLPipeline (no text encoders; `force_zeros_for_empty_prompt`)."""
    return tiny_sdxl_pipeline()


def run(pipe, guidance_scale, steps=3, latents=None, **kwargs):
    """One pipeline call on the tiny parts; returns the final latents (B, 4, 8, 8)."""
    if "prompt" not in kwargs:
        kwargs.setdefault("prompt_embeds", PROMPT)
        kwargs.setdefault("negative_prompt_embeds", NEGATIVE)
    return pipe(
        num_inference_steps=steps,
        guidance_scale=guidance_scale,
        height=HEIGHT,
        width=WIDTH,
        latents=start_latents() if latents is None else latents,
        output_type="latent",
        **kwargs,
    ).images


@pytest.fixture
def step_inputs(monkeypatch):
    """``spy(scheduler) -> list``: the (model_output, sample) of every ``scheduler.step``."""
    return functools.partial(spy_step, monkeypatch)


@pytest.fixture
def outputs_of():
    """``outputs_of(module) -> list``: the first output tensor of every forward."""
    handles = []

    def attach(module):
        seen = []

        def hook(mod, args, output):
            seen.append(
                (output[0] if isinstance(output, tuple) else output.sample).detach().clone()
            )

        handles.append(module.register_forward_hook(hook))
        return seen

    yield attach
    for handle in handles:
        handle.remove()


# ---------------------------------------------------------------- the combination, batch doubling


def test_scheduler_step_gets_the_guided_combination(sd_pipe, record_calls, outputs_of, step_inputs):
    """`StableDiffusionPipeline.__call__` hands `scheduler.step` the single tensor `noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)` of batch `B`, built from the two halves of one UNet output, together with the undoubled `latents`: `scheduler.step` never sees the doubled batch.

    The UNet's inputs, outputs and the arguments of every ``scheduler.step`` are recorded.
    """
    calls, outs = record_calls(sd_pipe.unet).calls, outputs_of(sd_pipe.unet)
    steps = step_inputs(sd_pipe.scheduler)
    run(sd_pipe, guidance_scale=7.5, steps=3)
    assert len(calls) == len(outs) == len(steps) == 3
    for (args, _), out, (model_output, sample) in zip(calls, outs, steps, strict=True):
        assert out.shape == (2, 4, 8, 8) and model_output.shape == sample.shape == (1, 4, 8, 8)
        torch.testing.assert_close(model_output, guided(out, 7.5))
        torch.testing.assert_close(sample, args[0][1:])  # DDIM: scale_model_input is identity
        assert not torch.allclose(model_output, out[1:])  # not the conditional half alone


def test_cfg_doubles_the_batch_uncond_first(sd_pipe, record_calls):
    """In `StableDiffusionPipeline`, with CFG on (`guidance_scale > 1` and a UNet without `time_cond_proj_dim`), each step makes one UNet call on the doubled `latents` of batch `2B`, where `B = batch_size * num_images_per_prompt`, with `encoder_hidden_states = torch.cat([negative_prompt_embeds, prompt_embeds])`: the unconditional rows come first, in the same image order as the conditional ones.

    Moved from tests/verify/test_pipeline_loop.py and extended to B = 2 (one prompt,
    ``num_images_per_prompt=2``).
    """
    assert sd_pipe.unet.config.time_cond_proj_dim is None  # else 7.5 gives batch B (below)
    calls = record_calls(sd_pipe.unet).calls
    run(sd_pipe, guidance_scale=7.5, steps=4, latents=start_latents(2), num_images_per_prompt=2)
    assert len(calls) == 4  # one UNet call per step, even with CFG
    for args, kwargs in calls:
        sample, hidden = args[0], kwargs["encoder_hidden_states"]
        assert sample.shape == (4, 4, 8, 8)  # (2B, 4, H/8, W/8) with the tiny VAE's /2
        assert hidden.shape == (4, 77, EMBED_DIM)
        torch.testing.assert_close(hidden[:2], NEGATIVE.expand(2, -1, -1))  # uncond half first
        torch.testing.assert_close(hidden[2:], PROMPT.expand(2, -1, -1))
        torch.testing.assert_close(sample[:2], sample[2:])  # the same latents, same order
        assert not torch.allclose(sample[0], sample[1])  # two different images


def test_scale_model_input_sees_the_doubled_latents(record_calls, monkeypatch):
    """In `StableDiffusionPipeline`, `scheduler.scale_model_input` is applied to the already doubled `latent_model_input` of batch `2B`, and its output is what the UNet receives.

    Run with `EulerDiscreteScheduler`, whose ``scale_model_input`` divides by
    ``sqrt(sigma**2 + 1)`` (DDIM's is the identity and would not show the order).
    """
    pipe = tiny_sd_pipeline(scheduler=EulerDiscreteScheduler.from_config(SD_SCHEDULER))
    seen = []
    original = pipe.scheduler.scale_model_input

    def scale_model_input(sample, timestep):
        seen.append((sample.clone(), original(sample, timestep)))
        return seen[-1][1]

    monkeypatch.setattr(pipe.scheduler, "scale_model_input", scale_model_input)
    calls = record_calls(pipe.unet).calls
    run(pipe, guidance_scale=7.5, steps=3)
    assert len(seen) == len(calls) == 3
    for (before, after), (args, _) in zip(seen, calls, strict=True):
        assert before.shape == (2, 4, 8, 8)
        torch.testing.assert_close(before[:1], before[1:])
        torch.testing.assert_close(args[0], after)
        assert not torch.allclose(after, before)


def scheduler_batches(scheduler, monkeypatch):
    """Wrap every public method of ``scheduler`` (read from the instance): name -> set of the
    batch sizes of the 4-D tensors the pipeline hands it. Only outermost calls count: a
    method that another wrapped method calls (EDM's ``precondition_inputs`` inside
    ``scale_model_input``) is that method's own work."""
    seen: dict[str, set[int]] = {}
    depth = [0]
    for name in dir(scheduler):
        method = getattr(scheduler, name, None)
        if name.startswith("_") or not inspect.ismethod(method):
            continue

        def wrapper(*args, _name=name, _method=method, **kwargs):
            if depth[0] == 0:
                for value in (*args, *kwargs.values()):
                    if isinstance(value, torch.Tensor) and value.ndim == 4:
                        seen.setdefault(_name, set()).add(value.shape[0])
            depth[0] += 1
            try:
                return _method(*args, **kwargs)
            finally:
                depth[0] -= 1

        monkeypatch.setattr(scheduler, name, wrapper)
    return seen


def test_only_scale_model_input_sees_the_doubled_batch(sd_pipe, monkeypatch):
    """The pipeline hands the scheduler the doubled batch of `2B` only in `scale_model_input`: in `StableDiffusionPipeline.__call__` with every scheduler in `scheduler.compatibles`, `scheduler.step` gets batch `B`.

    Every public method of each scheduler instance is wrapped (enumerated from the instance,
    and the schedulers from the installed library, so a new one is covered) and records the
    batch of each 4-D tensor the pipeline passes it; CFG on, one image, one step, SD 1.x's
    scheduler settings (PNDM with ``skip_prk_steps``, as SD ships it), LMS and DPMSolverSDE
    among them (the verify extra installs scipy and torchsde).
    """
    original, ran = sd_pipe.scheduler, []
    config = dict(SD_SCHEDULER, skip_prk_steps=True)
    try:
        for cls in sorted(original.compatibles, key=lambda c: c.__name__):
            sd_pipe.scheduler = cls.from_config(config)
            seen = scheduler_batches(sd_pipe.scheduler, monkeypatch)
            run(sd_pipe, guidance_scale=7.5, steps=1)
            doubled = {name for name, batches in seen.items() if 2 in batches}
            assert doubled == {"scale_model_input"} and seen["step"] == {1}, (cls, seen)
            ran.append(cls.__name__)
    finally:
        sd_pipe.scheduler = original
    assert {"DDIMScheduler", "EulerDiscreteScheduler", "EDMEulerScheduler"} <= set(ran)


@pytest.mark.parametrize("guidance_scale", [1.0, 0.5, 0.0])
def test_guidance_scale_at_most_one_skips_the_uncond_branch(sd_pipe, record_calls, guidance_scale):
    """In `StableDiffusionPipeline`, with `guidance_scale` 1 or below, every UNet call gets a batch of `B` and the prompt embeddings alone: the unconditional branch is skipped and `negative_prompt_embeds` never reach the UNet.

    Moved from tests/verify/test_pipeline_loop.py; 0.5 added.
    """
    calls = record_calls(sd_pipe.unet).calls
    run(sd_pipe, guidance_scale=guidance_scale, steps=3)
    assert [args[0].shape[0] for args, _ in calls] == [1, 1, 1]
    for _, kwargs in calls:
        torch.testing.assert_close(kwargs["encoder_hidden_states"], PROMPT)


def test_scales_below_one_equal_one(sd_pipe):
    """In `StableDiffusionPipeline`, for a UNet without `time_cond_proj_dim`, `guidance_scale=0.5` and `guidance_scale=0.0` give exactly the latents of `guidance_scale=1`: a scale below 1 is not an interpolation towards the unconditional prediction."""
    at_one = run(sd_pipe, guidance_scale=1.0)
    for scale in (0.5, 0.0):
        torch.testing.assert_close(run(sd_pipe, guidance_scale=scale), at_one, rtol=0, atol=0)
    assert not torch.allclose(run(sd_pipe, guidance_scale=1.5), at_one)  # above 1 it acts


@pytest.fixture(scope="module")
def distilled_pipe():
    """The tiny StableDiffusionPipeline around a guidance-distilled UNet (`time_cond_proj_dim=8`)."""
    return tiny_sd_pipeline(unet=tiny_unet(time_cond_proj_dim=8))


def test_guidance_distilled_unet_tells_scales_below_one_apart(distilled_pipe, record_calls):
    """In `StableDiffusionPipeline`, with a guidance-distilled UNet, `guidance_scale` 0.5, 0 and 1 give three different results: each still runs one pass at batch `B`, and the scale reaches the UNet as `timestep_cond`.

    Run through ``StableDiffusionPipeline.__call__``; a plain UNet gives one result for all
    three (``test_scales_below_one_equal_one``).
    """
    calls = record_calls(distilled_pipe.unet).calls
    results = [run(distilled_pipe, guidance_scale=s, steps=2) for s in (0.5, 0.0, 1.0)]
    assert [args[0].shape[0] for args, _ in calls] == [1] * 6
    conds = [kwargs["timestep_cond"] for _, kwargs in calls[::2]]
    for i, j in ((0, 1), (0, 2), (1, 2)):
        assert not torch.allclose(results[i], results[j])
        assert not torch.allclose(conds[i], conds[j])


def test_do_classifier_free_guidance_condition(sd_pipe, distilled_pipe):
    """`StableDiffusionPipeline.do_classifier_free_guidance` is `guidance_scale > 1 and unet.config.time_cond_proj_dim is None`."""
    distilled = distilled_pipe
    for scale in (0.0, 0.5, 1.0, 1.0001, 7.5):
        sd_pipe._guidance_scale = distilled._guidance_scale = scale
        assert sd_pipe.do_classifier_free_guidance is (scale > 1)
        assert distilled.do_classifier_free_guidance is False


def test_guidance_distilled_unet_gets_one_pass_and_timestep_cond(distilled_pipe, record_calls):
    """In `StableDiffusionPipeline`, a UNet with `time_cond_proj_dim` set gets one pass per step at batch `B` even at `guidance_scale=7.5`, with `timestep_cond = get_guidance_scale_embedding(guidance_scale - 1, embedding_dim=time_cond_proj_dim)`, a sinusoidal embedding of `1000 * (guidance_scale - 1)`."""
    pipe = distilled_pipe
    calls = record_calls(pipe.unet).calls
    run(pipe, guidance_scale=7.5, steps=3)
    expected = pipe.get_guidance_scale_embedding(torch.tensor([6.5]), embedding_dim=8)
    angles = 6.5 * 1000 * torch.exp(-torch.log(torch.tensor(1e4)) / 3 * torch.arange(4))
    torch.testing.assert_close(expected, torch.cat([angles.sin(), angles.cos()])[None])  # sinusoid
    wrong = pipe.get_guidance_scale_embedding(torch.tensor([7.5]), embedding_dim=8)
    assert len(calls) == 3
    for args, kwargs in calls:
        assert args[0].shape == (1, 4, 8, 8)
        torch.testing.assert_close(kwargs["encoder_hidden_states"], PROMPT)
        assert kwargs["timestep_cond"].shape == (1, 8)
        torch.testing.assert_close(kwargs["timestep_cond"], expected)
        assert not torch.allclose(kwargs["timestep_cond"], wrong)


def test_dynamic_cfg_callback_switches_guidance_off(sd_pipe, record_calls):
    """In `StableDiffusionPipeline`, `do_classifier_free_guidance` is read at every step: a `callback_on_step_end` that sets `pipe._guidance_scale = 0.0` and returns `prompt_embeds.chunk(2)[-1]` makes every later UNet call run on batch `B` with the prompt embeddings alone.

    The pattern of diffusers' "dynamic classifier-free guidance" callback example.
    """

    def callback(pipe, step_index, timestep, callback_kwargs):
        if step_index == 1:
            pipe._guidance_scale = 0.0
            callback_kwargs["prompt_embeds"] = callback_kwargs["prompt_embeds"].chunk(2)[-1]
        return callback_kwargs

    calls = record_calls(sd_pipe.unet).calls
    run(
        sd_pipe,
        guidance_scale=7.5,
        steps=4,
        callback_on_step_end=callback,
        callback_on_step_end_tensor_inputs=["prompt_embeds"],
    )
    assert [args[0].shape[0] for args, _ in calls] == [2, 2, 1, 1]
    for _, kwargs in calls[2:]:
        torch.testing.assert_close(kwargs["encoder_hidden_states"], PROMPT)


# ---------------------------------------------------------------- prompts and negative prompts


def test_null_condition_is_the_encoded_empty_string(text_pipe, record_calls):
    """With `negative_prompt=None`, `StableDiffusionPipeline.encode_prompt` runs the text encoder on `[""] * batch_size`, padded to 77 tokens like the prompt: the unconditional embedding is the CLIP encoding of the empty string, not a tensor of zeros."""
    calls = record_calls(text_pipe.text_encoder).calls
    prompt_embeds, negative_prompt_embeds = text_pipe.encode_prompt(
        ["a cat", "a dog"], "cpu", 1, True, negative_prompt=None
    )
    empty = text_pipe.tokenizer(
        ["", ""], padding="max_length", max_length=77, truncation=True, return_tensors="pt"
    ).input_ids
    assert len(calls) == 2  # the prompts, then the empty strings
    torch.testing.assert_close(calls[1][0][0], empty)
    with torch.no_grad():
        torch.testing.assert_close(negative_prompt_embeds, text_pipe.text_encoder(empty)[0])
    assert negative_prompt_embeds.shape == prompt_embeds.shape == (2, 77, EMBED_DIM)
    assert negative_prompt_embeds.abs().min() > 0


def test_encode_prompt_shapes_and_dtype():
    """With `do_classifier_free_guidance=True`, `StableDiffusionPipeline.encode_prompt` returns `prompt_embeds` and `negative_prompt_embeds` of shape `(batch_size * num_images_per_prompt, 77, D)` each, in `text_encoder.dtype`."""
    pipe = tiny_sd_pipeline(text_encoder=cfg_text_encoder().double(), tokenizer=tiny_tokenizer())
    prompt_embeds, negative_prompt_embeds = pipe.encode_prompt(
        ["a cat", "a dog"], "cpu", 3, True, negative_prompt=["x", "y"]
    )
    for tensor in (prompt_embeds, negative_prompt_embeds):
        assert tensor.shape == (6, 77, EMBED_DIM) and tensor.dtype == torch.float64
    torch.testing.assert_close(negative_prompt_embeds[0], negative_prompt_embeds[2])  # per prompt
    assert not torch.allclose(negative_prompt_embeds[2], negative_prompt_embeds[3])
    assert pipe.encode_prompt("a cat", "cpu", 1, False)[1] is None  # no CFG: no negative half


def test_text_encoder_runs_twice_per_generation_with_cfg(text_pipe, record_calls):
    """In `StableDiffusionPipeline`, a call with a text `prompt` runs the text encoder twice with CFG (prompt, then negative prompt) and once without: text encoding is per generation, not per step, and with `guidance_scale <= 1` the negative prompt is not encoded."""
    calls = record_calls(text_pipe.text_encoder).calls
    run(text_pipe, guidance_scale=7.5, steps=3, prompt="a cat", negative_prompt="dog")
    assert len(calls) == 2
    calls.clear()
    run(text_pipe, guidance_scale=7.5, steps=3, prompt="a cat")  # the default: "" is encoded
    assert len(calls) == 2
    calls.clear()
    run(text_pipe, guidance_scale=1.0, steps=3, prompt="a cat", negative_prompt="dog")
    assert len(calls) == 1


def test_a_negative_prompt_costs_nothing_extra(text_pipe, record_calls):
    """In `StableDiffusionPipeline` a `negative_prompt` replaces the empty string in the unconditional half: the UNet calls and their batch of `2B` are the same with and without one, only the unconditional rows of `encoder_hidden_states` change."""
    calls = record_calls(text_pipe.unet).calls
    run(text_pipe, guidance_scale=7.5, steps=2, prompt="a cat")
    without = [kwargs["encoder_hidden_states"] for _, kwargs in calls]
    calls.clear()
    run(text_pipe, guidance_scale=7.5, steps=2, prompt="a cat", negative_prompt="dog")
    with_negative = [kwargs["encoder_hidden_states"] for _, kwargs in calls]
    assert [h.shape for h in without] == [h.shape for h in with_negative] == [(2, 77, 32)] * 2
    for a, b in zip(without, with_negative, strict=True):
        torch.testing.assert_close(a[1:], b[1:])  # the prompt rows
        assert not torch.allclose(a[:1], b[:1])  # "" vs "dog"


def test_negative_prompt_type_and_length_must_match(text_pipe):
    """In `StableDiffusionPipeline`, with CFG on, `negative_prompt` must have the type of `prompt` (`TypeError` otherwise) and, as a list, its length (`ValueError` otherwise).

    Each case runs ``__call__`` with CFG on (the raise comes from ``encode_prompt``).
    """
    two = dict(steps=1, prompt=["a cat", "a dog"], latents=start_latents(2))
    with pytest.raises(TypeError, match="same type"):
        run(text_pipe, 7.5, negative_prompt="bad", **two)
    with pytest.raises(TypeError, match="same type"):
        run(text_pipe, 7.5, steps=1, prompt="a cat", negative_prompt=["bad"])
    with pytest.raises(ValueError, match="batch size"):
        run(text_pipe, 7.5, negative_prompt=["x"] * 3, **two)
    assert run(text_pipe, 7.5, negative_prompt=["x", "y"], **two).shape == (2, 4, 8, 8)


def test_negative_prompt_is_not_checked_without_guidance(text_pipe):
    """In `StableDiffusionPipeline`, with `guidance_scale <= 1`, a `negative_prompt` of the wrong type or length raises nothing: it is never encoded."""
    two = dict(steps=1, prompt=["a cat", "a dog"], latents=start_latents(2))
    run(text_pipe, guidance_scale=1.0, negative_prompt="x", **two)
    run(text_pipe, guidance_scale=1.0, negative_prompt=["x"], **two)
    with pytest.raises(TypeError):  # the same call with guidance on
        run(text_pipe, guidance_scale=7.5, negative_prompt="x", **two)


@pytest.mark.parametrize("guidance_scale", [7.5, 1.0])
def test_negative_prompt_embeds_shape_must_match(sd_pipe, text_pipe, guidance_scale):
    """In `StableDiffusionPipeline`, `check_inputs` compares `negative_prompt_embeds` with `prompt_embeds` (`ValueError` on a different shape), whatever the `guidance_scale`, but only when both are passed: beside a text `prompt` it compares nothing, so with guidance off a wrong shape raises nothing.

    With a text prompt and guidance on, the mismatch surfaces later, in ``torch.cat``.
    """
    with pytest.raises(ValueError, match="must have the same shape"):
        run(sd_pipe, guidance_scale, steps=1, negative_prompt_embeds=NEGATIVE[:, :70])
    with pytest.raises(ValueError, match="must have the same shape"):
        run(sd_pipe, guidance_scale, steps=1, negative_prompt_embeds=embeds(2, batch=2))
    text = dict(steps=1, prompt="ab", negative_prompt_embeds=NEGATIVE[:, :70])
    if guidance_scale > 1:
        with pytest.raises(RuntimeError, match="Sizes of tensors must match"):  # not check_inputs
            run(text_pipe, guidance_scale, **text)
    else:
        assert run(text_pipe, guidance_scale, **text).shape == (1, 4, 8, 8)


# ---------------------------------------------------------------- defaults and guidance_rescale


def test_pipeline_guidance_defaults(sd_pipe, sdxl_pipe, sd3_pipe, outputs_of, step_inputs):
    """`StableDiffusionPipeline.__call__` defaults to `guidance_scale=7.5` and `guidance_rescale=0.0`, `StableDiffusionXLPipeline.__call__` to `guidance_scale=5.0` and `guidance_rescale=0.0`, and `StableDiffusion3Pipeline.__call__` to `guidance_scale=7.0`.

    Each pipeline is called without either argument; ``scheduler.step`` must receive exactly
    ``noise_pred_uncond + s * (noise_pred_text - noise_pred_uncond)`` of the denoiser's own
    doubled output with the default ``s``, unrescaled (a ``guidance_rescale`` above 0 would
    change it, see ``test_pipeline_rescales_only_with_cfg_and_positive_guidance_rescale``).
    """
    common = dict(num_inference_steps=2, height=HEIGHT, width=WIDTH, latents=start_latents(),
                  output_type="latent")  # fmt: skip
    pooled = torch.randn(1, POOLED_DIM, generator=torch.Generator().manual_seed(3))
    sd3_pos, sd3_neg = embeds(4)[:, :10], embeds(5)[:, :10]
    sd3_pooled, sd3_neg_pooled = torch.randn(2, 16, generator=torch.Generator().manual_seed(4))
    for pipe, denoiser, default, kwargs in [
        (sd_pipe, sd_pipe.unet, 7.5, dict(prompt_embeds=PROMPT, negative_prompt_embeds=NEGATIVE)),
        (sdxl_pipe, sdxl_pipe.unet, 5.0, dict(prompt_embeds=PROMPT, pooled_prompt_embeds=pooled)),
        (sd3_pipe, sd3_pipe.transformer, 7.0,
         dict(prompt_embeds=sd3_pos, negative_prompt_embeds=sd3_neg,
              pooled_prompt_embeds=sd3_pooled[None], negative_pooled_prompt_embeds=sd3_neg_pooled[None])),
    ]:  # fmt: skip
        outs, steps = outputs_of(denoiser), step_inputs(pipe.scheduler)
        pipe(**kwargs, **common)
        assert len(outs) == len(steps) == 2
        for out, (model_output, _) in zip(outs, steps, strict=True):
            assert out.shape[0] == 2  # CFG on: the doubled batch
            torch.testing.assert_close(model_output, guided(out, default), rtol=0, atol=0)


def test_no_guidance_rescale_on_controlnet_sd3_and_flux(sd3_pipe, controlnet_pipe, flux_pipe):
    """`StableDiffusionControlNetPipeline.__call__`, `StableDiffusion3Pipeline.__call__` and `FluxPipeline.__call__` have no `guidance_rescale` parameter: SD3 rejects one with `TypeError`, and the ControlNet pipeline's `**kwargs` swallows it, so it changes nothing.

    Each ``__call__`` is called with ``guidance_rescale=0.7``; Flux rejects it like SD3.
    """
    with pytest.raises(TypeError, match="guidance_rescale"):
        sd3_pipe(guidance_rescale=0.7)
    with pytest.raises(TypeError, match="guidance_rescale"):
        run_flux(flux_pipe, guidance_rescale=0.7)
    plain = run_controlnet(controlnet_pipe)
    torch.testing.assert_close(run_controlnet(controlnet_pipe, guidance_rescale=0.7), plain)


@pytest.mark.parametrize("guidance_rescale", [0.0, 0.7, 1.0])
def test_rescale_noise_cfg_formula(guidance_rescale):
    """`rescale_noise_cfg(noise_cfg, noise_pred_text, guidance_rescale)` rescales `noise_cfg` by the per-sample ratio `std(noise_pred_text) / std(noise_cfg)`, each taken over all non-batch axes, and returns `guidance_rescale * rescaled + (1 - guidance_rescale) * noise_cfg`.

    Recomputed in float64 NumPy (``ddof=0``; the ratio does not depend on ``ddof``).
    """
    g = torch.Generator().manual_seed(0)
    text = torch.randn(3, 4, 8, 8, generator=g, dtype=torch.float64)
    cfg = 3.0 * torch.randn(3, 4, 8, 8, generator=g, dtype=torch.float64) + 0.5
    t, c = text.numpy(), cfg.numpy()
    ratio = t.std(axis=(1, 2, 3), keepdims=True) / c.std(axis=(1, 2, 3), keepdims=True)
    expected = guidance_rescale * (c * ratio) + (1 - guidance_rescale) * c
    ours = rescale_noise_cfg(cfg, text, guidance_rescale=guidance_rescale).numpy()
    np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-12)
    if guidance_rescale == 1.0:  # fully rescaled: each sample has the text prediction's std
        np.testing.assert_allclose(ours.std(axis=(1, 2, 3)), t.std(axis=(1, 2, 3)), rtol=1e-12)


def test_pipeline_rescales_only_with_cfg_and_positive_guidance_rescale(
    sd_pipe, outputs_of, step_inputs, monkeypatch
):
    """`StableDiffusionPipeline` applies `rescale_noise_cfg(noise_pred, noise_pred_text, guidance_rescale=guidance_rescale)` right after the combination, and only when CFG is on and `guidance_rescale > 0.0`."""
    calls = []
    original = sd_module.rescale_noise_cfg

    def counted(*args, **kwargs):
        calls.append(kwargs["guidance_rescale"])
        return original(*args, **kwargs)

    monkeypatch.setattr(sd_module, "rescale_noise_cfg", counted)
    outs, steps = outputs_of(sd_pipe.unet), step_inputs(sd_pipe.scheduler)
    run(sd_pipe, guidance_scale=7.5, steps=3, guidance_rescale=0.7)
    assert calls == [0.7] * 3
    for out, (model_output, _) in zip(outs, steps, strict=True):
        expected = original(guided(out, 7.5), out[1:], guidance_rescale=0.7)
        torch.testing.assert_close(model_output, expected)
        assert not torch.allclose(model_output, guided(out, 7.5))
    calls.clear()
    run(sd_pipe, guidance_scale=7.5, steps=3)  # default guidance_rescale=0.0
    run(sd_pipe, guidance_scale=1.0, steps=3, guidance_rescale=0.7)  # CFG off
    assert calls == []


def test_sdxl_pipeline_applies_guidance_rescale(sdxl_pipe, step_inputs, outputs_of, monkeypatch):
    """`StableDiffusionXLPipeline` applies the same `rescale_noise_cfg` after its combination, and only when CFG is on and `guidance_rescale > 0.0`.

    ``rescale_noise_cfg`` is counted in the SDXL pipeline's module through three calls: 5.0
    with 0.7, 5.0 with the default ``guidance_rescale``, and 1.0 (CFG off) with 0.7.
    """
    from diffusers.pipelines.stable_diffusion_xl import pipeline_stable_diffusion_xl as xl_module

    rescales, original = [], xl_module.rescale_noise_cfg

    def counted(*args, **kwargs):
        rescales.append(kwargs["guidance_rescale"])
        return original(*args, **kwargs)

    monkeypatch.setattr(xl_module, "rescale_noise_cfg", counted)
    pipe = sdxl_pipe
    pooled = torch.randn(1, POOLED_DIM, generator=torch.Generator().manual_seed(3))
    common = dict(prompt_embeds=PROMPT, pooled_prompt_embeds=pooled, num_inference_steps=2,
                  height=HEIGHT, width=WIDTH, latents=start_latents(), output_type="latent")  # fmt: skip
    outs, steps = outputs_of(pipe.unet), step_inputs(pipe.scheduler)
    pipe(guidance_scale=5.0, guidance_rescale=0.7, **common)
    assert len(outs) == len(steps) == 2 and rescales == [0.7, 0.7]
    for out, (model_output, _) in zip(outs, steps, strict=True):
        expected = rescale_noise_cfg(guided(out, 5.0), out[1:], guidance_rescale=0.7)
        torch.testing.assert_close(model_output, expected)
        assert not torch.allclose(model_output, guided(out, 5.0))
    rescales.clear()
    pipe(guidance_scale=5.0, **common)  # the default guidance_rescale
    pipe(guidance_scale=1.0, guidance_rescale=0.7, **common)  # CFG off
    assert rescales == []


def test_rescale_noise_cfg_documentation():
    """`rescale_noise_cfg`'s docstring cites Section 3.4 of arXiv:2305.08891, its comments say the rescale "fixes overexposure" and the mix avoids "plain looking" images, and `StableDiffusionPipeline.__call__`'s docstring says `guidance_rescale` should fix overexposure "when using zero terminal SNR"."""
    doc = " ".join(rescale_noise_cfg.__doc__.split())
    assert re.search(r"Section 3\.4 from \[Common Diffusion Noise Schedules.*2305\.08891", doc)
    source = inspect.getsource(rescale_noise_cfg)
    assert "# rescale the results from guidance (fixes overexposure)" in source
    assert 'by factor guidance_rescale to avoid "plain looking" images' in source
    call_doc = " ".join(StableDiffusionPipeline.__call__.__doc__.split())
    assert (
        "Guidance rescale factor should fix overexposure when using zero terminal SNR" in call_doc
    )


def test_imagen_convention_comment():
    """A source comment above `StableDiffusionPipeline.do_classifier_free_guidance` defines `guidance_scale` as the weight `w` of equation (2) of the Imagen paper and says "`guidance_scale = 1` corresponds to doing no classifier free guidance"."""
    source = inspect.getsource(StableDiffusionPipeline)
    head, _, _ = source.partition("def do_classifier_free_guidance")
    comment = " ".join(re.findall(r"^\s*# ?(.*)$", head[-600:], re.MULTILINE))
    assert (
        "`guidance_scale` is defined analog to the guidance weight `w` of equation (2)" in comment
    )
    assert "Imagen paper" in comment
    assert "`guidance_scale = 1` corresponds to doing no classifier free guidance" in comment


# ---------------------------------------------------------------- other pipelines and inputs


@pytest.fixture(scope="module")
def sd3_pipe():
    """The real StableDiffusion3Pipeline around a tiny SD3Transformer2DModel; no text encoders."""
    return tiny_sd3_pipeline()


def test_sd3_guides_the_flow_velocity_the_same_way(sd3_pipe, record_calls, outputs_of, step_inputs):
    """`StableDiffusion3Pipeline` applies the same combination to the transformer's flow-velocity output: without `skip_guidance_layers`, one transformer call per step on batch `2B`, negative embeddings first, and `scheduler.step` gets `noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)`."""
    pipe, transformer = sd3_pipe, sd3_pipe.transformer
    g = torch.Generator().manual_seed(0)
    pos, neg = (torch.randn(1, 10, EMBED_DIM, generator=g) for _ in range(2))
    pooled, neg_pooled = (torch.randn(1, 16, generator=g) for _ in range(2))
    calls, outs = record_calls(transformer).calls, outputs_of(transformer)
    steps = step_inputs(pipe.scheduler)
    pipe(
        prompt_embeds=pos,
        pooled_prompt_embeds=pooled,
        negative_prompt_embeds=neg,
        negative_pooled_prompt_embeds=neg_pooled,
        guidance_scale=4.0,
        num_inference_steps=3,
        height=HEIGHT,
        width=WIDTH,
        latents=start_latents(),
        output_type="latent",
    )
    assert len(calls) == len(steps) == 3
    for (_, kwargs), out, (model_output, _) in zip(calls, outs, steps, strict=True):
        assert kwargs["hidden_states"].shape == (2, 4, 8, 8)
        torch.testing.assert_close(kwargs["encoder_hidden_states"], torch.cat([neg, pos]))
        torch.testing.assert_close(kwargs["pooled_projections"], torch.cat([neg_pooled, pooled]))
        torch.testing.assert_close(model_output, guided(out, 4.0))


# ---------------------------------------------------------------- SDXL, SD3's text path, Flux


def test_sdxl_batches_2b_with_zeros_as_the_default_negative(record_calls):
    """With a UNet without `time_cond_proj_dim`, `StableDiffusionXLPipeline` batches `2B` from `guidance_scale > 1` as SD does, negative half first for `prompt_embeds`, the pooled `text_embeds` and `time_ids`, but with no `negative_prompt` its default `force_zeros_for_empty_prompt=True` makes the unconditional embeddings zeros, not an encoded empty string.

    ``negative_original_size`` / ``negative_target_size`` make the negative ``time_ids`` row
    differ from the positive one, so their order shows.
    """
    pipe = tiny_sdxl_pipeline()  # the constructor's default
    assert pipe.config.force_zeros_for_empty_prompt is True
    assert pipe.unet.config.time_cond_proj_dim is None  # else one pass at B (next test)
    for scale, on in [(1.0, False), (1.0001, True)]:
        pipe._guidance_scale = scale
        assert pipe.do_classifier_free_guidance is on
    pooled = torch.randn(1, POOLED_DIM, generator=torch.Generator().manual_seed(3))
    calls = record_calls(pipe.unet).calls
    pipe(
        prompt_embeds=PROMPT,
        pooled_prompt_embeds=pooled,
        guidance_scale=5.0,
        num_inference_steps=2,
        height=HEIGHT,
        width=WIDTH,
        negative_original_size=(8, 8),
        negative_target_size=(8, 8),
        latents=start_latents(),
        output_type="latent",
    )
    assert len(calls) == 2
    for args, kwargs in calls:
        assert args[0].shape == (2, 4, 8, 8)
        hidden, added = kwargs["encoder_hidden_states"], kwargs["added_cond_kwargs"]
        torch.testing.assert_close(hidden, torch.cat([torch.zeros_like(PROMPT), PROMPT]))
        torch.testing.assert_close(
            added["text_embeds"], torch.cat([torch.zeros_like(pooled), pooled])
        )
        # (original_size, crops_coords_top_left, target_size) per row: negative row first
        assert added["time_ids"].tolist() == [[8, 8, 0, 0, 8, 8], [16, 16, 0, 0, 16, 16]]


def test_sdxl_guidance_distilled_unet_gets_one_pass(record_calls):
    """`StableDiffusionXLPipeline` has the same threshold as SD: with a UNet that sets `time_cond_proj_dim`, `guidance_scale=5.0` gives one pass per step at batch `B` and the scale as `timestep_cond`."""
    unet = tiny_text_time_unet(time_cond_proj_dim=8)
    pipe = tiny_sdxl_pipeline(unet=unet)
    pooled = torch.randn(1, POOLED_DIM, generator=torch.Generator().manual_seed(3))
    calls = record_calls(pipe.unet).calls
    pipe(prompt_embeds=PROMPT, pooled_prompt_embeds=pooled, guidance_scale=5.0,
         num_inference_steps=2, height=HEIGHT, width=WIDTH, latents=start_latents(),
         output_type="latent")  # fmt: skip
    expected = pipe.get_guidance_scale_embedding(torch.tensor([4.0]), embedding_dim=8)
    assert [args[0].shape[0] for args, _ in calls] == [1, 1]
    for _, kwargs in calls:
        torch.testing.assert_close(kwargs["encoder_hidden_states"], PROMPT)
        torch.testing.assert_close(kwargs["timestep_cond"], expected)


def test_sd3_encodes_the_empty_string_as_the_default_negative(sd3_pipe, record_calls):
    """`StableDiffusion3Pipeline` encodes `""` when no `negative_prompt` is given (`negative_prompt = negative_prompt or ""`), and its `do_classifier_free_guidance` is `guidance_scale > 1` alone.

    Two tiny CLIP text encoders with projections, no T5 (``text_encoder_3=None``).
    """
    pipe = StableDiffusion3Pipeline(
        transformer=sd3_pipe.transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=sd3_pipe.vae,
        text_encoder=tiny_clip_with_projection(1),
        tokenizer=tiny_tokenizer(),
        text_encoder_2=tiny_clip_with_projection(2),
        tokenizer_2=tiny_tokenizer(),
        text_encoder_3=None,
        tokenizer_3=None,
    )
    pipe.set_progress_bar_config(disable=True)
    calls = record_calls(pipe.transformer).calls
    pipe(prompt="a cat", guidance_scale=4.0, num_inference_steps=1, height=HEIGHT, width=WIDTH,
         max_sequence_length=8, output_type="latent")  # fmt: skip
    hidden = calls[0][1]["encoder_hidden_states"]
    empty = pipe.encode_prompt("", None, None, device="cpu", do_classifier_free_guidance=False,
                               max_sequence_length=8)[0]  # fmt: skip
    cat = pipe.encode_prompt("a cat", None, None, device="cpu", do_classifier_free_guidance=False,
                             max_sequence_length=8)[0]  # fmt: skip
    torch.testing.assert_close(hidden, torch.cat([empty, cat]))
    assert empty[:, :77].abs().max() > 0  # a real CLIP encoding, not zeros
    for scale, on in [(1.0, False), (1.0001, True)]:
        pipe._guidance_scale = scale
        assert pipe.do_classifier_free_guidance is on


@pytest.mark.parametrize("guidance_scale", [1.0, 0.5, 0.0])
def test_sdxl_and_sd3_skip_the_uncond_branch_up_to_one(
    sdxl_pipe, sd3_pipe, record_calls, guidance_scale
):
    """In `StableDiffusionXLPipeline` and `StableDiffusion3Pipeline` too, `guidance_scale` 1 or below switches the unconditional branch off: every denoiser call gets batch `B` and the prompt embeddings alone.

    Each pipeline's ``__call__`` runs with negative embeddings passed, which must not reach
    the denoiser.
    """
    g = torch.Generator().manual_seed(5)
    pooled, neg_pooled = torch.randn(2, 1, 16, generator=g)
    pos, neg = (torch.randn(1, 10, EMBED_DIM, generator=g) for _ in range(2))
    common = dict(guidance_scale=guidance_scale, num_inference_steps=2, height=HEIGHT,
                  width=WIDTH, latents=start_latents(), output_type="latent")  # fmt: skip
    xl = record_calls(sdxl_pipe.unet).calls
    sdxl_pipe(prompt_embeds=PROMPT, negative_prompt_embeds=NEGATIVE, pooled_prompt_embeds=pooled,
              negative_pooled_prompt_embeds=neg_pooled, **common)  # fmt: skip
    sd3 = record_calls(sd3_pipe.transformer).calls
    sd3_pipe(prompt_embeds=pos, negative_prompt_embeds=neg, pooled_prompt_embeds=pooled,
             negative_pooled_prompt_embeds=neg_pooled, **common)  # fmt: skip
    assert [args[0].shape[0] for args, _ in xl] == [1, 1]
    assert [kwargs["hidden_states"].shape[0] for _, kwargs in sd3] == [1, 1]
    for (_, a), (_, b) in zip(xl, sd3, strict=True):
        torch.testing.assert_close(a["encoder_hidden_states"], PROMPT)
        torch.testing.assert_close(a["added_cond_kwargs"]["text_embeds"], pooled)
        torch.testing.assert_close(b["encoder_hidden_states"], pos)
        torch.testing.assert_close(b["pooled_projections"], pooled)


def test_sd3_skip_guidance_layers_adds_a_third_call(sd3_pipe, record_calls):
    """In `StableDiffusion3Pipeline`, skip-layer guidance is opt-in: with `skip_guidance_layers` set and CFG on, the steps whose index lies strictly between `skip_layer_guidance_start` and `skip_layer_guidance_stop` times `num_inference_steps` add a third transformer call, at batch `B` on the prompt alone with those layers skipped; without it every step is one call at `2B`.

    Ten steps with the defaults 0.01 and 0.2: only step 1 is inside the window. At
    ``guidance_scale=1`` (CFG off) the same ``skip_guidance_layers`` adds nothing.
    """
    g = torch.Generator().manual_seed(6)
    pos, neg = (torch.randn(1, 10, EMBED_DIM, generator=g) for _ in range(2))
    pooled, neg_pooled = torch.randn(2, 1, 16, generator=g)
    kwargs = dict(prompt_embeds=pos, negative_prompt_embeds=neg, pooled_prompt_embeds=pooled,
                  negative_pooled_prompt_embeds=neg_pooled, guidance_scale=4.0,
                  num_inference_steps=10, height=HEIGHT, width=WIDTH, latents=start_latents(),
                  output_type="latent")  # fmt: skip
    calls = record_calls(sd3_pipe.transformer).calls
    sd3_pipe(**kwargs)
    assert [k["hidden_states"].shape[0] for _, k in calls] == [2] * 10
    calls.clear()
    sd3_pipe(**kwargs, skip_guidance_layers=[0])
    assert [k["hidden_states"].shape[0] for _, k in calls] == [2, 2, 1] + [2] * 8
    third = calls[2][1]
    assert third["skip_layers"] == [0]
    torch.testing.assert_close(third["encoder_hidden_states"], pos)
    calls.clear()
    sd3_pipe(**{**kwargs, "guidance_scale": 1.0}, skip_guidance_layers=[0])
    assert [k["hidden_states"].shape[0] for _, k in calls] == [1] * 10


def test_negative_prompt_costs_no_denoiser_call_except_in_flux(text_pipe, flux_pipe, record_calls):
    """In `StableDiffusionPipeline` a negative prompt adds no denoiser compute (the same calls at batch `2B`, only the unconditional rows change); in `FluxPipeline` a negative prompt with `true_cfg_scale > 1` is what turns on the second transformer call per step."""
    unet = record_calls(text_pipe.unet).calls
    run(text_pipe, guidance_scale=7.5, steps=2, prompt="a cat")
    without = [args[0].shape[0] for args, _ in unet]
    unet.clear()
    run(text_pipe, guidance_scale=7.5, steps=2, prompt="a cat", negative_prompt="dog")
    assert [args[0].shape[0] for args, _ in unet] == without == [2, 2]
    flux = record_calls(flux_pipe.transformer).calls
    run_flux(flux_pipe, true_cfg_scale=4.0)
    assert len(flux) == 2  # 2 steps, one call each
    flux.clear()
    run_flux(flux_pipe, negative=True, true_cfg_scale=4.0)
    assert len(flux) == 4  # the negative prompt doubles the calls


FLUX_TEXT, FLUX_POOLED = flux_prompt_embeds()  # [neg, pos]: (2, 8, 32) and (2, 32)


@pytest.fixture(scope="module")
def flux_pipe():
    return tiny_flux_pipeline()


def run_flux(pipe, negative=False, **kwargs):
    """One 2-step call; ``negative=True`` also passes negative embeddings. Final latents."""
    if negative:
        kwargs.update(
            negative_prompt_embeds=FLUX_TEXT[:1], negative_pooled_prompt_embeds=FLUX_POOLED[:1]
        )
    return pipe(
        prompt_embeds=FLUX_TEXT[1:],
        pooled_prompt_embeds=FLUX_POOLED[1:],
        num_inference_steps=2,
        height=HEIGHT,
        width=WIDTH,
        generator=torch.Generator().manual_seed(1),
        output_type="latent",
        **kwargs,
    ).images


def test_flux_dev_takes_the_scale_as_an_input_in_one_call(flux_pipe, record_calls):
    """`FluxPipeline` with a guidance-embedding transformer (FLUX.1-dev, `guidance_embeds=True`) does not batch `2B`: with the default `true_cfg_scale=1.0` it makes one transformer call per step at batch `B` and passes `guidance_scale` (default 3.5) as the `guidance` input."""
    calls = record_calls(flux_pipe.transformer).calls
    low = run_flux(flux_pipe, guidance_scale=1.0)
    high = run_flux(flux_pipe)  # the default guidance_scale
    assert len(calls) == 4  # 2 steps x 2 calls of the pipeline
    for (_, kwargs), scale in zip(calls, [1.0, 1.0, 3.5, 3.5], strict=True):
        assert kwargs["hidden_states"].shape[0] == 1  # batch B: packed latents, not doubled
        torch.testing.assert_close(kwargs["encoder_hidden_states"], FLUX_TEXT[1:])
        assert kwargs["guidance"].tolist() == [scale]
    assert not torch.allclose(low, high)


def test_flux_schnell_ignores_guidance_scale(record_calls):
    """In `FluxPipeline`, with `guidance_embeds=False` (FLUX.1-schnell), the transformer gets `guidance=None`, and `guidance_scale` changes nothing."""
    pipe = tiny_flux_pipeline(guidance_embeds=False)
    calls = record_calls(pipe.transformer).calls
    low, high = run_flux(pipe, guidance_scale=1.0), run_flux(pipe, guidance_scale=7.0)
    assert all(kwargs["guidance"] is None for _, kwargs in calls)
    torch.testing.assert_close(low, high, rtol=0, atol=0)


def test_flux_true_cfg_adds_a_second_call(flux_pipe, record_calls, outputs_of, step_inputs):
    """In `FluxPipeline`, `true_cfg_scale > 1` with a negative prompt adds a second, separate transformer call per step at batch `B` on the negative embeddings, and `scheduler.step` gets `neg_noise_pred + true_cfg_scale * (noise_pred - neg_noise_pred)`; without a negative prompt `true_cfg_scale` silently changes nothing (no error, warning or log record).

    A handler on ``pipeline_flux``'s logger records every log record of the second run.
    """
    calls, outs = record_calls(flux_pipe.transformer).calls, outputs_of(flux_pipe.transformer)
    steps = step_inputs(flux_pipe.scheduler)
    run_flux(flux_pipe, negative=True, true_cfg_scale=4.0)
    assert len(calls) == 4 and len(steps) == 2  # two calls per step
    for i, (model_output, _) in enumerate(steps):
        (_, pos), (_, neg) = calls[2 * i], calls[2 * i + 1]
        assert pos["hidden_states"].shape[0] == neg["hidden_states"].shape[0] == 1
        torch.testing.assert_close(pos["encoder_hidden_states"], FLUX_TEXT[1:])
        torch.testing.assert_close(neg["encoder_hidden_states"], FLUX_TEXT[:1])
        noise_pred, neg_noise_pred = outs[2 * i], outs[2 * i + 1]
        torch.testing.assert_close(
            model_output, neg_noise_pred + 4.0 * (noise_pred - neg_noise_pred)
        )
    calls.clear()
    plain = run_flux(flux_pipe)
    from diffusers.pipelines.flux import pipeline_flux

    # at DEBUG, whatever verbosity an earlier test left
    with logged_messages(pipeline_flux.logger.name, logging.DEBUG) as records:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            without_negative = run_flux(flux_pipe, true_cfg_scale=4.0)
    assert records == [] and caught == []
    assert len(calls) == 4  # one call per step in each of the two runs
    torch.testing.assert_close(without_negative, plain, rtol=0, atol=0)


CONTROL_IMAGE = torch.rand(1, 3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def controlnet_pipe():
    """The real StableDiffusionControlNetPipeline: tiny UNet, a ControlNetModel made from it
    (``trained``: non-zero residuals)."""
    unet = tiny_unet()
    return tiny_controlnet_pipeline(
        unet, tiny_controlnet(unet, trained=True), scheduler=DDIMScheduler(**SD_SCHEDULER)
    )


def run_controlnet(pipe, guidance_scale=7.5, **kwargs):
    return run(pipe, guidance_scale, steps=2, image=CONTROL_IMAGE, **kwargs)


def test_controlnet_prepare_image_doubles_the_control_image(controlnet_pipe):
    """`StableDiffusionControlNetPipeline.prepare_image` returns `torch.cat([image] * 2)` (batch `2B`) when CFG is on and `guess_mode` is off, and the image at batch `B` otherwise."""

    def prepare(cfg, guess_mode):
        return controlnet_pipe.prepare_image(
            CONTROL_IMAGE, WIDTH, HEIGHT, 2, 1, "cpu", torch.float32, cfg, guess_mode
        )

    doubled = prepare(True, False)
    assert doubled.shape == (4, 3, HEIGHT, WIDTH)
    torch.testing.assert_close(doubled[:2], doubled[2:])
    torch.testing.assert_close(doubled[0], CONTROL_IMAGE[0])  # do_normalize=False: in [0, 1]
    assert prepare(True, True).shape == prepare(False, False).shape == (2, 3, HEIGHT, WIDTH)


def test_controlnet_gets_the_doubled_batch(controlnet_pipe, record_calls):
    """In `StableDiffusionControlNetPipeline`, with CFG on, the ControlNet runs once per step on the doubled control image and on the same doubled `latents` and `[negative_prompt_embeds, prompt_embeds]` as the UNet; with `guess_mode=True` it runs on batch `B` with `prompt_embeds` alone, and the UNet gets zeros as the unconditional half of its residuals."""
    calls = record_calls(controlnet_pipe.controlnet).calls
    unet_calls = record_calls(controlnet_pipe.unet).calls
    run_controlnet(controlnet_pipe)
    assert len(calls) == len(unet_calls) == 2
    for (args, kwargs), (unet_args, _) in zip(calls, unet_calls, strict=True):
        cond = kwargs["controlnet_cond"]
        assert args[0].shape == (2, 4, 8, 8) and cond.shape == (2, 3, HEIGHT, WIDTH)
        torch.testing.assert_close(args[0], unet_args[0])
        torch.testing.assert_close(cond[:1], cond[1:])
        torch.testing.assert_close(kwargs["encoder_hidden_states"], torch.cat([NEGATIVE, PROMPT]))
    calls.clear(), unet_calls.clear()
    run_controlnet(controlnet_pipe, guess_mode=True)
    assert len(calls) == len(unet_calls) == 2
    for (args, kwargs), (unet_args, unet_kwargs) in zip(calls, unet_calls, strict=True):
        assert args[0].shape == (1, 4, 8, 8) and kwargs["controlnet_cond"].shape[0] == 1
        torch.testing.assert_close(kwargs["encoder_hidden_states"], PROMPT)
        assert unet_args[0].shape[0] == 2
        mid = unet_kwargs["mid_block_additional_residual"]
        assert mid.shape[0] == 2 and not mid[:1].any() and mid[1:].any()


@pytest.fixture(scope="module")
def ip_pipe():
    """The tiny pipeline with a tiny CLIP image encoder (image_embeds width 16)."""
    return tiny_sd_pipeline(
        unet=tiny_unet(),
        image_encoder=tiny_image_encoder(
            hidden_size=32, intermediate_size=37, num_attention_heads=4
        ),
    )


def pixels(seed=0):
    """A CLIP-normalised pixel tensor (1, 3, 32, 32), as the feature extractor returns it."""
    return torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_ip_adapter_uncond_image_embeds_are_zeros(ip_pipe):
    """For a plain IP-Adapter (`output_hidden_states` off), `StableDiffusionPipeline.encode_image` returns `torch.zeros_like(image_embeds)` as the unconditional image embeddings."""
    image_embeds, uncond = ip_pipe.encode_image(pixels(), "cpu", 2)
    assert image_embeds.shape == uncond.shape == (2, 16)
    torch.testing.assert_close(uncond, torch.zeros_like(image_embeds), rtol=0, atol=0)
    assert image_embeds.abs().min() > 0


def test_ip_adapter_plus_uncond_encodes_a_zero_pixel_tensor(ip_pipe):
    """For IP-Adapter Plus (`output_hidden_states=True`), `StableDiffusionPipeline.encode_image` returns as the unconditional input the image encoder's penultimate hidden states for `torch.zeros_like(image)`, an all-zero tensor of CLIP-normalised pixels: an encoded image, not zeros."""
    hidden, uncond = ip_pipe.encode_image(pixels(), "cpu", 1, output_hidden_states=True)
    with torch.no_grad():
        zero_image = ip_pipe.image_encoder(torch.zeros(1, 3, 32, 32), output_hidden_states=True)
    assert hidden.shape == uncond.shape == (1, 17, 32)  # 16 patches + class token, width 32
    torch.testing.assert_close(uncond, zero_image.hidden_states[-2])
    assert not torch.allclose(uncond, zero_image.hidden_states[-1])
    assert uncond.abs().max() > 0.1


def test_clip_zero_pixels_are_the_mean_colour():
    """The `CLIPImageProcessor` that `StableDiffusionPipeline.load_ip_adapter` creates when the pipeline has none normalises with the CLIP mean and std, so an all-zero pixel tensor is an image filled with the CLIP mean colour (a mid grey), not a black image.

    ``load_ip_adapter`` runs on a fresh tiny pipeline with an image encoder and no
    ``feature_extractor``, given a plain IP-Adapter state dict; the processor it registers
    then turns a mean-colour image into zeros and a black one into large negative values.
    """
    pipe = tiny_sd_pipeline(unet=tiny_unet(), image_encoder=tiny_image_encoder(
        hidden_size=32, intermediate_size=37, num_attention_heads=4))  # fmt: skip
    assert pipe.feature_extractor is None
    pipe.load_ip_adapter(random_ip_adapter(pipe.unet), subfolder="", weight_name="unused")
    processor = pipe.feature_extractor
    assert isinstance(processor, CLIPImageProcessor)
    mean = np.rint(255 * np.asarray(processor.image_mean)).astype(np.uint8)
    grey = processor(np.broadcast_to(mean, (32, 32, 3)).copy(), return_tensors="pt").pixel_values
    black = processor(np.zeros((32, 32, 3), np.uint8), return_tensors="pt").pixel_values
    assert grey.shape == (1, 3, 32, 32)  # the image encoder's image_size
    assert grey.abs().max() < 0.01  # rounding of the mean to 8 bits
    assert black.max() < -1.4
    assert 100 < mean.min() and mean.max() < 130  # mid grey, all three channels


def test_ip_adapter_negative_image_embeds_come_first(ip_pipe, monkeypatch):
    """`StableDiffusionPipeline.prepare_ip_adapter_image_embeds` puts the unconditional image embeddings in front of the positive ones when CFG is on (batch `2B`) and leaves them out when it is off; with CFG on, embeddings you pass yourself as `ip_adapter_image_embeds` are read as `[negative, positive]` halves, and with it off, whole, as positive embeddings.

    The UNet gets two IP-Adapter projection layers, a plain ``ImageProjection`` and an
    ``IPAdapterPlusImageProjection``, as ``load_ip_adapter`` would install them.
    """
    projections = MultiIPAdapterImageProjection(
        [
            ImageProjection(image_embed_dim=16, cross_attention_dim=EMBED_DIM),
            IPAdapterPlusImageProjection(embed_dims=32, output_dims=EMBED_DIM, heads=4),
        ]
    )
    monkeypatch.setattr(ip_pipe.unet, "encoder_hid_proj", projections)
    image = pixels()
    plain, plus = ip_pipe.prepare_ip_adapter_image_embeds([image, image], None, "cpu", 2, True)
    embeds_, _ = ip_pipe.encode_image(image, "cpu", 1)
    hidden, uncond_hidden = ip_pipe.encode_image(image, "cpu", 1, output_hidden_states=True)
    assert plain.shape == (4, 1, 16) and plus.shape == (4, 1, 17, 32)
    torch.testing.assert_close(plain[:2], torch.zeros(2, 1, 16), rtol=0, atol=0)
    torch.testing.assert_close(plain[2:], embeds_[None].expand(2, -1, -1))
    torch.testing.assert_close(plus[:2], uncond_hidden[None].expand(2, -1, -1, -1))
    torch.testing.assert_close(plus[2:], hidden[None].expand(2, -1, -1, -1))
    off = ip_pipe.prepare_ip_adapter_image_embeds([image, image], None, "cpu", 2, False)
    assert [t.shape for t in off] == [(2, 1, 16), (2, 1, 17, 32)]
    own = torch.cat([torch.full((1, 1, 16), -1.0), torch.full((1, 1, 16), 1.0)])
    (mine,) = ip_pipe.prepare_ip_adapter_image_embeds(None, [own], "cpu", 2, True)
    assert mine[:, 0, 0].tolist() == [-1.0, -1.0, 1.0, 1.0]
    (whole,) = ip_pipe.prepare_ip_adapter_image_embeds(None, [own], "cpu", 2, False)
    assert whole[:, 0, 0].tolist() == [-1.0, 1.0, -1.0, 1.0]  # CFG off: no halves, both rows kept


# ---------------------------------------------------------------- parameterisation


def consistent_outputs(scheduler, t, x_t, x0):
    """The epsilon, v and sample predictions that all mean the clean estimate ``x0`` at ``x_t``."""
    a = scheduler.alphas_cumprod[t].double()
    eps = (x_t - a.sqrt() * x0) / (1 - a).sqrt()
    return {"epsilon": eps, "v_prediction": a.sqrt() * eps - (1 - a).sqrt() * x0, "sample": x0}


def ddim_step(prediction_type, model_output, t, x_t):
    scheduler = DDIMScheduler(prediction_type=prediction_type, **SD_SCHEDULER)
    scheduler.set_timesteps(10)
    return scheduler.step(model_output, t, x_t).prev_sample


def guided_pair(guidance_scale, rescale=None):
    """Guide consistent (uncond, cond) outputs in each parameterisation; step DDIM with each."""
    scheduler = DDIMScheduler(**SD_SCHEDULER)
    g = torch.Generator().manual_seed(0)
    x_t, x0_u, x0_c = (torch.randn(2, 4, 8, 8, generator=g, dtype=torch.float64) for _ in range(3))
    t = 501
    u = consistent_outputs(scheduler, t, x_t, x0_u)
    c = consistent_outputs(scheduler, t, x_t, x0_c)
    prev = {}
    for kind in u:
        out = u[kind] + guidance_scale * (c[kind] - u[kind])
        if rescale is not None:
            out = rescale_noise_cfg(out, c[kind], guidance_rescale=rescale)
        prev[kind] = ddim_step(kind, out, t, x_t)
    return prev


def test_guidance_is_the_same_in_every_parameterisation():
    """For consistent conditional and unconditional outputs, guiding the `epsilon`, `v_prediction` or `sample` output with the same `guidance_scale` gives the same `DDIMScheduler.step(...).prev_sample`: the weights `1 - s` and `s` sum to 1 and each target is an affine function of the others."""
    prev = guided_pair(7.5)
    torch.testing.assert_close(prev["v_prediction"], prev["epsilon"])
    torch.testing.assert_close(prev["sample"], prev["epsilon"])
    assert not torch.allclose(guided_pair(3.0)["epsilon"], prev["epsilon"])


def test_guidance_rescale_depends_on_the_parameterisation():
    """`rescale_noise_cfg` is the exception: rescaling the guided `epsilon` and the guided `v_prediction` gives different `prev_sample`, because a ratio of standard deviations is not preserved by the change of target."""
    prev = guided_pair(7.5, rescale=0.7)
    assert (prev["v_prediction"] - prev["epsilon"]).abs().max() > 1e-3


def test_sdxl_modular_guider_holds_the_scale_and_combines_once_per_step(tmp_path):
    """SDXL's modular pipeline (`diffusers.modular_pipelines`) writes no combine line of its own: its `guider` component, `ClassifierFreeGuidance` unless replaced, holds `guidance_scale` and combines the predictions once per step.

    Built from the tiny SDXL parts (``tiny_modular_sdxl``, which also builds a
    `StableDiffusionXLPipeline` to save them): `guidance_scale` is no input of its blocks, and
    a spy on the guider's `__call__` counts one call per step of one modular call, and setting
    the guider's `guidance_scale` changes the images."""
    from diffusers import ClassifierFreeGuidance

    pipe, _ = tiny_modular_sdxl(tmp_path / "tiny-sdxl")
    assert "guidance_scale" not in pipe.blocks.input_names
    assert type(pipe.guider) is ClassifierFreeGuidance and pipe.guider.guidance_scale > 1
    calls = []
    forward = type(pipe.guider).__call__

    def spy(self, *args, **kwargs):
        calls.append(self)
        return forward(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ClassifierFreeGuidance, "__call__", spy)
        images = pipe(**sdxl_modular_inputs(steps=3), output="images")
    assert calls == [pipe.guider] * 3
    pipe.guider.guidance_scale, default = 2.0, pipe.guider.guidance_scale  # the scale it holds
    try:
        rescaled = pipe(**sdxl_modular_inputs(steps=3), output="images")
    finally:
        pipe.guider.guidance_scale = default
    assert abs(rescaled - images).max() > 1e-3
