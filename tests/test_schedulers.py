"""labkit.schedulers with NumPy alone: the contract, the formulas, and whole sampling loops.

The comparison with diffusers itself is in tests/verify/test_schedulers_vs_diffusers.py;
these tests pin what the labs rely on without it: timesteps (dtype, order, length, known
values), config errors, the step formulas on exact inputs, and that each sampling loop,
driven by the exact denoiser, lands its samples on the toy data's modes.
"""

import numpy as np
import pytest

from labkit import ExactDenoiser, FlowMatchDenoiser, alphas_cumprod, canonical_betas
from labkit.data import default_mixture
from labkit.metrics import sample_quality
from labkit.schedulers import (
    DDIMScheduler,
    DDPMScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    SchedulerOutput,
)

SPACINGS = ["leading", "trailing", "linspace"]
PREDICTION_TYPES = ["epsilon", "sample", "v_prediction"]
DDPM_FAMILY = [DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler]
ALL = [*DDPM_FAMILY, FlowMatchEulerDiscreteScheduler]
MIXTURE = default_mixture()


# ----------------------------------------------------------------------------- timesteps


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("steps_offset", [0, 1])
def test_repeated_spacing_rules_stay_in_sync(spacing, steps_offset):
    """Each scheduler file writes the spacing rules out again (the single-file policy,
    as diffusers does with "# Copied from"). This keeps the copies in step: DDPM and
    DDIM agree everywhere, and Euler too wherever its grid is integer (it leaves
    linspace unrounded, as diffusers does)."""
    for n in [1, 3, 7, 10, 50, 999]:
        grids = []
        for cls in DDPM_FAMILY:
            scheduler = cls(timestep_spacing=spacing, steps_offset=steps_offset)
            scheduler.set_timesteps(n)
            grids.append(scheduler.timesteps)
        ddpm, ddim, euler = grids
        np.testing.assert_array_equal(ddpm, ddim)
        if spacing != "linspace":
            np.testing.assert_array_equal(euler, ddim)


@pytest.mark.parametrize("cls", DDPM_FAMILY)
@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("n", [1, 7, 10, 50, 1000])
def test_timesteps_dtype_order_length(cls, spacing, n):
    scheduler = cls(timestep_spacing=spacing)
    scheduler.set_timesteps(n)
    timesteps = scheduler.timesteps
    assert scheduler.num_inference_steps == n
    assert timesteps.shape == (n,)
    assert timesteps.dtype == (np.float64 if cls is EulerDiscreteScheduler else np.int64)
    assert np.all(np.diff(timesteps) < 0)  # high noise first
    assert 0 <= timesteps.min() and timesteps.max() <= 999
    if cls is EulerDiscreteScheduler:
        assert scheduler.sigmas.shape == (n + 1,) and scheduler.sigmas[-1] == 0.0
        assert np.all(np.diff(scheduler.sigmas) < 0)


@pytest.mark.parametrize("shift", [1.0, 3.0])
@pytest.mark.parametrize("n", [1, 7, 28, 1000])
def test_flow_timesteps_and_sigmas(shift, n):
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(n)
    assert scheduler.timesteps.shape == (n,) and scheduler.timesteps.dtype == np.float64
    assert scheduler.sigmas.shape == (n + 1,) and scheduler.sigmas[-1] == 0.0
    assert scheduler.sigmas[0] == pytest.approx(1.0)
    assert np.all(np.diff(scheduler.sigmas) < 0)
    np.testing.assert_allclose(scheduler.timesteps, scheduler.sigmas[:-1] * 1000)


@pytest.mark.parametrize(
    ("spacing", "steps_offset", "expected"),
    [
        ("leading", 0, [900, 800, 700, 600, 500, 400, 300, 200, 100, 0]),
        ("leading", 1, [901, 801, 701, 601, 501, 401, 301, 201, 101, 1]),  # SD 1.x
        ("trailing", 0, [999, 899, 799, 699, 599, 499, 399, 299, 199, 99]),
        ("linspace", 0, [999, 888, 777, 666, 555, 444, 333, 222, 111, 0]),
        ("linspace", 1, [999, 888, 777, 666, 555, 444, 333, 222, 111, 0]),  # offset: leading only
    ],
)
def test_known_integer_timesteps(spacing, steps_offset, expected):
    for cls in (DDPMScheduler, DDIMScheduler):
        scheduler = cls(timestep_spacing=spacing, steps_offset=steps_offset)
        scheduler.set_timesteps(10)
        assert scheduler.timesteps.tolist() == expected


def test_known_float_timesteps():
    euler = EulerDiscreteScheduler()
    euler.set_timesteps(4)
    np.testing.assert_allclose(euler.timesteps, [999.0, 666.0, 333.0, 0.0])
    flow = FlowMatchEulerDiscreteScheduler()
    flow.set_timesteps(4)
    np.testing.assert_allclose(flow.timesteps, [1000.0, 667.0, 334.0, 1.0])
    np.testing.assert_allclose(flow.sigmas, [1.0, 0.667, 0.334, 0.001, 0.0])


def test_flow_shift_moves_sigmas_toward_noise_and_shifts_sigma_min_twice():
    plain = FlowMatchEulerDiscreteScheduler(shift=1.0)
    shifted = FlowMatchEulerDiscreteScheduler(shift=3.0)
    plain.set_timesteps(10)
    shifted.set_timesteps(10)
    assert np.all(shifted.sigmas[1:-1] > plain.sigmas[1:-1])

    def shift3(s):
        return 3 * s / (1 + 2 * s)

    # diffusers' quirk: __init__ shifts sigma_min, set_timesteps shifts it again
    assert shifted.sigmas[-2] == pytest.approx(shift3(shift3(0.001)))


def test_before_set_timesteps_every_training_step():
    for cls in (DDPMScheduler, DDIMScheduler):
        scheduler = cls()
        assert scheduler.num_inference_steps is None
        assert scheduler.timesteps.tolist() == list(range(999, -1, -1))
    euler = EulerDiscreteScheduler()
    assert euler.timesteps.shape == (1000,) and euler.sigmas.shape == (1001,)


@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize("n", [0, -1, 1001])
def test_set_timesteps_bounds(cls, n):
    scheduler = cls()
    with pytest.raises(ValueError, match="num_inference_steps must be between 1 and"):
        scheduler.set_timesteps(n)


@pytest.mark.parametrize("cls", ALL)
def test_set_timesteps_accepts_both_ends(cls):
    scheduler = cls()
    scheduler.set_timesteps(1)
    scheduler.set_timesteps(1000)
    assert len(scheduler.timesteps) == 1000


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (DDPMScheduler, {"beta_schedule": "cosine"}, "unknown beta_schedule 'cosine'"),
        (DDPMScheduler, {"variance_type": "learned"}, "fixed_small, fixed_large"),
        (DDPMScheduler, {"prediction_type": "eps"}, "epsilon, sample, v_prediction"),
        (DDPMScheduler, {"timestep_spacing": "uniform"}, "leading, trailing, linspace"),
        (DDIMScheduler, {"beta_schedule": "sigmoid"}, "linear, scaled_linear"),
        (DDIMScheduler, {"prediction_type": "flow_prediction"}, "unknown prediction_type"),
        (DDIMScheduler, {"timestep_spacing": "karras"}, "unknown timestep_spacing"),
        (EulerDiscreteScheduler, {"prediction_type": "x0"}, "unknown prediction_type 'x0'"),
        (EulerDiscreteScheduler, {"timestep_spacing": "even"}, "unknown timestep_spacing"),
        (EulerDiscreteScheduler, {"beta_schedule": "cos"}, "unknown beta_schedule"),
        (FlowMatchEulerDiscreteScheduler, {"shift": 0.0}, "shift must be > 0"),
        (FlowMatchEulerDiscreteScheduler, {"shift": -3.0}, "shift must be > 0"),
    ],
)
def test_bad_config_is_a_one_line_error(cls, kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        cls(**kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("cls", ALL)
def test_config_namespace_and_plain_attributes(cls):
    scheduler = cls()
    assert scheduler.config.num_train_timesteps == 1000 == scheduler.num_train_timesteps
    for key, value in vars(scheduler.config).items():
        assert getattr(scheduler, key) == value
    assert len(scheduler) == 1000 and scheduler.order == 1


@pytest.mark.parametrize("cls", DDPM_FAMILY)
def test_schedule_arrays_are_float64(cls):
    scheduler = cls(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)
    for name in ("betas", "alphas", "alphas_cumprod"):
        array = getattr(scheduler, name)
        assert array.dtype == np.float64 and array.shape == (1000,)
    np.testing.assert_allclose(scheduler.alphas_cumprod, np.cumprod(1 - scheduler.betas))


# ----------------------------------------------------------------------------- init_noise_sigma


def test_init_noise_sigma_values():
    for scheduler in (DDPMScheduler(), DDIMScheduler(), FlowMatchEulerDiscreteScheduler()):
        assert scheduler.init_noise_sigma == 1.0
    ab = alphas_cumprod(canonical_betas("linear"))
    sigma_max = np.sqrt((1 - ab[999]) / ab[999])  # ~157 for DDPM's linear schedule
    for spacing in ("linspace", "trailing"):
        euler = EulerDiscreteScheduler(timestep_spacing=spacing)
        euler.set_timesteps(10)
        assert isinstance(euler.init_noise_sigma, float)
        assert euler.init_noise_sigma == pytest.approx(sigma_max)
    # "leading" never visits t = 999, and diffusers adds the VP "+1": sqrt(sigma_900^2 + 1)
    euler = EulerDiscreteScheduler(timestep_spacing="leading")
    euler.set_timesteps(10)
    sigma_900 = np.sqrt((1 - ab[900]) / ab[900])
    assert euler.init_noise_sigma == pytest.approx(np.sqrt(sigma_900**2 + 1))


# ----------------------------------------------------------------------------- step formulas


@pytest.fixture
def clean_and_noise():
    rng = np.random.default_rng(0)
    x0, _ = MIXTURE.sample(256, rng)
    return x0, rng.standard_normal(x0.shape)


@pytest.mark.parametrize("cls", [DDPMScheduler, DDIMScheduler])
@pytest.mark.parametrize("prediction_type", PREDICTION_TYPES)
def test_true_model_output_recovers_x0(cls, prediction_type, clean_and_noise):
    """Fed the true eps / x0 / v of a noised x0, every prediction_type gives back x0."""
    x0, noise = clean_and_noise
    scheduler = cls(prediction_type=prediction_type, clip_sample=False)
    scheduler.set_timesteps(10)
    t = int(scheduler.timesteps[3])
    x_t = scheduler.add_noise(x0, noise, t)
    a, s = np.sqrt(scheduler.alphas_cumprod[t]), np.sqrt(1 - scheduler.alphas_cumprod[t])
    model_output = {"epsilon": noise, "sample": x0, "v_prediction": a * noise - s * x0}
    out = scheduler.step(model_output[prediction_type], t, x_t)
    assert isinstance(out, SchedulerOutput)
    np.testing.assert_allclose(out.pred_original_sample, x0, atol=1e-10)


def test_ddim_with_true_noise_lands_on_the_forward_marginal(clean_and_noise):
    """eta = 0 with the true eps re-noises x0 with the *same* eps: x_prev = add_noise(prev_t)."""
    x0, noise = clean_and_noise
    scheduler = DDIMScheduler(clip_sample=False)
    scheduler.set_timesteps(10)
    x_t = scheduler.add_noise(x0, noise, 900)
    out = scheduler.step(noise, 900, x_t)
    np.testing.assert_allclose(out.prev_sample, scheduler.add_noise(x0, noise, 800), atol=1e-10)


def test_ddim_eta_zero_is_deterministic():
    scheduler = DDIMScheduler(clip_sample=False)
    scheduler.set_timesteps(10)
    rng = np.random.default_rng(0)
    model_output, sample = rng.standard_normal((2, 8, 2))
    a = scheduler.step(model_output, 500, sample, generator=np.random.default_rng(1))
    b = scheduler.step(model_output, 500, sample, generator=np.random.default_rng(2))
    np.testing.assert_array_equal(a.prev_sample, b.prev_sample)
    c = scheduler.step(model_output, 500, sample, eta=1.0, generator=np.random.default_rng(1))
    d = scheduler.step(model_output, 500, sample, eta=1.0, generator=np.random.default_rng(2))
    assert not np.allclose(c.prev_sample, d.prev_sample)


def test_ddim_prev_timestep_is_a_fixed_stride_even_when_trailing():
    """diffusers' quirk: prev_t = t - T // n, not the next entry of scheduler.timesteps."""
    scheduler = DDIMScheduler(timestep_spacing="trailing", clip_sample=False)
    scheduler.set_timesteps(7)
    assert scheduler.timesteps[:2].tolist() == [999, 856]
    rng = np.random.default_rng(0)
    eps, sample = rng.standard_normal((2, 4, 2))
    ab = scheduler.alphas_cumprod
    x0 = (sample - np.sqrt(1 - ab[999]) * eps) / np.sqrt(ab[999])
    expected = np.sqrt(ab[857]) * x0 + np.sqrt(1 - ab[857]) * eps  # 999 - 1000 // 7 = 857
    np.testing.assert_allclose(scheduler.step(eps, 999, sample).prev_sample, expected)


def test_ddim_last_step_uses_final_alpha_cumprod():
    rng = np.random.default_rng(0)
    eps, sample = rng.standard_normal((2, 4, 2))
    one = DDIMScheduler(clip_sample=False, set_alpha_to_one=True)
    zero = DDIMScheduler(clip_sample=False, set_alpha_to_one=False)
    for scheduler in (one, zero):
        scheduler.set_timesteps(10)
    out_one = one.step(eps, 0, sample)
    # alpha_bar_prev = 1: x_prev is exactly x0_hat
    np.testing.assert_allclose(out_one.prev_sample, out_one.pred_original_sample)
    out_zero = zero.step(eps, 0, sample)
    # alpha_bar_prev = alpha_bar_0: the step changes nothing
    np.testing.assert_allclose(out_zero.prev_sample, sample)


@pytest.mark.parametrize("cls", [DDPMScheduler, DDIMScheduler])
def test_clip_sample_clips_pred_original_sample(cls):
    rng = np.random.default_rng(0)
    model_output, sample = 3 * rng.standard_normal((2, 16, 2))
    scheduler = cls(clip_sample=True, clip_sample_range=1.5)
    scheduler.set_timesteps(10)
    out = scheduler.step(model_output, 500, sample, variance_noise=np.zeros_like(sample))
    assert np.abs(out.pred_original_sample).max() == pytest.approx(1.5)


def test_ddpm_previous_timestep_rules():
    scheduler = DDPMScheduler()
    assert scheduler.previous_timestep(500) == 499  # before set_timesteps: t - 1
    scheduler.set_timesteps(10)
    assert scheduler.previous_timestep(900) == 800
    assert scheduler.previous_timestep(0) == -1
    with pytest.raises(ValueError, match=r"not in scheduler\.timesteps"):
        scheduler.previous_timestep(850)


def test_ddpm_adds_no_noise_at_t_zero_and_noise_elsewhere():
    scheduler = DDPMScheduler(clip_sample=False)
    scheduler.set_timesteps(10)
    rng = np.random.default_rng(0)
    model_output, sample = rng.standard_normal((2, 8, 2))
    a = scheduler.step(model_output, 0, sample, generator=np.random.default_rng(1))
    b = scheduler.step(model_output, 0, sample, generator=np.random.default_rng(2))
    np.testing.assert_array_equal(a.prev_sample, b.prev_sample)
    c = scheduler.step(model_output, 100, sample, generator=np.random.default_rng(1))
    d = scheduler.step(model_output, 100, sample, generator=np.random.default_rng(2))
    assert not np.allclose(c.prev_sample, d.prev_sample)
    # variance_noise is the z of sqrt(variance) z: zero noise gives the posterior mean
    mean = scheduler.step(model_output, 100, sample, variance_noise=np.zeros_like(sample))
    z = np.random.default_rng(1).standard_normal(sample.shape)
    np.testing.assert_allclose(
        c.prev_sample, mean.prev_sample + np.sqrt(scheduler._get_variance(100)) * z
    )
    with pytest.raises(ValueError, match="not both"):
        scheduler.step(model_output, 100, sample, generator=rng, variance_noise=z)


def test_ddpm_fixed_large_variance_is_beta():
    small = DDPMScheduler(variance_type="fixed_small")
    large = DDPMScheduler(variance_type="fixed_large")
    for scheduler in (small, large):
        scheduler.set_timesteps(1000)
    ab = small.alphas_cumprod
    assert large._get_variance(500) == pytest.approx(small.betas[500])
    beta_tilde = (1 - ab[499]) / (1 - ab[500]) * small.betas[500]
    assert small._get_variance(500) == pytest.approx(beta_tilde)


def test_ddim_step_needs_set_timesteps():
    with pytest.raises(ValueError, match="set_timesteps"):
        DDIMScheduler().step(np.zeros(2), 500, np.zeros(2))


def test_euler_scale_model_input_returns_the_vp_latent():
    """x / sqrt(sigma^2 + 1) = sqrt(alpha_bar_t) x at an integer timestep."""
    scheduler = EulerDiscreteScheduler(timestep_spacing="leading")
    scheduler.set_timesteps(10)
    sample = np.random.default_rng(0).standard_normal((4, 2))
    t = scheduler.timesteps[0]  # 900.0
    scaled = scheduler.scale_model_input(sample, t)
    np.testing.assert_allclose(scaled, np.sqrt(scheduler.alphas_cumprod[900]) * sample)
    assert scheduler.step_index == 0 and scheduler.is_scale_input_called


def test_euler_step_index_advances_and_ints_are_refused():
    scheduler = EulerDiscreteScheduler()
    scheduler.set_timesteps(5)
    sample = np.ones((3, 2))
    with pytest.raises(ValueError, match="not an integer index"):
        scheduler.step(sample, 0, sample)
    for k, t in enumerate(scheduler.timesteps):
        scheduler.scale_model_input(sample, t)
        assert scheduler.step_index == k
        sample = scheduler.step(np.zeros_like(sample), t, sample).prev_sample
    assert scheduler.step_index == 5


def test_euler_warns_without_scale_model_input():
    scheduler = EulerDiscreteScheduler()
    scheduler.set_timesteps(5)
    with pytest.warns(UserWarning, match="scale_model_input"):
        scheduler.step(np.zeros((1, 2)), scheduler.timesteps[0], np.zeros((1, 2)))


def test_index_for_timestep_takes_the_second_of_repeated_matches():
    scheduler = EulerDiscreteScheduler()
    schedule = np.array([9.0, 5.0, 5.0, 1.0])
    assert scheduler.index_for_timestep(5.0, schedule) == 2
    assert scheduler.index_for_timestep(9.0, schedule) == 0
    with pytest.raises(ValueError, match=r"not in scheduler\.timesteps"):
        scheduler.index_for_timestep(4.0, schedule)


def test_euler_add_noise_uses_sigma():
    scheduler = EulerDiscreteScheduler()
    scheduler.set_timesteps(10)
    x0, noise = np.ones((2, 3)), np.full((2, 3), 2.0)
    out = scheduler.add_noise(x0, noise, scheduler.timesteps[[0, 9]])
    np.testing.assert_allclose(out[0], 1 + 2 * scheduler.sigmas[0])
    np.testing.assert_allclose(out[1], 1 + 2 * scheduler.sigmas[9])


def test_flow_step_is_euler_on_the_velocity(clean_and_noise):
    """With the exact velocity eps - x0 on a straight path, one Euler step stays on the
    path and pred_original_sample is x0 itself."""
    x0, noise = clean_and_noise
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(10)
    t, sigma, sigma_next = scheduler.timesteps[2], scheduler.sigmas[2], scheduler.sigmas[3]
    sample = scheduler.scale_noise(x0, t, noise)
    np.testing.assert_allclose(sample, (1 - sigma) * x0 + sigma * noise)
    scheduler.set_begin_index(2)
    out = scheduler.step(noise - x0, t, sample)
    np.testing.assert_allclose(out.prev_sample, (1 - sigma_next) * x0 + sigma_next * noise)
    np.testing.assert_allclose(out.pred_original_sample, x0, atol=1e-12)


def test_flow_add_noise_alias_and_identity_scale_model_input():
    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(10)
    rng = np.random.default_rng(0)
    sample, noise = rng.standard_normal((2, 5, 2))
    t = scheduler.timesteps[[4, 4, 4, 4, 4]]
    np.testing.assert_array_equal(
        scheduler.add_noise(sample, noise, t), scheduler.scale_noise(sample, t, noise)
    )
    assert scheduler.scale_model_input(sample, t[0]) is sample
    with pytest.raises(ValueError, match="not an integer index"):
        scheduler.step(sample, 3, sample)


@pytest.mark.parametrize("cls", ALL)
def test_any_sample_shape_broadcasts(cls):
    """(B, C, H, W) latents, one timestep per batch element, as in a real pipeline."""
    scheduler = cls()
    scheduler.set_timesteps(10)
    rng = np.random.default_rng(0)
    x0, noise = rng.standard_normal((2, 2, 4, 8, 8))
    timesteps = scheduler.timesteps[[1, 5]]
    noisy = scheduler.add_noise(x0, noise, timesteps)
    assert noisy.shape == x0.shape
    t = scheduler.timesteps[0]
    model_input = scheduler.scale_model_input(noisy, t)
    out = scheduler.step(noise, t, model_input)
    assert out.prev_sample.shape == out.pred_original_sample.shape == x0.shape


# ----------------------------------------------------------------------------- sampling loops


def run_loop(scheduler, denoiser, num_inference_steps, seed=0, num_samples=500, **step_kwargs):
    """The pipeline's denoising loop, with the exact denoiser as the "UNet"."""
    scheduler.set_timesteps(num_inference_steps)
    rng = np.random.default_rng(seed)
    latents = rng.standard_normal((num_samples, 2)) * scheduler.init_noise_sigma
    if isinstance(scheduler, DDPMScheduler | DDIMScheduler):
        step_kwargs.setdefault("generator", rng)
    for t in scheduler.timesteps:
        latent_model_input = scheduler.scale_model_input(latents, t)
        noise_pred = denoiser(latent_model_input, t)
        latents = scheduler.step(noise_pred, t, latents, **step_kwargs).prev_sample
    return latents


def exact_denoiser(prediction_type="epsilon", beta_schedule="linear"):
    return ExactDenoiser(MIXTURE, alphas_cumprod(canonical_betas(beta_schedule)), prediction_type)


SD_BETAS = {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012}

QUALITY_LOOPS = [
    ("ddpm", DDPMScheduler(clip_sample=False), exact_denoiser(), 100, {}),
    (
        "ddpm-v-trailing",
        DDPMScheduler(
            clip_sample=False, prediction_type="v_prediction", timestep_spacing="trailing"
        ),
        exact_denoiser("v_prediction"),
        100,
        {},
    ),
    ("ddim", DDIMScheduler(clip_sample=False), exact_denoiser(), 50, {}),
    ("ddim-eta1", DDIMScheduler(clip_sample=False), exact_denoiser(), 50, {"eta": 1.0}),
    (
        "ddim-sd",
        DDIMScheduler(clip_sample=False, set_alpha_to_one=False, steps_offset=1, **SD_BETAS),
        exact_denoiser(beta_schedule="scaled_linear"),
        50,
        {},
    ),
    (
        "ddim-sample",
        DDIMScheduler(clip_sample=False, prediction_type="sample"),
        exact_denoiser("sample"),
        50,
        {},
    ),
    ("euler", EulerDiscreteScheduler(), exact_denoiser(), 50, {}),
    ("euler-karras", EulerDiscreteScheduler(use_karras_sigmas=True), exact_denoiser(), 50, {}),
    (
        "euler-sd-leading",
        EulerDiscreteScheduler(timestep_spacing="leading", steps_offset=1, **SD_BETAS),
        exact_denoiser(beta_schedule="scaled_linear"),
        50,
        {},
    ),
    (
        "euler-v",
        EulerDiscreteScheduler(prediction_type="v_prediction"),
        exact_denoiser("v_prediction"),
        50,
        {},
    ),
    ("flow", FlowMatchEulerDiscreteScheduler(), FlowMatchDenoiser(MIXTURE), 50, {}),
    ("flow-sd3", FlowMatchEulerDiscreteScheduler(shift=3.0), FlowMatchDenoiser(MIXTURE), 28, {}),
]


@pytest.mark.parametrize(
    ("scheduler", "denoiser", "n", "step_kwargs"),
    [case[1:] for case in QUALITY_LOOPS],
    ids=[case[0] for case in QUALITY_LOOPS],
)
def test_loops_land_samples_on_the_modes(scheduler, denoiser, n, step_kwargs):
    latents = run_loop(scheduler, denoiser, n, **step_kwargs)
    quality = sample_quality(MIXTURE, latents)
    assert quality.on_mode > 0.9
    assert quality.weight_error < 0.1  # 500 samples: sampling noise alone is ~0.03


def test_fewer_steps_cost_accuracy():
    many = run_loop(FlowMatchEulerDiscreteScheduler(), FlowMatchDenoiser(MIXTURE), 50)
    few = run_loop(FlowMatchEulerDiscreteScheduler(), FlowMatchDenoiser(MIXTURE), 3)
    assert sample_quality(MIXTURE, few).on_mode < sample_quality(MIXTURE, many).on_mode - 0.3


def test_ddim_eta_zero_loop_is_reproducible():
    """Deterministic DDIM: the same starting noise gives the same samples, whatever rng
    the step is handed."""
    a = run_loop(DDIMScheduler(clip_sample=False), exact_denoiser(), 20, seed=3)
    scheduler = DDIMScheduler(clip_sample=False)
    b = run_loop(scheduler, exact_denoiser(), 20, seed=3, generator=np.random.default_rng(9))
    np.testing.assert_array_equal(a, b)


def test_flow_match_dynamic_shift_takes_mu_and_refuses_sigmas_alone():
    """With ``mu`` the given sigmas get diffusers' exponential time shift (a final 0 appended,
    timesteps = sigma * T); sigmas without ``mu``, or as many sigmas as steps not, raise."""
    from labkit.schedulers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler()
    sigmas = np.linspace(1.0, 1 / 4, 4)
    scheduler.set_timesteps(4, sigmas=sigmas, mu=0.0)  # e^0 / (e^0 + 1/s - 1) = s
    np.testing.assert_allclose(scheduler.sigmas, [*sigmas, 0.0])
    np.testing.assert_allclose(scheduler.timesteps, sigmas * 1000)
    scheduler.set_timesteps(4, sigmas=sigmas, mu=1.15)
    assert np.all(scheduler.sigmas[1:-1] > sigmas[1:])  # shifted toward noise
    with pytest.raises(ValueError):
        scheduler.set_timesteps(4, sigmas=sigmas)
    with pytest.raises(ValueError):
        scheduler.set_timesteps(3, sigmas=sigmas, mu=1.0)
