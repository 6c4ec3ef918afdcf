"""Lab 03, your turn: write the three timestep spacings of `DDIMScheduler.set_timesteps`.

Fill in the blanks of `set_timesteps` below: each `blank(n)` is a line to write, and the
comment above it says what the line must give. Then check your lines against the solution:

Check it:  python3 code/lab-03-scheduler-reading/check_spacing.py

The checker runs this function and the solution's on the same inputs (every spacing; 1,
3, 7, 10, 16, 27, 50, 61 and 1000 steps; steps_offset 0 and 1; 7 steps of a 500-step
training schedule) and names the first blank whose line gives another value, with a hint for the
typical mistakes. Nothing but NumPy is needed. Run the checker, not this file.
"""

import sys

if __name__ == "__main__":  # the checker runs these blanks; this file only defines them
    print("spacing_blanks.py: error: this file holds your blanks; check them with: "
          "python3 code/lab-03-scheduler-reading/check_spacing.py", file=sys.stderr)  # fmt: skip
    sys.exit(2)

import numpy as np  # noqa: F401  (your lines need it)

from labkit.blanks import blank


# %%
# --8<-- [start:blanks]
def set_timesteps(num_inference_steps, timestep_spacing, steps_offset, num_train_timesteps=1000):
    """The int64 timesteps the loop visits, high to low: n = num_inference_steps of them
    (trailing gives one more at a few n, as diffusers does: 62 at 61 steps, the last -1)."""
    n, T = num_inference_steps, num_train_timesteps  # noqa: F841

    if timestep_spacing == "leading":
        # BLANK 1 of 3 · leading: n integer strides of T // n counted up from 0, as int64,
        # high to low, then steps_offset added (SD 1.x ships 1). 10 steps, offset 1: 901, 801, ..., 1.
        timesteps = blank(1)

    elif timestep_spacing == "trailing":
        # BLANK 2 of 3 · trailing: from T down in strides of T / n (a float), rounded to int64,
        # then 1 less: it starts at T - 1. 10 steps: 999, 899, ..., 99.
        timesteps = blank(2)

    else:
        # BLANK 3 of 3 · linspace: n evenly spaced points from 0 to T - 1 (both ends from 2 steps on),
        # rounded to int64, high to low. 10 steps: 999, 888, ..., 0.
        timesteps = blank(3)

    return timesteps


# --8<-- [end:blanks]
