"""labkit.schedulers against the installed diffusers: same inputs in, same numbers out.

Each test builds our NumPy scheduler and diffusers' class with the same config, feeds both
identical random inputs (and identical step noise), and compares. Finally whole sampling
loops run side by side on the toy data with the exact denoiser.

Tolerances: diffusers keeps betas, alphas_cumprod and sigmas in float32 torch tensors (and
its Euler / flow steps cast ``sample`` to float32), while labkit computes in float64. So we
compare to float32 accuracy *relative to each array's scale*: ``close`` allows 1e-5 of
max(1, max |expected|). Per-element relative error is the wrong yardstick here: float32
alpha_bar is off by ~1e-7, which is ~1e-4 relative in sigma near t = 0 (1 - alpha_bar is
tiny there, but so is sigma), and in ``x + dt * eps`` where the two terms nearly cancel.
A whole loop compounds the per-step errors, and a trajectory near the boundary between two
modes amplifies them (measured: up to 2.5e-4 of the latents' size in the 1000-step DDPM
loop, < 1e-4 elsewhere), hence LOOP_REL = 1e-3. Given our float64 alpha_bar, diffusers'
DDPM and DDIM loops agree with ours to 1e-12: the formulas are identical.
"""

import inspect

import diffusers
import numpy as np
import pytest
import torch

from labkit import ExactDenoiser, FlowMatchDenoiser, alphas_cumprod, canonical_betas
from labkit import schedulers as ours
from labkit.data import default_mixture
from labkit.schedules import CANONICAL_BETA_RANGE

REL = 1e-5
LOOP_REL = 1e-3

SPACINGS = ["leading", "trailing", "linspace"]
STEP_COUNTS = [1, 7, 10, 50, 1000]
PREDICTION_TYPES = ["epsilon", "sample", "v_prediction"]
SCHEDULER_NAMES = [
    "DDPMScheduler",
    "DDIMScheduler",
    "EulerDiscreteScheduler",
    "FlowMatchEulerDiscreteScheduler",
]


def t64(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(torch.float64)


def close(actual, desired, rel: float = REL) -> None:
    """Agreement to ``rel`` of the expected array's scale (at least 1): float32 accuracy."""
    desired = desired.numpy() if isinstance(desired, torch.Tensor) else np.asarray(desired)
    scale = max(1.0, float(np.abs(desired).max()))
    np.testing.assert_allclose(actual, desired, rtol=rel, atol=rel * scale)


def pair(name: str, **config):
    """(ours, theirs): the same class name from labkit.schedulers and from diffusers."""
    return getattr(ours, name)(**config), getattr(diffusers, name)(**config)


def torch_noise(shape: tuple, seed: int) -> torch.Tensor:
    """What diffusers' randn_tensor draws for a float64 model_output on the CPU."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def random_inputs(shape=(2, 3, 4, 4), seed=0, scale=2.0):
    """(model_output, sample): 4-D like SD latents; scale 2 so clip_sample really clips."""
    rng = np.random.default_rng(seed)
    return scale * rng.standard_normal(shape), scale * rng.standard_normal(shape)


# ----------------------------------------------------------------------------- contract


@pytest.mark.parametrize("name", SCHEDULER_NAMES)
def test_constructor_names_and_defaults_are_diffusers(name):
    """Every constructor keyword of labkit's `DDPMScheduler`, `DDIMScheduler`, `EulerDiscreteScheduler` and `FlowMatchEulerDiscreteScheduler` exists in diffusers' class with the same default."""
    ours_params = inspect.signature(getattr(ours, name).__init__).parameters
    theirs_params = inspect.signature(getattr(diffusers, name).__init__).parameters
    for param in list(ours_params.values())[1:]:
        assert param.name in theirs_params, param.name
        assert param.default == theirs_params[param.name].default, param.name


@pytest.mark.parametrize("name", SCHEDULER_NAMES[:3])
def test_config_attributes_like_diffusers(name):
    """The config attributes, `betas` and `alphas_cumprod` of labkit's DDPM, DDIM and Euler schedulers equal diffusers' for the same config."""
    mine, theirs = pair(name, prediction_type="v_prediction", steps_offset=1)
    for key in vars(mine.config):
        assert getattr(mine.config, key) == getattr(theirs.config, key), key
        assert getattr(mine, key) == getattr(theirs.config, key), key
    close(mine.betas, theirs.betas)
    close(mine.alphas_cumprod, theirs.alphas_cumprod)


def test_diffusers_flow_match_has_no_scale_model_input():
    """diffusers' `FlowMatchEulerDiscreteScheduler` defines neither `scale_model_input` nor `init_noise_sigma`; labkit's adds an identity so one loop fits all four classes."""
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler()
    assert not hasattr(scheduler, "scale_model_input")
    assert not hasattr(scheduler, "init_noise_sigma")
    assert ours.FlowMatchEulerDiscreteScheduler().scale_model_input is not None


# ----------------------------------------------------------------------------- timesteps


@pytest.mark.parametrize("name", ["DDPMScheduler", "DDIMScheduler"])
@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("n", STEP_COUNTS)
@pytest.mark.parametrize("steps_offset", [0, 1])
def test_integer_timesteps(name, spacing, n, steps_offset):
    """DDPM and DDIM `timesteps` (int64) match diffusers for `leading`, `trailing` and `linspace`, `steps_offset` 0 and 1, at 1, 7, 10, 50 and 1000 steps, and so does DDPM's `previous_timestep`."""
    mine, theirs = pair(name, timestep_spacing=spacing, steps_offset=steps_offset)
    np.testing.assert_array_equal(mine.timesteps, theirs.timesteps.numpy())  # before set
    mine.set_timesteps(n)
    theirs.set_timesteps(n)
    assert mine.timesteps.dtype == np.int64
    np.testing.assert_array_equal(mine.timesteps, theirs.timesteps.numpy())
    if name == "DDPMScheduler":
        for t in mine.timesteps:
            assert mine.previous_timestep(t) == int(theirs.previous_timestep(int(t)))


def test_ddpm_previous_timestep_before_set_timesteps():
    """Before `set_timesteps`, DDPM's `previous_timestep(t)` is `t - 1` in both."""
    mine, theirs = pair("DDPMScheduler")
    for t in (999, 500, 0):
        assert mine.previous_timestep(t) == theirs.previous_timestep(t) == t - 1


@pytest.mark.parametrize("name", ["DDPMScheduler", "DDIMScheduler"])
def test_set_timesteps_above_num_train_timesteps_raises_in_both(name):
    """`set_timesteps(1001)` raises `ValueError` in both, for DDPM and DDIM."""
    mine, theirs = pair(name)
    for scheduler in (mine, theirs):
        with pytest.raises(ValueError):
            scheduler.set_timesteps(1001)


# ----------------------------------------------------------------------------- DDPM


@pytest.mark.parametrize("prediction_type", PREDICTION_TYPES)
@pytest.mark.parametrize("variance_type", ["fixed_small", "fixed_large"])
@pytest.mark.parametrize("clip_sample", [False, True])
def test_ddpm_step(prediction_type, variance_type, clip_sample):
    """A DDPM `step` matches diffusers for every `prediction_type`, both fixed `variance_type`s, and `clip_sample` on and off."""
    config = dict(
        prediction_type=prediction_type,
        variance_type=variance_type,
        clip_sample=clip_sample,
        clip_sample_range=1.5,
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
    )
    mine, theirs = pair("DDPMScheduler", **config)
    mine.set_timesteps(7)
    theirs.set_timesteps(7)
    model_output, sample = random_inputs()
    for k, t in enumerate(mine.timesteps):  # the last one, t = 0, adds no noise
        z = torch_noise(sample.shape, k)
        out = mine.step(model_output, t, sample, variance_noise=z.numpy())
        ref = theirs.step(
            t64(model_output), int(t), t64(sample), generator=torch.Generator().manual_seed(k)
        )
        close(out.prev_sample, ref.prev_sample.numpy())
        close(out.pred_original_sample, ref.pred_original_sample.numpy())
        assert out.prev_sample.shape == sample.shape


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("steps_offset", [0, 1])
def test_ddpm_step_every_spacing(spacing, steps_offset):
    """A DDPM `step` matches diffusers on every spacing's grid, including one that ends at `t = 1`.

    Including a schedule that ends at t = 1 (leading + steps_offset = 1): diffusers
    clamps the last variance to 1e-20 and still adds (negligible) noise."""
    mine, theirs = pair(
        "DDPMScheduler", timestep_spacing=spacing, steps_offset=steps_offset, clip_sample=False
    )
    mine.set_timesteps(10)
    theirs.set_timesteps(10)
    model_output, sample = random_inputs(shape=(16, 2))
    for k, t in enumerate(mine.timesteps):
        out = mine.step(
            model_output, t, sample, variance_noise=torch_noise(sample.shape, k).numpy()
        )
        ref = theirs.step(
            t64(model_output), int(t), t64(sample), generator=torch.Generator().manual_seed(k)
        )
        close(out.prev_sample, ref.prev_sample.numpy())


def test_ddpm_step_before_set_timesteps():
    """DDPM single-step jumps `t -> t - 1` near `t = 0`, before `set_timesteps`, match diffusers.

    Single-step jumps t -> t - 1 near t = 0: beta_t' = 1 - alpha_bar_t / alpha_bar_prev
    is ~1e-4, and float32 cancellation leaves diffusers ~5e-4 relative off the float64
    value. So here diffusers gets our float64 alpha_bar: the formulas agree to 1e-12."""
    mine, theirs = pair("DDPMScheduler", clip_sample=False)
    theirs.alphas_cumprod = torch.from_numpy(mine.alphas_cumprod)
    model_output, sample = random_inputs(shape=(16, 2))
    for k, t in enumerate([999, 500, 1, 0]):
        z = torch_noise(sample.shape, k).numpy()
        out = mine.step(model_output, t, sample, variance_noise=z)
        ref = theirs.step(
            t64(model_output), t, t64(sample), generator=torch.Generator().manual_seed(k)
        )
        np.testing.assert_allclose(out.prev_sample, ref.prev_sample.numpy(), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- DDIM


@pytest.mark.parametrize("prediction_type", PREDICTION_TYPES)
@pytest.mark.parametrize("set_alpha_to_one", [True, False])
@pytest.mark.parametrize("clip_sample", [False, True])
@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_ddim_step(prediction_type, set_alpha_to_one, clip_sample, eta):
    """A DDIM `step` matches diffusers for every `prediction_type`, `set_alpha_to_one` both ways, `clip_sample` on and off, and `eta` 0 and 1."""
    config = dict(
        prediction_type=prediction_type,
        set_alpha_to_one=set_alpha_to_one,
        clip_sample=clip_sample,
        clip_sample_range=1.5,
    )
    mine, theirs = pair("DDIMScheduler", **config)
    mine.set_timesteps(7)
    theirs.set_timesteps(7)
    model_output, sample = random_inputs()
    for k, t in enumerate(mine.timesteps):  # the last step uses final_alpha_cumprod
        z = torch_noise(sample.shape, k)
        for clipped in (False, True):
            kwargs = dict(eta=eta, use_clipped_model_output=clipped)
            out = mine.step(model_output, t, sample, variance_noise=z.numpy(), **kwargs)
            ref = theirs.step(t64(model_output), int(t), t64(sample), variance_noise=z, **kwargs)
            close(out.prev_sample, ref.prev_sample.numpy())
            close(out.pred_original_sample, ref.pred_original_sample.numpy())


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("n", [7, 10, 50])
@pytest.mark.parametrize("steps_offset", [0, 1])
def test_ddim_step_every_spacing(spacing, n, steps_offset):
    """DDIM steps `t -> t - 1000 // n` under every spacing, as diffusers does, matched step by step at 7, 10 and 50 steps.

    prev_t = t - T // n for every spacing (diffusers' quirk), matched step by step."""
    mine, theirs = pair(
        "DDIMScheduler", timestep_spacing=spacing, steps_offset=steps_offset, clip_sample=False
    )
    mine.set_timesteps(n)
    theirs.set_timesteps(n)
    model_output, sample = random_inputs(shape=(16, 2))
    for t in mine.timesteps:
        out = mine.step(model_output, t, sample)
        ref = theirs.step(t64(model_output), int(t), t64(sample))
        close(out.prev_sample, ref.prev_sample.numpy())


@pytest.mark.parametrize("name", ["DDPMScheduler", "DDIMScheduler"])
@pytest.mark.parametrize("schedule", ["linear", "scaled_linear", "squaredcos_cap_v2"])
def test_add_noise_ddpm_family(name, schedule):
    """`add_noise` of DDPM and DDIM matches diffusers for the three beta schedules."""
    start, end = CANONICAL_BETA_RANGE[schedule]
    mine, theirs = pair(name, beta_schedule=schedule, beta_start=start, beta_end=end)
    original, noise = random_inputs()
    timesteps = np.array([0, 999])  # one per sample in the batch of 2
    out = mine.add_noise(original, noise, timesteps)
    ref = theirs.add_noise(t64(original), t64(noise), torch.from_numpy(timesteps))
    close(out, ref.numpy())
    # one scalar timestep for the whole batch
    out = mine.add_noise(original, noise, 500)
    ref = theirs.add_noise(t64(original), t64(noise), torch.tensor(500))
    close(out, ref.numpy())


# ----------------------------------------------------------------------------- Euler


@pytest.mark.parametrize("use_karras_sigmas", [False, True])
@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("n", STEP_COUNTS)
def test_euler_schedule(use_karras_sigmas, spacing, n):
    """Euler `timesteps`, `sigmas`, `init_noise_sigma` and `scale_model_input` match diffusers at every step, for every spacing, with and without Karras sigmas.

    timesteps, sigmas, init_noise_sigma and scale_model_input at every step."""
    config = dict(use_karras_sigmas=use_karras_sigmas, timestep_spacing=spacing)
    mine, theirs = pair("EulerDiscreteScheduler", **config)
    assert mine.init_noise_sigma == pytest.approx(float(theirs.init_noise_sigma), rel=REL, abs=REL)
    mine.set_timesteps(n)
    theirs.set_timesteps(n)
    assert mine.timesteps.dtype == np.float64 and mine.sigmas.shape == (n + 1,)
    close(mine.timesteps, theirs.timesteps.numpy())
    close(mine.sigmas, theirs.sigmas.numpy())
    assert mine.init_noise_sigma == pytest.approx(float(theirs.init_noise_sigma), rel=REL, abs=REL)
    _, sample = random_inputs(shape=(4, 2))
    # the first 50 steps (all of them for n <= 50) keep the test fast
    for t_mine, t_theirs in list(zip(mine.timesteps, theirs.timesteps, strict=True))[:50]:
        scaled = mine.scale_model_input(sample, t_mine)
        ref = theirs.scale_model_input(t64(sample), t_theirs)
        close(scaled, ref.numpy())
        # the step index advances in step(); advance both without a model
        mine._step_index += 1
        theirs._step_index += 1


@pytest.mark.parametrize("spacing", SPACINGS)
def test_euler_steps_offset_and_scaled_linear(spacing):
    """labkit's Euler on SD's `scaled_linear` betas with `steps_offset=1` gives diffusers' `timesteps`, `sigmas` and `init_noise_sigma` under each spacing, `leading` being SDXL's shipped Euler config.

    SD 1.5 itself ships `PNDMScheduler`; `EulerDiscreteScheduler.from_config` on it gets
    `linspace` (test_page_lab_03.py)."""
    config = dict(
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
        timestep_spacing=spacing,
        steps_offset=1,
    )
    mine, theirs = pair("EulerDiscreteScheduler", **config)
    mine.set_timesteps(50)
    theirs.set_timesteps(50)
    close(mine.timesteps, theirs.timesteps.numpy())
    close(mine.sigmas, theirs.sigmas.numpy())
    assert mine.init_noise_sigma == pytest.approx(float(theirs.init_noise_sigma), rel=REL, abs=REL)


@pytest.mark.parametrize("prediction_type", PREDICTION_TYPES)
@pytest.mark.parametrize("use_karras_sigmas", [False, True])
def test_euler_step(prediction_type, use_karras_sigmas):
    """An Euler `step` matches diffusers for every `prediction_type`, with and without Karras sigmas."""
    config = dict(prediction_type=prediction_type, use_karras_sigmas=use_karras_sigmas)
    mine, theirs = pair("EulerDiscreteScheduler", **config)
    # Karras sigmas inherit float32's ~1e-4 relative error in sigma at t = 0 (their
    # sigma_min) through sigma_min^(1/7), raised back to the 7th power: ~5e-5 in dt
    rel = 1e-4 if use_karras_sigmas else REL
    mine.set_timesteps(10)
    theirs.set_timesteps(10)
    model_output, noise = random_inputs()
    for i, (t_mine, t_theirs) in enumerate(zip(mine.timesteps, theirs.timesteps, strict=True)):
        # a latent of the size it has at this step, ~sqrt(sigma^2 + 1)
        sample = noise * (mine.sigmas[i] ** 2 + 1) ** 0.5
        mine.scale_model_input(sample, t_mine)
        theirs.scale_model_input(t64(sample), t_theirs)
        out = mine.step(model_output, t_mine, sample)
        ref = theirs.step(t64(model_output), t_theirs, t64(sample))
        close(out.prev_sample, ref.prev_sample, rel)
        close(out.pred_original_sample, ref.pred_original_sample, rel)
    assert mine.step_index == theirs.step_index == 10


def test_euler_add_noise():
    """Euler's `add_noise`, `x0 + sigma * noise`, matches diffusers."""
    mine, theirs = pair("EulerDiscreteScheduler", use_karras_sigmas=True)
    mine.set_timesteps(10)
    theirs.set_timesteps(10)
    original, noise = random_inputs()
    out = mine.add_noise(original, noise, mine.timesteps[[2, 7]])
    ref = theirs.add_noise(t64(original), t64(noise), theirs.timesteps[[2, 7]])
    close(out, ref.numpy())
    # img2img: with a begin index, the timesteps are ignored in favour of it
    mine.set_begin_index(3)
    theirs.set_begin_index(3)
    out = mine.add_noise(original, noise, mine.timesteps[[0, 0]])
    ref = theirs.add_noise(t64(original), t64(noise), theirs.timesteps[[0, 0]])
    close(out, ref.numpy())


# ----------------------------------------------------------------------------- flow matching


@pytest.mark.parametrize("shift", [1.0, 3.0])
@pytest.mark.parametrize("n", STEP_COUNTS)
def test_flow_schedule(shift, n):
    """Flow-matching `sigmas` and `timesteps` match diffusers with `shift` 1.0 and 3.0 at 1 to 1000 steps."""
    mine, theirs = pair("FlowMatchEulerDiscreteScheduler", shift=shift)
    close(mine.timesteps, theirs.timesteps.numpy())  # before set
    close(mine.sigmas, theirs.sigmas.numpy())
    mine.set_timesteps(n)
    theirs.set_timesteps(n)
    assert mine.timesteps.dtype == np.float64 and mine.sigmas.shape == (n + 1,)
    close(mine.timesteps, theirs.timesteps.numpy())
    close(mine.sigmas, theirs.sigmas.numpy())


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_flow_step(shift):
    """A flow-matching `step`, `sample + dt * model_output`, matches diffusers with `shift` 1.0 and 3.0."""
    mine, theirs = pair("FlowMatchEulerDiscreteScheduler", shift=shift)
    mine.set_timesteps(10)
    theirs.set_timesteps(10)
    model_output, sample = random_inputs()
    for t_mine, t_theirs in zip(mine.timesteps, theirs.timesteps, strict=True):
        out = mine.step(model_output, t_mine, sample)
        ref = theirs.step(t64(model_output), t_theirs, t64(sample))
        close(out.prev_sample, ref.prev_sample.numpy())
        assert not hasattr(ref, "pred_original_sample")  # ours adds it
        sigma = float(theirs.sigmas[theirs.step_index - 1])
        close(out.pred_original_sample, sample - sigma * model_output)


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_flow_scale_noise(shift):
    """Flow matching's `scale_noise`, `sigma * noise + (1 - sigma) * sample`, matches diffusers."""
    mine, theirs = pair("FlowMatchEulerDiscreteScheduler", shift=shift)
    mine.set_timesteps(10)
    theirs.set_timesteps(10)
    sample, noise = random_inputs()
    ref = theirs.scale_noise(t64(sample), theirs.timesteps[[1, 6]], t64(noise))
    close(mine.scale_noise(sample, mine.timesteps[[1, 6]], noise), ref.numpy())
    # add_noise is ours only: the same math in the DDPM-family argument order
    close(mine.add_noise(sample, noise, mine.timesteps[[1, 6]]), ref.numpy())
    ref = theirs.scale_noise(t64(sample), theirs.timesteps[3:4], t64(noise))
    close(mine.scale_noise(sample, mine.timesteps[3], noise), ref.numpy())


# ----------------------------------------------------------------------------- full loops

MIXTURE = default_mixture()

LOOPS = [
    # (class, config, num_inference_steps, step kwargs)
    ("DDPMScheduler", {}, 1000, {}),
    ("DDPMScheduler", {"prediction_type": "sample"}, 50, {}),
    ("DDPMScheduler", {"prediction_type": "v_prediction", "timestep_spacing": "trailing"}, 10, {}),
    ("DDPMScheduler", {"beta_schedule": "scaled_linear", "steps_offset": 1}, 50, {}),
    ("DDPMScheduler", {"variance_type": "fixed_large", "timestep_spacing": "linspace"}, 20, {}),
    ("DDIMScheduler", {}, 50, {}),
    ("DDIMScheduler", {"beta_schedule": "scaled_linear", "steps_offset": 1}, 50, {"eta": 1.0}),
    ("DDIMScheduler", {"prediction_type": "v_prediction", "timestep_spacing": "trailing"}, 7, {}),
    (
        "DDIMScheduler",
        {"beta_schedule": "squaredcos_cap_v2", "set_alpha_to_one": False, "clip_sample": True},
        20,
        {"use_clipped_model_output": True},
    ),
    ("DDIMScheduler", {"prediction_type": "sample", "timestep_spacing": "linspace"}, 20, {}),
    ("EulerDiscreteScheduler", {}, 50, {}),
    (
        "EulerDiscreteScheduler",
        {"use_karras_sigmas": True, "prediction_type": "v_prediction"},
        30,
        {},
    ),
    (
        "EulerDiscreteScheduler",
        {"beta_schedule": "scaled_linear", "timestep_spacing": "leading", "steps_offset": 1},
        30,
        {},
    ),
    (
        "EulerDiscreteScheduler",
        {"timestep_spacing": "trailing", "prediction_type": "sample"},
        20,
        {},
    ),
    (
        "EulerDiscreteScheduler",
        {"beta_schedule": "squaredcos_cap_v2", "use_karras_sigmas": True},
        30,
        {},
    ),
    ("FlowMatchEulerDiscreteScheduler", {"shift": 1.0}, 28, {}),
    ("FlowMatchEulerDiscreteScheduler", {"shift": 3.0}, 50, {}),
]


def _loop_id(case) -> str:
    name, config, n, kwargs = case
    return "-".join(
        [name.removesuffix("Scheduler"), *map(str, {**config, **kwargs}.values()), str(n)]
    )


@pytest.mark.parametrize("case", LOOPS, ids=[_loop_id(case) for case in LOOPS])
def test_full_sampling_loop(case):
    """Whole sampling loops on the toy mixture with the exact denoiser (DDPM, DDIM, Euler, Euler with Karras sigmas, flow matching) match diffusers at every step, to float32 accuracy.

    The whole loop, ours and diffusers' side by side, from the same starting latents.

    Each scheduler gets its own scale_model_input (none for diffusers' flow class) and the
    exact denoiser's output on its own latents; DDPM / DDIM(eta > 0) get the same z per step.
    """
    name, config, n, step_kwargs = case
    if name == "FlowMatchEulerDiscreteScheduler":
        denoiser = FlowMatchDenoiser(MIXTURE)
    else:
        schedule = config.get("beta_schedule", "linear")
        start, end = CANONICAL_BETA_RANGE[schedule]
        config = {**config, "beta_start": start, "beta_end": end}
        if name != "EulerDiscreteScheduler":
            # the toy modes sit at radius 2: clip to [-1, 1] would pull them in; widen or skip
            config.setdefault("clip_sample", False)
            config["clip_sample_range"] = 3.0
        prediction_type = config.get("prediction_type", "epsilon")
        denoiser = ExactDenoiser(
            MIXTURE, alphas_cumprod(canonical_betas(schedule)), prediction_type
        )
    mine, theirs = pair(name, **config)
    mine.set_timesteps(n)
    theirs.set_timesteps(n)

    noise = np.random.default_rng(0).standard_normal((64, 2))
    latents = noise * mine.init_noise_sigma
    their_sigma = float(getattr(theirs, "init_noise_sigma", 1.0))  # flow: SD3 draws unscaled
    their_latents = t64(noise) * their_sigma
    stochastic = name == "DDPMScheduler" or step_kwargs.get("eta", 0) > 0

    for k, (t, their_t) in enumerate(zip(mine.timesteps, theirs.timesteps, strict=True)):
        model_input = mine.scale_model_input(latents, t)
        if hasattr(theirs, "scale_model_input"):
            their_model_input = theirs.scale_model_input(their_latents, their_t)
        else:
            their_model_input = their_latents
        noise_pred = denoiser(model_input, t)
        their_noise_pred = t64(denoiser(their_model_input.numpy(), float(their_t)))

        kwargs, their_kwargs = dict(step_kwargs), dict(step_kwargs)
        if stochastic and name == "DDPMScheduler":
            kwargs["variance_noise"] = torch_noise(noise.shape, k).numpy()
            their_kwargs["generator"] = torch.Generator().manual_seed(k)
        elif stochastic:
            kwargs["variance_noise"] = torch_noise(noise.shape, k).numpy()
            their_kwargs["variance_noise"] = torch_noise(noise.shape, k)
        latents = mine.step(noise_pred, t, latents, **kwargs).prev_sample
        their_latents = theirs.step(their_noise_pred, their_t, their_latents, **their_kwargs)
        their_latents = their_latents.prev_sample
        # every step, final latents included; Euler's early latents are ~sigma_max in size
        close(latents, their_latents, rel=LOOP_REL)


@pytest.mark.parametrize("name", ["DDPMScheduler", "DDIMScheduler"])
@pytest.mark.parametrize("prediction_type", PREDICTION_TYPES)
def test_loop_is_exact_with_a_float64_schedule(name, prediction_type):
    """Given labkit's float64 `alphas_cumprod`, diffusers' DDPM and DDIM loops (DDIM with `eta=1`) agree with labkit's to 1e-12: the formulas are identical.

    All the disagreement above is float32 storage: give diffusers our float64 alpha_bar
    and a stochastic 100-step loop agrees to 1e-12 (DDIM with eta = 1 and set_alpha_to_one
    False exercises every branch)."""
    config = dict(clip_sample=False, prediction_type=prediction_type)
    if name == "DDIMScheduler":
        config["set_alpha_to_one"] = False
    mine, theirs = pair(name, **config)
    theirs.alphas_cumprod = torch.from_numpy(mine.alphas_cumprod)
    if name == "DDIMScheduler":
        theirs.final_alpha_cumprod = torch.tensor(
            float(mine.final_alpha_cumprod), dtype=torch.float64
        )
    mine.set_timesteps(100)
    theirs.set_timesteps(100)
    denoiser = ExactDenoiser(MIXTURE, mine.alphas_cumprod, prediction_type)
    latents = np.random.default_rng(0).standard_normal((64, 2))
    their_latents = t64(latents)
    for k, t in enumerate(mine.timesteps):
        z = torch_noise(latents.shape, k)
        if name == "DDPMScheduler":
            kwargs, their_kwargs = {}, {"generator": torch.Generator().manual_seed(k)}
        else:
            kwargs, their_kwargs = {"eta": 1.0}, {"eta": 1.0, "variance_noise": z}
        latents = mine.step(denoiser(latents, t), t, latents, variance_noise=z.numpy(), **kwargs)
        latents = latents.prev_sample
        their_noise_pred = t64(denoiser(their_latents.numpy(), t))
        their_latents = theirs.step(their_noise_pred, int(t), their_latents, **their_kwargs)
        their_latents = their_latents.prev_sample
    np.testing.assert_allclose(latents, their_latents.numpy(), rtol=1e-12, atol=1e-12)
