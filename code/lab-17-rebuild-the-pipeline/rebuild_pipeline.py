"""Lab 17: can you write the loop of a text-to-image pipeline yourself, from its parts?

The parts are Lab 12's toy world (shape images, a patch-PCA "VAE", the exact denoiser of
its latents) with a NumPy scheduler of SD 1.5's config; the loop that joins them is
yours. Six blanks are left in pipeline(): the doubled condition and latents,
scale_model_input, the guidance line, scheduler.step and the division by scaling_factor
before decode. Each can be written wrong and still return an image, so check_pipeline.py
compares what each blank gives with what the solution's gives, blank by blank, step by
step. Level 2, pipeline_any_scale(), is the loop at any guidance_scale with a scheduler
that adds noise in step (three blanks, fewer hints).

Run it:  python3 code/lab-17-rebuild-the-pipeline/rebuild_pipeline.py
Check it:  python3 code/lab-17-rebuild-the-pipeline/check_pipeline.py
The solution's pipeline() in place of yours:  add --solution (pipeline_solution.txt holds it)
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
try:
    import labkit  # noqa: F401
except ModuleNotFoundError as missing:  # a copy away from code/: one line, not a traceback
    if missing.name != "labkit":
        raise
    print(f"{Path(sys.argv[0]).name}: error: labkit (code/labkit) is not beside this file: run the copy in the repository's code/lab-17-rebuild-the-pipeline/", file=sys.stderr)  # fmt: skip
    sys.exit(2)

from labkit import ExactDenoiser, alphas_cumprod, canonical_betas, figures
from labkit.blanks import (
    UnfilledBlankError,
    blank_at,
    error_site,
    handed_on,
    load_constant,
    load_function,
    with_warnings,
)
from labkit.blanks import blank as blank  # the placeholder; the solution has none left
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    add_pipeline_arguments,
    check_pipeline_arguments,
    parse_args,
)
from labkit.denoiser import UNCOND
from labkit.images import SHAPES, FiniteSet, image_grid, toy_images
from labkit.schedulers import DDIMScheduler, DDPMScheduler, EulerDiscreteScheduler
from labkit.vae import PatchPCAAutoencoder

# %% [markdown]
# ## 1. The parts
#
# Lab 12's toy world, built the same way: 256 training images of four shapes, the
# patch-PCA autoencoder fitted to them as the `vae`, their latents times
# `vae.config.scaling_factor` (unit std), and the exact denoiser of those latents as the
# `unet`. The scheduler has SD 1.5's betas; Euler by default, because there
# `scale_model_input` is not the identity. check_pipeline.py builds the same parts.


# %%
# --8<-- [start:parts]
def make_parts():
    """(training images, vae, the training latents as a FiniteSet, unet): Lab 12's parts."""
    data = toy_images(256, seed=0)  # .images (K, 3, 32, 32) in [-1, 1], .labels (K,)
    vae = PatchPCAAutoencoder.fit(data.images, patch_size=8, latent_channels=4)  # Lab 05
    latents = vae.encode(data.images) * vae.config.scaling_factor  # (K, 4, 4, 4), std 1
    training_set = FiniteSet(latents, data.labels)  # the data the "unet" knows exactly
    unet = ExactDenoiser(training_set, alphas_cumprod(canonical_betas("scaled_linear")), "epsilon")
    return data, vae, training_set, unet


def make_scheduler(kind):
    """A fresh scheduler with SD 1.5's config (its step index starts from scratch)."""
    sd15 = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1)
    if kind == "ddim":  # Lab 12's: scale_model_input is the identity, init_noise_sigma 1
        return DDIMScheduler(**sd15, set_alpha_to_one=False, clip_sample=False)
    if kind == "ddpm":  # level 2's: step adds noise, drawn from the generator it is given
        return DDPMScheduler(**sd15, clip_sample=False)
    # EulerDiscreteScheduler.from_config(SD 1.5's config): init_noise_sigma = sigma_max, 14.615
    # from 2 steps on (at 1 step linspace's only timestep is 0, where sigma is 0.029)
    return EulerDiscreteScheduler(**sd15)


parser = LabArgumentParser(prog=Path(sys.argv[0]).name, description=__doc__.splitlines()[0])
parser.add_argument("--prompt", choices=SHAPES, default="disc", help="the class to generate")
add_pipeline_arguments(parser, guidance_help="CFG scale, >= 0")  # and --steps, --num-samples
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--scheduler", choices=["euler", "ddim"], default="euler")
parser.add_argument(
    "--solution", action="store_true",
    help="run pipeline_solution.txt's pipeline() in place of yours (and draw --figures)",
)  # fmt: skip
add_figures_argument(parser)
args = parse_args(parser)
# Lab 12's bounds, with its one-line errors; DDIM's leading grid with SD 1.5's steps_offset=1
# reaches t = 1000 at 1000 steps, past alphas_cumprod (diffusers raises IndexError there too)
if args.scheduler == "ddim":
    check_pipeline_arguments(parser, args, 999, "DDIM with steps_offset=1 would reach t=1000")
else:
    check_pipeline_arguments(parser, args)

data, vae, training_set, unet = make_parts()
# --8<-- [end:parts]

# %% [markdown]
# ## 2. The inputs
#
# What `StableDiffusionPipeline.__call__` has once `encode_prompt` has run: the prompt's
# condition and the negative prompt's, one row per image, and the starting noise. The
# toy's condition is a class label per row, `(B,)`, with `UNCOND` (-1) for the empty
# prompt; in SD 1.x these are `(B, 77, 768)` text embeddings.

# %%
# --8<-- [start:inputs]
B, n = args.num_samples, args.steps
class_labels = np.full(B, SHAPES.index(args.prompt))  # (B,): the toy's prompt_embeds
negative_class_labels = np.full(B, UNCOND)  # (B,): the empty prompt ""
noise = np.random.default_rng(args.seed).standard_normal((B, 4, 4, 4))  # (B, 4, h, w)
# --8<-- [end:inputs]

# %% [markdown]
# ## 3. Your part: the pipeline
#
# The lines of `StableDiffusionPipeline.__call__` from the doubled condition to the
# decoded image, as it runs when it guides (`guidance_scale > 1`, a UNet without
# `time_cond_proj_dim`), on these parts. Each `blank(n)` is a line to write; the comment
# above it gives the shapes and a hint. Check your lines with check_pipeline.py.


# %%
# --8<-- [start:pipeline]
def pipeline(
    unet, scheduler, vae, prompt_embeds, negative_prompt_embeds, latents,
    num_inference_steps, guidance_scale,
):  # fmt: skip
    """Latents (B, 4, h, w) of noise and conditions (B, ...) -> images (B, 3, H, W)."""
    # BLANK 1 of 6 · the doubled condition rows and their order. One unet call serves both
    # halves of classifier-free guidance: 2B condition rows, here (2B,) labels, in SD 1.x
    # (2B, 77, 768). The order is a convention blank 4 must follow; StableDiffusionPipeline
    # puts the negative prompt's rows first.
    prompt_embeds = blank(1)

    scheduler.set_timesteps(num_inference_steps)  # scheduler.timesteps: (n,), high to low
    latents = latents * scheduler.init_noise_sigma  # the std the scheduler starts from

    for t in scheduler.timesteps:
        # BLANK 2 of 6 · the latents, doubled to match blank 1's rows: (B, 4, h, w) ->
        # (2B, 4, h, w), each half the whole batch.
        latent_model_input = blank(2)

        # BLANK 3 of 6 · what the unet sees at t is the scheduler's business: Euler keeps
        # its latents on a larger scale than the one the unet was trained on (up to
        # init_noise_sigma), DDIM does not. (2B, 4, h, w) in and out.
        latent_model_input = blank(3)

        noise_pred = unet(latent_model_input, t, class_labels=prompt_embeds)  # (2B, 4, h, w)

        # BLANK 4 of 6 · the chunk(2) guidance line: cut the prediction into its two
        # halves in blank 1's order, then go from the unconditional prediction towards
        # the conditional one, guidance_scale times their difference: (B, 4, h, w).
        noise_pred_uncond, noise_pred_text = blank(4)  # noqa: RUF059
        noise_pred = blank(4)  # noqa: F841

        # BLANK 5 of 6 · one scheduler update x_t -> x_{t-1}: the guided prediction, this
        # timestep, and the B latents the loop carries (not the doubled, scaled input).
        # The result holds two arrays; keep the one the next iteration needs.
        latents = blank(5)

    # BLANK 6 of 6 · the unet's latents have unit std because the training latents were
    # multiplied by vae.config.scaling_factor; the decoder wants the scale it encoded to.
    latents = blank(6)

    image = vae.decode(latents)  # (B, 3, H, W), about [-1, 1]
    return image


# --8<-- [end:pipeline]

# %% [markdown]
# ## 4. Level 2 (optional): any guidance_scale, a scheduler that adds noise
#
# `pipeline_any_scale` is `pipeline` as `__call__` runs it at every `guidance_scale`, with
# the latents drawn from a generator and a scheduler whose `step` adds noise (the checker
# runs DDPM at guidance_scale 7.5 and 0, Euler at 1). Its comments give no hints:
# check_pipeline.py checks it once pipeline() matches.


# %%
# --8<-- [start:level2]
def pipeline_any_scale(
    unet, scheduler, vae, prompt_embeds, negative_prompt_embeds, shape, generator,
    num_inference_steps, guidance_scale,
):  # fmt: skip
    """Level 2: pipeline() as __call__ runs it at any guidance_scale, the latents drawn
    from ``generator`` (shape (B, 4, h, w)), with a scheduler that may add noise in step."""
    # BLANK 7 of 9 · whether to guide, and the condition rows the unet gets.
    do_classifier_free_guidance = blank(7)  # noqa: F841
    prompt_embeds = blank(7)  # noqa: F841

    # BLANK 8 of 9 · the starting latents.
    scheduler.set_timesteps(num_inference_steps)
    latents = blank(8)

    for t in scheduler.timesteps:  # noqa: B007
        # BLANK 9 of 9 · one step, the unet call included.
        latent_model_input = blank(9)  # noqa: F841
        noise_pred = blank(9)
        noise_pred_uncond, noise_pred_text = blank(9)  # noqa: RUF059
        noise_pred = blank(9)  # noqa: F841
        latents = blank(9)

    image = vae.decode(latents / vae.config.scaling_factor)  # (B, 3, H, W)
    return image


# --8<-- [end:level2]

# %% [markdown]
# ## 5. Run it
#
# A blank still to fill stops the run with its number; an exception in your lines, with
# the line that raised and its blank, and first, when it raised on a non-array an earlier
# line made (step's whole output kept), that line (a syntax error is Python's own message:
# the file cannot catch it; check_pipeline.py gives it in one line). Filled in, the images come
# out, and the exact denoiser gives a check any reader can run: it memorises its training
# set, so each image, encoded back, should sit on a training latent of the prompted class
# (Lab 12).
# `--solution` runs pipeline_solution.txt's `pipeline()` instead of yours, read from that
# file by `load_function` (its imports and its `def`, nothing else).

# %%
# --8<-- [start:run]
#: pipeline_solution.txt, beside this file (a notebook has no __file__; it runs in this folder)
SOLUTION = Path(globals().get("__file__", "pipeline_solution.txt")).resolve().with_name("pipeline_solution.txt")  # fmt: skip
if not SOLUTION.is_file() and (args.solution or args.figures):
    parser.error(f"pipeline_solution.txt is not beside this file ({SOLUTION.parent}): run the copy in the repository's code/lab-17-rebuild-the-pipeline/")  # fmt: skip
#: where StableDiffusionPipeline stops guiding; printed with a run at those scales
GUIDE_NOTE = "note: StableDiffusionPipeline does not guide at guidance_scale <= 1 (one batch, the prompt's rows alone); this loop always guides: at 1 that is the prompt's prediction on 2B rows, at 0 the unconditional one (level 2 runs StableDiffusionPipeline's rule)"  # fmt: skip


def load_solution(mistake=None):
    """The solution's pipeline(); with ``mistake``, a copy with MISTAKES[mistake] planted."""
    edit = load_constant(SOLUTION, "MISTAKES")[mistake][1:3] if mistake else None
    return load_function(SOLUTION, "pipeline", edit)


def inputs():
    """pipeline()'s arguments: the parts and inputs, with a fresh scheduler."""
    return unet, make_scheduler(args.scheduler), vae, class_labels, negative_class_labels, noise, n, args.guidance_scale  # fmt: skip


def run(fn):
    """Images from ``fn`` on the parts and inputs, with a fresh scheduler."""
    return fn(*inputs())


name = type(make_scheduler(args.scheduler)).__name__
yours = load_solution() if args.solution else pipeline
unfilled = False
try:
    image = run(yours)
except UnfilledBlankError as error:  # a blank to fill: which one, and where
    image, unfilled = None, True
    print(f"blank {error.number} of 6 is not filled in yet: find blank({error.number}) in rebuild_pipeline.py")  # fmt: skip
    print("replace blank(...) there with your code, then check it with check_pipeline.py")
except (Exception, KeyboardInterrupt, SystemExit) as error:  # your line failed: one line
    line, number, _ = error_site(error, yours)
    where = f"line {line}" + (f" (blank {number})" if number else "") if line else "the call"
    text = " ".join(str(error).split())
    if isinstance(error, KeyboardInterrupt | SystemExit):  # no message of their own
        text = "interrupted (Ctrl-C) there" if isinstance(error, KeyboardInterrupt) else "exit() ends the run: pipeline() must return its value"  # fmt: skip
    # a line that raised on a value an earlier line handed on (a SchedulerOutput kept from
    # step where an array goes): name the line that made it first
    if isinstance(error, Exception) and (found := handed_on(error, yours, *inputs())):
        v, at, value = found
        cause = f"line {at}" + (f" (blank {blank_at(yours, at)})" if blank_at(yours, at) else "")
        parser.error(f"your pipeline()'s {cause} makes {v} a {type(value).__name__}, not an array, and {where} then raised {type(error).__name__}: {text}; check_pipeline.py names the blank that differs")  # fmt: skip
    parser.error(f"your pipeline() raised {type(error).__name__} at {where}: {text}; check_pipeline.py names the blank that differs")  # fmt: skip
decoded = (B, *data.images.shape[1:])
if not unfilled and not (isinstance(image, np.ndarray) and image.shape == decoded):
    parser.error(f"your pipeline() returns {getattr(image, 'shape', type(image).__name__)}, not images {decoded}: check_pipeline.py names the blank that differs")  # fmt: skip
if image is not None:
    print(f"pipeline(): prompt {args.prompt!r}, guidance_scale {args.guidance_scale:g}, {n} step{'s' * (n != 1)} of {name}, B = {B}")  # fmt: skip
    print(f"unet: {unet.calls} call{'s' * (unet.calls != 1)} on {unet.rows // unet.calls} rows each")  # fmt: skip
    print(f"image: {image.shape} {image.dtype}, range {image.min():.2f}..{image.max():.2f}")
    latents_back = vae.encode(image) * vae.config.scaling_factor  # the linear vae inverts exactly
    nearest, rms = training_set.nearest(latents_back)
    purity = np.mean(data.labels[nearest] == SHAPES.index(args.prompt))
    print(f"nearest training latent has the prompt's label: {purity:.1%} of {len(image)} (RMS distance max {rms.max():.3f})")  # fmt: skip
    if args.guidance_scale <= 1:  # where StableDiffusionPipeline stops guiding
        print(GUIDE_NOTE)
    if not args.solution:
        print("next: python3 code/lab-17-rebuild-the-pipeline/check_pipeline.py compares every blank with the solution's")  # fmt: skip
# --8<-- [end:run]

# %% [markdown]
# ## 6. Picture it
#
# What typical mistakes do to the images: the first row is this file's pipeline (or with
# `--solution`, the solution's), each row below it the solution with one blank wrong, as
# pipeline_solution.txt's MISTAKES table plants it. Drawn with `--figures`.

# %%
# --8<-- [start:figures]
#: the mistakes drawn, one row each, in blank order
DRAWN = ["order-swapped", "no-scale-model-input", "guidance-sign", "pred-original", "no-division"]  # fmt: skip
if args.figures and image is not None:
    shown = min(B, 8)
    # each planted mistake is a known-wrong run drawn on purpose: its warnings (Euler's step
    # before scale_model_input) are caught, not printed
    rows = [image[:shown]] + [with_warnings(run, load_solution(key))[0][:shown] for key in DRAWN]  # fmt: skip
    grid = image_grid(np.clip(np.concatenate(rows), -1, 1), columns=shown)
    table = load_constant(SOLUTION, "MISTAKES")
    mistakes = "; ".join(f"blank {table[k][0]}: {table[k][1]} -> {table[k][2]}" for k in DRAWN)
    top = "the solution's pipeline" if args.solution else "this file's pipeline"
    figures.save(
        args.figures, "mistakes", figures.png(grid, scale=2),
        alt=f"Six rows of {shown} small images generated for the prompt '{args.prompt}' with "
        f"{name}, in blank order ({mistakes}). As drawn at the default flags: the top row, "
        f"{top}, is training images of the prompted class; rows 2 and 4 (the "
        "condition order swapped, the guidance sign flipped) are saturated blocks, far outside "
        "the pixel range in places; row 3 (no scale_model_input) is clean images of the prompted class, "
        "mostly other ones than the top row's; row 5 (pred_original_sample carried) is one image "
        "eight times; row 6 (no division by scaling_factor) is the top row at lower contrast.",
        caption=f"Rows, top to bottom: {top} ({name}, prompt '{args.prompt}'), "
        "then one typical mistake per row: blank 1's condition order swapped, blank 3's "
        "scale_model_input left out, blank 4's guidance sign flipped, blank 5's "
        "pred_original_sample carried instead of prev_sample, blank 6's division by "
        "scaling_factor left out.",
    )  # fmt: skip
# --8<-- [end:figures]
