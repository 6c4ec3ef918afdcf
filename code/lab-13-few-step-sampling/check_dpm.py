"""Lab 13: does your DPM-Solver++ 2M update give the x_t DPMSolverMultistepScheduler's does?

Checks `dpm_solver_update` in dpm_blanks.py, the file you edit, against the solution
(dpm_solution.txt) on every step of SD's trailing grids at 1, 2, 4 and 8 steps, first
order on the first step and second order on the others (as diffusers' step with
final_sigmas_type="sigma_min" and lower_order_final=False), with tiny arrays: the first
blank that gives another value is named, with its line, both values and, for a typical
mistake, a hint. Exit 0: every filled blank the runs reach matches (a run stops at the first
blank still to fill; those are listed); 1: a blank differs; 2: your file does not parse, a
line of it raises, or a blank gives another type than the solution's (one line, naming
your line).

Check it:  python3 code/lab-13-few-step-sampling/check_dpm.py
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

from labkit import make_betas
from labkit.blanks import check_function, exercise, finish

# %% [markdown]
# ## The cases and the check
#
# The sigmas are few_step.py's DPMSolverMultistepScheduler's on SD's `scaled_linear` betas
# with `timestep_spacing="trailing"`, ending at the smallest training sigma
# (`final_sigmas_type="sigma_min"`, so that every lambda is finite). Step i of an n-step
# run gets a (3, 2) sample, its x0_hat m0 and, after the first step, the m0 of step i - 1
# as m1: second order on every later step, the last too, as with `lower_order_final=False`
# (the default, True, makes the last step of these grids first order). `check_function`
# (labkit.blanks) runs your function and the solution's on each case and compares the
# variables each blank assigns.

# %%
# --8<-- [start:check]
parser, CHECKED, SOLUTION = exercise(__doc__, "check_dpm.py", "lab-13-few-step-sampling", globals().get("__file__"),
                                     "dpm_blanks.py", "dpm_solution.txt")  # fmt: skip

betas = make_betas(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)
alphas_cumprod = np.cumprod(1.0 - betas)  # (1000,) alpha_bar_t


def trailing_sigmas(n):
    """(n + 1,) float64: sigma = sqrt((1 - alpha_bar) / alpha_bar) on the trailing grid,
    then the smallest training sigma."""
    T = len(alphas_cumprod)
    timesteps = np.arange(T, 0, -T / n).round().astype(np.int64) - 1  # (n,) high to low
    ab = alphas_cumprod[np.append(timesteps, 0)]
    return ((1 - ab) / ab) ** 0.5


CASES = []
rng = np.random.default_rng(0)
for n in (1, 2, 4, 8):
    sigmas = trailing_sigmas(n)
    samples, x0s = rng.standard_normal((2, n, 3, 2))  # per step: sample, x0_hat (3, 2)
    for i in range(n):
        m1 = x0s[i - 1] if i else None  # the step before's x0_hat: none on the first step
        order = "second order" if i else "first order"
        CASES.append((f"num_inference_steps={n}, step_index={i}, {order}", (sigmas, i, samples[i], x0s[i], m1)))  # fmt: skip

verdict = check_function(CHECKED, "dpm_solver_update", SOLUTION, CASES, blanks=5)  # fmt: skip
finish(parser, verdict)
# --8<-- [end:check]
