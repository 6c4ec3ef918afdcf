"""Lab 10: what does each memory switch of a diffusers pipeline save, and what does it cost?

Five switches: attention slicing (``pipe.enable_attention_slicing``), VAE tiling
(``pipe.vae.enable_tiling``) and lower precision (``dtype=``), measured on small NumPy
stand-ins and scaled to real models by arithmetic on shapes, and CPU offload
(``pipe.enable_model_cpu_offload`` / ``pipe.enable_sequential_cpu_offload``), counted in bytes
from the real weight sizes, not measured. Slicing and
tiling trade time for a smaller peak of one intermediate; precision halves weights and
activations (not SDXL's VAE decode, run in float32, nor T5's wo under float16) and adds
rounding error; offload trades GPU bytes for bytes over the PCIe bus on every call.

Run it:  python3 code/lab-10-memory-optimization-reading/memory_optimization.py --slice-sizes 16,8,4,2,1
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
    float_list,
    in_notebook,
    int_at_least,
    int_list,
    parse_args,
)
from labkit.memory import peak_bytes  # tracemalloc peak of one call
from labkit.metrics import sample_quality
from labkit.precision import round_to  # nearest-even, as torch's CPU casts of float32
from labkit.schedulers import DDIMScheduler

DTYPES = ("float64", "float32", "float16", "bfloat16")

# %% [markdown]
# ## 1. Setup / contract
#
# Attention runs on `query, key, value` of shape `(B * heads, N, d)` float32, the layout
# diffusers' `Attention.head_to_batch_dim` produces; B = 2 is the CFG-doubled batch.
# The toy decoder maps latents `(1, 4, S, S)` to images `(1, 3, 2S, 2S)`. Precision runs a
# real DDIM loop on the 2-D Gaussian mixture with its exact denoiser. Offload reads the
# real weight bytes from `labkit.model_sizes`.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="memory_optimization.py", description=__doc__.splitlines()[0])
parser.add_argument("--tokens", type=int_at_least(4), default=256, help="N, attention tokens")
parser.add_argument("--heads", type=int_at_least(1), default=8)
parser.add_argument(
    "--slice-sizes", type=int_list, default=[16, 8, 4, 2, 1], help="(batch*head) rows per slice"
)
parser.add_argument("--latent-size", type=int_at_least(4), default=48, help="toy latent side S")
parser.add_argument("--tile", type=int_at_least(2), default=16, help="latent tile side")
parser.add_argument("--overlap", type=int, default=4, help="latent rows two tiles share")
parser.add_argument("--dtypes", default="float32,float16,bfloat16", help="comma-separated")
parser.add_argument("--steps", type=int_at_least(1), default=30, help="num_inference_steps")
parser.add_argument(
    "--pcie-gbps", type=float_list(0.001), default=[25.0], help="host-to-GPU GB/s (an assumption)"
)
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)

batch_heads = 2 * args.heads  # B = 2 (CFG) times heads
for s in args.slice_sizes:
    if s < 1 or s > batch_heads:
        parser.error(
            f"--slice-sizes: {s} is not in 1..{batch_heads} (B * heads = 2 * {args.heads})"
        )
if args.tokens > 512 or args.heads > 16 or args.latent_size > 128:
    parser.error(
        "--tokens must be <= 512, --heads <= 16 and --latent-size <= 128 (seconds, not hours)"
    )
if not 0 <= args.overlap < args.tile:
    parser.error(f"--overlap must be in 0..{args.tile - 1}: a tile must be larger than its overlap")
stride = int(args.tile * (1 - args.overlap / args.tile))  # as tiled_decode computes them, float
row_limit = 2 * args.tile - int(2 * args.tile * (args.overlap / args.tile))  # rounding included
if row_limit != 2 * stride:  # e.g. --tile 10 --overlap 9 (stride 0), --tile 12 --overlap 5
    parser.error(f"--tile {args.tile} --overlap {args.overlap}: int() rounding gives tiles every {stride} latent rows but keeps {row_limit} image rows of each, not {2 * stride}: the tiles would not fit the image")  # fmt: skip
if args.tile > args.latent_size:
    parser.error(f"--tile {args.tile} is larger than --latent-size {args.latent_size}")
dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
unknown = [d for d in dtypes if d not in DTYPES[1:]]  # float64 is the reference, always run
if unknown or not dtypes:
    parser.error(f"--dtypes: {f'unknown dtype {unknown}' if unknown else 'no dtype given'} (choose from {', '.join(DTYPES[1:])}; float64 is the reference every run is compared with)")  # fmt: skip
if args.steps > 999:
    parser.error("--steps must be <= 999 (at 1000, SD 1.5's shipped PNDMScheduler.step raises IndexError)")  # fmt: skip
if len(args.pcie_gbps) != 1 or args.pcie_gbps[0] > 1000:
    parser.error("--pcie-gbps takes one bandwidth in GB/s, in (0, 1000]")
pcie_gbps = args.pcie_gbps[0]
rng = np.random.default_rng(args.seed)
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
# ## 2. Attention slicing: the same numbers, a smaller score matrix at a time
#
# Naive attention materialises `softmax(q k^T / sqrt(d))`, shape `(B * heads, N, N)`.
# diffusers' `SlicedAttnProcessor` loops over the first axis, `slice_size` rows of
# `B * heads` at a time, so only `(slice_size, N, N)` tensors exist at once (two of them in
# diffusers' `get_attention_scores`: scores and their softmax); softmax is
# per row, so the result is the same. `enable_attention_slicing("auto")` sets
# `slice_size = heads // 2` (`sliceable_head_dim // 2`, two slices per batch element).


# %%
# --8<-- [start:attention]
def softmax(x):
    x = x - x.max(axis=-1, keepdims=True)  # per row: stable, and independent of other rows
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def attention(query, key, value):
    """(BH, N, d) x3 -> (BH, N, d), storing the whole (BH, N, N) score matrix."""
    # a float32 divisor: NumPy 2 would promote the scores to float64 for np.sqrt's float64
    scores = query @ key.transpose(0, 2, 1) / np.float32(np.sqrt(query.shape[-1]))  # (BH, N, N)
    return softmax(scores) @ value


def sliced_attention(query, key, value, slice_size):
    """SlicedAttnProcessor's loop: (slice_size, N, N) scores at a time."""
    out = np.zeros_like(query)  # hidden_states = torch.zeros(...) in diffusers
    for start in range(0, query.shape[0], slice_size):
        s = slice(start, start + slice_size)
        out[s] = attention(query[s], key[s], value[s])
    return out


def chunked_attention(query, key, value, rows):
    """Chunk over query rows instead: (BH, rows, N) scores at a time, same result to rounding."""
    out = np.zeros_like(query)
    for start in range(0, query.shape[1], rows):
        s = slice(start, start + rows)
        out[:, s] = attention(query[:, s], key, value)
    return out


head_dim = 40  # SD 1.5's first level: 320 channels / 8 heads
query, key, value = (rng.standard_normal((batch_heads, args.tokens, head_dim)).astype(np.float32) for _ in range(3))  # fmt: skip
# the least of two calls: a notebook kernel's own threads can add a hundred bytes to a few
# KB to one call's peak (labkit.memory), and the naive peak sits within 2 KB of a rounding
# step of the printed MiB
reference, naive_peak = peak_bytes(attention, query, key, value, repeats=2)
sliced = {}  # slice_size -> (max abs diff to naive, peak bytes)
for s in args.slice_sizes:
    out, peak = peak_bytes(sliced_attention, query, key, value, s, repeats=2)
    sliced[s] = (float(np.abs(out - reference).max()), peak)
out, chunk_peak = peak_bytes(chunked_attention, query, key, value, args.tokens // 4, repeats=2)
chunk_diff = float(np.abs(out - reference).max())
# --8<-- [end:attention]

scores_bytes = batch_heads * args.tokens**2 * 4
print(f"attention: query/key/value ({batch_heads}, {args.tokens}, {head_dim}) float32, B = 2 (CFG) x {args.heads} heads")  # fmt: skip
print(f"full score matrix ({batch_heads}, {args.tokens}, {args.tokens}) float32 = {fmt(scores_bytes)}")  # fmt: skip
rows = [["naive (no slicing)", batch_heads, "0", fmt(naive_peak), "1.00"]]
for s, (diff, peak) in sliced.items():
    rows.append([f"sliced, slice_size={s}", -(-batch_heads // s), f"{diff:.1e}", fmt(peak), f"{peak / naive_peak:.2f}"])  # fmt: skip
rows.append([f"query chunks of {args.tokens // 4} rows", 4, f"{chunk_diff:.1e}", fmt(chunk_peak), f"{chunk_peak / naive_peak:.2f}"])  # fmt: skip
table("Attention, measured with tracemalloc (peak NumPy bytes inside the call)", ["", "slices", "max abs diff", "peak", "of naive"], rows)  # fmt: skip

# --8<-- [start:sd-scores]
sd_rows = []
for px in (512, 1024):
    tokens = (px // 8) ** 2  # highest-resolution self-attention: one token per latent position
    for batch in (1, 2):
        full = batch * 8 * tokens**2 * 2  # (B * 8 heads, N, N) fp16
        auto = (8 // 2) * tokens**2 * 2  # "auto": slice_size = 8 // 2 rows of B * heads
        # get_attention_scores keeps two slice-sized tensors alive: scores and baddbmm's
        # empty input, then scores and softmax (the verify tests count them)
        sd_rows.append([f"{px} px, B={batch}", tokens, f"({batch * 8}, {tokens}, {tokens})", fmt(full), fmt(auto), fmt(2 * auto), fmt(tokens**2 * 2)])  # fmt: skip
# --8<-- [end:sd-scores]
table(
    "SD 1.5 first-level self-attention scores, fp16 (8 heads; B=2 is CFG), from shapes",
    [
        "",
        "tokens",
        "shape",
        "naive",
        'one "auto" slice (4)',
        '"auto", 2 live',
        'one "max" slice (1)',
    ],
    sd_rows,
)

# %% [markdown]
# ## 3. VAE tiling: overlapping tiles, blended, against one whole decode
#
# The toy decoder is spatially local: 2x nearest upsampling, a 3 x 3 convolution to 32
# channels, tanh, a 3 x 3 convolution to 3 channels. `tiled_decode` in diffusers cuts the
# latents into tiles of `tile_latent_min_size` that start every
# `int(tile_latent_min_size * (1 - tile_overlap_factor))` positions, decodes each, blends
# its upper and left neighbours linearly into each tile over
# `blend_extent = int(tile_sample_min_size * tile_overlap_factor)` rows and columns
# (`blend_v`, `blend_h`), and keeps `row_limit = tile_sample_min_size - blend_extent`.

# %%
# --8<-- [start:decoder]
w1 = rng.standard_normal((32, 4, 3, 3)) / 6.0  # conv 4 -> 32 channels, 3 x 3
w2 = rng.standard_normal((3, 32, 3, 3)) / 17.0  # conv 32 -> 3 channels, 3 x 3


def conv3x3(x, w):
    """(1, Cin, H, W) -> (1, Cout, H, W), zero padding like nn.Conv2d(padding=1)."""
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, wd = x.shape[2:]
    return sum(np.einsum("oc,bchw->bohw", w[:, :, i, j], p[:, :, i : i + h, j : j + wd]) for i in range(3) for j in range(3))  # fmt: skip


def decode(z, group_norm=False):
    """Toy decoder (1, 4, S, S) -> (1, 3, 2S, 2S); group_norm uses the input's own statistics."""
    h = conv3x3(z.repeat(2, axis=2).repeat(2, axis=3), w1)  # (1, 32, 2S, 2S): the wide one
    if group_norm:  # like nn.GroupNorm(1, 32): mean and std over the whole feature map
        h = (h - h.mean()) / h.std()
    return conv3x3(np.tanh(h), w2)


# --8<-- [end:decoder]


# --8<-- [start:tiled]
def blend_v(a, b, extent):
    """AutoencoderKL.blend_v: the top rows of b fade in from the bottom rows of a."""
    extent = min(a.shape[2], b.shape[2], extent)
    for y in range(extent):
        b[:, :, y, :] = a[:, :, -extent + y, :] * (1 - y / extent) + b[:, :, y, :] * (y / extent)
    return b


def blend_h(a, b, extent):
    """AutoencoderKL.blend_h: the same along columns."""
    extent = min(a.shape[3], b.shape[3], extent)
    for x in range(extent):
        b[:, :, :, x] = a[:, :, :, -extent + x] * (1 - x / extent) + b[:, :, :, x] * (x / extent)
    return b


def tiled_decode(z, tile, overlap, blend=True, group_norm=False):
    """AutoencoderKL.tiled_decode with tile_latent_min_size = tile and 2x upsampling."""
    factor = overlap / tile  # tile_overlap_factor (diffusers: 0.25)
    stride = int(tile * (1 - factor))  # overlap_size in diffusers
    sample_tile = 2 * tile  # tile_sample_min_size
    extent = int(sample_tile * factor) if blend else 0  # blend_extent
    row_limit = sample_tile - int(sample_tile * factor)
    rows = [[decode(z[:, :, i : i + tile, j : j + tile], group_norm) for j in range(0, z.shape[3], stride)] for i in range(0, z.shape[2], stride)]  # fmt: skip
    out_rows = []
    for i, row in enumerate(rows):
        out_row = []
        for j, t in enumerate(row):
            if i > 0 and extent:
                t = blend_v(rows[i - 1][j], t, extent)
            if j > 0 and extent:
                t = blend_h(row[j - 1], t, extent)
            out_row.append(t[:, :, :row_limit, :row_limit])
        out_rows.append(np.concatenate(out_row, axis=3))
    return np.concatenate(out_rows, axis=2)


ramp = np.linspace(-2, 2, args.latent_size)  # brighter to the right, as images have regions
z = rng.standard_normal((1, 4, args.latent_size, args.latent_size)) + ramp  # toy latents
whole, whole_peak = peak_bytes(decode, z)
blended, tiled_peak = peak_bytes(tiled_decode, z, args.tile, args.overlap)
unblended = tiled_decode(z, args.tile, args.overlap, blend=False)
err_blend = float(np.abs(blended - whole).max())
err_plain = float(np.abs(unblended - whole).max())
gn_whole = decode(z, group_norm=True)
gn_tiled = tiled_decode(z, args.tile, args.overlap, group_norm=True)
err_gn = float(np.abs(gn_tiled - gn_whole).max())
mean_err = {"blend": np.abs(blended - whole).mean(), "plain": np.abs(unblended - whole).mean(), "gn": np.abs(gn_tiled - gn_whole).mean()}  # fmt: skip
# --8<-- [end:tiled]

stride = int(args.tile * (1 - args.overlap / args.tile))
n_tiles = len(range(0, args.latent_size, stride)) ** 2
decoded_area = sum(min(args.tile, args.latent_size - i) for i in range(0, args.latent_size, stride)) ** 2  # fmt: skip
print(
    f"\ntiling: latents {z.shape} -> image {whole.shape}; tile {args.tile} latent = {2 * args.tile} px,"
    f" overlap {args.overlap} (tile_overlap_factor {args.overlap / args.tile:g}), {n_tiles} tiles,"
    f" blend_extent {int(2 * args.tile * args.overlap / args.tile)} px"
)
rows = [
    ["whole decode", "0 (reference)", "0", fmt(whole_peak), "1.00"],
    [
        "tiles, blended (diffusers)",
        f"{err_blend:.3f}",
        f"{mean_err['blend']:.4f}",
        fmt(tiled_peak),
        f"{decoded_area / args.latent_size**2:.2f}",
    ],
    [
        "tiles, not blended",
        f"{err_plain:.3f}",
        f"{mean_err['plain']:.4f}",
        "",
        f"{decoded_area / args.latent_size**2:.2f}",
    ],
    [
        "tiles, blended, with group norm",
        f"{err_gn:.3f}",
        f"{mean_err['gn']:.4f}",
        "",
        f"{decoded_area / args.latent_size**2:.2f}",
    ],
]
table("Tiled vs whole decode (image values about +-1)", ["", "max abs diff", "mean abs diff", "peak (tracemalloc)", "area decoded"], rows)  # fmt: skip
print(f"the (1, 32, 2S, 2S) float64 activation: whole {fmt(32 * (2 * args.latent_size) ** 2 * 8)}, one tile {fmt(32 * (2 * args.tile) ** 2 * 8)}")  # fmt: skip

# %% [markdown]
# ## 4. Precision: the same DDIM loop with latents and noise_pred stored in each dtype
#
# Every format goes through `labkit.precision.round_to`, the site's one emulation: round
# to the nearest value of the format, ties to even (the verify tests compare it with
# torch's CPU casts of float32 values bit for bit). The scheduler arithmetic runs
# in float64; only the stored tensors are rounded.


# %%
# --8<-- [start:precision]
def to_dtype(x, name):
    """Round float64 ``x`` to the nearest ``name`` value, kept as float64 (storage in ``name``)."""
    return x if name == "float64" else round_to(x, name)


mixture = default_mixture()
unet = ExactDenoiser(mixture, alphas_cumprod(canonical_betas("scaled_linear")), "epsilon")
scheduler = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, clip_sample=False, set_alpha_to_one=False)  # fmt: skip
scheduler.set_timesteps(args.steps)
start = np.random.default_rng(args.seed + 1).standard_normal((2000, 2))  # (N, 2) latents
runs = {}  # dtype -> (final samples, per-step latents)
for name in ["float64", *[d for d in dtypes if d != "float64"]]:
    latents, path = to_dtype(start * scheduler.init_noise_sigma, name), []
    for t in scheduler.timesteps:
        noise_pred = to_dtype(unet(scheduler.scale_model_input(latents, t), t), name)
        latents = to_dtype(scheduler.step(noise_pred, t, latents).prev_sample, name)
        path.append(latents)
    runs[name] = (latents, np.array(path))
# --8<-- [end:precision]

bytes_per = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
rows = []
for name, (final, _path) in runs.items():
    q = sample_quality(mixture, final)
    dev = np.abs(final - runs["float64"][0])
    rows.append([name, bytes_per[name], fmt(4 * 64 * 64 * bytes_per[name]), f"{dev.max():.1e}", f"{np.sqrt(np.mean(dev**2)):.1e}", f"{q.on_mode:.1%}", f"{q.weight_error:.3f}", f"{q.spread:.3f}"])  # fmt: skip
table(
    f"DDIM {args.steps} steps, 2000 samples, deviation from the float64 run",
    [
        "dtype",
        "bytes",
        "SD latents (1,4,64,64)",
        "max abs dev",
        "RMS dev",
        "on_mode",
        "weight_error",
        "spread",
    ],
    rows,
)

# %% [markdown]
# ## 5. CPU offload as bytes over the bus
#
# `enable_model_cpu_offload` (`pipelines/pipeline_utils.py`, diffusers 0.42.1) gives each
# component accelerate's `cpu_offload_with_hook`, chained in `model_cpu_offload_seq` order
# (components the pipeline lacks skipped). accelerate's `CpuOffload.pre_forward`
# (`accelerate/hooks.py`) runs when a component's forward starts: it sends the previous
# component of the chain to the CPU if it is on the GPU, then copies this one in if it is
# not there yet. So a component leaves only when the next one in the chain starts: SD3's
# second pass over its three text encoders brings CLIP-L and CLIP-G back while T5 stays.
# At the end `maybe_free_model_hooks` re-runs `enable_model_cpu_offload`, whose
# `pipe.to("cpu")` moves everything out; SD's `safety_checker` (`_exclude_from_cpu_offload`,
# no hook) stays on the GPU during the call and is moved out and back in then.
# `enable_sequential_cpu_offload` copies each submodule's weights in for its own forward and
# drops them after (no copy back): every forward streams in the submodules it runs, once
# (a text-to-image call never runs the VAE's encoder).
# Bandwidth is an assumption (`--pcie-gbps`); copies from pageable memory, per-copy
# latency and compute are not modelled, so every time below is a floor.


# %%
# --8<-- [start:offload]
def clip_vision_params(hidden=1024, layers=24, mlp=4096, patch=14, image=224, proj=768):
    """CLIP ViT-L/14's vision tower and visual_projection (Radford et al., 2021), from shapes."""
    positions = (image // patch) ** 2 + 1  # patches and the class token
    embed = hidden + 3 * patch * patch * hidden + positions * hidden  # class, patch conv, positions
    layer = 4 * (hidden * hidden + hidden) + 2 * hidden * mlp + mlp + hidden + 4 * hidden
    return embed + 4 * hidden + layers * layer + hidden * proj  # + pre/post LayerNorm, projection


def vae_encoder_params(config):
    """AutoencoderKL's encoder and quant_conv, from the config's shapes: a text-to-image call
    never runs them, so sequential offload never streams them in."""
    conv = lambda i, o, k=3: i * o * k * k + o  # noqa: E731
    resnet = lambda i, o: 2 * i + conv(i, o) + 2 * o + conv(o, o) + (conv(i, o, 1) if i != o else 0)  # noqa: E731
    widths, layers = config["block_out_channels"], config["layers_per_block"]
    n, prev = conv(config["in_channels"], widths[0]), widths[0]
    for k, width in enumerate(widths):
        n += sum(resnet(prev if j == 0 else width, width) for j in range(layers))
        n += conv(width, width) if k < len(widths) - 1 else 0  # downsample
        prev = width
    c, z = widths[-1], 2 * config["latent_channels"]  # mean and logvar
    n += 2 * resnet(c, c) + 2 * c + 4 * (c * c + c)  # mid block: two resnets, one attention
    n += 2 * c + conv(c, z)  # conv_norm_out, conv_out
    return n + (conv(z, z, 1) if config.get("use_quant_conv", True) else 0)


# The hooked forwards of one pipe(prompt) call at the default guidance, in order, with the
# denoiser's entry standing for one call per entry of scheduler.timesteps (CFG batched): data,
# pinned to what the real pipelines do by tests/verify/test_page_lab_10.py (tiny parts,
# through pipe(...)).
FORWARDS = {
    "SD 1.5": ["text_encoder", "text_encoder", "unet", "vae"],  # prompt, then "" for CFG
    "SDXL": ["text_encoder", "text_encoder_2", "unet", "vae"],  # "" -> zeros, no encoder call
    "SD3 Medium": ["text_encoder", "text_encoder_2", "text_encoder_3"] * 2 + ["transformer", "vae"],
    "Flux.1-dev": ["text_encoder", "text_encoder_2", "transformer", "vae"],  # no CFG by default
}
# len(scheduler.timesteps) after set_timesteps(steps) with the scheduler each checkpoint ships:
# SD 1.5's PNDMScheduler(skip_prk_steps=True) repeats its second-to-last timestep (steps + 1
# from 2 to 999 steps; at 1000 its step raises IndexError: --steps stops at 999); SDXL's
# Euler and SD3's and Flux's flow-matching Euler make steps
DENOISER_CALLS = {"SD 1.5": lambda steps: steps + (steps > 1)}
OFFLOAD_SEQ = {  # each pipeline class's model_cpu_offload_seq, diffusers 0.42.1
    "SD 1.5": "text_encoder->image_encoder->unet->vae",
    "SDXL": "text_encoder->text_encoder_2->image_encoder->unet->vae",
    "SD3 Medium": "text_encoder->text_encoder_2->text_encoder_3->image_encoder->transformer->vae",
    "Flux.1-dev": "text_encoder->text_encoder_2->image_encoder->transformer->vae",
}


def call_order(pipeline, parts, steps):
    """FORWARDS[pipeline] for the components in ``parts``, the denoiser repeated once per
    entry of the shipped scheduler's timesteps at ``steps``."""
    denoiser = "unet" if "unet" in parts else "transformer"
    calls = DENOISER_CALLS.get(pipeline, lambda n: n)(steps)
    expanded = [[c] * calls if c == denoiser else [c] for c in FORWARDS[pipeline]]
    return [c for run in expanded for c in run if c in parts]


def model_offload(order, seq, parts, stays=0, resident=None):
    """Replay CpuOffload.pre_forward over ``order``: (crossings per component, peak resident
    bytes). ``stays`` (no hook) is resident throughout and crosses twice at the end; a list
    ``resident`` gets the bytes resident during each forward of ``order``."""
    chain = [c for c in seq.split("->") if c in parts]
    prev = {c: chain[k - 1] if k else None for k, c in enumerate(chain)}
    on, crossings, peak = set(), dict.fromkeys(chain, 0), 0
    for c in order:
        if prev[c] in on:  # the previous component of the chain goes out
            on.discard(prev[c])
            crossings[prev[c]] += 1
        if c not in on:  # this one comes in, unless it is still there
            on.add(c)
            crossings[c] += 1
        peak = max(peak, stays + sum(parts[x] for x in on))
        if resident is not None:
            resident.append(stays + sum(parts[x] for x in on))
    for c in on:  # maybe_free_model_hooks: pipe.to("cpu")
        crossings[c] += 1
    return crossings, peak


safety_checker_params = clip_vision_params() + 20 * 768 + 20  # + 17 + 3 concept embeddings
pipelines = list(FORWARDS)
sizes = {p: {r["component"]: r["bytes"]["fp16"] for r in model_sizes.rows(p)} for p in pipelines}
vae_rows = {p: next(r for r in model_sizes.rows(p) if r["component"] == "vae") for p in pipelines}
encoder_share = {p: vae_encoder_params(r["config"]) / r["params"] for p, r in vae_rows.items()}
stays = {"SD 1.5": 2 * safety_checker_params}  # fp16 bytes; _exclude_from_cpu_offload: no hook
# float16 loading keeps T5's wo layers in float32 (_keep_in_fp32_modules; not in bfloat16)
t5 = next(r for r in model_sizes.rows("SD3 Medium") if r["component"] == "text_encoder_3")
t5_wo_params = t5["config"]["num_layers"] * t5["config"]["d_ff"] * t5["config"]["d_model"]
fp32_extra = 2 * t5_wo_params  # 4 bytes instead of 2 per wo weight under float16
sd3 = sizes["SD3 Medium"]
sd3_fp16 = {**sd3, "text_encoder_3": sd3["text_encoder_3"] + fp32_extra}
# SDXL's force_upcast: upcast_vae() casts the VAE to float32 before its forward copies it in
upcast_in = {"SDXL, fp16": sizes["SDXL"]["vae"]}  # 4 bytes per VAE weight in, not 2
offload_variants = {  # row -> (pipeline, component bytes in the row's dtype)
    "SD 1.5, fp16": ("SD 1.5", sizes["SD 1.5"]),
    "SDXL, fp16": ("SDXL", sizes["SDXL"]),
    "SD3 Medium, bf16": ("SD3 Medium", sd3),
    "SD3 Medium, fp16": ("SD3 Medium", sd3_fp16),
    "Flux.1-dev, bf16": ("Flux.1-dev", sizes["Flux.1-dev"]),
}
offload_rows, crossings = [], {}
for name, (p, parts) in offload_variants.items():
    order = call_order(p, parts, args.steps)
    crossings[name], _ = model_offload(order, OFFLOAD_SEQ[p], parts, stays.get(p, 0))
    model_bytes = sum(n * parts[c] for c, n in crossings[name].items()) + 2 * stays.get(p, 0)
    # in only, once per forward; the checker stays; the VAE's encoder never runs (0.07 GB in fp16)
    seq_bytes = sum(parts[c] for c in order)
    model_bytes, seq_bytes = (b + upcast_in.get(name, 0) for b in (model_bytes, seq_bytes))
    seq_bytes -= (parts["vae"] + upcast_in.get(name, 0)) * encoder_share[p]
    total = sum(parts.values()) + stays.get(p, 0)
    offload_rows.append([name, f"{total / 1e9:.2f}", f"{stays.get(p, 0) / 1e9:.2f}", f"{model_bytes / 1e9:.2f}", f"{model_bytes / (pcie_gbps * 1e9):.2f} s", f"{seq_bytes / 1e9:.1f}", f"{seq_bytes / (pcie_gbps * 1e9):.1f} s"])  # fmt: skip
# --8<-- [end:offload]
table(
    f"Weights moved per call, {args.steps} steps, at {pcie_gbps:g} GB/s (assumed): floors",
    ["", "weights GB", "stays GB", "model offload GB", "time", "sequential GB", "time"],
    offload_rows,
)
print(f"SD 1.5's PNDM makes {DENOISER_CALLS['SD 1.5'](args.steps)} UNet calls at {args.steps} steps; SDXL's VAE crosses in as float32 (force_upcast)")  # fmt: skip
print("model offload crossings per call (in + out), replayed from each pipeline's forward order:")
for name, n in crossings.items():
    print(f"  {name}: " + ", ".join(f"{c} {k}" for c, k in n.items()))
# Not a weight: SD3's transformer keeps its sin-cos positions as a persistent buffer,
# pos_embed_max_size**2 positions x hidden, loaded in the pipeline's dtype; module.to()
# moves buffers with the parameters, so model offload moves it in and out with the transformer
sd3_config = next(r for r in model_sizes.rows("SD3 Medium") if r["component"] == "transformer")["config"]  # fmt: skip
pos_embed_values = sd3_config["pos_embed_max_size"] ** 2 * sd3_config["num_attention_heads"] * sd3_config["attention_head_dim"]  # fmt: skip
print(f"plus SD3's pos_embed buffer ({pos_embed_values:,} values, {2 * pos_embed_values / 1e9:.2f} GB in bf16 or fp16): model offload moves it in and out with the transformer")  # fmt: skip

# %% [markdown]
# ## 6. What fits
#
# A card fits a pipeline "resident" if all weights fit, "model offload" if the most that is
# resident at once under model offload fits: replayed from the forward order as above, SD3's
# T5 with CLIP-G, SD's UNet with the `safety_checker`. Two corrections to the plain fp16 bytes:
# transformers keeps the modules in a model's `_keep_in_fp32_modules` in float32 when it
# loads with `dtype=torch.float16` (not with bfloat16); for `T5EncoderModel` that is every
# `wo`, the `(d_model, d_ff)` output projection of each feed-forward block. And SD3's
# pipeline runs with `text_encoder_3=None` (zeros in place of the T5 embeddings).

# %%
# --8<-- [start:fits]
sd3_no_t5 = {k: v for k, v in sd3.items() if k != "text_encoder_3"}  # text_encoder_3=None
variants = {  # name -> (pipeline, component bytes)
    "SD 1.5, fp16": ("SD 1.5", sizes["SD 1.5"]),
    "SDXL, fp16": ("SDXL", sizes["SDXL"]),
    "SD3 Medium, fp16": ("SD3 Medium", sd3_fp16),
    "SD3 Medium, bf16": ("SD3 Medium", sd3),
    "SD3 Medium, no T5": ("SD3 Medium", sd3_no_t5),
    "Flux.1-dev, bf16": ("Flux.1-dev", sizes["Flux.1-dev"]),
}
fit_rows = []
for name, (p, parts) in variants.items():
    stay = stays.get(p, 0)
    total = sum(parts.values()) + stay
    _, peak = model_offload(call_order(p, parts, 1), OFFLOAD_SEQ[p], parts, stay)
    fit_rows.append([name, f"{total / 1e9:.2f}", f"{peak / 1e9:.2f}"] + [("yes" if total <= g * 2**30 else "offload" if peak <= g * 2**30 else "no") for g in (8, 16, 24, 80)])  # fmt: skip
# --8<-- [end:fits]
print(f"\nT5-XXL's wo layers: {t5_wo_params:,} parameters; kept in float32 under dtype=torch.float16: +{fp32_extra / 1e9:.2f} GB")  # fmt: skip
table(
    "What fits, weights only (GB = 10^9 B; cards counted as 8/16/24/80 GiB)",
    ["", "all GB", "model offload peak GB", "8", "16", "24", "80"],
    fit_rows,
)
print(
    "yes = all weights resident; offload = only with enable_model_cpu_offload (its peak"
    " resident set fits); no = not even that: sequential or group offload, or fewer bytes per"
    " weight (Labs 14 and 16). Activations, attention workspace and the CUDA context come on top."
)

# %% [markdown]
# ## 7. Batching a UNet: compute, not weight reads
#
# Multiply-adds of one SD 1.5 UNet forward at 512 px on one row, from the layer shapes of
# its published config (the verify tests check the count against torch's FlopCounterMode on
# the real class, on the meta device). Against the fp16 weight bytes this gives the
# arithmetic intensity of one row: already hundreds of FLOP per byte of weights read.


# %%
# --8<-- [start:flops]
def unet_macs(cfg, latent=64, text_tokens=77):
    """Multiply-adds of one UNet2DConditionModel forward on one row, from layer shapes."""
    C, L, ctx = cfg["block_out_channels"], cfg["layers_per_block"], cfg["cross_attention_dim"]
    temb = 4 * C[0]  # time embedding width

    def conv(res, cin, cout, k=3):
        return res * res * k * k * cin * cout

    def resnet(res, cin, cout):  # conv1, time_emb_proj, conv2, 1x1 conv_shortcut
        return conv(res, cin, cout) + temb * cout + conv(res, cout, cout) + (conv(res, cin, cout, 1) if cin != cout else 0)  # fmt: skip

    def transformer(res, c):  # proj_in, attn1, attn2, GEGLU feed-forward, proj_out
        n = res * res  # tokens: one per position
        attn1 = 4 * n * c * c + 2 * n * n * c  # q, k, v, out; q k^T and scores @ v
        attn2 = 2 * n * c * c + 2 * text_tokens * ctx * c + 2 * n * text_tokens * c
        return 2 * n * c * c + attn1 + attn2 + n * c * 8 * c + n * 4 * c * c

    macs = C[0] * temb + temb * temb + conv(latent, 4, C[0])  # time_embedding, conv_in
    res, skips = latent, [C[0]]
    for i, kind in enumerate(cfg["down_block_types"]):
        cin = C[max(i - 1, 0)]
        for _ in range(L):
            macs += resnet(res, cin, C[i]) + (transformer(res, C[i]) if "CrossAttn" in kind else 0)
            cin = C[i]
            skips.append(C[i])
        if i < len(C) - 1:  # Downsample2D: 3x3 conv, stride 2
            res //= 2
            macs += conv(res, C[i], C[i])
            skips.append(C[i])
    macs += 2 * resnet(res, C[-1], C[-1]) + transformer(res, C[-1])  # mid block
    cin = C[-1]
    for i, kind in enumerate(cfg["up_block_types"]):
        cout = C[::-1][i]
        for _ in range(L + 1):  # each resnet takes a skip connection, concatenated
            macs += resnet(res, cin + skips.pop(), cout) + (transformer(res, cout) if "CrossAttn" in kind else 0)  # fmt: skip
            cin = cout
        if i < len(C) - 1:  # Upsample2D: nearest x2, then a 3x3 conv
            res *= 2
            macs += conv(res, cout, cout)
    return macs + conv(latent, C[0], 4)  # conv_out


sd_unet = next(r for r in model_sizes.rows("SD 1.5") if r["component"] == "unet")
row_flops = 2 * unet_macs(sd_unet["config"])  # one 512 px row: (1, 4, 64, 64)
flop_per_byte = row_flops / sd_unet["bytes"]["fp16"]
# --8<-- [end:flops]
print(
    f"\nSD 1.5 UNet, one 512 px row: {row_flops / 1e9:.1f} GFLOP (2 x {unet_macs(sd_unet['config']):,} multiply-adds)"
    f" over {sd_unet['bytes']['fp16'] / 1e9:.2f} GB of fp16 weights = {flop_per_byte:.0f} FLOP per weight byte;"
    f" {2 * flop_per_byte:.0f} for the 2 rows of one CFG image"
)

# %% [markdown]
# ## 8. One call, phase by phase: where each switch lowers the peak
#
# SD 1.5 at 512 px, one image with guidance: the weights resident in each phase of a call
# plus the tensors this lab counts live at the phase's largest step. Loaded: weights before
# the call (under model offload only the `safety_checker`, which `enable_model_cpu_offload`
# moves to the device instead of hooking it: `pipelines/pipeline_utils.py`, lines 1264-1265
# of diffusers 0.42.1). Text encode: weights only (77 tokens' activations are small).
# Denoise loop: one first-level self-attention layer run by diffusers' `AttnProcessor`,
# whose `get_attention_scores` keeps two `(2 * 8, 4096, 4096)` tensors alive (section 2;
# two `"auto"` slices when sliced). The default `AttnProcessor2_0` calls SDPA, whose flash
# and memory-efficient kernels store no scores: there the loop adds nothing counted here.
# VAE decode: three tensors of the decoder's widest output, `(1, C, H, W)` of the up block
# with the most values, from the VAE's config (the last up block's first resnet holds its
# input for the shortcut, its GroupNorm output and their SiLU). A floor, not a
# measurement: other activations, workspace and the CUDA context come on top.


# %%
# --8<-- [start:timeline]
def widest_decoder_output(cfg, px):
    """Values in the largest up block output of AutoencoderKL's decoder at ``px`` pixels:
    reversed(block_out_channels), each up block but the last doubling the side."""
    side, widest = px // 2 ** (len(cfg["block_out_channels"]) - 1), 0
    for i, channels in enumerate(reversed(cfg["block_out_channels"])):
        side *= 2 if i < len(cfg["block_out_channels"]) - 1 else 1
        widest = max(widest, channels * side * side)
    return widest


PHASES = ("loaded", "text encode", "denoise loop", "VAE decode")
sd15, stay = sizes["SD 1.5"], stays["SD 1.5"]  # fp16 component bytes; the safety_checker
scores_values = 2 * 2 * 8 * (512 // 8) ** 4  # two live (B * heads, N, N): B = 2 (CFG), N = 4096
auto_values = 2 * (8 // 2) * (512 // 8) ** 4  # two live slices of 8 // 2 rows ("auto")
decode_values = 3 * widest_decoder_output(vae_rows["SD 1.5"]["config"], 512)  # three live
order = call_order("SD 1.5", sd15, args.steps)
phase_of = {"text_encoder": 1, "unet": 2, "vae": 3}
resident = []
model_offload(order, OFFLOAD_SEQ["SD 1.5"], sd15, stay, resident)
offloaded = [stay] + [max(r for c, r in zip(order, resident, strict=True) if phase_of[c] == k) for k in (1, 2, 3)]  # fmt: skip
timeline = {}  # switch -> bytes in each phase
for name, width, loop_values, weights in [
    ("float32", 4, scores_values, [2 * (sum(sd15.values()) + stay)] * 4),
    ("float16", 2, scores_values, [sum(sd15.values()) + stay] * 4),
    ("+ attn slicing", 2, auto_values, [sum(sd15.values()) + stay] * 4),
    ("+ model offload", 2, auto_values, offloaded),
]:
    extra = [0, 0, width * loop_values, width * decode_values]
    timeline[name] = [w + e for w, e in zip(weights, extra, strict=True)]
# with a flash or memory-efficient SDPA kernel (the default processor's) no scores are stored
sdpa_row = [w + e for w, e in zip(timeline["float16"], [0, 0, -2 * scores_values, 0], strict=True)]
# --8<-- [end:timeline]
table(
    "SD 1.5, 512 px, one image with guidance: weights + the tensors counted live, GB (float32: no dtype=)",
    ["", *PHASES],
    [[name, *(f"{b / 1e9:.2f}" for b in row)] for name, row in timeline.items()],
)
print(f"float16 with a flash or memory-efficient SDPA kernel (no scores stored): peak {max(sdpa_row) / 1e9:.2f} GB in the {PHASES[int(np.argmax(sdpa_row))]}; attention slicing lowers nothing there")  # fmt: skip
print("VAE slicing and tiling change nothing here: a batch of one image, and 512 px is one tile")

# %% [markdown]
# ## 9. Summary

# %%
best_slice = min(sliced, key=lambda s: sliced[s][1])
rows = [
    [
        "enable_attention_slicing",
        "attention scores",
        f"peak x{sliced[best_slice][1] / naive_peak:.2f} (slice_size={best_slice})",
        "more, smaller matmuls",
    ],
    [
        "SDPA (AttnProcessor2_0, default)",
        "attention scores",
        "flash/mem-efficient: no (B*heads, N, N)",
        "the math backend stores it",
    ],
    [
        "vae.enable_slicing",
        "decoder activations",
        "one image of the batch at a time",
        "batch decoded in sequence",
    ],
    [
        "vae.enable_tiling",
        "decoder activations",
        f"peak x{tiled_peak / whole_peak:.2f}, seam {err_blend:.3f}",
        f"x{decoded_area / args.latent_size**2:.2f} area, not exact",
    ],
    [
        "dtype=float16/bfloat16",
        "weights, activations",
        "x0.50 (not SDXL VAE decode, T5 wo)",
        f"final dev {np.abs(runs[dtypes[-1]][0] - runs['float64'][0]).max():.1e} ({dtypes[-1]})",
    ],
    [
        "enable_model_cpu_offload",
        "resident weights",
        "the components running",
        f"{offload_rows[0][3]} GB/call (SD 1.5)",
    ],
    [
        "enable_sequential_cpu_offload",
        "resident weights",
        "one submodule, + excluded",
        f"{offload_rows[0][5]} GB/call (SD 1.5)",
    ],
]
table("Strategy summary (this run)", ["strategy", "reduces", "measured saving", "cost"], rows)

# %% [markdown]
# ## 10. Picture it

# %%
# --8<-- [start:figures]
xs = np.array(list(sliced))
chart = figures.line_chart(
    {
        # the MiB the table prints: bytes of noise (labkit.memory) must not move the chart
        "sliced": (xs, np.round(np.array([sliced[s][1] for s in xs]) / 2**20, 1)),
        "naive": (xs, np.full(len(xs), round(naive_peak / 2**20, 1))),
    },
    xlabel="slice_size (rows of B*heads per slice)",
    ylabel="peak MiB",
    markers=True,
)
figures.save(args.figures, "attention-peak", chart, alt="Line chart of the peak NumPy bytes of sliced attention against slice_size, falling in proportion to the slice size, and the naive peak as a flat line, which one slice of all 16 rows slightly exceeds.", caption="Peak bytes of attention against slice_size (tracemalloc).")  # fmt: skip
col = np.arange(whole.shape[3])
seam = figures.line_chart(
    {
        "not blended": (col, np.abs(unblended - whole).max(axis=(0, 1, 2))),
        "blended": (col, np.abs(blended - whole).max(axis=(0, 1, 2))),
    },
    xlabel="image column (px)",
    ylabel="max abs diff to whole decode",
)
figures.save(args.figures, "seam-error", seam, alt="Line chart of the tiled decode's error against image column: spikes at every tile seam without blending, much smaller bumps with linear blending.", caption="Error of the tiled decode per column, with and without blend_h/blend_v.")  # fmt: skip
steps = np.arange(1, args.steps + 1)
prec = figures.line_chart(
    {
        n: (steps, np.abs(runs[n][1] - runs["float64"][1]).max(axis=(1, 2)) + 1e-12)
        for n in runs
        if n != "float64"
    },
    xlabel="DDIM step",
    ylabel="max abs deviation from float64",
    logy=True,
)
figures.save(args.figures, "precision-error", prec, alt="Line chart, log scale, of the deviation of the DDIM latents from the float64 run at each step, for float32, float16 and emulated bfloat16.", caption="Deviation from the float64 run over the DDIM steps.")  # fmt: skip
# each phase one unit wide: a step per switch, its value held across the phase
edges = np.repeat(np.arange(len(PHASES) + 1), 2)[1:-1]  # 0, 1, 1, 2, 2, 3, 3, 4
steps_y = {name: np.repeat(np.round(np.array(row) / 1e9, 2), 2) for name, row in timeline.items()}
mem = figures.line_chart(
    {name: (edges, y) for name, y in steps_y.items()},
    xlabel="phase of one pipe(prompt) call",
    ylabel="GB resident (10^9 B)",
    xticks={k + 0.5: phase for k, phase in enumerate(PHASES)},
    legend_outside=True,
)
peaks = [f"{name} {max(row) / 1e9:.2f} GB in the {PHASES[int(np.argmax(row))]}" for name, row in timeline.items()]  # fmt: skip
figures.save(args.figures, "memory-timeline", mem, alt="Step chart of Lab 10's accounting (not a measurement) of GPU memory over the phases of one SD 1.5 call (loaded, text encode, denoise loop, VAE decode), one line per switch, each peaking: " + "; ".join(peaks) + ".", caption="Lab 10's accounting, not a measurement: SD 1.5 at 512 px, one image with guidance, from the real classes' configs. Weights resident in each phase plus the tensors the lab counts live there, a floor: one first-level self-attention layer's scores and softmax as diffusers' AttnProcessor keeps them (not the processor a pipeline loads with), and three tensors of the VAE decoder's widest output. With the default SDPA's flash or memory-efficient kernels no scores are stored, and attention slicing lowers nothing.")  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    for svg in (mem, chart, seam, prec):
        display(SVG(svg))
# --8<-- [end:figures]
