"""Lab 23: what is a modular pipeline, and how do its blocks rebuild Lab 12's call?

A classic pipeline is one ``__call__`` that runs every stage in order. A modular pipeline
(``diffusers.modular_pipelines``) builds its call from blocks: each block declares its
inputs (``InputParam``) and outputs (``OutputParam``), a sequential block runs
its sub-blocks in order, a loop block (SDXL's) runs its sub-blocks once per timestep, an
auto block picks at most one sub-block from the inputs present, and one ``PipelineState``
carries every key between them. This starter rebuilds Lab 12's toy pipeline that way,
prints the state keys at each block boundary, swaps the guider, and checks the result
against the monolithic call. The trap: the toy's blocks do not change the math; they change who owns a step.

Run it:  python3 code/lab-23-modular-diffusers/blocks.py --prompt disc
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
from labkit.images import SHAPES, FiniteSet, toy_images
from labkit.schedulers import DDIMScheduler
from labkit.vae import PatchPCAAutoencoder

# %% [markdown]
# ## 1. The contract: declared inputs and outputs, one state between blocks
#
# As in `modular_pipeline.py`: a block lists its `inputs` (`InputParam`: name, required,
# default) and `intermediate_outputs` (`OutputParam`); `get_block_state` gathers those
# inputs from the `PipelineState` (a missing required one is an error), the block
# works on them, and `set_block_state` writes its outputs back. The toy's base
# class does that around `run`.


# %%
# --8<-- [start:contract]
class InputParam:
    def __init__(self, name, required=False, default=None):
        self.name, self.required, self.default = name, required, default


class OutputParam:
    def __init__(self, name):
        self.name = name


class BlockState:
    """A block's inputs gathered from the state, read and set as attributes (``s.latents``)."""

    def __init__(self, **values):
        self.__dict__.update(values)


class PipelineState:
    """The one dict every block reads from and writes to (``state.values``)."""

    def __init__(self, **values):
        self.values = dict(values)


trace = []  # (block path, block class, {key: "shape dtype"} it wrote), in execution order


def describe(value):
    """``"(8, 4, 4, 4) float64"`` for an array; a Python value's type name otherwise."""
    if isinstance(value, np.ndarray):
        return f"{tuple(value.shape)} {value.dtype}"
    return type(value).__name__


class ModularPipelineBlocks:
    inputs = ()  # InputParam: what this block reads from the state
    intermediate_outputs = ()  # OutputParam: what it writes back
    expected_components = ()  # names it needs from the pipeline (unet, scheduler...)

    def get_block_state(self, state):
        data = {}
        for param in self.inputs:
            value = state.values.get(param.name)
            value = param.default if value is None else value
            if param.required and value is None:
                raise ValueError(f"Required input '{param.name}' is missing")
            data[param.name] = value
        return BlockState(**data)

    def set_block_state(self, state, block_state):
        written = {}
        for param in self.intermediate_outputs:
            state.values[param.name] = getattr(block_state, param.name)
            written[param.name] = describe(state.values[param.name])
        return written

    def __call__(self, components, state, path=""):
        block_state = self.get_block_state(state)
        self.run(components, block_state)
        trace.append((path, type(self).__name__, self.set_block_state(state, block_state)))
        return components, state


# --8<-- [end:contract]

# %% [markdown]
# ## 2. The three ways to compose blocks
#
# `SequentialPipelineBlocks` runs its `sub_blocks` in order; diffusers leaves a loop block's
# loop to its subclass (SDXL's `StableDiffusionXLDenoiseLoopWrapper` runs its sub-blocks
# once per timestep, on one shared block state; the toy's base class loops the same way); `AutoPipelineBlocks` runs the
# first sub-block whose trigger input is present, else the default (trigger `None`), else
# none. A composite's inputs are what its sub-blocks read that no earlier one wrote.


# %%
# --8<-- [start:compose]
class SequentialPipelineBlocks(ModularPipelineBlocks):
    def __init__(self, **sub_blocks):
        self.sub_blocks = sub_blocks  # name -> block, run in this order
        written, self.inputs = set(), []
        for block in sub_blocks.values():
            self.inputs += [p for p in block.inputs if p.name not in written | {q.name for q in self.inputs}]  # fmt: skip
            written |= {p.name for p in block.intermediate_outputs}
        self.intermediate_outputs = [OutputParam(name) for name in sorted(written)]
        self.expected_components = sorted({c for b in sub_blocks.values() for c in b.expected_components})  # fmt: skip

    def __call__(self, components, state, path=""):
        for name, block in self.sub_blocks.items():
            components, state = block(components, state, f"{path}.{name}".lstrip("."))
        return components, state


class LoopSequentialPipelineBlocks(SequentialPipelineBlocks):
    def __call__(self, components, state, path=""):
        block_state = self.get_block_state(state)  # one block state for the whole loop
        for i, t in enumerate(block_state.timesteps):
            for name, block in self.sub_blocks.items():
                block.loop_step(components, block_state, i, t)
                if i == 0:  # the first iteration's boundaries; every step has the same
                    keys = {p.name: describe(getattr(block_state, p.name)) for p in block.intermediate_outputs}  # fmt: skip
                    trace.append((f"{path}.{name} (step 1)", type(block).__name__, keys))
        trace.append((path, type(self).__name__, self.set_block_state(state, block_state)))
        return components, state


class AutoPipelineBlocks(ModularPipelineBlocks):
    block_trigger_inputs = ()  # one per sub-block; None marks the default

    def __init__(self, **sub_blocks):
        self.sub_blocks = sub_blocks
        names = dict.fromkeys(p.name for b in sub_blocks.values() for p in b.inputs)
        # required only where every branch requires it (the others may run without it)
        self.inputs = [InputParam(n, all(any(p.name == n and p.required for p in b.inputs) for b in sub_blocks.values())) for n in names]  # fmt: skip
        self.intermediate_outputs = list(next(iter(sub_blocks.values())).intermediate_outputs)
        self.expected_components = sorted({c for b in sub_blocks.values() for c in b.expected_components})  # fmt: skip

    def select_block(self, state):  # a present trigger first, then the default, else None
        pairs = list(zip(self.block_trigger_inputs, self.sub_blocks, strict=True))
        for trigger, name in pairs:
            if trigger is not None and state.values.get(trigger) is not None:
                return name
        return next((name for trigger, name in pairs if trigger is None), None)

    def __call__(self, components, state, path=""):
        name = self.select_block(state)
        if name is None:  # no trigger present and no default: the block is skipped
            return components, state
        return self.sub_blocks[name](components, state, f"{path}[{name}]")


# --8<-- [end:compose]

# %% [markdown]
# ## 3. Lab 12's call as blocks
#
# Each block is a few lines of Lab 12's `pipeline_trace.py`, with the keys it reads and
# writes declared. The toy has no text encoder: its condition is a class label per row,
# `class_labels`, and `UNCOND` (-1) plays the empty negative prompt, as in Lab 12.


# %%
# --8<-- [start:steps]
class TextEncoderStep(ModularPipelineBlocks):
    inputs = (InputParam("prompt", required=True), InputParam("num_images_per_prompt", default=1))
    intermediate_outputs = (OutputParam("class_labels"), OutputParam("negative_class_labels"))

    def run(self, components, s):
        s.class_labels = np.full(s.num_images_per_prompt, SHAPES.index(s.prompt))  # (B,)
        s.negative_class_labels = np.full(s.num_images_per_prompt, UNCOND)  # (B,): ""


class SetTimestepsStep(ModularPipelineBlocks):
    inputs = (InputParam("num_inference_steps", default=50),)
    intermediate_outputs = (OutputParam("timesteps"), OutputParam("num_inference_steps"))
    expected_components = ("scheduler",)

    def run(self, components, s):
        components.scheduler.set_timesteps(s.num_inference_steps)
        s.timesteps = components.scheduler.timesteps  # (n,) int64


class PrepareLatentsStep(ModularPipelineBlocks):  # latents passed in: scaled, as given
    inputs = (InputParam("latents", required=True),)
    intermediate_outputs = (OutputParam("latents"),)
    expected_components = ("scheduler",)

    def run(self, components, s):
        s.latents = s.latents * components.scheduler.init_noise_sigma  # (B, 4, h, w)


class PrepareNoiseLatentsStep(ModularPipelineBlocks):  # no latents: draw them from the seed
    inputs = (InputParam("class_labels", required=True), InputParam("seed", default=0))
    intermediate_outputs = (OutputParam("latents"),)
    expected_components = ("scheduler",)

    def run(self, components, s):
        noise = np.random.default_rng(s.seed).standard_normal((len(s.class_labels), 4, 4, 4))
        s.latents = noise * components.scheduler.init_noise_sigma  # (B, 4, h, w)


class AutoPrepareLatentsStep(AutoPipelineBlocks):
    block_trigger_inputs = ("latents", None)  # "latents" present -> given; else noise


class DecodeStep(ModularPipelineBlocks):
    inputs = (InputParam("latents", required=True),)
    intermediate_outputs = (OutputParam("images"),)
    expected_components = ("vae",)

    def run(self, components, s):
        vae = components.vae
        image = vae.decode(s.latents / vae.config.scaling_factor)  # (B, 3, H, W)
        s.images = np.clip(image / 2 + 0.5, 0, 1).transpose(0, 2, 3, 1)  # (B, H, W, 3)


# --8<-- [end:steps]

# %% [markdown]
# ## 4. The loop's sub-blocks, and the guider as a component
#
# As in SDXL's `StableDiffusionXLLoopDenoiser`: the guider's `prepare_inputs` turns
# `(cond, uncond)` pairs into one batch per prediction, the denoiser runs once per batch
# (Lab 12 ran it once on the doubled batch), and calling the guider on the batches
# combines their `noise_pred`. Swapping the guider can change how many batches there are
# and how they combine; no block changes.


# %%
# --8<-- [start:loop]
# one batch at guidance_scale <= 1, Lab 12's classic rule, not diffusers' guider's: in SDXL's
# modular call with Euler and a UNet without time_cond_proj_dim, ClassifierFreeGuidance (its
# other settings at their defaults) makes one batch at 1, two at 0.5
class ClassifierFreeGuidance:
    def __init__(self, guidance_scale=7.5):
        self.guidance_scale = guidance_scale

    def prepare_inputs(self, fields):  # {name: (cond, uncond)} -> one batch per prediction
        ids = ["pred_cond", "pred_uncond"] if self.guidance_scale > 1.0 else ["pred_cond"]
        return [{name: pair[k] for name, pair in fields.items()} | {"id": ids[k]} for k in range(len(ids))]  # fmt: skip

    def __call__(self, batches):
        pred = {batch["id"]: batch["noise_pred"] for batch in batches}
        if len(pred) == 1:
            return pred["pred_cond"]
        return pred["pred_uncond"] + self.guidance_scale * (pred["pred_cond"] - pred["pred_uncond"])


class NoGuidance:  # the swap: one batch, the conditional prediction as it is
    def prepare_inputs(self, fields):
        return [{name: pair[0] for name, pair in fields.items()} | {"id": "pred_cond"}]

    def __call__(self, batches):
        return batches[0]["noise_pred"]


class LoopBeforeDenoiser(ModularPipelineBlocks):
    intermediate_outputs = (OutputParam("scaled_latents"),)
    expected_components = ("scheduler",)

    def loop_step(self, components, s, i, t):
        s.scaled_latents = components.scheduler.scale_model_input(s.latents, t)  # DDIM: identity


class LoopDenoiser(ModularPipelineBlocks):
    inputs = (InputParam("class_labels", required=True), InputParam("negative_class_labels"))
    intermediate_outputs = (OutputParam("noise_pred"),)
    expected_components = ("guider", "unet")

    def loop_step(self, components, s, i, t):
        fields = {"class_labels": (s.class_labels, s.negative_class_labels)}
        batches = components.guider.prepare_inputs(fields)  # 2 batches for CFG, 1 without
        for batch in batches:  # one denoiser call per batch, B rows each
            batch["noise_pred"] = components.unet(s.scaled_latents, t, class_labels=batch["class_labels"])  # fmt: skip
        s.noise_pred = components.guider(batches)  # (B, 4, h, w)


class LoopAfterDenoiser(ModularPipelineBlocks):
    intermediate_outputs = (OutputParam("latents"),)
    expected_components = ("scheduler",)

    def loop_step(self, components, s, i, t):
        s.latents = components.scheduler.step(s.noise_pred, t, s.latents).prev_sample


class DenoiseLoop(LoopSequentialPipelineBlocks):
    def __init__(self):
        super().__init__(before_denoiser=LoopBeforeDenoiser(), denoiser=LoopDenoiser(), after_denoiser=LoopAfterDenoiser())  # fmt: skip
        self.inputs = [InputParam("timesteps", required=True), InputParam("latents", required=True), *self.inputs]  # fmt: skip
        self.intermediate_outputs = [OutputParam("latents")]


# --8<-- [end:loop]

# %% [markdown]
# ## 5. Components, loaded lazily, and the pipeline
#
# A `ModularPipeline` holds the blocks and the components their `expected_components`
# name. Here `init_pipeline` registers each name with nothing loaded, and
# `load_components` runs the loaders it is asked for; the toy's loaders build what
# Lab 12's `load` built (256 shape images, the patch-PCA `vae`, the exact denoiser,
# DDIM with SD 1.5's scheduler settings). The run sets the toy's flags.

# %%
# --8<-- [start:pipeline]
parser = LabArgumentParser(prog="blocks.py", description=__doc__.splitlines()[0])
parser.add_argument("--prompt", choices=SHAPES, default="disc", help="the class to generate")
add_pipeline_arguments(parser, guidance_help="CFG; <= 1: one batch, as Lab 12")  # --steps...
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)
check_pipeline_arguments(parser, args, 999, "steps_offset=1 would reach t=1000")


def load_toy_world():
    data = toy_images(256, seed=0)  # (K, 3, 32, 32) shape images and their labels
    vae = PatchPCAAutoencoder.fit(data.images, patch_size=8, latent_channels=4)  # Lab 05
    latents = vae.encode(data.images) * vae.config.scaling_factor  # (K, 4, 4, 4)
    unet = ExactDenoiser(FiniteSet(latents, data.labels), alphas_cumprod(canonical_betas("scaled_linear")), "epsilon")  # fmt: skip
    return BlockState(vae=vae, unet=unet)


world = {}  # the loaded toy world, built once on the first loader that needs it
LOADERS = {
    "vae": lambda: world.setdefault("w", load_toy_world()).vae,
    "unet": lambda: world.setdefault("w", load_toy_world()).unet,
    "scheduler": lambda: DDIMScheduler(
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
        set_alpha_to_one=False,
        steps_offset=1,
        clip_sample=False,
    ),
    "guider": lambda: ClassifierFreeGuidance(guidance_scale=args.guidance_scale),
}


class ModularPipeline:
    def __init__(self, blocks):
        self.blocks = blocks
        self.components = BlockState(**dict.fromkeys(blocks.expected_components))

    def load_components(self, names):
        for name in names:
            setattr(self.components, name, LOADERS[name]())

    def update_components(self, **components):  # swap one component, keep the rest
        for name, component in components.items():
            setattr(self.components, name, component)

    def __call__(self, output, **kwargs):
        missing = [k for k, v in vars(self.components).items() if v is None]
        if missing:
            raise ValueError(f"components not loaded: {missing}")
        state = PipelineState(**kwargs)
        self.blocks(self.components, state)
        return state.values[output]


blocks = SequentialPipelineBlocks(
    text_encoder=TextEncoderStep(), set_timesteps=SetTimestepsStep(),
    prepare_latents=AutoPrepareLatentsStep(given=PrepareLatentsStep(), noise=PrepareNoiseLatentsStep()),
    denoise=DenoiseLoop(), decode=DecodeStep(),
)  # fmt: skip
pipe = ModularPipeline(blocks)  # init_pipeline: every component registered, none loaded
print(f"components before load_components: {vars(pipe.components)}")
pipe.load_components(["scheduler", "guider", "unet"])
print(f"loaded: {[k for k, v in vars(pipe.components).items() if v is not None]}; vae still None")
pipe.load_components(["vae"])
# --8<-- [end:pipeline]

# %% [markdown]
# ## 6. The block order and the state at each boundary
#
# One run with Lab 12's defaults. Each row is a block boundary: the block's path in
# the tree and the keys it wrote into the state, with shape and dtype. The loop's
# sub-blocks are shown for step 1; every step writes the same keys and shapes.

# %%
# --8<-- [start:run]
call = dict(prompt=args.prompt, num_images_per_prompt=args.num_samples, num_inference_steps=args.steps, seed=args.seed)  # fmt: skip
trace.clear()
unet = pipe.components.unet
calls_before = unet.calls
images = pipe(output="images", **call)
cfg_calls = unet.calls - calls_before
print(f"block inputs the caller may pass: {[p.name for p in blocks.inputs]}")
print(f"{'block path':<33} {'block class':<23} keys written (shape dtype)")
for path, cls, written in trace:
    print(f"{path:<33} {cls:<23} {', '.join(f'{k} {v}' for k, v in written.items())}")
per_step = cfg_calls // args.steps
print(f"unet calls: {cfg_calls} ({args.steps} steps x {per_step} batch{'es' * (per_step > 1)} of {args.num_samples} rows)")  # fmt: skip
# --8<-- [end:run]

# %% [markdown]
# ## 7. Check: the blocks against the monolithic call, and one swapped guider
#
# `monolithic_call` is Lab 12's prepare, loop and decode lines in one function, with the
# same components: one denoiser call per step on the doubled batch. The block-built
# run must give the same `images`. Then `update_components(guider=NoGuidance())`
# swaps one component: the same blocks run one batch per step, and the result must
# equal the monolithic call at `guidance_scale` 1.


# %%
# --8<-- [start:check]
def monolithic_call(prompt, num_images_per_prompt, num_inference_steps, seed, guidance_scale):
    c = pipe.components
    B = num_images_per_prompt
    class_labels, negative = np.full(B, SHAPES.index(prompt)), np.full(B, UNCOND)
    c.scheduler.set_timesteps(num_inference_steps)
    latents = np.random.default_rng(seed).standard_normal((B, 4, 4, 4)) * c.scheduler.init_noise_sigma  # fmt: skip
    do_cfg = guidance_scale > 1.0
    hidden = np.concatenate([negative, class_labels]) if do_cfg else class_labels
    for t in c.scheduler.timesteps:
        model_input = c.scheduler.scale_model_input(np.concatenate([latents] * (2 if do_cfg else 1)), t)  # fmt: skip
        noise_pred = c.unet(model_input, t, class_labels=hidden)  # one call, 2B rows
        if do_cfg:
            uncond, text = np.split(noise_pred, 2)
            noise_pred = uncond + guidance_scale * (text - uncond)
        latents = c.scheduler.step(noise_pred, t, latents).prev_sample
    image = c.vae.decode(latents / c.vae.config.scaling_factor)
    return np.clip(image / 2 + 0.5, 0, 1).transpose(0, 2, 3, 1)


reference = monolithic_call(**call, guidance_scale=args.guidance_scale)
print(f"blocks vs monolithic call, guidance_scale {args.guidance_scale:g}: max |diff| {np.abs(images - reference).max():.1e}")  # fmt: skip
pipe.update_components(guider=NoGuidance())  # swap one component; no block changes
calls_before = unet.calls
swapped = pipe(output="images", **call)
swapped_calls = unet.calls - calls_before
plain = monolithic_call(**call, guidance_scale=1.0)
print(f"guider swapped to NoGuidance: unet calls {cfg_calls} -> {swapped_calls}; vs monolithic at guidance_scale 1: max |diff| {np.abs(swapped - plain).max():.1e}")  # fmt: skip
print(f"images changed by the swap: max |diff| {np.abs(swapped - images).max():.3f}")
given = pipe(output="latents", latents=np.zeros((args.num_samples, 4, 4, 4)), **call)  # fmt: skip
print(f"latents passed in -> AutoPrepareLatentsStep ran: {[p for p, _, _ in trace if 'prepare_latents' in p][-1]}")  # fmt: skip
# --8<-- [end:check]

# %% [markdown]
# ## 8. Picture it
#
# The block graph, drawn from the trace of the first run: one box per block, the state
# keys it wrote on the arrow below it, with shape and dtype.

# %%
# --8<-- [start:figures]
first_run = trace[: next(k for k, (p, _, _) in enumerate(trace) if p == "denoise") + 2]
rows = []
for path, cls, written in first_run:
    if path == "denoise":  # the loop's own boundary: its sub-blocks already drew the keys
        continue
    band = path.split(".")[0].split("[")[0]  # the top-level block: one shaded band each
    rows.append((band, cls, [f"{k} {v}" for k, v in written.items()]))
graph = figures.flow_diagram(rows, repeat={"denoise": f"x {args.steps} steps"}, title="Lab 12's call as blocks")  # fmt: skip
order = "; ".join(f"{op} writes {', '.join(k.split()[0] for k in labels)}" for _, op, labels in rows)  # fmt: skip
figures.save(
    args.figures, "blocks", graph,
    alt=f"Diagram of the block graph in execution order. {order}. The three denoise "
    f"sub-blocks repeat {args.steps} times.",
    caption="Lab 12's text-to-image call rebuilt as blocks: each box a block's class, each "
    "band the top-level block it runs in, each arrow the state keys it wrote, with the shape and dtype of this "
    f"run (B = {args.num_samples}, {args.steps} steps). Drawn from the trace the run records.",
)  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(graph))
# --8<-- [end:figures]
