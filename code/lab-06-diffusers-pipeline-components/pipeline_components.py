"""Lab 06: what is a diffusers pipeline made of, and which of its parts can you swap?

A pipeline is a config-driven container: ``model_index.json`` names one
``[library, class]`` per component, ``from_pretrained`` builds each from its
subfolder, and ``__call__`` wires them: the prompt becomes ``prompt_embeds``, the
denoiser and ``scheduler.step`` update ``latents`` in a loop, and ``vae.decode``
turns the final ``latents`` into pixels. The state that crosses every boundary
is a tensor of a fixed shape, so the trap is swapping a part whose config no
longer matches its neighbours': latent channels, text width, prediction type.
Schedulers are the exception: ``from_config`` rebuilds one from another's config.

Run it:  python3 code/lab-06-diffusers-pipeline-components/pipeline_components.py --family sdxl
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import figures
from labkit.cli import LabArgumentParser, add_figures_argument, in_notebook, parse_args

# %% [markdown]
# ## 1. Setup / contract: four pipelines as data
#
# For each family, what `save_pretrained` writes into `model_index.json` with
# diffusers 0.42.1 (the pipeline's `__init__` order; `[None, None]` is an
# optional component that is absent, JSON `null`), and the few config entries
# of each component that its neighbours depend on. The values are the
# published checkpoints' `config.json` / `scheduler_config.json` settings:
# `stable-diffusion-v1-5`, `stable-diffusion-xl-base-1.0`,
# `stable-diffusion-3-medium-diffusers` and `FLUX.1-dev`.

# %%
# --8<-- [start:setup]
PIPELINES = {
    "sd15": {
        "_class_name": "StableDiffusionPipeline",
        "components": {
            "vae": ["diffusers", "AutoencoderKL"],
            "text_encoder": ["transformers", "CLIPTextModel"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "unet": ["diffusers", "UNet2DConditionModel"],
            "scheduler": ["diffusers", "PNDMScheduler"],
            "safety_checker": ["stable_diffusion", "StableDiffusionSafetyChecker"],
            "feature_extractor": ["transformers", "CLIPImageProcessor"],
            "image_encoder": [None, None],  # IP-Adapter's, loaded later if at all
        },
        "config": {"requires_safety_checker": True},
    },
    "sdxl": {
        "_class_name": "StableDiffusionXLPipeline",
        "components": {
            "vae": ["diffusers", "AutoencoderKL"],
            "text_encoder": ["transformers", "CLIPTextModel"],
            "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "tokenizer_2": ["transformers", "CLIPTokenizer"],
            "unet": ["diffusers", "UNet2DConditionModel"],
            "scheduler": ["diffusers", "EulerDiscreteScheduler"],
            "image_encoder": [None, None],
            "feature_extractor": [None, None],
        },
        "config": {"force_zeros_for_empty_prompt": True},
    },
    "sd3": {
        "_class_name": "StableDiffusion3Pipeline",
        "components": {
            "transformer": ["diffusers", "SD3Transformer2DModel"],
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "vae": ["diffusers", "AutoencoderKL"],
            "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
            "tokenizer_2": ["transformers", "CLIPTokenizer"],
            "text_encoder_3": ["transformers", "T5EncoderModel"],
            "tokenizer_3": ["transformers", "T5TokenizerFast"],
            "image_encoder": [None, None],
            "feature_extractor": [None, None],
        },
        "config": {},
    },
    "flux": {
        "_class_name": "FluxPipeline",
        "components": {
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "vae": ["diffusers", "AutoencoderKL"],
            "text_encoder": ["transformers", "CLIPTextModel"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "text_encoder_2": ["transformers", "T5EncoderModel"],
            "tokenizer_2": ["transformers", "T5TokenizerFast"],
            "transformer": ["diffusers", "FluxTransformer2DModel"],
            "image_encoder": [None, None],
            "feature_extractor": [None, None],
        },
        "config": {},
    },
}
FAMILY_NAMES = {"sd15": "SD 1.5", "sdxl": "SDXL", "sd3": "SD3", "flux": "Flux"}

VAE_4CH = {"_class_name": "AutoencoderKL", "latent_channels": 4, "block_out_channels": [128, 256, 512, 512]}  # fmt: skip
VAE_16CH = {"_class_name": "AutoencoderKL", "latent_channels": 16, "block_out_channels": [128, 256, 512, 512]}  # fmt: skip
CLIP_L = {"architectures": ["CLIPTextModel"], "hidden_size": 768, "projection_dim": 768}
CLIP_L_PROJ = {"architectures": ["CLIPTextModelWithProjection"], "hidden_size": 768, "projection_dim": 768}  # fmt: skip
CLIP_G_PROJ = {"architectures": ["CLIPTextModelWithProjection"], "hidden_size": 1280, "projection_dim": 1280}  # fmt: skip
T5_XXL = {"architectures": ["T5EncoderModel"], "d_model": 4096}
SD_BETAS = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear"}

# the entries each component's neighbours depend on (a subset of each config.json)
CONFIGS = {
    "sd15": {
        "unet": {"_class_name": "UNet2DConditionModel", "in_channels": 4, "sample_size": 64,
                 "cross_attention_dim": 768},
        "vae": {**VAE_4CH, "scaling_factor": 0.18215},
        "text_encoder": CLIP_L,
        "scheduler": {"_class_name": "PNDMScheduler", "num_train_timesteps": 1000, **SD_BETAS,
                      "set_alpha_to_one": False, "skip_prk_steps": True, "steps_offset": 1,
                      "trained_betas": None, "clip_sample": False},
    },
    "sdxl": {
        "unet": {"_class_name": "UNet2DConditionModel", "in_channels": 4, "sample_size": 128,
                 "cross_attention_dim": 2048, "addition_embed_type": "text_time",
                 "addition_time_embed_dim": 256, "projection_class_embeddings_input_dim": 2816},
        "vae": {**VAE_4CH, "scaling_factor": 0.13025},
        "text_encoder": CLIP_L,
        "text_encoder_2": CLIP_G_PROJ,
        "scheduler": {"_class_name": "EulerDiscreteScheduler", "num_train_timesteps": 1000,
                      **SD_BETAS, "prediction_type": "epsilon", "interpolation_type": "linear",
                      "timestep_spacing": "leading", "steps_offset": 1, "use_karras_sigmas": False,
                      "trained_betas": None, "clip_sample": False, "sample_max_value": 1.0,
                      "set_alpha_to_one": False, "skip_prk_steps": True},
    },
    "sd3": {
        "transformer": {"_class_name": "SD3Transformer2DModel", "in_channels": 16, "patch_size": 2,
                        "sample_size": 128, "joint_attention_dim": 4096,
                        "pooled_projection_dim": 2048},
        "vae": {**VAE_16CH, "scaling_factor": 1.5305, "shift_factor": 0.0609},
        "text_encoder": CLIP_L_PROJ,
        "text_encoder_2": CLIP_G_PROJ,
        "text_encoder_3": T5_XXL,
        "scheduler": {"_class_name": "FlowMatchEulerDiscreteScheduler",
                      "num_train_timesteps": 1000, "shift": 3.0},
    },
    "flux": {
        "transformer": {"_class_name": "FluxTransformer2DModel", "in_channels": 64, "patch_size": 1,
                        "joint_attention_dim": 4096, "pooled_projection_dim": 768,
                        "guidance_embeds": True},
        "vae": {**VAE_16CH, "scaling_factor": 0.3611, "shift_factor": 0.1159},
        "text_encoder": CLIP_L,
        "text_encoder_2": T5_XXL,
        "scheduler": {"_class_name": "FlowMatchEulerDiscreteScheduler",
                      "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True,
                      "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256,
                      "max_image_seq_len": 4096},
    },
}  # fmt: skip

parser = LabArgumentParser(prog="pipeline_components.py", description=__doc__.splitlines()[0])
parser.add_argument(
    "--family",
    choices=list(PIPELINES),
    default="sd15",
    help="the pipeline whose model_index.json is written, swapped and drawn",
)
add_figures_argument(parser)
args = parse_args(parser)
family = args.family
# --8<-- [end:setup]

# %% [markdown]
# ## 2. `model_index.json`: the pipeline's table of contents
#
# `save_pretrained` writes one subfolder per component plus this file; for
# each component it records the library to import from and the class to build.
# `from_pretrained` reads it back, imports `library.class` and calls that
# class's own `from_pretrained(folder / name)`. Keys that are not components
# (`requires_safety_checker`) are pipeline config, passed to `__init__`.
# The lab writes the file with the standard library and reads it back.


# %%
# --8<-- [start:model-index]
def write_model_index(folder, pipeline, diffusers_version="0.42.1"):
    """Write ``folder/model_index.json`` in diffusers' format (sorted keys, 2-space indent)."""
    import json  # stdlib, imported here: the starter's top level stays NumPy-only
    from pathlib import Path

    index = {"_class_name": pipeline["_class_name"], "_diffusers_version": diffusers_version}
    index.update(pipeline["components"])  # name -> [library, class] or [None, None]
    index.update(pipeline["config"])  # plain flags: not components, __init__ arguments
    path = Path(folder) / "model_index.json"
    path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def read_component_map(path):
    """model_index.json -> ({component: (library, class)}, {config key: value})."""
    import json

    index = json.loads(open(path, encoding="utf-8").read())
    components, config = {}, {}
    for key, value in index.items():
        if key.startswith("_"):
            continue  # _class_name, _diffusers_version: metadata
        if isinstance(value, list) and len(value) == 2:
            components[key] = tuple(value)  # [library, class]; [null, null] = absent
        else:
            config[key] = value
    return index["_class_name"], components, config


def tmp_folder():
    import tempfile

    return tempfile.TemporaryDirectory()


with tmp_folder() as folder:
    path = write_model_index(folder, PIPELINES[family])
    size = path.stat().st_size
    pipeline_class, component_map, pipeline_config = read_component_map(path)

print(f"{FAMILY_NAMES[family]}: model_index.json, {size} bytes, read back as {pipeline_class}")
print(f"  {'component':<18} {'library':<17} class")
for name in PIPELINES[family]["components"]:  # __init__ order; the file itself is sorted
    library, cls = component_map[name]
    if library is None:
        print(f"  {name:<18} {'null':<17} (optional, absent: the pipeline gets None)")
    else:
        print(f"  {name:<18} {library:<17} {cls}")
for key, value in pipeline_config.items():
    print(f"  {key} = {value}  (pipeline config, an __init__ argument, not a component)")
# --8<-- [end:model-index]

# %% [markdown]
# ## 3. Four pipelines side by side
#
# Same container, different parts: SDXL adds a second CLIP text encoder
# (with projection, for the pooled embedding), SD3 a third one (T5) and
# a `transformer` in place of the `unet`, Flux one CLIP and one T5.
# `-` means the pipeline has no such component at all.

# %%
# --8<-- [start:side-by-side]
ROWS = ["vae", "text_encoder", "text_encoder_2", "text_encoder_3", "tokenizer", "tokenizer_2",
        "tokenizer_3", "unet", "transformer", "scheduler", "safety_checker", "feature_extractor",
        "image_encoder"]  # fmt: skip


def cell(fam, name):
    library, cls = PIPELINES[fam]["components"].get(name, ("-", "-"))
    return "null" if library is None else cls


for pair in (("sd15", "sdxl"), ("sd3", "flux")):
    print()
    print(
        (
            f"{'component':<18}" + "".join(f"{PIPELINES[f]['_class_name']:<33}" for f in pair)
        ).rstrip()
    )
    for name in ROWS:
        print(f"{name:<18}" + "".join(f"{cell(f, name):<33}" for f in pair).rstrip())
# --8<-- [end:side-by-side]

# %% [markdown]
# ## 4. Swappable: schedulers, through `from_config`
#
# `EulerDiscreteScheduler.from_config(pipe.scheduler.config)` builds a new
# scheduler from the old one's config: it keeps every key the new class's
# `__init__` accepts, and every other key is ignored. Keys that the original
# file never set are listed in `_use_default_values` and are not carried: the
# new class's own defaults apply. `_compatibles` is a hint, not a check: the
# DDPM-family classes share one list of names, the flow-matching scheduler has none.
# Below: the `__init__` defaults of four schedulers in diffusers 0.42.1.

# %%
# --8<-- [start:swap]
SD_SCHEDULER_DEFAULTS = {"num_train_timesteps": 1000, "beta_start": 0.0001, "beta_end": 0.02,
                         "beta_schedule": "linear", "trained_betas": None}  # fmt: skip
SCHEDULER_INIT = {
    "PNDMScheduler": {**SD_SCHEDULER_DEFAULTS, "skip_prk_steps": False, "set_alpha_to_one": False,
                      "prediction_type": "epsilon", "timestep_spacing": "leading",
                      "steps_offset": 0},
    "DDIMScheduler": {**SD_SCHEDULER_DEFAULTS, "clip_sample": True, "set_alpha_to_one": True,
                      "steps_offset": 0, "prediction_type": "epsilon", "thresholding": False,
                      "dynamic_thresholding_ratio": 0.995, "clip_sample_range": 1.0,
                      "sample_max_value": 1.0, "timestep_spacing": "leading",
                      "rescale_betas_zero_snr": False},
    "EulerDiscreteScheduler": {**SD_SCHEDULER_DEFAULTS, "prediction_type": "epsilon",
                               "interpolation_type": "linear", "use_karras_sigmas": False,
                               "use_exponential_sigmas": False, "use_beta_sigmas": False,
                               "sigma_min": None, "sigma_max": None, "timestep_spacing": "linspace",
                               "timestep_type": "discrete", "steps_offset": 0,
                               "rescale_betas_zero_snr": False, "final_sigmas_type": "zero"},
    "FlowMatchEulerDiscreteScheduler": {"num_train_timesteps": 1000, "shift": 1.0,
                                        "use_dynamic_shifting": False, "base_shift": 0.5,
                                        "max_shift": 1.15, "base_image_seq_len": 256,
                                        "max_image_seq_len": 4096, "invert_sigmas": False,
                                        "shift_terminal": None, "use_karras_sigmas": False,
                                        "use_exponential_sigmas": False, "use_beta_sigmas": False,
                                        "time_shift_type": "exponential",
                                        "stochastic_sampling": False},
}  # fmt: skip
# DDIMScheduler._compatibles: the KarrasDiffusionSchedulers names, a list 20 classes carry in
# diffusers 0.42.1 (EDMEulerScheduler, named in it, has no betas and an empty list of its own)
KARRAS_COMPATIBLES = ["DDIMScheduler", "DDPMScheduler", "PNDMScheduler", "LMSDiscreteScheduler",
                      "EulerDiscreteScheduler", "HeunDiscreteScheduler",
                      "EulerAncestralDiscreteScheduler", "DPMSolverMultistepScheduler",
                      "DPMSolverSinglestepScheduler", "KDPM2DiscreteScheduler",
                      "KDPM2AncestralDiscreteScheduler", "DEISMultistepScheduler",
                      "UniPCMultistepScheduler", "DPMSolverSDEScheduler", "EDMEulerScheduler"]  # fmt: skip
COMPATIBLES = {name: KARRAS_COMPATIBLES for name in SCHEDULER_INIT}
COMPATIBLES["FlowMatchEulerDiscreteScheduler"] = []


def wrapped(label, items, width=88):
    """Print ``label: item, item, ...``, wrapped at ``width`` under the first item."""
    lines, line = [], f"  {label:<8}:"
    for i, item in enumerate(items or ["(none)"]):
        if i and len(line) + len(item) + 2 > width:
            lines.append(line + ",")
            line = " " * 12 + item
        else:
            line += (", " if i else " ") + item
    print("\n".join([*lines, line]))


def from_config(cls_name, config):
    """What ``<cls_name>.from_config(config)`` builds: (init values, carried, defaulted, ignored)."""
    defaults = SCHEDULER_INIT[cls_name]
    not_set = set(config.get("_use_default_values", []))  # keys the file never set
    source = {k: v for k, v in config.items() if not k.startswith("_") and k not in not_set}
    carried = {k: source[k] for k in defaults if k in source}
    defaulted = {k: defaults[k] for k in defaults if k not in source}
    ignored = sorted(k for k in source if k not in defaults)
    return {**defaulted, **carried}, carried, defaulted, ignored


def load_scheduler(file_config):
    """``<_class_name>.from_config(scheduler_config.json)``: the config ``pipe.scheduler`` has."""
    values, _, defaulted, ignored = from_config(file_config["_class_name"], file_config)
    extra = {k: file_config[k] for k in ignored}  # kept on .config, unused by this class
    return {**values, "_use_default_values": sorted(defaulted), **extra}


pipe_scheduler_config = load_scheduler(CONFIGS[family]["scheduler"])
source_class = CONFIGS[family]["scheduler"]["_class_name"]
print(f"\npipe.scheduler = {source_class}; keys its file did not set (defaults):")
wrapped("default", pipe_scheduler_config["_use_default_values"])
for target in ["EulerDiscreteScheduler", "DDIMScheduler", "FlowMatchEulerDiscreteScheduler"]:
    values, carried, defaulted, ignored = from_config(target, pipe_scheduler_config)
    verdict = "in _compatibles" if target in COMPATIBLES[source_class] else "NOT in _compatibles"
    verdict = "same class" if target == source_class else verdict
    print(f"{target}.from_config(pipe.scheduler.config): {verdict}")
    changed = {k: v for k, v in defaulted.items() if pipe_scheduler_config.get(k, v) != v}
    wrapped("carried", [f"{k}={v}" for k, v in carried.items()])
    wrapped("reset", [f"{k}={v} (was {pipe_scheduler_config[k]})" for k, v in changed.items()])
    wrapped("ignored", ignored)
# --8<-- [end:swap]

# %% [markdown]
# ## 5. Must match: a compatibility checker over configs
#
# Four tensors cross a boundary between two separately loaded components, and
# each must agree on a size or a meaning. Nothing in `from_pretrained` checks
# them: a wrong size raises somewhere in `__call__` (where depends on the
# pipeline: see the lab page), a wrong `prediction_type` can run to the end
# without an error (`DDIMScheduler` at `epsilon` on a `v_prediction` checkpoint does). The checker reads
# only the configs.


# %%
# --8<-- [start:checker]
def arch(config):
    return config.get("architectures", [config.get("_class_name")])[0]


# the scheduler classes whose defaults step SD3's velocity to sigma 0 in diffusers 0.42.1, the
# solvers once set to flow sigmas (DEIS, SA-Solver and the inverse DPM-Solver take the flow
# flags too, but stop short of sigma 0); the tests run every class diffusers exports
FLOW_MATCH = ["FlowMatchEulerDiscreteScheduler", "FlowMatchHeunDiscreteScheduler",
              "FlowMatchLCMScheduler", "FlowMapEulerDiscreteScheduler",
              "LTXEulerAncestralRFScheduler"]  # fmt: skip
FLOW_SOLVERS = ["DPMSolverMultistepScheduler", "DPMSolverSinglestepScheduler",
                "UniPCMultistepScheduler"]  # fmt: skip
# flags that break them on flow sigmas (NaN or inf latents, a clipped clean estimate, or a
# ValueError); the tests flip every boolean __init__ flag of the three classes
FLOW_BREAKERS = ["use_exponential_sigmas", "use_beta_sigmas", "use_lu_lambdas", "thresholding"]
# the settings the tests vary: the flow flags, then one of these changes (or, for FLOW_SOLVERS
# on flow sigmas, one boolean flag); a scheduler config that differs from the checkpoint's own
# in anything else gets "not checked here" (None) where the rules above would say ok
FLOW_FLAGS = {"use_flow_sigmas": True, "prediction_type": "flow_prediction", "flow_shift": 3.0}
FLOW_CHANGES = [{}, {"use_dynamic_shifting": True}, {"final_sigmas_type": "sigma_min"},
                {"use_dynamic_shifting": True, "time_shift_type": "linear"}, {"invert_sigmas": True}]  # fmt: skip
# which of those keys each class's __init__ takes (the tests run a change only where it does)
SHIFTS = {"use_dynamic_shifting", "time_shift_type"}
FLOW_KEYS = {"FlowMatchEulerDiscreteScheduler": {*SHIFTS, "invert_sigmas"},
             "FlowMatchLCMScheduler": {*SHIFTS, "invert_sigmas"},
             **{name: {*SHIFTS, "final_sigmas_type"} for name in FLOW_SOLVERS}}  # fmt: skip


def changes(sched, ship):
    """The settings ``sched`` sets to a value other than the checkpoint's scheduler config's."""
    return {
        k: v for k, v in sched.items() if not k.startswith("_") and (k not in ship or ship[k] != v)
    }


def tested(name, sched, ship):
    """Whether ``sched`` differs from ``ship`` only in a way the tests run."""
    changed = changes(sched, ship)
    flags = {k: changed.pop(k) for k in FLOW_FLAGS if changed.get(k) == FLOW_FLAGS[k]}
    one_flag = len(changed) == 1 and isinstance(next(iter(changed.values())), bool)
    runs = [changes(change, ship) for change in FLOW_CHANGES if set(change) <= FLOW_KEYS.get(name, set())]  # fmt: skip
    if flags and (flags != FLOW_FLAGS or name not in FLOW_SOLVERS):
        return False
    return changed in runs or (bool(flags) and one_flag)


def check(components, shipped_scheduler):
    """components: {name: config dict}; shipped_scheduler: the checkpoint's scheduler config.
    Returns [(rule, left, right, ok)]: one line per boundary, ok None if not checked here."""
    denoiser_name = "unet" if "unet" in components else "transformer"
    den, vae = components[denoiser_name], components["vae"]
    encoders = [components[k] for k in sorted(components) if k.startswith("text_encoder")]
    results = []
    # latents: vae.encode -> (B, latent_channels, H/8, W/8) -> denoiser conv_in / patch embedding;
    # Flux packs 2x2 latent patches into channels: in_channels = 4 * latent_channels
    packing = 4 if den["_class_name"] == "FluxTransformer2DModel" else 1
    results.append(("latent channels", f"{denoiser_name}.in_channels {den['in_channels']}",
                    f"{packing} x vae.latent_channels {packing * vae['latent_channels']}",
                    den["in_channels"] == packing * vae["latent_channels"]))  # fmt: skip
    # prompt_embeds (B, 77, width) -> cross-attention keys/values
    if denoiser_name == "unet":  # CLIP hidden states, concatenated on the feature axis (SDXL)
        width = sum(e["hidden_size"] for e in encoders)
        left = f"unet.cross_attention_dim {den['cross_attention_dim']}"
        results.append(("text width", left, f"text encoders' hidden_size {width}",
                        den["cross_attention_dim"] == width))  # fmt: skip
    else:  # joint attention over T5 tokens (SD3 zero-pads its CLIP features to this width)
        width = sum(e["d_model"] for e in encoders if arch(e) == "T5EncoderModel")
        left = f"transformer.joint_attention_dim {den['joint_attention_dim']}"
        results.append(("text width", left, f"T5 d_model {width}",
                        den["joint_attention_dim"] == width))  # fmt: skip
    # pooled_prompt_embeds (B, P): SDXL adds 6 size/crop ids of addition_time_embed_dim each
    proj = [e["projection_dim"] for e in encoders if arch(e) == "CLIPTextModelWithProjection"]
    if den.get("addition_embed_type") == "text_time":
        pooled = sum(proj) + 6 * den["addition_time_embed_dim"]
        results.append(("pooled width",
                        f"unet.projection_class_embeddings_input_dim {den['projection_class_embeddings_input_dim']}",
                        f"projection_dim + 6 x {den['addition_time_embed_dim']} {pooled}",
                        den["projection_class_embeddings_input_dim"] == pooled))  # fmt: skip
    elif "pooled_projection_dim" in den:  # SD3: both CLIP projections; Flux: CLIP-L's pooler
        pooled = sum(proj) or sum(e["hidden_size"] for e in encoders if arch(e) == "CLIPTextModel")
        results.append(("pooled width",
                        f"transformer.pooled_projection_dim {den['pooled_projection_dim']}",
                        f"CLIP pooled width {pooled}", den["pooled_projection_dim"] == pooled))  # fmt: skip
    # the denoiser's output means what it was trained to predict; the scheduler must read it so
    sched, ship = components["scheduler"], shipped_scheduler
    if ship["_class_name"].startswith("FlowMatch"):  # the output is a velocity: FLOW_MATCH
        # steps it, or FLOW_SOLVERS set to flow sigmas and flow_prediction
        name, want = sched["_class_name"], "a scheduler that steps a velocity"
        ok = (name in FLOW_MATCH and not sched.get("invert_sigmas")) or (  # inverted: to noise
            name in FLOW_SOLVERS
            and sched.get("use_flow_sigmas") is True
            and sched.get("prediction_type") == "flow_prediction"
            and sched.get("final_sigmas_type", "zero") == "zero"  # "sigma_min" stops short
            and not any(sched.get(flag) for flag in FLOW_BREAKERS)
            and (name.startswith("UniPC") or not sched.get("use_karras_sigmas"))  # UniPC copes
            and (  # UniPC needs its defaults predict_x0 and lower_order_final
                not name.startswith("UniPC")
                or (sched.get("predict_x0", True) and sched.get("lower_order_final", True))
            )
        )
        # given mu (SD3 passes it under use_dynamic_shifting), a DPM-Solver asserts exponential
        if name.startswith("DPMSolver") and sched.get("use_dynamic_shifting"):
            ok = ok and sched.get("time_shift_type", "exponential") == "exponential"
        if den["_class_name"] == "FluxTransformer2DModel":  # FluxPipeline's set_timesteps call
            # passes mu, and sigmas unless use_flow_sigmas: FlowMatchHeun takes no sigmas,
            # FlowMapEuler no mu, LTX's rejects NumPy sigmas, and a DPM-Solver given mu
            # asserts use_dynamic_shifting (UniPC ignores mu without it)
            want += ", as FluxPipeline calls it"
            rejects = ["FlowMatchHeunDiscreteScheduler", *FLOW_MATCH[3:]]  # FlowMap, LTX
            ok = (
                ok
                and name not in rejects
                and (not name.startswith("DPMSolver") or sched.get("use_dynamic_shifting") is True)
            )
        ok = None if ok and not tested(name, sched, ship) else ok  # "ok" only where tested
        results.append(("objective", f"scheduler {name}", want, ok))
    else:
        want = ship.get("prediction_type", "epsilon")
        got = sched.get("prediction_type", "epsilon")
        ok = (
            None if got == want and set(changes(sched, ship)) - {"prediction_type"} else got == want
        )
        results.append(("prediction_type", f"scheduler {got}", f"checkpoint {want}", ok))
        ok = sched["_class_name"] in COMPATIBLES[ship["_class_name"]]
        results.append(("scheduler class", sched["_class_name"],
                        f"{ship['_class_name']}._compatibles", ok))  # fmt: skip
    return results


MARKS = {True: ("ok ", ""), False: ("BAD", ""), None: ("?  ", "  (not checked here)")}


def show(title, results):
    bad = [r for r in results if r[3] is False]
    unchecked = [r for r in results if r[3] is None]  # a setting the tests did not vary
    status = "MISMATCH" if bad else "NOT CHECKED" if unchecked else "ok"
    print(f"{title:<46} {status} ({sum(r[3] is True for r in results)}/{len(results)})")
    for rule, left, right, ok in bad + unchecked or results:
        mark, note = MARKS[ok]
        print(f"    {mark} {rule:<16} {left}  vs  {right}{note}")


print(f"\n{FAMILY_NAMES[family]} as published, every boundary:")
shipped = CONFIGS[family]
show(f"{FAMILY_NAMES[family]}", check(shipped, shipped["scheduler"]))

SD21_TEXT_ENCODER = {"architectures": ["CLIPTextModel"], "hidden_size": 1024, "projection_dim": 512}
SD21_V_SCHEDULER = {**CONFIGS["sd15"]["scheduler"], "_class_name": "DDIMScheduler",
                    "prediction_type": "v_prediction"}  # fmt: skip
FLOW_DPM = {"_class_name": "DPMSolverMultistepScheduler", "use_flow_sigmas": True,
            "prediction_type": "flow_prediction", "flow_shift": 3.0}  # fmt: skip
sd15, sdxl = CONFIGS["sd15"], CONFIGS["sdxl"]
scenarios = [
    ("SD 1.5 UNet + SD3's 16-channel VAE", {**sd15, "vae": CONFIGS["sd3"]["vae"]}, sd15["scheduler"]),
    ("SD 1.5 UNet + SD 2.1's text encoder (1024)", {**sd15, "text_encoder": SD21_TEXT_ENCODER},
     sd15["scheduler"]),
    ("SD 2.1-v checkpoint + SD 1.5's scheduler", {**sd15, "text_encoder": SD21_TEXT_ENCODER,
     "unet": {**sd15["unet"], "cross_attention_dim": 1024}}, SD21_V_SCHEDULER),
    ("SDXL + DPMSolverMultistepScheduler", {**sdxl, "scheduler": {**sdxl["scheduler"],
     "_class_name": "DPMSolverMultistepScheduler"}}, sdxl["scheduler"]),
    ("SDXL UNet + SD 1.5's text encoder only", {k: v for k, v in sdxl.items()
     if k != "text_encoder_2"}, sdxl["scheduler"]),
    ("Flux + EulerDiscreteScheduler", {**CONFIGS["flux"], "scheduler": sdxl["scheduler"]},
     CONFIGS["flux"]["scheduler"]),
    ("SD3 + DPM-Solver on flow sigmas", {**CONFIGS["sd3"], "scheduler": FLOW_DPM},
     CONFIGS["sd3"]["scheduler"]),
    ("Flux + the same DPM-Solver", {**CONFIGS["flux"], "scheduler": FLOW_DPM},
     CONFIGS["flux"]["scheduler"]),
]  # fmt: skip
print("\nswaps:")
for title, components, shipped_scheduler in scenarios:
    show(title, check(components, shipped_scheduler))
# --8<-- [end:checker]

# %% [markdown]
# ## 6. The pipeline graph, with the shape on every arrow
#
# Inputs become conditions (tokenizers and text encoders), loaders create the
# modules (`from_pretrained` with `model_index.json`), the loop updates
# `latents` (denoiser, then `scheduler.step`, once per entry of `scheduler.timesteps`:
# 51 of them at 50 steps with SD 1.5's PNDM), and
# decode emits media (`vae.decode`). Shapes at the checkpoint's default size,
# `B` prompts, without classifier-free guidance (with it, the denoiser sees
# `2B` rows; Flux.1-dev instead feeds `guidance_scale` in as an input).


# %%
# --8<-- [start:shapes]
def boundary_shapes(fam):
    """Each tensor that crosses a component boundary, with its shape, for one family."""
    c = CONFIGS[fam]
    vae_scale_factor = 2 ** (len(c["vae"]["block_out_channels"]) - 1)  # 8: 3 downsamplings
    side = (c["unet"]["sample_size"] if "unet" in c else 128) * vae_scale_factor  # pixels
    lat_hw = np.array([side, side]) // vae_scale_factor  # (H/8, W/8)
    ch = c["vae"]["latent_channels"]
    text = {"sd15": [("input_ids", "(B, 77)"), ("prompt_embeds", "(B, 77, 768)")],
            "sdxl": [("input_ids x2", "(B, 77)"), ("prompt_embeds", "(B, 77, 768+1280=2048)"),
                     ("pooled_prompt_embeds", "(B, 1280)"), ("add_time_ids", "(B, 6)")],
            "sd3": [("input_ids x3", "(B, 77), (B, 77), (B, 256)"),
                    ("prompt_embeds", "(B, 77+256=333, 4096)"),
                    ("pooled_prompt_embeds", "(B, 768+1280=2048)")],
            "flux": [("input_ids x2", "(B, 77), (B, 512)"), ("prompt_embeds", "(B, 512, 4096)"),
                     ("pooled_prompt_embeds", "(B, 768)"), ("guidance (FLUX.1-dev)", "(B,)")]}[fam]  # fmt: skip
    rows = [("image size", f"{side} x {side}"), *text]
    rows.append(("latents", f"(B, {ch}, {lat_hw[0]}, {lat_hw[1]})"))
    noise_pred = rows[-1][1]  # the denoiser returns the shape it was given
    if fam in ("sd3", "flux"):  # DiTs see 2x2 latent patches as tokens
        tokens = int(np.prod(lat_hw // 2))  # (H/8/2) * (W/8/2)
        text_tokens = 333 if fam == "sd3" else 512
        if fam == "flux":  # _pack_latents: each 2x2 patch becomes one token of 4 * 16 channels
            noise_pred = f"(B, {tokens}, {4 * ch})"
            rows.append(("packed latents", noise_pred))
        rows.append(("image tokens", f"{tokens} (+ {text_tokens} text tokens)"))
    rows.append(("noise_pred", noise_pred))
    rows.append(("image", f"(B, 3, {side}, {side})"))
    return rows


tables = {f: boundary_shapes(f) for f in PIPELINES}
for pair in (("sd15", "sdxl"), ("sd3", "flux")):
    print()
    for f in pair:
        vae_cfg = CONFIGS[f]["vae"]
        decode = f"latents / {vae_cfg['scaling_factor']}"
        if "shift_factor" in vae_cfg:
            decode += f" + {vae_cfg['shift_factor']}"
        print(f"{FAMILY_NAMES[f]} ({PIPELINES[f]['_class_name']}), decode: vae.decode({decode})")
        for name, shape in tables[f]:
            print(f"  {name:<22} {shape}")
# --8<-- [end:shapes]

# %% [markdown]
# The same graph as a figure: boxes are components, arrows carry the tensors.


# %%
# --8<-- [start:figure]
def shape_of(fam, name):
    return dict(boundary_shapes(fam))[name]


def classes(comps, prefix):
    """The classes of the components named prefix, prefix_2, ...: 'A x2 + B'."""
    names = [cls for name, (_, cls) in comps.items() if name.startswith(prefix)]
    counts = {n: names.count(n) for n in names}  # insertion order: first seen first
    return " + ".join(n + (f" x{k}" if k > 1 else "") for n, k in counts.items())


def pipeline_graph(fam):
    """A hand-built SVG: components as boxes, tensors and shapes on the arrows."""
    c, comps = CONFIGS[fam], PIPELINES[fam]["components"]
    encoders = ", ".join(k.replace("text_encoder_", "_") for k in comps if k.startswith("text_en"))
    tokenizers = ", ".join(k.replace("tokenizer_", "_") for k in comps if k.startswith("tokenizer"))
    denoiser = "unet" if "unet" in comps else "transformer"
    boxes = {  # name: (x, y, width, label, class name)
        "prompt": (20, 78, 90, "prompt", "str"),
        "tok": (190, 78, 200, tokenizers, classes(comps, "tokenizer")),
        "enc": (530, 78, 250, encoders, classes(comps, "text_encoder")),
        # SD 1.5 / SDXL scale the noise by the scheduler's init_noise_sigma; flow-matching
        # schedulers have none, and SD3 / Flux start from the noise as drawn (sigma 1)
        "noise": (20, 208, 130, "randn", "x init_noise_sigma" if "unet" in comps else "unscaled"),
        "den": (530, 208, 250, denoiser, comps[denoiser][1]),
        "step": (530, 338, 250, "scheduler.step", comps["scheduler"][1]),
        "vae": (190, 338, 200, "vae.decode", "AutoencoderKL"),
        "image": (20, 338, 90, "image", "media"),
    }  # fmt: skip
    h = 48
    out = [
        '<text x="20" y="22" class="title">from_pretrained reads model_index.json: '
        "each box is one [library, class] entry, built from its subfolder</text>",
    ]
    for label, y in [("1. inputs become conditions", 62), ("2. the loop updates latents", 192),
                     ("3. decode emits media", 322)]:  # fmt: skip
        out.append(f'<text x="20" y="{y}" font-style="italic" opacity="0.75">{label}</text>')
    for x, y, w, label, sub in boxes.values():
        out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="none" '
                   'stroke="currentColor" stroke-width="1.5"/>')  # fmt: skip
        out.append(f'<text x="{x + w / 2}" y="{y + 20}" text-anchor="middle" '
                   f'font-weight="700">{label}</text>')  # fmt: skip
        size = 11 if len(sub) * 6.2 < w - 8 else 9.5  # long class lists: smaller type
        out.append(f'<text x="{x + w / 2}" y="{y + 38}" text-anchor="middle" '
                   f'font-size="{size}" opacity="0.8">{sub}</text>')  # fmt: skip

    def arrow(x1, y1, x2, y2, labels, lx, ly, anchor="middle", dashed=False):
        """An arrow; ``labels`` are lines at (lx, ly + 14 i); None skips a line (the arrow)."""
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        out.append(f'<path d="M{x1},{y1}L{x2},{y2}" stroke="currentColor" stroke-width="1.5" '
                   f'fill="none"{dash}/>')  # fmt: skip
        # The head is drawn in place, not as a <marker>: an id inside an inline SVG would
        # clash with the next figure's on the same page.
        dx, dy = x2 - x1, y2 - y1
        n = (dx * dx + dy * dy) ** 0.5
        ux, uy = dx / n, dy / n
        bx, by = x2 - 8 * ux, y2 - 8 * uy
        head = f"{x2},{y2} {bx - 4 * uy},{by + 4 * ux} {bx + 4 * uy},{by - 4 * ux}"
        out.append(f'<polygon points="{head}" fill="currentColor"/>')
        for i, text in enumerate(labels):
            if text is not None:
                out.append(f'<text x="{lx}" y="{ly + 14 * i}" text-anchor="{anchor}" '
                           f'font-size="11">{text}</text>')  # fmt: skip

    text = dict(boundary_shapes(fam))
    ids = text.get("input_ids", text.get("input_ids x2", text.get("input_ids x3")))
    arrow(110, 102, 190, 102, ["str"], 150, 96)
    arrow(390, 102, 530, 102, ["input_ids", None, ids], 460, 96)
    cond = [f"prompt_embeds {text['prompt_embeds']}"]
    if "pooled_prompt_embeds" in text:
        cond.append(f"pooled_prompt_embeds {text['pooled_prompt_embeds']}")
    arrow(655, 126, 655, 208, cond, 645, 150, anchor="end")
    latents = text.get("packed latents", text["latents"])
    arrow(150, 232, 530, 232, [f"latents {latents}"], 340, 224)
    arrow(700, 256, 700, 338, ["noise_pred", text["noise_pred"]], 710, 290, anchor="start")
    arrow(610, 338, 610, 256, ["latents", "x len(scheduler.timesteps)"], 600, 290, anchor="end",
          dashed=True)  # fmt: skip
    decode = f"latents / {c['vae']['scaling_factor']}"
    if "shift_factor" in c["vae"]:
        decode += f" + {c['vae']['shift_factor']}"
    unpacked = ("unpacked " if fam == "flux" else "") + text["latents"]
    arrow(530, 362, 390, 362, [unpacked, None, decode], 456, 356)
    arrow(190, 362, 110, 362, [text["image"]], 150, 404)
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" class="lab-chart" viewBox="0 0 800 420" '
        'width="800" height="420" aria-hidden="true" focusable="false">' + "".join(out) + "</svg>\n"
    )


graph = pipeline_graph(family)
shapes = dict(boundary_shapes(family))
# the loop runs len(scheduler.timesteps) times: SD 1.5's PNDM (skip_prk_steps) repeats one
# timestep, 51 at 50 steps (but 1 at 1 step, and at 1000 its grid starts at t = 1000, past
# the 1000 trained timesteps: step raises IndexError)
pndm = PIPELINES[family]["components"]["scheduler"][1] == "PNDMScheduler"
n_timesteps = (
    "51 at 50 steps with SD 1.5's PNDMScheduler" if pndm else "num_inference_steps of them"
)
figures.save(
    args.figures, f"graph-{family}", graph,
    alt=f"The {PIPELINES[family]['_class_name']} graph as boxes and arrows: the prompt goes "
    f"through {' and '.join(k for k in PIPELINES[family]['components'] if k.startswith('tokenizer'))} "
    f"to input_ids, the text encoders turn them into prompt_embeds {shapes['prompt_embeds']}, "
    f"which condition the denoiser; random latents {shapes['latents']} go through the denoiser "
    f"and scheduler.step once per entry of scheduler.timesteps ({n_timesteps}); vae.decode "
    "turns the final latents into an "
    f"image {shapes['image']}.",
    caption=f"{FAMILY_NAMES[family]}: the pipeline graph, with the tensor and its shape on "
    "every arrow (B prompts, default size, no classifier-free guidance).",
)  # fmt: skip
if in_notebook():
    from IPython.display import SVG, display

    display(SVG(graph))
# --8<-- [end:figure]
