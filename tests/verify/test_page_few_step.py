"""The few-step sampling and distillation page against the installed diffusers.

The schedulers are the real classes with SD 1.x's betas; the pipeline checks run the real
``__call__`` of tiny pipelines built in code (no text encoders, no weights): the
``FluxPipeline`` of Lab 13's verify module (a guidance-embedding ``FluxTransformer2DModel``
and a 16-channel ``AutoencoderKL``), ``tiny.py``'s ``StableDiffusionPipeline`` and a
``StableDiffusionXLPipeline`` around a UNet with SDXL's "text_time" conditioning.
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
from test_page_lab_13 import (  # noqa: F401 (guidance_rescale_calls is a fixture)
    HEIGHT,
    guidance_rescale_calls,
    orders_used,
    run_flux,
    spy_set_timesteps,
    tiny_flux_pipeline,
)

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


#: width of the pooled text embedding of the tiny SDXL UNet (SDXL: 1280)
POOLED_DIM = 16


def tiny_sdxl_pipeline():
    """The real StableDiffusionXLPipeline around a tiny UNet with SDXL's "text_time"
    conditioning (6 time ids x 8 + pooled width), no text encoders: pass embeddings."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline
    from tiny import tiny_unet, tiny_vae

    unet = tiny_unet(
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + POOLED_DIM,
    )
    pipe = StableDiffusionXLPipeline(
        vae=tiny_vae(), text_encoder=None, text_encoder_2=None, tokenizer=None, tokenizer_2=None,
        unet=unet, scheduler=EulerDiscreteScheduler(**SD_BETAS),
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("name", ["StableDiffusionPipeline", "StableDiffusionXLPipeline"])
def test_guidance_rescale(name, sd_pipe, guidance_rescale_calls):  # noqa: F811 (the imported fixture)
    """`StableDiffusionPipeline` and `StableDiffusionXLPipeline` take `guidance_rescale` (default 0.0) and, only while guiding and only when it is above 0, pass the guided `noise_pred` through `rescale_noise_cfg`, which rescales it to the per-sample std of `noise_pred_text` and returns `guidance_rescale * rescaled + (1 - guidance_rescale) * guided`, the prediction `scheduler.step` then gets."""
    import importlib

    if name == "StableDiffusionPipeline":
        module = importlib.import_module("diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion")  # fmt: skip
        pipe, extra = sd_pipe, {}
    else:
        module = importlib.import_module("diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl")  # fmt: skip
        pipe = tiny_sdxl_pipeline()
        g = torch.Generator().manual_seed(3)
        extra = dict(pooled_prompt_embeds=torch.randn(1, POOLED_DIM, generator=g),
                     negative_pooled_prompt_embeds=torch.randn(1, POOLED_DIM, generator=g))  # fmt: skip
    assert inspect.signature(getattr(module, name).__call__).parameters["guidance_rescale"].default == 0.0  # fmt: skip
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


def test_time_cond_proj_dim_embeds_guidance(record_calls):
    """A UNet with `time_cond_proj_dim` set (how full LCM checkpoints take guidance) turns classifier-free guidance off in `StableDiffusionPipeline`: one UNet call per step on the un-doubled batch at `guidance_scale=8.5`, with an embedding of `guidance_scale - 1` passed as `timestep_cond`; the same UNet without it makes one call per step on a doubled batch."""
    from diffusers import LCMScheduler
    from tiny import HEIGHT as SD_HEIGHT
    from tiny import SD_SCHEDULER, embeds, start_latents, tiny_sd_pipeline, tiny_unet

    lcm = dict(SD_SCHEDULER, set_alpha_to_one=True)
    for proj_dim, rows in [(8, 1), (None, 2)]:
        pipe = tiny_sd_pipeline(scheduler=LCMScheduler(**lcm), unet=tiny_unet(time_cond_proj_dim=proj_dim))  # fmt: skip
        recorder = record_calls(pipe.unet)
        with torch.no_grad():
            pipe(prompt_embeds=embeds(1), negative_prompt_embeds=embeds(2), latents=start_latents(),
                 guidance_scale=8.5, num_inference_steps=2, height=SD_HEIGHT, width=SD_HEIGHT,
                 output_type="latent")  # fmt: skip
        assert len(recorder.calls) == 2
        for args, kwargs in recorder.calls:
            assert args[0].shape[0] == rows
            if proj_dim is None:
                assert kwargs["timestep_cond"] is None
            else:
                expected = pipe.get_guidance_scale_embedding(torch.tensor([7.5]), embedding_dim=proj_dim)  # fmt: skip
                torch.testing.assert_close(kwargs["timestep_cond"], expected)
        recorder.remove()


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


def test_flux_pipeline_grid_and_example(record_calls, monkeypatch):
    """`FluxPipeline.__call__` passes `sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)` and `mu = calculate_shift(image_seq_len, ...)`, with `image_seq_len` the packed token count the transformer sees, to the scheduler's `set_timesteps`; its docstring example runs FLUX.1-schnell with `num_inference_steps=4, guidance_scale=0.0`."""
    from diffusers.pipelines.flux import pipeline_flux

    pipe = tiny_flux_pipeline()
    seen = spy_set_timesteps(pipe, monkeypatch)
    _, calls = run_flux(pipe, record_calls)
    (kwargs,) = seen
    np.testing.assert_allclose(kwargs["sigmas"], np.linspace(1.0, 1 / 2, 2))
    tokens = calls[0][1]["hidden_states"].shape[1]
    assert kwargs["mu"] == pytest.approx(pipeline_flux.calculate_shift(tokens))
    assert 'FluxPipeline.from_pretrained("black-forest-labs/FLUX.1-schnell"' in pipeline_flux.EXAMPLE_DOC_STRING  # fmt: skip
    assert "num_inference_steps=4, guidance_scale=0.0" in pipeline_flux.EXAMPLE_DOC_STRING


def test_flux_dev_is_guidance_distilled():
    """Flux.1-dev's transformer config has `guidance_embeds=True`, and `FluxPipeline` defaults to `guidance_scale=3.5` and `true_cfg_scale=1.0`."""
    from diffusers import FluxPipeline
    from model_configs import FLUX_DEV_TRANSFORMER

    assert FLUX_DEV_TRANSFORMER["guidance_embeds"] is True
    params = inspect.signature(FluxPipeline.__call__).parameters
    assert params["guidance_scale"].default == 3.5 and params["true_cfg_scale"].default == 1.0


def test_embedded_guidance_against_true_cfg(record_calls, monkeypatch):
    """On a tiny guidance-embedding `FluxPipeline`, `guidance_scale` changes the image at one transformer call per step, and `true_cfg_scale > 1` with a negative prompt makes two calls per step, both with the embedded guidance, and steps with `neg_noise_pred + true_cfg_scale * (noise_pred - neg_noise_pred)`."""
    pipe = tiny_flux_pipeline()
    a, calls_a = run_flux(pipe, record_calls, guidance_scale=1.0)
    b, calls_b = run_flux(pipe, record_calls, guidance_scale=3.5)
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
        _, calls = run_flux(pipe, record_calls, true_cfg_scale=4.0, guidance_scale=3.5, **negative)
    finally:
        hook.remove()
    assert len(calls) == 4 and all(kwargs["guidance"].tolist() == [3.5] for _, kwargs in calls)
    for k, model_output in enumerate(steps):
        cond, neg = outputs[2 * k], outputs[2 * k + 1]
        torch.testing.assert_close(model_output, neg + 4.0 * (cond - neg))


def test_zero_snr_needs_v_prediction():
    """With `rescale_betas_zero_snr=True` and SD's `clip_sample=False`, `DDIMScheduler.step` at t = 999 returns NaN or inf for an epsilon model (the exact epsilon, x_999 itself, gives 0 / 0) and, for `prediction_type="v_prediction"`, the finite x0 prediction -v."""
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


def test_fixed_shift_is_the_dynamic_shift_at_exp_mu():
    """`FlowMatchEulerDiscreteScheduler`'s fixed `shift` maps sigma to `shift * sigma / (1 + (shift - 1) * sigma)`, the same map as `use_dynamic_shifting=True` with `shift = exp(mu)`."""
    s = np.linspace(1.0, 1 / 28, 28)
    fixed = FlowMatchEulerDiscreteScheduler(shift=3.0)
    fixed.set_timesteps(sigmas=s)
    np.testing.assert_allclose(fixed.sigmas[:-1].numpy(), 3.0 * s / (1 + 2.0 * s), rtol=1e-6)
    dynamic = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    dynamic.set_timesteps(sigmas=s, mu=float(np.log(3.0)))
    np.testing.assert_allclose(dynamic.sigmas.numpy(), fixed.sigmas.numpy(), rtol=1e-5)
