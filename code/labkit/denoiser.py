"""The exact denoiser: what a perfectly trained network would output.

``ExactDenoiser(mixture, alphas_cumprod, prediction_type)`` is called like
``unet(latents, t).sample`` in a diffusers pipeline: it takes the noisy
``sample`` (N, D) and an integer ``timestep`` and returns a ``(N, D)`` array
whose meaning is set by ``prediction_type``, with diffusers' names:

- ``"epsilon"``: the noise eps in x_t = alpha_t x0 + sigma_t eps (DDPM, SD 1.x)
- ``"sample"``: the clean sample x0 itself
- ``"v_prediction"``: v = alpha_t eps - sigma_t x0 (Salimans & Ho, 2022; SD 2.x 768)

with alpha_t = sqrt(alpha_bar_t), sigma_t = sqrt(1 - alpha_bar_t). All three are
exact functions of E[x0 | x_t], which the Gaussian mixture gives in closed form.
Passing ``class_label`` conditions on one class (the "cond" branch of CFG).
"""

from __future__ import annotations

import numpy as np

from labkit.data import GaussianMixture

#: diffusers' ``prediction_type`` values for DDPM-family schedulers.
PREDICTION_TYPES = ("epsilon", "sample", "v_prediction")


def exact_prediction(
    mixture: GaussianMixture,
    sample: np.ndarray,
    alpha_t: float,
    sigma_t: float,
    prediction_type: str = "epsilon",
) -> np.ndarray:
    """Exact model output for ``sample`` = alpha_t x0 + sigma_t eps. (N, D) -> (N, D)."""
    x0 = mixture.posterior_mean(sample, alpha_t, sigma_t)
    if prediction_type == "sample":
        return x0
    # E[eps | x_t] follows from E[x0 | x_t] because x_t is known: eps = (x_t - alpha_t x0) / sigma_t
    eps = (sample - alpha_t * x0) / sigma_t
    if prediction_type == "epsilon":
        return eps
    if prediction_type == "v_prediction":
        return alpha_t * eps - sigma_t * x0
    raise ValueError(
        f"unknown prediction_type {prediction_type!r}; choose one of {', '.join(PREDICTION_TYPES)}"
    )


class ExactDenoiser:
    """A stand-in for a trained denoiser network on the DDPM (variance-preserving) time axis."""

    def __init__(
        self,
        mixture: GaussianMixture,
        alphas_cumprod: np.ndarray,
        prediction_type: str = "epsilon",
    ) -> None:
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(
                f"unknown prediction_type {prediction_type!r}; "
                f"choose one of {', '.join(PREDICTION_TYPES)}"
            )
        self.mixture = mixture
        self.alphas_cumprod = np.asarray(alphas_cumprod, dtype=np.float64)
        self.prediction_type = prediction_type
        #: how many times the "network" ran: the latency proxy of later labs
        self.calls = 0

    def __call__(
        self, sample: np.ndarray, timestep: int, class_label: int | None = None
    ) -> np.ndarray:
        self.calls += 1
        alpha_bar = self.alphas_cumprod[int(timestep)]
        mixture = self.mixture if class_label is None else self.mixture.restrict(class_label)
        return exact_prediction(
            mixture, sample, np.sqrt(alpha_bar), np.sqrt(1.0 - alpha_bar), self.prediction_type
        )
