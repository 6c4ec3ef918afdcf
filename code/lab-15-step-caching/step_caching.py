"""Lab 15: how many denoiser calls can step caching skip, and what does each skip cost?

Successive sampling steps feed the denoiser nearly the same ``latents`` at a nearby
timestep, so its internal features change little from one step to the next. Step caching
reuses them: FirstBlockCache runs the first block every step and skips the remaining
blocks when that block's residual barely moved; TaylorSeer runs everything every few steps
and extrapolates the features in between. The trap: the savings come from many small
steps, so the toy's 4-step run has almost nothing to reuse.

Run it:  python3 code/lab-15-step-caching/step_caching.py --thresholds 0,0.05,0.1,0.2,0.4
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import FlowMatchDenoiser, default_mixture, figures, model_sizes
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    float_list,
    in_notebook,
    int_at_least,
    int_list,
    parse_args,
)
from labkit.metrics import sample_quality
from labkit.schedulers import FlowMatchEulerDiscreteScheduler

# %% [markdown]
# ## 1. Setup / contract
#
# Flow matching on the 2-D Gaussian mixture, as Flux and SD3 sample: `latents` `(N, 2)`
# float64 start as noise at sigma = 1, the denoiser predicts the velocity `noise_pred`
# `(N, 2)`, and `FlowMatchEulerDiscreteScheduler` (shift 3.0, SD3's) steps to sigma = 0.
# The cached runs start from the same noise as the uncached one, so any difference in the
# final `latents` is what caching cost.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="step_caching.py", description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int_at_least(1), default=50, help="num_inference_steps")
parser.add_argument("--few-steps", type=int_at_least(1), default=4, help="a few-step model's steps")
parser.add_argument(
    "--thresholds", type=float_list(0.0), default=[0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6],
    help="FirstBlockCache thresholds (relative L1 change), comma-separated",
)  # fmt: skip
parser.add_argument(
    "--cache-intervals", type=int_list, default=[2, 5, 10], help="TaylorSeer cache_interval values"
)
parser.add_argument(
    "--warmup",
    type=int_at_least(1),
    default=3,
    help="disable_cache_before_step (>= 1: step 0 has nothing to extrapolate from)",
)
parser.add_argument("--num-samples", type=int_at_least(1), default=500, help="N, rows of latents")
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)
if args.steps > 1000 or args.few_steps > 1000:
    parser.error("--steps and --few-steps must be <= num_train_timesteps (1000)")
if args.num_samples > 20000:
    parser.error(f"--num-samples must be <= 20000, got {args.num_samples}")
if any(i < 1 for i in args.cache_intervals):
    parser.error(f"--cache-intervals must be >= 1, got {args.cache_intervals}")
if not all(t < 1e6 for t in args.thresholds):
    parser.error("--thresholds must be < 1e6 (a relative change, usually below 1)")

mixture = default_mixture()
denoiser = FlowMatchDenoiser(mixture)  # exact velocity eps - x0: the "remaining blocks"
noise = np.random.default_rng(args.seed).standard_normal((args.num_samples, 2))  # (N, 2)
# --8<-- [end:setup]

# %% [markdown]
# ## 2. A denoiser with blocks
#
# Caching needs a denoiser with an inside. This one has Flux's outline, at toy width:
# `x_embedder` lifts `latents` `(N, 2)` to `hidden_states` `(N, D)`, D = 16; a cheap first
# block adds a residual (a random one-hidden-layer MLP conditioned on the timestep, like a
# transformer block's adaLN-modulated MLP); the remaining blocks, collapsed into one, read
# the sample back from the residual stream and add what makes `proj_out` return the exact
# velocity. So the uncached model is the exact denoiser, and the head block's residual
# drifts with the input and the timestep as a real first block's does. The weights are
# fixed (seed 1234), like a trained model's: `--seed` changes only the noise.

# %%
# --8<-- [start:model]
D = 16  # hidden width (Flux.1-dev: 3072)
w = np.random.default_rng(1234)
W_in = np.linalg.qr(w.standard_normal((D, 2)))[0].T  # (2, D) orthonormal rows: x_embedder
free = np.eye(D) - W_in.T @ W_in  # (D, D) projector onto the 14 channels the sample is not in
A = w.standard_normal((D, 32)) / np.sqrt(D)  # head MLP in, (D, 32)
B = w.standard_normal((32, D)) / np.sqrt(32) @ free  # head MLP out, (32, D): leaves x intact
W_t = 0.5 * w.standard_normal((8, 32))  # timestep features (8,) -> the MLP's (32,) shift
W_out = w.standard_normal((D, 2)) / np.sqrt(D)  # proj_out, (D, 2)
W_out_pinv = np.linalg.pinv(W_out)  # (2, D): W_out_pinv @ W_out = I_2


def time_embed(timestep):
    """Sinusoidal features of sigma = timestep / 1000, projected: () -> (32,)."""
    s = np.pi / 2 * 2.0 ** np.arange(4) * timestep / 1000.0
    return np.concatenate([np.sin(s), np.cos(s)]) @ W_t


def head_block(hidden_states, temb):
    """transformer_blocks[0]: (N, D) -> (N, D), hidden_states + a timestep-conditioned MLP."""
    return hidden_states + np.tanh(hidden_states @ A + temb) @ B


def remaining_blocks(hidden_states, timestep):
    """Every other block, as one: (N, D) -> (N, D). Reads the sample from the stream and
    adds what makes proj_out return the exact velocity; this is where the compute goes."""
    sample = hidden_states @ W_in.T  # (N, 2): the head block wrote nothing here
    velocity = denoiser(sample, timestep)  # (N, 2) exact eps - x0; counts denoiser.calls
    return hidden_states + (velocity - hidden_states @ W_out) @ W_out_pinv


# --8<-- [end:model]

# %% [markdown]
# ## 3. FirstBlockCache: skip the rest when the first block's residual barely moved
#
# diffusers' `FBCHeadBlockHook` (`hooks/first_block_cache.py`) runs the first block, takes
# its residual `r = output - hidden_states`, and compares it with the residual it stored
# the last time the rest ran: `diff = mean|r - r_prev| / mean|r_prev|`. If `diff >
# threshold` (or nothing is stored) the rest runs, and the hook stores `r` and the tail's
# residual `tail_out - head_out`; otherwise the output is `head_out + ` the stored tail
# residual. `r_prev` is only replaced when the rest runs, so skips accumulate drift
# against the last full step, not against the previous step.


# %%
# --8<-- [start:first-block-cache]
class FirstBlockCache:
    """FBCSharedBlockState plus the head hook's decision, in NumPy."""

    def __init__(self, threshold):
        self.threshold = threshold
        self.head_block_residual = None  # (N, D) r from the last step that ran the rest
        self.tail_block_residuals = None  # (N, D) tail_out - head_out from that step

    def should_compute(self, hidden_states_residual):
        """(compute the remaining blocks?, diff): FBCHeadBlockHook._should_compute_remaining_blocks."""
        if self.head_block_residual is None:
            return True, np.inf
        absmean = np.abs(hidden_states_residual - self.head_block_residual).mean()
        diff = float(absmean / np.abs(self.head_block_residual).mean())
        return diff > self.threshold, diff


def transformer(latents, timestep, cache=None):
    """(N, 2) latents -> (N, 2) noise_pred, and the head residual's diff (nan: no cache)."""
    hidden_states = latents @ W_in  # x_embedder: (N, D)
    temb = time_embed(timestep)  # (32,)
    if isinstance(cache, TaylorSeer):
        # the prediction stands in for the remaining blocks' output, the only reader of the
        # head's: here the head runs only on computed steps (same numbers, less work)
        out = cache(lambda: remaining_blocks(head_block(hidden_states, temb), timestep))
        return out @ W_out, np.nan  # proj_out
    head_out = head_block(hidden_states, temb)
    residual = head_out - hidden_states  # (N, D): what the FBC rule watches
    diff = np.nan
    if isinstance(cache, FirstBlockCache):
        compute, diff = cache.should_compute(residual)
        if compute:
            out = remaining_blocks(head_out, timestep)
            cache.head_block_residual = residual  # stored only when the rest ran
            cache.tail_block_residuals = out - head_out
        else:
            out = head_out + cache.tail_block_residuals  # the skip: reuse the tail residual
    else:
        out = remaining_blocks(head_out, timestep)
    return out @ W_out, diff  # proj_out


# --8<-- [end:first-block-cache]

# %% [markdown]
# ## 4. TaylorSeer: compute on a schedule, extrapolate in between
#
# diffusers' `TaylorSeerCacheHook` (`hooks/taylorseer_cache.py`) wraps modules chosen by
# name (by default, on Flux, every attention module of the blocks; here all blocks as one)
# and counts its calls from step 0. It computes when `step < disable_cache_before_step`
# or `(step - disable_cache_before_step - 1) % cache_interval == 0`. Each computed output
# updates divided differences up to `max_order`, `f_{k+1} = (f_k - f_k_prev) / delta_step`;
# the other steps return the Taylor series `sum_k f_k offset^k / k!`, offset = steps since
# the last computation. `max_order = 0` is plain reuse.


# %%
# --8<-- [start:taylorseer]
class TaylorSeer:
    """TaylorSeerState plus TaylorSeerCacheHook's schedule, for one module's output."""

    def __init__(self, cache_interval=5, disable_cache_before_step=3, max_order=1):
        self.cache_interval = cache_interval
        self.disable_cache_before_step = disable_cache_before_step
        self.max_order = max_order
        self.current_step = -1
        self.last_update_step = None
        self.taylor_factors = {}  # order -> (N, D) factor

    def should_compute(self):
        self.current_step += 1
        step, before = self.current_step, self.disable_cache_before_step
        return step < before or (step - before - 1) % self.cache_interval == 0

    def update(self, features):
        new = {0: features}
        if self.last_update_step is not None:
            delta_step = self.current_step - self.last_update_step
            for j in range(self.max_order):  # recursive divided differences
                if j not in self.taylor_factors:
                    break
                new[j + 1] = (new[j] - self.taylor_factors[j]) / delta_step
        self.taylor_factors = new
        self.last_update_step = self.current_step

    def predict(self):
        offset = self.current_step - self.last_update_step
        factorial = np.cumprod([1.0, *range(1, len(self.taylor_factors))])  # k!
        return sum(f * offset**k / factorial[k] for k, f in self.taylor_factors.items())

    def __call__(self, compute):
        if self.should_compute():
            features = compute()
            self.update(features)
            return features
        return self.predict()


# --8<-- [end:taylorseer]

# %% [markdown]
# ## 5. The sampling loop, with and without a cache
#
# One loop for every run: the pipeline's loop with the transformer call in the middle.
# `denoiser.calls` counts how often the remaining blocks really ran.


# %%
# --8<-- [start:loop]
def sample(num_inference_steps, cache=None):
    """Run the loop; return final latents (N, 2), remaining-block calls and per-step diffs."""
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(num_inference_steps)
    latents, diffs = noise.copy(), []
    denoiser.calls = 0
    for t in scheduler.timesteps:
        noise_pred, diff = transformer(latents, t, cache)  # (N, 2) velocity
        diffs.append(diff)
        latents = scheduler.step(noise_pred, t, latents).prev_sample
    return latents, denoiser.calls, np.array(diffs)


def measure(num_inference_steps, cache, reference):
    """One row: calls, share skipped, on-mode, weight error, RMS deviation from uncached."""
    latents, calls, diffs = sample(num_inference_steps, cache)
    q = sample_quality(mixture, latents)
    rms = float(np.sqrt(np.mean(np.sum((latents - reference) ** 2, axis=1))))
    return dict(calls=calls, saved=1 - calls / num_inference_steps, on_mode=q.on_mode,
                weight_error=q.weight_error, rms=rms, diffs=diffs)  # fmt: skip


reference, _, _ = sample(args.steps)  # uncached: the exact sampler
fbc = {tau: measure(args.steps, FirstBlockCache(tau), reference) for tau in args.thresholds}
taylor = {
    (interval, order): measure(args.steps, TaylorSeer(interval, args.warmup, order), reference)
    for interval in args.cache_intervals
    for order in (0, 1, 2)
}
# --8<-- [end:loop]


def table(title, header, rows):
    """Print ``rows`` under ``header``, each column right-aligned to its widest cell."""
    cells = [[str(x) for x in row] for row in [header, *rows]]
    widths = [max(len(row[k]) for row in cells) for k in range(len(header))]
    print(f"\n{title}")
    for row in cells:
        print("  ".join([row[0].ljust(widths[0]), *(c.rjust(n) for c, n in zip(row[1:], widths[1:], strict=True))]))  # fmt: skip


def n_steps(n):
    """A step count as the labels print it: '1 step', '50 steps'."""
    return f"{n} step" if n == 1 else f"{n} steps"


def cells(r):
    return [f"{r['calls']}", f"{r['saved']:.0%}", f"{r['on_mode']:.1%}", f"{r['weight_error']:.3f}", f"{r['rms']:.4f}"]  # fmt: skip


q_ref = sample_quality(mixture, reference)
print(
    f"{args.num_samples} samples, FlowMatchEuler shift 3.0, {n_steps(args.steps)} uncached:"
    f" on_mode {q_ref.on_mode:.1%}, weight_error {q_ref.weight_error:.3f}"
)
header = ["", "rest calls", "saved", "on_mode", "weight_error", "RMS dev"]
table(
    f"FirstBlockCache, {n_steps(args.steps)} (RMS dev: final latents vs the uncached run)",
    header,
    [[f"threshold={tau:g}", *cells(r)] for tau, r in fbc.items()],
)
table(
    f"TaylorSeer, {n_steps(args.steps)}, disable_cache_before_step={args.warmup}",
    header,
    [[f"cache_interval={i}, max_order={o}", *cells(r)] for (i, o), r in taylor.items()],
)
# --8<-- [start:real-taylorseer]
# The toy's TaylorSeer predicts its whole block stack, so a predicted step skips every block.
# On Flux diffusers' default hooks only the attention modules; the real model's figures, counted on
# the meta device (labkit.model_sizes): FLOPs of one Flux.1-dev call at 1024 px, and bytes.
flux = model_sizes.flux_1024px()
attn_share = flux["taylorseer_hooked_flops"] / flux["flops"]
# --8<-- [end:real-taylorseer]
print(
    f"\nOn the real Flux.1-dev at 1024 px ({flux['image_tokens']} + {flux['text_tokens']} tokens),"
    f" TaylorSeerCacheConfig() hooks {flux['taylorseer_hooked_modules']} attention modules holding"
    f" {attn_share:.0%} of a call's {flux['flops'] / 1e12:.0f} TFLOPs: a predicted step still runs"
    f" the other {1 - attn_share:.0%}. Its Taylor factors (orders 0 and 1, bf16) hold"
    f" {flux['taylorseer_factor_bytes'] / 1e9:.2f} GB on the GPU."
)
if 2 in args.cache_intervals:
    toy_saved = taylor[2, 1]["saved"]
    print(f"At cache_interval=2 the toy predicts {toy_saved:.0%} of the steps; on Flux that would skip about {toy_saved * attn_share:.0%} of the FLOPs.")  # fmt: skip

# %% [markdown]
# ## 6. Why the toy gains nothing at few steps
#
# The head residual's relative change between consecutive steps (threshold 0 runs every
# step and still reports it) is small when the steps are small. At a few steps each step
# crosses a large stretch of sigma, the residual changes by a large fraction, and a
# threshold loose enough to skip anything skips something very different.

# %%
# --8<-- [start:few-step]
few_reference, _, _ = sample(args.few_steps)
few = {tau: measure(args.few_steps, FirstBlockCache(tau), few_reference) for tau in args.thresholds}
change = {n: measure(n, FirstBlockCache(0.0), r)["diffs"][1:] for n, r in [(args.steps, reference), (args.few_steps, few_reference)]}  # fmt: skip
# --8<-- [end:few-step]
for n, d in change.items():
    if len(d):
        print(f"\n{n} steps: step-to-step change of the head residual: median {np.median(d):.3f}, max {d.max():.3f}")  # fmt: skip
    else:
        print(f"\n{n} step: no second step, nothing to compare or reuse")
table(
    f"FirstBlockCache, {n_steps(args.few_steps)} (RMS dev vs the uncached {args.few_steps}-step run)",
    header,
    [[f"threshold={tau:g}", *cells(r)] for tau, r in few.items()],
)

# %% [markdown]
# ## 7. Picture it


# %%
# --8<-- [start:figures]
def curve(rows):
    """(share skipped, RMS dev) pairs sorted by share, for a line through the points."""
    pts = sorted((r["saved"], r["rms"] + 1e-6) for r in rows)
    return np.array([p[0] for p in pts]), np.array([p[1] for p in pts])


series = {
    f"FirstBlockCache, {args.steps} steps": curve(fbc.values()),
    "TaylorSeer max_order=1": curve(r for (i, o), r in taylor.items() if o == 1),
    "TaylorSeer max_order=0": curve(r for (i, o), r in taylor.items() if o == 0),
    f"FirstBlockCache, {args.few_steps} steps": curve(few.values()),
}
chart = figures.line_chart(series, xlabel="share of remaining-block calls skipped", ylabel="RMS deviation from uncached (log)", logy=True, markers=True)  # fmt: skip
figures.save(args.figures, "calls-vs-error", chart, alt="Line chart, log scale, of the final samples' RMS deviation from the uncached run against the share of remaining-block calls skipped, for FirstBlockCache thresholds at the default and the few-step count and for TaylorSeer cache intervals at orders 0 and 1.", caption="Calls saved against error, one point per threshold or cache_interval (same noise, same model).")  # fmt: skip
steps_series = {f"{n} steps": (np.arange(2, len(d) + 2) / n, d + 1e-6) for n, d in change.items() if len(d)}  # fmt: skip
steps_chart = None  # both runs of 1 step: no step-to-step change to draw
if steps_series:
    steps_chart = figures.line_chart(
        steps_series,
        xlabel="sampling progress (step / num_inference_steps)",
        ylabel="relative change of the head residual (log)",
        logy=True,
        markers=True,
    )
    figures.save(args.figures, "residual-change", steps_chart, alt="Line chart, log scale, of the relative mean absolute change of the first block's residual from one step to the next over the sampling run, for each run of more than one step (by default 50 steps and a 4-step run, whose changes are far larger).", caption="The FirstBlockCache signal, step to step, with no skipping.")  # fmt: skip
# (with both runs at 1 step nothing is drawn, and nothing is printed about it: a run prints
# the same with and without --figures)
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(chart))
    if steps_chart is not None:
        display(SVG(steps_chart))
# --8<-- [end:figures]
