"""Lab 21: what does a video add to a diffusion pipeline's shapes and cost?

A video model denoises one latent tensor with a time axis: Wan 2.1's VAE encodes the first
frame alone and then every 4 frames into one latent frame, 8x smaller in each spatial
direction, so a clip must have 4k+1 frames and its latents are
`(B, 16, 1 + (F-1)/4, H/8, W/8)`. The transformer attends over every latent patch of every
latent frame at once: 5 s of 720p is 75,600 tokens against 4,096 for a 1024 px image, and
attention's cost grows with the square of that. The trap: frames look like a batch, but
they are one sequence, so cost grows faster than the frame count.

Run it:  python3 code/lab-21-video-diffusion/video_latents.py --frames 33
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import figures, images, model_sizes
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
# The toy video: `(F, 3, 32, 32)` float64 in [-1, 1] (frames, RGB, rows, columns), two of
# `labkit.images`' shapes, one sliding right and one sliding down, `--speed` pixels a frame.
# The real shapes: Wan 2.1's VAE (diffusers' `AutoencoderKLWan` defaults: `z_dim=16`,
# `scale_factor_temporal=4`, `scale_factor_spatial=8`) and `WanTransformer3DModel`'s
# defaults, Wan 2.1 14B (`patch_size=(1, 2, 2)`, 40 blocks, 40 heads of 128,
# `ffn_dim=13824`); a verify test reads them from the installed classes.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="video_latents.py", description=__doc__.splitlines()[0])
parser.add_argument("--frames", type=int_at_least(1), default=17, help="frames in the toy clip: 4k+1 (1, 5, 9, ...)")  # fmt: skip
parser.add_argument("--speed", type=int, default=1, help="pixels a shape moves per frame")
parser.add_argument("--seed", type=int, default=0, help="seed of the toy shapes and the toy VAE")
add_figures_argument(parser)
args = parse_args(parser)
if args.frames > 81 or abs(args.speed) > 8:  # first: a 4k+1 suggested below is then <= 81
    parser.error("--frames must be <= 81 and --speed between -8 and 8")
if (args.frames - 1) % 4:
    k = (args.frames - 1) // 4
    parser.error(f"--frames must be 4k+1 (the first frame alone, then groups of 4), got {args.frames}: use {4 * k + 1} or {4 * k + 5}")  # fmt: skip

T_DOWN, S_DOWN, Z_DIM = 4, 8, 16  # AutoencoderKLWan: scale_factor_temporal, scale_factor_spatial, z_dim  # fmt: skip
PATCH = (1, 2, 2)  # WanTransformer3DModel.patch_size: (frames, rows, columns) per token
WAN = dict(layers=40, heads=40, head_dim=128, ffn_dim=13824)  # Wan 2.1 14B, the class defaults
toy = images.toy_images(8, seed=args.seed).images  # (8, 3, 32, 32), pick two shapes
a, b = toy[0], toy[1]
video = np.empty((args.frames, 3, images.SIZE, images.SIZE))  # (F, 3, H, W)
for f in range(args.frames):
    frame = np.roll(a, args.speed * f, axis=2)  # shape a slides right (wraps round)
    moved = np.roll(b, args.speed * f, axis=1)  # shape b slides down
    video[f] = np.where(moved != images.BACKGROUND, moved, frame)
# --8<-- [end:setup]

# %% [markdown]
# ## 2. A causal spatio-temporal patch "VAE"
#
# The stand-in encoder cuts the clip into patches of 4 frames x 8 x 8 pixels x 3 channels
# (768 numbers) and projects each onto 16 fixed orthonormal directions: 48x fewer numbers,
# the same ratio as Wan's VAE (3 x 4 x 8 x 8 pixels -> 16 latent channels). The first three
# directions are each patch's mean colour, so a latent frame can be drawn. Causal: latent
# frame 0 sees frame 0 alone (repeated 4 times here; Wan's causal convolutions pad the
# past instead), latent frame i sees frames 4i-3 .. 4i, never a later one. The decoder is
# the transpose. Linear and untrained: in this toy, detail inside a patch is lost.


# %%
# --8<-- [start:vae]
def toy_projection(seed):
    """(16, 768) orthonormal rows; rows 0-2 average one RGB channel over a 4 x 8 x 8 patch."""
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((Z_DIM, 3 * T_DOWN * S_DOWN * S_DOWN))
    for c in range(3):
        # (channel, frame, row, column): the order encode flattens a patch in
        mask = np.zeros((3, T_DOWN, S_DOWN, S_DOWN))
        mask[c] = 1.0
        rows[c] = mask.ravel()
    for i in range(Z_DIM):  # Gram-Schmidt in row order: rows 0-2 keep their direction
        rows[i] -= rows[:i].T @ (rows[:i] @ rows[i])
        rows[i] /= np.linalg.norm(rows[i])
    return rows


PROJ = toy_projection(args.seed)


def groups(n_frames):
    """Frame indices per latent frame: [0], [1..4], [5..8], ...: the causal 1 + 4k split."""
    return [[0]] + [list(range(1 + T_DOWN * i, 1 + T_DOWN * (i + 1))) for i in range((n_frames - 1) // T_DOWN)]  # fmt: skip


def encode(video):
    """(F, 3, H, W) -> latents (16, 1 + (F-1)/4, H/8, W/8)."""
    f, c, h, w = video.shape
    latents = []
    for idx in groups(f):
        chunk = video[[idx[0]] * T_DOWN if len(idx) == 1 else idx]  # (4, 3, H, W)
        patches = chunk.reshape(T_DOWN, c, h // S_DOWN, S_DOWN, w // S_DOWN, S_DOWN)
        patches = patches.transpose(2, 4, 1, 0, 3, 5).reshape(h // S_DOWN, w // S_DOWN, -1)  # (h, w, 768)  # fmt: skip
        latents.append(patches @ PROJ.T)  # (H/8, W/8, 16)
    return np.stack(latents).transpose(3, 0, 1, 2)  # (16, latent frames, H/8, W/8)


def decode(latents):
    """latents (16, T, h, w) -> (1 + 4 (T-1), 3, 8h, 8w): the transpose of encode."""
    _, t, h, w = latents.shape
    out = []
    for i in range(t):
        patches = (latents[:, i].transpose(1, 2, 0) @ PROJ).reshape(h, w, 3, T_DOWN, S_DOWN, S_DOWN)  # fmt: skip
        chunk = patches.transpose(3, 2, 0, 4, 1, 5).reshape(T_DOWN, 3, h * S_DOWN, w * S_DOWN)
        out.append(chunk[:1] if i == 0 else chunk)  # latent frame 0 gives back 1 frame
    return np.concatenate(out)


latents = encode(video)
recon = decode(latents)
print(f"video (F, 3, H, W) = {video.shape} -> latents (C, T, h, w) = {latents.shape} -> decoded {recon.shape}")  # fmt: skip
print(f" {video.size:,} numbers -> {latents.size:,}: {video.size / latents.size:.1f}x smaller; "
      f"in this toy, RMS error of the decoded clip {np.sqrt(np.mean((recon - video) ** 2)):.3f} (pixels in [-1, 1])")  # fmt: skip
# --8<-- [end:vae]

# %% [markdown]
# ## 3. Tokens: a clip against an image
#
# With Wan 2.1's VAE and transformer, `WanPipeline.prepare_latents` makes
# `(B, 16, (F-1)//4 + 1, H/8, W/8)` latents (the pipeline reads the channels and factors
# from the checkpoint's configs: Wan 2.2 TI2V-5B's are 48 and 16x in space); the
# transformer's patch `(1, 2, 2)` turns each latent frame into `(H/16) x (W/16)` tokens, and
# all frames form one self-attention sequence (text enters by cross-attention). FLUX.1-dev at
# 1024 px has 4,096 image tokens (`labkit.model_sizes`).


# %%
# --8<-- [start:tokens]
def latent_shape(frames, height, width, batch=1):
    """WanPipeline.prepare_latents's shape with Wan 2.1's VAE: (B, 16, (F-1)//4 + 1, H/8, W/8)."""
    return (batch, Z_DIM, (frames - 1) // T_DOWN + 1, height // S_DOWN, width // S_DOWN)


def tokens(frames, height, width):
    _, _, t, h, w = latent_shape(frames, height, width)
    return (t // PATCH[0]) * (h // PATCH[1]) * (w // PATCH[2])


FLUX_TOKENS = model_sizes.flux_1024px()["image_tokens"]  # 4,096
CLIPS = {"toy clip, 32 px": (args.frames, 32, 32), "Wan 480p, 5 s": (81, 480, 832), "Wan 720p, 5 s": (81, 720, 1280)}  # fmt: skip
print("\n clip                | frames | latents (B, C, T, h, w) | tokens | x FLUX.1-dev 1024 px image")  # fmt: skip
for name, (f, h, w) in CLIPS.items():
    print(f" {name:19s} | {f:6d} | {latent_shape(f, h, w)!s:23s} | {tokens(f, h, w):6,d} | {tokens(f, h, w) / FLUX_TOKENS:.2f}")  # fmt: skip
# --8<-- [end:tokens]

# %% [markdown]
# ## 4. Cost per transformer call as frames grow
#
# Per block and token, the linear layers cost about `2 (6 D^2 + 2 D ffn_dim)` FLOPs
# (self-attention's q, k, v, o; cross-attention's q and o; the MLP), and self-attention's
# scores and weighted sum `4 N D` (`Q K^T` and `softmax V`, 2 N D each): the linear part
# grows with the tokens N, attention with N^2. An estimate from the config: cross-attention's
# K/V projections of the 512 text tokens and its scores against them, norms, the time
# embedding and the patch embedding are left out (a verify test finds the estimate within
# 5% of torch's FlopCounterMode on the meta device).


# %%
# --8<-- [start:cost]
D = WAN["heads"] * WAN["head_dim"]  # 5,120


def call_flops(n):
    """(linear, attention) FLOPs of one Wan 2.1 14B transformer call over n tokens."""
    linear = WAN["layers"] * n * 2 * (6 * D * D + 2 * D * WAN["ffn_dim"])
    return linear, WAN["layers"] * 4 * n * n * D


frame_counts = np.arange(1, 82, 4)  # 1, 5, ..., 81: every valid count up to 5 s at 16 fps
cost = np.array([call_flops(tokens(int(f), 720, 1280)) for f in frame_counts])  # (21, 2)
print("\n720p frames | latent frames | tokens | linear TFLOPs | attention TFLOPs | attention share")
for f in (1, 17, 33, 49, 81):
    lin, att = call_flops(tokens(f, 720, 1280))
    print(f" {f:10d} | {(f - 1) // 4 + 1:13d} | {tokens(f, 720, 1280):6,d} | {lin / 1e12:13,.0f} | {att / 1e12:16,.0f} | {att / (lin + att):6.1%}")  # fmt: skip
# --8<-- [end:cost]

# %% [markdown]
# ## 5. Decoding by frames held, context parallelism, and CFG
#
# A decoder call's memory follows the frames it holds, not the clip. diffusers'
# `AutoencoderKLWan._decode` calls the decoder once per latent frame (1, then 4 output
# frames), keeping the last `CACHE_T = 2` frames of every causal convolution's input. At
# full resolution the decoder has `base_dim=96` channels and 7 causal convolutions (3
# residual blocks of 2, and `conv_out`). Here: one 96-channel full-resolution feature map
# for the whole clip, against a later call's 4 frames of the map before `conv_out` plus those
# 7 two-frame caches, all 96-channel maps (the first call holds 1 frame and 1-frame caches);
# bf16 (diffusers' Wan example loads the VAE in float32: twice these). A lower bound: the
# lower-resolution stages' caches and a call's transient activations come on top. The
# measured peak (a verify test runs the real decoder on the meta device and records the
# live tensors' bytes in labkit/model_sizes.json; weights, workspaces and the allocator's
# overhead not counted) is about three times that bound. Untiled, the peak still grows a
# little with the clip: `_decode` concatenates every call's output into the decoded clip
# (0.45 GB in bf16 at 81 frames) and clamps a copy. `enable_tiling()` (256 px tiles,
# stride 192) decodes each overlapping tile through every latent frame and keeps all the
# decoded tiles until it blends them, so a tiled decode grows with the clip.
# Context parallelism splits the token sequence over GPUs (Lab 19). With
# `guidance_scale=5.0` (WanPipeline's default) each of the 50 default steps runs the
# transformer twice, cond and uncond.


# %%
# --8<-- [start:scale]
def feature_map_gb(frames, height=720, width=1280, channels=96):
    return channels * frames * height * width * 2 / 1e9  # bf16


FULL_RES_CAUSAL_CONVS, CACHE_T = 7, 2  # AutoencoderKLWan's decoder at full resolution
per_call = (
    4 + FULL_RES_CAUSAL_CONVS * CACHE_T
)  # frames of 96-channel maps held: 4 before conv_out + caches
print(f"\n96-channel 720p decoder feature maps (bf16): one map of the whole 81-frame clip {feature_map_gb(81):.1f} GB; "
      f"frame by frame, a later decoder call's 4 frames before conv_out + {FULL_RES_CAUSAL_CONVS} caches x {CACHE_T} frames = {feature_map_gb(per_call):.2f} GB (a lower bound), whatever the clip's length")  # fmt: skip
DECODE = model_sizes.load()["wan_vae_decode_720p"]  # measured by tests/verify (meta device)
peak = {k: v / 1e9 for k, v in DECODE["peak_bytes"].items()}
print(f"measured: AutoencoderKLWan() decoding {DECODE['frames']} frames of 720p peaks at {peak['bf16']:.1f} GB of live tensors in bf16 "
      f"({DECODE['bf16_peak_float32_bytes'] / 1e9:.1f} GB of them float32), {peak['fp32']:.1f} GB in float32; "
      f"with vae.enable_tiling() {peak['bf16_tiled']:.2f} GB ({DECODE['frames']} frames, the decoder's repeated calls replayed; weights not counted)")  # fmt: skip
print(f"untiled, 81 frames: measured {peak['bf16_81_frames']:.1f} GB in bf16 (the decoder's repeated calls replayed): "
      f"+{peak['bf16_81_frames'] - peak['bf16']:.2f} GB over {DECODE['frames']} frames, the decoded clip that _decode concatenates")  # fmt: skip
TILE, STRIDE = 256 // S_DOWN, 192 // S_DOWN  # enable_tiling() defaults, in latent pixels
lat_h, lat_w = 720 // S_DOWN, 1280 // S_DOWN
tile_pixels = sum(min(TILE, lat_h - i) for i in range(0, lat_h, STRIDE)) * sum(min(TILE, lat_w - j) for j in range(0, lat_w, STRIDE)) * S_DOWN**2  # fmt: skip
clip_bytes, tiles_bytes = 3 * 81 * 720 * 1280 * 2, 3 * 81 * tile_pixels * 2  # 81 frames, bf16
print(f"tiled, 81 frames: measured {peak['bf16_tiled_81_frames']:.2f} GB (replayed). tiled_decode keeps every decoded tile until it blends them "
      f"(tiles overlap: {tile_pixels / (720 * 1280):.2f}x the frame's pixels, {tiles_bytes / 1e9:.2f} GB), then holds the blended rows, "
      f"their concatenation and the clamped clip ({clip_bytes / 1e9:.2f} GB each): {(tiles_bytes + 3 * clip_bytes) / 1e9:.2f} GB")  # fmt: skip
(wan14b,) = [r for r in model_sizes.rows("Wan 2.1 T2V 14B") if r["component"] == "transformer"]
# UMT5EncoderModel with Wan 2.1's umt5-xxl config (Wan2.1 wan/modules/t5.py), counted on meta by a verify test
UMT5_XXL_PARAMS = 5_680_910_336
print(f"weights, bf16: Wan 2.1 14B's transformer {wan14b['bytes']['bf16'] / 1e9:.1f} GB (labkit.model_sizes), "
      f"its UMT5-XXL text encoder {UMT5_XXL_PARAMS * 2 / 1e9:.1f} GB ({UMT5_XXL_PARAMS / 1e9:.2f} B parameters)")  # fmt: skip
n720 = tokens(81, 720, 1280)
print(f"context parallel, {n720:,} tokens: " + ", ".join(f"{r} GPUs -> {n720 // r:,} a GPU" for r in (2, 4, 8)))  # fmt: skip
steps, calls_per_step = 50, 2  # num_inference_steps default; cond + uncond while guidance_scale > 1
wan_clip = steps * calls_per_step * sum(call_flops(n720))
# FLUX.1-dev: 28 steps, one call each (guidance-distilled); its call's FLOPs counted on meta
flux_image = 28 * model_sizes.flux_1024px()["flops"]
print(f"Wan 2.1 14B, 5 s 720p: {steps} steps x {calls_per_step} calls x {sum(call_flops(n720)) / 1e15:.2f} PFLOPs = "
      f"{wan_clip / 1e15:,.0f} PFLOPs a clip (estimate); FLUX.1-dev 1024 px, 28 steps: "
      f"{flux_image / 1e15:.1f} PFLOPs: {wan_clip / flux_image:,.0f}x")  # fmt: skip
# --8<-- [end:scale]

# %% [markdown]
# ## 6. Figures

# %%
# --8<-- [start:figures]
# row 1: the frames; row 2: each latent frame's mean colour (channels 0-2), under the last
# frame it sees; row 3: the decoded frames. White where a latent column is empty.
colour = latents[:3] / np.sqrt(T_DOWN * S_DOWN * S_DOWN)  # (3, T, h, w): back to pixel units
tiles = np.ones((3, args.frames, 3, images.SIZE, images.SIZE))
tiles[0], tiles[2] = video, np.clip(recon, -1, 1)
for i, idx in enumerate(groups(args.frames)):
    tiles[1, idx[-1]] = colour[:, i].repeat(S_DOWN, axis=1).repeat(S_DOWN, axis=2)
grid = images.image_grid(tiles.reshape(-1, 3, images.SIZE, images.SIZE), columns=args.frames)
figures.save(args.figures, "frames-and-latents", figures.png(grid, scale=2), alt=f"Three rows of {args.frames} small frames: two coloured shapes moving across a dark background; below them {latents.shape[1]} latent frames of {latents.shape[2]} x {latents.shape[3]} coloured blocks, one under the first frame and one under every fourth frame after it; then the decoded frames, blurred into 8 x 8 blocks and smeared across each group of 4.", caption="In this toy: the clip (top), the mean colour of each latent frame (middle, under the last frame it sees) and the decoded clip (bottom). Frame 0 has a latent frame of its own; every later latent frame covers 4 frames.")  # fmt: skip
tok = np.array([tokens(int(f), 720, 1280) for f in frame_counts])
chart = figures.line_chart({"attention": (frame_counts, cost[:, 1] / 1e12), "linear layers": (frame_counts, cost[:, 0] / 1e12)}, xlabel="frames at 720p (4k+1)", ylabel="TFLOPs per transformer call", logy=True, markers=True)  # fmt: skip
figures.save(args.figures, "attention-cost", chart, alt=f"Log-scale line chart of TFLOPs per Wan 2.1 14B transformer call against 1 to 81 frames at 720p: the linear layers grow with the tokens ({tok[0]:,} to {tok[-1]:,}), from {cost[0, 0] / 1e12:,.0f} to {cost[-1, 0] / 1e12:,.0f} TFLOPs; attention grows with their square, from {cost[0, 1] / 1e12:,.0f} to {cost[-1, 1] / 1e12:,.0f}, overtaking the linear layers as frames grow.", caption="One transformer call's FLOPs, estimated from WanTransformer3DModel's default config (Wan 2.1 14B): linear layers against self-attention's scores and weighted sum.")  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(chart))
# --8<-- [end:figures]
