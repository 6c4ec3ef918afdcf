"""The exact denoiser: what a perfectly trained network would output.

``ExactDenoiser(mixture, alphas_cumprod, prediction_type)`` is called like
``unet(latents, t, class_labels=...).sample`` in diffusers: it takes the noisy
``sample`` (N, D) and a ``timestep`` and returns a ``(N, D)`` array whose
meaning is set by ``prediction_type``, with diffusers' names:

- ``"epsilon"``: the noise eps in x_t = alpha_t x0 + sigma_t eps (DDPM, SD 1.x)
- ``"sample"``: the clean sample x0 itself
- ``"v_prediction"``: v = alpha_t eps - sigma_t x0 (Salimans & Ho, 2022; SD 2.x 768)

with alpha_t = sqrt(alpha_bar_t), sigma_t = sqrt(1 - alpha_bar_t). All three are
exact functions of E[x0 | x_t], which the Gaussian mixture gives in closed form.

``FlowMatchDenoiser`` is the same idea on the rectified-flow time axis of SD3
(x_t = (1 - s) x0 + s eps, s = timestep / 1000) and predicts the velocity
eps - x0 (``"flow_prediction"``).

``class_labels`` conditions on a class, like a text prompt does: ``None`` (all
rows unconditional), one int (all rows), or an ``(N,)`` int array with -1 for
"no condition" on that row, so a CFG batch ``[uncond; cond]`` is one call.
"""

from __future__ import annotations

import numpy as np

from labkit.data import GaussianMixture

#: diffusers' ``prediction_type`` values for DDPM-family schedulers.
PREDICTION_TYPES = ("epsilon", "sample", "v_prediction")
#: the label meaning "unconditional" in a ``class_labels`` array (the empty prompt)
UNCOND = -1


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
    if prediction_type == "flow_prediction":
        return eps - x0
    raise ValueError(
        f"unknown prediction_type {prediction_type!r}; choose one of {', '.join(PREDICTION_TYPES)}"
    )


def _conditioned(
    mixture: GaussianMixture,
    sample: np.ndarray,
    class_labels: int | np.ndarray | None,
    predict,
) -> np.ndarray:
    """Apply ``predict(mixture_for_rows, rows)`` per condition group; (N, D) -> (N, D)."""
    if class_labels is None:
        return predict(mixture, sample)
    if np.ndim(class_labels) == 0:  # one label for every row: no per-row split
        label = int(class_labels)
        return predict(mixture if label == UNCOND else mixture.restrict(label), sample)
    labels = np.broadcast_to(np.asarray(class_labels), (len(sample),))
    out = np.empty_like(sample, dtype=np.float64)
    for label in sorted(set(labels.tolist())):  # not np.unique: it imports numpy.ma (~12 ms)
        rows = labels == label
        part = mixture if label == UNCOND else mixture.restrict(int(label))
        out[rows] = predict(part, sample[rows])
    return out


class ExactDenoiser:
    """A stand-in for a trained denoiser on the DDPM (variance-preserving) time axis.

    Accepts fractional timesteps (Euler and Karras schedules produce them): the
    noise level is interpolated in log-sigma between the integer timesteps, the
    inverse of diffusers' ``_sigma_to_t``.
    """

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
        self.log_sigmas = 0.5 * np.log((1.0 - self.alphas_cumprod) / self.alphas_cumprod)
        self.prediction_type = prediction_type
        #: how many times the "network" ran, and on how many rows: the latency proxy
        self.calls = 0
        self.rows = 0

    def alpha_bar_at(self, timestep: float) -> float:
        t = float(timestep)
        if t == int(t):
            return float(self.alphas_cumprod[int(t)])
        log_sigma = np.interp(t, np.arange(len(self.log_sigmas)), self.log_sigmas)
        return float(1.0 / (1.0 + np.exp(2.0 * log_sigma)))

    def __call__(
        self,
        sample: np.ndarray,
        timestep: float,
        class_labels: int | np.ndarray | None = None,
    ) -> np.ndarray:
        self.calls += 1
        self.rows += len(sample)
        alpha_bar = self.alpha_bar_at(timestep)
        alpha_t, sigma_t = np.sqrt(alpha_bar), np.sqrt(1.0 - alpha_bar)
        return _conditioned(
            self.mixture,
            sample,
            class_labels,
            lambda m, x: exact_prediction(m, x, alpha_t, sigma_t, self.prediction_type),
        )


class FlowMatchDenoiser:
    """Exact velocity model for rectified flow: x_s = (1 - s) x0 + s eps, output eps - x0.

    ``timestep`` is on diffusers' FlowMatchEulerDiscreteScheduler axis, s * 1000.
    """

    prediction_type = "flow_prediction"

    def __init__(self, mixture: GaussianMixture, num_train_timesteps: int = 1000) -> None:
        self.mixture = mixture
        self.num_train_timesteps = num_train_timesteps
        self.calls = 0
        self.rows = 0

    def __call__(
        self,
        sample: np.ndarray,
        timestep: float,
        class_labels: int | np.ndarray | None = None,
    ) -> np.ndarray:
        self.calls += 1
        self.rows += len(sample)
        s = float(timestep) / self.num_train_timesteps
        return _conditioned(
            self.mixture,
            sample,
            class_labels,
            lambda m, x: exact_prediction(m, x, 1.0 - s, s, "flow_prediction"),
        )
