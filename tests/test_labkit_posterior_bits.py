"""``GaussianMixture`` computes component-major (K first, N last) for speed; its results
must be the same bits as the (N, K, D) formulas it replaced, which every starter's printed
numbers were computed with. Those formulas are kept here as the reference."""

import numpy as np
import pytest

from labkit.data import GaussianMixture, default_mixture


def reference_log_joint(m, x_t, alpha_t, sigma_t):
    var = alpha_t**2 * m.stds**2 + sigma_t**2
    resid = x_t[:, None, :] - alpha_t * m.means[None]  # (N, K, D)
    sq = np.einsum("nkd,nkd->nk", resid, resid)
    return np.log(m.weights) - 0.5 * m.dim * np.log(var) - 0.5 * sq / var, resid


def reference_posterior_mean(m, x_t, alpha_t, sigma_t):
    log_p, resid = reference_log_joint(m, x_t, alpha_t, sigma_t)
    log_p -= log_p.max(axis=1, keepdims=True)
    r = np.exp(log_p)
    r /= r.sum(axis=1, keepdims=True)
    gain = alpha_t * m.stds**2 / (alpha_t**2 * m.stds**2 + sigma_t**2)
    return r @ m.means + np.einsum("nk,nkd->nd", r * gain, resid)


def reference_responsibilities(m, x_t, alpha_t, sigma_t):
    log_p, _ = reference_log_joint(m, x_t, alpha_t, sigma_t)
    log_p -= log_p.max(axis=1, keepdims=True)
    p = np.exp(log_p)
    return p / p.sum(axis=1, keepdims=True)


TWO = GaussianMixture(
    means=np.array([[-0.7, 0.0], [0.7, 0.0]]),  # labs 04 and 22
    stds=np.array([0.6, 0.6]),
    weights=np.array([0.5, 0.5]),
    classes=np.array([0, 1]),
)
MIXTURES = {
    "default": default_mixture(),
    "default class 0": default_mixture().restrict(0),
    "two": TWO,
    "one component": TWO.restrict(1),
}


def noise_levels(rng):
    yield 0.0, 1.0  # pure noise: gain 0, residuals of -0.0 rows stay signed
    yield 1.0, 0.0  # clean
    for _ in range(6):
        sigma = float(rng.uniform(0.001, 0.999))
        yield float(np.sqrt(1 - sigma**2)), sigma  # variance preserving
        yield 1 - sigma, sigma  # flow matching
    yield 1.0, 80.0  # variance exploding
    yield 1e-6, 1e-6


@pytest.mark.parametrize("name", MIXTURES)
def test_posterior_mean_and_responsibilities_are_the_same_bits(name):
    m, rng = MIXTURES[name], np.random.default_rng(0)
    for n in (1, 2, 3, 7, 8, 9, 64, 500, 2001):
        x = rng.standard_normal((n, 2)) * np.exp(rng.uniform(-6, 4, (n, 1)))
        x[rng.random((n, 2)) < 0.1] = 0.0
        x[rng.random((n, 2)) < 0.1] = -0.0
        for alpha_t, sigma_t in noise_levels(rng):
            for fast, slow in [
                (m.posterior_mean, reference_posterior_mean),
                (m.responsibilities, reference_responsibilities),
            ]:
                got, want = fast(x, alpha_t, sigma_t), slow(m, x, alpha_t, sigma_t)
                assert got.shape == want.shape and got.flags.c_contiguous
                assert got.tobytes() == want.tobytes(), (name, n, alpha_t, sigma_t)


def test_float32_input_and_non_finite_rows_match_too():
    m, rng = default_mixture(), np.random.default_rng(1)
    x = rng.standard_normal((50, 2))
    x[3] = np.inf
    x[4, 1] = np.nan
    x[5] = 1e200
    with np.errstate(all="ignore"):
        for xs in (x, x.astype(np.float32)):
            got = m.posterior_mean(xs, 0.6, 0.8)
            assert got.tobytes() == reference_posterior_mean(m, xs, 0.6, 0.8).tobytes()
