"""Lab 03: what does a scheduler own: the time axis, the input scaling, or the update?

All three. ``set_timesteps`` turns the 1000 training timesteps into the few
inference timesteps (and, for sigma-based schedulers, the noise levels
``sigmas``); ``scale_model_input`` adapts ``latents`` to what the network was
trained on; ``step`` maps the network's prediction to the next ``latents``. The
trap: ``step`` reads the prediction through ``prediction_type``, and diffusers'
``DDIMScheduler`` with ``epsilon`` and ``v_prediction`` swapped still runs, to wrong
``latents``.

Run it:  python3 code/lab-03-scheduler-reading/scheduler_reading.py --steps 10
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
    BETA_SCHEDULES,
    ExactDenoiser,
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
    parse_args,
)
from labkit.denoiser import PREDICTION_TYPES
from labkit.metrics import sample_quality
from labkit.schedulers import (
    DDIMScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
)
from labkit.schedules import CANONICAL_BETA_RANGE

# %% [markdown]
# ## 1. Setup / contract
#
# One beta schedule (Stable Diffusion's `scaled_linear` by default) shared by
# every scheduler, the toy mixture, and a batch of starting noise
# `(num_samples, 2)` float64. `--steps` is `num_inference_steps`.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="scheduler_reading.py", description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int_at_least(1), default=10, help="num_inference_steps")
parser.add_argument("--beta-schedule", choices=BETA_SCHEDULES, default="scaled_linear")
parser.add_argument("--num-samples", type=int_at_least(100), default=2000)
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)
if args.steps > 1000:
    parser.error(f"--steps must be <= 1000 (num_train_timesteps), got {args.steps}")

beta_start, beta_end = CANONICAL_BETA_RANGE[args.beta_schedule]
betas_config = dict(beta_schedule=args.beta_schedule, beta_start=beta_start, beta_end=beta_end)
alphas_cumprod_ = alphas_cumprod(canonical_betas(args.beta_schedule))  # (1000,)
mixture = default_mixture()
rng = np.random.default_rng(args.seed)
noise = rng.standard_normal((args.num_samples, 2))  # (N, 2) the starting latents, unit variance
np.set_printoptions(precision=3, suppress=True, linewidth=100)
# --8<-- [end:setup]

# %% [markdown]
# ## 2. set_timesteps: the inference time axis
#
# The same `num_inference_steps` gives different timesteps under each
# `timestep_spacing`. Stable Diffusion 1.x ships `leading` with
# `steps_offset=1`; `trailing` starts at the last training timestep.
# Euler works on noise levels `sigmas` (one more entry than `timesteps`: the
# final 0), and Karras sigmas crowd the steps at low noise. Flow matching's
# `sigmas` run from 1 to 0, bent toward high noise by `shift`.

# %%
# --8<-- [start:timesteps]
for spacing, offset in [("leading", 1), ("trailing", 0), ("linspace", 0)]:
    ddim = DDIMScheduler(timestep_spacing=spacing, steps_offset=offset, **betas_config)
    ddim.set_timesteps(args.steps)
    print(f"DDIM {spacing:>8} (steps_offset={offset}): timesteps {ddim.timesteps}")

for karras in (False, True):
    euler = EulerDiscreteScheduler(use_karras_sigmas=karras, **betas_config)
    euler.set_timesteps(args.steps)
    print(f"Euler karras={karras!s:>5}: sigmas {euler.sigmas}")

for shift in (1.0, 3.0):
    flow = FlowMatchEulerDiscreteScheduler(shift=shift)
    flow.set_timesteps(args.steps)
    print(f"Flow shift={shift}: sigmas {flow.sigmas}")
# --8<-- [end:timesteps]

# %% [markdown]
# ## 3. init_noise_sigma and scale_model_input: what the network sees
#
# DDIM's latents live at unit variance, so the starting noise is used as is and
# `scale_model_input` is the identity. Euler's latents are x0 + sigma * eps,
# with variance ~ 1 + sigma^2: the pipeline multiplies the starting noise by
# `init_noise_sigma`, and `scale_model_input` divides by sqrt(sigma^2 + 1)
# so the network again gets unit-variance input, as in training.

# %%
# --8<-- [start:scaling]
ddim = DDIMScheduler(**betas_config)
ddim.set_timesteps(args.steps)
euler = EulerDiscreteScheduler(**betas_config)
euler.set_timesteps(args.steps)
for name, scheduler in [("DDIM", ddim), ("Euler", euler)]:
    latents = noise * scheduler.init_noise_sigma  # (N, 2) the loop's starting state
    t = scheduler.timesteps[0]
    model_input = scheduler.scale_model_input(latents, t)
    print(
        f"{name:>5}: init_noise_sigma={scheduler.init_noise_sigma:8.3f}  std(latents)={latents.std():7.3f}"
        f"  std(scale_model_input)={model_input.std():5.3f}"
    )
# --8<-- [end:scaling]

# %% [markdown]
# ## 4. step: the same update from three prediction types
#
# Take one state at the fourth inference timestep and three perfect models,
# trained on `epsilon`, `sample` and `v_prediction`. Configured with the
# matching `prediction_type`, `step` recovers the same `pred_original_sample`
# and the same `prev_sample` from all three.

# %%
# --8<-- [start:step]
t = ddim.timesteps[min(3, len(ddim.timesteps) - 1)]
x0, _ = mixture.sample(args.num_samples, rng)
latents = ddim.add_noise(x0, noise, np.full(args.num_samples, t))  # (N, 2) a state at t

prev = {}
for prediction_type in PREDICTION_TYPES:
    unet = ExactDenoiser(mixture, alphas_cumprod_, prediction_type)
    scheduler = DDIMScheduler(prediction_type=prediction_type, clip_sample=False, **betas_config)
    scheduler.set_timesteps(args.steps)
    prev[prediction_type] = scheduler.step(unet(latents, t), t, latents).prev_sample
spread = max(np.abs(prev[p] - prev["epsilon"]).max() for p in PREDICTION_TYPES)
print(f"t={t}: max |prev_sample difference| across prediction types = {spread:.1e}")
# --8<-- [end:step]

# %% [markdown]
# ## 5. The trap: a prediction-type mismatch breaks sampling
#
# Full DDIM loops with `--steps` steps. The model is trained on `v_prediction`
# (as SD 2.x 768 is); the scheduler is configured correctly in one run and
# left at the `epsilon` default in the other. `on_mode` is the fraction of
# samples within 3 std of a mode (98.9% for true data); `weight_err` is the
# total-variation distance between the sampled mode shares and the true weights.


# %%
# --8<-- [start:mismatch]
def sample(prediction_type_model: str, prediction_type_scheduler: str) -> np.ndarray:
    unet = ExactDenoiser(mixture, alphas_cumprod_, prediction_type_model)
    scheduler = DDIMScheduler(
        prediction_type=prediction_type_scheduler, clip_sample=False, **betas_config
    )
    scheduler.set_timesteps(args.steps)
    latents = noise * scheduler.init_noise_sigma
    for t in scheduler.timesteps:
        model_input = scheduler.scale_model_input(latents, t)
        latents = scheduler.step(unet(model_input, t), t, latents).prev_sample
    return latents


print(f"{'model':>13} {'scheduler':>13} {'on_mode':>8} {'weight_err':>11} {'mean |x|':>9}")
for model_type, scheduler_type in [
    ("v_prediction", "v_prediction"),
    ("v_prediction", "epsilon"),
    ("epsilon", "epsilon"),
    ("epsilon", "sample"),
]:
    samples = sample(model_type, scheduler_type)
    q = sample_quality(mixture, samples)
    radius = np.linalg.norm(samples, axis=1).mean()  # the modes sit at radius 2
    print(
        f"{model_type:>13} {scheduler_type:>13} {q.on_mode:>8.1%} {q.weight_error:>11.3f} {radius:>9.2f}"
    )
# --8<-- [end:mismatch]

# %% [markdown]
# ## 6. Picture it
#
# First: where each spacing puts its `args.steps` timesteps (step index on the x
# axis). Second: the noise level `sigma` each Euler grid visits, on a log axis.
# Third: all four grids (leading, trailing, linspace, Karras) on one log sigma axis.

# %%
# --8<-- [start:figures]
grids = {}
for spacing, offset in [("leading", 1), ("trailing", 0), ("linspace", 0)]:
    ddim = DDIMScheduler(timestep_spacing=spacing, steps_offset=offset, **betas_config)
    ddim.set_timesteps(args.steps)
    # trailing has one entry more at a few counts (62 at 61 steps, the last -1), as diffusers'
    grids[f"{spacing}, steps_offset={offset}"] = (np.arange(len(ddim.timesteps)), ddim.timesteps)
timestep_chart = figures.line_chart(
    grids, "step index i", "timesteps[i]", markers=args.steps <= 50
)  # fmt: skip
sigma_grids = {}
for karras in (False, True):
    euler = EulerDiscreteScheduler(use_karras_sigmas=karras, **betas_config)
    euler.set_timesteps(args.steps)
    label = "Euler, Karras sigmas" if karras else "Euler, linspace"
    sigma_grids[label] = (np.arange(args.steps), euler.sigmas[:-1])  # the final 0 is off a log axis
sigma_chart = figures.line_chart(
    sigma_grids, "step index i", "sigmas[i], log scale", logy=True, markers=args.steps <= 50
)  # fmt: skip
figures.save(
    args.figures, "timesteps", timestep_chart,
    alt=f"Line chart of DDIM timesteps against step index for {args.steps} steps: "
    + ", ".join(f"{label} runs from {ts[0]} to {ts[-1]}" for label, (_, ts) in grids.items())
    + "; all three fall in near-equal strides.",
    caption=f"The timesteps each timestep_spacing gives DDIM ({args.steps} steps).",
)  # fmt: skip
figures.save(
    args.figures, "sigmas", sigma_chart,
    alt=f"Line chart, log scale, of Euler sigmas against step index for {args.steps} steps: "
    + "; ".join(f"{label} runs from {s[0]:.3f} to {s[-1]:.3f}, {int(np.sum(s < 0.5))} steps below 0.5"
                for label, (_, s) in sigma_grids.items()) + ".",
    caption="Noise levels visited by EulerDiscreteScheduler, linspace against Karras sigmas.",
)  # fmt: skip

# All four grids on one sigma axis: SDXL's shipped Euler config (leading, steps_offset=1, SD's
# betas; SD 1.5 ships PNDM, and Euler.from_config on it gets linspace) and the two spacings of
# Lin et al., then Karras sigmas on that same leading config. diffusers takes the Karras end
# points from the spaced grid, so Karras spans leading's range, redistributed.
sigma_axis = {}  # label -> (n,) sigmas visited, high to low (the final 0 is off a log axis)
for label, config in [
    ("leading (SDXL's Euler)", dict(timestep_spacing="leading", steps_offset=1)),
    ("trailing", dict(timestep_spacing="trailing")),
    ("linspace", dict(timestep_spacing="linspace")),
    ("Karras on leading", dict(timestep_spacing="leading", steps_offset=1, use_karras_sigmas=True)),
]:  # fmt: skip
    grid_euler = EulerDiscreteScheduler(**config, **betas_config)
    grid_euler.set_timesteps(args.steps)
    sigma_axis[label] = grid_euler.sigmas[:-1]
sigma_max = float(((1 - alphas_cumprod_[-1]) / alphas_cumprod_[-1]) ** 0.5)  # sigma at t = 999
lead, trail, lin, karras = sigma_axis.values()
low = [int(np.sum(s < 0.5)) for s in (lead, trail, lin, karras)]  # steps spent below sigma 0.5
sigma_grid_chart = figures.line_chart(
    {label: (s, np.arange(len(s))) for label, s in sigma_axis.items()},
    "sigma visited, log scale", "step index i", logx=True, markers=args.steps <= 50,
)  # fmt: skip
figures.save(
    args.figures, "sigma-grids", sigma_grid_chart,
    alt=f"Line chart with dots: the sigma each grid visits on a log x axis, step index on the "
    f"y axis, for {args.steps} Euler steps on the {args.beta_schedule} schedule "
    f"(sigma_max = {sigma_max:.2f}). Trailing starts at {trail[0]:.2f}, linspace at {lin[0]:.2f}; "
    f"leading with steps_offset=1 starts at {lead[0]:.2f} (so its init_noise_sigma is "
    f"{(lead[0] ** 2 + 1) ** 0.5:.2f}), and so does the Karras grid, which shares leading's end points. At the "
    f"low end linspace reaches {lin[-1]:.3f}, leading and Karras {lead[-1]:.3f}, while trailing "
    f"stops at {trail[-1]:.3f}. Below sigma = 0.5 leading takes {low[0]} steps, trailing "
    f"{low[1]}, linspace {low[2]} and Karras {low[3]}.",
    caption=f"The noise levels each EulerDiscreteScheduler grid visits ({args.steps} steps, "
    f"{args.beta_schedule}): Karras sigmas keep the end points of the configured spacing"
    + (" and move steps toward low noise." if low[3] > low[0] else "."),
)  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(timestep_chart), SVG(sigma_chart), SVG(sigma_grid_chart))
# --8<-- [end:figures]
