"""Lab 11 Scheduler Loop Reading: calls = steps, and more steps buy quality."""

import pytest

STARTER = "code/lab-11-scheduler-loop-reading/scheduler_loop.py"


def table(stdout: str) -> dict[tuple[str, int], tuple[int, float, float, float]]:
    """(scheduler, steps) -> (calls, on_mode, weight_err, spread) from the printed table."""
    rows = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[3].endswith("%"):
            name, steps, calls, on_mode, weight_err, spread = parts
            rows[(name, int(steps))] = (
                int(calls),
                float(on_mode.rstrip("%")) / 100,
                float(weight_err),
                float(spread),
            )
    return rows


@pytest.fixture(scope="module")
def rows():
    from infralens_docs.runner import run_starter

    run = run_starter(STARTER, ["--steps", "2,5,10,50"], cache=False)
    assert run.returncode == 0, run.stderr
    return table(run.stdout)


def test_one_denoiser_call_per_step(rows):
    for (_, steps), (calls, *_) in rows.items():
        assert calls == steps


def test_enough_steps_land_on_the_modes_with_the_right_weights(rows):
    for name in ["ddpm", "ddim", "euler", "euler_karras", "flow_match"]:
        _, on_mode, weight_err, spread = rows[(name, 50)]
        assert on_mode > 0.95, name
        assert weight_err < 0.05, name
        assert 0.5 < spread < 1.2, name


def test_spread_approaches_the_data_with_more_steps(rows):
    """At 10 steps the deterministic and DDPM samplers pack the modes too tightly
    (spread well below 1); 50 steps come closer to the data. Karras sigmas, which
    spend their steps at low noise, are near 1 already."""
    for name in ["ddpm", "ddim", "euler", "flow_match"]:
        assert rows[(name, 10)][3] < 0.7, name
        assert abs(rows[(name, 50)][3] - 1) < abs(rows[(name, 10)][3] - 1), name
    assert abs(rows[("euler_karras", 10)][3] - 1) < 0.05


def test_fewer_steps_cost_accuracy(rows):
    for name in ["ddpm", "ddim", "euler", "euler_karras", "flow_match"]:
        assert rows[(name, 2)][1] < rows[(name, 50)][1], name


def test_conditioning_restricts_to_one_class(run_lab):
    g = run_lab(STARTER, "--steps", "25", "--schedulers", "ddim", "--class-label", "1")
    from labkit.metrics import purity

    samples = g["run_loop"](*g["make"]("ddim"), 25, 0)
    assert purity(g["mixture"], samples, 1) > 0.99


@pytest.mark.parametrize(
    "argv",
    [["--schedulers", "karras"], ["--steps", "0"], ["--steps", "5,x"], ["--class-label", "7"]],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("scheduler_loop.py: error: ")


def test_image_strip_x0_hat_settles_on_a_training_image_before_x_t_does(run_lab):
    """The `images` figure's strip: on 32 x 32 toy images, DDIM's x0_hat starts as a blur far
    from the image the loop ends on, its error falls at every step and is gone by mid-loop,
    while x_t is still noisy; the output is that training image (DDIM's last step leaves a
    little noise)."""
    import numpy as np

    g = run_lab(STARTER, "--steps", "5", "--schedulers", "ddim")
    x_t, x0_hat, output, target = g["image_strip"](10, 0)
    assert x_t.shape == x0_hat.shape == (10, 3, 32, 32) and output.shape == target.shape
    err = np.sqrt(np.mean((x0_hat - target) ** 2, axis=(1, 2, 3)))
    noisy = np.sqrt(np.mean((x_t - target) ** 2, axis=(1, 2, 3)))
    assert err[0] > 0.2 and np.all(np.diff(err) <= 1e-9) and err[-1] < 1e-3
    assert err[4] < 0.01 < noisy[4]  # halfway: x0_hat has arrived, x_t has not
    assert np.all(np.diff(noisy) < 0) and noisy[0] > 1.0
    assert np.sqrt(np.mean((output - target) ** 2)) < 0.05
