"""Lab 13, your turn: write the DPM-Solver++ 2M update, the five lines that take x from one
timestep to the next given the data predictions x0_hat of this step and of the step before.

Fill in the blanks below: each `blank(n)` is a line to write, and the comment above it
says what the line must give. Then check your lines against the solution:

Check it:  python3 code/lab-13-few-step-sampling/check_dpm.py

The checker runs this function and the solution's on the same inputs (first- and
second-order steps of 1, 2, 4 and 8-step grids, tiny arrays) and names the first blank
whose line gives another value, with a hint for a typical mistake. Nothing but NumPy is needed.
"""

import sys

if __name__ == "__main__":  # the checker runs these blanks; this file only defines them
    print("dpm_blanks.py: error: this file holds your blanks; check them with: "
          "python3 code/lab-13-few-step-sampling/check_dpm.py", file=sys.stderr)  # fmt: skip
    sys.exit(2)

import numpy as np

from labkit.blanks import blank


# %%
# --8<-- [start:blanks]
def dpm_solver_update(sigmas, step_index, sample, m0, m1):
    """x at the next timestep (the step's prev_sample), from the sample x at this one and
    the data predictions x0_hat of this step (m0) and of the step before (m1; None on a
    first-order step)."""
    # sigma -> alpha_t, sigma_t on the variance-preserving scale, lambda = log(alpha / sigma)
    s_t, s_s0 = sigmas[step_index + 1], sigmas[step_index]  # the next sigma, this one
    alpha_t, alpha_s0 = 1 / (s_t**2 + 1) ** 0.5, 1 / (s_s0**2 + 1) ** 0.5
    sigma_t, sigma_s0 = s_t * alpha_t, s_s0 * alpha_s0
    lambda_t, lambda_s0 = np.log(alpha_t) - np.log(sigma_t), np.log(alpha_s0) - np.log(sigma_s0)  # noqa: F841  # fmt: skip

    # BLANK 1 of 5 · h: the length of this step in lambda, from this timestep (s0) to the
    # next (t).
    h = blank(1)  # noqa: F841

    if m1 is None:  # first order (no x0_hat of a step before): DDIM, written in lambda
        # BLANK 2 of 5 · x_t from sample and this step's x0_hat m0: the sample scaled by the
        # ratio of the two variance-preserving sigmas (sigma_t, sigma_s0; not s_t, s_s0), and
        # m0 weighted by alpha_t and (e^-h - 1).
        x_t = blank(2)
        return x_t

    # second order: the step before's lambda, and its length h_0
    alpha_s1 = 1 / (sigmas[step_index - 1] ** 2 + 1) ** 0.5
    lambda_s1 = np.log(alpha_s1) - np.log(sigmas[step_index - 1] * alpha_s1)
    h_0 = lambda_s0 - lambda_s1  # noqa: F841

    # BLANK 3 of 5 · r0: the ratio of the step before's length h_0 to this one's, h.
    r0 = blank(3)  # noqa: F841

    # BLANK 4 of 5 · D0, D1: the data prediction of this step, and the change of x0_hat since
    # the step before, divided by r0.
    D0, D1 = blank(4)  # noqa: RUF059

    # BLANK 5 of 5 · x_t, the midpoint rule: as the first-order step with D0 for x0_hat, plus
    # the correction from D1.
    x_t = blank(5)
    return x_t


# --8<-- [end:blanks]
