"""Lab 12: what crosses each boundary of a text-to-image pipeline, and where does the work go?

A latent-diffusion pipeline is four stages: ``load`` builds the modules, ``prepare``
makes the condition and the starting ``latents``, ``loop`` rewrites ``latents`` once per
timestep (the denoiser on a doubled batch when guiding), and ``decode`` turns the final
latents into pixels. This starter runs all four on a toy world (shape images, a patch-PCA
"VAE", the exact denoiser of its training latents, DDIM) and records the shape, dtype and
device of every array that crosses a boundary. The trap: a pipeline is not "the model";
the scheduler and the VAE are in the path, and the loop is where the work goes.

Run it:  python3 code/lab-12-end-to-end-inference-trace/pipeline_trace.py --prompt disc
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import ExactDenoiser, alphas_cumprod, canonical_betas, figures
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    add_pipeline_arguments,
    check_pipeline_arguments,
    in_notebook,
    parse_args,
)
from labkit.denoiser import UNCOND
from labkit.images import SHAPES, FiniteSet, image_grid, toy_images
from labkit.schedulers import DDIMScheduler
from labkit.vae import PatchPCAAutoencoder

# %% [markdown]
# ## 1. The trace record
#
# One row per array that crosses a stage boundary: the stage, the boundary (the line
# of code that produced it), the variable's name, its concrete `shape`, its `layout`
# (the shape in symbols: `B` batch, `2B` the guided batch, `n` steps, `h, w` latent
# size, `H, W` image size, `4` latent channels), its dtype and its device. The layout
# is what two pipelines of different sizes share; `expand` turns it back into numbers.

# %%
# --8<-- [start:record]
trace = []  # one dict per boundary crossing, in execution order


def record(stage, boundary, name, array, layout, step=None):
    """Append one trace row for ``array``, which crossed ``boundary`` as ``name``."""
    trace.append(
        dict(stage=stage, step=step, boundary=boundary, name=name, shape=tuple(array.shape),
             layout=layout, dtype=str(array.dtype), device="cpu")
    )  # fmt: skip


def expand(layout, sizes):
    """``"2B, 4, h, w"`` and ``{"B": 8, "h": 4, ...}`` -> ``(16, 4, 4, 4)``; H = f*h, W = f*w."""
    sizes = dict(sizes, H=sizes["f"] * sizes["h"], W=sizes["f"] * sizes["w"])
    return tuple(
        2 * sizes["B"] if axis == "2B" else sizes[axis] if axis in sizes else int(axis)
        for axis in (a.strip() for a in layout.split(","))
    )


# --8<-- [end:record]

# %% [markdown]
# ## 2. load: build the modules
#
# A real pipeline's `from_pretrained` reads weights; the toy builds its parts instead:
# 256 training images of four shapes, a patch-PCA autoencoder fitted to them (Lab 05)
# as the `vae`, their latents scaled by `vae.config.scaling_factor`, the exact
# denoiser of those latents as the `unet`, and SD 1.5's DDIM scheduler config.

# %%
# --8<-- [start:load]
parser = LabArgumentParser(prog="pipeline_trace.py", description=__doc__.splitlines()[0])
parser.add_argument("--prompt", choices=SHAPES, default="disc", help="the class to generate")
add_pipeline_arguments(parser, guidance_help="CFG scale; <= 1: off")  # and --steps, --num-samples
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)
check_pipeline_arguments(parser, args, 999, "steps_offset=1 would reach t=1000")  # one-line errors

data = toy_images(256, seed=0)  # .images (K, 3, 32, 32) in [-1, 1], .labels (K,)
record("load", "toy_images(256)", "images", data.images, "K, 3, H, W")
vae = PatchPCAAutoencoder.fit(data.images, patch_size=8, latent_channels=4)  # Lab 05
training_latents = vae.encode(data.images) * vae.config.scaling_factor  # (K, 4, 4, 4), std 1
record("load", "vae.encode * scaling_factor", "training_latents", training_latents, "K, 4, h, w")
training_set = FiniteSet(training_latents, data.labels)  # the data the "unet" knows exactly
unet = ExactDenoiser(training_set, alphas_cumprod(canonical_betas("scaled_linear")), "epsilon")
scheduler = DDIMScheduler(  # the values of SD 1.5's scheduler_config.json
    beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
    set_alpha_to_one=False, steps_offset=1, clip_sample=False,
)  # fmt: skip
# --8<-- [end:load]

# %% [markdown]
# ## 3. prepare: the condition and the starting latents
#
# In `StableDiffusionPipeline.__call__`: `encode_prompt` gives `prompt_embeds` and
# `negative_prompt_embeds` `(B, 77, 768)`; `retrieve_timesteps` calls `set_timesteps`;
# `prepare_latents` draws noise `(B, 4, H/8, W/8)` and multiplies it by
# `init_noise_sigma`. The toy has no text encoder: its condition is a class label per
# row, and `UNCOND` (-1) is the empty prompt. So these are `class_labels`, the toy's
# stand-in for `prompt_embeds`, not embeddings.

# %%
# --8<-- [start:prepare]
B, n = args.num_samples, args.steps
prompt_class = SHAPES.index(args.prompt)  # "disc" -> 0: the tokenizer + text encoder's job
class_labels = np.full(B, prompt_class)  # (B,): the toy's prompt_embeds
record("prepare", "prompt -> condition", "class_labels", class_labels, "B")
negative_class_labels = np.full(B, UNCOND)  # (B,): the empty prompt ""
record(
    "prepare", "negative prompt -> condition", "negative_class_labels", negative_class_labels, "B"
)
scheduler.set_timesteps(n)  # (n,) int64, leading: (n - 1) * (1000 // n) + 1 down to 1
record("prepare", "set_timesteps", "timesteps", scheduler.timesteps, "n")
noise = np.random.default_rng(args.seed).standard_normal((B, 4, 4, 4))  # (B, 4, h, w)
latents = noise * scheduler.init_noise_sigma  # DDIM: 1.0; Euler (linspace): the largest sigma
record("prepare", "noise * init_noise_sigma", "latents", latents, "B, 4, h, w")
# --8<-- [end:prepare]

# %% [markdown]
# ## 4. loop: one denoiser call per timestep, on a doubled batch when guiding
#
# The same lines as the pipeline's loop and Lab 04: duplicate `latents` along the batch
# axis, call the denoiser once on `2B` rows (unconditional first), split, extrapolate,
# step. Five boundaries per step; every step has the same shapes.

# %%
# --8<-- [start:loop]
do_classifier_free_guidance = args.guidance_scale > 1.0  # SD 1.5's rule; else cond only
copies, rows = (2, "2B") if do_classifier_free_guidance else (1, "B")
# cat([negative_prompt_embeds, prompt_embeds]), once before the loop: uncond rows first
encoder_hidden_states = np.concatenate([negative_class_labels, class_labels][-copies:])
into_unet = "cat([latents] * 2), scale_model_input" if copies == 2 else "scale_model_input"
guide = "split + guidance" if copies == 2 else "no guidance: unchanged"
for i, t in enumerate(scheduler.timesteps, start=1):
    latent_model_input = np.concatenate([latents] * copies)  # (2B, 4, h, w): the batch doubles
    latent_model_input = scheduler.scale_model_input(latent_model_input, t)  # DDIM: identity
    record("loop", into_unet, "latent_model_input", latent_model_input, f"{rows}, 4, h, w", i)
    record("loop", "condition into the unet", "class_labels", encoder_hidden_states, rows, i)
    noise_pred = unet(latent_model_input, t, class_labels=encoder_hidden_states)  # one call
    record("loop", "unet(...)", "noise_pred", noise_pred, f"{rows}, 4, h, w", i)
    if do_classifier_free_guidance:
        noise_pred_uncond, noise_pred_text = np.split(noise_pred, 2)  # chunk(2): uncond first
        noise_pred = noise_pred_uncond + args.guidance_scale * (noise_pred_text - noise_pred_uncond)
    record("loop", guide, "noise_pred", noise_pred, "B, 4, h, w", i)  # (B, 4, h, w)
    latents = scheduler.step(noise_pred, t, latents).prev_sample  # x_t -> x_{t-1}
    record("loop", "scheduler.step(...).prev_sample", "latents", latents, "B, 4, h, w", i)
# --8<-- [end:loop]

# %% [markdown]
# ## 5. decode: latents to pixels
#
# `vae.decode(latents / vae.config.scaling_factor)` gives `(B, 3, H, W)` in about
# [-1, 1]; `image_processor.postprocess(output_type="np")` maps it to [0, 1] and moves
# the channels last, `(B, H, W, 3)` float; `numpy_to_pil` makes 8-bit pixels of it.

# %%
# --8<-- [start:decode]
vae_input = latents / vae.config.scaling_factor  # back to the vae's own latent scale
record("decode", "latents / scaling_factor", "latents", vae_input, "B, 4, h, w")
image = vae.decode(vae_input)  # (B, 3, H, W), about [-1, 1]: 8 x 8 pixels per latent
record("decode", "vae.decode", "image", image, "B, 3, H, W")
image_np = np.clip(image / 2 + 0.5, 0, 1).transpose(0, 2, 3, 1)  # (B, H, W, 3) in [0, 1]
record("decode", 'postprocess(output_type="np")', "image", image_np, "B, H, W, 3")
pixels = (image_np * 255).round().astype(np.uint8)  # what numpy_to_pil hands to PIL
record("decode", "(image * 255).round() to uint8", "image", pixels, "B, H, W, 3")
# --8<-- [end:decode]

# %% [markdown]
# ## 6. The trace table
#
# Every row of load, prepare and decode, and the five rows of the first and the last
# step; the steps between cross the same five boundaries with the same shapes, which
# the check below asserts rather than prints.

# %%
# --8<-- [start:table]
sizes = dict(K=len(data.images), B=B, n=n, h=4, w=4, f=vae.config.patch_size)
assert all(row["shape"] == expand(row["layout"], sizes) for row in trace)  # every row
loop_rows = [row for row in trace if row["stage"] == "loop"]
assert all(a["shape"] == b["shape"] for a, b in zip(loop_rows[:-5], loop_rows[5:], strict=True))
print(
    f"{'stage':<10} {'boundary':<38} {'name':<21} {'shape':<17} {'layout':<14} {'dtype':<8} device"
)
for row in trace:
    if row["stage"] == "loop" and 1 < row["step"] < n:
        if row is loop_rows[5]:  # first row of step 2
            middle = "loop 2" if n == 3 else f"loop 2-{n - 1}"
            print(
                f"{middle:<10} (the same 5 boundaries and shapes, {n - 2} more step{'s' * (n > 3)})"
            )
        continue
    stage = row["stage"] if row["step"] is None else f"loop {row['step']}/{n}"
    comma = "," if len(row["shape"]) == 1 else ""  # (8,) like Python prints a 1-tuple
    shape, layout = str(row["shape"]), f"({row['layout']}{comma})"
    print(
        f"{stage:<10} {row['boundary']:<38} {row['name']:<21} {shape:<17} {layout:<14}"
        f" {row['dtype']:<8} {row['device']}"
    )
print(f"{len(trace)} rows: {sum(r['stage'] == 'loop' for r in trace)} in the loop ({n} steps x 5)")
# --8<-- [end:table]

# %% [markdown]
# ## 7. Check: what came out
#
# The exact denoiser of a finite set is the memorising optimum: a perfect sampler
# returns training points. So each generated latent should sit next to a training
# latent of the prompted class. `nearest` finds it; `purity` is the share whose label
# is the prompt; the distance is in scaled latent units, where DDIM's last step
# (`set_alpha_to_one=False`) leaves noise of std `sqrt(1 - alphas_cumprod[0])`.

# %%
# --8<-- [start:check]
nearest, rms = training_set.nearest(latents)  # (B,) indices into the training set, (B,) RMS
purity = np.mean(data.labels[nearest] == prompt_class)
print(
    f"prompt {args.prompt!r} (class {prompt_class}), guidance_scale {args.guidance_scale:g},"
    f" {n} steps, B = {B}: unet.calls {unet.calls}, unet.rows {unet.rows}"
)
print(
    f"vae: {vae.config.patch_size} x {vae.config.patch_size} pixels per latent, 4 channels,"
    f" scaling_factor {vae.config.scaling_factor:.3f} (1 / std of the training latents)"
)
print(f"nearest training latent has the prompt's label: {purity:.1%} of {B}")
print(f"distinct training images reached: {len(np.unique(nearest))} of {B}")
print(
    f"RMS distance to the nearest training latent: max {rms.max():.3f}"
    f" (DDIM's last-step noise std: {np.sqrt(1 - scheduler.alphas_cumprod[0]):.3f})"
)
print(f"output pixels: {pixels.shape} {pixels.dtype}, range {pixels.min()}..{pixels.max()}")
# --8<-- [end:check]

# %% [markdown]
# ## 8. Where the work goes: a cost model, not a stopwatch
#
# Multiply-adds counted from the shapes in the trace (wall time varies from run to run;
# this does not). Matrix products count rows x inner size x columns; elementwise
# steps one per element. Patches hold `P = 3 * 8 * 8 = 192` numbers, a latent
# `D = 4 * 4 * 4 = 64`. The exact denoiser compares each row with every training latent
# of its condition (all `K` for `UNCOND` rows, one class for the others), then
# averages them: `2 * K_row * D` per row.

# %%
# --8<-- [start:cost]
P, C = 3 * vae.config.patch_size**2, 4  # numbers per patch, latent channels
D, K = 4 * 4 * 4, len(data.images)
patches = K * 4 * 4  # training patches (K, h, w)
K_row = {UNCOND: K} | {c: int(np.sum(data.labels == c)) for c in range(len(SHAPES))}
per_call = sum(2 * K_row[int(label)] * D for label in encoder_hidden_states)
cost = {
    # covariance (patches x P x P) + eigh (~P^3) + encoding the K training images
    "load": patches * P * P + P**3 + patches * P * C,
    # noise * init_noise_sigma
    "prepare": B * D,
    # per step: the denoiser, the guidance line, DDIM's step (~4 ops per element)
    "loop": n * (per_call + (2 * B * D if do_classifier_free_guidance else 0) + 4 * B * D),
    # / scaling_factor, the decoder's matmul (B*h*w x C x P), postprocess (~3 per pixel value)
    "decode": B * D + B * 4 * 4 * C * P + 3 * B * 3 * 32 * 32,
}
run_total, call_total = sum(cost.values()), sum(cost.values()) - cost["load"]
print(f"{'stage':<8} {'multiply-adds':>14} {'of the run':>11} {'of one call':>12}")
for stage, macs in cost.items():
    of_call = "(once)" if stage == "load" else f"{macs / call_total:.1%}"
    print(f"{stage:<8} {macs:>14,} {macs / run_total:>11.1%} {of_call:>12}")
print(f"loop: {n} unet calls x {per_call:,} multiply-adds ({len(encoder_hidden_states)} rows)")
# --8<-- [end:cost]

# %% [markdown]
# ## 9. Picture it
#
# Top row: the generated images. Middle: the nearest training latent, decoded by the
# same `vae`. Bottom: that training image as drawn, before the `vae` saw it.
# Then the cost model as two timelines, each scaled to its own total: the whole run
# (load included) and one pipeline call (load excluded), one block per loop step.


# %%
# --8<-- [start:figures]
def timeline_svg(cost, n):
    """Two stacked horizontal bars of the cost model; one segment per stage, per step."""
    width, left, bar_w, bar_h = 640, 150, 460, 34
    colours = {"load": 0, "prepare": 1, "loop": 2, "decode": 3}
    body, y = [], 30
    body.append(f'<text class="title" x="{width / 2}" y="18" text-anchor="middle">'
                "Cost model: multiply-adds per stage, in execution order</text>")  # fmt: skip
    for label, stages in [("whole run", list(cost)), ("one pipeline call", list(cost)[1:])]:
        total, x = sum(cost[s] for s in stages), float(left)
        body.append(
            f'<text x="{left - 8}" y="{y + bar_h / 2 + 5}" text-anchor="end">{label}</text>'
        )
        for s in stages:
            pieces = n if s == "loop" else 1  # one block per loop step
            for _ in range(pieces):
                w = bar_w * cost[s] / total / pieces
                body.append(f'<rect class="c{colours[s]} dot" x="{x:.2f}" y="{y}" '
                            f'width="{max(w - (0.6 if pieces > 1 else 0), 0.3):.2f}" height="{bar_h}"/>')  # fmt: skip
                x += w
        y += bar_h + 22
    run_total, call_total = sum(cost.values()), sum(cost.values()) - cost["load"]
    for k, s in enumerate(cost):  # legend: stage, count and shares
        share = f"{cost[s] / run_total:.1%} of the run"
        share += "" if s == "load" else f", {cost[s] / call_total:.1%} of a call"
        lx, ly = 40, y + 8 + k * 22
        body.append(
            f'<rect class="c{colours[s]} dot" x="{lx}" y="{ly - 11}" width="14" height="14"/>'
        )
        body.append(
            f'<text x="{lx + 20}" y="{ly + 1}">{s}: {cost[s]:,} multiply-adds ({share})</text>'
        )
    height = y + 8 + 4 * 22
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="lab-chart" viewBox="0 0 {width} {height}"'
            f' width="{width}" height="{height}" aria-hidden="true" focusable="false">'
            + "".join(body) + "</svg>\n")  # fmt: skip


shown = min(B, 8)
recon = vae.decode(training_latents[nearest[:shown]] / vae.config.scaling_factor)
rows3 = [image[:shown], recon, data.images[nearest[:shown]]]  # generated, decoded, original
grid = image_grid(np.concatenate(rows3), columns=shown)
images_png = figures.png(grid, scale=3)
figures.save(
    args.figures, "images", images_png,
    alt=f"Three rows of {shown} small images. Top: the images generated for the prompt "
    f"'{args.prompt}', blocky because the 4-channel patch-PCA decoder keeps 4 numbers per 8 x 8 "
    "patch. Middle: the nearest training latent, decoded the same way, which looks the same. "
    "Bottom: that training image itself, the shape, colour and position the sample copied.",
    caption=f"Generated for prompt '{args.prompt}' (top), the nearest training latent decoded "
    "(middle) and its training image (bottom).",
)  # fmt: skip
timeline = timeline_svg(cost, n)
figures.save(
    args.figures, "timeline", timeline,
    alt=f"Two horizontal bars of multiply-adds. Whole run: load takes "
    f"{cost['load'] / run_total:.0%}, the {n} loop steps most of the rest, prepare and decode "
    f"slivers. One pipeline call: the {n} loop steps fill "
    f"{cost['loop'] / call_total:.0%} of the bar, decode the rest.",
    caption="Cost model (multiply-adds from the shapes, not measured time) per stage, with one "
    "block per loop step.",
)  # fmt: skip

# The pipeline as a diagram, drawn from the trace: each arrow is a row above, with its
# layout, the shape it had in this toy run, and the shape the same layout has in SD 1.5.
# The home page and the inference-loop section show it too.
sd15 = dict(B=1, n=50, h=64, w=64, f=8)  # one 512 x 512 image, 50 steps
first_step = [row for row in trace if row["step"] in (None, 1)]
picked = {  # (stage, boundary) of a trace row -> (operation, name and layout in diffusers)
    # encode_prompt returns (B, 77, 768) twice; __call__ concatenates them when guiding
    ("loop", "condition into the unet"): (
        "encode_prompt, cat([negative, prompt])" if copies == 2 else "encode_prompt",
        "prompt_embeds",
        f"{rows}, 77, 768",
    ),
    ("prepare", "set_timesteps"): ("set_timesteps(n)", None, None),
    ("prepare", "noise * init_noise_sigma"): ("randn * init_noise_sigma", None, None),
    ("loop", into_unet): (into_unet.split(", ")[0], None, None),
    ("loop", "unet(...)"): ("unet(latent_model_input, t)", None, None),
    ("loop", guide): ("chunk(2) + guidance_scale" if copies == 2 else "(no guidance)", None, None),
    ("loop", "scheduler.step(...).prev_sample"): ("scheduler.step(...)", None, None),
    ("decode", "vae.decode"): ("vae.decode(latents / scaling_factor)", None, None),
    ("decode", "(image * 255).round() to uint8"): ("postprocess, numpy_to_pil", None, None),
}
diagram_rows = []
for row in sorted(first_step, key=lambda r: r["boundary"] != "condition into the unet"):
    if (row["stage"], row["boundary"]) not in picked:
        continue
    operation, name, layout = picked[row["stage"], row["boundary"]]
    name, layout = name or row["name"], layout or row["layout"]
    stage = "prepare" if row["boundary"] == "condition into the unet" else row["stage"]
    here = f"{row['name']} " if row["name"] != name else ""
    sd_shape = str(expand(layout, sd15))
    if row["boundary"] == "set_timesteps":  # SD 1.5's shipped PNDM adds one (n >= 2; here 50)
        sd_shape += f" DDIM, ({sd15['n'] + 1},) PNDM"
    diagram_rows.append((stage, operation, [
        f"{name} ({layout}{',' if ',' not in layout else ''})",
        f"toy: {here}{row['shape']} {row['dtype']} · SD 1.5: {sd_shape}",
    ]))  # fmt: skip
pipeline_svg = figures.flow_diagram(
    diagram_rows, repeat={"loop": f"x {n} steps"}, title="A text-to-image pipeline call"
)
described = "; ".join(f"{op} gives {labels[0]}" for _, op, labels in diagram_rows)
figures.save(
    args.figures, "pipeline", pipeline_svg,
    alt=f"Diagram of one pipeline call in three stages. {described}. The loop stage repeats "
    f"{n} times; each arrow also gives the shape in Lab 12's toy run and in SD 1.5 at 512 px.",
    caption="One call of a text-to-image pipeline: the operation in each box, the tensor on "
    f"each arrow with its layout, its shape in Lab 12's toy run (B = {B}, {n} steps), and the "
    "shape the same layout has in Stable Diffusion 1.5 (one 512 x 512 image, 50 steps; its "
    "timesteps with DDIM, as here, and with its shipped PNDM scheduler, which adds one). "
    "Drawn from the trace the run records.",
)  # fmt: skip
if in_notebook():
    from IPython.display import SVG, Image, display

    display(SVG(pipeline_svg))
    display(Image(data=images_png))
    display(SVG(timeline))
# --8<-- [end:figures]
