"""Lab 01: how fast does the forward process destroy the signal?

The state is a batch of clean samples ``x0`` (N, 2). The transition is the
closed-form forward process x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) eps:
one multiply-add reaches any t directly, without stepping through the t noising
steps before it. The trap: the schedule
(``beta_schedule``) decides how much signal survives at each t, and even at
t = 999 a little survives, so "x_999 is pure noise" is only approximately true.

Run it:  python3 code/lab-01-forward-noise-process/forward_noise.py --schedule scaled_linear
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import BETA_SCHEDULES, alphas_cumprod, canonical_betas, default_mixture, figures
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    in_notebook,
    int_at_least,
    int_list,
    parse_args,
)

# %% [markdown]
# ## 1. Setup / contract
#
# Inputs: a `beta_schedule` name (diffusers' names), the timesteps to inspect,
# a sample count and a seed. The data is the toy 2-D Gaussian mixture from
# `labkit`: four modes on a ring, so each "latent" is a point of shape `(2,)`
# and a batch is `(N, 2)` float64 (axis 0 = batch, axis 1 = channels).

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="forward_noise.py", description=__doc__.splitlines()[0])
parser.add_argument("--schedule", choices=BETA_SCHEDULES, default="linear")
parser.add_argument("--timesteps", type=int_list, default=[0, 100, 250, 500, 750, 999])
parser.add_argument("--num-samples", type=int_at_least(100), default=20_000)
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)

num_train_timesteps = 1000  # T: the training time axis, t = 0 .. T-1 (diffusers' default)
bad = [t for t in args.timesteps if not 0 <= t < num_train_timesteps]
if bad:
    parser.error(f"--timesteps must lie in [0, {num_train_timesteps - 1}], got {bad}")
# --8<-- [end:setup]

# %% [markdown]
# ## 2. The schedule: betas → alphas_cumprod
#
# `betas[t]` is the variance added at step t; `alphas_cumprod[t]` (alpha-bar)
# is the product of `1 - betas` up to t: the fraction of signal variance left.
# SNR(t) = alpha_bar / (1 - alpha_bar) is the signal-to-noise ratio of x_t.

# %%
# --8<-- [start:schedule]
betas = canonical_betas(args.schedule, num_train_timesteps)  # (T,) variance added per step
alpha_bar = alphas_cumprod(betas)  # (T,) signal variance left at t, decreasing from ~1
snr = alpha_bar / (1.0 - alpha_bar)  # (T,) signal-to-noise ratio of x_t

print(f"schedule={args.schedule}  T={num_train_timesteps}")
print(f"{'t':>5} {'beta_t':>9} {'alpha_bar':>10} {'sqrt(ab)':>9} {'sqrt(1-ab)':>10} {'SNR':>10}")
for t in args.timesteps:
    print(
        f"{t:>5} {betas[t]:>9.5f} {alpha_bar[t]:>10.6f} {np.sqrt(alpha_bar[t]):>9.4f} "
        f"{np.sqrt(1 - alpha_bar[t]):>10.4f} {snr[t]:>10.3g}"
    )
# The first t where noise variance exceeds signal variance (SNR < 1).
print(f"SNR drops below 1 at t = {int(np.argmax(snr < 1.0))}")
# --8<-- [end:schedule]

# %% [markdown]
# ## 3. Main transition: noise every chosen timestep in one shot
#
# x_t = sqrt(alpha_bar_t) * x0 + sqrt(1 - alpha_bar_t) * eps, with eps ~ N(0, I).
# This is what diffusers' `DDPMScheduler.add_noise(original_samples, noise, timesteps)`
# computes during training: no loop over t, because the Gaussian steps compose.

# %%
# --8<-- [start:forward]
mixture = default_mixture()
rng = np.random.default_rng(args.seed)
x0, component = mixture.sample(args.num_samples, rng)  # (N, 2) clean samples, (N,) mode ids
noise = rng.standard_normal(x0.shape)  # (N, 2) eps, one draw shared across t

noised = {}  # t -> x_t, each (N, 2)
for t in args.timesteps:
    noised[t] = np.sqrt(alpha_bar[t]) * x0 + np.sqrt(1.0 - alpha_bar[t]) * noise
# --8<-- [end:forward]

# %% [markdown]
# ## 4. Check: does x_t have the predicted mean and covariance?
#
# From the formula, E[x_t] = sqrt(alpha_bar) E[x0] and
# Cov[x_t] = alpha_bar Cov[x0] + (1 - alpha_bar) I. The mixture gives E[x0] and
# Cov[x0] in closed form, so the empirical moments must match within sampling
# error. The "ok" flag also checks the noise alone: x_t - sqrt(alpha_bar) x0
# must have variance 1 - alpha_bar, which catches a wrong noise coefficient
# even where the total variance cannot (near t = 0 the data variance
# dominates). The last column measures what survives: how often the Bayes-optimal
# guess of the mode, p(mode | x_t), still names the mode x0 came from.

# %%
# --8<-- [start:check]
mean0, cov0 = mixture.mean(), mixture.covariance()  # (2,), (2, 2) closed form
print(f"{'t':>5} {'|mean err|':>11} {'|cov err|':>10} {'ok':>4} {'mode acc':>9}")
for t, x_t in noised.items():
    mean_pred = np.sqrt(alpha_bar[t]) * mean0
    cov_pred = alpha_bar[t] * cov0 + (1.0 - alpha_bar[t]) * np.eye(2)
    mean_err = np.abs(x_t.mean(axis=0) - mean_pred).max()
    cov_err = np.abs(np.cov(x_t, rowvar=False) - cov_pred).max()
    # 5 standard errors of each estimate: generous, yet a wrong coefficient fails mid-axis.
    var_max = np.diag(cov_pred).max()
    mean_tol = 5 * np.sqrt(var_max / args.num_samples)
    cov_tol = 5 * np.sqrt(2.0 / args.num_samples) * var_max
    posterior = mixture.responsibilities(x_t, np.sqrt(alpha_bar[t]), np.sqrt(1 - alpha_bar[t]))
    mode_acc = np.mean(posterior.argmax(axis=1) == component)
    noise_var = np.var(x_t - np.sqrt(alpha_bar[t]) * x0, axis=0)  # (2,) per channel
    noise_ok = np.all(
        np.abs(noise_var / (1.0 - alpha_bar[t]) - 1) < 5 * np.sqrt(2.0 / args.num_samples)
    )
    ok = mean_err < mean_tol and cov_err < cov_tol and noise_ok
    print(f"{t:>5} {mean_err:>11.4f} {cov_err:>10.4f} {'yes' if ok else 'NO':>4} {mode_acc:>9.1%}")
# --8<-- [end:check]

# %% [markdown]
# ## 5. Compare the schedules
#
# Same T, different shapes. From t ~ 100 on, `scaled_linear` (Stable Diffusion)
# keeps more signal than DDPM's `linear`; the cosine schedule spends more steps at
# mid SNR. None reaches alpha_bar = 0 at t = T-1: the terminal SNR is small but
# not zero, which is why "zero terminal SNR" rescaling exists.

# %%
# --8<-- [start:compare]
print(
    f"{'schedule':>18} {'ab[250]':>9} {'ab[500]':>9} {'ab[750]':>9} {'ab[999]':>10} {'SNR<1 at':>9}"
)
for name in BETA_SCHEDULES:
    ab = alphas_cumprod(canonical_betas(name, num_train_timesteps))
    crossing = int(np.argmax(ab / (1 - ab) < 1.0))
    print(
        f"{name:>18} {ab[250]:>9.4f} {ab[500]:>9.4f} {ab[750]:>9.4f} {ab[999]:>10.2e} {crossing:>9}"
    )
# --8<-- [end:compare]

# %% [markdown]
# ## 6. Picture it
#
# Left: alpha_bar(t) for the three schedules. Right: the same 400 samples at
# increasing t, coloured by the mode they came from, drifting from four tight
# modes to one round blob. `labkit.figures` draws both with NumPy alone; the site
# runs the starter with `--figures DIR` and shows them on the lab page.

# %%
# --8<-- [start:figures]
curves = {
    name: (np.arange(num_train_timesteps), alphas_cumprod(canonical_betas(name)))
    for name in BETA_SCHEDULES
}
chart = figures.line_chart(curves, "timestep t", "alpha_bar_t (signal variance left)")
panels = [(f"t = {t}", noised[t][:400], component[:400]) for t in args.timesteps]
clouds = figures.scatter_panels(panels, lim=3.2, columns=len(panels), size=120)
figures.save(
    args.figures, "alpha-bar", chart,
    alt="Line chart of alpha_bar against timestep for the linear, scaled_linear and "
    "squaredcos_cap_v2 schedules: all fall from 1 toward 0, scaled_linear and the cosine "
    "schedule more slowly than linear, and none reaches exactly 0 at t = 999.",
    caption="Signal variance left, alpha_bar_t, per beta_schedule.",
)  # fmt: skip
figures.save(
    args.figures, "samples", clouds,
    alt=f"Scatter plots of the same 400 samples at t = {', '.join(map(str, args.timesteps))} "
    f"under the {args.schedule} schedule: four tight coloured clusters on a ring at t = 0 "
    "that spread and merge into one round blob by the last timestep.",
    caption=f"x_t of the same samples, coloured by mode, under {args.schedule}.",
)  # fmt: skip
if in_notebook():  # the executed notebook page shows them inline; a terminal run skips this
    from IPython.display import SVG, display

    display(SVG(chart), SVG(clouds))
# --8<-- [end:figures]
