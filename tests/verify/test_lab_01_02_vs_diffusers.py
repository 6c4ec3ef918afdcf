"""Labs 01-02 against the installed diffusers: schedules, add_noise, one DDPM/DDIM step.

Each test feeds the *starter's own arrays* (run in-process) to the diffusers
class and asserts the same numbers, to float32 tolerance (diffusers keeps its
schedule tensors in float32; the labs compute in float64).
"""

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from labkit import BETA_SCHEDULES, alphas_cumprod, make_betas
from labkit.schedules import CANONICAL_BETA_RANGE

LAB01 = "code/lab-01-forward-noise-process/forward_noise.py"
LAB02 = "code/lab-02-denoising-step/denoising_step.py"


def t64(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(torch.float64)


@pytest.mark.parametrize("schedule", BETA_SCHEDULES)
@pytest.mark.parametrize("beta_range", [(0.0001, 0.02), (0.00085, 0.012)])
def test_betas_and_alphas_cumprod(schedule, beta_range):
    ours = make_betas(schedule, 1000, *beta_range)
    theirs = DDPMScheduler(beta_schedule=schedule, beta_start=beta_range[0], beta_end=beta_range[1])
    np.testing.assert_allclose(ours, theirs.betas.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        alphas_cumprod(ours), theirs.alphas_cumprod.numpy(), rtol=1e-4, atol=1e-7
    )


def test_ddpm_scheduler_defaults_the_pages_quote():
    config = DDPMScheduler().config
    assert (config.num_train_timesteps, config.beta_start, config.beta_end) == (1000, 0.0001, 0.02)
    assert config.beta_schedule == "linear"
    assert config.prediction_type == "epsilon"
    assert config.variance_type == "fixed_small"
    assert config.clip_sample is True  # meant for pixels in [-1, 1]; the labs do not clip


@pytest.mark.parametrize("schedule", BETA_SCHEDULES)
def test_lab01_forward_formula_is_add_noise(run_lab, schedule):
    g = run_lab(LAB01, "--schedule", schedule, "--num-samples", "500")
    scheduler = DDPMScheduler(beta_schedule=schedule, **_range(schedule))
    for t, x_t in g["noised"].items():
        timesteps = torch.full((len(x_t),), t, dtype=torch.long)
        theirs = scheduler.add_noise(t64(g["x0"]), t64(g["noise"]), timesteps)
        np.testing.assert_allclose(x_t, theirs.numpy(), rtol=1e-5, atol=1e-5)


def _range(schedule: str) -> dict:
    start, end = CANONICAL_BETA_RANGE[schedule]
    return {"beta_start": start, "beta_end": end}


STEP_CASES = [
    ("linear", 500, 10),
    ("linear", 500, 1000),
    ("linear", 500, 2),
    ("scaled_linear", 700, 10),
    ("squaredcos_cap_v2", 300, 50),
]


@pytest.mark.parametrize(("schedule", "timestep", "steps"), STEP_CASES)
def test_lab02_ddpm_step_is_ddpm_scheduler_step(run_lab, schedule, timestep, steps):
    g = run_lab(
        LAB02, "--schedule", schedule, "--timestep", str(timestep),
        "--num-inference-steps", str(steps), "--num-samples", "500",
    )  # fmt: skip
    scheduler = DDPMScheduler(beta_schedule=schedule, clip_sample=False, **_range(schedule))
    scheduler.set_timesteps(steps)
    assert timestep in scheduler.timesteps
    assert int(scheduler.previous_timestep(timestep)) == g["prev_timestep"]

    latent, noise_pred = t64(g["latent"]), t64(g["noise_pred"])
    out = scheduler.step(noise_pred, timestep, latent, generator=torch.Generator().manual_seed(0))
    np.testing.assert_allclose(
        g["pred_original_sample"], out.pred_original_sample.numpy(), atol=1e-4
    )

    # diffusers draws its own step noise; redraw it to split prev_sample into mean + noise.
    z = torch.randn(latent.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    variance = float(scheduler._get_variance(timestep))
    np.testing.assert_allclose(g["variance"], variance, rtol=1e-4, atol=1e-7)  # float32 1 - ab
    theirs_mean = out.prev_sample - variance**0.5 * z
    np.testing.assert_allclose(g["pred_prev_sample"], theirs_mean.numpy(), atol=1e-4)


@pytest.mark.parametrize(("schedule", "timestep", "steps"), STEP_CASES)
def test_lab02_ddim_step_is_ddim_scheduler_step(run_lab, schedule, timestep, steps):
    g = run_lab(
        LAB02, "--schedule", schedule, "--timestep", str(timestep),
        "--num-inference-steps", str(steps), "--num-samples", "500",
    )  # fmt: skip
    scheduler = DDIMScheduler(beta_schedule=schedule, clip_sample=False, **_range(schedule))
    scheduler.set_timesteps(steps)
    out = scheduler.step(t64(g["noise_pred"]), timestep, t64(g["latent"]), eta=0.0)
    np.testing.assert_allclose(g["latent_prev_ddim"], out.prev_sample.numpy(), atol=1e-4)
    np.testing.assert_allclose(
        g["pred_original_sample"], out.pred_original_sample.numpy(), atol=1e-4
    )


@pytest.mark.parametrize("prediction_type", ["sample", "v_prediction"])
def test_lab02_conversions_are_what_the_scheduler_does(run_lab, prediction_type):
    """Feeding diffusers the lab's x0 or v output, with the matching prediction_type,
    recovers the same pred_original_sample as the epsilon path."""
    g = run_lab(LAB02, "--num-samples", "500")
    model_output = g["pred_original_sample"] if prediction_type == "sample" else g["v_pred"]
    scheduler = DDIMScheduler(clip_sample=False, prediction_type=prediction_type)
    scheduler.set_timesteps(10)
    out = scheduler.step(t64(model_output), g["timestep"], t64(g["latent"]), eta=0.0)
    np.testing.assert_allclose(
        g["pred_original_sample"], out.pred_original_sample.numpy(), atol=1e-4
    )
    np.testing.assert_allclose(g["latent_prev_ddim"], out.prev_sample.numpy(), atol=1e-4)
