"""Lab 17 (rebuild the pipeline) against the real StableDiffusionPipeline.

``code/lab-17-rebuild-the-pipeline/rebuild_diffusers.py`` is the lab's loop with its six
blanks filled, written against a pipeline's own parts (``encode_prompt``, ``unet``,
``scheduler``, ``vae``, ``prepare_extra_step_kwargs``, ``image_processor``). These tests run
it on a tiny random StableDiffusionPipeline with a real CLIP tokenizer and text encoder
(``tiny.py``) and compare it with ``pipe(...)`` for the same prompt and generator, over
four schedulers and three guidance scales; then they plant each blank's classic mistake in
a copy of it and show that the output changes. Spies on ``pipe(...)`` record what its own
loop hands ``scale_model_input``, the UNet, ``step`` and ``vae.decode`` each step, and what
SD3's loop does instead. The last tests call the schedulers the page names: what ``step``
returns, Euler's warning when ``scale_model_input`` was skipped, the device the loop makes
its tensors on, and the order ControlNet's guess mode and IP-Adapter read a doubled batch in.
"""

from __future__ import annotations

import functools
import inspect
import re

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
    """diffusers' scheduler ``name`` with SD 1.5's betas and steps_offset, on DDIMScheduler's config
    (so timestep_spacing "leading"; SD 1.5's shipped file has none)."""
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


#: blank -> its classic mistake, planted in a copy of rebuild_diffusers.py (old text, new text)
CLASSIC = {
    1: ("[negative_prompt_embeds, prompt_embeds]", "[prompt_embeds, negative_prompt_embeds]"),
    2: ("torch.cat([latents] * 2) if guide", "latents.repeat_interleave(2, dim=0) if guide"),
    3: ("pipe.scheduler.scale_model_input(latent_model_input, t)", "latent_model_input"),
    4: ("(noise_pred_text - noise_pred_uncond)", "(noise_pred_uncond - noise_pred_text)"),
    5: ("latents = out[0]", "latents = out[1]"),
    6: ("latents / pipe.vae.config.scaling_factor", "latents"),
}


def test_every_blank_of_the_rebuilt_loop_has_its_classic_mistake_planted():
    """The verify tests plant a classic mistake in each of the six blanks of rebuild_diffusers.py (the blanks counted from its # BLANK comments), one blank per copy."""
    numbers = {int(n) for n in re.findall(r"# BLANK (\d+)", SOURCE.read_text(encoding="utf-8"))}
    assert numbers == set(CLASSIC) == set(range(1, 7)), numbers


@pytest.mark.parametrize("number", list(CLASSIC), ids=["1 order", "2 rows interleaved", "3 scale_model_input", "4 guidance sign", "5 x0 carried", "6 scaling_factor"])  # fmt: skip
def test_each_blanks_classic_mistake_changes_the_real_pipelines_output(pipe, number):
    """Each of the six blanks matters on the real StableDiffusionPipeline's parts with Euler: each one's classic mistake (swapped order, the latents doubled row by row with repeat_interleave, no scale_model_input, flipped guidance sign, pred_original_sample carried, no division by scaling_factor) changes the images."""
    pipe = with_scheduler(pipe, "EulerDiscreteScheduler")
    assert abs(rebuilt(pipe, CLASSIC[number]) - real(pipe)).max() > 1e-3


def test_a_unet_with_time_cond_proj_dim_is_not_guided():
    """The loop guides when guidance_scale > 1 and the UNet has no time_cond_proj_dim: StableDiffusionPipeline.__call__ at guidance_scale 7.5 calls a tiny UNet with time_cond_proj_dim on B rows each step, not 2B (without it, on 2B: test_call_doubles_the_latents_then_scales_them_each_step)."""
    from tiny import embeds, tiny_unet

    lcm = tiny_sd_pipeline(unet=tiny_unet(time_cond_proj_dim=8))
    rows = []
    hook = lcm.unet.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    try:
        lcm(
            prompt_embeds=embeds(1), negative_prompt_embeds=embeds(2), guidance_scale=GUIDANCE,
            num_inference_steps=2, output_type="np",
        )  # fmt: skip
    finally:
        hook.remove()
    assert rows == [1, 1], rows


def test_sds_decoder_does_not_turn_a_missing_division_into_lower_contrast():
    """SD 1.x's decoder is non-linear: with its factor 0.18215 (AutoencoderKL's default) a missing division hands it latents 1/0.18215 times too small, which it does not simply turn into lower contrast: on a tiny random AutoencoderKL, vae.decode(latents) is far from every affine image a * vae.decode(latents / scaling_factor) + b (the toy's affine decoder gives exactly one)."""
    from tiny import tiny_vae

    vae = tiny_vae()
    assert vae.config.scaling_factor == 0.18215
    latents = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))  # unit std
    with torch.no_grad():
        right = vae.decode(latents / vae.config.scaling_factor).sample.double().flatten()
        wrong = vae.decode(latents).sample.double().flatten()
    fit = torch.stack([right, torch.ones_like(right)], 1)  # the best a, b by least squares
    residual = wrong - fit @ torch.linalg.lstsq(fit, wrong[:, None]).solution[:, 0]
    assert residual.norm() > 0.5 * (wrong - wrong.mean()).norm()


@pytest.mark.parametrize("scheduler, module", [("EulerAncestralDiscreteScheduler", "scheduling_euler_ancestral_discrete"), ("DDPMScheduler", "scheduling_ddpm")])  # fmt: skip
def test_euler_ancestral_and_ddpm_draw_their_step_noise_from_the_generator(pipe, scheduler, module, monkeypatch):  # fmt: skip
    """Euler Ancestral and DDPM, which add noise in step, draw it from that generator: through StableDiffusionPipeline's pipe(...) at 4 steps with SD 1.5's betas and steps_offset (leading spacing), each of their steps calls randn_tensor with the generator passed to pipe(...)."""
    import importlib

    owner = importlib.import_module(f"diffusers.schedulers.{module}")
    pipe, generators, draw = with_scheduler(pipe, scheduler), [], owner.randn_tensor

    def spy(*args, **kwargs):
        generators.append(kwargs.get("generator"))
        return draw(*args, **kwargs)

    monkeypatch.setattr(owner, "randn_tensor", spy)
    generator = torch.Generator().manual_seed(0)
    pipe(PROMPTS, num_inference_steps=STEPS, guidance_scale=GUIDANCE, generator=generator, output_type="np")  # fmt: skip
    assert len(generators) == STEPS and all(g is generator for g in generators), generators


def test_ddims_scale_model_input_is_the_identity_so_leaving_it_out_changes_nothing(pipe):
    """With DDIM the call is the identity, so leaving it out changes nothing: on a StableDiffusionPipeline with diffusers' DDIMScheduler, the rebuilt loop without scale_model_input returns bit for bit the images pipe(...) returns (with Euler it does not)."""
    skipped = ("pipe.scheduler.scale_model_input(latent_model_input, t)", "latent_model_input")
    ddim = with_scheduler(pipe, "DDIMScheduler")
    np.testing.assert_array_equal(rebuilt(ddim, skipped), real(ddim))
    euler = with_scheduler(pipe, "EulerDiscreteScheduler")
    assert np.abs(rebuilt(euler, skipped) - real(euler)).max() > 1e-3


def record(monkeypatch, owner, name, seen, arg):
    """Wrap ``owner.name`` (signature kept: prepare_extra_step_kwargs reads step's) so that
    each call appends (name, its argument number ``arg``, cloned) to ``seen``."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def spy(*args, **kwargs):
        seen.append((name, args[arg].detach().clone()))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_call_doubles_the_latents_then_scales_them_each_step(pipe, scheduler, monkeypatch):
    """StableDiffusionPipeline.__call__ at guidance_scale 7.5 doubles the latents first, then scales them: with DDIM, Euler, Euler Ancestral and DDPM, each step calls scale_model_input on the 2B rows torch.cat([latents] * 2) of the latents that step then gets, the UNet on 2B rows and step on B, and after the loop vae.decode once on B rows."""
    pipe, seen = with_scheduler(pipe, scheduler), []
    record(monkeypatch, pipe.scheduler, "scale_model_input", seen, 0)
    record(monkeypatch, pipe.scheduler, "step", seen, 2)  # step(noise_pred, t, latents)
    record(monkeypatch, pipe.vae, "decode", seen, 0)
    hook = pipe.unet.register_forward_pre_hook(lambda m, args: seen.append(("unet", args[0])))
    try:
        real(pipe)
    finally:
        hook.remove()
    B = len(PROMPTS)
    assert [(name, len(x)) for name, x in seen] == [("scale_model_input", 2 * B), ("unet", 2 * B), ("step", B)] * STEPS + [("decode", B)]  # fmt: skip
    for k in range(STEPS):  # the scaled input is the doubled latents that step gets, scaled
        doubled, latents = seen[3 * k][1], seen[3 * k + 2][1]
        torch.testing.assert_close(doubled, torch.cat([latents] * 2), rtol=0, atol=0)


def test_sd3_scales_nothing_and_decodes_with_shift_factor(monkeypatch):
    """Not every text-to-image pipeline runs this loop: StableDiffusion3Pipeline.__call__ gives its transformer the doubled latents unscaled (its FlowMatchEulerDiscreteScheduler has no scale_model_input) and decodes latents / scaling_factor + shift_factor (SD3's VAE factors, run on a tiny SD3 pipeline)."""
    from tiny import dit_embeds, tiny_sd3_pipeline_16ch

    pipe, seen = tiny_sd3_pipeline_16ch(), []
    step = pipe.scheduler.step

    @functools.wraps(step)
    def stepped(*args, **kwargs):  # the latents step gets, and the prev_sample it returns
        out = step(*args, **kwargs)
        seen.append(("step", args[2].clone(), out[0].clone()))
        return out

    monkeypatch.setattr(pipe.scheduler, "step", stepped)
    record(monkeypatch, pipe.vae, "decode", seen, 0)
    hook = pipe.transformer.register_forward_hook(
        lambda m, args, kwargs, out: seen.append(("transformer", kwargs["hidden_states"])), with_kwargs=True
    )  # fmt: skip
    (text, pooled), (negative, negative_pooled) = dit_embeds(1), dit_embeds(2)
    try:
        pipe(
            prompt_embeds=text, pooled_prompt_embeds=pooled, negative_prompt_embeds=negative,
            negative_pooled_prompt_embeds=negative_pooled, guidance_scale=GUIDANCE,
            num_inference_steps=2, height=16, width=16, output_type="np",
        )  # fmt: skip
    finally:
        hook.remove()
    assert [call[0] for call in seen] == ["transformer", "step"] * 2 + ["decode"]
    assert not hasattr(pipe.scheduler, "scale_model_input")
    for k in range(2):  # the transformer's input: the step's latents doubled, nothing scaled
        torch.testing.assert_close(seen[2 * k][1], torch.cat([seen[2 * k + 1][1]] * 2), rtol=0, atol=0)  # fmt: skip
    config, last, decoded = pipe.vae.config, seen[-2][2], seen[-1][1]
    assert config.shift_factor != 0
    torch.testing.assert_close(decoded, last / config.scaling_factor + config.shift_factor, rtol=0, atol=0)  # fmt: skip
    assert (decoded - last / config.scaling_factor).abs().min() > 0  # not the SD 1.x decode


def test_euler_step_warns_when_scale_model_input_was_skipped(pipe):
    """diffusers' EulerDiscreteScheduler.step logs a warning ("The `scale_model_input` function should be called before `step` to ensure correct denoising") only on a scheduler that has never scaled an input: pipe.scheduler after one StableDiffusionPipeline call logs none when a later loop skips scale_model_input, because set_timesteps does not reset the flag."""
    skipped = ("pipe.scheduler.scale_model_input(latent_model_input, t)", "latent_model_input")
    warning = "The `scale_model_input` function should be called before `step` to ensure correct denoising."  # fmt: skip
    pipe = with_scheduler(pipe, "EulerDiscreteScheduler")  # fresh: never scaled an input
    with logged_messages() as fresh:
        rebuilt(pipe, skipped)
    assert any(warning in message for message in fresh), fresh
    pipe = with_scheduler(pipe, "EulerDiscreteScheduler")
    with logged_messages() as with_it:
        real(pipe)  # one ordinary call: scale_model_input runs on this scheduler
    assert not any(warning in message for message in with_it), with_it
    with logged_messages() as reused:
        rebuilt(pipe, skipped)  # the same scheduler, scale_model_input skipped: silent
    assert not any(warning in message for message in reused), reused


def test_the_rebuilt_loop_uses_the_execution_device_as_call_does(monkeypatch):
    """Like StableDiffusionPipeline.__call__, the rebuilt loop makes the prompt embeddings, the timesteps and the noise on pipe._execution_device, which model offload sets to the accelerator while pipe.device stays the CPU: with enable_model_cpu_offload(device="cpu") (execution device cpu:0), both hand encode_prompt, set_timesteps and randn_tensor the same device, and return the same images."""
    import diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion as sd_module
    import diffusers.utils.torch_utils as torch_utils

    pipe = with_scheduler(
        tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer()), "DDIMScheduler"
    )  # fmt: skip
    pipe.enable_model_cpu_offload(device="cpu")  # accelerate's hooks, execution device cpu:0
    assert pipe.device != pipe._execution_device
    devices = []

    def recording(name, fn):
        def spy(*args, **kwargs):
            devices.append((name, inspect.signature(fn).bind(*args, **kwargs).arguments.get("device")))  # fmt: skip
            return fn(*args, **kwargs)

        return spy

    randn = recording("randn_tensor", torch_utils.randn_tensor)
    monkeypatch.setattr(torch_utils, "randn_tensor", randn)  # what the rebuilt loop imports
    monkeypatch.setattr(sd_module, "randn_tensor", randn)  # what prepare_latents calls
    monkeypatch.setattr(pipe, "encode_prompt", recording("encode_prompt", pipe.encode_prompt))
    timesteps = recording("set_timesteps", pipe.scheduler.set_timesteps)
    monkeypatch.setattr(pipe.scheduler, "set_timesteps", timesteps)
    theirs = real(pipe)
    by_call, devices[:] = list(devices), []
    ours = rebuilt(pipe)
    assert [name for name, _ in by_call] == ["encode_prompt", "set_timesteps", "randn_tensor"]
    assert devices == by_call and by_call[0][1] == pipe._execution_device, (devices, by_call)
    np.testing.assert_array_equal(ours, theirs)


def test_controlnet_guess_mode_reads_a_doubled_batch_negative_first():
    """In guess mode StableDiffusionControlNetPipeline gives the ControlNet prompt_embeds.chunk(2)[1], the second half of the doubled batch, as the prompt's rows, and puts zero residuals first for the negative half: it relies on StableDiffusionPipeline's order, negative rows first."""
    from tiny import embeds, tiny_controlnet, tiny_controlnet_pipeline, tiny_unet

    unet = tiny_unet()
    controlnet = tiny_controlnet(unet, trained=True)
    pipe = tiny_controlnet_pipeline(unet, controlnet)
    prompt_embeds, negative_prompt_embeds = embeds(1), embeds(2)
    seen, residuals = [], []
    hooks = [
        controlnet.register_forward_hook(
            lambda m, args, kwargs, out: seen.append(kwargs["encoder_hidden_states"]), with_kwargs=True
        ),
        unet.register_forward_hook(
            lambda m, args, kwargs, out: residuals.append(kwargs["mid_block_additional_residual"]), with_kwargs=True
        ),
    ]  # fmt: skip
    try:
        pipe(
            prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_prompt_embeds,
            image=torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(0)),
            guess_mode=True, guidance_scale=GUIDANCE, num_inference_steps=2, output_type="np",
        )  # fmt: skip
    finally:
        for hook in hooks:
            hook.remove()
    assert len(seen) == len(residuals) == 2
    for rows, mid in zip(seen, residuals, strict=True):
        torch.testing.assert_close(rows, prompt_embeds, rtol=0, atol=0)  # the second half
        assert mid.shape[0] == 2 and not mid[0].any() and mid[1].abs().max() > 0  # zeros first


def test_ip_adapter_reads_a_doubled_batch_negative_first(pipe):
    """StableDiffusionPipeline's code that splits the doubled batch reads its first half as the negative: its prepare_ip_adapter_image_embeds chunks precomputed ip_adapter_image_embeds into (negative, positive) and returns the negative rows first."""
    negative, positive = torch.zeros(1, 1, 8), torch.ones(1, 1, 8)
    out = pipe.prepare_ip_adapter_image_embeds(
        None, [torch.cat([negative, positive])], torch.device("cpu"), 2, True
    )[0]  # two images per prompt: each half repeated twice
    np.testing.assert_array_equal(out[:, 0, 0].numpy(), [0, 0, 1, 1])


@pytest.mark.parametrize("name", list(STEP_FIELDS))
def test_what_step_returns(name):
    """The step of DDIM, Euler, DPMSolverMultistepScheduler and UniPCMultistepScheduler returns prev_sample first ([0], as the pipeline reads it); DDIM's and Euler's return pred_original_sample too, the other two prev_sample alone."""
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
