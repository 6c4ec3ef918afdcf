"""Lab 01 Forward Noise Process: the numbers the page states hold for every schedule."""

import numpy as np
import pytest

from labkit import BETA_SCHEDULES

STARTER = "code/lab-01-forward-noise-process/forward_noise.py"


@pytest.mark.parametrize("schedule", BETA_SCHEDULES)
def test_noised_batches_have_the_predicted_moments(run_lab, schedule):
    g = run_lab(STARTER, "--schedule", schedule)
    rows = [line for line in g["__stdout__"].splitlines() if line.strip().endswith("%")]
    assert len(rows) == len(g["args"].timesteps)
    assert all(" yes " in row for row in rows), "a moment check failed:\n" + "\n".join(rows)


def test_shapes_and_dtypes_at_the_boundary(run_lab):
    g = run_lab(STARTER, "--timesteps", "0,999", "--num-samples", "300")
    assert g["betas"].shape == g["alpha_bar"].shape == (1000,)
    assert g["x0"].shape == g["noise"].shape == (300, 2)
    assert all(x.shape == (300, 2) and x.dtype == np.float64 for x in g["noised"].values())


def test_signal_is_destroyed_monotonically_but_not_completely(run_lab):
    g = run_lab(STARTER, "--num-samples", "300")
    ab = g["alpha_bar"]
    assert np.all(np.diff(ab) < 0)
    assert 0 < ab[-1] < 1e-4  # linear DDPM schedule: terminal SNR small, not zero


def test_mode_identity_decays_to_the_prior(run_lab):
    """At t=999 the best guess of x0's mode is the heaviest mode: accuracy ~ max weight."""
    g = run_lab(STARTER, "--timesteps", "0,999")
    accuracies = [
        float(line.split()[-1].rstrip("%")) / 100
        for line in g["__stdout__"].splitlines()
        if line.strip().endswith("%")
    ]
    assert accuracies[0] > 0.99
    assert accuracies[1] == pytest.approx(g["mixture"].weights.max(), abs=0.02)


def test_schedules_differ_where_the_page_says(run_lab):
    g = run_lab(STARTER, "--num-samples", "300")
    crossings = {}
    for line in g["__stdout__"].splitlines():
        parts = line.split()
        if parts and parts[0] in BETA_SCHEDULES:
            crossings[parts[0]] = int(parts[-1])
    # SNR = 1 comes later for scaled_linear than linear, latest for cosine.
    assert crossings["linear"] < crossings["scaled_linear"] < crossings["squaredcos_cap_v2"]


@pytest.mark.parametrize(
    "argv",
    [["--schedule", "cosine"], ["--timesteps", "1000"], ["--timesteps", "a,b"], ["--seed", "1.5"]],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("forward_noise.py: error: ")
