"""Lab 11: what does the number of loop steps buy, for each scheduler?

The loop is the spine of every diffusers pipeline: ``latents`` is the state,
the denoiser is called once per timestep, and ``scheduler.step`` owns the
update. Loop count drives latency (one denoiser call per step), and the
scheduler and its timesteps decide how much quality each call buys. The trap:
the loop is not a progress bar; changing the timesteps changes both the result
and the cost.

Run it:  python code/lab-11-scheduler-loop-reading/scheduler_loop.py --steps 5,10,25,50
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
from labkit.cli import LabArgumentParser, add_figures_argument, in_notebook, int_list, parse_args
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
parser.add_argument("--num-samples", type=int, default=2000)
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)
names = [name.strip() for name in args.schedulers.split(",") if name.strip()]
unknown = [name for name in names if name not in SCHEDULERS]
if unknown or not names:
    parser.error(
        f"unknown scheduler {unknown or args.schedulers!r}; choose from {', '.join(SCHEDULERS)}"
    )
if not all(1 <= n <= 1000 for n in args.steps):
    parser.error(f"--steps values must be in [1, 1000], got {args.steps}")
if args.num_samples < 100:
    parser.error(f"--num-samples must be >= 100, got {args.num_samples}")

# SD 1.5's scheduler_config.json, the keys these schedulers share (steps_offset moves only
# the `leading` grid, DDPM's here; `trailing` and `linspace` ignore it)
sd_config = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1)
mixture = default_mixture()
cond = args.class_label  # None: unconditional
noise = np.random.default_rng(args.seed).standard_normal((args.num_samples, 2))  # (N, 2)


def make(name):
    """A fresh scheduler and its matching perfect denoiser."""
    if name == "flow_match":
        return FlowMatchEulerDiscreteScheduler(shift=3.0), FlowMatchDenoiser(mixture)
    unet = ExactDenoiser(mixture, alphas_cumprod(canonical_betas("scaled_linear")), "epsilon")
    if name == "ddpm":
        return DDPMScheduler(clip_sample=False, **sd_config), unet
    if name == "ddim":
        return DDIMScheduler(clip_sample=False, timestep_spacing="trailing", **sd_config), unet
    karras = name == "euler_karras"
    return EulerDiscreteScheduler(use_karras_sigmas=karras, **sd_config), unet


# --8<-- [end:setup]

# %% [markdown]
# ## 2. Main transition: the loop
#
# Exactly the shape of a diffusers pipeline's denoising loop, minus CFG (lab
# 04): scale the input, call the denoiser once, let the scheduler step.
# DDPM's step is stochastic, so it takes a seeded generator.


# %%
# --8<-- [start:loop]
def run_loop(scheduler, unet, num_inference_steps, seed, trajectory=None):
    scheduler.set_timesteps(num_inference_steps)
    generator = np.random.default_rng(seed)  # only DDPM draws from it
    latents = noise * scheduler.init_noise_sigma  # (N, 2)
    for t in scheduler.timesteps:
        model_input = scheduler.scale_model_input(latents, t)  # identity except Euler
        if trajectory is not None:
            trajectory.append(model_input)  # what the denoiser sees at each step
        noise_pred = unet(model_input, t, class_labels=cond)  # one denoiser call per step
        if isinstance(scheduler, DDPMScheduler):
            latents = scheduler.step(noise_pred, t, latents, generator=generator).prev_sample
        else:
            latents = scheduler.step(noise_pred, t, latents).prev_sample
    return latents


# --8<-- [end:loop]

# %% [markdown]
# ## 3. Check: quality and cost against the step count
#
# `on_mode`: samples within 3 std of a mode (98.9% for real data, so more is
# not better). `weight_err`: total-variation distance between the sampled mode
# shares and the true weights (0.4 / 0.3 / 0.2 / 0.1). `spread`: how wide the
# samples sit around their mode, relative to the data (1.00; below 1 means too
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
# One panel per scheduler at the smallest step count: grey lines follow 24
# samples through the loop, as the denoiser sees them (`scale_model_input`'s
# output, so Euler's states are shown at the network's scale), and the dots
# are 400 final samples, coloured by their nearest mode.

# %%
# --8<-- [start:figures]
few = min(args.steps)
panels = []
for name in names:
    scheduler, unet = make(name)
    trajectory = []
    samples = run_loop(scheduler, unet, few, args.seed, trajectory)
    paths = np.stack([*trajectory, samples])[:, :24]  # (steps + 1, 24, 2)
    nearest = np.linalg.norm(samples[:400, None] - mixture.means[None], axis=-1).argmin(1)
    panels.append((name, samples[:400], nearest, paths))
trajectories = figures.scatter_panels(panels, lim=3.2, columns=len(panels), size=150)
figures.save(
    args.figures, "trajectories", trajectories,
    alt=f"{len(panels)} panels, one per scheduler ({', '.join(names)}) at {few} steps: grey "
    "lines trace 24 samples from the starting noise to their final position, and coloured "
    "dots show 400 final samples, which gather on the four modes of the ring more or less "
    "tightly depending on the scheduler.",
    caption=f"Sample trajectories and final samples at num_inference_steps={few}, per scheduler.",
)  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(trajectories))
# --8<-- [end:figures]
