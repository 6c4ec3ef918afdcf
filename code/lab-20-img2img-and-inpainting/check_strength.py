"""Lab 20: does your get_timesteps keep the timesteps StableDiffusionImg2ImgPipeline's does?

Checks `get_timesteps` in strength_blanks.py, the file you edit, against the solution
(strength_solution.txt) at several strengths (1.0, and ones that run 0 or 1 step) and step
counts (1 included), on a first-order scheduler and a second-order one: the first blank that
gives another value is named, with its line, both values and a hint. Exit 0: every filled
blank the runs reach matches (a run stops at the first blank still to fill; those are
listed); 1: a blank differs; 2: your file does
not parse, a line of it raises, or a blank gives another type than the solution's (one
line, naming your line).

Check it:  python3 code/lab-20-img2img-and-inpainting/check_strength.py
The solution's lines in place of yours:  add --solution
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit.blanks import check_function, exercise, finish
from labkit.schedulers import DDIMScheduler

# %% [markdown]
# ## The cases and the check
#
# `get_timesteps` reads two things of the scheduler: `timesteps` and `order`. The cases
# use DDIM with SD 1.5's scheduler settings (order 1, one entry per step) and a
# second-order grid laid out as `HeunDiscreteScheduler` lays out its own (order 2: the
# first timestep once, each later one twice, 2n - 1 entries), at strengths that run every
# step, a few, one or none. `check_function` (labkit.blanks) runs your function and the solution's on each
# case and compares the variable each blank assigns.

# %%
# --8<-- [start:check]
parser, CHECKED, SOLUTION = exercise(__doc__, "check_strength.py", "lab-20-img2img-and-inpainting", globals().get("__file__"),
                                     "strength_blanks.py", "strength_solution.txt")  # fmt: skip


class Grid:
    """All of a scheduler that get_timesteps reads: its timesteps and its order."""

    def __init__(self, name, timesteps, order):
        self.name, self.timesteps, self.order = name, timesteps, order

    def __repr__(self):
        return f"{self.name} (order {self.order}, {len(self.timesteps)} entries)"


def grids(n):
    """DDIM's grid of SD 1.5 (leading, steps_offset=1), and Heun's layout of it."""
    ddim = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                         steps_offset=1, set_alpha_to_one=False, clip_sample=False)  # fmt: skip
    ddim.set_timesteps(n)
    t = ddim.timesteps  # (n,) int64, high to low
    return Grid("DDIM", t, 1), Grid("second-order", np.concatenate([t[:1], np.repeat(t[1:], 2)]), 2)


#: num_inference_steps -> strengths: all steps (1.0), a few, one (0.1 of 10), none (0.05 of
#: 10, 0.5 of 1: an img2img call that runs no step)
STRENGTHS = [
    (10, (0.6, 0.35, 1.0, 0.1, 0.05)),
    (4, (0.5, 0.3, 0.75)),
    (1, (1.0, 0.5)),
    (50, (0.8,)),
]
CASES = [
    (f"scheduler={grid!r}, num_inference_steps={n}, strength={strength}", (grid, n, strength))
    for n, strengths in STRENGTHS
    for strength in strengths
    for grid in grids(n)
]
verdict = check_function(CHECKED, "get_timesteps", SOLUTION, CASES, blanks=3)  # fmt: skip
finish(parser, verdict)
# --8<-- [end:check]
