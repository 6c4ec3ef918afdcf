"""Lab 18: when does launching kernels, not computing them, set a denoising step's time?

A denoiser step is a sequence of GPU kernels. In eager PyTorch the host (Python, the
dispatcher, the driver) issues them one by one, and each costs a launch overhead on the
host before the device can run it. torch.compile fuses chains of small pointwise kernels
into fewer, larger ones; a CUDA graph replays a whole captured step from one launch. The
trap: this is a model with assumed hardware constants, not a measurement, and compiling
costs a cold start that only enough requests of the same shape pay back.

Run it:  python3 code/lab-18-compilation-and-cuda-graphs/launch_overhead.py --launch-us 20
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
    int_list,
    parse_args,
)

# %% [markdown]
# ## 1. Setup / contract
#
# The denoiser is FLUX.1-dev's `FluxTransformer2DModel`, its shapes read from the real
# config (`labkit.model_sizes`): 19 double-stream blocks, 38 single-stream blocks, width
# 3072 = 24 heads x 128, 512 text tokens, one image token per 16 x 16 pixels, bf16. The
# hardware constants are assumptions, each a flag: peak FLOP/s and bandwidth are the
# H100 SXM datasheet's dense BF16 and HBM3 figures, the launch overhead is an assumption:
# the default 5 us is about a bare driver-level launch; eager PyTorch adds Python and the
# dispatcher per op, so try `--launch-us 20` for that. `--num-samples` requests with `--seed`-drawn shapes feed the shape-bucket section.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="launch_overhead.py", description=__doc__.splitlines()[0])
parser.add_argument("--resolutions", type=int_list, default=[256, 512, 768, 1024], help="image sides in px, multiples of 16")  # fmt: skip
parser.add_argument("--batch-size", type=int_at_least(1), default=1, help="images per denoiser call")  # fmt: skip
parser.add_argument("--steps", type=int_at_least(1), default=28, help="num_inference_steps (FluxPipeline's default)")  # fmt: skip
parser.add_argument("--launch-us", type=float, default=5.0, help="host cost per kernel launch, microseconds (assumption)")  # fmt: skip
parser.add_argument("--tflops", type=float, default=989.0, help="peak dense BF16 TFLOP/s (H100 SXM datasheet)")  # fmt: skip
parser.add_argument("--bandwidth", type=float, default=3.35, help="memory bandwidth, TB/s (H100 SXM datasheet)")  # fmt: skip
parser.add_argument("--compile-s", type=float, default=60.0, help="compile cold start, seconds (assumption: measure yours)")  # fmt: skip
parser.add_argument("--num-samples", type=int_at_least(1), default=1000, help="requests in the shape-bucket simulation")  # fmt: skip
parser.add_argument("--seed", type=int, default=0, help="seed of the request shapes")
add_figures_argument(parser)
args = parse_args(parser)
for flag in ("launch_us", "tflops", "bandwidth", "compile_s"):
    value = getattr(args, flag)
    if not 0 < value < 1e9:  # also refuses nan and inf
        parser.error(f"--{flag.replace('_', '-')} must be a positive number, got {value}")
if any(r < 16 or r > 4096 or r % 16 for r in args.resolutions):
    parser.error(f"--resolutions must be multiples of 16 in [16, 4096], got {args.resolutions}")
if args.batch_size > 64 or args.num_samples > 100_000:
    parser.error("--batch-size must be <= 64 and --num-samples <= 100000")

(flux,) = [r for r in model_sizes.rows("Flux.1-dev") if r["component"] == "transformer"]
config = flux["config"]  # FluxTransformer2DModel's published config
HEADS, HEAD_DIM = config["num_attention_heads"], config["attention_head_dim"]
D = HEADS * HEAD_DIM  # 3072, the residual stream's width
TEXT_TOKENS = model_sizes.flux_1024px()["text_tokens"]  # 512, T5 prompt_embeds
BF16 = 2  # bytes per element
PEAK_FLOPS, BANDWIDTH = args.tflops * 1e12, args.bandwidth * 1e12  # per second
LAUNCH = args.launch_us * 1e-6  # seconds of host time per kernel launch
# --8<-- [end:setup]

# %% [markdown]
# ## 2. The step as kernels
#
# One kernel per op, as eager PyTorch runs diffusers' blocks: a kernel is (name, kind,
# FLOPs, bytes). A linear layer on `t` tokens reads its input and weight and writes its
# output, `2 t d_in d_out` FLOPs; a pointwise op (norm, modulation, GELU, RoPE, residual)
# reads and writes `(t, D)` and does a few FLOPs per element; attention (SDPA, fused as
# flash attention does) is `4 B heads T^2 head_dim` FLOPs over q, k, v and out. Views and
# index bookkeeping launch nothing here, so the count is a lower bound on eager's.


# %%
# --8<-- [start:kernels]
def linear(name, tokens, d_in, d_out):
    """y (tokens, d_out) = x (tokens, d_in) @ W: reads x and W, writes y."""
    return (name, "matmul", 2 * tokens * d_in * d_out, BF16 * (tokens * d_in + d_in * d_out + tokens * d_out))  # fmt: skip


def pointwise(name, elements, flops_each=1, inputs=1):
    """An elementwise op or a norm: reads `inputs` tensors of `elements`, writes one."""
    return (name, "pointwise", flops_each * elements, BF16 * elements * (inputs + 1))


def attention(batch, tokens):
    """SDPA over the joint sequence: QK^T and PV, 2 matmuls of 2 T^2 head_dim per head."""
    return ("sdpa", "attention", 4 * batch * HEADS * tokens**2 * HEAD_DIM, BF16 * 4 * batch * tokens * D)  # fmt: skip


def modulated_norm(batch, tokens, chunks):
    """AdaLayerNormZero: SiLU(temb) -> Linear(D, chunks*D) per image, LayerNorm, scale+shift."""
    return [pointwise("silu", batch * D), linear("norm.linear", batch, D, chunks * D),
            pointwise("layer_norm", tokens * D, 5), pointwise("modulate", tokens * D, 2)]  # fmt: skip


def qkv(tokens):
    """to_q, to_k, to_v and the RMSNorms on q and k (norm_q, norm_k)."""
    projections = [linear(p, tokens, D, D) for p in ("to_q", "to_k", "to_v")]
    return [*projections, pointwise("norm_q", tokens * D, 4), pointwise("norm_k", tokens * D, 4)]


def flux_step(batch, side):
    """The kernels of one FluxTransformer2DModel call on `batch` images of side x side px."""
    img = (side // 16) ** 2  # image tokens: 8x VAE, then 2 x 2 patches packed
    joint = img + TEXT_TOKENS  # the sequence attention sees
    ks = [linear("x_embedder", batch * img, config["in_channels"], D),
          linear("context_embedder", batch * TEXT_TOKENS, config["joint_attention_dim"], D)]  # fmt: skip
    for src, width in (("timestep", 256), ("guidance", 256), ("pooled", config["pooled_projection_dim"])):  # fmt: skip
        ks += [linear(f"{src}.linear_1", batch, width, D), pointwise("silu", batch * D), linear(f"{src}.linear_2", batch, D, D)]  # fmt: skip
    for _ in range(config["num_layers"]):  # FluxTransformerBlock: two streams, joint attention
        for n in (img, TEXT_TOKENS):
            ks += modulated_norm(batch, batch * n, 6) + qkv(batch * n)
        ks += [pointwise("cat", batch * joint * D) for _ in "qkv"]
        ks += [pointwise("rope_q", batch * joint * D, 3), pointwise("rope_k", batch * joint * D, 3), attention(batch, joint)]  # fmt: skip
        for n in (img, TEXT_TOKENS):
            t = batch * n
            ks += [linear("to_out", t, D, D), pointwise("gate_residual", t * D, 2, 2),
                   pointwise("layer_norm", t * D, 5), pointwise("modulate", t * D, 2),
                   linear("ff.0", t, D, 4 * D), pointwise("gelu", t * 4 * D, 8),
                   linear("ff.2", t, 4 * D, D), pointwise("gate_residual", t * D, 2, 2)]  # fmt: skip
    for _ in range(config["num_single_layers"]):  # FluxSingleTransformerBlock: one stream
        t = batch * joint
        ks += [*modulated_norm(batch, t, 3), linear("proj_mlp", t, D, 4 * D), pointwise("gelu", t * 4 * D, 8)]  # fmt: skip
        ks += [*qkv(t), pointwise("rope_q", t * D, 3), pointwise("rope_k", t * D, 3), attention(batch, joint)]  # fmt: skip
        ks += [pointwise("cat", t * 5 * D), linear("proj_out", t, 5 * D, D), pointwise("gate_residual", t * D, 2, 2)]  # fmt: skip
    ks += [*modulated_norm(batch, batch * img, 2), linear("proj_out", batch * img, D, config["in_channels"])]  # fmt: skip
    return ks


def fused(kernels, qkv=True):
    """What the compiler does here: each run of consecutive pointwise kernels becomes one
    kernel that reads its input once and writes its output once (bytes: the run's largest
    member, which undercounts a run that spans several tensors, and inductor would not fuse
    every such run); with `qkv`, to_q/to_k/to_v also become one matmul, as the separate,
    manual fuse_qkv_projections() does (torch.compile does not merge them by default). Matmuls and
    attention stay separate kernels."""
    out = []
    for name, kind, flops, nbytes in kernels:
        prev = out[-1] if out else None
        if prev and kind == "pointwise" == prev[1]:
            out[-1] = ("fused_pointwise", kind, prev[2] + flops, max(prev[3], nbytes))
        elif qkv and prev and name in ("to_k", "to_v") and prev[0] in ("to_q", "to_qk"):
            out[-1] = ("to_qk" if name == "to_k" else "to_qkv", kind, prev[2] + flops, prev[3] + nbytes)  # fmt: skip
        else:
            out.append((name, kind, flops, nbytes))
    return out


# --8<-- [end:kernels]

# %% [markdown]
# ## 3. Main transition: the host issues, the device runs
#
# Each kernel's device time is a roofline: `max(FLOPs / peak, bytes / bandwidth)`. The host
# spends `LAUNCH` per kernel and the device cannot start a kernel before it is issued, so
# kernel i ends at `max(device free, host issued i)` + its device time. When launches
# dominate (the host's lag outgrows the device's work), the device waits on the host, and
# the step costs `K x launch` plus the last kernel (host-bound); if the host runs ahead, launches hide
# behind the device. The `serialised` column, `K x (launch + roofline)`, has no overlap at
# all, as with a sync after every kernel: the timeline never exceeds it. A CUDA graph
# replays the whole captured step from one launch.


# %%
# --8<-- [start:timeline]
def device_times(kernels):
    """(K,) seconds per kernel: the slower of compute and memory traffic."""
    flops = np.array([k[2] for k in kernels], dtype=float)
    nbytes = np.array([k[3] for k in kernels], dtype=float)
    return np.maximum(flops / PEAK_FLOPS, nbytes / BANDWIDTH)


def step_time(kernels, cuda_graph=False):
    """Seconds for one step. Kernel i (0-based) is issued at (i + 1) * LAUNCH; the device
    runs kernels in order, so the last ends at sum(device) + max_i((i + 1) * LAUNCH - sum
    of device times before i): the longest wait for the host."""
    dev = device_times(kernels)
    if cuda_graph:
        return LAUNCH + dev.sum()  # one launch, then the kernels back to back
    before = np.concatenate([[0.0], np.cumsum(dev)[:-1]])
    return dev.sum() + max(0.0, np.max(LAUNCH * np.arange(1, len(dev) + 1) - before))


rows = {}
for side in args.resolutions:
    eager = flux_step(args.batch_size, side)
    compiled = fused(eager)
    rows[side] = dict(
        kernels=(len(eager), len(compiled)),
        tflop=sum(k[2] for k in eager) / 1e12,
        device=device_times(eager).sum(),
        eager=step_time(eager),
        serialised=LAUNCH * len(eager) + device_times(eager).sum(),  # no overlap at all
        compiled=step_time(compiled),
        graph=step_time(compiled, cuda_graph=True),
    )
print(f"FLUX.1-dev transformer, batch {args.batch_size}, launch {args.launch_us:g} us, "
      f"{args.tflops:g} TFLOP/s, {args.bandwidth:g} TB/s (a model, not a measurement)")  # fmt: skip
print(" side px | kernels eager/fused | TFLOP | eager ms | serialised ms | compiled ms | + CUDA graph ms | eager idle")  # fmt: skip
for side, r in rows.items():
    idle = 1 - r["device"] / r["eager"]  # share of the eager step the device waits
    print(f" {side:7d} | {r['kernels'][0]:6d} / {r['kernels'][1]:<10d} | {r['tflop']:5.1f} | "
          f"{r['eager'] * 1e3:8.2f} | {r['serialised'] * 1e3:13.2f} | {r['compiled'] * 1e3:11.2f} | "
          f"{r['graph'] * 1e3:15.2f} | {idle:8.1%}")  # fmt: skip
pointwise_only = len(fused(flux_step(args.batch_size, side), qkv=False))
print(f"fusing pointwise runs alone (the toy's torch.compile) leaves {pointwise_only} kernels; "
      f"fuse_qkv_projections() takes that to {rows[side]['kernels'][1]}")  # fmt: skip
check = sum(k[2] for k in flux_step(1, 1024) if k[1] != "pointwise")
print(f"check: matmul + attention FLOPs at 1024 px, batch 1 = {check / 1e12:.2f} T; the real "
      f"model on the meta device counts {model_sizes.flux_1024px()['flops'] / 1e12:.2f} T")  # fmt: skip
# --8<-- [end:timeline]

# %% [markdown]
# ## 4. When the host is the bottleneck
#
# The same step for a range of launch overheads: the device time per kernel is fixed by
# the model and the resolution, so the step turns host-bound as a launch nears the time an
# average kernel runs (a little before: runs of short pointwise kernels let the host fall
# behind). The fused step has fewer kernels, so it turns later; the graph
# never does.

# %%
# --8<-- [start:sweep]
launch_us = np.array([1.0, 2.0, 5.0, 10.0, 20.0, 40.0])
small = min(args.resolutions)
eager_small, fused_small = flux_step(args.batch_size, small), None
fused_small = fused(eager_small)
sweep = {"eager": [], "compiled": [], "compiled + CUDA graph": []}
saved_launch = LAUNCH
for us in launch_us:
    LAUNCH = us * 1e-6
    sweep["eager"].append(step_time(eager_small) * 1e3)
    sweep["compiled"].append(step_time(fused_small) * 1e3)
    sweep["compiled + CUDA graph"].append(step_time(fused_small, cuda_graph=True) * 1e3)
LAUNCH = saved_launch
per_kernel = device_times(eager_small).mean() * 1e6
print(f"\n{small} px: an eager kernel runs {per_kernel:.1f} us on average on the device")
for us, e, c, g in zip(launch_us, *sweep.values(), strict=True):
    print(f" launch {us:4.0f} us: eager {e:7.2f} ms, compiled {c:7.2f} ms, + graph {g:7.2f} ms")
# --8<-- [end:sweep]

# %% [markdown]
# ## 5. Cold start, amortised
#
# Compiling costs `--compile-s` once per shape (inductor's on-disk cache, and Mega-Cache's
# artifacts on a new machine, cut it for a restart; dynamo still traces); it pays back after
# `compile_s / (steps x saving per step)` requests of that shape. Few steps per request
# (a distilled 4-step model) means less saving per request and a later break-even.

# %%
# --8<-- [start:amortise]
side = max(args.resolutions)
saving = rows[side]["eager"] - rows[side]["graph"]  # seconds per step
print(f"\n{side} px: compiled + graph saves {saving * 1e3:.2f} ms per step "
      f"({saving / rows[side]['eager']:.1%})")  # fmt: skip
for steps in sorted({args.steps, 4}):
    per_request = steps * saving
    print(f" {steps:3d} steps: {per_request * 1e3:8.1f} ms per request; a {args.compile_s:g} s "
          f"cold start pays back after {np.ceil(args.compile_s / per_request):,.0f} requests")  # fmt: skip
requests = np.arange(0, 2001, 50)
cumulative = {
    "eager": requests * args.steps * rows[side]["eager"],
    "compiled (cold start, then graph)": args.compile_s
    + requests * args.steps * rows[side]["graph"],
}
# --8<-- [end:amortise]

# %% [markdown]
# ## 6. Shapes: recompiles and buckets
#
# A compiled graph is specialised to its input shapes. Requests arrive with sides drawn
# from 512 to 1024 px (multiples of 64, independently for height and width) and batch 1,
# 2 or 4. Three policies, counted in compiles: static shapes (`dynamic=False`) compile
# every new (batch, tokens) shape, and past 8 compiled versions (`recompile_limit`) dynamo
# runs new shapes eagerly; automatic dynamic shapes (the default) compile the first shape
# statically and, on a miss, recompile with every dimension that has changed made symbolic,
# except that a size of 1 stays a constant (dynamo's 0/1 specialisation of backed sizes; an
# unbacked batch, `mark_unbacked`, is not specialised), so batch 1 and batch >= 2 need two graphs; buckets round each request up to one of a few sides and pay
# for the padded tokens, and with `dynamic=False` count against the same limit: raise
# `torch._dynamo.config.recompile_limit` to at least the number of bucket shapes times the
# compiled model configurations (many diffusers models share one code object, `apply_lora_scale`'s wrapper).

# %%
# --8<-- [start:buckets]
rng = np.random.default_rng(args.seed)
heights = rng.choice(np.arange(512, 1025, 64), args.num_samples)
widths = rng.choice(np.arange(512, 1025, 64), args.num_samples)
batches = rng.choice([1, 2, 4], args.num_samples)
tokens = heights * widths // 256  # (N,) image tokens per request
RECOMPILE_LIMIT = 8  # torch._dynamo.config.recompile_limit
# distinct (batch, tokens) shapes, in first-seen order
shapes = list(dict.fromkeys(zip(batches.tolist(), tokens.tolist(), strict=True)))
static_compiles = min(len(shapes), RECOMPILE_LIMIT)  # at most 8 compiled versions
compiled_shapes = set(shapes[:static_compiles])
eager_fallback = sum((b, t) not in compiled_shapes for b, t in zip(batches.tolist(), tokens.tolist(), strict=True))  # fmt: skip


def automatic_dynamic_compiles(requests):
    """Graphs compiled for (batch, tokens) requests under automatic dynamic shapes: a graph
    holds, per dimension, a constant or "symbolic" (any size >= 2); a miss compiles a graph
    in which each dimension that has taken more than one value is symbolic, unless it is 1."""
    graphs, seen = [], [set(), set()]
    for shape in requests:
        for values, size in zip(seen, shape, strict=True):
            values.add(size)
        if not any(all(g == n or (g == "symbolic" and n >= 2) for g, n in zip(graph, shape, strict=True)) for graph in graphs):  # fmt: skip
            graphs.append(tuple("symbolic" if len(v) > 1 and n != 1 else n for v, n in zip(seen, shape, strict=True)))  # fmt: skip
    return len(graphs)


automatic_compiles = automatic_dynamic_compiles(zip(batches.tolist(), tokens.tolist(), strict=True))
BUCKETS = np.array([512, 768, 1024])  # square sides requests are padded up to
bucket = BUCKETS[np.searchsorted(BUCKETS, np.maximum(heights, widths))]
bucket_order = list(dict.fromkeys(zip(batches.tolist(), bucket.tolist(), strict=True)))
bucket_shapes = len(bucket_order)
bucket_compiles = min(bucket_shapes, RECOMPILE_LIMIT)  # the limit counts buckets too
compiled_buckets = set(bucket_order[:bucket_compiles])
bucket_eager = sum(s not in compiled_buckets for s in zip(batches.tolist(), bucket.tolist(), strict=True))  # fmt: skip
padding = (bucket**2 // 256).sum() / tokens.sum() - 1  # extra tokens per image (batch not weighted)
print(f"\n{args.num_samples} requests, {len(shapes)} distinct (batch, tokens) shapes:")
print(f" static shapes: {static_compiles} compiles, then {eager_fallback} requests "
      f"({eager_fallback / args.num_samples:.0%}) run eagerly past recompile_limit {RECOMPILE_LIMIT}")  # fmt: skip
print(f" automatic dynamic: {automatic_compiles} compiles (changed dimensions made symbolic; batch 1 stays a constant)")  # fmt: skip
print(f" buckets {BUCKETS.tolist()}, dynamic=False: {bucket_shapes} shapes, {bucket_compiles} compiles, {bucket_eager} request{'s' * (bucket_eager != 1)} "
      f"eager unless recompile_limit >= {bucket_shapes}; {padding:.0%} more tokens per image")  # fmt: skip
# --8<-- [end:buckets]

# %% [markdown]
# ## 7. Figures

# %%
# --8<-- [start:figures]
chart = figures.line_chart(
    {name: (launch_us, np.array(ms)) for name, ms in sweep.items()},
    xlabel="host cost per kernel launch (us)",
    ylabel=f"ms per step at {small} px",
    logx=True,
    markers=True,
)
figures.save(args.figures, "launch-sweep", chart, alt=f"Line chart of the modelled FLUX.1-dev step time at {small} px, batch {args.batch_size}, against the host cost per kernel launch from 1 to 40 microseconds: eager stays flat while the device is the bottleneck and then rises steeply as a launch nears the time an average kernel runs; the compiled step, with fewer kernels, turns later; with a CUDA graph the step time stays flat.", caption=f"Modelled step time against launch overhead, {small} px, batch {args.batch_size}: a roofline model with assumed H100 constants, not a measurement.")  # fmt: skip
cold = figures.line_chart(
    {name: (requests, total / 60) for name, total in cumulative.items()},
    xlabel=f"requests at {side} px, {args.steps} steps",
    ylabel="cumulative minutes",
)
figures.save(args.figures, "cold-start", cold, alt=f"Line chart of cumulative time against the number of {side} px requests: the compiled line starts at the {args.compile_s:g} s cold start and grows more slowly than the eager line, which it crosses at the break-even request count.", caption=f"A {args.compile_s:g} s compile amortised over requests (modelled step times).")  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(chart))
    display(SVG(cold))
# --8<-- [end:figures]
