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

import diffusers
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
from tiny import (
    DIT_TEXT,
    DIT_TOKENS,
    FLUX_VAE_FACTORS,
    HEIGHT,
    SD_BETAS,
    flux_image_and_calls,
    orders_used,
    run_starter,
    spy_set_timesteps,
    timestep_grid,
    tiny_flux_pipeline,
)

LAB13 = "code/lab-13-few-step-sampling/few_step.py"


@pytest.fixture(scope="module")
def starter():
    return run_starter(LAB13)


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


@pytest.mark.parametrize("timesteps", [[999, 667, 334, 201], [999, 809, 639, 490, 360, 250, 160, 90, 40, 10]])  # fmt: skip
def test_dpm_solver_custom_timesteps_match_diffusers(starter, timesteps):
    """`DPMSolverMultistepScheduler.set_timesteps(timesteps=...)` takes custom timesteps and ignores `timestep_spacing`; the starter's copy gives the same sigmas and every `prev_sample` to within 1e-5, for the spacing table's control grid 999, 667, 334, 201 and the quadratic grid `ode_endpoint_eps` solves on from t = 999."""
    ours = starter["DPMSolverMultistepScheduler"](starter["betas"], timestep_spacing="leading")
    theirs = DPMSolverMultistepScheduler(**SD_BETAS, timestep_spacing="leading")
    ours.set_timesteps(timesteps=timesteps)
    theirs.set_timesteps(timesteps=timesteps)
    assert ours.timesteps.tolist() == theirs.timesteps.tolist() == timesteps
    np.testing.assert_allclose(ours.sigmas, theirs.sigmas.numpy(), rtol=1e-4)
    unet = starter["unet"]
    torch_latents = torch.from_numpy(start_noise()).float()
    for t in theirs.timesteps:
        noise_pred = unet(torch_latents.double().numpy(), int(t))
        ours_prev = ours.step(noise_pred, int(t), torch_latents.double().numpy()).prev_sample
        torch_latents = theirs.step(torch.from_numpy(noise_pred).float(), t, torch_latents).prev_sample  # fmt: skip
        np.testing.assert_allclose(ours_prev, torch_latents.double().numpy(), atol=1e-5, rtol=1e-5)


def test_ode_endpoint_grid(starter, monkeypatch):
    """`ode_endpoint_eps` at t = 999 solves on the custom timesteps 999, 809, 639, 490, 360, 250, 160, 90, 40, 10, a grid on which the starter's DPM-Solver++ 2M matches diffusers' step for step (checked above)."""
    seen = []
    original = starter["DPMSolverMultistepScheduler"].set_timesteps

    def spy(self, num_inference_steps=None, timesteps=None):
        seen.append([int(t) for t in timesteps])
        return original(self, num_inference_steps, timesteps)

    monkeypatch.setattr(starter["DPMSolverMultistepScheduler"], "set_timesteps", spy)
    starter["ode_endpoint_eps"](start_noise(8), 999)
    assert seen == [[999, 809, 639, 490, 360, 250, 160, 90, 40, 10]]


def test_dpm_solver_first_and_last_steps_are_first_order():
    """At 4 steps `DPMSolverMultistepScheduler` runs first-, second-, second-, first-order updates: the first step has no previous x0 prediction, and the last is first order because `final_sigmas_type="zero"` (the default); with `final_sigmas_type="sigma_min"` and `lower_order_final=False` the last step is second order, and `euler_at_final=True` makes it first order again."""
    assert orders_used(4) == [1, 2, 2, 1]
    assert orders_used(4, final_sigmas_type="sigma_min", lower_order_final=False) == [1, 2, 2, 2]
    assert orders_used(4, final_sigmas_type="sigma_min", lower_order_final=False, euler_at_final=True) == [1, 2, 2, 1]  # fmt: skip
    assert DPMSolverMultistepScheduler().config.final_sigmas_type == "zero"


def test_first_order_dpm_solver_is_ddim(starter):
    """First-order DPM-Solver++ is DDIM: at 2 steps, where both of `DPMSolverMultistepScheduler`'s updates are first order, it gives the samples of `DDIMScheduler(set_alpha_to_one=True)` on the same trailing grid to 1e-5, and at 4 steps, with second-order steps in the middle, it does not."""
    unet = starter["unet"]

    def run(scheduler, n):
        scheduler.set_timesteps(n)
        x = torch.from_numpy(start_noise()).float()
        for t in scheduler.timesteps:
            x = scheduler.step(torch.from_numpy(unet(x.double().numpy(), int(t))).float(), t, x).prev_sample  # fmt: skip
        return x

    def ddim():
        return DDIMScheduler(**SD_BETAS, timestep_spacing="trailing", clip_sample=False, set_alpha_to_one=True)  # fmt: skip

    def dpm():
        return DPMSolverMultistepScheduler(**SD_BETAS, timestep_spacing="trailing")

    torch.testing.assert_close(run(dpm(), 2), run(ddim(), 2), atol=1e-5, rtol=1e-5)
    assert (run(dpm(), 4) - run(ddim(), 4)).abs().max() > 1e-3


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
    """`TCDScheduler.step` takes `eta` (the paper's gamma; called alone it defaults to 0.3): it moves the x0 and noise predictions to `s = floor((1 - eta) * prev_t)` and, for `eta > 0`, re-noises from s to `prev_t` with fresh noise before the last step; `eta=0` is a deterministic DDIM-like jump to `prev_t`, and `eta=1` moves to s = 0 and re-noises all the way. The last step, of 4 or of a 1-step run, never re-noises: it returns the moved prediction."""
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
    defaults = []  # step without eta is step with eta=0.3, from the same generator
    for kwargs in ({}, dict(eta=0.3)):
        scheduler = TCDScheduler(**SD_BETAS)
        scheduler.set_timesteps(4)
        defaults.append(scheduler.step(eps.float(), t, sample.float(), generator=torch.Generator().manual_seed(3), **kwargs).prev_sample)  # fmt: skip
    torch.testing.assert_close(defaults[0], defaults[1], rtol=0, atol=0)
    for eta in (0.5, 1.0):  # eta = 1: s = 0, x0_hat re-noised all the way
        scheduler = TCDScheduler(**SD_BETAS)
        scheduler.set_timesteps(4)
        out = scheduler.step(eps.float(), t, sample.float(), eta=eta, generator=torch.Generator().manual_seed(3))  # fmt: skip
        s = int(np.floor((1 - eta) * prev_t))
        torch.testing.assert_close(out.pred_noised_sample.double(), ab[s].sqrt() * x0 + (1 - ab[s]).sqrt() * eps, atol=1e-5, rtol=1e-5)  # fmt: skip
        z = torch.randn(8, 2, generator=torch.Generator().manual_seed(3))
        renoised = (ab[prev_t] / ab[s]).sqrt() * out.pred_noised_sample.double() + (1 - ab[prev_t] / ab[s]).sqrt() * z.double()  # fmt: skip
        torch.testing.assert_close(out.prev_sample.double(), renoised, atol=1e-5, rtol=1e-5)
    for eta, n in [(0.3, 4), (1.0, 4), (0.3, 1), (1.0, 1)]:  # the last step: no fresh noise
        last = []
        for seed in (3, 4):
            scheduler = TCDScheduler(**SD_BETAS)
            scheduler.set_timesteps(n)
            for step_t in scheduler.timesteps:
                out = scheduler.step(eps.float(), step_t, sample.float(), eta=eta, generator=torch.Generator().manual_seed(seed))  # fmt: skip
            torch.testing.assert_close(out.prev_sample, out.pred_noised_sample, rtol=0, atol=0)
            last.append(out.prev_sample)
        torch.testing.assert_close(last[0], last[1], rtol=0, atol=0)


def test_tcd_eta_through_stable_diffusion_pipeline(monkeypatch):
    """`StableDiffusionPipeline` passes its own `eta=0.0` to `TCDScheduler.step`, overriding the scheduler's 0.3: without `eta=0.3` passed to `pipe(...)` every step is the deterministic jump (two generators, the same latents); with it each step gets 0.3 and re-noises."""

    from tiny import SD_SCHEDULER, embeds, spy_step_kwarg, start_latents, tiny_sd_pipeline

    def run(seed, **kwargs):
        pipe = tiny_sd_pipeline(scheduler=TCDScheduler(**SD_SCHEDULER))
        etas = spy_step_kwarg(monkeypatch, pipe.scheduler, "eta")
        with torch.no_grad():
            latents = pipe(prompt_embeds=embeds(1), guidance_scale=0.0, num_inference_steps=4,
                           latents=start_latents(), height=HEIGHT, width=HEIGHT, output_type="latent",
                           generator=torch.Generator().manual_seed(seed), **kwargs).images  # fmt: skip
        return latents, etas

    (a, etas), (b, _) = run(0), run(1)
    assert etas == [0.0] * 4
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    (a, etas), (b, _) = run(0, eta=0.3), run(1, eta=0.3)
    assert etas == [0.3] * 4 and not torch.allclose(a, b)


def test_leading_and_trailing_grids():
    """At 4 steps `leading` with `steps_offset=1` gives DDIM 751, 501, 251, 1 and DPM-Solver++ 801, 601, 401, 201, and at 1 step DDIM's only timestep is 1; `trailing` gives 999, 749, 499, 249 for both and 999 at 1 step."""
    assert timestep_grid(DDIMScheduler, "leading", 4) == [751, 501, 251, 1]
    assert timestep_grid(DPMSolverMultistepScheduler, "leading", 4) == [801, 601, 401, 201]
    assert timestep_grid(DDIMScheduler, "leading", 1) == [1]
    for cls in (DDIMScheduler, DPMSolverMultistepScheduler):
        assert timestep_grid(cls, "trailing", 4) == [999, 749, 499, 249]
        assert timestep_grid(cls, "trailing", 1) == [999]


def test_default_spacings():
    """`leading` is `DDIMScheduler`'s default `timestep_spacing`, and `DPMSolverMultistepScheduler`'s is `linspace`, which at 4 steps gives 999, 749, 500, 250: the starter sets `leading` on DPM-Solver++ explicitly."""
    assert DDIMScheduler(**SD_BETAS).config.timestep_spacing == "leading"
    dpm = DPMSolverMultistepScheduler(**SD_BETAS)
    assert dpm.config.timestep_spacing == "linspace"
    dpm.set_timesteps(4)
    assert dpm.timesteps.tolist() == [999, 749, 500, 250]


def test_starter_spacing_grids_are_diffusers(starter):
    """The leading, trailing and custom grids the starter prints for DDIM and DPM-Solver++ are the grids of diffusers' `DDIMScheduler` and `DPMSolverMultistepScheduler` with the same config (`steps_offset=1` with `leading`, `set_timesteps(timesteps=...)` for the custom one)."""
    for row in starter["spacing_rows"]:
        name, n, spacing, printed = row[0].removesuffix("-ideal"), row[1], row[2], row[3]
        cls = {"ddim": DDIMScheduler, "dpm++2m": DPMSolverMultistepScheduler}[name]
        if spacing == "custom":
            scheduler = cls(**SD_BETAS)
            scheduler.set_timesteps(timesteps=[int(t) for t in printed.split(", ")])
        else:
            scheduler = cls(**SD_BETAS, timestep_spacing=spacing, steps_offset=1 if spacing == "leading" else 0)  # fmt: skip
            scheduler.set_timesteps(n)
        assert printed == ", ".join(str(t) for t in scheduler.timesteps.tolist())


def test_rescale_betas_zero_snr(starter):
    """The starter's `rescale_zero_terminal_snr` gives the betas of diffusers' own `rescale_zero_terminal_snr` (in `scheduling_ddim.py`) to 1e-6, and its `DDIMZeroSNRScheduler` the `alphas_cumprod` of `DDIMScheduler(rescale_betas_zero_snr=True)`, which ends at exactly 0 on SD's `scaled_linear` betas (4.66e-03 without it); of the schedulers diffusers exports that take `rescale_betas_zero_snr=True`, exactly `DPMSolverMultistepScheduler`, `UniPCMultistepScheduler`, `EulerDiscreteScheduler` and `EulerAncestralDiscreteScheduler` then set it to `2**-24`, so the first sigma of their grid (t = 999) stays finite; the others keep 0."""
    from diffusers.schedulers.scheduling_ddim import rescale_zero_terminal_snr

    plain = DDIMScheduler(**SD_BETAS)
    theirs = rescale_zero_terminal_snr(plain.betas.double()).numpy()
    np.testing.assert_allclose(starter["rescale_zero_terminal_snr"](starter["betas"]), theirs, atol=1e-6)  # fmt: skip
    ddim = DDIMScheduler(**SD_BETAS, rescale_betas_zero_snr=True)
    ours = starter["DDIMZeroSNRScheduler"](**starter["DDIM_TRAILING"])
    np.testing.assert_allclose(ours.alphas_cumprod, ddim.alphas_cumprod.double().numpy(), atol=1e-6)
    assert float(ddim.alphas_cumprod[-1]) == 0.0 and ours.alphas_cumprod[-1] == 0.0
    assert float(plain.alphas_cumprod[-1]) == pytest.approx(4.66e-03, abs=5e-6)
    # every scheduler class diffusers exports that takes the flag, so a new one joins the set
    clamped, zero = set(), set()
    for name in [n for n in dir(diffusers) if n.endswith("Scheduler")]:
        cls = getattr(diffusers, name)
        if "rescale_betas_zero_snr" not in inspect.signature(cls.__init__).parameters:
            continue
        scheduler = cls(**SD_BETAS, rescale_betas_zero_snr=True, timestep_spacing="trailing")
        last = float(scheduler.alphas_cumprod[-1])
        assert last in (0.0, 2**-24), name
        (zero if last == 0.0 else clamped).add(name)
        if last:
            scheduler.set_timesteps(4)
            assert int(scheduler.timesteps[0]) == 999 and torch.isfinite(scheduler.sigmas[0]), name  # fmt: skip
    assert clamped == {"DPMSolverMultistepScheduler", "UniPCMultistepScheduler", "EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler"}  # fmt: skip
    assert "DDIMScheduler" in zero


def zero_snr_ddim(prediction_type):
    return DDIMScheduler(**SD_BETAS, rescale_betas_zero_snr=True, prediction_type=prediction_type,
                         timestep_spacing="trailing", clip_sample=False, set_alpha_to_one=False)  # fmt: skip


@pytest.mark.parametrize("n", [1, 4, 25])
def test_zero_snr_run_matches_diffusers(starter, n):
    """The starter's zero-SNR run is `DDIMScheduler(rescale_betas_zero_snr=True, prediction_type="v_prediction", timestep_spacing="trailing")` step by step at 1, 4 and 25 steps (every `prev_sample` to 1e-5 from the same v-predictions); at t = 999 its x0 prediction is `-v`, the same data mean for every sample."""
    ours = starter["DDIMZeroSNRScheduler"](
        prediction_type="v_prediction", **starter["DDIM_TRAILING"]
    )
    theirs = zero_snr_ddim("v_prediction")
    ours.set_timesteps(n)
    theirs.set_timesteps(n)
    assert ours.timesteps.tolist() == theirs.timesteps.tolist() and theirs.timesteps[0] == 999
    unet_v = starter["unet_v"]
    latents = torch.from_numpy(start_noise()).float()
    for t in theirs.timesteps:
        v = unet_v(latents.double().numpy(), int(t))
        mine = ours.step(v, int(t), latents.double().numpy())
        out = theirs.step(torch.from_numpy(v).float(), t, latents)
        np.testing.assert_allclose(mine.prev_sample, out.prev_sample.double().numpy(), atol=1e-5)
        if t == 999:
            torch.testing.assert_close(out.pred_original_sample, -torch.from_numpy(v).float())
            mean = starter["mixture"].weights @ starter["mixture"].means
            np.testing.assert_allclose(out.pred_original_sample.double().numpy(), np.broadcast_to(mean, v.shape), atol=1e-6)  # fmt: skip
        latents = out.prev_sample


def test_epsilon_at_zero_snr_is_not_finite(starter):
    """With `rescale_betas_zero_snr=True`, `prediction_type="epsilon"` and SD's `clip_sample=False`, `DDIMScheduler.step` at t = 999 divides by `sqrt(alphas_cumprod[999]) = 0`: the exact epsilon (which equals x_999) gives NaN, any other gives inf, so zero terminal SNR needs `v_prediction`."""
    scheduler = zero_snr_ddim("epsilon")
    scheduler.set_timesteps(4)
    x = torch.from_numpy(start_noise()).float()
    exact = torch.from_numpy(starter["unet_eps"](x.double().numpy(), 999)).float()
    torch.testing.assert_close(exact, x)  # at SNR 0, eps = x_t: nothing to predict
    assert scheduler.step(exact, 999, x).pred_original_sample.isnan().all()
    scheduler = zero_snr_ddim("epsilon")
    scheduler.set_timesteps(4)
    assert scheduler.step(0.9 * x, 999, x).pred_original_sample.isinf().all()
    assert not np.isfinite(starter["x0_eps"]).any()


def test_guidance_rescale(sd_pipe, guidance_rescale_calls):
    """`StableDiffusionPipeline.__call__` takes `guidance_rescale` (default 0.0) and, only while guiding and only when it is above 0, passes the guided `noise_pred` and `noise_pred_text` to `rescale_noise_cfg`, which rescales the guided prediction to the per-sample std of `noise_pred_text` and mixes it with the unrescaled one by `guidance_rescale`; the result is what `scheduler.step` receives."""
    from diffusers import StableDiffusionPipeline
    from diffusers.pipelines.stable_diffusion import pipeline_stable_diffusion as module

    assert isinstance(sd_pipe, StableDiffusionPipeline)
    calls, steps = guidance_rescale_calls(sd_pipe, module, guidance_scale=7.5, guidance_rescale=0.7)
    assert len(calls) == len(steps) == 2
    for (guided, text, phi, out), model_output in zip(calls, steps, strict=True):
        assert phi == 0.7
        std = lambda x: x.std(dim=list(range(1, x.ndim)), keepdim=True)  # noqa: E731
        torch.testing.assert_close(out, 0.7 * guided * std(text) / std(guided) + 0.3 * guided)
        torch.testing.assert_close(model_output, out)
    for kwargs in (dict(guidance_scale=1.0, guidance_rescale=0.7), dict(guidance_scale=7.5)):
        calls, steps = guidance_rescale_calls(sd_pipe, module, **kwargs)
        assert calls == [] and len(steps) == 2


def test_calculate_shift_and_the_shifted_grid(starter):
    """`calculate_shift` (in `pipeline_flux.py`) defaults to 256, 4096, 0.5, 1.15 and gives mu = 0.5, 0.63, 1.15 and 3.23 for 256, 1024, 4096 and 16384 tokens, as the starter's copy does; `FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True).set_timesteps(sigmas=..., mu=...)` then gives the starter's shifted sigmas followed by 0, and without `mu` it raises `ValueError`; with `use_dynamic_shifting=False` (and the default `shift=1.0`) it ignores `mu` and keeps the sigmas it is given."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    defaults = [p.default for p in list(inspect.signature(calculate_shift).parameters.values())[1:]]
    assert defaults == [256, 4096, 0.5, 1.15]
    for tokens, mu in [(256, 0.5), (1024, 0.63), (4096, 1.15), (16384, 3.23)]:
        assert calculate_shift(tokens) == pytest.approx(mu, abs=5e-4)
        assert starter["calculate_shift"](tokens) == pytest.approx(
            calculate_shift(tokens), abs=1e-12
        )
    plain = FlowMatchEulerDiscreteScheduler()
    plain.set_timesteps(sigmas=np.linspace(1.0, 1 / 4, 4), mu=calculate_shift(4096))
    np.testing.assert_allclose(plain.sigmas[:-1].numpy(), np.linspace(1.0, 1 / 4, 4), rtol=1e-6)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    with pytest.raises(ValueError, match="mu"):
        scheduler.set_timesteps(4)
    for n, tokens in [(4, 256), (28, 4096), (4, 16384)]:
        mu = calculate_shift(tokens)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / n, n), mu=mu)
        np.testing.assert_allclose(scheduler.sigmas[:-1].numpy(), starter["shifted_sigmas"](n, mu), rtol=1e-6)  # fmt: skip
        assert scheduler.sigmas[-1] == 0
        np.testing.assert_allclose(scheduler.timesteps.numpy(), 1000 * scheduler.sigmas[:-1].numpy(), rtol=1e-6)  # fmt: skip


# ---- a tiny FluxPipeline, built in code (``tiny.py``) ----------------------------------


@pytest.fixture(scope="module")
def flux_pipe():
    return tiny_flux_pipeline(vae_config=FLUX_VAE_FACTORS)


def test_guidance_is_an_input_one_call_per_step(flux_pipe, record_calls):
    """With `guidance_embeds=True` the tiny `FluxPipeline` makes one transformer call per step on the un-doubled batch whatever `guidance_scale` is and passes `guidance` = `guidance_scale` to it; the transformer multiplies it by 1000, as it does the timestep, and its `CombinedTimestepGuidanceTextProjEmbeddings` embeds both the same way and adds the two embeddings; `guidance_scale` 1.0 and 3.5 give different images from the same seed."""
    embed = flux_pipe.transformer.time_text_embed
    assert type(embed).__name__ == "CombinedTimestepGuidanceTextProjEmbeddings"
    images = {}
    for scale in (1.0, 3.5):
        embedded = record_calls(embed)
        images[scale], calls = flux_image_and_calls(flux_pipe, record_calls, guidance_scale=scale)
        assert len(calls) == 2 and len(embedded.calls) == 2
        for (_, kwargs), (args, _) in zip(calls, embedded.calls, strict=True):
            assert kwargs["hidden_states"].shape == (1, (HEIGHT // 4) ** 2, 64)
            assert kwargs["guidance"].tolist() == [scale]
            timestep, guidance = args[0], args[1]  # time_text_embed(timestep, guidance, pooled)
            assert guidance.tolist() == [1000 * scale]
            torch.testing.assert_close(timestep, 1000 * kwargs["timestep"])
        embedded.remove()
    assert np.abs(images[3.5] - images[1.0]).max() > 1e-4


def test_true_cfg_doubles_the_calls(flux_pipe, record_calls, monkeypatch):
    """In `FluxPipeline`, `true_cfg_scale > 1` with `negative_prompt_embeds` and `negative_pooled_prompt_embeds` makes two transformer calls per step (conditional, then negative), both still with `guidance` passed, and hands `scheduler.step` `neg_noise_pred + true_cfg_scale * (noise_pred - neg_noise_pred)`; `true_cfg_scale > 1` without a negative prompt stays at one call per step."""
    g = torch.Generator().manual_seed(2)
    negative = dict(
        negative_prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
        negative_pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g),
    )
    outputs, steps = [], []
    hook = flux_pipe.transformer.register_forward_hook(lambda m, a, out: outputs.append(out[0].clone()))  # fmt: skip
    step = flux_pipe.scheduler.step
    monkeypatch.setattr(flux_pipe.scheduler, "step", lambda out, t, x, **kw: steps.append(out.clone()) or step(out, t, x, **kw))  # fmt: skip
    try:
        _, calls = flux_image_and_calls(flux_pipe, record_calls, true_cfg_scale=4.0, **negative)
    finally:
        hook.remove()
    assert len(calls) == 4 and len(steps) == 2
    assert all(kwargs["guidance"] is not None for _, kwargs in calls)
    for k, model_output in enumerate(steps):
        cond_call, neg_call = calls[2 * k][1], calls[2 * k + 1][1]
        torch.testing.assert_close(neg_call["encoder_hidden_states"], negative["negative_prompt_embeds"])  # fmt: skip
        assert not torch.equal(
            cond_call["encoder_hidden_states"], neg_call["encoder_hidden_states"]
        )
        cond, neg = outputs[2 * k], outputs[2 * k + 1]
        torch.testing.assert_close(model_output, neg + 4.0 * (cond - neg))
    monkeypatch.undo()
    _, calls = flux_image_and_calls(flux_pipe, record_calls, true_cfg_scale=4.0)
    assert len(calls) == 2


def test_flux_pipeline_shifts_by_token_count(record_calls, monkeypatch):
    """`FluxPipeline.__call__` passes `sigmas = np.linspace(1.0, 1 / n, n)` and `mu = calculate_shift(latents.shape[1], ...)` to `scheduler.set_timesteps`, where `latents.shape[1]` is the packed token count the transformer sees and the other four arguments are the scheduler config's `base_image_seq_len`, `max_image_seq_len`, `base_shift` and `max_shift`; it defaults to `num_inference_steps=28` and `guidance_scale=3.5`."""
    from diffusers import FluxPipeline
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    pipe = tiny_flux_pipeline(vae_config=FLUX_VAE_FACTORS)
    g = torch.Generator().manual_seed(0)
    embeds = dict(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g), pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g))  # fmt: skip
    recorder = record_calls(pipe.transformer)
    with torch.no_grad():
        pipe(**embeds, height=HEIGHT, width=HEIGHT, output_type="latent")  # defaults
    assert isinstance(pipe, FluxPipeline) and len(recorder.calls) == 28
    assert all(float(kw["guidance"][0]) == 3.5 for _, kw in recorder.calls)
    recorder.remove()
    custom = dict(base_image_seq_len=4, max_image_seq_len=64, base_shift=0.2, max_shift=2.0)
    for config in ({}, custom):
        pipe = tiny_flux_pipeline(vae_config=FLUX_VAE_FACTORS, **config)
        seen = spy_set_timesteps(pipe, monkeypatch)
        _, calls = flux_image_and_calls(pipe, record_calls)
        tokens = calls[0][1]["hidden_states"].shape[1]
        assert tokens == (HEIGHT // 4) ** 2  # 16 px, VAE factor 2, 2 x 2 packing: 4 x 4 tokens
        (kwargs,) = seen
        np.testing.assert_allclose(kwargs["sigmas"], np.linspace(1.0, 1 / 2, 2))
        c = {**dict(base_image_seq_len=256, max_image_seq_len=4096, base_shift=0.5, max_shift=1.15), **config}  # fmt: skip
        expected = calculate_shift(tokens, c["base_image_seq_len"], c["max_image_seq_len"], c["base_shift"], c["max_shift"])  # fmt: skip
        assert kwargs["mu"] == pytest.approx(expected)
        monkeypatch.undo()


# ---------------------------------------------------------------- fixed costs at few steps


def _gflops(fn, *args, **kwargs):
    """GFLOPs of ``fn(*args, **kwargs)`` by torch's FlopCounterMode (2 per multiply-add)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        fn(*args, **kwargs)
    return counter.get_total_flops() / 1e9


def test_fixed_cost_flops_are_the_real_models(starter):
    """The starter's GFLOPs per call are the real models': counted with torch's `FlopCounterMode` on the meta device from the published configs (`model_configs`: SD 1.5's UNet, CLIP text encoder and KL-f8 VAE at 512 px, SDXL's at 1024 px with both text encoders, 77 tokens), and `AutoencoderTiny()`'s default config (TAESD's) decoding the same latents, all at batch 1."""
    from diffusers import AutoencoderTiny
    from model_configs import COMPONENTS, build

    parts = {(c.pipeline, c.component): c for c in COMPONENTS}
    for (pipe, px), key in [(("SD 1.5", 512), "SD 1.5, 512 px"), (("SDXL", 1024), "SDXL, 1024 px")]:  # fmt: skip
        unet, vae = build(parts[pipe, "unet"]), build(parts[pipe, "vae"])
        with torch.device("meta"):
            latents = torch.randn(1, 4, px // 8, px // 8)  # (B, 4, H/8, W/8)
            prompt_embeds = torch.randn(1, 77, unet.config.cross_attention_dim)
            added = dict(text_embeds=torch.randn(1, 1280), time_ids=torch.randn(1, 6))
            input_ids = torch.zeros(1, 77, dtype=torch.long)
            taesd = AutoencoderTiny()
        extra = dict(added_cond_kwargs=added) if pipe == "SDXL" else {}
        t = torch.tensor([999], device="meta")
        encoders = [build(parts[c]) for c in [(pipe, "text_encoder"), (pipe, "text_encoder_2")] if c in parts]  # fmt: skip
        counted = dict(
            unet=_gflops(unet, latents, t, prompt_embeds, **extra),
            vae_decode=_gflops(vae.decode, latents),
            taesd_decode=_gflops(taesd.decode, latents),
            text_encoders=sum(_gflops(encoder, input_ids) for encoder in encoders),
        )
        for name, value in counted.items():
            assert starter["GFLOPS"][key][name] == pytest.approx(value, rel=2e-3, abs=0.06), (key, name)  # fmt: skip


def tiny_taesd(**overrides):
    """A random AutoencoderTiny with two blocks each way: 4 latent channels, scale factor 2."""
    from diffusers import AutoencoderTiny

    torch.manual_seed(0)
    config = dict(
        encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8),
        num_encoder_blocks=(1, 1), num_decoder_blocks=(1, 1),
    )  # fmt: skip
    config.update(overrides)
    return AutoencoderTiny(**config).eval()


def test_autoencoder_tiny_decodes_like_autoencoder_kl():
    """`AutoencoderTiny` (TAESD) is a drop-in decoder: its default config (TAESD's: four blocks each way, 4 latent channels) has `scaling_factor=1.0` and maps SD's `(1, 4, 64, 64)` latents to a `(1, 3, 512, 512)` image, the shape `AutoencoderKL` with SD 1.5's config returns (both on the meta device); its decoder squashes the latents with `tanh(x / 3) * 3` and returns `x.mul(2).sub(1)`, images in AutoencoderKL's [-1, 1] convention (a final layer forced to 0 or 1 gives -1 or 1); encoding an image returns `(B, 4, H/f, W/f)` latents."""
    from diffusers import AutoencoderKL, AutoencoderTiny
    from model_configs import COMPONENTS

    (sd15_vae,) = [c for c in COMPONENTS if (c.pipeline, c.component) == ("SD 1.5", "vae")]
    with torch.device("meta"):
        taesd, kl = AutoencoderTiny(), AutoencoderKL(**sd15_vae.config)
        latents = torch.randn(1, 4, 64, 64)
        assert taesd.config.scaling_factor == 1.0 and taesd.config.latent_channels == 4
        assert taesd.decode(latents).sample.shape == kl.decode(latents).sample.shape == (1, 3, 512, 512)  # fmt: skip
    vae = tiny_taesd()
    x = torch.zeros(1, 4, 8, 8)
    with torch.no_grad():
        assert vae.encode(torch.rand(1, 3, 16, 16) * 2 - 1).latents.shape == (1, 4, 8, 8)
        saturated = [vae.decode(x + v).sample for v in (30.0, 300.0)]
        torch.testing.assert_close(saturated[0], saturated[1])  # tanh(x / 3) * 3 saturates
        last = vae.decoder.layers[-1]
        for value, expected in [(0.0, -1.0), (1.0, 1.0)]:
            handle = last.register_forward_hook(lambda m, a, out, v=value: torch.full_like(out, v))
            assert torch.all(vae.decode(x).sample == expected)
            handle.remove()


def test_autoencoder_tiny_swapped_into_a_pipeline():
    """Set as `pipe.vae` on a `StableDiffusionPipeline`, `AutoencoderTiny` decodes the final latents divided by its `scaling_factor` of 1.0, that is the latents as they are, into the image the pipeline post-processes."""
    from tiny import tiny_sd_pipeline

    pipe = tiny_sd_pipeline()
    pipe.vae = tiny_taesd()
    seen = []
    pipe.vae.decoder.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
    g = torch.Generator().manual_seed(0)
    prompt_embeds = torch.randn(1, 77, 32, generator=g)
    with torch.no_grad():
        latents = pipe(prompt_embeds=prompt_embeds, num_inference_steps=2, guidance_scale=1.0, output_type="latent", generator=torch.Generator().manual_seed(1)).images  # fmt: skip
        image = pipe(prompt_embeds=prompt_embeds, num_inference_steps=2, guidance_scale=1.0, output_type="pt", generator=torch.Generator().manual_seed(1)).images  # fmt: skip
    torch.testing.assert_close(seen[-1], latents)
    assert image.shape == (1, 3, 16, 16)


def test_autoencoder_tiny_in_a_bf16_pipeline(tmp_path):
    """In a bf16 `StableDiffusionPipeline`, `AutoencoderTiny.from_pretrained(...)` without `torch_dtype` loads float32 weights and the decode raises `RuntimeError` (input and parameter dtypes differ); `AutoencoderTiny.from_pretrained(..., torch_dtype=pipe.dtype).to(pipe.device)` decodes the pipeline's latents into a bf16 image."""
    from diffusers import AutoencoderTiny
    from tiny import tiny_sd_pipeline

    tiny_taesd().save_pretrained(tmp_path / "taesd")  # stands in for "madebyollin/taesd"
    pipe = tiny_sd_pipeline().to(torch.bfloat16)
    prompt_embeds = torch.randn(1, 77, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)  # fmt: skip
    common = dict(prompt_embeds=prompt_embeds, num_inference_steps=2, guidance_scale=1.0, output_type="pt")  # fmt: skip
    pipe.vae = AutoencoderTiny.from_pretrained(tmp_path / "taesd")
    assert pipe.vae.dtype == torch.float32
    with (
        torch.no_grad(),
        pytest.raises(
            RuntimeError, match=r"Input type .* and (bias|weight) type .* should be the same"
        ),
    ):
        pipe(**common)
    pipe.vae = AutoencoderTiny.from_pretrained(tmp_path / "taesd", torch_dtype=pipe.dtype).to(pipe.device)  # fmt: skip
    with torch.no_grad():
        image = pipe(**common).images
    assert image.dtype == torch.bfloat16 and image.shape == (1, 3, 16, 16)


def test_prompt_embeds_skip_the_text_encoder():
    """`StableDiffusionPipeline.__call__` given `prompt_embeds` and `negative_prompt_embeds` never calls its text encoder, nor given `prompt_embeds` alone at `guidance_scale <= 1`; given `prompt_embeds` alone with CFG on, it still calls it once, to encode the empty negative prompt; given a prompt with CFG on, it calls it twice (the prompt, then the negative prompt), and the two calls give the same latents when the embeddings are the ones `encode_prompt` returns: cached embeddings are the whole text-encoder cost saved."""
    from tiny import tiny_sd_pipeline, tiny_text_encoder, tiny_tokenizer

    pipe = tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer())
    calls = []
    pipe.text_encoder.register_forward_pre_hook(lambda m, a, k=None: calls.append(1))
    common = dict(num_inference_steps=2, guidance_scale=7.5, output_type="latent")
    with torch.no_grad():
        from_prompt = pipe("a cat", generator=torch.Generator().manual_seed(0), **common).images
        assert len(calls) == 2
        prompt_embeds, negative_prompt_embeds = pipe.encode_prompt("a cat", "cpu", 1, True)
        calls.clear()
        cached = pipe(prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_prompt_embeds, generator=torch.Generator().manual_seed(0), **common).images  # fmt: skip
    assert calls == []
    torch.testing.assert_close(cached, from_prompt)
    with torch.no_grad():
        pipe(prompt_embeds=prompt_embeds, **common)  # CFG on, no negative_prompt_embeds
        assert len(calls) == 1
        calls.clear()
        pipe(prompt_embeds=prompt_embeds, **{**common, "guidance_scale": 1.0})
    assert calls == []


def test_flop_counter_counts_matmuls_convolutions_and_attention_only():
    """torch's `FlopCounterMode`, which counts the starter's GFLOPs, counts 2 per multiply-add in matmuls, convolutions and attention only: a group norm, a SiLU, a nearest upsampling and a softmax count 0, so the decoder's full-resolution elementwise work is not in the table. Attention counts on the meta device, where `scaled_dot_product_attention` runs as two batched matmuls; on CPU tensors its fused CPU kernel counts 0."""
    from torch.nn import functional

    x = torch.randn(1, 8, 16, 16)
    assert _gflops(torch.nn.Conv2d(8, 8, 3, padding=1), x) == 2 * 8 * 8 * 9 * 16 * 16 / 1e9
    q = torch.randn(1, 2, 16, 4)  # (B, heads, tokens, head_dim)
    attention = 2 * (2 * 2 * 16 * 16 * 4) / 1e9  # QK^T and PV, 2 FLOPs per multiply-add
    assert _gflops(functional.scaled_dot_product_attention, *[q.to("meta")] * 3) == attention
    assert _gflops(functional.scaled_dot_product_attention, q, q, q) == 0
    for fn in (torch.nn.GroupNorm(4, 8), functional.silu, lambda t: functional.interpolate(t, scale_factor=2.0), lambda t: t.softmax(-1)):  # fmt: skip
        assert _gflops(fn, x) == 0


def test_sdxl_zeroes_a_missing_negative_prompt():
    """`StableDiffusionXLPipeline` (its config's `force_zeros_for_empty_prompt` is True by default) run at its default `guidance_scale` with `prompt_embeds` and no negative prompt (`negative_prompt=None`, the default) gives the UNet an all-zero negative half of `encoder_hidden_states` and calls no text encoder, so its text encoders run once per prompt, not twice: the starter's count with CFG is an upper bound for SDXL. An explicit `negative_prompt=""` is encoded: both text encoders run and the negative half is not zero."""
    from diffusers import StableDiffusionXLPipeline
    from tiny import tiny_sdxl_pipeline, tiny_text_encoder, tiny_tokenizer

    tok = tiny_tokenizer()
    parts = {**tiny_sdxl_pipeline().components, "tokenizer": tok, "tokenizer_2": tok}
    parts.update(text_encoder=tiny_text_encoder(16), text_encoder_2=tiny_text_encoder(16, seed=1, with_projection=True, projection_dim=16))  # fmt: skip
    pipe = StableDiffusionXLPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.config.force_zeros_for_empty_prompt is True
    g = torch.Generator().manual_seed(0)
    prompt_embeds, pooled = torch.randn(1, 77, 32, generator=g), torch.randn(1, 16, generator=g)
    seen, encoded = [], []
    pipe.unet.register_forward_pre_hook(lambda m, a, k: seen.append(k["encoder_hidden_states"]), with_kwargs=True)  # fmt: skip
    for encoder in (pipe.text_encoder, pipe.text_encoder_2):
        encoder.register_forward_pre_hook(lambda m, a: encoded.append(m))
    for negative_prompt in (None, ""):
        seen.clear(), encoded.clear()
        kwargs = {} if negative_prompt is None else {"negative_prompt": negative_prompt}
        with torch.no_grad():
            pipe(prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled, num_inference_steps=2, height=32, width=32, output_type="latent", **kwargs)  # fmt: skip
        assert all(ehs.shape[0] == 2 for ehs in seen)  # CFG on at the default guidance_scale
        negative = seen[0][:1]
        torch.testing.assert_close(seen[0][1:], prompt_embeds)
        if negative_prompt is None:
            assert encoded == [] and torch.count_nonzero(negative) == 0
        else:
            assert encoded == [pipe.text_encoder, pipe.text_encoder_2]
            assert torch.count_nonzero(negative) > 0


def test_dpm_exercise_checks_against_dpm_solver_multistep_step():
    """The solution `check_dpm.py` checks your `dpm_solver_update` against gives the `prev_sample` of `DPMSolverMultistepScheduler.step` (`algorithm_type="dpmsolver++"`, `solver_order=2`, `solver_type="midpoint"`) to within 1e-5, step after step, on every case the checker tries: SD's trailing grids at 1, 2, 4 and 8 steps ending at the smallest training sigma, the first step first order and the others second order as with `lower_order_final=False` (its default, True, makes the last step of each of these grids first order), the x0_hat of the step before as m1."""
    import runpy
    import sys
    from unittest import mock

    from infralens_docs.registry import ROOT
    from labkit.blanks import load_function

    checker = ROOT / "code/lab-13-few-step-sampling/check_dpm.py"
    with mock.patch.object(sys, "argv", [str(checker), "--solution"]):
        found = runpy.run_path(str(checker), run_name="__main__")
    solution = load_function(found["SOLUTION"], "dpm_solver_update")
    orders, default_orders = [], []

    def spied(**config):
        """The scheduler, and the list its step appends the order of each update it takes to."""
        scheduler = DPMSolverMultistepScheduler(**SD_BETAS, timestep_spacing="trailing", final_sigmas_type="sigma_min", prediction_type="sample", **config)  # fmt: skip
        taken = []
        for order, method in ((1, "dpm_solver_first_order_update"), (2, "multistep_dpm_solver_second_order_update")):  # fmt: skip
            update = getattr(scheduler, method)
            setattr(scheduler, method, lambda *a, _u=update, _o=order, **k: (taken.append(_o), _u(*a, **k))[1])  # fmt: skip
        return scheduler, taken

    for label, (sigmas, i, sample, m0, m1) in found["CASES"]:
        if i == 0:  # a new grid; prediction_type="sample": the model output is x0_hat itself
            theirs, taken = spied(lower_order_final=False)
            assert (theirs.config.algorithm_type, theirs.config.solver_order, theirs.config.solver_type) == ("dpmsolver++", 2, "midpoint")  # fmt: skip
            theirs.set_timesteps(len(sigmas) - 1)
            np.testing.assert_allclose(sigmas, theirs.sigmas.numpy(), rtol=1e-4)  # float32 rounding
            default, default_taken = spied()  # lower_order_final's default, True
            default.set_timesteps(len(sigmas) - 1)
        t = theirs.timesteps[i]
        prev = theirs.step(torch.from_numpy(m0), t, torch.from_numpy(sample)).prev_sample
        assert taken[-1] == (1 if m1 is None else 2), label  # the update diffusers called
        orders.append(taken[-1])
        default.step(torch.from_numpy(m0), t, torch.from_numpy(sample))
        if i == len(sigmas) - 2:  # the last step: first order by default (on these grids)
            default_orders.append(default_taken[-1])
        mine = solution(theirs.sigmas.double().numpy(), i, sample, m0, m1)
        np.testing.assert_allclose(mine, prev.double().numpy(), rtol=1e-5, atol=1e-5, err_msg=label)  # fmt: skip
    assert set(orders) == {1, 2} and orders[-1] == 2
    assert default_orders == [1, 1, 1, 1]  # the last step of the 1-, 2-, 4- and 8-step grids
