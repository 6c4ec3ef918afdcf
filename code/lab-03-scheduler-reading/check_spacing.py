"""Lab 03: do your three timestep spacings give the timesteps DDIMScheduler.set_timesteps does?

Checks `set_timesteps` in spacing_blanks.py, the file you edit, against the solution
(spacing_solution.txt) on every spacing at 1, 3, 7, 10, 16, 27, 50, 61 and 1000 steps and
steps_offset 0 and 1, and at 7 steps of a 500-step training schedule: the first blank that gives another value is named, with its line,
both values and a hint. Exit 0: every filled blank matches (the blanks still to fill are
listed); 1: a blank differs; 2: your file does not parse, a line of it raises, or a blank
gives another type than the solution's (one line, naming your line).

Check it:  python3 code/lab-03-scheduler-reading/check_spacing.py
The solution's lines in place of yours:  add --solution
"""

import sys
from pathlib import Path

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit.blanks import check_function, exercise, finish

# %% [markdown]
# ## The cases and the check
#
# Every spacing, at step counts where the rules part ways: 7 and 3 do not divide 1000 (the
# integer stride of `leading` against the float one of `trailing`), 1 and 1000 are the
# ends, and at 27 and 61 NumPy's floats part from the formulas (`linspace` rounds 499.49...
# to 499, not a tie's 500; `trailing` gives 62 timesteps at 61 steps, the last -1), and at
# 16 `trailing` holds ties (812.5), which np.round sends to the even integer, 812. One
# case of a 500-step training schedule (num_train_timesteps, T) catches a 1000 written in.
# `check_function` (labkit.blanks) runs your function and the solution's on each case,
# compares the variable each blank assigns, and takes its hint from the solution's table of
# typical mistakes when one of them gives your value.

# %%
# --8<-- [start:check]
parser, CHECKED, SOLUTION = exercise(__doc__, "check_spacing.py", "lab-03-scheduler-reading", globals().get("__file__"),
                                     "spacing_blanks.py", "spacing_solution.txt")  # fmt: skip

SPACINGS = ("leading", "trailing", "linspace")  # blanks 1, 2, 3
#: (num_inference_steps, num_train_timesteps)
STEPS = [(10, 1000), (7, 1000), (3, 1000), (50, 1000), (1, 1000), (1000, 1000), (27, 1000), (61, 1000), (16, 1000), (7, 500)]  # fmt: skip
CASES = [
    (
        f"timestep_spacing={spacing!r}, num_inference_steps={n}, steps_offset={offset}"
        + (f", num_train_timesteps={T}" if T != 1000 else ""),
        (n, spacing, offset, T),
    )
    for spacing in SPACINGS
    for n, T in STEPS
    for offset in (1, 0)
]
verdict = check_function(CHECKED, "set_timesteps", SOLUTION, CASES, blanks=3)  # fmt: skip
finish(parser, verdict)
# --8<-- [end:check]
