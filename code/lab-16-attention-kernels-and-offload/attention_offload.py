"""Lab 16: how does attention run without the N x N matrix, and what does offloading cost per step?

Two schedules that trade a big allocation for a loop. Tiled attention walks the keys and
values one block at a time and keeps an online softmax (running max, running sum, rescaled
accumulator), so the ``(B, heads, N, N)`` scores never exist, and ring attention (context
parallelism) merges per-device ``(out, lse)`` pairs into the same result. Offloading walks
the denoiser's weights one group at a time: group offloading (``enable_group_offload``)
lowers the peak on the device, but every byte of the model then crosses the bus on every
denoiser call, and without streams or a disk path crosses back. The trap: neither is an
approximation, and neither is free.

Run it:  python3 code/lab-16-attention-kernels-and-offload/attention_offload.py --block-sizes 512,128,32
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import figures, model_sizes, offload_groups
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    float_list,
    in_notebook,
    int_at_least,
    int_list,
    parse_args,
)
from labkit.memory import peak_bytes  # tracemalloc peak of a call

# %% [markdown]
# ## 1. Setup / contract
#
# `query`, `key`, `value` arrive as `dispatch_attention_fn` receives them in diffusers:
# `(B, N, heads, head_dim)` float32. Like the `native` backend, the lab permutes them to
# `(B, heads, N, head_dim)` for the matrix products. The default shapes are Flux.1-dev's
# attention scaled down: Flux at 1024 x 1024 px has N = 4096 image + 512 text tokens,
# 24 heads of 128; here N = 512, 4 heads of 64, so every variant runs in milliseconds.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="attention_offload.py", description=__doc__.splitlines()[0])
parser.add_argument("--tokens", type=int_at_least(16), default=512, help="N, query = key tokens")
parser.add_argument("--heads", type=int_at_least(1), default=4)
parser.add_argument("--head-dim", type=int_at_least(8), default=64)
parser.add_argument(
    "--block-sizes", type=int_list, default=[512, 256, 128, 64, 32], help="key/value rows per block"
)
parser.add_argument("--devices", type=int_at_least(1), default=4, help="ring degree (simulated)")
parser.add_argument("--steps", type=int_at_least(1), default=28, help="num_inference_steps")
parser.add_argument(
    "--group-sizes", type=int_list, default=[1, 2, 4, 8], help="num_blocks_per_group values"
)
parser.add_argument(
    "--pcie-gbps",
    type=float_list(0.001),
    default=[25.0],
    help="GB/s each way, host to GPU and back (an assumption)",
)
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)

N = args.tokens
if N > 2048 or args.heads > 16 or args.head_dim > 256:
    parser.error("--tokens must be <= 2048, --heads <= 16 and --head-dim <= 256 (seconds, not minutes)")  # fmt: skip
for b in args.block_sizes:
    if b < 1 or N % b:
        parser.error(f"--block-sizes: {b} does not divide --tokens {N} into equal key/value blocks")
if N % args.devices or args.devices > 16:
    parser.error(f"--devices {args.devices} must divide --tokens {N} and be <= 16")
if args.steps > 1000:
    parser.error("--steps must be <= 1000")
if min(args.group_sizes) < 1 or max(args.group_sizes) > 64:
    parser.error("--group-sizes: num_blocks_per_group must be in 1..64")
if len(args.pcie_gbps) != 1 or args.pcie_gbps[0] > 1000:
    parser.error("--pcie-gbps takes one bandwidth in GB/s, in (0, 1000]")
pcie_gbps = args.pcie_gbps[0]
rng = np.random.default_rng(args.seed)
shape = (1, N, args.heads, args.head_dim)  # (B, N, heads, head_dim), B = 1: Flux needs no CFG batch
query, key, value = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
query, key, value = (
    np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (query, key, value)
)  # (B, heads, N, d)
# --8<-- [end:setup]


def fmt(n):
    """Bytes with a binary unit: 2 * 1024**3 -> '2.0 GiB'."""
    unit = max(u for u in range(5) if n >= 1024**u or u == 0)
    return f"{n / 1024**unit:.1f} {['B', 'KiB', 'MiB', 'GiB', 'TiB'][unit]}"


def table(title, header, rows):
    """Print ``rows`` under ``header``, each column right-aligned to its widest cell."""
    cells = [[str(x) for x in row] for row in [header, *rows]]
    widths = [max(len(row[k]) for row in cells) for k in range(len(header))]
    print(f"\n{title}")
    for row in cells:
        aligned = [cell.rjust(w) for cell, w in zip(row, widths, strict=True)]
        print("  ".join([row[0].ljust(widths[0]), *aligned[1:]]))


# %% [markdown]
# ## 2. Main transition: the online softmax over key/value blocks
#
# Naive attention stores `scores = q k^T / sqrt(d)`, shape `(B, heads, N, N)`, then
# `softmax(scores) @ v`. The tiled loop keeps three running quantities per query row:
# the max `m` of the scores seen so far, the sum `l` of `exp(score - m)`, and the
# accumulator `acc` of `exp(score - m) @ v`. A new block with a larger max rescales the
# old `l` and `acc` by `exp(m_old - m_new)`. After the last block, `out = acc / l`, and
# `lse = m + log(l)` is the log of the softmax denominator: what ring attention merges.


# %%
# --8<-- [start:attention]
def naive_attention(query, key, value):
    """(B, H, Nq, d), (B, H, Nk, d) x2 -> out (B, H, Nq, d), lse (B, H, Nq), storing all scores."""
    # a float32 divisor: NumPy 2 would promote the scores to float64 for np.sqrt's float64
    scores = query @ key.swapaxes(-1, -2) / np.float32(np.sqrt(query.shape[-1]))  # (B, H, Nq, Nk)
    m = scores.max(axis=-1, keepdims=True)  # (B, H, Nq, 1): per query row
    p = np.exp(scores - m)  # another (B, H, Nq, Nk)
    l = p.sum(axis=-1, keepdims=True)  # noqa: E741  (the softmax denominator / exp(m))
    return p @ value / l, (m + np.log(l))[..., 0]


def tiled_attention(query, key, value, block_size):
    """The same result, one (B, H, Nq, block_size) score block at a time (FlashAttention's loop)."""
    shape = (*query.shape[:-1], 1)  # (B, H, Nq, 1)
    m = np.full(shape, -np.inf, dtype=np.float32)  # running max
    l = np.zeros(shape, dtype=np.float32)  # noqa: E741  running sum of exp(score - m)
    acc = np.zeros(query.shape, dtype=np.float32)  # (B, H, Nq, d): running exp(score - m) @ v
    for start in range(0, key.shape[2], block_size):
        k, v = key[:, :, start : start + block_size], value[:, :, start : start + block_size]
        s = query @ k.swapaxes(-1, -2) / np.float32(np.sqrt(query.shape[-1]))  # (B, H, Nq, block)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        correction = np.exp(m - m_new)  # rescales what was summed under the old max
        p = np.exp(s - m_new)  # (B, H, Nq, block)
        l = l * correction + p.sum(axis=-1, keepdims=True)  # noqa: E741
        acc = acc * correction + p @ v
        m = m_new
    return acc / l, (m + np.log(l))[..., 0]


# the least of two calls: a notebook kernel's own threads can add a hundred bytes to a few
# KB to one call's peak (labkit.memory), and a peak near a rounding step of the printed
# MiB would then move
(reference, ref_lse), naive_peak = peak_bytes(naive_attention, query, key, value, repeats=2)
tiled = {}  # block_size -> (max abs diff of out, max abs diff of lse, peak bytes)
for b in args.block_sizes:
    (out, lse), peak = peak_bytes(tiled_attention, query, key, value, b, repeats=2)
    tiled[b] = (float(np.abs(out - reference).max()), float(np.abs(lse - ref_lse).max()), peak)
# --8<-- [end:attention]

# The diffs are float32 rounding: about 1e-7 for out, 1e-6 for lse (values near 7). Their
# last digits follow the order in which BLAS sums each matmul and the SIMD loops NumPy
# picks for exp and log, both chosen per CPU: the page's run pins one BLAS thread, but
# another CPU prints other digits, so the page quotes none of them.
scores_bytes = args.heads * N * N * 4
print(f"attention: query/key/value (1, {N}, {args.heads}, {args.head_dim}) float32, as (B, heads, N, head_dim)")  # fmt: skip
print(f"full score matrix (1, {args.heads}, {N}, {N}) float32 = {fmt(scores_bytes)}")
rows = [["naive (all scores)", 1, "0", "0", fmt(naive_peak), "1.00"]]
for b, (diff, lse_diff, peak) in tiled.items():
    rows.append([f"tiled, block_size={b}", N // b, f"{diff:.1e}", f"{lse_diff:.1e}", fmt(peak), f"{peak / naive_peak:.2f}"])  # fmt: skip
table("Attention, measured with tracemalloc (peak NumPy bytes inside the call)", ["", "blocks", "max abs diff", "lse diff", "peak", "of naive"], rows)  # fmt: skip

# --8<-- [start:real-shapes]
real_rows = []
for name, tokens, heads, head_dim in [("Flux.1-dev 1024 px", 4096 + 512, 24, 128), ("SD3 Medium 1024 px", 4096 + 333, 24, 64), ("SDXL 1024 px, 64x64 level", 4096, 10, 64)]:  # fmt: skip
    batch = 1 if name.startswith("Flux") else 2  # Flux.1-dev: guidance is an input; others: CFG
    full = batch * heads * tokens**2 * 2  # (B, heads, N, N) bf16 scores, per attention call
    state = batch * heads * tokens * (head_dim + 2) * 4  # acc (d) + m + l per query row, fp32
    tile = 128 * 128 * 4  # a 128 x 128 fp32 score tile, for scale (kernels pick theirs per GPU)
    real_rows.append([name, tokens, f"{batch} x {heads} x {head_dim}", fmt(full), fmt(state), fmt(tile)])  # fmt: skip
# --8<-- [end:real-shapes]
table(
    "Real shapes: what one attention call would store naively, and what the online softmax keeps",
    ["", "tokens N", "B x heads x d", "naive scores", "online state", "a 128x128 tile"],
    real_rows,
)

# %% [markdown]
# ## 3. Ring attention: merge (out, lse) pairs across devices
#
# Context parallelism splits the sequence over `devices`: each device holds `N / devices`
# query rows and one key/value shard. It attends its queries to each shard in turn and
# merges each partial `(out_i, lse_i)` into its running pair with the update diffusers'
# `TemplatedRingAttention` uses:
# `out = out - sigmoid(lse_i - lse) * (out - out_i)`, `lse = lse - logsigmoid(lse - lse_i)`,
# which is `lse = logaddexp(lse, lse_i)` with `out` weighted by each part's softmax mass.


# %%
# --8<-- [start:ring]
def sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))  # 1 / (1 + exp(-x)), without overflow


def logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def merge(out, lse, out_i, lse_i):
    """One step of the ring merge: two softmax-normalised partial results -> their union."""
    w = sigmoid(lse_i - lse)[..., None]  # exp(lse_i) / (exp(lse) + exp(lse_i)), (B, H, Nq, 1)
    return out - w * (out - out_i), lse - logsigmoid(lse - lse_i)


def ring_attention(query, key, value, devices):
    """Each simulated device: its query shard against every key/value shard, in ring order."""
    q_shards, k_shards, v_shards = (np.split(x, devices, axis=2) for x in (query, key, value))
    outs = []
    for rank in range(devices):
        out = lse = None
        for i in range(devices):
            j = (rank + i) % devices  # its own shard first, then the next rank's, and so on
            out_i, lse_i = naive_attention(q_shards[rank], k_shards[j], v_shards[j])
            out, lse = (out_i, lse_i) if out is None else merge(out, lse, out_i, lse_i)
        outs.append(out)  # (B, H, N / devices, d) on device `rank`
    return np.concatenate(outs, axis=2)


ring_out = ring_attention(query, key, value, args.devices)
ring_diff = float(np.abs(ring_out - reference).max())
# dropping the merge weights (averaging the shard outputs) is what a wrong merge looks like
shard_mean = np.mean([naive_attention(query, k, v)[0] for k, v in zip(np.split(key, args.devices, axis=2), np.split(value, args.devices, axis=2), strict=True)], axis=0)  # fmt: skip
mean_diff = float(np.abs(shard_mean - reference).max())
# --8<-- [end:ring]

per_device = N // args.devices
print(f"\nring attention over {args.devices} simulated devices: {per_device} query rows and {per_device} key/value rows each")  # fmt: skip
print(f"  merged with the (out, lse) update: max abs diff to naive {ring_diff:.1e}")
print(f"  plain mean of the {args.devices} shard outputs (no lse weights): max abs diff {mean_diff:.2f}")  # fmt: skip
print(f"  per device and step: scores ({args.heads}, {per_device}, {per_device}) = {fmt(args.heads * per_device**2 * 4)}, against ({args.heads}, {N}, {N}) = {fmt(scores_bytes)} on one device")  # fmt: skip

# %% [markdown]
# ## 4. Attention backends in diffusers: what each one needs
#
# `transformer.set_attention_backend(name)` or `with attention_backend(name):` picks the
# function `dispatch_attention_fn` calls. The rows are read from
# `diffusers/models/attention_dispatch.py` (0.42.1): the package
# `_check_attention_backend_requirements` asks for, the checks the backend registers
# (they run only when `DIFFUSERS_ATTN_CHECKS=1`), and whether it supports context
# parallelism. Only models whose processors call `dispatch_attention_fn` (Flux, Wan,
# QwenImage, ...) follow the setting; the UNet's `AttnProcessor2_0` and SD3's
# `JointAttnProcessor2_0` call SDPA themselves.

# %%
# --8<-- [start:backends]
BACKENDS = {  # name -> (what it needs, dtypes its checks accept, device check, context parallel)
    "native": ("torch SDPA, any kernel", "any", "same device", True),
    "_native_math": ("torch SDPA, SDPBackend.MATH", "any", "same device", False),
    "_native_efficient": ("torch SDPA, EFFICIENT_ATTENTION", "any", "same device", False),
    "_native_flash": ("torch SDPA, FLASH_ATTENTION", "fp16/bf16", "same device", True),
    "_native_cudnn": ("torch SDPA, CUDNN_ATTENTION", "fp16/bf16", "same device", True),
    "flex": ("torch >= 2.5 flex_attention", "any", "same device", False),
    "flash": ("flash-attn >= 2.6.3", "fp16/bf16", "same device", True),
    "flash_hub": ("kernels >= 0.12 (Hub kernel)", "fp16/bf16", "same device", True),
    "_flash_3": ("flash-attn 3, built from source", "fp16/bf16", "same device", False),
    "sage": ("sageattention >= 2.1.1", "fp16/bf16", "CUDA", True),
    "xformers": ("xformers >= 0.0.29", "any", "same device", False),
}
# --8<-- [end:backends]
table(
    "Attention backends (diffusers 0.42.1 registry)",
    ["backend", "needs", "dtype check", "device check", "context parallel"],
    [[k, n, d, dev, "yes" if cp else "no"] for k, (n, d, dev, cp) in BACKENDS.items()],
)

# %% [markdown]
# ## 5. Offload as a schedule: peak device bytes against bytes moved per step
#
# Per denoiser call (one step; Flux.1-dev and SDXL's batched CFG both make one call; Flux's
# true CFG, `true_cfg_scale > 1` with a negative prompt, makes two and doubles every
# row's bytes but model offload's), in each direction: host-to-device (onto the GPU) and
# device-to-host (back).
# - `enable_model_cpu_offload`: the whole denoiser stays on the device for the loop; it
#   goes on at the first step and back after the last (the VAE's hook offloads it before
#   the decode): one round trip per `pipe(...)` call, whatever `num_images_per_prompt`,
#   `1 / steps` of it each way per step.
# - `enable_sequential_cpu_offload` (accelerate's `cpu_offload`): every module with its
#   own parameters is loaded for its own forward, so the whole model crosses every step;
#   afterwards the hook drops it to the meta device and keeps its CPU copy, so nothing
#   is copied back. The peak is the largest such module.
# - `enable_group_offload(offload_type="block_level", num_blocks_per_group=n)`: each
#   `ModuleList` / `Sequential` child is cut into groups of `n` blocks, onloaded before
#   the group's first block runs and offloaded after its last; every other child (SDXL's
#   `mid_block`, the embeddings) forms one "unmatched" group that stays on the device for
#   the whole forward. Peak: unmatched + the largest group. Offloading a group calls
#   `module.to(offload_device)`: every byte is copied back, so the whole model crosses
#   twice per call. `use_stream=True` forces n = 1, from the model's second forward on
#   prefetches the next group while one runs (two block groups besides the unmatched one),
#   and offloads a block group by pointing its weights back at a CPU copy it holds; the
#   unmatched group gets no stream, so it is still onloaded synchronously and copied back
#   every call. With `offload_to_disk_path` nothing is copied back: each onload reads the
#   group from disk instead.
#   `block_modules=["mid_block"]` (diffusers 0.42.1) cuts a named child into groups of
#   its own ModuleLists' blocks, so it no longer sits in the unmatched group.
# - `offload_type="leaf_level"`: one group per Linear / Conv / Embedding layer, plus one
#   per module holding other parameters (norm weights): sequential offload's granularity,
#   but without streams each group is copied back too.
# Weights are bf16/fp16, 2 bytes per parameter; activations come on top. Transfer time
# adds both directions: without streams the copies run one after another.


# %%
# --8<-- [start:offload]
def schedules(record, steps, group_sizes):
    """[(strategy, peak bytes on the device, host-to-device bytes per step, device-to-host
    bytes per step, transfers per step)]."""
    total = record["params"] * 2  # bf16/fp16 bytes
    lists = [c["blocks"] for c in record["children"] if "blocks" in c]  # ModuleList children
    unmatched = sum(c["params"] for c in record["children"] if "params" in c) * 2
    leaf = record["leaf_level"]
    rows = [("all on the device", total, 0, 0, 0)]
    rows.append(("model offload", total, total / steps, total / steps, 1 / steps))  # on, then back
    for n in group_sizes:  # without streams: each group is onloaded, then copied back
        groups = [sum(blocks[i : i + n]) * 2 for blocks in lists for i in range(0, len(blocks), n)]
        rows.append((f"block_level, n={n}", unmatched + max(groups), total, total, len(groups) + 1))
    ones = [b * 2 for blocks in lists for b in blocks]  # use_stream: n = 1, next one prefetched
    pairs = max(ones[i] + ones[i + 1] for i in range(len(ones) - 1))
    # the unmatched group has no stream: it is still copied back with module.to(...)
    rows.append(("block_level, use_stream", unmatched + pairs, total, unmatched, len(ones) + 1))
    # block_modules=[name]: a child outside the ModuleLists (SDXL's mid_block) is itself cut
    # into groups of its own ModuleLists' blocks, instead of staying in the unmatched group
    inner = [c for c in record["children"] if "inner_blocks" in c]
    if inner:
        rest = unmatched - sum(c["params"] for c in inner) * 2  # what stays resident
        inner_ones = [b * 2 for c in inner for b in c["inner_blocks"]]
        own = max(c["inner_rest"] for c in inner) * 2  # a child's own unmatched part
        names = ", ".join(repr(c["name"]) for c in inner)
        rows.append((f"block_level, n=1, block_modules=[{names}]", rest + own + max(ones + inner_ones), total, total, len(ones) + len(inner_ones) + 1 + sum(c["inner_rest"] > 0 for c in inner)))  # fmt: skip
    # one group per module with its own parameters; accelerate's sequential hooks take the
    # same modules but keep the CPU copy, so they copy nothing back
    largest = max(leaf["largest_layer"], leaf["largest_other"]) * 2
    groups = leaf["layers"] + leaf["other_groups"]
    rows.append(("leaf_level", largest, total, total, groups))
    rows.append(("sequential offload", largest, total, 0, groups))
    return rows


offload = {}  # model -> schedules
for pipeline, component in [("Flux.1-dev", "transformer"), ("SDXL", "unet")]:
    record = offload_groups.model(pipeline, component)
    (size,) = [r for r in model_sizes.rows(pipeline) if r["component"] == component]
    assert record["params"] == size["params"]  # the same model as the size table
    offload[f"{pipeline} {component}"] = schedules(record, args.steps, args.group_sizes)
# --8<-- [end:offload]

header = ["strategy", "peak on device", "to device/step", "back to host/step", "transfer s/step", "groups/step"]  # fmt: skip
for name, rows in offload.items():
    title = f"{name}, bf16 weights, {args.steps} steps, transfer time at {pcie_gbps:g} GB/s each way (assumed), both directions added"  # fmt: skip
    cells = []
    for s, peak, on, back, n in rows:
        seconds = (on + back) / (pcie_gbps * 1e9)  # without streams the copies are serialized
        cells.append([s, f"{peak / 1e9:.2f} GB", f"{on / 1e9:.2f} GB", f"{back / 1e9:.2f} GB", f"{seconds:.2f}", f"{n:g}" if n == 0 or n >= 1 else "1 per pipe call"])  # fmt: skip
    table(title, header, cells)
sdxl = {c["name"]: c for c in offload_groups.model("SDXL", "unet")["children"]}
print(
    f"\nSDXL's largest group is up_blocks[0]: {max(sdxl['up_blocks']['blocks']) * 2 / 1e9:.2f} GB;"
    f" its mid_block ({sdxl['mid_block']['params'] * 2 / 1e9:.2f} GB) is not in a ModuleList,"
    " so it stays in the unmatched group, on the device for the whole forward,"
    " unless enable_group_offload(..., block_modules=['mid_block']) names it."
)

# %% [markdown]
# ## 6. Picture it

# %%
# --8<-- [start:figures]
xs = np.array(args.block_sizes)
chart = figures.line_chart(
    {
        # the MiB the table prints: bytes of noise (labkit.memory) must not move the chart
        "tiled (online softmax)": (xs, np.round(np.array([tiled[b][2] for b in xs]) / 2**20, 1)),
        "naive": (xs, np.full(len(xs), round(naive_peak / 2**20, 1))),
    },
    xlabel="block_size (key/value rows per block)",
    ylabel="peak MiB",
    markers=True,
)
figures.save(args.figures, "attention-peak", chart, alt="Line chart of the peak NumPy bytes of tiled attention with an online softmax against the key/value block size, falling with the block size, under a flat line for naive attention that stores every score.", caption="Peak bytes of attention against block_size (tracemalloc); every block size gives the naive result.")  # fmt: skip
series = {}
for name, rows in offload.items():
    order = sorted(rows, key=lambda r: (r[2] + r[3], -r[1]))  # by bytes moved, then falling peak
    series[name] = (np.array([r[2] + r[3] for r in order]) / 1e9, np.array([r[1] for r in order]) / 1e9)  # fmt: skip
trade = figures.line_chart(series, xlabel="GB moved per step, both directions", ylabel="peak weights on the device (GB)", logy=True, markers=True)  # fmt: skip
figures.save(args.figures, "offload-tradeoff", trade, alt="Line chart, log scale, of the peak weight bytes on the device against the bytes moved per denoising step for the Flux.1-dev transformer and the SDXL UNet: all-resident and model offload keep the whole model at almost no traffic; sequential offload moves the whole model onto the device each step, streamed groups the same plus the modules outside the blocks back, and group and leaf schedules without streams move it there and back, twice the bytes.", caption="Offload strategies: peak device bytes against bytes moved per step, both directions (bf16, from the real block sizes).")  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    for svg in (chart, trade):
        display(SVG(svg))
# --8<-- [end:figures]
