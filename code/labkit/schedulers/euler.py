"""Euler scheduler: the probability-flow ODE in sigma, one Euler step per model call.

A NumPy mirror of diffusers' ``EulerDiscreteScheduler`` (``schedulers/scheduling_euler_discrete.py``,
checked against diffusers 0.42.1), deterministic (``s_churn = 0``), in the formulation of
Karras et al., *Elucidating the Design Space of Diffusion-Based Generative Models* (EDM, 2022),
arXiv:2206.00364 (Algorithm 1 with Euler steps, and its sigma schedule with ``use_karras_sigmas``).

Divide the DDPM latent by sqrt(alpha_bar_t) and it becomes ``x = x0 + sigma eps`` with
``sigma_t = sqrt((1 - alpha_bar_t) / alpha_bar_t)``: a variance-exploding process indexed by
sigma. Sampling integrates the ODE ``dx/dsigma = (x - x0_hat(x, sigma)) / sigma`` from the
largest sigma to 0:

    x0_hat     = x - sigma eps_hat                     (epsilon prediction)
    derivative = (x - x0_hat) / sigma                  (= eps_hat)
    x_next     = x + (sigma_next - sigma) * derivative

The model was trained on the variance-preserving x_t, so its input is scaled back first:
``scale_model_input`` returns ``x / sqrt(sigma^2 + 1)`` = sqrt(alpha_bar_t) x = x_t. The loop
starts from ``noise * init_noise_sigma`` (not 1: set by the grid, see ``init_noise_sigma``).

Arrays are float64 NumPy; diffusers keeps its schedule in float32 torch tensors, so the two
agree to about 1e-5 (``tests/verify/test_schedulers_vs_diffusers.py``).
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np

from labkit.denoiser import PREDICTION_TYPES
from labkit.schedulers.output import SchedulerOutput, check_choice
from labkit.schedules import BETA_SCHEDULES, alphas_cumprod, make_betas

#: diffusers' ``timestep_spacing`` values (Table 2 of arXiv:2305.08891).
TIMESTEP_SPACINGS = ("linspace", "leading", "trailing")


class EulerDiscreteScheduler:
    """Deterministic Euler sampling on sigma, with diffusers' constructor names and defaults.

    The config lives in ``scheduler.config`` (like diffusers' ``ConfigMixin``) and is
    copied to plain attributes (``scheduler.use_karras_sigmas``); ``step`` reads ``config``.
    The final sigma is 0 (diffusers' ``final_sigmas_type="zero"``).
    """

    #: model evaluations per step (diffusers pipelines use it for warm-up steps)
    order = 1

    def __init__(
        self,
        num_train_timesteps: int = 1000,
        beta_start: float = 0.0001,
        beta_end: float = 0.02,
        beta_schedule: str = "linear",
        prediction_type: str = "epsilon",
        use_karras_sigmas: bool = False,
        timestep_spacing: str = "linspace",
        steps_offset: int = 0,
    ) -> None:
        check_choice("beta_schedule", beta_schedule, BETA_SCHEDULES)
        check_choice("prediction_type", prediction_type, PREDICTION_TYPES)
        check_choice("timestep_spacing", timestep_spacing, TIMESTEP_SPACINGS)
        self.config = SimpleNamespace(
            num_train_timesteps=num_train_timesteps,
            beta_start=beta_start,
            beta_end=beta_end,
            beta_schedule=beta_schedule,
            prediction_type=prediction_type,
            use_karras_sigmas=use_karras_sigmas,
            timestep_spacing=timestep_spacing,
            steps_offset=steps_offset,
        )
        # the same values as plain attributes, for reading (scheduler.use_karras_sigmas)
        vars(self).update(vars(self.config))

        # (T,) float64 betas, alphas and alpha_bar, exactly as for DDPM
        self.betas = make_betas(beta_schedule, num_train_timesteps, beta_start, beta_end)
        self.alphas = 1.0 - self.betas
        self.alphas_cumprod = alphas_cumprod(self.betas)

        # (T,) sigma_t = sqrt((1 - alpha_bar_t) / alpha_bar_t), reversed: noisiest first
        sigmas = (((1 - self.alphas_cumprod) / self.alphas_cumprod) ** 0.5)[::-1]
        # until set_timesteps is called: every training step, as floats, T-1 down to 0
        self.num_inference_steps: int | None = None
        self.timesteps = np.linspace(0, num_train_timesteps - 1, num_train_timesteps)[::-1].copy()
        # (T + 1,): the ODE ends at sigma = 0
        self.sigmas = np.concatenate([sigmas, [0.0]])

        self.is_scale_input_called = False
        # which entry of self.timesteps / self.sigmas the next step uses; set on first use
        self._step_index: int | None = None
        self._begin_index: int | None = None

    def __len__(self) -> int:
        return self.config.num_train_timesteps

    @property
    def init_noise_sigma(self) -> float:
        """Std of the starting latents: the grid's sigmas.max() for "linspace" / "trailing"
        and sqrt(sigmas.max()^2 + 1) for "leading", exactly as diffusers (a
        variance-preserving start at the first, non-maximal, "leading" timestep)."""
        max_sigma = float(self.sigmas.max())
        if self.config.timestep_spacing in ("linspace", "trailing"):
            return max_sigma
        return (max_sigma**2 + 1) ** 0.5

    @property
    def step_index(self) -> int | None:
        """Index of the current timestep; +1 after each ``step``."""
        return self._step_index

    @property
    def begin_index(self) -> int | None:
        """First index, if a pipeline set it (img2img) with ``set_begin_index``."""
        return self._begin_index

    def set_begin_index(self, begin_index: int = 0) -> None:
        """Start at ``self.timesteps[begin_index]`` without looking the timestep up."""
        self._begin_index = begin_index

    def set_timesteps(self, num_inference_steps: int) -> None:
        """Choose the timesteps (float64, high to low) and their sigmas (with a final 0).

        ``self.timesteps`` has shape ``(n,)``, ``self.sigmas`` ``(n + 1,)``. The timesteps follow
        ``timestep_spacing`` (unrounded for "linspace"); each sigma is interpolated linearly in t
        from the training sigmas. ``use_karras_sigmas`` then replaces the sigmas by the EDM
        schedule between the same end points and maps each back to a fractional timestep.
        """
        T = self.config.num_train_timesteps
        if not 1 <= num_inference_steps <= T:
            raise ValueError(
                f"num_inference_steps must be between 1 and num_train_timesteps={T}, "
                f"got {num_inference_steps}"
            )
        self.num_inference_steps = num_inference_steps

        # Same rules as DDIMScheduler.set_timesteps, but "linspace" is not rounded.
        if self.config.timestep_spacing == "linspace":
            timesteps = np.linspace(0, T - 1, num_inference_steps)[::-1].copy()
        elif self.config.timestep_spacing == "leading":
            step_ratio = T // num_inference_steps
            timesteps = (np.arange(0, num_inference_steps) * step_ratio).round()[::-1]
            timesteps = timesteps.astype(np.float64) + self.config.steps_offset
        else:  # "trailing"
            step_ratio = T / num_inference_steps
            timesteps = np.arange(T, 0, -step_ratio).round().astype(np.float64) - 1

        # (T,) training sigmas, low to high, and their logs for _sigma_to_t
        train_sigmas = ((1 - self.alphas_cumprod) / self.alphas_cumprod) ** 0.5
        log_sigmas = np.log(train_sigmas)
        # (n,) sigma at each (possibly fractional) timestep, linear in t
        sigmas = np.interp(timesteps, np.arange(0, len(train_sigmas)), train_sigmas)

        if self.config.use_karras_sigmas:
            sigmas = self._convert_to_karras(sigmas, num_inference_steps)
            timesteps = self._sigma_to_t(sigmas, log_sigmas)

        # (n + 1,): final sigma 0 (diffusers' final_sigmas_type="zero")
        self.sigmas = np.concatenate([sigmas, [0.0]])
        self.timesteps = np.asarray(timesteps, dtype=np.float64)
        self._step_index = None
        self._begin_index = None

    def _convert_to_karras(self, in_sigmas: np.ndarray, num_inference_steps: int) -> np.ndarray:
        """EDM's schedule (arXiv:2206.00364, eq. (5)), rho = 7: evenly spaced in sigma^(1/rho).

        diffusers' quirk: the end points are the first and last of the *interpolated* sigmas,
        so they depend on timestep_spacing (e.g. "trailing", n = 10 ends at sigma(t = 99),
        not at the smallest training sigma).
        """
        sigma_min = float(in_sigmas[-1])
        sigma_max = float(in_sigmas[0])
        # --8<-- [start:karras]
        # rho = 7 spends more steps at small sigma, where detail is decided
        rho = 7.0
        # (n,) from 0 to 1
        ramp = np.linspace(0, 1, num_inference_steps)
        min_inv_rho = sigma_min ** (1 / rho)
        max_inv_rho = sigma_max ** (1 / rho)
        # sigma_i = (sigma_max^(1/rho) + i/(n-1) (sigma_min^(1/rho) - sigma_max^(1/rho)))^rho
        sigmas = (max_inv_rho + ramp * (min_inv_rho - max_inv_rho)) ** rho
        # --8<-- [end:karras]
        return sigmas

    def _sigma_to_t(self, sigma: np.ndarray, log_sigmas: np.ndarray) -> np.ndarray:
        """Fractional timestep of each sigma: linear interpolation in log-sigma, as diffusers."""
        # (n,) log sigma, guarded against log(0)
        log_sigma = np.log(np.maximum(sigma, 1e-10))
        # (T, n) signed distance to every training log-sigma
        dists = log_sigma - log_sigmas[:, np.newaxis]
        # (n,) last training index at or below each sigma, kept <= T-2 so low_idx + 1 exists
        low_idx = np.cumsum(dists >= 0, axis=0).argmax(axis=0).clip(max=log_sigmas.shape[0] - 2)
        high_idx = low_idx + 1
        low = log_sigmas[low_idx]
        high = log_sigmas[high_idx]
        # interpolation weight between the two neighbours, clipped to [0, 1]
        w = np.clip((low - log_sigma) / (low - high), 0, 1)
        t = (1 - w) * low_idx + w * high_idx
        return t.reshape(np.shape(sigma))

    def index_for_timestep(
        self, timestep: float, schedule_timesteps: np.ndarray | None = None
    ) -> int:
        """Position of ``timestep`` in ``self.timesteps`` (an exact float match).

        diffusers' rule: if the timestep appears more than once, take the *second* match, so a
        schedule entered mid-way (img2img) does not skip a sigma.
        """
        if schedule_timesteps is None:
            schedule_timesteps = self.timesteps
        indices = np.flatnonzero(schedule_timesteps == timestep)
        if len(indices) == 0:
            raise ValueError(f"timestep {timestep} is not in scheduler.timesteps")
        pos = 1 if len(indices) > 1 else 0
        return int(indices[pos])

    def _init_step_index(self, timestep: float) -> None:
        # looked up once, on the first scale_model_input or step; then only incremented
        if self._begin_index is None:
            self._step_index = self.index_for_timestep(timestep)
        else:
            self._step_index = self._begin_index

    def scale_model_input(self, sample: np.ndarray, timestep: float) -> np.ndarray:
        """x / sqrt(sigma^2 + 1): the model's variance-preserving input x_t.

        diffusers' quirk: after the first call the sigma comes from the internal step index,
        not from ``timestep``; call it once per step, before ``step``.
        """
        if self._step_index is None:
            self._init_step_index(timestep)
        # --8<-- [start:euler_scale]
        sigma = self.sigmas[self._step_index]
        # 1 / sqrt(sigma^2 + 1) = sqrt(alpha_bar_t): back to the scale the model was trained on
        sample = np.asarray(sample, dtype=np.float64) / ((sigma**2 + 1) ** 0.5)
        # --8<-- [end:euler_scale]
        self.is_scale_input_called = True
        return sample

    def step(
        self,
        model_output: np.ndarray,
        timestep: float,
        sample: np.ndarray,
        generator: np.random.Generator | None = None,
    ) -> SchedulerOutput:
        """One Euler step from ``sigmas[step_index]`` to ``sigmas[step_index + 1]``.

        ``generator`` is taken, as diffusers' step takes it, and not used: this step adds no
        noise.

        ``sample`` is the *unscaled* latent (the one ``scale_model_input`` was given);
        ``model_output`` is the model's prediction on the scaled one; both share a shape.
        """
        if isinstance(timestep, (int, np.integer)):
            # as diffusers: an int is almost always an index from enumerate(timesteps)
            raise ValueError(
                "pass a timestep from scheduler.timesteps (a float) to EulerDiscreteScheduler.step,"
                " not an integer index"
            )
        if not self.is_scale_input_called:
            warnings.warn(
                "call scale_model_input before step: the model needs x / sqrt(sigma^2 + 1)",
                stacklevel=2,
            )
        if self._step_index is None:
            self._init_step_index(timestep)
        model_output = np.asarray(model_output, dtype=np.float64)
        sample = np.asarray(sample, dtype=np.float64)

        # --8<-- [start:euler_step]
        # diffusers' sigma_hat equals sigma when s_churn = 0 (no noise is re-added)
        sigma = self.sigmas[self._step_index]

        # 1. x0_hat from the model output, on the variance-exploding scale x = x0 + sigma eps
        if self.config.prediction_type == "epsilon":
            pred_original_sample = sample - sigma * model_output
        elif self.config.prediction_type == "sample":
            pred_original_sample = model_output
        else:  # "v_prediction": x0 = -sigma / sqrt(sigma^2 + 1) v + x / (sigma^2 + 1)
            pred_original_sample = model_output * (-sigma / (sigma**2 + 1) ** 0.5) + (
                sample / (sigma**2 + 1)
            )

        # 2. ODE derivative dx/dsigma = (x - x0_hat) / sigma
        derivative = (sample - pred_original_sample) / sigma
        # 3. Euler step to the next sigma (dt < 0: sigma decreases)
        dt = self.sigmas[self._step_index + 1] - sigma
        prev_sample = sample + derivative * dt
        # --8<-- [end:euler_step]

        self._step_index += 1
        return SchedulerOutput(prev_sample, pred_original_sample)

    def add_noise(
        self, original_samples: np.ndarray, noise: np.ndarray, timesteps: float | np.ndarray
    ) -> np.ndarray:
        """x0 + sigma eps, with sigma looked up for each timestep as diffusers does.

        ``timesteps`` must be entries of ``self.timesteps`` (one, or one per sample). With a
        ``begin_index`` set, diffusers ignores them and uses the current step index (or the
        begin index before the first step), for img2img / inpainting.
        """
        original_samples = np.asarray(original_samples, dtype=np.float64)
        # (B,) timesteps (a scalar becomes (1,))
        timesteps = np.asarray(timesteps, dtype=np.float64).reshape(-1)
        if self._begin_index is None:
            step_indices = [self.index_for_timestep(t) for t in timesteps]
        elif self._step_index is not None:
            step_indices = [self._step_index] * timesteps.shape[0]
        else:
            step_indices = [self._begin_index] * timesteps.shape[0]

        # (B,) -> (B, 1, ..., 1): one sigma per sample, broadcast over its other axes
        sigma = self.sigmas[step_indices].reshape(-1, *(1,) * (original_samples.ndim - 1))
        return original_samples + noise * sigma
