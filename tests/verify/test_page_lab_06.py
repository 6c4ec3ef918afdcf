"""Lab 06 (pipeline components) against the real diffusers pipelines and schedulers.

No weights and no hub: a StableDiffusionPipeline is assembled from tiny random parts
built in code (``tiny.py``, plus a tiny safety checker and image processor here), saved
with ``save_pretrained`` to a temporary folder and loaded back with ``from_pretrained``
from that local folder. Tiny img2img, inpainting, SDXL, SD3 and Flux pipelines (no text
encoders; embeddings passed in) are run through their own ``__call__``; the rest comes from
the installed classes' ``__init__`` signatures and static methods. The lab's own data structures are read
through the ``run_lab`` fixture, so the page and the library are compared directly.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import logging

import pytest
import torch
from tiny import (
    EMBED_DIM,
    FLUX_VAE_FACTORS,
    HEIGHT,
    SD15_SCHEDULER_FILE,
    SD_BETAS,
    SD_SCHEDULER,
    WIDTH,
    dit_embeds,
    embeds,
    start_latents,
    tiny_flux_pipeline,
    tiny_sd3_pipeline_16ch,
    tiny_sd_pipeline,
    tiny_sdxl_pipeline,
    tiny_sdxl_unet,
    tiny_text_encoder,
    tiny_tokenizer,
    tiny_unet,
)

LAB06 = "code/lab-06-diffusers-pipeline-components/pipeline_components.py"

pytestmark = pytest.mark.usefixtures("quiet_diffusers")


@pytest.fixture
def lab(run_lab):
    return run_lab(LAB06)


def tiny_safety_parts():
    """A StableDiffusionSafetyChecker on a tiny CLIPConfig, and a small CLIPImageProcessor."""
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig, CLIPImageProcessor

    torch.manual_seed(0)
    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
    config = CLIPConfig(
        text_config=dict(tower, vocab_size=64, bos_token_id=0, eos_token_id=1, pad_token_id=1),
        vision_config=dict(tower, image_size=32, patch_size=8),
        projection_dim=32,
    )
    checker = StableDiffusionSafetyChecker(config).eval()
    processor = CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    return checker, processor


def sd15_scheduler():
    from diffusers import PNDMScheduler

    return PNDMScheduler.from_config(SD15_SCHEDULER_FILE)


def full_sd_pipeline(tmp_path):
    """Every SD 1.5 component class, tiny: the pipeline the lab's sd15 map describes."""
    checker, processor = tiny_safety_parts()
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    return tiny_sd_pipeline(
        scheduler=sd15_scheduler(),
        text_encoder=tiny_text_encoder(),
        tokenizer=tiny_tokenizer(tok_dir),
        safety_checker=checker,
        feature_extractor=processor,
        requires_safety_checker=True,
    )


def resolve(library: str, cls: str):
    """The class ``from_pretrained`` builds for a model_index.json entry."""
    if library == "stable_diffusion":  # a pipeline module of diffusers, as the loader treats it
        return getattr(importlib.import_module("diffusers.pipelines.stable_diffusion"), cls)
    return getattr(importlib.import_module(library), cls)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The full tiny SD 1.5 pipeline, saved; returns (folder, model_index dict)."""
    from diffusers.utils import logging as dlogging

    # Quiet only while building and saving, and restore: a module fixture that leaves
    # diffusers at ERROR would hide the warnings later modules assert on.
    level = dlogging.get_verbosity()
    dlogging.set_verbosity_error()
    dlogging.disable_progress_bar()
    try:
        tmp = tmp_path_factory.mktemp("sd15")
        pipe = full_sd_pipeline(tmp)
        folder = tmp / "pipe"
        pipe.save_pretrained(folder)
    finally:
        dlogging.set_verbosity(level)
        dlogging.enable_progress_bar()
    return folder, json.loads((folder / "model_index.json").read_text(encoding="utf-8"))


# --------------------------------------------------------------------- model_index.json


def test_save_pretrained_writes_the_labs_model_index(lab, saved):
    """`save_pretrained` of a `StableDiffusionPipeline` built from SD 1.5's component classes writes a `model_index.json` with the lab's keys: `_class_name`, `_diffusers_version`, one `[library, class]` pair per component (`image_encoder` as `[null, null]`) and `requires_safety_checker`. Without torchvision, transformers 5 writes its PIL backend's name, `CLIPImageProcessorPil`, instead of `CLIPImageProcessor`; both load the same class."""
    _, index = saved
    expected = lab["PIPELINES"]["sd15"]
    assert index["_class_name"] == expected["_class_name"] == "StableDiffusionPipeline"
    keys = {"_class_name", "_diffusers_version"} | set(expected["components"])
    assert set(index) == keys | set(expected["config"])
    assert index["requires_safety_checker"] is True
    for name, (library, cls) in expected["components"].items():
        saved_library, saved_cls = index[name]
        assert saved_library == library, name
        if cls is None:
            assert saved_cls is None, name
        else:  # CLIPImageProcessor may resolve to a backend subclass (no torchvision here)
            assert resolve(saved_library, saved_cls) is resolve(library, cls), name
    pil = importlib.util.find_spec("torchvision") is None  # transformers 5 writes the PIL backend
    assert index["feature_extractor"][1] == (
        "CLIPImageProcessorPil" if pil else "CLIPImageProcessor"
    )


def test_save_pretrained_writes_one_subfolder_per_present_component(lab, saved):
    """`save_pretrained` writes one subfolder per component that is present, each with its own config or weights, and none for components that are `None`."""
    folder, _index = saved
    present = {k for k, (lib, _) in lab["PIPELINES"]["sd15"]["components"].items() if lib}
    subfolders = {p.name for p in folder.iterdir() if p.is_dir()}
    assert subfolders == present
    assert (folder / "scheduler" / "scheduler_config.json").is_file()
    assert (folder / "unet" / "config.json").is_file()


def test_from_pretrained_builds_each_component_with_its_class(lab, saved):
    """`StableDiffusionPipeline.from_pretrained(folder)` on a local folder builds every component as the class its `model_index.json` entry names, and `pipe.components` has exactly the lab's component names."""
    from diffusers import StableDiffusionPipeline

    folder, index = saved
    pipe = StableDiffusionPipeline.from_pretrained(folder)
    assert list(pipe.components) == list(lab["PIPELINES"]["sd15"]["components"])
    for name, component in pipe.components.items():
        library, cls = index[name]
        if library is None:
            assert component is None, name
        else:
            assert type(component) is resolve(library, cls), name


def test_absent_optional_components_are_null_and_load_as_none(tmp_path):
    """Without a safety checker and feature extractor, `model_index.json` records `safety_checker` and `feature_extractor` as `[null, null]`, and `from_pretrained` gives `None` for both."""
    from diffusers import StableDiffusionPipeline

    pipe = tiny_sd_pipeline(
        scheduler=sd15_scheduler(),
        text_encoder=tiny_text_encoder(),
        tokenizer=tiny_tokenizer(tmp_path),
    )
    pipe.save_pretrained(tmp_path / "pipe")
    index = json.loads((tmp_path / "pipe" / "model_index.json").read_text(encoding="utf-8"))
    assert index["safety_checker"] == index["feature_extractor"] == [None, None]
    loaded = StableDiffusionPipeline.from_pretrained(tmp_path / "pipe")
    assert loaded.safety_checker is None and loaded.feature_extractor is None


def test_from_pretrained_loads_the_labs_own_model_index_json(lab, saved, tmp_path):
    """A folder whose `model_index.json` is the one the lab writes with the standard library loads with `from_pretrained`: the file format is the whole contract."""
    import shutil

    from diffusers import StableDiffusionPipeline

    folder, _ = saved
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    (copy / "model_index.json").unlink()
    lab["write_model_index"](copy, lab["PIPELINES"]["sd15"])
    pipe = StableDiffusionPipeline.from_pretrained(copy)
    assert type(pipe.scheduler).__name__ == "PNDMScheduler"
    assert pipe.image_encoder is None and pipe.safety_checker is not None


def test_dtype_casts_the_models_not_the_scheduler(saved):
    """`from_pretrained(folder, dtype=torch.float16)` loads the UNet, VAE, text encoder and safety checker in float16; the scheduler and tokenizer have no weights and are unchanged; the older spelling `torch_dtype=` still works in 0.42.1 but warns that it is deprecated."""
    from diffusers import StableDiffusionPipeline

    folder, _ = saved
    pipe = StableDiffusionPipeline.from_pretrained(folder, dtype=torch.float16)
    for module in (pipe.unet, pipe.vae, pipe.text_encoder, pipe.safety_checker):
        assert next(module.parameters()).dtype == torch.float16
    assert type(pipe.scheduler).__name__ == "PNDMScheduler"
    assert pipe.dtype == torch.float16
    with pytest.warns(FutureWarning, match="`torch_dtype` is deprecated"):
        old = StableDiffusionPipeline.from_pretrained(folder, torch_dtype=torch.float16)
    assert old.dtype == torch.float16


# ------------------------------------------------------------------- the four families


def _components_and_flags(pipeline_cls):
    modules, flags = pipeline_cls._get_signature_keys(pipeline_cls)
    order = [p for p in inspect.signature(pipeline_cls.__init__).parameters if p in modules]
    return order, flags


@pytest.mark.parametrize(
    "family, cls_name",
    [
        ("sd15", "StableDiffusionPipeline"),
        ("sdxl", "StableDiffusionXLPipeline"),
        ("sd3", "StableDiffusion3Pipeline"),
        ("flux", "FluxPipeline"),
    ],
)
def test_component_names_come_from_the_init_signature(lab, family, cls_name):
    """The component names of `StableDiffusionPipeline`, `StableDiffusionXLPipeline` (`text_encoder_2`, `tokenizer_2`), `StableDiffusion3Pipeline` (`transformer`, `text_encoder_3`, `tokenizer_3`) and `FluxPipeline` are their `__init__` parameters, in the lab's order, and each class annotation is the class the lab's map names."""
    import diffusers
    from diffusers.schedulers import KarrasDiffusionSchedulers

    pipeline_cls = getattr(diffusers, cls_name)
    expected = lab["PIPELINES"][family]
    assert expected["_class_name"] == cls_name
    order, flags = _components_and_flags(pipeline_cls)
    assert order == list(expected["components"])
    assert set(expected["config"]) <= set(flags)
    params = inspect.signature(pipeline_cls.__init__).parameters
    for name, (library, cls) in expected["components"].items():
        annotation = params[name].annotation
        if cls is None:
            assert params[name].default is None, name  # optional, may be absent
        elif annotation is KarrasDiffusionSchedulers:
            assert cls in KarrasDiffusionSchedulers.__members__, name
        else:
            assert resolve(library, cls) is annotation, name


def test_image_encoder_is_optional_in_the_four_pipelines_not_in_every_sd_class(saved, tmp_path):
    """`StableDiffusionPipeline`, `StableDiffusionXLPipeline`, `StableDiffusion3Pipeline` and `FluxPipeline` each have an optional `image_encoder` (IP-Adapter's): saved without one, each `model_index.json` lists it as `[null, null]` (even SD 1.5's; SDXL's, SD3's and Flux's list `feature_extractor` so too) and `from_pretrained` gives `None` for it without being told; not every SD-family pipeline class does: `StableDiffusionUpscalePipeline` and `StableDiffusionDepth2ImgPipeline` have no `image_encoder` component at all."""
    import diffusers

    folder, index = saved
    assert index["image_encoder"] == [None, None]
    assert diffusers.StableDiffusionPipeline.from_pretrained(folder).image_encoder is None
    without_text = {f"{kind}{s}": None for kind in ("text_encoder", "tokenizer") for s in ("", "_2", "_3")}  # fmt: skip
    for pipe in (tiny_sdxl_pipeline(), tiny_sd3_pipeline_16ch(), tiny_flux_pipeline()):
        cls = type(pipe)
        pipe.save_pretrained(tmp_path / cls.__name__)
        written = json.loads((tmp_path / cls.__name__ / "model_index.json").read_text(encoding="utf-8"))  # fmt: skip
        assert written["image_encoder"] == written["feature_extractor"] == [None, None], (
            cls.__name__
        )
        params = inspect.signature(cls.__init__).parameters
        loaded = cls.from_pretrained(tmp_path / cls.__name__, **{k: v for k, v in without_text.items() if k in params})  # fmt: skip
        assert loaded.image_encoder is None and loaded.vae is not None, cls.__name__
    for name in ("StableDiffusionUpscalePipeline", "StableDiffusionDepth2ImgPipeline"):
        cls = getattr(diffusers, name)
        assert "image_encoder" not in inspect.signature(cls.__init__).parameters, name
        assert "image_encoder" not in cls._optional_components, name


def test_pndm_makes_51_calls_at_50_steps(record_calls):
    """Below 1000 steps, the loop updates `latents` once per scheduler timestep: with SD 1.5's `PNDMScheduler` config, `StableDiffusionPipeline` makes 51 UNet calls at 50 steps (3 at 2), one more than `num_inference_steps`, but 1 at 1 step.

    The extra call is no open-ended rule: at 1000 steps the config's leading grid
    (`steps_offset=1`) starts at t = 1000, past the 1000 trained timesteps, so the first
    `step` raises `IndexError` after one UNet call.
    """
    pipe = tiny_sd_pipeline(sd15_scheduler())
    calls = record_calls(pipe.unet).calls
    run = dict(prompt_embeds=embeds(1), guidance_scale=1.0, height=HEIGHT, width=WIDTH,
               output_type="latent")  # fmt: skip
    for steps, expected in ((1, 1), (2, 3), (50, 51)):
        calls.clear()
        with torch.no_grad():
            pipe(num_inference_steps=steps, **run)
        assert len(calls) == expected == len(pipe.scheduler.timesteps), steps
    calls.clear()
    with pytest.raises(IndexError), torch.no_grad():
        pipe(num_inference_steps=1000, **run)
    assert len(calls) == 1 and int(pipe.scheduler.timesteps[0]) == 1000
    import re

    from infralens_docs.registry import ROOT

    page = (ROOT / "docs" / "labs" / "lab-06-diffusers-pipeline-components.md").read_text(
        encoding="utf-8"
    )
    counts = [
        part
        for part in re.split(r"(?<=[.!?])\s+", page)
        if any(
            phrase in part
            for phrase in ("once per entry of `scheduler.timesteps`", "once per scheduler timestep")
        )
    ]
    assert len(counts) == 2 and all("below 1000 steps" in c.lower() for c in counts), counts


# ------------------------------------------------------------------ scheduler swapping


def test_the_labs_scheduler_defaults_are_the_init_defaults(lab):
    """The lab's table of `__init__` defaults for `PNDMScheduler`, `DDIMScheduler`, `EulerDiscreteScheduler` and `FlowMatchEulerDiscreteScheduler` is exactly their signatures' keys and defaults."""
    import diffusers

    for name, defaults in lab["SCHEDULER_INIT"].items():
        params = inspect.signature(getattr(diffusers, name).__init__).parameters
        real = {k: p.default for k, p in params.items() if k != "self"}
        assert real == defaults, name


def _classes_carrying_the_karras_list(monkeypatch):
    """Scheduler classes whose `_compatibles` is the `KarrasDiffusionSchedulers` list, read at
    run time from every installed ``diffusers.schedulers.scheduling_*`` module.

    Every module imports: the verify extra installs scipy and torchsde, which two of them
    import at their top.
    """
    import pkgutil

    import diffusers.schedulers
    from diffusers import DDIMScheduler
    from diffusers.schedulers.scheduling_utils import SchedulerMixin

    def carriers(module):
        return [
            name for name, obj in vars(module).items()
            if inspect.isclass(obj) and issubclass(obj, SchedulerMixin)
            and obj.__module__ == module.__name__
            and obj.__dict__.get("_compatibles") == DDIMScheduler._compatibles
        ]  # fmt: skip

    found = []
    for info in pkgutil.iter_modules(diffusers.schedulers.__path__):
        if info.name.startswith("scheduling_"):
            found += carriers(importlib.import_module(f"diffusers.schedulers.{info.name}"))
    return found


def test_compatibles_lists_the_shared_config_schedulers(lab, monkeypatch):
    """`DDIMScheduler._compatibles` is the 15 names of `KarrasDiffusionSchedulers` (`EulerDiscreteScheduler`, `DPMSolverMultistepScheduler`, `PNDMScheduler`...), and 20 scheduler classes in diffusers 0.42.1 carry that same list (every `scheduling_*` module imported and its classes read); it names `EDMEulerScheduler`, which has no betas and whose own `_compatibles` is empty, and `FlowMatchEulerDiscreteScheduler._compatibles` is empty: its `compatibles` property lists only itself."""
    import diffusers
    from diffusers import (
        DDIMScheduler,
        EDMEulerScheduler,
        EulerDiscreteScheduler,
        FlowMatchEulerDiscreteScheduler,
    )

    assert DDIMScheduler._compatibles == lab["KARRAS_COMPATIBLES"]
    assert len(DDIMScheduler._compatibles) == 15
    carriers = _classes_carrying_the_karras_list(monkeypatch)
    assert len(carriers) == 20, carriers
    from diffusers.schedulers.scheduling_utils import SchedulerMixin

    for name in carriers:  # those importable here (not dummies) have the same list at run time
        cls = getattr(diffusers, name, None)
        if isinstance(cls, type) and issubclass(cls, SchedulerMixin):
            assert cls._compatibles == DDIMScheduler._compatibles, name
    assert EulerDiscreteScheduler._compatibles == DDIMScheduler._compatibles
    assert "EDMEulerScheduler" in DDIMScheduler._compatibles
    assert EDMEulerScheduler._compatibles == []
    assert "beta_schedule" not in inspect.signature(EDMEulerScheduler.__init__).parameters
    assert FlowMatchEulerDiscreteScheduler._compatibles == []
    flow = FlowMatchEulerDiscreteScheduler()
    assert [c.__name__ for c in flow.compatibles] == ["FlowMatchEulerDiscreteScheduler"]


def test_loading_records_the_keys_the_file_did_not_set(lab):
    """Loading SD 1.5's `scheduler_config.json` into `PNDMScheduler` fills the keys the file does not set (`prediction_type`, `timestep_spacing`) with defaults and lists them in `config._use_default_values`; keys it sets but does not use (`clip_sample`) stay in `config`."""
    pndm = sd15_scheduler()
    lab_config = lab["load_scheduler"](SD15_SCHEDULER_FILE)
    assert sorted(pndm.config["_use_default_values"]) == lab_config["_use_default_values"]
    assert sorted(pndm.config["_use_default_values"]) == ["prediction_type", "timestep_spacing"]
    assert (
        pndm.config["clip_sample"] is False
        and "clip_sample" not in lab["SCHEDULER_INIT"]["PNDMScheduler"]
    )
    for key, value in lab_config.items():
        if key != "_use_default_values":  # compared above, as sets
            assert pndm.config[key] == value, key


@pytest.mark.parametrize(
    "target", ["EulerDiscreteScheduler", "DDIMScheduler", "FlowMatchEulerDiscreteScheduler"]
)
def test_from_config_carries_init_keys_and_resets_unset_ones(lab, target):
    """`<Scheduler>.from_config(pipe.scheduler.config)` keeps each key the new class's `__init__` accepts and the old file set (`beta_start`, `beta_end`, `beta_schedule`, `steps_offset`...), uses the new class's defaults for the rest, including keys the old file never set, and ignores the others: the lab's `from_config` gives the same values."""
    import diffusers

    pndm = sd15_scheduler()
    new = getattr(diffusers, target).from_config(pndm.config)
    values, _carried, defaulted, ignored = lab["from_config"](target, dict(pndm.config))
    for key, value in values.items():
        assert new.config[key] == value, key
    assert set(defaulted) <= set(new.config["_use_default_values"])
    for key in ignored:
        assert key not in inspect.signature(type(new).__init__).parameters


def test_euler_and_ddim_keep_only_num_train_timesteps_from_fluxs_config(lab):
    """In the `--family flux` run, Euler and DDIM keep only `num_train_timesteps` from Flux's, ignoring `shift=3.0` and the dynamic-shifting keys (their `.config` still lists them, unused): built by `from_config` on FLUX.1's loaded `FlowMatchEulerDiscreteScheduler` config, each samples the timesteps of its own default config, as the lab's `from_config` predicts."""
    import diffusers

    file = lab["CONFIGS"]["flux"]["scheduler"]
    flux = diffusers.FlowMatchEulerDiscreteScheduler.from_config(file)
    for target in ("EulerDiscreteScheduler", "DDIMScheduler"):
        cls = getattr(diffusers, target)
        new, default = cls.from_config(flux.config), cls(num_train_timesteps=1000)
        _, carried, _, ignored = lab["from_config"](target, dict(flux.config))
        assert set(carried) == {"num_train_timesteps"}, target
        assert {"shift", "use_dynamic_shifting"} <= set(ignored), target
        assert new.config["shift"] == 3.0 and new.config["use_dynamic_shifting"] is True, target
        new.set_timesteps(4)
        default.set_timesteps(4)
        assert torch.equal(new.timesteps, default.timesteps), target


def test_euler_from_sd15_config_switches_to_linspace_spacing():
    """`EulerDiscreteScheduler.from_config` on SD 1.5's loaded `PNDMScheduler` config gets `timestep_spacing="linspace"`, Euler's default, not PNDM's `leading`, because SD 1.5's file never set it; `beta_schedule`, the betas and `steps_offset=1` carry over."""
    from diffusers import EulerDiscreteScheduler

    pndm = sd15_scheduler()
    euler = EulerDiscreteScheduler.from_config(pndm.config)
    assert pndm.config.timestep_spacing == "leading"
    assert euler.config.timestep_spacing == "linspace"
    assert euler.config.beta_schedule == "scaled_linear" and euler.config.steps_offset == 1
    assert euler.config.prediction_type == "epsilon"
    explicit = EulerDiscreteScheduler.from_config(
        {**SD15_SCHEDULER_FILE, "timestep_spacing": "leading"}
    )
    assert explicit.config.timestep_spacing == "leading"  # set in the file: carried


def test_from_config_carries_prediction_type_when_the_file_sets_it():
    """A `prediction_type="v_prediction"` that the scheduler file sets carries over through `EulerDiscreteScheduler.from_config`."""
    from diffusers import DDIMScheduler, EulerDiscreteScheduler

    ddim = DDIMScheduler(prediction_type="v_prediction", **SD_BETAS)
    assert EulerDiscreteScheduler.from_config(ddim.config).config.prediction_type == "v_prediction"


def test_flow_match_from_a_betas_config_ignores_betas_and_prediction_type(lab, caplog):
    """`FlowMatchEulerDiscreteScheduler.from_config` on a DDPM-style config without sigma flags (DDIM's, as SD 1.5's PNDM's) keeps only `num_train_timesteps`: the betas, `beta_schedule` and `prediction_type` are not `__init__` arguments and change nothing."""
    from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler

    ddim = DDIMScheduler(num_train_timesteps=1000, prediction_type="v_prediction", **SD_BETAS)
    with caplog.at_level(logging.WARNING):
        flow = FlowMatchEulerDiscreteScheduler.from_config(ddim.config)
    default = FlowMatchEulerDiscreteScheduler()
    flow.set_timesteps(10)
    default.set_timesteps(10)
    torch.testing.assert_close(flow.sigmas, default.sigmas)
    _, carried, _, ignored = lab["from_config"](
        "FlowMatchEulerDiscreteScheduler", dict(ddim.config)
    )
    assert list(carried) == ["num_train_timesteps"]
    assert {"beta_schedule", "prediction_type"} <= set(ignored)


def test_flow_match_from_config_keeps_the_sigma_flags_it_shares(lab):
    """`FlowMatchEulerDiscreteScheduler.from_config` keeps more than `num_train_timesteps` from some betas configs: every DDPM-family class (those named in `DDIMScheduler._compatibles`, importable here) that takes `use_karras_sigmas` hands `use_karras_sigmas=True` on to it, and from such an `EulerDiscreteScheduler` config it samples on Karras sigmas, a different schedule, as the lab's `from_config` predicts."""
    import diffusers
    from diffusers import EulerDiscreteScheduler, FlowMatchEulerDiscreteScheduler
    from diffusers.schedulers.scheduling_utils import SchedulerMixin

    sharing = []
    for name in diffusers.DDIMScheduler._compatibles:
        cls = getattr(diffusers, name, None)
        assert isinstance(cls, type) and issubclass(cls, SchedulerMixin), name
        if "use_karras_sigmas" not in inspect.signature(cls.__init__).parameters:
            continue
        flow = FlowMatchEulerDiscreteScheduler.from_config(cls(use_karras_sigmas=True).config)
        assert flow.config.use_karras_sigmas is True, name
        sharing.append(name)
    assert "EulerDiscreteScheduler" in sharing and "DPMSolverMultistepScheduler" in sharing
    euler = EulerDiscreteScheduler(**SD_BETAS, use_karras_sigmas=True)
    flow, default = FlowMatchEulerDiscreteScheduler.from_config(euler.config), FlowMatchEulerDiscreteScheduler()  # fmt: skip
    flow.set_timesteps(4)
    default.set_timesteps(4)
    assert (flow.sigmas - default.sigmas).abs().max() > 0.1
    _, carried, _, _ = lab["from_config"]("FlowMatchEulerDiscreteScheduler", dict(euler.config))
    assert carried["use_karras_sigmas"] is True


# ----------------------------------------------------------------------- must match


def _configs(unet, vae, text_encoder, scheduler):
    """The configs of real components, as the lab's checker reads them."""
    return {
        "unet": {**dict(unet.config), "_class_name": type(unet).__name__},
        "vae": {**dict(vae.config), "_class_name": type(vae).__name__},
        # architectures: what save_pretrained writes into config.json (None until then)
        "text_encoder": {
            **text_encoder.config.to_dict(),
            "architectures": [type(text_encoder).__name__],
        },
        "scheduler": {**dict(scheduler.config), "_class_name": type(scheduler).__name__},
    }


def _failed(lab, components, shipped=None):
    shipped = shipped or components["scheduler"]
    return sorted(rule for rule, *_, ok in lab["check"](components, shipped) if not ok)


def test_checker_passes_the_tiny_pipelines_real_configs(lab):
    """The lab's checker, given the real configs of the tiny `StableDiffusionPipeline`'s UNet, VAE, text encoder and scheduler, reports every boundary as matching, and that pipeline runs."""
    pipe = tiny_sd_pipeline(text_encoder=tiny_text_encoder())
    components = _configs(pipe.unet, pipe.vae, pipe.text_encoder, pipe.scheduler)
    assert _failed(lab, components) == []
    pipe(prompt_embeds=embeds(1), num_inference_steps=2, guidance_scale=1.0, height=HEIGHT,
         width=WIDTH, latents=start_latents(), output_type="latent")  # fmt: skip


def _vae16():
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=16,
                         sample_size=HEIGHT).eval()  # fmt: skip


def _raised_in(error, filename):
    """Whether ``error`` was raised from a frame of a file whose path ends with ``filename``."""
    import traceback

    return any(f.filename.endswith(filename) for f in traceback.extract_tb(error.__traceback__))


def test_latent_channel_mismatch_runs_the_loop_and_fails_in_vae_decode(lab, record_calls):
    """With a 16-channel VAE and a 4-channel UNet, `StableDiffusionPipeline.__call__` runs every denoising step (`prepare_latents` sizes the noise from `unet.config.in_channels`) and raises only inside `vae.decode`; `__init__` checks nothing, and the lab's checker flags "latent channels" from the configs alone."""
    pipe = tiny_sd_pipeline(vae=_vae16(), text_encoder=tiny_text_encoder())  # no error here
    components = _configs(pipe.unet, pipe.vae, pipe.text_encoder, pipe.scheduler)
    assert _failed(lab, components) == ["latent channels"]
    unet = record_calls(pipe.unet)
    decode, entered = pipe.vae.decode, []
    pipe.vae.decode = lambda z, *a, **k: entered.append(tuple(z.shape)) or decode(z, *a, **k)
    with pytest.raises(RuntimeError) as error:
        pipe(prompt_embeds=embeds(1), num_inference_steps=3, guidance_scale=1.0, height=HEIGHT,
             width=WIDTH, output_type="np")  # fmt: skip
    assert [args[0].shape[1] for args, _ in unet.calls] == [4, 4, 4]  # every step ran
    assert entered == [(1, 4, 8, 8)]  # 4-channel latents into a 16-channel decoder
    assert _raised_in(error.value, "autoencoder_kl.py")


def test_dit_latent_channel_mismatch_also_runs_the_loop_and_fails_in_vae_decode(record_calls):
    """SD3 and Flux fail the same way: with a 16-channel transformer (Flux's packed `in_channels` 64 = 4 x 16) and a 4-channel VAE, `StableDiffusion3Pipeline.__call__` and `FluxPipeline.__call__` run every step (the noise is sized from `transformer.config.in_channels`) and raise only inside `vae.decode`, on `(B, 16, H/8, W/8)` latents."""
    from tiny import (
        DIT_TEXT,
        SD3_VAE_FACTORS,
        tiny_dit_vae,
        tiny_sd3_pipeline,
        tiny_sd3_transformer,
    )

    sd3 = tiny_sd3_pipeline(transformer=tiny_sd3_transformer(in_channels=16, pooled_projection_dim=DIT_TEXT),
                            vae=tiny_dit_vae(latent_channels=4, **SD3_VAE_FACTORS))  # fmt: skip
    flux = tiny_flux_pipeline(vae_config=dict(latent_channels=4, **FLUX_VAE_FACTORS))
    text, pooled = dit_embeds(1)
    for pipe in (sd3, flux):
        steps, entered = record_calls(pipe.transformer).calls, []
        decode = pipe.vae.decode
        pipe.vae.decode = lambda z, *a, d=decode, e=entered, **k: (
            e.append(tuple(z.shape)) or d(z, *a, **k)
        )
        with pytest.raises(RuntimeError) as error, torch.no_grad():
            pipe(prompt_embeds=text, pooled_prompt_embeds=pooled, guidance_scale=1.0,
                 num_inference_steps=3, height=HEIGHT, width=WIDTH, output_type="np")  # fmt: skip
        assert len(steps) == 3 and entered == [(1, 16, 8, 8)], type(pipe).__name__
        assert _raised_in(error.value, "autoencoder_kl.py"), type(pipe).__name__


def test_latent_channel_mismatch_fails_at_the_first_unet_call_in_img2img_and_inpainting(
    record_calls,
):
    """With the same 16-channel VAE, `StableDiffusionImg2ImgPipeline` and `StableDiffusionInpaintPipeline` (4-channel UNet) raise at the first UNet call, on 16-channel latents (img2img encodes the image with the VAE; inpainting sizes its noise from `vae.config.latent_channels`), and with a 9-channel inpainting UNet `StableDiffusionInpaintPipeline.__call__` raises `ValueError` before the loop."""
    from diffusers import StableDiffusionImg2ImgPipeline, StableDiffusionInpaintPipeline

    parts = tiny_sd_pipeline(vae=_vae16()).components
    image = torch.rand(1, 3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(1, 1, HEIGHT, WIDTH)
    mask[..., 4:12, 4:12] = 1
    kwargs = dict(prompt_embeds=embeds(1), num_inference_steps=3, guidance_scale=1.0,
                  output_type="np", image=image)  # fmt: skip
    img2img = StableDiffusionImg2ImgPipeline(**parts)
    inpaint = StableDiffusionInpaintPipeline(**parts)
    for pipe, extra in [
        (img2img, {}),
        (inpaint, dict(mask_image=mask, height=HEIGHT, width=WIDTH)),
    ]:
        pipe.set_progress_bar_config(disable=True)
        unet = record_calls(pipe.unet)
        with pytest.raises(RuntimeError) as error:
            pipe(**kwargs, **extra)
        assert [args[0].shape[1] for args, _ in unet.calls] == [16], type(pipe).__name__
        assert _raised_in(error.value, "unet_2d_condition.py")
        unet.remove()
    inpaint9 = StableDiffusionInpaintPipeline(**{**parts, "unet": tiny_unet(in_channels=9)})
    inpaint9.set_progress_bar_config(disable=True)
    unet = record_calls(inpaint9.unet)
    with pytest.raises(ValueError, match="Incorrect configuration settings"):
        inpaint9(**kwargs, mask_image=mask, height=HEIGHT, width=WIDTH)
    assert unet.calls == []


def test_text_width_mismatch_fails_in_cross_attention(lab, tmp_path, record_calls):
    """A UNet with `cross_attention_dim=32` fails in its first cross-attention on `prompt_embeds` from a 48-wide text encoder, run through `StableDiffusionPipeline.__call__` with a prompt; the lab's checker flags "text width" from the configs alone."""
    unet, encoder = tiny_unet(), tiny_text_encoder(hidden_size=48)
    assert unet.config.cross_attention_dim == EMBED_DIM == 32
    pipe = tiny_sd_pipeline(text_encoder=encoder, tokenizer=tiny_tokenizer(tmp_path))
    components = _configs(pipe.unet, pipe.vae, pipe.text_encoder, pipe.scheduler)
    assert _failed(lab, components) == ["text width"]
    attn2 = pipe.unet.down_blocks[0].attentions[0].transformer_blocks[0].attn2
    cross = record_calls(attn2)
    with pytest.raises(RuntimeError) as error:
        pipe(prompt="a cat", num_inference_steps=1, guidance_scale=1.0, height=HEIGHT,
             width=WIDTH, output_type="latent")  # fmt: skip
    assert len(cross.calls) == 1 and cross.calls[0][1]["encoder_hidden_states"].shape[-1] == 48
    assert _raised_in(error.value, "attention_processor.py")


def test_sdxl_pooled_width_mismatch_raises_before_the_loop(record_calls):
    """In `StableDiffusionXLPipeline.__call__`, a `pooled_prompt_embeds` width that does not fit the UNet's `projection_class_embeddings_input_dim` (six time ids of `addition_time_embed_dim` plus the pooled width) raises `ValueError` in `_get_add_time_ids`, before the first UNet call."""
    from diffusers import EulerDiscreteScheduler

    euler = EulerDiscreteScheduler(**SD_BETAS, steps_offset=1)
    pipe = tiny_sdxl_pipeline(euler, unet=tiny_sdxl_unet(pooled=20), add_watermarker=False)
    unet = record_calls(pipe.unet)
    kwargs = dict(prompt_embeds=embeds(1), guidance_scale=1.0, num_inference_steps=2,
                  height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
    pipe(pooled_prompt_embeds=torch.randn(1, 20), **kwargs)  # the right width runs
    assert len(unet.calls) == 2
    unet.calls.clear()
    with pytest.raises(ValueError, match="Model expects an added time embedding vector") as error:
        pipe(pooled_prompt_embeds=torch.randn(1, 24), **kwargs)
    assert any(f.name == "_get_add_time_ids" for f in _frames(error.value))
    assert unet.calls == []


def _frames(error):
    import traceback

    return traceback.extract_tb(error.__traceback__)


def test_ddim_runs_a_prediction_type_mismatch_without_an_error(lab, record_calls):
    """A `DDIMScheduler` with `prediction_type="epsilon"`, or SD 1.5's `PNDMScheduler` (`epsilon`), on a checkpoint trained for `v_prediction` raises nothing: `StableDiffusionPipeline` runs and returns different `latents`; only the lab's checker flags "prediction_type". A scheduler config that differs from the checkpoint's in another setting (a DPM-Solver given `use_flow_sigmas=True`) gets "not checked here" from the checker, not "ok". Not every mismatch is silent: a `DDIMScheduler` carrying `flow_prediction` (what `from_config` gives it from a DPM-Solver on flow sigmas) and SD 1.5's `PNDMScheduler` set to `sample` raise `ValueError` in their first `step`."""
    from diffusers import DDIMScheduler, DPMSolverMultistepScheduler, PNDMScheduler

    shipped = DDIMScheduler(prediction_type="v_prediction", **SD_SCHEDULER)
    wrong = DDIMScheduler(prediction_type="epsilon", **SD_SCHEDULER)
    results = []
    for scheduler in (shipped, wrong, PNDMScheduler.from_config(SD15_SCHEDULER_FILE)):
        pipe = tiny_sd_pipeline(scheduler=scheduler, text_encoder=tiny_text_encoder())
        results.append(pipe(prompt_embeds=embeds(1), num_inference_steps=3, guidance_scale=1.0,
                            height=HEIGHT, width=WIDTH, latents=start_latents(),
                            output_type="latent").images)  # fmt: skip
    assert all(torch.isfinite(r).all() and not torch.allclose(results[0], r) for r in results[1:])
    components = _configs(pipe.unet, pipe.vae, pipe.text_encoder, wrong)
    shipped_config = {**dict(shipped.config), "_class_name": "DDIMScheduler"}
    assert _failed(lab, components, shipped_config) == ["prediction_type"]
    sd15 = lab["CONFIGS"]["sd15"]
    flow_sigmas = {**sd15["scheduler"], "_class_name": "DPMSolverMultistepScheduler", "use_flow_sigmas": True}  # fmt: skip
    verdict = {r[0]: r[3] for r in lab["check"]({**sd15, "scheduler": flow_sigmas}, sd15["scheduler"])}  # fmt: skip
    assert verdict["prediction_type"] is None  # not "ok": the tests run no flow sigmas here
    flow = DPMSolverMultistepScheduler(**SD_BETAS, steps_offset=1, use_flow_sigmas=True, prediction_type="flow_prediction")  # fmt: skip
    ddim = DDIMScheduler.from_config(flow.config, clip_sample=False, set_alpha_to_one=False)
    assert ddim.config.prediction_type == "flow_prediction"
    pndm = PNDMScheduler.from_config(SD15_SCHEDULER_FILE, prediction_type="sample")
    for scheduler, valid in ((ddim, "`epsilon`, `sample`, or `v_prediction`"), (pndm, "`epsilon` or `v_prediction`")):  # fmt: skip
        pipe = tiny_sd_pipeline(scheduler=scheduler)
        calls = record_calls(pipe.unet).calls
        with pytest.raises(ValueError, match=f"must be one of {valid}"):
            pipe(prompt_embeds=embeds(1), num_inference_steps=3, guidance_scale=1.0, height=HEIGHT,
                 width=WIDTH, output_type="latent")  # fmt: skip
        assert len(calls) == 1


# -------------------------------------------------------------------------- shapes


def test_vae_scale_factor_and_decode_scaling(sd_pipe, record_calls):
    """`vae_scale_factor` is `2 ** (len(vae.config.block_out_channels) - 1)`, and `StableDiffusionPipeline` calls `vae.decode` on `latents / vae.config.scaling_factor`."""
    assert sd_pipe.vae_scale_factor == 2 ** (len(sd_pipe.vae.config.block_out_channels) - 1)
    kwargs = dict(prompt_embeds=embeds(1), num_inference_steps=2, guidance_scale=1.0,
                  height=HEIGHT, width=WIDTH)  # fmt: skip
    latents = sd_pipe(**kwargs, latents=start_latents(), output_type="latent").images
    calls = []
    original = sd_pipe.vae.decode
    sd_pipe.vae.decode = lambda z, *a, **k: calls.append(z.clone()) or original(z, *a, **k)
    try:
        sd_pipe(**kwargs, latents=start_latents(), output_type="np")
    finally:
        sd_pipe.vae.decode = original
    torch.testing.assert_close(calls[0], latents / sd_pipe.vae.config.scaling_factor)


class _SizeSeenError(Exception):
    """Raised by the ``prepare_latents`` spy with the (height, width) ``__call__`` chose."""


def test_default_size_is_the_denoisers_sample_size_times_vae_scale_factor():
    """`vae_scale_factor = 2 ** (len(block_out_channels) - 1)`, 8 for all four VAEs, so the default size is the denoiser's `sample_size` × 8 (64 × 8 = 512 for SD 1.5, 128 × 8 = 1024 for the others; `FluxPipeline` hard-codes its 128 as `default_sample_size`): called without `height` and `width`, `StableDiffusionPipeline`, `StableDiffusionXLPipeline` and `StableDiffusion3Pipeline` size their latents from `sample_size * vae_scale_factor`, and `FluxPipeline` from `128 * vae_scale_factor` whatever its transformer."""
    from model_configs import (
        FLUX_VAE,
        SD3_MEDIUM_TRANSFORMER,
        SD3_VAE,
        SD15_UNET,
        SD15_VAE,
        SDXL_UNET,
        SDXL_VAE,
    )

    for config in (SD15_VAE, SDXL_VAE, SD3_VAE, FLUX_VAE):  # the published VAEs: f = 8
        assert 2 ** (len(config["block_out_channels"]) - 1) == 8
    assert (SD15_UNET["sample_size"], SDXL_UNET["sample_size"], SD3_MEDIUM_TRANSFORMER["sample_size"]) == (64, 128, 128)  # fmt: skip
    text, pooled = dit_embeds(1)
    cases = [
        (tiny_sd_pipeline(), "unet", dict(prompt_embeds=embeds(1))),
        (tiny_sdxl_pipeline(), "unet", dict(prompt_embeds=embeds(1), pooled_prompt_embeds=torch.randn(1, 16))),
        (tiny_sd3_pipeline_16ch(), "transformer", dict(prompt_embeds=text, pooled_prompt_embeds=pooled)),
        (tiny_flux_pipeline(vae_config=FLUX_VAE_FACTORS), None, dict(prompt_embeds=text, pooled_prompt_embeds=pooled)),
    ]  # fmt: skip
    for pipe, denoiser, kwargs in cases:

        def spy(*args, **kw):
            raise _SizeSeenError(args[2], args[3])

        pipe.prepare_latents = spy
        with pytest.raises(_SizeSeenError) as seen, torch.no_grad():
            pipe(**kwargs, guidance_scale=1.0, num_inference_steps=1, output_type="latent")
        side = getattr(pipe, denoiser).config.sample_size if denoiser else 128
        assert seen.value.args == (side * pipe.vae_scale_factor,) * 2, type(pipe).__name__
        assert pipe.vae_scale_factor == 2 ** (len(pipe.vae.config.block_out_channels) - 1)


def test_flux_packs_2x2_latent_patches_into_tokens(lab):
    """`FluxPipeline._pack_latents` turns `latents` `(B, 16, 128, 128)` into `(B, 4096, 64)`: each 2x2 patch becomes one token of `4 * 16` channels, the lab's "packed latents"."""
    from diffusers import FluxPipeline

    latents = torch.zeros(1, 16, 128, 128)
    packed = FluxPipeline._pack_latents(latents, 1, 16, 128, 128)
    assert tuple(packed.shape) == (1, 4096, 64)
    assert lab["boundary_shapes"]("flux")[6] == ("packed latents", "(B, 4096, 64)")
    assert lab["CONFIGS"]["flux"]["transformer"]["in_channels"] == 64


# ---- tiny SD3 and Flux pipelines with 16-channel VAEs (``tiny.py``) --------------------


def lab_flux_pipeline():
    """``tiny_flux_pipeline`` (guidance-embedding, as Flux.1-dev) with FLUX.1's VAE factors,
    the VAE seeded on its own."""
    return tiny_flux_pipeline(vae_seed=0, vae_config=FLUX_VAE_FACTORS)


def _dit_call(pipe, seed=1, steps=2, **kwargs):
    prompt_embeds, pooled = dit_embeds(seed)
    kwargs = dict(dict(prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled), **kwargs)
    with torch.no_grad():
        return pipe(**kwargs, num_inference_steps=steps, height=HEIGHT, width=WIDTH,
                    generator=torch.Generator().manual_seed(7)).images  # fmt: skip


def _noise(*shape):
    """The noise ``randn_tensor`` draws on the CPU from ``manual_seed(7)``."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(7))


def test_flow_pipelines_start_from_unscaled_noise(record_calls):
    """`FlowMatchEulerDiscreteScheduler` has no `init_noise_sigma`: `StableDiffusion3Pipeline` and `FluxPipeline` start from the noise as drawn (SD3's first transformer input is the `randn` latents, Flux's the same noise packed into tokens), while `StableDiffusionPipeline` and `StableDiffusionXLPipeline` multiply their noise by `scheduler.init_noise_sigma` before the loop."""
    from diffusers import EulerDiscreteScheduler, FlowMatchEulerDiscreteScheduler, FluxPipeline

    assert not hasattr(FlowMatchEulerDiscreteScheduler(), "init_noise_sigma")
    sd3 = tiny_sd3_pipeline_16ch()
    calls = record_calls(sd3.transformer).calls
    _dit_call(sd3, guidance_scale=1.0, output_type="latent")
    torch.testing.assert_close(calls[0][1]["hidden_states"], _noise(1, 16, 8, 8))
    flux = lab_flux_pipeline()
    calls = record_calls(flux.transformer).calls
    _dit_call(flux, output_type="latent")
    packed = FluxPipeline._pack_latents(_noise(1, 16, 8, 8), 1, 16, 8, 8)
    torch.testing.assert_close(calls[0][1]["hidden_states"], packed)
    # SD 1.5's loop: the noise times init_noise_sigma is what scale_model_input first receives
    euler = EulerDiscreteScheduler(**SD_BETAS, steps_offset=1)
    sd = tiny_sd_pipeline(scheduler=euler)
    seen, scale = [], euler.scale_model_input
    euler.scale_model_input = lambda sample, t: seen.append(sample.clone()) or scale(sample, t)
    sd(prompt_embeds=embeds(1), num_inference_steps=2, guidance_scale=1.0, height=HEIGHT,
       width=WIDTH, output_type="latent", generator=torch.Generator().manual_seed(7))  # fmt: skip
    assert euler.init_noise_sigma > 10
    torch.testing.assert_close(seen[0], _noise(1, 4, 8, 8) * euler.init_noise_sigma)
    # SDXL's loop, the same way (pooled width 20 fits tinytiny_sdxl_unet(pooled=20))

    euler = EulerDiscreteScheduler(**SD_BETAS, steps_offset=1)
    sdxl = tiny_sdxl_pipeline(euler, unet=tiny_sdxl_unet(pooled=20), add_watermarker=False)
    seen, scale = [], euler.scale_model_input
    euler.scale_model_input = lambda sample, t: seen.append(sample.clone()) or scale(sample, t)
    sdxl(prompt_embeds=embeds(1), pooled_prompt_embeds=torch.randn(1, 20), num_inference_steps=2,
         guidance_scale=1.0, height=HEIGHT, width=WIDTH, output_type="latent",
         generator=torch.Generator().manual_seed(7))  # fmt: skip
    torch.testing.assert_close(seen[0], _noise(1, 4, 8, 8) * euler.init_noise_sigma)


def test_sd3_guides_on_2b_rows_flux_dev_on_an_embedded_scale(record_calls):
    """With guidance on, `StableDiffusion3Pipeline` calls its transformer once per step on `2B` rows (negative rows first), while `FluxPipeline` with `guidance_embeds=True` calls it once per step on `B` rows and passes `guidance_scale` in as `guidance`; only `true_cfg_scale > 1` with a negative prompt adds a second Flux call per step."""
    sd3 = tiny_sd3_pipeline_16ch()
    calls = record_calls(sd3.transformer).calls
    negative, negative_pooled = dit_embeds(2)
    _dit_call(sd3, guidance_scale=5.0, negative_prompt_embeds=negative,
              negative_pooled_prompt_embeds=negative_pooled, output_type="latent")  # fmt: skip
    assert len(calls) == 2
    for _, kwargs in calls:
        assert kwargs["hidden_states"].shape[0] == 2
        torch.testing.assert_close(kwargs["encoder_hidden_states"][0], negative[0])
    flux = lab_flux_pipeline()
    calls = record_calls(flux.transformer).calls
    _dit_call(flux, guidance_scale=3.5, output_type="latent")
    assert len(calls) == 2
    for _, kwargs in calls:
        assert kwargs["hidden_states"].shape[0] == 1 and kwargs["guidance"].tolist() == [3.5]
    calls.clear()
    _dit_call(flux, guidance_scale=3.5, true_cfg_scale=4.0, negative_prompt_embeds=negative,
              negative_pooled_prompt_embeds=negative_pooled, output_type="latent")  # fmt: skip
    assert len(calls) == 4 and all(kwargs["hidden_states"].shape[0] == 1 for _, kwargs in calls)


def test_flux_steps_packed_tokens_and_both_decode_with_shift(lab, record_calls):
    """In `FluxPipeline.__call__`, `scheduler.step` receives `latents` and `noise_pred` as packed tokens `(B, (H/16) * (W/16), 64)`, unpacked to `(B, 16, H/8, W/8)` only for `vae.decode`; Flux and `StableDiffusion3Pipeline` both decode `latents / vae.config.scaling_factor + vae.config.shift_factor`."""
    from diffusers import FluxPipeline

    for pipe in (lab_flux_pipeline(), tiny_sd3_pipeline_16ch()):
        steps, decoded = [], []

        def spy_step(out, t, z, _steps=steps, _step=pipe.scheduler.step, **k):
            _steps.append((out.shape, z.shape))
            return _step(out, t, z, **k)

        def spy_decode(z, *a, _decoded=decoded, _decode=pipe.vae.decode, **k):
            _decoded.append(z.clone())
            return _decode(z, *a, **k)

        pipe.scheduler.step, pipe.vae.decode = spy_step, spy_decode
        last = _dit_call(pipe, guidance_scale=1.0, output_type="latent")  # the final latents
        _dit_call(pipe, guidance_scale=1.0, output_type="np")
        config = pipe.vae.config
        if isinstance(pipe, FluxPipeline):
            assert steps[0] == ((1, 16, 64), (1, 16, 64))  # (16/16) * ... = (8/2) * (8/2) tokens
            last = FluxPipeline._unpack_latents(last, HEIGHT, WIDTH, pipe.vae_scale_factor)
        else:
            assert steps[0] == ((1, 16, 8, 8), (1, 16, 8, 8))
        torch.testing.assert_close(decoded[0], last / config.scaling_factor + config.shift_factor)
        assert decoded[0].shape == (1, 16, 8, 8)
    assert lab["boundary_shapes"]("flux")[-2] == ("noise_pred", "(B, 4096, 64)")


def test_dit_text_and_pooled_width_mismatches_fail_at_the_first_transformer_call(record_calls):
    """`StableDiffusion3Pipeline` and `FluxPipeline` given `prompt_embeds` wider than the transformer's `joint_attention_dim` raise in `context_embedder`, the linear layer that projects the text tokens, at the first transformer call; a `pooled_prompt_embeds` of the wrong width raises in `time_text_embed` at that same first call."""
    for pipe in (tiny_sd3_pipeline_16ch(), lab_flux_pipeline()):
        calls = record_calls(pipe.transformer.context_embedder)
        wide, pooled = dit_embeds(3, width=48)
        with pytest.raises(RuntimeError) as error:
            _dit_call(pipe, prompt_embeds=wide, pooled_prompt_embeds=pooled, guidance_scale=1.0,
                      output_type="latent")  # fmt: skip
        assert len(calls.calls) == 1 and calls.calls[0][0][0].shape[-1] == 48
        assert any(f.name == "forward" and "context_embedder" in (f.line or "")
                   for f in _frames(error.value)), type(pipe).__name__  # fmt: skip
        transformer = record_calls(pipe.transformer)
        prompt_embeds, _ = dit_embeds(3)
        with pytest.raises(RuntimeError) as error:
            _dit_call(pipe, prompt_embeds=prompt_embeds, pooled_prompt_embeds=torch.randn(1, 48),
                      guidance_scale=1.0, output_type="latent")  # fmt: skip
        assert len(transformer.calls) == 1
        assert any("time_text_embed" in (f.line or "") for f in _frames(error.value))


def test_sequence_lengths_default_to_256_and_512(tmp_path, record_calls):
    """`StableDiffusion3Pipeline.__call__` defaults to `max_sequence_length=256` T5 tokens and `FluxPipeline.__call__` to 512, the lab's 77 + 256 and 512 text tokens: a `pipe(prompt)` call that does not set it feeds T5 that many tokens, and SD3's denoiser gets 77 + 256 text tokens."""
    from tiny import text_to_image_pipelines

    pipes = text_to_image_pipelines(tmp_path)
    for family, t5_name, length, text_tokens in [
        ("SD3 Medium", "text_encoder_3", 256, 77 + 256),
        ("Flux.1-dev", "text_encoder_2", 512, 512),
    ]:
        pipe, _ = pipes[family]
        t5, denoiser = record_calls(getattr(pipe, t5_name)), record_calls(pipe.transformer)
        with torch.no_grad():
            pipe("a cat", guidance_scale=1.0, num_inference_steps=1, height=HEIGHT, width=WIDTH,
                 output_type="latent")  # no max_sequence_length  # fmt: skip
        assert [args[0].shape[-1] for args, _ in t5.calls] == [length], family
        assert denoiser.calls[0][1]["encoder_hidden_states"].shape[1] == text_tokens, family


def test_a_flow_model_samples_with_dpm_solver_on_flow_sigmas(lab):
    """`DPMSolverMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction")` and `UniPCMultistepScheduler` set the same way, classes outside `FlowMatchEulerDiscreteScheduler`'s `_compatibles`, sample a flow-matching model: through the tiny `StableDiffusion3Pipeline`'s `__call__` they end close to the flow-matching Euler result, while `EulerDiscreteScheduler`, which reads the velocity as `epsilon`, raises nothing and ends far off; the lab's checker accepts the first and flags the second. `DEISMultistepScheduler` takes the same flags, but its flow schedule has no final zero sigma (its last step repeats the smallest nonzero one), so it stops with noise left."""
    from diffusers import (
        DEISMultistepScheduler,
        DPMSolverMultistepScheduler,
        EulerDiscreteScheduler,
        FlowMatchEulerDiscreteScheduler,
        UniPCMultistepScheduler,
    )

    flow = dict(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0)
    dpm = DPMSolverMultistepScheduler(**flow)
    deis = DEISMultistepScheduler(**flow)
    solvers = (dpm, UniPCMultistepScheduler(**flow))
    for solver in (*solvers, deis):
        assert type(solver).__name__ not in FlowMatchEulerDiscreteScheduler._compatibles
    latents = _noise(1, 16, 8, 8)
    out = {}
    for scheduler in (FlowMatchEulerDiscreteScheduler(shift=3.0), *solvers, deis,
                      EulerDiscreteScheduler()):  # fmt: skip
        pipe = tiny_sd3_pipeline_16ch(scheduler)
        out[type(scheduler).__name__] = _dit_call(
            pipe, steps=8, guidance_scale=1.0, latents=latents.clone(), output_type="latent"
        )
    reference = out["FlowMatchEulerDiscreteScheduler"]
    scale = reference.abs().max()
    for solver in solvers:
        name = type(solver).__name__
        assert (out[name] - reference).abs().max() < 0.05 * scale, name
    # DEIS: no final zero sigma; the last step goes from 3 * (1/8) / (1 + 2/8) = 0.3 to 0.3
    assert deis.sigmas[-1] == deis.sigmas[-2] and abs(float(deis.sigmas[-1]) - 0.3) < 1e-3
    assert dpm.sigmas[-1] == 0
    assert (out["DEISMultistepScheduler"] - reference).abs().max() > 0.1 * scale
    assert (out["EulerDiscreteScheduler"] - reference).abs().max() > 10 * scale
    shipped = lab["CONFIGS"]["sd3"]
    flow_dpm = {"_class_name": "DPMSolverMultistepScheduler", **flow}  # the keys it sets
    euler = {"_class_name": "EulerDiscreteScheduler", **dict(EulerDiscreteScheduler().config)}
    verdicts = [dict((r[0], r[3]) for r in lab["check"]({**shipped, "scheduler": sched},
                                                         shipped["scheduler"]))["objective"]
                for sched in (flow_dpm, euler)]  # fmt: skip
    assert verdicts == [True, False]


def test_flux_passes_mu_on_which_that_dpm_solver_raises(record_calls):
    """`FluxPipeline` passes `mu`, on which that DPM-Solver (`DPMSolverMultistepScheduler` with `use_flow_sigmas=True, prediction_type="flow_prediction"`, which `StableDiffusion3Pipeline` runs) raises `AssertionError`: through `FluxPipeline.__call__` it fails in `set_timesteps`, given `mu`, before the first transformer call."""
    from diffusers import DPMSolverMultistepScheduler

    dpm = DPMSolverMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction",
                                      flow_shift=3.0)  # fmt: skip
    flux = lab_flux_pipeline()
    flux.scheduler = dpm
    seen, set_timesteps = [], dpm.set_timesteps
    dpm.set_timesteps = lambda *a, **k: seen.append(k) or set_timesteps(*a, **k)
    calls = record_calls(flux.transformer).calls
    with pytest.raises(AssertionError):
        _dit_call(flux, guidance_scale=1.0, output_type="latent")
    assert len(seen) == 1 and seen[0].get("mu") is not None and calls == []


def _exact_velocity(pipe, x0, sigma_scale):
    """Replace the transformer's forward with the exact flow-matching velocity toward the one
    data point ``x0``, ``(x_t - x0) / sigma``, sigma read from the timestep the pipeline passes
    (SD3: ``t``, so sigma = t / 1000; Flux: ``t / 1000``). A scheduler that reads the output as a
    velocity on that timestep scale and steps to sigma 0 lands on ``x0``."""

    def forward(hidden_states, timestep, *args, **kwargs):
        sigma = (timestep.float() / sigma_scale).clamp(min=1e-6)
        return ((hidden_states - x0) / sigma.view(-1, *[1] * (hidden_states.dim() - 1)),)

    pipe.transformer.forward = forward


def test_the_checkers_objective_verdict_is_what_sd3_and_flux_do(lab):
    """The lab's checker accepts a scheduler for SD3 or Flux exactly when that pipeline's `__call__` (`StableDiffusion3Pipeline`, `FluxPipeline`) steps a velocity with it to sigma 0, over every scheduler class diffusers exports: at its defaults and, where its `__init__` takes them, with or without `use_flow_sigmas=True, prediction_type="flow_prediction"`, with `use_dynamic_shifting=True`, `time_shift_type="linear"`, `final_sigmas_type="sigma_min"` or `invert_sigmas=True`, with the checkpoint's own scheduler settings, and, for the flow solvers it accepts, each boolean `__init__` flag flipped (run with a transformer that returns the exact velocity toward one data point, so a scheduler that steps it lands there). At their defaults for SD3 these are the three `FlowMatch*` classes, `FlowMapEulerDiscreteScheduler`, `LTXEulerAncestralRFScheduler`, and DPM-Solver (multistep, single-step) and UniPC once set to flow sigmas; `FluxPipeline` passes custom `sigmas` and `mu`, on which `FlowMatchHeunDiscreteScheduler`, `FlowMapEulerDiscreteScheduler`, `LTXEulerAncestralRFScheduler` and a DPM-Solver without `use_dynamic_shifting=True` raise; DEIS, SA-Solver and the inverse DPM-Solver never reach sigma 0. Where a config differs from the checkpoint's in any other setting, the checker never says "ok": where its rules would, it says "not checked here" (UniPC's `solver_type="bh1"`, `num_train_timesteps=500`, `FlowMatchLCMScheduler`'s `scale_factors`)."""
    import diffusers
    from diffusers.schedulers.scheduling_utils import SchedulerMixin

    exported = [getattr(diffusers, n) for n in dir(diffusers) if n.endswith("Scheduler")]
    classes = [c for c in exported if isinstance(c, type) and issubclass(c, SchedulerMixin)]
    flow = dict(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0)
    pipes = {"sd3": (tiny_sd3_pipeline_16ch(), (1, 16, 8, 8), 1000.0),
             "flux": (lab_flux_pipeline(), (1, 16, 64), 1.0)}  # fmt: skip
    x0 = {f: torch.randn(*shape, generator=torch.Generator().manual_seed(5)) for f, (_, shape, _) in pipes.items()}  # fmt: skip
    for family, (pipe, _, scale) in pipes.items():
        _exact_velocity(pipe, x0[family], scale)
    text, pooled = dit_embeds(1)
    landed, wrong = set(), []

    def objective(family, name, settings):  # the checker, given the keys a config sets
        config = {**lab["CONFIGS"][family], "scheduler": {**settings, "_class_name": name}}
        return {r[0]: r[3] for r in lab["check"](config, lab["CONFIGS"][family]["scheduler"])}["objective"]  # fmt: skip

    for cls in classes:
        params = inspect.signature(cls.__init__).parameters
        base = {k: v for k, v in flow.items() if k in params} if "use_flow_sigmas" in params else {}
        keys = {k for change in lab["FLOW_CHANGES"] for k in change if k in params}
        if cls.__name__ in lab["FLOW_MATCH"] + lab["FLOW_SOLVERS"]:
            assert lab["FLOW_KEYS"].get(cls.__name__, set()) == keys, cls.__name__
        variants = [{**b, **change} for b in ([{}, base] if base else [{}])
                    for change in lab["FLOW_CHANGES"] if set(change) <= keys]  # fmt: skip
        if cls.__name__ in lab["FLOW_SOLVERS"]:  # every boolean flag flipped on flow sigmas
            flags = [k for k, p in params.items() if isinstance(p.default, bool) and k not in base]
            variants += [{**base, k: not params[k].default} for k in flags]
        for family, (pipe, shape, _) in pipes.items():
            shipped = {k: v for k, v in lab["CONFIGS"][family]["scheduler"].items()
                       if k in params and params[k].default != v}  # fmt: skip
            runs = variants + [{**shipped, **v} for v in variants if {**shipped, **v} != v]
            for kwargs in runs:
                try:
                    pipe.scheduler = cls(**kwargs)
                except (TypeError, ValueError):  # a class that cannot be built this way
                    continue
                noise = torch.randn(*shape, generator=torch.Generator().manual_seed(7))
                try:
                    with torch.no_grad():
                        out = pipe(prompt_embeds=text, pooled_prompt_embeds=pooled, latents=noise,
                                   guidance_scale=1.0, num_inference_steps=4, height=HEIGHT,
                                   width=WIDTH, output_type="latent").images  # fmt: skip
                    error = (out - x0[family]).abs().max() / (noise - x0[family]).abs().max()
                    lands = bool(error < 5e-3)  # the flow solvers' int timesteps: about 1e-3
                except Exception:  # any error in the call: it does not step this model
                    lands = False
                if objective(family, cls.__name__, kwargs) is not lands:
                    wrong.append((family, cls.__name__, kwargs))
                if lands and kwargs in ({}, base):
                    landed.add((family, cls.__name__))
    assert wrong == []
    untested = [("UniPCMultistepScheduler", {**flow, "solver_type": "bh1"}),  # NaN in both
                ("DPMSolverMultistepScheduler", {**flow, "num_train_timesteps": 500}),
                ("UniPCMultistepScheduler", {**flow, "num_train_timesteps": 500}),
                ("FlowMatchHeunDiscreteScheduler", {"num_train_timesteps": 500}),
                ("FlowMatchLCMScheduler", {"scale_factors": [1.0, 2.0]}),  # a ValueError
                ("FlowMapEulerDiscreteScheduler", {"use_dynamic_shifting": True})]  # SD3 passes mu  # fmt: skip
    assert {objective(f, name, settings) for f in pipes for name, settings in untested} <= {None, False}  # fmt: skip
    assert objective("sd3", "UniPCMultistepScheduler", {**flow, "solver_type": "bh1"}) is None
    assert {n for f, n in landed if f == "sd3"} == {
        "FlowMatchEulerDiscreteScheduler", "FlowMatchHeunDiscreteScheduler", "FlowMatchLCMScheduler",
        "FlowMapEulerDiscreteScheduler", "LTXEulerAncestralRFScheduler",
        "DPMSolverMultistepScheduler", "DPMSolverSinglestepScheduler", "UniPCMultistepScheduler",
    }  # fmt: skip
    assert {n for f, n in landed if f == "flux"} == {
        "FlowMatchEulerDiscreteScheduler", "FlowMatchLCMScheduler", "UniPCMultistepScheduler",
    }  # fmt: skip


def test_sd3_prompt_embeds_concatenate_clip_and_t5_tokens(tmp_path):
    """`StableDiffusion3Pipeline.encode_prompt` returns `prompt_embeds` of `77 + max_sequence_length` tokens at the T5 width (both CLIP outputs concatenated on the feature axis, zero-padded, then T5's tokens appended) and `pooled_prompt_embeds` of the two CLIP projection widths summed."""
    from diffusers import StableDiffusion3Pipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    def clip(width):
        torch.manual_seed(0)
        return CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=64, hidden_size=width, intermediate_size=2 * width, projection_dim=width,
            num_hidden_layers=1, num_attention_heads=4, max_position_embeddings=77,
            bos_token_id=0, eos_token_id=1, pad_token_id=1)).eval()  # fmt: skip

    torch.manual_seed(0)
    t5 = T5EncoderModel(T5Config(vocab_size=64, d_model=64, d_kv=16, d_ff=64, num_layers=1,
                                 num_heads=4)).eval()  # fmt: skip
    tok = tiny_tokenizer(tmp_path)
    pipe = StableDiffusion3Pipeline(
        transformer=None, scheduler=None, vae=None, text_encoder=clip(16), tokenizer=tok,
        text_encoder_2=clip(24), tokenizer_2=tok, text_encoder_3=t5, tokenizer_3=tok,
    )  # fmt: skip
    with torch.no_grad():
        prompt_embeds, _, pooled, _ = pipe.encode_prompt(
            "a cat", "a cat", "a cat", do_classifier_free_guidance=False, max_sequence_length=20
        )
    assert tuple(prompt_embeds.shape) == (1, 77 + 20, 64)
    assert tuple(pooled.shape) == (1, 16 + 24)
    assert torch.all(prompt_embeds[:, :77, 16 + 24 :] == 0)  # CLIP features zero-padded to 64


def _clip_config(width):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=64, hidden_size=width, intermediate_size=2 * width, projection_dim=width,
        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77,
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )  # fmt: skip


def test_sdxl_concatenates_both_encoders_and_pools_from_the_second(tmp_path):
    """`StableDiffusionXLPipeline.encode_prompt` returns `prompt_embeds` of `77` tokens whose width is the two text encoders' hidden sizes summed, and `pooled_prompt_embeds` equal to `text_encoder_2`'s projected `text_embeds` alone."""
    from diffusers import StableDiffusionXLPipeline
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(0)
    te1, te2 = (
        CLIPTextModel(_clip_config(16)).eval(),
        CLIPTextModelWithProjection(_clip_config(24)).eval(),
    )
    tok = tiny_tokenizer(tmp_path)
    pipe = StableDiffusionXLPipeline(vae=None, text_encoder=te1, text_encoder_2=te2, tokenizer=tok,
                                     tokenizer_2=tok, unet=None, scheduler=None)  # fmt: skip
    with torch.no_grad():
        prompt_embeds, _, pooled, _ = pipe.encode_prompt("a cat", do_classifier_free_guidance=False)
        ids = tok("a cat", padding="max_length", max_length=77, return_tensors="pt").input_ids
        text_embeds = te2(ids).text_embeds
    assert tuple(prompt_embeds.shape) == (1, 77, 16 + 24)
    torch.testing.assert_close(pooled, text_embeds)


def test_flux_conditions_on_t5_tokens_and_clips_pooled_vector(tmp_path):
    """`FluxPipeline.encode_prompt` returns `prompt_embeds` of `max_sequence_length` T5 tokens at T5's width, and `pooled_prompt_embeds` equal to the CLIP text encoder's `pooler_output`, `hidden_size` wide."""
    from diffusers import FluxPipeline
    from transformers import CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(0)
    clip = CLIPTextModel(_clip_config(16)).eval()
    t5 = T5EncoderModel(T5Config(vocab_size=64, d_model=64, d_kv=16, d_ff=64, num_layers=1,
                                 num_heads=4)).eval()  # fmt: skip
    tok = tiny_tokenizer(tmp_path)
    pipe = FluxPipeline(scheduler=None, vae=None, text_encoder=clip, tokenizer=tok,
                        text_encoder_2=t5, tokenizer_2=tok, transformer=None)  # fmt: skip
    with torch.no_grad():
        prompt_embeds, pooled, _ = pipe.encode_prompt("a cat", "a cat", max_sequence_length=20)
        ids = tok("a cat", padding="max_length", max_length=77, return_tensors="pt").input_ids
        pooler_output = clip(ids).pooler_output
    assert tuple(prompt_embeds.shape) == (1, 20, 64)
    torch.testing.assert_close(pooled, pooler_output)


def test_the_labs_config_values_match_the_sourced_model_configs(lab):
    """The config values the lab's checker reads (latent channels, text widths, pooled widths, `scaling_factor`, `shift_factor`) equal those of the configs the model-size tests instantiate (`tests/verify/model_configs.py`, each traced to its upstream source)."""
    mc = pytest.importorskip("model_configs")
    sources = {
        ("sd15", "unet"): mc.SD15_UNET, ("sdxl", "unet"): mc.SDXL_UNET,
        ("sd15", "vae"): mc.SD15_VAE, ("sdxl", "vae"): mc.SDXL_VAE,
        ("sd3", "vae"): mc.SD3_VAE, ("flux", "vae"): mc.FLUX_VAE,
        ("sd3", "transformer"): mc.SD3_MEDIUM_TRANSFORMER,
        ("flux", "transformer"): mc.FLUX_DEV_TRANSFORMER,
        ("sd15", "text_encoder"): mc.CLIP_L_TEXT, ("sdxl", "text_encoder_2"): mc.CLIP_BIGG_TEXT,
        ("sd3", "text_encoder_3"): mc.T5_XXL, ("flux", "text_encoder_2"): mc.T5_XXL,
    }  # fmt: skip
    checked = 0
    for (family, component), source in sources.items():
        for key, value in lab["CONFIGS"][family][component].items():
            if key in source and not key.startswith("_") and key != "architectures":
                assert source[key] == value, (family, component, key)
                checked += 1
    assert checked >= 20
