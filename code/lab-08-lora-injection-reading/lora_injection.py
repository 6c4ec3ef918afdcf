"""Lab 08: how is a LoRA injected into a UNet, scaled, stacked and fused, and what does it cost?

The state is a weight matrix, not an activation: a LoRA replaces a frozen
``W`` ``(d_out, d_in)`` of a Linear layer by ``W + (alpha / r) * B @ A`` with
``A`` ``(r, d_in)`` and ``B`` ``(d_out, r)``. ``B`` starts at zero, so a fresh
adapter returns the base output exactly. Unfused, every call runs two thin extra
matmuls; fused, the delta sits inside ``W`` and costs nothing per step, but the
strength can no longer change per call. The trade-off is flexibility against
per-step compute, for a delta that is a small fraction of the base weights.

Run it:  python3 code/lab-08-lora-injection-reading/lora_injection.py --rank 4,16,64 --family sdxl
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
    float_list,
    in_notebook,
    int_list,
    parse_args,
)
from labkit.precision import round_to

# %% [markdown]
# ## 1. Setup / contract
#
# In: the ranks to size (`--rank 4,8,...`), the model families to size (`--family`),
# the LoRA's `lora_alpha` (`--alpha`; by default equal to the demo rank, so
# `scaling` is 1, as `load_lora_weights` sets it for a file without alpha keys or adapter
# metadata) and the strengths to try (`--scales`). The two UNet configs are the published
# `unet/config.json` of runwayml/stable-diffusion-v1-5 and
# stabilityai/stable-diffusion-xl-base-1.0 (the same values as
# `tests/verify/model_configs.py`), reduced to the keys that shape attention.
# Weights follow torch's `nn.Linear` layout: `W` is `(d_out, d_in)` and `y = x @ W.T`.

# %%
# --8<-- [start:setup]
CONFIGS = {
    "sd15": dict(  # runwayml/stable-diffusion-v1-5 unet/config.json
        name="SD 1.5",
        block_out_channels=(320, 640, 1280, 1280),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        layers_per_block=2,
        transformer_layers_per_block=1,  # one BasicTransformerBlock per attention slot
        attention_head_dim=8,  # the number of heads (a diffusers naming quirk); head width C/8
        cross_attention_dim=768,  # CLIP ViT-L/14: prompt_embeds (B, 77, 768)
    ),
    "sdxl": dict(  # stabilityai/stable-diffusion-xl-base-1.0 unet/config.json
        name="SDXL",
        block_out_channels=(320, 640, 1280),
        down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * 2,
        up_block_types=("CrossAttnUpBlock2D",) * 2 + ("UpBlock2D",),
        layers_per_block=2,
        transformer_layers_per_block=(1, 2, 10),  # per level; the mid block uses the last
        attention_head_dim=(5, 10, 20),  # head counts: C / 64, so every head is 64 wide
        cross_attention_dim=2048,  # CLIP ViT-L (768) + OpenCLIP bigG (1280), concatenated
    ),
}
FP16_BYTES = 2

parser = LabArgumentParser(prog="lora_injection.py", description=__doc__.splitlines()[0])
parser.add_argument("--rank", type=int_list, default=[4, 8, 16, 32, 64, 128],
                    help="LoRA ranks r, comma-separated (the first one is used in the demos)")  # fmt: skip
parser.add_argument("--family", default="sd15,sdxl", help="comma-separated: sd15, sdxl")
parser.add_argument("--alpha", type=float_list(1e-6), default=None,
                    help="lora_alpha (> 0); default: the demo rank, so scaling = 1")  # fmt: skip
parser.add_argument("--scales", type=float_list(0.0), default=[0.0, 0.25, 0.5, 1.0, 1.5],
                    help="LoRA strengths to try, comma-separated, each >= 0")  # fmt: skip
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)
if min(args.rank) < 1:
    parser.error(f"--rank values must be >= 1 (a rank-0 LoRA has no A or B), got {args.rank}")
families = [f.strip() for f in args.family.split(",") if f.strip()]
unknown = [f for f in families if f not in CONFIGS]
if unknown or not families:
    parser.error(f"unknown --family {unknown or args.family!r}: choose from {', '.join(CONFIGS)}")
if args.alpha is not None and len(args.alpha) != 1:
    parser.error(f"--alpha takes one value, got {args.alpha}")
rank = args.rank[0]
alpha = float(rank) if args.alpha is None else args.alpha[0]
# the demo layer: the first cross-attention to_k of the first family (SDXL's level 0 has none)
DEMO_LAYER = {"sd15": ("SD 1.5 level-0 attn2.to_k", 768, 320),
              "sdxl": ("SDXL level-1 attn2.to_k", 2048, 640)}  # fmt: skip
demo_name, d_in, d_out = DEMO_LAYER[families[0]]
if rank > d_out:
    parser.error(
        f"--rank {rank} is larger than the demo layer's width {d_out}; use a rank <= {d_out}"
    )
rng = np.random.default_rng(args.seed)
print(f"ranks {args.rank}, lora_alpha {alpha:g}, families {families}; demo rank r = {rank}")
# --8<-- [end:setup]

# %% [markdown]
# ## 2. The LoRA Linear: base output plus a scaled low-rank branch
#
# peft's `lora.Linear.forward` computes
# `base_layer(x) + lora_B(lora_A(dropout(x))) * scaling`, with
# `scaling = lora_alpha / r` at creation. `fuse_lora` / peft's `merge` instead adds
# `scaling * B @ A` into `base_layer.weight`. The layer here is the `to_k` of the
# first family's first cross-attention (`attn2`): for SD 1.5 it maps `prompt_embeds`
# `(1, 77, 768)` to keys `(1, 77, 320)`, for SDXL `(1, 77, 2048)` to `(1, 77, 640)`.


# %%
# --8<-- [start:lora_linear]
def lora_delta(lora_A, lora_B, alpha, r, scale=1.0):
    """(d_out, d_in) weight change: scale * (alpha / r) * B @ A."""
    return (scale * alpha / r) * (lora_B @ lora_A)


def lora_linear(x, weight, bias, lora_A, lora_B, alpha, r, scale=1.0):
    """Unfused: (..., d_in) -> (..., d_out) = x W^T + b + scale * (alpha / r) * (x A^T) B^T."""
    base = x @ weight.T + (0 if bias is None else bias)  # the frozen layer's own output
    low = x @ lora_A.T  # (..., r): the thin bottleneck
    return base + (scale * alpha / r) * (low @ lora_B.T)  # (..., d_out)


def fused_weight(weight, lora_A, lora_B, alpha, r, scale=1.0):
    """Fused: W' = W + scale * (alpha / r) * B @ A, same shape as W; no extra matmul after."""
    return weight + lora_delta(lora_A, lora_B, alpha, r, scale)


prompt_embeds = rng.standard_normal((1, 77, d_in), dtype=np.float32)  # (B, 77, d_in)
weight = rng.standard_normal((d_out, d_in), dtype=np.float32) / d_in**0.5  # to_k, no bias
# lora_A is random at init: it only needs to span r directions
lora_A = rng.standard_normal((rank, d_in), dtype=np.float32) / d_in**0.5  # noqa: N816 (peft's name)
# lora_B is zero at init, so the delta B @ A is exactly 0
lora_B = np.zeros((d_out, rank), np.float32)  # noqa: N816 (peft's name)
key_base = prompt_embeds @ weight.T  # (1, 77, d_out)
key_init = lora_linear(prompt_embeds, weight, None, lora_A, lora_B, alpha, rank)
print(f"{demo_name}: prompt_embeds {prompt_embeds.shape} @ W.T {weight.T.shape} -> "
      f"key {key_base.shape}; lora_A {lora_A.shape}, lora_B {lora_B.shape}")  # fmt: skip
print(f"B = 0 at init: LoRA output == base output exactly: {np.array_equal(key_init, key_base)}")
# --8<-- [end:lora_linear]

# %% [markdown]
# ## 3. Fused against unfused
#
# A trained adapter has nonzero `B`. The unfused path computes the branch on the
# activations, the fused path on the weights; in exact arithmetic they are equal, in
# float32 they differ by rounding only. Measured, as a max absolute difference.

# %%
# --8<-- [start:fuse]
# a "trained" adapter: lora_B no longer zero
lora_B = rng.standard_normal((d_out, rank), dtype=np.float32) * 0.05  # noqa: N816 (peft's name)
key_unfused = lora_linear(prompt_embeds, weight, None, lora_A, lora_B, alpha, rank)
weight_fused = fused_weight(weight, lora_A, lora_B, alpha, rank)  # (d_out, d_in), as W
key_fused = prompt_embeds @ weight_fused.T  # plain Linear: no lora_A / lora_B call
fuse_gap = float(np.abs(key_fused - key_unfused).max())
lora_effect = float(np.abs(key_unfused - key_base).max())
weight_back = weight_fused - lora_delta(lora_A, lora_B, alpha, rank)  # unfuse: subtract it
print(f"scaling = lora_alpha / r = {alpha:g} / {rank} = {alpha / rank:g}")
print(f"max |fused - unfused| = {fuse_gap:.2e}  (float32 rounding; the LoRA moves the keys "
      f"by up to {lora_effect:.3f})")  # fmt: skip
print(f"unfuse restores W: max |W - (W' - delta)| = {np.abs(weight_back - weight).max():.2e}")
# --8<-- [end:fuse]

# %% [markdown]
# ## 4. Strength: `set_adapters` weights and `cross_attention_kwargs={"scale": s}`
#
# Both multiply peft's per-layer `scaling`:
#
# - `set_adapters(["a", "b"], adapter_weights=[w1, w2])` calls peft's
#   `set_scale(name, w)`: `scaling[name] = w * lora_alpha / r`, persistently.
#   Each active adapter adds its own branch, so the deltas add with their weights.
# - `cross_attention_kwargs={"scale": s}`: diffusers' `apply_lora_scale` decorator on
#   `UNet2DConditionModel.forward` pops `"scale"`, calls `scale_lora_layers(unet, s)`
#   (`scaling *= s` in every LoRA layer), runs the forward, then
#   `unscale_lora_layers(unet, s)` (`scaling /= s`; at s = 0 a reset to `lora_alpha / r`)
#   in a `finally`. The pipeline's `lora_scale` does the same for the text encoder
#   inside `encode_prompt`.
#
# So one layer's output is `base + sum_a s * w_a * (alpha_a / r_a) * B_a A_a x`.


# %%
# --8<-- [start:stack]
def stacked_linear(x, weight, adapters, adapter_weights, scale=1.0):
    """Several active adapters: base + sum of each branch, times its weight and the scale."""
    out = x @ weight.T
    for (a, b, alpha_i, r_i), w in zip(adapters, adapter_weights, strict=True):
        out = out + (scale * w * alpha_i / r_i) * ((x @ a.T) @ b.T)
    return out


rank_b = 2 * rank  # a second adapter of another rank and alpha
adapter_a = (lora_A, lora_B, alpha, rank)
adapter_b = (rng.standard_normal((rank_b, d_in), dtype=np.float32) / d_in**0.5,
             rng.standard_normal((d_out, rank_b), dtype=np.float32) * 0.05, 2 * alpha, rank_b)  # fmt: skip
w1, w2 = 0.7, 0.3
key_stacked = stacked_linear(prompt_embeds, weight, [adapter_a, adapter_b], [w1, w2])
weight_sum = (
    weight
    + lora_delta(*adapter_a[:2], alpha, rank, w1)
    + lora_delta(*adapter_b[:2], 2 * alpha, rank_b, w2)
)  # fuse_lora of both active adapters at their weights
stack_gap = float(np.abs(prompt_embeds @ weight_sum.T - key_stacked).max())
print(f"set_adapters(['a', 'b'], adapter_weights=[{w1}, {w2}]): ranks {rank} and {rank_b}, "
      f"alphas {alpha:g} and {2 * alpha:g}")  # fmt: skip
print(f"  W + {w1}*delta_a + {w2}*delta_b against the two branches: max gap {stack_gap:.2e}")

delta_out = key_unfused - key_base  # the branch at scale 1
print(f"{'scale':>6} {'peft scaling':>12} {'max |y - base|':>15} {'/ scale':>9}")
scale_effect = []
for s in args.scales:
    y = lora_linear(prompt_embeds, weight, None, lora_A, lora_B, alpha, rank, scale=s)
    moved = float(np.abs(y - key_base).max())
    scale_effect.append(moved)
    ratio = f"{moved / s:.4f}" if s > 0 else "-"
    print(f"{s:>6g} {s * alpha / rank:>12g} {moved:>15.4f} {ratio:>9}")
print(f"the output moves linearly in the scale: y(s) - base = s * {np.abs(delta_out).max():.4f} "
      f"at most; s = 0 gives the base model back")  # fmt: skip
# --8<-- [end:stack]

# %% [markdown]
# ## 5. Changing the strength of a fused LoRA: what the layer remembers
#
# diffusers' `fuse_lora(lora_scale=s)` calls peft's `scale_layer(s)` (`scaling *= s`)
# and then `merge` (`W += scaling * B @ A`); nothing divides `scaling` back.
# `unfuse_lora()` subtracts `scaling * B @ A` with whatever `scaling` is at that
# moment. `set_adapters(name, w)` sets `scaling = w * lora_alpha / r` outright, and a
# call with `cross_attention_kwargs={"scale": 0}` resets it to `lora_alpha / r`. The
# layer below is that state: `W` and `scaling`, nothing else.


# %%
# --8<-- [start:fuse_scale]
def fuse_lora(layer, lora_scale=1.0):
    """peft's scale_layer then merge: the scale stays multiplied into `scaling`."""
    layer["scaling"] *= lora_scale
    layer["W"] = layer["W"] + layer["scaling"] * layer["BA"]


def unfuse_lora(layer):
    """peft's unmerge: subtract the delta at the *current* scaling."""
    layer["W"] = layer["W"] - layer["scaling"] * layer["BA"]


def set_adapters(layer, weight):
    """peft's set_scale: an absolute weight, scaling = weight * lora_alpha / r."""
    layer["scaling"] = weight * alpha / rank


def merged_strength(layer):
    """How many unit deltas (lora_alpha / r) * B @ A sit in W now (least squares)."""
    unit = (alpha / rank) * layer["BA"]
    return float(((layer["W"] - weight) * unit).sum() / (unit * unit).sum())


layer = {"W": weight, "BA": lora_B @ lora_A, "scaling": alpha / rank}
fuse_lora(layer, 0.5)
unfuse_lora(layer)
unfused_strength = layer["scaling"] * rank / alpha  # what an unfused call now runs at
fuse_lora(layer, 0.8)
print(f"fuse_lora(lora_scale=0.5), unfuse_lora(), fuse_lora(lora_scale=0.8): merged at "
      f"{merged_strength(layer):.2f}, not 0.8; unfused in between it ran at {unfused_strength:.2f}")  # fmt: skip
unfuse_lora(layer)
set_adapters(layer, 0.8)  # the fix: set the weight, then fuse at lora_scale=1
fuse_lora(layer)
print(f"unfuse_lora(), set_adapters(w=0.8), fuse_lora(): merged at {merged_strength(layer):.2f}")
unfuse_lora(layer)
set_adapters(layer, 0.5)
fuse_lora(layer)
layer["scaling"] = alpha / rank  # one call with cross_attention_kwargs={"scale": 0}
unfuse_lora(layer)
print(f"set_adapters(w=0.5), fuse_lora(), a scale-0 call, unfuse_lora(): W is left at "
      f"{merged_strength(layer):+.2f} deltas from the base weights")  # fmt: skip
# --8<-- [end:fuse_scale]

# %% [markdown]
# ## 6. Fusing in bf16: the base weights drift
#
# peft's `merge` adds the delta into `base_layer.weight` in place, in the weights'
# dtype (on CPU it computes `B @ A` in float32 and rounds it to bf16 first), and
# `unmerge` subtracts it the same way. Each add and subtract rounds to bf16, so a
# fuse/unfuse cycle does not bring `W` back, and the error grows with every cycle.
# `round_to(x, "bf16")` is torch's round-to-nearest-even cast. A slice of 8 rows of
# the demo layer keeps this fast.


# %%
# --8<-- [start:bf16]
def fuse_unfuse_cycle(w, delta):
    """One fuse_lora() and unfuse_lora() in bf16: W += delta, then W -= delta, each rounded."""
    w = round_to(w + delta, "bf16")  # merge: in place, in the weights' dtype
    return round_to(w - delta, "bf16")  # unmerge


strengths = (1.0, 0.5, 0.8)  # set_adapters weights fused in turn: a server switching strengths
w_bf16 = round_to(weight[:8], "bf16")  # 8 rows of W, as a bf16 pipeline holds them
deltas_bf16 = [round_to(lora_delta(lora_A, lora_B[:8], alpha, rank, w), "bf16") for w in strengths]
print(f"bf16 fuse/unfuse at strengths {strengths} in turn:")
print(f"{'cycles':>7} {'weights changed':>16} {'max |W - W0|':>13} {'mean |W - W0|':>14}")
w = w_bf16
for cycle in range(30):
    w = fuse_unfuse_cycle(w, deltas_bf16[cycle % len(strengths)])
    if cycle + 1 in (1, 3, 10, 30):
        drift = w - w_bf16
        print(f"{cycle + 1:>7} {np.mean(drift != 0):>16.1%} {np.abs(drift).max():>13.2e} "
              f"{np.abs(drift).mean():>14.2e}")  # fmt: skip
# --8<-- [end:bf16]

# %% [markdown]
# ## 7. Where the targets are: attention projections from the UNet config
#
# `UNet2DConditionModel.__init__` builds, per level `i`: a `CrossAttnDownBlock2D`
# with `layers_per_block` attentions of `transformer_layers_per_block[i]`
# `BasicTransformerBlock`s each; a mid block with `transformer_layers_per_block[-1]`;
# and each `CrossAttnUpBlock2D` with `layers_per_block + 1` attentions, using the
# reversed per-level list. Every transformer block has `attn1` (self: `to_q`,
# `to_k`, `to_v` all `C -> C`) and `attn2` (cross: `to_q` `C -> C`, `to_k` and `to_v`
# `cross_attention_dim -> C`), each with `to_out.0` `C -> C`. The inner width
# `heads * head_dim` equals `C` in both families.


# %%
# --8<-- [start:shapes]
def per_level(value, n):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * n


def attention_projections(config):
    """(module, d_in, d_out) for every to_q, to_k, to_v, to_out.0 in the UNet."""
    channels = config["block_out_channels"]
    layers = per_level(config["transformer_layers_per_block"], len(channels))
    cross = config["cross_attention_dim"]
    blocks = []  # (channels C, number of BasicTransformerBlocks)
    for i, block in enumerate(config["down_block_types"]):
        if block.startswith("CrossAttn"):
            blocks.append((channels[i], config["layers_per_block"] * layers[i]))
    blocks.append((channels[-1], layers[-1]))  # UNetMidBlock2DCrossAttn
    for j, block in enumerate(config["up_block_types"]):
        level = len(channels) - 1 - j  # up blocks walk the levels in reverse
        if block.startswith("CrossAttn"):
            blocks.append((channels[level], (config["layers_per_block"] + 1) * layers[level]))
    out = []
    for c, n in blocks:
        for _ in range(n):
            out += [("attn1.to_q", c, c), ("attn1.to_k", c, c), ("attn1.to_v", c, c),
                    ("attn1.to_out.0", c, c), ("attn2.to_q", c, c), ("attn2.to_k", cross, c),
                    ("attn2.to_v", cross, c), ("attn2.to_out.0", c, c)]  # fmt: skip
    return out


def lora_params(projections, r):
    """LoRA parameters: r * (d_in + d_out) per adapted Linear (A and B, no bias)."""
    return sum(r * (i + o) for _, i, o in projections)


unet_params = {r["pipeline"]: r["params"] for r in model_sizes.rows() if r["component"] == "unet"}
lora_counts, n_adapted = {}, {}  # (family, rank) -> parameters; family -> adapted Linears
for family in families:
    config = CONFIGS[family]
    projections = attention_projections(config)
    n_adapted[family] = len(projections)
    base = sum(i * o for _, i, o in projections)  # the projections' weights (biases aside)
    n_blocks = len(projections) // 8
    print(f"{config['name']}: {n_blocks} transformer blocks, {len(projections)} adapted Linears "
          f"(to_q, to_k, to_v, to_out.0), their weights {base:,} params; "
          f"UNet {unet_params[config['name']]:,}")  # fmt: skip
    print(f"{'rank':>6} {'LoRA params':>12} {'fp16 bytes':>12} {'MiB':>8} "
          f"{'% of projections':>17} {'% of UNet':>10}")  # fmt: skip
    for r in args.rank:
        n = lora_params(projections, r)
        lora_counts[(family, r)] = n
        print(f"{r:>6} {n:>12,} {n * FP16_BYTES:>12,} {n * FP16_BYTES / 2**20:>8.2f} "
              f"{n / base:>17.2%} {n / unet_params[config['name']]:>10.2%}")  # fmt: skip
# --8<-- [end:shapes]

# %% [markdown]
# ## 8. Cost per step: parameters change, the condition does not
#
# A LoRA adds no input: the same `latents`, timestep and `prompt_embeds` go in. Per
# token, the base Linear costs `d_in * d_out` multiply-adds; the unfused branch
# adds `r * (d_in + d_out)` (`lora_A`, then `lora_B`), in four more ops (two matmuls, the
# multiply by `scaling`, the add); fused, it adds nothing, because `W'` has the shape of `W`.

# %%
# --8<-- [start:flops]
all_shapes = {
    "sd15": [
        ("SD 1.5 level-0 to_q", 320, 320),
        ("SD 1.5 level-0 attn2.to_k", 768, 320),
        ("SD 1.5 level-2 to_q", 1280, 1280),
    ],
    "sdxl": [("SDXL level-1 to_q", 640, 640), ("SDXL level-2 attn2.to_k", 2048, 1280)],
}
layer_shapes = [row for f in families for row in all_shapes[f]]  # only the families asked
print(f"{'layer':>26} {'d_in x d_out':>12} {'base MACs/token':>16} {'rank':>5} "
      f"{'LoRA MACs/token':>16} {'unfused extra':>14} {'fused extra':>12}")  # fmt: skip
for name, i, o in layer_shapes:
    for r in sorted({args.rank[0], args.rank[-1]}):  # the smallest and largest rank asked
        extra = r * (i + o)
        print(f"{name:>26} {f'{i}x{o}':>12} {i * o:>16,} {r:>5} {extra:>16,} "
              f"{extra / (i * o):>14.2%} {0:>12}")  # fmt: skip
EXTRA_OPS = 4  # peft's unfused forward: lora_A and lora_B matmuls, the * scaling, the add
for f in families:
    print(f"{CONFIGS[f]['name']} unfused: {EXTRA_OPS} more ops per adapted Linear (lora_A, "
          f"lora_B, * scaling, +), {EXTRA_OPS * n_adapted[f]:,} per UNet call; fused: 0")  # fmt: skip
# --8<-- [end:flops]

# %% [markdown]
# ## 9. Picture it
#
# Delta size in fp16 bytes against rank for each family, on log axes (a straight
# line of slope 1: the size is linear in `r`), and the output change against the scale.

# %%
# --8<-- [start:figures]
ranks = sorted(set(args.rank))  # x must increase along each line
series = {
    CONFIGS[f]["name"]: (
        np.array(ranks, float),
        np.array([lora_counts[(f, r)] * FP16_BYTES for r in ranks], float),
    )
    for f in families
}
chart = figures.line_chart(series, "rank r", "LoRA size, fp16 bytes", logx=len(ranks) > 1,
                           logy=True, markers=True)  # fmt: skip
names = " and ".join(CONFIGS[f]["name"] for f in families)
figures.save(
    args.figures, "lora-bytes", chart,
    alt=f"Log-log line chart of the fp16 size in bytes of a LoRA on every to_q, to_k, to_v and "
    f"to_out.0 of the UNet, against the rank from {ranks[0]} to {ranks[-1]}, for {names}. The "
    "lines are straight with slope one: doubling the rank doubles the size. SDXL's line lies "
    "above SD 1.5's because SDXL has more and wider attention projections.",
    caption="LoRA delta size (fp16 bytes) against rank, attention projections only.",
)  # fmt: skip
scale_chart = figures.line_chart(
    {"max |y(s) - base|": (np.array(args.scales), np.array(scale_effect))},
    "scale s", "max |LoRA output - base output|", markers=True,
)  # fmt: skip
figures.save(
    args.figures, "lora-scale", scale_chart,
    alt="Line chart of the largest change a LoRA makes to the to_k output against the LoRA "
    "scale. The points lie on a straight line through the origin: scale 0 gives the base "
    "output and the change grows in proportion to the scale.",
    caption="Output change of one LoRA layer against the scale (cross_attention_kwargs).",
)  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(chart))
    display(SVG(scale_chart))
# --8<-- [end:figures]
