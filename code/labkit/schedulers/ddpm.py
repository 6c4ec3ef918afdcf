"""DDPM scheduler: ancestral sampling, one Gaussian step at a time.

A NumPy mirror of diffusers' ``DDPMScheduler`` (``schedulers/scheduling_ddpm.py``,
checked against diffusers 0.42.1), for Ho, Jain & Abbeel, *Denoising Diffusion
Probabilistic Models* (2020), arXiv:2006.11239.

The forward process noises a clean x0 to ``x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) eps``.
Sampling walks the chosen ``timesteps`` backwards. At each step the model output is turned
into an estimate of x0, and x_{prev_t} is drawn from the Gaussian posterior
q(x_{prev_t} | x_t, x0) (formula (7) of the paper), with prev_t the next, smaller timestep:

    alpha_t' = alpha_bar_t / alpha_bar_prev,   beta_t' = 1 - alpha_t'      (one jump t -> prev_t)
    mean     = sqrt(alpha_bar_prev) beta_t' / (1 - alpha_bar_t) * x0_hat
             + sqrt(alpha_t') (1 - alpha_bar_prev) / (1 - alpha_bar_t) * x_t
    x_prev   = mean + sqrt(variance) z,   z ~ N(0, I),   and no noise at t = 0

``variance`` is the posterior variance ``(1 - alpha_bar_prev) / (1 - alpha_bar_t) beta_t'``
("fixed_small", DDPM's beta tilde) or the forward variance ``beta_t'`` ("fixed_large").

Arrays are float64 NumPy; diffusers keeps its schedule in float32 torch tensors, so the two
agree to about 1e-6 (``tests/verify/test_schedulers_vs_diffusers.py``).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from labkit.denoiser import PREDICTION_TYPES
from labkit.schedulers.output import SchedulerOutput, check_choice
from labkit.schedules import BETA_SCHEDULES, alphas_cumprod, make_betas

#: diffusers' ``timestep_spacing`` values (Table 2 of arXiv:2305.08891).
TIMESTEP_SPACINGS = ("leading", "trailing", "linspace")
#: the ``variance_type`` values implemented here (diffusers also has *_log and learned ones).
VARIANCE_TYPES = ("fixed_small", "fixed_large")


class DDPMScheduler:
    """Ancestral DDPM sampling, with diffusers' constructor names and defaults.

    The config lives in ``scheduler.config`` (like diffusers' ``ConfigMixin``) and is
    copied to plain attributes (``scheduler.prediction_type``); ``step`` reads ``config``.
    """

    #: model evaluations per step (diffusers pipelines use it for warm-up steps)
    order = 1

    def __init__(
        self,
        num_train_timesteps: int = 1000,
        beta_start: float = 0.0001,
        beta_end: float = 0.02,
        beta_schedule: str = "linear",
        variance_type: str = "fixed_small",
        clip_sample: bool = True,
        prediction_type: str = "epsilon",
        clip_sample_range: float = 1.0,
        timestep_spacing: str = "leading",
        steps_offset: int = 0,
    ) -> None:
        check_choice("beta_schedule", beta_schedule, BETA_SCHEDULES)
        check_choice("variance_type", variance_type, VARIANCE_TYPES)
        check_choice("prediction_type", prediction_type, PREDICTION_TYPES)
        check_choice("timestep_spacing", timestep_spacing, TIMESTEP_SPACINGS)
        self.config = SimpleNamespace(
            num_train_timesteps=num_train_timesteps,
            beta_start=beta_start,
            beta_end=beta_end,
            beta_schedule=beta_schedule,
            variance_type=variance_type,
            clip_sample=clip_sample,
            prediction_type=prediction_type,
            clip_sample_range=clip_sample_range,
            timestep_spacing=timestep_spacing,
            steps_offset=steps_offset,
        )
        # the same values as plain attributes, for reading (scheduler.prediction_type)
        vars(self).update(vars(self.config))

        # (T,) float64: noise variance added at each training step t
        self.betas = make_betas(beta_schedule, num_train_timesteps, beta_start, beta_end)
        # (T,) alpha_t = 1 - beta_t
        self.alphas = 1.0 - self.betas
        # (T,) alpha_bar_t = prod_{s<=t} alpha_s: the signal fraction left at t
        self.alphas_cumprod = alphas_cumprod(self.betas)
        # alpha_bar "before t = 0": no noise at all
        self.one = np.float64(1.0)

        # latents start as pure N(0, I) noise: std 1 on the variance-preserving scale
        self.init_noise_sigma = 1.0

        # until set_timesteps is called: every training step, T-1 down to 0
        self.num_inference_steps: int | None = None
        self.timesteps = np.arange(0, num_train_timesteps)[::-1].astype(np.int64)

    def __len__(self) -> int:
        return self.config.num_train_timesteps

    def scale_model_input(self, sample: np.ndarray, timestep: int | None = None) -> np.ndarray:
        """Identity: DDPM feeds x_t to the model unscaled (kept so every loop looks the same)."""
        return sample

    def set_timesteps(self, num_inference_steps: int) -> None:
        """Choose the ``num_inference_steps`` integer timesteps to walk, high to low.

        ``self.timesteps`` becomes an ``(num_inference_steps,)`` int64 array. The three
        ``timestep_spacing`` rules (arXiv:2305.08891, Table 2), for T = 1000, n = 10:

        - ``leading``: 900, 800, ..., 0 (+ ``steps_offset``; SD 1.x uses 1)
        - ``trailing``: 999, 899, ..., 99 (starts at the last, noisiest training step)
        - ``linspace``: 999, 888, ..., 0 (rounded linspace, both ends included)
        """
        T = self.config.num_train_timesteps
        if not 1 <= num_inference_steps <= T:
            raise ValueError(
                f"num_inference_steps must be between 1 and num_train_timesteps={T}, "
                f"got {num_inference_steps}"
            )
        self.num_inference_steps = num_inference_steps

        # Same rules as DDIMScheduler.set_timesteps (labkit/schedulers/ddim.py).
        if self.config.timestep_spacing == "linspace":
            timesteps = np.linspace(0, T - 1, num_inference_steps).round()[::-1].astype(np.int64)
        elif self.config.timestep_spacing == "leading":
            # integer stride from 0: below n = T the noisiest step T-1 is never visited
            step_ratio = T // num_inference_steps
            timesteps = (np.arange(0, num_inference_steps) * step_ratio).round()[::-1]
            timesteps = timesteps.astype(np.int64)
            # diffusers applies steps_offset to "leading" only
            timesteps += self.config.steps_offset
        else:  # "trailing"
            # fractional stride counted down from T, shifted to start at T-1
            step_ratio = T / num_inference_steps
            timesteps = np.round(np.arange(T, 0, -step_ratio)).astype(np.int64)
            timesteps -= 1
        self.timesteps = timesteps

    def previous_timestep(self, timestep: int) -> int:
        """prev_t: the next entry of ``self.timesteps`` (-1 after the last), or t - 1 before
        ``set_timesteps`` was called; diffusers 0.42.1's ``DDPMScheduler.previous_timestep``."""
        if self.num_inference_steps:
            matches = np.flatnonzero(self.timesteps == timestep)
            if len(matches) == 0:
                raise ValueError(f"timestep {timestep} is not in scheduler.timesteps")
            # diffusers takes the first match
            index = matches[0]
            if index == len(self.timesteps) - 1:
                return -1
            return int(self.timesteps[index + 1])
        return int(timestep) - 1

    def _get_variance(self, t: int, variance_type: str | None = None) -> float:
        """Variance of the noise added on the jump t -> prev_t."""
        prev_t = self.previous_timestep(t)

        alpha_prod_t = self.alphas_cumprod[t]
        alpha_prod_t_prev = self.alphas_cumprod[prev_t] if prev_t >= 0 else self.one
        # beta_t' = 1 - alpha_bar_t / alpha_bar_prev: the forward variance of the whole jump
        current_beta_t = 1 - alpha_prod_t / alpha_prod_t_prev

        # posterior variance beta tilde = (1 - alpha_bar_prev) / (1 - alpha_bar_t) * beta_t'
        variance = (1 - alpha_prod_t_prev) / (1 - alpha_prod_t) * current_beta_t
        # diffusers clamps (it may take a log); so the last jump of a schedule ending at t > 0
        # still adds noise of std 1e-10 instead of 0
        variance = max(variance, 1e-20)

        if variance_type is None:
            variance_type = self.config.variance_type
        if variance_type == "fixed_large":
            # the forward variance instead: DDPM paper's other choice, sigma_t^2 = beta_t
            variance = current_beta_t
        return float(variance)

    def step(
        self,
        model_output: np.ndarray,
        timestep: int,
        sample: np.ndarray,
        generator: np.random.Generator | None = None,
        variance_noise: np.ndarray | None = None,
    ) -> SchedulerOutput:
        """One reverse step x_t -> x_{prev_t}.

        ``model_output`` and ``sample`` have the same shape (``(N, D)`` in the labs). The step
        noise z is ``variance_noise`` if given, else drawn from ``generator`` (a
        ``numpy.random.Generator``), else from a fresh ``np.random.default_rng()``. diffusers'
        ``step`` has no ``variance_noise`` argument (it always draws with ``randn_tensor``);
        ours takes one so a test can feed both the same z. Passing both is an error, as in
        diffusers' ``DDIMScheduler.step``.
        """
        if variance_noise is not None and generator is not None:
            raise ValueError("pass either generator or variance_noise, not both")
        model_output = np.asarray(model_output, dtype=np.float64)
        sample = np.asarray(sample, dtype=np.float64)
        t = int(timestep)
        prev_t = self.previous_timestep(t)

        # 1. alphas, betas for the jump t -> prev_t
        alpha_prod_t = self.alphas_cumprod[t]
        alpha_prod_t_prev = self.alphas_cumprod[prev_t] if prev_t >= 0 else self.one
        beta_prod_t = 1 - alpha_prod_t
        beta_prod_t_prev = 1 - alpha_prod_t_prev
        current_alpha_t = alpha_prod_t / alpha_prod_t_prev
        current_beta_t = 1 - current_alpha_t

        # 2. x0_hat from the model output (formula (15) of the DDPM paper for epsilon)
        if self.config.prediction_type == "epsilon":
            # x0 = (x_t - sqrt(1 - alpha_bar_t) eps) / sqrt(alpha_bar_t)
            pred_original_sample = (sample - beta_prod_t**0.5 * model_output) / alpha_prod_t**0.5
        elif self.config.prediction_type == "sample":
            pred_original_sample = model_output
        else:  # "v_prediction": x0 = sqrt(alpha_bar_t) x_t - sqrt(1 - alpha_bar_t) v
            pred_original_sample = alpha_prod_t**0.5 * sample - beta_prod_t**0.5 * model_output

        # 3. clip x0_hat to [-range, range] (meant for pixels in [-1, 1], not for latents)
        if self.config.clip_sample:
            r = self.config.clip_sample_range
            pred_original_sample = np.clip(pred_original_sample, -r, r)

        # --8<-- [start:ddpm_step]
        # 4. posterior mean = coeff_x0 * x0_hat + coeff_xt * x_t (formula (7))
        pred_original_sample_coeff = (alpha_prod_t_prev**0.5 * current_beta_t) / beta_prod_t
        current_sample_coeff = current_alpha_t**0.5 * beta_prod_t_prev / beta_prod_t
        pred_prev_sample = (
            pred_original_sample_coeff * pred_original_sample + current_sample_coeff * sample
        )

        # 5. add sqrt(variance) z, z ~ N(0, I), except at t = 0: the last step returns the mean
        if t > 0:
            if variance_noise is None:
                rng = generator if generator is not None else np.random.default_rng()
                variance_noise = rng.standard_normal(model_output.shape)
            variance_noise = np.asarray(variance_noise, dtype=np.float64)
            pred_prev_sample = pred_prev_sample + self._get_variance(t) ** 0.5 * variance_noise
        # --8<-- [end:ddpm_step]

        return SchedulerOutput(pred_prev_sample, pred_original_sample)

    def add_noise(
        self, original_samples: np.ndarray, noise: np.ndarray, timesteps: int | np.ndarray
    ) -> np.ndarray:
        """The forward process in one jump: sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) eps.

        ``timesteps`` is one int or one per sample (shape ``(B,)``); each coefficient is
        broadcast over the sample's other axes, as diffusers does.
        """
        original_samples = np.asarray(original_samples, dtype=np.float64)
        # (B,) integer timesteps (a scalar becomes (1,)), as diffusers' .flatten()
        timesteps = np.asarray(timesteps).reshape(-1)
        # (B,) -> (B, 1, ..., 1): one coefficient per sample, broadcast over its other axes
        trailing = (1,) * (original_samples.ndim - 1)
        # sqrt(alpha_bar_t)
        sqrt_alpha_prod = (self.alphas_cumprod[timesteps] ** 0.5).reshape(-1, *trailing)
        # sqrt(1 - alpha_bar_t)
        sqrt_one_minus_alpha_prod = ((1 - self.alphas_cumprod[timesteps]) ** 0.5).reshape(
            -1, *trailing
        )
        return sqrt_alpha_prod * original_samples + sqrt_one_minus_alpha_prod * noise
