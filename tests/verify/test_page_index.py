"""The home page's pipeline-at-a-glance claims, on the real StableDiffusionPipeline.

The pipeline is built from tiny random parts (``tiny.py``): a real CLIP tokenizer
over a made-up vocabulary and a tiny CLIPTextModel, so a string prompt goes through
``encode_prompt`` as in SD 1.x, with width ``EMBED_DIM`` where SD 1.x has 768. Every
test runs ``StableDiffusionPipeline.__call__`` and observes it with hooks and spies.
"""

from __future__ import annotations

import functools
import itertools
import re

import pytest
import torch
from diffusers import (
    DDIMScheduler,
    EulerDiscreteScheduler,
    PNDMScheduler,
    StableDiffusionImg2ImgPipeline,
)
from tiny import (
    EMBED_DIM,
    HEIGHT,
    SD15_PNDM,
    SD_SCHEDULER,
    WIDTH,
    spy_step,
    start_latents,
    tiny_sd_pipeline,
    tiny_text_encoder,
    tiny_tokenizer,
)

from infralens_docs.registry import ROOT


def once_per_entry_sentences(page: str) -> list[str]:
    """The sentences (or table cells) of a page that say the denoiser runs once per entry."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    found = []
    for line in text.splitlines():
        for part in re.split(r"(?<=[.!?])\s+|\s\|\s", line):
            if re.search(r"once per (entry|`scheduler\.timesteps` entry)", part):
                found.append(part)
    return found


def full_pipeline(tmp_path, **components):
    return tiny_sd_pipeline(
        text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer(tmp_path), **components
    )


def test_prompt_is_encoded_once_to_77_token_embeddings(tmp_path, record_calls):
    """In `StableDiffusionPipeline`, the prompt is tokenized to 77 tokens and encoded before the loop, once per call (and the negative prompt once more under CFG): `prompt_embeds` is `(B, 77, D)` with `D` the text encoder's width (768 for SD 1.x's CLIP ViT-L)."""
    pipe = full_pipeline(tmp_path)
    order = []
    pipe.text_encoder.register_forward_pre_hook(lambda m, a: order.append(("text", a[0].shape)))
    pipe.unet.register_forward_pre_hook(
        lambda m, a, k: order.append(("unet", k["encoder_hidden_states"].shape)), with_kwargs=True
    )
    pipe(["a cat", "a dog"], num_inference_steps=3, guidance_scale=1.0, height=HEIGHT,
         width=WIDTH, output_type="latent")  # fmt: skip
    # input_ids (batch_size, 77) once, then three UNet calls on prompt_embeds (B, 77, D)
    assert order == [("text", (2, 77))] + [("unet", (2, 77, EMBED_DIM))] * 3
    order.clear()
    pipe("a cat", num_inference_steps=3, height=HEIGHT, width=WIDTH, output_type="latent")
    # with CFG: the prompt, then "" for the unconditional half, both before the loop
    assert [kind for kind, _ in order] == ["text", "text", "unet", "unet", "unet"]


def test_latents_are_drawn_at_the_vae_scale_and_scaled_by_init_noise_sigma(tmp_path, monkeypatch):
    """In `StableDiffusionPipeline`, `latents` are `(B, unet.config.in_channels, H / f, W / f)` with `f = 2 ** (len(vae.config.block_out_channels) - 1)` (8 for SD's four-block VAE), multiplied by `scheduler.init_noise_sigma`.

    Run with ``EulerDiscreteScheduler`` from SD 1.5's config, whose ``init_noise_sigma`` is
    ``sigma_max`` (about 14.6), so the scaling shows; DDIM's is 1.0.
    """
    pipe = full_pipeline(tmp_path, scheduler=EulerDiscreteScheduler.from_config(SD_SCHEDULER))
    f = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    assert pipe.vae_scale_factor == f == 2  # the tiny VAE has two blocks
    steps = spy_step(monkeypatch, pipe.scheduler)
    pipe("a cat", num_images_per_prompt=2, num_inference_steps=2, guidance_scale=1.0,
         height=HEIGHT, width=WIDTH, generator=torch.Generator().manual_seed(0),
         output_type="latent")  # fmt: skip
    first_latents = steps[0][1]  # what the loop starts from
    assert first_latents.shape == (2, pipe.unet.config.in_channels, HEIGHT // f, WIDTH // f)
    noise = torch.randn(first_latents.shape, generator=torch.Generator().manual_seed(0))
    sigma = pipe.scheduler.init_noise_sigma
    assert sigma > 10
    torch.testing.assert_close(first_latents, noise * sigma)


def test_sd1_shaped_vae_gives_latents_at_one_eighth(sd1_shaped_pipe):
    """In `StableDiffusionPipeline`, with a VAE of SD 1.x's four blocks, `vae_scale_factor` is 8: `latents` are `(B, 4, H/8, W/8)` and the decoded image is `(B, 3, H, W)`."""
    pipe = sd1_shaped_pipe
    assert pipe.vae_scale_factor == 8
    kwargs = dict(prompt_embeds=torch.zeros(2, 77, EMBED_DIM), height=32, width=32,
                  num_inference_steps=2, guidance_scale=1.0)  # fmt: skip
    latents = pipe(**kwargs, output_type="latent").images
    image = pipe(**kwargs, output_type="pt").images
    assert latents.shape == (2, 4, 32 // 8, 32 // 8) and image.shape == (2, 3, 32, 32)


def test_the_unet_runs_once_per_timestep_on_twice_the_batch(tmp_path, record_calls, monkeypatch):
    """In `StableDiffusionPipeline`, with CFG and SD 1.5's scheduler settings below 1000 steps, the UNet runs once per entry of `scheduler.timesteps` on `2B` rows: `num_inference_steps` times with DDIM and, from two steps up, one more with the `PNDMScheduler` SD 1.x checkpoints ship (one call at one step), whose grid repeats one timestep; `noise_pred` has the shape of `latents`.

    PNDM with SD 1.5's shipped config (``skip_prk_steps=True``, ``steps_offset=1``,
    ``set_alpha_to_one=False``): its ``set_timesteps(n)`` repeats one timestep when n > 1.
    The grid lengths are checked at every count below 1000; at 1000, ``steps_offset=1`` puts
    t = 1000 first and both pipelines stop after one UNet call with an IndexError, so each
    sentence of the page that says "once per entry" carries "below 1000 steps".
    """
    ddim = DDIMScheduler(**SD_SCHEDULER)
    pndm = PNDMScheduler(**SD15_PNDM)
    for n in range(1, 1000):
        ddim.set_timesteps(n)
        pndm.set_timesteps(n)
        assert (len(ddim.timesteps), len(pndm.timesteps)) == (n, n + 1 if n > 1 else 1), n
    cases = [(None, 4, 4), (pndm, 4, 5), (pndm, 2, 3), (pndm, 1, 1)]
    for scheduler, num_steps, calls_expected in cases:
        pipe = full_pipeline(tmp_path, **({"scheduler": scheduler} if scheduler else {}))
        unet = record_calls(pipe.unet)
        steps = spy_step(monkeypatch, pipe.scheduler)
        pipe("a cat", num_inference_steps=num_steps, guidance_scale=7.5, height=HEIGHT,
             width=WIDTH, output_type="latent")  # fmt: skip
        assert len(unet.calls) == len(steps) == len(pipe.scheduler.timesteps) == calls_expected
        # per entry, not per distinct timestep: PNDM's grid repeats one (4 steps, 5 calls)
        assert len(set(pipe.scheduler.timesteps.tolist())) == num_steps
        assert all(args[0].shape == (2, 4, 8, 8) for args, _ in unet.calls)  # 2B
        # the guided noise_pred that scheduler.step gets has the shape of latents, (B, 4, 8, 8)
        assert all(pred.shape == latents.shape == (1, 4, 8, 8) for pred, latents in steps)
    for scheduler in [DDIMScheduler(**SD_SCHEDULER), PNDMScheduler(**SD15_PNDM)]:
        pipe = full_pipeline(tmp_path, scheduler=scheduler)
        unet = record_calls(pipe.unet)
        with pytest.raises(IndexError):
            pipe("a cat", num_inference_steps=1000, guidance_scale=7.5, height=HEIGHT,
                 width=WIDTH, output_type="latent")  # fmt: skip
        assert int(pipe.scheduler.timesteps[0]) == 1000 and len(unet.calls) == 1
    sentences = once_per_entry_sentences("index.md")  # the table row and the bullet
    assert len(sentences) == 2 and all("below 1000 steps" in s.lower() for s in sentences)


def test_the_scheduler_makes_each_update_from_the_combined_prediction(tmp_path):
    """Under CFG, `scheduler.step` gets `noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)` from the two halves of one UNet output (the unconditional half first), and its `prev_sample` is the next step's `latents` and the loop's output: `StableDiffusionPipeline` changes `latents` only through `scheduler.step`; the same UNet output read under `prediction_type="v_prediction"` gives different `latents`."""
    pipe = full_pipeline(tmp_path)
    outputs, steps = [], []
    pipe.unet.register_forward_hook(
        lambda m, a, out: outputs.append((out[0] if isinstance(out, tuple) else out.sample).clone())
    )

    def run(scheduler):
        original = scheduler.step

        @functools.wraps(original)  # keeps the signature prepare_extra_step_kwargs reads
        def step(model_output, timestep, sample, *args, **kwargs):
            out = original(model_output, timestep, sample, *args, **kwargs)
            prev = out[0] if isinstance(out, tuple) else out.prev_sample
            steps.append((model_output.clone(), sample.clone(), prev.clone()))
            return out

        scheduler.step = step
        pipe.scheduler = scheduler
        outputs.clear(), steps.clear()
        return pipe("a cat", num_inference_steps=3, guidance_scale=7.5, height=HEIGHT,
                    width=WIDTH, output_type="latent", latents=start_latents()).images  # fmt: skip

    config = pipe.scheduler.config
    latents = run(pipe.scheduler)
    assert len(outputs) == len(steps) == 3
    for out, (pred, _, _) in zip(outputs, steps, strict=True):
        uncond, text = out.chunk(2)
        torch.testing.assert_close(pred, uncond + 7.5 * (text - uncond))
        assert not torch.allclose(pred, text + 7.5 * (uncond - text))  # the order matters
    for (_, _, prev), (_, sample, _) in itertools.pairwise(steps):
        torch.testing.assert_close(sample, prev, rtol=0, atol=0)
    torch.testing.assert_close(latents, steps[-1][2], rtol=0, atol=0)
    first_output = outputs[0]
    other = run(DDIMScheduler.from_config(config, prediction_type="v_prediction"))
    torch.testing.assert_close(outputs[0], first_output)  # the same first UNet call
    assert not torch.allclose(other, latents)


def test_encoding_multiplies_by_scaling_factor(record_calls, monkeypatch):
    """Encoding an image for the loop multiplies the VAE's latents by `vae.config.scaling_factor`: `StableDiffusionImg2ImgPipeline.__call__` hands `scheduler.add_noise` the encoder's sample times `scaling_factor`.

    The same tiny parts in the real img2img pipeline; the latents are sampled from
    ``vae.encode(image).latent_dist`` with the call's generator, first draw.
    """
    parts = tiny_sd_pipeline().components
    pipe = StableDiffusionImg2ImgPipeline(**parts, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    seen, original = [], pipe.scheduler.add_noise

    def add_noise(original_samples, noise, timesteps):
        seen.append(original_samples.clone())
        return original(original_samples, noise, timesteps)

    monkeypatch.setattr(pipe.scheduler, "add_noise", add_noise)
    image = torch.rand(1, 3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(0))
    pipe(prompt_embeds=torch.zeros(1, 77, EMBED_DIM), image=image, strength=0.5,
         num_inference_steps=4, guidance_scale=1.0, generator=torch.Generator().manual_seed(1),
         output_type="latent")  # fmt: skip
    with torch.no_grad():
        posterior = pipe.vae.encode(pipe.image_processor.preprocess(image)).latent_dist
    sample = posterior.sample(generator=torch.Generator().manual_seed(1))
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], sample * 0.18215)
    assert not torch.allclose(seen[0], sample)


def test_decode_divides_by_scaling_factor_once_after_the_loop(tmp_path, record_calls, monkeypatch):
    """In `StableDiffusionPipeline`, after the loop `vae.decode(latents / vae.config.scaling_factor)` is called once, to `(B, 3, H, W)` (not at all with `output_type="latent"`); `AutoencoderKL`'s default `scaling_factor` is 0.18215."""
    pipe = full_pipeline(tmp_path)
    assert pipe.vae.config.scaling_factor == 0.18215  # tiny_vae passes none: the default
    decode_calls, decode = [], pipe.vae.decode
    monkeypatch.setattr(
        pipe.vae, "decode", lambda *a, **k: decode_calls.append(1) or decode(*a, **k)
    )
    decoder = record_calls(pipe.vae.decoder)
    final = []
    handle = pipe.vae.post_quant_conv.register_forward_pre_hook(lambda m, a: final.append(a[0]))
    latents = pipe("a cat", num_inference_steps=3, height=HEIGHT, width=WIDTH,
                   output_type="latent", latents=start_latents()).images  # fmt: skip
    assert decode_calls == [] and decoder.calls == [] and final == []  # "latent": no decode
    image = pipe("a cat", num_inference_steps=3, height=HEIGHT, width=WIDTH,
                 output_type="pt", latents=start_latents()).images  # fmt: skip
    handle.remove()
    assert len(decode_calls) == len(decoder.calls) == 1 and image.shape == (1, 3, HEIGHT, WIDTH)
    torch.testing.assert_close(final[0], latents / 0.18215)
