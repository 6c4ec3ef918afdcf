"""Lab 03 Scheduler Reading: spacings, input scaling, prediction types, the mismatch trap."""

import json
import re

import numpy as np
import pytest

from infralens_docs.registry import ROOT

STARTER = "code/lab-03-scheduler-reading/scheduler_reading.py"


def test_spacings_differ_where_the_page_says(run_lab):
    out = run_lab(STARTER, "--steps", "10")["__stdout__"]
    assert "leading (steps_offset=1): timesteps [901" in out  # never reaches 999
    assert "trailing (steps_offset=0): timesteps [999" in out
    assert "linspace (steps_offset=0): timesteps [999" in out


def test_scale_model_input_brings_euler_back_to_unit_variance(run_lab):
    g = run_lab(STARTER)
    euler = g["euler"]
    assert euler.init_noise_sigma > 10  # sigma_max of SD's schedule, ~14.6
    latents = g["noise"] * euler.init_noise_sigma
    scaled = euler.scale_model_input(latents, euler.timesteps[0])
    assert abs(scaled.std() - 1.0) < 0.05
    ddim = g["ddim"]
    np.testing.assert_array_equal(ddim.scale_model_input(latents, ddim.timesteps[0]), latents)


def test_three_prediction_types_give_one_update(run_lab):
    g = run_lab(STARTER)
    assert g["spread"] < 1e-10


def test_mismatch_breaks_sampling_and_match_does_not(run_lab):
    g = run_lab(STARTER, "--steps", "20")
    rows = {}
    for line in g["__stdout__"].splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[2].endswith("%"):
            rows[(parts[0], parts[1])] = float(parts[2].rstrip("%")) / 100
    assert rows[("v_prediction", "v_prediction")] > 0.95
    assert rows[("epsilon", "epsilon")] > 0.95
    assert rows[("v_prediction", "epsilon")] < 0.2
    assert rows[("epsilon", "sample")] < 0.5


@pytest.mark.parametrize("steps", ["10", "30"])
def test_sigma_grids_figure_shows_where_each_grid_starts_and_where_it_crowds(
    run_lab, tmp_path, steps
):
    """The figure sigma-grids: on SD's scaled_linear betas, trailing and linspace start at
    sigma_max (t = 999); leading with steps_offset=1 (SDXL's Euler config) starts below it and Karras shares leading's
    end points; trailing never visits the lowest noise; Karras puts more steps below sigma 0.5
    than any linear-in-t grid. The alt text carries the same numbers."""
    g = run_lab(STARTER, "--steps", steps, "--figures", str(tmp_path))
    lead, trail, lin, karras = (g["sigma_axis"][k] for k in g["sigma_axis"])
    ab = g["alphas_cumprod_"]
    train_sigmas = np.sqrt((1 - ab) / ab)  # (1000,)
    assert g["sigma_max"] == pytest.approx(train_sigmas[-1]) and g["sigma_max"] > 14
    n = int(steps)
    assert all(len(s) == n and np.all(np.diff(s) < 0) for s in (lead, trail, lin, karras))
    assert trail[0] == pytest.approx(train_sigmas[999]) and lin[0] == pytest.approx(trail[0])
    assert lead[0] == pytest.approx(train_sigmas[(n - 1) * (1000 // n) + 1])  # t = 901 at 10
    assert lead[0] < 0.9 * g["sigma_max"]
    assert karras[0] == pytest.approx(lead[0]) and karras[-1] == pytest.approx(lead[-1])
    assert lin[-1] == pytest.approx(train_sigmas[0]) and lead[-1] == pytest.approx(train_sigmas[1])
    trailing_last_t = round(1000 - (n - 1) * 1000 / n) - 1  # 99 at 10 steps, 32 at 30
    assert trail[-1] == pytest.approx(train_sigmas[trailing_last_t]) and trail[-1] > 4 * lead[-1]
    # the last grid built is Karras on leading: init_noise_sigma = sqrt(sigma_0^2 + 1), 8.45 at 10
    assert g["grid_euler"].init_noise_sigma == pytest.approx((karras[0] ** 2 + 1) ** 0.5)
    low = g["low"]
    assert low[3] > max(low[:3]) and np.median(karras) < np.median(lead)
    figure = json.loads((tmp_path / "figures.json").read_text())["sigma-grids"]
    assert (tmp_path / figure["file"]).is_file()
    assert f"sigma_max = {g['sigma_max']:.2f}" in figure["alt"]
    assert f"starts lower, at {lead[0]:.2f}" in figure["alt"]
    assert f"Karras {low[3]}." in figure["alt"]


def test_sigma_grid_labels_name_the_family_that_ships_leading_euler(run_lab):
    """The sigma-grids series: `leading` with steps_offset=1 is SDXL's shipped Euler config;
    SD 1.5 ships PNDM, and Euler.from_config on it gets linspace, so no label says SD 1.5."""
    labels = list(run_lab(STARTER)["sigma_axis"])
    assert labels == ["leading (SDXL's Euler)", "trailing", "linspace", "Karras on leading"]


def test_scheduler_page_quotes_lab_11s_five_step_row(run_lab):
    """docs/handbook/scheduler.md (this lab's section) quotes Lab 11's 5-step on_mode and
    spread for DDPM, DDIM and Euler; they must be what Lab 11 prints."""
    out = run_lab(
        "code/lab-11-scheduler-loop-reading/scheduler_loop.py",
        "--steps", "5", "--schedulers", "ddpm,ddim,euler",
    )["__stdout__"]  # fmt: skip
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[1] == "5":
            rows[parts[0]] = (parts[3], parts[5])
    page = " ".join((ROOT / "docs" / "handbook" / "scheduler.md").read_text().split())
    quoted = re.search(
        r"`on_mode` ([\d.]+%) for DDPM, ([\d.]+%) for DDIM and ([\d.]+%) for Euler.*?"
        r"\(`spread` ([\d.]+) and ([\d.]+)\)",
        page,
    )
    assert quoted is not None
    assert quoted.groups() == (
        rows["ddpm"][0], rows["ddim"][0], rows["euler"][0], rows["ddpm"][1], rows["ddim"][1],
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv", [["--steps", "0"], ["--steps", "1001"], ["--beta-schedule", "karras"]], ids=" ".join
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("scheduler_reading.py: error: ")
