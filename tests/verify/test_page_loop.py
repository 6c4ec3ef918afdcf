"""Inference loop step by step (docs/handbook/loop.md) against the installed diffusers.

Everything runs on the real classes with tiny random-config parts built in code:
``StableDiffusionPipeline`` (tiny UNet and VAE from ``tiny``; a tiny ``CLIPTextModel``
and an in-memory ``CLIPTokenizer`` where the text path matters),
``StableDiffusionControlNetPipeline`` with a ``ControlNetModel`` made from the tiny UNet,
an IP-Adapter installed through the UNet's own loader from a random state dict, and
``StableDiffusion3Pipeline`` with a tiny ``SD3Transformer2DModel`` and tiny CLIP text
encoders. Hooks record what each model receives and returns. ``inspect`` only reads two
signatures, each beside a ``__call__`` that shows the same behaviour: the callback's default
tensor inputs and DDIM's ``set_timesteps`` without ``timesteps``.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import re
import typing

import numpy as np
import pytest
import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    DPMSolverSDEScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    HeunDiscreteScheduler,
    PNDMScheduler,
    StableDiffusion3Pipeline,
    StableDiffusionPipeline,
    UniPCMultistepScheduler,
)
from diffusers.models.attention_processor import AttnProcessor2_0, IPAdapterAttnProcessor2_0
from diffusers.pipelines.stable_diffusion import pipeline_stable_diffusion as sd_module
from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift
from diffusers.utils.torch_utils import randn_tensor
from tiny import (
    EMBED_DIM,
    HEIGHT,
    MODULAR_B,
    MODULAR_STEPS,
    SD15_PNDM,
    SD_SCHEDULER,
    WIDTH,
    embeds,
    flux_prompt_embeds,
    guided,
    guider_swapped,
    random_ip_adapter,
    schedulers_swapped,
    sd_with,
    sdxl_modular_inputs,
    start_latents,
    tiny_clip_with_projection,
    tiny_controlnet,
    tiny_controlnet_pipeline,
    tiny_flux_pipeline,
    tiny_modular_sdxl,
    tiny_sd3_pipeline,
    tiny_text_encoder,
    tiny_text_time_unet,
    tiny_tokenizer,
    tiny_unet,
    tiny_vae,
    unet_batches_of,
)

from infralens_docs.registry import ROOT

PROMPT, NEGATIVE = embeds(1), embeds(2)  # (1, 77, EMBED_DIM) stand-in prompt_embeds
LATENT = (1, 4, HEIGHT // 2, WIDTH // 2)  # the tiny VAE downsamples by 2


def sd_scheduler(cls, **overrides):
    """``cls`` with SD 1.5's scheduler config (``tiny.SD_SCHEDULER``: ``steps_offset=1``,
    ``clip_sample=False``, ``set_alpha_to_one=False``), as ``cls.from_config(pipe.scheduler.config)``
    carries it over; keys ``cls`` does not take are ignored, as ``from_config`` does."""
    return cls.from_config({**SD_SCHEDULER, **overrides})


# ---------------------------------------------------------------- helpers (this page only)


def once_per_entry_sentences(page: str) -> list[str]:
    """The sentences (or table cells) of a page that say the denoiser runs once per entry."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    found = []
    for line in text.splitlines():
        for part in re.split(r"(?<=[.!?])\s+|\s\|\s", line):
            if re.search(r"once per (entry|`scheduler\.timesteps` entry)", part):
                found.append(part)
    return found


def run(pipe, guidance_scale=7.5, steps=3, latents=None, **kwargs):
    """One call of the tiny pipeline; returns ``.images`` (the final latents by default)."""
    if "prompt" not in kwargs:
        kwargs.setdefault("prompt_embeds", PROMPT)
        if guidance_scale > 1:
            kwargs.setdefault("negative_prompt_embeds", NEGATIVE)
    kwargs.setdefault("height", HEIGHT)
    kwargs.setdefault("width", WIDTH)
    kwargs.setdefault("output_type", "latent")
    return pipe(
        num_inference_steps=steps,
        guidance_scale=guidance_scale,
        latents=start_latents() if latents is None else latents,
        **kwargs,
    ).images


@pytest.fixture
def outputs_of():
    """``outputs_of(module) -> list``: the output of every forward (tuple or ``.sample``)."""
    handles = []

    def attach(module):
        seen = []

        def hook(mod, args, output):
            seen.append(output)

        handles.append(module.register_forward_hook(hook))
        return seen

    yield attach
    for handle in handles:
        handle.remove()


@pytest.fixture
def step_calls(monkeypatch):
    """``spy(scheduler) -> list``: a dict of every ``scheduler.step`` call and its result."""

    def spy(scheduler):
        seen = []
        original = scheduler.step

        @functools.wraps(original)
        def step(model_output, timestep, sample, *args, **kwargs):
            out = original(model_output, timestep, sample, *args, **kwargs)
            seen.append(
                dict(
                    model_output=model_output.clone(),
                    t=timestep,
                    sample=sample.clone(),
                    kwargs=dict(kwargs),
                    prev_sample=out[0].clone(),
                )
            )
            return out

        monkeypatch.setattr(scheduler, "step", step)
        return seen

    return spy


class Bar:
    """Stands in for the pipeline's tqdm bar: records ``total`` and counts ``update()``."""

    def __init__(self, total):
        self.total, self.updates = total, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        self.updates += n


@pytest.fixture
def bars(monkeypatch):
    """``spy(pipe) -> list``: the progress bars ``pipe`` opens (``Bar`` objects)."""

    def spy(pipe):
        seen = []

        def progress_bar(iterable=None, total=None):
            seen.append(Bar(total))
            return seen[-1]

        monkeypatch.setattr(pipe, "progress_bar", progress_bar)
        return seen

    return spy


@pytest.fixture(scope="module")
def text_pipe(sd_pipe):
    """The tiny pipeline with a tiny CLIP text encoder and tokenizer."""
    return sd_with(sd_pipe, text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer())


# ---------------------------------------------------------------- before the loop


def test_default_size_is_unet_sample_size_times_vae_scale_factor(sd_pipe):
    """In `StableDiffusionPipeline`, if `height` or `width` is missing, both become `unet.config.sample_size * vae_scale_factor`, where `vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1)`: 8 for SD's four-block VAE; a lone `height` is dropped."""
    assert sd_pipe.vae_scale_factor == 2  # the tiny VAE has two blocks
    torch.manual_seed(0)
    four_blocks = AutoencoderKL(
        block_out_channels=(32,) * 4,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
    )
    assert sd_with(sd_pipe, vae=four_blocks).vae_scale_factor == 8
    pipe = sd_with(sd_pipe, unet=tiny_unet(sample_size=12))
    image = pipe(
        prompt_embeds=PROMPT,
        guidance_scale=1.0,
        num_inference_steps=1,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    ).images
    assert image.shape == (1, 24, 24, 3)  # 12 * 2 pixels each way
    for one_side in [dict(height=32), dict(width=32)]:  # the given side is dropped too
        image = pipe(prompt_embeds=PROMPT, guidance_scale=1.0, num_inference_steps=1,
                     output_type="np", **one_side).images  # fmt: skip
        assert image.shape == (1, 24, 24, 3), one_side


@pytest.mark.parametrize(
    "bad",
    [
        dict(height=12),  # divisible by the tiny VAE's factor 2, not by 8
        dict(width=20),
        dict(prompt="a cat"),  # together with prompt_embeds
        dict(prompt_embeds=None),  # neither prompt nor prompt_embeds
        dict(negative_prompt="blurry"),  # together with negative_prompt_embeds
        dict(negative_prompt_embeds=torch.zeros(1, 70, EMBED_DIM)),  # shape mismatch
        dict(callback_on_step_end_tensor_inputs=["latents", "noise_pred"]),
    ],
    ids=["height", "width", "both-prompts", "no-prompt", "both-negatives", "shapes", "callback"],
)
def test_check_inputs_rejects_bad_calls_before_any_model_runs(sd_pipe, record_calls, bad):
    """`StableDiffusionPipeline.check_inputs` raises `ValueError` before any model runs when `height` or `width` is not divisible by 8, when both or neither of `prompt` and `prompt_embeds` are given, when both `negative_prompt` and `negative_prompt_embeds` are given, when `prompt_embeds` and `negative_prompt_embeds` differ in shape, or when `callback_on_step_end_tensor_inputs` names a tensor outside `_callback_tensor_inputs`, which is `["latents", "prompt_embeds", "negative_prompt_embeds"]`."""
    assert StableDiffusionPipeline._callback_tensor_inputs == [
        "latents",
        "prompt_embeds",
        "negative_prompt_embeds",
    ]
    calls = record_calls(sd_pipe.unet).calls
    kwargs = dict(prompt_embeds=PROMPT, negative_prompt_embeds=NEGATIVE, height=16, width=16)
    kwargs.update(bad)
    with pytest.raises(ValueError):
        sd_pipe(guidance_scale=7.5, num_inference_steps=2, output_type="latent", **kwargs)
    assert calls == []
    run(sd_pipe, steps=1, callback_on_step_end_tensor_inputs=list(sd_pipe._callback_tensor_inputs))
    assert len(calls) == 1  # the same call with valid inputs runs


def test_batch_size_from_prompt_or_prompt_embeds(text_pipe, record_calls):
    """In `StableDiffusionPipeline`, `batch_size` is 1 for a string `prompt`, `len(prompt)` for a list and `prompt_embeds.shape[0]` otherwise, and the `latents` get batch `B = batch_size * num_images_per_prompt`."""
    calls = record_calls(text_pipe.unet).calls

    def batch(**kwargs):
        calls.clear()
        text_pipe(
            guidance_scale=1.0,
            num_inference_steps=1,
            height=HEIGHT,
            width=WIDTH,
            output_type="latent",
            **kwargs,
        )
        return calls[0][0][0].shape[0]

    assert batch(prompt="a cat") == 1
    assert batch(prompt=["a cat", "a dog", "an owl"]) == 3
    assert batch(prompt=["a cat", "a dog"], num_images_per_prompt=2) == 4
    assert batch(prompt_embeds=embeds(1, batch=3), num_images_per_prompt=2) == 6


def test_encode_prompt_pads_to_77_and_puts_the_negative_first(text_pipe, record_calls):
    """`StableDiffusionPipeline.encode_prompt` pads or truncates every prompt to `tokenizer.model_max_length` (77) tokens, int64 `input_ids` of shape `(batch_size, 77)`, and casts the text encoder's last hidden state to `text_encoder.dtype`; with CFG the negative prompt, or `""`, goes through the same text encoder, and the UNet gets `torch.cat([negative_prompt_embeds, prompt_embeds])`, each repeated `num_images_per_prompt` times: `(2B, 77, D)`."""
    encoder_calls = record_calls(text_pipe.text_encoder).calls
    unet_calls = record_calls(text_pipe.unet).calls
    long_prompt = " ".join("abcdefghij") * 12  # 120 letter tokens: truncated to 77
    run(text_pipe, prompt=long_prompt, num_images_per_prompt=2, steps=1, latents=start_latents(2))
    assert len(encoder_calls) == 2  # the prompt, then the default negative ""
    ids = [args[0] for args, _ in encoder_calls]
    assert [tuple(i.shape) for i in ids] == [(1, 77), (1, 77)]
    assert all(i.dtype == torch.int64 for i in ids)
    tokenize = functools.partial(text_pipe.tokenizer, padding="max_length", return_tensors="pt")
    torch.testing.assert_close(ids[1], tokenize("").input_ids)  # start token, then padding
    torch.testing.assert_close(ids[0], tokenize(long_prompt, truncation=True).input_ids)
    with torch.no_grad():
        positive = text_pipe.text_encoder(ids[0])[0]
        negative = text_pipe.text_encoder(ids[1])[0]
    hidden = unet_calls[0][1]["encoder_hidden_states"]
    assert hidden.shape == (4, 77, EMBED_DIM)
    torch.testing.assert_close(hidden, torch.cat([negative, negative, positive, positive]))
    half = sd_with(text_pipe, text_encoder=tiny_text_encoder().to(torch.bfloat16))
    embeds_bf16, negative_bf16 = half.encode_prompt("a cat", "cpu", 1, True)
    assert embeds_bf16.dtype == negative_bf16.dtype == torch.bfloat16  # text_encoder.dtype


def test_custom_timesteps_and_sigmas(sd_pipe, record_calls, bars):
    """In `StableDiffusionPipeline`, `retrieve_timesteps` passes custom `timesteps=` or `sigmas=` to `set_timesteps` only if its signature accepts them, raising `ValueError` otherwise, and then sets `num_inference_steps = len(timesteps)`, which becomes the progress bar's `total`.

    The bar need not reach it: with an order-2 scheduler it advances on every second call, so
    ``HeunDiscreteScheduler`` with ``timesteps=[999, 500, 1]`` makes 5 UNet calls under a bar of
    ``total=5`` that advances 3 times.
    """
    ddpm = sd_with(sd_pipe, scheduler=sd_scheduler(DDPMScheduler))
    calls = record_calls(ddpm.unet).calls
    bar = bars(ddpm)
    run(ddpm, guidance_scale=1.0, steps=50, timesteps=[900, 500, 100])
    assert [int(args[1]) for args, _ in calls] == [900, 500, 100]
    assert bar[0].total == 3 and bar[0].updates == 3
    euler = sd_with(sd_pipe, scheduler=sd_scheduler(EulerDiscreteScheduler))
    calls.clear()
    bar = bars(euler)
    run(euler, guidance_scale=1.0, steps=50, sigmas=[10.0, 3.0, 1.0, 0.3, 0.0])  # ends at 0
    assert len(calls) == 4 and bar[0].total == 4
    heun = sd_with(sd_pipe, scheduler=sd_scheduler(HeunDiscreteScheduler))
    calls.clear()
    bar = bars(heun)
    run(heun, guidance_scale=1.0, steps=50, timesteps=[999, 500, 1])
    assert len(calls) == len(heun.scheduler.timesteps) == bar[0].total == 5
    assert bar[0].updates == 3
    torch.testing.assert_close(euler.scheduler.sigmas, torch.tensor([10.0, 3.0, 1.0, 0.3, 0.0]))
    assert "timesteps" not in inspect.signature(DDIMScheduler.set_timesteps).parameters
    with pytest.raises(ValueError, match="does not support custom timestep"):
        run(sd_pipe, guidance_scale=1.0, timesteps=[900, 500, 100])


def test_timesteps_shape_and_dtype_per_scheduler(sd_pipe, record_calls):
    """With SD 1.5's settings, after `set_timesteps(n)`, `scheduler.timesteps` has shape `(n,)`, int64 for `DDPMScheduler` and `DDIMScheduler` and float32 for `EulerDiscreteScheduler`, and `StableDiffusionPipeline` passes each entry `t` to the UNet as a 0-d tensor."""
    calls = record_calls(sd_pipe.unet).calls
    for scheduler, dtype in [
        (sd_scheduler(DDPMScheduler), torch.int64),
        (sd_scheduler(DDIMScheduler), torch.int64),
        (sd_scheduler(EulerDiscreteScheduler), torch.float32),
    ]:
        pipe = sd_with(sd_pipe, scheduler=scheduler)
        calls.clear()
        run(pipe, guidance_scale=1.0, steps=3)
        assert pipe.scheduler.timesteps.shape == (3,)
        assert pipe.scheduler.timesteps.dtype == dtype
        ts = [args[1] for args, _ in calls]
        assert all(torch.is_tensor(t) and t.ndim == 0 and t.dtype == dtype for t in ts)
        torch.testing.assert_close(torch.stack(ts), pipe.scheduler.timesteps)


def test_prepare_latents_draws_and_scales_by_init_noise_sigma(sd_pipe, record_calls, monkeypatch):
    """`StableDiffusionPipeline.prepare_latents` draws `randn_tensor((B, unet.config.in_channels, h, w), generator=generator, dtype=prompt_embeds.dtype)`, or takes the `latents` passed in, and multiplies either by `scheduler.init_noise_sigma`: 1.0 for DDPM and DDIM, and for Euler `sigmas.max()` with its default `linspace` spacing or `sqrt(sigmas.max() ** 2 + 1)` with `leading`."""
    calls = record_calls(sd_pipe.unet).calls
    sd_pipe(
        prompt_embeds=PROMPT,
        guidance_scale=1.0,
        num_inference_steps=1,
        height=HEIGHT,
        width=WIDTH,
        generator=torch.Generator().manual_seed(5),
        output_type="latent",
    )
    noise = torch.randn(LATENT, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(calls[0][0][0], noise, rtol=0, atol=0)  # DDIM: init sigma 1.0
    monkeypatch.setattr(sd_pipe.scheduler, "init_noise_sigma", 3.0)
    calls.clear()
    run(sd_pipe, guidance_scale=1.0, steps=1)
    torch.testing.assert_close(calls[0][0][0], 3.0 * start_latents())
    drawn = sd_pipe.prepare_latents(
        1, 4, HEIGHT, WIDTH, torch.float16, "cpu", torch.Generator().manual_seed(5)
    )
    assert drawn.dtype == torch.float16 and drawn.shape == LATENT
    assert DDPMScheduler().init_noise_sigma == DDIMScheduler().init_noise_sigma == 1.0
    for spacing, expected in [("linspace", lambda s: s), ("leading", lambda s: (s**2 + 1) ** 0.5)]:
        euler = sd_scheduler(EulerDiscreteScheduler, timestep_spacing=spacing)
        euler.set_timesteps(10)
        torch.testing.assert_close(
            torch.as_tensor(euler.init_noise_sigma), expected(euler.sigmas.max())
        )


def test_extra_step_kwargs_follow_the_step_signature(sd_pipe, step_calls):
    """In `StableDiffusionPipeline`, `eta` and `generator` reach `scheduler.step` only if its signature has them: `DDIMScheduler.step` gets both, `EulerDiscreteScheduler.step` only `generator`, and `PNDMScheduler.step` neither."""
    expected = {DDIMScheduler: {"eta", "generator"}, EulerDiscreteScheduler: {"generator"}}
    for scheduler in [
        sd_scheduler(DDIMScheduler),
        sd_scheduler(EulerDiscreteScheduler),
        PNDMScheduler(**SD15_PNDM),
    ]:
        cls = type(scheduler)
        pipe = sd_with(sd_pipe, scheduler=scheduler)
        seen = step_calls(pipe.scheduler)
        run(pipe, guidance_scale=1.0, steps=2, eta=0.5, generator=torch.Generator())
        assert {k for k in seen[0]["kwargs"] if k != "return_dict"} == expected.get(cls, set())
        if cls is DDIMScheduler:
            assert seen[0]["kwargs"]["eta"] == 0.5


def test_guidance_distilled_unet_gets_timestep_cond_and_one_pass(sd_pipe, record_calls):
    """In `StableDiffusionPipeline`, a UNet with `time_cond_proj_dim` set gets `timestep_cond`, the sinusoidal embedding of `1000 * (guidance_scale - 1)`, and a single pass at batch `B` even at `guidance_scale` 7.5: `do_classifier_free_guidance` is `guidance_scale > 1 and unet.config.time_cond_proj_dim is None`."""
    pipe = sd_with(sd_pipe, unet=tiny_unet(time_cond_proj_dim=16))
    calls = record_calls(pipe.unet).calls
    run(pipe, guidance_scale=7.5, steps=2)
    assert pipe.do_classifier_free_guidance is False
    cond = calls[0][1]["timestep_cond"]
    freqs = torch.exp(-math.log(10000.0) * torch.arange(8) / 7)
    angle = 1000 * 6.5 * freqs
    torch.testing.assert_close(cond, torch.cat([angle.sin(), angle.cos()])[None], atol=1e-4, rtol=0)
    assert all(args[0].shape[0] == 1 for args, _ in calls)
    calls = record_calls(sd_pipe.unet).calls
    run(sd_pipe, guidance_scale=1.01, steps=1)  # no guidance embedding: CFG from just above 1
    assert calls[0][0][0].shape[0] == 2 and calls[0][1]["timestep_cond"] is None


# ---------------------------------------------------------------- the loop


def test_one_unet_call_per_step_with_the_loop_arguments(sd_pipe, record_calls, step_calls):
    """In `StableDiffusionPipeline`, each iteration makes one UNet call, with `torch.cat([latents] * 2)` `(2B, 4, h, w)`, `t`, `encoder_hidden_states=prompt_embeds` `(2B, 77, D)`, `timestep_cond`, `cross_attention_kwargs`, `added_cond_kwargs` and `return_dict=False`, and `scheduler.step` turns the guided prediction into the next `latents` `(B, 4, h, w)`."""
    calls = record_calls(sd_pipe.unet).calls
    steps = step_calls(sd_pipe.scheduler)
    run(sd_pipe, steps=3, cross_attention_kwargs={"foo": 1})
    assert len(calls) == len(steps) == 3
    for (args, kwargs), step in zip(calls, steps, strict=True):
        sample, t = args
        assert sample.shape == (2, 4, 8, 8)
        torch.testing.assert_close(sample, torch.cat([step["sample"]] * 2))  # DDIM: no scaling
        assert t == step["t"]
        assert set(kwargs) == {
            "encoder_hidden_states",
            "timestep_cond",
            "cross_attention_kwargs",
            "added_cond_kwargs",
            "return_dict",
        }
        torch.testing.assert_close(kwargs["encoder_hidden_states"], torch.cat([NEGATIVE, PROMPT]))
        assert kwargs["cross_attention_kwargs"] == {"foo": 1}
        assert kwargs["added_cond_kwargs"] is None and kwargs["return_dict"] is False
        assert step["prev_sample"].shape == LATENT
    for before, after in itertools.pairwise(steps):
        torch.testing.assert_close(after["sample"], before["prev_sample"])


def test_unet_expands_the_0d_timestep_to_the_batch(sd_pipe, record_calls):
    """In `StableDiffusionPipeline`, the UNet gets `t` as a 0-d tensor and expands it to the batch itself (`timesteps.expand(sample.shape[0])` in `get_time_embed`): its time projection sees `2B` copies of `t`."""
    unet_calls = record_calls(sd_pipe.unet).calls
    proj_calls = record_calls(sd_pipe.unet.time_proj).calls
    run(sd_pipe, steps=2)
    for (unet_args, _), (proj_args, _) in zip(unet_calls, proj_calls, strict=True):
        t = unet_args[1]
        assert t.ndim == 0
        torch.testing.assert_close(proj_args[0], t.expand(2))


class NoScaleModelInput(DDIMScheduler):
    """DDIM without a ``scale_model_input`` attribute (``hasattr`` is False)."""

    @property
    def scale_model_input(self):
        raise AttributeError("scale_model_input")


def test_scale_model_input_is_guarded_and_per_class(sd_pipe, record_calls):
    """In `StableDiffusionPipeline`, `scale_model_input` is called only if the scheduler has it (`hasattr`), so a scheduler without it runs the same loop; it is the identity for DDPM and DDIM, and for Euler it divides by `sqrt(sigma ** 2 + 1)`."""
    expected = run(sd_pipe, steps=3)
    assert not hasattr(NoScaleModelInput(), "scale_model_input")
    without = sd_with(sd_pipe, scheduler=NoScaleModelInput(**SD_SCHEDULER))
    torch.testing.assert_close(run(without, steps=3), expected, rtol=0, atol=0)
    x = start_latents()
    for cls in [DDPMScheduler, DDIMScheduler]:
        scheduler = sd_scheduler(cls)
        scheduler.set_timesteps(10)
        assert scheduler.scale_model_input(x, scheduler.timesteps[0]) is x
    euler = sd_with(sd_pipe, scheduler=sd_scheduler(EulerDiscreteScheduler))
    calls = record_calls(euler.unet).calls
    run(euler, guidance_scale=1.0, steps=3)
    sigma = euler.scheduler.sigmas[0]
    torch.testing.assert_close(calls[0][0][0], x * sigma / (sigma**2 + 1) ** 0.5)


def test_guidance_line_between_unet_and_step(sd_pipe, outputs_of, step_calls, calls_of):
    """In `StableDiffusionPipeline`, with CFG, `scheduler.step` gets `noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)` from the two `chunk(2)` halves of the UNet output, passed through `rescale_noise_cfg(noise_pred, noise_pred_text, guidance_rescale=...)` only when `guidance_rescale > 0`."""
    outs = outputs_of(sd_pipe.unet)
    steps = step_calls(sd_pipe.scheduler)
    rescales = calls_of(sd_module, "rescale_noise_cfg")
    run(sd_pipe, guidance_scale=5.0, steps=2)
    assert rescales == []
    for out, step in zip(outs, steps, strict=True):
        torch.testing.assert_close(step["model_output"], guided(out[0], 5.0))
    outs.clear(), steps.clear()
    run(sd_pipe, guidance_scale=5.0, steps=2, guidance_rescale=0.7)
    assert len(rescales) == 2
    for out, step in zip(outs, steps, strict=True):
        text = out[0].chunk(2)[1]
        expected = sd_module.rescale_noise_cfg(guided(out[0], 5.0), text, guidance_rescale=0.7)
        torch.testing.assert_close(step["model_output"], expected)


@pytest.mark.parametrize("scheduler_cls", [DDIMScheduler, EulerDiscreteScheduler])
def test_the_loop_written_out_reproduces_the_pipeline(sd_pipe, scheduler_cls):
    """Written out from the lines on this page (`randn_tensor` times `init_noise_sigma`, `torch.cat([latents] * 2)`, `scale_model_input`, one UNet call, `chunk(2)` and the guidance line, `scheduler.step(...)[0]`, then `vae.decode(latents / scaling_factor)`), the loop reproduces `StableDiffusionPipeline`'s output, with `DDIMScheduler` and with `EulerDiscreteScheduler`."""
    pipe = sd_with(sd_pipe, scheduler=sd_scheduler(scheduler_cls))
    guidance_scale, steps = 6.0, 4
    expected = pipe(
        prompt_embeds=PROMPT,
        negative_prompt_embeds=NEGATIVE,
        guidance_scale=guidance_scale,
        num_inference_steps=steps,
        height=HEIGHT,
        width=WIDTH,
        generator=torch.Generator().manual_seed(3),
        output_type="pt",
    ).images

    scheduler = sd_scheduler(scheduler_cls)  # a fresh instance
    scheduler.set_timesteps(steps)
    prompt_embeds = torch.cat([NEGATIVE, PROMPT])
    generator = torch.Generator().manual_seed(3)
    latents = randn_tensor(LATENT, generator=generator) * scheduler.init_noise_sigma
    with torch.no_grad():
        for t in scheduler.timesteps:
            latent_model_input = scheduler.scale_model_input(torch.cat([latents] * 2), t)
            noise_pred = pipe.unet(latent_model_input, t, encoder_hidden_states=prompt_embeds)[0]
            noise_pred = guided(noise_pred, guidance_scale)
            latents = scheduler.step(noise_pred, t, latents, generator=generator)[0]
        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor)[0]
    torch.testing.assert_close(expected, (image / 2 + 0.5).clamp(0, 1))


@pytest.mark.parametrize(
    "make",
    [
        lambda: sd_scheduler(EulerDiscreteScheduler),
        lambda: sd_scheduler(EulerAncestralDiscreteScheduler),
        lambda: FlowMatchEulerDiscreteScheduler(shift=3.0),
    ],
    ids=["euler", "euler_ancestral", "flow_match_euler"],
)
def test_euler_step_computes_in_float32_and_casts_back(make):
    """`EulerDiscreteScheduler.step`, `EulerAncestralDiscreteScheduler.step` and `FlowMatchEulerDiscreteScheduler.step` upcast the sample to float32 and cast `prev_sample` back to the dtype of the model output."""
    g = torch.Generator().manual_seed(0)
    x, eps = (torch.randn(LATENT, generator=g).to(torch.bfloat16) for _ in range(2))

    def step(sample, model_output):
        scheduler = make()
        scheduler.set_timesteps(10)
        generator = torch.Generator().manual_seed(1)  # the ancestral step draws noise
        t = scheduler.timesteps[0]
        return scheduler.step(model_output, t, sample, generator=generator).prev_sample

    out = step(x, eps)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, step(x.float(), eps).to(torch.bfloat16), rtol=0, atol=0)
    assert step(x.float(), eps).dtype == torch.bfloat16  # the model output's dtype decides
    assert step(x, eps.float()).dtype == torch.float32


def test_callback_on_step_end_runs_after_step_and_replaces_tensors(
    sd_pipe, record_calls, step_calls
):
    """In `StableDiffusionPipeline`, `callback_on_step_end(self, i, t, callback_kwargs)` runs after `scheduler.step` with the tensors named in `callback_on_step_end_tensor_inputs` (default `["latents"]`), and `latents` or `prompt_embeds` it returns replace the loop's own from the next step on."""
    assert inspect.signature(StableDiffusionPipeline.__call__).parameters[
        "callback_on_step_end_tensor_inputs"
    ].default == ["latents"]
    seen = []
    steps = step_calls(sd_pipe.scheduler)

    def callback(pipe, i, t, callback_kwargs):
        seen.append((pipe, i, t, {k: v.clone() for k, v in callback_kwargs.items()}))
        return {}

    run(sd_pipe, steps=3, callback_on_step_end=callback)
    assert [s[1] for s in seen] == [0, 1, 2] and all(s[0] is sd_pipe for s in seen)
    for (_, _, t, kwargs), step in zip(seen, steps, strict=True):
        assert set(kwargs) == {"latents"} and t == step["t"]
        torch.testing.assert_close(kwargs["latents"], step["prev_sample"])

    calls = record_calls(sd_pipe.unet).calls
    new_latents, new_embeds = torch.full(LATENT, 0.5), embeds(7, batch=2)

    def replace(pipe, i, t, callback_kwargs):
        return {"latents": new_latents, "prompt_embeds": new_embeds} if i == 0 else {}

    run(sd_pipe, steps=3, callback_on_step_end=replace)
    torch.testing.assert_close(calls[1][0][0], torch.cat([new_latents] * 2))
    torch.testing.assert_close(calls[0][1]["encoder_hidden_states"], torch.cat([NEGATIVE, PROMPT]))
    torch.testing.assert_close(calls[1][1]["encoder_hidden_states"], new_embeds)


def test_callback_sees_the_concatenated_prompt_embeds(sd_pipe, record_calls):
    """In `StableDiffusionPipeline`, with CFG the callback's `prompt_embeds` is the concatenated `(2B, 77, D)` tensor the UNet gets, and a returned `negative_prompt_embeds` is accepted but never read again: the concatenation happened before the loop."""
    seen = []
    calls = record_calls(sd_pipe.unet).calls

    def callback(pipe, i, t, callback_kwargs):
        seen.append({k: v.clone() for k, v in callback_kwargs.items()})
        return {"negative_prompt_embeds": torch.zeros_like(NEGATIVE)}

    inputs = ["latents", "prompt_embeds", "negative_prompt_embeds"]
    run(sd_pipe, steps=2, callback_on_step_end=callback, callback_on_step_end_tensor_inputs=inputs)
    torch.testing.assert_close(seen[0]["prompt_embeds"], torch.cat([NEGATIVE, PROMPT]))
    torch.testing.assert_close(seen[0]["negative_prompt_embeds"], NEGATIVE)
    for _, kwargs in calls:
        torch.testing.assert_close(kwargs["encoder_hidden_states"], torch.cat([NEGATIVE, PROMPT]))


def test_interrupt_skips_the_remaining_steps(sd_pipe, record_calls):
    """Setting `pipe._interrupt = True` (read through the `interrupt` property) makes every remaining iteration `continue`: no further UNet calls, and `StableDiffusionPipeline` returns the `latents` of the last step that ran."""
    calls = record_calls(sd_pipe.unet).calls
    kept = {}

    def stop_after_two(pipe, i, t, callback_kwargs):
        kept[i] = callback_kwargs["latents"].clone()
        if i == 1:
            pipe._interrupt = True
        return {}

    out = run(sd_pipe, steps=5, callback_on_step_end=stop_after_two)
    assert len(calls) == 2 and sorted(kept) == [0, 1]
    torch.testing.assert_close(out, kept[1], rtol=0, atol=0)
    calls.clear()
    run(sd_pipe, steps=5)  # `_interrupt` is reset to False by the next call
    assert len(calls) == 5


def test_progress_bar_counts_num_inference_steps(sd_pipe, record_calls, bars):
    """In `StableDiffusionPipeline`, the progress bar has `total=num_inference_steps` and advances when `i` is the last index or `(i + 1) > num_warmup_steps and (i + 1) % scheduler.order == 0`, with `num_warmup_steps = len(timesteps) - num_inference_steps * scheduler.order`, so it shows `n` whether the UNet ran `n` times (DDIM), `n + 1` (SD 1.5's PNDM) or `2n - 1` (Heun)."""
    calls = record_calls(sd_pipe.unet).calls
    n = 4
    for scheduler, unet_calls in [
        (sd_scheduler(DDIMScheduler), n),
        (PNDMScheduler(**SD15_PNDM), n + 1),
        (sd_scheduler(HeunDiscreteScheduler), 2 * n - 1),
    ]:
        pipe = sd_with(sd_pipe, scheduler=scheduler)
        bar = bars(pipe)
        calls.clear()
        run(pipe, guidance_scale=1.0, steps=n)
        assert len(calls) == unet_calls
        assert bar[0].total == n and bar[0].updates == n


# ---------------------------------------------------------------- after the loop


def test_decode_and_postprocess(sd_pipe, calls_of, outputs_of):
    """In `StableDiffusionPipeline`, unless `output_type="latent"`, the final `latents` are decoded once, as `vae.decode(latents / vae.config.scaling_factor, return_dict=False, generator=generator)`, `run_safety_checker` gets the decoded image, and `postprocess` maps it to `(x / 2 + 0.5).clamp(0, 1)`: float32 NumPy `(B, H, W, 3)` for `"np"`, and those values times 255, rounded to uint8, as PIL images for `"pil"`, the default."""
    assert tiny_vae().config.scaling_factor == 0.18215  # the AutoencoderKL default, SD 1.x's
    final = run(sd_pipe, steps=2)
    decodes = calls_of(sd_pipe.vae, "decode")
    checks = calls_of(sd_pipe, "run_safety_checker")
    frees = calls_of(sd_pipe, "maybe_free_model_hooks")
    decoder_out = outputs_of(sd_pipe.vae.decoder)
    generator = torch.Generator()
    image = run(sd_pipe, steps=2, output_type="np", generator=generator)
    assert len(decodes) == 1 and len(checks) == 1 and len(frees) == 1
    (latents,), kwargs = decodes[0]
    torch.testing.assert_close(latents, final / 0.18215)
    assert kwargs == {"return_dict": False, "generator": generator}
    decoded = decoder_out[0]
    assert decoded.shape == (1, 3, HEIGHT, WIDTH)
    torch.testing.assert_close(checks[0][0][0], decoded)
    assert isinstance(image, np.ndarray) and image.dtype == np.float32
    assert image.shape == (1, HEIGHT, WIDTH, 3)
    expected = (decoded / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(image, expected, rtol=1e-6, atol=1e-6)
    assert image.min() >= 0 and image.max() <= 1
    (pil,) = run(sd_pipe, steps=2, output_type="pil")
    assert pil.mode == "RGB" and pil.size == (WIDTH, HEIGHT)
    np.testing.assert_array_equal(np.asarray(pil), (image[0] * 255).round().astype(np.uint8))
    (default,) = sd_pipe(prompt_embeds=PROMPT, negative_prompt_embeds=NEGATIVE, height=HEIGHT,
                         width=WIDTH, num_inference_steps=2, latents=start_latents()).images  # fmt: skip
    np.testing.assert_array_equal(np.asarray(default), np.asarray(pil))  # no output_type: PIL


def test_text_encoder_and_vae_run_outside_the_loop(text_pipe, record_calls, calls_of):
    """In `StableDiffusionPipeline`, below 1000 steps, the text encoder runs only before the loop (from a `prompt`, once for it and once more for the negative prompt with CFG on), the UNet once per entry of `scheduler.timesteps`, and the VAE decodes once after it (except with `output_type="latent"`). With `prompt_embeds`, `negative_prompt_embeds` and `output_type="latent"` passed, neither runs.

    "With CFG on", not "when guiding": a guidance-embedded UNet (``time_cond_proj_dim`` set) at
    ``guidance_scale=7.5`` has ``do_classifier_free_guidance`` false, one text-encoder pass and
    ``B`` rows per UNet call. At 1000 steps SD's DDIM (``steps_offset=1``) puts t = 1000 first:
    one UNet call, then an ``IndexError``, and no decode; so the page's sentence carries
    "below 1000 steps".
    """
    for steps in [2, 5, 1000]:
        encoder = record_calls(text_pipe.text_encoder).calls
        unet = record_calls(text_pipe.unet).calls
        decodes = calls_of(text_pipe.vae, "decode")
        if steps == 1000:
            with pytest.raises(IndexError):
                run(text_pipe, prompt="a cat", steps=steps, output_type="np")
            assert len(text_pipe.scheduler.timesteps) == 1000
            assert (len(encoder), len(unet), len(decodes)) == (2, 1, 0)
            continue
        run(text_pipe, prompt="a cat", steps=steps, output_type="np")
        assert (len(encoder), len(unet), len(decodes)) == (2, steps, 1)
        assert len(unet) == len(text_pipe.scheduler.timesteps)
    sentences = once_per_entry_sentences("handbook/loop.md")
    assert len(sentences) == 2 and all("below 1000 steps" in s.lower() for s in sentences), (
        sentences
    )
    # the scope opens the sentence, so it covers the decode too (none at 1000 steps)
    assert all(
        s.lower().startswith("below 1000 steps") or "`: below 1000 steps" in s for s in sentences
    )
    why = [line for line in (ROOT / "docs" / "handbook" / "loop.md").read_text(encoding="utf-8").splitlines()
           if "`len(scheduler.timesteps)` denoiser calls" in line]  # fmt: skip
    assert len(why) == 1 and "below 1000 steps" in why[0].lower(), why
    encoder = record_calls(text_pipe.text_encoder).calls
    decodes = calls_of(text_pipe.vae, "decode")
    run(text_pipe, steps=2)  # prompt_embeds, negative_prompt_embeds, output_type="latent"
    assert (len(encoder), len(decodes)) == (0, 0)
    distilled = sd_with(text_pipe, unet=tiny_unet(time_cond_proj_dim=16))
    encoder = record_calls(distilled.text_encoder).calls
    unet = record_calls(distilled.unet).calls
    run(distilled, prompt="a cat", guidance_scale=7.5, steps=2)
    assert len(encoder) == 1 and [args[0].shape[0] for args, _ in unet] == [1, 1]


# ---------------------------------------------------------------- ControlNet


CONTROL_IMAGE = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def controlnet_pipe():
    """The real StableDiffusionControlNetPipeline: tiny UNet, a ControlNetModel made from it.

    ``from_unet`` zero-initialises the ControlNet's output convolutions (its residuals
    start at zero); they are re-drawn here so that the residuals are not trivially zero.
    """
    unet = tiny_unet()
    controlnet = tiny_controlnet(unet, trained=True)
    return tiny_controlnet_pipeline(unet, controlnet, scheduler=sd_scheduler(DDIMScheduler))


def test_controlnet_residuals_go_into_the_unet_every_step(
    controlnet_pipe, record_calls, outputs_of
):
    """In `StableDiffusionControlNetPipeline`, each step makes one ControlNet call, `self.controlnet(control_model_input, t, encoder_hidden_states=..., controlnet_cond=image, conditioning_scale=cond_scale, guess_mode=guess_mode, return_dict=False)`, on the same doubled `latents`, `t` and embeddings as the UNet, and its `down_block_res_samples` and `mid_block_res_sample` go unchanged into that step's UNet call as `down_block_additional_residuals` and `mid_block_additional_residual`."""
    pipe = controlnet_pipe
    cn_calls, cn_outs = record_calls(pipe.controlnet).calls, outputs_of(pipe.controlnet)
    unet_calls = record_calls(pipe.unet).calls
    run(pipe, steps=3, image=CONTROL_IMAGE)
    assert len(cn_calls) == len(cn_outs) == len(unet_calls) == 3
    previous = None
    for (args, kwargs), (down, mid), (unet_args, unet_kwargs) in zip(
        cn_calls, cn_outs, unet_calls, strict=True
    ):
        assert set(kwargs) == {
            "encoder_hidden_states",
            "controlnet_cond",
            "conditioning_scale",
            "guess_mode",
            "return_dict",
        }
        torch.testing.assert_close(args[0], unet_args[0])
        assert args[0].shape == (2, 4, 8, 8) and args[1] == unet_args[1]
        torch.testing.assert_close(
            kwargs["encoder_hidden_states"], unet_kwargs["encoder_hidden_states"]
        )
        assert kwargs["conditioning_scale"] == 1.0 and kwargs["guess_mode"] is False
        assert len(down) == len(unet_kwargs["down_block_additional_residuals"]) == 4
        for ours, theirs in zip(down, unet_kwargs["down_block_additional_residuals"], strict=True):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        torch.testing.assert_close(mid, unet_kwargs["mid_block_additional_residual"])
        if previous is not None:  # new latents and t: new residuals, nothing to cache
            assert not torch.allclose(mid, previous)
        previous = mid


def test_controlnet_control_image_is_resized_and_doubled(controlnet_pipe, record_calls):
    """`StableDiffusionControlNetPipeline.prepare_image` resizes the control image to `(B, 3, H, W)` and, with CFG, doubles it to `2B` with `torch.cat([image] * 2)`."""
    calls = record_calls(controlnet_pipe.controlnet).calls
    run(controlnet_pipe, steps=1, image=CONTROL_IMAGE)  # a 32 x 32 image for a 16 x 16 output
    cond = calls[0][1]["controlnet_cond"]
    assert cond.shape == (2, 3, HEIGHT, WIDTH)
    torch.testing.assert_close(cond[:1], cond[1:], rtol=0, atol=0)
    calls.clear()
    run(controlnet_pipe, guidance_scale=1.0, steps=1, image=CONTROL_IMAGE)
    assert calls[0][1]["controlnet_cond"].shape == (1, 3, HEIGHT, WIDTH)


def test_unet_adds_the_residuals_to_its_skips_and_mid_block(controlnet_pipe, record_calls):
    """`UNet2DConditionModel` adds `down_block_additional_residuals`, one tensor per skip connection, to its skip tensors, and `mid_block_additional_residual` to the mid-block output, before the up blocks read them."""
    unet = controlnet_pipe.unet
    x, t, hidden = start_latents(), torch.tensor(500), PROMPT

    def up_block_inputs(down=None, mid=None):
        calls = record_calls(unet.up_blocks[0]).calls, record_calls(unet.up_blocks[1]).calls
        with torch.no_grad():
            unet(
                x,
                t,
                encoder_hidden_states=hidden,
                down_block_additional_residuals=down,
                mid_block_additional_residual=mid,
            )
        (_, first), (_, second) = calls[0][0], calls[1][0]
        skips = list(second["res_hidden_states_tuple"]) + list(first["res_hidden_states_tuple"])
        return first["hidden_states"], skips

    with torch.no_grad():
        down, mid = controlnet_pipe.controlnet(
            x,
            t,
            encoder_hidden_states=hidden,
            controlnet_cond=torch.rand(1, 3, 16, 16),
            return_dict=False,
        )
    zeros = [torch.zeros_like(d) for d in down]
    plain_mid, plain_skips = up_block_inputs(zeros, torch.zeros_like(mid))
    with_mid, with_skips = up_block_inputs(down, mid)
    assert len(plain_skips) == len(down) == 4  # conv_in + 2 in block 0 + 1 in block 1
    torch.testing.assert_close(with_mid, plain_mid + mid)
    for plain, added, residual in zip(plain_skips, with_skips, down, strict=True):
        torch.testing.assert_close(added, plain + residual)


def test_one_controlnet_pass_per_unet_call(controlnet_pipe, record_calls):
    """One pass per ControlNet per UNet call, not per step: with SD 1.5's `PNDMScheduler` config, `StableDiffusionControlNetPipeline` makes 4 UNet calls at 3 steps and calls its ControlNet 4 times, and each of two ControlNets 4 times."""
    pipe = tiny_controlnet_pipeline(
        controlnet_pipe.unet, controlnet_pipe.controlnet, scheduler=PNDMScheduler(**SD15_PNDM)
    )
    cn_calls = record_calls(pipe.controlnet).calls
    unet_calls = record_calls(pipe.unet).calls
    run(pipe, steps=3, image=CONTROL_IMAGE)
    assert len(cn_calls) == len(unet_calls) == 4
    nets = [controlnet_pipe.controlnet, tiny_controlnet(controlnet_pipe.unet, seed=1)]
    two = tiny_controlnet_pipeline(  # a list becomes a MultiControlNetModel
        controlnet_pipe.unet, nets, scheduler=PNDMScheduler(**SD15_PNDM)
    )
    net_calls = [record_calls(net).calls for net in nets]
    unet_calls.clear()
    run(two, steps=3, image=[CONTROL_IMAGE, CONTROL_IMAGE])
    assert len(unet_calls) == 4 and [len(c) for c in net_calls] == [4, 4]


def test_control_guidance_window_scales_but_still_calls(controlnet_pipe, record_calls):
    """In `StableDiffusionControlNetPipeline`, `control_guidance_start` and `control_guidance_end` set `controlnet_keep[i]` to 1 or 0 per step, which multiplies `cond_scale`; on steps where it is 0 the ControlNet is still called, with `conditioning_scale=0.0`, and its residuals are zeros."""
    cn_calls = record_calls(controlnet_pipe.controlnet).calls
    unet_calls = record_calls(controlnet_pipe.unet).calls
    run(
        controlnet_pipe,
        steps=4,
        image=CONTROL_IMAGE,
        controlnet_conditioning_scale=0.8,
        control_guidance_end=0.5,
    )
    assert len(cn_calls) == 4  # a ControlNet pass on every step
    assert [kwargs["conditioning_scale"] for _, kwargs in cn_calls] == [0.8, 0.8, 0.0, 0.0]
    for i, (_, kwargs) in enumerate(unet_calls):
        residuals = [
            *kwargs["down_block_additional_residuals"],
            kwargs["mid_block_additional_residual"],
        ]
        assert all((r.abs().max() == 0) == (i >= 2) for r in residuals)


def test_guess_mode_runs_the_controlnet_on_the_conditional_half(controlnet_pipe, record_calls):
    """In `StableDiffusionControlNetPipeline`, in `guess_mode` with CFG, the ControlNet runs on the conditional half only (the `latents` at batch `B`, the positive `prompt_embeds` and an undoubled control image), and zeros are concatenated in front of each residual for the unconditional half."""
    cn_calls = record_calls(controlnet_pipe.controlnet).calls
    unet_calls = record_calls(controlnet_pipe.unet).calls
    run(controlnet_pipe, steps=2, image=CONTROL_IMAGE, guess_mode=True)
    for (args, kwargs), (unet_args, unet_kwargs) in zip(cn_calls, unet_calls, strict=True):
        assert args[0].shape == (1, 4, 8, 8) and unet_args[0].shape == (2, 4, 8, 8)
        torch.testing.assert_close(args[0], unet_args[0][1:])
        torch.testing.assert_close(kwargs["encoder_hidden_states"], PROMPT)
        assert kwargs["controlnet_cond"].shape == (1, 3, HEIGHT, WIDTH)
        assert kwargs["guess_mode"] is True
        residuals = [
            *unet_kwargs["down_block_additional_residuals"],
            unet_kwargs["mid_block_additional_residual"],
        ]
        for r in residuals:
            assert r.shape[0] == 2 and r[0].abs().max() == 0 and r[1].abs().max() > 0


# ---------------------------------------------------------------- IP-Adapter


@pytest.fixture(scope="module")
def ip_pipe(sd_pipe):
    """The tiny pipeline with an IP-Adapter installed by the UNet's loader (no image encoder)."""
    unet = tiny_unet()
    unet._load_ip_adapter_weights(random_ip_adapter(unet), low_cpu_mem_usage=False)
    return sd_with(sd_pipe, unet=unet)


IMAGE_EMBEDS = torch.randn(2, 1, 16, generator=torch.Generator().manual_seed(4))  # [neg, pos]


def test_ip_adapter_embeds_enter_as_added_cond_kwargs(ip_pipe, record_calls, calls_of):
    """In `StableDiffusionPipeline`, with an IP-Adapter loaded, `prepare_ip_adapter_image_embeds` runs once per call, before the loop, and every UNet call gets the result as `added_cond_kwargs={"image_embeds": image_embeds}`; with CFG, passed `ip_adapter_image_embeds` are read as `[negative, positive]` halves and kept in that order at batch `2B`."""
    assert ip_pipe.unet.config.encoder_hid_dim_type == "ip_image_proj"
    prepares = calls_of(ip_pipe, "prepare_ip_adapter_image_embeds")
    calls = record_calls(ip_pipe.unet).calls
    run(
        ip_pipe,
        steps=3,
        ip_adapter_image_embeds=[IMAGE_EMBEDS],
        num_images_per_prompt=2,
        latents=start_latents(2),
    )
    assert len(prepares) == 1 and len(calls) == 3
    for _, kwargs in calls:
        (image_embeds,) = kwargs["added_cond_kwargs"]["image_embeds"]
        assert image_embeds.shape == (4, 1, 16)
        torch.testing.assert_close(image_embeds, IMAGE_EMBEDS[[0, 0, 1, 1]])


def test_ip_adapter_image_tokens_reach_attention_as_a_tuple(ip_pipe, sd_pipe, record_calls):
    """With `encoder_hid_dim_type == "ip_image_proj"`, the UNet projects `image_embeds` with `encoder_hid_proj` and passes `encoder_hidden_states` to the cross-attention as a tuple, the text tokens and a list with the image tokens of each adapter (4 for a plain IP-Adapter), which the IP-Adapter attention processors attend to separately and add with weight `scale`."""
    unet = ip_pipe.unet
    attn2 = unet.down_blocks[0].attentions[0].transformer_blocks[0].attn2
    assert isinstance(attn2.processor, IPAdapterAttnProcessor2_0)
    calls = record_calls(attn2).calls
    x, t = start_latents(), torch.tensor(500)
    image_embeds = [IMAGE_EMBEDS[1:]]

    def predict(model):
        with torch.no_grad():
            return model(
                x, t, encoder_hidden_states=PROMPT, added_cond_kwargs={"image_embeds": image_embeds}
            ).sample

    with_image = predict(unet)
    text, (image_tokens,) = calls[0][1]["encoder_hidden_states"]
    torch.testing.assert_close(text, PROMPT)
    assert image_tokens.shape == (1, 1, 4, EMBED_DIM)
    with torch.no_grad():
        torch.testing.assert_close(image_tokens, unet.encoder_hid_proj(image_embeds)[0])
    processors = [
        p for p in unet.attn_processors.values() if isinstance(p, IPAdapterAttnProcessor2_0)
    ]
    assert len(processors) == 4  # one per cross-attention layer
    try:
        for p in processors:
            p.scale = [0.0]
        without_image = predict(unet)
    finally:
        for p in processors:
            p.scale = [1.0]
    plain = sd_pipe.unet  # the same seeded weights, no IP-Adapter
    assert isinstance(
        plain.down_blocks[0].attentions[0].transformer_blocks[0].attn2.processor, AttnProcessor2_0
    )
    with torch.no_grad():
        torch.testing.assert_close(without_image, plain(x, t, encoder_hidden_states=PROMPT).sample)
    assert not torch.allclose(with_image, without_image)


# ---------------------------------------------------------------- LoRA


class RecordingProcessor(AttnProcessor2_0):
    """The default attention processor, recording the extra keyword arguments it gets."""

    seen: typing.ClassVar[list] = []

    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        attention_mask=None,
        temb=None,
        scale="not passed",
        foo=None,
    ):
        RecordingProcessor.seen.append({"scale": scale, "foo": foo})
        return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, temb)


def test_unet_forward_pops_and_applies_the_lora_scale():
    """`UNet2DConditionModel.forward` is wrapped by `apply_lora_scale("cross_attention_kwargs")`, which pops `scale` (default 1.0) from a copy of `cross_attention_kwargs`, so the attention processors never see it, and with the PEFT backend scales the LoRA layers by it for the forward pass and unscales them afterwards."""
    unet = tiny_unet()
    unet.set_attn_processor(RecordingProcessor())
    RecordingProcessor.seen = []
    kwargs = {"scale": 0.5, "foo": 1}
    with torch.no_grad():
        unet(start_latents(), 10, encoder_hidden_states=PROMPT, cross_attention_kwargs=kwargs)
    assert kwargs == {"scale": 0.5, "foo": 1}  # the caller's dict is untouched
    assert RecordingProcessor.seen and all(
        s == {"scale": "not passed", "foo": 1} for s in RecordingProcessor.seen
    )
    # a real PEFT LoRA on every attention projection, random (non-zero) B matrices
    from diffusers.utils import USE_PEFT_BACKEND
    from peft import LoraConfig

    assert USE_PEFT_BACKEND
    lora_unet = tiny_unet()

    def predict(**kwargs):
        with torch.no_grad():
            return lora_unet(start_latents(), 10, encoder_hidden_states=PROMPT, **kwargs).sample

    base = predict()
    torch.manual_seed(0)
    lora_unet.add_adapter(
        LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                   init_lora_weights=False)
    )  # fmt: skip
    layer = lora_unet.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_q
    full = predict()  # no cross_attention_kwargs: scale 1.0
    torch.testing.assert_close(predict(cross_attention_kwargs={"scale": 1.0}), full)
    torch.testing.assert_close(predict(cross_attention_kwargs={"scale": 0.0}), base)
    half = predict(cross_attention_kwargs={"scale": 0.5})
    assert not torch.allclose(half, full) and not torch.allclose(half, base)
    assert layer.scaling["default"] == 1.0  # unscaled again after the forward pass
    torch.testing.assert_close(predict(), full)


def test_pipeline_passes_the_lora_scale_to_encode_prompt_and_the_unet(
    text_pipe, record_calls, monkeypatch
):
    """`StableDiffusionPipeline` passes `cross_attention_kwargs["scale"]` to `encode_prompt` as `lora_scale`, for the text encoder's LoRA layers, and the whole `cross_attention_kwargs`, `scale` included, to every UNet call.

    The spy records ``encode_prompt``'s arguments and calls it without ``lora_scale``: without
    the PEFT backend, ``adjust_lora_scale_text_encoder`` expects a ``text_model`` attribute
    that transformers 5's ``CLIPTextModel`` does not have, and raises.
    """
    encodes = []
    original = text_pipe.encode_prompt

    def encode_prompt(*args, **kwargs):
        encodes.append((args, kwargs))
        return original(*args, **{**kwargs, "lora_scale": None})

    monkeypatch.setattr(text_pipe, "encode_prompt", encode_prompt)
    calls = record_calls(text_pipe.unet).calls
    run(text_pipe, steps=2, cross_attention_kwargs={"scale": 0.3})
    assert len(encodes) == 1 and encodes[0][1]["lora_scale"] == 0.3
    assert [kwargs["cross_attention_kwargs"] for _, kwargs in calls] == [{"scale": 0.3}] * 2
    encodes.clear()
    run(text_pipe, steps=1)
    assert encodes[0][1]["lora_scale"] is None


def test_lora_changes_the_weights_not_the_loop(sd_pipe, record_calls, step_calls):
    """LoRA changes weights. The loop's code is identical with or without it: with a PEFT LoRA on the UNet's attention projections, `StableDiffusionPipeline.__call__` makes the same UNet calls, on inputs of the same shapes and with the same keyword arguments, and the same `scheduler.step` calls; the LoRA layers run inside each UNet call and change its output."""
    from peft import LoraConfig

    def loop_of(pipe):
        unet, steps = record_calls(pipe.unet).calls, step_calls(pipe.scheduler)
        out = run(pipe, steps=3)
        shapes = [(args[0].shape, sorted(kwargs)) for args, kwargs in unet]
        return out, shapes, [int(s["t"]) for s in steps]

    plain_out, plain_calls, plain_steps = loop_of(sd_pipe)
    torch.manual_seed(0)
    unet = tiny_unet()
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights=False,
                                target_modules=["to_q", "to_k", "to_v", "to_out.0"]))  # fmt: skip
    pipe = sd_with(sd_pipe, unet=unet, scheduler=sd_scheduler(DDIMScheduler))
    lora_a = record_calls(unet.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_q
                          .lora_A["default"]).calls  # fmt: skip
    lora_out, lora_calls, lora_steps = loop_of(pipe)
    assert lora_calls == plain_calls and len(plain_calls) == 3
    assert lora_steps == plain_steps
    assert len(lora_a) == 3  # the low-rank layer runs once inside every UNet call
    assert not torch.allclose(lora_out, plain_out, atol=1e-3)


# ---------------------------------------------------------------- loop count and the grid


def test_sd15_pndm_has_order_1_and_51_timesteps_at_50_steps():
    """SD 1.5's shipped scheduler, `PNDMScheduler` with `skip_prk_steps=True`, `steps_offset=1` and `set_alpha_to_one=False`, has `order == 1`, yet `set_timesteps(50)` gives 51 timesteps, 981, 961, 961, 941, ..., 21, 1, with 961 twice."""
    scheduler = PNDMScheduler(**SD15_PNDM)
    assert scheduler.order == 1
    scheduler.set_timesteps(50)
    timesteps = scheduler.timesteps.tolist()
    assert len(timesteps) == 51
    assert timesteps[:4] == [981, 961, 961, 941] and timesteps[-2:] == [21, 1]
    assert [t for t in set(timesteps) if timesteps.count(t) > 1] == [961]


def test_unet_calls_equal_len_timesteps(sd_pipe, sd3_pipe, record_calls, bars):
    """Below 1000 steps `StableDiffusionPipeline` calls the UNet once per entry of `scheduler.timesteps`: for `num_inference_steps=n`, with SD 1.5's settings and `n < 1000`, `n` times with DDPM, DDIM and Euler (at `n = 1000` DDPM and DDIM start at `t = 1000`, index `alphas_cumprod[1000]` and raise `IndexError` after one call), `n + 1` times from `n = 2` with SD 1.5's `PNDMScheduler` (`order == 1`; once at `n = 1`), and `2n - 1` times with every scheduler with `order == 2` it runs (a flow-matching one in `StableDiffusion3Pipeline`), `HeunDiscreteScheduler` among them; the progress bar shows `n` in every case. DPM-Solver++ 2M (`solver_order=2`) keeps `order == 1`: `n` calls with SD 1.5's settings.

    The set is every class in ``StableDiffusionPipeline``'s ``scheduler.compatibles`` (LMS and
    DPMSolverSDE included: the verify extra installs scipy and torchsde), each with SD 1.5's
    settings; ``n`` calls for every order-1 class except PNDM, ``2n - 1`` for every order-2
    one (here Heun, the two KDPM2 schedulers and ``DPMSolverSDEScheduler``), so a new class that breaks the
    rule fails here. Then every other order-2 class the installed diffusers exports runs in
    its own pipeline, SD3's for a flow-matching scheduler (no ``init_noise_sigma``), SD's
    otherwise: ``FlowMatchHeunDiscreteScheduler`` makes ``2n - 1`` calls, and the deprecated
    ``KarrasVeScheduler`` (order 2, ``n`` timesteps) does not run at all: its ``step`` takes
    another signature (``sample_hat``), so the pipeline raises ``TypeError``. Every compatible
    class whose config has ``solver_order=2`` (``DPMSolverMultistepScheduler``, DPM-Solver++ 2M,
    among them) has ``order == 1`` and makes ``n`` calls: a second-order solver is not an
    order-2 scheduler. With SD 1.5's settings (``leading`` for DDPM and DDIM, the ``linspace``
    that Euler and DPM-Solver++ 2M get from ``from_config``) each gives ``n`` timesteps at every
    ``n`` from 1 to 1000. Without that qualifier the count fails: with ``trailing`` spacing,
    ``np.arange(1000, 0, -1000 / n)`` can return ``n + 1`` entries, the last ``t = -1``, so DDIM
    at ``n = 61`` makes 62 UNet calls.
    """
    calls = record_calls(sd_pipe.unet).calls
    n, seen, order_2, solver_order_2 = 3, set(), set(), {}
    for cls in sorted(sd_pipe.scheduler.compatibles, key=lambda c: c.__name__):
        scheduler = PNDMScheduler(**SD15_PNDM) if cls is PNDMScheduler else sd_scheduler(cls)
        pipe = sd_with(sd_pipe, scheduler=scheduler)
        bar = bars(pipe)
        calls.clear()
        run(pipe, guidance_scale=1.0, steps=n)
        expected = n + 1 if cls is PNDMScheduler else 2 * n - 1 if scheduler.order == 2 else n
        assert len(calls) == len(pipe.scheduler.timesteps) == expected, cls.__name__
        assert bar[0].total == n and bar[0].updates == n, cls.__name__
        torch.testing.assert_close(
            torch.stack([torch.as_tensor(args[1]) for args, _ in calls]).to(
                pipe.scheduler.timesteps.dtype
            ),
            pipe.scheduler.timesteps,
        )
        seen.add(cls.__name__)
        if scheduler.order == 2:
            order_2.add(cls.__name__)
        if scheduler.config.get("solver_order") == 2:
            solver_order_2[cls.__name__] = (scheduler.order, len(calls))
    assert {"DDIMScheduler", "EulerDiscreteScheduler", "PNDMScheduler"} <= seen
    pndm = sd_with(sd_pipe, scheduler=PNDMScheduler(**SD15_PNDM))
    calls.clear()
    run(pndm, guidance_scale=1.0, steps=1)
    assert len(calls) == len(pndm.scheduler.timesteps) == 1  # n + 1 holds from n = 2
    dpm = DPMSolverMultistepScheduler.from_config(SD_SCHEDULER)
    assert dpm.config.solver_order == 2 and dpm.config.algorithm_type == "dpmsolver++"
    assert "DPMSolverMultistepScheduler" in solver_order_2
    assert all(got == (1, n) for got in solver_order_2.values()), solver_order_2
    assert order_2 == {
        "HeunDiscreteScheduler",
        "KDPM2DiscreteScheduler",
        "KDPM2AncestralDiscreteScheduler",
        "DPMSolverSDEScheduler",
    }
    import diffusers

    others = set()
    for name in [name for name in dir(diffusers) if name.endswith("Scheduler")]:
        cls = getattr(diffusers, name)
        if getattr(cls, "order", None) == 2:
            others.add(cls)
    others = {cls for cls in others if cls.__name__ not in order_2}
    ran, not_run = set(), set()
    assert others, "no order-2 scheduler outside StableDiffusionPipeline's compatibles"
    for cls in others:
        scheduler = cls.from_config(SD_SCHEDULER)
        if hasattr(scheduler, "init_noise_sigma"):
            pipe, model = sd_with(sd_pipe, scheduler=scheduler), sd_pipe.unet
            go = functools.partial(run, pipe, guidance_scale=1.0)
        else:  # flow matching: SD3's pipeline
            pipe = StableDiffusion3Pipeline(**{**sd3_pipe.components, "scheduler": scheduler})
            pipe.set_progress_bar_config(disable=True)
            model, go = sd3_pipe.transformer, functools.partial(run_sd3, pipe, guidance_scale=1.0)
        seen_calls = record_calls(model).calls
        try:
            go(steps=n)
        except TypeError as error:  # not a scheduler this loop can run
            assert "step()" in str(error), (cls.__name__, error)
            not_run.add(cls.__name__)
            continue
        assert len(seen_calls) == len(pipe.scheduler.timesteps) == 2 * n - 1, cls.__name__
        ran.add(cls.__name__)
    assert "FlowMatchHeunDiscreteScheduler" in ran, (ran, not_run)
    for cls in [DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler, DPMSolverMultistepScheduler]:
        scheduler = sd_scheduler(cls)
        for steps in range(1, 1001):
            scheduler.set_timesteps(steps)
            assert len(scheduler.timesteps) == steps, (cls.__name__, steps)
    for cls in [DDPMScheduler, DDIMScheduler]:  # n = 1000: the grid starts at t = 1000
        pipe = sd_with(sd_pipe, scheduler=sd_scheduler(cls))
        calls.clear()
        with pytest.raises(IndexError):
            run(pipe, guidance_scale=1.0, steps=1000)
        assert len(calls) == 1 and int(pipe.scheduler.timesteps[0]) == 1000, cls.__name__
    trailing = sd_with(sd_pipe, scheduler=sd_scheduler(DDIMScheduler, timestep_spacing="trailing"))
    calls.clear()
    run(trailing, guidance_scale=1.0, steps=61)
    assert len(calls) == len(trailing.scheduler.timesteps) == 62
    assert int(trailing.scheduler.timesteps[-1]) == -1


@pytest.fixture(scope="module")
def sd15_flops():
    """FLOPs of SD 1.5's parts at 512 x 512 on the meta device (``sizes.sd15_flops``)."""
    from sizes import sd15_flops

    return sd15_flops()


def test_sd15_decode_costs_about_three_unet_passes(sd15_flops):
    """At 512 × 512 SD 1.5's decode takes the FLOPs of about three UNet passes: 44% of the UNet and VAE FLOPs of a 4-step unguided call, 7% at 20 guided steps.

    A guided step runs the UNet on 2 rows, twice the FLOPs of one (every operation is per
    row). The shares are of the UNet and VAE alone: with the text encoder (once per prompt)
    and the shipped safety checker (once per image) the 4-step share is 43%, not 44%.
    """
    unet, decode = sd15_flops["unet"], sd15_flops["decode"]
    assert 2.9 < decode / unet < 3.3
    assert round(100 * decode / (4 * unet + decode)) == 44
    assert round(100 * decode / (20 * 2 * unet + decode)) == 7
    whole_call = 4 * unet + decode + sd15_flops["text"] + sd15_flops["safety"]
    assert round(100 * decode / whole_call) == 43  # so the page says "UNet and VAE FLOPs"


def test_sd15_decode_is_one_and_a_half_guided_passes(sd15_flops):
    """So the cost is the number of timesteps times one UNet pass at `2B`, plus a decode of about one and a half such passes' FLOPs at 512 px.

    SD 1.5 at 512 x 512, ``B = 1``: the decode against one guided UNet call (2 rows); three
    passes at ``B`` rows are one and a half at ``2B``.
    """
    assert 1.4 < sd15_flops["decode"] / (2 * sd15_flops["unet"]) < 1.7


def test_timestep_spacing_moves_the_start_and_can_add_a_call():
    """With SD 1.x's scheduler config (`steps_offset=1`) and 50 steps, `timestep_spacing="leading"` starts the grid at `t = 981` and `"trailing"` at 999, both with 50 entries; at some counts `trailing` adds one: DDIM has 61 entries at 61 steps with `leading`, 62 with `trailing` (62 UNet calls through the pipeline, `test_unet_calls_equal_len_timesteps`)."""
    starts, at_61 = {}, {}
    for spacing in ["leading", "trailing"]:
        scheduler = sd_scheduler(DDIMScheduler, timestep_spacing=spacing)
        scheduler.set_timesteps(50)
        assert len(scheduler.timesteps) == 50
        starts[spacing] = int(scheduler.timesteps[0])
        scheduler.set_timesteps(61)
        at_61[spacing] = len(scheduler.timesteps)
    assert starts == {"leading": 981, "trailing": 999}
    assert at_61 == {"leading": 61, "trailing": 62}


def test_grid_options_move_the_steps_not_their_number(sd_pipe):
    """`use_karras_sigmas=True` and a flow-matching `shift` change where the steps fall along the noise axis, not how many there are; custom `sigmas=` move them too, but their length sets the count (`test_custom_timesteps_and_sigmas`).

    Karras sigmas keep the count for every class in ``StableDiffusionPipeline``'s compatibles
    whose grid the option moves, with SD 1.5's settings (at 1, 10 and 50 steps).
    """
    karras = set()
    for cls in sd_pipe.scheduler.compatibles:
        if cls is PNDMScheduler:  # no Karras option; SD 1.5 ships it with skip_prk_steps=True
            continue
        plain, with_karras = sd_scheduler(cls), sd_scheduler(cls, use_karras_sigmas=True)
        for n in [1, 10, 50]:
            plain.set_timesteps(n), with_karras.set_timesteps(n)
            assert len(with_karras.timesteps) == len(plain.timesteps), (cls.__name__, n)
        if not torch.equal(with_karras.timesteps, plain.timesteps):
            karras.add(cls.__name__)  # the option moved the grid
    assert {
        "EulerDiscreteScheduler",
        "DPMSolverMultistepScheduler",
        "HeunDiscreteScheduler",
    } <= karras
    grids = {}
    for name, scheduler, kwargs in [
        ("euler", sd_scheduler(EulerDiscreteScheduler), dict(num_inference_steps=10)),
        (
            "karras",
            sd_scheduler(EulerDiscreteScheduler, use_karras_sigmas=True),
            dict(num_inference_steps=10),
        ),
        (
            "custom",
            sd_scheduler(EulerDiscreteScheduler),
            dict(sigmas=[*np.geomspace(14.6, 0.03, 10), 0.0]),
        ),
        ("flow", FlowMatchEulerDiscreteScheduler(), dict(num_inference_steps=10)),
        ("flow_shift3", FlowMatchEulerDiscreteScheduler(shift=3.0), dict(num_inference_steps=10)),
    ]:
        scheduler.set_timesteps(**kwargs)
        grids[name] = scheduler.sigmas[:-1].double()
    assert all(len(g) == 10 for g in grids.values())
    for a, b in [("euler", "karras"), ("euler", "custom"), ("flow", "flow_shift3")]:
        assert not torch.allclose(grids[a], grids[b], rtol=1e-3, atol=1e-3)


def test_swapping_the_scheduler_and_fresh_noise(sd_pipe, step_calls):
    """In `StableDiffusionPipeline`, from the same starting `latents`, swapping `DDIMScheduler` for `EulerDiscreteScheduler` changes the result, and `DDPMScheduler` draws fresh noise from `generator` in its steps, so its result changes with the generator's seed while DDIM's (with `eta=0`) does not. `DPMSolverSDEScheduler` takes no `generator`: its noise is seeded by its config's `noise_sampler_seed`, random when unset, so a seeded `generator` does not make its output repeat.

    With ``noise_sampler_seed=0`` its result is the same for generator seeds 0 and 1; unset, two
    calls with the same generator seed differ. So "stochastic schedulers draw from ``generator``"
    is not true of every stochastic scheduler the pipeline runs.
    """

    def final(scheduler, seed):
        pipe = sd_with(sd_pipe, scheduler=scheduler)
        return run(pipe, steps=4, generator=torch.Generator().manual_seed(seed))

    def sde(**config):
        return sd_scheduler(DPMSolverSDEScheduler, **config)

    seeded = sde(noise_sampler_seed=0)
    calls = step_calls(seeded)
    torch.testing.assert_close(
        final(seeded, 0), final(sde(noise_sampler_seed=0), 1), rtol=0, atol=0
    )
    assert calls and not any("generator" in call["kwargs"] for call in calls)
    assert not torch.equal(final(sde(), 0), final(sde(), 0))

    ddim = final(sd_scheduler(DDIMScheduler), 0)
    torch.testing.assert_close(final(sd_scheduler(DDIMScheduler), 1), ddim, rtol=0, atol=0)
    assert not torch.allclose(final(sd_scheduler(EulerDiscreteScheduler), 0), ddim, atol=1e-2)
    assert not torch.allclose(
        final(sd_scheduler(DDPMScheduler), 0), final(sd_scheduler(DDPMScheduler), 1), atol=1e-2
    )


def test_a_mismatched_scheduler_runs_silently_or_fails_on_init_noise_sigma(sd_pipe, sd3_pipe):
    """`DDIMScheduler` with `epsilon` and `v_prediction` swapped, or DDIM in `StableDiffusion3Pipeline`, silently produce wrong latents; SD3's `FlowMatchEulerDiscreteScheduler` in `StableDiffusionPipeline` fails on `init_noise_sigma`.

    "Silently": the pipeline returns finite latents, different from the matched scheduler's.
    The failure is the class's, not flow matching's: ``UniPCMultistepScheduler`` configured for
    flow matching (``use_flow_sigmas=True``, ``prediction_type="flow_prediction"``)
    has ``init_noise_sigma`` and runs in ``StableDiffusionPipeline`` without an error.
    """
    matched = run(sd_pipe, steps=4)
    wrong = sd_with(
        sd_pipe,
        scheduler=sd_scheduler(DDIMScheduler, prediction_type="v_prediction"),
    )
    out = run(wrong, steps=4)
    assert torch.isfinite(out).all() and not torch.allclose(out, matched, atol=1e-2)
    sd3_matched = run_sd3(sd3_pipe, steps=3, latents=start_latents())
    ddim_in_sd3 = StableDiffusion3Pipeline(
        **{**sd3_pipe.components, "scheduler": sd_scheduler(DDIMScheduler)}
    )
    ddim_in_sd3.set_progress_bar_config(disable=True)
    sd3_out = run_sd3(ddim_in_sd3, steps=3, latents=start_latents())
    assert torch.isfinite(sd3_out).all() and not torch.allclose(sd3_out, sd3_matched, atol=1e-2)
    flow_in_sd = sd_with(sd_pipe, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))
    with pytest.raises(AttributeError, match="init_noise_sigma"):
        run(flow_in_sd, steps=2)
    unipc_flow = UniPCMultistepScheduler(
        use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0, steps_offset=1
    )
    assert torch.isfinite(run(sd_with(sd_pipe, scheduler=unipc_flow), steps=2)).all()


# ---------------------------------------------------------------- SD3


@pytest.fixture(scope="module")
def sd3_pipe():
    """The real StableDiffusion3Pipeline: tiny transformer, a VAE with a `shift_factor`,
    two tiny CLIP text encoders with projections, no T5 (``text_encoder_3=None``)."""
    return tiny_sd3_pipeline(
        FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=tiny_vae(scaling_factor=1.5, shift_factor=0.25),
        text_encoder=tiny_clip_with_projection(1),
        tokenizer=tiny_tokenizer(),
        text_encoder_2=tiny_clip_with_projection(2),
        tokenizer_2=tiny_tokenizer(),
    )


SD3_EMBEDS = torch.randn(2, 10, EMBED_DIM, generator=torch.Generator().manual_seed(8))
SD3_POOLED = torch.randn(2, 16, generator=torch.Generator().manual_seed(9))


def run_sd3(pipe, guidance_scale=4.0, steps=3, **kwargs):
    """Prompt embeddings passed directly: `[0]` negative, `[1]` positive."""
    return pipe(
        prompt_embeds=SD3_EMBEDS[1:],
        negative_prompt_embeds=SD3_EMBEDS[:1],
        pooled_prompt_embeds=SD3_POOLED[1:],
        negative_pooled_prompt_embeds=SD3_POOLED[:1],
        guidance_scale=guidance_scale,
        num_inference_steps=steps,
        **{"height": HEIGHT, "width": WIDTH, "output_type": "latent", **kwargs},
    ).images


def test_call_defaults_sd_and_sd3(sd_pipe, sd3_pipe, record_calls, calls_of):
    """Called without them, `StableDiffusion3Pipeline` runs 28 steps at `guidance_scale=7.0` and takes no `guidance_rescale`; `StableDiffusionPipeline` runs 50 steps at `guidance_scale=7.5` with no rescale (`guidance_rescale=0.0`).

    Observed through each pipeline's own ``__call__``: the denoiser calls, their batch (``2B``
    rows: guidance on), the guidance scale the call stored, and ``rescale_noise_cfg`` never
    called; ``guidance_rescale=`` to SD3 is a ``TypeError``.
    """
    sd3_calls = record_calls(sd3_pipe.transformer).calls
    sd3_pipe(prompt_embeds=SD3_EMBEDS[1:], negative_prompt_embeds=SD3_EMBEDS[:1],
             pooled_prompt_embeds=SD3_POOLED[1:], negative_pooled_prompt_embeds=SD3_POOLED[:1],
             height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
    assert len(sd3_calls) == 28 and sd3_pipe.guidance_scale == 7.0
    assert all(kwargs["hidden_states"].shape[0] == 2 for _, kwargs in sd3_calls)
    with pytest.raises(TypeError, match="guidance_rescale"):
        run_sd3(sd3_pipe, steps=1, guidance_rescale=0.7)
    unet_calls = record_calls(sd_pipe.unet).calls
    rescales = calls_of(sd_module, "rescale_noise_cfg")
    sd_pipe(prompt_embeds=PROMPT, negative_prompt_embeds=NEGATIVE, height=HEIGHT, width=WIDTH,
            latents=start_latents(), output_type="latent")  # fmt: skip
    assert len(unet_calls) == 50 and sd_pipe.guidance_scale == 7.5
    assert all(args[0].shape[0] == 2 for args, _ in unet_calls)
    assert sd_pipe.guidance_rescale == 0.0 and rescales == []


def test_sd3_latents_are_not_scaled(sd3_pipe, record_calls, monkeypatch):
    """`StableDiffusion3Pipeline` draws `randn_tensor((B, transformer.config.in_channels, h, w))`, or takes the `latents` passed in, and never multiplies by an initial sigma, and `FlowMatchEulerDiscreteScheduler` has neither `init_noise_sigma` nor `scale_model_input`: the transformer sees the noise as drawn."""
    assert not hasattr(sd3_pipe.scheduler, "scale_model_input")
    assert not hasattr(sd3_pipe.scheduler, "init_noise_sigma")
    # even one set on the instance is never read: the pipeline does not scale
    monkeypatch.setattr(sd3_pipe.scheduler, "init_noise_sigma", 5.0, raising=False)
    calls = record_calls(sd3_pipe.transformer).calls
    run_sd3(sd3_pipe, guidance_scale=1.0, steps=1, generator=torch.Generator().manual_seed(5))
    noise = torch.randn(LATENT, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(calls[0][1]["hidden_states"], noise, rtol=0, atol=0)
    calls.clear()
    run_sd3(sd3_pipe, guidance_scale=1.0, steps=1, latents=start_latents())
    torch.testing.assert_close(calls[0][1]["hidden_states"], start_latents(), rtol=0, atol=0)


def test_sd3_timestep_is_1000_sigma_expanded_to_the_batch(
    sd3_pipe, record_calls, outputs_of, step_calls
):
    """`StableDiffusion3Pipeline` passes `timestep = t.expand(latent_model_input.shape[0])`, float `1000 * sigma` for each of the `2B` rows with CFG, and guides the transformer output with the same `chunk(2)` line before `scheduler.step`."""
    calls = record_calls(sd3_pipe.transformer).calls
    outs = outputs_of(sd3_pipe.transformer)
    steps = step_calls(sd3_pipe.scheduler)
    run_sd3(sd3_pipe, guidance_scale=4.0, steps=3)
    sigmas = sd3_pipe.scheduler.sigmas[:-1]
    for (_, kwargs), sigma, out, step in zip(calls, sigmas, outs, steps, strict=True):
        timestep = kwargs["timestep"]
        assert timestep.shape == (2,) and timestep.dtype == torch.float32
        torch.testing.assert_close(timestep, (1000 * sigma).expand(2))
        assert kwargs["hidden_states"].shape == (2, 4, 8, 8)
        torch.testing.assert_close(kwargs["pooled_projections"], SD3_POOLED)
        torch.testing.assert_close(step["model_output"], guided(out[0], 4.0))


def test_sd3_transformer_patchifies_the_latents(sd3_pipe, outputs_of):
    """In `StableDiffusion3Pipeline`, `SD3Transformer2DModel` turns `(B, C, h, w)` latents into `(h / patch_size) * (w / patch_size)` tokens."""
    tokens = outputs_of(sd3_pipe.transformer.pos_embed)
    run_sd3(sd3_pipe, steps=1)
    patch = sd3_pipe.transformer.config.patch_size
    inner = sd3_pipe.transformer.inner_dim
    assert tokens[0].shape == (2, (8 // patch) * (8 // patch), inner)


def test_sd3_passes_mu_from_the_token_count_with_dynamic_shifting(sd3_pipe, calls_of, monkeypatch):
    """With `use_dynamic_shifting=True`, `StableDiffusion3Pipeline` passes `set_timesteps` a `mu` computed by `calculate_shift` from the latent token count, `(h / patch_size) * (w / patch_size)`."""
    monkeypatch.setattr(
        sd3_pipe, "scheduler", FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    )
    sets = calls_of(sd3_pipe.scheduler, "set_timesteps")
    for size, tokens in [(16, 16), (32, 64)]:
        sets.clear()
        run_sd3(sd3_pipe, guidance_scale=1.0, steps=2, height=size, width=size)
        config = sd3_pipe.scheduler.config
        expected = calculate_shift(
            tokens,
            config.base_image_seq_len,
            config.max_image_seq_len,
            config.base_shift,
            config.max_shift,
        )
        assert sets[0][1]["mu"] == pytest.approx(expected)


def test_sd3_prompt_embeds_layout(sd3_pipe, record_calls):
    """`StableDiffusion3Pipeline.encode_prompt` joins the penultimate-layer features of the two CLIP encoders on the channel axis, zero-pads them to the T5 width `transformer.config.joint_attention_dim` and joins them with `max_sequence_length` T5 tokens on the sequence axis, `(B, 77 + max_sequence_length, D)`; `pooled_prompt_embeds`, the two CLIP projections joined, reaches the transformer as `pooled_projections`.

    Without ``text_encoder_3`` (as here) the T5 tokens are zeros of that width.
    """
    pipe = sd3_pipe
    prompt_embeds, _, pooled, _ = pipe.encode_prompt(
        "a cat", None, None, device="cpu", do_classifier_free_guidance=False, max_sequence_length=10
    )
    assert prompt_embeds.shape == (1, 77 + 10, EMBED_DIM)
    ids = pipe.tokenizer(
        "a cat", padding="max_length", max_length=77, return_tensors="pt"
    ).input_ids
    with torch.no_grad():
        one = pipe.text_encoder(ids, output_hidden_states=True)
        two = pipe.text_encoder_2(ids, output_hidden_states=True)
    clip = torch.cat([one.hidden_states[-2], two.hidden_states[-2]], dim=-1)  # (1, 77, 16)
    torch.testing.assert_close(prompt_embeds[:, :77, :16], clip)
    assert prompt_embeds[:, :77, 16:].abs().max() == 0  # zero-padded to the T5 width
    assert prompt_embeds[:, 77:].abs().max() == 0  # the (absent) T5 tokens
    torch.testing.assert_close(pooled, torch.cat([one.text_embeds, two.text_embeds], dim=-1))
    calls = record_calls(pipe.transformer).calls
    pipe(
        prompt="a cat",
        guidance_scale=1.0,
        num_inference_steps=1,
        height=HEIGHT,
        width=WIDTH,
        max_sequence_length=10,
        output_type="latent",
    )
    torch.testing.assert_close(calls[0][1]["encoder_hidden_states"], prompt_embeds)
    torch.testing.assert_close(calls[0][1]["pooled_projections"], pooled)


def test_flow_match_step_follows_the_velocity():
    """`FlowMatchEulerDiscreteScheduler.step` returns `sample + (sigma_next - sigma) * model_output`, so a model output of `noise - x0`, the velocity of the path `(1 - sigma) * x0 + sigma * noise`, moves the sample exactly along that path."""
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(5)
    g = torch.Generator().manual_seed(0)
    x0, noise = (torch.randn(LATENT, generator=g, dtype=torch.float64) for _ in range(2))
    sample = noise.clone()  # sigma = 1: pure noise
    for i, t in enumerate(scheduler.timesteps):
        sigma, sigma_next = scheduler.sigmas[i].double(), scheduler.sigmas[i + 1].double()
        torch.testing.assert_close(sample, (1 - sigma) * x0 + sigma * noise, rtol=0, atol=1e-6)
        out = scheduler.step(noise - x0, t, sample).prev_sample
        torch.testing.assert_close(out, sample + (sigma_next - sigma) * (noise - x0))
        sample = out
    torch.testing.assert_close(sample, x0, rtol=0, atol=1e-6)


def test_sd3_skip_layer_guidance_adds_a_third_pass(sd3_pipe, record_calls):
    """With CFG and `skip_guidance_layers`, `StableDiffusion3Pipeline` makes a third transformer call, at batch `B` with the positive embeddings and `skip_layers`, on the steps `i` with `num_inference_steps * skip_layer_guidance_start < i < num_inference_steps * skip_layer_guidance_stop`."""
    calls = record_calls(sd3_pipe.transformer).calls
    run_sd3(sd3_pipe, steps=10, skip_guidance_layers=[0])  # defaults 0.01 and 0.2: only i = 1
    batches = [kwargs["hidden_states"].shape[0] for _, kwargs in calls]
    assert batches == [2, 2, 1] + [2] * 8
    assert calls[2][1]["skip_layers"] == [0]
    torch.testing.assert_close(calls[2][1]["encoder_hidden_states"], SD3_EMBEDS[1:])
    calls.clear()
    run_sd3(sd3_pipe, steps=10, skip_guidance_layers=[0], skip_layer_guidance_stop=0.5)
    assert len(calls) == 10 + 4  # i = 1, 2, 3, 4


def test_sd3_decode_adds_the_shift_factor(sd3_pipe, calls_of):
    """`StableDiffusion3Pipeline` decodes `latents / vae.config.scaling_factor + vae.config.shift_factor`."""
    final = run_sd3(sd3_pipe, steps=2, latents=start_latents())
    decodes = calls_of(sd3_pipe.vae, "decode")
    run_sd3(sd3_pipe, steps=2, latents=start_latents(), output_type="np")
    assert len(decodes) == 1
    torch.testing.assert_close(decodes[0][0][0], final / 1.5 + 0.25)


# ---------------------------------------------------------------- Flux


def test_flux_packs_the_noise_and_does_not_scale_it(record_calls):
    """`FluxPipeline` packs the `(B, 16, h, w)` noise into `(B, (h/2)(w/2), 64)` tokens of 2 × 2 patches and never scales it (`FlowMatchEulerDiscreteScheduler` has no `init_noise_sigma`), and calls the transformer once per step at batch `B` with `timestep = t / 1000`, the current sigma, and, for a guidance-embedding transformer (FLUX.1-dev), `guidance = guidance_scale`.

    The tiny FluxPipeline built by ``tiny.tiny_flux_pipeline`` (16 latent channels, a VAE
    with factor 2, ``guidance_embeds=True``).
    """
    FLUX_TEXT, FLUX_POOLED = flux_prompt_embeds()
    pipe = tiny_flux_pipeline()
    assert not hasattr(pipe.scheduler, "init_noise_sigma")
    calls = record_calls(pipe.transformer).calls
    pipe(
        prompt_embeds=FLUX_TEXT[1:],
        pooled_prompt_embeds=FLUX_POOLED[1:],
        num_inference_steps=3,
        guidance_scale=2.5,
        height=HEIGHT,
        width=WIDTH,
        generator=torch.Generator().manual_seed(1),
        output_type="latent",
    )
    assert pipe.transformer.config.guidance_embeds is True
    assert [kwargs["guidance"].tolist() for _, kwargs in calls] == [[2.5]] * 3
    noise = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(1))  # (B, C, h, w)
    packed = noise.view(1, 16, 4, 2, 4, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, 16, 64)
    assert len(calls) == 3
    torch.testing.assert_close(calls[0][1]["hidden_states"], packed, rtol=0, atol=0)
    timesteps = torch.cat([kwargs["timestep"] for _, kwargs in calls])
    torch.testing.assert_close(timesteps, pipe.scheduler.sigmas[:-1])
    assert all(kwargs["hidden_states"].shape[0] == 1 for _, kwargs in calls)


# ---------------------------------------------------------------- the loop as blocks (SDXL's modular pipeline)

LOOP_BLOCKS = {"before_denoiser": "StableDiffusionXLLoopBeforeDenoiser",
               "denoiser": "StableDiffusionXLLoopDenoiser",
               "after_denoiser": "StableDiffusionXLLoopAfterDenoiser"}  # fmt: skip


@pytest.fixture(scope="module")
def modular_sdxl(tmp_path_factory):
    """(modular, classic): SDXL's modular pipeline over the tiny SDXL parts, built once."""
    return tiny_modular_sdxl(tmp_path_factory.mktemp("tiny-sdxl"))


def test_sdxl_denoise_step_runs_three_sub_blocks_per_timestep(modular_sdxl, monkeypatch):
    """In SDXL's modular text-to-image call the loop is one block, `StableDiffusionXLDenoiseStep`, which runs three sub-blocks per timestep on one shared block state: `before_denoiser` (`scale_model_input`), `denoiser` (the UNet and the guider) and `after_denoiser` (`scheduler.step`)."""
    from diffusers.modular_pipelines.stable_diffusion_xl import denoise

    pipe, _ = modular_sdxl
    loop = pipe.blocks.sub_blocks["denoise"].sub_blocks["denoise"].sub_blocks["denoise"]
    assert type(loop) is denoise.StableDiffusionXLDenoiseStep
    assert {k: type(v).__name__ for k, v in loop.sub_blocks.items()} == LOOP_BLOCKS
    runs, active, inside = [], [], []
    for name in LOOP_BLOCKS.values():
        cls = getattr(denoise, name)

        def spy(self, components, block_state, i, t, _original=cls.__call__):
            runs.append((type(self).__name__, id(block_state), i))
            active.append(type(self).__name__)
            try:
                return _original(self, components, block_state, i=i, t=t)
            finally:
                active.pop()

        monkeypatch.setattr(cls, "__call__", spy)

    def inside_of(label, method):
        def wrapped(*args, **kwargs):
            inside.append((label, active[-1] if active else None))
            return method(*args, **kwargs)

        return wrapped

    scheduler, guider = type(pipe.scheduler), type(pipe.guider)
    monkeypatch.setattr(scheduler, "scale_model_input", inside_of("scale_model_input", scheduler.scale_model_input))  # fmt: skip
    monkeypatch.setattr(scheduler, "step", inside_of("step", scheduler.step))
    monkeypatch.setattr(guider, "prepare_inputs", inside_of("guider", guider.prepare_inputs))
    monkeypatch.setattr(guider, "__call__", inside_of("combine", guider.__call__))
    handle = pipe.unet.register_forward_pre_hook(lambda m, a: inside.append(("unet", active[-1] if active else None)))  # fmt: skip
    try:
        pipe(**sdxl_modular_inputs(), output="images")
    finally:
        handle.remove()
    assert [(n, i) for n, _, i in runs] == [(n, i) for i in range(MODULAR_STEPS) for n in LOOP_BLOCKS.values()]  # fmt: skip
    assert len({s for _, s, _ in runs}) == 1  # one block state throughout
    where = {label: {block for seen, block in inside if seen == label} for label, _ in inside}
    assert where == {"scale_model_input": {"StableDiffusionXLLoopBeforeDenoiser"},
                     "unet": {"StableDiffusionXLLoopDenoiser"},
                     "guider": {"StableDiffusionXLLoopDenoiser"},
                     "combine": {"StableDiffusionXLLoopDenoiser"},
                     "step": {"StableDiffusionXLLoopAfterDenoiser"}}  # fmt: skip
    assert sum(label == "step" for label, _ in inside) == MODULAR_STEPS
    assert sum(label == "combine" for label, _ in inside) == MODULAR_STEPS


def test_sdxl_modular_denoiser_calls_the_unet_once_per_guider_batch(
    modular_sdxl, monkeypatch, tmp_path
):
    """The guider's `prepare_inputs` makes one batch per prediction, and the `denoiser` block calls the UNet once per batch: with `EulerDiscreteScheduler`, `ClassifierFreeGuidance` at `guidance_scale=5.0` and a UNet without `time_cond_proj_dim`, two calls of `B` rows per step, where `StableDiffusionXLPipeline` makes one call of `2B` rows.

    The scale is a condition, not "above 1": at ``1 + 1e-10`` the guider (``not isclose(scale,
    1.0)``) asks for one batch, one call of ``B`` rows, while the classic call (``> 1``) makes
    one of ``2B``.

    With a UNet that sets ``time_cond_proj_dim`` (the guidance-distilled shape), the modular
    loop disables the guider: at 5.0 both pipelines make one call of ``B`` rows per step.
    Euler is a condition: with ``HeunDiscreteScheduler`` (order 2, ``2n - 1`` timesteps) the
    guider's window counts loop entries against ``n``, so the last ``n - 1`` entries get one
    call of ``B`` rows (8 calls at 3 steps, not 10), while the classic call makes 5 of ``2B``.
    """
    from diffusers import ClassifierFreeGuidance

    pipe, classic = modular_sdxl
    assert type(pipe.scheduler) is type(classic.scheduler) is EulerDiscreteScheduler
    assert pipe.unet.config.time_cond_proj_dim is None
    prepared = []
    original = ClassifierFreeGuidance.prepare_inputs
    monkeypatch.setattr(ClassifierFreeGuidance, "prepare_inputs", lambda self, data: prepared.append(len(out := original(self, data))) or out)  # fmt: skip
    for scale, per_step in ((5.0, 2), (1.0, 1), (1.0 + 1e-10, 1)):
        prepared.clear()
        with guider_swapped(pipe, ClassifierFreeGuidance(guidance_scale=scale)):
            batches, _ = unet_batches_of(pipe, **sdxl_modular_inputs(), output="images")
        assert prepared == [per_step] * MODULAR_STEPS, scale
        assert batches == [MODULAR_B] * (per_step * MODULAR_STEPS), scale
    for scale in (5.0, 1.0 + 1e-10):
        classic_batches, _ = unet_batches_of(classic, **sdxl_modular_inputs(), guidance_scale=scale)  # fmt: skip
        assert classic_batches == [2 * MODULAR_B] * MODULAR_STEPS, scale
    with schedulers_swapped(pipe, classic, HeunDiscreteScheduler), guider_swapped(pipe, ClassifierFreeGuidance(guidance_scale=5.0)):  # fmt: skip
        batches, _ = unet_batches_of(pipe, **sdxl_modular_inputs(), output="images")
        classic_batches, _ = unet_batches_of(classic, **sdxl_modular_inputs(), guidance_scale=5.0)  # fmt: skip
    entries = 2 * MODULAR_STEPS - 1  # Heun's len(scheduler.timesteps)
    assert classic_batches == [2 * MODULAR_B] * entries
    assert batches == [MODULAR_B] * (2 * MODULAR_STEPS + (entries - MODULAR_STEPS))
    distilled_unet = tiny_text_time_unet(time_cond_proj_dim=8)
    distilled, distilled_classic = tiny_modular_sdxl(tmp_path / "distilled", unet=distilled_unet)
    with guider_swapped(distilled, ClassifierFreeGuidance(guidance_scale=5.0)):
        batches, _ = unet_batches_of(distilled, **sdxl_modular_inputs(), output="images")
    classic_batches, _ = unet_batches_of(distilled_classic, **sdxl_modular_inputs(), guidance_scale=5.0)  # fmt: skip
    assert batches == classic_batches == [MODULAR_B] * MODULAR_STEPS


def test_sdxl_modular_loop_agrees_with_stable_diffusion_xl_pipeline(modular_sdxl):
    """With Euler and one prompt, both at `guidance_scale=5.0`, the rows are the same and the outputs agree with `StableDiffusionXLPipeline`'s up to float rounding; at their defaults (the guider's `7.5`, the pipeline's `5.0`) they differ, as they do for two different prompts at `num_images_per_prompt=2`, whose `pooled_prompt_embeds` the modular input step repeats in another order.

    SDXL's modular pipeline with ``ClassifierFreeGuidance(guidance_scale=5.0)`` against
    ``StableDiffusionXLPipeline`` at 5.0, both with ``EulerDiscreteScheduler``: at every step,
    the guider's two batches (conditional first) are the classic call's two halves
    (unconditional first) in ``latents``, ``encoder_hidden_states``, ``text_embeds`` and
    ``time_ids``. Then both at their defaults. Euler is the scheduler tested; with the order-2
    ``HeunDiscreteScheduler`` at 5.0 the outputs differ by more than rounding (about 3e-4).
    One prompt is a condition too: with two different prompts and ``num_images_per_prompt=2`` the
    ``encoder_hidden_states`` rows still match, but the modular ``text_embeds`` come in the order
    (q0, q1, q0, q1) where the classic call's are (q0, q0, q1, q1), and the images differ.
    """
    from diffusers import ClassifierFreeGuidance

    pipe, classic = modular_sdxl
    assert type(pipe.scheduler) is type(classic.scheduler) is EulerDiscreteScheduler
    rows = {"modular": [], "classic": []}

    def record(key, unet):
        def hook(module, args, kwargs):
            added = kwargs["added_cond_kwargs"]
            parts = [args[0], kwargs["encoder_hidden_states"], added["text_embeds"], added["time_ids"]]  # fmt: skip
            rows[key].append(torch.cat([part.flatten(1) for part in parts], 1))

        return unet.register_forward_pre_hook(hook, with_kwargs=True)

    handles = [record("modular", pipe.unet), record("classic", classic.unet)]
    try:
        with guider_swapped(pipe, ClassifierFreeGuidance(guidance_scale=5.0)):
            images = pipe(**sdxl_modular_inputs(), output="images")
        reference = classic(**sdxl_modular_inputs(), guidance_scale=5.0).images
    finally:
        for handle in handles:
            handle.remove()
    assert len(rows["modular"]) == 2 * len(rows["classic"]) == 2 * MODULAR_STEPS
    for step, classic_rows in enumerate(rows["classic"]):
        cond, uncond = rows["modular"][2 * step : 2 * step + 2]
        exact = step == 0  # the same inputs; later steps carry the rounding of the first
        tol = 0 if exact else 1e-4
        torch.testing.assert_close(torch.cat([uncond, cond]), classic_rows, rtol=tol, atol=tol)
    np.testing.assert_allclose(images, reference, atol=1e-5, rtol=0)
    assert pipe.guider.guidance_scale == 7.5  # the guider's default
    modular_default = pipe(**sdxl_modular_inputs(), output="images")
    classic_default = classic(**sdxl_modular_inputs()).images
    assert classic.guidance_scale == 5.0  # the pipeline's default, as its __call__ ran it
    assert np.abs(modular_default - classic_default).max() > 1e-3
    with schedulers_swapped(pipe, classic, HeunDiscreteScheduler), guider_swapped(pipe, ClassifierFreeGuidance(guidance_scale=5.0)):  # fmt: skip
        heun = pipe(**sdxl_modular_inputs(), output="images")
        heun_reference = classic(**sdxl_modular_inputs(), guidance_scale=5.0).images
    assert np.abs(heun - heun_reference).max() > 1e-4
    # two prompts, two images each: the pooled vectors are paired with other prompts' rows
    prompts = embeds(3, batch=2)
    pooled = torch.randn(2, classic.unet.config.projection_class_embeddings_input_dim - 6 * classic.unet.config.addition_time_embed_dim, generator=torch.Generator().manual_seed(4))  # fmt: skip
    two = dict(prompt_embeds=prompts, pooled_prompt_embeds=pooled, negative_prompt_embeds=torch.zeros_like(prompts),
               negative_pooled_prompt_embeds=torch.zeros_like(pooled), num_images_per_prompt=2)  # fmt: skip
    assert not torch.equal(prompts[0], prompts[1])  # two different prompts
    assert not torch.equal(pooled[0], pooled[1])
    rows = {"modular": [], "classic": []}
    handles = [record("modular", pipe.unet), record("classic", classic.unet)]
    try:
        with guider_swapped(pipe, ClassifierFreeGuidance(guidance_scale=5.0)):
            images = pipe(**{**sdxl_modular_inputs(), **two}, output="images")
        reference = classic(**{**sdxl_modular_inputs(), **two}, guidance_scale=5.0).images
    finally:
        for handle in handles:
            handle.remove()
    cond, classic_cond = rows["modular"][0], rows["classic"][0][4:]  # step 0, the conditional rows
    width = cond.shape[1] - pooled.shape[1] - 6  # latents, encoder_hidden_states; then the rest
    torch.testing.assert_close(cond[:, :width], classic_cond[:, :width], rtol=0, atol=0)
    text = slice(width, width + pooled.shape[1])
    torch.testing.assert_close(cond[:, text], pooled[[0, 1, 0, 1]], rtol=0, atol=0)
    torch.testing.assert_close(classic_cond[:, text], pooled[[0, 0, 1, 1]], rtol=0, atol=0)
    assert np.abs(images - reference).max() > 1e-3
