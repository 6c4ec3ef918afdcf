"""Lab 12: What crosses each boundary of a Flux-class call, and what differs from Stable Diffusion's?

FLUX.1 is a flow-matching DiT: its ``latents`` are packed 2 x 2 into a sequence of tokens
``(B, N, 4C)`` with position ids, its sigmas are shifted by ``mu`` computed from that
sequence length, guidance is an input of the transformer (one call of B rows per step, no
doubling), and the decoder's input is unpacked and un-shifted. This starter runs such a
call on Lab 12's toy world (shape images, the patch-PCA "VAE", the exact denoiser, here as
a velocity) and records every array that crosses a boundary. The trap: reading SD's
``(2B, 4, h, w)`` habits into a pipeline whose latents have rank 3.

Run it:  python3 code/lab-12-end-to-end-inference-trace/flux_trace.py --true-cfg-scale 2
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit (see pipeline_trace.py)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import figures
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    add_pipeline_arguments,
    check_pipeline_arguments,
    in_notebook,
    parse_args,
)
from labkit.denoiser import UNCOND, FlowMatchDenoiser
from labkit.images import SHAPES, FiniteSet, toy_images
from labkit.schedulers import FlowMatchEulerDiscreteScheduler
from labkit.vae import PatchPCAAutoencoder

# %% [markdown]
# ## 1. The trace record
#
# The same rows as `pipeline_trace.py`. Layout symbols: `B` batch, `C` latent channels,
# `h, w` latent size, `H, W` image size, `N = (h/2)(w/2)` tokens, `4C` numbers per token,
# `L` text tokens, `D` text width, `P` pooled width, `n` steps; `n+1` and `4C` are
# sums and products of them. `expand` turns a layout into numbers.

# %%
# --8<-- [start:record]
trace = []  # one dict per boundary crossing, in execution order


def record(stage, boundary, name, array, layout, step=None):
    """Append one trace row for ``array``, which crossed ``boundary`` as ``name``."""
    array = np.asarray(array)
    trace.append(
        dict(stage=stage, step=step, boundary=boundary, name=name, shape=tuple(array.shape),
             layout=layout, dtype=str(array.dtype), device="cpu")
    )  # fmt: skip


def expand(layout, sizes):
    """``"B, N, 4C"`` and ``{"B": 2, "C": 4, ...}`` -> ``(2, 4, 16)``; ``""`` -> ``()``."""
    sizes = dict(sizes, N=sizes["h"] // 2 * (sizes["w"] // 2), H=sizes["f"] * sizes["h"],
                 W=sizes["f"] * sizes["w"])  # fmt: skip

    def axis(a):
        if "+" in a:  # "n+1"
            return sum(axis(part) for part in a.split("+"))
        digits = a[: len(a) - len(a.lstrip("0123456789"))]
        if digits == a:  # "3"
            return int(a)
        return int(digits or 1) * sizes[a[len(digits) :]]  # "4C", "B"

    return tuple(axis(a.strip()) for a in layout.split(",") if a.strip())


# --8<-- [end:record]

# %% [markdown]
# ## 2. load: the toy's parts, Flux-style
#
# The toy VAE of Lab 05 with `shift=True`: like FLUX.1's VAE it has a `shift_factor`
# (the latents' mean) and a `scaling_factor`, and the pipeline's latents are
# `(z - shift_factor) * scaling_factor`. The "transformer" is the exact velocity of
# those latents packed into tokens (section 3), on the flow-matching scheduler.

# %%
# --8<-- [start:load]
parser = LabArgumentParser(prog="flux_trace.py", description=__doc__.splitlines()[0])
parser.add_argument("--prompt", choices=SHAPES, default="disc", help="the class to generate")
add_pipeline_arguments(parser, guidance_help="guidance_scale: the transformer's guidance input")
parser.set_defaults(guidance_scale=3.5, steps=8, num_samples=2)  # FluxPipeline's 3.5
parser.add_argument(
    "--true-cfg-scale", type=float, default=1.0, help="> 1: a negative prompt, two calls per step"
)
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)
check_pipeline_arguments(parser, args)  # one-line errors past the toy's bounds
if not 0.0 <= args.true_cfg_scale < float("inf"):
    parser.error(f"--true-cfg-scale must be a finite number >= 0, got {args.true_cfg_scale:g}")

data = toy_images(256, seed=0)  # .images (K, 3, 32, 32) in [-1, 1], .labels (K,)
record("load", "toy_images(256)", "images", data.images, "K, 3, H, W")
vae = PatchPCAAutoencoder.fit(data.images, patch_size=8, latent_channels=4, shift=True)
z = vae.encode(data.images)  # (K, C, h, w) = (K, 4, 4, 4)
training_latents = (z - vae.config.shift_factor) * vae.config.scaling_factor  # mean 0, std 1
record("load", "(z - shift_factor) * scaling_factor", "training_latents", training_latents,
       "K, C, h, w")  # fmt: skip
scheduler = FlowMatchEulerDiscreteScheduler()  # FLUX.1: use_dynamic_shifting=True (section 4)
# --8<-- [end:load]

# %% [markdown]
# ## 3. Packing: 2 x 2 latent pixels -> one token
#
# `FluxPipeline._pack_latents` views `(B, C, h, w)` as `(B, C, h/2, 2, w/2, 2)`, permutes
# to `(B, h/2, w/2, C, 2, 2)` and flattens: token `(i, j)` holds the `4C` numbers of the
# 2 x 2 block at row `2i`, column `2j`, channel-major. `_unpack_latents` is the inverse.
# Packing only reorders numbers, so the exact denoiser of packed training latents is
# the packed exact denoiser: the toy "transformer" works on tokens directly.


# %%
# --8<-- [start:pack]
def _pack_latents(latents, batch_size, num_channels_latents, height, width):
    """(B, C, h, w) -> (B, N, 4C), N = (h/2)(w/2): diffusers' index arithmetic."""
    latents = latents.reshape(batch_size, num_channels_latents, height // 2, 2, width // 2, 2)
    latents = latents.transpose(0, 2, 4, 1, 3, 5)  # (B, h/2, w/2, C, 2, 2)
    return latents.reshape(batch_size, (height // 2) * (width // 2), num_channels_latents * 4)


def _unpack_latents(latents, height, width):
    """(B, N, 4C) -> (B, C, h, w), the inverse (``height, width`` in latent pixels here)."""
    batch_size, _num_patches, channels = latents.shape  # (B, N, 4C)
    latents = latents.reshape(batch_size, height // 2, width // 2, channels // 4, 2, 2)
    latents = latents.transpose(0, 3, 1, 4, 2, 5)  # (B, C, h/2, 2, w/2, 2)
    return latents.reshape(batch_size, channels // 4, height, width)


def _prepare_latent_image_ids(height, width):
    """(N, 3) float: (0, row, column) of each token, for the rotary position embedding."""
    latent_image_ids = np.zeros((height, width, 3))
    latent_image_ids[..., 1] += np.arange(height)[:, None]
    latent_image_ids[..., 2] += np.arange(width)[None, :]
    return latent_image_ids.reshape(height * width, 3)


K, C, h, w = training_latents.shape
packed_set = FiniteSet(_pack_latents(training_latents, K, C, h, w), data.labels)  # (K, N, 4C)
velocity = FlowMatchDenoiser(packed_set)  # exact v = noise - x0 for x_t = (1 - s) x0 + s noise


def transformer(hidden_states, timestep, guidance, pooled_projections, encoder_hidden_states,
                txt_ids, img_ids):  # fmt: skip
    """The toy's FluxTransformer2DModel: (B, N, 4C) tokens at sigma = ``timestep`` -> (B, N, 4C).

    It reads the class from ``pooled_projections`` (one-hot; all zero = no prompt) and
    emulates guidance distillation: in ONE call it returns what CFG at scale ``guidance``
    would give, v_u + g (v_c - v_u). (FLUX.1-dev learned that; the toy computes it.)
    ``encoder_hidden_states``, ``txt_ids`` and ``img_ids`` carry no extra information here.
    """
    transformer.rows.append(len(hidden_states))  # one call of this many rows
    labels = np.where(pooled_projections.any(axis=1), pooled_projections.argmax(axis=1), UNCOND)
    t = float(timestep[0]) * 1000  # the pipeline passes t / 1000 = sigma; the toy wants t
    v_cond = velocity(hidden_states, t, labels)
    if guidance is None:  # FLUX.1-schnell: no guidance embedding
        return v_cond
    v_uncond = velocity(hidden_states, t, UNCOND)
    return v_uncond + guidance[:, None, None] * (v_cond - v_uncond)


transformer.rows = []
# --8<-- [end:pack]

# %% [markdown]
# ## 4. prepare: text stand-ins, packed noise, ids, the shifted schedule
#
# FLUX.1's `encode_prompt` returns T5's `prompt_embeds (B, 512, 4096)`, CLIP's pooled
# `pooled_prompt_embeds (B, 768)` and `text_ids (512, 3)` of zeros. The toy's stand-ins:
# ONE token of the one-hot class, `(B, 1, 4)`, and the same one-hot as the pooled vector
# `(B, 4)`; the negative prompt of true CFG is all zeros. `calculate_shift` turns the
# token count into `mu` (0.5 at 256 tokens, 1.15 at 4096, linear between), and
# `set_timesteps(sigmas=linspace(1, 1/n, n), mu=mu)` shifts the sigmas toward noise.

# %%
# --8<-- [start:prepare]
B, n = args.num_samples, args.steps
prompt_class = SHAPES.index(args.prompt)
prompt_embeds = np.eye(len(SHAPES))[np.full(B, prompt_class)][:, None, :]  # (B, L, D) = (B, 1, 4)
record("prepare", "encode_prompt (T5 stand-in)", "prompt_embeds", prompt_embeds, "B, L, D")
pooled_prompt_embeds = prompt_embeds[:, 0, :]  # (B, P) = (B, 4): CLIP's pooled vector
record("prepare", "encode_prompt (CLIP pooled stand-in)", "pooled_prompt_embeds",
       pooled_prompt_embeds, "B, P")  # fmt: skip
text_ids = np.zeros((prompt_embeds.shape[1], 3))  # (L, 3): text tokens get no position
record("prepare", "encode_prompt", "text_ids", text_ids, "L, 3")
do_true_cfg = args.true_cfg_scale > 1  # and a negative prompt: FluxPipeline's rule
if do_true_cfg:
    negative_prompt_embeds = np.zeros_like(prompt_embeds)  # the toy's "no prompt"
    record("prepare", "encode_prompt (negative)", "negative_prompt_embeds",
           negative_prompt_embeds, "B, L, D")  # fmt: skip
    negative_pooled_prompt_embeds = negative_prompt_embeds[:, 0, :]
    record("prepare", "encode_prompt (negative)", "negative_pooled_prompt_embeds",
           negative_pooled_prompt_embeds, "B, P")  # fmt: skip
    negative_text_ids = np.zeros((negative_prompt_embeds.shape[1], 3))
    record("prepare", "encode_prompt (negative)", "negative_text_ids", negative_text_ids, "L, 3")

noise = np.random.default_rng(args.seed).standard_normal((B, C, h, w))  # (B, C, h, w)
record("prepare", "prepare_latents: randn", "latents", noise, "B, C, h, w")
latents = _pack_latents(noise, B, C, h, w)  # (B, N, 4C): rank 3 from here to the decoder
record("prepare", "_pack_latents", "latents", latents, "B, N, 4C")
latent_image_ids = _prepare_latent_image_ids(h // 2, w // 2)  # (N, 3)
record("prepare", "_prepare_latent_image_ids", "latent_image_ids", latent_image_ids, "N, 3")


def calculate_shift(image_seq_len, base_seq_len=256, max_seq_len=4096, base_shift=0.5,
                    max_shift=1.15):  # fmt: skip
    """FluxPipeline's line through (256, 0.5) and (4096, 1.15), at ``image_seq_len``."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * m + (base_shift - m * base_seq_len)


image_seq_len = latents.shape[1]  # N tokens
mu = calculate_shift(image_seq_len)
record("prepare", "calculate_shift(image_seq_len)", "mu", mu, "")
sigmas = np.linspace(1.0, 1 / n, n)  # (n,) before the shift
scheduler.set_timesteps(n, sigmas=sigmas, mu=mu)  # sigma' = e^mu / (e^mu + 1/sigma - 1)
record("prepare", "set_timesteps(sigmas=..., mu=mu)", "timesteps", scheduler.timesteps, "n")
record("prepare", "set_timesteps(sigmas=..., mu=mu)", "sigmas", scheduler.sigmas, "n+1")
guidance = np.full(B, args.guidance_scale, dtype=np.float32)  # torch.full([1]).expand(B)
record("prepare", "torch.full(guidance_scale).expand", "guidance", guidance, "B")
# --8<-- [end:prepare]

# %% [markdown]
# ## 5. loop: one transformer call of B rows per step (two with true CFG)
#
# No `cat([latents] * 2)`: guidance travels as an input. With `true_cfg_scale > 1` and a
# negative prompt, `FluxPipeline.__call__` calls the transformer a second time, again on
# `B` rows, and combines `neg + true_cfg_scale * (noise_pred - neg)`.

# %%
# --8<-- [start:loop]
for i, t in enumerate(scheduler.timesteps, start=1):
    timestep = np.full(B, t)  # t.expand(latents.shape[0]): (B,)
    record("loop", "transformer(hidden_states=latents)", "latents", latents, "B, N, 4C", i)
    record("loop", "timestep / 1000", "timestep", timestep / 1000, "B", i)
    noise_pred = transformer(latents, timestep / 1000, guidance, pooled_prompt_embeds,
                             prompt_embeds, text_ids, latent_image_ids)  # fmt: skip
    record("loop", "transformer(...)", "noise_pred", noise_pred, "B, N, 4C", i)
    if do_true_cfg:
        record("loop", "transformer(negative)", "latents", latents, "B, N, 4C", i)
        record("loop", "timestep / 1000 (negative)", "timestep", timestep / 1000, "B", i)
        neg_noise_pred = transformer(latents, timestep / 1000, guidance,
                                     negative_pooled_prompt_embeds, negative_prompt_embeds,
                                     negative_text_ids, latent_image_ids)  # fmt: skip
        record("loop", "transformer(negative ...)", "neg_noise_pred", neg_noise_pred,
               "B, N, 4C", i)  # fmt: skip
        noise_pred = neg_noise_pred + args.true_cfg_scale * (noise_pred - neg_noise_pred)
        record("loop", "true CFG combine", "noise_pred", noise_pred, "B, N, 4C", i)
    latents = scheduler.step(noise_pred, t, latents).prev_sample  # x + (sigma_next - sigma) v
    record("loop", "scheduler.step(...).prev_sample", "latents", latents, "B, N, 4C", i)
# --8<-- [end:loop]

# %% [markdown]
# ## 6. decode: unpack, undo the normalisation, decode
#
# `_unpack_latents` gives `(B, C, h, w)` back; the decoder's input is
# `latents / scaling_factor + shift_factor` (SD: `latents / scaling_factor` only).

# %%
# --8<-- [start:decode]
latents = _unpack_latents(latents, h, w)  # (B, C, h, w): rank 4 again
record("decode", "_unpack_latents", "latents", latents, "B, C, h, w")
vae_input = latents / vae.config.scaling_factor + vae.config.shift_factor
record("decode", "latents / scaling_factor + shift_factor", "latents", vae_input, "B, C, h, w")
image = vae.decode(vae_input)  # (B, 3, H, W), about [-1, 1]
record("decode", "vae.decode", "image", image, "B, 3, H, W")
image_np = np.clip(image / 2 + 0.5, 0, 1).transpose(0, 2, 3, 1)  # (B, H, W, 3) in [0, 1]
record("decode", 'postprocess(output_type="np")', "image", image_np, "B, H, W, 3")
# --8<-- [end:decode]

# %% [markdown]
# ## 7. The trace table, and the differences from SD's
#
# Every row but the loop's middle steps; the checks run before anything prints.

# %%
# --8<-- [start:table]
sizes = dict(K=K, B=B, n=n, C=C, h=h, w=w, f=vae.config.patch_size, L=1, D=4, P=4)
assert all(row["shape"] == expand(row["layout"], sizes) for row in trace)  # every row
per_step = 8 if do_true_cfg else 4
loop_rows = [row for row in trace if row["stage"] == "loop"]
assert len(loop_rows) == n * per_step
assert transformer.rows == [B] * n * (2 if do_true_cfg else 1)  # B rows a call, never 2B
packed = _pack_latents(noise, B, C, h, w)
assert np.array_equal(_unpack_latents(packed, h, w), noise)  # packing loses nothing
assert np.array_equal(packed[:, 1, : C * 4 : 4], noise[:, :, 0, 2])  # token 1 = block (0, 2)
nearest, rms = FiniteSet(training_latents, data.labels).nearest(latents)
print(f"{'stage':<9} {'boundary':<41} {'name':<22} {'shape':<14} {'layout':<13} dtype")
for row in trace:
    if row["stage"] == "loop" and 1 < row["step"] < n:
        if row is loop_rows[per_step]:  # first row of step 2
            middle = "loop 2" if n == 3 else f"loop 2-{n - 1}"
            print(f"{middle:<9} (the same {per_step} boundaries and shapes)")
        continue
    stage = row["stage"] if row["step"] is None else f"loop {row['step']}/{n}"
    comma = "," if len(row["shape"]) == 1 else ""
    print(f"{stage:<9} {row['boundary']:<41} {row['name']:<22} {row['shape']!s:<14}"
          f" ({row['layout']}{comma}){'':<{max(0, 10 - len(row['layout']) - len(comma))}} {row['dtype']}")  # fmt: skip
print(f"{len(trace)} rows, {len(loop_rows)} in the loop ({n} steps x {per_step})")
print(f"transformer calls: {len(transformer.rows)} of {B} rows each "
      f"(SD with CFG and DDIM: {n} unet calls of {2 * B} rows)")  # fmt: skip
print(f"latents in the loop: rank 3 {loop_rows[-1]['shape']} (SD: rank 4, (B, 4, h, w))")
print(f"mu = calculate_shift({image_seq_len}) = {mu:.4f} in this toy (1.15 at 4096 tokens);"
      f" sigmas {scheduler.sigmas[0]:.3f}, {scheduler.sigmas[1]:.3f} ... {scheduler.sigmas[-2]:.3f}"
      f" (unshifted {sigmas[min(1, n - 1)]:.3f} ... {sigmas[-1]:.3f}); SD's DDIM has no resolution-dependent shift")  # fmt: skip
print(f"decode undo: latents / {vae.config.scaling_factor:.3f} + {vae.config.shift_factor:.3f}"
      " (SD: latents / scaling_factor only; the toy's shift is ~0: PCA codes are centred)")  # fmt: skip
print(f"nearest training latent has the prompt's label: {np.mean(data.labels[nearest] == prompt_class):.0%} of {B}")  # fmt: skip
# --8<-- [end:table]

# %% [markdown]
# ## 8. Picture it: the call as a diagram drawn from the trace

# %%
# --8<-- [start:figures]
step_one = [r for r in trace if r["stage"] != "load" and r["step"] in (None, 1)]
diagram_rows = [
    (r["stage"], r["boundary"], [f"{r['name']} ({r['layout'] or 'scalar'})",
                                 f"toy: {r['shape']} {r['dtype']}"])
    for r in step_one
    if r["name"] not in ("timestep",) and "negative" not in r["boundary"]
]  # fmt: skip
flux_svg = figures.flow_diagram(
    diagram_rows, repeat={"loop": f"x {n} steps"}, title="A Flux-class pipeline call"
)
described = "; ".join(f"{op} gives {labels[0]}" for _, op, labels in diagram_rows)
figures.save(
    args.figures, "flux", flux_svg,
    alt=f"Diagram of one Flux-class call in this toy, in three stages. {described}. The loop "
    f"repeats {n} times with one transformer call of {B} rows per step.",
    caption=f"One Flux-class call on Lab 12's toy (B = {B}, {n} steps): each box a boundary, "
    "each arrow the tensor with its layout and its shape in this toy. Drawn from the trace.",
)  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(flux_svg))
# --8<-- [end:figures]
