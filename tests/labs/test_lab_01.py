"""Lab 01 Forward Noise Process: the numbers the page states hold for every schedule."""

import numpy as np
import pytest

from infralens_docs.registry import ROOT
from labkit import BETA_SCHEDULES, make_betas
from labkit.schedules import CANONICAL_BETA_RANGE

STARTER = "code/lab-01-forward-noise-process/forward_noise.py"
DEFAULT_T = (0, 100, 250, 500, 750, 999)  # the starter's default --timesteps


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


def check_rows(stdout: str) -> dict[int, list[str]]:
    """The check table's rows, keyed by timestep: t -> [|mean err|, |cov err|, ok, mode acc]."""
    rows = [line.split() for line in stdout.splitlines() if line.strip().endswith("%")]
    return {int(row[0]): row[1:] for row in rows}


def test_a_wrong_noise_coefficient_fails_the_check_up_to_t_500(run_lab, tmp_path):
    """The page: a wrong coefficient (1 - alpha_bar instead of its square root) prints NO on
    every row of the default run up to t = 500, t = 0 included, where only the noise-term check
    sees it (the moments barely move), and passes at t = 750 and 999, where both coefficients
    are close to 1."""
    source = (ROOT / STARTER).read_text(encoding="utf-8")
    right = "np.sqrt(1.0 - alpha_bar[t]) * noise"
    assert source.count(right) == 1
    mutant = tmp_path / "forward_noise.py"
    mutant.write_text(source.replace(right, "(1.0 - alpha_bar[t]) * noise"), encoding="utf-8")
    right_rows = check_rows(run_lab(STARTER)["__stdout__"])
    wrong_rows = check_rows(run_lab(str(mutant))["__stdout__"])
    assert {t: row[2] for t, row in right_rows.items()} == dict.fromkeys(DEFAULT_T, "yes")
    ok = {t: row[2] for t, row in wrong_rows.items()}
    assert ok == {0: "NO", 100: "NO", 250: "NO", 500: "NO", 750: "yes", 999: "yes"}
    moments = [
        abs(float(w) - float(r)) for w, r in zip(wrong_rows[0][:2], right_rows[0][:2], strict=True)
    ]
    assert max(moments) < 1e-3  # at t = 0 the mean and covariance errors are the right run's


#: the ok column of the wrong-signal mutant, per schedule: yes where both coefficients are near
#: 1 or both near 0
SIGNAL_MUTANT_OK = {
    "linear": ["yes", "NO", "NO", "NO", "yes", "yes"],
    "scaled_linear": ["yes", "NO", "NO", "NO", "NO", "NO"],
    "squaredcos_cap_v2": ["yes", "yes", "NO", "NO", "NO", "yes"],
}


@pytest.mark.parametrize("schedule", BETA_SCHEDULES)
def test_a_wrong_signal_coefficient_passes_at_both_ends(run_lab, tmp_path, schedule):
    """The page: a wrong signal coefficient (alpha_bar instead of its square root) prints NO at
    t = 250 and 500 under every schedule, but passes at t = 0 under every schedule, at t = 999
    under linear and cosine, at t = 750 under linear and at t = 100 under cosine; only
    scaled_linear flags every row after t = 0. The whole ok column is checked."""
    assert set(SIGNAL_MUTANT_OK) == set(BETA_SCHEDULES)
    source = (ROOT / STARTER).read_text(encoding="utf-8")
    right = "noised[t] = np.sqrt(alpha_bar[t]) * x0 +"
    assert source.count(right) == 1
    mutant = tmp_path / "forward_noise.py"
    mutant.write_text(source.replace(right, "noised[t] = alpha_bar[t] * x0 +"), encoding="utf-8")
    rows = check_rows(run_lab(str(mutant), "--schedule", schedule)["__stdout__"])
    assert {t: row[2] for t, row in rows.items()} == dict(
        zip(DEFAULT_T, SIGNAL_MUTANT_OK[schedule], strict=True)
    )


def test_cosine_keeps_the_most_signal_mid_axis_and_the_least_at_the_end(run_lab):
    """The page: cosine keeps the most signal of the three schedules from ab[250] to ab[750] of
    the compare table and ends with the least at ab[999]."""
    g = run_lab(STARTER, "--num-samples", "300", "--timesteps", "0")
    table = {}
    for line in g["__stdout__"].splitlines():
        parts = line.split()
        if parts and parts[0] in BETA_SCHEDULES:
            table[parts[0]] = [float(x) for x in parts[1:5]]  # ab[250], ab[500], ab[750], ab[999]
    cosine = table.pop("squaredcos_cap_v2")
    for other in table.values():
        assert all(c > o for c, o in zip(cosine[:3], other[:3], strict=True))
        assert cosine[3] < other[3]


@pytest.mark.parametrize("schedule", BETA_SCHEDULES)
def test_each_schedule_name_uses_its_canonical_beta_range(run_lab, schedule):
    """`--schedule NAME` builds the betas with labkit's `CANONICAL_BETA_RANGE[NAME]`, whatever
    range a checkpoint's config gives: `linear` starts at DDPM's 0.0001, `scaled_linear` at
    SD's 0.00085."""
    g = run_lab(STARTER, "--schedule", schedule, "--num-samples", "100", "--timesteps", "0")
    np.testing.assert_array_equal(
        g["betas"], make_betas(schedule, 1000, *CANONICAL_BETA_RANGE[schedule])
    )
    first = {"linear": 0.0001, "scaled_linear": 0.00085}
    if schedule in first:
        assert g["betas"][0] == pytest.approx(first[schedule], rel=1e-9)


@pytest.mark.parametrize(
    "argv",
    [
        ["--schedule", "cosine"],
        ["--schedule", "sigmoid"],
        ["--timesteps", "1000"],
        ["--timesteps", "a,b"],
        ["--seed", "1.5"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("forward_noise.py: error: ")
