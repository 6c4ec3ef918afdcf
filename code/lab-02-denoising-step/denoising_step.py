"""Lab 02: what exactly happens in one reverse step?

One update is two separate jobs. The denoiser (here: the exact posterior-mean
denoiser of the toy mixture) turns the noisy ``latent`` at ``timestep`` into a
prediction, ``noise_pred``. The scheduler's math turns that prediction into
``latent_prev``, the state one inference step earlier. The trap: the
scheduler must read the prediction as the type the model was trained on
(``epsilon``, ``sample`` or ``v_prediction``); read it as another type and the
step is silently wrong.

Run it:  python3 code/lab-02-denoising-step/denoising_step.py --timestep 500
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
from labkit.images import FiniteSet, image_grid, toy_images

# %% [markdown]
# ## 1. Setup / contract
#
# The state entering the step is `latent`, a batch of noisy points `(N, 2)`
# float64, made exactly as training makes them, so the clean `x0` behind
# each one is known. `timestep` is an integer on the training axis 0..999.
# `--num-inference-steps` sets the stride to the previous timestep, the way
# `scheduler.set_timesteps(num_inference_steps)` does in diffusers.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="denoising_step.py", description=__doc__.splitlines()[0])
parser.add_argument("--timestep", type=int_at_least(0), default=500)
parser.add_argument("--num-inference-steps", type=int_at_least(1), default=10)
parser.add_argument("--schedule", choices=BETA_SCHEDULES, default="linear")
parser.add_argument("--num-samples", type=int_at_least(100), default=20_000)
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)

num_train_timesteps = 1000
if args.timestep >= num_train_timesteps:
    parser.error(f"--timestep must be < {num_train_timesteps}, got {args.timestep}")
if args.num_inference_steps > num_train_timesteps:
    parser.error(f"--num-inference-steps must be <= {num_train_timesteps}")

alphas_cumprod_ = alphas_cumprod(canonical_betas(args.schedule, num_train_timesteps))  # (T,)
mixture = default_mixture()
rng = np.random.default_rng(args.seed)

timestep = args.timestep
# One inference step back. DDIMScheduler.step computes exactly this; DDPMScheduler
# takes the next entry of its `timesteps`, the same number with the default
# "leading" spacing. Below 0 means this is the last step (alpha_bar_prev = 1).
prev_timestep = timestep - num_train_timesteps // args.num_inference_steps
alpha_prod_t = alphas_cumprod_[timestep]  # alpha_bar_t
alpha_prod_t_prev = alphas_cumprod_[prev_timestep] if prev_timestep >= 0 else 1.0
beta_prod_t = 1.0 - alpha_prod_t  # noise variance in latent

x0, component = mixture.sample(args.num_samples, rng)  # (N, 2) clean points, (N,) modes
noise = rng.standard_normal(x0.shape)  # (N, 2) the noise actually added
latent = np.sqrt(alpha_prod_t) * x0 + np.sqrt(beta_prod_t) * noise  # (N, 2) model input
print(f"timestep={timestep} -> prev_timestep={prev_timestep}  schedule={args.schedule}")
print(f"alpha_bar_t={alpha_prod_t:.6f}  alpha_bar_prev={alpha_prod_t_prev:.6f}")
# --8<-- [end:setup]

# %% [markdown]
# ## 2. The model call: noise_pred = unet(latent, timestep)
#
# The denoiser is trained with `prediction_type="epsilon"`, the Stable
# Diffusion 1.x default. Its output has the input's shape `(N, 2)`. It is
# E[eps | latent]: the best guess of the noise, not the noise that was added.

# %%
# --8<-- [start:model]
unet = ExactDenoiser(mixture, alphas_cumprod_, prediction_type="epsilon")
noise_pred = unet(latent, timestep)  # (N, 2), same shape as latent

mse_vs_added = np.mean((noise_pred - noise) ** 2)
mse_vs_zero = np.mean(noise**2)
print(f"E|noise_pred - noise|^2 = {mse_vs_added:.4f}  (guessing zero: {mse_vs_zero:.4f})")
# --8<-- [end:model]

# %% [markdown]
# ## 3. Convert the prediction: epsilon → x0 and v
#
# Inverting x_t = sqrt(ab) x0 + sqrt(1 - ab) eps gives the clean-sample
# estimate `pred_original_sample`, the name diffusers' `step` uses.
# v = sqrt(ab) eps - sqrt(1 - ab) x0 follows from the two. A model trained
# on `sample` or `v_prediction` must produce the same numbers directly.

# %%
# --8<-- [start:convert]
pred_original_sample = (latent - beta_prod_t**0.5 * noise_pred) / alpha_prod_t**0.5  # x0_hat
v_pred = alpha_prod_t**0.5 * noise_pred - beta_prod_t**0.5 * pred_original_sample

for prediction_type, converted in [("sample", pred_original_sample), ("v_prediction", v_pred)]:
    direct = ExactDenoiser(mixture, alphas_cumprod_, prediction_type)(latent, timestep)
    print(
        f"{prediction_type:>13}: max |converted - direct| = {np.abs(converted - direct).max():.1e}"
    )
# --8<-- [end:convert]

# %% [markdown]
# ## 4. Main transition: DDPM and DDIM updates from the same prediction
#
# DDPM samples the posterior q(x_prev | x_t, x0) with x0 replaced by the
# estimate: a mean that mixes `pred_original_sample` and `latent`, plus fresh
# noise of variance (1 - ab_prev)/(1 - ab_t) * beta_t ("fixed_small").
# DDIM with eta = 0 adds no noise: it re-noises x0_hat to the previous level
# with the *predicted* noise, so the update is deterministic.

# %%
# --8<-- [start:step]
current_alpha_t = alpha_prod_t / alpha_prod_t_prev  # alpha for this (possibly strided) step
current_beta_t = 1.0 - current_alpha_t

# DDPM: posterior mean coefficients (Ho et al. 2020, eq. 7), then add noise
pred_original_sample_coeff = alpha_prod_t_prev**0.5 * current_beta_t / beta_prod_t
current_sample_coeff = current_alpha_t**0.5 * (1.0 - alpha_prod_t_prev) / beta_prod_t
pred_prev_sample = pred_original_sample_coeff * pred_original_sample + current_sample_coeff * latent
variance = (1.0 - alpha_prod_t_prev) / beta_prod_t * current_beta_t
variance_noise = rng.standard_normal(latent.shape)  # (N, 2) fresh noise for this step
latent_prev_ddpm = pred_prev_sample + variance**0.5 * variance_noise

# DDIM, eta = 0 (Song et al. 2021, eq. 12): no fresh noise
latent_prev_ddim = (
    alpha_prod_t_prev**0.5 * pred_original_sample + (1.0 - alpha_prod_t_prev) ** 0.5 * noise_pred
)
# --8<-- [end:step]

# %% [markdown]
# ## 5. Check: does latent_prev have the statistics of x at prev_timestep?
#
# If the step is right, the batch after it is distributed like fresh data
# noised to `prev_timestep`: mean sqrt(ab_prev) E[x0], covariance
# ab_prev Cov[x0] + (1 - ab_prev) I (closed form, from the mixture).


# %%
# --8<-- [start:check]
def moment_error(x: np.ndarray, alpha_bar: float) -> float:
    """Largest deviation of the batch's mean and covariance from q(x_t) at this alpha_bar."""
    mean = np.sqrt(alpha_bar) * mixture.mean()
    cov = alpha_bar * mixture.covariance() + (1.0 - alpha_bar) * np.eye(2)
    return max(np.abs(x.mean(axis=0) - mean).max(), np.abs(np.cov(x, rowvar=False) - cov).max())


print(f"{'state':>16} {'alpha_bar':>10} {'moment err':>11}")
print(f"{'latent':>16} {alpha_prod_t:>10.4f} {moment_error(latent, alpha_prod_t):>11.4f}")
for name, x in [("latent_prev_ddpm", latent_prev_ddpm), ("latent_prev_ddim", latent_prev_ddim)]:
    print(f"{name:>16} {alpha_prod_t_prev:>10.4f} {moment_error(x, alpha_prod_t_prev):>11.4f}")
# --8<-- [end:check]

# %% [markdown]
# ## 6. The trap: a prediction-type mismatch
#
# Same latent, same perfect model, but the scheduler is told the wrong
# `prediction_type`. Rows: what the model was trained to output. Columns: what
# the scheduler assumes. Each cell is the error of the resulting x0 estimate
# against the correct one (zero on the diagonal), and the moment error of the
# DDIM step taken with it.


# %%
# --8<-- [start:mismatch]
def x0_from(model_output: np.ndarray, assumed_type: str) -> np.ndarray:
    """What the scheduler computes as pred_original_sample, given its prediction_type."""
    if assumed_type == "epsilon":
        return (latent - beta_prod_t**0.5 * model_output) / alpha_prod_t**0.5
    if assumed_type == "sample":
        return model_output
    return alpha_prod_t**0.5 * latent - beta_prod_t**0.5 * model_output  # v_prediction


print("cells: x0 error / step moment error")
print(f"{'trained (row) / assumed':>24}" + "".join(f" | {t:>18}" for t in PREDICTION_TYPES))
for trained_type in PREDICTION_TYPES:
    model_output = ExactDenoiser(mixture, alphas_cumprod_, trained_type)(latent, timestep)
    cells = []
    for assumed_type in PREDICTION_TYPES:
        x0_hat = x0_from(model_output, assumed_type)
        eps_hat = (latent - alpha_prod_t**0.5 * x0_hat) / beta_prod_t**0.5
        x_prev = alpha_prod_t_prev**0.5 * x0_hat + (1 - alpha_prod_t_prev) ** 0.5 * eps_hat
        x0_err = np.sqrt(np.mean((x0_hat - pred_original_sample) ** 2))
        cells.append(f"{x0_err:.2f} / {moment_error(x_prev, alpha_prod_t_prev):.2f}")
    print(f"{trained_type:>24}" + "".join(f" | {c:>18}" for c in cells))
# --8<-- [end:mismatch]

# %% [markdown]
# ## 7. Picture it
#
# The same 400 points through the step, coloured by the mode their `x0` came
# from: the noisy `latent`, the model's `pred_original_sample` (a posterior *mean*,
# pulled toward the modes and between them), the batch after the DDPM and the DDIM
# step, fresh data noised to `prev_timestep` for reference, and the x0 estimate of a
# `v_prediction` model read as `epsilon`.

# %%
# --8<-- [start:figures]
show = slice(0, 400)
fresh_x0, fresh_component = mixture.sample(400, np.random.default_rng(args.seed + 1))
fresh = alpha_prod_t_prev**0.5 * fresh_x0 + (1 - alpha_prod_t_prev) ** 0.5 * (
    np.random.default_rng(args.seed + 2).standard_normal(fresh_x0.shape)
)  # (400, 2) what latent_prev should look like
v_output = ExactDenoiser(mixture, alphas_cumprod_, "v_prediction")(latent, timestep)
panels = [
    (f"latent, t = {timestep}", latent[show], component[show]),
    ("pred_original_sample", pred_original_sample[show], component[show]),
    ("latent_prev_ddpm", latent_prev_ddpm[show], component[show]),
    ("latent_prev_ddim", latent_prev_ddim[show], component[show]),
    (f"fresh x at t = {max(prev_timestep, 0)}", fresh, fresh_component),
    ("x0 of v read as epsilon", x0_from(v_output, "epsilon")[show], component[show]),
]
step_figure = figures.scatter_panels(panels, lim=3.5, columns=3, size=170)
figures.save(
    args.figures, "step", step_figure,
    alt=f"Six scatter plots of the same 400 points, coloured by mode: the noisy latent at t = "
    f"{timestep}; the predicted x0, pulled toward the four modes and between them; the "
    "batch after the DDPM and the DDIM step, both narrower than fresh data noised to the "
    "previous timestep, shown next; and the x0 estimate of a v-prediction model read as "
    "epsilon, thrown far outside the ring.",
    caption="One step, panel by panel: input, x0 estimate, DDPM and DDIM results, the "
    "reference they should match, and a prediction_type mismatch.",
)  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(step_figure))
# --8<-- [end:figures]

# %% [markdown]
# ## 8. Picture it on images: x0_hat is a blur at high noise
#
# The same arithmetic on pictures: the toy shape images of Labs 05 and 12
# (`labkit.images`, 256 images `(K, 3, 32, 32)` in [-1, 1]), whose exact denoiser is a
# softmax-weighted average of the training images. First, one image sampled from pure
# noise with this lab's DDIM step and stride: `x_t` and `x0_hat` at every step. Then
# how far `x0_hat` sits from the data mean as t grows, for the mixture and the images.
# Drawn only with `--figures` (the site's build), so the default run stays fast.

# %%
# --8<-- [start:images]
if args.figures is not None:
    data = toy_images(256, seed=0)  # .images (K, 3, 32, 32) in [-1, 1], .labels (K,)
    image_unet = ExactDenoiser(FiniteSet(data.images, data.labels), alphas_cumprod_, "epsilon")
    data_mean = data.images.mean(axis=0)  # (3, 32, 32): the blur x0_hat tends to at high t

    # One image, DDIM (eta = 0) from pure noise on this lab's grid: 900, 800, ..., 0
    stride = num_train_timesteps // args.num_inference_steps
    trajectory_t = np.arange(0, num_train_timesteps, stride)[::-1]  # "leading", no offset
    x_t = np.random.default_rng(args.seed).standard_normal((1, 3, 32, 32))  # (1, 3, 32, 32)
    strip_x_t, strip_x0_hat = [], []  # the state entering each step, and its x0 estimate
    for t in trajectory_t:
        ab, ab_prev = alphas_cumprod_[t], alphas_cumprod_[t - stride] if t >= stride else 1.0
        eps_hat = image_unet(x_t, t)  # (1, 3, 32, 32) noise_pred
        x0_hat = (x_t - (1 - ab) ** 0.5 * eps_hat) / ab**0.5  # pred_original_sample
        strip_x_t.append(x_t[0])
        strip_x0_hat.append(x0_hat[0])
        x_t = ab_prev**0.5 * x0_hat + (1 - ab_prev) ** 0.5 * eps_hat  # the DDIM step above
    shown = np.unique(np.linspace(0, len(trajectory_t) - 1, 10).round().astype(int))
    strip = np.concatenate([np.array(strip_x_t)[shown], np.array(strip_x0_hat)[shown]])

    # x0_hat against t: a fixed batch, noised with fixed noise, distance to the data mean
    # (RMS over the batch), divided by the same distance for x0 itself: 1 at t = 0
    def relative_spread(x0_hat, x0, mean):
        d_hat = np.sum((x0_hat - mean).reshape(len(x0), -1) ** 2, axis=1).mean()
        return np.sqrt(d_hat / np.sum((x0 - mean).reshape(len(x0), -1) ** 2, axis=1).mean())

    spread_t = np.linspace(0, num_train_timesteps - 1, 37).round().astype(int)  # (37,)
    mixture_x0, mixture_noise = x0[:400], noise[:400]  # (400, 2) this run's batch
    image_x0 = data.images[:16]  # (16, 3, 32, 32)
    image_noise = np.random.default_rng(args.seed + 3).standard_normal(image_x0.shape)
    x0_model = ExactDenoiser(mixture, alphas_cumprod_, "sample")  # outputs x0_hat directly
    image_x0_model = ExactDenoiser(FiniteSet(data.images, data.labels), alphas_cumprod_, "sample")
    spread = {"2-D mixture (this lab)": [], "toy images": []}
    for t in spread_t:
        a, s = alphas_cumprod_[t] ** 0.5, (1 - alphas_cumprod_[t]) ** 0.5
        x0_hat = x0_model(a * mixture_x0 + s * mixture_noise, t)  # (400, 2)
        spread["2-D mixture (this lab)"].append(relative_spread(x0_hat, mixture_x0, mixture.mean()))
        x0_hat = image_x0_model(a * image_x0 + s * image_noise, t)  # (16, 3, 32, 32)
        spread["toy images"].append(relative_spread(x0_hat, image_x0, data_mean))
    spread = {name: np.array(values) for name, values in spread.items()}
    # the last t at which the images' x0_hat still sits at 0.99 or more of x0's spread
    held = np.argmax(spread["toy images"] < 0.99) - 1

    columns = ", ".join(str(t) for t in trajectory_t[shown])
    figures.save(
        args.figures, "x0hat-strip", figures.png(image_grid(strip, columns=len(shown)), scale=2),
        alt=f"Two rows of {len(shown)} small images, one sampling run of a toy shape image at "
        f"t = {columns}. Top: the state x_t, pure noise at first, then less and less noisy. "
        "Bottom: the model's estimate x0_hat at the same steps: a dark blur, the average of "
        "all training images, at first, then a faint shape, then one sharp shape.",
        caption=f"One image, {len(trajectory_t)} DDIM steps: x_t (top) and x0_hat (bottom) at "
        f"t = {columns}. At high noise x0_hat is the average of the data.",
    )  # fmt: skip
    figures.save(
        args.figures, "x0hat-vs-t",
        figures.line_chart(
            {name: (spread_t, values) for name, values in spread.items()},
            "timestep t", "x0_hat's distance to the data mean (x0's = 1)",
        ),
        alt="Line chart of the distance of the exact denoiser's x0_hat from the data mean, "
        "relative to the distance of x0 itself, against timestep for the 2-D mixture and the "
        f"toy images: both start at 1 at t = 0 and fall toward 0, to "
        f"{spread['2-D mixture (this lab)'][-1]:.3f} and {spread['toy images'][-1]:.3f} at "
        f"t = {spread_t[-1]}, the images later and more steeply than the mixture: they "
        f"stay at 0.99 or above up to t = {spread_t[held]}, where the mixture is already at "
        f"{spread['2-D mixture (this lab)'][held]:.2f}.",
        caption=f"x0_hat collapses toward the data mean as t grows ({args.schedule} schedule, "
        "exact denoiser): the best guess of a clean sample from a very noisy one is the average.",
    )  # fmt: skip
# --8<-- [end:images]
