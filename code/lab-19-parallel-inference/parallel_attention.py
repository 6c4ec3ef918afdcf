"""Lab 19: how do several GPUs share one image's attention, and what does each rank send?

A DiT's joint attention sees every token of the image (and the prompt), so splitting one
image across GPUs means splitting the token sequence, and attention then needs every
other rank's keys and values. Ulysses swaps the token split for a head split with
all-to-alls; ring attention passes K/V blocks around and merges partial softmaxes by
log-sum-exp. Both give exactly full attention; they differ in what they send. The trap:
more GPUs cut one image's latency only while the traffic stays small beside the compute,
and for throughput alone, one image per GPU (data parallel) sends nothing.

Run it:  python3 code/lab-19-parallel-inference/parallel_attention.py --ranks 8
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

# %% [markdown]
# ## 1. Setup / contract
#
# The toy: one layer's `query`, `key`, `value` of shape `(tokens, heads, head_dim)`, float64,
# random; `--ranks` simulated GPUs, each starting with `tokens / ranks` consecutive tokens
# (diffusers' `_cp_plan` splits each input on its token axis: FLUX's image and text tokens
# separately, Wan's video tokens only). The real shapes come from
# FLUX.1-dev's config (`labkit.model_sizes`): 24 heads x 128, 19 double- and 38
# single-stream blocks, 4,096 image + 512 text tokens at 1024 px; and from diffusers'
# `WanTransformer3DModel` defaults (Wan 2.1 14B: 40 heads x 128, 40 blocks; its text enters
# by cross-attention, so only the video tokens form the self-attention sequence). Traffic is
# counted in bf16, 2 bytes an element, as served. The link bandwidth and the peak FLOP/s
# are assumptions (flags), used only to turn bytes and FLOPs into milliseconds.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="parallel_attention.py", description=__doc__.splitlines()[0])
parser.add_argument("--tokens", type=int_at_least(1), default=96, help="toy sequence length (divisible by --ranks)")  # fmt: skip
parser.add_argument("--heads", type=int_at_least(1), default=8, help="toy attention heads (divisible by --ranks for Ulysses)")  # fmt: skip
parser.add_argument("--head-dim", type=int_at_least(1), default=16, help="toy head_dim")
parser.add_argument("--ranks", type=int_at_least(1), default=4, help="simulated GPUs sharing the sequence")  # fmt: skip
parser.add_argument("--link-gbs", type=float, default=450.0, help="GB/s each GPU sends (assumption: H100 NVLink, one direction)")  # fmt: skip
parser.add_argument("--tflops", type=float, default=989.0, help="peak dense BF16 TFLOP/s (H100 SXM datasheet)")  # fmt: skip
parser.add_argument("--steps", type=int_at_least(1), default=28, help="num_inference_steps")
parser.add_argument("--seed", type=int, default=0, help="seed of the toy query, key, value")
add_figures_argument(parser)
args = parse_args(parser)
if args.tokens > 8192 or args.heads > 128 or args.head_dim > 256 or args.ranks > 64:
    parser.error("--tokens must be <= 8192, --heads <= 128, --head-dim <= 256, --ranks <= 64")
# NumPy holds the toy's whole score matrix, (heads, tokens, tokens) float64: keep it, and the
# multiply-adds that fill it, small enough to run in about a second
if args.heads * args.tokens**2 > 2**20 or args.heads * args.tokens**2 * args.head_dim > 2**25:
    parser.error(f"--heads x --tokens^2 is {args.heads * args.tokens**2:,} and x --head-dim {args.heads * args.tokens**2 * args.head_dim:,}: the toy's score matrix allows at most {2**20:,} and {2**25:,}")  # fmt: skip
if args.tokens % args.ranks:
    parser.error(f"--tokens {args.tokens} is not divisible by --ranks {args.ranks}: each rank holds tokens/ranks")  # fmt: skip
if args.heads % args.ranks:
    parser.error(f"--heads {args.heads} is not divisible by --ranks {args.ranks}: Ulysses gives each rank heads/ranks whole heads")  # fmt: skip
for flag in ("link_gbs", "tflops"):
    if not 0 < getattr(args, flag) < 1e9:  # also refuses nan and inf
        parser.error(f"--{flag.replace('_', '-')} must be a positive number, got {getattr(args, flag)}")  # fmt: skip

R, T, H, HEAD_DIM = args.ranks, args.tokens, args.heads, args.head_dim
BF16 = 2  # bytes per element on the wire
rng = np.random.default_rng(args.seed)
query, key, value = (rng.standard_normal((T, H, HEAD_DIM)) for _ in range(3))
# rank r holds tokens [r T/R, (r+1) T/R): a list of R arrays (T/R, H, head_dim)
q_shards, k_shards, v_shards = (np.split(x, R, axis=0) for x in (query, key, value))

(flux,) = [r for r in model_sizes.rows("Flux.1-dev") if r["component"] == "transformer"]
FLUX = dict(
    name="FLUX.1-dev, 1024 px",
    tokens=model_sizes.flux_1024px()["image_tokens"] + model_sizes.flux_1024px()["text_tokens"],
    heads=flux["config"]["num_attention_heads"],  # 24
    head_dim=flux["config"]["attention_head_dim"],  # 128
    layers=flux["config"]["num_layers"] + flux["config"]["num_single_layers"],  # 19 + 38
    call_flops=model_sizes.flux_1024px()["flops"],  # one transformer call, meta-device count
)
# Wan 2.1 14B, 5 s of 720p: WanPipeline.prepare_latents makes (num_frames - 1) // 4 + 1 latent
# frames of (720/8, 1280/8); patch_size (1, 2, 2) then gives (90/2) x (160/2) tokens a frame
WAN_FRAMES = (81 - 1) // 4 + 1  # 21
WAN = dict(name="Wan 2.1 14B, 5 s 720p", tokens=WAN_FRAMES * (720 // 8 // 2) * (1280 // 8 // 2),
           heads=40, head_dim=128, layers=40)  # fmt: skip
# --8<-- [end:setup]

# %% [markdown]
# ## 2. Full attention, and attention that also returns its log-sum-exp
#
# `out[q, h] = sum_k softmax_k(q . k / sqrt(d)) v[k]`; the log-sum-exp
# `lse[q, h] = log sum_k exp(q . k / sqrt(d))` is the softmax's normaliser, the one number a
# partial result needs to be merged with another computed over different keys.


# %%
# --8<-- [start:attention]
def attention(q, k, v):
    """q (Tq, h, d), k and v (Tk, h, d) -> out (Tq, h, d), lse (Tq, h)."""
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(q.shape[-1])  # (h, Tq, Tk)
    peak = scores.max(axis=-1, keepdims=True)  # subtract the max: exp never overflows
    weights = np.exp(scores - peak)
    total = weights.sum(axis=-1, keepdims=True)
    out = np.einsum("hqk,khd->qhd", weights / total, v)
    lse = (peak + np.log(total))[..., 0].T  # (Tq, h)
    return out, lse


full_out, _ = attention(query, key, value)  # (T, H, head_dim): what one GPU computes
# --8<-- [end:attention]

# %% [markdown]
# ## 3. Ulysses: all-to-all from a token split to a head split, and back
#
# Each rank cuts its `(T/R, H, d)` shard into R head groups and sends group j to rank j; rank j
# stacks what it receives along tokens and holds `(T, H/R, d)`: every token for its heads.
# Attention per head needs nothing else. A fourth all-to-all returns the output to the token
# split. Bytes a rank sends per layer: 4 all-to-alls (Q, K, V, O), each sending (R-1)/R of
# the rank's shard of T/R x H x d elements: `4 (R-1)/R * (T/R) H d * 2` bytes, which falls
# as 1/R. R must divide the heads and, in diffusers by default, each split input's tokens too
# (FLUX.1-dev at 1024 px, 24 heads and 512 text tokens: 2, 4 or 8 ranks); diffusers'
# `ulysses_anything=True` cuts unequal token shares and pads the heads to a multiple of R while
# the padding is < H/R per rank. This toy keeps equal shares.


# %%
# --8<-- [start:ulysses]
def all_to_all(shards, split_axis, concat_axis):
    """shards[r] is rank r's array. Rank r cuts it into R chunks along split_axis and sends
    chunk j to rank j; rank j concatenates the chunks from ranks 0..R-1 along concat_axis.
    Returns the new shards and the elements each rank sent (its own chunk stays)."""
    chunks = [np.split(s, len(shards), axis=split_axis) for s in shards]
    received = [np.concatenate([c[dst] for c in chunks], axis=concat_axis) for dst in range(len(shards))]  # fmt: skip
    return received, sum(c.size for j, c in enumerate(chunks[0]) if j != 0)


sent = 0
heads_split = []
for shards in (q_shards, k_shards, v_shards):  # (T/R, H, d) -> (T, H/R, d) on every rank
    moved, n = all_to_all(shards, split_axis=1, concat_axis=0)
    heads_split.append(moved)
    sent += n
ulysses_heads = [attention(q, k, v)[0] for q, k, v in zip(*heads_split, strict=True)]  # (T, H/R, d)
ulysses_out, n = all_to_all(ulysses_heads, split_axis=0, concat_axis=1)  # back to (T/R, H, d)
ulysses_sent_bytes = (sent + n) * BF16
# the same per-head arithmetic as full attention, so the difference is often exactly 0
ulysses_diff = np.abs(np.concatenate(ulysses_out) - full_out).max()
# --8<-- [end:ulysses]

# %% [markdown]
# ## 4. Ring: K/V blocks go round, partial softmaxes merge by log-sum-exp
#
# Each rank keeps its queries and, R times, attends to the K/V block it holds, then passes
# that block to the next rank (R-1 sends). Two partial results over disjoint keys merge
# exactly: `lse = logaddexp(lse_a, lse_b)`, `out = out_a exp(lse_a - lse) + out_b exp(lse_b -
# lse)` (diffusers writes the same as `out_a - sigmoid(lse_b - lse_a) (out_a - out_b)`).
# Bytes a rank sends per layer: sends of a K and a V block of T/R x H x d:
# `2 (R-1) (T/R) H d * 2` bytes, which tends to `4 T H d` as R grows: ring's traffic per rank
# does not fall, and heads need not divide (in diffusers the tokens must too, unless
# `ring_anything=True` cuts unequal shares). A send can
# hide behind the attention of the block in hand if that block is long enough (section 5
# computes a sufficient condition at assumed peak rates).


# %%
# --8<-- [start:ring]
def merge(out_a, lse_a, out_b, lse_b):
    """Softmax over keys A and B from softmaxes over A and over B: (Tq, h, d), (Tq, h)."""
    lse = np.logaddexp(lse_a, lse_b)
    return out_a * np.exp(lse_a - lse)[..., None] + out_b * np.exp(lse_b - lse)[..., None], lse


held = list(zip(k_shards, v_shards, strict=True))  # the K/V block each rank holds now
ring_out = [None] * R
ring_sent = 0
for step in range(R):
    if step:  # every rank sends its block to rank r + 1 and receives rank r - 1's
        held = [held[(r - 1) % R] for r in range(R)]
        ring_sent += held[0][0].size + held[0][1].size
    for r in range(R):
        out, lse = attention(q_shards[r], *held[r])
        ring_out[r] = (out, lse) if step == 0 else merge(*ring_out[r], out, lse)
ring_sent_bytes = ring_sent * BF16
ring_diff = np.abs(np.concatenate([o for o, _ in ring_out]) - full_out).max()
print(f"toy: {T} tokens, {H} heads x {HEAD_DIM}, {R} ranks, float64")
print(f" Ulysses = full attention: max abs difference {ulysses_diff:.1e}; each rank sent {ulysses_sent_bytes:,} bytes (bf16)")  # fmt: skip
print(f" ring    = full attention: max abs difference {ring_diff:.1e}; each rank sent {ring_sent_bytes:,} bytes (bf16)")  # fmt: skip
# --8<-- [end:ring]

# %% [markdown]
# ## 5. Traffic per rank per layer, from the formulas
#
# The toy's counts equal the formulas; then the formulas at the real models' sizes. Per
# rank per attention layer, bf16 (T tokens, H heads of d, R ranks):
# Ulysses `8 T H d / R^2` bytes (4 all-to-alls), ring `4 T H d / R` (R-1 K/V
# sends). Their ratio is R/2: equal at 2 ranks, ring twice Ulysses at 4. Per transformer call
# means all layers once; a step with two guidance branches makes two calls.
#
# When can a rotating ring hide its sends? A block's attention is `4 (T/R)^2 H d` FLOPs (QK^T
# and PV), its K/V send `4 (T/R) H d` bytes, so at these assumed peak rates the send takes no
# longer than the attention once `T/R >= peak FLOP/s / link bytes/s`: the block-size condition
# of Ring Attention (Liu et al. 2023); real kernels and links run below peak. Long videos pass it; a 1024 px image split many ways does not.


# %%
# --8<-- [start:traffic]
def ulysses_bytes(tokens, heads, head_dim, ranks):
    """4 all-to-alls (Q, K, V, O), each sending (R-1)/R of a (T/R, H, d) bf16 shard."""
    return 4 * (ranks - 1) * tokens * heads * head_dim * BF16 // ranks**2


def ring_bytes(tokens, heads, head_dim, ranks):
    """R-1 sends of one K and one V block of (T/R, H, d), bf16."""
    return 2 * (ranks - 1) * tokens * heads * head_dim * BF16 // ranks


assert ulysses_sent_bytes == ulysses_bytes(T, H, HEAD_DIM, R)  # the toy sent what the formula says
assert ring_sent_bytes == ring_bytes(T, H, HEAD_DIM, R)
RANKS = [2, 4, 8]
print("\nMB each rank sends per attention layer (bf16), and per transformer call (all layers):")
print(" model                  | tokens | ranks | Ulysses MB | ring MB | per call: Ulysses MB, ring MB")  # fmt: skip
for m in (FLUX, WAN):
    for r in RANKS:
        u, g = (f(m["tokens"], m["heads"], m["head_dim"], r) / 1e6 for f in (ulysses_bytes, ring_bytes))  # fmt: skip
        print(f" {m['name']:22s} | {m['tokens']:6,d} | {r:5d} | {u:10,.1f} | {g:7,.1f} | "
              f"{u * m['layers']:,.0f}, {g * m['layers']:,.0f}")  # fmt: skip

# a rotating ring's block: attention 4 (T/R)^2 H d FLOPs against a send of 4 (T/R) H d bytes
min_block_tokens = args.tflops * 1e12 / (args.link_gbs * 1e9)  # peak FLOP/s / link bytes/s
print(f"\nring overlap at these assumed peak rates: a block's K/V send hides behind its attention once T/R >= {args.tflops:g} TFLOP/s / {args.link_gbs:g} GB/s = {min_block_tokens:,.0f} tokens")  # fmt: skip
print(" model                  | ranks | T/R tokens | block attention us | block send us | send / attention")  # fmt: skip
for m in (FLUX, WAN):
    for r in RANKS:
        block, width = m["tokens"] // r, m["heads"] * m["head_dim"]
        attend_us = 4 * block**2 * width / (args.tflops * 1e12) * 1e6
        send_us = 4 * block * width / (args.link_gbs * 1e9) * 1e6
        verdict = "hidden" if block >= min_block_tokens else "exposed"
        print(f" {m['name']:22s} | {r:5d} | {block:10,d} | {attend_us:18,.1f} | {send_us:13,.1f} | {send_us / attend_us:5.2f} {verdict}")  # fmt: skip
# --8<-- [end:traffic]

# %% [markdown]
# ## 6. Paper scale: what each rank holds
#
# Per rank, bf16: the residual stream `(T/R, H d)`; the attention working set per layer:
# Ulysses holds Q, K, V, O as `(T, H/R, d)` (the same bytes as four token shards); a
# rotating ring holds its Q and O shards and two K/V blocks (the one in use and the one
# arriving); diffusers 0.42.1's ring all-gathers every rank's K and V at once, so it holds
# the whole `(T, H, d)` K and V. The score matrix, if materialised, is `H/R x T x T` for
# Ulysses: why memory-efficient attention kernels, which never materialise it, are a
# precondition here.


# %%
# --8<-- [start:paper]
def gb(n):
    return n / 1e9


print("\nper rank, bf16: GB held (residual stream; attention set: Ulysses / rotating ring / all-gather ring, of which the gathered K and V; scores if materialised)")  # fmt: skip
for m in (FLUX, WAN):
    width = m["heads"] * m["head_dim"]
    for r in RANKS:
        shard = m["tokens"] // r * width * BF16  # one (T/R, H d) tensor
        whole_kv = 2 * m["tokens"] * width * BF16  # the whole K and V, (T, H, d) each
        sets = (4 * shard, 6 * shard, 2 * shard + whole_kv)
        scores = m["heads"] // r * m["tokens"] ** 2 * BF16
        print(f" {m['name']:22s} R={r}: {m['tokens'] // r:6,d} tokens, stream {gb(shard):.3f}; "
              f"attention {' / '.join(f'{gb(s):.3f}' for s in sets)} (K and V {gb(whole_kv):.3f}); scores {gb(scores):,.1f}")  # fmt: skip
# context parallelism replicates the weights: every rank holds the whole transformer
for name in ("Flux.1-dev", "Wan 2.1 T2V 14B"):
    (row,) = [c for c in model_sizes.rows(name) if c["component"] == "transformer"]
    print(f" weights on every rank: {name} transformer {row['params']:,} parameters, {gb(row['bytes']['bf16']):.1f} GB in bf16")  # fmt: skip
# --8<-- [end:paper]

# %% [markdown]
# ## 7. Four ways to use 2 or 4 GPUs, for a model that runs two guidance branches
#
# A step with classifier-free guidance runs the denoiser on uncond and cond: FluxPipeline
# (true CFG) and WanPipeline make two batch-1 calls a step, one after the other (SD-style
# pipelines make one batch-2 call; the roofline time is the same). Data parallel gives each
# GPU its own request: no traffic, the same latency, more images per second. CFG-parallel puts uncond on one GPU and cond on the other; after each
# step one all-gather of `noise_pred` (B, tokens, channels) lets both compute
# `uncond + scale (cond - uncond)` (WanPipeline's `guidance_scale`, FluxPipeline's `true_cfg_scale`). Context parallel splits the tokens with Ulysses.
# A call's time is its FLOPs at the peak rate (a roofline: real kernels are slower, and a
# small shard uses a GPU less well); traffic is not overlapped (an upper bound). FLUX.1-dev
# is guidance-distilled and runs one branch; with `true_cfg_scale > 1` and a negative prompt
# FluxPipeline runs two (see the CFG section).


# %%
# --8<-- [start:schemes]
call_s = FLUX["call_flops"] / (args.tflops * 1e12)  # one batch-1 call, seconds
link = args.link_gbs * 1e9  # bytes per second
# noise_pred (1, 4096, 64): packed latents, 16 channels x a 2 x 2 patch per token
noise_pred_bytes = model_sizes.flux_1024px()["image_tokens"] * 64 * BF16


def ulysses_step_comm(ranks, calls):
    """Seconds of Ulysses traffic in a step of ``calls`` transformer calls."""
    return calls * FLUX["layers"] * ulysses_bytes(FLUX["tokens"], FLUX["heads"], FLUX["head_dim"], ranks) / link  # fmt: skip


schemes = {  # name: (GPUs, compute seconds per step for one image, traffic seconds, images in flight)
    "1 GPU, 2 calls a step": (1, 2 * call_s, 0.0, 1),
    "data parallel": (2, 2 * call_s, 0.0, 2),
    "CFG-parallel": (2, call_s, noise_pred_bytes / link, 1),
    "Ulysses 2": (2, call_s, ulysses_step_comm(2, 2), 1),
    "data parallel x4": (4, 2 * call_s, 0.0, 4),
    "CFG-parallel x Ulysses 2": (
        4,
        call_s / 2,
        ulysses_step_comm(2, 1) + noise_pred_bytes / link,
        1,
    ),
    "Ulysses 4": (4, call_s / 2, ulysses_step_comm(4, 2), 1),
}
print(f"\nFLUX.1-dev 1024 px with two branches, {args.steps} steps, {args.tflops:g} TFLOP/s, {args.link_gbs:g} GB/s (a model, not a measurement):")  # fmt: skip
print(" scheme                   | GPUs | s per image | images/s | traffic share of the step")
for name, (gpus, compute_s, comm_s, inflight) in schemes.items():
    latency = args.steps * (compute_s + comm_s)  # seconds for one image
    print(f" {name:24s} | {gpus:4d} | {latency:11.2f} | {inflight / latency:8.2f} | {comm_s / (compute_s + comm_s):6.1%}")  # fmt: skip
print(f" noise_pred all-gather: {noise_pred_bytes / 1e6:.2f} MB a step; one Ulysses layer at 2 ranks, both calls: {2 * ulysses_bytes(FLUX['tokens'], FLUX['heads'], FLUX['head_dim'], 2) / 1e6:.1f} MB")  # fmt: skip
# --8<-- [end:schemes]

# %% [markdown]
# ## 8. Figure

# %%
# --8<-- [start:figures]
sweep = np.array([2, 4, 8, 16])
series = {}
for m in (FLUX, WAN):
    short = m["name"].split(",")[0]
    series[f"Ulysses, {short}"] = (sweep, np.array([ulysses_bytes(m["tokens"], m["heads"], m["head_dim"], int(r)) / 1e6 for r in sweep]))  # fmt: skip
    series[f"ring, {short}"] = (sweep, np.array([ring_bytes(m["tokens"], m["heads"], m["head_dim"], int(r)) / 1e6 for r in sweep]))  # fmt: skip
chart = figures.line_chart(series, xlabel="ranks (GPUs sharing one sequence)", ylabel="MB sent per rank per layer", logx=True, logy=True, markers=True)  # fmt: skip
f2, f16 = (series["ring, FLUX.1-dev"][1][i] / series["Ulysses, FLUX.1-dev"][1][i] for i in (0, 3))
figures.save(args.figures, "traffic-per-rank", chart, alt=f"Log-log line chart of megabytes each rank sends per attention layer against 2 to 16 ranks, for FLUX.1-dev at 1024 px ({FLUX['tokens']:,} tokens) and Wan 2.1 14B for 5 s of 720p ({WAN['tokens']:,} tokens): Ulysses falls as ranks grow, ring levels off; the two are equal at 2 ranks (ratio {f2:.0f}), and ring sends {f16:.0f} times what Ulysses sends at 16.", caption="Bytes each rank sends per attention layer, from the formulas the toy's counts check (bf16). Ulysses at 16 ranks divides neither FLUX.1-dev's 24 heads nor Wan 2.1's 40: those points show the formula only.")  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(chart))
# --8<-- [end:figures]
