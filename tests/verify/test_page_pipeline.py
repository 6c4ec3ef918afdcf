"""Handbook "Diffusers pipeline anatomy" against the real DiffusionPipeline machinery.

Tiny random-config components (``tiny.py``), saved and loaded from local temporary
folders; no weights, no hub. The page also lists the claims of Lab 06's module
(``test_page_lab_06.py``): the model_index.json contents, the four families' components,
scheduler swapping, the must-match boundaries and the shapes.
"""

from __future__ import annotations

import json

import pytest
import torch
from tiny import (
    HEIGHT,
    WIDTH,
    embeds,
    start_latents,
    tiny_sd_pipeline,
    tiny_text_encoder,
    tiny_tokenizer,
)


@pytest.fixture(autouse=True)
def quiet_diffusers():
    from diffusers.utils import logging as dlogging

    level = dlogging.get_verbosity()
    dlogging.set_verbosity_error()
    dlogging.disable_progress_bar()
    yield
    dlogging.set_verbosity(level)
    dlogging.enable_progress_bar()


@pytest.fixture
def pipe(tmp_path):
    return tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer(tmp_path))


def test_register_modules_records_library_and_class_in_the_config(pipe):
    """`__init__` calls `register_modules`, which stores each component as an attribute and records a `(library, class)` pair for it in `pipe.config`: the dict `save_pretrained` writes as `model_index.json`."""
    assert pipe.config["unet"] == ("diffusers", "UNet2DConditionModel")
    assert pipe.config["text_encoder"] == ("transformers", "CLIPTextModel")
    assert pipe.config["safety_checker"] == (None, None)
    assert pipe.unet is pipe.components["unet"]
    assert set(pipe.components) == {
        "vae", "text_encoder", "tokenizer", "unet", "scheduler", "safety_checker",
        "feature_extractor", "image_encoder",
    }  # fmt: skip


def test_assigning_a_component_updates_the_model_index(pipe, tmp_path):
    """Assigning `pipe.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)` updates `pipe.config.scheduler`, so `save_pretrained` writes the new class into `model_index.json`."""
    from diffusers import EulerDiscreteScheduler

    pipe.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    assert pipe.config["scheduler"] == ("diffusers", "EulerDiscreteScheduler")
    pipe.save_pretrained(tmp_path / "saved")
    index = json.loads((tmp_path / "saved" / "model_index.json").read_text(encoding="utf-8"))
    assert index["scheduler"] == ["diffusers", "EulerDiscreteScheduler"]
    config = json.loads(
        (tmp_path / "saved" / "scheduler" / "scheduler_config.json").read_text(encoding="utf-8")
    )
    assert config["_class_name"] == "EulerDiscreteScheduler"


def test_from_pretrained_takes_component_overrides(pipe, tmp_path):
    """`from_pretrained(folder, scheduler=...)` uses the component passed in instead of loading that subfolder; the other components still load from the folder."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline

    pipe.save_pretrained(tmp_path / "saved")
    euler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    loaded = StableDiffusionPipeline.from_pretrained(tmp_path / "saved", scheduler=euler)
    assert loaded.scheduler is euler
    assert type(loaded.unet).__name__ == "UNet2DConditionModel"


def test_components_build_a_second_pipeline_sharing_the_modules(pipe):
    """`StableDiffusionImg2ImgPipeline(**pipe.components)` builds a second pipeline around the very same module objects: no weights are copied or reloaded."""
    from diffusers import StableDiffusionImg2ImgPipeline

    img2img = StableDiffusionImg2ImgPipeline(**pipe.components)
    assert img2img.unet is pipe.unet and img2img.vae is pipe.vae
    assert img2img.text_encoder is pipe.text_encoder


def test_to_dtype_casts_every_module_and_the_pipeline_runs(pipe):
    """`pipe.to(torch.float64)` casts every `torch.nn.Module` component (UNet, VAE, text encoder); `pipe.dtype` follows, and `__call__` runs with `latents` in that dtype."""
    pipe.to(torch.float64)
    for module in (pipe.unet, pipe.vae, pipe.text_encoder):
        assert next(module.parameters()).dtype == torch.float64
    assert pipe.dtype == torch.float64 and pipe.device == torch.device("cpu")
    out = pipe(
        prompt_embeds=embeds(1).double(), num_inference_steps=2, guidance_scale=1.0,
        height=HEIGHT, width=WIDTH, latents=start_latents().double(), output_type="latent",
    ).images  # fmt: skip
    assert out.dtype == torch.float64


@pytest.mark.parametrize(
    "cls_name, sequence",
    [
        ("StableDiffusionPipeline", "text_encoder->image_encoder->unet->vae"),
        ("StableDiffusionXLPipeline", "text_encoder->text_encoder_2->image_encoder->unet->vae"),
        (
            "StableDiffusion3Pipeline",
            "text_encoder->text_encoder_2->text_encoder_3->image_encoder->transformer->vae",
        ),
        ("FluxPipeline", "text_encoder->text_encoder_2->image_encoder->transformer->vae"),
    ],
)
def test_model_cpu_offload_seq_is_the_call_order(cls_name, sequence):
    """Each pipeline's `model_cpu_offload_seq` lists its models in the order `__call__` uses them: text encoders, then the denoiser, then the VAE."""
    import diffusers

    assert getattr(diffusers, cls_name).model_cpu_offload_seq == sequence


def test_the_pipeline_never_holds_tensors_between_calls(pipe):
    """Two calls with the same `latents` and `prompt_embeds` give identical results: the pipeline keeps its components, not the previous call's state."""
    kwargs = dict(prompt_embeds=embeds(1), num_inference_steps=3, guidance_scale=3.0,
                  height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
    first = pipe(latents=start_latents(), **kwargs).images
    second = pipe(latents=start_latents(), **kwargs).images
    assert torch.equal(first, second)


def test_a_wrong_scaling_factor_decodes_without_an_error(pipe):
    """A VAE whose `scaling_factor` differs from the one the denoiser was trained with decodes without an error: `vae.decode` receives `latents` at a different scale and returns a different image."""
    kwargs = dict(prompt_embeds=embeds(1), num_inference_steps=2, guidance_scale=1.0,
                  height=HEIGHT, width=WIDTH, output_type="np")  # fmt: skip
    right = pipe(latents=start_latents(), **kwargs).images
    pipe.vae.register_to_config(scaling_factor=1.0)
    wrong = pipe(latents=start_latents(), **kwargs).images
    assert right.shape == wrong.shape and not (right == wrong).all()


def test_prompt_embeds_can_be_passed_instead_of_a_prompt():
    """`StableDiffusionPipeline`, `StableDiffusionXLPipeline`, `StableDiffusion3Pipeline` and `FluxPipeline` all accept `prompt_embeds` in `__call__`, so the text encoders need not be present during the loop."""
    import inspect

    import diffusers

    for name in ["StableDiffusionPipeline", "StableDiffusionXLPipeline",
                 "StableDiffusion3Pipeline", "FluxPipeline"]:  # fmt: skip
        params = inspect.signature(getattr(diffusers, name).__call__).parameters
        assert "prompt_embeds" in params, name
    pipe = tiny_sd_pipeline()  # text_encoder=None, tokenizer=None
    assert pipe.text_encoder is None
    pipe(prompt_embeds=embeds(1), num_inference_steps=1, guidance_scale=1.0, height=HEIGHT,
         width=WIDTH, latents=start_latents(), output_type="latent")  # fmt: skip
