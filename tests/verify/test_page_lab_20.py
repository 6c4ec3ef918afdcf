"""Lab 20's claims about image-to-image, inpainting and reference editing, on tiny
random-config pipelines (diffusers 0.42.1, CPU): the real ``StableDiffusionImg2ImgPipeline``,
``StableDiffusionInpaintPipeline`` (4- and 9-channel UNets) and ``FluxKontextPipeline``
run end to end with spies on the UNet / transformer, the VAE's decoder, ``encode_prompt``,
``scheduler.add_noise``, ``scheduler.scale_noise`` and ``scheduler.step``; a tiny
``FluxImg2ImgPipeline`` shows where the starter's SD-only sentences differ."""

from __future__ import annotations

import contextlib
import inspect
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny import (
    DIT_TEXT,
    DIT_TOKENS,
    FLUX_VAE_FACTORS,
    HEIGHT,
    embeds,
    pil_image_and_mask,
    tiny_dit_vae,
    tiny_flux_family,
    tiny_flux_transformer,
    tiny_sd_variant,
    tiny_unet,
)

STEPS = 10


@pytest.fixture(scope="module")
def img2img():
    return tiny_sd_variant("StableDiffusionImg2ImgPipeline")


@pytest.fixture(scope="module")
def inpaint4():
    return tiny_sd_variant("StableDiffusionInpaintPipeline")


@pytest.fixture(scope="module")
def inpaint9():
    return tiny_sd_variant("StableDiffusionInpaintPipeline", unet=tiny_unet(in_channels=9))


def spy(monkeypatch, obj, name, returns=False):
    """Record the (args, kwargs[, result]) of every call of ``obj.name``, tensors cloned."""
    seen, original = [], getattr(obj, name)

    def clone(x):
        return x.detach().clone() if isinstance(x, torch.Tensor) else x

    def wrapper(*args, **kwargs):
        out = original(*args, **kwargs)
        row = [tuple(map(clone, args)), {k: clone(v) for k, v in kwargs.items()}]
        if returns:
            row.append(clone(out[0] if isinstance(out, tuple) else out))
        seen.append(row)
        return out

    monkeypatch.setattr(obj, name, wrapper)
    return seen


def run(pipe, **kwargs):
    with torch.no_grad():
        return pipe(prompt_embeds=embeds(0), guidance_scale=1.0, num_inference_steps=STEPS,
                    generator=torch.Generator().manual_seed(0), **kwargs)  # fmt: skip


@pytest.mark.parametrize("strength", [0.3, 0.6, 1.0])
def test_img2img_runs_the_last_int_n_times_strength_timesteps(img2img, record_calls, monkeypatch, strength):  # fmt: skip
    """With `DDIMScheduler` (as here), `StableDiffusionImg2ImgPipeline` runs the last `int(num_inference_steps * strength)` timesteps of the grid (`get_timesteps`), one UNet call each, and noises the encoded image once, with `scheduler.add_noise(init_latents, noise, timesteps[:1])` at the first of them, where `init_latents` is `vae.encode(image)` times `scaling_factor`; at `strength=1.0` too."""
    import diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion_img2img as module
    from diffusers import DDIMScheduler

    assert type(img2img.scheduler) is DDIMScheduler  # the count is DDIM's (PNDM: one more)
    image, _ = pil_image_and_mask()
    encoded = spy(monkeypatch, module, "retrieve_latents", returns=True)
    noised = spy(monkeypatch, img2img.scheduler, "add_noise")
    calls = record_calls(img2img.unet)
    run(img2img, image=image, strength=strength, output_type="latent")

    img2img.scheduler.set_timesteps(STEPS)
    full = img2img.scheduler.timesteps
    expected = full[STEPS - int(STEPS * strength) :]
    assert [int(c[0][1]) for c in calls.calls] == expected.tolist()
    assert len(calls.calls) == int(STEPS * strength)
    assert len(noised) == 1
    (init_latents, _, timestep), _ = noised[0]
    assert timestep.tolist() == [int(expected[0])]
    sf = img2img.vae.config.scaling_factor
    assert torch.equal(init_latents, sf * encoded[0][2])
    assert init_latents.shape == (1, 4, HEIGHT // 2, HEIGHT // 2)


def test_strength_too_small_runs_nothing(img2img, inpaint4, record_calls, monkeypatch):
    """When `int(num_inference_steps * strength)` is 0 (strength 0.1 of 4 steps, DDIM), `StableDiffusionImg2ImgPipeline` runs no UNet call. With one prompt and one image, with `output_type="latent"` it returns an empty batch, latents of shape `(0, 4, H/8, W/8)` (with or without CFG); with the default `output_type` (and `"np"`, `"pt"`) it hands that empty batch to `vae.decode`, which raises a `RuntimeError`. With a batch of two or more (`num_images_per_prompt=2` or `3`, or two prompts with one image or two, with or without CFG), `prepare_latents`' `scheduler.add_noise` raises a `RuntimeError` ("must match the size") whatever the `output_type`, before `vae.decode`: its batch of timesteps is empty, which broadcasts against one image's latents but not against two or more. `StableDiffusionInpaintPipeline` raises a `ValueError` instead."""
    image, mask_image = pil_image_and_mask()
    unet_calls, decoded = record_calls(img2img.unet), record_calls(img2img.vae.decoder)
    call = dict(prompt_embeds=embeds(0), guidance_scale=1.0, num_inference_steps=4, image=image, strength=0.1)  # fmt: skip
    with torch.no_grad():
        out = img2img(**call, output_type="latent").images
        cfg = img2img(**dict(call, guidance_scale=7.5), negative_prompt_embeds=embeds(1), output_type="latent").images  # fmt: skip
    assert out.shape == cfg.shape == (0, 4, HEIGHT // 2, HEIGHT // 2)
    for output_type in ({}, {"output_type": "np"}, {"output_type": "pt"}):  # {}: the default
        decoded.calls.clear()
        with pytest.raises(RuntimeError, match="0 elements"), torch.no_grad():
            img2img(**call, **output_type)
        ((latents, *_), _) = decoded.calls[0]
        assert latents.shape == (0, 4, HEIGHT // 2, HEIGHT // 2)  # raised inside vae.decode
    # a batch of two or more: add_noise gets (B, 4, H/8, W/8) latents and 0 timesteps
    raised_in_add_noise, add_noise = [], img2img.scheduler.add_noise

    def spy(original_samples, noise, timesteps):
        try:
            return add_noise(original_samples, noise, timesteps)
        except RuntimeError:
            raised_in_add_noise.append((original_samples.shape[0], timesteps.shape[0]))
            raise

    monkeypatch.setattr(img2img.scheduler, "add_noise", spy)
    two = dict(call, prompt_embeds=embeds(0, 2), image=[image, image])
    batches = [(dict(call, num_images_per_prompt=2), 2), (dict(call, num_images_per_prompt=3), 3),
               (dict(call, prompt_embeds=embeds(0, 2)), 2), (two, 2),
               (dict(two, guidance_scale=7.5, negative_prompt_embeds=embeds(1, 2)), 2)]  # fmt: skip
    decoded.calls.clear()
    for batch, size in batches:
        for output_type in ("latent", "pil", "np", "pt"):
            raised_in_add_noise.clear()
            with contextlib.ExitStack() as stack:
                stack.enter_context(pytest.raises(RuntimeError, match="must match the size"))
                if not isinstance(batch["image"], list):  # one image for 2 or 3: diffusers warns
                    stack.enter_context(pytest.warns(FutureWarning, match="duplicating"))
                stack.enter_context(torch.no_grad())
                img2img(**batch, output_type=output_type)
            assert raised_in_add_noise == [(size, 0)]
    assert not decoded.calls and not unet_calls.calls
    with pytest.raises(ValueError, match="After adjusting"), torch.no_grad():
        inpaint4(prompt_embeds=embeds(0), guidance_scale=1.0, num_inference_steps=4, image=image,
                 mask_image=mask_image, strength=0.1, output_type="latent")  # fmt: skip


def test_get_timesteps_sets_begin_index_only_on_schedulers_that_have_it(img2img, monkeypatch):
    """`StableDiffusionImg2ImgPipeline.get_timesteps` calls `scheduler.set_begin_index(t_start * scheduler.order)` only on a scheduler that has it: `DDIMScheduler` has none, so with DDIM the slice is all it does; with `EulerDiscreteScheduler`, strength 0.5 of 10 steps, a run through `__call__` calls `set_begin_index(5)`."""
    from diffusers import DDIMScheduler, EulerDiscreteScheduler
    from tiny import SD_BETAS

    assert isinstance(img2img.scheduler, DDIMScheduler)
    assert not hasattr(img2img.scheduler, "set_begin_index")
    euler = type(img2img)(**{**img2img.components, "scheduler": EulerDiscreteScheduler(**SD_BETAS, steps_offset=1)}, requires_safety_checker=False)  # fmt: skip
    euler.set_progress_bar_config(disable=True)
    begins = spy(monkeypatch, euler.scheduler, "set_begin_index")
    with torch.no_grad():
        euler(prompt_embeds=embeds(0), guidance_scale=1.0, num_inference_steps=10, strength=0.5,
              image=pil_image_and_mask()[0], output_type="latent")  # fmt: skip
    assert [args for args, _ in begins] == [(5,)]


@pytest.mark.parametrize(("steps", "strength", "ddim_calls", "pndm_calls"), [(50, 0.5, 25, 26), (10, 1.0, 10, 11), (10, 0.35, 3, 4), (4, 0.1, 0, 1), (1, 1.0, 1, 1)])  # fmt: skip
def test_ddim_and_pndm_img2img_call_counts(img2img, record_calls, steps, strength, ddim_calls, pndm_calls):  # fmt: skip
    """`get_timesteps` slices `scheduler.timesteps[t_start * scheduler.order:]` with `t_start = num_inference_steps - int(num_inference_steps * strength)`. DDIM's grid has `num_inference_steps` entries, so it runs `int(num_inference_steps * strength)` UNet calls (0.5 of 50: 25, starting at t=481; 0.35 of 10: 3; 0.1 of 4: none). From 2 steps on, SD 1.5's shipped `PNDMScheduler` (`skip_prk_steps=True`) repeats its second timestep, so its grid has `num_inference_steps + 1` entries and the same slice keeps one entry more; `StableDiffusionImg2ImgPipeline` runs 26 calls at 0.5 of 50, starting at t=501, 4 at 0.35 of 10 (at 1.0 of 10, 11 calls, both from t=901), and at 0.1 of 4 one call, at t=1, not an empty batch; at 1 step its grid has one entry, and strength 1.0 makes one call with either scheduler; `StableDiffusionInpaintPipeline` with PNDM still raises its `ValueError` at 0.1 of 4, since its check counts `num_inference_steps - t_start`, 0."""
    from diffusers import DDIMScheduler, PNDMScheduler
    from tiny import SD15_PNDM

    def calls_and_first(pipe):
        calls = record_calls(pipe.unet)
        run_with = dict(num_inference_steps=steps, image=pil_image_and_mask()[0])
        with torch.no_grad():
            out = pipe(prompt_embeds=embeds(0), guidance_scale=1.0, strength=strength,
                       generator=torch.Generator().manual_seed(0), output_type="latent",
                       **run_with).images  # fmt: skip
        timesteps = [int(c[0][1]) for c in calls.calls]
        calls.calls.clear()
        return timesteps, out.shape[0]

    assert isinstance(img2img.scheduler, DDIMScheduler)
    ddim, ddim_batch = calls_and_first(img2img)
    pndm_pipe = type(img2img)(**{**img2img.components, "scheduler": PNDMScheduler(**SD15_PNDM)})
    pndm_pipe.set_progress_bar_config(disable=True)
    pndm, pndm_batch = calls_and_first(pndm_pipe)
    assert (len(ddim), len(pndm)) == (ddim_calls, pndm_calls)
    pndm_pipe.scheduler.set_timesteps(steps)
    grid = pndm_pipe.scheduler.timesteps
    assert len(grid) == steps + (steps >= 2)  # no repeat at 1 step
    assert steps < 2 or grid[1] == grid[2]  # the repeat: its second timestep
    if (steps, strength) == (50, 0.5):
        assert (ddim[0], pndm[0]) == (481, 501)
    if (steps, strength) == (10, 1.0):
        assert ddim[0] == pndm[0] == 901  # no earlier start when nothing is skipped
    if steps == 4:
        assert (ddim_batch, pndm_batch, pndm) == (0, 1, [1])
        base = tiny_sd_variant("StableDiffusionInpaintPipeline")
        inpaint = type(base)(**{**base.components, "scheduler": PNDMScheduler(**SD15_PNDM)})
        inpaint.set_progress_bar_config(disable=True)
        image, mask_image = pil_image_and_mask()
        with pytest.raises(ValueError, match="After adjusting"), torch.no_grad():
            inpaint(prompt_embeds=embeds(0), guidance_scale=1.0, num_inference_steps=steps, image=image,
                    mask_image=mask_image, strength=strength, output_type="latent")  # fmt: skip


@pytest.mark.parametrize("steps", [2, 50, 1000])
def test_pndm_slice_keeps_one_entry_more_from_2_steps_on(img2img, monkeypatch, steps):
    """From 2 steps on, the slice `get_timesteps` hands `StableDiffusionImg2ImgPipeline.__call__` keeps one entry more with SD 1.5's shipped `PNDMScheduler` than with `DDIMScheduler` (2, 50 and 1000 steps; strength 1.0, 0.999 and 0.5)."""
    from diffusers import DDIMScheduler, PNDMScheduler
    from tiny import SD15_PNDM, SD_SCHEDULER

    class StopError(Exception):
        pass

    def slice_length(scheduler, strength):
        pipe = type(img2img)(**{**img2img.components, "scheduler": scheduler})
        pipe.set_progress_bar_config(disable=True)
        kept, original = [], pipe.get_timesteps

        def stop(*args, **kwargs):
            kept.append(len(original(*args, **kwargs)[0]))
            raise StopError  # the slice is known: no UNet call needed

        monkeypatch.setattr(pipe, "get_timesteps", stop)
        with pytest.raises(StopError), torch.no_grad():
            pipe(prompt_embeds=embeds(0), guidance_scale=1.0, num_inference_steps=steps,
                 strength=strength, image=pil_image_and_mask()[0], output_type="latent")  # fmt: skip
        return kept[0]

    for strength in (1.0, 0.999, 0.5):
        ddim = slice_length(DDIMScheduler(**SD_SCHEDULER), strength)
        assert ddim == int(steps * strength)
        assert slice_length(PNDMScheduler(**SD15_PNDM), strength) == ddim + 1, strength


def test_strength_one_still_carries_the_image(img2img, record_calls, monkeypatch):
    """At `strength=1.0` the first timestep of SD 1.5's 50-step grid (`timestep_spacing="leading"`, `steps_offset=1`: its shipped `PNDMScheduler` config, and `DDIMScheduler` with the same settings) is 981, where `sqrt(alpha_bar)` is 0.076, not 0: run through `StableDiffusionImg2ImgPipeline`, `add_noise` returns `sqrt(alpha_bar_981) * init_latents + sqrt(1 - alpha_bar_981) * noise`, 7.6% of the image latents, and the UNet's first call gets exactly that; a `"trailing"` grid starts at 999, where it is 0.068."""
    from diffusers import DDIMScheduler, PNDMScheduler
    from tiny import SD15_PNDM, SD_SCHEDULER

    pndm = PNDMScheduler(**SD15_PNDM)
    pndm.set_timesteps(50)
    assert int(pndm.timesteps[0]) == 981
    s = img2img.scheduler
    assert s.config.timestep_spacing == "leading" and s.config.steps_offset == 1
    trailing = type(img2img)(**{**img2img.components, "scheduler": DDIMScheduler(**SD_SCHEDULER, timestep_spacing="trailing")})  # fmt: skip
    trailing.set_progress_bar_config(disable=True)
    for pipe, t_first, weight in ((img2img, 981, 0.076), (trailing, 999, 0.068)):
        noised = spy(monkeypatch, pipe.scheduler, "add_noise", returns=True)
        calls = record_calls(pipe.unet)
        with torch.no_grad():
            pipe(prompt_embeds=embeds(0), guidance_scale=1.0, num_inference_steps=50, strength=1.0,
                 image=pil_image_and_mask()[0], generator=torch.Generator().manual_seed(0),
                 output_type="latent")  # fmt: skip
        (((init_latents, noise, timestep), _, latents),) = noised
        assert timestep.tolist() == [t_first] and len(calls.calls) == 50
        alpha_bar = pipe.scheduler.alphas_cumprod[t_first]
        assert float(alpha_bar.sqrt()) == pytest.approx(weight, abs=5e-4)
        expected = alpha_bar.sqrt() * init_latents + (1 - alpha_bar).sqrt() * noise
        torch.testing.assert_close(latents, expected)
        assert (
            init_latents.abs().mean() > 0.1
        )  # the image latents are not zero: 7.6% of them is seen
        assert torch.equal(calls.calls[0][0][0], latents) and int(calls.calls[0][0][1]) == t_first
        calls.remove()


def test_inpaint_4_channel_blends_after_every_step(inpaint4, record_calls, monkeypatch):
    """With a 4-channel UNet, `StableDiffusionInpaintPipeline` blends after every `scheduler.step`: `latents = (1 - mask) * add_noise(image_latents, noise, t_next) + mask * latents`, with the un-noised `image_latents` after the last step, so the kept region of the output latents is the image's latents exactly; at `strength=1.0` it starts from the noise itself, not from `add_noise`."""
    image, mask_image = pil_image_and_mask()
    steps = spy(monkeypatch, inpaint4.scheduler, "step", returns=True)
    noised = spy(monkeypatch, inpaint4.scheduler, "add_noise")
    masks = spy(monkeypatch, inpaint4, "prepare_mask_latents", returns=True)
    calls = record_calls(inpaint4.unet)
    latents = run(inpaint4, image=image, mask_image=mask_image, strength=1.0, output_type="latent").images  # fmt: skip

    mask = masks[0][2]  # (1, 1, 8, 8): 1 = repaint
    assert mask.shape == (1, 1, HEIGHT // 2, HEIGHT // 2)
    assert torch.equal(mask[0, 0, :, 4:], torch.ones(8, 4)) and not mask[0, 0, :, :4].any()
    timesteps = [int(c[0][1]) for c in calls.calls]
    assert len(timesteps) == STEPS and len(noised) == STEPS - 1  # one add_noise per t_next
    image_latents, noise, _ = noised[0][0]
    assert torch.equal(calls.calls[0][0][0], noise)  # strength 1.0: pure noise, no add_noise
    for i in range(STEPS - 1):
        (orig, n, t_next), _ = noised[i]
        assert torch.equal(orig, image_latents) and torch.equal(n, noise)
        assert t_next.tolist() == [timesteps[i + 1]]
        expected = (1 - mask) * inpaint4.scheduler.add_noise(image_latents, noise, t_next) + mask * steps[i][2]  # fmt: skip
        torch.testing.assert_close(calls.calls[i + 1][0][0], expected)
    keep = mask[0, 0] == 0
    assert torch.equal(latents[..., keep], image_latents[..., keep])  # exactly, as the page says
    assert not torch.allclose(latents[..., ~keep], image_latents[..., ~keep])


def test_inpaint_9_channel_unet_gets_latents_mask_and_masked_image(inpaint9, record_calls, monkeypatch):  # fmt: skip
    """In `StableDiffusionInpaintPipeline`, with a 9-channel UNet (`in_channels=9`), every UNet call gets `torch.cat([latent_model_input, mask, masked_image_latents], dim=1)` (here, unguided with DDIM, `latent_model_input` is the `latents`): 4 + 1 + 4 channels, the mask resized to latent size by `prepare_mask_latents` (`interpolate` to `height // vae_scale_factor`) and no blending afterwards."""
    image, mask_image = pil_image_and_mask()
    steps = spy(monkeypatch, inpaint9.scheduler, "step", returns=True)
    noised = spy(monkeypatch, inpaint9.scheduler, "add_noise")
    calls = record_calls(inpaint9.unet)
    run(inpaint9, image=image, mask_image=mask_image, strength=1.0, output_type="latent")

    assert len(calls.calls) == STEPS and not noised  # no blending, and pure noise at 1.0
    first = calls.calls[0][0][0]
    assert first.shape == (1, 9, HEIGHT // 2, HEIGHT // 2)
    mask = first[:, 4]
    assert torch.equal(mask[0, :, 4:], torch.ones(8, 4)) and not mask[0, :, :4].any()
    for i in range(STEPS - 1):  # the next call's latents are the step's output, unblended
        x = calls.calls[i + 1][0][0]
        torch.testing.assert_close(x[:, :4], steps[i][2])
        assert torch.equal(x[:, 4:], first[:, 4:])  # mask and masked_image_latents: fixed


@pytest.mark.parametrize("channels", [1, 5, 8, 16])
def test_inpaint_raises_unless_4_or_9_channels(channels):
    """`StableDiffusionInpaintPipeline` raises a `ValueError` for a UNet with other than 4 or 9 input channels ("should have either 4 or 9 input channels"); its source names the 9-channel branch the "default case for stable-diffusion-v1-5/stable-diffusion-inpainting"."""
    from diffusers import StableDiffusionInpaintPipeline

    source = inspect.getsource(StableDiffusionInpaintPipeline.__call__)
    comment = "# default case for stable-diffusion-v1-5/stable-diffusion-inpainting"
    assert "if num_channels_unet == 9:\n            " + comment in source
    pipe = tiny_sd_variant("StableDiffusionInpaintPipeline", unet=tiny_unet(in_channels=channels))
    image, mask_image = pil_image_and_mask()
    with pytest.raises(ValueError, match="either 4 or 9 input channels"):
        run(pipe, image=image, mask_image=mask_image, output_type="latent")


def test_padding_mask_crop(inpaint4, record_calls):
    """In `StableDiffusionInpaintPipeline`, `padding_mask_crop=pad` crops the mask's bounding box grown by `pad` px (`VaeImageProcessor.get_crop_region`: a 200 px hole in a 2048 px image with pad 32 gives a 264 px square crop, which it grows to the output's aspect ratio, 528 x 264 px for a 1024 x 512 output), inpaints the crop at the call's `height x width` and pastes it back over the original: the output has the original's size and its pixels outside the mask; it needs PIL `image` and `mask_image` and `output_type="pil"`, else `ValueError`."""
    from diffusers.image_processor import VaeImageProcessor

    _, big = pil_image_and_mask(2048, hole=(924, 924, 1124, 1124))
    assert VaeImageProcessor.get_crop_region(big, 512, 512, pad=32) == (892, 892, 1156, 1156)
    assert VaeImageProcessor.get_crop_region(big, 1024, 512, pad=32) == (760, 892, 1288, 1156)

    image, mask_image = pil_image_and_mask(32, hole=(20, 20, 26, 26))
    calls = record_calls(inpaint4.unet)
    out = run(inpaint4, image=image, mask_image=mask_image, height=HEIGHT, width=HEIGHT,
              padding_mask_crop=2, output_type="pil").images[0]  # fmt: skip
    assert calls.calls[0][0][0].shape[-1] == HEIGHT // 2  # the crop runs at 16 px
    assert out.size == image.size == (32, 32)
    a, b, m = np.asarray(out, int), np.asarray(image, int), np.asarray(mask_image) == 0
    assert np.abs(a[m] - b[m]).max() <= 1  # kept pixels: the original (RGBa rounding)
    with pytest.raises(ValueError, match="The image should be a PIL image"):
        run(inpaint4, image=torch.zeros(1, 3, 32, 32), mask_image=mask_image, padding_mask_crop=2, output_type="pil")  # fmt: skip
    with pytest.raises(ValueError, match="mask image should be a PIL image"):
        run(inpaint4, image=image, mask_image=torch.zeros(1, 1, 32, 32), padding_mask_crop=2, output_type="pil")  # fmt: skip
    for output_type in ("latent", "np", "pt"):  # PIL inputs, another output type
        with pytest.raises(ValueError, match="output type should be PIL"):
            run(inpaint4, image=image, mask_image=mask_image, padding_mask_crop=2, output_type=output_type)  # fmt: skip


def test_kontext_appends_reference_tokens(record_calls, monkeypatch):
    """`FluxKontextPipeline` packs the reference image's latents like the noisy ones and concatenates them along the sequence axis (`torch.cat([latents, image_latents], dim=1)`), so with a reference the output's size (as here, `_auto_resize=False`) the transformer sees 2N image tokens for N generated (with `img_ids` rows whose first coordinate is 1), and keeps only the first N of its output (`noise_pred[:, : latents.size(1)]`); it does not noise the reference: `scheduler.scale_noise` is never called, and the reference tokens are, at every step, the reference's posterior mean (`latent_dist.mode()`, recomputed here from the pixels the VAE encoder got) shifted, scaled and packed, `_pack_latents((mode - shift_factor) * scaling_factor)`."""
    import PIL.Image
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxKontextPipeline

    pipe = FluxKontextPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=tiny_dit_vae(**FLUX_VAE_FACTORS),
        transformer=tiny_flux_transformer(), text_encoder=None, tokenizer=None,
        text_encoder_2=None, tokenizer_2=None,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    noised = spy(monkeypatch, pipe.scheduler, "scale_noise")
    g = torch.Generator().manual_seed(0)
    text = dict(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
                pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g))  # fmt: skip
    n = (HEIGHT // 2 // 2) ** 2  # 16 px -> 8 x 8 latents -> 4 x 4 packed tokens
    seen, pixels = {}, []
    hook = pipe.vae.encoder.register_forward_pre_hook(lambda m, a: pixels.append(a[0].clone()))
    for image in (None, PIL.Image.new("RGB", (HEIGHT, HEIGHT), (200, 30, 30))):
        calls = record_calls(pipe.transformer)
        with torch.no_grad():
            out = pipe(**text, image=image, height=HEIGHT, width=HEIGHT, num_inference_steps=2,
                       _auto_resize=False, max_area=HEIGHT * HEIGHT,
                       generator=torch.Generator().manual_seed(1),
                       output_type="latent").images  # fmt: skip
        kw = calls.calls[0][1]
        seen[image is None] = (kw["hidden_states"].shape, kw["img_ids"])
        first, second = (c[1]["hidden_states"] for c in calls.calls)
        assert torch.equal(first[:, n:], second[:, n:])  # the reference: the same at both steps
        assert out.shape == (1, n, 64)  # packed latents: only the N generated tokens
        calls.remove()
    hook.remove()
    assert seen[True][0] == (1, n, 64) and seen[False][0] == (1, 2 * n, 64)
    # the reference tokens: the encoded image's mode, shifted and scaled, packed; no noise
    (reference_pixels,) = pixels  # one encode: the reference (16 px, [-1, 1])
    red = torch.tensor([200, 30, 30]) / 127.5 - 1
    torch.testing.assert_close(reference_pixels, red.view(1, 3, 1, 1).expand(1, 3, HEIGHT, HEIGHT))
    with torch.no_grad():
        mode = pipe.vae.encode(reference_pixels).latent_dist.mode()  # (1, 16, 8, 8)
    shift, scale = pipe.vae.config.shift_factor, pipe.vae.config.scaling_factor
    expected = pipe._pack_latents((mode - shift) * scale, 1, 16, HEIGHT // 2, HEIGHT // 2)
    torch.testing.assert_close(first[:, n:], expected)  # first: the run with the reference
    ids = seen[False][1]
    assert (ids[:n, 0] == 0).all() and (ids[n:, 0] == 1).all()
    assert not noised


def test_kontext_resizes_the_reference_to_a_preferred_resolution(record_calls, monkeypatch):
    """By default (`_auto_resize=True`) `FluxKontextPipeline` resizes the reference image to the entry of `PREFERRED_KONTEXT_RESOLUTIONS` nearest its aspect ratio, whatever the output size: every entry is about 1 MP (1024 x 1024 among them), so the reference adds about 4,096 tokens; N tokens become about 2N only when the output is about 1 MP too."""
    import diffusers.pipelines.flux.pipeline_flux_kontext as module
    import PIL.Image
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxKontextPipeline

    sizes = module.PREFERRED_KONTEXT_RESOLUTIONS
    assert (1024, 1024) in sizes and all(abs(w * h / 1024**2 - 1) < 0.02 for w, h in sizes)
    tiny_sizes = [(32, 32), (64, 16)]  # stand-ins the tiny VAE encodes in milliseconds
    monkeypatch.setattr(module, "PREFERRED_KONTEXT_RESOLUTIONS", tiny_sizes)
    pipe = FluxKontextPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=tiny_dit_vae(**FLUX_VAE_FACTORS),
        transformer=tiny_flux_transformer(), text_encoder=None, tokenizer=None,
        text_encoder_2=None, tokenizer_2=None,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    g = torch.Generator().manual_seed(0)
    calls = record_calls(pipe.transformer)
    with torch.no_grad():
        pipe(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
             pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g),
             image=PIL.Image.new("RGB", (HEIGHT, HEIGHT), (200, 30, 30)), height=HEIGHT, width=HEIGHT,
             max_area=HEIGHT * HEIGHT, num_inference_steps=1, output_type="latent")  # fmt: skip
    n = (HEIGHT // 2 // 2) ** 2  # the 16 px output: 16 tokens
    assert calls.calls[0][1]["hidden_states"].shape[1] == n + (32 // 2 // 2) ** 2  # 32 px reference


def test_kontext_resizes_the_output_to_max_area(record_calls, monkeypatch):
    """`FluxKontextPipeline` rescales the requested `height` and `width` to `max_area` pixels (default `1024**2`) at their aspect ratio, rounded down to a multiple of `vae_scale_factor * 2`, with a logged warning: a 16 px request with `max_area=32 * 32` generates 32 px, 64 image tokens instead of 16. A call that sets neither `max_area` nor `max_sequence_length` asks `prepare_latents` for 1024 x 1024 px and passes `max_sequence_length=512` (text tokens) to `encode_prompt`."""
    from diffusers import FluxKontextPipeline
    from tiny import logged_messages

    pipe = tiny_flux_family(FluxKontextPipeline)
    g = torch.Generator().manual_seed(0)
    text = dict(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
                pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g))  # fmt: skip
    calls = record_calls(pipe.transformer)
    with logged_messages("diffusers") as messages, torch.no_grad():
        pipe(**text, height=HEIGHT, width=HEIGHT, max_area=32 * 32, num_inference_steps=1,
             output_type="latent")  # fmt: skip
    assert calls.calls[0][1]["hidden_states"].shape[1] == (32 // 2 // 2) ** 2
    assert any("adjusted to 32 and 32" in m for m in messages)

    class StopError(Exception):
        pass

    encoded = spy(monkeypatch, pipe, "encode_prompt")
    planned = []

    def stop(image, batch_size, num_channels_latents, height, width, *args):
        planned.append((height, width))
        raise StopError  # a 1024 px run of the tiny model is not needed: the size is known

    monkeypatch.setattr(pipe, "prepare_latents", stop)
    with pytest.raises(StopError), torch.no_grad():
        pipe(**text, height=HEIGHT, width=HEIGHT, num_inference_steps=1, output_type="latent")
    assert planned == [(1024, 1024)]
    assert [kw["max_sequence_length"] for _, kw in encoded] == [512]


def strength_checker_cases():
    """check_strength.py's (num_inference_steps, strengths) and the solution it checks
    against, read from the checker itself (its script part run with --solution)."""
    import runpy
    import sys
    from unittest import mock

    from infralens_docs.registry import ROOT

    checker = ROOT / "code/lab-20-img2img-and-inpainting/check_strength.py"
    with mock.patch.object(sys, "argv", [str(checker), "--solution"]):
        found = runpy.run_path(str(checker), run_name="__main__")
    return found["STRENGTHS"], found["SOLUTION"], found["grids"]


def test_strength_exercise_checks_against_img2img_get_timesteps(img2img):
    """The solution `check_strength.py` checks your `get_timesteps` against returns what `StableDiffusionImg2ImgPipeline.get_timesteps` does, the timesteps and their step count, on `DDIMScheduler` and on the second-order `HeunDiscreteScheduler`, at every strength and step count the checker tries (among them strength 1.0; 0.1 of 10 steps, one step; 0.05 of 10 and 0.5 of 1, none); `HeunDiscreteScheduler` has `order` 2 and lays out its grid as the checker's second-order one: the first timestep once, each later one twice, 2n - 1 entries."""
    from diffusers import DDIMScheduler, HeunDiscreteScheduler
    from tiny import SD_BETAS

    from labkit.blanks import load_function

    strengths, solution, grids = strength_checker_cases()
    reference = load_function(solution, "get_timesteps")
    assert {n for n, _ in strengths} >= {1, 10} and 1.0 in strengths[0][1]
    pipe = type(img2img)(**img2img.components, requires_safety_checker=False)
    for scheduler in (DDIMScheduler(**SD_BETAS, steps_offset=1), HeunDiscreteScheduler(**SD_BETAS, steps_offset=1)):  # fmt: skip
        pipe.scheduler = scheduler
        for n, values in strengths:
            scheduler.set_timesteps(n)
            t = scheduler.timesteps
            if scheduler.order == 2:  # the layout the checker's second-order grid copies
                assert len(t) == 2 * n - 1 and torch.equal(t[1::2], t[2::2])
                layout = grids(n)[1].timesteps
                assert len(layout) == len(t) and np.array_equal(layout[1::2], layout[2::2])
            for strength in values:
                theirs, count = pipe.get_timesteps(n, strength, "cpu")
                mine, my_count = reference(scheduler, n, strength)
                assert torch.equal(mine, theirs) and my_count == count, (type(scheduler).__name__, n, strength)  # fmt: skip
    assert HeunDiscreteScheduler.order == 2 and DDIMScheduler.order == 1


def test_blank_3s_comment_names_the_scheduler_whose_layout_it_gives():
    """`HeunDiscreteScheduler` (`scheduler.order` 2) holds its first timestep once and each later one twice (2n - 1 entries), as blank 3's comment in `strength_blanks.py` says of it by name: not every scheduler diffusers exports with `order` 2 lays out its grid so (`KDPM2DiscreteScheduler` and `DPMSolverSDEScheduler` interleave midpoints, `KarrasVeScheduler` holds n entries), so the comment says it of Heun, not of "a second-order scheduler", and so does the hint for a slice without `scheduler.order` (two entries for each step skipped, on Heun's grid)."""
    import diffusers

    from infralens_docs.registry import ROOT

    def repeats(cls, n=10):
        scheduler = cls()
        scheduler.set_timesteps(n)
        t = scheduler.timesteps
        return len(t) == 2 * n - 1 and torch.equal(t[1::2], t[2::2]) and len(set(t.tolist())) == n

    second_order = [
        cls
        for name in dir(diffusers)
        if name.endswith("Scheduler")
        and inspect.isclass(cls := getattr(diffusers, name))
        and getattr(cls, "order", None) == 2
    ]
    laid_out = {cls.__name__ for cls in second_order if repeats(cls)}
    assert "HeunDiscreteScheduler" in laid_out
    assert laid_out < {cls.__name__ for cls in second_order}, laid_out  # not every order-2 class
    for name, entries in (("KDPM2DiscreteScheduler", 19), ("DPMSolverSDEScheduler", 19), ("KarrasVeScheduler", 10)):  # fmt: skip
        scheduler = getattr(diffusers, name)()
        scheduler.set_timesteps(10)
        t = scheduler.timesteps.tolist()
        assert scheduler.order == 2 and len(t) == len(set(t)) == entries, (name, t)  # no repeats
    folder = ROOT / "code/lab-20-img2img-and-inpainting"
    for name in ("strength_blanks.py", "strength_solution.txt"):
        text = " ".join((folder / name).read_text(encoding="utf-8").replace("#", " ").split())
        assert "HeunDiscreteScheduler (scheduler.order 2) holds its first timestep once and each later one twice (2n - 1 entries)" in text, name  # fmt: skip
        assert "a second-order scheduler such as" not in text, name
    from labkit.blanks import load_constant

    hint = load_constant(folder / "strength_solution.txt", "MISTAKES")["no-order"][3]
    assert "a second-order scheduler holds" not in hint and "on Heun's grid that is two entries for each step skipped" in hint  # fmt: skip


def test_round_hint_names_the_pipeline_whose_get_timesteps_floors(img2img, record_calls):
    """The "int vs round" hint `check_strength.py` prints names `StableDiffusionImg2ImgPipeline` as the one that cuts `num_inference_steps * strength` with `int()`, and gives its count with DDIM (0.35 of 10 steps: 3 UNet calls through its `__call__`, not 4; with SD 1.5's shipped `PNDMScheduler`, whose grid has one entry more, the same call makes 4), not diffusers as a whole: `FluxImg2ImgPipeline.get_timesteps` floors only `num_inference_steps - num_inference_steps * strength` and keeps 4."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxImg2ImgPipeline, PNDMScheduler
    from tiny import SD15_PNDM

    from infralens_docs.registry import ROOT
    from labkit.blanks import load_constant

    folder = ROOT / "code/lab-20-img2img-and-inpainting"
    hint = load_constant(folder / "strength_solution.txt", "MISTAKES")["round"][3]
    assert "diffusers cuts" not in hint and "with DDIM, 0.35 of 10 steps runs 3, not 4" in hint
    assert f"{type(img2img).__name__} cuts n * strength with int()" in hint
    source = (folder / "img2img_inpainting.py").read_text(encoding="utf-8")
    comment = " ".join(source.replace("#", " ").split())
    assert "so with DDIM strength 0.35 of 10 steps runs 3 (SD 1.5's PNDM, whose grid has one entry more, runs 4)" in comment  # fmt: skip
    pndm = type(img2img)(**{**img2img.components, "scheduler": PNDMScheduler(**SD15_PNDM)})
    pndm.set_progress_bar_config(disable=True)
    counts = []
    for pipe in (img2img, pndm):  # DDIM, then SD 1.5's shipped PNDM: one UNet, shared
        calls = record_calls(pipe.unet)
        run(pipe, image=pil_image_and_mask()[0], strength=0.35, output_type="latent")
        counts.append(len(calls.calls))
        calls.remove()
    assert counts == [3, 4]
    flux = SimpleNamespace(scheduler=FlowMatchEulerDiscreteScheduler())
    flux.scheduler.set_timesteps(10)
    assert len(FluxImg2ImgPipeline.get_timesteps(flux, 10, 0.35, "cpu")[0]) == 4


def test_starter_names_the_pipeline_whose_empty_run_it_describes():
    """The starter's `get_timesteps` and its comment on a run with no step to run name `StableDiffusionImg2ImgPipeline`, whose behaviour they give (its `get_timesteps`; an empty batch or a `RuntimeError`, as `test_strength_too_small_runs_nothing` runs), not diffusers as a whole: a tiny `FluxImg2ImgPipeline` with no step to run (strength 0.0) raises a `ValueError` ("After adjusting") instead."""
    import PIL.Image
    from diffusers import FluxImg2ImgPipeline

    from infralens_docs.registry import ROOT

    source = (ROOT / "code/lab-20-img2img-and-inpainting/img2img_inpainting.py").read_text(encoding="utf-8")  # fmt: skip
    text = " ".join(source.replace("#", " ").split())
    assert "diffusers' get_timesteps" not in text and "(diffusers, one image" not in text
    assert '"""StableDiffusionImg2ImgPipeline.get_timesteps:' in text
    assert "(StableDiffusionImg2ImgPipeline, one image: an empty batch" in text
    pipe = tiny_flux_family(FluxImg2ImgPipeline)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="After adjusting"), torch.no_grad():
        pipe(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
             pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g),
             image=PIL.Image.new("RGB", (HEIGHT, HEIGHT), (200, 30, 30)), strength=0.0,
             height=HEIGHT, width=HEIGHT, num_inference_steps=4, output_type="latent")  # fmt: skip


def test_flux_img2img_at_strength_one_starts_at_sigma_one():
    """`FluxImg2ImgPipeline` at `strength=1.0` starts at sigma 1, pure noise: its `scheduler.scale_noise(image_latents, timestep, noise)` returns the noise itself."""
    from tiny import flux_img2img_scale_noise_calls

    from infralens_docs.registry import ROOT

    pipe, seen = flux_img2img_scale_noise_calls(strength=1.0, side=HEIGHT)
    ((image_latents, noise, latents),) = seen
    assert image_latents.abs().mean() > 0.1 and torch.equal(latents, noise)
    assert float(pipe.scheduler.sigmas[0]) == 1.0
    page = " ".join((ROOT / "docs/labs/lab-20-img2img-and-inpainting.md").read_text(encoding="utf-8").split())  # fmt: skip
    assert "Flux's img2img at 1.0 starts at sigma 1, pure noise" in page
    assert "flow-matching img2img (Flux)" not in page


def test_out_loud_gives_sd_get_timesteps_rule_not_fluxs(img2img):
    """`StableDiffusionImg2ImgPipeline`'s `get_timesteps` skips the first `num_inference_steps - int(num_inference_steps * strength)` steps of the grid (DDIM, 0.35 of 10: 7); `FluxImg2ImgPipeline.get_timesteps` skips `int(num_inference_steps - num_inference_steps * strength)`, 6 of 10."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxImg2ImgPipeline

    from infralens_docs.registry import ROOT

    img2img.scheduler.set_timesteps(10)
    sd_kept, _ = img2img.get_timesteps(10, 0.35, "cpu")
    flux = SimpleNamespace(scheduler=FlowMatchEulerDiscreteScheduler())
    flux.scheduler.set_timesteps(10)
    flux_kept, _ = FluxImg2ImgPipeline.get_timesteps(flux, 10, 0.35, "cpu")
    assert (10 - len(sd_kept), 10 - len(flux_kept)) == (10 - int(10 * 0.35), int(10 - 10 * 0.35)) == (7, 6)  # fmt: skip
    page = " ".join((ROOT / "docs/labs/lab-20-img2img-and-inpainting.md").read_text(encoding="utf-8").split())  # fmt: skip
    assert "part-way. `StableDiffusionImg2ImgPipeline`'s `get_timesteps` skips the first `num_inference_steps - int(num_inference_steps * strength)` steps" in page  # fmt: skip
