"""Scheduler / sampler (docs/handbook/scheduler.md) against the installed diffusers.

Everything runs on the real scheduler classes; pipeline claims run the real
``StableDiffusionPipeline`` (tiny UNet and VAE from ``tiny``) and the real
``StableDiffusion3Pipeline`` (a tiny ``SD3Transformer2DModel`` built here). The
tables of the spacing, Euler-sigma and flow-sigma grids are read *from the page*
and recomputed, so a diffusers upgrade that changes a grid fails here instead of
leaving the page wrong (``tests/test_build.py::VERIFIED_ELSEWHERE`` exempts those
rows from the prose-number check). ``inspect`` reads only type annotations and the
parameters of ``__init__`` signatures, and the schedulers' source only to list the
``beta_schedule`` names to try; every behaviour is observed by calling it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import re
from pathlib import Path

import diffusers
import numpy as np
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    EDMEulerScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    HeunDiscreteScheduler,
    PNDMScheduler,
    StableDiffusionPipeline,
)
from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift
from diffusers.schedulers.scheduling_flow_match_euler_discrete import (
    FlowMatchEulerDiscreteSchedulerOutput,
)
from diffusers.schedulers.scheduling_utils import KarrasDiffusionSchedulers, SchedulerMixin
from tiny import (
    EMBED_DIM,
    HEIGHT,
    SD15_PNDM,
    SD15_SCHEDULER_FILE,
    SD_BETAS,
    SD_SCHEDULER,
    WIDTH,
    close,
    embeds,
    logged_messages,
    randn,
    start_latents,
    tiny_sd3_pipeline,
    tiny_sd_pipeline,
)

from infralens_docs.registry import ROOT

SCHEDULER_PAGE = (ROOT / "docs" / "handbook" / "scheduler.md").read_text(encoding="utf-8")
#: the glossary's hover definitions, shown on every page a term appears
ABBREVIATIONS = (ROOT / "includes" / "abbreviations.md").read_text(encoding="utf-8")
#: SD 1.5's scheduler settings that EulerDiscreteScheduler accepts (it has no clip_sample)
SD_SCHEDULER_EULER = dict(SD_BETAS, steps_offset=SD_SCHEDULER["steps_offset"])
LATENT_SHAPE = (1, 4, HEIGHT // 2, WIDTH // 2)  # the tiny VAE downsamples by 2


def table_rows(first_cell_pattern: str) -> list[list[str]]:
    """Cells of the page's Markdown table rows whose first cell matches the pattern."""
    rows = []
    for line in SCHEDULER_PAGE.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and re.fullmatch(first_cell_pattern, cells[0]):
            rows.append(cells)
    return rows


def numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", cell)]


def decimals(cell: str) -> list[int]:
    return [len(x.split(".")[1]) if "." in x else 0 for x in re.findall(r"\d+(?:\.\d+)?", cell)]


def tensors(seed: int, n: int = 2, shape=LATENT_SHAPE, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=dtype) for _ in range(n)]


def run_sd(pipe, steps: int, **kwargs):
    """One unguided tiny SD 1.x call (guidance_scale 1: one UNet call per timestep)."""
    return pipe(
        prompt_embeds=embeds(0),
        guidance_scale=1.0,
        num_inference_steps=steps,
        height=HEIGHT,
        width=WIDTH,
        output_type="latent",
        **kwargs,
    ).images


# --- the tables on the page, recomputed ------------------------------------------------------


def test_timestep_table_matches_set_timesteps():
    """`DDIMScheduler` and `DDPMScheduler` built with each row's `timestep_spacing` and `steps_offset` return exactly that row's `timesteps` from `set_timesteps(10)`, as int64, and `EulerDiscreteScheduler` returns the same values as float32.

    Reads the rows of the spacing table from the page. A "First, last" cell that quotes numbers
    quotes exactly the first and last timestep of its row (no bound beyond those 10 steps:
    `leading` with offset 0 starts at 950 for 20 steps, 999 for 1000).
    """
    rows = table_rows(r"`(leading|trailing|linspace)`")
    assert len(rows) == 4, "the timestep_spacing table changed shape"
    assert re.fullmatch(r"[\d, ]+", rows[0][3]), "the leading/0 row's First, last cell changed"
    for spacing_cell, offset_cell, timesteps_cell, ends_cell in rows:
        if re.fullmatch(r"[\d, ]+", ends_cell):  # a cell of timesteps, not a remark
            assert numbers(ends_cell) == [numbers(timesteps_cell)[i] for i in (0, -1)], ends_cell
        spacing, offset = spacing_cell.strip("`"), int(offset_cell)
        for cls in (DDIMScheduler, DDPMScheduler):
            scheduler = cls(timestep_spacing=spacing, steps_offset=offset)
            scheduler.set_timesteps(10)
            assert scheduler.timesteps.dtype == torch.int64
            assert scheduler.timesteps.tolist() == numbers(timesteps_cell), (cls.__name__, spacing)
        euler = EulerDiscreteScheduler(timestep_spacing=spacing, steps_offset=offset)
        euler.set_timesteps(10)
        assert euler.timesteps.dtype == torch.float32
        assert euler.timesteps.tolist() == numbers(timesteps_cell), ("Euler", spacing)


def test_euler_sigma_table_matches_set_timesteps():
    """`EulerDiscreteScheduler` with SD's `scaled_linear` betas returns the tabulated `sigmas` from `set_timesteps(10)`, with the default grid and with `use_karras_sigmas=True`, to the digits shown."""
    rows = table_rows(r"`(linspace` \(default\)|use_karras_sigmas=True`)")
    assert len(rows) == 2
    for label, sigmas_cell in rows:
        scheduler = EulerDiscreteScheduler(use_karras_sigmas="karras" in label, **SD_BETAS)
        scheduler.set_timesteps(10)
        for shown, places, actual in zip(
            numbers(sigmas_cell), decimals(sigmas_cell), scheduler.sigmas.tolist(), strict=True
        ):
            assert shown == pytest.approx(actual, abs=0.51 * 10**-places), label


def test_flow_sigma_table_matches_set_timesteps():
    """`FlowMatchEulerDiscreteScheduler(shift=1.0)` and `FlowMatchEulerDiscreteScheduler(shift=3.0)` return the tabulated `sigmas` from `set_timesteps(10)`, to the digits shown."""
    rows = table_rows(r"\d\.\d")
    assert [float(r[0]) for r in rows] == [1.0, 3.0]
    for shift_cell, sigmas_cell in rows:
        scheduler = FlowMatchEulerDiscreteScheduler(shift=float(shift_cell))
        scheduler.set_timesteps(10)
        for shown, places, actual in zip(
            numbers(sigmas_cell), decimals(sigmas_cell), scheduler.sigmas.tolist(), strict=True
        ):
            assert shown == pytest.approx(actual, abs=0.51 * 10**-places), shift_cell


def test_karras_timesteps_are_fractional_as_quoted():
    """With `use_karras_sigmas=True`, `timesteps` are fractional (the values quoted on the page): each is the training timestep at that sigma, interpolated linearly in `log(sigma)` on the training schedule."""
    quoted = re.search(r"fractional \(([\d., ]+), …\)", SCHEDULER_PAGE)
    assert quoted, "the Karras timesteps sentence changed"
    scheduler = EulerDiscreteScheduler(use_karras_sigmas=True, **SD_BETAS)
    scheduler.set_timesteps(10)
    shown = numbers(quoted.group(1))
    np.testing.assert_allclose(shown, scheduler.timesteps[: len(shown)].numpy(), atol=0.006)
    assert any(t != round(t) for t in scheduler.timesteps.tolist())

    acp = scheduler.alphas_cumprod.double().numpy()
    log_train_sigmas = np.log(((1 - acp) / acp) ** 0.5)  # increasing with t
    expected = np.interp(
        np.log(scheduler.sigmas[:-1].double().numpy()), log_train_sigmas, np.arange(1000)
    )
    np.testing.assert_allclose(scheduler.timesteps.numpy(), expected, atol=1e-3)


# --- grids, spacing and call counts ----------------------------------------------------------


def test_ddim_and_ddpm_sd_grid_at_50_steps(sd_pipe, record_calls):
    """Called without `num_inference_steps`, `StableDiffusionPipeline` runs its default of 50 steps: with `DDIMScheduler` or `DDPMScheduler` on SD 1.x's `leading` spacing and `steps_offset=1`, 50 UNet calls at 981, 961, …, 21, 1, a stride of 20."""
    assert "981, 961, …, 21, 1" in SCHEDULER_PAGE
    original = sd_pipe.scheduler
    try:
        for cls in (DDIMScheduler, DDPMScheduler):
            sd_pipe.scheduler = cls(
                timestep_spacing="leading", steps_offset=1, clip_sample=False, **SD_BETAS
            )
            recorder = record_calls(sd_pipe.unet)
            sd_pipe(
                prompt_embeds=embeds(0),
                guidance_scale=1.0,
                output_type="latent",
                generator=torch.Generator().manual_seed(0),
            )
            recorder.remove()
            told = [int(args[1]) for args, _ in recorder.calls]
            assert told == list(range(981, 0, -20)), cls.__name__
    finally:
        sd_pipe.scheduler = original


def test_sd15_pndm_gives_51_timesteps_at_50_steps():
    """SD 1.5's shipped `PNDMScheduler` config (`skip_prk_steps=True`, `steps_offset=1`, `set_alpha_to_one=False`) has `order = 1`, yet `set_timesteps(50)` returns 51 timesteps, 981, 961, 961, 941, …, 21, 1, with 961 repeated.

    The pages quote this count at 50 steps only, not "n + 1 from n = 2": at 1000 steps the
    grid has 1001 entries (the pipeline run at 1000 steps is
    ``test_sd_schedulers_at_1000_steps_call_once_then_raise``).
    """
    scheduler = PNDMScheduler(**SD15_PNDM)
    assert scheduler.order == 1 and scheduler.config.timestep_spacing == "leading"
    scheduler.set_timesteps(50)
    assert scheduler.timesteps.tolist() == [981, 961, *range(961, 0, -20)]
    assert len(scheduler.timesteps) == 51
    scheduler.set_timesteps(1000)
    assert len(scheduler.timesteps) == 1001
    notes = (ROOT / "code" / "lab-03-scheduler-reading" / "scheduler_notes.md").read_text(
        encoding="utf-8"
    )
    for text in (SCHEDULER_PAGE, notes):
        assert not re.search(r"n \+ 1\$? (calls )?from\s+\$?n = 2", text)


@pytest.mark.parametrize(
    ("make", "steps", "calls"),
    [
        (lambda: PNDMScheduler(**SD15_PNDM), 50, 51),
        (lambda: HeunDiscreteScheduler(**SD_BETAS), 10, 19),
        (lambda: DPMSolverMultistepScheduler(**SD_BETAS), 10, 10),
        (lambda: EulerDiscreteScheduler(**SD_BETAS), 10, 10),
    ],
    ids=["pndm", "heun", "dpmsolver", "euler"],
)
def test_unet_calls_equal_len_timesteps(sd_pipe, record_calls, make, steps, calls):
    """Below 1000 steps, `StableDiffusionPipeline` calls the UNet once per entry of `scheduler.timesteps`: 51 calls at `num_inference_steps=50` with SD 1.5's `PNDMScheduler`, 19 at 10 with `HeunDiscreteScheduler`, 10 at 10 with `DPMSolverMultistepScheduler` and `EulerDiscreteScheduler`.

    Unguided (guidance_scale 1), so one UNet call per timestep.
    """
    sd_pipe.scheduler = make()
    recorder = record_calls(sd_pipe.unet)
    run_sd(sd_pipe, steps)
    assert len(recorder.calls) == len(sd_pipe.scheduler.timesteps) == calls
    assert [float(args[1]) for args, _ in recorder.calls] == sd_pipe.scheduler.timesteps.tolist()


def test_text_to_image_calls_the_denoiser_once_per_entry(sd_pipe, record_calls):
    """The grid sets latency, because text-to-image `StableDiffusionPipeline` calls the denoiser once per entry of `scheduler.timesteps` below 1000 steps: with DDIM at SD's settings, 4 UNet calls for 4 entries, and 999 for 999; at 1000, one call, then an `IndexError`. `StableDiffusionImg2ImgPipeline` at `strength=0.5` makes 2 UNet calls for the same 4 entries.

    Not every pipeline: ``StableDiffusionImg2ImgPipeline`` at ``strength=0.5`` runs the same UNet
    2 times for the same 4 entries (it slices ``scheduler.timesteps``). Every sentence of the page
    that says "once per entry" or counts UNet calls as ``len(scheduler.timesteps)`` carries
    "below 1000 steps" (a stand-in UNet forward keeps the
    999- and 1000-step runs cheap).
    """
    from diffusers import StableDiffusionImg2ImgPipeline

    original = sd_pipe.scheduler
    recorder = record_calls(sd_pipe.unet)
    try:
        sd_pipe.scheduler = DDIMScheduler(**SD_SCHEDULER)
        run_sd(sd_pipe, 4)
        assert len(recorder.calls) == len(sd_pipe.scheduler.timesteps) == 4
        img2img = StableDiffusionImg2ImgPipeline(**sd_pipe.components)
        img2img.set_progress_bar_config(disable=True)
        recorder.calls.clear()
        img2img(prompt_embeds=embeds(0), image=torch.rand(1, 3, HEIGHT, WIDTH), strength=0.5,
                guidance_scale=1.0, num_inference_steps=4, output_type="latent")  # fmt: skip
        assert len(img2img.scheduler.timesteps) == 4 and len(recorder.calls) == 2
        seen = []
        sd_pipe.unet.forward = lambda sample, t, *a, **k: seen.append(float(t)) or (sample * 0,)
        sd_pipe.scheduler = DDIMScheduler(**SD_SCHEDULER)
        run_sd(sd_pipe, 999)
        assert len(seen) == len(sd_pipe.scheduler.timesteps) == 999 and max(seen) == 999
        seen.clear()
        with pytest.raises(IndexError):
            run_sd(sd_pipe, 1000)
        assert seen == [1000.0] and len(sd_pipe.scheduler.timesteps) == 1000
    finally:
        sd_pipe.unet.__dict__.pop("forward", None)
        sd_pipe.scheduler = original
    sentences = [
        part
        for line in SCHEDULER_PAGE.splitlines()
        for part in re.split(r"(?<=[.!?])\s+", line)
        if "once per entry" in part or "calls as `len(scheduler.timesteps)`" in part
    ]
    assert len(sentences) == 3 and all("below 1000 steps" in s.lower() for s in sentences), (
        sentences
    )


def test_sd_schedulers_at_1000_steps_call_once_then_raise(sd_pipe):
    """The count has an edge: with SD's `steps_offset=1`, `DDIMScheduler`, `DDPMScheduler` and SD 1.5's `PNDMScheduler` at 1000 steps put $t = 1000$ on the grid, and `StableDiffusionPipeline` makes one UNet call, then raises an `IndexError`.

    Through ``StableDiffusionPipeline.__call__``; a stand-in UNet forward keeps the run cheap.
    """
    seen = []

    def stand_in_unet(sample, t, *args, **kwargs):
        seen.append(float(t))
        return (torch.zeros_like(sample),)

    original = sd_pipe.scheduler
    sd_pipe.unet.forward = stand_in_unet
    try:
        for make in (
            lambda: DDIMScheduler(**SD_SCHEDULER),
            lambda: DDPMScheduler.from_config(SD_SCHEDULER),  # ignores set_alpha_to_one
            lambda: PNDMScheduler(**SD15_PNDM),
        ):
            seen.clear()
            sd_pipe.scheduler = make()
            assert sd_pipe.scheduler.config.steps_offset == 1
            with pytest.raises(IndexError):
                run_sd(sd_pipe, 1000)
            name = type(sd_pipe.scheduler).__name__
            assert 1000 in sd_pipe.scheduler.timesteps.tolist(), name
            assert seen == [1000.0], name
    finally:
        del sd_pipe.unet.forward
        sd_pipe.scheduler = original
    fold = SCHEDULER_PAGE.split("Depth: `order` and `solver_order`", 1)[1].split("### PNDM", 1)[0]
    assert "1000 steps" in fold and "IndexError" in fold


def test_higher_order_schedulers():
    """`HeunDiscreteScheduler` has `order = 2` and `set_timesteps(10)` returns 19 timesteps, the first once and every later level twice; `DPMSolverMultistepScheduler` has `order = 1` with its default `solver_order=2`, keeping the last two model outputs instead."""
    heun = HeunDiscreteScheduler(**SD_BETAS)
    heun.set_timesteps(10)
    t = heun.timesteps.tolist()
    assert heun.order == 2 and len(t) == 19
    assert t[1::2] == t[2::2] and len(set(t)) == 10

    dpm = DPMSolverMultistepScheduler(**SD_BETAS)
    assert dpm.order == 1 and dpm.config.solver_order == 2
    dpm.set_timesteps(10)
    assert len(dpm.timesteps) == 10
    x, eps = tensors(0)
    for step_t in dpm.timesteps[:3]:
        x = dpm.step(eps, step_t, x).prev_sample
    assert sum(o is not None for o in dpm.model_outputs) == 2


def test_heun_calls_twice_per_level_after_the_first(sd_pipe):
    """Heun calls twice per level after the first (19 calls for 10 steps): through `StableDiffusionPipeline.__call__`, 1 + 2 (levels - 1) UNet calls, which is 2n - 1 only when the grid has n levels; at `trailing` 61 it has 62 (the last -1) and Heun makes 123 calls, so the Heun hover, shown on every page, states no count.

    A stand-in UNet forward (zeros) keeps the 61-step run cheap; the loop is the pipeline's.
    """
    hover = next(line for line in ABBREVIATIONS.splitlines() if line.startswith("*[Heun]:"))
    assert "2n - 1" not in hover  # false at the trailing step counts
    assert "one denoiser call each" not in SCHEDULER_PAGE  # 10 levels, 19 calls (below)
    seen = []

    def stand_in_unet(sample, t, *args, **kwargs):
        seen.append(float(t))
        return (torch.zeros_like(sample),)

    original = sd_pipe.scheduler
    sd_pipe.unet.forward = stand_in_unet
    try:
        for spacing, n, calls in (("linspace", 10, 19), ("trailing", 61, 123)):
            seen.clear()
            sd_pipe.scheduler = HeunDiscreteScheduler(timestep_spacing=spacing, **SD_BETAS)
            run_sd(sd_pipe, n, latents=start_latents())
            levels = sorted(set(seen), reverse=True)
            assert len(seen) == calls == 1 + 2 * (len(levels) - 1), (spacing, len(seen))
            assert seen.count(levels[0]) == 1 and all(seen.count(t) == 2 for t in levels[1:])
        assert levels[-1] == -1.0 and calls != 2 * n - 1
    finally:
        del sd_pipe.unet.forward
        sd_pipe.scheduler = original


@pytest.mark.parametrize("n", [5, 7, 10, 20, 25, 50])
def test_spacing_formulas(n):
    """For `T = 1000` at 5, 7, 10, 20, 25 and 50 steps the three spacings follow the page's formulas in `DDPMScheduler` and `DDIMScheduler`: `leading` is `T // n * (n - 1 - i) + steps_offset`, `trailing` is `round(T - i * T / n) - 1`, `linspace` is `round((n - 1 - i) * (T - 1) / (n - 1))`; `EulerDiscreteScheduler`'s `linspace`, its default, does not round: its grid is fractional at 7 steps and at SD's 50.

    At 7 steps Euler's second entry is 832.5 where the formula gives 832 (at 50, 978.61), so a
    sentence giving these formulas for every class's grid fails on Euler's default.
    """
    T, i = 1000, np.arange(n)
    expected = {
        "leading": (T // n) * (n - 1 - i) + 1,
        "trailing": np.round(T - i * T / n) - 1,
        "linspace": np.round((n - 1 - i) * (T - 1) / (n - 1)),
    }
    for spacing, values in expected.items():
        for cls in (DDPMScheduler, DDIMScheduler):
            scheduler = cls(timestep_spacing=spacing, steps_offset=int(spacing == "leading"))
            scheduler.set_timesteps(n)
            assert scheduler.timesteps.tolist() == values.astype(int).tolist(), (cls, spacing)
    euler = EulerDiscreteScheduler(**SD_BETAS)  # the default spacing
    assert euler.config.timestep_spacing == "linspace"
    euler.set_timesteps(n)
    unrounded = (n - 1 - i) * (T - 1) / (n - 1)
    np.testing.assert_allclose(euler.timesteps.numpy(), unrounded, rtol=1e-6)
    if n in (7, 50):
        assert euler.timesteps.tolist() != expected["linspace"].tolist()
        assert euler.timesteps[1].item() == pytest.approx({7: 832.5, 50: 978.61}[n], abs=0.005)


def test_float_rounding_quirks_in_spacing():
    """The rounding is NumPy's, on floating-point values: `linspace` at 27 steps gives 499 where the formula's tie 499.5 rounds to 500, and `trailing` at 61 steps gives `DDIMScheduler` (and `DDPMScheduler` and `EulerDiscreteScheduler`) 62 timesteps, the last one -1, and SD 1.5's `PNDMScheduler` 63.

    Not "a few step counts": from 2 to 1000 steps the `trailing` formula misses at 111 counts
    (48 gives 936 where it says 937) and `linspace` at 92 (31 gives 499 where it says 500), in
    DDIM and DDPM alike, so the page says "some".
    """
    linspace = DDIMScheduler(timestep_spacing="linspace")
    linspace.set_timesteps(27)
    assert linspace.timesteps[13].item() == 499 and (27 - 1 - 13) * 999 / 26 == 499.5
    missed = {"trailing": [], "linspace": []}
    for n in range(2, 1001):
        i = np.arange(n)
        formula = {
            "trailing": np.round(1000 - i * 1000 / n) - 1,
            "linspace": np.round((n - 1 - i) * 999 / (n - 1)),
        }
        for spacing, values in formula.items():
            scheduler = DDIMScheduler(timestep_spacing=spacing)
            scheduler.set_timesteps(n)
            if scheduler.timesteps.tolist() != values.astype(int).tolist():
                missed[spacing].append(n)
    assert {k: len(v) for k, v in missed.items()} == {"trailing": 111, "linspace": 92}
    assert missed["trailing"][:2] == [48, 61] and missed["linspace"][:2] == [27, 31]
    for cls in (DDIMScheduler, DDPMScheduler):
        trailing = cls(timestep_spacing="trailing")
        trailing.set_timesteps(48)
        assert trailing.timesteps[3].item() == 936 and np.round(1000 - 3 * 1000 / 48) - 1 == 937
    assert "at a few step counts" not in SCHEDULER_PAGE and "at some step counts" in SCHEDULER_PAGE
    for cls in (DDIMScheduler, DDPMScheduler, EulerDiscreteScheduler):
        trailing = cls(timestep_spacing="trailing")
        trailing.set_timesteps(61)
        assert len(trailing.timesteps) == 62 and trailing.timesteps[-1].item() == -1, cls.__name__
    pndm = PNDMScheduler(**{**SD15_PNDM, "timestep_spacing": "trailing"})
    pndm.set_timesteps(61)
    assert len(pndm.timesteps) == 63 and pndm.timesteps[-1].item() == -1


def trailing_schedulers():
    """Every scheduler class diffusers exports that takes `timestep_spacing="trailing"` with SD's
    betas and can run 60 and 61 steps (inversion schedulers run the other way: left out)."""
    found = {}
    for name in sorted(n for n in dir(diffusers) if n.endswith("Scheduler")):  # the exports' names
        cls = getattr(diffusers, name, None)
        if not (inspect.isclass(cls) and issubclass(cls, SchedulerMixin)) or "Inverse" in name:
            continue
        if not hasattr(cls, "step"):  # SchedulerMixin itself
            continue
        required = [
            p.name for p in inspect.signature(cls.step).parameters.values()
            if p.default is inspect.Parameter.empty and p.name != "self"
        ]  # fmt: skip
        if required != ["model_output", "timestep", "sample"]:  # CogVideoX's DPM: two samples
            continue
        try:
            scheduler = cls(timestep_spacing="trailing", **SD_BETAS)
            scheduler.set_timesteps(61)
        except (TypeError, ImportError, ValueError):  # no such setting, optional deps, LCM's 50
            continue
        if scheduler.config.get("timestep_spacing") == "trailing":
            found[name] = cls
    return found


def trailing_loop(cls, steps):
    """A whole loop of `cls` under `trailing` on SD's betas, with the output `0.1 *` the scaled
    input standing in for the model; returns the calls made and the `latents` that enter and
    leave the last step."""
    extra = {"clip_sample": False} if "clip_sample" in inspect.signature(cls).parameters else {}
    scheduler = cls(timestep_spacing="trailing", **SD_BETAS, **extra)
    scheduler.set_timesteps(steps)
    x = randn(1) * scheduler.init_noise_sigma
    kw = {"generator": torch.Generator().manual_seed(2)}
    if "generator" not in inspect.signature(scheduler.step).parameters:
        kw = {}
    for t in scheduler.timesteps:
        before = x
        x = scheduler.step(0.1 * scheduler.scale_model_input(x, t), t, x, **kw).prev_sample
    return len(scheduler.timesteps), before, x


def test_trailing_extra_timestep_wrecks_ddim_and_ddpm(sd_pipe, record_calls):
    """`trailing` at 61 steps gives `DDIMScheduler` 62 timesteps, the last one -1 (SD 1.5's `PNDMScheduler` 63): DDIM, DDPM and PNDM (also `DDIMParallelScheduler`, `DDPMParallelScheduler` and `CogVideoXDDIMScheduler`) read `alphas_cumprod[-1]`, the noisiest level, at that last step and divide by its square root (DDIM's `pred_original_sample` is `(x - sqrt(1 - alphas_cumprod[999]) * noise_pred) / sqrt(alphas_cumprod[999])`), so the final `latents` of `StableDiffusionPipeline` come out about 15 times the correct ones for SD's schedule when `noise_pred` is small next to them, without an error; Euler, Heun, `DPMSolverMultistepScheduler` and UniPC make the extra calls too but read the smallest `sigma` there (that of `t = 0`), and their output is unaffected; 61, 103, 121 and 59 other step counts up to 1000 do this.

    `StableDiffusionPipeline` runs DDIM at 61 steps with a spy on `step`; the latents that
    enter the extra step at -1 are what a correct loop returns (the step from 15 already
    lands on `final_alpha_cumprod`). It runs SD 1.5's `PNDMScheduler` at `trailing` 61 too:
    63 UNet calls (999, 983, 983, …, 15, -1), so "62 UNet calls" holds for DDIM, not PNDM. Then every exported scheduler class that takes
    `trailing` runs a whole stand-in loop at 60 and at 61 steps: exactly the
    `alphas_cumprod`-indexed ones end an order of magnitude larger.
    """
    quirky, scheduler = [], DDIMScheduler(timestep_spacing="trailing")
    for n in range(1, 1001):
        scheduler.set_timesteps(n)
        if len(scheduler.timesteps) != n:
            assert len(scheduler.timesteps) == n + 1 and scheduler.timesteps[-1] == -1, n
            quirky.append(n)
    assert quirky[:3] == [61, 103, 121] and len(quirky) == 62
    damage = 1 / DDIMScheduler(**SD_BETAS).alphas_cumprod[-1].item() ** 0.5
    assert damage == pytest.approx(15, abs=0.5)

    original = sd_pipe.scheduler
    try:
        sd_pipe.scheduler = scheduler = DDIMScheduler(timestep_spacing="trailing", **SD_SCHEDULER)
        steps, original_step = [], scheduler.step

        def step(model_output, t, sample, *args, **kwargs):
            steps.append((model_output.clone(), int(t), sample.clone()))
            return original_step(model_output, t, sample, *args, **kwargs)

        scheduler.step = step
        recorder = record_calls(sd_pipe.unet)
        final = run_sd(sd_pipe, 61, latents=start_latents())  # no error
    finally:
        sd_pipe.scheduler = original
    told = [int(args[1]) for args, _ in recorder.calls]
    assert len(told) == 62 and told[-2:] == [15, -1]
    try:
        sd_pipe.scheduler = PNDMScheduler(**{**SD15_PNDM, "timestep_spacing": "trailing"})
        recorder.calls.clear()
        run_sd(sd_pipe, 61, latents=start_latents())  # no error
    finally:
        sd_pipe.scheduler = original
    pndm_told = [int(args[1]) for args, _ in recorder.calls]
    assert len(pndm_told) == 63 and pndm_told[:3] == [999, 983, 983] and pndm_told[-1] == -1
    noise_pred, t, correct = steps[-1]
    assert t == -1 and torch.isfinite(final).all()
    abar = DDIMScheduler(**SD_BETAS).alphas_cumprod[-1]
    expected = abar.sqrt() ** -1 * (correct - (1 - abar).sqrt() * noise_pred)
    prev = DDIMScheduler(**SD_SCHEDULER).alphas_cumprod[0]  # SD's set_alpha_to_one=False
    close(final, prev.sqrt() * expected + (1 - prev).sqrt() * noise_pred)
    assert final.abs().max() / correct.abs().max() == pytest.approx(damage, rel=0.1)

    wrecked, unaffected = set(), set()
    for name, cls in trailing_schedulers().items():
        at60 = cls(timestep_spacing="trailing", **SD_BETAS)
        at60.set_timesteps(60)
        calls60 = len(at60.timesteps)
        calls61, before, x61 = trailing_loop(cls, 61)
        assert calls61 > calls60 * 61 / 60, name  # the extra timestep costs calls everywhere
        ratio = (x61.abs().max() / before.abs().max()).item()  # the last step, from t = -1
        (wrecked if ratio > 5 else unaffected).add(name)
        assert ratio > 5 or ratio == pytest.approx(1, abs=0.05), (name, ratio)
    assert wrecked == {
        "DDIMScheduler", "DDPMScheduler", "PNDMScheduler", "DDIMParallelScheduler",
        "DDPMParallelScheduler", "CogVideoXDDIMScheduler",
    }  # fmt: skip
    harmless = {
        "EulerDiscreteScheduler", "HeunDiscreteScheduler", "DPMSolverMultistepScheduler",
        "UniPCMultistepScheduler",
    }  # fmt: skip
    assert harmless <= unaffected
    abar0 = DDIMScheduler(**SD_BETAS).alphas_cumprod[0].item()
    for name in harmless:  # the sigma they step from at t = -1: the smallest, t = 0's
        at61 = getattr(diffusers, name)(timestep_spacing="trailing", **SD_BETAS)
        at61.set_timesteps(61)
        sigmas = at61.sigmas[: len(at61.timesteps)]  # sigmas[i] belongs to timesteps[i]
        last = sigmas[at61.timesteps == -1]
        assert len(last) and (last == sigmas.min()).all(), name
        assert last[0].item() == pytest.approx(((1 - abar0) / abar0) ** 0.5, rel=1e-5), name


def test_class_defaults():
    """The default `timestep_spacing` is `leading` for `DDPMScheduler` and `DDIMScheduler` and `linspace` for `EulerDiscreteScheduler`: built without arguments, `set_timesteps(10)` gives 900, 800, …, 0 for the first two and 999, 888, …, 0 for Euler."""
    for cls, expected in [
        (DDPMScheduler, list(range(900, -1, -100))),
        (DDIMScheduler, list(range(900, -1, -100))),
        (EulerDiscreteScheduler, list(range(999, -1, -111))),
    ]:
        scheduler = cls()
        scheduler.set_timesteps(10)
        assert scheduler.timesteps.tolist() == expected, cls.__name__


@pytest.mark.parametrize("cls", [DDPMScheduler, DDIMScheduler], ids=lambda c: c.__name__)
def test_trailing_starts_at_the_last_timestep(cls):
    """With `timestep_spacing="trailing"` the first of `scheduler.timesteps` is 999, the last training timestep; the default `"leading"` starts lower (900 for 10 steps, 901 with SD's `steps_offset=1`)."""
    firsts = {}
    for spacing, offset in [("trailing", 0), ("leading", 0), ("leading", 1)]:
        scheduler = cls(timestep_spacing=spacing, steps_offset=offset)
        scheduler.set_timesteps(10)
        firsts[spacing, offset] = int(scheduler.timesteps[0])
    assert cls().config.timestep_spacing == "leading"
    assert firsts == {("trailing", 0): 999, ("leading", 0): 900, ("leading", 1): 901}


def test_leading_starts_euler_below_sigma_max():
    """For SD's betas at 10 steps, `EulerDiscreteScheduler` with `leading` and `steps_offset=1` starts at `sigma` 8.39 (`t = 901`), while `trailing` starts at `sigma_max` 14.61 (`t = 999`)."""
    assert "8.39" in SCHEDULER_PAGE and "14.61" in SCHEDULER_PAGE
    leading = EulerDiscreteScheduler(timestep_spacing="leading", steps_offset=1, **SD_BETAS)
    leading.set_timesteps(10)
    trailing = EulerDiscreteScheduler(timestep_spacing="trailing", **SD_BETAS)
    trailing.set_timesteps(10)
    assert leading.timesteps[0].item() == 901 and trailing.timesteps[0].item() == 999
    assert float(leading.sigmas[0]) == pytest.approx(8.39, abs=0.005)
    assert float(trailing.sigmas[0]) == pytest.approx(14.61, abs=0.005)


def test_pipeline_rewrites_steps_offset_and_clip_sample(sd_pipe):
    """`StableDiffusionPipeline.__init__` rewrites a scheduler config with `steps_offset` other than 1 to 1, and `clip_sample=True` to `False`, each with a `FutureWarning`."""
    parts = {**sd_pipe.components, "scheduler": DDIMScheduler(steps_offset=0, clip_sample=True)}
    with pytest.warns(FutureWarning) as record:
        pipe = StableDiffusionPipeline(**parts)
    messages = " ".join(str(w.message) for w in record)
    assert "`steps_offset` should be set to 1" in messages
    assert "`clip_sample` should be set to False" in messages
    assert pipe.scheduler.config.steps_offset == 1 and pipe.scheduler.config.clip_sample is False


# --- the contract ----------------------------------------------------------------------------


def test_pipeline_loop_runs_the_contract(sd_pipe, record_calls):
    """`StableDiffusionPipeline` starts from `randn_tensor(...) * scheduler.init_noise_sigma`, passes each `t` of `scheduler.timesteps` to the UNet as a 0-d tensor with `scale_model_input(latents, t)`, and sets `latents` to `step(noise_pred, t, latents)[0]`, calling the UNet and `step` with `return_dict=False`; element `[0]` is the same tensor as `.prev_sample`; all have shape `(B, 4, H/8, W/8)` with a VAE of SD 1.x's four blocks (`(1, 4, 4, 4)` at 32 px), `(B, 4, H/2, W/2)` with the two-block tiny one.

    The tiny pipeline runs the whole contract; the pipeline with SD 1.x's four-block VAE
    (``vae_scale_factor`` 8) checks the shapes the UNet and ``step`` see.
    """
    sd_pipe.scheduler = EulerDiscreteScheduler(**SD_BETAS)
    scheduler = sd_pipe.scheduler
    steps = []
    original_step = scheduler.step

    @functools.wraps(original_step)
    def step(model_output, t, sample, *args, **kwargs):
        out = original_step(model_output, t, sample, *args, **kwargs)
        assert kwargs.get("return_dict") is False and isinstance(out, tuple)
        steps.append((model_output.clone(), t, sample.clone(), out[0].clone()))
        return out

    scheduler.step = step
    recorder = record_calls(sd_pipe.unet)
    try:
        final = run_sd(sd_pipe, 4, generator=torch.Generator().manual_seed(3))
    finally:
        del scheduler.step

    noise = torch.randn(LATENT_SHAPE, generator=torch.Generator().manual_seed(3))
    reference = EulerDiscreteScheduler.from_config(scheduler.config)
    reference.set_timesteps(4)
    latents = noise * reference.init_noise_sigma
    assert len(recorder.calls) == len(steps) == 4
    for (args, kwargs), (model_output, t, sample, prev) in zip(recorder.calls, steps, strict=True):
        assert kwargs["return_dict"] is False
        unet_input, unet_t = args[0], args[1]
        assert unet_t.dim() == 0 and t.dim() == 0 and unet_t.item() == t.item()
        torch.testing.assert_close(sample, latents)
        torch.testing.assert_close(unet_input, reference.scale_model_input(latents, t))
        out = reference.step(model_output, t, latents)
        torch.testing.assert_close(prev, out.prev_sample)
        for tensor in (model_output, sample, prev, out.pred_original_sample, unet_input):
            assert tuple(tensor.shape) == LATENT_SHAPE
        latents = out.prev_sample
    torch.testing.assert_close(final, latents)
    assert sd_pipe.vae_scale_factor == 2 and LATENT_SHAPE == (1, 4, HEIGHT // 2, WIDTH // 2)


def test_pipeline_loop_shapes_with_sd1_vae(sd1_shaped_pipe, record_calls):
    """With a VAE of SD 1.x's four blocks, `StableDiffusionPipeline` hands the UNet and `step` `latents` of shape `(B, 4, H/8, W/8)`: `(1, 4, 4, 4)` at 32 px, and `noise_pred` and `prev_sample` have that shape too."""
    pipe = sd1_shaped_pipe
    assert pipe.vae_scale_factor == 8
    shapes, original_step = [], pipe.scheduler.step

    def step(model_output, t, sample, *args, **kwargs):
        out = original_step(model_output, t, sample, *args, **kwargs)
        shapes.append((tuple(model_output.shape), tuple(sample.shape), tuple(out[0].shape)))
        return out

    pipe.scheduler.step = step
    recorder = record_calls(pipe.unet)
    try:
        final = pipe(prompt_embeds=embeds(0), guidance_scale=1.0, num_inference_steps=2,
                     height=32, width=32, output_type="latent").images  # fmt: skip
    finally:
        del pipe.scheduler.step
    expected = (1, 4, 32 // 8, 32 // 8)
    assert tuple(final.shape) == expected and len(shapes) == len(recorder.calls) == 2
    assert all(tuple(args[0].shape) == expected for args, _ in recorder.calls)
    assert all(s == (expected,) * 3 for s in shapes), shapes


class DDIMWithoutScaleModelInput(DDIMScheduler):
    """A DDIMScheduler on which `hasattr(scheduler, "scale_model_input")` is False."""

    @property
    def scale_model_input(self):
        raise AttributeError("scale_model_input")


def test_pipeline_guards_scale_model_input_but_not_init_noise_sigma(sd_pipe):
    """`StableDiffusionPipeline.__call__` skips `scale_model_input` when the scheduler has none (an `if hasattr` guard), but `prepare_latents` reads `scheduler.init_noise_sigma` unguarded: with `FlowMatchEulerDiscreteScheduler`, which has neither, the call fails there with an `AttributeError`."""
    original = sd_pipe.scheduler
    try:
        sd_pipe.scheduler = DDIMWithoutScaleModelInput(**SD_SCHEDULER)
        assert not hasattr(sd_pipe.scheduler, "scale_model_input")
        without = run_sd(sd_pipe, 3, latents=start_latents())
        sd_pipe.scheduler = DDIMScheduler(**SD_SCHEDULER)
        torch.testing.assert_close(without, run_sd(sd_pipe, 3, latents=start_latents()))
        sd_pipe.scheduler = FlowMatchEulerDiscreteScheduler()
        with pytest.raises(AttributeError, match="init_noise_sigma"):
            run_sd(sd_pipe, 3, latents=start_latents())
    finally:
        sd_pipe.scheduler = original


def test_only_init_checks_the_scheduler_config(sd_pipe, record_calls):
    """In `StableDiffusionPipeline` only `__init__` rewrites an outdated config: a `DDIMScheduler()` with the defaults `steps_offset=0` and `clip_sample=True` assigned later with `pipe.scheduler = ...` raises no warning, and `__call__` runs it as configured (first UNet call at `t = 900`, not 901)."""
    original = sd_pipe.scheduler
    try:
        sd_pipe.scheduler = DDIMScheduler(
            **SD_BETAS
        )  # the error filter turns a warning into a failure
        recorder = record_calls(sd_pipe.unet)
        run_sd(sd_pipe, 10, latents=start_latents())
        assert sd_pipe.scheduler.config.steps_offset == 0 and sd_pipe.scheduler.config.clip_sample
        assert float(recorder.calls[0][0][1]) == 900
    finally:
        sd_pipe.scheduler = original


def test_init_noise_sigma_per_class_and_spacing():
    """`init_noise_sigma` is 1.0 for `DDPMScheduler` and `DDIMScheduler`; for `EulerDiscreteScheduler` it is `sigmas.max()` under `linspace` and `trailing` and `(sigmas.max()**2 + 1) ** 0.5` under `leading`; `FlowMatchEulerDiscreteScheduler` has no `init_noise_sigma`. Under `leading` it is not about the grid's largest sigma at few steps: at 1 step with `steps_offset=1` (SDXL's Euler config) it is over 20 times it."""
    for cls in (DDPMScheduler, DDIMScheduler):
        scheduler = cls(**SD_BETAS)
        scheduler.set_timesteps(10)
        assert scheduler.init_noise_sigma == 1.0
    for spacing in ("linspace", "trailing", "leading"):
        scheduler = EulerDiscreteScheduler(timestep_spacing=spacing, steps_offset=1, **SD_BETAS)
        scheduler.set_timesteps(10)
        sigma_max = scheduler.sigmas.max()
        expected = sigma_max if spacing != "leading" else (sigma_max**2 + 1) ** 0.5
        assert float(scheduler.init_noise_sigma) == pytest.approx(float(expected)), spacing
    # the table's Euler cell states no "about sigma_max": at 1 `leading` step the grid is t = 1
    leading = EulerDiscreteScheduler(timestep_spacing="leading", steps_offset=1, **SD_BETAS)
    leading.set_timesteps(1)
    assert leading.timesteps.tolist() == [1.0]
    assert float(leading.init_noise_sigma) > 20 * float(leading.sigmas.max())
    row = next(
        line for line in SCHEDULER_PAGE.splitlines() if line.startswith("| `init_noise_sigma`")
    )
    assert "largest" not in row, row
    assert not hasattr(FlowMatchEulerDiscreteScheduler(), "init_noise_sigma")


def test_scale_model_input_per_class():
    """`scale_model_input(sample, t)` returns `sample` itself for `DDPMScheduler` and `DDIMScheduler` and `sample / (sigma**2 + 1) ** 0.5` for `EulerDiscreteScheduler`; `FlowMatchEulerDiscreteScheduler` has no such method."""
    sample, _ = tensors(1)
    for cls in (DDPMScheduler, DDIMScheduler):
        scheduler = cls(**SD_BETAS)
        scheduler.set_timesteps(10)
        assert scheduler.scale_model_input(sample, scheduler.timesteps[3]) is sample
    euler = EulerDiscreteScheduler(**SD_BETAS)
    euler.set_timesteps(10)
    t, sigma = euler.timesteps[3], euler.sigmas[3]
    torch.testing.assert_close(euler.scale_model_input(sample, t), sample / (sigma**2 + 1) ** 0.5)
    assert not hasattr(FlowMatchEulerDiscreteScheduler(), "scale_model_input")


def test_scale_model_input_identity_and_state_beyond_ddim():
    """`scale_model_input` returns `sample` itself for `PNDMScheduler`, `DPMSolverMultistepScheduler` and `UniPCMultistepScheduler` too, but rescales it for `HeunDiscreteScheduler` and `KDPM2DiscreteScheduler`; `EulerDiscreteScheduler` and `DPMSolverMultistepScheduler` advance a `step_index` and `PNDMScheduler` a `counter` in each `step`."""
    from diffusers import KDPM2DiscreteScheduler, UniPCMultistepScheduler

    sample, model_output = tensors(24)
    for cls in (PNDMScheduler, DPMSolverMultistepScheduler, UniPCMultistepScheduler):
        scheduler = cls(**SD_BETAS)
        scheduler.set_timesteps(10)
        assert scheduler.init_noise_sigma == 1.0, cls.__name__
        assert scheduler.scale_model_input(sample, scheduler.timesteps[0]) is sample, cls.__name__
    for cls in (HeunDiscreteScheduler, KDPM2DiscreteScheduler):
        scheduler = cls(**SD_BETAS)
        scheduler.set_timesteps(10)
        scaled = scheduler.scale_model_input(sample, scheduler.timesteps[0])
        assert scaled.std() < 0.1 * sample.std(), cls.__name__
    for cls, counter in [
        (EulerDiscreteScheduler, "step_index"),
        (DPMSolverMultistepScheduler, "step_index"),
        (PNDMScheduler, "counter"),
    ]:
        scheduler = cls(**SD_BETAS)
        scheduler.set_timesteps(10)
        x = sample
        for k, t in enumerate(scheduler.timesteps[:3]):
            x = scheduler.step(model_output, t, scheduler.scale_model_input(x, t)).prev_sample
            assert getattr(scheduler, counter) == k + 1, cls.__name__


def test_euler_scaled_input_is_the_vp_sample():
    """For an Euler state `x0 + sigma * eps` at a training timestep `t`, `scale_model_input` returns `sqrt(alphas_cumprod[t]) * x0 + sqrt(1 - alphas_cumprod[t]) * eps`, which is `DDPMScheduler.add_noise(x0, eps, t)`: the input the UNet was trained on."""
    x0, eps = tensors(2)
    ddpm = DDPMScheduler(**SD_BETAS)
    for index in (0, 4, 9):
        euler = EulerDiscreteScheduler(timestep_spacing="trailing", **SD_BETAS)
        euler.set_timesteps(10)  # a fresh instance: scale_model_input reads step_index from t
        t = euler.timesteps[index]
        state = x0 + euler.sigmas[index] * eps
        expected = ddpm.add_noise(x0, eps, t.long().reshape(1))
        torch.testing.assert_close(
            euler.scale_model_input(state, t), expected, atol=1e-5, rtol=1e-4
        )
    # At SD's sigma_max the unscaled state has variance about 1 + sigma_max**2 (unit-variance x0)
    assert 1 + float(euler.sigmas.max()) ** 2 == pytest.approx(215, abs=1)


def test_step_outputs_per_class():
    """`step` returns `.prev_sample` and `.pred_original_sample` for `DDPMScheduler`, `DDIMScheduler` and `EulerDiscreteScheduler`, but only `.prev_sample` for `FlowMatchEulerDiscreteScheduler`; with `return_dict=False` element `[0]` is `prev_sample`."""
    sample, model_output = tensors(4)
    for cls in (DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler):
        a, b = cls(**SD_BETAS), cls(**SD_BETAS)
        for s in (a, b):
            s.set_timesteps(10)
        t = a.timesteps[2]
        out = a.step(model_output, t, sample, generator=torch.Generator().manual_seed(0))
        tup = b.step(model_output, t, sample, generator=torch.Generator().manual_seed(0), return_dict=False)  # fmt: skip
        names = [f.name for f in dataclasses.fields(out)]
        assert names == ["prev_sample", "pred_original_sample"], cls.__name__
        assert torch.equal(tup[0], out.prev_sample) and len(tup) == 2
    flow_a, flow_b = FlowMatchEulerDiscreteScheduler(), FlowMatchEulerDiscreteScheduler()
    for s in (flow_a, flow_b):
        s.set_timesteps(10)
    out = flow_a.step(model_output, flow_a.timesteps[2], sample)
    assert isinstance(out, FlowMatchEulerDiscreteSchedulerOutput)
    assert [f.name for f in dataclasses.fields(out)] == ["prev_sample"]
    tup = flow_b.step(model_output, flow_b.timesteps[2], sample, return_dict=False)
    assert len(tup) == 1 and torch.equal(tup[0], out.prev_sample)


def test_euler_sigma_is_the_noise_scale_of_alphas_cumprod():
    """`EulerDiscreteScheduler` keeps its state as `x0 + sigma * noise` (`add_noise`), where `sigma` at training timestep `t` is `((1 - alphas_cumprod[t]) / alphas_cumprod[t]) ** 0.5`: 14.61 at SD's `t = 999`, 0.029 at `t = 0`; 0 is clean data (the final entry of `sigmas`)."""
    scheduler = EulerDiscreteScheduler(**SD_BETAS)
    abar = scheduler.alphas_cumprod.double()
    torch.testing.assert_close(scheduler.sigmas[:-1].flip(0).double(), ((1 - abar) / abar) ** 0.5, rtol=1e-6, atol=0)  # fmt: skip
    assert scheduler.sigmas[-1].item() == 0
    assert f"{scheduler.sigmas[0].item():.2f}" == "14.61"
    assert f"{scheduler.sigmas[-2].item():.3f}" == "0.029"  # t = 0 is not yet clean data
    x0, noise = tensors(22)
    scheduler.set_timesteps(1000)  # linspace at 1000 steps visits every training timestep
    for i in (0, 499, 999):
        t = scheduler.timesteps[i]
        sigma = ((1 - abar[int(t)]) / abar[int(t)]) ** 0.5
        scheduler._step_index = None
        noisy = scheduler.add_noise(x0, noise, t.reshape(1))
        torch.testing.assert_close(noisy, x0 + sigma.float() * noise)


def test_forward_process_formulas():
    """`add_noise(original_samples, noise, timesteps)` gives `sqrt(alphas_cumprod[t]) * x0 + sqrt(1 - alphas_cumprod[t]) * noise` for DDPM and DDIM and `x0 + sigma * noise` for Euler; `FlowMatchEulerDiscreteScheduler` has `scale_noise(sample, timestep, noise)` = `sigma * noise + (1 - sigma) * sample` instead of `add_noise`."""
    x0, noise = tensors(5)
    for cls in (DDPMScheduler, DDIMScheduler):
        scheduler = cls(**SD_BETAS)
        t = torch.tensor([700])
        abar = scheduler.alphas_cumprod[700]
        expected = abar**0.5 * x0 + (1 - abar) ** 0.5 * noise
        torch.testing.assert_close(scheduler.add_noise(x0, noise, t), expected)
    euler = EulerDiscreteScheduler(**SD_BETAS)
    euler.set_timesteps(10)
    t = euler.timesteps[3].reshape(1)
    torch.testing.assert_close(euler.add_noise(x0, noise, t), x0 + euler.sigmas[3] * noise)
    flow = FlowMatchEulerDiscreteScheduler(shift=3.0)
    flow.set_timesteps(10)
    assert not hasattr(flow, "add_noise")
    sigma = flow.sigmas[3]
    scaled = flow.scale_noise(x0, flow.timesteps[3].reshape(1), noise)
    torch.testing.assert_close(scaled, sigma * noise + (1 - sigma) * x0)


def test_contract_orders():
    """`DDPMScheduler`, `DDIMScheduler`, `EulerDiscreteScheduler` and `FlowMatchEulerDiscreteScheduler` all have `order = 1`."""
    for cls in (DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler):
        assert cls.order == 1 and cls().order == 1
    assert FlowMatchEulerDiscreteScheduler.order == 1


def test_flow_timesteps_are_1000_sigmas():
    """`FlowMatchEulerDiscreteScheduler.set_timesteps(n)` gives float32 `timesteps` of shape `(n,)` equal to `sigmas[:-1] * num_train_timesteps` and `sigmas` of shape `(n + 1,)` ending in 0; `EulerDiscreteScheduler` gives `sigmas` one longer than its `timesteps`, ending in 0.

    Not ``(n + 1,)`` for Euler: at ``trailing`` 61 it has 62 timesteps and 63 sigmas, so the
    page's contract table states no shape for DDPM, DDIM or Euler.
    """
    for shift in (1.0, 3.0):
        flow = FlowMatchEulerDiscreteScheduler(shift=shift)
        flow.set_timesteps(10)
        assert flow.timesteps.dtype == torch.float32 and flow.timesteps.shape == (10,)
        assert flow.sigmas.shape == (11,) and flow.sigmas[-1].item() == 0
        torch.testing.assert_close(flow.timesteps, flow.sigmas[:-1] * 1000)
    for spacing, n, entries in (("linspace", 10, 10), ("trailing", 61, 62)):
        euler = EulerDiscreteScheduler(timestep_spacing=spacing, **SD_BETAS)
        euler.set_timesteps(n)
        assert len(euler.timesteps) == entries and euler.sigmas.shape == (entries + 1,)
        assert euler.sigmas[-1].item() == 0
    (row,) = table_rows(r"`set_timesteps\(n\)`")
    assert "(n,)" not in row[1] + row[2] and "(n+1,)" not in row[2]


# --- state -----------------------------------------------------------------------------------


def test_euler_and_flow_keep_a_step_index():
    """`EulerDiscreteScheduler` and `FlowMatchEulerDiscreteScheduler` keep a `step_index` that each `step` increments and `set_timesteps` resets to `None`, so calling `step` twice at one `t` gives a different result from the first call."""
    sample, model_output = tensors(6)
    for scheduler in (
        EulerDiscreteScheduler(**SD_BETAS),
        FlowMatchEulerDiscreteScheduler(shift=3.0),
    ):
        scheduler.set_timesteps(10)
        assert scheduler.step_index is None
        t = scheduler.timesteps[0]
        first = scheduler.step(model_output, t, sample).prev_sample
        assert scheduler.step_index == 1
        second = scheduler.step(model_output, t, sample).prev_sample
        assert scheduler.step_index == 2
        assert not torch.allclose(first, second), type(scheduler).__name__
        scheduler.set_timesteps(10)
        assert scheduler.step_index is None
        torch.testing.assert_close(scheduler.step(model_output, t, sample).prev_sample, first)


def test_an_extra_step_call_corrupts_the_trajectory(sd_pipe):
    """Euler keeps a `step_index`, PNDM a `counter` and past outputs, advanced by each `step`: an extra `step` call corrupts the trajectory (in `StableDiffusionPipeline` at 5 steps, one extra call after the first step makes Euler raise an `IndexError`, and one after the third makes SD 1.5's PNDM return other `latents`).

    Not silently for Euler: through ``StableDiffusionPipeline.__call__`` at 5 steps, one
    extra ``scheduler.step`` call in ``callback_on_step_end`` (a preview, say) makes
    ``EulerDiscreteScheduler`` raise an ``IndexError`` at the last step, past the end of
    ``sigmas``; SD 1.5's ``PNDMScheduler`` given it after its third call runs to the end
    and returns other ``latents``, without an error.
    """
    assert "silently corrupts the trajectory" not in SCHEDULER_PAGE  # Euler's loop raises

    def extra_step_after(k):
        def callback(pipe, i, t, callback_kwargs):
            if i == k:
                latents = callback_kwargs["latents"]
                pipe.scheduler.step(torch.zeros_like(latents), t, latents)
            return callback_kwargs

        return callback

    original = sd_pipe.scheduler
    try:
        sd_pipe.scheduler = EulerDiscreteScheduler(**SD_SCHEDULER_EULER)
        run_sd(sd_pipe, 5, latents=start_latents())
        with pytest.raises(IndexError):
            run_sd(sd_pipe, 5, latents=start_latents(), callback_on_step_end=extra_step_after(0))  # fmt: skip
        sd_pipe.scheduler = PNDMScheduler(**SD15_PNDM)
        alone = run_sd(sd_pipe, 5, latents=start_latents())
        extra = run_sd(sd_pipe, 5, latents=start_latents(), callback_on_step_end=extra_step_after(2))  # fmt: skip
        assert torch.isfinite(extra).all() and not torch.allclose(extra, alone, atol=1e-3)
    finally:
        sd_pipe.scheduler = original


def test_ddim_and_ddpm_step_are_stateless():
    """`DDIMScheduler.step` depends only on `t`, the step count and its inputs, `DDPMScheduler.step` on `t`, the grid and its inputs: calling either twice at one `t` gives the same result (DDPM with the same `generator` seed), and DDIM's result does not change when its `timesteps` are replaced."""
    sample, model_output = tensors(7)
    for cls in (DDIMScheduler, DDPMScheduler):
        scheduler = cls(**SD_BETAS)
        scheduler.set_timesteps(10)
        t = scheduler.timesteps[0]
        results = [
            scheduler.step(
                model_output, t, sample, generator=torch.Generator().manual_seed(0)
            ).prev_sample
            for _ in range(2)
        ]
        assert torch.equal(*results), cls.__name__
        if cls is DDIMScheduler:
            scheduler.timesteps = scheduler.timesteps.flip(0)  # another grid, same step count
            again = scheduler.step(model_output, t, sample).prev_sample
            assert torch.equal(again, results[0])


def test_pndm_is_stateful():
    """`PNDMScheduler` keeps a `counter` and the past model outputs `ets`: with SD 1.5's config, the second call at the repeated timestep 961 ignores the `sample` it is given and redoes the step from 981 with the average of the two model outputs."""
    scheduler = PNDMScheduler(**SD15_PNDM)
    scheduler.set_timesteps(50)
    x, other, e1, e2 = tensors(8, 4)
    t = scheduler.timesteps
    assert t[:3].tolist() == [981, 961, 961]
    first = scheduler.step(e1, t[0], x).prev_sample
    assert scheduler.counter == 1 and len(scheduler.ets) == 1
    second = scheduler.step(e2, t[1], first).prev_sample
    assert scheduler.counter == 2
    assert not torch.allclose(first, second)

    fresh = PNDMScheduler(**SD15_PNDM)
    fresh.set_timesteps(50)
    averaged = fresh.step((e1 + e2) / 2, t[0], x).prev_sample
    torch.testing.assert_close(second, averaged)

    again = PNDMScheduler(**SD15_PNDM)
    again.set_timesteps(50)
    again.step(e1, t[0], x)
    torch.testing.assert_close(again.step(e2, t[1], other).prev_sample, second)


def test_a_shared_instance_loses_its_grid_to_another_request(sd_pipe):
    """DDIM keeps only its step count, DDPM its grid, and a concurrent request's `set_timesteps` on a shared instance replaces them: in `StableDiffusionPipeline` at 10 steps, another `set_timesteps(5)` on the same scheduler after the first step makes DDIM step with that request's stride, silently, and DDPM raise an `IndexError` at a `t` off the new grid and step to the new grid's next level at one on it."""
    prompt_embeds = embeds(0)
    seen = {}

    def other_request(pipe, i, t, callback_kwargs):
        seen[i] = callback_kwargs["latents"].clone()
        if i == 0:
            pipe.scheduler.set_timesteps(5)  # what a second request on this instance does
        return callback_kwargs

    original = sd_pipe.scheduler
    try:
        sd_pipe.scheduler = DDIMScheduler(**SD_SCHEDULER)
        alone = run_sd(sd_pipe, 10, latents=start_latents())
        shared = run_sd(
            sd_pipe, 10, latents=start_latents(), callback_on_step_end=other_request
        )  # no error
        assert torch.isfinite(shared).all() and not torch.allclose(shared, alone, atol=1e-3)
        # the second step, at t = 801, used the 5-step grid's stride (to 601, not 701)
        with torch.no_grad():
            noise_pred = sd_pipe.unet(seen[0], 801, encoder_hidden_states=prompt_embeds).sample
        five = DDIMScheduler(**SD_SCHEDULER)
        five.set_timesteps(5)
        close(seen[1], five.step(noise_pred, 801, seen[0]).prev_sample)
        five.timesteps = torch.arange(999, -1, -111)  # any grid: DDIM reads only the count
        close(seen[1], five.step(noise_pred, 801, seen[0]).prev_sample)

        sd_pipe.scheduler = DDPMScheduler(**{**SD_BETAS, "steps_offset": 1, "clip_sample": False})
        scheduler, targets = sd_pipe.scheduler, []
        previous_timestep = scheduler.previous_timestep

        def spy(t):
            targets.append((int(t), int(previous_timestep(t))))
            return targets[-1][1]

        scheduler.previous_timestep = spy
        with pytest.raises(IndexError):  # t = 701 is not on 801, 601, …, 1
            run_sd(
                sd_pipe, 10, latents=start_latents(), callback_on_step_end=other_request,
                generator=torch.Generator().manual_seed(0),
            )  # fmt: skip
        assert list(dict.fromkeys(targets)) == [(901, 801), (801, 601)]  # step and _get_variance
    finally:
        sd_pipe.scheduler = original


# --- prediction_type -------------------------------------------------------------------------


def test_prediction_type_values_and_default():
    """`DDPMScheduler`, `DDIMScheduler` and `EulerDiscreteScheduler` default to `prediction_type="epsilon"` and accept `"sample"` and `"v_prediction"`, each reading the same output differently (Euler also `"original_sample"`, read as `"sample"`, which DDPM and DDIM reject in `step`); `FlowMatchEulerDiscreteScheduler` has no `prediction_type`."""
    sample, model_output = tensors(9)
    for cls in (DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler):
        x0 = []
        for kind in (None, "epsilon", "sample", "v_prediction"):  # None: the default
            extra = {} if cls is EulerDiscreteScheduler else {"clip_sample": False}
            if kind is not None:
                extra["prediction_type"] = kind
            scheduler = cls(**extra, **SD_BETAS)
            scheduler.set_timesteps(10)
            out = scheduler.step(
                model_output, scheduler.timesteps[3], sample, generator=torch.Generator()
            )
            x0.append(out.pred_original_sample)
        assert torch.equal(x0[0], x0[1]), cls.__name__  # the default reads `epsilon`
        assert not torch.allclose(x0[1], x0[2]) and not torch.allclose(x0[1], x0[3])
        assert torch.equal(x0[2], model_output), cls.__name__
        alias = cls(prediction_type="original_sample", **SD_BETAS)
        alias.set_timesteps(10)
        if cls is EulerDiscreteScheduler:  # read as `sample`
            out = alias.step(model_output, alias.timesteps[3], sample)
            assert torch.equal(out.pred_original_sample, x0[2])
        else:
            with pytest.raises(ValueError, match="prediction_type"):
                alias.step(model_output, alias.timesteps[3], sample, generator=torch.Generator())
    assert "prediction_type" not in FlowMatchEulerDiscreteScheduler().config


def test_each_step_reads_prediction_type_in_ddpm_ddim_euler():
    r"""In DDPM, DDIM and Euler, each step reads the output through `prediction_type` as $\hat x_0$ (`pred_original_sample`) and computes `prev_sample` from it: given the exact $x_0$ as a `sample` output, `DDIMScheduler.step` and `EulerDiscreteScheduler.step` return `add_noise(x0, noise)` at the next level and `DDPMScheduler.step` shrinks the noise. Not every step lowers the noise level: `DDIMScheduler` with `set_alpha_to_one=False` and `clip_sample=False` on a `linspace` grid ends at $t = 0$ and returns its `sample` unchanged; not every scheduler has a `prediction_type`: `FlowMatchEulerDiscreteScheduler` and others of the installed diffusers' scheduler exports have none."""
    x0, noise = randn(1, (2, 4, 4, 4)).float(), randn(2, (2, 4, 4, 4)).float()
    for cls in (DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler):
        scheduler = cls(prediction_type="sample", **SD_BETAS)
        if "clip_sample" in scheduler.config:
            scheduler.register_to_config(clip_sample=False)
        scheduler.set_timesteps(10)
        t, t_next = scheduler.timesteps[2], scheduler.timesteps[3]
        x_t = scheduler.add_noise(x0, noise, t.reshape(1))
        generator = torch.Generator().manual_seed(0)
        out = scheduler.step(x0, t, x_t, generator=generator)
        torch.testing.assert_close(out.pred_original_sample, x0), cls.__name__
        if cls is DDPMScheduler:
            assert (out.prev_sample - x0).norm() < (x_t - x0).norm()
        else:
            expected = cls(prediction_type="sample", **SD_BETAS)
            expected.set_timesteps(10)
            target = expected.add_noise(x0, noise, t_next.reshape(1))
            torch.testing.assert_close(out.prev_sample, target, rtol=1e-4, atol=1e-4), cls.__name__
    without = set()
    for name in dir(diffusers):
        if not name.endswith("Scheduler"):
            continue
        cls = getattr(diffusers, name)
        if not (inspect.isclass(cls) and issubclass(cls, SchedulerMixin)):
            continue
        try:
            scheduler = cls()
        except TypeError:  # needs arguments (e.g. VQDiffusionScheduler)
            continue
        if "prediction_type" not in scheduler.config:
            without.add(name)
    assert "FlowMatchEulerDiscreteScheduler" in without and len(without) > 1, without
    assert not without & {"DDPMScheduler", "DDIMScheduler", "EulerDiscreteScheduler"}
    # the last step of a linspace grid under set_alpha_to_one=False stays at alphas_cumprod[0]
    ddim = DDIMScheduler(
        set_alpha_to_one=False, clip_sample=False, timestep_spacing="linspace", **SD_BETAS
    )
    ddim.set_timesteps(10)
    assert int(ddim.timesteps[-1]) == 0
    torch.testing.assert_close(ddim.step(noise, ddim.timesteps[-1], x0).prev_sample, x0)
    # at any eta: sigma_t is 0 there, since the previous level is the current one
    with_eta = ddim.step(noise, ddim.timesteps[-1], x0, eta=1.0, generator=torch.Generator())
    torch.testing.assert_close(with_eta.prev_sample, x0)
    # ... only with clip_sample=False: the class default clamps x0_hat and changes the sample
    clipped = DDIMScheduler(set_alpha_to_one=False, timestep_spacing="linspace", **SD_BETAS)
    clipped.set_timesteps(10)
    assert clipped.config.clip_sample
    changed = clipped.step(noise, clipped.timesteps[-1], x0).prev_sample
    assert (changed - x0).abs().max() > 1e-2
    doc = " ".join(test_each_step_reads_prediction_type_in_ddpm_ddim_euler.__doc__.split())
    assert "`set_alpha_to_one=False` and `clip_sample=False` on a `linspace` grid" in doc, doc
    lines = [
        line for line in SCHEDULER_PAGE.splitlines() if "step reads the output through" in line
    ]
    assert len(lines) == 2 and all("In DDPM, DDIM and Euler" in line for line in lines), lines
    assert not any("lower noise level" in line or "lower level" in line for line in lines), lines


def test_wrong_prediction_type_raises_no_error():
    """In `DDIMScheduler` a mismatched `prediction_type` raises no error: at `epsilon` it reads a `v_prediction` output as noise and, on SD's schedule, returns finite `latents`; in DDPM, DDIM and Euler a name the class does not accept (`"noise"`) raises in `step`, not at construction.

    Not every scheduler is silent: SD 1.5's ``PNDMScheduler`` raises in ``step`` on ``sample``. Nor is a bad
    name the only raise: ``EulerDiscreteScheduler(timestep_type="continuous")`` at ``v_prediction``
    raises a ``ValueError`` in ``set_timesteps(timesteps=...)``, where ``epsilon`` runs.
    """
    x0, eps = tensors(10)
    scheduler = DDIMScheduler(prediction_type="epsilon", clip_sample=False, **SD_BETAS)
    scheduler.set_timesteps(10)
    t = scheduler.timesteps[3]
    abar = scheduler.alphas_cumprod[t]
    x_t = abar**0.5 * x0 + (1 - abar) ** 0.5 * eps
    v = abar**0.5 * eps - (1 - abar) ** 0.5 * x0  # what a v-prediction model outputs
    out = scheduler.step(v, t, x_t)
    assert torch.isfinite(out.prev_sample).all()
    assert not torch.allclose(out.pred_original_sample, x0, atol=0.1)
    for cls in (DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler):
        bogus = cls(prediction_type="noise", **SD_BETAS)  # constructs without complaint
        bogus.set_timesteps(10)
        with pytest.raises(ValueError, match="prediction_type"):
            bogus.step(eps, bogus.timesteps[0], x_t)
    pndm = PNDMScheduler(**{**SD15_PNDM, "prediction_type": "sample"})
    pndm.set_timesteps(10)
    with pytest.raises(ValueError, match="must be one of `epsilon` or `v_prediction`"):
        pndm.step(eps, pndm.timesteps[0], x_t)
    custom = [999, 500, 1]  # an accepted name that raises, outside step
    EulerDiscreteScheduler(timestep_type="continuous", **SD_BETAS).set_timesteps(timesteps=custom)
    continuous_v = EulerDiscreteScheduler(
        timestep_type="continuous", prediction_type="v_prediction", **SD_BETAS
    )
    with pytest.raises(ValueError, match="prediction_type = 'v_prediction'"):
        continuous_v.set_timesteps(timesteps=custom)
    zero_snr = DDIMScheduler(prediction_type="epsilon", clip_sample=False, **SD_BETAS,
                             rescale_betas_zero_snr=True, timestep_spacing="trailing")  # fmt: skip
    zero_snr.set_timesteps(10)
    t = zero_snr.timesteps[0]  # 999, where zero terminal SNR puts alphas_cumprod at 0
    abar = zero_snr.alphas_cumprod[t]
    x_t = abar**0.5 * x0 + (1 - abar) ** 0.5 * eps
    v = abar**0.5 * eps - (1 - abar) ** 0.5 * x0
    assert t == 999 and not torch.isfinite(zero_snr.step(v, t, x_t).prev_sample).all()


def test_a_mismatch_raises_nothing(sd_pipe):
    """In `step`, `epsilon` and `v_prediction` swapped raise nothing, returning wrong `latents`: through `StableDiffusionPipeline.__call__`, `DDIMScheduler`, `DDPMScheduler` and `EulerDiscreteScheduler` read as `epsilon` or `v_prediction` finish without an error, with different `latents`, on SD's schedule, and DDIM also on a zero-terminal-SNR `trailing` one.

    The page states no rule for when those `latents` are finite. At 5 steps, eta = 0: finite on
    SD's schedule; with `rescale_betas_zero_snr=True` and `trailing` the `epsilon` reading ends
    non-finite in DDIM and DDPM (finite with `clip_sample=True`), `v_prediction` finite, DDIM's
    `leading` grid (from 801) and `EulerDiscreteScheduler` (last `alphas_cumprod` `2**-24`) finite.
    But with `pipe(..., eta=1.0)` at 6 `trailing` zero-SNR steps every reading ends non-finite,
    `sample` and clipped `epsilon` too: DDIM's step from t = 999 takes the square root of
    `1 - abar_prev - std_dev_t**2`, 0 in exact arithmetic, below 0 after rounding (round 11 cut
    the page's "finite except ... `epsilon` read unclipped").
    """
    original, finals = sd_pipe.scheduler, {}
    zero_snr = dict(rescale_betas_zero_snr=True, timestep_spacing="trailing")
    ddpm = dict(SD_BETAS, steps_offset=1, clip_sample=False)
    try:
        for name, cls, config in [
            ("epsilon", DDIMScheduler, SD_SCHEDULER),
            ("v_prediction", DDIMScheduler, {**SD_SCHEDULER, "prediction_type": "v_prediction"}),
            ("DDPM epsilon", DDPMScheduler, ddpm),
            ("DDPM v_prediction", DDPMScheduler, {**ddpm, "prediction_type": "v_prediction"}),
            ("Euler epsilon", EulerDiscreteScheduler, SD_SCHEDULER_EULER),
            ("Euler v_prediction", EulerDiscreteScheduler,
             {**SD_SCHEDULER_EULER, "prediction_type": "v_prediction"}),
            ("zero-SNR epsilon", DDIMScheduler, {**SD_SCHEDULER, **zero_snr}),
            ("zero-SNR v_prediction", DDIMScheduler,
             {**SD_SCHEDULER, **zero_snr, "prediction_type": "v_prediction"}),
            ("zero-SNR epsilon, clipped", DDIMScheduler,
             {**SD_SCHEDULER, **zero_snr, "clip_sample": True}),
            ("zero-SNR DDPM epsilon", DDPMScheduler, {**ddpm, **zero_snr}),
            ("zero-SNR leading epsilon", DDIMScheduler,
             {**SD_SCHEDULER, "rescale_betas_zero_snr": True}),
            ("zero-SNR Euler epsilon", EulerDiscreteScheduler, {**SD_SCHEDULER_EULER, **zero_snr}),
        ]:  # fmt: skip
            sd_pipe.scheduler = cls(**config)
            finals[name] = run_sd(
                sd_pipe, 5, latents=start_latents(), generator=torch.Generator().manual_seed(0)
            )  # no error
    finally:
        sd_pipe.scheduler = original
    finite = {name: bool(torch.isfinite(x).all()) for name, x in finals.items()}
    assert finite == {
        "epsilon": True,
        "v_prediction": True,
        "DDPM epsilon": True,
        "DDPM v_prediction": True,
        "Euler epsilon": True,
        "Euler v_prediction": True,
        "zero-SNR epsilon": False,
        "zero-SNR v_prediction": True,
        "zero-SNR epsilon, clipped": True,
        "zero-SNR DDPM epsilon": False,
        "zero-SNR leading epsilon": True,
        "zero-SNR Euler epsilon": True,
    }
    for prefix in ("", "DDPM ", "Euler "):
        assert not torch.allclose(finals[f"{prefix}epsilon"], finals[f"{prefix}v_prediction"])
    assert not torch.equal(finals["zero-SNR epsilon"], finals["zero-SNR v_prediction"])
    eta1 = {}
    try:
        for name, config in [
            ("sample", {**SD_SCHEDULER, **zero_snr, "prediction_type": "sample"}),
            ("epsilon, clipped", {**SD_SCHEDULER, **zero_snr, "clip_sample": True}),
        ]:
            sd_pipe.scheduler = DDIMScheduler(**config)
            latents = run_sd(
                sd_pipe,
                6,
                eta=1.0,
                latents=start_latents(),
                generator=torch.Generator().manual_seed(0),
            )  # no error
            eta1[name] = bool(torch.isfinite(latents).all())
    finally:
        sd_pipe.scheduler = original
    assert eta1 == {"sample": False, "epsilon, clipped": False}
    sentence = next(line for line in SCHEDULER_PAGE.splitlines() if "swapped raise nothing" in line)
    assert "finite" not in sentence, sentence  # no finiteness rule: eta = 1 breaks any such list


# --- clip_sample -------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [DDPMScheduler, DDIMScheduler], ids=lambda c: c.__name__)
def test_clip_sample_clamps_x0_by_default(cls):
    r"""`DDPMScheduler` and `DDIMScheduler` default to `clip_sample=True`, which clamps $\hat{x}_0$ to `[-clip_sample_range, clip_sample_range]` (default `[-1, 1]`) inside `step`; `clip_sample=False` leaves it as converted."""
    x_t, out = 3 * randn(0), randn(1)
    x0 = {}
    for clip in [True, False]:
        kwargs = {} if clip else {"clip_sample": False}
        scheduler = cls(**kwargs, **SD_BETAS)
        assert scheduler.config.clip_sample is clip
        scheduler.set_timesteps(10)
        x0[clip] = scheduler.step(out, 100, x_t).pred_original_sample
    assert x0[False].abs().max() > 1.5
    close(x0[True], x0[False].clamp(-1.0, 1.0))


def test_sd_pipeline_turns_clip_sample_off():
    r"""`StableDiffusionPipeline` sets `clip_sample=False` in the config of a scheduler given with `clip_sample=True` (with a deprecation warning), so its `step` does not clamp $\hat{x}_0$ of SD's `latents` to `[-1, 1]`."""
    scheduler = DDIMScheduler(steps_offset=1, **SD_BETAS)
    assert scheduler.config.clip_sample is True
    with pytest.warns(FutureWarning, match="clip_sample"):
        pipe = tiny_sd_pipeline(scheduler=scheduler)
    assert pipe.scheduler.config.clip_sample is False
    pipe.scheduler.set_timesteps(10)
    x_t, out = 3 * randn(0).float(), randn(1).float()
    x0 = pipe.scheduler.step(out, 101, x_t).pred_original_sample
    assert x0.abs().max() > 1.5


# --- DDIM ------------------------------------------------------------------------------------


def ddim_reference(scheduler, model_output, sample, t, prev_t, eta=0.0, noise=None):
    """The DDIM update (epsilon target) with explicit alphas_cumprod at t and prev_t."""
    acp = scheduler.alphas_cumprod
    abar_t = acp[t]
    abar_prev = acp[prev_t] if prev_t >= 0 else scheduler.final_alpha_cumprod
    x0 = (sample - (1 - abar_t) ** 0.5 * model_output) / abar_t**0.5
    sigma = eta * ((1 - abar_prev) / (1 - abar_t)) ** 0.5 * (1 - abar_t / abar_prev) ** 0.5
    prev = abar_prev**0.5 * x0 + (1 - abar_prev - sigma**2) ** 0.5 * model_output
    return prev if noise is None else prev + sigma * noise


def test_ddim_step_formula_with_eta(sd_pipe):
    """`DDIMScheduler.step` returns `sqrt(abar_prev) * x0_hat + sqrt(1 - abar_prev - sigma_t**2) * eps_hat + sigma_t * z` with `sigma_t = eta * sqrt((1 - abar_prev) / (1 - abar_t)) * sqrt(1 - abar_t / abar_prev)`; `eta` is an argument of `step`, default 0.0, which is deterministic. At `eta=1` and `abar_t = 0` (zero terminal SNR) the argument of `sqrt(1 - abar_prev - sigma_t**2)` is 0 up to rounding, and at some step counts it rounds below 0 (which ones varies from one machine to another: 50 `trailing` steps on one, 10 on another): `prev_sample` is then NaN, and `StableDiffusionPipeline.__call__(..., eta=1.0)` on that schedule (`v_prediction`) ends with non-finite `latents`.

    The page no longer says `eta=1` "gives DDPM's posterior variance": through
    `StableDiffusionPipeline.__call__(..., eta=1.0)` on Lin et al.'s setting
    (`rescale_betas_zero_snr=True`, `v_prediction`, `trailing`), at a step count where the
    first step's argument (from t = 999, as `step` computes it from `_get_variance`) rounds
    below 0, DDIM returns non-finite `latents`, while `DDPMScheduler`, stepping between the
    same two levels, stays finite; at a step count where it rounds to 0 or above, DDIM stays
    finite (a stand-in UNet forward keeps the runs cheap). The counts are searched for, among
    those that divide 1000, on the machine that runs the test.
    """
    sample, model_output, z = tensors(11, 3)
    scheduler = DDIMScheduler(clip_sample=False, **SD_BETAS)
    scheduler.set_timesteps(10)
    t = int(scheduler.timesteps[2])
    for eta in (0.0, 0.5, 1.0):
        out = scheduler.step(model_output, t, sample, eta=eta, variance_noise=z).prev_sample
        expected = ddim_reference(scheduler, model_output, sample, t, t - 100, eta, z)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    a, b = (
        scheduler.step(model_output, t, sample, generator=torch.Generator().manual_seed(seed))
        for seed in (0, 1)
    )
    assert torch.equal(a.prev_sample, b.prev_sample)
    zero = scheduler.step(model_output, t, sample, eta=0.0, variance_noise=z).prev_sample
    assert torch.equal(a.prev_sample, zero)  # the default eta is 0.0

    zero_snr = dict(
        SD_BETAS,
        rescale_betas_zero_snr=True,
        prediction_type="v_prediction",
        timestep_spacing="trailing",
        clip_sample=False,
    )
    seen = []

    def stand_in_unet(sample, t, *args, **kwargs):
        seen.append(int(t))
        return (torch.full_like(sample, 0.1),)

    def first_argument(steps: int) -> float:
        """1 - abar_prev - sigma_t**2 at the first step, as DDIMScheduler.step computes it."""
        ddim = DDIMScheduler(**zero_snr)
        ddim.set_timesteps(steps)
        t = int(ddim.timesteps[0])
        prev = t - ddim.config.num_train_timesteps // steps
        std_dev_t = 1.0 * ddim._get_variance(t, prev) ** 0.5  # eta = 1
        return float(1 - ddim.alphas_cumprod[prev] - std_dev_t**2)

    # step counts that divide 1000: the trailing grid's next entry is DDIM's target too
    arguments = {steps: first_argument(steps) for steps in range(2, 201) if 1000 % steps == 0}
    assert max(abs(a) for a in arguments.values()) < 1e-6  # 0 up to rounding
    below = next(steps for steps, a in arguments.items() if a < 0)
    not_below = next(steps for steps, a in arguments.items() if a >= 0)
    original = sd_pipe.scheduler
    sd_pipe.unet.forward = stand_in_unet
    finite = {}
    try:
        for name, cls, eta, steps in (
            ("ddim below 0", DDIMScheduler, 1.0, below),
            ("ddpm", DDPMScheduler, 0.0, below),
            ("ddim at 0 or above", DDIMScheduler, 1.0, not_below),
        ):
            sd_pipe.scheduler = cls(**zero_snr)
            assert sd_pipe.scheduler.alphas_cumprod[999].item() == 0.0
            seen.clear()
            latents = run_sd(sd_pipe, steps, eta=eta, generator=torch.Generator().manual_seed(0))
            assert seen[0] == 999 and len(seen) == steps, name
            finite[name] = torch.isfinite(latents).all().item()
    finally:
        del sd_pipe.unet.forward
        sd_pipe.scheduler = original
    assert finite == {"ddim below 0": False, "ddpm": True, "ddim at 0 or above": True}
    ddpm = DDPMScheduler(**zero_snr)
    ddpm.set_timesteps(below)
    assert int(ddpm.previous_timestep(999)) == 999 - 1000 // below  # DDIM's target too
    ddim = DDIMScheduler(**zero_snr)
    ddim.set_timesteps(below)
    out = ddim.step(model_output, 999, sample, eta=1.0, variance_noise=z).prev_sample
    assert torch.isnan(out).all()  # sqrt of a negative rounding error, times every element
    ddim.set_timesteps(not_below)
    assert torch.isfinite(ddim.step(model_output, 999, sample, eta=1.0, variance_noise=z)[0]).all()
    assert (
        "posterior variance"
        not in SCHEDULER_PAGE.split("## Four schedulers", 1)[1]
        .split('=== "Euler', 1)[0]
        .split('=== "DDIM"', 1)[1]
    )


def test_ddim_prev_timestep_is_a_fixed_stride():
    """`DDIMScheduler.step` targets `prev_timestep = timestep - num_train_timesteps // num_inference_steps`, not the next grid entry: under `linspace` at 10 steps the step from 999 uses `alphas_cumprod[899]` though the next call is at 888, while `DDPMScheduler.step` looks the next timestep up on the grid and uses 888."""
    sample, model_output = tensors(12)
    ddim = DDIMScheduler(timestep_spacing="linspace", clip_sample=False, **SD_BETAS)
    ddim.set_timesteps(10)
    assert ddim.timesteps[:2].tolist() == [999, 888]
    out = ddim.step(model_output, 999, sample).prev_sample
    torch.testing.assert_close(out, ddim_reference(ddim, model_output, sample, 999, 899))
    assert not torch.allclose(out, ddim_reference(ddim, model_output, sample, 999, 888))

    ddpm = DDPMScheduler(timestep_spacing="linspace", clip_sample=False, **SD_BETAS)
    ddpm.set_timesteps(10)
    assert int(ddpm.previous_timestep(999)) == 888
    # the tabs' t' is not "the grid's next timestep" for DDIM
    t_prime = next(line for line in SCHEDULER_PAGE.splitlines() if line.startswith("$t'$ is"))
    assert "grid's next" not in t_prime and "DDIM" in t_prime and "stride" in t_prime, t_prime


def test_ddim_trailing_matches_only_when_n_divides_t():
    """`trailing` matches DDIM's stride only when the step count divides 1000: at 7 steps the grid starts 999, 856, but `step` at 999 uses `alphas_cumprod[857]`; `leading` always matches, since its stride is also `1000 // n` (at 7 steps: 852, 710, …, 0)."""
    sample, model_output = tensors(13)
    trailing = DDIMScheduler(timestep_spacing="trailing", clip_sample=False, **SD_BETAS)
    trailing.set_timesteps(7)
    assert trailing.timesteps[:2].tolist() == [999, 856]
    out = trailing.step(model_output, 999, sample).prev_sample
    torch.testing.assert_close(out, ddim_reference(trailing, model_output, sample, 999, 857))
    assert not torch.allclose(out, ddim_reference(trailing, model_output, sample, 999, 856))

    trailing.set_timesteps(10)
    assert all(np.diff(trailing.timesteps.numpy()) == -100)
    for n in (7, 10, 30, 50):
        leading = DDIMScheduler(timestep_spacing="leading", steps_offset=1)
        leading.set_timesteps(n)
        assert all(np.diff(leading.timesteps.numpy()) == -(1000 // n)), n
    leading = DDIMScheduler(timestep_spacing="leading")
    leading.set_timesteps(7)
    assert leading.timesteps.tolist() == list(range(852, -1, -142))


def test_ddim_eta0_agrees_with_euler():
    """`DDIMScheduler` (`eta=0`, `clip_sample=False`, `set_alpha_to_one=True`) and `EulerDiscreteScheduler`, fed the same stand-in model on the same `trailing` grid from corresponding starting states `x_T` and `x_T / sqrt(abar_T)`, end at the same sample to float32 rounding."""

    def model(x_vp, t):  # any smooth function of the variance-preserving input and t
        return torch.tanh(x_vp) * (float(t) / 1000) + 0.1 * x_vp

    x_T, _ = tensors(15)
    ddim = DDIMScheduler(timestep_spacing="trailing", clip_sample=False, **SD_BETAS)
    euler = EulerDiscreteScheduler(timestep_spacing="trailing", **SD_BETAS)
    ddim.set_timesteps(10)
    euler.set_timesteps(10)
    assert ddim.timesteps.tolist() == euler.timesteps.tolist()
    x_ddim = x_T
    x_euler = x_T / ddim.alphas_cumprod[999] ** 0.5
    for t_ddim, t_euler in zip(ddim.timesteps, euler.timesteps, strict=True):
        x_ddim = ddim.step(model(x_ddim, t_ddim), t_ddim, x_ddim).prev_sample
        scaled = euler.scale_model_input(x_euler, t_euler)
        x_euler = euler.step(model(scaled, t_euler), t_euler, x_euler).prev_sample
    torch.testing.assert_close(x_euler, x_ddim, atol=2e-5, rtol=2e-5)
    assert x_ddim.abs().max() > 0.1


# --- DDPM ------------------------------------------------------------------------------------


def test_ddpm_step_formula():
    """`DDPMScheduler.step` with a stride samples the posterior with `current_alpha_t = abar_t / abar_prev`: mean `sqrt(abar_prev) * (1 - current_alpha_t) / (1 - abar_t) * x0_hat + sqrt(current_alpha_t) * (1 - abar_prev) / (1 - abar_t) * x_t` and variance `(1 - abar_prev) / (1 - abar_t) * (1 - current_alpha_t)` (`variance_type="fixed_small"`, the default), with no noise at `t == 0`."""
    assert DDPMScheduler().config.variance_type == "fixed_small"
    sample, model_output = tensors(16)
    scheduler = DDPMScheduler(clip_sample=False, **SD_BETAS)
    scheduler.set_timesteps(10)
    t, prev = 500, 400
    assert scheduler.timesteps.tolist()[4:6] == [t, prev]
    acp = scheduler.alphas_cumprod
    abar_t, abar_prev = acp[t], acp[prev]
    alpha = abar_t / abar_prev
    x0 = (sample - (1 - abar_t) ** 0.5 * model_output) / abar_t**0.5
    mean = (abar_prev**0.5 * (1 - alpha) / (1 - abar_t)) * x0 + (
        alpha**0.5 * (1 - abar_prev) / (1 - abar_t)
    ) * sample
    var = (1 - abar_prev) / (1 - abar_t) * (1 - alpha)
    z = torch.randn(LATENT_SHAPE, generator=torch.Generator().manual_seed(0))
    out = scheduler.step(model_output, t, sample, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(out.prev_sample, mean + var**0.5 * z, atol=1e-5, rtol=1e-5)
    last = [
        scheduler.step(model_output, 0, sample, generator=torch.Generator().manual_seed(s))
        for s in (0, 1)
    ]
    assert int(scheduler.timesteps[-1]) == 0
    assert torch.equal(last[0].prev_sample, last[1].prev_sample)


def test_ddpm_adds_fresh_noise_at_every_step_but_the_last():
    """`DDPMScheduler` samples the posterior with fresh noise at every step but the last: on SD 1.x's `leading` grid (`steps_offset=1`, last $t = 1$), on `trailing` (last $t = 99$) and on `linspace` (last $t = 0$) at 10 steps, two generators give different `prev_sample` at every step before the last and the same one (within 1e-8) at the last, whatever its $t$: the previous level there is alpha-bar 1, so the default `fixed_small` variance is 0 (clamped to 1e-20)."""
    sample, model_output = tensors(18)
    for spacing, offset, last_t in (("leading", 1, 1), ("trailing", 0, 99), ("linspace", 0, 0)):
        scheduler = DDPMScheduler(
            clip_sample=False, timestep_spacing=spacing, steps_offset=offset, **SD_BETAS
        )
        scheduler.set_timesteps(10)
        assert int(scheduler.timesteps[-1]) == last_t
        for i, t in enumerate(scheduler.timesteps):
            a, b = (
                scheduler.step(
                    model_output, t, sample, generator=torch.Generator().manual_seed(s)
                ).prev_sample
                for s in (0, 1)
            )
            diff = float((a - b).abs().max())
            if i < len(scheduler.timesteps) - 1:
                assert diff > 1e-3, (spacing, int(t), diff)
            else:
                assert diff < 1e-8, (spacing, int(t), diff)
    # the interview line does not tie DDPM's noise to t > 0 (SD's last step, t = 1, adds none)
    line = next(x for x in SCHEDULER_PAGE.splitlines() if x.startswith('"The scheduler is'))
    assert "DDPM adding fresh noise" in line and "above t = 0" not in line, line


# --- Euler -----------------------------------------------------------------------------------


def test_euler_step_formula():
    """For an `epsilon` model (and the default `s_churn=0`) `EulerDiscreteScheduler.step` returns `x + (sigma_next - sigma) * d` with `x0_hat = x - sigma * eps_hat` and the slope `d = (x - x0_hat) / sigma`, which is `eps_hat`: `x + (sigma_next - sigma) * eps_hat`."""
    sample, model_output = tensors(17)
    scheduler = EulerDiscreteScheduler(**SD_BETAS)
    scheduler.set_timesteps(10)
    sigma, sigma_next = scheduler.sigmas[3], scheduler.sigmas[4]
    out = scheduler.step(model_output, scheduler.timesteps[3], sample)  # step_index from t
    x0 = sample - sigma * model_output
    torch.testing.assert_close(out.pred_original_sample, x0)
    torch.testing.assert_close(
        out.prev_sample, sample + (sigma_next - sigma) * (sample - x0) / sigma
    )
    torch.testing.assert_close(out.prev_sample, sample + (sigma_next - sigma) * model_output)
    assert (out.prev_sample - sample).abs().max() > 0.1  # a real move, not a no-op


def test_euler_step_warns_without_scale_model_input():
    """If `scale_model_input` was never called on the instance, `EulerDiscreteScheduler.step` logs a warning that it should be called before `step`, and still returns a result."""
    with logged_messages("diffusers.schedulers.scheduling_euler_discrete") as messages:
        sample, model_output = tensors(18)
        scheduler = EulerDiscreteScheduler(**SD_BETAS)
        scheduler.set_timesteps(10)
        scheduler.step(model_output, scheduler.timesteps[0], sample)
        assert any("`scale_model_input` function should be called before `step`" in m for m in messages)  # fmt: skip
        messages.clear()
        scheduler = EulerDiscreteScheduler(**SD_BETAS)
        scheduler.set_timesteps(10)
        t = scheduler.timesteps[0]
        scheduler.step(model_output, t, scheduler.scale_model_input(sample, t))
        assert messages == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_euler_step_upcasts_and_casts_back(dtype):
    """`EulerDiscreteScheduler.step` upcasts `sample` to float32 for the update and casts `prev_sample` back to `model_output`'s dtype: float16 in gives float16 out, and float64 in gives float64 out, computed from `sample` rounded to float32."""
    sample, model_output = tensors(19, dtype=dtype)

    def step(x):
        scheduler = EulerDiscreteScheduler(**SD_BETAS)
        scheduler.set_timesteps(10)
        return scheduler.step(model_output, scheduler.timesteps[2], x).prev_sample

    out = step(sample)
    assert out.dtype == dtype
    rounded = sample.float().to(dtype)
    if dtype == torch.float64:
        assert not torch.equal(rounded, sample)
        assert torch.equal(out, step(rounded))
    else:
        reference = step(sample.float())  # float16 in both: the model_output is still float16
        torch.testing.assert_close(out, reference.to(dtype))
        scheduler = EulerDiscreteScheduler(**SD_BETAS)
        scheduler.set_timesteps(10)
        exact = scheduler.step(model_output.float(), scheduler.timesteps[2], sample.float())
        torch.testing.assert_close(out.float(), exact.prev_sample, atol=2e-2, rtol=2e-3)


def test_karras_sigma_formula():
    """`use_karras_sigmas=True` replaces the `n` sigmas with `(sigma_max**(1/7) + i / (n - 1) * (sigma_min**(1/7) - sigma_max**(1/7)))**7` between the default grid's ends, followed by a final 0."""
    plain = EulerDiscreteScheduler(**SD_BETAS)
    plain.set_timesteps(10)
    karras = EulerDiscreteScheduler(use_karras_sigmas=True, **SD_BETAS)
    karras.set_timesteps(10)
    s_max, s_min = plain.sigmas[0].double(), plain.sigmas[-2].double()
    i = torch.arange(10, dtype=torch.float64)
    rho = 7.0
    expected = (s_max ** (1 / rho) + i / 9 * (s_min ** (1 / rho) - s_max ** (1 / rho))) ** rho
    torch.testing.assert_close(karras.sigmas[:-1].double(), expected, atol=1e-4, rtol=1e-5)
    assert karras.sigmas[-1].item() == 0


def test_s_churn_is_a_step_argument():
    """`s_churn` is an argument of `EulerDiscreteScheduler.step` (default 0.0): above 0 it adds fresh noise from `generator` to the state before the update, so the result changes with the seed."""
    sample, model_output = tensors(20)

    def step(s_churn, seed):
        scheduler = EulerDiscreteScheduler(**SD_BETAS)
        scheduler.set_timesteps(10)
        t = scheduler.timesteps[2]
        g = torch.Generator().manual_seed(seed)
        churn = {} if s_churn is None else {"s_churn": s_churn}  # None: the default
        return scheduler.step(model_output, t, sample, generator=g, **churn).prev_sample

    assert torch.equal(step(None, 0), step(0.0, 1))
    assert not torch.allclose(step(1.0, 0), step(1.0, 1))
    assert not torch.allclose(step(1.0, 0), step(0.0, 0))


def test_s_churn_raises_sigma_before_the_euler_step():
    """`EulerDiscreteScheduler.step` computes `gamma = min(s_churn / (len(sigmas) - 1), 2**0.5 - 1)` when `s_tmin <= sigma <= s_tmax` (a range of sigmas, not of timesteps), else 0; it adds fresh noise of standard deviation `(sigma_hat**2 - sigma**2) ** 0.5` times `s_noise`, with `sigma_hat = (1 + gamma) * sigma`, and then steps from `sigma_hat` to the next sigma."""
    sample, model_output = tensors(21)

    def step(**churn):
        scheduler = EulerDiscreteScheduler(**SD_BETAS)
        scheduler.set_timesteps(10)
        scheduler.scale_model_input(sample, scheduler.timesteps[2])
        scheduler._step_index = 2
        g = torch.Generator().manual_seed(7)
        out = scheduler.step(model_output, scheduler.timesteps[2], sample, generator=g, **churn)
        return scheduler, out.prev_sample

    scheduler, plain = step()
    sigma, sigma_next = scheduler.sigmas[2].item(), scheduler.sigmas[3].item()
    n = len(scheduler.sigmas) - 1
    noise = torch.randn(model_output.shape, generator=torch.Generator().manual_seed(7))

    def expected(gamma, s_noise=1.0):
        sigma_hat = sigma * (1 + gamma)
        x = sample + noise * s_noise * (sigma_hat**2 - sigma**2) ** 0.5
        return x + (sigma_next - sigma_hat) * model_output  # epsilon: the slope is eps_hat

    torch.testing.assert_close(plain, expected(0.0))
    torch.testing.assert_close(step(s_churn=2.0)[1], expected(2.0 / n))  # below the cap
    torch.testing.assert_close(step(s_churn=2.0, s_noise=0.5)[1], expected(2.0 / n, 0.5))
    torch.testing.assert_close(step(s_churn=50.0)[1], expected(2**0.5 - 1))  # capped
    # s_tmin and s_tmax bound sigma: a window around this sigma churns, one in timesteps does not
    t = scheduler.timesteps[2].item()
    assert sigma < t
    torch.testing.assert_close(step(s_churn=2.0, s_tmin=sigma - 0.01, s_tmax=sigma + 0.01)[1], expected(2.0 / n))  # fmt: skip
    torch.testing.assert_close(step(s_churn=2.0, s_tmin=t - 1, s_tmax=t + 1)[1], plain)


def test_s_churn_reuses_the_prediction_made_before_the_noise(record_calls):
    """`EulerDiscreteScheduler.step` steps from `sigma_hat` to the next sigma with the prediction the model made at `sigma`: EDM's Algorithm 2 adds the same noise but then calls the denoiser on the churned sample; here the model never sees it.

    The contract loop (``scale_model_input`` -> model -> ``step``) with the exact noise
    predictor of N(0, I) data, ``eps_hat = sqrt(1 - alphas_cumprod) * x_t``: the model is called
    once, on the sample before the noise, and ``prev_sample`` is that prediction moved from
    ``sigma_hat``; Algorithm 2's Euler step, which predicts again at the churned sample, differs.
    """
    assert "here the model never sees it" in SCHEDULER_PAGE
    assert "EDM's Algorithm 2)" not in SCHEDULER_PAGE  # the churn is not Algorithm 2's
    scheduler = EulerDiscreteScheduler(**SD_BETAS)
    scheduler.set_timesteps(10)
    n = len(scheduler.sigmas) - 1
    sigmas = {
        float(t): float(s) for t, s in zip(scheduler.timesteps, scheduler.sigmas[:-1], strict=True)
    }

    class ExactEps(torch.nn.Module):  # the network's view: the variance-preserving x_t and t
        def forward(self, x_t, t):
            sigma = sigmas[float(t)]
            return (sigma**2 / (1 + sigma**2)) ** 0.5 * x_t  # sqrt(1 - alphas_cumprod[t]) * x_t

    model = ExactEps()
    recorder = record_calls(model)
    (x,) = tensors(23, n=1)
    t = scheduler.timesteps[2]
    latent_model_input = scheduler.scale_model_input(x, t)
    noise_pred = model(latent_model_input, t)
    out = scheduler.step(noise_pred, t, x, s_churn=4.0, generator=torch.Generator().manual_seed(3))
    assert len(recorder.calls) == 1
    torch.testing.assert_close(recorder.calls[0][0][0], x / (sigmas[float(t)] ** 2 + 1) ** 0.5)

    sigma, sigma_next = scheduler.sigmas[2].item(), scheduler.sigmas[3].item()
    gamma = min(4.0 / n, 2**0.5 - 1)
    sigma_hat = (1 + gamma) * sigma
    z = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    x_hat = x + (sigma_hat**2 - sigma**2) ** 0.5 * z
    reused = x_hat + (sigma_next - sigma_hat) * noise_pred
    eps_at_hat = sigma_hat / (1 + sigma_hat**2) * x_hat  # the exact predictor at (x_hat, sigma_hat)
    algorithm_2 = x_hat + (sigma_next - sigma_hat) * eps_at_hat
    torch.testing.assert_close(out.prev_sample, reused)
    assert (out.prev_sample - algorithm_2).abs().max() > 0.05


def test_flow_match_euler_accepts_and_ignores_s_churn():
    """`FlowMatchEulerDiscreteScheduler.step` accepts `s_churn` and ignores it."""
    sample, model_output = tensors(24)

    def step(stochastic_sampling, **churn):
        scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, stochastic_sampling=stochastic_sampling)  # fmt: skip
        scheduler.set_timesteps(10)
        t = scheduler.timesteps[2]
        scheduler.step(model_output, scheduler.timesteps[0], sample)  # advance the step_index
        scheduler.step(model_output, scheduler.timesteps[1], sample)
        g = torch.Generator().manual_seed(0)
        return scheduler.step(model_output, t, sample, generator=g, **churn).prev_sample

    for stochastic in (False, True):  # both branches of step
        assert torch.equal(step(stochastic, s_churn=50.0, s_noise=2.0), step(stochastic))
    assert not torch.equal(step(True), step(False))  # the stochastic branch is taken


def test_the_sd_pipeline_never_passes_s_churn(sd_pipe):
    """`s_churn` adds noise before the step, but only in a loop that passes it to `step`: `StableDiffusionPipeline.__call__` never does, and `pipe(..., s_churn=...)` lands in `**kwargs` and is ignored without an error."""
    assert "`pipe(..., s_churn=...)` lands in `**kwargs`" in SCHEDULER_PAGE
    assert "sends `eta` and `generator`" not in SCHEDULER_PAGE  # Euler's step gets no eta (below)
    churners = {  # every exported scheduler whose step takes s_churn and that SD's loop can run
        name: cls
        for name in dir(diffusers)
        if name.endswith("Scheduler")
        and isinstance(cls := getattr(diffusers, name), type)
        and issubclass(cls, SchedulerMixin)
        and "s_churn" in inspect.signature(getattr(cls, "step", lambda: None)).parameters
        and "init_noise_sigma" in dir(cls)  # the flow-matching ones fail in prepare_latents
    }
    assert {"EulerDiscreteScheduler", "EDMEulerScheduler"} <= set(churners), churners
    original = sd_pipe.scheduler
    for name, cls in churners.items():
        accepted = inspect.signature(cls.__init__).parameters
        sd_pipe.scheduler = cls(**{k: v for k, v in SD_SCHEDULER_EULER.items() if k in accepted})
        step, seen = sd_pipe.scheduler.step, []

        @functools.wraps(step)  # keeps step's signature, which prepare_extra_step_kwargs inspects
        def spy(*args, step=step, seen=seen, **kwargs):
            seen.append(set(kwargs))
            return step(*args, **kwargs)

        sd_pipe.scheduler.step = spy
        try:
            plain = run_sd(sd_pipe, 3, generator=torch.Generator().manual_seed(0))
            churned = run_sd(sd_pipe, 3, generator=torch.Generator().manual_seed(0), s_churn=50.0)
        finally:
            sd_pipe.scheduler = original
        assert len(seen) == 6 and all("s_churn" not in kw for kw in seen), (name, seen)
        assert torch.equal(plain, churned), name


# --- flow matching ---------------------------------------------------------------------------


def test_flow_step_is_sample_plus_dt_velocity():
    """`FlowMatchEulerDiscreteScheduler.step` (default `stochastic_sampling=False`) returns `sample + (sigma_next - sigma) * model_output`, using the shifted `sigmas`."""
    assert FlowMatchEulerDiscreteScheduler().config.stochastic_sampling is False
    sample, velocity = tensors(21)
    for shift in (1.0, 3.0, 0.5):
        scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
        scheduler.set_timesteps(10)
        sigmas = scheduler.sigmas
        x = sample
        for index, t in enumerate(scheduler.timesteps[:3]):
            new = scheduler.step(velocity, t, x).prev_sample
            torch.testing.assert_close(new, x + (sigmas[index + 1] - sigmas[index]) * velocity)
            x = new


@pytest.mark.parametrize("shift", [0.5, 1.0, 3.0, 6.0])
def test_flow_shift_formula(shift):
    """`shift` (default 1.0) maps each sigma `s` to `shift * s / (1 + (shift - 1) * s)`: `set_timesteps(n)` spaces `n` values linearly from 1 to `sigma_min` and maps them, and since `__init__` has already mapped `sigma_min` from `1 / 1000`, the last level is mapped twice."""
    default, unshifted = (
        FlowMatchEulerDiscreteScheduler(),
        FlowMatchEulerDiscreteScheduler(shift=1.0),
    )
    for scheduler in (default, unshifted):
        scheduler.set_timesteps(10)
    torch.testing.assert_close(default.sigmas, unshifted.sigmas)  # the default shift is 1.0

    def shifted(s):
        return shift * s / (1 + (shift - 1) * s)

    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    assert scheduler.sigma_min == pytest.approx(shifted(1 / 1000))
    scheduler.set_timesteps(10)
    s = torch.linspace(1.0, scheduler.sigma_min, 10, dtype=torch.float64)
    torch.testing.assert_close(scheduler.sigmas[:-1].double(), shifted(s), atol=1e-6, rtol=1e-6)
    assert scheduler.sigmas[-2].item() == pytest.approx(shifted(shifted(1 / 1000)), rel=1e-5)


@pytest.mark.parametrize("shift", [0.5, 3.0, 6.0])
def test_any_shift_is_read_consistently(shift):
    """After `set_timesteps` with any `shift`, `timesteps` equal the shifted `sigmas[:-1] * num_train_timesteps` and `step` moves between those same shifted `sigmas`: the network is told the shifted noise level."""
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(10)
    torch.testing.assert_close(scheduler.timesteps, scheduler.sigmas[:-1] * 1000)
    sample, velocity = tensors(22)
    x = sample
    for index, t in enumerate(scheduler.timesteps):
        sigma = t / 1000  # the level the network is told
        sigma_next = scheduler.sigmas[index + 1]
        new = scheduler.step(velocity, t, x).prev_sample
        torch.testing.assert_close(new, x + (sigma_next - sigma) * velocity)
        x = new


def test_dynamic_shifting_with_mu():
    """With `use_dynamic_shifting=True`, `set_timesteps` requires `mu` and, under the default `time_shift_type="exponential"`, maps each sigma with `exp(mu) / (exp(mu) + 1 / sigma - 1)`, which is the `shift` map with `shift = exp(mu)`."""
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    assert scheduler.config.time_shift_type == "exponential"
    with pytest.raises(ValueError, match="`mu` must be passed"):
        scheduler.set_timesteps(10)
    mu = 1.1
    scheduler.set_timesteps(10, mu=mu)
    s = torch.linspace(1.0, 1 / 1000, 10, dtype=torch.float64)
    expected = math.exp(mu) / (math.exp(mu) + 1 / s - 1)
    torch.testing.assert_close(scheduler.sigmas[:-1].double(), expected, atol=1e-6, rtol=1e-6)
    shift = math.exp(mu)
    torch.testing.assert_close(expected, shift * s / (1 + (shift - 1) * s))


@pytest.fixture(scope="module")
def sd3_pipe():
    return tiny_sd3_pipeline(FlowMatchEulerDiscreteScheduler(shift=3.0))


def run_sd3(pipe, **kwargs):
    g = torch.Generator().manual_seed(1)
    return pipe(
        prompt_embeds=torch.randn(1, 10, EMBED_DIM, generator=g),
        pooled_prompt_embeds=torch.randn(1, 16, generator=g),
        guidance_scale=1.0,
        num_inference_steps=4,
        height=HEIGHT,
        width=WIDTH,
        output_type="latent",
        **kwargs,
    ).images


def test_sd3_pipeline_starts_unscaled_and_tells_the_shifted_level(sd3_pipe, record_calls):
    """`StableDiffusion3Pipeline` starts from unscaled `randn_tensor` latents and passes each shifted `sigma * 1000` of `FlowMatchEulerDiscreteScheduler(shift=3.0)` to the transformer as its `timestep`."""
    recorder = record_calls(sd3_pipe.transformer)
    run_sd3(sd3_pipe, generator=torch.Generator().manual_seed(5))
    first = recorder.calls[0][1]["hidden_states"]
    noise = torch.randn(LATENT_SHAPE, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(first, noise)
    scheduler = sd3_pipe.scheduler
    told = [kwargs["timestep"].item() for _, kwargs in recorder.calls]
    assert told == pytest.approx((scheduler.sigmas[:-1] * 1000).tolist())
    unshifted = FlowMatchEulerDiscreteScheduler()
    unshifted.set_timesteps(4)
    assert told[1] > unshifted.timesteps[1].item() + 50  # shifted towards high noise


def test_sd3_pipeline_passes_mu_from_token_count(sd3_pipe):
    """With `use_dynamic_shifting=True`, `StableDiffusion3Pipeline` passes `set_timesteps` a `mu` computed by `calculate_shift` from the latent token count, `(latent height / patch_size) * (latent width / patch_size)`."""
    original = sd3_pipe.scheduler
    sd3_pipe.scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    try:
        run_sd3(sd3_pipe, latents=start_latents())
        sigmas = sd3_pipe.scheduler.sigmas
    finally:
        sd3_pipe.scheduler = original
    tokens = (LATENT_SHAPE[2] // 2) * (LATENT_SHAPE[3] // 2)
    mu = calculate_shift(tokens, 256, 4096, 0.5, 1.15)
    expected = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    expected.set_timesteps(4, mu=mu)
    torch.testing.assert_close(sigmas, expected.sigmas)
    other = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    other.set_timesteps(4, mu=calculate_shift(4 * tokens, 256, 4096, 0.5, 1.15))
    assert not torch.allclose(sigmas, other.sigmas)


# --- training vs inference -------------------------------------------------------------------


def test_from_config_carries_the_config_over():
    """`EulerDiscreteScheduler.from_config(config)` carries over the keys the config set explicitly and `EulerDiscreteScheduler` accepts (the betas, `prediction_type`, and `timestep_spacing` when it was set); keys left at the old class's default, listed in `_use_default_values`, take Euler's default, so a `leading` grid survives the swap only if `leading` was set explicitly."""
    source = DDIMScheduler(prediction_type="v_prediction", steps_offset=1, **SD_BETAS)
    euler = EulerDiscreteScheduler.from_config(source.config)
    for key in ("beta_schedule", "beta_start", "beta_end", "steps_offset"):
        assert euler.config[key] == source.config[key], key
    assert euler.config.prediction_type == "v_prediction"
    torch.testing.assert_close(euler.alphas_cumprod, source.alphas_cumprod)
    assert source.config.timestep_spacing == "leading"
    assert "timestep_spacing" in source.config._use_default_values
    assert euler.config.timestep_spacing == "linspace"
    explicit = DDIMScheduler(timestep_spacing="leading", steps_offset=1, **SD_BETAS)
    euler = EulerDiscreteScheduler.from_config(explicit.config)
    assert euler.config.timestep_spacing == "leading"
    euler.set_timesteps(10)
    assert euler.timesteps[0].item() == 901


def test_compatibles_is_one_shared_list():
    """`DDPMScheduler`, `DDIMScheduler`, `EulerDiscreteScheduler`, `PNDMScheduler`, `DPMSolverMultistepScheduler` and `UniPCMultistepScheduler` share one `compatibles` list, the names of the `KarrasDiffusionSchedulers` enum, which includes `EDMEulerScheduler`, a class with no betas; `FlowMatchEulerDiscreteScheduler` and `EDMEulerScheduler` list none."""
    from diffusers import UniPCMultistepScheduler

    karras = {e.name for e in KarrasDiffusionSchedulers}
    assert {"DDIMScheduler", "DPMSolverMultistepScheduler", "EDMEulerScheduler"} <= karras
    for cls in (
        DDPMScheduler,
        DDIMScheduler,
        EulerDiscreteScheduler,
        PNDMScheduler,
        DPMSolverMultistepScheduler,
        UniPCMultistepScheduler,
    ):
        listed = {c.__name__ for c in cls().compatibles} - {cls.__name__}
        assert listed == karras - {cls.__name__}, cls.__name__
        assert EDMEulerScheduler in cls().compatibles, cls.__name__
    assert "beta_schedule" not in inspect.signature(EDMEulerScheduler).parameters
    assert not hasattr(EDMEulerScheduler(), "alphas_cumprod")
    for cls in (FlowMatchEulerDiscreteScheduler, EDMEulerScheduler):
        assert cls().compatibles == [cls], cls.__name__


#: stable-diffusion-v1-5/stable-diffusion-v1-5, scheduler/scheduler_config.json, as shipped
SD15_SCHEDULER_CONFIG_JSON = {**SD15_SCHEDULER_FILE, "_diffusers_version": "0.6.0"}


def test_from_config_builds_edm_euler_from_sd15s_config(tmp_path):
    """`EDMEulerScheduler.from_config` builds from SD 1.5's config without an error, ignoring the betas it does not read: given SD 1.5's `scheduler_config.json` loaded by `PNDMScheduler.from_pretrained`, it builds, names no beta in any logged warning, and starts at its own `sigma_max` of 80 instead of SD's 14.61.

    Not "`from_config` checks no compatibility" (round 11): the same call logs that `clip_sample`
    "will be ignored. Please verify your scheduler_config.json", and `UnCLIPScheduler.from_config`
    raises `ValueError` on this config."""
    (tmp_path / "scheduler_config.json").write_text(json.dumps(SD15_SCHEDULER_CONFIG_JSON))
    config = PNDMScheduler.from_pretrained(tmp_path).config
    with logged_messages("diffusers.configuration_utils") as messages:
        edm = EDMEulerScheduler.from_config(config)
    assert not any("beta" in m for m in messages), messages
    assert any("clip_sample" in m and "will be ignored" in m for m in messages), messages
    with pytest.raises(ValueError, match="squaredcos_cap_v2"):
        diffusers.UnCLIPScheduler.from_config(config)
    page = (ROOT / "docs/handbook/scheduler.md").read_text(encoding="utf-8")
    assert "checks no compatibility" not in page
    assert not hasattr(edm, "alphas_cumprod")  # the betas reach no __init__ argument
    edm.set_timesteps(10)
    assert edm.sigmas[0].item() == pytest.approx(80.0)
    last = PNDMScheduler.from_config(config).alphas_cumprod[-1]  # SD's noisiest level
    assert float(((1 - last) / last) ** 0.5) == pytest.approx(14.61, abs=0.005)


def exact_flow_velocity(module, args, kwargs, output, mean=0.5, std=0.3):
    """Forward hook: replace the transformer's output with the exact velocity for data
    x0 ~ N(mean, std**2 I) at the level it is told (sigma = timestep / 1000)."""
    x = kwargs["hidden_states"].double()
    sigma = kwargs["timestep"].double().reshape(-1, 1, 1, 1) / 1000
    gain = (1 - sigma) * std**2 / ((1 - sigma) ** 2 * std**2 + sigma**2)
    x0_hat = mean + gain * (x - (1 - sigma) * mean)
    return ((x - x0_hat) / sigma).to(output[0].dtype), *output[1:]


def flow_errors(sd3_pipe, schedulers, steps=25):
    """Mean |final latents - exact|: for Gaussian data the flow ODE maps z to mean + std * z."""
    z = start_latents()
    handle = sd3_pipe.transformer.register_forward_hook(exact_flow_velocity, with_kwargs=True)
    original = sd3_pipe.scheduler
    errors = {}
    try:
        for name, scheduler in schedulers.items():
            sd3_pipe.scheduler = scheduler
            g = torch.Generator().manual_seed(1)
            final = sd3_pipe(
                prompt_embeds=torch.randn(1, 10, EMBED_DIM, generator=g),
                pooled_prompt_embeds=torch.randn(1, 16, generator=g),
                guidance_scale=1.0,
                num_inference_steps=steps,
                height=HEIGHT,
                width=WIDTH,
                output_type="latent",
                latents=z.clone(),
            ).images
            errors[name] = (final - (0.5 + 0.3 * z)).abs().mean().item()
    finally:
        handle.remove()
        sd3_pipe.scheduler = original
    return errors


def test_dpmsolver_with_flow_sigmas_runs_a_flow_model(sd3_pipe):
    """A flow-matching model does not need `FlowMatchEulerDiscreteScheduler`: `DPMSolverMultistepScheduler` (the type of `SanaPipeline`'s scheduler) and `UniPCMultistepScheduler` with `use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0` in `StableDiffusion3Pipeline` read the velocity and, on an exact flow denoiser at 25 steps, land closer to the exact samples than `FlowMatchEulerDiscreteScheduler(shift=3.0)`.

    The denoiser: the tiny transformer's output replaced by a forward hook with the exact
    velocity for Gaussian data, for which the ODE's end point is known in closed form.
    """
    from diffusers import SanaPipeline, UniPCMultistepScheduler

    sana = inspect.signature(SanaPipeline.__init__).parameters["scheduler"].annotation
    assert sana is DPMSolverMultistepScheduler
    assert "DPMSolverMultistepScheduler" not in FlowMatchEulerDiscreteScheduler._compatibles
    flow = dict(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0)
    errors = flow_errors(
        sd3_pipe,
        {
            "euler": FlowMatchEulerDiscreteScheduler(shift=3.0),
            "dpm": DPMSolverMultistepScheduler(**flow),
            "unipc": UniPCMultistepScheduler(**flow),
        },
    )
    assert max(errors["dpm"], errors["unipc"]) < errors["euler"] < 0.05, errors


def test_flux_needs_dynamic_shifting_for_a_flow_dpmsolver():
    """`DPMSolverMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0)` runs `StableDiffusion3Pipeline` but not `FluxPipeline`, which passes `mu` to `set_timesteps`: there it raises an `AssertionError`, also with `use_dynamic_shifting=True` and `time_shift_type="linear"`; with `use_dynamic_shifting=True` added (and the default `time_shift_type="exponential"`), `FluxPipeline` runs it to sigma 0."""
    from tiny import dit_embeds, tiny_flux_pipeline

    flow = dict(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0)
    prompt_embeds, pooled = dit_embeds(1)
    kwargs = dict(prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled, num_inference_steps=4,
                  height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
    flux = tiny_flux_pipeline()
    flux.scheduler = DPMSolverMultistepScheduler(**flow)
    with torch.no_grad(), pytest.raises(AssertionError):
        flux(**kwargs)
    flux.scheduler = DPMSolverMultistepScheduler(
        **flow, use_dynamic_shifting=True, time_shift_type="linear"
    )
    with torch.no_grad(), pytest.raises(AssertionError):
        flux(**kwargs)
    flux.scheduler = DPMSolverMultistepScheduler(**flow, use_dynamic_shifting=True)
    with torch.no_grad():
        latents = flux(**kwargs).images
    assert torch.isfinite(latents).all() and flux.scheduler.sigmas[-1].item() == 0
    sd3 = tiny_sd3_pipeline(DPMSolverMultistepScheduler(**flow))
    assert torch.isfinite(run_sd3(sd3)).all()
    assert sd3.scheduler.sigmas[-1].item() == 0


def test_flow_model_with_a_default_solver_config_fails_silently(sd3_pipe):
    """`DPMSolverMultistepScheduler.from_config(config)` of SD3's `FlowMatchEulerDiscreteScheduler` config keeps the default `use_flow_sigmas=False` and `prediction_type="epsilon"` (and drops `shift`): `StableDiffusion3Pipeline` runs without an error and ends far from the data; so does setting only one of `use_flow_sigmas=True` and `prediction_type="flow_prediction"`, in `DPMSolverMultistepScheduler` and in `UniPCMultistepScheduler`."""
    from diffusers import UniPCMultistepScheduler

    naive = DPMSolverMultistepScheduler.from_config(
        FlowMatchEulerDiscreteScheduler(shift=3.0).config
    )
    assert naive.config.use_flow_sigmas is False and naive.config.prediction_type == "epsilon"
    assert naive.config.flow_shift == 1.0
    errors = flow_errors(
        sd3_pipe,
        {
            "euler": FlowMatchEulerDiscreteScheduler(shift=3.0),
            "naive": naive,
            "target only": DPMSolverMultistepScheduler(prediction_type="flow_prediction"),
            "sigmas only": DPMSolverMultistepScheduler(use_flow_sigmas=True, flow_shift=3.0),
            "unipc target only": UniPCMultistepScheduler(prediction_type="flow_prediction"),
            "unipc sigmas only": UniPCMultistepScheduler(use_flow_sigmas=True, flow_shift=3.0),
        },
    )
    assert all(errors[k] > 10 * errors["euler"] for k in errors if k != "euler"), errors


def test_rescale_betas_zero_snr():
    """`rescale_betas_zero_snr=True` makes the last `alphas_cumprod` 0, zero SNR at `t = 999` (`DDPMScheduler` and `DDIMScheduler` exactly, `EulerDiscreteScheduler` `2**-24` to keep `sigmas` finite); without it SD's schedule ends above 0 (0.00466)."""
    for cls in (DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler):
        on = cls(rescale_betas_zero_snr=True, **SD_BETAS).alphas_cumprod[-1].item()
        off = cls(**SD_BETAS).alphas_cumprod[-1].item()
        assert on == (2**-24 if cls is EulerDiscreteScheduler else 0.0), cls.__name__
        assert off == pytest.approx(0.00466, abs=1e-5)


def test_zero_terminal_snr():
    r"""With `rescale_betas_zero_snr=True` `alphas_cumprod[999]` is exactly 0 (and `alphas_cumprod[0]` is unchanged), so at `t=999`, with `clip_sample=False` (SD's setting), an `epsilon` output gives a non-finite `pred_original_sample` (the default clip turns it into ±1), while a `v_prediction` output $v$ gives $\hat{x}_0 = -v$ and a `sample` output is $\hat{x}_0$ itself: at zero terminal SNR any target other than `epsilon` gives a finite $\hat{x}_0$, not `v_prediction` alone."""
    plain = DDIMScheduler(**SD_BETAS)
    x_t, out = randn(0), randn(1)
    x0 = {}
    for prediction_type in ["epsilon", "v_prediction", "sample"]:
        scheduler = DDIMScheduler(
            rescale_betas_zero_snr=True,
            prediction_type=prediction_type,
            timestep_spacing="trailing",
            clip_sample=False,
            **SD_BETAS,
        )
        assert scheduler.alphas_cumprod[-1] == 0
        close(scheduler.alphas_cumprod[0], plain.alphas_cumprod[0])
        scheduler.set_timesteps(10)
        assert scheduler.timesteps[0] == 999
        x0[prediction_type] = scheduler.step(out, 999, x_t).pred_original_sample
    assert not torch.isfinite(x0["epsilon"]).any()
    close(x0["v_prediction"], -out)
    close(x0["sample"], out, tol=0)
    for cls in (DDIMScheduler, DDPMScheduler):
        zero_snr = dict(rescale_betas_zero_snr=True, timestep_spacing="trailing", **SD_BETAS)
        unclipped, clipped = cls(clip_sample=False, **zero_snr), cls(**zero_snr)
        for scheduler in (unclipped, clipped):
            scheduler.set_timesteps(10)
        gen = torch.Generator().manual_seed(0)
        x0_hat = unclipped.step(out, 999, x_t, generator=gen).pred_original_sample
        assert not torch.isfinite(x0_hat).any(), cls.__name__
        # the default clip_sample=True clamps the infinities to ±1
        x0_hat = clipped.step(out, 999, x_t, generator=gen).pred_original_sample
        assert x0_hat.abs().eq(1).all(), cls.__name__


def beta_schedule_names() -> set[str]:
    """Every `beta_schedule` value a scheduler module of the installed diffusers tests for."""
    import diffusers.schedulers as schedulers_package

    names = set()
    for path in Path(schedulers_package.__file__).parent.glob("scheduling_*.py"):
        names |= set(re.findall(r'beta_schedule == "(\w+)"', path.read_text(encoding="utf-8")))
    return names


def test_no_beta_schedule_reaches_zero_terminal_snr():
    """No standard `beta_schedule` reaches `alphas_cumprod[999] == 0`: each name a scheduler of the installed diffusers accepts ends above 0 (built by the first class, in name order, that accepts it)."""
    import diffusers.schedulers as schedulers_package
    from diffusers.schedulers.scheduling_utils import SchedulerMixin

    names = beta_schedule_names()
    assert {"linear", "scaled_linear", "squaredcos_cap_v2", "sigmoid"} <= names
    checked = set()
    for cls_name in sorted(dir(schedulers_package)):
        cls = getattr(schedulers_package, cls_name)
        if not (inspect.isclass(cls) and issubclass(cls, SchedulerMixin)):
            continue
        if "beta_schedule" not in inspect.signature(cls.__init__).parameters:
            continue
        for name in names - checked:
            try:
                scheduler = cls(beta_schedule=name)
            except (NotImplementedError, ValueError, TypeError):
                continue  # this class does not accept that name
            if hasattr(scheduler, "alphas_cumprod"):
                assert float(scheduler.alphas_cumprod[-1]) > 0, (cls_name, name)
                checked.add(name)
    assert checked == names, names - checked
