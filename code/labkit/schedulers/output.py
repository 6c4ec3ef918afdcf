"""What every scheduler's ``step`` returns, and the one check all four constructors share.

diffusers returns a small dataclass from ``scheduler.step(...)`` (``DDPMSchedulerOutput``,
``DDIMSchedulerOutput``, ...), and a pipeline reads ``.prev_sample`` from it: the
latents for the next loop iteration. The NumPy schedulers return this one class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class SchedulerOutput:
    """The result of one denoising step, with diffusers' field names.

    - ``prev_sample``: x_{t_prev}, same shape as the ``sample`` that went in, e.g. ``(N, D)``
      for the toy labs or ``(B, 4, H/8, W/8)`` for SD 1.x latents. The next loop input.
    - ``pred_original_sample``: the scheduler's estimate of x0 at this step (same shape),
      the "preview" image. ``None`` where a scheduler does not compute one.
    """

    prev_sample: np.ndarray
    pred_original_sample: np.ndarray | None = None


def check_choice(name: str, value: object, choices: Sequence[str]) -> None:
    """Raise a one-line ``ValueError`` if a config string is not one the scheduler implements."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")
