"""How good is a batch of generated samples? Three numbers the labs print.

Each compares a ``(N, 2)`` batch with the mixture it should have come from:

- ``on_mode``: the fraction of samples within 3 std of their nearest mode mean
  (98.9% for true samples: a 2-D Gaussian puts 1 - exp(-4.5) of its mass there);
- ``weight_error``: the total-variation distance between how samples split
  across modes (by nearest mode) and the true weights (0 = recovered exactly);
- ``spread``: the RMS distance of on-mode samples to their mode, over what true
  samples give: 1.0 for the data, below 1 when samples are packed too tightly
  (an ``on_mode`` above 98.9% hints at the same), above 1 when they are smeared.
  The labs' mixtures are 2-D, and the normalisation assumes it;
- ``purity``: the fraction of samples whose nearest mode has the wanted class.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit.data import GaussianMixture


def nearest_mode(mixture: GaussianMixture, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the nearest mode mean (N,) and the distance to it (N,)."""
    dist = np.linalg.norm(samples[:, None, :] - mixture.means[None], axis=-1)  # (N, K)
    idx = dist.argmin(axis=1)
    return idx, dist[np.arange(len(samples)), idx]


@dataclass(frozen=True)
class SampleQuality:
    on_mode: float
    weight_error: float
    spread: float


def sample_quality(mixture: GaussianMixture, samples: np.ndarray) -> SampleQuality:
    idx, dist = nearest_mode(mixture, samples)
    on_mode = float(np.mean(dist <= 3.0 * mixture.stds[idx]))
    counts = np.bincount(idx, minlength=len(mixture.weights)) / len(samples)
    weight_error = float(0.5 * np.abs(counts - mixture.weights).sum())
    # Only on-mode samples enter the RMS, so a few stragglers between modes do not dominate
    # it. For true 2-D data |x - mean|^2 / (2 std^2) ~ Exp(1); cut at 3 std (u <= 4.5) its
    # mean is 1 - 4.5 e^-4.5 / (1 - e^-4.5) = 0.9494, the value that makes spread 1.
    near = dist <= 3.0 * mixture.stds[idx]
    if not near.any():
        return SampleQuality(on_mode, weight_error, float("inf"))
    u = (dist[near] / mixture.stds[idx[near]]) ** 2 / 2.0
    truncated_mean = 1.0 - 4.5 * np.exp(-4.5) / (1.0 - np.exp(-4.5))
    spread = float(np.sqrt(np.mean(u) / truncated_mean))
    return SampleQuality(on_mode, weight_error, spread)


def purity(mixture: GaussianMixture, samples: np.ndarray, class_label: int) -> float:
    idx, _ = nearest_mode(mixture, samples)
    return float(np.mean(mixture.classes[idx] == class_label))
