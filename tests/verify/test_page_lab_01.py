"""Lab 01 (forward noise process) against the installed diffusers.

The starter runs in-process and its own arrays go to diffusers' ``DDPMScheduler``,
which must give the same numbers to float32 tolerance (diffusers keeps its
schedule tensors in float32; the lab computes in float64).
"""

import numpy as np
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    PNDMScheduler,
)
from tiny import SD15_SCHEDULER_FILE, accepted_beta_schedules, canonical_beta_range, t64

from labkit import BETA_SCHEDULES

LAB01 = "code/lab-01-forward-noise-process/forward_noise.py"


@pytest.mark.parametrize("schedule", BETA_SCHEDULES)
def test_betas_and_alphas_cumprod(run_lab, schedule):
    """The starter's `betas` and `alphas_cumprod` for `--schedule linear`, `scaled_linear` and `squaredcos_cap_v2` equal `DDPMScheduler.betas` and `.alphas_cumprod` built with that name and the beta range the starter uses (DDPM's for `linear`, SD's for `scaled_linear`)."""
    g = run_lab(LAB01, "--schedule", schedule, "--num-samples", "100", "--timesteps", "0")
    theirs = DDPMScheduler(beta_schedule=schedule, **canonical_beta_range(schedule))
    np.testing.assert_allclose(g["betas"], theirs.betas.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g["alpha_bar"], theirs.alphas_cumprod.numpy(), rtol=1e-4, atol=1e-7)


def test_the_starter_takes_three_of_diffusers_schedules():
    """`--schedule` takes three of the `beta_schedule` names diffusers' `DDPMScheduler` accepts; `sigmoid` and `laplace` are the others."""
    accepted = accepted_beta_schedules()
    assert set(BETA_SCHEDULES) < accepted
    assert accepted - set(BETA_SCHEDULES) == {"sigmoid", "laplace"}


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


@pytest.mark.parametrize("beta_range", [(0.0001, 0.02), (0.00085, 0.012)])
def test_no_standard_schedule_reaches_zero_signal(beta_range):
    """No `beta_schedule` that `DDPMScheduler` accepts (the lab's three, `sigmoid` and `laplace`) reaches `alphas_cumprod[999] == 0` with DDPM's or SD's beta range: some signal survives at the last training timestep, unless `rescale_betas_zero_snr=True`."""
    start, end = beta_range
    for schedule in accepted_beta_schedules():
        scheduler = DDPMScheduler(beta_schedule=schedule, beta_start=start, beta_end=end)
        assert float(scheduler.alphas_cumprod[-1]) > 0.0, schedule
        rescaled = DDPMScheduler(
            beta_schedule=schedule, rescale_betas_zero_snr=True, beta_start=start, beta_end=end
        )
        assert float(rescaled.alphas_cumprod[-1]) == 0.0, schedule


def test_cosine_terminal_signal_is_zero_in_practice():
    """Under `squaredcos_cap_v2`, `alphas_cumprod[999]` is zero in practice (below 1e-8), kept above it only by the 0.999 cap on the last beta; `linear` and `scaled_linear` keep far more signal there (above 1e-5)."""
    cosine = DDPMScheduler(beta_schedule="squaredcos_cap_v2").alphas_cumprod.double()
    assert 0 < cosine[999] < 1e-8
    assert (cosine[999] / cosine[998]).item() == pytest.approx(1 - 0.999, rel=1e-3)
    for schedule in ["linear", "scaled_linear"]:
        scheduler = DDPMScheduler(beta_schedule=schedule, **canonical_beta_range(schedule))
        assert scheduler.alphas_cumprod[999] > 1e-5, schedule


def test_add_noise_broadcasts_one_level_per_example():
    """`DDPMScheduler.add_noise` with `timesteps` of shape `(B,)` gathers `alphas_cumprod[timesteps]` and broadcasts it as `(B, 1, 1, 1)` over the channels and space of `(B, 4, h, w)` latents: each example is noised at its own level."""
    scheduler = DDPMScheduler(
        beta_schedule="scaled_linear", **canonical_beta_range("scaled_linear")
    )
    g = torch.Generator().manual_seed(0)
    x0, noise = (torch.randn(3, 4, 8, 8, generator=g, dtype=torch.float64) for _ in range(2))
    timesteps = torch.tensor([10, 500, 990])
    ab = scheduler.alphas_cumprod.double()[timesteps].reshape(3, 1, 1, 1)
    expected = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
    torch.testing.assert_close(scheduler.add_noise(x0, noise, timesteps), expected)


def test_add_noise_reads_alphas_cumprod_in_ddpm_not_in_every_scheduler():
    """`DDPMScheduler.add_noise` indexes `alphas_cumprod`, but not every diffusers scheduler does: `EulerDiscreteScheduler.add_noise` returns `x0 + sigma * noise`, and `FlowMatchEulerDiscreteScheduler` has no `alphas_cumprod` and no `add_noise`."""
    g = torch.Generator().manual_seed(0)
    x0, noise = (torch.randn(2, 4, 8, 8, generator=g) for _ in range(2))
    kwargs = canonical_beta_range("scaled_linear")
    ddpm = DDPMScheduler(beta_schedule="scaled_linear", **kwargs)
    euler = EulerDiscreteScheduler(beta_schedule="scaled_linear", **kwargs)
    euler.set_timesteps(10)
    t = euler.timesteps[2:3].repeat(2)
    ab = ddpm.alphas_cumprod[t.round().long()].reshape(2, 1, 1, 1)
    sigma = euler.sigmas[2]
    torch.testing.assert_close(euler.add_noise(x0, noise, t), x0 + sigma * noise)
    assert sigma == pytest.approx(((1 - ab[0]) / ab[0]).sqrt().item(), rel=1e-4)
    assert not torch.allclose(
        euler.add_noise(x0, noise, t), ab.sqrt() * x0 + (1 - ab).sqrt() * noise
    )
    flow = FlowMatchEulerDiscreteScheduler()
    assert not hasattr(flow, "alphas_cumprod") and not hasattr(flow, "add_noise")


def test_from_config_rebuilds_the_checkpoints_alphas_cumprod():
    """A sampler swapped in with `DDIMScheduler.from_config(config)`, `config` SD 1.5's shipped `PNDMScheduler` config, rebuilds the `alphas_cumprod` of the scheduler it replaces, while `DDIMScheduler()` from defaults does not."""
    shipped = PNDMScheduler.from_config(SD15_SCHEDULER_FILE)
    swapped = DDIMScheduler.from_config(shipped.config)
    assert torch.equal(swapped.alphas_cumprod, shipped.alphas_cumprod)
    assert not torch.allclose(DDIMScheduler().alphas_cumprod, shipped.alphas_cumprod)
