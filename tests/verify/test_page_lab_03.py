"""Lab 03 (scheduler reading): the page's claims about diffusers' schedulers.

That labkit's NumPy schedulers reproduce diffusers' is held by the shared module
``test_schedulers_vs_diffusers.py``, which the page lists too. This module holds
what the page says about diffusers itself: DDIM's fixed stride against each
spacing's grid, where `leading` starts, which classes scale the model input, Euler's
step index and warning, Karras end points, and the flow-matching double shift.
"""

import itertools
import json
import logging
import re

import numpy as np
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    HeunDiscreteScheduler,
    PNDMScheduler,
)
from tiny import HEIGHT, SD15_PNDM, SD15_SCHEDULER_FILE, SD_SCHEDULER, WIDTH, embeds, start_latents

T = 1000


def ddim_target(scheduler: DDIMScheduler, t: int) -> int:
    """The timestep whose alphas_cumprod ``DDIMScheduler.step`` used when leaving ``t``.

    With eta = 0 and an epsilon output of zeros, prev_sample = sqrt(ab_prev / ab_t) * x_t,
    so the ratio of output to input names ab_prev, and so the target timestep.
    """
    sample = torch.ones(1, dtype=torch.float64)
    out = scheduler.step(torch.zeros_like(sample), t, sample, eta=0.0).prev_sample
    ab_prev = float(out[0]) ** 2 * float(scheduler.alphas_cumprod[t])
    return int(np.argmin(np.abs(scheduler.alphas_cumprod.double().numpy() - ab_prev)))


def transitions(spacing: str, n: int, steps_offset: int = 0) -> list[tuple[int, int]]:
    """(next grid entry, the timestep DDIM's step targets) for each step but the last."""
    scheduler = DDIMScheduler(
        timestep_spacing=spacing, clip_sample=False, steps_offset=steps_offset
    )
    scheduler.set_timesteps(n)
    grid = scheduler.timesteps.tolist()
    return [(nxt, ddim_target(scheduler, t)) for t, nxt in itertools.pairwise(grid)]


def test_ddim_step_targets_t_minus_the_fixed_stride_under_linspace():
    """`DDIMScheduler.step` at 999 targets 999 - 1000 // 10 = 899 under `linspace` at 10 steps, while the grid's next timestep is 888: it computes the stride, it does not read the grid."""
    scheduler = DDIMScheduler(timestep_spacing="linspace", clip_sample=False)
    scheduler.set_timesteps(10)
    assert scheduler.timesteps.tolist()[:2] == [999, 888]
    assert ddim_target(scheduler, 999) == 899


def test_leading_always_matches_the_ddim_stride():
    """Under `leading` the grid's stride is `1000 // n` by construction, so `DDIMScheduler.step` always lands on the next grid entry.

    The grid against `t - 1000 // n` at every count from 1 to 999, `steps_offset` 0 and 1;
    the step's own target at nine of the counts, both offsets."""
    for offset in (0, 1):
        scheduler = DDIMScheduler(timestep_spacing="leading", steps_offset=offset)
        for n in range(1, T):
            scheduler.set_timesteps(n)
            grid = scheduler.timesteps.tolist()
            assert all(nxt == t - T // n for t, nxt in itertools.pairwise(grid)), (n, offset)
        for n in (1, 3, 7, 10, 13, 50, 64, 100, 250):
            assert all(nxt == target for nxt, target in transitions("leading", n, offset)), n


def test_trailing_matches_only_when_the_step_count_divides_1000():
    """Under `trailing`, DDIM's stride matches the grid when the step count divides 1000 (10 steps: 999, 899, …); at 7 steps the grid goes 999, 856 while `step` targets 857, at five of the six transitions, one training timestep off each time."""
    assert all(nxt == target for nxt, target in transitions("trailing", 10))
    seven = transitions("trailing", 7)
    assert seven[0] == (856, 857)
    assert sum(nxt != target for nxt, target in seven) == 5
    assert all(abs(nxt - target) <= 1 for nxt, target in seven)


def test_trailing_matches_the_stride_only_when_the_step_count_divides_1000():
    """`trailing` matches DDIM's stride only when the step count divides 1000: at every dividing count from 2 to 1000 each transition lands on the next grid entry, at every other count at least one does not.

    The whole grid (its final -1 included, at the 62 counts that end there) against DDIM's
    target `t - 1000 // n` (`DDIMScheduler.step`'s `prev_timestep`), read from the step itself
    at five of the counts."""
    scheduler, off = DDIMScheduler(timestep_spacing="trailing"), {}
    for n in range(2, T + 1):
        scheduler.set_timesteps(n)
        grid = scheduler.timesteps.tolist()
        off[n] = sum(nxt != t - T // n for t, nxt in itertools.pairwise(grid))
        assert (off[n] == 0) == (T % n == 0), n
    assert off[7] == 5 and off[9] == 1
    for n in (9, 10, 27, 333, 999):  # the step's own target, not the formula
        assert sum(nxt != target for nxt, target in transitions("trailing", n)) == off[n], n


def test_euler_warns_when_scale_model_input_was_skipped(caplog):
    """`EulerDiscreteScheduler.step` without `scale_model_input` raises nothing, and warns only if that instance never ran `scale_model_input`: once it has, even before a later `set_timesteps`, a skipped call goes unlogged."""
    scheduler = EulerDiscreteScheduler(
        beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012
    )
    scheduler.set_timesteps(10)
    sample = torch.randn(1, 4, 2, 2, generator=torch.Generator().manual_seed(0))
    t = scheduler.timesteps[0]
    with caplog.at_level(logging.WARNING, logger="diffusers"):
        out = scheduler.step(torch.zeros_like(sample), t, sample).prev_sample
    assert torch.isfinite(out).all()
    assert any("scale_model_input" in r.getMessage() for r in caplog.records)
    # the same instance, reused as a pipeline reuses `pipe.scheduler`: no warning any more
    scheduler.set_timesteps(10)
    scheduler.scale_model_input(sample, scheduler.timesteps[0])
    scheduler.set_timesteps(10)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="diffusers"):
        for t in scheduler.timesteps[:2]:
            out = scheduler.step(torch.zeros_like(sample), t, sample).prev_sample
    assert torch.isfinite(out).all()
    assert not any("scale_model_input" in r.getMessage() for r in caplog.records)


def test_skipping_scale_model_input_feeds_init_noise_sigma_times_too_large():
    """Skip `scale_model_input` with Euler and the network sees inputs about `init_noise_sigma` times too large at the first step, under every spacing on SD's betas, so less with SDXL's `leading` config than with `linspace` or `trailing`."""
    noise = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    for spacing in ("leading", "trailing", "linspace"):
        scheduler = EulerDiscreteScheduler(
            timestep_spacing=spacing,
            steps_offset=1,
            beta_schedule="scaled_linear",
            beta_start=0.00085,
            beta_end=0.012,
        )
        scheduler.set_timesteps(10)
        latents = noise * scheduler.init_noise_sigma
        seen = scheduler.scale_model_input(latents, scheduler.timesteps[0])
        ratio = float(latents.std() / seen.std())
        assert ratio == pytest.approx(float(scheduler.init_noise_sigma), rel=0.005), spacing
        expected = 8.45 if spacing == "leading" else 14.6
        assert ratio == pytest.approx(expected, rel=0.005), spacing


def test_flow_match_shifts_sigma_min_twice():
    """`FlowMatchEulerDiscreteScheduler(shift=3.0).set_timesteps(10)` ends its non-zero sigmas at 0.0089, not the 0.0030 a single shift of 1/1000 gives: `sigma_min` is shifted once in `__init__` and again in `set_timesteps`."""
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(10)
    last = float(scheduler.sigmas[-2])
    once = 3.0 * 0.001 / (1 + 2.0 * 0.001)
    twice = 3.0 * once / (1 + 2.0 * once)
    assert last == pytest.approx(twice, rel=1e-4) and last == pytest.approx(0.0089, abs=5e-5)
    assert once == pytest.approx(0.0030, abs=5e-5)


def flow_loop(scheduler, z, mean=0.5, std=0.3, steps=25):
    """A scheduler loop on the exact velocity for data x0 ~ N(mean, std**2): returns the mean
    |x - exact| at the end (the flow ODE maps z to mean + std * z)."""
    scheduler.set_timesteps(steps)
    x = z.clone()
    for t in scheduler.timesteps:
        sigma = float(t) / T  # the level the model is told
        gain = (1 - sigma) * std**2 / ((1 - sigma) ** 2 * std**2 + sigma**2)
        x0_hat = mean + gain * (x - (1 - sigma) * mean)
        x = scheduler.step((x - x0_hat) / sigma, t, x).prev_sample
    return float((x - (mean + std * z)).abs().mean())


def test_flow_matching_is_a_path_and_a_target():
    """`FlowMatchEulerDiscreteScheduler` has no `prediction_type`; `DPMSolverMultistepScheduler` runs a flow model's loop at least as accurately as `FlowMatchEulerDiscreteScheduler` only with both `use_flow_sigmas=True` and `prediction_type="flow_prediction"`: with either one alone it runs without an error and ends far from the data."""
    assert "prediction_type" not in FlowMatchEulerDiscreteScheduler().config
    z = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    euler = flow_loop(FlowMatchEulerDiscreteScheduler(shift=3.0), z)
    both = flow_loop(
        DPMSolverMultistepScheduler(
            use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0
        ),
        z,
    )
    target_only = flow_loop(DPMSolverMultistepScheduler(prediction_type="flow_prediction"), z)
    sigmas_only = flow_loop(DPMSolverMultistepScheduler(use_flow_sigmas=True, flow_shift=3.0), z)
    assert both < euler < 0.05, (both, euler)
    for alone in (target_only, sigmas_only):
        assert np.isfinite(alone) and alone > 10 * euler, (target_only, sigmas_only)


def test_leading_largest_entry():
    """`leading` starts at `(n - 1) * (1000 // n) + steps_offset`: 901 at 10 steps with SD's `steps_offset=1`, and 999, the noisiest training timestep, only at 500 or 999 steps with offset 1 (with offset 0 only at 1000 steps). At 1000 steps offset 1 gives 1000, off the training axis: `DDIMScheduler.step` and `DDPMScheduler.step` raise an `IndexError` there."""
    from diffusers import DDPMScheduler

    reaches = {0: [], 1: []}
    for offset, hits in reaches.items():
        for n in range(1, T + 1):
            scheduler = DDIMScheduler(timestep_spacing="leading", steps_offset=offset)
            scheduler.set_timesteps(n)
            first = int(scheduler.timesteps[0])
            assert first == (n - 1) * (T // n) + offset, (n, offset)
            if first == T - 1:
                hits.append(n)
    assert reaches == {0: [1000], 1: [500, 999]}
    scheduler = DDIMScheduler(timestep_spacing="leading", steps_offset=1)
    scheduler.set_timesteps(10)
    assert int(scheduler.timesteps[0]) == 901
    sample = torch.ones(1, 4, 2, 2)
    for cls in (DDIMScheduler, DDPMScheduler):
        scheduler = cls(timestep_spacing="leading", steps_offset=1, clip_sample=False)
        scheduler.set_timesteps(T)
        assert int(scheduler.timesteps[0]) == T
        with pytest.raises(IndexError):
            scheduler.step(torch.zeros_like(sample), scheduler.timesteps[0], sample)


def test_scale_model_input_is_identity_beyond_ddpm_and_ddim():
    """`scale_model_input` returns its input unchanged for `DDPMScheduler`, `DDIMScheduler`, `PNDMScheduler`, `DPMSolverMultistepScheduler` and `UniPCMultistepScheduler`, and divides by `sqrt(sigma**2 + 1)` in the Euler family (`EulerDiscreteScheduler`, `EulerAncestralDiscreteScheduler`, `HeunDiscreteScheduler`)."""
    from diffusers import (
        DDPMScheduler,
        EulerAncestralDiscreteScheduler,
        HeunDiscreteScheduler,
        PNDMScheduler,
        UniPCMultistepScheduler,
    )

    sample = torch.randn(1, 4, 2, 2, generator=torch.Generator().manual_seed(0))
    identity = (
        DDPMScheduler,
        DDIMScheduler,
        PNDMScheduler,
        DPMSolverMultistepScheduler,
        UniPCMultistepScheduler,
    )
    for cls in identity:
        scheduler = cls()
        scheduler.set_timesteps(10)
        assert scheduler.scale_model_input(sample, scheduler.timesteps[0]) is sample, cls
    for cls in (EulerDiscreteScheduler, EulerAncestralDiscreteScheduler, HeunDiscreteScheduler):
        scheduler = cls()
        scheduler.set_timesteps(10)
        sigma = scheduler.sigmas[0]
        scaled = scheduler.scale_model_input(sample, scheduler.timesteps[0])
        torch.testing.assert_close(scaled, sample / (sigma**2 + 1) ** 0.5)


def test_karras_end_points_follow_the_spacing():
    """With `use_karras_sigmas=True`, `EulerDiscreteScheduler` takes `sigma_max` and `sigma_min` from the interpolated grid of its `timestep_spacing`, so the Karras end points differ between `linspace` and `leading`."""
    ends = {}
    for spacing in ("linspace", "leading"):
        plain = EulerDiscreteScheduler(timestep_spacing=spacing, steps_offset=1)
        plain.set_timesteps(10)
        karras = EulerDiscreteScheduler(
            timestep_spacing=spacing, steps_offset=1, use_karras_sigmas=True
        )
        karras.set_timesteps(10)
        torch.testing.assert_close(karras.sigmas[0], plain.sigmas[0])
        torch.testing.assert_close(karras.sigmas[-2], plain.sigmas[-2])
        ends[spacing] = (float(karras.sigmas[0]), float(karras.sigmas[-2]))
    assert ends["leading"][0] < 0.7 * ends["linspace"][0]
    assert ends["leading"][1] != pytest.approx(ends["linspace"][1])


def test_euler_scale_model_input_reads_step_index_not_t():
    """`EulerDiscreteScheduler`'s first `scale_model_input` or `step` sets `step_index` from `t`, unless `set_begin_index` was called first (then from the begin index, whatever `t` is); after that `scale_model_input` reads `sigma` from `step_index` whatever `t` it is given, and does not advance it; only `step` does."""
    sample = torch.randn(1, 4, 2, 2, generator=torch.Generator().manual_seed(1))
    for begin, expected in ((None, 5), (0, 0)):
        for first in ("scale_model_input", "step"):
            scheduler = EulerDiscreteScheduler()
            scheduler.set_timesteps(10)
            if begin is not None:
                scheduler.set_begin_index(begin)
            t5 = scheduler.timesteps[5]
            if first == "step":  # sets the index, then advances it by one (and logs a warning)
                scheduler.step(torch.zeros_like(sample), t5, sample)
                assert scheduler.step_index == expected + 1, (begin, first)
            else:
                scheduler.scale_model_input(sample, t5)
                assert scheduler.step_index == expected, (begin, first)
    scheduler = EulerDiscreteScheduler()
    scheduler.set_timesteps(10)
    t0, t5 = scheduler.timesteps[0], scheduler.timesteps[5]
    first = scheduler.scale_model_input(sample, t0)
    assert scheduler.step_index == 0
    torch.testing.assert_close(scheduler.scale_model_input(sample, t5), first)
    assert scheduler.step_index == 0
    scheduler.step(torch.zeros_like(sample), t0, sample)
    assert scheduler.step_index == 1
    sigma1 = scheduler.sigmas[1]
    torch.testing.assert_close(
        scheduler.scale_model_input(sample, t5), sample / (sigma1**2 + 1) ** 0.5
    )


#: stabilityai/stable-diffusion-xl-base-1.0, scheduler/scheduler_config.json, as shipped
#: (but for "_diffusers_version"): Euler with `leading` and `steps_offset=1` on SD's betas
SDXL_SCHEDULER_FILE = {
    "_class_name": "EulerDiscreteScheduler",
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "clip_sample": False,
    "interpolation_type": "linear",
    "num_train_timesteps": 1000,
    "prediction_type": "epsilon",
    "sample_max_value": 1.0,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "trained_betas": None,
    "use_karras_sigmas": False,
}


def load_scheduler(cls, config: dict, folder):
    (folder / "scheduler_config.json").write_text(json.dumps(config))
    return cls.from_pretrained(folder)


def test_sdxl_ships_leading_euler_and_sd15_swaps_to_linspace(tmp_path):
    """On SDXL's shipped Euler config (`leading`, `steps_offset=1`, SD's betas) the first sigma is 8.39, not `sigma_max` = 14.61, and `init_noise_sigma` is 8.45 at 10 steps; SD 1.5 ships PNDM, whose config sets no `timestep_spacing`: `EulerDiscreteScheduler.from_config` on it gets `linspace`, starting at 999 and 14.61."""
    (tmp_path / "sdxl").mkdir()
    (tmp_path / "sd15").mkdir()
    sdxl = load_scheduler(EulerDiscreteScheduler, SDXL_SCHEDULER_FILE, tmp_path / "sdxl")
    sdxl.set_timesteps(10)
    assert sdxl.timesteps[0].item() == 901
    assert float(sdxl.sigmas[0]) == pytest.approx(8.39, abs=0.005)
    assert float(sdxl.init_noise_sigma) == pytest.approx(8.45, abs=0.005)
    pndm = load_scheduler(PNDMScheduler, SD15_SCHEDULER_FILE, tmp_path / "sd15")
    euler = EulerDiscreteScheduler.from_config(pndm.config)
    euler.set_timesteps(10)
    assert euler.config.timestep_spacing == "linspace"
    assert euler.timesteps[0].item() == 999
    assert float(euler.sigmas[0]) == pytest.approx(14.61, abs=0.005)
    assert float(euler.init_noise_sigma) == pytest.approx(14.61, abs=0.005)


def test_timesteps_and_sigmas_of_the_three_mirrored_classes():
    """`set_timesteps(n)` fills `timesteps` `(n,)`, int64 for DDIM and float32 for Euler and flow matching, and for those two `sigmas` `(n + 1,)` ending in 0; not every class: `HeunDiscreteScheduler` returns 19 `timesteps` at 10 steps; nor every `n`: under `trailing`, DDIM and Euler return `n + 1` at 61 steps, the last one -1."""
    for n in (1, 10, 50):
        ddim = DDIMScheduler()
        ddim.set_timesteps(n)
        assert ddim.timesteps.shape == (n,) and ddim.timesteps.dtype == torch.int64
        for cls in (EulerDiscreteScheduler, FlowMatchEulerDiscreteScheduler):
            scheduler = cls()
            scheduler.set_timesteps(n)
            assert scheduler.timesteps.shape == (n,), cls.__name__
            assert scheduler.timesteps.dtype == torch.float32, cls.__name__
            assert scheduler.sigmas.shape == (n + 1,) and scheduler.sigmas[-1] == 0, cls.__name__
    heun = HeunDiscreteScheduler()
    heun.set_timesteps(10)
    assert len(heun.timesteps) == 19
    for cls in (DDIMScheduler, EulerDiscreteScheduler):
        trailing = cls(timestep_spacing="trailing")
        trailing.set_timesteps(61)
        assert trailing.timesteps.shape == (62,) and trailing.timesteps[-1] == -1, cls.__name__


def test_notes_sd15_pndm_makes_51_calls_at_50_steps(sd_pipe, record_calls):
    """scheduler_notes.md: SD 1.5's PNDM (`order == 1`) makes 51 calls at 50 steps in `StableDiffusionPipeline`.

    `StableDiffusionPipeline.__call__` with SD 1.5's `PNDMScheduler` settings, unguided (one
    UNet call per timestep); a UNet pre-hook counts the calls. The notes state no range: at
    1 step PNDM makes 1 call, and at 1000 it raises after one (test_page_scheduler)."""
    original = sd_pipe.scheduler
    try:
        sd_pipe.scheduler = PNDMScheduler(**SD15_PNDM)
        assert sd_pipe.scheduler.order == 1
        calls = {}
        for n in (1, 50):
            recorder = record_calls(sd_pipe.unet)
            sd_pipe(
                prompt_embeds=embeds(0),
                guidance_scale=1.0,
                num_inference_steps=n,
                height=HEIGHT,
                width=WIDTH,
                output_type="latent",
            )
            calls[n] = len(recorder.calls)
            recorder.remove()
    finally:
        sd_pipe.scheduler = original
    assert calls == {1: 1, 50: 51}


def test_notes_one_unet_call_per_step_for_ddpm_ddim_and_euler_only(sd_pipe, record_calls):
    """scheduler_notes.md: in SD's text-to-image loop (`StableDiffusionPipeline`) with SD's scheduler settings (`steps_offset=1`; each class's default spacing, `leading` for DDPM and DDIM, `linspace` for Euler), one UNet call per step for DDPM, DDIM and Euler.

    `StableDiffusionPipeline.__call__` at SD's settings, unguided, 3 steps: 3 UNet calls each.
    Not at every setting: under `trailing` at 61 steps each makes 62 (the notes' exception,
    test_page_scheduler.py::test_trailing_extra_timestep_wrecks_ddim_and_ddpm).
    Flow-matching Euler is not on that list: the same call with `FlowMatchEulerDiscreteScheduler`
    raises an `AttributeError` (no `init_noise_sigma`) before any UNet call."""
    from infralens_docs.registry import ROOT

    original, calls = sd_pipe.scheduler, {}
    call = dict(prompt_embeds=embeds(0), guidance_scale=1.0, num_inference_steps=3)
    call.update(height=HEIGHT, width=WIDTH, output_type="latent")
    try:
        for cls in (DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler):
            sd_pipe.scheduler = cls.from_config(SD_SCHEDULER)  # ignores keys cls lacks
            recorder = record_calls(sd_pipe.unet)
            sd_pipe(**call)
            calls[cls.__name__] = len(recorder.calls)
            recorder.remove()
        sd_pipe.scheduler = FlowMatchEulerDiscreteScheduler()
        recorder = record_calls(sd_pipe.unet)
        with pytest.raises(AttributeError, match="init_noise_sigma"):
            sd_pipe(**call)
        calls["FlowMatchEulerDiscreteScheduler"] = len(recorder.calls)
        recorder.remove()
    finally:
        sd_pipe.scheduler = original
    assert calls == {
        "DDPMScheduler": 3, "DDIMScheduler": 3, "EulerDiscreteScheduler": 3,
        "FlowMatchEulerDiscreteScheduler": 0,
    }  # fmt: skip
    notes = (ROOT / "code/lab-03-scheduler-reading/scheduler_notes.md").read_text()
    bullet = notes.split("- In SD's text-to-image loop", 1)[1].split("\n- ", 1)[0]
    assert "flow-matching" not in bullet and "FlowMatch" not in bullet


def test_ddim_with_epsilon_and_v_prediction_swapped_runs_without_error(sd_pipe):
    """`DDIMScheduler` with `epsilon` and `v_prediction` swapped runs without error (the myth "Any scheduler works with any checkpoint", scheduler_notes.md's `prediction_type` row, the starter's docstring, the interview hook): `StableDiffusionPipeline.__call__` runs one UNet from the same `latents` under each reading to finite `latents` of the input's shape and dtype, and different ones.

    Not every scheduler is silent: SD 1.5's `PNDMScheduler` raises in `step` on `sample`.
    """
    original, finals = sd_pipe.scheduler, {}
    try:
        for prediction_type in ("epsilon", "v_prediction", "sample"):
            if prediction_type == "sample":
                sd_pipe.scheduler = PNDMScheduler(**{**SD15_PNDM, "prediction_type": "sample"})
            else:
                sd_pipe.scheduler = DDIMScheduler(**SD_SCHEDULER, prediction_type=prediction_type)
            call = dict(prompt_embeds=embeds(0), latents=start_latents(), guidance_scale=1.0)
            call.update(num_inference_steps=3, height=HEIGHT, width=WIDTH, output_type="latent")
            if prediction_type == "sample":
                with pytest.raises(ValueError, match="must be one of `epsilon` or `v_prediction`"):
                    sd_pipe(**call)
            else:
                finals[prediction_type] = sd_pipe(**call).images
    finally:
        sd_pipe.scheduler = original
    start = start_latents()
    for latents in finals.values():
        assert latents.shape == start.shape and latents.dtype == start.dtype
        assert torch.isfinite(latents).all()
    assert not torch.allclose(finals["epsilon"], finals["v_prediction"], atol=1e-3)


def test_notes_flow_checkpoint_runs_on_dpmsolver_or_unipc_with_both_flags():
    """scheduler_notes.md: a flow-matching checkpoint needs flow sigmas and a velocity reading: in SD3's pipeline `FlowMatchEulerDiscreteScheduler`, or DPM-Solver or UniPC with `use_flow_sigmas=True` and `prediction_type="flow_prediction"`; Flux's pipeline passes `mu`, so DPM-Solver also needs `use_dynamic_shifting=True`. In `StableDiffusion3Pipeline.__call__` the Euler, both DPM-Solvers (multistep, singlestep) and UniPC step to sigma 0, while the multistep DEIS with the same flags stops short of it; in `FluxPipeline.__call__` both DPM-Solvers raise an `AssertionError` with those flags alone and step to sigma 0 with `use_dynamic_shifting=True` added."""
    from diffusers import (
        DEISMultistepScheduler,
        DPMSolverSinglestepScheduler,
        UniPCMultistepScheduler,
    )
    from tiny import EMBED_DIM, dit_embeds, tiny_flux_pipeline, tiny_sd3_pipeline

    flow = dict(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0)
    dpm_solvers = (DPMSolverMultistepScheduler, DPMSolverSinglestepScheduler)
    pipe = tiny_sd3_pipeline()
    last = {}
    for scheduler in (FlowMatchEulerDiscreteScheduler(shift=3.0), *(cls(**flow) for cls in dpm_solvers),
                      UniPCMultistepScheduler(**flow), DEISMultistepScheduler(**flow)):  # fmt: skip
        pipe.scheduler = scheduler
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            latents = pipe(prompt_embeds=torch.randn(1, 10, EMBED_DIM, generator=g),
                           pooled_prompt_embeds=torch.randn(1, 16, generator=g), guidance_scale=1.0,
                           num_inference_steps=10, height=HEIGHT, width=WIDTH, output_type="latent").images  # fmt: skip
        assert torch.isfinite(latents).all()
        last[type(scheduler).__name__] = scheduler.sigmas[-1].item()
    assert last.pop("DEISMultistepScheduler") > 0.2
    assert len(last) == 4 and set(last.values()) == {0.0}, last
    prompt_embeds, pooled = dit_embeds(1)
    kwargs = dict(prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled, num_inference_steps=4,
                  height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
    flux = tiny_flux_pipeline()
    for cls in dpm_solvers:
        flux.scheduler = cls(**flow)
        with torch.no_grad(), pytest.raises(AssertionError):
            flux(**kwargs)
        flux.scheduler = cls(**flow, use_dynamic_shifting=True)
        with torch.no_grad():
            latents = flux(**kwargs).images
        assert torch.isfinite(latents).all() and flux.scheduler.sigmas[-1].item() == 0, cls.__name__


def spacing_checker_cases():
    """check_spacing.py's cases and the solution it checks against, read from the checker
    itself (its script part run with --solution, as a reader would)."""
    import runpy
    import sys
    from unittest import mock

    from infralens_docs.registry import ROOT

    checker = ROOT / "code/lab-03-scheduler-reading/check_spacing.py"
    with mock.patch.object(sys, "argv", [str(checker), "--solution"]):
        found = runpy.run_path(str(checker), run_name="__main__")
    return found["CASES"], found["SOLUTION"]


def test_spacing_exercise_checks_against_ddim_set_timesteps():
    """The solution `check_spacing.py` checks your spacings against gives the `timesteps` of `DDIMScheduler.set_timesteps` for `leading`, `trailing` and `linspace`, as int64, high to low, on every case it tries (1, 3, 7, 10, 16, 27, 50, 61 and 1000 steps, `steps_offset` 0 and 1, and 7 steps with `num_train_timesteps=500`); `EulerDiscreteScheduler` gives the same values as float32 for `leading` and `trailing`, and for `linspace` the same grid unrounded, in float32. At 27 and 61 steps, for example, diffusers' floats part from the formulas: DDIM's `linspace` middle timestep is 499 where the exact formula's tie 499.5 rounds to 500 (Euler's float32 grid holds 499.5 there), and `trailing` at 61 steps returns 62 timesteps, the last -1. At 16 steps `trailing`'s grid holds ties (937.5, 812.5), which `np.round` sends to the even integer: 937 and 811 after the - 1."""
    from fractions import Fraction

    from labkit.blanks import load_function

    cases, solution = spacing_checker_cases()
    reference = load_function(solution, "set_timesteps")
    assert {args[1] for _, args in cases} == {"leading", "trailing", "linspace"}
    assert {args[0] for _, args in cases} == {1, 3, 7, 10, 16, 27, 50, 61, 1000}
    assert {args[2] for _, args in cases} == {0, 1}
    assert {args[3] for _, args in cases} == {1000, 500}
    for label, (n, spacing, offset, train) in cases:
        mine = reference(n, spacing, offset, train)
        ddim = DDIMScheduler(num_train_timesteps=train, timestep_spacing=spacing, steps_offset=offset)  # fmt: skip
        ddim.set_timesteps(n)
        assert ddim.timesteps.dtype == torch.int64 and mine.dtype == np.int64, label
        np.testing.assert_array_equal(ddim.timesteps.numpy(), mine, err_msg=label)
        euler = EulerDiscreteScheduler(num_train_timesteps=train, timestep_spacing=spacing, steps_offset=offset)  # fmt: skip
        euler.set_timesteps(n)
        assert euler.timesteps.dtype == torch.float32, label
        if spacing == "linspace":  # unrounded: 166.5 at 7 steps, where DDIM has 166
            grid = np.linspace(0, train - 1, n, dtype=np.float32)[::-1]
            np.testing.assert_array_equal(euler.timesteps.numpy(), grid, err_msg=label)
            tie = grid % 1 == 0.5  # float32 holds the tie exactly; DDIM's float64 grid may not
            np.testing.assert_array_equal(grid.round().astype(np.int64)[~tie], mine[~tie], err_msg=label)  # fmt: skip
        else:
            np.testing.assert_array_equal(euler.timesteps.numpy(), mine.astype(np.float32), err_msg=label)  # fmt: skip
    # where the floats part from the formulas: linspace's tie at 27 steps, trailing at 61
    ddim = DDIMScheduler(timestep_spacing="linspace")
    ddim.set_timesteps(27)
    assert Fraction(13 * (T - 1), 26) == Fraction(999, 2) and ddim.timesteps[13].item() == 499
    euler = EulerDiscreteScheduler(timestep_spacing="linspace")
    euler.set_timesteps(27)
    assert euler.timesteps[13].item() == 499.5
    ddim = DDIMScheduler(timestep_spacing="trailing")
    ddim.set_timesteps(61)
    assert len(ddim.timesteps) == 62 and ddim.timesteps[-1].item() == -1
    ddim.set_timesteps(16)  # ties: 937.5 and 812.5 go to the even 938 and 812
    assert ddim.timesteps[[1, 3]].tolist() == [937, 811]


def test_notes_step_reads_prediction_type_but_flow_matching_reads_a_velocity():
    """scheduler_notes.md: inside `step`, DDPM, DDIM and Euler first convert the output to an x0 estimate according to `prediction_type` (their `pred_original_sample` changes with it); flow matching has no `prediction_type` and moves along the output as a velocity: `FlowMatchEulerDiscreteScheduler.step` returns only `prev_sample`, `sample + (sigma_next - sigma) * model_output`."""
    g = torch.Generator().manual_seed(4)
    sample, out = torch.randn(2, 4, 2, 2, generator=g), torch.randn(2, 4, 2, 2, generator=g)
    for cls in (DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler):
        x0 = {}
        for prediction_type in ("epsilon", "v_prediction"):
            scheduler = cls(prediction_type=prediction_type, beta_schedule="scaled_linear",
                            beta_start=0.00085, beta_end=0.012)  # fmt: skip
            scheduler.set_timesteps(10)
            t = scheduler.timesteps[2]
            scheduler.scale_model_input(sample, t)  # the call order a pipeline uses
            result = scheduler.step(out, t, sample, generator=torch.Generator().manual_seed(0))
            x0[prediction_type] = result.pred_original_sample
        assert (x0["epsilon"] - x0["v_prediction"]).abs().max() > 0.1, cls.__name__
    flow = FlowMatchEulerDiscreteScheduler(shift=3.0)
    assert "prediction_type" not in flow.config
    flow.set_timesteps(10)
    result = flow.step(out, flow.timesteps[2], sample)
    assert list(result.keys()) == ["prev_sample"]
    expected = sample + (flow.sigmas[3] - flow.sigmas[2]) * out
    torch.testing.assert_close(result.prev_sample, expected)


def test_notes_from_config_keeps_the_keys_it_does_not_read(tmp_path):
    """scheduler_notes.md: keys a class does not read stay in its `.config`: `EulerDiscreteScheduler` loaded from SDXL's shipped file still carries PNDM's `skip_prk_steps`, and gives the same timesteps, sigmas and `step` as the file without it; every exported scheduler class that builds from that file keeps each of its keys (only `_class_name` becomes the new class's).

    Not "from_config builds any class and checks nothing" (round 10): on that file, of every
    scheduler class diffusers exports, `UnCLIPScheduler` raises `ValueError` (cosine only) and
    classes with required arguments raise `TypeError`; neither the notes nor the page says so.
    """
    import diffusers
    from diffusers import SchedulerMixin

    from infralens_docs.registry import ROOT

    euler = load_scheduler(EulerDiscreteScheduler, SDXL_SCHEDULER_FILE, tmp_path)
    assert euler.config.skip_prk_steps is True
    plain = {k: v for k, v in SDXL_SCHEDULER_FILE.items() if k != "skip_prk_steps"}
    other = EulerDiscreteScheduler.from_config(plain)
    sample, out = torch.ones(1, 4, 2, 2), torch.full((1, 4, 2, 2), 0.5)
    for scheduler in (euler, other):
        scheduler.set_timesteps(10)
    assert torch.equal(euler.timesteps, other.timesteps) and torch.equal(euler.sigmas, other.sigmas)
    t = euler.timesteps[0]
    torch.testing.assert_close(euler.step(out, t, sample).prev_sample, other.step(out, t, sample).prev_sample)  # fmt: skip
    raising = set()
    for name in [n for n in dir(diffusers) if n.endswith("Scheduler")]:  # a new class joins the set
        cls = getattr(diffusers, name)
        if isinstance(cls, type) and issubclass(cls, SchedulerMixin):
            try:
                built = cls.from_config(SDXL_SCHEDULER_FILE)
            except (TypeError, ValueError):
                raising.add(name)
                continue
            for key, value in SDXL_SCHEDULER_FILE.items():  # read or not, every key stays
                if key != "_class_name":  # the one key rewritten: the new class's name
                    assert key in built.config and built.config[key] == value, (name, key)
    assert "UnCLIPScheduler" in raising
    notes = (ROOT / "code/lab-03-scheduler-reading/scheduler_notes.md").read_text(encoding="utf-8")
    page = (ROOT / "docs/labs/lab-03-scheduler-reading.md").read_text(encoding="utf-8")
    for text in (" ".join(notes.split()), page):
        assert "builds any class" not in text and "checks nothing" not in text


def test_euler_starts_at_sigma_max_under_linspace_and_trailing_from_two_steps():
    """At 10 steps `linspace` and `trailing` start `EulerDiscreteScheduler` at the training `sigma_max` (14.61 on SD's betas), as its `init_noise_sigma`.

    Not at 1 step: `linspace`'s only timestep is then 0 (sigma 0.029, `init_noise_sigma`
    0.029), so the page's sentences carry "at 10 steps" (round 10).
    """
    from infralens_docs.registry import ROOT

    betas = {k: SD_SCHEDULER[k] for k in ("beta_schedule", "beta_start", "beta_end")}
    for n in (2, 10):
        for spacing in ("linspace", "trailing"):
            euler = EulerDiscreteScheduler(timestep_spacing=spacing, **betas)
            euler.set_timesteps(n)
            assert (
                euler.timesteps[0].item() == 999
                and round(float(euler.init_noise_sigma), 2) == 14.61
            )
    euler = EulerDiscreteScheduler(timestep_spacing="linspace", **betas)
    euler.set_timesteps(1)
    assert euler.timesteps.tolist() == [0.0] and round(float(euler.init_noise_sigma), 3) == 0.029
    page = (ROOT / "docs/labs/lab-03-scheduler-reading.md").read_text(encoding="utf-8")
    said = [s for s in re.split(r"(?<=[.:;])\s+", page) if re.search(r"start(s)? at (the training \$\\sigma_\{\\max\}\$|sigma_max)", s)]  # fmt: skip
    assert len(said) == 2 and all("at 10 steps" in s.lower() for s in said), said


def test_eulers_init_noise_sigma_per_spacing():
    """Euler's `init_noise_sigma` is the grid's largest sigma for `linspace` and `trailing`, and `sqrt(sigma**2 + 1)` of that sigma for `leading`, in diffusers and here.

    `EulerDiscreteScheduler` and labkit's mirror at 10 steps on SD's betas, SDXL's
    `steps_offset=1`. Not every class with `sigmas`: `DPMSolverMultistepScheduler` keeps the
    variance-preserving state, `init_noise_sigma` 1.0 under every spacing (round 11), so the
    page's sentence names Euler.
    """
    from infralens_docs.registry import ROOT
    from labkit.schedulers import EulerDiscreteScheduler as MirrorEuler

    betas = {k: SD_SCHEDULER[k] for k in ("beta_schedule", "beta_start", "beta_end")}
    for spacing in ("linspace", "trailing", "leading"):
        config = dict(timestep_spacing=spacing, steps_offset=1, **betas)
        for euler in (EulerDiscreteScheduler(**config), MirrorEuler(**config)):
            euler.set_timesteps(10)
            top = float(max(euler.sigmas))
            expected = top if spacing != "leading" else (top**2 + 1) ** 0.5
            assert float(euler.init_noise_sigma) == pytest.approx(expected, rel=1e-5), spacing
        dpm = DPMSolverMultistepScheduler(**config)
        dpm.set_timesteps(10)
        assert float(dpm.sigmas.max()) > 8 and dpm.init_noise_sigma == 1.0, spacing
    page = (ROOT / "docs/labs/lab-03-scheduler-reading.md").read_text(encoding="utf-8")
    said = [
        line for line in page.splitlines() if "`init_noise_sigma` is the grid's largest" in line
    ]
    assert len(said) == 1 and "Euler's `init_noise_sigma` is" in said[0], said
