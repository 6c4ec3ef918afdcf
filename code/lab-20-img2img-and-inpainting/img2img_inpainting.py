"""Lab 20: what does `strength` do, and why does inpainting by blending leave seams?

Image-to-image starts the ordinary denoising loop part-way: it noises the encoded input
image to the first timestep it will run and skips the ones before it, so `strength`
sets both how much of the image survives and how many denoiser calls run. Inpainting
keeps a known region: a 4-channel UNet only pastes the (re-noised) known latents back
after every step, a 9-channel inpainting UNet sees the mask and the masked image's
latents as input. The trap: pasting keeps the pixels but not their meaning; the
generated region need not belong to the same picture as the kept one.

Run it:  python3 code/lab-20-img2img-and-inpainting/img2img_inpainting.py --strength 0.5
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import ExactDenoiser, figures, model_sizes
from labkit.cli import LabArgumentParser, add_figures_argument, int_at_least, parse_args
from labkit.images import FiniteSet, image_grid, toy_images
from labkit.schedulers import DDIMScheduler
from labkit.vae import PatchPCAAutoencoder

# %% [markdown]
# ## 1. Setup / contract
#
# The toy world of labs 05 and 12: 256 training images `(K, 3, 32, 32)` in [-1, 1], a
# patch-PCA `vae` (one latent position per 8 x 8 pixels, so latents are `(B, 4, 4, 4)`),
# the exact denoiser of the scaled training latents as the `unet` (it memorises: its
# samples are training images), and DDIM with SD 1.5's scheduler settings. The input image
# of img2img is *not* a training image (drawn with another seed); the inpainting input is.
#
# The shares below are counted over samples, so they need many: a share of 16 samples is
# uncertain by up to 12.5 points (one standard error), of 256 by 3.1. `FiniteSet32`
# computes the same exact posterior mean as labkit's float64 `FiniteSet`, in float32 (as a
# UNet's forward would run) with one softmax pass, its logits clipped at -80, short of
# where float32's exp turns subnormal or zero, and slow (see below): the same samples in
# about a third of the float64 denoiser's CPU time (unclipped, float32 was no faster).


# %%
class FiniteSet32(FiniteSet):
    """``FiniteSet`` whose ``posterior_mean`` E[x0 | x_t] runs in float32: (N, *shape) -> same."""

    def __post_init__(self) -> None:
        super().__post_init__()
        flat = self.points.reshape(len(self.points), -1)  # (K, D)
        object.__setattr__(self, "flat32", flat.astype(np.float32))
        object.__setattr__(self, "norms32", np.sum(flat**2, axis=1).astype(np.float32))  # (K,)

    def posterior_mean(self, x_t: np.ndarray, alpha_t: float, sigma_t: float) -> np.ndarray:
        # softmax_k(-|x_t - alpha_t x_k|^2 / (2 sigma_t^2)); |x_t|^2 is the same for every k
        two_var = 2 * max(sigma_t, 1e-12) ** 2
        x = x_t.reshape(len(x_t), -1).astype(np.float32)  # (N, D)
        logits = x @ (self.flat32.T * np.float32(2 * alpha_t / two_var))  # (N, K)
        logits -= np.float32(alpha_t**2 / two_var) * self.norms32
        logits -= logits.max(axis=1, keepdims=True)
        # a weight under exp(-80) ~ 2e-35 is lost beside the largest, exp(0) = 1, in float32
        # (eps 1.2e-7); clipped there, no logit is left below -87.3, where float32's exp
        # turns subnormal (below -103.3, zero): such logits, most entries at sigma_t = 0.5,
        # made a call ~9x slower
        np.maximum(logits, np.float32(-80), out=logits)
        weights = np.exp(logits, out=logits)
        weights /= weights.sum(axis=1, keepdims=True)
        return (weights @ self.flat32).reshape(x_t.shape).astype(np.float64)


# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="img2img_inpainting.py", description=__doc__.splitlines()[0])
parser.add_argument("--strength", type=float, default=0.6, help="img2img strength in [0, 1]")
parser.add_argument("--steps", type=int_at_least(1), default=50, help="num_inference_steps (<= 999)")  # fmt: skip
parser.add_argument("--num-samples", type=int_at_least(1), default=256, help="samples per setting (<= 1024)")  # fmt: skip
parser.add_argument("--seed", type=int, default=0, help="seed of the noise")
add_figures_argument(parser)
args = parse_args(parser)
if not 0.0 <= args.strength <= 1.0:  # also refuses nan
    parser.error(f"--strength must be in [0, 1], got {args.strength}")
if args.steps > 999:  # leading spacing + steps_offset=1 reaches t=1000 at 1000 steps
    parser.error(f"--steps must be <= 999 (steps_offset=1 would reach t=1000), got {args.steps}")
if args.num_samples > 1024:
    parser.error(f"--num-samples must be <= 1024, got {args.num_samples}")

data = toy_images(256, seed=0)  # .images (K, 3, 32, 32) in [-1, 1]
vae = PatchPCAAutoencoder.fit(data.images, patch_size=8, latent_channels=4)  # Lab 05
training_latents = vae.encode(data.images) * vae.config.scaling_factor  # (K, 4, 4, 4), std 1
training_set = FiniteSet(training_latents, data.labels)
scheduler = DDIMScheduler(  # SD 1.5's scheduler_config.json values
    beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
    set_alpha_to_one=False, steps_offset=1, clip_sample=False,
)  # fmt: skip
# the "unet": the exact, unconditional denoiser of the 256 training latents (epsilon)
unet = ExactDenoiser(FiniteSet32(training_latents, data.labels), scheduler.alphas_cumprod, "epsilon")  # fmt: skip
B = args.num_samples
# --8<-- [end:setup]

# %% [markdown]
# ## 2. `strength` -> the timesteps that run
#
# `StableDiffusionImg2ImgPipeline.get_timesteps`, line for line but for its
# `set_begin_index` call, made only on schedulers that have one (DDIM has none): of the `n`
# timesteps DDIM's `set_timesteps(n)` makes, the first `n - int(n * strength)` are skipped.
# `int` floors, so with DDIM strength 0.35 of 10 steps runs 3 (SD 1.5's PNDM, whose grid has
# one entry more, runs 4). The count of denoiser calls is the count of timesteps run (with
# CFG each call carries the doubled batch `2B`).


# %%
# --8<-- [start:timesteps]
def get_timesteps(scheduler, num_inference_steps, strength):
    """StableDiffusionImg2ImgPipeline.get_timesteps: (timesteps to run, n - t_start)."""
    init_timestep = min(int(num_inference_steps * strength), num_inference_steps)
    t_start = max(num_inference_steps - init_timestep, 0)
    timesteps = scheduler.timesteps[t_start * scheduler.order :]
    return timesteps, num_inference_steps - t_start


table_strengths, table_steps = (0.1, 0.35, 0.5, 0.75, 1.0), (4, 10, 25, 50)
calls = {}  # (strength, n) -> denoiser calls
for n in table_steps:
    scheduler.set_timesteps(n)
    for s in table_strengths:
        calls[s, n] = len(get_timesteps(scheduler, n, s)[0])
print("denoiser calls = len(timesteps) run, by strength (rows) and num_inference_steps:")
print("strength " + "".join(f"{n:>6}" for n in table_steps))
for s in table_strengths:
    print(f"{s:>8} " + "".join(f"{calls[s, n]:>6}" for n in table_steps))

scheduler.set_timesteps(args.steps)
timesteps, num_run = get_timesteps(scheduler, args.steps, args.strength)
print(f"\nstrength {args.strength}, {args.steps} steps: {num_run} run,"
      f" timesteps {timesteps[:3].tolist()}{' ...' if num_run > 3 else ''}")  # fmt: skip
# --8<-- [end:timesteps]

# %% [markdown]
# ## 3. img2img: noise the image to `timesteps[0]`, then the usual loop
#
# `prepare_latents`: `init_latents = vae.encode(image) * scaling_factor`, then
# `scheduler.add_noise(init_latents, noise, timesteps[:1])`, i.e.
# `sqrt(alpha_bar_t) * init_latents + sqrt(1 - alpha_bar_t) * noise` at the first timestep
# run. At strength 1.0 that is the noisiest timestep of the grid, where
# `sqrt(alpha_bar_t)` is small but not zero: the image still leaks in.


# %%
# --8<-- [start:img2img]
def img2img(init_latents, strength, num_inference_steps, seed, denoiser=unet):
    """(1, 4, 4, 4) init latents -> (B, 4, 4, 4) latents after the partial loop."""
    scheduler.set_timesteps(num_inference_steps)
    timesteps, _ = get_timesteps(scheduler, num_inference_steps, strength)
    noise = np.random.default_rng(seed).standard_normal((B, *init_latents.shape[1:]))
    if len(timesteps) == 0:  # nothing runs: the toy returns the input
        # (StableDiffusionImg2ImgPipeline, one image: an empty batch with output_type="latent",
        # else a RuntimeError from vae.decode; a batch of 2+: a RuntimeError from add_noise
        # whatever the output_type)
        return np.repeat(init_latents, B, axis=0)
    latents = scheduler.add_noise(init_latents, noise, timesteps[:1])  # (B, 4, 4, 4)
    for t in timesteps:
        noise_pred = denoiser(latents, t)  # (B, 4, 4, 4): epsilon
        latents = scheduler.step(noise_pred, t, latents).prev_sample
    return latents


image = toy_images(1, seed=1).images  # (1, 3, 32, 32): not in the training set
init_latents = vae.encode(image) * vae.config.scaling_factor  # (1, 4, 4, 4)
init_nearest, _ = training_set.nearest(init_latents)  # the training image closest to it
strengths = (0.2, 0.4, 0.6, 0.8, 1.0)
results = {}  # strength -> (decoded images, share on the init's nearest training image)
for s in sorted({*strengths, args.strength}):
    latents = img2img(init_latents, s, args.steps, args.seed)
    nearest, _ = training_set.nearest(latents)
    results[s] = (vae.decode(latents / vae.config.scaling_factor), float(np.mean(nearest == init_nearest[0])))  # fmt: skip
# text-to-image from the same noise: pure noise, no image (the "strength > 1" limit)
scheduler.set_timesteps(args.steps)
pure = np.random.default_rng(args.seed).standard_normal((B, 4, 4, 4)) * scheduler.init_noise_sigma  # fmt: skip
for t in scheduler.timesteps:
    pure = scheduler.step(unet(pure, t), t, pure).prev_sample
t2i_share = float(np.mean(training_set.nearest(pure)[0] == init_nearest[0]))
t2i_rms = float(np.sqrt(np.mean((vae.decode(pure / vae.config.scaling_factor) - image) ** 2)))

t_first = int(scheduler.timesteps[0])  # 981 for 50 steps: leading spacing + steps_offset 1
leak = float(np.sqrt(scheduler.alphas_cumprod[t_first]))
leak_999 = float(np.sqrt(scheduler.alphas_cumprod[999]))
print(f"\nimg2img of an image the denoiser never saw, {B} samples, {args.steps} steps:")
print("strength  rms to input  share on the input's nearest training image")
for s in sorted({*strengths, args.strength}):
    rms = float(np.sqrt(np.mean((results[s][0] - image) ** 2)))
    print(f"{s:>8}  {rms:>12.3f}  {results[s][1]:>6.0%}")
print(
    f"text-to-image (no image): {t2i_rms:>5.3f}  {t2i_share:>6.0%}  (by chance: 1/256 = {1 / 256:.1%})"
)
print(f"a share of {B} samples is uncertain by up to {50 / np.sqrt(B):.1f} points (one standard error)")  # fmt: skip
print(f"strength 1.0 starts at t={t_first}: sqrt(alpha_bar) = {leak:.3f}"
      f" (t=999: {leak_999:.3f}), so the image still carries {leak:.1%} weight")  # fmt: skip
# --8<-- [end:img2img]

# %% [markdown]
# ## 4. Inpainting two ways
#
# The mask is `(1, 1, 4, 4)` in latent space, 1 where to repaint (the right half: latent
# columns 2-3, pixels 16-31), as diffusers' `mask` after it is resized to latent size.
#
# - **Blending** (`StableDiffusionInpaintPipeline` with a 4-channel UNet): after every
#   `scheduler.step`, `latents = (1 - mask) * add_noise(image_latents, noise, t_next) +
#   mask * latents`, and at the last step the un-noised `image_latents`.
# - **Conditioned** (a 9-channel inpainting UNet gets `cat([latent_model_input, mask,
#   masked_image_latents], dim=1)` and is trained to use them): the toy's stand-in is the
#   exact denoiser of the posterior given the known region, i.e. over the training images
#   whose known half matches the input's. A trained 9-channel UNet approximates this; no
#   network is exact, but it is *trained* to be consistent, which blending is not.


# %%
# --8<-- [start:inpaint]
mask = np.zeros((1, 1, 4, 4))
mask[..., 2:] = 1.0  # 1 = repaint (right half), 0 = keep
keep = mask[0, 0] == 0  # (4, 4) bool: the known latent positions
j = 0  # the input is training image 0
image_latents = training_latents[j : j + 1]  # (1, 4, 4, 4)


def rms_over(a, b, where):
    """RMS of a - b over the latent positions ``where`` (4, 4), per row: (N,)."""
    return np.sqrt(np.mean(((a - b) ** 2)[:, :, where], axis=(1, 2)))


# the training images whose known half matches the input's: the posterior's support
consistent = np.flatnonzero(rms_over(training_latents, image_latents, keep) < 1e-6)
conditioned_unet = ExactDenoiser(FiniteSet32(training_latents[consistent], data.labels[consistent]), scheduler.alphas_cumprod)  # fmt: skip


def inpaint(denoiser, blend, num_inference_steps, seed):
    """strength 1.0 inpainting: pure noise in, (B, 4, 4, 4) latents out."""
    scheduler.set_timesteps(num_inference_steps)
    timesteps = scheduler.timesteps
    noise = np.random.default_rng(seed).standard_normal((B, 4, 4, 4))
    latents = noise * scheduler.init_noise_sigma  # is_strength_max: noise, not add_noise
    for i, t in enumerate(timesteps):
        noise_pred = denoiser(latents, t)
        latents = scheduler.step(noise_pred, t, latents).prev_sample
        if blend:  # the 4-channel path: paste the known region back, noised to t_next
            init_latents_proper = image_latents
            if i < len(timesteps) - 1:
                init_latents_proper = scheduler.add_noise(image_latents, noise, timesteps[i + 1])
            latents = (1 - mask) * init_latents_proper + mask * latents
    return latents


def consistent_share(latents):
    """Share of samples whose repainted half is the repainted half of a training image
    whose known half matches the input's (RMS < 0.05 over the masked positions)."""
    d = [rms_over(latents, training_latents[k : k + 1], ~keep) for k in consistent]
    return float(np.mean(np.min(d, axis=0) < 0.05))


blended = inpaint(unet, True, args.steps, args.seed)
conditioned = inpaint(conditioned_unet, False, args.steps, args.seed)
known_drift = float(rms_over(conditioned, image_latents, keep).max())
print(f"\ninpainting training image {j}, right half masked, {B} samples, {args.steps} steps:")
print(f"{len(consistent)} of 256 training images share its left half")
print(f"blending (4-channel):     {consistent_share(blended):.0%} of samples consistent")
print(f"conditioned (9-channel):  {consistent_share(conditioned):.0%} consistent,"
      f" known half off by at most {known_drift:.1e} RMS (no pasting)")  # fmt: skip
# --8<-- [end:inpaint]

# %% [markdown]
# ## 5. padding_mask_crop and editing by reference, in numbers
#
# `padding_mask_crop=pad` crops the mask's bounding box plus `pad` pixels (grown to the
# output's aspect ratio: `VaeImageProcessor.get_crop_region`), inpaints that crop at the
# full `height x width`, and pastes it back. A reference editor (FLUX.1 Kontext) instead
# appends the reference image's packed latents, resized to about 1 MP, to the sequence: at
# 1024 px `N` image tokens become about `2N`, and their attention costs about 4x as much.


# %%
# --8<-- [start:numbers]
def crop_side(mask_side, pad, image_side):
    """Square mask of ``mask_side`` px centred in a square image: the crop's side in px."""
    return min(mask_side + 2 * pad, image_side)


photo, hole, pad, out = 2048, 200, 32, 512  # a 2048 px photo, a 200 px hole, SD 1.5's 512
side = crop_side(hole, pad, photo)
print(f"\npadding_mask_crop={pad}: a {hole} px hole in a {photo} px photo is inpainted in a"
      f" {side} px crop resized to {out} px: {(out / side) ** 2:.2f}x its pixels, against"
      f" {(out / photo) ** 2:.4f}x when the whole photo is resized to {out} px")  # fmt: skip

text_tokens = model_sizes.flux_1024px()["text_tokens"]  # 512: max_sequence_length's default
N = (1024 // 16) ** 2  # 4096 image tokens at 1024 px: 8x VAE, then 2 x 2 packing
L0, L1 = text_tokens + N, text_tokens + 2 * N  # joint sequence without / with the reference
print(f"FLUX.1 Kontext at 1024 px: {N} image + {text_tokens} text = {L0} tokens;"
      f" with the reference image {L1} ({L1 / L0:.2f}x)")  # fmt: skip
print(f"attention FLOPs ~ L^2: x{(L1 / L0) ** 2:.2f} per call; image-image part"
      f" N^2 -> (2N)^2: x{(2 * N) ** 2 / N**2:.0f}; linear layers ~ L: x{L1 / L0:.2f}")  # fmt: skip

# FLUX.1-dev's strength counts steps too, on a grid the resolution shift moved up (its
# scheduler has use_dynamic_shifting=True): the pipeline's sigmas linspace(1, 1/n, n) go
# through time_shift with mu = calculate_shift(N tokens)
mu = 0.5 + (1.15 - 0.5) * (N - 256) / (4096 - 256)  # base_shift, max_shift: 1.15 at 4096
flux_sigmas = np.exp(mu) / (np.exp(mu) + (1 / np.linspace(1.0, 1 / 10, 10) - 1))
sigma_first = float(flux_sigmas[int(10 - 10 * 0.6)])  # FluxImg2ImgPipeline.get_timesteps
print(f"FLUX.1-dev img2img at 1024 px (mu {mu:.2f}), strength 0.6 of 10 steps: first sigma"
      f" {sigma_first:.2f}, not 0.6")  # fmt: skip
# --8<-- [end:numbers]

# %% [markdown]
# ## 6. Figures

# %%
# --8<-- [start:figures]
if args.figures is not None:  # PNG encoding costs time: only when the figures are saved
    shown = min(B, 3)
    init_decoded = vae.decode(init_latents / vae.config.scaling_factor)  # as blocky as the outputs
    rows = [np.concatenate([init_decoded, results[s][0][:shown]]) for s in strengths]
    figures.save(
        args.figures, "img2img", figures.png(image_grid(np.concatenate(rows), columns=shown + 1), scale=2),
        alt=f"Five rows of small images, one per strength ({', '.join(map(str, strengths))}). Each "
        f"row starts with the same input picture, then {shown} img2img results. Low strength keeps "
        f"the input's shape, colour and place ({results[0.2][1]:.0%} of samples land on its nearest "
        f"training image); at strength 1.0 the results are mostly other training images "
        f"({results[1.0][1]:.0%} land on it).",
        caption="img2img of one input (first column, through the toy VAE) at strength 0.2 (top) to "
        "1.0 (bottom), in this toy with the memorising exact denoiser.",
    )  # fmt: skip
    # a stand-in for diffusers' masked_image_latents, which encodes the masked pixels
    masked_image = image_latents * (1 - mask)
    to_px = lambda z: vae.decode(z / vae.config.scaling_factor)  # noqa: E731
    inpaint_rows = [np.concatenate([to_px(image_latents), to_px(masked_image), to_px(x[:4])]) for x in (blended, conditioned)]  # fmt: skip
    figures.save(
        args.figures, "inpainting", figures.png(image_grid(np.concatenate(inpaint_rows), columns=6), scale=2),
        alt=f"Two rows of small images. Each starts with the input picture (its shape in the right "
        f"half, the left half plain background) and the input with its right half blanked. Top row, blending: the left half is always kept, but the right half "
        f"often belongs to another picture, leaving cut shapes at the seam ({consistent_share(blended):.0%} "
        f"consistent). Bottom row, conditioned: whole, consistent pictures "
        f"({consistent_share(conditioned):.0%}).",
        caption="Inpainting the right half: blending (top) and the conditioned denoiser that stands "
        "for a 9-channel inpainting UNet (bottom); input and masked input first.",
    )  # fmt: skip
    series = {f"{n} steps": (np.array(table_strengths), np.array([calls[s, n] for s in table_strengths])) for n in (10, 25, 50)}  # fmt: skip
    figures.save(
        args.figures, "calls", figures.line_chart(series, "strength", "denoiser calls", markers=True),
        alt=f"Denoiser calls against strength ({table_strengths[0]} to {table_strengths[-1]}) for "
        f"10, 25 and 50 steps: rising in steps, int(steps x strength), from {calls[0.1, 10]}, "
        f"{calls[0.1, 25]} and {calls[0.1, 50]} to {calls[1.0, 10]}, {calls[1.0, 25]} and "
        f"{calls[1.0, 50]} at strength 1.0.",
        caption="Denoiser calls of img2img with DDIM: get_timesteps runs int(num_inference_steps x strength).",
    )  # fmt: skip
# --8<-- [end:figures]
