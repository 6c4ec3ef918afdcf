"""Lab 16: does your online-softmax update give the attention tiled_attention gives?

Checks `tiled_attention` in softmax_blanks.py, the file you edit, against the solution
(softmax_solution.txt) on small query, key and value arrays at several block sizes (one
key per block, all keys in one block, a last block that is shorter): each blank is compared
at every key/value block, and the first that gives another value is named, with its line,
the block, both values (for an array, its shape and the first entry that differs) and, for
a typical mistake, a hint. Exit 0: every filled blank the runs reach matches (a run stops
at the first blank still to fill; those are listed); 1: a blank differs; 2: your file does not parse, a line of it raises, or
a blank gives another type than the solution's (one line, naming your line).

Check it:  python3 code/lab-16-attention-kernels-and-offload/check_softmax.py
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

# %% [markdown]
# ## The cases and the check
#
# Each case is a query, key and value drawn from a seeded normal, `(B, heads, N, head_dim)`
# float32 as in the starter, and a `block_size`. `check_function` (labkit.blanks) runs your
# function and the solution's on each case and compares the variables each blank assigns
# each time the loop passes through it, key/value block by block, then the output.
# Floats match to float32 rounding, within 1e-6 of the array's largest entry: a correct line
# that sums in another order passes, a line off by a factor of 1 + 1e-5 does not.

# %%
# --8<-- [start:check]
parser, CHECKED, SOLUTION = exercise(__doc__, "check_softmax.py", "lab-16-attention-kernels-and-offload", globals().get("__file__"),
                                     "softmax_blanks.py", "softmax_solution.txt")  # fmt: skip


def qkv(seed, batch, heads, nq, nk, d, scale=1.0):
    """query (B, H, Nq, d), key and value (B, H, Nk, d), float32; ``scale`` widens the scores."""
    rng = np.random.default_rng(seed)
    q = (scale * rng.standard_normal((batch, heads, nq, d))).astype(np.float32)
    k, v = (rng.standard_normal((batch, heads, nk, d)).astype(np.float32) for _ in range(2))
    return q, k, v


#: (seed, B, heads, Nq, Nk, head_dim, score scale, block sizes): one key per block, all keys
#: in one block, a last block shorter than the others (10 keys in blocks of 4), fewer query
#: rows than keys, and wider scores (the query times 8)
SHAPES = [
    (0, 1, 2, 8, 8, 4, 1.0, (4, 2, 1, 8)),
    (1, 2, 1, 5, 10, 8, 1.0, (4, 3)),
    (2, 1, 2, 6, 12, 16, 8.0, (4,)),
]
CASES = [
    (
        f"query {(b, h, nq, d)}, key/value {(b, h, nk, d)}, block_size={size}"
        + (f", scores x{scale:g}" if scale != 1 else ""),
        (*qkv(seed, b, h, nq, nk, d, scale), size),
    )
    for seed, b, h, nq, nk, d, scale, sizes in SHAPES
    for size in sizes
]
with np.errstate(all="ignore"):  # a wrong line's inf or nan is shown in the report instead
    verdict = check_function(CHECKED, "tiled_attention", SOLUTION, CASES, blanks=6, rounds="key/value block")  # fmt: skip
finish(parser, verdict)
# --8<-- [end:check]
