"""The image-to-image and inpainting section against diffusers 0.42.1, on the CPU.

The pipeline call paths (timesteps run, add_noise, blending, the 9-channel UNet's input,
padding_mask_crop, Kontext's sequence) are run in Lab 20's module,
``test_page_lab_20.py``. These tests read the pipelines' signatures, call their
``get_timesteps`` on real schedulers, and run a tiny ``FluxImg2ImgPipeline``.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch


def test_default_strengths():
    """The default `strength` is 0.8 in `StableDiffusionImg2ImgPipeline`, 1.0 in `StableDiffusionInpaintPipeline`, 0.3 in `StableDiffusionXLImg2ImgPipeline`, 0.9999 in `StableDiffusionXLInpaintPipeline` and 0.6 in `FluxImg2ImgPipeline` and `FluxInpaintPipeline`; `FluxKontextPipeline` has no `strength`."""
    import diffusers

    expected = dict(StableDiffusionImg2ImgPipeline=0.8, StableDiffusionInpaintPipeline=1.0,
                    StableDiffusionXLImg2ImgPipeline=0.3, StableDiffusionXLInpaintPipeline=0.9999,
                    FluxImg2ImgPipeline=0.6, FluxInpaintPipeline=0.6)  # fmt: skip
    for name, strength in expected.items():
        params = inspect.signature(getattr(diffusers, name).__call__).parameters
        assert params["strength"].default == strength, name
    assert "strength" not in inspect.signature(diffusers.FluxKontextPipeline.__call__).parameters


def test_sd_floors_the_steps_run_and_flux_rounds_them_up():
    """SD's `get_timesteps` runs `int(num_inference_steps * strength)` steps (strength 0.35 of 10: 3), Flux's skips `int(num_inference_steps - num_inference_steps * strength)` and so runs 4. Flux's `strength` counts steps, not noise: at 1024 px (4,096 image tokens, `mu` 1.15) the shifted grid's first sigma run at strength 0.6 of 10 steps is 0.83, not 0.6."""
    from diffusers import (
        DDIMScheduler,
        FlowMatchEulerDiscreteScheduler,
        FluxImg2ImgPipeline,
        StableDiffusionImg2ImgPipeline,
    )
    from tiny import SD_SCHEDULER

    sd = SimpleNamespace(scheduler=DDIMScheduler(**SD_SCHEDULER))
    sd.scheduler.set_timesteps(10)
    timesteps, n = StableDiffusionImg2ImgPipeline.get_timesteps(sd, 10, 0.35, "cpu")
    assert n == len(timesteps) == 3
    flux = SimpleNamespace(scheduler=FlowMatchEulerDiscreteScheduler())
    flux.scheduler.set_timesteps(10)
    timesteps, n = FluxImg2ImgPipeline.get_timesteps(flux, 10, 0.35, "cpu")
    assert n == len(timesteps) == 4

    import numpy as np
    from diffusers.pipelines.flux.pipeline_flux_img2img import calculate_shift

    mu = calculate_shift(4096)  # the pipeline's call with the scheduler's defaults
    assert mu == pytest.approx(1.15)
    flux = SimpleNamespace(scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True))
    flux.scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / 10, 10), mu=mu)  # as the pipeline
    timesteps, n = FluxImg2ImgPipeline.get_timesteps(flux, 10, 0.6, "cpu")
    assert n == 6
    assert float(timesteps[0]) / 1000 == pytest.approx(0.83, abs=5e-3)


def test_flux_img2img_at_strength_one_is_pure_noise(monkeypatch):
    """`FluxImg2ImgPipeline` noises the image with the flow-matching `scheduler.scale_noise(image_latents, timestep, noise)`, `sigma * noise + (1 - sigma) * image_latents`; at `strength=1.0` the first sigma is 1.0, so the starting latents are the noise and the image is ignored."""
    import PIL.Image
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxImg2ImgPipeline
    from tiny import DIT_TEXT, DIT_TOKENS, FLUX_VAE_FACTORS, tiny_dit_vae, tiny_flux_transformer

    pipe = FluxImg2ImgPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),
        vae=tiny_dit_vae(**FLUX_VAE_FACTORS), transformer=tiny_flux_transformer(),
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    seen, original = [], pipe.scheduler.scale_noise

    def spy(sample, timestep, noise=None):
        out = original(sample, timestep, noise)
        seen.append((sample.clone(), noise.clone(), out.clone()))
        return out

    monkeypatch.setattr(pipe.scheduler, "scale_noise", spy)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        pipe(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
             pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g),
             image=PIL.Image.new("RGB", (16, 16), (200, 30, 30)), strength=1.0, height=16,
             width=16, num_inference_steps=2, output_type="latent")  # fmt: skip
    ((image_latents, noise, latents),) = seen
    assert not torch.allclose(image_latents, torch.zeros_like(image_latents))
    assert torch.equal(latents, noise)
    assert pipe.scheduler.sigmas[0] == pytest.approx(1.0)


def test_qwen_image_edit_appends_its_reference_like_kontext():
    """`QwenImageEditPipeline`'s loop has the same two lines as `FluxKontextPipeline`'s: `torch.cat([latents, image_latents], dim=1)` before the transformer and `noise_pred[:, : latents.size(1)]` after it (read from the installed source; Lab 20's module runs Kontext's)."""
    from diffusers import FluxKontextPipeline, QwenImageEditPipeline

    for cls in (QwenImageEditPipeline, FluxKontextPipeline):
        source = inspect.getsource(cls.__call__)
        assert "torch.cat([latents, image_latents], dim=1)" in source
        assert "noise_pred[:, : latents.size(1)]" in source
