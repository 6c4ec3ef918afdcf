"""Lab 13 (few-step sampling) against the real diffusers schedulers and FluxPipeline.

The starter's NumPy ``DPMSolverMultistepScheduler`` and ``LCMScheduler`` are run step by
step next to diffusers' classes with the same config and the same model outputs (the
exact denoiser evaluated on diffusers' own latents), and the same noise for LCM. The
Flux checks build a tiny ``FluxPipeline`` in code: a two-block ``FluxTransformer2DModel``
with ``guidance_embeds=True``, a 16-channel ``AutoencoderKL``, no text encoders
(``prompt_embeds`` and ``pooled_prompt_embeds`` are passed directly), no weights.
"""

from __future__ import annotations

import inspect
import runpy
import sys

import numpy as np
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    LCMScheduler,
    TCDScheduler,
)

LAB13 = "code/lab-13-few-step-sampling/few_step.py"
SD_BETAS = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)


@pytest.fixture(scope="module")
def starter():
    from infralens_docs.registry import ROOT

    argv, sys.argv = sys.argv, ["few_step.py"]
    try:
        return runpy.run_path(str(ROOT / LAB13), run_name="__main__")
    finally:
        sys.argv = argv


def start_noise(n=64, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 2))


DPM_CONFIGS = [
    dict(timestep_spacing="trailing"),
    dict(timestep_spacing="linspace"),
    dict(timestep_spacing="leading", steps_offset=1),
    dict(timestep_spacing="trailing", final_sigmas_type="sigma_min"),
    dict(timestep_spacing="trailing", final_sigmas_type="sigma_min", euler_at_final=True),
]


@pytest.mark.parametrize("n", [1, 2, 4, 8, 20])
@pytest.mark.parametrize("config", DPM_CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))  # fmt: skip
def test_dpm_solver_pp_2m_matches_diffusers_step_by_step(starter, config, n):
    """The starter's NumPy DPM-Solver++ 2M gives the timesteps of `DPMSolverMultistepScheduler` (`algorithm_type="dpmsolver++"`, `solver_order=2`, `solver_type="midpoint"`), its sigmas to float32 rounding, and every `prev_sample` to within 1e-5, at 1, 2, 4, 8 and 20 steps, under `linspace`, `leading` and `trailing` spacing and both `final_sigmas_type` values, with and without `euler_at_final`."""
    ours = starter["DPMSolverMultistepScheduler"](starter["betas"], **config)
    theirs = DPMSolverMultistepScheduler(**SD_BETAS, **config)
    assert (theirs.config.algorithm_type, theirs.config.solver_order, theirs.config.solver_type) == ("dpmsolver++", 2, "midpoint")  # fmt: skip
    ours.set_timesteps(n)
    theirs.set_timesteps(n)
    assert ours.timesteps.tolist() == theirs.timesteps.tolist()
    np.testing.assert_allclose(ours.sigmas, theirs.sigmas.numpy(), rtol=1e-4)
    unet = starter["unet"]
    latents = start_noise()
    torch_latents = torch.from_numpy(latents).float()
    for t in theirs.timesteps:
        noise_pred = unet(torch_latents.double().numpy(), int(t))  # the same output fed to both
        ours_prev = ours.step(noise_pred, int(t), torch_latents.double().numpy()).prev_sample
        torch_latents = theirs.step(torch.from_numpy(noise_pred).float(), t, torch_latents).prev_sample  # fmt: skip
        np.testing.assert_allclose(ours_prev, torch_latents.double().numpy(), atol=1e-5, rtol=1e-5)


def orders_used(n, **config):
    """Which update `DPMSolverMultistepScheduler.step` runs at each of ``n`` steps: 1 or 2."""
    scheduler = DPMSolverMultistepScheduler(**SD_BETAS, timestep_spacing="trailing", **config)
    scheduler.set_timesteps(n)
    used = []
    first, second = scheduler.dpm_solver_first_order_update, scheduler.multistep_dpm_solver_second_order_update  # fmt: skip
    scheduler.dpm_solver_first_order_update = lambda *a, **k: used.append(1) or first(*a, **k)
    scheduler.multistep_dpm_solver_second_order_update = lambda *a, **k: used.append(2) or second(*a, **k)  # fmt: skip
    sample = torch.randn(4, 2, generator=torch.Generator().manual_seed(0))
    for t in scheduler.timesteps:
        sample = scheduler.step(torch.zeros_like(sample), t, sample).prev_sample
    return used


def test_dpm_solver_first_and_last_steps_are_first_order():
    """At 4 steps `DPMSolverMultistepScheduler` runs first-, second-, second-, first-order updates: the first step has no previous x0 prediction, and the last is first order because `final_sigmas_type="zero"` (the default); with `final_sigmas_type="sigma_min"` and `lower_order_final=False` the last step is second order, and `euler_at_final=True` makes it first order again."""
    assert orders_used(4) == [1, 2, 2, 1]
    assert orders_used(4, final_sigmas_type="sigma_min", lower_order_final=False) == [1, 2, 2, 2]
    assert orders_used(4, final_sigmas_type="sigma_min", lower_order_final=False, euler_at_final=True) == [1, 2, 2, 1]  # fmt: skip
    assert DPMSolverMultistepScheduler().config.final_sigmas_type == "zero"


def test_dpm_solver_karras_sigmas():
    """With `use_karras_sigmas=True`, `DPMSolverMultistepScheduler` places its sigmas by Karras et al.'s rule, `(sigma_max^(1/7) + ramp (sigma_min^(1/7) - sigma_max^(1/7)))^7` between the training schedule's largest and smallest sigma, and rounds the matching timesteps to integers."""
    scheduler = DPMSolverMultistepScheduler(**SD_BETAS, use_karras_sigmas=True)
    scheduler.set_timesteps(6)
    ab = scheduler.alphas_cumprod.double().numpy()
    train = np.sqrt((1 - ab) / ab)
    ramp = np.linspace(0, 1, 6)
    expected = (train[-1] ** (1 / 7) + ramp * (train[0] ** (1 / 7) - train[-1] ** (1 / 7))) ** 7
    np.testing.assert_allclose(scheduler.sigmas[:-1].numpy(), expected, rtol=1e-4)
    assert scheduler.sigmas[-1] == 0
    ts = scheduler.timesteps.numpy()
    assert ts[0] == 999 and np.all(np.diff(ts) < 0) and ts.dtype == np.int64


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_lcm_step_matches_diffusers_with_the_same_noise(starter, n):
    """The starter's NumPy LCM step gives `LCMScheduler`'s timesteps (999 at 1 step; 999, 759, 499, 259 at 4) and every `prev_sample` and `denoised` to within 1e-5 when both get the same fresh noise: x0 prediction, the `c_skip` / `c_out` boundary condition, re-noising to the next timestep, and `denoised` returned at the last step."""
    ours = starter["LCMScheduler"](starter["betas"])
    theirs = LCMScheduler(**SD_BETAS)
    assert (theirs.config.original_inference_steps, theirs.config.timestep_scaling, theirs.config.set_alpha_to_one) == (50, 10.0, True)  # fmt: skip
    ours.set_timesteps(n)
    theirs.set_timesteps(n)
    assert ours.timesteps.tolist() == theirs.timesteps.tolist()
    if n == 4:
        assert theirs.timesteps.tolist() == [999, 759, 499, 259]
    unet = starter["unet"]
    latents = torch.from_numpy(start_noise()).float()
    generator, replay = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for t in theirs.timesteps:
        sample = latents.double().numpy()
        noise_pred = unet(sample, int(t))
        out = theirs.step(torch.from_numpy(noise_pred).float(), t, latents, generator=generator)
        fresh = torch.randn(latents.shape, generator=replay, dtype=torch.float32).double().numpy()
        mine = ours.step(noise_pred, int(t), sample, noise=fresh)
        np.testing.assert_allclose(mine.pred_original_sample, out.denoised.double().numpy(), atol=1e-5)  # fmt: skip
        np.testing.assert_allclose(mine.prev_sample, out.prev_sample.double().numpy(), atol=1e-5)
        latents = out.prev_sample
    # the last step added no noise: prev_sample is denoised
    assert torch.equal(out.prev_sample, out.denoised)


def test_lcm_boundary_scalings():
    """`LCMScheduler.get_scalings_for_boundary_condition_discrete(t)` returns `c_skip = 0.25 / ((10 t)^2 + 0.25)` and `c_out = 10 t / sqrt((10 t)^2 + 0.25)`: 1 and 0 at t = 0, and an x0 prediction passed through almost unchanged at every timestep LCM visits."""
    scheduler = LCMScheduler(**SD_BETAS)
    assert scheduler.get_scalings_for_boundary_condition_discrete(0) == (1.0, 0.0)
    c_skip, c_out = scheduler.get_scalings_for_boundary_condition_discrete(19)
    assert c_skip == pytest.approx(0.25 / (190**2 + 0.25)) and c_skip < 1e-5
    assert c_out == pytest.approx(190 / (190**2 + 0.25) ** 0.5) and c_out > 0.99999


def test_tcd_step_rule():
    """`TCDScheduler.step` takes `eta` (the paper's gamma, default 0.3): it moves the x0 and noise predictions to `s = floor((1 - eta) * prev_t)` and, for `eta > 0`, re-noises from s to `prev_t` with fresh noise; `eta=0` is a deterministic DDIM-like jump to `prev_t`, and `eta=1` moves to s = 0 and re-noises all the way, as LCM does."""
    assert inspect.signature(TCDScheduler.step).parameters["eta"].default == 0.3
    scheduler = TCDScheduler(**SD_BETAS)
    scheduler.set_timesteps(4)
    t, prev_t = [int(x) for x in scheduler.timesteps[:2]]
    ab = scheduler.alphas_cumprod.double()
    sample = torch.randn(8, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    eps = torch.randn(8, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x0 = (sample - (1 - ab[t]).sqrt() * eps) / ab[t].sqrt()
    out = scheduler.step(eps.float(), t, sample.float(), eta=0.0)
    ddim = ab[prev_t].sqrt() * x0 + (1 - ab[prev_t]).sqrt() * eps
    torch.testing.assert_close(out.prev_sample.double(), ddim, atol=1e-5, rtol=1e-5)
    for eta in (0.5, 1.0):  # eta = 1: s = 0, x0_hat re-noised all the way, as LCM does
        scheduler = TCDScheduler(**SD_BETAS)
        scheduler.set_timesteps(4)
        out = scheduler.step(eps.float(), t, sample.float(), eta=eta, generator=torch.Generator().manual_seed(3))  # fmt: skip
        s = int(np.floor((1 - eta) * prev_t))
        torch.testing.assert_close(out.pred_noised_sample.double(), ab[s].sqrt() * x0 + (1 - ab[s]).sqrt() * eps, atol=1e-5, rtol=1e-5)  # fmt: skip
        z = torch.randn(8, 2, generator=torch.Generator().manual_seed(3))
        renoised = (ab[prev_t] / ab[s]).sqrt() * out.pred_noised_sample.double() + (1 - ab[prev_t] / ab[s]).sqrt() * z.double()  # fmt: skip
        torch.testing.assert_close(out.prev_sample.double(), renoised, atol=1e-5, rtol=1e-5)


def test_leading_and_trailing_grids():
    """At 4 steps `leading` with `steps_offset=1` gives DDIM 751, 501, 251, 1 and DPM-Solver++ 801, 601, 401, 201, and at 1 step DDIM's only timestep is 1; `trailing` gives 999, 749, 499, 249 for both and 999 at 1 step: only `trailing` starts at the noisiest training timestep."""

    def grid(cls, spacing, n):
        scheduler = cls(**SD_BETAS, timestep_spacing=spacing, steps_offset=1 if spacing == "leading" else 0)  # fmt: skip
        scheduler.set_timesteps(n)
        return scheduler.timesteps.tolist()

    assert grid(DDIMScheduler, "leading", 4) == [751, 501, 251, 1]
    assert grid(DPMSolverMultistepScheduler, "leading", 4) == [801, 601, 401, 201]
    assert grid(DDIMScheduler, "leading", 1) == [1]
    for cls in (DDIMScheduler, DPMSolverMultistepScheduler):
        assert grid(cls, "trailing", 4) == [999, 749, 499, 249]
        assert grid(cls, "trailing", 1) == [999]


def test_starter_spacing_grids_are_diffusers(starter):
    """The leading and trailing grids the starter prints for DDIM and DPM-Solver++ are the grids of diffusers' `DDIMScheduler` and `DPMSolverMultistepScheduler` with the same config."""
    for row in starter["spacing_rows"]:
        name, n, spacing, printed = row[0].split(" ")[0], row[1], row[2], row[3]
        cls = {"ddim": DDIMScheduler, "dpm++2m": DPMSolverMultistepScheduler}[name]
        scheduler = cls(**SD_BETAS, timestep_spacing=spacing, steps_offset=1 if spacing == "leading" else 0)  # fmt: skip
        scheduler.set_timesteps(n)
        assert printed == ", ".join(str(t) for t in scheduler.timesteps.tolist())


def test_rescale_betas_zero_snr(starter):
    """`rescale_betas_zero_snr=True` makes SD's `scaled_linear` schedule end at `alphas_cumprod[-1] = 0` in `DDIMScheduler` (the starter's NumPy Algorithm 1 gives the same `alphas_cumprod` to 1e-6), while `DPMSolverMultistepScheduler` then sets it to 2**-24 so the first sigma stays finite."""
    ddim = DDIMScheduler(**SD_BETAS, rescale_betas_zero_snr=True)
    ours = np.cumprod(1 - starter["rescale_zero_terminal_snr"](starter["betas"]))
    np.testing.assert_allclose(ddim.alphas_cumprod.double().numpy(), ours, atol=1e-6)
    assert float(ddim.alphas_cumprod[-1]) < 1e-9
    plain = DDIMScheduler(**SD_BETAS)
    assert float(plain.alphas_cumprod[-1]) == pytest.approx(starter["alphas_cumprod"][-1], rel=1e-4)
    dpm = DPMSolverMultistepScheduler(**SD_BETAS, rescale_betas_zero_snr=True)
    assert float(dpm.alphas_cumprod[-1]) == 2**-24


def test_guidance_rescale():
    """`guidance_rescale` (a `StableDiffusionPipeline` argument, default 0.0, used only while guiding) goes through `rescale_noise_cfg`: it rescales the guided `noise_pred` to the per-sample std of `noise_pred_text`, and mixes that with the unrescaled guided prediction by `guidance_rescale`."""
    from diffusers import StableDiffusionPipeline
    from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import rescale_noise_cfg

    assert inspect.signature(StableDiffusionPipeline.__call__).parameters["guidance_rescale"].default == 0.0  # fmt: skip
    g = torch.Generator().manual_seed(0)
    text, uncond = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 4, 8, 8, generator=g)
    cfg = uncond + 7.5 * (text - uncond)
    full = rescale_noise_cfg(cfg, text, guidance_rescale=1.0)
    torch.testing.assert_close(full.std(dim=(1, 2, 3)), text.std(dim=(1, 2, 3)))
    torch.testing.assert_close(rescale_noise_cfg(cfg, text, guidance_rescale=0.0), cfg)
    torch.testing.assert_close(rescale_noise_cfg(cfg, text, guidance_rescale=0.7), 0.7 * full + 0.3 * cfg)  # fmt: skip


def test_calculate_shift_and_the_shifted_grid(starter):
    """`calculate_shift` (in `pipeline_flux.py`) defaults to 256, 4096, 0.5, 1.15 and gives mu = 0.5, 0.63, 1.15 and 3.23 for 256, 1024, 4096 and 16384 tokens, as the starter's copy does; `FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True).set_timesteps(sigmas=..., mu=...)` then gives the starter's shifted sigmas followed by 0, and without `mu` it raises `ValueError`."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    defaults = [p.default for p in list(inspect.signature(calculate_shift).parameters.values())[1:]]
    assert defaults == [256, 4096, 0.5, 1.15]
    for tokens, mu in [(256, 0.5), (1024, 0.63), (4096, 1.15), (16384, 3.23)]:
        assert calculate_shift(tokens) == pytest.approx(mu, abs=5e-4)
        assert starter["calculate_shift"](tokens) == pytest.approx(
            calculate_shift(tokens), abs=1e-12
        )
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    with pytest.raises(ValueError, match="mu"):
        scheduler.set_timesteps(4)
    for n, tokens in [(4, 256), (28, 4096), (4, 16384)]:
        mu = calculate_shift(tokens)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / n, n), mu=mu)
        np.testing.assert_allclose(scheduler.sigmas[:-1].numpy(), starter["shifted_sigmas"](n, mu), rtol=1e-6)  # fmt: skip
        assert scheduler.sigmas[-1] == 0
        np.testing.assert_allclose(scheduler.timesteps.numpy(), 1000 * scheduler.sigmas[:-1].numpy(), rtol=1e-6)  # fmt: skip


def test_flux_pipeline_shifts_by_token_count():
    """`FluxPipeline.__call__` builds `sigmas = np.linspace(1.0, 1 / n, n)`, reads `base_image_seq_len`, `max_image_seq_len`, `base_shift` and `max_shift` from `scheduler.config` with those defaults, passes `mu = calculate_shift(latents.shape[1], ...)`, the packed token count, to `set_timesteps`, and defaults to `num_inference_steps=28` and `guidance_scale=3.5`."""
    from diffusers import FluxPipeline

    source = inspect.getsource(FluxPipeline.__call__)
    assert "sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)" in source
    assert "image_seq_len = latents.shape[1]" in source
    for key, default in [("base_image_seq_len", 256), ("max_image_seq_len", 4096), ("base_shift", 0.5), ("max_shift", 1.15)]:  # fmt: skip
        assert f'self.scheduler.config.get("{key}", {default})' in source
    params = inspect.signature(FluxPipeline.__call__).parameters
    assert params["num_inference_steps"].default == 28 and params["guidance_scale"].default == 3.5
    assert params["true_cfg_scale"].default == 1.0


# ---- a tiny FluxPipeline, built in code ------------------------------------------------

TEXT_DIM, TEXT_LEN, HEIGHT = 32, 8, 16


def tiny_flux_pipeline():
    """FluxPipeline around a tiny guidance-embedding transformer and a 16-channel VAE."""
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,  # 16 latent channels x a packed 2 x 2 patch, as Flux.1
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=TEXT_DIM,
        pooled_projection_dim=TEXT_DIM,
        guidance_embeds=True,
        axes_dims_rope=(4, 4, 8),
    ).eval()
    vae = AutoencoderKL(
        block_out_channels=(32, 32),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=16,
        norm_num_groups=8,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.1159,
        scaling_factor=0.3611,
        sample_size=HEIGHT,
    ).eval()
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def flux_pipe():
    return tiny_flux_pipeline()


def run_flux(pipe, record_calls, **kwargs):
    """Image (1, 16, 16, 3) and the transformer's recorded calls for one 2-step call."""
    g = torch.Generator().manual_seed(0)
    embeds = dict(
        prompt_embeds=torch.randn(1, TEXT_LEN, TEXT_DIM, generator=g),
        pooled_prompt_embeds=torch.randn(1, TEXT_DIM, generator=g),
    )
    recorder = record_calls(pipe.transformer)
    with torch.no_grad():
        image = pipe(**embeds, **kwargs, height=HEIGHT, width=HEIGHT, num_inference_steps=2,
                     generator=torch.Generator().manual_seed(1), output_type="np").images  # fmt: skip
    recorder.remove()
    return image, recorder.calls


def test_guidance_is_an_input_one_call_per_step(flux_pipe, record_calls):
    """With `guidance_embeds=True` the tiny `FluxPipeline` makes one transformer call per step on the un-doubled batch whatever `guidance_scale` is, passes `guidance` = `guidance_scale` to it, which the transformer's `CombinedTimestepGuidanceTextProjEmbeddings` embeds next to the timestep, and `guidance_scale` 1.0 and 3.5 give different images from the same seed."""
    assert type(flux_pipe.transformer.time_text_embed).__name__ == "CombinedTimestepGuidanceTextProjEmbeddings"  # fmt: skip
    low, low_calls = run_flux(flux_pipe, record_calls, guidance_scale=1.0)
    high, high_calls = run_flux(flux_pipe, record_calls, guidance_scale=3.5)
    assert len(low_calls) == len(high_calls) == 2
    for calls, scale in [(low_calls, 1.0), (high_calls, 3.5)]:
        for _, kwargs in calls:
            assert kwargs["hidden_states"].shape == (1, (HEIGHT // 4) ** 2, 64)
            assert kwargs["guidance"].tolist() == [scale]
    assert np.abs(high - low).max() > 1e-4


def test_true_cfg_doubles_the_calls(flux_pipe, record_calls):
    """`true_cfg_scale > 1` with `negative_prompt_embeds` and `negative_pooled_prompt_embeds` makes two transformer calls per step (conditional, then negative), still with `guidance` passed; `true_cfg_scale > 1` without a negative prompt stays at one call per step."""
    g = torch.Generator().manual_seed(2)
    negative = dict(
        negative_prompt_embeds=torch.randn(1, TEXT_LEN, TEXT_DIM, generator=g),
        negative_pooled_prompt_embeds=torch.randn(1, TEXT_DIM, generator=g),
    )
    _, calls = run_flux(flux_pipe, record_calls, true_cfg_scale=4.0, **negative)
    assert len(calls) == 4
    assert all(kwargs["guidance"] is not None for _, kwargs in calls)
    _, calls = run_flux(flux_pipe, record_calls, true_cfg_scale=4.0)
    assert len(calls) == 2
