"""DDPM noise schedules, with diffusers' ``beta_schedule`` names and formulas.

Lab 01 teaches these; every later lab imports them from here.

A schedule is the training-time noise timetable: ``betas[t]`` is the variance of
the noise added at step ``t`` and ``alphas_cumprod[t] = prod_{s<=t} (1 - betas[s])``
("alpha_bar_t") is the fraction of signal variance left at ``t``. Both are
``(num_train_timesteps,)`` float64 arrays indexed by the integer timestep.

diffusers computes the same quantities in float32 torch tensors
(``DDPMScheduler.betas`` / ``.alphas_cumprod``); the verify tests compare them.
"""

from __future__ import annotations

import math

import numpy as np

#: The ``beta_schedule`` values diffusers' DDPM-family schedulers accept that
#: these labs implement. ("sigmoid" exists too but no common checkpoint uses it.)
BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")


def betas_for_alpha_bar(num_train_timesteps: int, max_beta: float = 0.999) -> np.ndarray:
    """Cosine schedule of Nichol & Dhariwal (2021), as diffusers' ``betas_for_alpha_bar``.

    alpha_bar(t) = cos^2(((t + 0.008) / 1.008) * pi / 2) on t in [0, 1], and
    beta_i = min(1 - alpha_bar((i + 1) / T) / alpha_bar(i / T), max_beta).
    The cap keeps the last betas below 1, so alpha_bar never reaches exactly 0.
    """

    def alpha_bar(t: float) -> float:
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    T = num_train_timesteps
    return np.array(
        [min(1.0 - alpha_bar((i + 1) / T) / alpha_bar(i / T), max_beta) for i in range(T)]
    )


def make_betas(
    beta_schedule: str = "linear",
    num_train_timesteps: int = 1000,
    beta_start: float = 0.0001,
    beta_end: float = 0.02,
) -> np.ndarray:
    """``(num_train_timesteps,)`` float64 betas, with diffusers' defaults.

    - ``linear``: DDPM (Ho et al., 2020), betas evenly spaced from beta_start to beta_end.
    - ``scaled_linear``: Stable Diffusion's schedule (with beta_start=0.00085,
      beta_end=0.012), evenly spaced in sqrt(beta), then squared.
    - ``squaredcos_cap_v2``: the cosine schedule; ignores beta_start / beta_end.
    """
    if num_train_timesteps < 1:
        raise ValueError(f"num_train_timesteps must be >= 1, got {num_train_timesteps}")
    if beta_schedule == "linear":
        return np.linspace(beta_start, beta_end, num_train_timesteps)
    if beta_schedule == "scaled_linear":
        return np.linspace(beta_start**0.5, beta_end**0.5, num_train_timesteps) ** 2
    if beta_schedule == "squaredcos_cap_v2":
        return betas_for_alpha_bar(num_train_timesteps)
    raise ValueError(
        f"unknown beta_schedule {beta_schedule!r}; choose one of {', '.join(BETA_SCHEDULES)}"
    )


def alphas_cumprod(betas: np.ndarray) -> np.ndarray:
    """alpha_bar_t = prod_{s<=t} (1 - beta_s), shape ``(T,)``: the signal fraction left at t."""
    return np.cumprod(1.0 - np.asarray(betas, dtype=np.float64))


#: The (beta_start, beta_end) that well-known checkpoints were trained with:
#: DDPM (Ho et al., 2020) for ``linear``; Stable Diffusion 1.x/2.x for
#: ``scaled_linear`` (its scheduler_config.json); the cosine schedule ignores them.
CANONICAL_BETA_RANGE = {
    "linear": (0.0001, 0.02),
    "scaled_linear": (0.00085, 0.012),
    "squaredcos_cap_v2": (0.0001, 0.02),
}


def canonical_betas(beta_schedule: str, num_train_timesteps: int = 1000) -> np.ndarray:
    """``make_betas`` with the beta range its best-known checkpoints use."""
    if beta_schedule not in CANONICAL_BETA_RANGE:
        raise ValueError(
            f"unknown beta_schedule {beta_schedule!r}; choose one of {', '.join(BETA_SCHEDULES)}"
        )
    beta_start, beta_end = CANONICAL_BETA_RANGE[beta_schedule]
    return make_betas(beta_schedule, num_train_timesteps, beta_start, beta_end)
