"""Flow-matching Euler scheduler: straight paths from data to noise, walked back in sigma.

A NumPy mirror of diffusers' ``FlowMatchEulerDiscreteScheduler``
(``schedulers/scheduling_flow_match_euler_discrete.py``, checked against diffusers 0.42.1),
the sampler of Stable Diffusion 3. Rectified flow is Liu, Gong & Liu, *Flow Straight and
Fast* (2022), arXiv:2209.03003; flow matching is Lipman et al., *Flow Matching for Generative
Modeling* (2022), arXiv:2210.02747. Esser et al., *Scaling Rectified Flow Transformers for
High-Resolution Image Synthesis* (2024), arXiv:2403.03206, scaled them up for SD3 and added
the resolution-dependent timestep shift.

Rectified flow noises data along a straight line, ``x_sigma = (1 - sigma) x0 + sigma eps`` for
sigma in [0, 1], and the model predicts the velocity ``v = dx/dsigma = eps - x0``. Sampling is
Euler on that ODE from sigma = 1 (pure noise) down to 0:

    x_next = x + (sigma_next - sigma) * v_hat

SD3 shifts the sigmas toward the noisy end (more steps where the image's layout is decided):
``sigma' = shift sigma / (1 + (shift - 1) sigma)``; shift = 3.0 for SD3, 1.0 = no shift.
The ``timesteps`` the model sees are ``sigma * num_train_timesteps`` (floats, 1000 down to ~0).

Arrays are float64 NumPy; diffusers keeps its sigmas in float32 torch tensors, so the two
agree to about 1e-6 (``tests/verify/test_schedulers_vs_diffusers.py``).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from labkit.schedulers.output import SchedulerOutput


class FlowMatchEulerDiscreteScheduler:
    """Euler sampling of a rectified flow with a static ``shift``, diffusers' names and defaults.

    The config lives in ``scheduler.config`` and is copied to plain attributes
    (``scheduler.shift``), or diffusers' dynamic (resolution-dependent) shifting when
    ``set_timesteps`` is given ``mu``. Karras / exponential / beta sigmas and stochastic
    sampling are not implemented.
    """

    #: model evaluations per step (diffusers pipelines use it for warm-up steps)
    order = 1

    def __init__(self, num_train_timesteps: int = 1000, shift: float = 1.0) -> None:
        if not shift > 0:
            raise ValueError(f"shift must be > 0 (1.0 = no shift, SD3 uses 3.0), got {shift}")
        self.config = SimpleNamespace(num_train_timesteps=num_train_timesteps, shift=shift)
        # the same values as plain attributes, for reading (scheduler.shift)
        vars(self).update(vars(self.config))

        T = num_train_timesteps
        # (T,) the training noise levels t / T for t = T, ..., 1: from 1.0 down to 1/T
        sigmas = np.linspace(1, T, T)[::-1] / T
        # SD3 shift: sigma' = shift sigma / (1 + (shift - 1) sigma)
        sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
        # until set_timesteps is called: T shifted training timesteps, no final 0 yet
        self.num_inference_steps: int | None = None
        self.timesteps = sigmas * T
        self.sigmas = sigmas
        # end points for set_timesteps; sigma_min is already shifted (see set_timesteps)
        self.sigma_min = float(sigmas[-1])
        self.sigma_max = float(sigmas[0])

        # which entry of self.sigmas the next step uses; set on first use
        self._step_index: int | None = None
        self._begin_index: int | None = None

    def __len__(self) -> int:
        return self.config.num_train_timesteps

    @property
    def init_noise_sigma(self) -> float:
        """1.0: the loop starts from N(0, I) at sigma = 1. Not a diffusers attribute: its flow
        class has none, and SD3's pipeline draws unscaled latents. Kept so loops look alike."""
        return 1.0

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

    def set_timesteps(
        self, num_inference_steps: int, sigmas: np.ndarray | None = None, mu: float | None = None
    ) -> None:
        """n shifted sigmas from sigma_max down to sigma_min, then a final 0.

        ``self.timesteps``: ``(n,)`` float64 = sigma * T; ``self.sigmas``: ``(n + 1,)``.
        With ``mu``, diffusers' dynamic shifting (``use_dynamic_shifting=True``, as in
        FLUX.1-dev's config; its pipeline passes ``sigmas = linspace(1, 1/n, n)`` and
        ``mu = calculate_shift(image_seq_len)``): the given ``sigmas`` get diffusers'
        exponential ``time_shift`` instead of the static ``shift``,
        ``sigma' = e^mu / (e^mu + (1/sigma - 1))``. ``sigmas`` without ``mu`` (diffusers'
        static shift of given sigmas) is not emulated, and raises.
        """
        T = self.config.num_train_timesteps
        if sigmas is not None and mu is None:
            raise ValueError("sigmas without mu (a static shift of given sigmas) is not emulated")
        if mu is not None:
            if sigmas is None:
                sigmas = np.linspace(1.0, 1.0 / num_inference_steps, num_inference_steps)
            if len(sigmas) != num_inference_steps or not 1 <= num_inference_steps <= T:
                raise ValueError(f"{len(sigmas)} sigmas for {num_inference_steps} steps")
            # diffusers' _time_shift_exponential(mu, 1.0, sigmas)
            sigmas = np.exp(mu) / (np.exp(mu) + (1.0 / np.asarray(sigmas, dtype=np.float64) - 1.0))
            self.num_inference_steps = len(sigmas)
            self.timesteps = sigmas * T
            self.sigmas = np.concatenate([sigmas, [0.0]])
            self._step_index = None
            self._begin_index = None
            return
        if not 1 <= num_inference_steps <= T:
            raise ValueError(
                f"num_inference_steps must be between 1 and num_train_timesteps={T}, "
                f"got {num_inference_steps}"
            )
        self.num_inference_steps = num_inference_steps
        shift = self.config.shift

        # --8<-- [start:flow_sigmas]
        # (n,) timesteps evenly spaced from sigma_max * T down to sigma_min * T
        timesteps = np.linspace(self.sigma_max * T, self.sigma_min * T, num_inference_steps)
        sigmas = timesteps / T
        # SD3 shift: sigma' = shift sigma / (1 + (shift - 1) sigma), pushes steps toward noise.
        # diffusers' quirk: sigma_min was already shifted in __init__ and is shifted again here
        # (shift = 3: the last sigma is 0.0089, not 0.0030)
        sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
        # --8<-- [end:flow_sigmas]

        # the model is conditioned on sigma * T, a float in (0, T]
        self.timesteps = sigmas * T
        # (n + 1,): the ODE ends at sigma = 0, the clean sample
        self.sigmas = np.concatenate([sigmas, [0.0]])
        self._step_index = None
        self._begin_index = None

    def index_for_timestep(
        self, timestep: float, schedule_timesteps: np.ndarray | None = None
    ) -> int:
        """Position of ``timestep`` in ``self.timesteps`` (an exact float match); if it appears
        more than once, diffusers takes the second match (img2img must not skip a sigma)."""
        if schedule_timesteps is None:
            schedule_timesteps = self.timesteps
        indices = np.flatnonzero(schedule_timesteps == timestep)
        if len(indices) == 0:
            raise ValueError(f"timestep {timestep} is not in scheduler.timesteps")
        pos = 1 if len(indices) > 1 else 0
        return int(indices[pos])

    def _init_step_index(self, timestep: float) -> None:
        # looked up once, on the first step; then only incremented
        if self._begin_index is None:
            self._step_index = self.index_for_timestep(timestep)
        else:
            self._step_index = self._begin_index

    def scale_model_input(self, sample: np.ndarray, timestep: float | None = None) -> np.ndarray:
        """Identity. diffusers' ``FlowMatchEulerDiscreteScheduler`` does not define
        ``scale_model_input`` and SD3 pipelines do not call it: the transformer sees x_sigma
        as is. Provided only so one loop body fits every scheduler here."""
        return sample

    def step(
        self, model_output: np.ndarray, timestep: float, sample: np.ndarray
    ) -> SchedulerOutput:
        """One Euler step from ``sigmas[step_index]`` to ``sigmas[step_index + 1]``.

        ``model_output`` is the predicted velocity eps - x0, same shape as ``sample``.
        diffusers' output has only ``prev_sample``; ours also fills ``pred_original_sample``.
        """
        if isinstance(timestep, (int, np.integer)):
            # as diffusers: an int is almost always an index from enumerate(timesteps)
            raise ValueError(
                "pass a timestep from scheduler.timesteps (a float) to"
                " FlowMatchEulerDiscreteScheduler.step, not an integer index"
            )
        if self._step_index is None:
            self._init_step_index(timestep)
        model_output = np.asarray(model_output, dtype=np.float64)
        sample = np.asarray(sample, dtype=np.float64)

        # --8<-- [start:flow_step]
        sigma = self.sigmas[self._step_index]
        sigma_next = self.sigmas[self._step_index + 1]
        # Euler on dx/dsigma = v: dt < 0, sigma goes down toward the data
        dt = sigma_next - sigma
        prev_sample = sample + dt * model_output
        # x0_hat = x - sigma v, from x = (1 - sigma) x0 + sigma eps and v = eps - x0
        # (not in diffusers' FlowMatchEulerDiscreteSchedulerOutput; added for the labs)
        pred_original_sample = sample - sigma * model_output
        # --8<-- [end:flow_step]

        self._step_index += 1
        return SchedulerOutput(prev_sample, pred_original_sample)

    def scale_noise(
        self, sample: np.ndarray, timestep: float | np.ndarray, noise: np.ndarray
    ) -> np.ndarray:
        """The forward process: sigma * noise + (1 - sigma) * sample (diffusers' ``scale_noise``).

        ``timestep`` must be entries of ``self.timesteps`` (one, or one per sample); with a
        ``begin_index`` set, diffusers uses the current step index (or the begin index) instead.
        """
        sample = np.asarray(sample, dtype=np.float64)
        # (B,) timesteps (a scalar becomes (1,))
        timestep = np.asarray(timestep, dtype=np.float64).reshape(-1)
        if self._begin_index is None:
            step_indices = [self.index_for_timestep(t) for t in timestep]
        elif self._step_index is not None:
            step_indices = [self._step_index] * timestep.shape[0]
        else:
            step_indices = [self._begin_index] * timestep.shape[0]

        # (B,) -> (B, 1, ..., 1): one sigma per sample, broadcast over its other axes
        sigma = self.sigmas[step_indices].reshape(-1, *(1,) * (sample.ndim - 1))
        return sigma * noise + (1.0 - sigma) * sample

    def add_noise(
        self, original_samples: np.ndarray, noise: np.ndarray, timesteps: float | np.ndarray
    ) -> np.ndarray:
        """``scale_noise`` with the DDPM-family argument order. Not a diffusers method: the
        flow class only has ``scale_noise(sample, timestep, noise)``."""
        return self.scale_noise(original_samples, timesteps, noise)
