"""Measured memory: the peak bytes NumPy allocates inside one call (Labs 10, 14, 16).

NumPy reports its array buffers to ``tracemalloc``, so the traced peak during a call is
the largest amount of array memory alive at once inside it (inputs, allocated before,
are not counted). ``tracemalloc`` traces every thread, though: inside a Jupyter kernel
(a reader's notebook) the kernel's own threads can add from a hundred
bytes to a few KB to one call, mostly while they send output printed just before it.
So the output streams are flushed first, and ``repeats=2`` keeps the least of two
calls, for a peak that sits close to the rounding of the printed value. That makes a
flip unlikely, not impossible (a thread may also free memory during the call): a chart
of peaks plots the printed, rounded values, so bytes of noise cannot move it.
"""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import Callable
from typing import Any


def peak_bytes(fn: Callable[..., Any], *args: Any, repeats: int = 1) -> tuple[Any, int]:
    """``(fn(*args), peak bytes allocated inside the call)``, the least over ``repeats``
    calls (``fn`` must be deterministic: the result of the last call is returned)."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    peaks = []
    for _ in range(repeats):
        sys.stdout.flush()  # a kernel sends printed output from another thread
        sys.stderr.flush()
        tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = fn(*args)
        peaks.append(tracemalloc.get_traced_memory()[1] - base)
        tracemalloc.stop()
    return out, min(peaks)
