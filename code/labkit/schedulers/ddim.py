"""DDIM scheduler: big deterministic jumps along the same noise schedule.

A NumPy mirror of diffusers' ``DDIMScheduler`` (``schedulers/scheduling_ddim.py``,
checked against diffusers 0.42.1), for Song, Meng & Ermon, *Denoising Diffusion
Implicit Models* (2020), arXiv:2010.02502.

DDIM reuses a DDPM-trained model but samples a non-Markovian process that has the same
marginals ``x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) eps``. From the model output it
recovers (x0_hat, eps_hat) and re-noises x0_hat to the previous timestep (formula (12)):

    x_prev = sqrt(alpha_bar_prev) x0_hat                           "predicted x0"
           + sqrt(1 - alpha_bar_prev - std_dev_t^2) eps_hat        "direction pointing to x_t"
           + std_dev_t z,   z ~ N(0, I)                            "random noise"

    std_dev_t = eta * sqrt((1 - alpha_bar_prev) / (1 - alpha_bar_t) * (1 - alpha_bar_t / alpha_bar_prev))

``eta = 0`` is deterministic DDIM (an ODE solver; same noise in, same image out);
``eta = 1`` gives DDPM's posterior variance (formula (16)).

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


class DDIMScheduler:
    """DDIM sampling, with diffusers' constructor names and defaults.

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
        clip_sample: bool = True,
        set_alpha_to_one: bool = True,
        steps_offset: int = 0,
        prediction_type: str = "epsilon",
        clip_sample_range: float = 1.0,
        timestep_spacing: str = "leading",
    ) -> None:
        check_choice("beta_schedule", beta_schedule, BETA_SCHEDULES)
        check_choice("prediction_type", prediction_type, PREDICTION_TYPES)
        check_choice("timestep_spacing", timestep_spacing, TIMESTEP_SPACINGS)
        self.config = SimpleNamespace(
            num_train_timesteps=num_train_timesteps,
            beta_start=beta_start,
            beta_end=beta_end,
            beta_schedule=beta_schedule,
            clip_sample=clip_sample,
            set_alpha_to_one=set_alpha_to_one,
            steps_offset=steps_offset,
            prediction_type=prediction_type,
            clip_sample_range=clip_sample_range,
            timestep_spacing=timestep_spacing,
        )
        # the same values as plain attributes, for reading (scheduler.prediction_type)
        vars(self).update(vars(self.config))

        # (T,) float64: noise variance added at each training step t
        self.betas = make_betas(beta_schedule, num_train_timesteps, beta_start, beta_end)
        # (T,) alpha_t = 1 - beta_t
        self.alphas = 1.0 - self.betas
        # (T,) alpha_bar_t = prod_{s<=t} alpha_s: the signal fraction left at t
        self.alphas_cumprod = alphas_cumprod(self.betas)

        # alpha_bar "after the last step" (prev_timestep < 0): 1 = a clean x0 (SD uses False,
        # which stops at alpha_bar_0 and leaves the tiny noise of training step 0)
        self.final_alpha_cumprod = np.float64(1.0) if set_alpha_to_one else self.alphas_cumprod[0]

        # latents start as pure N(0, I) noise: std 1 on the variance-preserving scale
        self.init_noise_sigma = 1.0

        # until set_timesteps is called: every training step, T-1 down to 0
        self.num_inference_steps: int | None = None
        self.timesteps = np.arange(0, num_train_timesteps)[::-1].astype(np.int64)

    def __len__(self) -> int:
        return self.config.num_train_timesteps

    def scale_model_input(self, sample: np.ndarray, timestep: int | None = None) -> np.ndarray:
        """Identity: DDIM feeds x_t to the model unscaled (kept so every loop looks the same)."""
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

        # --8<-- [start:spacing]
        if self.config.timestep_spacing == "linspace":
            # n evenly spaced points on [0, T-1], rounded: both ends are visited
            timesteps = np.linspace(0, T - 1, num_inference_steps).round()[::-1].astype(np.int64)
        elif self.config.timestep_spacing == "leading":
            # integer stride from 0: the noisiest step is (n-1)·(T//n), below T-1 for n < T;
            # steps_offset=1 reaches T-1 only at n = 500 and 999 (T = 1000)
            step_ratio = T // num_inference_steps
            timesteps = (np.arange(0, num_inference_steps) * step_ratio).round()[::-1]
            # diffusers applies steps_offset to "leading" only (SD 1.x: 901, 801, ..., 1)
            timesteps = timesteps.astype(np.int64) + self.config.steps_offset
        else:  # "trailing"
            # fractional stride counted down from T, shifted to start at T-1
            step_ratio = T / num_inference_steps
            timesteps = np.round(np.arange(T, 0, -step_ratio)).astype(np.int64) - 1
        # --8<-- [end:spacing]
        self.timesteps = timesteps

    def _get_variance(self, timestep: int, prev_timestep: int) -> float:
        """DDPM's posterior variance for the jump t -> prev_t (before eta scales its sqrt)."""
        alpha_prod_t = self.alphas_cumprod[timestep]
        alpha_prod_t_prev = (
            self.alphas_cumprod[prev_timestep] if prev_timestep >= 0 else self.final_alpha_cumprod
        )
        beta_prod_t = 1 - alpha_prod_t
        beta_prod_t_prev = 1 - alpha_prod_t_prev
        # (1 - alpha_bar_prev) / (1 - alpha_bar_t) * (1 - alpha_bar_t / alpha_bar_prev)
        return (beta_prod_t_prev / beta_prod_t) * (1 - alpha_prod_t / alpha_prod_t_prev)

    def step(
        self,
        model_output: np.ndarray,
        timestep: int,
        sample: np.ndarray,
        eta: float = 0.0,
        use_clipped_model_output: bool = False,
        generator: np.random.Generator | None = None,
        variance_noise: np.ndarray | None = None,
    ) -> SchedulerOutput:
        """One DDIM step x_t -> x_{prev_t}; ``model_output`` and ``sample`` share a shape.

        ``eta`` scales the added noise (0: deterministic, 1: DDPM-like). For ``eta > 0`` the
        noise z is ``variance_noise`` if given, else drawn from ``generator`` (a
        ``numpy.random.Generator``), else from a fresh ``np.random.default_rng()``.
        ``use_clipped_model_output`` re-derives eps_hat from the clipped x0_hat (GLIDE).
        """
        if self.num_inference_steps is None:
            raise ValueError("num_inference_steps is None: call set_timesteps before step")
        model_output = np.asarray(model_output, dtype=np.float64)
        sample = np.asarray(sample, dtype=np.float64)
        timestep = int(timestep)

        # 1. prev_t = t - T // n. diffusers' quirk: this fixed stride is used for every
        # timestep_spacing, so with "trailing" or "linspace" prev_t need not be the next entry
        # of self.timesteps (trailing, n = 7: 999 -> 857, but the next timestep is 856)
        prev_timestep = timestep - self.config.num_train_timesteps // self.num_inference_steps

        # 2. alphas, betas; past the end (prev_t < 0) use final_alpha_cumprod
        alpha_prod_t = self.alphas_cumprod[timestep]
        alpha_prod_t_prev = (
            self.alphas_cumprod[prev_timestep] if prev_timestep >= 0 else self.final_alpha_cumprod
        )
        beta_prod_t = 1 - alpha_prod_t

        # 3. (x0_hat, eps_hat) from the model output, whatever it predicts
        if self.config.prediction_type == "epsilon":
            # x0 = (x_t - sqrt(1 - alpha_bar_t) eps) / sqrt(alpha_bar_t)
            pred_original_sample = (sample - beta_prod_t**0.5 * model_output) / alpha_prod_t**0.5
            pred_epsilon = model_output
        elif self.config.prediction_type == "sample":
            pred_original_sample = model_output
            # eps = (x_t - sqrt(alpha_bar_t) x0) / sqrt(1 - alpha_bar_t)
            pred_epsilon = (sample - alpha_prod_t**0.5 * pred_original_sample) / beta_prod_t**0.5
        else:  # "v_prediction", v = sqrt(alpha_bar_t) eps - sqrt(1 - alpha_bar_t) x0
            pred_original_sample = alpha_prod_t**0.5 * sample - beta_prod_t**0.5 * model_output
            pred_epsilon = alpha_prod_t**0.5 * model_output + beta_prod_t**0.5 * sample

        # 4. clip x0_hat to [-range, range] (meant for pixels in [-1, 1], not for latents)
        if self.config.clip_sample:
            r = self.config.clip_sample_range
            pred_original_sample = np.clip(pred_original_sample, -r, r)

        if use_clipped_model_output:
            # GLIDE: eps_hat re-derived from the clipped x0_hat
            pred_epsilon = (sample - alpha_prod_t**0.5 * pred_original_sample) / beta_prod_t**0.5

        # --8<-- [start:ddim_step]
        # 5. std_dev_t = eta * sigma_t, sigma_t from formula (16)
        variance = self._get_variance(timestep, prev_timestep)
        std_dev_t = eta * variance**0.5

        # 6. "direction pointing to x_t": sqrt(1 - alpha_bar_prev - std_dev_t^2) eps_hat
        pred_sample_direction = (1 - alpha_prod_t_prev - std_dev_t**2) ** 0.5 * pred_epsilon

        # 7. x_prev = sqrt(alpha_bar_prev) x0_hat + direction (formula (12), without noise)
        prev_sample = alpha_prod_t_prev**0.5 * pred_original_sample + pred_sample_direction

        # 8. eta > 0: add the "random noise" std_dev_t z
        if eta > 0:
            if variance_noise is not None and generator is not None:
                raise ValueError("pass either generator or variance_noise, not both")
            if variance_noise is None:
                rng = generator if generator is not None else np.random.default_rng()
                variance_noise = rng.standard_normal(model_output.shape)
            variance_noise = np.asarray(variance_noise, dtype=np.float64)
            prev_sample = prev_sample + std_dev_t * variance_noise
        # --8<-- [end:ddim_step]

        return SchedulerOutput(prev_sample, pred_original_sample)

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
