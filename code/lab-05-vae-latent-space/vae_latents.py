"""Lab 05: what does the VAE's latent space buy, and what does vae.config.scaling_factor do?

Stable Diffusion denoises ``latents`` ``(B, 4, H/8, W/8)``, not pixels ``(B, 3, H, W)``:
4 numbers per 8 x 8 patch's worth of pixels (192 numbers), so each step touches
64 times fewer positions. The latents are multiplied by ``vae.config.scaling_factor``
(1 / their std) before the denoiser and divided by it before ``vae.decode``. The traps:
forgetting that division decodes a wrong image with no error (washed out, or blown out
if divided twice, on this lab's linear toy; distorted on a real VAE), and
thinking the pixel cost is gone, when the decoder still runs once at full resolution
and owns its own memory peak.

Run it:  python3 code/lab-05-vae-latent-space/vae_latents.py --latent-channels 4
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import ExactDenoiser, alphas_cumprod, canonical_betas, figures
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    in_notebook,
    int_at_least,
    int_list,
    parse_args,
)
from labkit.images import FiniteSet, image_grid, toy_images
from labkit.schedulers import DDIMScheduler
from labkit.vae import PatchPCAAutoencoder

# %% [markdown]
# ## 1. Setup / contract: `(B, 3, 32, 32)` pixels -> `(B, C, 4, 4)` latents
#
# 256 toy images (coloured discs, squares and bars, 32 x 32 RGB in [-1, 1]) train the
# autoencoder; 64 more, drawn with the next seed, are held out to measure it. The
# autoencoder is `labkit.vae.PatchPCAAutoencoder`: PCA over 8 x 8 patches, the best
# *linear* code with `--latent-channels` numbers per patch (4, like SD 1.x/2.x/SDXL;
# SD3 and Flux.1 use 16). It has the diffusers names: `encode`, `decode`,
# `config.scaling_factor`, `config.shift_factor`.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="vae_latents.py", description=__doc__.splitlines()[0])
parser.add_argument("--latent-channels", type=int_at_least(1), default=4)
parser.add_argument(
    "--resolutions", type=int_list, default=[512, 1024, 2048], help="square sizes in pixels"
)
parser.add_argument("--steps", type=int_at_least(1), default=30, help="num_inference_steps")
parser.add_argument("--num-samples", type=int_at_least(1), default=8, help="images to sample")
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)
patch_size = 8  # SD's VAE downsamples by 2 ** (len(block_out_channels) - 1) = 2 ** 3 = 8
if args.latent_channels > 3 * patch_size**2:
    parser.error(f"--latent-channels must be <= 192 (3 x 8 x 8), got {args.latent_channels}")
for size in args.resolutions:
    if size < patch_size or size % patch_size or size > 16384:
        parser.error(f"--resolutions: {size} is not a multiple of 8 in 8..16384 (latents are H/8)")
if args.steps > 1000 or args.num_samples > 64:
    parser.error("--steps must be <= 1000 and --num-samples <= 64")

train = toy_images(256, seed=args.seed)  # .images (256, 3, 32, 32) float64 in [-1, 1]
held_out = toy_images(64, seed=args.seed + 1)  # never seen by fit
vae = PatchPCAAutoencoder.fit(train.images, patch_size, args.latent_channels)
latents_raw = vae.encode(train.images)  # (256, C, 4, 4): "latent_dist.mean", unscaled
recon = vae.decode(latents_raw)  # (256, 3, 32, 32)
# --8<-- [end:setup]

print(f"images  {train.images.shape} in [-1, 1]: {train.images[0].size} numbers per image")
print(
    f"latents {latents_raw.shape}: {latents_raw[0].size} numbers per image,"
    f" {train.images[0].size / latents_raw[0].size:g}x fewer"
    f" (one {3 * patch_size**2}-number patch -> {args.latent_channels} channels)"
)
print(f"decode  {latents_raw.shape} -> {recon.shape}")


def table(title, header, rows):
    """Print ``rows`` under ``header``, each column right-aligned to its widest cell."""
    cells = [[str(x) for x in row] for row in [header, *rows]]
    widths = [max(len(row[k]) for row in cells) for k in range(len(header))]
    print(f"\n{title}")
    for row in cells:
        aligned = [cell.rjust(w) for cell, w in zip(row, widths, strict=True)]
        print("  ".join([row[0].ljust(widths[0]), *aligned[1:]]))  # first column to the left


# %% [markdown]
# ## 2. `scaling_factor`: put the latents at unit variance, once, with one number
#
# The encoder's output has whatever scale training gave it. The noise schedule
# assumes data of variance about 1: `x_t = sqrt(alpha_bar_t) x_0 + sqrt(1 - alpha_bar_t) eps`.
# So latent diffusion multiplies by `scaling_factor = 1 / std(latents)` (one scalar,
# measured on training latents; SD 1.x's is 0.18215) before the denoiser, and divides
# by it before `decode`. SD3 and Flux.1 also subtract a `shift_factor` first.

# %%
# --8<-- [start:scaling]
scaling_factor = vae.config.scaling_factor  # 1 / std of the training latents
latents = latents_raw * scaling_factor  # what the denoiser is trained on and samples
shift_factor = latents_raw.mean()  # what fit(..., shift=True) records; SD3/Flux.1 subtract it
# --8<-- [end:scaling]

per_channel = " ".join(f"{s:.3f}" for s in latents_raw.std(axis=(0, 2, 3))[:4])
print(f"\nraw latents:    std {latents_raw.std():.3f}, mean {latents_raw.mean():.3f}")
print(f"  per channel std (first {min(4, args.latent_channels)}): {per_channel}")
print(f"scaling_factor = 1 / {latents_raw.std():.3f} = {scaling_factor:.4f}")
print(f"scaled latents: std {latents.std():.3f}, mean {latents.mean():.3f}")
print(
    f"shift_factor (mean of the raw latents): {abs(shift_factor):.3f}"
    " (PCA subtracts the mean patch, so its latents are already centred)"
)
print(f"SD 1.x for comparison: its raw latents have std 1 / 0.18215 = {1 / 0.18215:.2f}")

# %% [markdown]
# ## 3. What the channels keep: reconstruction error against `latent_channels`
#
# Fewer channels per patch compress more and keep less. RMSE is in pixel units
# (the range [-1, 1] is 2 wide); PSNR = 20 log10(2 / RMSE) dB. The held-out images
# were never seen by the PCA.

# %%
# --8<-- [start:channels]
channel_counts = sorted({1, 4, 8, 16, args.latent_channels})
errors = {}  # latent_channels -> (train RMSE, held-out RMSE)
reconstructions = {}  # latent_channels -> decoded held-out images (64, 3, 32, 32)
for c in channel_counts:
    v = vae if c == args.latent_channels else PatchPCAAutoencoder.fit(train.images, patch_size, c)
    reconstructions[c] = v.decode(v.encode(held_out.images))
    train_rmse = np.sqrt(np.mean((v.decode(v.encode(train.images)) - train.images) ** 2))
    errors[c] = (train_rmse, np.sqrt(np.mean((reconstructions[c] - held_out.images) ** 2)))
# --8<-- [end:channels]

rows = []
for c in channel_counts:
    n = c * (32 // patch_size) ** 2  # numbers per 32 x 32 image
    train_rmse, test_rmse = errors[c]
    psnr = 20 * np.log10(2 / test_rmse)
    rows.append([c, n, f"{3072 / n:.1f}x", f"{train_rmse:.3f}", f"{test_rmse:.3f}", f"{psnr:.1f} dB"])  # fmt: skip
header = ["latent_channels", "numbers", "fewer", "RMSE train", "RMSE held-out", "PSNR held-out"]
table("Reconstruction error (pixels in [-1, 1])", header, rows)

# %% [markdown]
# ## 4. What goes wrong if you forget the scaling
#
# **Training side.** Noising unscaled latents gives a different signal-to-noise
# ratio than the schedule was designed for: `SNR(t) = alpha_bar_t Var(x_0) / (1 - alpha_bar_t)`.
# The "same as scaled t" column is the timestep at which scaled latents have that SNR.
#
# **Sampling side.** DDIM (lab 03) with the exact denoiser of the *scaled* training
# latents starts from unit-variance noise, like a pipeline with DDIM. The result has to be
# divided by `scaling_factor` before `decode`. Forgetting it decodes latents that are
# too small (washed out, toward the mean patch); dividing twice (the pipeline already
# did it, and your code does it again) decodes latents that are too large (blown out).

# %%
# --8<-- [start:forget]
alphas_cumprod_ = alphas_cumprod(canonical_betas("scaled_linear"))  # SD's schedule, (1000,)
snr = alphas_cumprod_ / (1 - alphas_cumprod_)  # SNR of unit-variance data, per timestep
snr_scaled, snr_unscaled = snr * latents.var(), snr * latents_raw.var()

unet = ExactDenoiser(FiniteSet(latents, train.labels), alphas_cumprod_, "epsilon")
scheduler = DDIMScheduler(
    beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, clip_sample=False
)
scheduler.set_timesteps(args.steps)
shape = (args.num_samples, *latents.shape[1:])  # (N, C, 4, 4), like prepare_latents
sample = np.random.default_rng(args.seed).standard_normal(shape) * scheduler.init_noise_sigma
for t in scheduler.timesteps:
    noise_pred = unet(scheduler.scale_model_input(sample, t), t)
    sample = scheduler.step(noise_pred, t, sample).prev_sample

decoded = {
    "latents / scaling_factor": vae.decode(sample / scaling_factor),  # the pipeline's line
    "latents (forgot)": vae.decode(sample),  # scaling_factor times too small
    "latents / scaling_factor**2": vae.decode(sample / scaling_factor**2),  # divided twice
}
# --8<-- [end:forget]

rows = []
for t in [0, 250, 500, 750, 999]:
    same_t = int(np.argmin(np.abs(np.log(snr_scaled) - np.log(snr_unscaled[t]))))
    rows.append([t, f"{alphas_cumprod_[t]:.5f}", f"{snr_scaled[t]:.4f}", f"{snr_unscaled[t]:.4f}", same_t])  # fmt: skip
header = ["t", "alpha_bar", "SNR scaled", "SNR unscaled", "same SNR as scaled at t"]
table(f"Var(latents) = {latents.var():.3f} scaled, {latents_raw.var():.3f} unscaled", header, rows)

nearest = FiniteSet(train.images, train.labels).nearest  # -> index, RMS distance per image
rows = [["(training images)", f"{train.images.std():.3f}", f"{0:.1%}", f"{0:.3f}"]]
for name, images in {"(their reconstructions)": recon, **decoded}.items():
    outside = np.mean(np.abs(images) > 1)  # clipped when saved as an image
    rows.append([name, f"{images.std():.3f}", f"{outside:.1%}", f"{nearest(images)[1].mean():.3f}"])  # fmt: skip
header = ["decode input", "pixel std", "outside [-1, 1]", "RMS to nearest training image"]
title = f"DDIM, {args.steps} steps, {len(sample)} samples: latents std {sample.std():.3f}"
table(title, header, rows)

# %% [markdown]
# ## 5. Memory arithmetic: pixels, latents, and the decoder's own peak
#
# fp16 is 2 bytes a number; batch 1; square images. SD's UNet starts at
# `block_out_channels[0] = 320` channels (`UNet2DConditionModel`'s default
# `block_out_channels` is `(320, 640, 1280, 1280)`) and SD 1.x runs self-attention
# at that first level, over one token per latent position. The VAE decoder is
# walked with SD's VAE config, `block_out_channels=(128, 256, 512, 512)`,
# `layers_per_block=2`, the way diffusers' `Decoder` builds it: mid block at H/8,
# then up blocks with `reversed(block_out_channels)` channels, each but the last
# ending in a 2x upsampler.


# %%
# --8<-- [start:decoder]
def decoder_activation_shapes(block_out_channels, layers_per_block, latent_channels, size):
    """Output shape of each module of diffusers' VAE ``Decoder`` for a (1, 3, size, size) image."""
    levels = len(block_out_channels)
    side = size // 2 ** (levels - 1)  # latent side: H / 8 for four blocks
    shapes = [("input", (1, latent_channels, side, side))]  # latents / scaling_factor
    shapes.append(("conv_in", (1, block_out_channels[-1], side, side)))
    shapes.append(("mid_block", (1, block_out_channels[-1], side, side)))  # attention here
    for i, channels in enumerate(reversed(block_out_channels)):
        for j in range(layers_per_block + 1):
            shapes.append((f"up_blocks.{i}.resnets.{j}", (1, channels, side, side)))
        if i < levels - 1:  # every block but the last doubles the side, keeping its channels
            side *= 2
            shapes.append((f"up_blocks.{i}.upsamplers.0", (1, channels, side, side)))
    shapes.append(("conv_norm_out", (1, block_out_channels[0], side, side)))
    shapes.append(("conv_out", (1, 3, side, side)))
    return shapes


def nbytes(shape, bytes_per_number=2):  # fp16
    return int(np.prod(shape)) * bytes_per_number


def fmt(n):
    unit = max(u for u in range(5) if n >= 1024**u or u == 0)
    return f"{n / 1024**unit:.1f} {['B', 'KiB', 'MiB', 'GiB', 'TiB'][unit]}"


sd_vae = dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4)
unet_channels = 320  # UNet2DConditionModel block_out_channels[0]
# --8<-- [end:decoder]

# --8<-- [start:memory]
rows_tensors, rows_unet, rows_decoder = [], [], []
for size in args.resolutions:
    side = size // 8  # latent side, H/8
    pixels, lat4, lat16 = (nbytes((1, c, s, s)) for c, s in [(3, size), (4, side), (16, side)])
    rows_tensors.append([f"{size} px", fmt(pixels), fmt(lat4), f"{pixels // lat4}x", fmt(lat16)])
    # the UNet's first level, on latents vs. the same network run on pixels
    act_lat, act_px = nbytes((1, unet_channels, side, side)), nbytes((1, unet_channels, size, size))  # fmt: skip
    scores_lat, scores_px = nbytes((side**2, side**2)), nbytes((size**2, size**2))  # one head
    rows_unet.append([f"{size} px", fmt(act_lat), fmt(act_px), side**2, size**2, fmt(scores_lat), fmt(scores_px)])  # fmt: skip
    # the decoder: its widest module output, its last block's width, its mid-block attention
    widest_name, widest_shape = max(decoder_activation_shapes(size=size, **sd_vae), key=lambda m: nbytes(m[1]))  # fmt: skip
    last = nbytes((1, sd_vae["block_out_channels"][0], size, size))
    rows_decoder.append([f"{size} px", f"{widest_shape}", fmt(nbytes(widest_shape)), fmt(last), fmt(scores_lat), fmt(lat4)])  # fmt: skip
# --8<-- [end:memory]

table(
    "fp16, batch 1: the denoiser's input and output",
    ["", "pixels (1,3,H,W)", "latents (1,4,H/8,W/8)", "ratio", "latents (1,16,H/8,W/8)"],
    rows_tensors,
)
table(
    f"UNet first level, {unet_channels} channels: one activation; attention scores per head",
    ["", "act. latents", "act. pixels", "tokens lat.", "tokens px", "scores lat.", "scores px"],
    rows_unet,
)
walk = decoder_activation_shapes(size=512, **sd_vae)
table(
    "SD VAE decoder at 512 px, fp16: the output of each module (diffusers names)",
    ["module", "shape", "fp16"],
    [[name, f"{shape}", fmt(nbytes(shape))] for name, shape in walk],
)
table(
    "SD VAE decoder, fp16: widest output, last block's width, mid-block attention (1 head)",
    ["", "widest output", "bytes", "(1,128,H,W)", "attn. scores", "latents in"],
    rows_decoder,
)

# %% [markdown]
# ## 6. Picture it
#
# Three image grids (nearest-neighbour upscaled) and one chart: held-out images with
# their latent channels as grey images (each 4 x 4 latent shown as 4 x 4 blocks of
# 8 x 8 pixels, mid-grey = 0, black / white = -3 / +3 in scaled units); their
# reconstructions with 1, 4, 8 and 16 channels; the DDIM samples decoded three ways;
# and the reconstruction error against the number of channels.

# %%
# --8<-- [start:figures]
show = held_out.images[:8]  # (8, 3, 32, 32)
channels = vae.encode(show)[:, :4] * scaling_factor  # (8, <=4, 4, 4), scaled
grey = np.clip(channels / 3, -1, 1).repeat(patch_size, axis=2).repeat(patch_size, axis=3)
grey_rows = [np.repeat(grey[:, k : k + 1], 3, axis=1) for k in range(grey.shape[1])]  # grey RGB
latent_grid = image_grid(np.concatenate([show, *grey_rows]), columns=8)
recon_rows = [reconstructions[c][:8] for c in (1, 4, 8, 16)]
recon_grid = image_grid(np.concatenate([show, *recon_rows]), columns=8)
landed_on = train.images[unet.mixture.nearest(sample)[0]]  # the training image each sample hit
forget_grid = image_grid(np.concatenate([landed_on, *decoded.values()]), columns=len(sample))
counts = np.array(channel_counts)
chart = figures.line_chart(
    {
        "training images": (counts, np.array([errors[c][0] for c in channel_counts])),
        "held-out images": (counts, np.array([errors[c][1] for c in channel_counts])),
    },
    xlabel="latent channels per 8 x 8 patch",
    ylabel="reconstruction RMSE (pixels)",
    logx=True,
    markers=True,
)
if args.figures is not None:  # PNG encoding costs time: only when the figures are saved
    figures.save(
        args.figures,
        "latents",
        figures.png(latent_grid, scale=3),
        alt="Eight held-out toy images of coloured discs, squares and bars in the top row; below "
        f"them, {grey.shape[1]} rows of grey block images, one per latent channel: each block is "
        "one 8 by 8 patch, light where the channel is positive, dark where it is negative, mid-grey "
        "on the empty background. Each channel responds differently to each colour and shape.",
        caption="Held-out images (top) and their scaled latent channels, one row per channel.",
    )
    figures.save(
        args.figures,
        "reconstructions",
        figures.png(recon_grid, scale=3),
        alt="Eight held-out toy images in the top row, then their reconstructions with 1, 4, 8 "
        "and 16 latent channels in the rows below: one channel gives dim blocks of one brownish "
        "colour that only mark where a shape is, four channels recover the colours with blocky "
        "edges, and sixteen channels come close to the originals.",
        caption="Reconstructions of held-out images with 1, 4, 8 and 16 latent channels.",
    )
    figures.save(
        args.figures,
        "forgot-scaling",
        figures.png(forget_grid, scale=3),
        alt=f"Top row: the {len(sample)} training images whose latents the DDIM samples landed "
        "on. Below, the same sampled latents decoded three ways, one row each: divided by "
        "scaling_factor (blocky versions of the top row, same colours and contrast), not divided "
        "(faded shapes on a lighter grey background), and divided twice (over-saturated colours "
        "on a darker background, some pixels clipped).",
        caption="The training image each sample landed on, then the sample decoded from "
        "latents / scaling_factor, latents, and latents / scaling_factor**2.",
    )
figures.save(
    args.figures, "recon-error", chart,
    alt="Line chart of reconstruction RMSE against latent channels per patch on a log axis: "
    "the error falls steadily from 1 to 16 channels, and the held-out curve lies just above "
    "the training curve.",
    caption="Reconstruction error against latent channels, training and held-out images.",
)  # fmt: skip
if in_notebook():
    from IPython.display import SVG, Image, display

    # actual size, and not the detailed reconstructions grid: the lab page shows all at 3x
    for grid in (latent_grid, forget_grid):
        display(Image(data=figures.png(grid)))
    display(SVG(chart))
# --8<-- [end:figures]
