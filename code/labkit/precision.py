"""Low-precision number formats, emulated in float64: the one emulation the labs share.

Lab 14 teaches it; labs 08 and 10 (and any later lab that stores a tensor in a narrower
format) import it from here, so every number the site quotes for fp16, bf16 or fp8 comes
from the same rounding rule.

A float format is a sign bit, ``e`` exponent bits and ``m`` mantissa bits. With bias
``2**(e-1) - 1``, normal numbers are ``1.f * 2**E`` for ``E`` from ``1 - bias`` up; the step
between neighbours near 1 (the ulp at 1) is ``2**-m``, and below the smallest normal the
step stays ``2**(1 - bias - m)`` (subnormals). Rounding is to the nearest representable
value, ties to the even one: what ``x.to(torch.bfloat16)`` does to a float32 ``x`` on the CPU.
The verify tests compare :func:`round_to` with torch's casts of float32 values bit for bit
(fp16, bf16, both fp8s).

NumPy is the only dependency.
"""

from __future__ import annotations

import numpy as np

# --8<-- [start:formats]
#: name -> (exponent bits, mantissa bits, what a too-large value becomes)
FORMATS = {
    "fp32": (8, 23, "inf"),
    "fp16": (5, 10, "inf"),
    "bf16": (8, 7, "inf"),
    # torch.float8_e4m3fn: "fn" = finite, no inf; the all-ones exponent still holds numbers
    # (only S.1111.111 is NaN). Past the top, torch 2.13's CPU cast saturates at +-448
    # (checked by the verify tests; other versions and devices may give NaN instead).
    "fp8_e4m3": (4, 3, "saturate"),
    "fp8_e5m2": (5, 2, "inf"),
}

#: the names NumPy and torch use for the same formats
ALIASES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _format(name: str) -> tuple[int, int, str]:
    name = ALIASES.get(name, name)
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r} (choose from {', '.join(FORMATS)})")
    return FORMATS[name]


def format_limits(name: str) -> tuple[float, float, float, float, int]:
    """(max, smallest normal, smallest subnormal, ulp at 1, bytes) of a format."""
    e, m, overflow = _format(name)
    bias = 2 ** (e - 1) - 1
    if overflow == "inf":  # IEEE: the all-ones exponent is inf/NaN, so E tops out at bias
        top = (2 - 2.0**-m) * 2.0**bias
    else:  # e4m3fn: E reaches bias + 1, but mantissa all-ones there is NaN: 1.110b * 2**8
        top = (2 - 2 * 2.0**-m) * 2.0 ** (bias + 1)
    return top, 2.0 ** (1 - bias), 2.0 ** (1 - bias - m), 2.0**-m, (1 + e + m) // 8


def round_to(x, name: str) -> np.ndarray:
    """Round ``x`` to the nearest value of format ``name`` (ties to even), as float64.

    ``name`` is one of :data:`FORMATS` or its NumPy/torch alias (``"bfloat16"``...).
    """
    e, m, overflow = _format(name)
    bias = 2 ** (e - 1) - 1
    a = np.abs(np.asarray(x, dtype=np.float64))
    exponent = np.frexp(a)[1] - 1  # floor(log2 a), exact: a = frac * 2**(exp), frac in [0.5, 1)
    exponent = np.maximum(exponent, 1 - bias)  # subnormals share the smallest normal's step
    step = np.ldexp(1.0, exponent - m)  # the spacing of representable values around a
    r = np.round(a / step) * step  # np.round is round-half-to-even; a / step is exact
    top = format_limits(name)[0]
    r = np.where(r > top, np.inf if overflow == "inf" else top, r)  # overflow: inf or saturate
    return np.copysign(r, np.asarray(x, dtype=np.float64))


# --8<-- [end:formats]


# --8<-- [start:scaled]
def quantize_scaled(x, fmt: str, axis=None) -> np.ndarray:
    """Store ``x`` as ``scale * q`` and return that value (float64): fake quantization.

    ``fmt`` is ``"int8"`` / ``"int4"`` (symmetric integers) or a float format of
    :data:`FORMATS` (e.g. ``"fp8_e4m3"``). One scale per slice: ``axis=None`` one for the
    whole tensor (per-tensor), ``axis=-1`` one per row (per-token for activations
    ``(tokens, in)``, per-output-channel for weights ``(out, in)``). The scale maps the
    slice's largest magnitude to the format's top: for ``b``-bit integers that is
    ``amax / (2**b - 1) * 2`` (``amax / 127.5`` for int8, so ``+amax`` rounds to 128 and is
    clipped to 127) at least float32's eps, with ``q = round(x / scale)`` clipped to
    ``[-2**(b-1), 2**(b-1) - 1]``: the rule of torchao's symmetric int8 (``choose_qparams_affine``;
    tests/verify/test_page_lab_14.py compares them value for value on float32 weights).
    """
    x = np.asarray(x, dtype=np.float64)
    amax = np.max(np.abs(x), axis=axis, keepdims=axis is not None)
    if fmt in ("int8", "int4"):
        bits = int(fmt[3:])
        scale = np.maximum(amax / ((2**bits - 1) / 2), np.finfo(np.float32).eps)  # amax / 127.5
        q = np.clip(np.round(x / scale), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        return q * scale
    scale = np.maximum(amax, 1e-30) / format_limits(fmt)[0]  # amax -> the top (448 for e4m3)
    return round_to(x / scale, fmt) * scale


# --8<-- [end:scaled]
