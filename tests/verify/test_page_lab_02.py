"""Lab 02 (one denoising step) against the installed diffusers.

The starter runs in-process and its own `latent` and `noise_pred` go to diffusers'
``DDPMScheduler.step`` and ``DDIMScheduler.step`` (``clip_sample=False``), which must
give the lab's numbers to float32 tolerance.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, PNDMScheduler
from tiny import SD15_PNDM, SD_SCHEDULER, canonical_beta_range, embeds, start_latents, t64

LAB02 = "code/lab-02-denoising-step/denoising_step.py"


STEP_CASES = [
    ("linear", 500, 10),
    ("linear", 500, 1000),
    ("linear", 500, 2),
    ("scaled_linear", 700, 10),
    ("squaredcos_cap_v2", 300, 50),
]


@pytest.mark.parametrize(("schedule", "timestep", "steps"), STEP_CASES)
def test_lab02_ddpm_step_is_ddpm_scheduler_step(run_lab, schedule, timestep, steps):
    """The lab's DDPM step is `DDPMScheduler.step`: the same `prev_timestep`, `pred_original_sample`, posterior variance and posterior mean, for three schedules and 2 to 1000 steps."""
    g = run_lab(
        LAB02, "--schedule", schedule, "--timestep", str(timestep),
        "--num-inference-steps", str(steps), "--num-samples", "500",
    )  # fmt: skip
    scheduler = DDPMScheduler(
        beta_schedule=schedule, clip_sample=False, **canonical_beta_range(schedule)
    )
    scheduler.set_timesteps(steps)
    assert timestep in scheduler.timesteps
    assert int(scheduler.previous_timestep(timestep)) == g["prev_timestep"]

    latent, noise_pred = t64(g["latent"]), t64(g["noise_pred"])
    out = scheduler.step(noise_pred, timestep, latent, generator=torch.Generator().manual_seed(0))
    np.testing.assert_allclose(
        g["pred_original_sample"], out.pred_original_sample.numpy(), atol=1e-4
    )

    # diffusers draws its own step noise; redraw it to split prev_sample into mean + noise.
    z = torch.randn(latent.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    variance = float(scheduler._get_variance(timestep))
    np.testing.assert_allclose(g["variance"], variance, rtol=1e-4, atol=1e-7)  # float32 1 - ab
    theirs_mean = out.prev_sample - variance**0.5 * z
    np.testing.assert_allclose(g["pred_prev_sample"], theirs_mean.numpy(), atol=1e-4)


@pytest.mark.parametrize(("schedule", "timestep", "steps"), STEP_CASES)
def test_lab02_ddim_step_is_ddim_scheduler_step(run_lab, schedule, timestep, steps):
    """The lab's DDIM step (`eta=0`) is `DDIMScheduler.step`: the same `prev_sample` and `pred_original_sample`."""
    g = run_lab(
        LAB02, "--schedule", schedule, "--timestep", str(timestep),
        "--num-inference-steps", str(steps), "--num-samples", "500",
    )  # fmt: skip
    scheduler = DDIMScheduler(
        beta_schedule=schedule, clip_sample=False, **canonical_beta_range(schedule)
    )
    scheduler.set_timesteps(steps)
    out = scheduler.step(t64(g["noise_pred"]), timestep, t64(g["latent"]), eta=0.0)
    np.testing.assert_allclose(g["latent_prev_ddim"], out.prev_sample.numpy(), atol=1e-4)
    np.testing.assert_allclose(
        g["pred_original_sample"], out.pred_original_sample.numpy(), atol=1e-4
    )


@pytest.mark.parametrize("prediction_type", ["sample", "v_prediction"])
def test_lab02_conversions_are_what_the_scheduler_does(run_lab, prediction_type):
    """Given the lab's `sample` or `v_prediction` output with the matching `prediction_type`, `DDIMScheduler.step` recovers the same `pred_original_sample` and `prev_sample` as from `epsilon`.

    The three targets carry the same information once `x_t` is known.
    """
    g = run_lab(LAB02, "--num-samples", "500")
    model_output = g["pred_original_sample"] if prediction_type == "sample" else g["v_pred"]
    scheduler = DDIMScheduler(clip_sample=False, prediction_type=prediction_type)
    scheduler.set_timesteps(10)
    out = scheduler.step(t64(model_output), g["timestep"], t64(g["latent"]), eta=0.0)
    np.testing.assert_allclose(
        g["pred_original_sample"], out.pred_original_sample.numpy(), atol=1e-4
    )
    np.testing.assert_allclose(g["latent_prev_ddim"], out.prev_sample.numpy(), atol=1e-4)


def test_both_schedulers_clip_pred_original_sample_by_default():
    """`DDPMScheduler` and `DDIMScheduler` default to `clip_sample=True`, which clamps `pred_original_sample` to `[-1, 1]`."""
    sample = torch.full((1, 2), 3.0, dtype=torch.float64)  # an x0 estimate far outside [-1, 1]
    for cls in (DDPMScheduler, DDIMScheduler):
        scheduler = cls()
        assert scheduler.config.clip_sample is True and scheduler.config.clip_sample_range == 1.0
        scheduler.set_timesteps(10)
        t = int(scheduler.timesteps[0])
        out = scheduler.step(torch.zeros_like(sample), t, sample, generator=torch.Generator())
        assert float(out.pred_original_sample.abs().max()) == 1.0, cls.__name__


def test_ddpm_adds_no_noise_at_t_zero():
    """`DDPMScheduler.step` adds fresh noise at every timestep except `t == 0`: there two different generators give the same `prev_sample`."""
    scheduler = DDPMScheduler(clip_sample=False)
    scheduler.set_timesteps(10)
    sample, eps = torch.randn(4, 2, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)

    def step(t, seed):
        gen = torch.Generator().manual_seed(seed)
        return scheduler.step(eps, t, sample, generator=gen).prev_sample

    assert int(scheduler.timesteps[-1]) == 0
    torch.testing.assert_close(step(0, 1), step(0, 2))
    assert not torch.allclose(step(100, 1), step(100, 2))


def test_ddim_eta1_differs_from_ddpm_at_the_final_step():
    """With `eta=1` and `clip_sample=False`, on SD 1.x's schedule and a 10-step `leading` grid, DDIM's step has the same distribution as DDPM's, except at the final step under SD 1.x's `set_alpha_to_one=False`: DDIM then targets `alphas_cumprod[0]`, while DDPM lands on clean data.

    (Round 11 cut "and still adds noise": with the class default `steps_offset=0` the final step
    is t = 0, where `alphas_cumprod[0]` is DDIM's own level and it adds none.)
    Both schedulers on SD 1.x's settings at 10 steps: one generator seed gives both steps the
    same fresh noise, so at 501 their whole `prev_sample` agrees; the spread between two
    seeds' `prev_sample` at the last timestep (1). With the classes' default
    `clip_sample=True` and a clipped `pred_original_sample` the two steps part: DDIM keeps
    the unclipped noise estimate (`use_clipped_model_output=False`), DDPM does not."""
    sample, eps = torch.randn(4, 2, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    ddpm = DDPMScheduler(**{k: v for k, v in SD_SCHEDULER.items() if k != "set_alpha_to_one"})
    ddim, ddim_one = (
        DDIMScheduler(**SD_SCHEDULER),
        DDIMScheduler(**{**SD_SCHEDULER, "set_alpha_to_one": True}),
    )
    spread = {}
    for name, scheduler, kw in [
        ("ddpm", ddpm, {}),
        ("ddim", ddim, {"eta": 1.0}),
        ("ddim_one", ddim_one, {"eta": 1.0}),
    ]:
        scheduler.set_timesteps(10)
        for t in (501, 1):
            a, b = (
                scheduler.step(
                    eps, t, sample, generator=torch.Generator().manual_seed(s), **kw
                ).prev_sample
                for s in (1, 2)
            )
            spread[name, t] = (a - b).std().item()
    assert spread["ddim", 501] == pytest.approx(spread["ddpm", 501], rel=1e-6)  # same noise std
    assert spread["ddpm", 1] < 1e-8 and spread["ddim_one", 1] < 1e-8  # clean data
    assert spread["ddim", 1] > 1e-3  # alphas_cumprod[0] < 1: noise at the last step
    offset0 = DDIMScheduler(**{**SD_SCHEDULER, "steps_offset": 0})  # set_alpha_to_one=False
    offset0.set_timesteps(10)
    assert offset0.timesteps[-1].item() == 0
    a, b = (
        offset0.step(
            eps, 0, sample, eta=1.0, generator=torch.Generator().manual_seed(s)
        ).prev_sample
        for s in (1, 2)
    )
    assert torch.equal(a, b)  # no noise at this final step: DDIM returns its input
    page = Path(__file__).resolve().parents[2] / "docs/labs/lab-02-denoising-step.md"
    line = next(x for x in page.read_text().splitlines() if "same distribution as DDPM" in x)
    assert "still adds noise" not in line, line

    e = torch.randn(4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def one_step(scheduler, x, **kw):  # seed 1: the same fresh noise for both classes
        scheduler.set_timesteps(10)
        gen = torch.Generator().manual_seed(1)
        return scheduler.step(e, 501, x, generator=gen, **kw)

    x = torch.randn(4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(  # same mean and same noise: the same step (float32 alphas)
        one_step(ddim, x, eta=1.0).prev_sample, one_step(ddpm, x).prev_sample, rtol=0, atol=1e-5
    )
    clipped = {k: v for k, v in SD_SCHEDULER.items() if k != "clip_sample"}  # default True
    ddpm_clip = DDPMScheduler(**{k: v for k, v in clipped.items() if k != "set_alpha_to_one"})
    x = 3 * x
    out = one_step(DDIMScheduler(**clipped), x, eta=1.0)
    assert float(out.pred_original_sample.abs().max()) == 1.0  # clipping engaged
    assert (out.prev_sample - one_step(ddpm_clip, x).prev_sample).abs().max() > 0.1


def test_from_config_carries_the_schedule_and_prediction_type():
    """`DDIMScheduler.from_config(ddpm.config)` keeps the schedule (`betas`, `alphas_cumprod`) and `prediction_type`: swapping the sampler needs no new model."""
    ddpm = DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                         prediction_type="v_prediction")  # fmt: skip
    ddim = DDIMScheduler.from_config(ddpm.config)
    torch.testing.assert_close(ddim.alphas_cumprod, ddpm.alphas_cumprod)
    assert ddim.config.prediction_type == "v_prediction"


def test_a_prediction_type_mismatch_raises_nothing(sd_pipe):
    """In `DDIMScheduler`, reading a model output as another of its three `prediction_type` values raises no error (SD 1.5's `PNDMScheduler` raises a `ValueError` for `sample`): `StableDiffusionPipeline` runs the same UNet from the same `latents` to the end with `DDIMScheduler` set to `epsilon`, `sample` or `v_prediction`, each returning finite `latents` of the same shape and dtype, and different ones."""
    original, results = sd_pipe.scheduler, []
    try:
        for prediction_type in ("epsilon", "sample", "v_prediction"):
            sd_pipe.scheduler = DDIMScheduler(**SD_SCHEDULER, prediction_type=prediction_type)
            results.append(
                sd_pipe(
                    prompt_embeds=embeds(0),
                    latents=start_latents(),
                    num_inference_steps=5,
                    guidance_scale=1.0,
                    output_type="latent",
                ).images
            )
    finally:
        sd_pipe.scheduler = original
    latents = start_latents()
    for r in results:
        assert r.shape == latents.shape and r.dtype == latents.dtype
        assert torch.isfinite(r).all()
    assert not torch.allclose(results[0], results[1]) and not torch.allclose(results[0], results[2])
    from diffusers import PNDMScheduler
    from tiny import SD15_PNDM

    try:
        sd_pipe.scheduler = PNDMScheduler(**{**SD15_PNDM, "prediction_type": "sample"})
        with pytest.raises(ValueError, match="prediction_type"):
            sd_pipe(prompt_embeds=embeds(0), latents=start_latents(), num_inference_steps=2,
                    guidance_scale=1.0, output_type="latent")  # fmt: skip
    finally:
        sd_pipe.scheduler = original


def test_the_ddim_sd_loop_alternates_one_unet_call_and_one_step(sd_pipe):
    """With `DDIMScheduler` at SD's settings, `StableDiffusionPipeline` at 3 steps, with and without CFG, alternates one UNet forward and one `scheduler.step`, 3 of each.

    Not with every scheduler: SD 1.5's ``PNDMScheduler`` makes 4 of each at 3 steps. Nor at every
    spacing: ``trailing`` DDIM gets 62 timesteps, so 62 of each, at 61 steps.
    """
    original, order = sd_pipe.scheduler, []
    scheduler = DDIMScheduler(**SD_SCHEDULER)
    step = scheduler.step

    def spy(*args, **kwargs):
        order.append("step")
        return step(*args, **kwargs)

    scheduler.step = spy
    handle = sd_pipe.unet.register_forward_pre_hook(lambda module, args: order.append("unet"))
    try:
        sd_pipe.scheduler = scheduler
        for guidance in ({"guidance_scale": 1.0}, {"negative_prompt_embeds": embeds(1)}):
            order.clear()
            sd_pipe(prompt_embeds=embeds(0), latents=start_latents(), num_inference_steps=3,
                    output_type="latent", **guidance)  # fmt: skip
            assert order == ["unet", "step"] * 3, (guidance, order)
        pndm = PNDMScheduler(**SD15_PNDM)
        step = pndm.step  # spy now wraps PNDM's step
        pndm.step = spy
        sd_pipe.scheduler, order[:] = pndm, []
        sd_pipe(prompt_embeds=embeds(0), latents=start_latents(), num_inference_steps=3,
                output_type="latent", guidance_scale=1.0)  # fmt: skip
        assert order == ["unet", "step"] * 4, order
        trailing = DDIMScheduler(**SD_SCHEDULER, timestep_spacing="trailing")
        trailing.set_timesteps(61)
        assert len(trailing.timesteps) == 62
    finally:
        handle.remove()
        sd_pipe.scheduler = original


def test_ddpm_step_off_the_grid_raises_index_error():
    """After `set_timesteps(10)`, `DDPMScheduler.step` at a timestep off the grid (50) raises an `IndexError` from `previous_timestep`, while `DDIMScheduler.step` steps from it by the fixed stride."""
    sample, eps = torch.randn(4, 2, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    ddpm = DDPMScheduler(clip_sample=False)
    ddpm.set_timesteps(10)
    assert 50 not in ddpm.timesteps
    with pytest.raises(IndexError):
        ddpm.step(eps, 50, sample, generator=torch.Generator().manual_seed(0))
    ddim = DDIMScheduler(clip_sample=False)
    ddim.set_timesteps(10)
    assert torch.isfinite(ddim.step(eps, 50, sample).prev_sample).all()


def test_unet_returns_sample_and_the_pipeline_takes_element_zero(sd_pipe, record_calls):
    """`UNet2DConditionModel` returns its prediction (in SD 1.x text-to-image shaped like its input) as the output object's `.sample`, or as element `[0]` of a tuple under `return_dict=False`; `StableDiffusionPipeline` calls it with `return_dict=False`."""
    unet = sd_pipe.unet
    latents, t, prompt_embeds = start_latents(), torch.tensor(500), embeds(0)
    with torch.no_grad():
        out = unet(latents, t, encoder_hidden_states=prompt_embeds)
        tup = unet(latents, t, encoder_hidden_states=prompt_embeds, return_dict=False)
    assert out.sample.shape == latents.shape
    assert isinstance(tup, tuple) and torch.equal(tup[0], out.sample)
    recorder = record_calls(unet)
    sd_pipe(
        prompt_embeds=prompt_embeds,
        latents=latents,
        num_inference_steps=2,
        guidance_scale=1.0,
        output_type="latent",
    )
    assert [kwargs["return_dict"] for _, kwargs in recorder.calls] == [False, False]
