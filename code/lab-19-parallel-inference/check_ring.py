"""Lab 19: does your log-sum-exp merge give the attention the starter's ring gives?

Checks `ring_attention` in ring_blanks.py, the file you edit, against the solution
(ring_solution.txt) on small query, key and value arrays cut into K/V blocks as a ring
brings them to one rank (one block, two, four, blocks of unequal length, wide scores, one
head): each
blank is compared at every ring step, and the first that gives another value is named, with
its line, the step, both values (for an array, its shape and the first entry that differs)
and, for a typical mistake, a hint. Exit 0: every filled blank the runs reach matches (a run
stops at the first blank still to fill; those are listed); 1: a blank differs; 2: your file
does not parse, a line of it raises, or a blank gives another type than the solution's (one
line, naming your line).

Check it:  python3 code/lab-19-parallel-inference/check_ring.py
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
# Each case is one rank's query shard and the K/V blocks in the order the ring brings them,
# `(tokens, heads, head_dim)` float64 as in the starter, drawn from a seeded normal.
# `check_function` (labkit.blanks) runs your function and the solution's on each case and
# compares the variables each blank assigns at each ring step, then the output. Floats
# match to within 1e-6 of the array's largest entry: a correct line that multiplies or sums
# in another order passes, a line off by a factor of 1 + 1e-5 does not.

# %%
# --8<-- [start:check]
parser, CHECKED, SOLUTION = exercise(__doc__, "check_ring.py", "lab-19-parallel-inference", globals().get("__file__"),
                                     "ring_blanks.py", "ring_solution.txt")  # fmt: skip


def shards(seed, nq, heads, d, blocks, scale=1.0):
    """query (nq, heads, d) and K/V blocks of ``blocks`` tokens each, float64; ``scale``
    widens the scores."""
    rng = np.random.default_rng(seed)
    query = scale * rng.standard_normal((nq, heads, d))
    key, value = (rng.standard_normal((sum(blocks), heads, d)) for _ in range(2))
    cuts = np.cumsum(blocks)[:-1]
    return query, np.split(key, cuts), np.split(value, cuts)


#: (seed, query tokens, heads, head_dim, K/V block lengths, score scale): one block (no
#: merge), two, four equal ones as on 4 ranks, unequal ones, as many query tokens as heads
#: (a transposed lse has the right shape there), wide scores (the query times 30), and one
#: head (a squeeze() that drops the head axis with the last one shows there)
SHAPES = [
    (0, 6, 2, 4, (6,)),
    (1, 6, 2, 4, (6, 6)),
    (2, 4, 3, 8, (4, 4, 4, 4)),
    (3, 5, 2, 4, (3, 1, 6)),
    (4, 3, 3, 4, (3, 3, 3)),
    (5, 4, 2, 16, (4, 4, 4), 30.0),
    (6, 3, 1, 4, (3, 3)),
]
CASES = [
    (
        f"query {(nq, h, d)}, K/V blocks of {', '.join(map(str, blocks))} tokens"
        + (f", scores x{scale[0]:g}" if scale else ""),
        shards(seed, nq, h, d, blocks, *scale),
    )
    for seed, nq, h, d, blocks, *scale in SHAPES
]
with np.errstate(all="ignore"):  # a wrong line's inf or nan is shown in the report instead
    verdict = check_function(CHECKED, "ring_attention", SOLUTION, CASES, blanks=6, rounds="ring step")  # fmt: skip
finish(parser, verdict)
# --8<-- [end:check]
