"""Lab 17: does your loop hand each part what the solution's hands it, blank by blank?

Checks `pipeline` in rebuild_pipeline.py, the file you edit, against the solution
(pipeline_solution.txt) on a few small batches with Euler and DDIM: each blank is compared
at every step as soon as your run leaves its lines, so a wrong blank 4 is named before
blank 5 is written. The first blank that gives another value is named, with its line, the
step, both values (for an array, the first entry that differs) and, for a typical mistake
(a sign, an order, a ratio, a missing call), a hint. Once pipeline() matches, level 2,
`pipeline_any_scale`, is checked the same way (DDPM at guidance_scale 7.5 and 0, Euler at 1).
Exit 0: every filled blank the runs reach matches (a run stops at the first blank still to
fill; those are listed); 1: a blank differs; 2: your file does not parse, a line of it
raises or yields, or a blank gives another type, shape or dtype than the solution's (one
line, naming your line).

Check it:  python3 code/lab-17-rebuild-the-pipeline/check_pipeline.py
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

from labkit.blanks import (
    blank_calls,
    check_function,
    exercise,
    finish,
    load_function,
    warnings_of_runs,
    with_warnings,
)

# %% [markdown]
# ## The cases and the check
#
# The parts are rebuild_pipeline.py's own (`make_parts`, `make_scheduler`, read from it
# without running its script part), with a fresh scheduler for each run. Each case is a
# batch of noise and class labels: Euler at 4 steps, DDIM at 3, Euler at 1 step (where its
# last step goes to sigma 0), with B of 1 to 3 and guidance scales above 1.
# `check_function` (labkit.blanks) runs your function and the solution's on each case and
# compares the variables each blank assigns each time the loop passes through it, step by
# step, then the images; `contract=True` makes an array of another shape or dtype than the
# solution's (B rows where 2B go) one line, exit 2.

# %%
# --8<-- [start:check]
parser, CHECKED, SOLUTION = exercise(__doc__, "check_pipeline.py", "lab-17-rebuild-the-pipeline", globals().get("__file__"),
                                     "rebuild_pipeline.py", "pipeline_solution.txt")  # fmt: skip
STARTER = SOLUTION.with_name("rebuild_pipeline.py")  # its parts, built as its run builds them
try:
    make_parts, make_scheduler = (load_function(STARTER, f) for f in ("make_parts", "make_scheduler"))  # fmt: skip
except SyntaxError:  # your file does not parse: check_function says where, in one line
    finish(parser, check_function(CHECKED, "pipeline", SOLUTION, [], blanks=6))
_, vae, _, unet = make_parts()


def labels(b, label):
    """(b,) class labels: the prompt's class, or UNCOND (-1) for the empty prompt."""
    return np.full(b, label)


#: (scheduler, steps, B, guidance_scale, seed) for level 1
LEVEL_1 = [("euler", 4, 2, 7.5, 0), ("ddim", 3, 3, 5.0, 1), ("euler", 1, 1, 3.0, 2)]
CASES = [
    (
        f"{kind}, {n} step{'s' * (n > 1)}, B = {b}, guidance_scale {s:g}",
        (unet, make_scheduler(kind), vae, labels(b, seed % 4), labels(b, -1),
         np.random.default_rng(seed).standard_normal((b, 4, 4, 4)), n, s),
    )
    for kind, n, b, s, seed in LEVEL_1
]  # fmt: skip
#: level 2: DDPM adds noise in step; guidance_scale 1 and 0 run the prompt's rows alone;
#: Euler, whose init_noise_sigma is not 1 nor scale_model_input the identity, checks those two
LEVEL_2 = [("ddpm", 3, 2, 7.5, 3), ("euler", 3, 2, 1.0, 4), ("ddpm", 2, 1, 0.0, 5)]
CASES_2 = [
    (
        f"level 2: {kind}, {n} steps, B = {b}, guidance_scale {s:g}",
        (unet, make_scheduler(kind), vae, labels(b, seed % 4), labels(b, -1), (b, 4, 4, 4),
         np.random.default_rng(seed), n, s),
    )
    for kind, n, b, s, seed in LEVEL_2
]  # fmt: skip


def check():
    """Level 1's verdict, or once it matches, level 2's after level 1's line."""
    verdict = check_function(CHECKED, "pipeline", SOLUTION, CASES, blanks=6, rounds="step", contract=True)  # fmt: skip
    level_2 = load_function(CHECKED, "pipeline_any_scale") if verdict.report.startswith("all ") else None  # fmt: skip
    if level_2 is not None and len(blank_calls(level_2)) == 3:  # level 2 not started
        verdict.report += "\nlevel 2 (optional): fill in pipeline_any_scale's blanks 7 to 9, then check again"  # fmt: skip
    elif level_2 is not None:
        first = verdict.report
        verdict = check_function(CHECKED, "pipeline_any_scale", SOLUTION, CASES_2, blanks=3, rounds="step", contract=True)  # fmt: skip
        if verdict.code != 2:  # exit 2 is one line: level 1's line goes with the others
            verdict.report = f"{first}\n{verdict.report.replace('all 3 blanks', 'level 2: all 3 blanks')}"  # fmt: skip
    return verdict


def warnings_of_yours(level_2):
    """The warnings a part gave in your own runs of the level that differs, each once (not
    those of the planted mistakes the check also runs for its hints)."""
    yours = load_function(CHECKED, "pipeline_any_scale" if level_2 else "pipeline")
    return warnings_of_runs(yours, [case for _, case in (CASES_2 if level_2 else CASES)])


with np.errstate(all="ignore"):  # a wrong line's inf or nan is shown in the report instead
    verdict, _ = with_warnings(check)  # the planted mistakes' warnings are not yours
    if verdict.code == 1:  # a part's warnings in your runs (labkit's Euler warns when step
        # comes before any scale_model_input), said after the difference, one line each
        warned = warnings_of_yours("(level 2: " in verdict.report)
        verdict.report += "".join(f"\na part warned during your runs: {text}" for text in warned)
finish(parser, verdict)
# --8<-- [end:check]
