"""Lab 17 on diffusers' own parts: the five blanks, filled, around a StableDiffusionPipeline.

The same loop as ``pipeline()`` in ``solution.py``, written against a real pipeline's
``unet``, ``scheduler`` and ``vae`` and its ``encode_prompt``: the lines of
``StableDiffusionPipeline.__call__`` (diffusers 0.42.1) that the blanks stand for, with
nothing else of ``__call__`` (no callbacks, IP-Adapter, guidance rescale or safety
checker). For the same prompt and generator it returns what ``pipe(...)`` returns with
``output_type="np"``: ``tests/verify/test_page_lab_17.py`` checks that on a tiny random
StableDiffusionPipeline, with DDIM and with Euler.

It needs the verify extra (torch, diffusers, transformers: ``pip install -e '.[verify]'``)
and a pipeline, for example ``StableDiffusionPipeline.from_pretrained(...)``; then
``pipeline(pipe, "a red disc", generator=torch.Generator().manual_seed(0))``. Running
this file only defines the function, so it imports torch inside it.
"""


# %%
# --8<-- [start:pipeline]
def pipeline(pipe, prompt, num_inference_steps=50, guidance_scale=7.5, generator=None):
    """``pipe(prompt, ...)`` from its parts: images (B, H, W, 3), float32 in [0, 1]."""
    import torch

    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    height = width = pipe.unet.config.sample_size * pipe.vae_scale_factor  # the defaults
    # (B, 77, D) each; the negative prompt is "" (diffusers encodes it when guiding)
    prompt_embeds, negative_prompt_embeds = pipe.encode_prompt(
        prompts, pipe.device, num_images_per_prompt=1, do_classifier_free_guidance=True
    )
    # BLANK 1 · the doubled batch, negative rows first: (2B, 77, D)
    prompt_embeds = torch.cat([negative_prompt_embeds, prompt_embeds])

    pipe.scheduler.set_timesteps(num_inference_steps, device=pipe.device)
    # prepare_latents: randn_tensor(shape, generator) * init_noise_sigma, (B, 4, H/f, W/f)
    shape = (len(prompts), pipe.unet.config.in_channels,
             height // pipe.vae_scale_factor, width // pipe.vae_scale_factor)  # fmt: skip
    latents = torch.randn(shape, generator=generator, dtype=prompt_embeds.dtype)
    latents = latents * pipe.scheduler.init_noise_sigma

    with torch.no_grad():
        for t in pipe.scheduler.timesteps:
            # BLANK 1 (continued) · the latents, doubled: (2B, 4, H/f, W/f)
            latent_model_input = torch.cat([latents] * 2)
            # BLANK 2 · the scheduler's input scaling (Euler: / sqrt(sigma^2 + 1))
            latent_model_input = pipe.scheduler.scale_model_input(latent_model_input, t)
            noise_pred = pipe.unet(
                latent_model_input, t, encoder_hidden_states=prompt_embeds, return_dict=False
            )[0]
            # BLANK 3 · the chunk(2) guidance line: (2B, ...) -> (B, ...)
            noise_pred_uncond, noise_pred_text = noise_pred.chunk(2)
            noise_pred = noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)
            # BLANK 4 · one step x_t -> x_{t-1} of the B latents; [0] is prev_sample
            latents = pipe.scheduler.step(noise_pred, t, latents, return_dict=False)[0]
        # BLANK 5 · back to the VAE's scale, then decode: (B, 3, H, W) in about [-1, 1]
        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
    return pipe.image_processor.postprocess(image, output_type="np")  # (B, H, W, 3) in [0, 1]


# --8<-- [end:pipeline]
