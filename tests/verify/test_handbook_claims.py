"""Claims the handbook makes about diffusers, checked against the installed library.

The scheduler section quotes grids that diffusers computes (timesteps per
spacing, Euler and Karras sigmas, flow-matching sigmas). This module reads
those tables *from the page* and recomputes them with diffusers, so a diffusers
upgrade that changes a grid fails here instead of leaving the page wrong.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    HeunDiscreteScheduler,
)

from infralens_docs.registry import ROOT

SCHEDULER_PAGE = (ROOT / "docs" / "handbook" / "scheduler.md").read_text(encoding="utf-8")
SD_BETAS = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)


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


def test_timestep_table_matches_set_timesteps():
    rows = table_rows(r"`(leading|trailing|linspace)`")
    assert len(rows) == 4, "the timestep_spacing table changed shape"
    for spacing_cell, offset_cell, timesteps_cell, _ in rows:
        spacing, offset = spacing_cell.strip("`"), int(offset_cell)
        for cls in (DDIMScheduler, DDPMScheduler):
            scheduler = cls(timestep_spacing=spacing, steps_offset=offset)
            scheduler.set_timesteps(10)
            assert scheduler.timesteps.tolist() == numbers(timesteps_cell), (cls.__name__, spacing)


def test_euler_sigma_table_matches_set_timesteps():
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
    quoted = re.search(r"fractional \(([\d., ]+), …\)", SCHEDULER_PAGE)
    assert quoted, "the Karras timesteps sentence changed"
    scheduler = EulerDiscreteScheduler(use_karras_sigmas=True, **SD_BETAS)
    scheduler.set_timesteps(10)
    shown = numbers(quoted.group(1))
    np.testing.assert_allclose(shown, scheduler.timesteps[: len(shown)].numpy(), atol=0.006)


def test_sd_default_grid_and_leading_start():
    """'At the pipeline's default of 50 steps the grid is 981, 961, …, 21, 1' and
    'Euler with leading and steps_offset=1 starts at sigma = 8.39 where trailing starts
    at 14.61'."""
    assert "981, 961, …, 21, 1" in SCHEDULER_PAGE
    ddim = DDIMScheduler(timestep_spacing="leading", steps_offset=1, **SD_BETAS)
    ddim.set_timesteps(50)
    t = ddim.timesteps.tolist()
    assert t[:2] == [981, 961] and t[-2:] == [21, 1]

    assert "8.39" in SCHEDULER_PAGE and "14.61" in SCHEDULER_PAGE
    leading = EulerDiscreteScheduler(timestep_spacing="leading", steps_offset=1, **SD_BETAS)
    leading.set_timesteps(10)
    trailing = EulerDiscreteScheduler(timestep_spacing="trailing", **SD_BETAS)
    trailing.set_timesteps(10)
    assert float(leading.sigmas[0]) == pytest.approx(8.39, abs=0.005)
    assert float(trailing.sigmas[0]) == pytest.approx(14.61, abs=0.005)


def test_class_defaults_and_contract_members():
    assert DDPMScheduler().config.timestep_spacing == "leading"
    assert DDIMScheduler().config.timestep_spacing == "leading"
    assert EulerDiscreteScheduler().config.timestep_spacing == "linspace"
    flow = FlowMatchEulerDiscreteScheduler()
    assert not hasattr(flow, "scale_model_input") and not hasattr(flow, "init_noise_sigma")
    assert hasattr(flow, "scale_noise") and not hasattr(flow, "add_noise")
    assert DDPMScheduler.order == DDIMScheduler.order == EulerDiscreteScheduler.order == 1
    assert FlowMatchEulerDiscreteScheduler.order == 1


def test_higher_order_call_counts():
    """'HeunDiscreteScheduler has order = 2, and set_timesteps(10) returns 19 timesteps';
    'DPMSolverMultistepScheduler has order = 1 despite its default solver_order=2'."""
    heun = HeunDiscreteScheduler()
    heun.set_timesteps(10)
    assert heun.order == 2 and len(heun.timesteps) == 19
    dpm = DPMSolverMultistepScheduler()
    assert dpm.order == 1 and dpm.config.solver_order == 2
