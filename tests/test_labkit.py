"""The shared scaffolding: schedules against their closed forms, the exact
denoiser against Monte-Carlo estimates of the same conditional expectations."""

import math

import numpy as np
import pytest

from labkit import (
    BETA_SCHEDULES,
    ExactDenoiser,
    FlowMatchDenoiser,
    alphas_cumprod,
    default_mixture,
    make_betas,
)
from labkit.cli import LabArgumentParser, int_at_least, int_list, parse_args
from labkit.data import GaussianMixture
from labkit.denoiser import UNCOND, exact_prediction


def test_linear_schedule_closed_form():
    betas = make_betas("linear", 1000, 1e-4, 0.02)
    assert betas.shape == (1000,) and betas.dtype == np.float64
    assert betas[0] == pytest.approx(1e-4) and betas[-1] == pytest.approx(0.02)
    np.testing.assert_allclose(np.diff(betas), (0.02 - 1e-4) / 999)


def test_scaled_linear_is_linear_in_sqrt_beta():
    betas = make_betas("scaled_linear", 1000, 0.00085, 0.012)
    np.testing.assert_allclose(np.diff(np.sqrt(betas)), (0.012**0.5 - 0.00085**0.5) / 999)


def test_cosine_schedule_reproduces_its_alpha_bar():
    """prod(1 - beta) must equal alpha_bar(t)/alpha_bar(0) where the 0.999 cap is inactive."""
    T = 1000
    ab = alphas_cumprod(make_betas("squaredcos_cap_v2", T))
    f = [math.cos((t / T + 0.008) / 1.008 * math.pi / 2) ** 2 for t in range(T + 1)]
    expected = np.array(f[1:]) / f[0]
    uncapped = slice(0, 990)
    np.testing.assert_allclose(ab[uncapped], expected[uncapped], rtol=1e-9)
    assert make_betas("squaredcos_cap_v2", T).max() <= 0.999


@pytest.mark.parametrize("schedule", BETA_SCHEDULES)
def test_alphas_cumprod_decreases_and_stays_positive(schedule):
    ab = alphas_cumprod(make_betas(schedule))
    assert np.all(np.diff(ab) < 0) and ab[-1] > 0 and ab[0] < 1


def test_unknown_schedule_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown beta_schedule 'cosine'"):
        make_betas("cosine")


def test_mixture_moments_match_samples():
    mixture = default_mixture()
    x0, component = mixture.sample(200_000, np.random.default_rng(0))
    np.testing.assert_allclose(x0.mean(axis=0), mixture.mean(), atol=0.01)
    np.testing.assert_allclose(np.cov(x0, rowvar=False), mixture.covariance(), atol=0.02)
    np.testing.assert_allclose(np.bincount(component) / len(component), mixture.weights, atol=0.005)


@pytest.mark.parametrize(("alpha_t", "sigma_t"), [(0.95, 0.3), (0.5, 0.87), (0.1, 0.995)])
def test_posterior_mean_matches_monte_carlo(alpha_t, sigma_t):
    """E[x0 | x_t] in closed form vs a kernel-free Monte-Carlo estimate: draw many
    (x0, x_t) pairs, keep those whose x_t lands in a small ball around a query."""
    mixture = default_mixture()
    rng = np.random.default_rng(1)
    x0, _ = mixture.sample(2_000_000, rng)
    x_t = alpha_t * x0 + sigma_t * rng.standard_normal(x0.shape)
    for query in x_t[:3]:  # queries where x_t has mass, so the ball is populated
        near = np.sum((x_t - query) ** 2, axis=1) < 0.04**2
        assert near.sum() > 200
        mc = x0[near].mean(axis=0)
        exact = mixture.posterior_mean(query[None], alpha_t, sigma_t)[0]
        tolerance = 4 * x0[near].std(axis=0).max() / np.sqrt(near.sum()) + 0.02
        np.testing.assert_allclose(exact, mc, atol=tolerance)


def test_epsilon_prediction_is_the_conditional_mean_of_the_noise():
    """E[eps | x_t] from the denoiser vs Monte Carlo, and the epsilon/x0/v identities."""
    mixture = default_mixture()
    ab = alphas_cumprod(make_betas("linear"))
    t = 300
    a, s = np.sqrt(ab[t]), np.sqrt(1 - ab[t])
    rng = np.random.default_rng(2)
    x0, _ = mixture.sample(1_000_000, rng)
    eps = rng.standard_normal(x0.shape)
    x_t = a * x0 + s * eps
    query = np.array([[0.9, 0.8]])
    near = np.sum((x_t - query) ** 2, axis=1) < 0.02**2
    eps_hat = ExactDenoiser(mixture, ab, "epsilon")(query, t)[0]
    np.testing.assert_allclose(eps_hat, eps[near].mean(axis=0), atol=0.05)

    batch = x_t[:1000]
    e = exact_prediction(mixture, batch, a, s, "epsilon")
    x = exact_prediction(mixture, batch, a, s, "sample")
    v = exact_prediction(mixture, batch, a, s, "v_prediction")
    np.testing.assert_allclose(batch, a * x + s * e, atol=1e-12)
    np.testing.assert_allclose(v, a * e - s * x, atol=1e-12)


def test_conditional_denoiser_uses_one_class():
    mixture = default_mixture()
    cond = mixture.restrict(1)
    assert set(cond.classes) == {1} and cond.weights.sum() == pytest.approx(1.0)
    ab = alphas_cumprod(make_betas("linear"))
    denoiser = ExactDenoiser(mixture, ab, "sample")
    x0_hat = denoiser(np.zeros((1, 2)), 999, class_labels=1)
    assert denoiser.calls == 1
    # At t=999 the data is forgotten: x0_hat is the class mean, a mix of its two modes.
    np.testing.assert_allclose(x0_hat[0], cond.mean(), atol=0.05)


def test_mixture_validates_shapes():
    with pytest.raises(ValueError):
        GaussianMixture(np.zeros((2, 2)), np.ones(3), np.array([0.5, 0.5]), np.zeros(2))


def test_cli_parser_errors_and_kernel_argv(capsys):
    parser = LabArgumentParser(prog="x.py")
    parser.add_argument("--steps", type=int_at_least(1), default=3)
    parser.add_argument("--ts", type=int_list, default=[1])
    assert parse_args(parser, ["--ts", "1,2"]).ts == [1, 2]
    with pytest.raises(SystemExit) as exc:
        parse_args(parser, ["--steps", "0"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "x.py: error: argument --steps: must be >= 1, got 0\n"


def test_fractional_timesteps_interpolate_between_training_steps():
    ab = alphas_cumprod(make_betas("scaled_linear", 1000, 0.00085, 0.012))
    denoiser = ExactDenoiser(default_mixture(), ab, "epsilon")
    assert denoiser.alpha_bar_at(500) == ab[500]
    mid = denoiser.alpha_bar_at(500.5)
    assert ab[501] < mid < ab[500]
    # log-sigma interpolation: the inverse of diffusers' _sigma_to_t
    sigma = lambda a: np.sqrt((1 - a) / a)  # noqa: E731
    assert np.log(sigma(mid)) == pytest.approx(
        0.5 * (np.log(sigma(ab[500])) + np.log(sigma(ab[501])))
    )


def test_per_row_class_labels_equal_separate_calls():
    """A CFG batch [uncond rows; cond rows] in one call == one call per condition."""
    mixture = default_mixture()
    ab = alphas_cumprod(make_betas("linear"))
    denoiser = ExactDenoiser(mixture, ab, "epsilon")
    x = np.random.default_rng(3).standard_normal((8, 2))
    labels = np.array([-1] * 4 + [1] * 4)
    batched = denoiser(np.concatenate([x[:4], x[4:]]), 400, class_labels=labels)
    np.testing.assert_allclose(batched[:4], denoiser(x[:4], 400))
    np.testing.assert_allclose(batched[4:], denoiser(x[4:], 400, class_labels=1))
    assert denoiser.rows == 16 and denoiser.calls == 3


@pytest.mark.parametrize("label", [UNCOND, 0, 1])
def test_one_label_for_all_rows_equals_the_per_row_split(label):
    """One int label (the fast path, no row split) gives the bytes a per-row label array gives;
    restrict() hands back the same conditional mixture each time it is asked."""
    mixture = default_mixture()
    denoiser = ExactDenoiser(mixture, alphas_cumprod(make_betas("linear")), "epsilon")
    x = np.random.default_rng(5).standard_normal((16, 2))
    one = denoiser(x, 300.5, class_labels=label)
    per_row = denoiser(x, 300.5, class_labels=np.full(16, label))
    assert one.dtype == np.float64 and np.array_equal(one, per_row)
    if label != UNCOND:
        assert mixture.restrict(label) is mixture.restrict(label)


def test_flow_denoiser_predicts_the_velocity():
    mixture = default_mixture()
    rng = np.random.default_rng(4)
    s = 0.3  # timestep 300 on the flow axis
    x_s = (1 - s) * mixture.sample(5, rng)[0] + s * rng.standard_normal((5, 2))
    v = FlowMatchDenoiser(mixture)(x_s, 300.0)
    x0_hat = mixture.posterior_mean(x_s, 1 - s, s)
    eps_hat = (x_s - (1 - s) * x0_hat) / s
    np.testing.assert_allclose(v, eps_hat - x0_hat, atol=1e-12)
    # one Euler step to s = 0 along v lands on x0_hat: x_s - s v = x0_hat
    np.testing.assert_allclose(x_s - s * v, x0_hat, atol=1e-12)


def test_sample_quality_of_true_data_is_the_reference():
    from labkit.metrics import purity, sample_quality

    mixture = default_mixture()
    x, component = mixture.sample(50_000, np.random.default_rng(5))
    q = sample_quality(mixture, x)
    assert q.on_mode == pytest.approx(1 - np.exp(-4.5), abs=0.003)
    assert q.weight_error < 0.01 and q.spread == pytest.approx(1.0, abs=0.01)
    assert purity(mixture, x[component == 1], 1) > 0.99
    squeezed = mixture.means[component] + 0.5 * (x - mixture.means[component])
    assert sample_quality(mixture, squeezed).spread == pytest.approx(0.5, abs=0.02)


def test_float_list_rejects_non_finite_and_small_values():
    import argparse

    from labkit.cli import float_list

    convert = float_list(minimum=0.0)
    assert convert("1,7.5") == [1.0, 7.5]
    for bad in ["nan", "inf,1", "-1", "x", ""]:
        with pytest.raises(argparse.ArgumentTypeError):
            convert(bad)


def test_peak_bytes_measures_the_arrays_a_call_allocates():
    import numpy as np

    from labkit.memory import peak_bytes

    out, peak = peak_bytes(lambda n: np.ones(n), 1_000_000)
    assert out.shape == (1_000_000,)
    assert 8_000_000 <= peak < 8_000_000 + 4096  # the buffer, plus Python's small change
    calls = []  # each call allocates a bigger array than the one before: 8 B, 80 kB, 160 kB
    _, least = peak_bytes(lambda: calls.append(np.zeros(len(calls) * 10_000 + 1)), repeats=3)
    assert len(calls) == 3 and least < 10_000  # the smallest of the three calls' peaks
    with pytest.raises(ValueError):
        peak_bytes(lambda: None, repeats=0)


def test_precision_format_limits_are_the_known_constants():
    from labkit.precision import FORMATS, format_limits

    limits = {name: format_limits(name) for name in FORMATS}
    assert limits["fp16"][0] == 65504.0 == float(np.finfo(np.float16).max)
    assert limits["fp16"][1] == float(np.finfo(np.float16).tiny)  # 2**-14
    assert limits["fp32"][0] == float(np.finfo(np.float32).max)
    assert limits["fp8_e4m3"][:3] == (448.0, 2.0**-6, 2.0**-9)
    assert limits["fp8_e5m2"][0] == 57344.0
    assert limits["bf16"][3] == 2.0**-7 and limits["fp16"][3] == 2.0**-10
    assert [limits[n][4] for n in ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2")] == [4, 2, 2, 1, 1]  # fmt: skip
    assert format_limits("bfloat16") == limits["bf16"]  # torch / NumPy names are aliases
    with pytest.raises(ValueError, match="unknown format 'fp4'"):
        format_limits("fp4")


def test_precision_round_to_matches_numpy_and_rounds_half_to_even():
    from labkit.precision import round_to

    probe = np.random.default_rng(7).standard_normal(100_000) * 100.0
    assert np.array_equal(round_to(probe, "fp16"), probe.astype(np.float16).astype(np.float64))
    assert np.array_equal(round_to(probe, "fp32"), probe.astype(np.float32).astype(np.float64))
    # 1 + 2**-8 is halfway between two bf16 neighbours (step 2**-7): ties go to the even one
    assert round_to(np.array([1 + 2**-8, 1 + 3 * 2**-8]), "bf16").tolist() == [1.0, 1 + 2**-6]
    # fp16 overflows to inf from 65520 (halfway to the next binade) on; fp8_e4m3 saturates
    assert round_to(np.array([65519.0, 65520.0, -1e9]), "fp16").tolist() == [65504.0, np.inf, -np.inf]  # fmt: skip
    assert round_to(np.array([500.0, -np.inf]), "fp8_e4m3").tolist() == [448.0, -448.0]
    # subnormals: the smallest e4m3 step is 2**-9; half of it ties to 0
    assert round_to(np.array([2.0**-9, 2.0**-10, 3 * 2.0**-11]), "fp8_e4m3").tolist() == [2.0**-9, 0.0, 2.0**-9]  # fmt: skip
    assert np.isnan(round_to(np.array([np.nan]), "bf16")[0])
    assert round_to(3.0, "fp8_e5m2") == 3.0 and round_to([-0.0], "fp16")[0] == 0.0


def test_precision_quantize_scaled_per_tensor_and_per_row():
    from labkit.precision import quantize_scaled, round_to

    x = np.array([[1.0, -0.5, 0.25, 0.0], [100.0, 1.0, -1.0, 0.5]])
    # int8: amax / 127.5 per slice, q clipped to [-128, 127]; the top value lands on 127
    per_row = quantize_scaled(x, "int8", axis=-1)
    scale = np.array([[1.0], [100.0]]) / 127.5
    assert np.array_equal(per_row, np.clip(np.round(x / scale), -128, 127) * scale)
    assert np.all(np.abs(per_row - x) <= scale / 2 + 1e-12)
    # one scale for the tensor: row 0 shares row 1's step of 100 / 127.5 and is wiped out
    per_tensor = quantize_scaled(x, "int8")
    assert np.abs(per_tensor[0] - x[0]).max() > 0.2 and np.abs(per_row[0] - x[0]).max() < 0.01
    # int4: 15 levels, [-8, 7]
    q4 = quantize_scaled(np.linspace(-1, 1, 101), "int4") / (1 / 7.5)
    assert set(np.round(q4).tolist()) <= set(range(-8, 8)) and np.allclose(q4, np.round(q4))
    # a float format: the slice's amax goes to the top (448 for e4m3), then round_to
    fp8 = quantize_scaled(x, "fp8_e4m3", axis=-1)
    s = np.array([[1.0], [100.0]]) / 448.0
    assert np.array_equal(fp8, round_to(x / s, "fp8_e4m3") * s)
    assert np.array_equal(quantize_scaled(np.zeros(3), "int8"), np.zeros(3))  # no 0 / 0
