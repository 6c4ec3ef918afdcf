"""The home page's pipeline-at-a-glance claims, on the real StableDiffusionPipeline.

The pipeline is built from tiny random parts (``tiny.py``): a real CLIP tokenizer
over a made-up vocabulary and a tiny CLIPTextModel, so a string prompt goes through
``encode_prompt`` as in SD 1.x, with width ``EMBED_DIM`` where SD 1.x has 768.
"""

from __future__ import annotations

import torch
from tiny import (
    EMBED_DIM,
    HEIGHT,
    WIDTH,
    start_latents,
    tiny_sd_pipeline,
    tiny_text_encoder,
    tiny_tokenizer,
)


def full_pipeline(tmp_path):
    return tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer(tmp_path))


def test_prompt_is_encoded_once_to_77_token_embeddings(tmp_path, record_calls):
    """The prompt is tokenized to 77 tokens and encoded once per call, before the loop: `prompt_embeds` is `(B, 77, D)` with `D` the text encoder's width (768 for SD 1.x's CLIP ViT-L)."""
    pipe = full_pipeline(tmp_path)
    text = record_calls(pipe.text_encoder)
    prompt_embeds, negative = pipe.encode_prompt(
        ["a cat", "a dog"], device="cpu", num_images_per_prompt=1,
        do_classifier_free_guidance=False,
    )  # fmt: skip
    assert prompt_embeds.shape == (2, 77, EMBED_DIM) and negative is None
    assert text.calls[0][0][0].shape == (2, 77)  # input_ids (batch, 77) int64
    text.calls.clear()
    pipe("a cat", num_inference_steps=3, height=HEIGHT, width=WIDTH, output_type="latent")
    assert len(text.calls) == 2  # once for the prompt, once for "" (CFG), not per step


def test_latents_are_drawn_at_the_vae_scale_and_scaled_by_init_noise_sigma(tmp_path):
    """`latents` are `(B, unet.config.in_channels, H / f, W / f)` with `f = 2 ** (len(vae.config.block_out_channels) - 1)` (8 for SD's four-block VAE), multiplied by `scheduler.init_noise_sigma`."""
    pipe = full_pipeline(tmp_path)
    f = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    assert pipe.vae_scale_factor == f
    latents = pipe.prepare_latents(
        2, pipe.unet.config.in_channels, HEIGHT, WIDTH, torch.float32, "cpu",
        torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert latents.shape == (2, 4, HEIGHT // f, WIDTH // f)
    pipe.scheduler.init_noise_sigma = 3.0  # any scheduler's value is applied, not assumed 1
    given = start_latents(2)
    scaled = pipe.prepare_latents(2, 4, HEIGHT, WIDTH, torch.float32, "cpu", None, given)
    torch.testing.assert_close(scaled, given * 3.0)


def test_the_unet_runs_once_per_step_on_twice_the_batch(tmp_path, record_calls):
    """With CFG the UNet runs once per step on `2B` rows, and `noise_pred` has the shape of `latents`."""
    pipe = full_pipeline(tmp_path)
    unet = record_calls(pipe.unet)
    outputs = []
    handle = pipe.unet.register_forward_hook(lambda m, a, out: outputs.append(out[0].shape))
    pipe("a cat", num_inference_steps=4, guidance_scale=7.5, height=HEIGHT, width=WIDTH,
         output_type="latent")  # fmt: skip
    handle.remove()
    assert len(unet.calls) == 4
    assert all(args[0].shape == (2, 4, 8, 8) for args, _ in unet.calls)
    assert outputs == [torch.Size([2, 4, 8, 8])] * 4


def test_decode_divides_by_scaling_factor_once_after_the_loop(tmp_path, record_calls):
    """After the loop the VAE decodes once, `vae.decode(latents / vae.config.scaling_factor)`, to `(B, 3, H, W)`; `AutoencoderKL`'s default `scaling_factor` is 0.18215."""
    pipe = full_pipeline(tmp_path)
    assert pipe.vae.config.scaling_factor == 0.18215
    decoder = record_calls(pipe.vae.decoder)
    final = []
    handle = pipe.vae.post_quant_conv.register_forward_pre_hook(lambda m, a: final.append(a[0]))
    latents = pipe("a cat", num_inference_steps=3, height=HEIGHT, width=WIDTH,
                   output_type="latent", latents=start_latents()).images  # fmt: skip
    assert decoder.calls == [] and final == []  # output_type="latent": no decode at all
    image = pipe("a cat", num_inference_steps=3, height=HEIGHT, width=WIDTH,
                 output_type="pt", latents=start_latents()).images  # fmt: skip
    handle.remove()
    assert len(decoder.calls) == 1 and image.shape == (1, 3, HEIGHT, WIDTH)
    torch.testing.assert_close(final[0], latents / 0.18215)
