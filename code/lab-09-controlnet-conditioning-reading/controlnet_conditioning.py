"""Lab 09: how does a ControlNet add spatial control to a frozen denoiser, and what does it cost?

The state is the base denoiser's skip features. A ControlNet is a trainable copy of
the denoiser's encoder half that reads ``latents`` plus a control signal, and adds
one residual per skip connection (and one to the mid block) through projections
initialised to zero, so at init the output is the base model's, exactly. The
pipeline scales the residuals by ``controlnet_conditioning_scale`` and by a 0/1
``controlnet_keep`` per step. The trade-off: a second network runs at every step.
IP-Adapter, for contrast, adds a second attention over image tokens, not residuals.

Run it:  python3 code/lab-09-controlnet-conditioning-reading/controlnet_conditioning.py
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import figures, model_sizes
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    in_notebook,
    int_at_least,
    parse_args,
)

# %% [markdown]
# ## 1. Setup / contract
#
# In: `--conditioning-scale` (`controlnet_conditioning_scale`, default 1.0),
# `--control-guidance-start` / `--control-guidance-end` (the fraction of the loop in
# which the ControlNet acts, default 0.0 and 1.0), `--steps` (`num_inference_steps`,
# default 50) and `--guess-mode`. The window checks are those of
# `StableDiffusionControlNetPipeline.check_inputs` (start < end, start >= 0,
# end <= 1), which let NaN through; the starter also rejects NaN, and a negative
# scale. The toy denoiser works on 2-D `latents` `(N, 2)` float32 with features
# `(N, 16)`: the same wiring as the UNet, at toy size.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(
    prog="controlnet_conditioning.py", description=__doc__.splitlines()[0]
)  # fmt: skip
parser.add_argument("--conditioning-scale", type=float, default=1.0,
                    help="controlnet_conditioning_scale (>= 0)")  # fmt: skip
parser.add_argument("--control-guidance-start", type=float, default=0.0)
parser.add_argument("--control-guidance-end", type=float, default=1.0)
parser.add_argument("--steps", type=int_at_least(1), default=50, help="num_inference_steps")
parser.add_argument("--guess-mode", action="store_true", help="guess_mode=True")
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)
start, end = args.control_guidance_start, args.control_guidance_end
if not np.isfinite(args.conditioning_scale) or args.conditioning_scale < 0:
    parser.error(f"--conditioning-scale must be a number >= 0, got {args.conditioning_scale}")
if not 0.0 <= start <= 1.0 or not 0.0 <= end <= 1.0:
    parser.error(f"--control-guidance-start/-end must be in [0, 1], got {start} and {end}")
if start >= end:
    parser.error(f"--control-guidance-start ({start}) must be smaller than the end ({end})")

N, D = 256, 16  # toy batch of latents (N, 2); feature width D, the toy's "channels"
rng = np.random.default_rng(args.seed)
latents = rng.standard_normal((N, 2)).astype(np.float32)  # (N, 2) noisy toy latents
controlnet_cond = rng.uniform(-1, 1, (N, 2)).astype(np.float32)  # (N, 2) control signal


def init(shape, gain=1.0):
    """A random float32 weight, variance gain / fan_in."""
    return (rng.standard_normal(shape) * np.sqrt(gain / shape[0])).astype(np.float32)


# the frozen base denoiser: conv_in, two down blocks, a mid block, two up blocks, conv_out
unet = dict(
    conv_in=init((2, D)), down_0=init((D, D)), down_1=init((D, D)), mid=init((D, D)),
    up_1=init((D, D)), skip_1=init((D, D)), up_0=init((D, D)), skip_0=init((D, D)),
    conv_out=init((D, 2)),
)  # fmt: skip
print(f"latents {latents.shape} {latents.dtype}, controlnet_cond {controlnet_cond.shape}")
# --8<-- [end:setup]

# %% [markdown]
# ## 2. The base denoiser with additive skip residuals
#
# `UNet2DConditionModel.forward` collects `down_block_res_samples` (the `conv_in`
# output, then each resnet's output, after its transformer in a cross-attention
# block, and each downsampler's output of the down blocks: 12 in SD 1.5;
# here each down block is one matrix, one skip), adds `down_block_additional_residuals[i]`
# to the i-th of them and `mid_block_additional_residual` to the mid-block output,
# and only then runs the up blocks, which consume the skips in reverse.


# %%
# --8<-- [start:unet]
def encoder(params, x, cond_embedding=None):
    """Down path: (N, 2) -> skips [(N, D)] * 3 and the mid-block output (N, D)."""
    h = x @ params["conv_in"]  # (N, D): conv_in
    if cond_embedding is not None:
        h = h + cond_embedding  # ControlNet: the embedded control signal joins here
    skips = [h]
    for name in ("down_0", "down_1"):
        h = np.tanh(h @ params[name])
        skips.append(h)  # down_block_res_samples: one per skip connection
    return skips, np.tanh(h @ params["mid"])


def unet_forward(x, down_block_additional_residuals=None, mid_block_additional_residual=None):
    """(N, 2) latents -> (N, 2) noise_pred; residuals are added to skips and mid output."""
    skips, mid = encoder(unet, x)
    if down_block_additional_residuals is not None:
        skips = [s + r for s, r in zip(skips, down_block_additional_residuals, strict=True)]
        mid = mid + mid_block_additional_residual
    h = np.tanh(mid @ unet["up_1"] + skips[2] @ unet["skip_1"])  # up blocks read skips
    h = np.tanh(h @ unet["up_0"] + skips[1] @ unet["skip_0"])
    return (h + skips[0]) @ unet["conv_out"]  # (N, 2) noise_pred


noise_pred_base = unet_forward(latents)
# --8<-- [end:unet]

# %% [markdown]
# ## 3. The ControlNet: a copy of the encoder and zero projections
#
# `ControlNetModel.from_unet` copies `conv_in`, the time embedding, every down block
# and the mid block. It adds `controlnet_cond_embedding` (small convs whose last one,
# `conv_out`, is `zero_module(...)`), one 1x1 conv per skip in
# `controlnet_down_blocks` and `controlnet_mid_block`, all zero-initialised. Here the
# 1x1 convs are `(D, D)` matrices. `forward` multiplies every residual by
# `conditioning_scale`; with `guess_mode` (and `global_pool_conditions` false) it uses
# `logspace(-1, 0, len(down) + 1)` times the scale instead, 0.1 for the first skip up
# to 1.0 for the mid block.


# %%
# --8<-- [start:controlnet]
def controlnet_from_unet(unet):
    """The copied encoder weights plus zero-initialised cond-embedding and projections."""
    net = {k: unet[k].copy() for k in ("conv_in", "down_0", "down_1", "mid")}
    net["cond_in"] = init((2, D))  # controlnet_cond_embedding: conv_in (random)
    net["cond_out"] = np.zeros((D, D), np.float32)  # its conv_out: zero_module
    net["controlnet_down_blocks"] = [np.zeros((D, D), np.float32) for _ in range(3)]
    net["controlnet_mid_block"] = np.zeros((D, D), np.float32)  # zero_module
    return net


def guess_mode_scales(n_down, conditioning_scale):
    """torch.logspace(-1, 0, n_down + 1) * conditioning_scale: shallow skips get less."""
    return (np.logspace(-1, 0, n_down + 1) * conditioning_scale).astype(np.float32)


def controlnet_forward(net, x, cond, conditioning_scale=1.0, guess_mode=False):
    """(N, 2) latents and (N, 2) cond -> (down_block_res_samples, mid_block_res_sample)."""
    conditioning_scale = np.float32(conditioning_scale)  # keep every residual float32
    cond_embedding = np.tanh(cond @ net["cond_in"]) @ net["cond_out"]  # (N, D)
    skips, mid = encoder(net, x, cond_embedding)
    down = [s @ z for s, z in zip(skips, net["controlnet_down_blocks"], strict=True)]
    mid = mid @ net["controlnet_mid_block"]
    if guess_mode:
        scales = guess_mode_scales(len(down), conditioning_scale)
        return [d * s for d, s in zip(down, scales[:-1], strict=True)], mid * scales[-1]
    return [d * conditioning_scale for d in down], mid * conditioning_scale


controlnet = controlnet_from_unet(unet)
down_res, mid_res = controlnet_forward(controlnet, latents, controlnet_cond)
noise_pred_init = unet_forward(latents, down_res, mid_res)
print(f"residual shapes: {[r.shape for r in down_res]} + mid {mid_res.shape}")
print(f"at init: every residual zero: {all(not r.any() for r in [*down_res, mid_res])}, "
      f"noise_pred == base exactly: {np.array_equal(noise_pred_init, noise_pred_base)}")  # fmt: skip
# --8<-- [end:controlnet]

# %% [markdown]
# ## 4. After training: the scale is linear in the residuals
#
# Training moves the zero projections. We stand in for it by drawing them at random.
# The residuals are then exactly linear in `conditioning_scale`; the output is not,
# because the up blocks are non-linear.

# %%
# --8<-- [start:trained]
trained = dict(controlnet)
trained["cond_out"] = init((D, D), 0.5)
trained["controlnet_down_blocks"] = [init((D, D), 0.1) for _ in range(3)]
trained["controlnet_mid_block"] = init((D, D), 0.1)
scale_grid = np.linspace(0.0, 2.0, 21)  # controlnet_conditioning_scale values
residual_norm, deviation = [], []
for scale in scale_grid:
    down, mid = controlnet_forward(trained, latents, controlnet_cond, scale)
    residual_norm.append(np.sqrt(sum(float((r**2).sum()) for r in [*down, mid])))
    deviation.append(float(np.abs(unet_forward(latents, down, mid) - noise_pred_base).mean()))
residual_norm, deviation = np.array(residual_norm), np.array(deviation)
unit = residual_norm[10]  # scale 1.0
print("scale  |residuals|/|at 1.0|  mean |noise_pred - base|")
for i in (0, 5, 10, 20):
    print(f"{scale_grid[i]:5.1f}  {residual_norm[i] / unit:18.3f}  {deviation[i]:26.4f}")
down_a, _ = controlnet_forward(trained, latents, controlnet_cond, 0.5)
down_b, _ = controlnet_forward(trained, latents, controlnet_cond, 1.0)
print(f"residuals(0.5) == 0.5 * residuals(1.0): "
      f"{all(np.array_equal(a, 0.5 * b) for a, b in zip(down_a, down_b, strict=True))}")  # fmt: skip
ramp = guess_mode_scales(len(down_a), 1.0)
print(f"guess_mode scales (logspace(-1, 0, {len(ramp)})): {[round(float(r), 4) for r in ramp]}")
# --8<-- [end:trained]

# %% [markdown]
# ## 5. Which steps get control: `controlnet_keep`
#
# `StableDiffusionControlNetPipeline.__call__` builds one 0/1 entry per timestep:
# `keep = 1.0 - float(i / len(timesteps) < start or (i + 1) / len(timesteps) > end)`,
# and calls the ControlNet at every step with
# `conditioning_scale = controlnet_conditioning_scale * controlnet_keep[i]`.
# With `guess_mode` and CFG the ControlNet sees only the conditional half of the batch
# and zeros are concatenated in front of each residual for the unconditional half.


# %%
# --8<-- [start:keep]
def controlnet_keep_for(n_timesteps, control_guidance_start, control_guidance_end):
    """The pipeline's per-step 0/1 list for one ControlNet."""
    return [
        1.0 - float(i / n_timesteps < control_guidance_start
                    or (i + 1) / n_timesteps > control_guidance_end)
        for i in range(n_timesteps)
    ]  # fmt: skip


controlnet_keep = controlnet_keep_for(args.steps, start, end)
cond_scales = [args.conditioning_scale * k for k in controlnet_keep]
print(f"controlnet_keep ({args.steps} steps, start {start}, end {end}): "
      f"{''.join(str(int(k)) for k in controlnet_keep)}")  # fmt: skip
# not counted here: the pipeline calls the ControlNet once per entry of scheduler.timesteps,
# 0 steps included, and builds controlnet_keep over them (tests/verify/test_page_lab_09.py)
print(f"steps with control: {int(sum(controlnet_keep))} of {args.steps} (the pipeline still "
      f"calls the ControlNet at a 0 step, with conditioning_scale 0.0)")  # fmt: skip

# step 0 with CFG: latent_model_input is [latents] * 2, (2N, 2), unconditional half first
latent_model_input = np.concatenate([latents, latents])
if args.guess_mode:  # ControlNet on the conditional half only, zeros for the uncond half
    down, mid = controlnet_forward(trained, latents, controlnet_cond, cond_scales[0], True)
    down = [np.concatenate([np.zeros_like(d), d]) for d in down]  # (2N, D)
    mid = np.concatenate([np.zeros_like(mid), mid])
else:  # ControlNet on the whole CFG batch, control image doubled
    control_image = np.concatenate([controlnet_cond, controlnet_cond])  # (2N, 2)
    down, mid = controlnet_forward(trained, latent_model_input, control_image, cond_scales[0])
noise_pred = unet_forward(latent_model_input, down, mid)  # (2N, 2)
noise_pred_uncond, noise_pred_text = np.split(noise_pred, 2)  # (N, 2) each
print(f"guess_mode={args.guess_mode}, step 0: noise_pred_uncond moved by "
      f"{np.abs(noise_pred_uncond - noise_pred_base).mean():.4f}, noise_pred_text by "
      f"{np.abs(noise_pred_text - noise_pred_base).mean():.4f}")  # fmt: skip
# --8<-- [end:keep]

# %% [markdown]
# ## 6. What control costs
#
# Per step the ControlNet is one more encoder pass. Count the toy's multiply-adds
# (2 FLOPs each) for both networks, then read SD 1.5's UNet size from
# `labkit.model_sizes`. `CONTROLNET_SD15_PARAMS` and `CONTROLNET_SD15_FLOPS_SHARE` are
# `ControlNetModel.from_unet` on SD 1.5's UNet config, counted on the meta device by this
# lab's verify test (parameters, and torch's `FlopCounterMode` for one call of each).


# %%
# --8<-- [start:cost]
def matmul_flops(weights):
    """2 * N * fan_in * fan_out summed over the weight matrices: one forward, N rows."""
    return sum(2 * N * m.shape[0] * m.shape[1] for m in weights)


base_flops = matmul_flops(unet.values())  # conv_in, 7 (D, D) blocks, conv_out
branch_weights = [trained[k] for k in ("conv_in", "down_0", "down_1", "mid", "cond_in", "cond_out")]
branch_flops = matmul_flops(branch_weights + trained["controlnet_down_blocks"]
                            + [trained["controlnet_mid_block"]])  # fmt: skip
print(f"toy FLOPs per step: base {base_flops:,}, ControlNet {branch_flops:,} "
      f"(+{branch_flops / base_flops:.0%}; its 4 projections alone: "
      f"{matmul_flops([trained['controlnet_mid_block']] * 4) / base_flops:.0%})")  # fmt: skip

# both checked in tests/verify/test_page_lab_09.py, on SD 1.5's real configs (meta device)
CONTROLNET_SD15_PARAMS = 361_279_120
CONTROLNET_SD15_FLOPS_SHARE = 0.353  # ControlNet / UNet FLOPs per call at 512 x 512
print(f"SD 1.5 at 512 x 512: ControlNet +{CONTROLNET_SD15_FLOPS_SHARE:.1%} of the UNet's FLOPs "
      f"per step (FlopCounterMode on the meta device), against the toy's "
      f"+{branch_flops / base_flops:.0%}")  # fmt: skip
unet_params = next(r["params"] for r in model_sizes.rows("SD 1.5") if r["component"] == "unet")
print(f"SD 1.5: UNet {unet_params:,} params, ControlNet {CONTROLNET_SD15_PARAMS:,} "
      f"({CONTROLNET_SD15_PARAMS / unet_params:.1%} of the UNet), "
      f"+{CONTROLNET_SD15_PARAMS * 2 / 1e9:.2f} GB in fp16")  # fmt: skip
# --8<-- [end:cost]

# %% [markdown]
# ## 7. The contrast: IP-Adapter's decoupled cross-attention
#
# `IPAdapterAttnProcessor2_0` keeps the layer's text attention and adds a second one of
# the same queries over image tokens, with its own `to_k_ip` / `to_v_ip`:
# `softmax(Q K_text^T / sqrt(d)) V_text + scale * softmax(Q K_img^T / sqrt(d)) V_img`,
# then the layer's `to_out`. Nothing is added to the skips.


# %%
# --8<-- [start:ip_adapter]
def attention(q, k, v, heads):
    """(B, Lq, C), (B, Lk, C) -> (B, Lq, C): multi-head scaled dot-product attention."""
    B, Lq, C = q.shape
    d = C // heads

    def split(t):
        return t.reshape(B, -1, heads, d).transpose(0, 2, 1, 3)  # (B, heads, L, d)

    scores = split(q) @ split(k).transpose(0, 1, 3, 2) / np.float32(np.sqrt(d))  # stays float32
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)  # softmax over the keys
    return (weights @ split(v)).transpose(0, 2, 1, 3).reshape(B, Lq, C)


def ip_adapter_attention(hidden_states, text, image, w, scale, heads):
    """Decoupled cross-attention; w holds to_q, to_k, to_v, to_k_ip, to_v_ip, to_out."""
    q = hidden_states @ w["to_q"]
    out = attention(q, text @ w["to_k"], text @ w["to_v"], heads)
    if scale != 0:  # the processor skips the image branch at scale 0
        out = out + scale * attention(q, image @ w["to_k_ip"], image @ w["to_v_ip"], heads)
    return out @ w["to_out"] + w["to_out_bias"]


C, E = 32, 24  # query width, prompt/image-token width
w = {k: init((E if k in ("to_k", "to_v", "to_k_ip", "to_v_ip") else C, C))
     for k in ("to_q", "to_k", "to_v", "to_k_ip", "to_v_ip", "to_out")}  # fmt: skip
w["to_out_bias"] = np.zeros(C, np.float32)
hidden_states = rng.standard_normal((1, 64, C)).astype(np.float32)  # (B, h*w, C)
text = rng.standard_normal((1, 77, E)).astype(np.float32)  # prompt_embeds (B, 77, E)
image = rng.standard_normal((1, 4, E)).astype(np.float32)  # 4 image tokens
out_text = ip_adapter_attention(hidden_states, text, image, w, 0.0, heads=4)
out_ip = ip_adapter_attention(hidden_states, text, image, w, 0.6, heads=4)
print(f"IP-Adapter: keys {77} text + {image.shape[1]} image tokens, attended separately; "
      f"scale 0.6 moves the output by {np.abs(out_ip - out_text).mean():.4f}")  # fmt: skip
# --8<-- [end:ip_adapter]

# %% [markdown]
# ## 8. Figures

# %%
# --8<-- [start:figures]
chart = figures.line_chart(
    {
        "|residuals| / |at 1.0|": (scale_grid, residual_norm / unit),
        "mean |noise_pred - base| / at 1.0": (scale_grid, deviation / deviation[10]),
    },
    "controlnet_conditioning_scale", "relative size",
)  # fmt: skip
figures.save(
    args.figures, "scale-response", chart,
    alt="Line chart against controlnet_conditioning_scale from 0 to 2, both curves relative "
    "to their value at scale 1: the residual norm is a straight line through the origin; the "
    "mean deviation of noise_pred from the base model also starts at 0 and lies almost on the "
    "same line at these residual sizes, since the up blocks are close to linear there.",
    caption="Residual size and output deviation against the conditioning scale (toy).",
)  # fmt: skip
windows = [(0.0, 1.0), (0.0, 0.5), (0.2, 0.8), (0.5, 1.0)]
keep_series = {
    f"start {s}, end {e}": (
        np.arange(args.steps),
        np.array(controlnet_keep_for(args.steps, s, e)) * (1 + 0.03 * j),  # offset: visible
    )
    for j, (s, e) in enumerate(windows)
}
keep_chart = figures.line_chart(keep_series, "step i", "controlnet_keep[i]")
figures.save(
    args.figures, "controlnet-keep", keep_chart,
    alt="Step chart of controlnet_keep against the step index for four windows: the full "
    "window is 1 everywhere; start 0, end 0.5 is 1 for the first half and 0 after; start 0.2, "
    "end 0.8 is 1 only in the middle; start 0.5, end 1 is 0 for the first half and 1 after. "
    "Lines are offset slightly so they do not overlap.",
    caption=f"controlnet_keep per step for four control_guidance windows ({args.steps} steps).",
)  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(chart))
    display(SVG(keep_chart))
# --8<-- [end:figures]
