"""Lab 13: why does a few-step model need its own scheduler, spacing and step rule?

At 1 to 8 steps every choice the 50-step default hides shows: where the first timestep
sits (``timestep_spacing``), whether the schedule ends at pure noise (zero terminal SNR),
how far one step may jump (DDIM and Euler take one derivative, DPM-Solver++ 2M reuses the
last one), and what the step does with the prediction (LCM predicts x0 and re-noises).
This starter runs DDIM, Euler, DPM-Solver++ 2M and the LCM step on the toy mixture with its
exact denoiser, leading against trailing spacing, a zero-terminal-SNR schedule with
v-prediction, then the resolution-shifted sigma grids of a Flux pipeline.

Run it:  python3 code/lab-13-few-step-sampling/few_step.py --steps 1,2,4,8
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import ExactDenoiser, default_mixture, figures, make_betas
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    in_notebook,
    int_at_least,
    int_list,
    parse_args,
)
from labkit.metrics import sample_quality
from labkit.schedulers import DDIMScheduler, EulerDiscreteScheduler, SchedulerOutput

SAMPLERS = ("ddim", "euler", "dpm++2m", "lcm", "lcm-ideal")

# %% [markdown]
# ## 1. Setup / contract
#
# `latents` are `(N, 2)` float64 points of the toy mixture (the 2-D stand-in for
# `(B, 4, H/8, W/8)`), drawn as N(0, I) noise. The "unet" is the exact denoiser with
# `prediction_type="epsilon"` on SD 1.x's `scaled_linear` betas: `unet(x_t, t)` returns
# E[eps | x_t], `(N, 2)`, what a perfectly trained network would. Every sampler gets the
# same noise, so rows of the table differ only by the step rule and the grid.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="few_step.py", description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int_list, default=[1, 2, 4, 8], help="num_inference_steps to compare")  # fmt: skip
parser.add_argument("--samplers", default=",".join(SAMPLERS), help="comma-separated, from: " + ", ".join(SAMPLERS))  # fmt: skip
parser.add_argument("--spacing-steps", type=int_list, default=[1, 4], help="steps for the leading vs trailing runs")  # fmt: skip
parser.add_argument("--num-samples", type=int_at_least(1), default=1000, help="N, rows of latents")
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)

for flag, values, why in (("--steps", args.steps, " (LCM's original_inference_steps is 50)"), ("--spacing-steps", args.spacing_steps, "")):  # fmt: skip
    for n in values:
        if not 1 <= n <= 50:
            parser.error(f"{flag}: {n} is not in 1..50{why}")
samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
unknown = [s for s in samplers if s not in SAMPLERS]
if not samplers:
    parser.error(f"--samplers: no sampler given (choose from {', '.join(SAMPLERS)})")
if unknown:
    parser.error(f"--samplers: unknown sampler {unknown} (choose from {', '.join(SAMPLERS)})")
if args.num_samples > 20000:
    parser.error(f"--num-samples must be <= 20000, got {args.num_samples}")

SD_BETAS = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)
mixture = default_mixture()
betas = make_betas(num_train_timesteps=1000, **SD_BETAS)  # (1000,) float64
alphas_cumprod = np.cumprod(1.0 - betas)  # (1000,) alpha_bar_t
unet = ExactDenoiser(mixture, alphas_cumprod, "epsilon")
noise = np.random.default_rng(args.seed).standard_normal((args.num_samples, 2))  # (N, 2)
# --8<-- [end:setup]


def table(title, header, rows):
    """Print ``rows`` under ``header``, each column right-aligned to its widest cell."""
    cells = [[str(x) for x in row] for row in [header, *rows]]
    widths = [max(len(row[k]) for row in cells) for k in range(len(header))]
    print(f"\n{title}")
    for row in cells:
        aligned = [cell.rjust(w) for cell, w in zip(row, widths, strict=True)]
        print("  ".join([row[0].ljust(widths[0]), *aligned[1:]]))


# %% [markdown]
# ## 2. Zero terminal SNR: does the last training timestep hold pure noise?
#
# SD's `scaled_linear` schedule ends at alpha_bar_999 > 0: the "noisiest" training input
# still carries sqrt(alpha_bar_999) of the image, while sampling starts from pure noise.
# `rescale_betas_zero_snr=True` applies Algorithm 1 of Lin et al. (arXiv:2305.08891):
# shift sqrt(alpha_bar) so its last value is 0, rescale so its first is unchanged.


# %%
# --8<-- [start:zero-snr]
def rescale_zero_terminal_snr(betas):
    """Algorithm 1 of arXiv:2305.08891, as diffusers' ``rescale_zero_terminal_snr``: (T,) -> (T,)."""
    alphas_bar_sqrt = np.sqrt(np.cumprod(1.0 - betas))  # (T,) sqrt(alpha_bar_t)
    first, last = alphas_bar_sqrt[0], alphas_bar_sqrt[-1]
    alphas_bar_sqrt = (alphas_bar_sqrt - last) * first / (first - last)  # last -> 0, first kept
    alphas_bar = alphas_bar_sqrt**2
    alphas = np.concatenate([alphas_bar[:1], alphas_bar[1:] / alphas_bar[:-1]])  # undo cumprod
    return 1.0 - alphas


zero_snr_betas = rescale_zero_terminal_snr(betas)
snr_rows = []
for name, b in [("scaled_linear", betas), ("scaled_linear + zero SNR", zero_snr_betas)]:
    ab = np.cumprod(1.0 - b)
    snr_rows.append([name, f"{ab[-1]:.2e}", f"{np.sqrt(ab[-1]):.4f}", f"{ab[-1] / (1 - ab[-1]):.2e}", f"{np.sqrt(ab[751]):.4f}"])  # fmt: skip
# --8<-- [end:zero-snr]
table(
    "The last training timestep (t = 999) and DDIM's first at 4 steps, leading (t = 751)",
    ["betas", "alpha_bar_999", "signal sqrt(alpha_bar_999)", "SNR_999", "signal at t=751"],
    snr_rows,
)

# %% [markdown]
# ## 3. DPM-Solver++ 2M: a second-order step from the last two x0 predictions
#
# diffusers' `DPMSolverMultistepScheduler` with `algorithm_type="dpmsolver++"`,
# `solver_order=2`, `solver_type="midpoint"`. In lambda = log(alpha_t / sigma_t), with
# h = lambda_next - lambda_now and the data prediction D0 = x0_hat (this step), D1 its
# finite difference to the previous step's x0_hat:
#
#     x_next = (sigma_next / sigma_now) x - alpha_next (e^-h - 1) (D0 + D1 / 2)
#
# The first step has no previous x0_hat (first order, which is DDIM), and the last is
# first order too when `final_sigmas_type="zero"` (the default), `euler_at_final=True`,
# or `lower_order_final` with fewer than 15 steps.


# %%
# --8<-- [start:dpm]
class DPMSolverMultistepScheduler:
    """DPM-Solver++ 2M (data prediction, midpoint), with diffusers' names and defaults."""

    order = 1

    def __init__(self, betas, timestep_spacing="linspace", steps_offset=0,
                 final_sigmas_type="zero", euler_at_final=False, lower_order_final=True):  # fmt: skip
        self.alphas_cumprod = np.cumprod(1.0 - betas)  # (T,)
        self.timestep_spacing, self.steps_offset = timestep_spacing, steps_offset
        self.final_sigmas_type, self.euler_at_final = final_sigmas_type, euler_at_final
        self.lower_order_final = lower_order_final
        self.init_noise_sigma = 1.0  # variance preserving: latents start as N(0, I)

    def set_timesteps(self, num_inference_steps=None, timesteps=None):
        T, n = len(self.alphas_cumprod), num_inference_steps
        if timesteps is not None:  # custom timesteps, high to low: the spacing is ignored
            timesteps, n = np.asarray(timesteps, dtype=np.int64), len(timesteps)
        elif self.timestep_spacing == "linspace":  # n + 1 points on [0, T-1], the last dropped
            timesteps = np.linspace(0, T - 1, n + 1).round()[::-1][:-1].astype(np.int64)
        elif self.timestep_spacing == "leading":  # stride T // (n + 1) from 0: starts below T-1
            timesteps = (np.arange(0, n + 1) * (T // (n + 1))).round()[::-1][:-1].astype(np.int64)
            timesteps = timesteps + self.steps_offset
        else:  # "trailing": count down from T-1 in strides of T / n
            timesteps = np.arange(T, 0, -T / n).round().astype(np.int64) - 1
        # (n + 1,) sigma = sqrt((1 - alpha_bar) / alpha_bar) at each timestep, then the final one
        sigmas = ((1 - self.alphas_cumprod[timesteps]) / self.alphas_cumprod[timesteps]) ** 0.5
        last = ((1 - self.alphas_cumprod[0]) / self.alphas_cumprod[0]) ** 0.5
        self.sigmas = np.append(sigmas, 0.0 if self.final_sigmas_type == "zero" else last)
        self.timesteps, self.num_inference_steps = timesteps, n
        self.model_outputs, self.lower_order_nums, self.step_index = [None, None], 0, 0

    def scale_model_input(self, sample, timestep=None):
        return sample  # the model sees x_t itself

    def step(self, model_output, timestep, sample):
        i, n = self.step_index, self.num_inference_steps
        # the step into sigma = 0 (or the last of a short run) is first order, for stability
        lower_order_final = i == n - 1 and (self.euler_at_final or (self.lower_order_final and n < 15) or self.final_sigmas_type == "zero")  # fmt: skip
        # sigma -> (alpha_t, sigma_t) on the variance-preserving scale, and lambda = log(alpha / sigma)
        alpha, sigma = [1 / (s**2 + 1) ** 0.5 for s in self.sigmas], self.sigmas
        sig = [sigma[k] * alpha[k] for k in range(len(sigma))]
        lam = [np.log(alpha[k]) - np.log(sig[k]) if sig[k] > 0 else np.inf for k in range(len(sigma))]  # fmt: skip
        # convert_model_output: epsilon -> data prediction x0_hat, (N, D)
        x0_pred = (sample - sig[i] * model_output) / alpha[i]
        self.model_outputs = [self.model_outputs[1], x0_pred]
        h = lam[i + 1] - lam[i]  # the step in log-SNR / 2; inf into sigma = 0
        if self.lower_order_nums < 1 or lower_order_final:  # first order: DDIM in lambda
            prev_sample = (sig[i + 1] / sig[i]) * sample - alpha[i + 1] * (np.exp(-h) - 1.0) * x0_pred  # fmt: skip
        else:  # second order, midpoint: D1 = (D0 - x0_prev) / r0, r0 = h_prev / h
            r0 = (lam[i] - lam[i - 1]) / h
            D0, D1 = x0_pred, (x0_pred - self.model_outputs[0]) / r0
            prev_sample = (sig[i + 1] / sig[i]) * sample - alpha[i + 1] * (np.exp(-h) - 1.0) * (D0 + 0.5 * D1)  # fmt: skip
        self.lower_order_nums = min(self.lower_order_nums + 1, 2)
        self.step_index += 1
        return SchedulerOutput(prev_sample, x0_pred)


# --8<-- [end:dpm]

# %% [markdown]
# ## 4. The LCM step: predict x0, then re-noise to the next timestep with fresh noise
#
# `LCMScheduler.step`: x0_hat from the output, the boundary condition
# `denoised = c_out * x0_hat + c_skip * x_t` (c_skip = 0.25 / ((10 t)^2 + 0.25), so x0_hat
# almost exactly on the grid, t >= 19), then `prev_sample = sqrt(alpha_bar_prev) denoised +
# sqrt(1 - alpha_bar_prev) z` with fresh z; the last step returns `denoised`. The
# timesteps come from a 50-step distillation grid (999, 979, ..., 19), n evenly spaced
# indices into it. A consistency model outputs the end point of the sampling ODE from x_t;
# "lcm" feeds the exact denoiser (E[x0 | x_t], a mean), "lcm-ideal" feeds that end point,
# computed with 10 steps of DPM-Solver++ 2M from t: a perfectly distilled LCM plus the
# error of that 10-step solve (the starter prints it against a 50-step solve).


# %%
# --8<-- [start:lcm]
class LCMScheduler:
    """LCMScheduler's timesteps and step, with diffusers' names and defaults."""

    def __init__(self, betas, original_inference_steps=50, timestep_scaling=10.0):
        self.alphas_cumprod = np.cumprod(1.0 - betas)  # (T,)
        self.final_alpha_cumprod = 1.0  # set_alpha_to_one=True
        self.original_inference_steps, self.timestep_scaling = original_inference_steps, timestep_scaling  # fmt: skip
        self.init_noise_sigma = 1.0

    def scale_model_input(self, sample, timestep=None):
        return sample

    def set_timesteps(self, num_inference_steps):
        T, original = len(self.alphas_cumprod), self.original_inference_steps
        k = T // original  # the skipping step of the distillation grid
        lcm_origin_timesteps = (np.arange(1, original + 1) * k - 1)[::-1]  # 999, 979, ..., 19
        indices = np.floor(np.linspace(0, original, num_inference_steps, endpoint=False)).astype(np.int64)  # fmt: skip
        self.timesteps, self.num_inference_steps, self.step_index = lcm_origin_timesteps[indices], num_inference_steps, 0  # fmt: skip

    def get_scalings_for_boundary_condition_discrete(self, timestep):
        sigma_data, scaled = 0.5, timestep * self.timestep_scaling
        c_skip = sigma_data**2 / (scaled**2 + sigma_data**2)  # 1 at t = 0: f(x, 0) = x
        c_out = scaled / (scaled**2 + sigma_data**2) ** 0.5
        return c_skip, c_out

    def step(self, model_output, timestep, sample, generator=None, noise=None):
        i = self.step_index
        prev_timestep = self.timesteps[i + 1] if i + 1 < len(self.timesteps) else timestep
        alpha_prod_t, alpha_prod_t_prev = self.alphas_cumprod[timestep], self.alphas_cumprod[prev_timestep]  # fmt: skip
        c_skip, c_out = self.get_scalings_for_boundary_condition_discrete(timestep)
        predicted_original_sample = (sample - (1 - alpha_prod_t) ** 0.5 * model_output) / alpha_prod_t**0.5  # fmt: skip
        denoised = c_out * predicted_original_sample + c_skip * sample  # (N, D)
        if i != self.num_inference_steps - 1:  # re-noise to prev_timestep with fresh noise
            noise = generator.standard_normal(sample.shape) if noise is None else noise
            prev_sample = alpha_prod_t_prev**0.5 * denoised + (1 - alpha_prod_t_prev) ** 0.5 * noise
        else:  # the last step returns the clean prediction
            prev_sample = denoised
        self.step_index += 1
        return SchedulerOutput(prev_sample, denoised)


def ode_endpoint_eps(sample, timestep, substeps=10):
    """An ideal consistency model's output, as epsilon: the sampling ODE's end point from
    ``(sample, timestep)``, solved by ``substeps`` (10) steps of DPM-Solver++ 2M, (N, D).
    10 steps are not converged: the stand-in carries that solver's error (printed below)."""
    t = int(timestep)
    # quadratic spacing down to t / 100, no repeats: the steps near the data are short
    timesteps = np.unique((t * np.linspace(1, 0, substeps, endpoint=False) ** 2).round().astype(np.int64))  # fmt: skip
    solver = DPMSolverMultistepScheduler(betas)
    solver.set_timesteps(timesteps=timesteps[timesteps > 0][::-1])
    x = sample
    for s in solver.timesteps:  # the last step lands on sigma = 0: x is the end point x0
        x = solver.step(unet(x, s), s, x).prev_sample
    a = alphas_cumprod[t]
    return (sample - a**0.5 * x) / (1 - a) ** 0.5  # the epsilon whose x0_hat is that end point


# --8<-- [end:lcm]

# %% [markdown]
# ## 5. One loop for every sampler, at 1, 2, 4 and 8 steps
#
# The loop is a pipeline's: `set_timesteps`, `latents = noise * init_noise_sigma`, then per
# timestep `scale_model_input`, one `unet` call, `step(...).prev_sample`. DDIM, Euler and
# DPM-Solver++ use `timestep_spacing="trailing"`, the spacing the SDXL-Turbo, SDXL-Lightning
# and Hyper-SD cards set; DDIM keeps SD's `set_alpha_to_one=False`. `sample_quality` scores
# each batch: `on_mode` (the share within 3 std of their nearest mode), `spread` (the RMS
# distance of on-mode samples to their mode, over the data's; inf when no sample is on a
# mode, since only on-mode samples count) and `weight_error`.


# %%
# --8<-- [start:loop]
def make_scheduler(name, spacing="trailing"):
    offset = 1 if spacing == "leading" else 0  # SD 1.x's offset; "leading": DDIM's default
    if name == "ddim":
        return DDIMScheduler(clip_sample=False, set_alpha_to_one=False, timestep_spacing=spacing, steps_offset=offset, **SD_BETAS)  # fmt: skip
    if name == "euler":
        return EulerDiscreteScheduler(timestep_spacing=spacing, steps_offset=offset, **SD_BETAS)
    if name == "dpm++2m":
        return DPMSolverMultistepScheduler(betas, timestep_spacing=spacing, steps_offset=offset)
    return LCMScheduler(betas)  # "lcm": its own 50-step distillation grid


def sample(scheduler, num_inference_steps=None, model=unet, timesteps=None):
    """A pipeline's loop from the shared noise -> (N, 2) samples. ``model(x_t, t)`` is the
    exact denoiser, or ``ode_endpoint_eps``: an ideal consistency model."""
    if timesteps is None:
        scheduler.set_timesteps(num_inference_steps)
    else:  # custom timesteps (DPMSolverMultistepScheduler)
        scheduler.set_timesteps(timesteps=timesteps)
    latents = noise * scheduler.init_noise_sigma  # (N, 2)
    rng = np.random.default_rng(args.seed + 1)  # LCM's fresh noise, the same for every run
    kwargs = {"generator": rng} if isinstance(scheduler, LCMScheduler) else {}
    for t in scheduler.timesteps:
        latent_model_input = scheduler.scale_model_input(latents, t)
        noise_pred = model(latent_model_input, t)  # (N, 2) the epsilon prediction
        latents = scheduler.step(noise_pred, t, latents, **kwargs).prev_sample
    return latents


results = {}  # (sampler, steps) -> SampleQuality
for name in samplers:
    model = ode_endpoint_eps if name.endswith("-ideal") else unet
    for n in args.steps:
        latents = sample(make_scheduler(name.removesuffix("-ideal")), n, model)
        results[name, n] = sample_quality(mixture, latents)
reference = sample_quality(mixture, sample(make_scheduler("ddim", "leading"), 50))  # SD 1.x's grid
# --8<-- [end:loop]

print(f"toy: {args.num_samples} samples, 4 modes (std 0.15) on a ring, exact epsilon denoiser, SD betas")  # fmt: skip
print(f"reference, DDIM at 50 steps (leading, SD's default): on_mode {reference.on_mode:.1%}, weight_error {reference.weight_error:.3f}, spread {reference.spread:.2f}")  # fmt: skip
rows = [[name] + [f"{results[name, n].on_mode:.1%}" for n in args.steps] for name in samplers]
table("on_mode (share of samples within 3 std of a mode) by num_inference_steps", ["sampler", *[str(n) for n in args.steps]], rows)  # fmt: skip
rows = [[name] + [f"{results[name, n].spread:.2f}" for n in args.steps] for name in samplers]
table("spread (on-mode samples' RMS distance to their mode over the data's: 1 is right, < 1 too tight)", ["sampler", *[str(n) for n in args.steps]], rows)  # fmt: skip
rows = [[name] + [f"{results[name, n].weight_error:.3f}" for n in args.steps] for name in samplers]
table("weight_error (total variation of the mode weights)", ["sampler", *[str(n) for n in args.steps]], rows)  # fmt: skip

# the stand-in's own error: ode_endpoint_eps solves the ODE in 10 steps; 50 is converged
# (to 0.0125 of a 200-step solve at most), so "lcm-ideal" at 1 step carries the difference
a999 = alphas_cumprod[999]
end_eps = {k: ode_endpoint_eps(noise, 999, k) for k in (10, 50)}  # (N, 2) each
ends = {k: (noise - (1 - a999) ** 0.5 * end_eps[k]) / a999**0.5 for k in (10, 50)}
q10, q50 = (sample_quality(mixture, ends[k]) for k in (10, 50))
print(f"\nideal consistency model at t = 999, ODE solved in 10 steps (the table's) against 50: on_mode {q10.on_mode:.1%} against {q50.on_mode:.1%}, spread {q10.spread:.2f} against {q50.spread:.2f}, weight_error {q10.weight_error:.3f} against {q50.weight_error:.3f}; mean |x0 difference| {np.abs(ends[10] - ends[50]).mean():.3f}")  # fmt: skip
# one trailing DDIM step on that end point ("ddim-ideal"): SD's set_alpha_to_one=False
# lands on alpha_bar_0, sqrt(alpha_bar_0) x0 + sqrt(1 - alpha_bar_0) eps_hat, not on x0
ddim_one = {}
for k in (10, 50):
    ddim = make_scheduler("ddim")
    ddim.set_timesteps(1)
    ddim_one[k] = ddim.step(end_eps[k], 999, noise).prev_sample  # (N, 2)
d10, d50 = (sample_quality(mixture, ddim_one[k]) for k in (10, 50))
print(f"the same through one trailing DDIM step (set_alpha_to_one=False: noise of alpha_bar_0 left): on_mode {d10.on_mode:.1%} against {d50.on_mode:.1%}, spread {d10.spread:.2f} against {d50.spread:.2f}; max |prev_sample - end point| {np.abs(ddim_one[10] - ends[10]).max():.3f}")  # fmt: skip

# %% [markdown]
# ## 6. Leading against trailing spacing
#
# `leading` with SD's `steps_offset=1` (set explicitly here: DPM-Solver++'s own default is
# `linspace`, which starts at 999) starts below t = 999 (the table prints where): the
# loop hands pure noise to a model told the input still holds sqrt(alpha_bar_t) of the
# image. The last model call matters as much: a deterministic sampler's last step lands
# on that call's x0_hat, a posterior mean. The control row starts where trailing does and
# ends where DPM-Solver++'s leading grid does, to tell the two effects apart.

# %%
# --8<-- [start:spacing]
spacing_rows = []
runs = [(name, spacing, n, None) for name in ("ddim", "dpm++2m", "ddim-ideal") for n in args.spacing_steps for spacing in ("leading", "trailing")]  # fmt: skip
runs.append(("dpm++2m", "custom", 4, [999, 667, 334, 201]))  # trailing's start, leading's end
for name, spacing, n, custom in runs:
    scheduler = make_scheduler(name.removesuffix("-ideal"), "trailing" if custom else spacing)
    model = ode_endpoint_eps if name.endswith("-ideal") else unet
    q = sample_quality(mixture, sample(scheduler, n, model, timesteps=custom))
    ts = [int(t) for t in scheduler.timesteps]
    signal = [f"{np.sqrt(alphas_cumprod[t]):.3f}" for t in (ts[0], ts[-1])]
    spacing_rows.append([name, n, spacing, ", ".join(map(str, ts)), *signal, f"{q.on_mode:.1%}", f"{q.weight_error:.3f}", f"{q.spread:.2f}"])  # fmt: skip
# --8<-- [end:spacing]
header = ["sampler", "steps", "spacing", "timesteps", "signal at first t", "at last t", "on_mode", "weight_error", "spread"]  # fmt: skip
table("timestep_spacing, leading (steps_offset=1, DDIM's default on SD 1.x) against trailing", header, spacing_rows)  # fmt: skip

# %% [markdown]
# ## 7. Zero terminal SNR, run
#
# `DDIMScheduler(rescale_betas_zero_snr=True)` rescales its betas in `__init__`, so
# `alphas_cumprod[999]` is 0: x_999 is pure noise, as sampling starts. The exact denoiser
# on that schedule is the Bayes answer there: E[x0 | x_999] is the data mean, the same for
# every sample. An epsilon model cannot be used: at SNR 0, eps = x_t exactly, and
# x0_hat = (x_t - sqrt(1 - alpha_bar) eps_hat) / sqrt(alpha_bar) is 0 / 0. A v-prediction
# gives x0_hat = sqrt(alpha_bar) x_t - sqrt(1 - alpha_bar) v_hat = -v_hat, finite.


# %%
# --8<-- [start:zero-snr-run]
class DDIMZeroSNRScheduler(DDIMScheduler):
    """labkit's DDIM with diffusers' ``rescale_betas_zero_snr=True``, applied as
    ``DDIMScheduler.__init__`` does: rescale the betas, then recompute alphas_cumprod."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.betas = rescale_zero_terminal_snr(self.betas)  # (T,) betas[-1] = 1
        self.alphas = 1.0 - self.betas
        self.alphas_cumprod = np.cumprod(self.alphas)  # (T,) alphas_cumprod[-1] = 0
        self.final_alpha_cumprod = 1.0 if self.set_alpha_to_one else self.alphas_cumprod[0]


DDIM_TRAILING = dict(clip_sample=False, set_alpha_to_one=False, timestep_spacing="trailing", **SD_BETAS)  # fmt: skip
with np.errstate(divide="ignore"):  # the denoiser's log-sigma table is inf at alpha_bar = 0
    unet_v = ExactDenoiser(mixture, np.cumprod(1.0 - zero_snr_betas), "v_prediction")
    unet_eps = ExactDenoiser(mixture, np.cumprod(1.0 - zero_snr_betas), "epsilon")
zero_snr_rows = []
zero_snr_runs = [
    ("scaled_linear, epsilon", DDIMScheduler(**DDIM_TRAILING), unet),
    ("zero SNR, v_prediction", DDIMZeroSNRScheduler(prediction_type="v_prediction", **DDIM_TRAILING), unet_v),
]  # fmt: skip
for label, scheduler, model in zero_snr_runs:
    scheduler.set_timesteps(1)
    x0_at_999 = scheduler.step(model(noise, 999), 999, noise).pred_original_sample  # (N, 2)
    q = {n: sample_quality(mixture, sample(scheduler, n, model)) for n in (4, 25)}
    zero_snr_rows.append([label, f"{scheduler.alphas_cumprod[999]:.2e}", f"{x0_at_999.std(axis=0).mean():.3f}", f"{q[4].on_mode:.1%}", f"{q[25].on_mode:.1%}", f"{q[25].weight_error:.3f}"])  # fmt: skip
scheduler = DDIMZeroSNRScheduler(prediction_type="epsilon", **DDIM_TRAILING)
scheduler.set_timesteps(1)
with np.errstate(divide="ignore", invalid="ignore"):  # 0 / 0 on purpose
    x0_eps = scheduler.step(unet_eps(noise, 999), 999, noise).pred_original_sample
# --8<-- [end:zero-snr-run]
header = ["betas, prediction_type", "alpha_bar_999", "x0_hat at t=999: std over samples", "on_mode 4 steps", "25 steps", "weight_error 25 steps"]  # fmt: skip
table("Zero terminal SNR, run: DDIM (trailing) on the exact denoiser", header, zero_snr_rows)
print(f"zero SNR with epsilon: x0_hat at t = 999 is finite for {np.isfinite(x0_eps).all(axis=1).sum()} of {len(noise)} samples (0 / 0)")  # fmt: skip

# %% [markdown]
# ## 8. Flow matching at resolution: the shifted sigma grid of FluxPipeline
#
# `FluxPipeline.__call__` builds `sigmas = np.linspace(1.0, 1 / n, n)`, computes
# `mu = calculate_shift(image_seq_len, 256, 4096, 0.5, 1.15)` (the defaults it reads from
# `scheduler.config` with `.get`), and calls `scheduler.set_timesteps(sigmas=sigmas, mu=mu)`;
# with `use_dynamic_shifting=True` the scheduler maps each sigma through
# `exp(mu) / (exp(mu) + (1 / sigma - 1))`. `image_seq_len` is the packed token count,
# `(H / 16) * (W / 16)`: the VAE divides by 8 and 2 x 2 patches are packed into one token.


# %%
# --8<-- [start:shift]
def calculate_shift(image_seq_len, base_seq_len=256, max_seq_len=4096, base_shift=0.5, max_shift=1.15):  # fmt: skip
    """mu, linear in the token count: 0.5 at 256 tokens, 1.15 at 4096, extrapolated beyond."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    b = base_shift - m * base_seq_len
    return image_seq_len * m + b


def shifted_sigmas(num_inference_steps, mu):
    """(n,) the sigmas FluxPipeline hands to FlowMatchEulerDiscreteScheduler, after its shift."""
    sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)
    return np.exp(mu) / (np.exp(mu) + (1 / sigmas - 1))  # time_shift(mu, 1.0, sigmas)


shift_rows, grids = [], {}
for px in (256, 512, 1024, 2048):
    image_seq_len = (px // 16) ** 2  # packed 2 x 2 latent patches of a (px/8) x (px/8) latent
    mu = calculate_shift(image_seq_len)
    grids[px] = shifted_sigmas(28, mu)  # FluxPipeline's default num_inference_steps
    four = ", ".join(f"{s:.3f}" for s in shifted_sigmas(4, mu))
    shift_rows.append([f"{px} x {px}", image_seq_len, f"{mu:.3f}", f"{np.exp(mu):.2f}", four, f"{grids[px][14]:.3f}"])  # fmt: skip
# --8<-- [end:shift]
table(
    "FluxPipeline's sigmas by resolution (use_dynamic_shifting=True)",
    ["image", "image_seq_len", "mu", "exp(mu)", "4-step sigmas", "28 steps: sigma at step 14"],
    shift_rows,
)

# %% [markdown]
# ## 9. Guidance distillation: guidance as an input, not a second call
#
# With `transformer.config.guidance_embeds=True` (Flux.1-dev) the pipeline passes
# `guidance = guidance_scale` to every transformer call and makes one call per step on the
# un-doubled batch. `true_cfg_scale > 1` with a negative prompt adds a second call per step
# and combines `neg_noise_pred + true_cfg_scale * (noise_pred - neg_noise_pred)`.

# %%
# --8<-- [start:calls]
call_rows = []
for label, calls_per_step, rows_per_call in [
    ("guidance_embeds (guidance_scale only)", 1, 1),
    ("true_cfg_scale > 1 + negative prompt", 2, 1),
    ("SD-style CFG (batch doubled)", 1, 2),
]:
    for n in (4, 28):
        call_rows.append([label, n, n * calls_per_step, n * calls_per_step * rows_per_call])
# --8<-- [end:calls]
table("Denoiser work per image", ["guidance", "steps", "transformer calls", "rows processed"], call_rows)  # fmt: skip

# %% [markdown]
# ## 10. Fixed costs: the VAE decode and the text encoders at few steps
#
# A step costs one denoiser call (two rows with CFG); the text encoders run once per
# prompt (twice with CFG in SD 1.5, which encodes the negative prompt too; SDXL zeroes a
# missing one, negative_prompt=None, but encodes an explicit "", so there the count is an
# upper bound) and the VAE decodes once per image. So
# the fixed part's share grows as the steps fall. The FLOPs below are the real models',
# counted once from their published configs on the meta device with torch's
# FlopCounterMode (2 per multiply-add, batch 1, one image): it counts matmuls, convolutions
# and attention only, not norms, activations or upsampling; tests/verify/test_page_lab_13.py
# recounts them with the installed diffusers. FLOPs are not seconds: a decode at 1024 px moves large
# activations, and SDXL's fp16 pipeline decodes in fp32 (`force_upcast`).

# %%
# --8<-- [start:fixed-costs]
GFLOPS = {  # one call at batch 1, GFLOPs
    "SD 1.5, 512 px": dict(unet=803.3, text_encoders=13.3, vae_decode=2514.5, taesd_decode=141.4),
    "SDXL, 1024 px": dict(unet=6761.2, text_encoders=111.2, vae_decode=10470.4, taesd_decode=565.4),
}
FIXED_STEPS = (1, 2, 4, 8, 25, 50)


def decode_share(g, steps, cfg, decode="vae_decode"):
    """Share of an image's FLOPs in the decode: rows = 2 with CFG (batch doubled), else 1."""
    rows = 2 if cfg else 1
    total = rows * g["text_encoders"] + steps * rows * g["unet"] + g[decode]
    return g[decode] / total


fixed_rows = [
    [model, n, f"{decode_share(g, n, cfg=False):.1%}", f"{decode_share(g, n, cfg=True):.1%}",
     f"{decode_share(g, n, cfg=False, decode='taesd_decode'):.1%}"]
    for model, g in GFLOPS.items()
    for n in FIXED_STEPS
]  # fmt: skip
# --8<-- [end:fixed-costs]
table(
    "Share of an image's FLOPs in the VAE decode (real configs, meta device)",
    ["model", "steps", "no CFG", "CFG", "AutoencoderTiny, no CFG"],
    fixed_rows,
)
for model, g in GFLOPS.items():
    print(f"{model}: one decode = {g['vae_decode'] / g['unet']:.1f} UNet calls; AutoencoderTiny's = {g['taesd_decode'] / g['unet']:.2f}; text encoders = {g['text_encoders'] / g['unet']:.3f}")  # fmt: skip

# %% [markdown]
# ## 11. Picture it

# %%
# --8<-- [start:figures]
xs = np.array(args.steps, dtype=float)
# the share of samples off every mode: falls towards 0 as the sampler gets it right
chart = figures.line_chart(
    {
        name: (xs, np.array([100 * (1 - results[name, n].on_mode) for n in args.steps]))
        for name in samplers
    },
    xlabel="num_inference_steps",
    ylabel="samples off every mode (%)",
    markers=True,
)
figures.save(args.figures, "quality-vs-steps", chart, alt="Line chart of the share of toy samples that land on no mode against the number of steps, one line per sampler: DDIM, Euler, DPM-Solver++ 2M and the LCM step with the exact denoiser start high at one step and fall with more steps, while the LCM step with an ideal consistency model stays near 0 at every step count.", caption="Samples off every mode (100% minus on_mode, the share within 3 std of their nearest mode) against num_inference_steps, same starting noise: trailing spacing for DDIM, Euler and DPM-Solver++ 2M, LCM's own 50-entry grid for the LCM lines.")  # fmt: skip
steps = np.arange(28) / 27
shift_chart = figures.line_chart(
    {f"{px} px": (steps, grids[px]) for px in grids if px <= 1024},  # 2048 px: in the table
    xlabel="step / (n - 1), 28 steps",
    ylabel="sigma",
)
figures.save(args.figures, "flux-sigmas", shift_chart, alt="Line chart of the 28 sigmas FluxPipeline uses at 256, 512 and 1024 pixels: all start at sigma 1, and the larger the image, the higher the curve stays before it falls at the end.", caption="FluxPipeline's shifted sigma grids at 256, 512 and 1024 px: calculate_shift(image_seq_len) and the exponential time shift.")  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    for svg in (chart, shift_chart):
        display(SVG(svg))
# --8<-- [end:figures]
