"""Lab 04: what does classifier-free guidance do to the samples, and what does it cost?

Each step runs the denoiser on a doubled batch, unconditional rows then
conditional rows, splits the prediction in two and extrapolates:
``noise_pred = noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)``.
The state is ``latents`` (N, 2); the axis that doubles is the batch axis. The
trade-off: class purity rises with the scale while diversity falls and, at high
scale, samples overshoot past the class they were pushed toward, and every
guided step costs twice the denoiser rows, in one call.

Run it:  python3 code/lab-04-cfg-code-reading/cfg_guidance.py --guidance-scales 1,3,7.5
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import ExactDenoiser, GaussianMixture, alphas_cumprod, canonical_betas, figures
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    float_list,
    in_notebook,
    int_at_least,
    parse_args,
)
from labkit.denoiser import UNCOND
from labkit.images import BACKGROUND, SHAPES, FiniteSet, image_grid, toy_images
from labkit.metrics import purity
from labkit.schedulers import DDIMScheduler

# %% [markdown]
# ## 1. Setup / contract
#
# Two overlapping classes, each one Gaussian: class 0 around (-0.7, 0), class
# 1 around (+0.7, 0), std 0.6. They overlap, so even a perfect conditional
# model puts some class-1 samples where class 0 is more likely; that is what
# guidance trades on. The exact denoiser is conditioned per row through
# `class_labels`, the toy stand-in for `prompt_embeds`; `UNCOND` (-1) is the
# empty prompt. A DDIM scheduler (lab 03) runs `--steps` steps.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="cfg_guidance.py", description=__doc__.splitlines()[0])
parser.add_argument(
    "--guidance-scales", type=float_list(minimum=0.0), default=[1.0, 2.0, 4.0, 7.5, 15.0]
)
parser.add_argument("--steps", type=int_at_least(1), default=30, help="num_inference_steps")
parser.add_argument("--num-samples", type=int_at_least(100), default=2000)
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)
if args.steps > 999:  # leading spacing + steps_offset=1 reaches t=1000 at 1000 steps
    parser.error(f"--steps must be <= 999 (steps_offset=1 would reach t=1000), got {args.steps}")
if max(args.guidance_scales) > 100:  # bounded: at 1e200 the toy's arithmetic overflows to NaN
    parser.error(f"--guidance-scales must be <= 100, got {max(args.guidance_scales)!r}")

mixture = GaussianMixture(
    means=np.array([[-0.7, 0.0], [0.7, 0.0]]),  # (K=2, 2)
    stds=np.array([0.6, 0.6]),
    weights=np.array([0.5, 0.5]),
    classes=np.array([0, 1]),
)
target_class = 1
unet = ExactDenoiser(mixture, alphas_cumprod(canonical_betas("scaled_linear")), "epsilon")
# SD 1.5's scheduler config (scheduler_config.json), with DDIM as StableDiffusionPipeline
# users swap it in: leading spacing shifted by steps_offset=1, no clipping
scheduler = DDIMScheduler(
    beta_schedule="scaled_linear",
    beta_start=0.00085,
    beta_end=0.012,
    steps_offset=1,
    clip_sample=False,
    set_alpha_to_one=False,
)
scheduler.set_timesteps(args.steps)
noise = np.random.default_rng(args.seed).standard_normal((args.num_samples, 2))  # (N, 2)
# --8<-- [end:setup]

# %% [markdown]
# ## 2. Main transition: one guided prediction, the way pipelines write it
#
# diffusers' Stable Diffusion pipeline concatenates `[latents] * 2` and
# `[negative_prompt_embeds, prompt_embeds]`, calls the UNet once on 2B rows,
# and `chunk(2)`s the output, unconditional half first. It only does this when
# `guidance_scale > 1`; at 1 or below it runs the conditional branch alone.


# %%
# --8<-- [start:guidance]
def guided_noise_pred(latents, t, guidance_scale, cond=target_class, uncond=UNCOND):
    """(N, 2) latents -> (N, 2) guided noise_pred. Costs 2N denoiser rows when guiding."""
    do_classifier_free_guidance = guidance_scale > 1.0
    if not do_classifier_free_guidance:
        return unet(scheduler.scale_model_input(latents, t), t, class_labels=cond)
    latent_model_input = np.concatenate([latents] * 2)  # (2N, 2): uncond rows, then cond rows
    latent_model_input = scheduler.scale_model_input(latent_model_input, t)
    class_labels = np.repeat([uncond, cond], len(latents))  # (2N,), like cat([neg, pos]) embeds
    noise_pred = unet(latent_model_input, t, class_labels=class_labels)  # one call, 2N rows
    noise_pred_uncond, noise_pred_text = np.split(noise_pred, 2)  # chunk(2): uncond first
    return noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)


def sample(guidance_scale, uncond=UNCOND):
    latents = noise * scheduler.init_noise_sigma
    for t in scheduler.timesteps:
        noise_pred = guided_noise_pred(latents, t, guidance_scale, uncond=uncond)
        latents = scheduler.step(noise_pred, t, latents).prev_sample
    return latents


# --8<-- [end:guidance]

# %% [markdown]
# ## 3. Check: purity, diversity, overshoot and cost against the scale
#
# `purity`: samples whose nearest class mean is class 1's. `std`: the spread of
# samples per axis (class 1's own is 0.6). `mean x`: where the samples sit
# (class 1's mean is at x = 0.7). `rows/step`: denoiser rows evaluated per
# step, the compute cost. The unconditional row (no prompt at all) is the
# reference.

# %%
# --8<-- [start:sweep]
print(
    f"{'guidance_scale':>14} {'purity':>7} {'std x':>6} {'std y':>6} {'mean x':>7} {'rows/step':>10}"
)
runs = [("uncond", None)] + [(f"{s:g}", s) for s in args.guidance_scales]
results = {}  # label -> samples (N, 2), kept for the figures below
for label, scale in runs:
    unet.rows = 0
    if scale is None:  # no conditioning at all: every row is UNCOND
        latents = noise * scheduler.init_noise_sigma
        for t in scheduler.timesteps:
            noise_pred = unet(scheduler.scale_model_input(latents, t), t, class_labels=UNCOND)
            latents = scheduler.step(noise_pred, t, latents).prev_sample
        samples = latents
    else:
        samples = sample(scale)
    results[label] = samples
    sx, sy = samples.std(axis=0)
    rows_per_step = unet.rows / len(scheduler.timesteps)
    print(
        f"{label:>14} {purity(mixture, samples, target_class):>7.1%} {sx:>6.3f} {sy:>6.3f}"
        f" {samples[:, 0].mean():>7.3f} {rows_per_step:>10.0f}"
    )
# --8<-- [end:sweep]

# %% [markdown]
# ## 4. The negative prompt is the unconditional branch
#
# A negative prompt replaces the empty prompt in the uncond half of the batch,
# as in StableDiffusionPipeline. Guidance then extrapolates away from class 0
# specifically instead of away from "anything": same cost, different direction.
# (FluxPipeline differs: there a negative prompt with true_cfg_scale > 1 adds a
# second transformer call per step.)

# %%
# --8<-- [start:negative]
scale = 1.5
for name, uncond in [("empty prompt (UNCOND)", UNCOND), ("negative prompt: class 0", 0)]:
    unet.rows = 0
    samples = sample(scale, uncond=uncond)
    print(
        f"guidance_scale={scale:g}, uncond = {name:<26} purity {purity(mixture, samples, target_class):.1%}"
        f"  mean x {samples[:, 0].mean():.3f}  rows/step {unet.rows / len(scheduler.timesteps):.0f}"
    )
# --8<-- [end:negative]

# %% [markdown]
# ## 5. Picture it
#
# The same starting noise, sampled without a prompt and at each guidance scale:
# 400 samples per panel, coloured by the class whose mean is nearer. Watch the
# cloud narrow along x only and slide past class 1's mean at x = 0.7.

# %%
# --8<-- [start:figures]
panels = []
for label, scale in runs:
    samples = results[label]
    nearest = (samples[:400, 0] > 0).astype(int)  # class 1's mean is at +0.7, class 0's at -0.7
    title = "no prompt" if scale is None else f"guidance_scale={label}"
    panels.append((title, samples[:400], nearest))
sweep_figure = figures.scatter_panels(panels, lim=3.6, columns=min(len(panels), 3), size=160)
figures.save(
    args.figures, "sweep", sweep_figure,
    alt="Scatter plots of 400 samples without a prompt and at guidance scales "
    f"{', '.join(f'{s:g}' for s in args.guidance_scales)}: without a prompt the samples split "
    "between the two classes; with the prompt they move to class 1 on the right, and as the "
    "scale grows the cloud narrows left to right and shifts further right, while its vertical "
    "spread stays the same.",
    caption="The CFG sweep: samples per guidance_scale, coloured by the nearer class mean.",
)  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(sweep_figure))
# --8<-- [end:figures]

# %% [markdown]
# ## 6. Picture it on images
#
# The same guidance on the toy shape images of Labs 05 and 12 (`labkit.images`: 256
# images `(K, 3, 32, 32)` in [-1, 1], four shape classes, an exact denoiser of the
# finite set). The prompt is "square". Each column is one guidance scale (the first: no
# prompt), each row one starting noise, the same in every column. All columns run as
# one doubled batch per step, with the lines of `guided_noise_pred`; a column at scale
# <= 1 uses the conditional half alone, StableDiffusionPipeline's result, though here its
# unconditional half is still computed (the pipeline skips it). Drawn only with `--figures`
# (the site's build), so the default run stays fast.

# %%
# --8<-- [start:images]
if args.figures is not None:
    data = toy_images(256, seed=0)  # .images (K, 3, 32, 32), .labels (K,) in SHAPES
    training_set = FiniteSet(data.images, data.labels)
    image_unet = ExactDenoiser(training_set, unet.alphas_cumprod, "epsilon")
    prompt = SHAPES.index("square")  # class 1: the toy's prompt
    R, C = 4, len(runs)  # rows: starting noises; columns: no prompt, then each scale
    image_noise = np.random.default_rng(args.seed).standard_normal((R, 3, 32, 32))
    # the same DDIM config, but at most 15 steps (the runs use 30): an image's 3072 values
    # (3 x 32 x 32) cost far more than 2-D points, and this keeps the site build's --figures
    # run short
    image_scheduler = DDIMScheduler(**vars(scheduler.config))  # like from_config
    image_scheduler.set_timesteps(min(args.steps, 15))
    # column-major: rows k*R .. k*R + R-1 are column k; (C*R, 3, 32, 32)
    latents = np.tile(image_noise, (C, 1, 1, 1)) * image_scheduler.init_noise_sigma
    cond = np.repeat([UNCOND if s is None else prompt for _, s in runs], R)  # (C*R,)
    scales = np.repeat([1.0 if s is None else s for _, s in runs], R)[:, None, None, None]
    class_labels = np.concatenate([np.full(C * R, UNCOND), cond])  # (2*C*R,) uncond first
    x0_hat_max, guidance_term = [], []  # per step: max |x0_hat|, max |guided - cond|
    for t in image_scheduler.timesteps:
        latent_model_input = image_scheduler.scale_model_input(np.concatenate([latents] * 2), t)
        noise_pred_uncond, noise_pred_text = np.split(
            image_unet(latent_model_input, t, class_labels=class_labels), 2
        )
        guided = noise_pred_uncond + scales * (noise_pred_text - noise_pred_uncond)
        noise_pred = np.where(scales > 1.0, guided, noise_pred_text)  # <= 1: cond half only
        output = image_scheduler.step(noise_pred, t, latents)
        x0_hat_max.append(float(np.abs(output.pred_original_sample).max()))
        guidance_term.append(float(np.abs(noise_pred - noise_pred_text).max()))
        latents = output.prev_sample
    nearest, nearest_rms = training_set.nearest(latents)  # (C*R,) training image reached, RMS
    area = np.sum(np.abs(latents - BACKGROUND).max(axis=1) > 0.5, axis=(1, 2))  # (C*R,) pixels
    image_purity, image_distinct, image_area = {}, {}, {}  # per column label
    for k, (label, _) in enumerate(runs):
        reached = nearest[k * R : (k + 1) * R]
        image_purity[label] = float(np.mean(data.labels[reached] == prompt))  # share of squares
        image_distinct[label] = len(set(reached.tolist()))  # different training images reached
        image_area[label] = float(area[k * R : (k + 1) * R].mean())  # mean shape area, pixels
    grid_images = latents.reshape(C, R, 3, 32, 32).transpose(1, 0, 2, 3, 4)  # rows = noises
    titles = ["no prompt"] + [f"{s:g}" for s in args.guidance_scales]
    figures.save(
        args.figures, "images", figures.png(image_grid(grid_images.reshape(-1, 3, 32, 32), C), 2),
        alt=f"A grid of {R} rows by {C} columns of small shape images. Columns, left to right: "
        f"{', '.join(titles)} (guidance scales, prompt 'square'); each row starts from the "
        f"same noise. Without a prompt {image_purity['uncond']:.0%} of the images are squares; "
        "with the prompt every image is a square, and as the scale grows the squares get "
        "larger and some rows turn into the same square.",
        caption=f"Guidance on toy images, prompt 'square'. Columns: {', '.join(titles)}. "
        f"Squares: {', '.join(f'{v:.0%}' for v in image_purity.values())}; distinct training "
        f"images reached: {', '.join(map(str, image_distinct.values()))}; mean shape area "
        f"(pixels): {', '.join(f'{v:.0f}' for v in image_area.values())}. {R} starting "
        f"noises, {len(image_scheduler.timesteps)} DDIM steps (the 2-D runs: {args.steps}); "
        f"each image ends within RMS {nearest_rms.max():.2f} of a training image.",
    )  # fmt: skip
# --8<-- [end:images]
