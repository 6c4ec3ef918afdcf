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

    def __getitem__(self, index: int | slice | str) -> object:
        """``output[0]`` is ``prev_sample``, as in diffusers' ``BaseOutput``: an integer indexes
        the fields that are not None, in order; a string, one of those fields by name."""
        fields = {"prev_sample": self.prev_sample, "pred_original_sample": self.pred_original_sample}  # fmt: skip
        fields = {k: v for k, v in fields.items() if v is not None}
        return fields[index] if isinstance(index, str) else tuple(fields.values())[index]

    #: no iteration: diffusers' outputs iterate over their field *names* (a dict's keys),
    #: so unpacking ``prev, x0 = step(...)`` is an error here rather than a silent difference
    __iter__ = None


def check_choice(name: str, value: object, choices: Sequence[str]) -> None:
    """Raise a one-line ``ValueError`` if a config string is not one the scheduler implements."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")
