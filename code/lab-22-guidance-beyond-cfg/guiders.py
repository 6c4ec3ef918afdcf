"""Lab 22: which guidance rules stop CFG's overshoot, and what does each cost per step?

diffusers' guiders (``diffusers.guiders``) each combine a step's predictions into one
``noise_pred``: CFG extrapolates from ``pred_uncond`` past ``pred_cond``; APG down-weights
the part of that push parallel to ``pred_cond``; CFG-Zero* replaces ``pred_uncond`` by the
projection of ``pred_cond`` onto it and zeroes the first steps; tangential CFG keeps only the part
of ``pred_uncond`` along the pair's main direction; PAG, SLG and SEG add a third
prediction. The state is ``latents`` (N, 2); the trap: a rule that
changes the combine line can change the cost too, one denoiser call per prediction per step.

Run it:  python3 code/lab-22-guidance-beyond-cfg/guiders.py --guidance-scales 3,7.5
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
from labkit.denoiser import UNCOND, FlowMatchDenoiser
from labkit.metrics import purity
from labkit.schedulers import DDIMScheduler, FlowMatchEulerDiscreteScheduler

# %% [markdown]
# ## 1. Setup / contract
#
# Lab 04's toy: two overlapping classes, class 0 around (-0.7, 0) and class 1 around
# (+0.7, 0), std 0.6; the prompt is class 1. `unet` is the exact denoiser; `class_labels`
# stands in for `prompt_embeds`, `UNCOND` (-1) for the empty prompt. With
# `--prediction-type epsilon` (default) it predicts the noise on SD 1.5's schedule and DDIM
# steps it, as in lab 04; with `flow` it predicts the velocity `noise - x0`, stepped by
# flow-matching Euler. `weak_unet` is the perturbed
# branch's stand-in: the exact denoiser of the same classes blurred to std 1.0.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="guiders.py", description=__doc__.splitlines()[0])
parser.add_argument("--guidance-scales", type=float_list(minimum=1.0), default=[1.0, 4.0, 15.0])  # fmt: skip
parser.add_argument("--prediction-type", choices=["epsilon", "flow"], default="epsilon")
parser.add_argument("--steps", type=int_at_least(2), default=30, help="num_inference_steps")
parser.add_argument("--num-samples", type=int_at_least(100, 20_000), default=500)
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)
if args.steps > 500 or max(args.guidance_scales) > 100:
    parser.error("--steps must be <= 500 and --guidance-scales <= 100")


def two_classes(std):
    return GaussianMixture(
        means=np.array([[-0.7, 0.0], [0.7, 0.0]]),  # (K=2, 2)
        stds=np.array([std, std]),
        weights=np.array([0.5, 0.5]),
        classes=np.array([0, 1]),
    )


mixture, target_class = two_classes(0.6), 1
if args.prediction_type == "epsilon":
    betas = alphas_cumprod(canonical_betas("scaled_linear"))
    unet, weak_unet = (ExactDenoiser(two_classes(s), betas, "epsilon") for s in (0.6, 1.0))
    scheduler = DDIMScheduler(
        beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
        steps_offset=1, clip_sample=False, set_alpha_to_one=False,
    )  # fmt: skip
else:
    unet, weak_unet = (FlowMatchDenoiser(two_classes(s)) for s in (0.6, 1.0))
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0)
scheduler.set_timesteps(args.steps)
noise = np.random.default_rng(args.seed).standard_normal((args.num_samples, 2))  # (N, 2)
# --8<-- [end:setup]

# %% [markdown]
# ## 2. Main transition: the combine rules, one function per diffusers class
#
# Each takes `pred_cond` and `pred_uncond`, `(N, ...)`, and returns the guided prediction,
# with the class's default arguments. Norms, dot products and stds run per row over every
# axis but the batch axis, as the guiders do (APG: `adaptive_projected_guidance_norm_dim=None`).
# `use_original_formulation` starts from `pred_cond` instead of `pred_uncond`.


# %%
# --8<-- [start:rules]
def per_row(x):
    return x.reshape(len(x), -1)  # (N, D): every non-batch axis flattened, like flatten(1)


def rescale_noise_cfg(noise_cfg, pred_cond, guidance_rescale):
    # match each row's std to pred_cond's (torch's std: ddof=1), then mix back
    std_text = per_row(pred_cond).std(axis=1, ddof=1).reshape(-1, *[1] * (pred_cond.ndim - 1))
    std_cfg = per_row(noise_cfg).std(axis=1, ddof=1).reshape(std_text.shape)
    rescaled = noise_cfg * (std_text / std_cfg)
    return guidance_rescale * rescaled + (1 - guidance_rescale) * noise_cfg


def ClassifierFreeGuidance(pred_cond, pred_uncond, guidance_scale=7.5, guidance_rescale=0.0, use_original_formulation=False):  # noqa: N802  # fmt: skip
    pred = pred_cond if use_original_formulation else pred_uncond
    pred = pred + guidance_scale * (pred_cond - pred_uncond)
    if guidance_rescale > 0.0:
        pred = rescale_noise_cfg(pred, pred_cond, guidance_rescale)
    return pred


def AdaptiveProjectedGuidance(pred_cond, pred_uncond, guidance_scale=7.5, eta=1.0, norm_threshold=15.0, momentum_buffer=None, use_original_formulation=False):  # noqa: N802  # fmt: skip
    diff = pred_cond - pred_uncond  # the CFG push, (N, ...)
    if momentum_buffer is not None:  # a running sum: diff + momentum * previous sum
        momentum_buffer["running_average"] = diff + momentum_buffer["momentum"] * momentum_buffer["running_average"]  # fmt: skip
        diff = momentum_buffer["running_average"]
    shape = (-1,) + (1,) * (diff.ndim - 1)
    if norm_threshold > 0:  # cap each row's push at norm_threshold
        diff = diff * np.minimum(1.0, norm_threshold / np.linalg.norm(per_row(diff), axis=1)).reshape(shape)  # fmt: skip
    v1 = per_row(pred_cond) / np.maximum(np.linalg.norm(per_row(pred_cond), axis=1, keepdims=True), 1e-12)  # fmt: skip
    parallel = ((per_row(diff) * v1).sum(axis=1, keepdims=True) * v1).reshape(diff.shape)
    update = (diff - parallel) + eta * parallel  # the parallel part down-weighted by eta
    return (pred_cond if use_original_formulation else pred_uncond) + guidance_scale * update


def ClassifierFreeZeroStarGuidance(pred_cond, pred_uncond, step, guidance_scale=7.5, zero_init_steps=1, use_original_formulation=False):  # noqa: N802  # fmt: skip
    if step < zero_init_steps:
        return np.zeros_like(pred_cond)  # the first steps' prediction is zeroed
    c, u = per_row(pred_cond), per_row(pred_uncond)
    alpha = ((c * u).sum(axis=1) / ((u**2).sum(axis=1) + 1e-8)).reshape((-1,) + (1,) * (pred_cond.ndim - 1))  # fmt: skip
    pred_uncond = pred_uncond * alpha  # the projection of pred_cond onto pred_uncond's line
    pred = pred_cond if use_original_formulation else pred_uncond
    return pred + guidance_scale * (pred_cond - pred_uncond)


def TangentialClassifierFreeGuidance(pred_cond, pred_uncond, guidance_scale=7.5, use_original_formulation=False):  # noqa: N802  # fmt: skip
    preds = np.stack([per_row(pred_cond), per_row(pred_uncond)], axis=1)  # (N, 2, D)
    # the pair's main direction, the top right singular vector diffusers takes from an SVD:
    # the top eigenvector of the 2x2 Gram matrix, mapped back through preds (same result)
    _, vecs = np.linalg.eigh(preds @ preds.transpose(0, 2, 1))  # (N, 2, 2), ascending
    top = vecs[:, :, -1:].transpose(0, 2, 1) @ preds  # (N, 1, D)
    top = top / np.maximum(np.linalg.norm(top, axis=2, keepdims=True), 1e-12)
    u = per_row(pred_uncond)[:, None]  # (N, 1, D)
    pred_uncond = ((u @ top.transpose(0, 2, 1)) @ top).reshape(pred_uncond.shape)  # keep that part
    pred = pred_cond if use_original_formulation else pred_uncond
    return pred + guidance_scale * (pred_cond - pred_uncond)


def PerturbedAttentionGuidance(pred_cond, pred_uncond, pred_cond_skip, guidance_scale=7.5, perturbed_guidance_scale=2.8, use_original_formulation=False):  # noqa: N802  # fmt: skip
    # also SkipLayerGuidance's and SmoothedEnergyGuidance's line (their third branch differs;
    # SEG's default window is 0.0 to 1.0, not PAG's and SLG's 0.01 to 0.2)
    pred = pred_cond if use_original_formulation else pred_uncond
    return pred + guidance_scale * (pred_cond - pred_uncond) + perturbed_guidance_scale * (pred_cond - pred_cond_skip)  # fmt: skip


# --8<-- [end:rules]

# %% [markdown]
# ## 3. The loop: one denoiser call per prediction, as SDXL's modular pipeline runs it
#
# SDXL's modular denoise step calls the UNet once per prediction the guider asks for
# (`pred_cond`, `pred_uncond`, `pred_cond_skip`), not one doubled batch. PAG's and SLG's
# perturbed branch runs only inside its window: from `perturbed_guidance_start` to
# `perturbed_guidance_stop` of the steps (defaults 0.01 and 0.2), with both bounds
# exclusive, as diffusers' guider checks it (`int(start * n) < step < int(stop * n)`); at 30
# steps that is steps 1 to 5.


# %%
# --8<-- [start:loop]
def perturbed_window(step, n, start=0.01, stop=0.2):
    return int(start * n) < step < int(stop * n)  # _is_slg_enabled: strict at both ends


def sample(rule, guidance_scale):
    """Run the loop with one rule; returns (N, 2) samples and denoiser calls per step."""
    scheduler.set_timesteps(args.steps)  # resets the scheduler's step index for a new run
    latents, calls, n = noise * scheduler.init_noise_sigma, 0, len(scheduler.timesteps)
    for i, t in enumerate(scheduler.timesteps):
        x = scheduler.scale_model_input(latents, t)
        # the guiders' check, use_original_formulation=False: no pred_uncond at (or within
        # math.isclose's 1e-9 of) scale 1
        cfg_on = not np.isclose(guidance_scale, 1.0, rtol=1e-9, atol=0.0)
        skip_on = rule == "PAG/SLG" and perturbed_window(i, n)
        pred_cond = unet(x, t, class_labels=target_class)
        pred_uncond = unet(x, t, class_labels=UNCOND) if cfg_on else None
        # scale 1, use_original_formulation=False: the guider batches the negative prompt here
        pred_cond_skip = (weak_unet(x, t, class_labels=target_class) if cfg_on else unet(x, t, class_labels=UNCOND)) if skip_on else None  # fmt: skip
        calls += 1 + cfg_on + skip_on  # one call per prediction
        if rule == "CFG-Zero*" and i < 1:  # zero_init_steps=1, applied at any scale
            noise_pred = ClassifierFreeZeroStarGuidance(pred_cond, pred_uncond, i, guidance_scale)  # fmt: skip
        elif skip_on:
            noise_pred = PerturbedAttentionGuidance(pred_cond, pred_uncond if cfg_on else pred_cond_skip, pred_cond_skip, guidance_scale if cfg_on else 0.0)  # fmt: skip
        elif not cfg_on:
            noise_pred = pred_cond
        elif rule == "APG, eta=0":
            noise_pred = AdaptiveProjectedGuidance(pred_cond, pred_uncond, guidance_scale, eta=0.0)  # fmt: skip
        elif rule == "CFG-Zero*":
            noise_pred = ClassifierFreeZeroStarGuidance(pred_cond, pred_uncond, i, guidance_scale)  # fmt: skip
        elif rule == "tangential CFG":
            noise_pred = TangentialClassifierFreeGuidance(pred_cond, pred_uncond, guidance_scale)  # fmt: skip
        else:  # CFG, and PAG/SLG outside their window
            noise_pred = ClassifierFreeGuidance(pred_cond, pred_uncond, guidance_scale)
        latents = scheduler.step(noise_pred, t, latents).prev_sample
    return latents, calls / n


# --8<-- [end:loop]

# %% [markdown]
# ## 4. Check: purity, overshoot and calls per step, for each rule and scale
#
# `purity`: samples whose nearest class mean is class 1's. `mean x`: where the samples sit
# along the class axis (class 1's mean is 0.7). `std x`: their spread along it (class 1's
# own: 0.6). `calls/step`: denoiser calls per step, averaged over the steps.

# %%
# --8<-- [start:sweep]
RULES = ["CFG", "APG, eta=0", "CFG-Zero*", "tangential CFG", "PAG/SLG"]  # fmt: skip
print(f"{args.prediction_type}, {args.steps} steps, {args.num_samples} samples")
print(f"{'rule':<26} {'scale':>5} {'purity':>7} {'mean x':>7} {'std x':>6} {'calls/step':>10}")
results = {}  # (rule, scale) -> (purity, mean x, std x, calls per step)
for rule in RULES:
    for scale in args.guidance_scales:
        samples, calls_per_step = sample(rule, scale)
        row = (purity(mixture, samples, target_class), samples[:, 0].mean(), samples[:, 0].std(), calls_per_step)  # fmt: skip
        results[rule, scale] = row
        print(f"{rule:<26} {scale:>5g} {row[0]:>7.1%} {row[1]:>7.3f} {row[2]:>6.3f} {row[3]:>10.2f}")  # fmt: skip
# --8<-- [end:sweep]

# %% [markdown]
# ## 5. Picture it: the mean along the class axis against the scale, per rule

# %%
# --8<-- [start:figures]
scales = np.array(args.guidance_scales)
series = {rule: (scales, np.array([results[rule, s][1] for s in scales])) for rule in RULES}
chart = figures.line_chart(
    series, xlabel="guidance_scale", ylabel="mean x of the samples (class 1: 0.7)",
    title=f"Overshoot per rule ({args.prediction_type}, exact toy denoiser)", markers=True,
    legend_outside=True,
)  # fmt: skip
top = scales.max()
figures.save(
    args.figures, "overshoot", chart,
    alt=f"A line chart of the samples' mean along the class axis against guidance_scale "
    f"from {scales.min():g} to {top:g}, one line per rule. At scale {top:g}: "
    + "; ".join(f"{rule} {results[rule, top][1]:.2f}" for rule in RULES) + ".",
    caption=f"Mean x per rule at guidance_scale {', '.join(f'{s:g}' for s in scales)} "
    f"({args.prediction_type}, {args.steps} steps, {args.num_samples} samples; class 1's mean is "
    f"0.7). Purity (the share of samples whose nearest class mean is class 1's) at scale {top:g}: "
    + ", ".join(f"{rule} {results[rule, top][0]:.1%}" for rule in RULES) + ".",
)  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(chart))
# --8<-- [end:figures]
