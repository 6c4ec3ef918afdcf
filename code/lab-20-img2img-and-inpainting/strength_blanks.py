"""Lab 20, your turn: write `get_timesteps`, the three lines that turn `strength` into the
timesteps an img2img call runs.

Fill in the blanks below: each `blank(n)` is a line to write, and the comment above it
says what the line must give. Then check your lines against the solution:

Check it:  python3 code/lab-20-img2img-and-inpainting/check_strength.py

The checker runs this function and the solution's on the same inputs (several strengths
and step counts, a first-order scheduler and a second-order one) and names the first blank
whose line gives another value, with a hint. Nothing but NumPy is needed.
"""

import sys

if __name__ == "__main__":  # the checker runs these blanks; this file only defines them
    print("strength_blanks.py: error: this file holds your blanks; check them with: "
          "python3 code/lab-20-img2img-and-inpainting/check_strength.py", file=sys.stderr)  # fmt: skip
    sys.exit(2)

from labkit.blanks import blank


# %%
# --8<-- [start:blanks]
def get_timesteps(scheduler, num_inference_steps, strength):
    """(the entries of scheduler.timesteps the call runs, the number of steps they make)."""
    # BLANK 1 of 3 · init_timestep: how many of the n steps run: n times strength, cut to a
    # whole number as Python's int() does, and never more than n.
    init_timestep = blank(1)  # noqa: F841

    # BLANK 2 of 3 · t_start: how many steps of the grid are skipped before the first one
    # that runs (never below 0).
    t_start = blank(2)

    # BLANK 3 of 3 · the entries of scheduler.timesteps that run. The grid runs from high
    # noise to low; HeunDiscreteScheduler (scheduler.order 2) holds its first timestep once
    # and each later one twice (2n - 1 entries).
    timesteps = blank(3)

    return timesteps, num_inference_steps - t_start


# --8<-- [end:blanks]
