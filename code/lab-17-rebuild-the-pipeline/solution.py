"""Lab 17's solution (spoilers): rebuild_pipeline.py's pipeline() with its five blanks filled.

Not a script: this file holds the filled-in ``pipeline`` function and the table of classic
mistakes that ``--demo-wrong`` plants in it, nothing else. ``rebuild_pipeline.py`` reads
both from here (``labkit.blanks.load_function`` runs only this file's imports and the
``def``; ``load_constant`` reads the table without running anything) and runs them on its
own parts, inputs, checker and figures:

- ``python3 code/lab-17-rebuild-the-pipeline/rebuild_pipeline.py --solution`` runs this
  pipeline() in place of yours (add ``--check`` to check it, ``--figures DIR`` to draw);
- ``python3 code/lab-17-rebuild-the-pipeline/rebuild_pipeline.py --demo-wrong 4`` checks a
  copy of it with ``MISTAKES[4]`` planted (any blank from 1 to 5).

The function is the reader's line for line, except that each ``blank(n)`` of the
reader's is filled in here (a test checks it).
"""

import numpy as np

# %% [markdown]
# ## The solution: the loop of `StableDiffusionPipeline.__call__`
#
# The five blanks of `rebuild_pipeline.py`, filled in as diffusers 0.42.1 writes them when
# it guides (`guidance_scale > 1`; at 1 or below it runs the prompt's rows alone):
# the negative prompt's rows first, `scale_model_input` before the unet, `np.split` in
# the same order for the guidance line, `step(...).prev_sample`, and the division by
# `scaling_factor` before decode. Any other way of writing a line that hands the parts
# the same arguments passes `--check` too.
#
# This page only defines the function: to run it, use
# `python3 code/lab-17-rebuild-the-pipeline/rebuild_pipeline.py --solution`.


# %%
# --8<-- [start:pipeline]
def pipeline(
    unet, scheduler, vae, prompt_embeds, negative_prompt_embeds, latents,
    num_inference_steps, guidance_scale,
):  # fmt: skip
    """Latents (B, 4, h, w) of noise and conditions (B, ...) -> images (B, 3, H, W)."""
    # BLANK 1 of 5 · the doubled batch and its order (this line and one in the loop). One
    # unet call serves both halves of classifier-free guidance: 2B condition rows, here
    # (2B,) labels, in SD 1.x (2B, 77, 768). The order is a convention blank 3 must follow;
    # diffusers puts the negative prompt's rows first.
    prompt_embeds = np.concatenate([negative_prompt_embeds, prompt_embeds])

    scheduler.set_timesteps(num_inference_steps)  # scheduler.timesteps: (n,), high to low
    latents = latents * scheduler.init_noise_sigma  # the std the scheduler starts from

    for t in scheduler.timesteps:
        # BLANK 1 (continued) · the latents, doubled to match: (B, 4, h, w) -> (2B, 4, h, w),
        # each half the whole batch.
        latent_model_input = np.concatenate([latents] * 2)

        # BLANK 2 of 5 · what the unet sees at t is the scheduler's business: Euler keeps
        # its latents on a larger scale than the one the unet was trained on (up to
        # init_noise_sigma), DDIM does not. (2B, 4, h, w) in and out.
        latent_model_input = scheduler.scale_model_input(latent_model_input, t)

        noise_pred = unet(latent_model_input, t, class_labels=prompt_embeds)  # (2B, 4, h, w)

        # BLANK 3 of 5 · the chunk(2) guidance line: cut the prediction into its two
        # halves in blank 1's order, then go from the unconditional prediction towards
        # the conditional one, guidance_scale times their difference: (B, 4, h, w).
        noise_pred_uncond, noise_pred_text = np.split(noise_pred, 2)
        noise_pred = noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)

        # BLANK 4 of 5 · one scheduler update x_t -> x_{t-1}: the guided prediction, this
        # timestep, and the B latents the loop carries (not the doubled, scaled input).
        # The result holds two arrays; keep the one the next iteration needs.
        latents = scheduler.step(noise_pred, t, latents).prev_sample

    # BLANK 5 of 5 · the unet's latents have unit std because the training latents were
    # multiplied by vae.config.scaling_factor; the decoder wants the scale it encoded to.
    image = vae.decode(latents / vae.config.scaling_factor)  # (B, 3, H, W), about [-1, 1]
    return image


# --8<-- [end:pipeline]


# %% [markdown]
# ## Classic mistakes
#
# `rebuild_pipeline.py --demo-wrong N` checks a copy of the function above with the text
# `old` of blank N replaced by `new`: a mistake people make in that blank, which still
# runs and returns an image. The checker must name blank N for each one (a test checks
# it); `--solution --figures DIR` draws the images each one makes.

# %%
# --8<-- [start:mistakes]
#: blank number -> (old, new): each ``old`` occurs once in pipeline() above
MISTAKES = {
    1: ("[negative_prompt_embeds, prompt_embeds]", "[prompt_embeds, negative_prompt_embeds]"),
    2: ("scheduler.scale_model_input(latent_model_input, t)", "latent_model_input"),
    3: ("(noise_pred_text - noise_pred_uncond)", "(noise_pred_uncond - noise_pred_text)"),
    4: (".prev_sample", ".pred_original_sample"),
    5: ("latents / vae.config.scaling_factor", "latents"),
}
# --8<-- [end:mistakes]
