"""Lab 11 (scheduler loop reading) against the real StableDiffusionPipeline and schedulers.

The lab's own loop (``run_loop`` from the starter, with its own scheduler) must reproduce
the real pipeline's loop on a tiny random UNet (``tiny.py``): the same `init_noise_sigma`,
`scale_model_input`, `step` and number of calls.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    HeunDiscreteScheduler,
    PNDMScheduler,
)
from tiny import (
    HEIGHT,
    SD15_SCHEDULER_FILE,
    SD_SCHEDULER,
    WIDTH,
    embeds,
    flux_prompt_embeds,
    start_latents,
    tiny_controlnet,
    tiny_controlnet_pipeline,
    tiny_flux_pipeline,
    tiny_sd_pipeline,
    tiny_unet,
)

LAB11 = "code/lab-11-scheduler-loop-reading/scheduler_loop.py"
#: a quick run of the starter: its functions and config are what the tests use
QUICK = ("--steps", "2", "--schedulers", "ddim", "--num-samples", "100")


#: SD 1.5's scheduler_config.json, as ``cls.from_config(pipe.scheduler.config)`` hands it to a
#: new class (keys the class does not take are ignored)
SD15 = {key: value for key, value in SD15_SCHEDULER_FILE.items() if not key.startswith("_")}
#: the overrides the lab page lists for each DDPM-family configuration ("the five configurations")
OVERRIDES = {
    "ddpm": (DDPMScheduler, {}),
    "ddim": (DDIMScheduler, dict(timestep_spacing="trailing", set_alpha_to_one=True)),
    "euler": (EulerDiscreteScheduler, {}),
    "euler_karras": (EulerDiscreteScheduler, dict(use_karras_sigmas=True)),
}


def diffusers_configs():
    """diffusers' classes built as the page says the starter's ``make`` builds labkit's: SD 1.5's
    config through ``from_config`` plus the listed overrides; ``flow_match`` is SD3's scheduler."""
    schedulers = {
        name: cls.from_config({**SD15, **overrides}) for name, (cls, overrides) in OVERRIDES.items()
    }
    schedulers["flow_match"] = FlowMatchEulerDiscreteScheduler(shift=3.0)
    return schedulers


def test_the_labs_configs_are_sd15s_with_the_listed_overrides(run_lab):
    """The four DDPM-family configurations start from SD 1.5's config as `from_config(pipe.scheduler.config)` carries it over, with the overrides listed below (DDIM: `trailing` and `set_alpha_to_one=True`); `flow_match` is SD3's scheduler with `shift=3.0`.

    Each of the starter's ``make(name)`` schedulers runs the starter's own ``run_loop`` on the
    toy; the same loop with the diffusers class built that way, stepping in torch float64 on
    the same perfect denoiser, ends at the same samples. DDPM draws its own noise, so only its
    grid is compared.
    """
    lab = run_lab(LAB11, *QUICK)
    schedulers = diffusers_configs()
    assert list(schedulers) == lab["SCHEDULERS"]
    for name, theirs in schedulers.items():
        ours, unet = lab["make"](name)
        if name == "ddpm":
            ours.set_timesteps(5), theirs.set_timesteps(5)
            np.testing.assert_array_equal(ours.timesteps, theirs.timesteps.numpy())
            continue
        expected = lab["run_loop"](ours, unet, 5, 0)
        theirs.set_timesteps(5)
        latents = torch.from_numpy(lab["noise"]) * getattr(theirs, "init_noise_sigma", 1.0)
        for t in theirs.timesteps:
            model_input = latents
            if hasattr(theirs, "scale_model_input"):
                model_input = theirs.scale_model_input(latents, t)
            noise_pred = unet(model_input.numpy(), float(t), class_labels=None)
            latents = theirs.step(torch.from_numpy(noise_pred), t, latents).prev_sample
        np.testing.assert_allclose(latents.double().numpy(), expected, rtol=1e-4, atol=1e-4,
                                   err_msg=name)  # fmt: skip


def test_the_labs_schedulers_give_n_timesteps_for_n_steps(run_lab):
    """Built with diffusers' classes, each of the lab's five configurations has `order = 1` and gives `n` timesteps for `set_timesteps(n)` at the page's step counts (2 to 200), but not at every `n`: DDIM's `trailing` grid gives 62 at `n = 61`, the last `t = -1`, as the starter's does; and SD 1.5's `PNDMScheduler` (`order = 1`) gives `n + 1` from `n = 2` (one at `n = 1`).

    ``trailing`` computes ``np.arange(1000, 0, -1000 / n)``, whose float step can give ``n + 1``
    entries; the last rounds to 0 and becomes -1.
    """
    lab = run_lab(LAB11, *QUICK)
    schedulers = diffusers_configs()
    assert list(schedulers) == lab["SCHEDULERS"]
    for name, scheduler in schedulers.items():
        assert scheduler.order == 1, name
        for n in [2, 5, 10, 25, 50, 200]:
            scheduler.set_timesteps(n)
            assert len(scheduler.timesteps) == n, (name, n)
    ddim, (ours, _) = schedulers["ddim"], lab["make"]("ddim")
    ddim.set_timesteps(61), ours.set_timesteps(61)
    assert len(ddim.timesteps) == len(ours.timesteps) == 62
    assert int(ddim.timesteps[-1]) == int(ours.timesteps[-1]) == -1
    pndm = PNDMScheduler(skip_prk_steps=True, set_alpha_to_one=False, **lab["sd_config"])
    assert pndm.order == 1
    for n, expected in [(1, 1), (2, 3), (10, 11), (999, 1000)]:
        pndm.set_timesteps(n)
        assert len(pndm.timesteps) == expected, n


def test_trailing_ddims_extra_step_reads_the_noise_level_of_t_999(run_lab):
    """The `trailing` DDIM grid gains a last $t = -1$ at some step counts, whose step reads `alphas_cumprod[-1]`, the value for $t = 999$.

    ``DDIMScheduler.step`` indexes ``self.alphas_cumprod[timestep]``, and -1 wraps to the last
    entry: with a zero ``noise_pred`` its ``pred_original_sample`` at ``t = -1`` is the sample
    divided by ``sqrt(alphas_cumprod[999])``, about 15 times the sample, in diffusers and in the
    starter's mirror alike (the lab's DDIM configuration at 61 steps).
    """
    lab = run_lab(LAB11, *QUICK)
    ddim, (ours, _) = diffusers_configs()["ddim"], lab["make"]("ddim")
    ddim.set_timesteps(61), ours.set_timesteps(61)
    sample = torch.ones(1, 2, dtype=torch.float64)
    theirs = ddim.step(torch.zeros_like(sample), ddim.timesteps[-1], sample).pred_original_sample
    expected = sample / ddim.alphas_cumprod[999].double().sqrt()
    torch.testing.assert_close(theirs.double(), expected)
    mine = ours.step(np.zeros((1, 2)), ours.timesteps[-1], np.ones((1, 2))).pred_original_sample
    np.testing.assert_allclose(mine, expected.numpy(), rtol=1e-5)
    assert expected[0, 0] > 10


@pytest.mark.parametrize("steps", [3, 7])
def test_the_pipeline_calls_the_unet_once_per_timestep(record_calls, steps):
    """`StableDiffusionPipeline` with an Euler scheduler calls the UNet `len(scheduler.timesteps)` times, each with the current `t`; at 1000 steps SD's `DDIMScheduler` (`steps_offset=1`) puts t = 1000 first and makes one UNet call, then an `IndexError`, so the interview hook's `len(timesteps)` count says "below 1000 steps"; after the loop it runs `vae.decode`, then SD 1.5's safety checker, once each (a tiny `StableDiffusionSafetyChecker`, one forward for a batch of 2)."""
    pipe = tiny_sd_pipeline(scheduler=EulerDiscreteScheduler.from_config(SD_SCHEDULER))
    unet = record_calls(pipe.unet)
    pipe(
        prompt_embeds=embeds(1),
        num_inference_steps=steps,
        guidance_scale=1.0,
        height=HEIGHT,
        width=WIDTH,
        latents=start_latents(),
        output_type="latent",
    )
    assert len(unet.calls) == steps == len(pipe.scheduler.timesteps)
    assert [float(args[1]) for args, _ in unet.calls] == pipe.scheduler.timesteps.tolist()
    if steps == 3:  # the 1000-step edge, once
        pipe.scheduler = DDIMScheduler.from_config(SD_SCHEDULER)
        unet.calls.clear()
        with pytest.raises(IndexError), torch.no_grad():
            pipe(prompt_embeds=embeds(1), num_inference_steps=1000, guidance_scale=1.0,
                 height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
        assert len(unet.calls) == 1 and int(pipe.scheduler.timesteps[0]) == 1000
        from diffusers.pipelines.stable_diffusion.safety_checker import (
            StableDiffusionSafetyChecker,
        )
        from transformers import CLIPConfig, CLIPImageProcessor

        small = dict(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
        )
        config = CLIPConfig(
            text_config=dict(small, vocab_size=100),
            vision_config=dict(small, image_size=32, patch_size=8),
            projection_dim=8,
        )
        checker = StableDiffusionSafetyChecker(config).eval()  # the class SD 1.5 ships
        size = dict(shortest_edge=32)
        pipe = tiny_sd_pipeline(
            scheduler=EulerDiscreteScheduler.from_config(SD_SCHEDULER),
            safety_checker=checker,
            feature_extractor=CLIPImageProcessor(size=size, crop_size=dict(height=32, width=32)),
        )
        stages, decode = [], pipe.vae.decode
        pipe.vae.decode = lambda *a, **k: stages.append("decode") or decode(*a, **k)
        checker.register_forward_hook(lambda *a: stages.append("safety checker"))
        with torch.no_grad():
            pipe(prompt_embeds=embeds(1, batch=2), num_inference_steps=steps, guidance_scale=1.0,
                 height=HEIGHT, width=WIDTH, output_type="np")  # fmt: skip
        assert stages == ["decode", "safety checker"], stages
        from infralens_docs.registry import ROOT

        page = (ROOT / "docs" / "labs" / "lab-11-scheduler-loop-reading.md").read_text(
            encoding="utf-8"
        )
        hook = [line for line in page.splitlines() if line.startswith("- **Interview hook.**")]
        assert len(hook) == 1 and "below 1000 steps" in hook[0], hook
        assert "one decode, then SD 1.5's safety checker, after it" in hook[0], hook


def test_pndm_and_heun_make_more_unet_calls_than_steps(record_calls):
    """SD 1.5's default PNDM (51 calls at 50 steps) and Heun (19 at 10) make more calls too: `StableDiffusionPipeline.__call__` calls the UNet once per entry of `scheduler.timesteps`, 51 times with SD 1.5's `PNDMScheduler` at `num_inference_steps=50` and 19 times with `HeunDiscreteScheduler` at 10; at 1 step each makes one call."""
    pipe = tiny_sd_pipeline(scheduler=PNDMScheduler.from_config(SD15))
    unet = record_calls(pipe.unet)
    for scheduler, steps, calls in [
        (PNDMScheduler.from_config(SD15), 50, 51),
        (HeunDiscreteScheduler.from_config(SD15), 10, 19),
        (PNDMScheduler.from_config(SD15), 1, 1),
        (HeunDiscreteScheduler.from_config(SD15), 1, 1),
    ]:
        pipe.scheduler = scheduler
        unet.calls.clear()
        with torch.no_grad():
            pipe(prompt_embeds=embeds(1), num_inference_steps=steps, guidance_scale=1.0,
                 height=HEIGHT, width=WIDTH, latents=start_latents(), output_type="latent")  # fmt: skip
        assert len(unet.calls) == calls == len(scheduler.timesteps), (type(scheduler), steps)
    from infralens_docs.registry import ROOT

    page = (ROOT / "docs/labs/lab-11-scheduler-loop-reading.md").read_text(encoding="utf-8")
    assert "`order == 2`" not in page  # at 1 step every order-2 export gives 1 timestep


def test_denoiser_passes_are_one_or_more_per_timesteps_entry_run(record_calls):
    """A pipeline makes one or more denoiser passes per entry of the scheduler's timesteps it runs: `StableDiffusionPipeline` makes one UNet call per entry (guidance batched), `FluxPipeline` with `true_cfg_scale > 1` and a negative prompt makes two transformer calls per entry, and `StableDiffusionImg2ImgPipeline` at `strength=0.5` runs only the last half of its 10 entries, one call each."""
    from tiny import tiny_sd_variant

    sd = tiny_sd_pipeline(scheduler=DDIMScheduler.from_config(SD_SCHEDULER))
    unet = record_calls(sd.unet)
    with torch.no_grad():
        sd(prompt_embeds=embeds(1), negative_prompt_embeds=embeds(2), guidance_scale=7.5,
           num_inference_steps=4, height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
    assert [int(args[1]) for args, _ in unet.calls] == sd.scheduler.timesteps.tolist()
    assert all(args[0].shape[0] == 2 for args, _ in unet.calls)

    flux = tiny_flux_pipeline()
    transformer = record_calls(flux.transformer)
    (neg, pos), (neg_pooled, pooled) = (t.split(1) for t in flux_prompt_embeds())
    with torch.no_grad():
        flux(prompt_embeds=pos, pooled_prompt_embeds=pooled, negative_prompt_embeds=neg,
             negative_pooled_prompt_embeds=neg_pooled, true_cfg_scale=4.0, num_inference_steps=3,
             height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
    assert len(transformer.calls) == 2 * len(flux.scheduler.timesteps) == 6

    img2img = tiny_sd_variant("StableDiffusionImg2ImgPipeline")
    img2img.scheduler = DDIMScheduler.from_config(SD_SCHEDULER)
    unet = record_calls(img2img.unet)
    with torch.no_grad():
        img2img(prompt_embeds=embeds(1), image=torch.rand(1, 3, HEIGHT, WIDTH), strength=0.5,
                num_inference_steps=10, guidance_scale=1.0, output_type="latent")  # fmt: skip
    timesteps = img2img.scheduler.timesteps.tolist()
    assert len(timesteps) == 10 and [int(args[1]) for args, _ in unet.calls] == timesteps[5:]


def test_the_labs_euler_loop_reproduces_the_pipeline(run_lab):
    """The lab's loop (`latents = noise * init_noise_sigma`, then `scale_model_input`, the call and `step(...).prev_sample` per `t`) with labkit's Euler scheduler reproduces `StableDiffusionPipeline`'s final `latents` with `EulerDiscreteScheduler` from the same starting noise.

    The starter's own ``run_loop`` and ``make("euler")`` run, with two stand-ins put in its
    namespace: ``noise`` (the pipeline's starting latents) and a denoiser that calls the tiny
    torch UNet with the pipeline's ``prompt_embeds``.
    """
    pipe = tiny_sd_pipeline(scheduler=EulerDiscreteScheduler.from_config(SD_SCHEDULER))
    steps = 8
    expected = pipe(
        prompt_embeds=embeds(1),
        num_inference_steps=steps,
        guidance_scale=1.0,
        height=HEIGHT,
        width=WIDTH,
        latents=start_latents(),
        output_type="latent",
    ).images

    lab = run_lab(LAB11, *QUICK)
    scheduler, _ = lab["make"]("euler")
    for key in ["beta_schedule", "beta_start", "beta_end", "timestep_spacing", "steps_offset"]:
        assert getattr(scheduler.config, key) == pipe.scheduler.config[key], key
    calls = []

    def unet(sample, t, class_labels=None):
        calls.append(t)
        with torch.no_grad():
            noise_pred = pipe.unet(
                torch.from_numpy(np.ascontiguousarray(sample)).float(),
                float(t),
                encoder_hidden_states=embeds(1),
            ).sample
        return noise_pred.double().numpy()

    lab["run_loop"].__globals__["noise"] = start_latents().numpy().astype(np.float64)
    latents = lab["run_loop"](scheduler, unet, steps, 0)
    assert len(calls) == steps
    np.testing.assert_allclose(latents, expected.double().numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cls", [EulerDiscreteScheduler, FlowMatchEulerDiscreteScheduler])
def test_euler_keeps_a_step_index_that_step_advances(cls):
    """`EulerDiscreteScheduler.step` and `FlowMatchEulerDiscreteScheduler.step` advance an internal `step_index` and `set_timesteps` resets it, so one instance must not serve two loops at once."""
    scheduler = cls.from_config(SD_SCHEDULER)
    scheduler.set_timesteps(5)
    assert scheduler.step_index is None
    sample = torch.zeros(1, 4, 2, 2)
    scheduler.step(torch.zeros_like(sample), scheduler.timesteps[0], sample)
    scheduler.step(torch.zeros_like(sample), scheduler.timesteps[1], sample)
    assert scheduler.step_index == 2
    scheduler.set_timesteps(5)
    assert scheduler.step_index is None


def test_flow_match_has_no_init_noise_sigma_or_scale_model_input(run_lab, record_calls):
    """diffusers' `FlowMatchEulerDiscreteScheduler` has neither `init_noise_sigma` nor `scale_model_input`, and `FluxPipeline` hands its transformer the starting noise unscaled; labkit's mirror has an `init_noise_sigma` of 1.0 and an identity `scale_model_input` so that one loop body fits all five.

    The tiny FluxPipeline built by ``tiny.tiny_flux_pipeline``; Flux packs the noise into 2 x 2
    patches.
    """
    FLUX_TEXT, FLUX_POOLED = flux_prompt_embeds()
    real = FlowMatchEulerDiscreteScheduler(shift=3.0)
    assert not hasattr(real, "init_noise_sigma") and not hasattr(real, "scale_model_input")
    ours, _ = run_lab(LAB11, *QUICK)["make"]("flow_match")
    assert ours.init_noise_sigma == 1.0
    x = np.arange(6.0).reshape(3, 2)
    assert np.array_equal(ours.scale_model_input(x, 500.0), x)
    pipe = tiny_flux_pipeline()
    calls = record_calls(pipe.transformer).calls
    pipe(prompt_embeds=FLUX_TEXT[1:], pooled_prompt_embeds=FLUX_POOLED[1:], num_inference_steps=2,
         height=HEIGHT, width=WIDTH, generator=torch.Generator().manual_seed(1),
         output_type="latent")  # fmt: skip
    noise = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(1))
    packed = noise.view(1, 16, 4, 2, 4, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, 16, 64)
    torch.testing.assert_close(calls[0][1]["hidden_states"], packed, rtol=0, atol=0)


def test_generator_reaches_every_step_whose_signature_takes_it(monkeypatch):
    """`StableDiffusionPipeline` passes `generator` and `eta` to `scheduler.step` whenever its signature has them (`prepare_extra_step_kwargs`): DDPM and Euler get `generator`, DDIM gets both; `FluxPipeline` passes neither to `FlowMatchEulerDiscreteScheduler.step`.

    A spy on ``scheduler.step`` records the keyword arguments of each pipeline's own loop; the
    tiny FluxPipeline is ``tiny.tiny_flux_pipeline``.
    """
    FLUX_TEXT, FLUX_POOLED = flux_prompt_embeds()

    def step_kwargs(pipe, **call):
        seen, original = [], pipe.scheduler.step

        @functools.wraps(original)  # the pipeline inspects step's signature: keep it
        def step(*args, **kwargs):
            seen.append(kwargs)
            return original(*args, **kwargs)

        monkeypatch.setattr(pipe.scheduler, "step", step)
        pipe(num_inference_steps=2, height=HEIGHT, width=WIDTH, output_type="latent", **call)
        assert len(seen) == 2
        return {k for k in seen[0] if k != "return_dict"}, seen[0]

    generator = torch.Generator().manual_seed(0)
    sd_call = dict(prompt_embeds=embeds(1), guidance_scale=1.0, eta=0.3, generator=generator)
    expected = {
        DDPMScheduler: {"generator"},
        DDIMScheduler: {"eta", "generator"},
        EulerDiscreteScheduler: {"generator"},
    }
    for cls, keys in expected.items():
        pipe = tiny_sd_pipeline(scheduler=cls.from_config(SD_SCHEDULER))
        names, kwargs = step_kwargs(pipe, **sd_call)
        assert names == keys, cls.__name__
        assert kwargs["generator"] is generator
    flux_call = dict(prompt_embeds=FLUX_TEXT[1:], pooled_prompt_embeds=FLUX_POOLED[1:])
    names, _ = step_kwargs(tiny_flux_pipeline(), generator=generator, **flux_call)
    assert names == set()


def test_controlnet_runs_every_step_and_feeds_residuals_to_the_unet(record_calls):
    """In `StableDiffusionControlNetPipeline` the ControlNet runs once per step on the current latents, and its outputs enter the UNet call as `down_block_additional_residuals` (one tensor per skip connection) and `mid_block_additional_residual`.

    ``from_unet`` zero-initialises the ControlNet's output convolutions; they are re-drawn so
    that the residuals are not zeros, and a forward hook compares what the ControlNet returns
    with what the UNet receives.
    """
    unet = tiny_unet()
    controlnet = tiny_controlnet(unet, trained=True, channels=(8, 16))
    pipe = tiny_controlnet_pipeline(unet, controlnet, scheduler=DDIMScheduler(**SD_SCHEDULER))
    control_calls, unet_calls = record_calls(pipe.controlnet), record_calls(pipe.unet)
    outputs = []
    handle = pipe.controlnet.register_forward_hook(lambda m, a, out: outputs.append(out))
    try:
        pipe(
            prompt_embeds=embeds(1),
            image=torch.rand(1, 3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(0)),
            num_inference_steps=3,
            guidance_scale=1.0,
            height=HEIGHT,
            width=WIDTH,
            latents=start_latents(),
            output_type="latent",
        )
    finally:
        handle.remove()
    assert len(control_calls.calls) == len(unet_calls.calls) == len(outputs) == 3
    for (args, _), (unet_args, kwargs), (down, mid) in zip(
        control_calls.calls, unet_calls.calls, outputs, strict=True
    ):
        torch.testing.assert_close(args[0], unet_args[0])  # the current latents, as the UNet's
        received = kwargs["down_block_additional_residuals"]
        assert len(received) == len(down) == len(controlnet.controlnet_down_blocks)
        for ours, theirs in zip(down, received, strict=True):
            torch.testing.assert_close(theirs, ours, rtol=0, atol=0)
        torch.testing.assert_close(kwargs["mid_block_additional_residual"], mid, rtol=0, atol=0)
        assert mid.abs().max() > 0
    latents_seen = [args[0] for args, _ in control_calls.calls]
    assert not torch.equal(latents_seen[0], latents_seen[1])  # new latents every step
