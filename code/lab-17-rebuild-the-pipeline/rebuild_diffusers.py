"""Lab 17 on diffusers' own parts: the six blanks, filled, around a StableDiffusionPipeline.

The same loop as ``pipeline()`` in ``pipeline_solution.txt``, written against a real pipeline's
``unet``, ``scheduler`` and ``vae`` and its ``encode_prompt``, ``prepare_extra_step_kwargs``
and ``image_processor``: the lines of ``StableDiffusionPipeline.__call__`` (diffusers
0.42.1) that the blanks stand for, plus the three places where ``__call__`` differs from
the toy's loop: no guidance at ``guidance_scale <= 1`` (one undoubled batch, the prompt's
rows alone), ``generator`` and ``eta`` passed on to ``scheduler.step`` (Euler Ancestral and
DDPM draw their step's noise from it), and everything made on ``pipe._execution_device``, as
``__call__`` does (with model offload it is the accelerator, not ``pipe.device``). Left out of
``__call__``, among others: callbacks, IP-Adapter, guidance rescale, the safety checker,
``num_images_per_prompt``, ``clip_skip``, ``cross_attention_kwargs``, passed ``latents`` or
``prompt_embeds``, and ``timestep_cond`` (a UNet with ``time_cond_proj_dim`` is not handled).

``tests/verify/test_page_lab_17.py`` checks that it returns what ``pipe(...)`` returns with
``output_type="np"`` for the same prompt and generator, bit for bit, on a tiny random
StableDiffusionPipeline on the CPU: with DDIM, Euler, Euler Ancestral and DDPM (the last
two draw noise in ``step``), each at ``guidance_scale`` 7.5, 1.0 and 0.0; and that, with
``enable_model_cpu_offload(device="cpu")``, it hands ``encode_prompt``, ``set_timesteps``
and ``randn_tensor`` the device ``__call__`` hands them. Not run on a GPU.

It needs the verify extra (torch, diffusers, transformers: ``pip install -e '.[verify]'``)
and a pipeline, for example ``StableDiffusionPipeline.from_pretrained(...)``; then
``pipeline(pipe, "a red disc", generator=torch.Generator().manual_seed(0))``. Running
this file only defines the function, so it imports torch inside it.
"""


# %%
# --8<-- [start:pipeline]
def pipeline(pipe, prompt, num_inference_steps=50, guidance_scale=7.5, generator=None, eta=0.0):
    """``pipe(prompt, ...)`` from its parts: images (B, H, W, 3), float32 in [0, 1]."""
    import torch
    from diffusers.utils.torch_utils import randn_tensor

    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    height = width = pipe.unet.config.sample_size * pipe.vae_scale_factor  # the defaults
    device = pipe._execution_device  # as __call__: the offload hooks' device, if any
    # __call__ guides only when guidance_scale > 1 (do_classifier_free_guidance); at 1 or
    # below it runs the prompt's rows alone, so guidance_scale=0 is not the unconditional image
    guide = guidance_scale > 1
    # (B, 77, D); the negative prompt is "", used only when guiding
    prompt_embeds, negative_prompt_embeds = pipe.encode_prompt(
        prompts, device, num_images_per_prompt=1, do_classifier_free_guidance=guide
    )
    # BLANK 1 · the doubled condition, negative rows first: (2B, 77, D)
    if guide:
        prompt_embeds = torch.cat([negative_prompt_embeds, prompt_embeds])

    pipe.scheduler.set_timesteps(num_inference_steps, device=device)
    # prepare_latents: randn_tensor on the execution device, times init_noise_sigma
    shape = (len(prompts), pipe.unet.config.in_channels,
             height // pipe.vae_scale_factor, width // pipe.vae_scale_factor)  # fmt: skip
    latents = randn_tensor(shape, generator=generator, device=device, dtype=prompt_embeds.dtype)
    latents = latents * pipe.scheduler.init_noise_sigma
    # eta and generator, passed to step when its signature has them (Euler Ancestral and
    # DDPM draw their step's noise from the generator)
    extra_step_kwargs = pipe.prepare_extra_step_kwargs(generator, eta)

    with torch.no_grad():
        for t in pipe.scheduler.timesteps:
            # BLANK 2 · the latents, doubled: (2B, 4, H/f, W/f)
            latent_model_input = torch.cat([latents] * 2) if guide else latents
            # BLANK 3 · the scheduler's input scaling
            latent_model_input = pipe.scheduler.scale_model_input(latent_model_input, t)
            noise_pred = pipe.unet(
                latent_model_input, t, encoder_hidden_states=prompt_embeds, return_dict=False
            )[0]
            # BLANK 4 · the chunk(2) guidance line: (2B, ...) -> (B, ...)
            if guide:
                noise_pred_uncond, noise_pred_text = noise_pred.chunk(2)
                noise_pred = noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)  # fmt: skip
            # BLANK 5 · one step x_t -> x_{t-1} of the B latents; [0] is prev_sample
            out = pipe.scheduler.step(noise_pred, t, latents, **extra_step_kwargs, return_dict=False)  # fmt: skip
            latents = out[0]
        # BLANK 6 · back to the VAE's scale, then decode: (B, 3, H, W) in about [-1, 1]
        image = pipe.vae.decode(
            latents / pipe.vae.config.scaling_factor, return_dict=False, generator=generator
        )[0]
    return pipe.image_processor.postprocess(image, output_type="np")  # (B, H, W, 3) in [0, 1]


# --8<-- [end:pipeline]
