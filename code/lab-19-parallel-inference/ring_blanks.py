"""Lab 19, your turn: write ring attention's log-sum-exp merge in `ring_attention`, the
lines that give each K/V block's partial softmax its log-sum-exp and fold it into the
running output.

Fill in the blanks below: each `blank(n)` is a line to write, and the comment above it
says what the line must give. Then check your lines against the solution:

Check it:  python3 code/lab-19-parallel-inference/check_ring.py

The checker runs this function and the solution's on the same inputs (a few small query,
key and value arrays cut into K/V blocks as a ring would bring them) and names the first
blank whose line gives another value, with the ring step it was folding in and, for a
typical mistake, a hint. Nothing but NumPy is needed.
"""

import sys

if __name__ == "__main__":  # the checker runs these blanks; this file only defines them
    print("ring_blanks.py: error: this file holds your blanks; check them with: "
          "python3 code/lab-19-parallel-inference/check_ring.py", file=sys.stderr)  # fmt: skip
    sys.exit(2)

import numpy as np

from labkit.blanks import blank


# %%
# --8<-- [start:blanks]
def ring_attention(query, key_blocks, value_blocks):
    """One rank's rows of full attention: query (Tq, h, d) and the K/V blocks, each (Tk, h, d),
    in the order the ring brings them -> out (Tq, h, d), lse (Tq, h), as in attention()."""
    out = np.zeros(query.shape)  # the merge of no block: nothing yet
    lse = np.full(query.shape[:2], -np.inf)  # (Tq, h): the log of an empty sum
    for k, v in zip(key_blocks, value_blocks, strict=True):
        scores = np.einsum("qhd,khd->hqk", query, k) / np.sqrt(query.shape[-1])  # (h, Tq, Tk)

        # BLANK 1 of 6 · peak: each query row's max over this block's scores, shape
        # (h, Tq, 1), subtracted before exp so that exp never overflows.
        peak = blank(1)

        weights = np.exp(scores - peak)
        total = weights.sum(axis=-1, keepdims=True)
        block_out = np.einsum("hqk,khd->qhd", weights / total, v)  # noqa: F841  this block's output: its softmax applied to v

        # BLANK 2 of 6 · block_lse: this block's log-sum-exp, log sum_k exp(score), one per
        # query token and head: shape (Tq, h), like lse.
        block_lse = blank(2)  # noqa: F841

        # BLANK 3 of 6 · lse_new: the log-sum-exp over every key so far, this block's
        # included (the log of the sum of the two sums).
        lse_new = blank(3)

        # BLANK 4 of 6 · w_old: the share of the softmax mass the keys merged so far keep,
        # shape (Tq, h, 1) to scale out's rows (0 at the first step, where lse is -inf).
        w_old = blank(4)  # noqa: F841

        # BLANK 5 of 6 · w_new: the share this block's keys take, shape (Tq, h, 1).
        w_new = blank(5)  # noqa: F841

        # BLANK 6 of 6 · out: the running output, the two partial softmaxes merged.
        out = blank(6)

        lse = lse_new

    return out, lse


# --8<-- [end:blanks]
