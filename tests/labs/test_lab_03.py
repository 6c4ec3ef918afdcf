"""Lab 03 Scheduler Reading: spacings, input scaling, prediction types, the mismatch trap."""

import numpy as np
import pytest

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


@pytest.mark.parametrize(
    "argv", [["--steps", "0"], ["--steps", "1001"], ["--beta-schedule", "karras"]], ids=" ".join
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("scheduler_reading.py: error: ")
