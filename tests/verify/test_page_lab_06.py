"""Lab 06 (pipeline components) against the real diffusers pipelines and schedulers.

No weights and no hub: a StableDiffusionPipeline is assembled from tiny random parts
built in code (``tiny.py``, plus a tiny safety checker and image processor here), saved
with ``save_pretrained`` to a temporary folder and loaded back with ``from_pretrained``
from that local folder. The SDXL, SD3 and Flux facts come from the installed classes'
``__init__`` signatures and static methods. The lab's own data structures are read
through the ``run_lab`` fixture, so the page and the library are compared directly.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging

import pytest
import torch
from tiny import (
    EMBED_DIM,
    HEIGHT,
    SD_BETAS,
    WIDTH,
    embeds,
    start_latents,
    tiny_sd_pipeline,
    tiny_text_encoder,
    tiny_tokenizer,
    tiny_unet,
)

LAB06 = "code/lab-06-diffusers-pipeline-components/pipeline_components.py"

#: SD 1.5's scheduler_config.json settings, as the lab writes them
SD15_SCHEDULER_FILE = {
    "_class_name": "PNDMScheduler",
    "num_train_timesteps": 1000,
    **SD_BETAS,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "trained_betas": None,
    "clip_sample": False,
}


@pytest.fixture(autouse=True)
def quiet_diffusers():
    """from_pretrained logs progress bars and an accelerate hint; keep the test log clean."""
    from diffusers.utils import logging as dlogging

    level = dlogging.get_verbosity()
    dlogging.set_verbosity_error()
    dlogging.disable_progress_bar()
    yield
    dlogging.set_verbosity(level)
    dlogging.enable_progress_bar()


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
    """`save_pretrained` of a `StableDiffusionPipeline` built from SD 1.5's component classes writes a `model_index.json` with the lab's keys: `_class_name`, `_diffusers_version`, one `[library, class]` pair per component (`image_encoder` as `[null, null]`) and `requires_safety_checker`."""
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


def test_torch_dtype_casts_the_models_not_the_scheduler(saved):
    """`from_pretrained(folder, torch_dtype=torch.float16)` loads the UNet, VAE, text encoder and safety checker in float16; the scheduler and tokenizer have no weights and are unchanged."""
    from diffusers import StableDiffusionPipeline

    folder, _ = saved
    pipe = StableDiffusionPipeline.from_pretrained(folder, torch_dtype=torch.float16)
    for module in (pipe.unet, pipe.vae, pipe.text_encoder, pipe.safety_checker):
        assert next(module.parameters()).dtype == torch.float16
    assert type(pipe.scheduler).__name__ == "PNDMScheduler"
    assert pipe.dtype == torch.float16


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


# ------------------------------------------------------------------ scheduler swapping


def test_the_labs_scheduler_defaults_are_the_init_defaults(lab):
    """The lab's table of `__init__` defaults for `PNDMScheduler`, `DDIMScheduler`, `EulerDiscreteScheduler` and `FlowMatchEulerDiscreteScheduler` is exactly their signatures' keys and defaults."""
    import diffusers

    for name, defaults in lab["SCHEDULER_INIT"].items():
        params = inspect.signature(getattr(diffusers, name).__init__).parameters
        real = {k: p.default for k, p in params.items() if k != "self"}
        assert real == defaults, name


def test_compatibles_lists_the_shared_config_schedulers(lab):
    """`DDIMScheduler._compatibles` lists the 15 `KarrasDiffusionSchedulers` (`EulerDiscreteScheduler`, `DPMSolverMultistepScheduler`, `PNDMScheduler`...), `EulerDiscreteScheduler` has the same list, and `FlowMatchEulerDiscreteScheduler._compatibles` is empty: its `compatibles` property lists only itself."""
    from diffusers import DDIMScheduler, EulerDiscreteScheduler, FlowMatchEulerDiscreteScheduler

    assert DDIMScheduler._compatibles == lab["KARRAS_COMPATIBLES"]
    assert len(DDIMScheduler._compatibles) == 15
    assert "EulerDiscreteScheduler" in DDIMScheduler._compatibles
    assert EulerDiscreteScheduler._compatibles == DDIMScheduler._compatibles
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
    """`FlowMatchEulerDiscreteScheduler.from_config` on a DDPM-style config keeps only `num_train_timesteps`: the betas, `beta_schedule` and `prediction_type` are not `__init__` arguments and change nothing."""
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
    """The lab's checker, given the real configs of the tiny pipeline's UNet, VAE, text encoder and scheduler, reports every boundary as matching, and that pipeline runs."""
    pipe = tiny_sd_pipeline(text_encoder=tiny_text_encoder())
    components = _configs(pipe.unet, pipe.vae, pipe.text_encoder, pipe.scheduler)
    assert _failed(lab, components) == []
    pipe(prompt_embeds=embeds(1), num_inference_steps=2, guidance_scale=1.0, height=HEIGHT,
         width=WIDTH, latents=start_latents(), output_type="latent")  # fmt: skip


def test_latent_channel_mismatch_fails_at_the_first_unet_call(lab):
    """A UNet with `in_channels=4` fails at its first forward pass on the 16-channel `latents` of a VAE with `latent_channels=16`; `from_pretrained` and `__init__` do not check, and the lab's checker flags "latent channels" from the configs alone."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae16 = AutoencoderKL(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                          up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=16,
                          sample_size=HEIGHT)  # fmt: skip
    pipe = tiny_sd_pipeline(vae=vae16, text_encoder=tiny_text_encoder())  # no error here
    components = _configs(pipe.unet, pipe.vae, pipe.text_encoder, pipe.scheduler)
    assert _failed(lab, components) == ["latent channels"]
    latents = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError):
        pipe.unet(latents, 10, encoder_hidden_states=embeds(1))


def test_text_width_mismatch_fails_in_cross_attention(lab, tmp_path):
    """A UNet with `cross_attention_dim=32` fails in cross-attention on `prompt_embeds` from a 48-wide text encoder; the lab's checker flags "text width" from the configs alone."""
    unet, encoder = tiny_unet(), tiny_text_encoder(hidden_size=48)
    assert unet.config.cross_attention_dim == EMBED_DIM == 32
    pipe = tiny_sd_pipeline(text_encoder=encoder, tokenizer=tiny_tokenizer(tmp_path))
    components = _configs(pipe.unet, pipe.vae, pipe.text_encoder, pipe.scheduler)
    assert _failed(lab, components) == ["text width"]
    with pytest.raises(RuntimeError):
        pipe(prompt="a cat", num_inference_steps=1, guidance_scale=1.0, height=HEIGHT,
             width=WIDTH, output_type="latent")  # fmt: skip


def test_prediction_type_mismatch_runs_without_an_error(lab):
    """A scheduler with `prediction_type="epsilon"` on a checkpoint trained for `v_prediction` raises nothing: the pipeline runs and returns different `latents`; only the lab's checker flags "prediction_type"."""
    from diffusers import DDIMScheduler

    shipped = DDIMScheduler(prediction_type="v_prediction", set_alpha_to_one=False, **SD_BETAS)
    wrong = DDIMScheduler(prediction_type="epsilon", set_alpha_to_one=False, **SD_BETAS)
    results = []
    for scheduler in (shipped, wrong):
        pipe = tiny_sd_pipeline(scheduler=scheduler, text_encoder=tiny_text_encoder())
        results.append(pipe(prompt_embeds=embeds(1), num_inference_steps=3, guidance_scale=1.0,
                            height=HEIGHT, width=WIDTH, latents=start_latents(),
                            output_type="latent").images)  # fmt: skip
    assert not torch.allclose(results[0], results[1])
    components = _configs(pipe.unet, pipe.vae, pipe.text_encoder, wrong)
    shipped_config = {**dict(shipped.config), "_class_name": "DDIMScheduler"}
    assert _failed(lab, components, shipped_config) == ["prediction_type"]


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


def test_flux_packs_2x2_latent_patches_into_tokens(lab):
    """`FluxPipeline._pack_latents` turns `latents` `(B, 16, 128, 128)` into `(B, 4096, 64)`: each 2x2 patch becomes one token of `4 * 16` channels, the lab's "packed latents"."""
    from diffusers import FluxPipeline

    latents = torch.zeros(1, 16, 128, 128)
    packed = FluxPipeline._pack_latents(latents, 1, 16, 128, 128)
    assert tuple(packed.shape) == (1, 4096, 64)
    assert lab["boundary_shapes"]("flux")[6] == ("packed latents", "(B, 4096, 64)")
    assert lab["CONFIGS"]["flux"]["transformer"]["in_channels"] == 64


def test_sequence_lengths_and_decode_shift(lab):
    """`StableDiffusion3Pipeline.__call__` defaults to `max_sequence_length=256` T5 tokens and `FluxPipeline.__call__` to 512; both decode `latents / vae.config.scaling_factor + vae.config.shift_factor` (read from their source)."""
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    for cls, length in [(StableDiffusion3Pipeline, 256), (FluxPipeline, 512)]:
        params = inspect.signature(cls.__call__).parameters
        assert params["max_sequence_length"].default == length
        source = inspect.getsource(cls.__call__)
        assert "(latents / self.vae.config.scaling_factor) + self.vae.config.shift_factor" in source
    shapes = dict(lab["boundary_shapes"]("sd3"))
    assert shapes["prompt_embeds"] == "(B, 77+256=333, 4096)"
    assert dict(lab["boundary_shapes"]("flux"))["prompt_embeds"] == "(B, 512, 4096)"


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
