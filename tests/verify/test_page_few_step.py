"""The few-step sampling and distillation page against the installed diffusers.

The schedulers are the real classes with SD 1.x's betas; the pipeline checks run the real
``__call__`` of tiny pipelines built in code (``tiny.py``; no text encoders, no weights):
the ``FluxPipeline`` Lab 13's module runs (a guidance-embedding ``FluxTransformer2DModel``
and a 16-channel ``AutoencoderKL`` with FLUX.1's factors), a ``StableDiffusionPipeline``,
a ``StableDiffusionXLPipeline`` around a UNet with SDXL's "text_time" conditioning, a
``StableDiffusion3Pipeline`` and a ``SanaSprintPipeline`` (one-layer transformer, two-block
``AutoencoderDC``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    LCMScheduler,
    TCDScheduler,
)
from tiny import (
    FLUX_VAE_FACTORS,
    HEIGHT,
    POOLED_DIM,
    SD_BETAS,
    SD_SCHEDULER,
    embeds,
    flux_image_and_calls,
    orders_used,
    spy_set_timesteps,
    spy_step_kwarg,
    start_latents,
    timestep_grid,
    tiny_flux_pipeline,
    tiny_sd_pipeline,
    tiny_sdxl_pipeline,
    tiny_text_time_unet,
    tiny_unet,
)


def test_leading_never_starts_at_the_noisiest_timestep():
    """With `steps_offset=1`, `leading` gives `DDIMScheduler` and `EulerDiscreteScheduler` 751, 501, 251, 1 at 4 steps and 1 at one step, and `DPMSolverMultistepScheduler` 801, 601, 401, 201 at 4 steps and 501 at one; `trailing` gives all three 999, 749, 499, 249 and 999, and `LCMScheduler`, whatever its `timestep_spacing`, starts at 999 from its own grid. On SD's betas `alphas_cumprod.sqrt()` is 0.236 at t = 751 and 0.191 at t = 801: the share of the image the model is told pure noise still holds."""
    signal = DDIMScheduler(**SD_BETAS).alphas_cumprod.sqrt()
    assert float(signal[751]) == pytest.approx(0.236, abs=5e-4)
    assert float(signal[801]) == pytest.approx(0.191, abs=5e-4)
    for cls in (DDIMScheduler, EulerDiscreteScheduler):
        assert timestep_grid(cls, "leading", 4) == [751, 501, 251, 1], cls.__name__
        assert timestep_grid(cls, "leading", 1) == [1], cls.__name__
    assert timestep_grid(DPMSolverMultistepScheduler, "leading", 4) == [801, 601, 401, 201]
    assert timestep_grid(DPMSolverMultistepScheduler, "leading", 1) == [501]
    for cls in (DDIMScheduler, EulerDiscreteScheduler, DPMSolverMultistepScheduler):
        assert timestep_grid(cls, "trailing", 4) == [999, 749, 499, 249], cls.__name__
        assert timestep_grid(cls, "trailing", 1) == [999], cls.__name__
    for spacing in ("leading", "trailing", "linspace"):
        assert timestep_grid(LCMScheduler, spacing, 1) == [999]


def test_from_config_spacing_is_the_class_default():
    """A scheduler built with `from_config` from a `PNDMScheduler` config with SD 1.x's betas and `steps_offset=1` that leaves `timestep_spacing` at its default keeps the offset but takes its own class's default spacing: `leading` for `DDIMScheduler` (751, 501, 251, 1 at 4 steps), `linspace` for `DPMSolverMultistepScheduler` (999, 749, 500, 250) and `EulerDiscreteScheduler`, which start at 999."""
    from diffusers import PNDMScheduler

    sd = PNDMScheduler(**SD_BETAS, steps_offset=1, skip_prk_steps=True, set_alpha_to_one=False)
    expected = {
        DDIMScheduler: ("leading", [751, 501, 251, 1]),
        DPMSolverMultistepScheduler: ("linspace", [999, 749, 500, 250]),
        EulerDiscreteScheduler: ("linspace", [999, 666, 333, 0]),
    }
    for cls, (spacing, timesteps) in expected.items():
        scheduler = cls.from_config(sd.config)
        scheduler.set_timesteps(4)
        assert scheduler.config.timestep_spacing == spacing and scheduler.config.steps_offset == 1
        assert [int(t) for t in scheduler.timesteps] == timesteps


def test_from_config_keeps_a_saved_timestep_spacing(tmp_path):
    """`from_config` takes the class default only when the loaded config omits `timestep_spacing`, as SD 1.5's original `scheduler_config.json` does; a config saved by diffusers' `save_config` writes `"leading"`, and `DPMSolverMultistepScheduler.from_config` keeps it (801, 601, 401, 201 at 4 steps); `timestep_spacing="trailing"` passed to `from_config` gives 999, 749, 499, 249 from either.

    The shipped file is SD 1.5's ``scheduler/scheduler_config.json`` (PNDM, no
    ``timestep_spacing``), loaded with ``from_pretrained`` as a pipeline loads it.
    """
    import json

    from diffusers import PNDMScheduler

    shipped = dict(_class_name="PNDMScheduler", beta_end=0.012, beta_schedule="scaled_linear",
                   beta_start=0.00085, num_train_timesteps=1000, set_alpha_to_one=False,
                   skip_prk_steps=True, steps_offset=1, trained_betas=None, clip_sample=False)  # fmt: skip
    (tmp_path / "shipped").mkdir()
    (tmp_path / "shipped" / "scheduler_config.json").write_text(json.dumps(shipped))
    as_shipped = PNDMScheduler.from_pretrained(tmp_path / "shipped")
    as_shipped.save_config(tmp_path / "resaved")  # what save_pretrained writes for the scheduler
    assert json.loads((tmp_path / "resaved" / "scheduler_config.json").read_text())["timestep_spacing"] == "leading"  # fmt: skip
    resaved = PNDMScheduler.from_pretrained(tmp_path / "resaved")

    def grid(config, **kwargs):
        scheduler = DPMSolverMultistepScheduler.from_config(config, **kwargs)
        scheduler.set_timesteps(4)
        return scheduler.config.timestep_spacing, [int(t) for t in scheduler.timesteps]

    assert grid(as_shipped.config) == ("linspace", [999, 749, 500, 250])
    assert grid(resaved.config) == ("leading", [801, 601, 401, 201])
    for config in (as_shipped.config, resaved.config):
        assert grid(config, timestep_spacing="trailing") == ("trailing", [999, 749, 499, 249])


NAMED_ZERO_SNR = {"DDIMScheduler", "DDPMScheduler", "EulerDiscreteScheduler", "DPMSolverMultistepScheduler", "LCMScheduler", "TCDScheduler"}  # fmt: skip


def test_rescale_betas_zero_snr():
    """`rescale_betas_zero_snr=True` is accepted by `DDIMScheduler`, `DDPMScheduler`, `EulerDiscreteScheduler`, `DPMSolverMultistepScheduler`, `LCMScheduler` and `TCDScheduler`, among others; it makes SD's `alphas_cumprod[-1]` (4.66e-03 without it) 0, and of the schedulers diffusers exports that take it, the four that keep `sigmas` (`EulerDiscreteScheduler`, `EulerAncestralDiscreteScheduler`, `DPMSolverMultistepScheduler`, `UniPCMultistepScheduler`) then set it to `2**-24`, so their first sigma (t = 999 on the trailing grid) stays finite; the others keep 0."""
    import inspect

    import diffusers

    taking, clamped = set(), set()
    for name in [n for n in dir(diffusers) if n.endswith("Scheduler")]:  # a new class joins the set
        cls = getattr(diffusers, name)
        if "rescale_betas_zero_snr" not in inspect.signature(cls.__init__).parameters:
            continue
        taking.add(name)
        plain = cls(**SD_BETAS)
        if name in NAMED_ZERO_SNR:  # (CogVideoX's schedulers also shift the SNR by default)
            assert float(plain.alphas_cumprod[-1]) == pytest.approx(4.66e-03, abs=5e-6), name
        rescaled = cls(**SD_BETAS, rescale_betas_zero_snr=True, timestep_spacing="trailing")
        last = float(rescaled.alphas_cumprod[-1])
        assert float(rescaled.alphas_cumprod[0]) == pytest.approx(float(plain.alphas_cumprod[0]), rel=1e-5), name  # fmt: skip
        assert last in (0.0, 2**-24), name
        assert (last == 2**-24) == hasattr(rescaled, "sigmas"), name
        if last:
            clamped.add(name)
            rescaled.set_timesteps(4)
            assert int(rescaled.timesteps[0]) == 999 and torch.isfinite(rescaled.sigmas[0]), name  # fmt: skip
    assert NAMED_ZERO_SNR < taking
    assert clamped == {"EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler", "DPMSolverMultistepScheduler", "UniPCMultistepScheduler"}  # fmt: skip


def sdxl_pipeline(**unet_overrides):
    """``tiny_sdxl_pipeline`` with Euler on SD's betas alone, ``unet_overrides`` on its UNet."""
    return tiny_sdxl_pipeline(
        EulerDiscreteScheduler(**SD_BETAS), unet=tiny_text_time_unet(**unet_overrides)
    )


@pytest.mark.parametrize("name", ["StableDiffusionPipeline", "StableDiffusionXLPipeline"])
def test_guidance_rescale(name, sd_pipe, guidance_rescale_calls):
    """`StableDiffusionPipeline` and `StableDiffusionXLPipeline` take `guidance_rescale` (default 0.0) and, only while guiding and only when it is above 0, pass the guided `noise_pred` through `rescale_noise_cfg`, which rescales it to the per-sample std of `noise_pred_text` and returns `guidance_rescale * rescaled + (1 - guidance_rescale) * guided`, the prediction `scheduler.step` then gets."""
    import importlib

    if name == "StableDiffusionPipeline":
        module = importlib.import_module("diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion")  # fmt: skip
        pipe, extra = sd_pipe, {}
    else:
        module = importlib.import_module("diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl")  # fmt: skip
        pipe = sdxl_pipeline()
        g = torch.Generator().manual_seed(3)
        extra = dict(pooled_prompt_embeds=torch.randn(1, POOLED_DIM, generator=g),
                     negative_pooled_prompt_embeds=torch.randn(1, POOLED_DIM, generator=g))  # fmt: skip
    calls, steps = guidance_rescale_calls(pipe, module, guidance_scale=7.5, guidance_rescale=0.7, extra=extra)  # fmt: skip
    assert len(calls) == len(steps) == 2
    for (guided, text, phi, out), model_output in zip(calls, steps, strict=True):
        rescaled = guided * text.std(dim=(1, 2, 3), keepdim=True) / guided.std(dim=(1, 2, 3), keepdim=True)  # fmt: skip
        assert phi == 0.7
        torch.testing.assert_close(out, 0.7 * rescaled + 0.3 * guided)
        torch.testing.assert_close(model_output, out)
    for kwargs in (dict(guidance_scale=1.0, guidance_rescale=0.7), dict(guidance_scale=7.5)):
        calls, steps = guidance_rescale_calls(pipe, module, extra=extra, **kwargs)
        assert calls == [] and len(steps) == 2


def sd_family_pipeline(name, **unet_overrides):
    """(pipe, extra call kwargs): tiny SD 1.x with an LCMScheduler, or tiny SDXL."""
    from diffusers import LCMScheduler

    if name == "StableDiffusionPipeline":
        scheduler = LCMScheduler(**dict(SD_SCHEDULER, set_alpha_to_one=True))
        return tiny_sd_pipeline(scheduler=scheduler, unet=tiny_unet(**unet_overrides)), {}
    g = torch.Generator().manual_seed(3)
    extra = dict(pooled_prompt_embeds=torch.randn(1, POOLED_DIM, generator=g),
                 negative_pooled_prompt_embeds=torch.randn(1, POOLED_DIM, generator=g))  # fmt: skip
    return sdxl_pipeline(**unet_overrides), extra


def run_sd_family(pipe, extra, record_calls, **kwargs):
    """One 2-step call on fixed embeddings and latents; the UNet's recorded calls."""
    recorder = record_calls(pipe.unet)
    with torch.no_grad():
        pipe(prompt_embeds=embeds(1), negative_prompt_embeds=embeds(2), latents=start_latents(),
             num_inference_steps=2, height=HEIGHT, width=HEIGHT, output_type="latent",
             **extra, **kwargs)  # fmt: skip
    recorder.remove()
    return recorder.calls


SD_FAMILY = ["StableDiffusionPipeline", "StableDiffusionXLPipeline"]


@pytest.mark.parametrize("name", SD_FAMILY)
def test_time_cond_proj_dim_embeds_guidance(name, record_calls):
    """A UNet with `time_cond_proj_dim` set (how full LCM checkpoints take guidance) turns classifier-free guidance off in `StableDiffusionPipeline` and `StableDiffusionXLPipeline`: one UNet call per step on the un-doubled batch at `guidance_scale=8.5`, with an embedding of `guidance_scale - 1` passed as `timestep_cond`; the same UNet without it makes one call per step on a doubled batch."""
    for proj_dim, rows in [(8, 1), (None, 2)]:
        pipe, extra = sd_family_pipeline(name, time_cond_proj_dim=proj_dim)
        calls = run_sd_family(pipe, extra, record_calls, guidance_scale=8.5)
        assert len(calls) == 2
        for args, kwargs in calls:
            assert args[0].shape[0] == rows
            if proj_dim is None:
                assert kwargs["timestep_cond"] is None
            else:
                expected = pipe.get_guidance_scale_embedding(torch.tensor([7.5]), embedding_dim=proj_dim)  # fmt: skip
                torch.testing.assert_close(kwargs["timestep_cond"], expected)


def guidance_pipeline(name):
    """(pipe, denoiser, cond, uncond): tiny SD 1.x (PNDM), SDXL (Euler) or SD3 (flow-match
    Euler), all deterministic; ``cond`` and ``uncond`` are two sets of embedding kwargs."""
    from tiny import EMBED_DIM, tiny_sd3_pipeline

    g = torch.Generator().manual_seed(3)
    if name == "StableDiffusion3Pipeline":
        pipe = tiny_sd3_pipeline()
        text = [torch.randn(1, 10, EMBED_DIM, generator=g) for _ in range(2)]
        pooled = [torch.randn(1, 16, generator=g) for _ in range(2)]
    else:
        pipe = tiny_sd_pipeline() if name == "StableDiffusionPipeline" else sdxl_pipeline()
        text = [embeds(1), embeds(2)]
        pooled = [torch.randn(1, POOLED_DIM, generator=g) for _ in range(2)]
    cond, uncond = ({"prompt_embeds": t} for t in text)
    if name != "StableDiffusionPipeline":
        cond["pooled_prompt_embeds"], uncond["pooled_prompt_embeds"] = pooled
    return pipe, getattr(pipe, "unet", None) or pipe.transformer, cond, uncond


GUIDED_FAMILY = {"StableDiffusionPipeline": 7.5, "StableDiffusionXLPipeline": 5.0, "StableDiffusion3Pipeline": 7.0}  # fmt: skip


@pytest.mark.parametrize("name", GUIDED_FAMILY)
def test_guidance_scale_at_most_one_is_the_conditional_prediction(name, record_calls):
    """In `StableDiffusionPipeline`, `StableDiffusionXLPipeline` and `StableDiffusion3Pipeline` any `guidance_scale <= 1` turns classifier-free guidance off: at `0.0` and at `1.0` each step is one denoiser call on the un-doubled batch with the prompt's embeddings alone, and `0.0` returns exactly the latents of `1.0`, not the unconditional prediction's; at each pipeline's default (7.5, 5.0, 7.0) every call takes a doubled batch."""
    pipe, denoiser, cond, uncond = guidance_pipeline(name)
    negative = {f"negative_{k}": v for k, v in uncond.items()}

    def run(embeddings, **kwargs):
        recorder = record_calls(denoiser)
        with torch.no_grad():
            latents = pipe(**embeddings, latents=start_latents(), num_inference_steps=2,
                           height=HEIGHT, width=HEIGHT, output_type="latent", **kwargs).images  # fmt: skip
        recorder.remove()
        rows = [(kw.get("hidden_states", args[0] if args else None)).shape[0] for args, kw in recorder.calls]  # fmt: skip
        return latents, rows, [kw["encoder_hidden_states"] for _, kw in recorder.calls]

    _, rows, _ = run({**cond, **negative})  # guidance_scale left at the pipeline's default
    assert pipe.guidance_scale == GUIDED_FAMILY[name] and rows == [2, 2]
    at_one, rows, hidden = run({**cond, **negative}, guidance_scale=1.0)
    assert rows == [1, 1] and all(torch.equal(h, cond["prompt_embeds"]) for h in hidden)
    at_zero, rows, hidden = run({**cond, **negative}, guidance_scale=0.0)
    assert rows == [1, 1] and all(torch.equal(h, cond["prompt_embeds"]) for h in hidden)
    torch.testing.assert_close(at_zero, at_one, rtol=0, atol=0)
    unconditional, _, _ = run(uncond, guidance_scale=1.0)  # the negative embeddings alone
    assert not torch.allclose(at_zero, unconditional)


def test_lora_leaves_guidance_as_cfg(record_calls):
    """A LoRA loaded with `load_lora_weights` (the way LCM-LoRA is loaded) leaves the UNet config's `time_cond_proj_dim` unset, so in `StableDiffusionPipeline` `guidance_scale` above 1 is still classifier-free guidance: every UNet call on a doubled batch, `timestep_cond` `None`."""
    from tiny import tiny_sd_pipeline, tiny_unet

    g = torch.Generator().manual_seed(0)
    state = {}
    for module_name, module in tiny_unet().named_modules():
        if module_name.endswith(("to_q", "to_k", "to_v", "to_out.0")):
            state[f"unet.{module_name}.lora_A.weight"] = torch.randn(2, module.in_features, generator=g)  # fmt: skip
            state[f"unet.{module_name}.lora_B.weight"] = torch.randn(module.out_features, 2, generator=g)  # fmt: skip
    pipe = tiny_sd_pipeline()
    pipe.load_lora_weights(state, adapter_name="lcm")
    assert pipe.unet.config.time_cond_proj_dim is None
    assert "lcm" in pipe.unet.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_q.lora_A
    calls = run_sd_family(pipe, {}, record_calls, guidance_scale=1.5)
    assert len(calls) == 2
    assert all(args[0].shape[0] == 2 and kwargs["timestep_cond"] is None for args, kwargs in calls)


def test_dpm_solver_orders():
    """`DPMSolverMultistepScheduler`'s update order at 4 steps is 1, 2, 2, 1 with the default `final_sigmas_type="zero"`, and at 2 steps 1, 1: DDIM with `set_alpha_to_one=True` on the same grid (the same samples to 1e-5 on the trailing grid, given the same `noise_pred`); into sigma 0 the last step is first order whatever the step count and `lower_order_final` (checked at 15 steps and with `lower_order_final=False`); with `final_sigmas_type="sigma_min"` the last step is first order under the default `lower_order_final=True` below 15 steps and second order from 15, and with `lower_order_final=False` it is second order unless `euler_at_final=True`."""
    assert orders_used(4) == [1, 2, 2, 1]
    assert orders_used(2) == [1, 1]
    dpm = DPMSolverMultistepScheduler(**SD_BETAS, timestep_spacing="trailing")
    ddim = DDIMScheduler(**SD_BETAS, timestep_spacing="trailing", set_alpha_to_one=True, clip_sample=False)  # fmt: skip
    dpm.set_timesteps(2)
    ddim.set_timesteps(2)
    assert dpm.timesteps.tolist() == ddim.timesteps.tolist() == [999, 499]
    x_dpm = x_ddim = torch.randn(8, 2, generator=torch.Generator().manual_seed(0))
    for t in ddim.timesteps:
        noise_pred = torch.tanh(x_ddim) + 0.3  # any function of x_t: the same output for both
        x_dpm = dpm.step(torch.tanh(x_dpm) + 0.3, t, x_dpm).prev_sample
        x_ddim = ddim.step(noise_pred, t, x_ddim).prev_sample
    torch.testing.assert_close(x_dpm, x_ddim, atol=1e-5, rtol=1e-5)
    assert orders_used(14, final_sigmas_type="sigma_min")[-1] == 1
    assert orders_used(15, final_sigmas_type="sigma_min")[-1] == 2
    assert orders_used(15)[-1] == 1  # into sigma 0: first order at any step count
    assert orders_used(15, lower_order_final=False)[-1] == 1  # ... and without lower_order_final
    assert orders_used(4, final_sigmas_type="sigma_min", lower_order_final=False)[-1] == 2
    assert orders_used(4, final_sigmas_type="sigma_min", lower_order_final=False, euler_at_final=True)[-1] == 1  # fmt: skip


def counted(fn, log):
    """``fn`` that appends 1 to ``log`` at each call."""
    return lambda *args, **kwargs: log.append(1) or fn(*args, **kwargs)


def test_each_rule_one_call_per_step(record_calls, monkeypatch):
    """Each rule makes one call per step: `StableDiffusionPipeline.__call__` at 4 steps with guidance on, its `DDIMScheduler` swapped by `from_config` for `EulerDiscreteScheduler`, `DPMSolverMultistepScheduler`, `LCMScheduler` or `TCDScheduler` (or kept), calls its UNet 4 times on the doubled batch, one call per `scheduler.step`; DPM-Solver++ 2M's two second-order updates among them reuse the previous step's `x0_hat` instead of an extra call."""
    pipe = tiny_sd_pipeline()
    base = pipe.scheduler.config
    rules = (DDIMScheduler, EulerDiscreteScheduler, DPMSolverMultistepScheduler, LCMScheduler, TCDScheduler)  # fmt: skip
    for cls in rules:
        pipe.scheduler = scheduler = cls.from_config(base)
        steps, second = [], []
        monkeypatch.setattr(scheduler, "step", counted(scheduler.step, steps))
        if cls is DPMSolverMultistepScheduler:
            update = "multistep_dpm_solver_second_order_update"
            monkeypatch.setattr(scheduler, update, counted(getattr(scheduler, update), second))
        recorder = record_calls(pipe.unet)
        with torch.no_grad():
            pipe(prompt_embeds=embeds(1), negative_prompt_embeds=embeds(2), latents=start_latents(),
                 num_inference_steps=4, guidance_scale=7.5, height=HEIGHT, width=HEIGHT, output_type="latent")  # fmt: skip
        recorder.remove()
        assert len(recorder.calls) == len(steps) == 4, cls.__name__
        assert all(args[0].shape[0] == 2 for args, _ in recorder.calls), cls.__name__
        assert len(second) == (2 if cls is DPMSolverMultistepScheduler else 0), cls.__name__
        monkeypatch.undo()


def test_euler_is_ddim_in_other_coordinates():
    """`EulerDiscreteScheduler.step` is `DDIMScheduler`'s step in other coordinates: on the same trailing grid, started from DDIM's latents divided by sqrt(alpha_bar_999) and given the same `noise_pred` at each step, its latents stay DDIM's (`set_alpha_to_one=True`) divided by sqrt(alpha_bar_t), `scale_model_input` hands the model DDIM's latents, and both end on the same sample."""
    euler = EulerDiscreteScheduler(**SD_BETAS, timestep_spacing="trailing")
    ddim = DDIMScheduler(**SD_BETAS, timestep_spacing="trailing", clip_sample=False, set_alpha_to_one=True)  # fmt: skip
    euler.set_timesteps(4)
    ddim.set_timesteps(4)
    assert [int(t) for t in euler.timesteps] == ddim.timesteps.tolist() == [999, 749, 499, 249]
    ab = ddim.alphas_cumprod.double()
    noise = torch.randn(8, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x_ddim, x_euler = noise.clone(), noise / ab[999].sqrt()
    for t_euler, t in zip(euler.timesteps, ddim.timesteps, strict=True):
        torch.testing.assert_close(x_euler * ab[t].sqrt(), x_ddim, atol=1e-5, rtol=1e-5)
        model_input = euler.scale_model_input(x_euler, t_euler)
        torch.testing.assert_close(model_input, x_ddim, atol=1e-5, rtol=1e-5)
        noise_pred = torch.tanh(x_ddim) + 0.3  # any function of x_t: the same output for both
        x_euler = euler.step(noise_pred, t_euler, x_euler).prev_sample
        x_ddim = ddim.step(noise_pred, t, x_ddim).prev_sample
    torch.testing.assert_close(x_euler, x_ddim, atol=1e-5, rtol=1e-5)


def test_lcm_step():
    """`LCMScheduler` at 4 steps visits 999, 759, 499, 259 of its 50-entry distillation grid; `c_skip` is below 1e-5 at every timestep LCM visits at 1 to 50 steps, so `denoised` is the model's x0 prediction; every step but the last re-noises with fresh noise (two generators give two `prev_sample` from one `denoised`), and the last returns `denoised`."""
    scheduler = LCMScheduler(**SD_BETAS)
    for n in range(1, scheduler.config.original_inference_steps + 1):
        scheduler.set_timesteps(n)
        assert all(scheduler.get_scalings_for_boundary_condition_discrete(int(t))[0] < 1e-5 for t in scheduler.timesteps), n  # fmt: skip
    outs = []
    for seed in (0, 1):
        scheduler = LCMScheduler(**SD_BETAS)
        scheduler.set_timesteps(4)
        assert scheduler.timesteps.tolist() == [999, 759, 499, 259]
        sample = torch.ones(4, 2)
        out = scheduler.step(torch.zeros(4, 2), scheduler.timesteps[0], sample, generator=torch.Generator().manual_seed(seed))  # fmt: skip
        outs.append(out)
        for t in scheduler.timesteps[1:]:
            last = scheduler.step(torch.zeros(4, 2), t, out.prev_sample, generator=torch.Generator().manual_seed(seed))  # fmt: skip
            out = last
        assert torch.equal(last.prev_sample, last.denoised)
    torch.testing.assert_close(outs[0].denoised, outs[1].denoised)
    assert not torch.allclose(outs[0].prev_sample, outs[1].prev_sample)


def tcd_pipeline_run(name, monkeypatch, seed, **kwargs):
    """(latents, etas): one 4-step call of tiny SD or SDXL with a `TCDScheduler`, ``guidance_scale=0``
    (as TCD's card), the ``eta`` every ``scheduler.step`` call receives recorded by a spy."""
    scheduler = TCDScheduler(**SD_SCHEDULER)  # SD 1.x's steps_offset=1: else a warning
    if name == "StableDiffusionPipeline":
        pipe, extra = tiny_sd_pipeline(scheduler=scheduler), {}
    else:
        pipe = tiny_sdxl_pipeline(scheduler, unet=tiny_text_time_unet())
        extra = dict(pooled_prompt_embeds=torch.randn(1, POOLED_DIM, generator=torch.Generator().manual_seed(3)))  # fmt: skip
    etas = spy_step_kwarg(monkeypatch, pipe.scheduler, "eta")
    with torch.no_grad():
        latents = pipe(prompt_embeds=embeds(1), guidance_scale=0.0, num_inference_steps=4,
                       latents=start_latents(), height=HEIGHT, width=HEIGHT, output_type="latent",
                       generator=torch.Generator().manual_seed(seed), **extra, **kwargs).images  # fmt: skip
    return latents, etas


@pytest.mark.parametrize("name", SD_FAMILY)
def test_tcd_eta_through_the_pipeline(name, monkeypatch):
    """`TCDScheduler.step` alone defaults to `eta=0.3`, but `StableDiffusionPipeline` and `StableDiffusionXLPipeline` pass their own `eta=0.0` to it, so a TCD checkpoint needs `eta=0.3` passed to `pipe(...)`: without it every step is the deterministic `eta=0` jump (two generators give the same latents); with it each step gets 0.3 and re-noises with the generator's noise. `eta=0` is DDIM's jump to the next timestep."""
    plain = [tcd_pipeline_run(name, monkeypatch, seed)[0] for seed in (0, 1)]
    _, etas = tcd_pipeline_run(name, monkeypatch, 0)
    assert etas == [0.0] * 4
    torch.testing.assert_close(plain[0], plain[1], rtol=0, atol=0)
    runs = [tcd_pipeline_run(name, monkeypatch, seed, eta=0.3) for seed in (0, 1)]
    assert runs[0][1] == [0.3] * 4
    assert not torch.allclose(runs[0][0], runs[1][0])
    # the scheduler's own default, observed: step without eta is step with eta=0.3
    outs = []
    for kwargs in ({}, dict(eta=0.3)):
        scheduler = TCDScheduler(**SD_BETAS)
        scheduler.set_timesteps(4)
        x, eps = torch.ones(3, 2), torch.full((3, 2), 0.5)
        outs.append(scheduler.step(eps, scheduler.timesteps[0], x, generator=torch.Generator().manual_seed(5), **kwargs).prev_sample)  # fmt: skip
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    scheduler = TCDScheduler(**SD_BETAS)
    scheduler.set_timesteps(4)
    t, t_next = (int(x) for x in scheduler.timesteps[:2])
    ab = scheduler.alphas_cumprod.double()
    x, eps = torch.ones(3, 2, dtype=torch.float64), torch.full((3, 2), 0.5, dtype=torch.float64)
    x0 = (x - (1 - ab[t]).sqrt() * eps) / ab[t].sqrt()
    out = scheduler.step(eps.float(), t, x.float(), eta=0.0).prev_sample
    torch.testing.assert_close(out.double(), ab[t_next].sqrt() * x0 + (1 - ab[t_next]).sqrt() * eps, atol=1e-5, rtol=1e-5)  # fmt: skip


def test_flow_match_step():
    """`FlowMatchEulerDiscreteScheduler.step` returns `sample + (sigma_next - sigma) * model_output`."""
    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(4)
    x, v = torch.randn(3, 2), torch.randn(3, 2)
    out = scheduler.step(v, scheduler.timesteps[0], x).prev_sample
    torch.testing.assert_close(out, x + (scheduler.sigmas[1] - scheduler.sigmas[0]) * v)


def test_calculate_shift():
    """`calculate_shift` gives mu = 0.500 at 256 tokens, 1.150 at 4096 and 3.230 at 16384; `FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)`, given the pipeline's `np.linspace(1.0, 1 / 28, 28)` and that mu, maps sigma to `exp(mu) / (exp(mu) + (1 / sigma - 1))`, which puts the middle of the 28-step grid at 0.622, 0.760 and 0.962, and it raises `ValueError` without `mu`."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    with pytest.raises(ValueError):
        scheduler.set_timesteps(28)
    for tokens, mu, middle in [(256, 0.5, 0.622), (4096, 1.15, 0.760), (16384, 3.23, 0.962)]:
        assert calculate_shift(tokens) == pytest.approx(mu, abs=5e-4)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / 28, 28), mu=calculate_shift(tokens))
        assert float(scheduler.sigmas[14]) == pytest.approx(middle, abs=5e-4)
        s = np.linspace(1.0, 1 / 28, 28)
        expected = np.exp(calculate_shift(tokens)) / (np.exp(calculate_shift(tokens)) + (1 / s - 1))
        np.testing.assert_allclose(scheduler.sigmas[:-1].numpy(), expected, rtol=1e-6)


def test_flux_pipeline_grid(record_calls, monkeypatch):
    """`FluxPipeline.__call__` by default passes `sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)` and `mu = calculate_shift(image_seq_len, ...)`, with `image_seq_len` the packed token count the transformer sees, to the scheduler's `set_timesteps`; the scheduler uses `mu` only when its config sets `use_dynamic_shifting=True`: with `use_dynamic_shifting=False` and `shift=1.0` the transformer gets the unshifted linspace."""
    from diffusers.pipelines.flux import pipeline_flux

    for config in ({}, dict(use_dynamic_shifting=False, shift=1.0)):
        pipe = tiny_flux_pipeline(vae_config=FLUX_VAE_FACTORS, **config)
        seen = spy_set_timesteps(pipe, monkeypatch)
        _, calls = flux_image_and_calls(pipe, record_calls)
        (kwargs,) = seen
        sigmas = np.linspace(1.0, 1 / 2, 2)
        np.testing.assert_allclose(kwargs["sigmas"], sigmas)
        tokens = calls[0][1]["hidden_states"].shape[1]
        mu = pipeline_flux.calculate_shift(tokens)
        assert kwargs["mu"] == pytest.approx(mu)
        used = np.array([float(kw["timestep"][0]) for _, kw in calls])  # timestep / 1000 = sigma
        if config:
            np.testing.assert_allclose(used, sigmas, rtol=1e-6)
        else:
            np.testing.assert_allclose(used, np.exp(mu) / (np.exp(mu) + (1 / sigmas - 1)), rtol=1e-6)  # fmt: skip
        monkeypatch.undo()
    seen = spy_set_timesteps(pipe, monkeypatch)  # a user's sigmas= replace the default linspace
    flux_image_and_calls(pipe, record_calls, sigmas=[1.0, 0.3])
    np.testing.assert_allclose(seen[0]["sigmas"], [1.0, 0.3])


def test_guidance_scale_without_guidance_embeds(record_calls):
    """With a transformer built with `guidance_embeds=False`, `FluxPipeline` passes `guidance=None`: `guidance_scale` 0.0 and 3.5 give the same image, at one transformer call per step on the un-doubled batch."""
    pipe = tiny_flux_pipeline(
        vae_config=FLUX_VAE_FACTORS, guidance_embeds=False, use_dynamic_shifting=False, shift=1.0
    )
    a, calls_a = flux_image_and_calls(pipe, record_calls, guidance_scale=0.0)
    b, calls_b = flux_image_and_calls(pipe, record_calls, guidance_scale=3.5)
    assert len(calls_a) == len(calls_b) == 2
    assert all(kw["guidance"] is None and kw["hidden_states"].shape[0] == 1 for _, kw in calls_a + calls_b)  # fmt: skip
    np.testing.assert_array_equal(a, b)


def test_flux_dev_is_guidance_distilled(record_calls):
    """Flux.1-dev's transformer config has `guidance_embeds=True` (BFL's `guidance_embed=True`), which gives `FluxTransformer2DModel` a guidance embedder (`CombinedTimestepGuidanceTextProjEmbeddings`), and `FluxPipeline` defaults to `num_inference_steps=28`, `guidance_scale=3.5` and a `true_cfg_scale` of at most 1: with a negative prompt given, 28 transformer calls, one per step, each with the embedded guidance 3.5."""
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from model_configs import FLUX_DEV_ORIGINAL, FLUX_DEV_TRANSFORMER

    assert FLUX_DEV_ORIGINAL["guidance_embed"] is FLUX_DEV_TRANSFORMER["guidance_embeds"] is True
    with torch.device("meta"):
        dev = FluxTransformer2DModel(**FLUX_DEV_TRANSFORMER)
        schnell = FluxTransformer2DModel(**{**FLUX_DEV_TRANSFORMER, "guidance_embeds": False})
    assert type(dev.time_text_embed).__name__ == "CombinedTimestepGuidanceTextProjEmbeddings"
    assert type(schnell.time_text_embed).__name__ == "CombinedTimestepTextProjEmbeddings"
    # the defaults, observed: 28 steps; with a negative prompt given, one call per step
    # (true_cfg_scale at most 1) and the embedded guidance is 3.5
    pipe = tiny_flux_pipeline(vae_config=FLUX_VAE_FACTORS)
    g = torch.Generator().manual_seed(0)
    text, pooled = torch.randn(1, 8, 32, generator=g), torch.randn(1, 32, generator=g)
    embeds = dict(prompt_embeds=text, pooled_prompt_embeds=pooled, negative_prompt_embeds=text, negative_pooled_prompt_embeds=pooled)  # fmt: skip
    recorder = record_calls(pipe.transformer)
    with torch.no_grad():
        pipe(**embeds, height=HEIGHT, width=HEIGHT, output_type="latent")  # fmt: skip
    assert isinstance(pipe, FluxPipeline) and len(recorder.calls) == 28
    assert all(float(kw["guidance"][0]) == 3.5 for _, kw in recorder.calls)


def test_embedded_guidance_against_true_cfg(record_calls, monkeypatch):
    """On a tiny guidance-embedding `FluxPipeline`, `guidance_scale` changes the image at one transformer call per step, and `true_cfg_scale > 1` with a negative prompt makes two calls per step, both with the embedded guidance, and steps with `neg_noise_pred + true_cfg_scale * (noise_pred - neg_noise_pred)`."""
    pipe = tiny_flux_pipeline(
        vae_config=FLUX_VAE_FACTORS,
    )
    a, calls_a = flux_image_and_calls(pipe, record_calls, guidance_scale=1.0)
    b, calls_b = flux_image_and_calls(pipe, record_calls, guidance_scale=3.5)
    assert len(calls_a) == len(calls_b) == 2 and np.abs(a - b).max() > 1e-4
    assert calls_a[0][1]["hidden_states"].shape[:2] == (1, (HEIGHT // 4) ** 2)
    g = torch.Generator().manual_seed(2)
    negative = dict(
        negative_prompt_embeds=torch.randn(1, 8, 32, generator=g),
        negative_pooled_prompt_embeds=torch.randn(1, 32, generator=g),
    )
    outputs, steps = [], []
    hook = pipe.transformer.register_forward_hook(lambda m, a, out: outputs.append(out[0].clone()))
    step = pipe.scheduler.step
    monkeypatch.setattr(pipe.scheduler, "step", lambda out, t, x, **kw: steps.append(out.clone()) or step(out, t, x, **kw))  # fmt: skip
    try:
        _, calls = flux_image_and_calls(
            pipe, record_calls, true_cfg_scale=4.0, guidance_scale=3.5, **negative
        )
    finally:
        hook.remove()
    assert len(calls) == 4 and all(kwargs["guidance"].tolist() == [3.5] for _, kwargs in calls)
    for k, model_output in enumerate(steps):
        cond, neg = outputs[2 * k], outputs[2 * k + 1]
        torch.testing.assert_close(model_output, neg + 4.0 * (cond - neg))


def test_zero_snr_rules_out_epsilon():
    """With `rescale_betas_zero_snr=True` and SD's `clip_sample=False`, `DDIMScheduler.step` at t = 999 returns NaN or inf for an epsilon model (the exact epsilon, x_999 itself, gives 0 / 0) and, for `prediction_type="v_prediction"`, the finite x0 prediction -v (for `sample`, the output itself)."""
    x = torch.randn(4, 2, generator=torch.Generator().manual_seed(0))
    v = torch.randn(4, 2, generator=torch.Generator().manual_seed(1))

    def step(prediction_type, model_output):
        scheduler = DDIMScheduler(**SD_BETAS, rescale_betas_zero_snr=True, prediction_type=prediction_type, timestep_spacing="trailing", clip_sample=False)  # fmt: skip
        scheduler.set_timesteps(4)
        assert int(scheduler.timesteps[0]) == 999 and float(scheduler.alphas_cumprod[999]) == 0.0
        return scheduler.step(model_output, 999, x).pred_original_sample

    assert step("epsilon", x).isnan().all()
    assert step("epsilon", 0.9 * x).isinf().all()
    torch.testing.assert_close(step("v_prediction", v), -v)
    torch.testing.assert_close(step("sample", v), v)


def test_fixed_shift_is_the_dynamic_shift_at_exp_mu():
    """`FlowMatchEulerDiscreteScheduler`'s fixed `shift` maps sigma to `shift * sigma / (1 + (shift - 1) * sigma)`, the same map as `use_dynamic_shifting=True` with `shift = exp(mu)`."""
    s = np.linspace(1.0, 1 / 28, 28)
    fixed = FlowMatchEulerDiscreteScheduler(shift=3.0)
    fixed.set_timesteps(sigmas=s)
    np.testing.assert_allclose(fixed.sigmas[:-1].numpy(), 3.0 * s / (1 + 2.0 * s), rtol=1e-6)
    dynamic = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    dynamic.set_timesteps(sigmas=s, mu=float(np.log(3.0)))
    np.testing.assert_allclose(dynamic.sigmas.numpy(), fixed.sigmas.numpy(), rtol=1e-5)


def test_tcd_set_timesteps_ignores_timestep_spacing():
    """`TCDScheduler.set_timesteps` ignores `timestep_spacing`: built with `"leading"` (its default), `"trailing"` or `"linspace"`, it takes the same n evenly spaced picks from its 50-entry grid (`original_inference_steps=50`) at 1, 2, 4 and 8 steps: 999 at one step, 999, 759, 499, 259 at four."""
    grids = {}
    for spacing in ("leading", "trailing", "linspace"):
        scheduler = TCDScheduler(**SD_BETAS, timestep_spacing=spacing)
        assert scheduler.config.original_inference_steps == 50
        grids[spacing] = []
        for n in (1, 2, 4, 8):
            scheduler.set_timesteps(n)
            grids[spacing].append(scheduler.timesteps.tolist())
    assert grids["leading"] == grids["trailing"] == grids["linspace"]
    assert grids["trailing"][0] == [999] and grids["trailing"][2] == [999, 759, 499, 259]


def test_distilled_checkpoints_scheduler_settings(record_calls):
    """The scheduler settings the distilled checkpoints' cards name do what the table says in diffusers: `EulerDiscreteScheduler(timestep_spacing="trailing")` (SDXL-Lightning) and `DDIMScheduler(timestep_spacing="trailing")` (Hyper-SD) visit 999, 749, 499, 249 at 4 steps; `StableDiffusionXLPipeline` with `LCMScheduler` and `timesteps=[999, 749, 499, 249]` (DMD2's 4-step UNet) or `timesteps=[399]` (its 1-step UNet) calls the UNet at exactly those timesteps; `LCMScheduler` and `TCDScheduler` default to `original_inference_steps=50`; `SanaSprintPipeline.__call__` with its defaults sets its `SCMScheduler` (`prediction_type="trigflow"`) to step from `max_timesteps=1.5708` through `intermediate_timesteps=1.3` to 0."""
    from diffusers import SCMScheduler

    trailing = [999, 749, 499, 249]
    for cls in (EulerDiscreteScheduler, DDIMScheduler):
        assert timestep_grid(cls, "trailing", 4) == trailing, cls.__name__
    g = torch.Generator().manual_seed(3)
    pooled = torch.randn(1, POOLED_DIM, generator=g)
    pipe = tiny_sdxl_pipeline(LCMScheduler(**SD_BETAS), unet=tiny_text_time_unet())
    for timesteps in (trailing, [399]):
        recorder = record_calls(pipe.unet)
        with torch.no_grad():
            pipe(prompt_embeds=embeds(1), pooled_prompt_embeds=pooled, guidance_scale=0.0,
                 num_inference_steps=len(timesteps), timesteps=timesteps, latents=start_latents(),
                 height=HEIGHT, width=HEIGHT, output_type="latent")  # fmt: skip
        recorder.remove()
        assert [int(args[1]) for args, _ in recorder.calls] == timesteps
    for cls in (LCMScheduler, TCDScheduler):
        assert cls().config.original_inference_steps == 50
    sana = tiny_sana_sprint_pipeline()  # its default call: SCMScheduler, 2 steps
    assert isinstance(sana.scheduler, SCMScheduler) and sana.scheduler.config.prediction_type == "trigflow"  # fmt: skip
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        sana(prompt_embeds=torch.randn(1, 5, 8, generator=g), prompt_attention_mask=torch.ones(1, 5),
             height=32, width=32, use_resolution_binning=False, output_type="latent")  # fmt: skip
    torch.testing.assert_close(sana.scheduler.timesteps, torch.tensor([1.5708, 1.3, 0.0]))


def tiny_sana_sprint_pipeline():
    """The real SanaSprintPipeline around a one-layer `SanaTransformer2DModel` with
    `guidance_embeds=True` (4 latent channels, 8-wide captions) and a two-block
    `AutoencoderDC` (vae_scale_factor 2), SCMScheduler's defaults; no text encoder or
    tokenizer: pass ``prompt_embeds`` (B, N, 8) and ``prompt_attention_mask`` (B, N)."""
    from diffusers import AutoencoderDC, SanaSprintPipeline, SanaTransformer2DModel, SCMScheduler

    torch.manual_seed(0)
    transformer = SanaTransformer2DModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=1, num_attention_heads=2,
        attention_head_dim=4, num_cross_attention_heads=2, cross_attention_head_dim=4,
        cross_attention_dim=8, caption_channels=8, sample_size=32,
        qk_norm="rms_norm_across_heads", guidance_embeds=True,
    ).eval()  # fmt: skip
    vae = AutoencoderDC(
        in_channels=3, latent_channels=4, attention_head_dim=2,
        encoder_block_types=("ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "EfficientViTBlock"),
        encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8),
        encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
        encoder_layers_per_block=(1, 1), decoder_layers_per_block=(1, 1),
        downsample_block_type="conv", upsample_block_type="interpolate",
    ).eval()  # fmt: skip
    pipe = SanaSprintPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer, scheduler=SCMScheduler())  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_sana_sprint_guidance_is_embedded(record_calls):
    """`SanaSprintPipeline.__call__` with its defaults (`num_inference_steps=2`, `guidance_scale=4.5`) makes one transformer call per step on the un-doubled batch, each passed `guidance = guidance_scale * transformer.config.guidance_embeds_scale` (0.45 at the default 0.1), which the transformer embeds with the timestep: a different `guidance_scale` changes the image at the same number of calls."""
    pipe = tiny_sana_sprint_pipeline()
    g = torch.Generator().manual_seed(0)
    prompt_embeds, mask = torch.randn(1, 5, 8, generator=g), torch.ones(1, 5)

    def run(**kwargs):
        recorder = record_calls(pipe.transformer)
        with torch.no_grad():
            image = pipe(prompt_embeds=prompt_embeds, prompt_attention_mask=mask, height=32,
                         width=32, use_resolution_binning=False, output_type="pt",
                         generator=torch.Generator().manual_seed(0), **kwargs).images  # fmt: skip
        recorder.remove()
        return image, recorder.calls

    image, calls = run()  # the pipeline's defaults
    assert len(calls) == 2
    for args, kwargs in calls:
        assert args[0].shape[0] == 1 and kwargs["encoder_hidden_states"].shape[0] == 1
        torch.testing.assert_close(kwargs["guidance"], torch.tensor([0.45]))
    other, calls = run(guidance_scale=2.0)
    assert len(calls) == 2
    torch.testing.assert_close(calls[0][1]["guidance"], torch.tensor([0.2]))
    assert not torch.allclose(image, other)


def test_unet_time_cond_proj_consumes_timestep_cond():
    """A `UNet2DConditionModel` built with `time_cond_proj_dim` adds a linear projection of `timestep_cond` to its timestep embedding (`time_embedding.cond_proj`, called once per forward with the `(B, time_cond_proj_dim)` tensor), so a different guidance embedding changes `noise_pred`; without `time_cond_proj_dim` there is no `cond_proj`."""
    unet = tiny_unet(time_cond_proj_dim=8)
    seen = []
    unet.time_embedding.cond_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    sample, prompt_embeds = start_latents(), embeds(0)
    w_embedding = torch.randn(
        1, 8, generator=torch.Generator().manual_seed(4)
    )  # any (B, 8) embedding
    with torch.no_grad():
        a = unet(sample, 999, prompt_embeds, timestep_cond=w_embedding).sample
        b = unet(sample, 999, prompt_embeds, timestep_cond=2 * w_embedding).sample
    assert len(seen) == 2 and torch.equal(seen[0], w_embedding) and seen[0].shape == (1, 8)
    assert not torch.allclose(a, b)
    assert tiny_unet().time_embedding.cond_proj is None


def test_text_encoding_and_decode_run_once_per_call_not_per_step(record_calls):
    """Text encoding (two calls with SD 1.5's CFG) and the VAE decode run per call, not per step: `StableDiffusionPipeline` with two prompts and guidance on calls its text encoder twice (prompts, then negative prompts, two rows each) and its VAE decoder once (two rows) at 4 steps and at 8, while the UNet calls follow the steps."""
    from tiny import WIDTH, sd_with, tiny_text_encoder, tiny_tokenizer

    pipe = sd_with(tiny_sd_pipeline(), text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer())
    for steps in (4, 8):
        encoder, unet = record_calls(pipe.text_encoder), record_calls(pipe.unet)
        decoder = record_calls(pipe.vae.decoder)
        with torch.no_grad():
            pipe(["a cat", "a dog"], guidance_scale=7.5, num_inference_steps=steps,
                 height=HEIGHT, width=WIDTH, output_type="pt")  # fmt: skip
        assert [args[0].shape[0] for args, _ in encoder.calls] == [2, 2]
        assert [args[0].shape[0] for args, _ in decoder.calls] == [2]
        assert len(unet.calls) == steps
        for recorder in (encoder, unet, decoder):
            recorder.remove()


def test_time_cond_proj_dim_keeps_the_teachers_size():
    """Weight bytes barely change: on the meta device, SD 1.5's and SDXL's `UNet2DConditionModel` configs with `time_cond_proj_dim=256` (a full LCM UNet's guidance input) add only `time_embedding.cond_proj`, 81,920 parameters, against SD 1.5's 859,520,964."""
    from diffusers import UNet2DConditionModel
    from model_configs import SD15_UNET, SDXL_UNET

    for config in (SD15_UNET, SDXL_UNET):
        with torch.device("meta"):
            teacher = UNet2DConditionModel(**config)
            lcm = UNet2DConditionModel(**{**config, "time_cond_proj_dim": 256})
        before = {name: p.numel() for name, p in teacher.named_parameters()}
        after = {name: p.numel() for name, p in lcm.named_parameters()}
        assert set(after) - set(before) == {"time_embedding.cond_proj.weight"}
        assert sum(after.values()) - sum(before.values()) == 81_920
        if config is SD15_UNET:
            assert sum(before.values()) == 859_520_964


def test_tcd_last_step_does_not_renoise():
    """`TCDScheduler.step` re-noises from s to `t_next` with fresh noise, except at the last step: at `eta=0.3` and at `eta=1.0`, every step before the last of 4 gives two generators two `prev_sample`, and the last step, of 4 or of a 1-step run, returns `pred_noised_sample`, the same from two generators."""
    x = torch.randn(4, 2, generator=torch.Generator().manual_seed(0))
    eps = torch.randn(4, 2, generator=torch.Generator().manual_seed(1))
    for eta in (0.3, 1.0):
        for n in (1, 4):
            runs = []
            for seed in (0, 1):
                scheduler = TCDScheduler(**SD_BETAS)
                scheduler.set_timesteps(n)
                outs = [scheduler.step(eps, t, x, eta=eta, generator=torch.Generator().manual_seed(seed)) for t in scheduler.timesteps]  # fmt: skip
                torch.testing.assert_close(outs[-1].prev_sample, outs[-1].pred_noised_sample, rtol=0, atol=0)  # fmt: skip
                runs.append(outs)
            for a, b in zip(runs[0][:-1], runs[1][:-1], strict=True):  # fresh noise before the last
                assert not torch.allclose(a.prev_sample, b.prev_sample), (eta, n)
            torch.testing.assert_close(runs[0][-1].prev_sample, runs[1][-1].prev_sample, rtol=0, atol=0)  # fmt: skip
