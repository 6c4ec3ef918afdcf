"""Lab 14: what do fewer bits per number cost, and where do fp16 VAEs turn images black?

Every tensor of a pipeline is stored in some number format: fp32, fp16, bf16, fp8, or a
block-quantized GGUF type such as Q8_0 or Q4_0. Fewer bits per number means fewer bytes to
hold and to move, and a coarser grid of representable values: rounding error everywhere,
and, for fp16, a ceiling of 65504: an activation rounding past it becomes inf, then NaN. The
trap: the error of a format is not one number; range (overflow) and step size (rounding)
fail differently, and block quantization spends bytes on scales to keep both in check.

Run it:  python3 code/lab-14-precision-and-quantization/precision_quantization.py --block-size 32
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import (
    ExactDenoiser,
    alphas_cumprod,
    canonical_betas,
    default_mixture,
    figures,
    model_sizes,
)
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    in_notebook,
    int_at_least,
    parse_args,
)
from labkit.memory import peak_bytes  # tracemalloc peak of one call
from labkit.metrics import sample_quality
from labkit.precision import FORMATS, format_limits, round_to  # the one emulation all labs share
from labkit.schedulers import DDIMScheduler

#: GGUF block types: name -> bits of each stored q (the scale d adds 16 bits per block)
QUANT_TYPES = {"Q8_0": 8, "Q4_0": 4}

# %% [markdown]
# ## 1. Setup / contract
#
# A float format is a sign bit, `e` exponent bits and `m` mantissa bits. Three toy
# workloads run in float64 and round every stored tensor to the format under test: a
# decoder-like chain of layers whose activations grow (the fp16 VAE problem), one linear
# layer `(out, in)` whose weights are block-quantized, and a DDIM loop on the 2-D Gaussian
# mixture whose `noise_pred` passes through a quantized linear head. Real sizes come
# from `labkit.model_sizes` (Flux.1-dev's parameter counts).

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="precision_quantization.py", description=__doc__.splitlines()[0])
parser.add_argument("--formats", default="fp16,bf16,fp8_e4m3,fp8_e5m2", help="comma-separated")
parser.add_argument("--layers", type=int_at_least(1), default=8, help="toy decoder depth")
parser.add_argument("--gain", type=float, default=4.0, help="activation growth per layer, >= 1")
parser.add_argument("--block-size", type=int_at_least(2), default=32, help="values per block of the one-layer test (GGUF: 32; the loop's head keeps 32)")  # fmt: skip
parser.add_argument("--in-features", type=int_at_least(2), default=1024, help="row length of the toy weight")  # fmt: skip
parser.add_argument("--steps", type=int_at_least(1), default=20, help="num_inference_steps")
parser.add_argument("--num-samples", type=int_at_least(1), default=2000)
parser.add_argument("--timing", action="store_true", help="also time dequantize vs matmul (varies by machine)")  # fmt: skip
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)

formats = [f.strip() for f in args.formats.split(",") if f.strip()]
unknown = [f for f in formats if f not in FORMATS]
if unknown or not formats:
    parser.error(f"--formats: unknown format {unknown or ''} (choose from {', '.join(FORMATS)})")
if not 1.0 <= args.gain <= 64.0:
    parser.error(f"--gain must be in [1, 64], got {args.gain:g}")
if args.block_size % 2 or args.in_features % args.block_size:
    parser.error(f"--block-size {args.block_size} must be even and divide the row length --in-features {args.in_features}")  # fmt: skip
if args.layers > 32 or args.in_features > 8192 or args.steps > 1000 or args.num_samples > 20000:
    parser.error("--layers <= 32, --in-features <= 8192, --steps <= 1000, --num-samples <= 20000")
rng = np.random.default_rng(args.seed)
# --8<-- [end:setup]


def table(title, header, rows):
    """Print ``rows`` under ``header``, each column right-aligned to its widest cell."""
    cells = [[str(x) for x in row] for row in [header, *rows]]
    widths = [max(len(row[k]) for row in cells) for k in range(len(header))]
    print(f"\n{title}")
    for row in cells:
        aligned = [cell.rjust(w) for cell, w in zip(row, widths, strict=True)]
        print("  ".join([row[0].ljust(widths[0]), *aligned[1:]]))


def rel_rms(approx, exact):
    """RMS(approx - exact) / RMS(exact): the error as a share of the signal."""
    return float(np.sqrt(np.mean((approx - exact) ** 2) / np.mean(exact**2)))


# %% [markdown]
# ## 2. Number formats: range, step, bytes
#
# With bias `2**(e-1) - 1`, normal numbers are `1.f * 2**E` for `E` from `1 - bias` up;
# the step between neighbours near 1 (the ulp at 1, `eps`) is `2**-m`, and below the
# smallest normal the step stays `2**(1 - bias - m)` (subnormals). Rounding is to the
# nearest representable value, ties to the even one: what torch's CPU cast of a float32
# `x` does (`x.to(torch.bfloat16)`; the verify tests compare them bit for bit).
# `FORMATS`, `format_limits` and `round_to` live in `labkit/precision.py`, the one
# emulation every lab that stores a tensor in a narrower format imports; read it there.

# %%
# --8<-- [start:formats]
probe = np.random.default_rng(args.seed + 7).standard_normal(100_000) * 100.0  # (100000,)
fp16_agrees = bool(np.array_equal(round_to(probe, "fp16"), probe.astype(np.float16).astype(np.float64)))  # fmt: skip
fp32_agrees = bool(np.array_equal(round_to(probe, "fp32"), probe.astype(np.float32).astype(np.float64)))  # fmt: skip
# --8<-- [end:formats]

rows = []
for name in FORMATS:
    top, normal, sub, ulp, nbytes = format_limits(name)
    e, m, _ = FORMATS[name]
    x = np.random.default_rng(args.seed + 8).standard_normal(10_000)  # N(0, 1) values
    rows.append([name, f"1+{e}+{m}", nbytes, f"{top:.6g}", f"{normal:.3g}", f"{sub:.3g}", f"{ulp:.3g}", f"{rel_rms(round_to(x, name), x):.1e}"])  # fmt: skip
table("Number formats (sign + exponent + mantissa bits), emulated in NumPy", ["format", "bits", "bytes", "max", "min normal", "min subnormal", "ulp at 1", "rel. RMS error, N(0,1)"], rows)  # fmt: skip
print(f"emulated fp16 == np.float16 on 100000 values: {fp16_agrees}; emulated fp32 == np.float32: {fp32_agrees}")  # fmt: skip
over = np.array([65504.0, 65519.0, 65520.0, 448.0, 464.0, 1e6])
print("65504, 65519, 65520 -> fp16:", ", ".join(f"{v:g}" for v in round_to(over[:3], "fp16")))
print("448, 464, 1e6 -> fp8_e4m3 (saturating):", ", ".join(f"{v:g}" for v in round_to(over[3:], "fp8_e4m3")))  # fmt: skip

# %% [markdown]
# ## 3. Why an fp16 VAE decode turns black
#
# A decoder-like chain: `latents` `(4, 256)` (4 channels, 16 x 16 positions), a 1 x 1
# conv to 32 channels, then `--layers` ReLU layers whose random weights grow the
# activations by about `--gain` each, then a group norm and a 1 x 1 conv to 3 channels,
# `image` `(3, 256)` in [-1, 1]. The norm divides the scale out, so the image is fine in
# exact arithmetic however large the activations get on the way. Every stored activation
# is rounded to the format; the matmuls run in float64 (fp32 accumulation on a GPU).


# %%
# --8<-- [start:decoder]
channels = 32
latents = rng.standard_normal((4, 256))  # (C=4, positions): a 16 x 16 latent
conv_in = rng.standard_normal((channels, 4)) / 2.0  # (32, 4)
# He init (std sqrt(2 / fan_in)) keeps a ReLU layer's RMS; gain makes each layer grow it
mid = [rng.standard_normal((channels, channels)) * np.sqrt(2.0 / channels) * args.gain for _ in range(args.layers)]  # fmt: skip
conv_out = rng.standard_normal((3, channels)) / np.sqrt(channels)  # (3, 32)


def decode(latents, fmt, weights):
    """latents (4, P) -> image (3, P); every activation stored in ``fmt``. Returns (image, max|h| per layer)."""
    store = (lambda x: x) if fmt is None else (lambda x: round_to(x, fmt))
    h, peaks = store(conv_in @ latents), []  # (32, P)
    for w in weights:
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as on a GPU
            h = store(np.maximum(w @ h, 0.0))  # (32, P): conv + ReLU, stored
        peaks.append(float(np.abs(h).max()))
    with np.errstate(invalid="ignore"):
        h = store((h - h.mean()) / np.sqrt(h.var() + 1e-6))  # GroupNorm(1, 32): scale divided out
        image = np.clip(store(conv_out @ h), -1.0, 1.0)  # (3, P); clip keeps NaN
    return image, peaks


# the fp16-fix idea: shrink each layer's weights by its gain so activations stay O(1);
# ReLU is positively homogeneous and the norm removes scale, so the image is unchanged
fixed = [w / args.gain for w in mid]
reference, ref_peaks = decode(latents, None, mid)  # float64: the truth
decodes = {"fp32 (force_upcast)": decode(latents, "fp32", mid)}
decodes.update({f"{f}": decode(latents, f, mid) for f in ("fp16", "bf16")})
decodes["fp16, fixed weights"] = decode(latents, "fp16", fixed)
# --8<-- [end:decoder]

rows = []
for name, (image, peaks) in decodes.items():
    finite = [p for p in peaks if np.isfinite(p)]
    first_inf = next((k + 1 for k, p in enumerate(peaks) if not np.isfinite(p)), None)
    nan_share = float(np.isnan(image).mean())
    err = np.nanmax(np.abs(image - reference)) if nan_share < 1 else float("nan")
    rows.append([name, f"{max(finite):.3g}", "-" if first_inf is None else f"layer {first_inf}", f"{nan_share:.0%}", f"{err:.1e}"])  # fmt: skip
table(f"Toy decode, {args.layers} layers of gain {args.gain:g} (fp16 max 65504)", ["activations stored in", "largest finite |h|", "first inf", "NaN pixels", "max abs err vs float64"], rows)  # fmt: skip
print("NaN pixels reach uint8 through clamp (NaN stays NaN) and the cast; on x86 they come out 0: black.")  # fmt: skip

# %% [markdown]
# ## 4. GGUF block quantization: Q8_0 and Q4_0
#
# A weight `(out, in)` is cut along each row into blocks of 32 values. Each block stores
# one fp16 scale `d` and 32 small integers `q`; the weight is `d * q`.
# **Q8_0**: `d = max|x| / 127`, `q = round(x * (1/d))` as int8: 2 + 32 = 34 bytes per block.
# **Q4_0**: `d = x_max / -8` with `x_max` the value of largest magnitude (sign kept),
# `q = trunc(x * (1/d) + 8.5)` clipped to 0..15, stored two per byte (the block's first 16
# values in the low nibbles, the last 16 in the high ones) and decoded as `q - 8`:
# 2 + 16 = 18 bytes. The arithmetic is float32, as in ggml's reference code.


# %%
# --8<-- [start:quant]
def roundf(x):
    """C's roundf: halves away from zero (np.round would send 2.5 to 2)."""
    t = np.trunc(x)
    return t + np.trunc(2 * (x - t))


def quantize(weight, qtype, block_size=32):
    """(out, in) float32 -> (out, in // block_size * bytes_per_block) uint8, GGUF's layout."""
    blocks = weight.astype(np.float32).reshape(-1, block_size)  # (n_blocks, 32) along rows
    if qtype == "Q8_0":
        d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)  # (n_blocks, 1)
        inv_d = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
        q = roundf(blocks * inv_d).astype(np.int8).view(np.uint8)  # -127..127 as bytes
    else:  # Q4_0: the largest-magnitude value maps to q = 0, i.e. -8 * d
        x_max = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)
        d = x_max / np.float32(-8)
        inv_d = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
        q = np.clip(np.trunc(blocks * inv_d + np.float32(8.5)), 0, 15).astype(np.uint8)
        half = block_size // 2
        q = q[:, :half] | (q[:, half:] << np.uint8(4))  # two 4-bit values per byte
    packed = np.concatenate([d.astype(np.float16).view(np.uint8), q], axis=1)  # d first
    return packed.reshape(weight.shape[0], -1)


def dequantize(packed, qtype, block_size=32):
    """(out, n_bytes) uint8 -> (out, in) float32: d * q, block by block."""
    per_block = 2 + block_size * QUANT_TYPES[qtype] // 8
    blocks = packed.reshape(-1, per_block)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # (n_blocks, 1)
    if qtype == "Q8_0":
        q = blocks[:, 2:].view(np.int8).astype(np.float32)
    else:
        low, high = blocks[:, 2:] & np.uint8(0x0F), blocks[:, 2:] >> np.uint8(4)
        q = np.concatenate([low, high], axis=1).astype(np.float32) - 8  # (n_blocks, 32)
    return (d * q).reshape(packed.shape[0], -1)


out_features = 256
weight = (rng.standard_normal((out_features, args.in_features)) / np.sqrt(args.in_features)).astype(np.float32)  # fmt: skip
x = rng.standard_normal((64, args.in_features)).astype(np.float32)  # (B, in) activations
y_ref = x @ weight.T  # (B, out) float32: its own rounding (~1e-7) is far below every error here
layer = {}  # format -> (bits per weight, weight rel. error, output rel. error)
for name in formats:  # a plain cast, no scale: what enable_layerwise_casting stores
    w = round_to(weight, name).astype(np.float32)  # exact: each format fits in float32
    layer[name] = (8 * format_limits(name)[4], rel_rms(w, weight), rel_rms(x @ w.T, y_ref))
packed = {q: quantize(weight, q, args.block_size) for q in QUANT_TYPES}
for q, p in packed.items():
    w = dequantize(p, q, args.block_size)
    layer[q] = (8 * p.nbytes / weight.size, rel_rms(w, weight), rel_rms(x @ w.T, y_ref))
# --8<-- [end:quant]

print(f"\nweight {weight.shape} float32 ~ N(0, 1/{args.in_features}), x {x.shape}; blocks of {args.block_size} along rows")  # fmt: skip
for q, p in packed.items():
    print(f"{q}: {p.shape[1] // (args.in_features // args.block_size)} bytes per block, packed {p.shape} uint8 = {p.nbytes} bytes for {weight.size} weights")  # fmt: skip
rows = [[name, f"{bits:g}", f"{w_err:.1e}", f"{y_err:.1e}"] for name, (bits, w_err, y_err) in layer.items()]  # fmt: skip
table("One linear layer y = x @ W.T, weights stored in each format", ["weights", "bits/weight", "weight rel. RMS err", "output rel. RMS err"], rows)  # fmt: skip

# %% [markdown]
# ## 5. Quantization inside a sampling loop
#
# The exact denoiser has no weights to quantize, so the loop gets a linear head that a
# network would have: `noise_pred = W_out @ (W_in @ eps)`, `W_in` `(256, 2)` random
# features and `W_out = pinv(W_in)` `(2, 256)`, so in full precision the head is the
# identity and every error below comes from storing `W_out` in a lower format. `W_in`'s
# rows hold 2 values, fewer than one block, so it stays in full precision here.

# %%
# --8<-- [start:loop]
hidden = 256
w_in = rng.standard_normal((hidden, 2)) / np.sqrt(hidden)  # (256, 2)
w_out = np.linalg.pinv(w_in).astype(np.float32)  # (2, 256): W_out @ W_in = I
heads = {"float64 head": w_out.astype(np.float64)}
heads.update({name: round_to(w_out, name) for name in formats})
heads.update({q: dequantize(quantize(w_out, q), q).astype(np.float64) for q in QUANT_TYPES})

mixture = default_mixture()
unet = ExactDenoiser(mixture, alphas_cumprod(canonical_betas("scaled_linear")), "epsilon")
scheduler = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, clip_sample=False, set_alpha_to_one=False)  # fmt: skip
scheduler.set_timesteps(args.steps)
start = np.random.default_rng(args.seed + 1).standard_normal((args.num_samples, 2))  # (N, 2)
finals, pred_err = {}, {}
for name, head in heads.items():
    # W_out @ W_in (2, 2): the same linear map as going through the (N, 256) features,
    # computed once instead of per step; the identity up to the rounding of W_out
    effective = head @ w_in
    latents = start * scheduler.init_noise_sigma
    for i, t in enumerate(scheduler.timesteps):
        eps = unet(scheduler.scale_model_input(latents, t), t)  # (N, 2), exact
        noise_pred = eps @ effective.T  # (N, 2)
        if i == 0:
            pred_err[name] = rel_rms(noise_pred, eps)
        latents = scheduler.step(noise_pred, t, latents).prev_sample
    finals[name] = latents
# --8<-- [end:loop]

rows = []
for name, final in finals.items():
    qual = sample_quality(mixture, final)
    dev = np.abs(final - finals["float64 head"])
    rows.append([name, f"{pred_err[name]:.1e}", f"{dev.max():.1e}", f"{np.sqrt(np.mean(dev**2)):.1e}", f"{qual.on_mode:.1%}", f"{qual.weight_error:.3f}"])  # fmt: skip
table(f"DDIM {args.steps} steps, {args.num_samples} samples, W_out stored in each format", ["head", "noise_pred rel. err", "max abs dev", "RMS dev", "on_mode", "weight_error"], rows)  # fmt: skip

# %% [markdown]
# ## 6. What the formats save on Flux.1-dev
#
# Bytes per parameter: bf16 2, fp8 1, Q8_0 34 / 32 = 1.0625, Q4_0 18 / 32 = 0.5625.
# Applied to every parameter this is a lower bound: real GGUF files keep some small
# tensors (norms, biases) in higher precision, and diffusers' `enable_layerwise_casting`
# skips every module whose name matches `norm`, which on Flux includes the AdaLN
# modulation Linears (`norm1.linear`, ...): `model_sizes.layerwise_casting` records what
# diffusers' own method casts on the real transformer (meta device, no weights).

# %%
# --8<-- [start:sizes]
bytes_per_param = {"bf16": 2.0, "fp8, every weight": 1.0, "Q8_0": 34 / 32, "Q4_0": 18 / 32}
flux = {r["component"]: r["params"] for r in model_sizes.rows("Flux.1-dev")}
others = sum(p for c, p in flux.items() if c != "transformer")  # VAE, CLIP, T5 kept in bf16
size_rows = [[c, model_sizes.format_params(flux[c])] + [f"{flux[c] * b / 1e9:.2f}" for b in bytes_per_param.values()] for c in ("transformer", "text_encoder_2")]  # fmt: skip
size_rows.append(["pipeline, rest in bf16", model_sizes.format_params(sum(flux.values()))] + [f"{(flux['transformer'] * b + others * 2) / 1e9:.2f}" for b in bytes_per_param.values()])  # fmt: skip
layerwise = model_sizes.layerwise_casting("Flux.1-dev", "transformer")  # diffusers' own skips
modulation = sum(n for name, n in layerwise["kept"].items() if name.endswith("norm1.linear") or name.endswith("norm1_context.linear") or name.endswith("norm.linear"))  # fmt: skip
# --8<-- [end:sizes]
table("Flux.1-dev weights in GB (10^9 B) per format; last row: the transformer in the format, VAE and text encoders in bf16", ["component", "params", *bytes_per_param], size_rows)  # fmt: skip
print(f"transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn): {model_sizes.format_params(layerwise['cast_params'])} params cast to fp8, {model_sizes.format_params(layerwise['kept_params'])} kept in bf16 ({model_sizes.format_params(modulation)} of them the AdaLN modulation Linears, skipped by the 'norm' pattern): {layerwise['bytes'] / 1e9:.2f} GB, pipeline {(layerwise['bytes'] + others * 2) / 1e9:.2f} GB")  # fmt: skip

# %% [markdown]
# ## 7. Dequantize on the fly
#
# A quantized layer cannot multiply `d * q` blocks directly in a plain matmul: diffusers'
# `GGUFLinear.forward_native` dequantizes the whole weight to the compute dtype on every
# call, then runs `F.linear`. So every call reads the packed blocks, writes a
# full-precision copy of the weight, and the matmul reads that copy: more bytes than a
# resident bf16 weight, plus extra kernel launches on a GPU, and the same matmul.
# Measured below: the transient copy (`tracemalloc`) and the weight bytes per call.
# `--timing` also times it (wall clock varies, so it is off by default).


# %%
# --8<-- [start:on-the-fly]
def forward_native(x, packed, qtype):
    """GGUFLinear.forward_native: dequantize the whole weight, then matmul."""
    return x @ dequantize(packed, qtype, args.block_size).T


x1 = x[:1]  # (1, in): one token, the decode-like case
resident = peak_bytes(lambda: x1 @ weight.T)[1]
on_the_fly = {q: peak_bytes(forward_native, x1, packed[q], q)[1] for q in QUANT_TYPES}
# weight bytes one call touches with a bf16 compute dtype, per weight: a resident bf16
# weight is read once (2); dequantizing reads the blocks, writes bf16, and the matmul reads
# it: a lower bound (diffusers' dequantizer writes fp16 first, then casts to compute_dtype)
touched = {"bf16 resident": 2.0} | {q: packed[q].nbytes / weight.size + 2.0 + 2.0 for q in QUANT_TYPES}  # fmt: skip
# --8<-- [end:on-the-fly]

print(f"\nweight {weight.shape}: stored float32 {weight.nbytes} B, Q8_0 {packed['Q8_0'].nbytes} B, Q4_0 {packed['Q4_0'].nbytes} B")  # fmt: skip
# MiB to one decimal: tracemalloc also counts a few dozen bytes of Python objects, which
# vary from run to run; the arrays' megabytes do not.
mib = {
    name: f"{peak / 2**20:.1f} MiB" for name, peak in [("resident", resident), *on_the_fly.items()]
}
print(f"peak memory of one call on x (1, {args.in_features}): float32 weight resident {mib['resident']} (the output only); dequantize + matmul: Q8_0 {mib['Q8_0']}, Q4_0 {mib['Q4_0']}")  # fmt: skip
print("weight bytes touched per call, per weight, at least (bf16 compute): " + ", ".join(f"{k} {v:.2f}" for k, v in touched.items()) + "; the matmul itself is the same bf16 matmul in every case")  # fmt: skip
if args.timing:
    import time  # standard library; wall clock, so only on request

    def best_of(fn, repeats=20):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) * 1e6

    for batch in (1, 64):
        xb = x[:batch]
        mm = best_of(lambda xb=xb: xb @ weight.T)
        dq = best_of(lambda: dequantize(packed["Q4_0"], "Q4_0", args.block_size))
        print(f"timing, batch {batch}: matmul {mm:.0f} us, Q4_0 dequantize {dq:.0f} us (x{dq / mm:.1f})")  # fmt: skip

# %% [markdown]
# ## 8. Picture it

# %%
# --8<-- [start:figures]
depth = np.arange(1, args.layers + 1)
series = {}
for name in ("fp32 (force_upcast)", "fp16", "fp16, fixed weights"):
    peaks = np.array(decodes[name][1])
    keep = np.isfinite(peaks)  # an inf cannot be drawn: the fp16 line stops where it overflows
    series[name] = (depth[keep], np.maximum(peaks[keep], 1e-3))
series["fp16 max 65504"] = (depth, np.full(args.layers, 65504.0))
chart = figures.line_chart(series, xlabel="decoder layer", ylabel="max |activation|", logy=True, markers=True)  # fmt: skip
figures.save(args.figures, "activation-overflow", chart, alt="Line chart, log scale, of the largest activation after each layer of the toy decoder: the fp32 line climbs past the flat fp16 limit of 65504, the fp16 line stops at the layer where it overflows to inf, and the line with weights scaled down stays at or below 12.", caption="Largest activation per layer of the toy decoder; fp16 overflows where the fp32 line crosses 65504.")  # fmt: skip
names = list(layer)
bars = figures.line_chart(
    {n: (np.array([layer[n][0]]), np.array([max(layer[n][2], 1e-9)])) for n in names},  # fp32: 0
    xlabel="bits per weight",
    ylabel="output rel. RMS error",
    logy=True,
    markers=True,
)
figures.save(args.figures, "bits-vs-error", bars, alt="Scatter of the toy linear layer's relative output error against bits per weight for bf16, fp16, fp8 e4m3, fp8 e5m2, Q8_0 and Q4_0: fewer bits give more error, and the block format Q8_0 sits below both 8-bit fp8 casts.", caption="Output error of one linear layer against bits per weight, per storage format.")  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    for svg in (chart, bars):
        display(SVG(svg))
# --8<-- [end:figures]
