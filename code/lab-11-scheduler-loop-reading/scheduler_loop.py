"""Lab 11: what does the number of loop steps buy, for each scheduler?

The loop is the spine of every diffusers pipeline: ``latents`` is the state,
the denoiser is called once per timestep, and ``scheduler.step`` owns the
update. Loop count drives latency (one denoiser call per step), and the
scheduler and its timesteps decide how much quality each call buys. The trap:
the loop is not a progress bar; changing the timesteps changes both the result
and the cost.

Run it:  python3 code/lab-11-scheduler-loop-reading/scheduler_loop.py --steps 5,10,25,50
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
    FlowMatchDenoiser,
    alphas_cumprod,
    canonical_betas,
    default_mixture,
    figures,
)
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    in_notebook,
    int_at_least,
    int_list,
    parse_args,
)
from labkit.images import FiniteSet, image_grid, toy_images
from labkit.metrics import sample_quality
from labkit.schedulers import (
    DDIMScheduler,
    DDPMScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
)

# %% [markdown]
# ## 1. Setup / contract
#
# Stable Diffusion's beta schedule, the four-mode toy mixture, a batch of
# `(num_samples, 2)` starting noise, and a perfect denoiser per family: the
# exact epsilon model for the DDPM-style schedulers, the exact velocity model
# for flow matching. `--class-label` conditions every call, the way
# `prompt_embeds` do; by default the model is unconditional.

# %%
# --8<-- [start:setup]
SCHEDULERS = ["ddpm", "ddim", "euler", "euler_karras", "flow_match"]

parser = LabArgumentParser(prog="scheduler_loop.py", description=__doc__.splitlines()[0])
parser.add_argument(
    "--steps", type=int_list, default=[5, 10, 25, 50], help="num_inference_steps list"
)
parser.add_argument("--schedulers", default=",".join(SCHEDULERS), help="comma-separated subset")
parser.add_argument("--class-label", type=int, choices=[0, 1], default=None)
parser.add_argument("--num-samples", type=int_at_least(100), default=2000)
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)
names = [name.strip() for name in args.schedulers.split(",") if name.strip()]
unknown = [name for name in names if name not in SCHEDULERS]
if unknown or not names:
    parser.error(
        f"unknown scheduler {unknown or args.schedulers!r}; choose from {', '.join(SCHEDULERS)}"
    )
if not all(1 <= n <= 999 for n in args.steps):  # steps_offset=1 reaches t=1000 at 1000
    parser.error(f"--steps values must be in [1, 999] (steps_offset=1 would reach t=1000), got {args.steps}")  # fmt: skip

# SD 1.5's scheduler_config.json, the keys these schedulers share (steps_offset moves only
# the `leading` grid, DDPM's here; `trailing` and `linspace` ignore it)
sd_config = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1)
mixture = default_mixture()
cond = args.class_label  # None: unconditional
noise = np.random.default_rng(args.seed).standard_normal((args.num_samples, 2))  # (N, 2)


def make(name, data=mixture):
    """A fresh scheduler and its matching perfect denoiser of ``data``."""
    if name == "flow_match":
        return FlowMatchEulerDiscreteScheduler(shift=3.0), FlowMatchDenoiser(data)
    unet = ExactDenoiser(data, alphas_cumprod(canonical_betas("scaled_linear")), "epsilon")
    if name == "ddpm":
        return DDPMScheduler(clip_sample=False, **sd_config), unet
    if name == "ddim":  # trailing: first step at t = 999; set_alpha_to_one: last lands on x0_hat
        ddim = DDIMScheduler(
            clip_sample=False, timestep_spacing="trailing", set_alpha_to_one=True, **sd_config
        )
        return ddim, unet
    karras = name == "euler_karras"
    return EulerDiscreteScheduler(use_karras_sigmas=karras, **sd_config), unet


# --8<-- [end:setup]

# %% [markdown]
# ## 2. Main transition: the loop
#
# Exactly the shape of a diffusers pipeline's denoising loop, minus CFG (lab
# 04): scale the input, call the denoiser once, let the scheduler step.
# DDPM's step is stochastic, so it takes a seeded generator. `step` returns the
# next `latents` and its estimate of the clean sample, `pred_original_sample`
# (x0_hat); `trajectory` keeps both for the figures. `start` swaps the toy's
# `(N, 2)` noise for noise of any shape: the loop never looks at the shape.


# %%
# --8<-- [start:loop]
def run_loop(scheduler, unet, num_inference_steps, seed, trajectory=None, start=None):
    scheduler.set_timesteps(num_inference_steps)
    generator = np.random.default_rng(seed)  # only DDPM draws from it
    latents = (noise if start is None else start) * scheduler.init_noise_sigma  # (N, 2)
    for t in scheduler.timesteps:
        model_input = scheduler.scale_model_input(latents, t)  # identity except Euler
        noise_pred = unet(model_input, t, class_labels=cond)  # one denoiser call per step
        if isinstance(scheduler, DDPMScheduler):
            output = scheduler.step(noise_pred, t, latents, generator=generator)
        else:
            output = scheduler.step(noise_pred, t, latents)
        if trajectory is not None:  # per step: what the denoiser saw, and the estimate of x0
            trajectory.append((model_input, output.pred_original_sample))
        latents = output.prev_sample  # x_t -> x_{t-1}, same shape
    return latents


# --8<-- [end:loop]

# %% [markdown]
# ## 3. Check: quality and cost against the step count
#
# `on_mode`: samples within 3 std of a mode (98.9% for real data, so more is
# not better). `weight_err`: total-variation distance between the sampled mode
# shares and the true weights (0.4 / 0.3 / 0.2 / 0.1). `spread`: how wide the
# on-mode samples sit around their mode, relative to the data (1.00; below 1 means too
# narrow, above 1 smeared). `calls`: denoiser calls, the
# latency proxy: in a real pipeline each one is a UNet pass, which dwarfs the
# scheduler's arithmetic, so wall time follows this column.

# %%
# --8<-- [start:table]
print(
    f"{'scheduler':>13} {'steps':>5} {'calls':>5} {'on_mode':>8} {'weight_err':>10} {'spread':>7}"
)
for name in names:
    for num_inference_steps in args.steps:
        scheduler, unet = make(name)
        samples = run_loop(scheduler, unet, num_inference_steps, args.seed)
        q = sample_quality(mixture if cond is None else mixture.restrict(cond), samples)
        print(
            f"{name:>13} {num_inference_steps:>5} {unet.calls:>5} {q.on_mode:>8.1%}"
            f" {q.weight_error:>10.3f} {q.spread:>7.2f}"
        )
# --8<-- [end:table]

# %% [markdown]
# ## 4. Picture it
#
# Drawn only with `--figures DIR` (or in the notebook), so a plain run stays fast.
# `trajectories`: one panel per scheduler at the smallest step count, plus the true
# data; grey lines follow 24 samples through the loop as the denoiser sees them
# (`scale_model_input`'s output, so Euler's states are at the network's scale), dots
# are 400 final samples coloured by their nearest mode. `images`: the same loop and
# `make("ddim")` on Lab 12's toy images (`(1, 3, 32, 32)` pixels, the exact denoiser
# of 256 training images): x_t and x0_hat at each of 10 steps.


# %%
# --8<-- [start:figures]
def image_strip(num_inference_steps=10, seed=0):
    """Per step x_t and x0_hat (n, 3, 32, 32); the output (3, 32, 32); the image it reached."""
    toy = toy_images(256, seed=0)  # (256, 3, 32, 32) in [-1, 1]: discs, squares, bars
    training_set = FiniteSet(toy.images, toy.labels)
    scheduler, unet = make("ddim", data=training_set)  # the same scheduler, another "unet"
    start = np.random.default_rng(seed).standard_normal((1, 3, 32, 32))  # (1, 3, 32, 32)
    steps = []
    output = run_loop(scheduler, unet, num_inference_steps, seed, steps, start)
    x_t, x0_hat = (np.concatenate(part) for part in zip(*steps, strict=True))
    target = toy.images[training_set.nearest(output)[0][0]]  # the training image reached
    return x_t, x0_hat, output[0], target


if args.figures is not None or in_notebook():
    few = min(args.steps)
    panels = []
    for name in names:
        scheduler, unet = make(name)
        trajectory = []
        samples = run_loop(scheduler, unet, few, args.seed, trajectory)
        paths = np.stack([x for x, _ in trajectory] + [samples])[:, :24]  # (steps + 1, 24, 2)
        nearest = np.linalg.norm(samples[:400, None] - mixture.means[None], axis=-1).argmin(1)
        panels.append((name, samples[:400], nearest, paths))
    data = mixture if cond is None else mixture.restrict(cond)
    true, labels = data.sample(400, np.random.default_rng(args.seed))
    panels.append(("true data", true, labels))
    trajectories = figures.scatter_panels(panels, lim=3.2, columns=3, size=240)
    figures.save(
        args.figures, "trajectories", trajectories,
        alt=f"{len(panels)} square panels in rows of three: one per scheduler ({', '.join(names)}) "
        f"at {few} steps, and last the true data. Grey lines trace 24 samples from the starting "
        "noise to their final position; coloured dots show 400 final samples, which gather on the "
        "four modes of the ring more or less tightly depending on the scheduler.",
        caption=f"Sample trajectories and final samples at num_inference_steps={few}, per "
        "scheduler; the last panel is 400 samples of the true data, for comparison.",
    )  # fmt: skip
    x_t, x0_hat, output, target = image_strip()
    err = np.sqrt(np.mean((x0_hat - target) ** 2, axis=(1, 2, 3)))  # (n,) RMS to the target
    settled = int(np.argmax(err < 0.01)) + 1  # first step whose x0_hat is within 0.01
    top, bottom = np.concatenate([x_t, output[None]]), np.concatenate([x0_hat, target[None]])
    strip = figures.png(image_grid(np.concatenate([top, bottom]), columns=len(top)), scale=3)
    figures.save(
        args.figures, "images", strip,
        alt=f"Two rows of {len(top)} small images. Top: x_t at each of {len(x_t)} DDIM steps, "
        "pure colour noise at the first that slowly shows a coloured shape, then the output, "
        "the clean shape. Bottom: x0_hat at each step, a dim blur (the average "
        f"of many training images) at the first, already the sharp shape by step {settled}, "
        "then the training image the output is nearest to: the same shape.",
        caption=f"The same loop on 32 x 32 toy images (DDIM, {len(x_t)} steps, the exact "
        "denoiser of 256 training images). Top: x_t entering each step, then the output. "
        "Bottom: x0_hat at each step, then the nearest training image. x0_hat's RMS error to "
        f"that image falls from {err[0]:.2f} at step 1 to under 0.01 by step {settled}; x_t "
        "stays visibly noisy much longer.",
    )  # fmt: skip
    if in_notebook():
        from IPython.display import SVG, Image, display

        display(SVG(trajectories))
        display(Image(data=strip))
# --8<-- [end:figures]
