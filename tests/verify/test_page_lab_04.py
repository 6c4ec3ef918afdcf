"""Lab 04 (CFG code reading) against the real StableDiffusionPipeline.

No weights: the UNet and VAE are tiny and random (``tiny.py``), and the prompt
embeddings are passed in directly, so ``StableDiffusionPipeline.__call__`` runs on
the CPU in a fraction of a second. A pre-hook on the UNet records each call.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from tiny import (
    EMBED_DIM,
    HEIGHT,
    SD15_PNDM,
    SD_BETAS,
    SD_SCHEDULER,
    WIDTH,
    embeds,
    flux_prompt_embeds,
    start_latents,
    tiny_flux_pipeline,
    tiny_sd_pipeline,
    tiny_unet,
)

LAB04 = "code/lab-04-cfg-code-reading/cfg_guidance.py"


def run(pipe, guidance_scale: float, steps: int = 4, **kwargs):
    return pipe(
        prompt_embeds=embeds(1),
        negative_prompt_embeds=embeds(2),
        num_inference_steps=steps,
        guidance_scale=guidance_scale,
        height=HEIGHT,
        width=WIDTH,
        latents=start_latents(),
        output_type="latent",
        **kwargs,
    ).images


def test_cfg_doubles_the_batch_uncond_first(sd_pipe, distilled_pipe, record_calls):
    """In `StableDiffusionPipeline`, with `guidance_scale=7.5` and a UNet without `time_cond_proj_dim`, every UNet call gets a batch of `2B`: the same `latents` twice, with `negative_prompt_embeds` in the first half and `prompt_embeds` in the second, in as many calls as at `guidance_scale=1`, the scheduler's count (at 4 steps DDIM makes 4, SD 1.5's PNDM config 5); a guidance-distilled UNet (with it) gets batch `B`.

    The pipelines run through ``__call__`` (PNDM sharing the tiny UNet and VAE); a pre-hook
    records each call, which matches ``len(scheduler.timesteps)`` guided or not.
    """
    from diffusers import PNDMScheduler

    distilled = record_calls(distilled_pipe.unet)
    run(distilled_pipe, guidance_scale=7.5, steps=2)
    assert [args[0].shape[0] for args, _ in distilled.calls] == [1, 1]  # B: no CFG at 7.5
    assert sd_pipe.unet.config.time_cond_proj_dim is None
    unet = record_calls(sd_pipe.unet)
    pndm = tiny_sd_pipeline(
        scheduler=PNDMScheduler(**SD15_PNDM), unet=sd_pipe.unet, vae=sd_pipe.vae
    )
    for pipe, calls in ((sd_pipe, 4), (pndm, 5)):  # 4 steps: DDIM 4 calls, PNDM 5
        unet.calls.clear()
        run(pipe, guidance_scale=1.0, steps=4)
        assert [args[0].shape[0] for args, _ in unet.calls] == [1] * calls
        unet.calls.clear()
        run(pipe, guidance_scale=7.5, steps=4)
        assert len(unet.calls) == calls == len(pipe.scheduler.timesteps)
        for args, kwargs in unet.calls:
            sample, hidden = args[0], kwargs["encoder_hidden_states"]
            assert sample.shape == (2, 4, 8, 8)  # (2B, 4, H/8, W/8) with the tiny VAE's /2
            assert hidden.shape == (2, 77, EMBED_DIM)
            torch.testing.assert_close(hidden[:1], embeds(2))  # negative (uncond) half first
            torch.testing.assert_close(hidden[1:], embeds(1))
            torch.testing.assert_close(sample[:1], sample[1:])


@pytest.mark.parametrize("guidance_scale", [1.0, 0.5, 0.0])
def test_guidance_scale_at_most_one_runs_the_cond_branch_alone(
    sd_pipe, record_calls, guidance_scale
):
    """In `StableDiffusionPipeline`, with `guidance_scale` 1, 0.5 or 0, every UNet call gets a batch of `B` and `prompt_embeds` alone: the unconditional branch is skipped, not interpolated toward."""
    unet = record_calls(sd_pipe.unet)
    run(sd_pipe, guidance_scale=guidance_scale, steps=3)
    assert [args[0].shape[0] for args, _ in unet.calls] == [1, 1, 1]
    for _, kwargs in unet.calls:
        torch.testing.assert_close(kwargs["encoder_hidden_states"], embeds(1))


def test_scales_at_most_one_give_identical_latents(sd_pipe):
    """In `StableDiffusionPipeline`, with a UNet that takes no guidance embedding, `guidance_scale` 0, 0.5 and 1 give bit-identical `latents`: all three are the conditional model."""
    assert sd_pipe.unet.config.time_cond_proj_dim is None
    results = [run(sd_pipe, guidance_scale=s, steps=3) for s in (0.0, 0.5, 1.0)]
    assert torch.equal(results[0], results[1]) and torch.equal(results[1], results[2])


@pytest.fixture(scope="module")
def distilled_pipe():
    """The tiny StableDiffusionPipeline around a guidance-distilled UNet (`time_cond_proj_dim`)."""
    return tiny_sd_pipeline(unet=tiny_unet(time_cond_proj_dim=8))


def test_a_guidance_distilled_unet_still_receives_scales_up_to_one(distilled_pipe, record_calls):
    """A guidance-distilled UNet still receives the scale as `timestep_cond`, so there 0, 0.5 and 1 differ: `StableDiffusionPipeline.__call__` gives three different `latents`, each from one UNet call per step at batch `B`."""
    unet = record_calls(distilled_pipe.unet)
    results = [run(distilled_pipe, guidance_scale=s, steps=2) for s in (0.0, 0.5, 1.0)]
    assert [args[0].shape[0] for args, _ in unet.calls] == [1] * 6
    assert all(kwargs["timestep_cond"] is not None for _, kwargs in unet.calls)
    for i, j in ((0, 1), (0, 2), (1, 2)):
        assert not torch.allclose(results[i], results[j])


def test_do_classifier_free_guidance_is_scale_above_one_without_guidance_embedding(
    sd_pipe, distilled_pipe
):
    """`do_classifier_free_guidance` is `guidance_scale > 1 and unet.config.time_cond_proj_dim is None`."""
    distilled = distilled_pipe
    assert sd_pipe.unet.config.time_cond_proj_dim is None
    for scale, expected in [(0.0, False), (1.0, False), (1.0001, True), (7.5, True)]:
        sd_pipe._guidance_scale = distilled._guidance_scale = scale
        assert sd_pipe.do_classifier_free_guidance is expected, scale
        assert distilled.do_classifier_free_guidance is False, scale  # guidance embedding


def test_default_ddim_config_warns_and_is_rewritten(sd_pipe, run_lab):
    """`StableDiffusionPipeline` built with SD's betas and DDIM's own defaults otherwise (`steps_offset=0`, `clip_sample=True`) warns about each of those two keys and rewrites them to `steps_offset=1` and `clip_sample=False`; DDIM's default `set_alpha_to_one=True` stays, so it is not the lab's config (`set_alpha_to_one=False`): the same call gives the same `latents` after every step but the last, which differs.

    The rewritten config is compared key by key with the starter's own scheduler; both
    pipelines share one tiny UNet and VAE, and ``callback_on_step_end`` records the
    ``latents`` after each step.
    """
    from diffusers import DDIMScheduler

    with pytest.warns(FutureWarning, match="is outdated. `steps_offset` should be set to 1"):
        with pytest.warns(FutureWarning, match="has not set the configuration `clip_sample`"):
            pipe = tiny_sd_pipeline(
                scheduler=DDIMScheduler(**SD_BETAS), unet=sd_pipe.unet, vae=sd_pipe.vae
            )
    config = pipe.scheduler.config
    assert config.steps_offset == 1 and config.clip_sample is False
    lab = run_lab(LAB04, "--guidance-scales", "1", "--num-samples", "100", "--steps", "2")
    labs = lab["scheduler"].config.__dict__
    differ = {k for k in SD_SCHEDULER if config[k] != labs[k]}
    assert differ == {"set_alpha_to_one"} and config.set_alpha_to_one is True

    def per_step(p):
        seen = []

        def record(pipe, i, t, callback_kwargs):
            seen.append(callback_kwargs["latents"].clone())
            return callback_kwargs

        run(p, 7.5, steps=3, callback_on_step_end=record)
        return seen

    rewritten, lab_config = per_step(pipe), per_step(sd_pipe)
    assert len(rewritten) == len(lab_config) == 3
    for before, after in zip(rewritten[:-1], lab_config[:-1], strict=True):
        assert torch.equal(before, after)
    assert not torch.allclose(rewritten[-1], lab_config[-1])


def test_the_labs_guided_step_reproduces_the_pipeline(sd_pipe, run_lab):
    """The lab's guidance lines (`np.concatenate([latents] * 2)`, one call, `np.split`, the extrapolation) in a NumPy loop with labkit's DDIM reproduce `StableDiffusionPipeline`'s final `latents` from the same UNet and starting noise.

    The starter runs, then its own ``sample`` and ``guided_noise_pred`` are called with its own
    DDIM scheduler (SD 1.5's config, like the pipeline's) and two stand-ins put in its
    namespace: ``noise`` (the pipeline's starting latents) and ``unet``, the tiny torch UNet
    behind the toy's ``class_labels`` interface (label 1 = ``prompt_embeds``, label 2 =
    ``negative_prompt_embeds``).
    """
    guidance_scale, steps = 5.0, 6
    expected = run(sd_pipe, guidance_scale=guidance_scale, steps=steps)

    lab = run_lab(LAB04, "--guidance-scales", "1", "--num-samples", "100", "--steps", "2")
    namespace = lab["sample"].__globals__  # the starter's own globals, read by its functions
    scheduler = namespace["scheduler"]
    ours = {k: sd_pipe.scheduler.config[k] for k in SD_SCHEDULER}
    assert {k: scheduler.config.__dict__[k] for k in SD_SCHEDULER} == ours
    label_embeds = {1: embeds(1), 2: embeds(2)}
    calls = []

    def unet(sample, t, class_labels):
        labels = np.broadcast_to(class_labels, (len(sample),))
        calls.append(len(sample))
        with torch.no_grad():
            noise_pred = sd_pipe.unet(
                torch.from_numpy(np.ascontiguousarray(sample)).float(),
                int(t),
                encoder_hidden_states=torch.cat([label_embeds[int(c)] for c in labels]),
            ).sample
        return noise_pred.double().numpy()

    namespace["unet"] = unet
    namespace["noise"] = start_latents().numpy().astype(np.float64)
    scheduler.set_timesteps(steps)
    latents = lab["sample"](guidance_scale, uncond=2)  # class 2: the negative prompt
    assert calls == [2] * steps  # one call per step on the doubled batch
    np.testing.assert_allclose(latents, expected.double().numpy(), rtol=1e-4, atol=1e-4)


def test_negative_prompt_embeds_replace_the_uncond_half_at_the_same_cost(sd_pipe, record_calls):
    """In `StableDiffusionPipeline`, a different `negative_prompt_embeds` changes only the first half of the UNet's `encoder_hidden_states` (and through it the result); the batch stays `2B`, in as many calls."""
    unet = record_calls(sd_pipe.unet)
    base = run(sd_pipe, guidance_scale=1.5, steps=3)
    other = sd_pipe(
        prompt_embeds=embeds(1),
        negative_prompt_embeds=embeds(3),
        num_inference_steps=3,
        guidance_scale=1.5,
        height=HEIGHT,
        width=WIDTH,
        latents=start_latents(),
        output_type="latent",
    ).images
    assert [args[0].shape[0] for args, _ in unet.calls] == [2] * 6
    for _, kwargs in unet.calls[3:]:
        torch.testing.assert_close(kwargs["encoder_hidden_states"][:1], embeds(3))
        torch.testing.assert_close(kwargs["encoder_hidden_states"][1:], embeds(1))
    assert not torch.allclose(base, other)


def test_only_scale_model_input_sees_the_doubled_batch(monkeypatch):
    """Guidance is applied to the model output: of the DDIM scheduler's methods, `StableDiffusionPipeline.__call__` hands only `scale_model_input` the doubled batch `2B`, and `scheduler.step` sees batch `B`.

    Every public method of the scheduler instance (enumerated from it) records the batch of
    each 4-D tensor it receives.
    """
    from diffusers import DDIMScheduler

    pipe = tiny_sd_pipeline(scheduler=DDIMScheduler(**SD_SCHEDULER))
    seen: dict[str, set[int]] = {}
    for name in dir(pipe.scheduler):
        method = getattr(pipe.scheduler, name, None)
        if name.startswith("_") or not inspect.ismethod(method):
            continue

        def wrapper(*args, _name=name, _method=method, **kwargs):
            for value in (*args, *kwargs.values()):
                if isinstance(value, torch.Tensor) and value.ndim == 4:
                    seen.setdefault(_name, set()).add(value.shape[0])
            return _method(*args, **kwargs)

        monkeypatch.setattr(pipe.scheduler, name, wrapper)
    run(pipe, guidance_scale=7.5, steps=2)
    assert seen == {"scale_model_input": {2}, "step": {1}}


def test_a_negative_prompt_adds_a_pass_in_flux_only(sd_pipe, record_calls):
    """A negative prompt adds no UNet call or row in `StableDiffusionPipeline` (the calls stay at `2B`, as many as without it), while in `FluxPipeline`, with `true_cfg_scale > 1`, it adds a second transformer call per step at batch `B`.

    SD runs with ``embeds(2)`` standing in for the encoded empty prompt, then ``embeds(3)``
    for a negative prompt; Flux without and with negative embeddings, at ``true_cfg_scale=4``.
    """
    unet = record_calls(sd_pipe.unet).calls
    for negative in (embeds(2), embeds(3)):
        sd_pipe(prompt_embeds=embeds(1), negative_prompt_embeds=negative, guidance_scale=7.5,
                num_inference_steps=2, height=HEIGHT, width=WIDTH, latents=start_latents(),
                output_type="latent")  # fmt: skip
    assert [args[0].shape[0] for args, _ in unet] == [2] * 4
    flux = tiny_flux_pipeline()
    text, pooled = flux_prompt_embeds()  # [neg, pos]
    transformer = record_calls(flux.transformer).calls
    counts = []
    for negative in ({}, dict(negative_prompt_embeds=text[:1], negative_pooled_prompt_embeds=pooled[:1])):  # fmt: skip
        transformer.clear()
        flux(prompt_embeds=text[1:], pooled_prompt_embeds=pooled[1:], true_cfg_scale=4.0,
             num_inference_steps=2, height=HEIGHT, width=WIDTH,
             generator=torch.Generator().manual_seed(1), output_type="latent", **negative)  # fmt: skip
        assert all(kwargs["hidden_states"].shape[0] == 1 for _, kwargs in transformer)
        counts.append(len(transformer))
    assert counts == [2, 4]  # 2 steps: one call each, then two
