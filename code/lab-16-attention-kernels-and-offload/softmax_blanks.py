"""Lab 16, your turn: write the online-softmax update of `tiled_attention`, the lines that
fold one key/value block into the running max, sum and accumulator, and the output.

Fill in the blanks below: each `blank(n)` is a line to write, and the comment above it
says what the line must give. Then check your lines against the solution:

Check it:  python3 code/lab-16-attention-kernels-and-offload/check_softmax.py

The checker runs this function and the solution's on the same inputs (a few small query,
key and value arrays, several block sizes) and names the first blank whose line gives
another value, with the key/value block it was folding in and, for a typical mistake, a
hint. Nothing but NumPy is needed.
"""

import sys

if __name__ == "__main__":  # the checker runs these blanks; this file only defines them
    print("softmax_blanks.py: error: this file holds your blanks; check them with: "
          "python3 code/lab-16-attention-kernels-and-offload/check_softmax.py", file=sys.stderr)  # fmt: skip
    sys.exit(2)

import numpy as np

from labkit.blanks import blank


# %%
# --8<-- [start:blanks]
def tiled_attention(query, key, value, block_size):
    """(B, H, Nq, d), (B, H, Nk, d) x2 -> out (B, H, Nq, d), lse (B, H, Nq), float32, one
    (B, H, Nq, block_size) block of scores at a time."""
    shape = (*query.shape[:-1], 1)  # (B, H, Nq, 1): one entry per query row
    m = np.full(shape, -np.inf, dtype=np.float32)  # running max of the scores seen
    l = np.zeros(shape, dtype=np.float32)  # noqa: E741  running sum of exp(score - m)
    acc = np.zeros(query.shape, dtype=np.float32)  # running exp(score - m) @ v, unnormalised
    for start in range(0, key.shape[2], block_size):
        k, v = key[:, :, start : start + block_size], value[:, :, start : start + block_size]  # noqa: F841
        s = query @ k.swapaxes(-1, -2) / np.float32(np.sqrt(query.shape[-1]))  # noqa: F841  (B, H, Nq, block)

        # BLANK 1 of 6 · m_new: each query row's max over the scores seen so far, this
        # block's included, shape (B, H, Nq, 1).
        m_new = blank(1)

        # BLANK 2 of 6 · correction: the factor that rescales what was summed under the old
        # max m to the new max m_new (0 at the first block, where m is -inf).
        correction = blank(2)  # noqa: F841

        # BLANK 3 of 6 · p: this block's exp(score - max), under the new max.
        p = blank(3)  # noqa: F841

        # BLANK 4 of 6 · l: the running sum, rescaled, plus this block's row sums of p.
        l = blank(4)  # noqa: E741

        # BLANK 5 of 6 · acc: the running accumulator, rescaled, plus this block's p @ v.
        # It stays unnormalised: no division by l inside the loop.
        acc = blank(5)  # noqa: F841

        m = m_new

    # BLANK 6 of 6 · out: the softmax-weighted sum of the values, after the last block.
    out = blank(6)

    return out, (m + np.log(l))[..., 0]


# --8<-- [end:blanks]
