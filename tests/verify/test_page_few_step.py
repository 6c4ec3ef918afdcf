"""The few-step sampling and distillation page against the installed diffusers.

The schedulers are the real classes with SD 1.x's betas; the Flux checks reuse the tiny
``FluxPipeline`` of Lab 13's verify module (a guidance-embedding ``FluxTransformer2DModel``
and a 16-channel ``AutoencoderKL`` built in code, no text encoders, no weights).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    LCMScheduler,
    TCDScheduler,
)
from test_page_lab_13 import HEIGHT, orders_used, run_flux, tiny_flux_pipeline

SD_BETAS = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)


def grid(cls, spacing, n):
    offset = 1 if spacing == "leading" else 0
    scheduler = cls(**SD_BETAS, timestep_spacing=spacing, steps_offset=offset)
    scheduler.set_timesteps(n)
    return scheduler.timesteps.tolist()


def test_leading_never_starts_at_the_noisiest_timestep():
    """With `steps_offset=1`, `leading` gives `DDIMScheduler` 751, 501, 251, 1 at 4 steps and 1 at one step, and `DPMSolverMultistepScheduler` 801, 601, 401, 201 at 4 steps; `trailing` gives both 999, 749, 499, 249 and 999."""
    assert grid(DDIMScheduler, "leading", 4) == [751, 501, 251, 1]
    assert grid(DDIMScheduler, "leading", 1) == [1]
    assert grid(DPMSolverMultistepScheduler, "leading", 4) == [801, 601, 401, 201]
    for cls in (DDIMScheduler, DPMSolverMultistepScheduler):
        assert grid(cls, "trailing", 4) == [999, 749, 499, 249]
        assert grid(cls, "trailing", 1) == [999]


@pytest.mark.parametrize(
    "cls, last",
    [
        (DDIMScheduler, 0.0),
        (DDPMScheduler, 0.0),
        (LCMScheduler, 0.0),
        (TCDScheduler, 0.0),
        (EulerDiscreteScheduler, 2**-24),
        (DPMSolverMultistepScheduler, 2**-24),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_rescale_betas_zero_snr(cls, last):
    """`rescale_betas_zero_snr=True` is accepted by `DDIMScheduler`, `DDPMScheduler`, `EulerDiscreteScheduler`, `DPMSolverMultistepScheduler`, `LCMScheduler` and `TCDScheduler`; it makes SD's `alphas_cumprod[-1]` (4.66e-03 without it) 0, and the Euler and DPM-Solver++ schedulers then set it to `2**-24`."""
    plain = cls(**SD_BETAS)
    assert float(plain.alphas_cumprod[-1]) == pytest.approx(4.66e-03, abs=5e-6)
    rescaled = cls(**SD_BETAS, rescale_betas_zero_snr=True)
    assert float(rescaled.alphas_cumprod[-1]) == pytest.approx(last, abs=1e-9)
    assert float(rescaled.alphas_cumprod[0]) == pytest.approx(float(plain.alphas_cumprod[0]), rel=1e-5)  # fmt: skip


@pytest.mark.parametrize(
    "module, name",
    [
        ("stable_diffusion.pipeline_stable_diffusion", "StableDiffusionPipeline"),
        ("stable_diffusion_xl.pipeline_stable_diffusion_xl", "StableDiffusionXLPipeline"),
    ],
)
def test_guidance_rescale(module, name):
    """`StableDiffusionPipeline` and `StableDiffusionXLPipeline` take `guidance_rescale` (default 0.0) and, only while guiding, pass the guided `noise_pred` through `rescale_noise_cfg`, which rescales it to the per-sample std of `noise_pred_text` and returns `guidance_rescale * rescaled + (1 - guidance_rescale) * guided`."""
    import importlib

    mod = importlib.import_module(f"diffusers.pipelines.{module}")
    pipeline = getattr(mod, name)
    assert inspect.signature(pipeline.__call__).parameters["guidance_rescale"].default == 0.0
    source = inspect.getsource(pipeline.__call__)
    assert "if self.do_classifier_free_guidance and self.guidance_rescale > 0.0:" in source
    g = torch.Generator().manual_seed(0)
    text, uncond = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 4, 8, 8, generator=g)
    guided = uncond + 7.5 * (text - uncond)
    rescaled = guided * text.std(dim=(1, 2, 3), keepdim=True) / guided.std(dim=(1, 2, 3), keepdim=True)  # fmt: skip
    out = mod.rescale_noise_cfg(guided, text, guidance_rescale=0.7)
    torch.testing.assert_close(out, 0.7 * rescaled + 0.3 * guided)


def test_dpm_solver_orders():
    """`DPMSolverMultistepScheduler`'s update order at 4 steps is 1, 2, 2, 1 with the default `final_sigmas_type="zero"`, and at 2 steps 1, 1 (DDIM); with `final_sigmas_type="sigma_min"` and `lower_order_final=False` the last step is second order unless `euler_at_final=True`."""
    assert orders_used(4) == [1, 2, 2, 1]
    assert orders_used(2) == [1, 1]
    assert orders_used(4, final_sigmas_type="sigma_min", lower_order_final=False)[-1] == 2
    assert orders_used(4, final_sigmas_type="sigma_min", lower_order_final=False, euler_at_final=True)[-1] == 1  # fmt: skip


def test_lcm_step():
    """`LCMScheduler` at 4 steps visits 999, 759, 499, 259 of its 50-entry distillation grid; `c_skip` is below 1e-5 at each, so `denoised` is the model's x0 prediction; every step but the last re-noises with fresh noise (two generators give two `prev_sample` from one `denoised`), and the last returns `denoised`."""
    outs = []
    for seed in (0, 1):
        scheduler = LCMScheduler(**SD_BETAS)
        scheduler.set_timesteps(4)
        assert scheduler.timesteps.tolist() == [999, 759, 499, 259]
        assert all(scheduler.get_scalings_for_boundary_condition_discrete(int(t))[0] < 1e-5 for t in scheduler.timesteps)  # fmt: skip
        sample = torch.ones(4, 2)
        out = scheduler.step(torch.zeros(4, 2), scheduler.timesteps[0], sample, generator=torch.Generator().manual_seed(seed))  # fmt: skip
        outs.append(out)
        for t in scheduler.timesteps[1:]:
            last = scheduler.step(torch.zeros(4, 2), t, out.prev_sample, generator=torch.Generator().manual_seed(seed))  # fmt: skip
            out = last
        assert torch.equal(last.prev_sample, last.denoised)
    torch.testing.assert_close(outs[0].denoised, outs[1].denoised)
    assert not torch.allclose(outs[0].prev_sample, outs[1].prev_sample)


def test_tcd_eta():
    """`TCDScheduler.step`'s `eta` defaults to 0.3, and `eta=0` gives the deterministic DDIM jump to the next timestep."""
    assert inspect.signature(TCDScheduler.step).parameters["eta"].default == 0.3
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
    """`calculate_shift` gives mu = 0.500 at 256 tokens, 1.150 at 4096 and 3.230 at 16384; with `use_dynamic_shifting=True` the scheduler maps sigma to `exp(mu) / (exp(mu) + (1 / sigma - 1))`, which puts the middle of FluxPipeline's 28-step grid at 0.622, 0.760 and 0.962, and it raises `ValueError` without `mu`."""
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


def test_flux_pipeline_grid_and_example():
    """`FluxPipeline.__call__` builds `sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)`, takes `image_seq_len = latents.shape[1]`, and passes `sigmas` and `mu` to `retrieve_timesteps`; its docstring example runs FLUX.1-schnell with `num_inference_steps=4, guidance_scale=0.0`."""
    from diffusers import FluxPipeline
    from diffusers.pipelines.flux import pipeline_flux

    source = inspect.getsource(FluxPipeline.__call__)
    assert "sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)" in source
    assert "image_seq_len = latents.shape[1]" in source
    assert "sigmas=sigmas,\n            mu=mu," in source
    assert 'FluxPipeline.from_pretrained("black-forest-labs/FLUX.1-schnell"' in pipeline_flux.EXAMPLE_DOC_STRING  # fmt: skip
    assert "num_inference_steps=4, guidance_scale=0.0" in pipeline_flux.EXAMPLE_DOC_STRING


def test_flux_dev_is_guidance_distilled():
    """Flux.1-dev's transformer config has `guidance_embeds=True`, and `FluxPipeline` defaults to `guidance_scale=3.5` and `true_cfg_scale=1.0`."""
    from diffusers import FluxPipeline
    from model_configs import FLUX_DEV_TRANSFORMER

    assert FLUX_DEV_TRANSFORMER["guidance_embeds"] is True
    params = inspect.signature(FluxPipeline.__call__).parameters
    assert params["guidance_scale"].default == 3.5 and params["true_cfg_scale"].default == 1.0


def test_embedded_guidance_against_true_cfg(record_calls):
    """On a tiny guidance-embedding `FluxPipeline`, `guidance_scale` changes the image at one transformer call per step, and `true_cfg_scale > 1` with a negative prompt makes two calls per step, combining `neg_noise_pred + true_cfg_scale * (noise_pred - neg_noise_pred)`."""
    pipe = tiny_flux_pipeline()
    a, calls_a = run_flux(pipe, record_calls, guidance_scale=1.0)
    b, calls_b = run_flux(pipe, record_calls, guidance_scale=3.5)
    assert len(calls_a) == len(calls_b) == 2 and np.abs(a - b).max() > 1e-4
    assert calls_a[0][1]["hidden_states"].shape[1] == (HEIGHT // 4) ** 2
    g = torch.Generator().manual_seed(2)
    negative = dict(
        negative_prompt_embeds=torch.randn(1, 8, 32, generator=g),
        negative_pooled_prompt_embeds=torch.randn(1, 32, generator=g),
    )
    _, calls = run_flux(pipe, record_calls, true_cfg_scale=4.0, **negative)
    assert len(calls) == 4
    from diffusers import FluxPipeline

    assert "noise_pred = neg_noise_pred + true_cfg_scale * (noise_pred - neg_noise_pred)" in inspect.getsource(FluxPipeline.__call__)  # fmt: skip
