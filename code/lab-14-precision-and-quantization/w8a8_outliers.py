"""Lab 14: why do a few large activation channels decide whether 8-bit and 4-bit matmuls work?

In a compute-bound diffusion transformer a quantized matmul is fast only when both operands
are low precision, weights *and* activations, so that the tensor cores multiply int8 (or
fp8, or 4-bit) values. The activations entering a transformer's Linear layers have a few
channels far larger than the rest, in every token (about 100 times in large language models,
SmoothQuant reports; SVDQuant finds such outliers in diffusion models, in weights too). The
trap: one scale per tensor, or per token, is set by those outliers and rounds every ordinary
channel to a few levels. SmoothQuant moves the outliers into the weights; SVDQuant, for 4
bits, then absorbs them in a small 16-bit low-rank branch.

Run it:  python3 code/lab-14-precision-and-quantization/w8a8_outliers.py --outlier-scale 50
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import figures, model_sizes
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    in_notebook,
    int_at_least,
    parse_args,
)
from labkit.precision import quantize_scaled, round_to  # the one emulation all labs share

# %% [markdown]
# ## 1. Setup / contract
#
# One Linear layer: `hidden_states` `(tokens, in)` times `weight.T`, weight `(out, in)`,
# as in every projection of a DiT block. The activations are N(0, 1) except
# `--outliers` channels (the same ones in every token) scaled by `--outlier-scale`; the
# weights are N(0, 1/in). The reference output is the float64 product. Every scheme
# below stores its operands through `labkit.precision.quantize_scaled` (a scale per
# slice, then int8 / int4 / fp8 values) and multiplies what was stored.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="w8a8_outliers.py", description=__doc__.splitlines()[0])
parser.add_argument("--tokens", type=int_at_least(1), default=64, help="rows of hidden_states")
parser.add_argument("--in-features", type=int_at_least(64), default=256, help="a multiple of --group-size")  # fmt: skip
parser.add_argument("--out-features", type=int_at_least(1), default=32)
parser.add_argument("--outliers", type=int_at_least(1), default=4, help="outlier channels of hidden_states")  # fmt: skip
parser.add_argument("--outlier-scale", type=float, default=50.0, help="their size against the rest, >= 1")  # fmt: skip
parser.add_argument("--alpha", type=float, default=0.5, help="SmoothQuant migration strength, in [0, 1]")  # fmt: skip
parser.add_argument("--rank", type=int_at_least(1), default=4, help="SVDQuant's 16-bit low-rank branch")  # fmt: skip
parser.add_argument("--group-size", type=int_at_least(2), default=64, help="values per 4-bit scale")  # fmt: skip
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)

if not 1.0 <= args.outlier_scale <= 1000.0:
    parser.error(f"--outlier-scale must be in [1, 1000], got {args.outlier_scale:g}")
if not 0.0 <= args.alpha <= 1.0:
    parser.error(f"--alpha must be in [0, 1], got {args.alpha:g}")
if args.in_features % args.group_size or args.outliers >= args.in_features:
    parser.error(f"--group-size {args.group_size} must divide --in-features {args.in_features}, and --outliers must be fewer")  # fmt: skip
if args.rank > min(args.in_features, args.out_features):
    parser.error(f"--rank {args.rank} must not exceed min(--in-features, --out-features)")
if args.tokens > 4096 or args.in_features > 4096 or args.out_features > 4096:
    parser.error("keep --tokens, --in-features and --out-features <= 4096 (a toy, not a benchmark)")  # fmt: skip
# --8<-- [end:setup]


rng = np.random.default_rng(args.seed)
noise = rng.standard_normal((args.tokens, args.in_features))  # (tokens, in)
channels = np.sort(rng.choice(args.in_features, args.outliers, replace=False))  # which ones


def activations(outlier_scale):
    """hidden_states (tokens, in): N(0, 1), the `--outliers` channels scaled up."""
    x = noise.copy()
    x[:, channels] *= outlier_scale  # the same channels in every token
    return x


weight = rng.standard_normal((args.out_features, args.in_features)) / np.sqrt(args.in_features)


def linear(x, w):
    """y (tokens, out) = x (tokens, in) @ w (out, in).T: y[t, o] = sum_k x[t, k] * w[o, k].

    einsum's own loop, not BLAS: at these sizes a BLAS thread pool costs more than it saves.
    """
    return np.einsum("tk,ok->to", x, w)


def rel_err(approx, exact):
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


# %% [markdown]
# ## 2. Main transition: where the scales go
#
# `y = x @ w.T` with `x` `(tokens, in)` and `w` `(out, in)`. A matmul kernel can apply one
# scale per row of `x` and one per row of `w` *after* the integer product:
# `y[t, o] = s_x[t] * s_w[o] * sum_k q_x[t, k] * q_w[o, k]`. A scale per input channel
# `k` cannot come out of that sum, so per-token is the finest activation scale a plain
# int8 GEMM takes. Weight-only schemes never quantize `x`: `w` is widened to 16 bits for
# the multiply (memory saved, no int8 math). SmoothQuant divides each input channel
# of `x` by `s[k] = max|x[:, k]|**alpha / max|w[:, k]|**(1 - alpha)` and multiplies the
# same column of `w` by it: the product is unchanged, and the outliers are split between
# the two operands. SVDQuant keeps the top `rank` singular directions of the smoothed
# weight `L1 @ L2` in 16 bits and quantizes only the residual to 4 bits.


# %%
# --8<-- [start:schemes]
def per_group(t, fmt):
    """4-bit values with one scale per `--group-size` consecutive inputs of a row."""
    g = t.reshape(t.shape[0], -1, args.group_size)  # (rows, in / group, group)
    return quantize_scaled(g, fmt, axis=-1).reshape(t.shape)


def smooth(x, w, alpha):
    """SmoothQuant: x / s and w * s per input channel k; (x / s) @ (w * s).T == x @ w.T."""
    s = np.abs(x).max(axis=0) ** alpha / np.abs(w).max(axis=0) ** (1 - alpha)  # (in,)
    return x / s, w * s


def schemes(x, w):
    """Output of each scheme for hidden_states x (tokens, in) and weight w (out, in)."""
    xs, ws = smooth(x, w, args.alpha)
    u, sv, vt = np.linalg.svd(ws, full_matrices=False)
    low_rank = (u[:, : args.rank] * sv[: args.rank]) @ vt[: args.rank]  # (out, in), rank r
    bf16 = round_to(x, "bf16")  # the 16-bit activations a weight-only kernel multiplies
    w8 = quantize_scaled(w, "int8", axis=-1)  # one scale per output channel (row of w)
    fp8 = [quantize_scaled(t, "fp8_e4m3") for t in (x, w)]  # one scale per tensor each
    smooth8 = [quantize_scaled(t, "int8", axis=-1) for t in (xs, ws)]  # per token, per row
    branch = linear(round_to(xs, "bf16"), round_to(low_rank, "bf16"))  # SVDQuant, 16-bit
    residual = linear(per_group(xs, "int4"), per_group(ws - low_rank, "int4"))  # and 4-bit
    return {
        "bf16 x bf16 (no quantization)": linear(bf16, round_to(w, "bf16")),
        "weight-only int8 (W8A16)": linear(bf16, w8),
        "W8A8 int8, per-tensor x": linear(quantize_scaled(x, "int8"), w8),
        "W8A8 int8, per-token x": linear(quantize_scaled(x, "int8", axis=-1), w8),
        "W8A8 fp8 e4m3, per-tensor": linear(*fp8),
        "W8A8 int8, per-channel x (not a GEMM)": linear(quantize_scaled(x, "int8", axis=0), w8),
        "SmoothQuant + W8A8 int8, per-token x": linear(*smooth8),
        "W4A4 int4, per-group": linear(per_group(x, "int4"), per_group(w, "int4")),
        "SmoothQuant + W4A4": linear(per_group(xs, "int4"), per_group(ws, "int4")),
        f"SVDQuant: smooth + rank-{args.rank} bf16 + W4A4": branch + residual,
    }


# --8<-- [end:schemes]

# %% [markdown]
# ## 3. Check: the output error of each scheme
#
# Relative RMS error of the layer's output against float64, for the default outliers and
# without them (every channel N(0, 1)). The largest channel decides the scale: compare
# per-tensor with per-token (no better, since the outliers sit in every token) and with
# per-channel (what the outliers would need, but no GEMM can use).

# %%
# --8<-- [start:check]
x = activations(args.outlier_scale)
exact = linear(x, weight)
calm = activations(1.0)
errors = {name: rel_err(y, exact) for name, y in schemes(x, weight).items()}
errors_calm = {name: rel_err(y, linear(calm, weight)) for name, y in schemes(calm, weight).items()}
top = np.abs(x).max(axis=0)  # (in,) the largest |value| of each input channel
# --8<-- [end:check]
rest = np.delete(top, channels)
print(f"hidden_states {x.shape}, weight {weight.shape}: channels {channels.tolist()} x{args.outlier_scale:g}; largest |x| per channel: outliers {top[channels].min():.1f} to {top[channels].max():.1f}, the rest {np.median(rest):.2f} (median)")  # fmt: skip
width = max(map(len, errors))
print(f"\n{'scheme':<{width}}  with outliers  without")
for name in errors:
    print(f"{name:<{width}}  {errors[name]:13.2e}  {errors_calm[name]:7.2e}")
xs, ws = smooth(x, weight, args.alpha)
print(f"\nafter smoothing (alpha {args.alpha:g}): largest |x| per channel {np.abs(xs).max(axis=0).max():.2f}, largest |w| per input channel {np.abs(ws).max(axis=0).max():.2f} (before: {top.max():.1f} and {np.abs(weight).max():.2f})")  # fmt: skip
sv = np.linalg.svd(ws, compute_uv=False)
# bytes of the bf16 branch (2 per value) against the 4-bit weight's (half a byte per value)
branch = 2 * args.rank * (args.in_features + args.out_features) / (ws.size / 2)
(flux,) = [r for r in model_sizes.rows("Flux.1-dev") if r["component"] == "transformer"]
d = flux["config"]["num_attention_heads"] * flux["config"]["attention_head_dim"]  # 3072
flux_branch = 2 * 32 * (d + d) / (d * d / 2)  # rank 32, SVDQuant's, on a (d, d) projection
print(f"smoothed weight: the top {args.rank} of {len(sv)} singular values hold {np.sum(sv[: args.rank] ** 2) / np.sum(sv**2):.0%} of its energy; the rank-{args.rank} branch adds {branch:.0%} to the 4-bit weight bytes in this toy, a rank-32 branch on a Flux.1-dev ({d}, {d}) projection {flux_branch:.1%}")  # fmt: skip

# %% [markdown]
# ## 4. Picture it: error against outlier size
#
# The same schemes as the outliers grow from none (x1) to x200.

# %%
# --8<-- [start:figures]
scales = np.geomspace(1.0, 200.0, 6)
shown = ["weight-only int8 (W8A16)", "W8A8 int8, per-token x", "W8A8 fp8 e4m3, per-tensor",
         "SmoothQuant + W8A8 int8, per-token x", "W4A4 int4, per-group",
         f"SVDQuant: smooth + rank-{args.rank} bf16 + W4A4"]  # fmt: skip
sweep = {name: [] for name in shown}
for s in scales:
    xa = activations(s)
    ya = schemes(xa, weight)
    for name in shown:
        sweep[name].append(rel_err(ya[name], linear(xa, weight)))
chart = figures.line_chart({n: (scales, np.array(v)) for n, v in sweep.items()}, xlabel="outlier channels' size (x the rest)", ylabel="output rel. RMS error", logx=True, logy=True, markers=True)  # fmt: skip
lines = "; ".join(f"{n}: {v[0]:.1e} at x1, at most {max(v):.1e}, {v[-1]:.1e} at x200" for n, v in sweep.items())  # fmt: skip
figures.save(args.figures, "outliers-vs-error", chart, alt=f"Line chart, log-log, of the toy layer's relative output error (lower is better) against the size of {args.outliers} outlier activation channels, 1 to 200 times the rest. {lines}.", caption="Output error of one linear layer against the size of its outlier activation channels.")  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(chart))
# --8<-- [end:figures]
