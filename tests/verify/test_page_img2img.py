"""The image-to-image and inpainting section against diffusers 0.42.1, on the CPU.

The pipeline call paths (timesteps run, add_noise, blending, the 9-channel UNet's input,
padding_mask_crop, Kontext's sequence) are run in Lab 20's module,
``test_page_lab_20.py``. These tests spy on the ``strength`` each pipeline's ``__call__``
passes to ``get_timesteps``, call SD 1.5's, SD3's and Flux's ``get_timesteps`` on real schedulers, and
run tiny ``StableDiffusionImg2ImgPipeline`` (DDIM, PNDM, zero-terminal-SNR DDIM),
``StableDiffusionXLInpaintPipeline``, ``FluxImg2ImgPipeline``, ``FluxFillPipeline`` and
``QwenImageEditPipeline`` calls (built offline: no hub, no weights).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch


def test_default_strengths(monkeypatch):
    """The default `strength` is 0.8 in `StableDiffusionImg2ImgPipeline`, 1.0 in `StableDiffusionInpaintPipeline`, 0.3 in `StableDiffusionXLImg2ImgPipeline`, 0.9999 in `StableDiffusionXLInpaintPipeline` and 0.6 in `FluxImg2ImgPipeline` and `FluxInpaintPipeline`; `FluxKontextPipeline.__call__` takes no `strength`."""
    import diffusers
    import PIL.Image
    from diffusers import FlowMatchEulerDiscreteScheduler
    from tiny import (
        DIT_TEXT,
        DIT_TOKENS,
        FLUX_VAE_FACTORS,
        POOLED_DIM,
        embeds,
        pil_image_and_mask,
        tiny_dit_vae,
        tiny_flux_transformer,
        tiny_sd_variant,
        tiny_sdxl_pipeline,
    )

    class StopError(Exception):
        pass

    def strength_passed(pipe, **call):
        """The `strength` a call without one hands to `get_timesteps` (the run stops there)."""
        seen = []

        def spy(*args, **kwargs):
            seen.append(kwargs["strength"] if "strength" in kwargs else args[1])
            raise StopError

        monkeypatch.setattr(pipe, "get_timesteps", spy)
        with pytest.raises(StopError), torch.no_grad():
            pipe(num_inference_steps=10, output_type="latent", **call)
        return seen[0]

    image, mask_image = pil_image_and_mask()
    sd = dict(prompt_embeds=embeds(0), guidance_scale=1.0, image=image)
    xl_parts = tiny_sdxl_pipeline().components
    pooled = torch.randn(1, POOLED_DIM, generator=torch.Generator().manual_seed(2))
    xl = dict(sd, pooled_prompt_embeds=pooled)
    g = torch.Generator().manual_seed(0)
    flux = dict(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
                pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g),
                image=PIL.Image.new("RGB", (16, 16), (200, 30, 30)), height=16, width=16)  # fmt: skip

    def flux_pipe(name):
        return getattr(diffusers, name)(
            scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),
            vae=tiny_dit_vae(**FLUX_VAE_FACTORS), transformer=tiny_flux_transformer(),
            text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
        )  # fmt: skip

    runs = {
        "StableDiffusionImg2ImgPipeline": (tiny_sd_variant("StableDiffusionImg2ImgPipeline"), sd),
        "StableDiffusionInpaintPipeline": (
            tiny_sd_variant("StableDiffusionInpaintPipeline"),
            dict(sd, mask_image=mask_image),
        ),
        "StableDiffusionXLImg2ImgPipeline": (
            diffusers.StableDiffusionXLImg2ImgPipeline(**xl_parts),
            xl,
        ),
        "StableDiffusionXLInpaintPipeline": (
            diffusers.StableDiffusionXLInpaintPipeline(**xl_parts),
            dict(xl, mask_image=mask_image),
        ),
        "FluxImg2ImgPipeline": (flux_pipe("FluxImg2ImgPipeline"), flux),
        "FluxInpaintPipeline": (
            flux_pipe("FluxInpaintPipeline"),
            dict(flux, mask_image=mask_image),
        ),
    }
    expected = dict(StableDiffusionImg2ImgPipeline=0.8, StableDiffusionInpaintPipeline=1.0,
                    StableDiffusionXLImg2ImgPipeline=0.3, StableDiffusionXLInpaintPipeline=0.9999,
                    FluxImg2ImgPipeline=0.6, FluxInpaintPipeline=0.6)  # fmt: skip
    assert {name: strength_passed(pipe, **call) for name, (pipe, call) in runs.items()} == expected
    kontext = flux_pipe("FluxKontextPipeline")  # a call with `strength` is refused
    with pytest.raises(TypeError, match="unexpected keyword argument 'strength'"):
        kontext(strength=0.5, num_inference_steps=1, output_type="latent", **flux)


def test_sd_floors_the_steps_run_and_flux_rounds_them_up():
    """`StableDiffusionImg2ImgPipeline.get_timesteps` with DDIM runs `int(num_inference_steps * strength)` steps (strength 0.35 of 10: 3), `FluxImg2ImgPipeline.get_timesteps` skips `int(num_inference_steps - num_inference_steps * strength)` and so runs 4."""
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


def test_floating_point_strength_floors_below_the_whole_number(record_calls):
    """`strength=0.29` of 100 steps runs 28 UNet calls through `StableDiffusionImg2ImgPipeline` with DDIM (29 with SD 1.5's shipped `PNDMScheduler`, whose grid has one entry more) and 29 transformer calls through `FluxImg2ImgPipeline`: `100 * 0.29` is `28.999999999999996`, which SD's `int(num_inference_steps * strength)` floors to 28, while Flux skips `int(100 - 28.999999999999996)`, 71 steps."""
    import PIL.Image
    from diffusers import (
        DDIMScheduler,
        FluxImg2ImgPipeline,
        PNDMScheduler,
    )
    from tiny import (
        DIT_TEXT,
        DIT_TOKENS,
        SD15_PNDM,
        embeds,
        pil_image_and_mask,
        tiny_flux_family,
        tiny_sd_variant,
    )

    assert 100 * 0.29 == 28.999999999999996
    sd = tiny_sd_variant("StableDiffusionImg2ImgPipeline")
    assert isinstance(sd.scheduler, DDIMScheduler)
    pndm = type(sd)(**{**sd.components, "scheduler": PNDMScheduler(**SD15_PNDM)}, requires_safety_checker=False)  # fmt: skip
    pndm.set_progress_bar_config(disable=True)
    unet_calls, sd_counts = record_calls(sd.unet), []  # one UNet, shared by both pipelines
    for pipe in (sd, pndm):
        with torch.no_grad():
            pipe(prompt_embeds=embeds(0), guidance_scale=1.0, num_inference_steps=100, strength=0.29,
                 image=pil_image_and_mask()[0], output_type="latent")  # fmt: skip
        sd_counts.append(len(unet_calls.calls))
        unet_calls.calls.clear()
    flux = tiny_flux_family(FluxImg2ImgPipeline)
    flux_calls = record_calls(flux.transformer)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        flux(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
             pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g),
             image=PIL.Image.new("RGB", (16, 16), (200, 30, 30)), strength=0.29, height=16,
             width=16, num_inference_steps=100, output_type="latent")  # fmt: skip
    assert (*sd_counts, len(flux_calls.calls)) == (28, 29, 29)  # DDIM, PNDM, Flux


def test_flux_strength_counts_steps_not_noise_at_1024px(monkeypatch, record_calls):
    """Run through `FluxImg2ImgPipeline.__call__` with 4,096 image tokens (FLUX.1 at 1024 px; here a tiny VAE at 256 px gives the same token grid) and FLUX.1-dev's resolution-shifted scheduler (`use_dynamic_shifting=True`): `mu` is 1.15, the shifted grid's first sigma run at strength 0.6 of 10 steps is 0.83, not 0.6, and 6 transformer calls run. An unshifted scheduler (`use_dynamic_shifting=False`, `shift=1.0`, as FLUX.1-schnell samples) ignores `mu` and starts at 0.6."""
    import PIL.Image
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxImg2ImgPipeline
    from tiny import DIT_TEXT, DIT_TOKENS, tiny_flux_family

    pipe = tiny_flux_family(FluxImg2ImgPipeline)
    mus, starts = [], []
    set_timesteps, scale_noise = pipe.scheduler.set_timesteps, pipe.scheduler.scale_noise

    @functools.wraps(set_timesteps)  # the pipeline inspects its signature for `sigmas`
    def spy_set(*args, **kwargs):
        mus.append(kwargs.get("mu"))
        return set_timesteps(*args, **kwargs)

    def spy_scale(sample, timestep, noise=None):
        starts.append(float(timestep.flatten()[0]))
        return scale_noise(sample, timestep, noise)

    monkeypatch.setattr(pipe.scheduler, "set_timesteps", spy_set)
    monkeypatch.setattr(pipe.scheduler, "scale_noise", spy_scale)
    calls = record_calls(pipe.transformer)
    g = torch.Generator().manual_seed(0)
    size = 2 * pipe.vae_scale_factor * 64  # 64 x 64 packed tokens
    with torch.no_grad():
        pipe(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
             pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g),
             image=PIL.Image.new("RGB", (size, size), (200, 30, 30)), strength=0.6,
             height=size, width=size, num_inference_steps=10, output_type="latent")  # fmt: skip
    assert calls.calls[0][1]["hidden_states"].shape[1] == 4096
    assert mus == [pytest.approx(1.15)]
    assert [s / 1000 for s in starts] == [pytest.approx(0.83, abs=5e-3)]
    assert len(calls.calls) == 6

    class StopError(Exception):  # the unshifted run stops once its start sigma is known
        pass

    def stop(sample, timestep, noise=None):
        starts.append(float(timestep.flatten()[0]))
        raise StopError

    unshifted = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=False, shift=1.0)
    pipe = FluxImg2ImgPipeline(**{**pipe.components, "scheduler": unshifted})
    pipe.set_progress_bar_config(disable=True)
    monkeypatch.setattr(pipe.scheduler, "scale_noise", stop)
    starts.clear()
    with pytest.raises(StopError), torch.no_grad():
        pipe(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
             pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g),
             image=PIL.Image.new("RGB", (size, size), (200, 30, 30)), strength=0.6,
             height=size, width=size, num_inference_steps=10, output_type="latent")  # fmt: skip
    assert [s / 1000 for s in starts] == [pytest.approx(0.6)]


@pytest.mark.parametrize("strength", [1.0, 0.5])
def test_pndm_img2img_drops_the_repeat_plms_expects(monkeypatch, record_calls, strength):
    """`StableDiffusionImg2ImgPipeline` with SD 1.5's shipped `PNDMScheduler` config, 50 steps: each call's `_get_prev_sample(sample, timestep, prev_timestep, ...)` is recorded beside the UNet's `t`. At strength 1.0 the grid starts 981, 961, 961 and from the second call on each call is told the timestep the previous step produced. At strength 0.5 the slice starts at 501 and holds no repeat; PLMS's warm-up still redoes its first step (501 to 481) on the second call, the third call is told t=461 for latents the second step produced for 481, and the later steps follow on from 461: the run denoises 20 timesteps fewer than its labels cover."""
    from diffusers import PNDMScheduler
    from tiny import SD15_PNDM, embeds, pil_image_and_mask, tiny_sd_variant

    base = tiny_sd_variant("StableDiffusionImg2ImgPipeline")
    pipe = type(base)(**{**base.components, "scheduler": PNDMScheduler(**SD15_PNDM)})
    pipe.set_progress_bar_config(disable=True)
    steps, original = [], pipe.scheduler._get_prev_sample

    def spy(sample, timestep, prev_timestep, model_output):
        steps.append((int(timestep), int(prev_timestep)))
        return original(sample, timestep, prev_timestep, model_output)

    monkeypatch.setattr(pipe.scheduler, "_get_prev_sample", spy)
    calls = record_calls(pipe.unet)
    with torch.no_grad():
        pipe(prompt_embeds=embeds(0), guidance_scale=1.0, num_inference_steps=50,
             strength=strength, image=pil_image_and_mask()[0],
             generator=torch.Generator().manual_seed(0), output_type="latent")  # fmt: skip
    told = [int(c[0][1]) for c in calls.calls]
    produced = [prev for _, prev in steps]
    assert [t for t, _ in steps[2:]] == told[2:]  # the step works from the timestep the UNet got
    if strength == 1.0:
        assert told[:3] == [981, 961, 961] and len(told) == 51
        assert told[1:] == produced[:-1]
    else:
        assert told[:3] == [501, 481, 461] and len(told) == 26
        assert steps[:2] == [(501, 481), (501, 481)]  # the warm-up's redo of the first step
        assert (produced[1], told[2]) == (481, 461)  # 20 timesteps no step denoises
        assert told[3:] == produced[2:-1]  # later steps follow on from 461


def test_flux_img2img_at_strength_one_is_pure_noise():
    """`FluxImg2ImgPipeline` noises the image with the flow-matching `scheduler.scale_noise(image_latents, timestep, noise)`, `sigma * noise + (1 - sigma) * image_latents`; at `strength=1.0` the first sigma is 1.0, so the starting latents are the noise and the image is ignored."""
    from tiny import flux_img2img_scale_noise_calls

    pipe, seen = flux_img2img_scale_noise_calls(strength=1.0)
    ((image_latents, noise, latents),) = seen
    assert not torch.allclose(image_latents, torch.zeros_like(image_latents))
    assert torch.equal(latents, noise)
    assert pipe.scheduler.sigmas[0] == pytest.approx(1.0)


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_zero_terminal_snr_img2img_at_strength_one_needs_v_prediction(monkeypatch, record_calls, prediction_type):  # fmt: skip
    """`StableDiffusionImg2ImgPipeline` with a zero-terminal-SNR `DDIMScheduler` (SD 1.5's betas, `rescale_betas_zero_snr=True`, `timestep_spacing="trailing"`) at `strength=1.0` of 50 steps noises the encoded image to t=999, where `alpha_bar` is 0: `add_noise` returns exactly the noise, and the UNet's first call gets it. With `prediction_type="epsilon"` (SD 1.5's) DDIM's first step divides by `sqrt(alpha_bar)` = 0 and the output is all NaN, latents and decoded pixels alike; with `"v_prediction"` it is finite."""
    from diffusers import DDIMScheduler
    from tiny import SD_SCHEDULER, embeds, pil_image_and_mask, tiny_sd_variant

    base = tiny_sd_variant("StableDiffusionImg2ImgPipeline")
    scheduler = DDIMScheduler(**SD_SCHEDULER, rescale_betas_zero_snr=True, timestep_spacing="trailing",
                              prediction_type=prediction_type)  # fmt: skip
    pipe = type(base)(**{**base.components, "scheduler": scheduler}, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    seen, steps = [], []
    original_add_noise, original_step = pipe.scheduler.add_noise, pipe.scheduler.step

    def spy(original_samples, noise, timesteps):
        out = original_add_noise(original_samples, noise, timesteps)
        seen.append((original_samples.clone(), noise.clone(), timesteps.clone(), out.clone()))
        return out

    def spy_step(model_output, timestep, sample, *args, **kwargs):
        out = original_step(model_output, timestep, sample, *args, **kwargs)
        steps.append((int(timestep), out[0].clone()))
        return out

    monkeypatch.setattr(pipe.scheduler, "add_noise", spy)
    monkeypatch.setattr(pipe.scheduler, "step", spy_step)
    calls = record_calls(pipe.unet)
    outputs = {}
    for output_type in ("latent", "np"):
        seen.clear(), steps.clear(), calls.calls.clear()
        with torch.no_grad():
            outputs[output_type] = torch.as_tensor(
                pipe(prompt_embeds=embeds(0), guidance_scale=1.0, num_inference_steps=50, strength=1.0,
                     image=pil_image_and_mask()[0], generator=torch.Generator().manual_seed(0),
                     output_type=output_type).images
            )  # fmt: skip
        ((init_latents, noise, timestep, latents),) = seen
        assert timestep.tolist() == [999] and float(pipe.scheduler.alphas_cumprod[999]) == 0.0
        assert init_latents.abs().mean() > 0.1  # an image went in
        assert torch.equal(latents, noise)
        assert len(calls.calls) == 50 and torch.equal(calls.calls[0][0][0], noise)
        assert steps[0][0] == 999 and torch.isfinite(noise).all()
        first_step_finite = bool(torch.isfinite(steps[0][1]).all())
        assert first_step_finite == (prediction_type == "v_prediction")
    for out in outputs.values():
        if prediction_type == "epsilon":
            assert torch.isnan(out).all()
        else:
            assert torch.isfinite(out).all()


def test_flux_fill_packs_latents_masked_image_and_pixel_mask_into_384_channels(monkeypatch, record_calls):  # fmt: skip
    """`FluxFillPipeline` (FLUX.1 Fill) calls its transformer on `torch.cat((latents, masked_image_latents), dim=2)`: with Flux's 8x VAE each packed token carries 64 channels of the step's latents, 64 of the masked image's latents (`image * (1 - mask)` encoded, not noised, the same at every step) and 256 of the pixel mask (8 x 8 pixels per latent position, packed 2 x 2), 384 in all."""
    import diffusers.pipelines.flux.pipeline_flux_fill as module
    import numpy as np
    import PIL.Image
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxFillPipeline
    from tiny import DIT_TEXT, DIT_TOKENS, FLUX_VAE_FACTORS, tiny_dit_vae, tiny_flux_transformer

    vae = tiny_dit_vae(**FLUX_VAE_FACTORS, block_out_channels=(8,) * 4, norm_num_groups=4,
                       down_block_types=("DownEncoderBlock2D",) * 4,
                       up_block_types=("UpDecoderBlock2D",) * 4)  # 8x, 16 channels  # fmt: skip
    pipe = FluxFillPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=vae,
        transformer=tiny_flux_transformer(in_channels=384, out_channels=64),
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    assert pipe.vae_scale_factor == 8
    encoded, encoder_inputs, stepped = [], [], []
    original_retrieve, original_step = module.retrieve_latents, pipe.scheduler.step

    def spy_retrieve(*args, **kwargs):
        out = original_retrieve(*args, **kwargs)
        encoded.append(out.clone())
        return out

    def spy_step(model_output, timestep, sample, **kwargs):
        stepped.append(sample.clone())
        return original_step(model_output, timestep, sample, **kwargs)

    monkeypatch.setattr(module, "retrieve_latents", spy_retrieve)
    monkeypatch.setattr(pipe.scheduler, "step", spy_step)
    hook = vae.encoder.register_forward_pre_hook(lambda m, a: encoder_inputs.append(a[0].clone()))
    calls = record_calls(pipe.transformer)
    size = 32  # 4 x 4 latents, 2 x 2 packed tokens
    m = np.zeros((size, size), np.uint8)
    m[3:20, 17:30] = 255  # a hole that cuts latent cells: the mask part is per pixel
    image = PIL.Image.fromarray(np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8))  # fmt: skip
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        pipe(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
             pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g), image=image,
             mask_image=PIL.Image.fromarray(m), height=size, width=size, num_inference_steps=2,
             generator=torch.Generator().manual_seed(1), output_type="latent")  # fmt: skip
    hook.remove()
    hidden = [kw["hidden_states"] for _, kw in calls.calls]
    assert len(hidden) == 2 and tuple(hidden[0].shape) == (1, 4, 384)
    for h, latents in zip(hidden, stepped, strict=True):
        assert torch.equal(h[..., :64], latents)  # the latents the step then updates
        assert torch.equal(h[..., 64:], hidden[0][..., 64:])  # masked image and mask: fixed
    # the masked image: the image with the hole zeroed, encoded, shifted and scaled, packed
    pixel_mask = torch.tensor(m / 255.0, dtype=torch.float32)  # (32, 32), 1 = repaint
    image_px, masked_px = encoder_inputs
    torch.testing.assert_close(masked_px, image_px * (1 - pixel_mask))
    shift, scale = vae.config.shift_factor, vae.config.scaling_factor
    torch.testing.assert_close(hidden[0][..., 64:128], pipe._pack_latents((encoded[1] - shift) * scale, 1, 16, 4, 4))  # fmt: skip
    # the mask: each latent position's 8 x 8 pixels as 64 channels, then 2 x 2 packing
    cells = pixel_mask.view(1, 4, 8, 4, 8).permute(0, 2, 4, 1, 3).reshape(1, 64, 4, 4)
    assert torch.equal(hidden[0][..., 128:], pipe._pack_latents(cells, 1, 64, 4, 4))
    assert 0 < float(cells[0, :, 0, 2].mean()) < 1  # a cell the hole cuts: no downsampling


@pytest.fixture(scope="module")
def qwen_edit_run(tmp_path_factory):
    """One call of a tiny random `QwenImageEditPipeline` (see :func:`run_qwen_edit`)."""
    return run_qwen_edit(tmp_path_factory)


def run_qwen_edit(tmp_path_factory, **image_processor_kwargs):
    """One call of a tiny random `QwenImageEditPipeline`, built offline, with what it passed.

    The Qwen2Tokenizer is loaded from a byte-level vocab.json (the 256 byte symbols, no
    merges) written to a temporary directory, plus the special tokens the pipeline's prompt
    template uses. The processor's image processor is built from its defaults. torchvision
    is not installed, so transformers does not export `VideoProcessorMixin` and
    `ProcessorMixin.check_argument_for_proper_class` fails for any `video_processor`; the
    check is skipped for `video_processor=None` while the processor is built, and nothing
    else is patched. ``image_processor_kwargs`` go to `Qwen2VLImageProcessorPil`
    (`max_pixels=...`). The reference is 64x32 px (2:1); the output is asked for at 32 px.
    """
    import json

    import PIL.Image
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImageEditPipeline,
        QwenImageTransformer2DModel,
    )
    from tokenizers import AddedToken
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2Tokenizer,
        Qwen2VLImageProcessorPil,
        Qwen2VLProcessor,
    )
    from transformers.processing_utils import ProcessorMixin

    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = [b for b in range(256) if b not in printable]  # GPT-2's bytes_to_unicode
    symbols = [chr(b) for b in printable] + [chr(256 + n) for n in range(len(shifted))]
    directory = tmp_path_factory.mktemp("qwen_tokenizer")
    (directory / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(symbols)}))
    (directory / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = Qwen2Tokenizer(str(directory / "vocab.json"), str(directory / "merges.txt"))
    special = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
               "<|image_pad|>", "<|video_pad|>"]  # fmt: skip
    tokenizer.add_tokens([AddedToken(t, special=True) for t in special])
    ids = dict(zip(special, tokenizer.convert_tokens_to_ids(special), strict=True))

    original_check = ProcessorMixin.check_argument_for_proper_class

    def check(self, name, argument):
        return (
            None
            if name == "video_processor" and argument is None
            else original_check(self, name, argument)
        )

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ProcessorMixin, "check_argument_for_proper_class", check)
        processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessorPil(**image_processor_kwargs), tokenizer=tokenizer,
                                     video_processor=None)  # fmt: skip

    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(0)
    config = Qwen2_5_VLConfig(
        text_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, rope_theta=1e6, vocab_size=len(tokenizer), bos_token_id=eos,
                         eos_token_id=eos, rope_scaling=dict(mrope_section=[1, 1, 2], rope_type="default")),
        vision_config=dict(depth=2, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=16),
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
    )  # fmt: skip
    text_encoder = Qwen2_5_VLForConditionalGeneration(config).eval()
    torch.manual_seed(0)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=64, out_channels=16, num_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=(8, 4, 4),
    ).eval()  # fmt: skip
    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage(
        base_dim=2, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True], latents_mean=[0.0] * 16, latents_std=[1.0] * 16,
    ).eval()  # the real 8x compression and 16 channels  # fmt: skip
    pipe = QwenImageEditPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
        tokenizer=tokenizer, processor=processor, transformer=transformer,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)

    seen = dict(calls=[], outputs=[], steps=[], encoded=[], rope=[], text=[])
    text_encoder.register_forward_pre_hook(
        lambda m, a, kw: seen["text"].append(dict(kw)), with_kwargs=True
    )
    transformer.register_forward_pre_hook(
        lambda m, a, kw: seen["calls"].append(dict(kw)), with_kwargs=True
    )
    transformer.register_forward_hook(lambda m, a, out: seen["outputs"].append(out[0]))
    transformer.pos_embed.register_forward_hook(lambda m, a, out: seen["rope"].append(out[0]))
    vae.encoder.register_forward_pre_hook(lambda m, a: seen["encoded"].append(tuple(a[0].shape)))
    step = pipe.scheduler.step

    def spy(model_output, timestep, sample, **kwargs):
        seen["steps"].append((model_output.clone(), sample.clone()))
        return step(model_output, timestep, sample, **kwargs)

    pipe.scheduler.step = spy
    with torch.no_grad():
        pipe(prompt="make it blue", image=PIL.Image.new("RGB", (64, 32), (200, 30, 30)), height=32,
             width=32, num_inference_steps=2, true_cfg_scale=1.0, output_type="latent",
             generator=torch.Generator().manual_seed(0))  # fmt: skip
    return pipe, seen


def test_qwen_image_edit_appends_its_reference_like_kontext(qwen_edit_run):
    """A tiny `QwenImageEditPipeline` run appends its reference like Kontext: each transformer call gets `torch.cat([latents, image_latents], dim=1)`, N + M tokens (4 + 4,140 here), the reference's tokens the same at every step, and only the first N output tokens reach `scheduler.step` as `noise_pred`."""
    _, seen = qwen_edit_run
    assert len(seen["calls"]) == len(seen["steps"]) == 2
    for call, output, (noise_pred, latents) in zip(
        seen["calls"], seen["outputs"], seen["steps"], strict=True
    ):
        hidden = call["hidden_states"]
        assert tuple(hidden.shape) == (1, 4 + 4140, 64) and tuple(latents.shape) == (1, 4, 64)
        assert torch.equal(hidden[:, :4], latents)
        assert torch.equal(hidden[:, 4:], seen["calls"][0]["hidden_states"][:, 4:])
        assert tuple(output.shape) == (1, 4144, 64)
        assert torch.equal(noise_pred, output[:, :4])


def test_qwen_image_edit_resizes_its_reference_to_1_mp_and_gives_it_frame_1(qwen_edit_run):
    """`QwenImageEditPipeline` resizes the reference to about 1 MP at its aspect ratio, `calculate_dimensions(1024 * 1024, w / h)` rounded to multiples of 32 (a 64x32 image to 1440x736, 4,140 tokens), keeps a requested 32 px output at 32 px (4 tokens), and passes `img_shapes=[[(1, 2, 2), (1, 46, 90)]]`, one (frame, height, width) token grid per image; the transformer's RoPE gives the reference frame index 1, the generated tokens 0."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

    pipe, seen = qwen_edit_run
    assert calculate_dimensions(1024 * 1024, 64 / 32)[:2] == (1440, 736)
    assert seen["encoded"] == [(1, 3, 1, 736, 1440)]
    assert [tuple(latents.shape) for _, latents in seen["steps"]] == [(1, 4, 64)] * 2
    for call in seen["calls"]:
        assert call["img_shapes"] == [[(1, 2, 2), (1, 46, 90)]]
    (freqs, *_) = seen["rope"]
    frame = pipe.transformer.pos_embed.axes_dim[0] // 2  # the first columns: the frame axis
    pos = pipe.transformer.pos_embed.pos_freqs
    assert tuple(freqs.shape) == (4144, sum(pipe.transformer.pos_embed.axes_dim) // 2)
    assert torch.equal(freqs[:4, :frame], pos[0, :frame].expand(4, frame))
    assert torch.equal(freqs[4:, :frame], pos[1, :frame].expand(4140, frame))


def test_qwen_image_edit_reference_also_lengthens_prompt_embeds(qwen_edit_run, tmp_path_factory):
    """`QwenImageEditPipeline` also gives the reference to its text encoder (Qwen2.5-VL) as image tokens, one per 2x2 merge of the processor's 14 px patch grid, which stay in `prompt_embeds` after the template's first `prompt_template_encode_start_idx` tokens are dropped: 1,250 for the 1440x736 reference at the image processor's default `max_pixels` (28 * 28 * 1280, which scales it to 1400x700 px), 1,326 with `max_pixels` above the reference's area (1428x728 px)."""
    from transformers import Qwen2VLImageProcessorPil

    assert Qwen2VLImageProcessorPil().size["longest_edge"] == 28 * 28 * 1280
    counts = []
    for pipe, seen in (qwen_edit_run, run_qwen_edit(tmp_path_factory, max_pixels=2 * 1440 * 736)):
        (text,) = seen["text"]
        image_tokens = int((text["input_ids"] == pipe.text_encoder.config.image_token_id).sum())
        assert image_tokens == int(text["image_grid_thw"].prod()) // 4
        length = seen["calls"][0]["encoder_hidden_states"].shape[1]
        assert length == text["input_ids"].shape[1] - pipe.prompt_template_encode_start_idx
        counts.append((image_tokens, text["image_grid_thw"].tolist()))
    assert counts == [(1250, [[1, 50, 100]]), (1326, [[1, 52, 102]])]


def test_sdxl_inpaint_default_is_not_a_pure_noise_start(monkeypatch):
    """`StableDiffusionXLInpaintPipeline` at its default `strength` (0.9999) does not start from pure noise: `prepare_latents` calls `scheduler.add_noise` on the encoded image's latents."""
    import diffusers
    from tiny import POOLED_DIM, embeds, pil_image_and_mask, tiny_sdxl_pipeline

    from infralens_docs.registry import ROOT

    class StopError(Exception):  # the start latents are known: no UNet call needed
        pass

    pipe = diffusers.StableDiffusionXLInpaintPipeline(**tiny_sdxl_pipeline().components)
    pipe.set_progress_bar_config(disable=True)
    noised = []

    def stop(original_samples, noise, timesteps):
        noised.append(original_samples.clone())
        raise StopError

    monkeypatch.setattr(pipe.scheduler, "add_noise", stop)
    image, mask_image = pil_image_and_mask()
    pooled = torch.randn(1, POOLED_DIM, generator=torch.Generator().manual_seed(2))
    with pytest.raises(StopError), torch.no_grad():
        pipe(prompt_embeds=embeds(0), pooled_prompt_embeds=pooled, guidance_scale=1.0, image=image,
             mask_image=mask_image, num_inference_steps=10, output_type="latent")  # fmt: skip
    assert len(noised) == 1 and noised[0].abs().mean() > 0.1  # the image's latents, noised
    page = " ".join((ROOT / "docs/handbook/img2img.md").read_text(encoding="utf-8").split())
    assert "`StableDiffusionInpaintPipeline` at 1.0, its default (pure noise), Flux's img2img (sigma 1)" in page  # fmt: skip
    assert (
        "the inpaint pipeline at 1.0" not in page and "flow-matching img2img (sigma 1)" not in page
    )


def test_sd15s_get_timesteps_rule_is_not_sd3s():
    """`StableDiffusionImg2ImgPipeline.get_timesteps` (SD 1.5's) skips the first `steps - int(steps * strength)` steps of the grid (DDIM, 0.35 of 10: 7); `StableDiffusion3Img2ImgPipeline.get_timesteps` and `FluxImg2ImgPipeline.get_timesteps` skip `int(steps - steps * strength)`, 6."""
    from diffusers import (
        DDIMScheduler,
        FlowMatchEulerDiscreteScheduler,
        FluxImg2ImgPipeline,
        StableDiffusion3Img2ImgPipeline,
        StableDiffusionImg2ImgPipeline,
    )
    from tiny import SD_SCHEDULER

    from infralens_docs.registry import ROOT

    skipped = []
    for cls, scheduler in ((StableDiffusionImg2ImgPipeline, DDIMScheduler(**SD_SCHEDULER)), (StableDiffusion3Img2ImgPipeline, FlowMatchEulerDiscreteScheduler(shift=3.0)), (FluxImg2ImgPipeline, FlowMatchEulerDiscreteScheduler())):  # fmt: skip
        scheduler.set_timesteps(10)
        kept, _ = cls.get_timesteps(SimpleNamespace(scheduler=scheduler), 10, 0.35, "cpu")
        skipped.append(10 - len(kept))
    assert skipped == [10 - int(10 * 0.35), int(10 - 10 * 0.35), int(10 - 10 * 0.35)] == [7, 6, 6]
    # so the pages name SD 1.5's rule, default and grid, not "SD's" (SD3's img2img differs)
    for name in ("docs/handbook/img2img.md", "docs/labs/lab-20-img2img-and-inpainting.md"):
        page = " ".join((ROOT / name).read_text(encoding="utf-8").split())
        assert "SD's" not in page, name
    page = " ".join((ROOT / "docs/handbook/img2img.md").read_text(encoding="utf-8").split())
    assert "starts from: SD 1.5's `get_timesteps` skips the first `steps - int(steps * strength)` steps" in page  # fmt: skip
