"""Lab 01 (forward noise process) against the installed diffusers.

The starter runs in-process and its own arrays go to diffusers' ``DDPMScheduler``,
which must give the same numbers to float32 tolerance (diffusers keeps its
schedule tensors in float32; the lab computes in float64).
"""

import numpy as np
import pytest
import torch
from diffusers import DDPMScheduler
from tiny import canonical_beta_range, t64

from labkit import BETA_SCHEDULES, alphas_cumprod, make_betas

LAB01 = "code/lab-01-forward-noise-process/forward_noise.py"


@pytest.mark.parametrize("schedule", BETA_SCHEDULES)
@pytest.mark.parametrize("beta_range", [(0.0001, 0.02), (0.00085, 0.012)])
def test_betas_and_alphas_cumprod(schedule, beta_range):
    """The lab's `betas` and `alphas_cumprod` for `linear`, `scaled_linear` and `squaredcos_cap_v2` equal `DDPMScheduler.betas` and `.alphas_cumprod`, for DDPM's and SD's beta ranges."""
    ours = make_betas(schedule, 1000, *beta_range)
    theirs = DDPMScheduler(beta_schedule=schedule, beta_start=beta_range[0], beta_end=beta_range[1])
    np.testing.assert_allclose(ours, theirs.betas.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        alphas_cumprod(ours), theirs.alphas_cumprod.numpy(), rtol=1e-4, atol=1e-7
    )


def test_ddpm_scheduler_defaults_the_pages_quote():
    """`DDPMScheduler()` defaults to 1000 training timesteps, a `linear` schedule from 0.0001 to 0.02, `prediction_type="epsilon"`, `variance_type="fixed_small"` and `clip_sample=True`."""
    config = DDPMScheduler().config
    assert (config.num_train_timesteps, config.beta_start, config.beta_end) == (1000, 0.0001, 0.02)
    assert config.beta_schedule == "linear"
    assert config.prediction_type == "epsilon"
    assert config.variance_type == "fixed_small"
    assert config.clip_sample is True  # meant for pixels in [-1, 1]; the labs do not clip


@pytest.mark.parametrize("schedule", BETA_SCHEDULES)
def test_lab01_forward_formula_is_add_noise(run_lab, schedule):
    """The starter's `x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) eps` is what `DDPMScheduler.add_noise(original_samples, noise, timesteps)` returns, at every timestep the lab prints."""
    g = run_lab(LAB01, "--schedule", schedule, "--num-samples", "500")
    scheduler = DDPMScheduler(beta_schedule=schedule, **canonical_beta_range(schedule))
    for t, x_t in g["noised"].items():
        timesteps = torch.full((len(x_t),), t, dtype=torch.long)
        theirs = scheduler.add_noise(t64(g["x0"]), t64(g["noise"]), timesteps)
        np.testing.assert_allclose(x_t, theirs.numpy(), rtol=1e-5, atol=1e-5)


def test_no_standard_schedule_reaches_zero_signal():
    """None of diffusers' three schedules reaches `alphas_cumprod[999] == 0`: some signal survives at the last training timestep, unless `rescale_betas_zero_snr=True`."""
    for schedule in BETA_SCHEDULES:
        scheduler = DDPMScheduler(beta_schedule=schedule, **canonical_beta_range(schedule))
        assert float(scheduler.alphas_cumprod[-1]) > 0.0, schedule
        rescaled = DDPMScheduler(
            beta_schedule=schedule, rescale_betas_zero_snr=True, **canonical_beta_range(schedule)
        )
        assert float(rescaled.alphas_cumprod[-1]) == 0.0, schedule


def test_add_noise_broadcasts_one_level_per_example():
    """`add_noise` with `timesteps` of shape `(B,)` gathers `alphas_cumprod[timesteps]` and broadcasts it as `(B, 1, 1, 1)` over the channels and space of `(B, 4, h, w)` latents: each example is noised at its own level."""
    scheduler = DDPMScheduler(
        beta_schedule="scaled_linear", **canonical_beta_range("scaled_linear")
    )
    g = torch.Generator().manual_seed(0)
    x0, noise = (torch.randn(3, 4, 8, 8, generator=g, dtype=torch.float64) for _ in range(2))
    timesteps = torch.tensor([10, 500, 990])
    ab = scheduler.alphas_cumprod.double()[timesteps].reshape(3, 1, 1, 1)
    expected = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
    torch.testing.assert_close(scheduler.add_noise(x0, noise, timesteps), expected)
