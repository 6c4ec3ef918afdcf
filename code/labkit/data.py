"""The toy world: a 2-D Gaussian mixture whose exact denoiser is known.

A "sample" here is a point in R^2, the stand-in for a latent; a batch of them is
a ``(N, 2)`` float64 array (axis 0 = batch, axis 1 = the two "channels"). Each
mixture component is an isotropic Gaussian ``N(mean_k, std_k^2 I)`` with weight
``w_k`` and a class label, so class-conditional labs can ask for one class.

For any noising ``x_t = alpha_t * x0 + sigma_t * eps`` (eps ~ N(0, I)), the
posterior of the clean sample is again a mixture, in closed form:

- component k's marginal of x_t is ``N(alpha_t mean_k, (alpha_t^2 std_k^2 + sigma_t^2) I)``;
- the responsibility ``r_k(x_t)`` is that density times ``w_k``, normalised over k;
- within component k, ``E[x0 | x_t, k] = mean_k + alpha_t std_k^2 / (alpha_t^2 std_k^2
  + sigma_t^2) * (x_t - alpha_t mean_k)`` (Gaussian conditioning);
- ``E[x0 | x_t] = sum_k r_k(x_t) E[x0 | x_t, k]``.

That posterior mean is exactly what a network trained with the MSE loss on x0
converges to, so every sampler in the labs runs on a perfect model.
The same formula serves the variance-preserving DDPM parameterisation
(alpha_t = sqrt(alpha_bar_t), sigma_t = sqrt(1 - alpha_bar_t)), the
variance-exploding one (alpha_t = 1) and flow matching (alpha_t = 1 - t, sigma_t = t).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class GaussianMixture:
    """Isotropic 2-D Gaussian mixture. ``means`` (K, D), ``stds`` (K,), ``weights`` (K,)."""

    means: np.ndarray
    stds: np.ndarray
    weights: np.ndarray
    classes: np.ndarray
    #: restrict()'s results by class label: a conditional denoiser asks for the same class at
    #: every step (the mixture is frozen; its arrays are not edited in place)
    _restricted: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        K = self.means.shape[0]
        if self.stds.shape != (K,) or self.weights.shape != (K,) or self.classes.shape != (K,):
            raise ValueError("means (K, D), stds (K,), weights (K,), classes (K,) must agree on K")
        if not np.isclose(self.weights.sum(), 1.0):
            raise ValueError("weights must sum to 1")

    @property
    def dim(self) -> int:
        return int(self.means.shape[1])

    def mean(self) -> np.ndarray:
        """E[x0], shape (D,)."""
        return self.weights @ self.means

    def covariance(self) -> np.ndarray:
        """Cov[x0], shape (D, D): within-component plus between-component spread."""
        mu = self.mean()
        centred = self.means - mu
        between = (self.weights[:, None] * centred).T @ centred
        within = np.sum(self.weights * self.stds**2) * np.eye(self.dim)
        return within + between

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` points. Returns ``x0`` (n, D) float64 and ``component`` (n,) int."""
        component = rng.choice(len(self.weights), size=n, p=self.weights)
        noise = rng.standard_normal((n, self.dim))
        x0 = self.means[component] + self.stds[component, None] * noise
        return x0, component

    def restrict(self, class_label: int) -> GaussianMixture:
        """The conditional data distribution p(x0 | class), weights renormalised."""
        if class_label in self._restricted:
            return self._restricted[class_label]
        keep = self.classes == class_label
        if not keep.any():
            raise ValueError(f"no component has class {class_label}")
        w = self.weights[keep]
        part = GaussianMixture(self.means[keep], self.stds[keep], w / w.sum(), self.classes[keep])
        self._restricted[class_label] = part
        return part

    def _log_joint(self, x_t: np.ndarray, alpha_t: float, sigma_t: float):
        """log(w_k N(x_t; alpha_t mean_k, var_k I)) up to a constant, (K, N), and the
        residuals x_t - alpha_t mean_k, (K, D, N), which the posterior mean reuses.

        Component-major, N last, so that every operation runs along the long axis: laid out
        (N, K, D), each ran along K or D (1 to 4 long), and NumPy's per-loop overhead made the
        posterior mean about twice as slow. The bits are the same: elementwise operations do
        not depend on the layout, and each sum over K or D adds in index order as before (from
        zero where ``np.einsum`` did): tests/test_labkit_posterior_bits.py holds the old formulas.
        """
        var = alpha_t**2 * self.stds**2 + sigma_t**2  # (K,) marginal variance per component
        x = np.ascontiguousarray(x_t.T)  # (D, N)
        resid = x[None] - (alpha_t * self.means)[:, :, None]  # (K, D, N)
        sq = sum(resid[:, d] * resid[:, d] for d in range(self.dim))  # (K, N) squared distances
        const = np.log(self.weights) - 0.5 * self.dim * np.log(var)  # (K,)
        log_p = const[:, None] - 0.5 * sq / var[:, None]
        return log_p, resid

    def responsibilities(self, x_t: np.ndarray, alpha_t: float, sigma_t: float) -> np.ndarray:
        """p(component k | x_t), shape (N, K). Computed in log space for stability."""
        log_p, _ = self._log_joint(x_t, alpha_t, sigma_t)  # (K, N)
        log_p -= log_p.max(axis=0)
        p = np.exp(log_p)
        p /= p.sum(axis=0)
        return np.ascontiguousarray(p.T)  # (N, K), C order as callers index it

    def posterior_mean(self, x_t: np.ndarray, alpha_t: float, sigma_t: float) -> np.ndarray:
        """E[x0 | x_t] for x_t = alpha_t x0 + sigma_t eps; ``x_t`` (N, D) -> (N, D).

        sum_k r_k (mean_k + gain_k (x_t - alpha_t mean_k)), with
        gain_k = alpha_t std_k^2 / (alpha_t^2 std_k^2 + sigma_t^2).
        """
        log_p, resid = self._log_joint(x_t, alpha_t, sigma_t)  # (K, N), (K, D, N)
        log_p -= log_p.max(axis=0)
        r = np.exp(log_p)
        r /= r.sum(axis=0)  # (K, N) responsibilities
        gain = alpha_t * self.stds**2 / (alpha_t**2 * self.stds**2 + sigma_t**2)  # (K,)
        x0 = np.ascontiguousarray(r.T) @ self.means  # (N, K) @ (K, D): sum_k r_k mean_k
        # + sum_k r_k gain_k resid_k, summed over K in index order from zero: (D, N) -> (N, D)
        x0 += ((r * gain[:, None])[:, None, :] * resid).sum(axis=0, initial=0.0).T
        return x0


def default_mixture() -> GaussianMixture:
    """Four tight modes on a ring of radius 2, two classes (alternating), unequal weights.

    Unequal weights make "are the mode weights recovered?" a real test, and the
    small std (0.15) makes "did samples land on the modes?" easy to read.
    """
    angles = np.pi / 4 + np.arange(4) * np.pi / 2
    means = 2.0 * np.stack([np.cos(angles), np.sin(angles)], axis=1)
    return GaussianMixture(
        means=means,
        stds=np.full(4, 0.15),
        weights=np.array([0.4, 0.3, 0.2, 0.1]),
        classes=np.array([0, 1, 0, 1]),
    )
