"""Lab 15 Step Caching: FirstBlockCache and TaylorSeer on a toy denoiser with blocks."""

import json

import numpy as np
import pytest

STARTER = "code/lab-15-step-caching/step_caching.py"


@pytest.fixture(scope="module")
def lab():
    """The starter's globals after a default run (module-scoped: one run for all tests)."""
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    argv, sys.argv = sys.argv, ["step_caching.py"]
    try:
        return runpy.run_path(str(ROOT / STARTER), run_name="__main__")
    finally:
        sys.argv = argv


def test_uncached_model_is_the_exact_denoiser(lab):
    latents = lab["noise"][:50] * 0.7
    for t in (900.0, 400.0, 30.0):
        noise_pred, diff = lab["transformer"](latents, t)
        np.testing.assert_allclose(noise_pred, lab["denoiser"](latents, t), atol=1e-12)
        assert np.isnan(diff)
    # the head block writes nothing into the channels that carry the sample
    h = latents @ lab["W_in"]
    out = lab["head_block"](h, lab["time_embed"](500.0))
    np.testing.assert_allclose(out @ lab["W_in"].T, latents, atol=1e-12)


def test_threshold_zero_is_uncached_and_thresholds_trade_calls_for_error(lab):
    fbc, steps = lab["fbc"], lab["args"].steps
    assert fbc[0.0]["calls"] == steps and fbc[0.0]["rms"] == 0.0
    taus = sorted(fbc)
    calls = [fbc[t]["calls"] for t in taus]
    assert calls == sorted(calls, reverse=True)  # looser threshold, fewer calls
    assert calls[-1] < steps // 2
    assert fbc[taus[-1]]["rms"] > fbc[taus[1]]["rms"]


def test_first_block_cache_rule_keeps_the_last_computed_residual(lab):
    cache = lab["FirstBlockCache"](0.5)
    r1 = np.ones((3, 16))
    assert cache.should_compute(r1) == (True, np.inf)
    cache.head_block_residual = r1
    compute, diff = cache.should_compute(1.3 * r1)  # mean|0.3| / mean|1| = 0.3 <= 0.5: skip
    assert not compute and diff == pytest.approx(0.3)
    # r_prev stays r1 (nothing stored on a skip), so drift accumulates against it
    compute, diff = cache.should_compute(1.6 * r1)
    assert compute and diff == pytest.approx(0.6)


def test_taylorseer_schedule_and_extrapolation(lab):
    ts = lab["TaylorSeer"](cache_interval=5, disable_cache_before_step=3, max_order=1)
    schedule = [ts.should_compute() for _ in range(15)]
    assert [k for k, c in enumerate(schedule) if c] == [0, 1, 2, 4, 9, 14]
    # a feature linear in the step is extrapolated exactly at order 1
    ts = lab["TaylorSeer"](cache_interval=4, disable_cache_before_step=2, max_order=1)
    for k in range(10):
        feature = np.full((2, 3), 1.0 + 0.5 * k)
        out = ts(lambda f=feature: f)
        np.testing.assert_allclose(out, feature)
    assert ts.taylor_factors[1][0, 0] == pytest.approx(0.5)


def test_a_taylorseer_prediction_skips_every_block(lab):
    """The toy's TaylorSeer predicts its whole block stack, so a predicted step skips every
    block: neither head_block nor remaining_blocks runs on it; a computed step runs both."""
    spied = lab["transformer"].__globals__  # the functions' own globals, where it looks them up
    real = {name: spied[name] for name in ("head_block", "remaining_blocks")}
    ran = []

    def spy(name):
        return lambda *a: (ran.append(name), real[name](*a))[1]

    spied.update({name: spy(name) for name in real})
    try:
        cache = lab["TaylorSeer"](cache_interval=2, disable_cache_before_step=1, max_order=1)
        per_step = []
        for t in (900.0, 800.0, 700.0):  # computed, predicted, computed
            ran.clear()
            lab["transformer"](lab["noise"][:8], t, cache)
            per_step.append(list(ran))
    finally:
        spied.update(real)
    both = ["head_block", "remaining_blocks"]
    assert per_step == [both, [], both]


def test_taylorseer_order_one_beats_reuse(lab):
    taylor = lab["taylor"]
    for interval in lab["args"].cache_intervals:
        assert taylor[(interval, 1)]["rms"] < taylor[(interval, 0)]["rms"]
        assert taylor[(interval, 1)]["calls"] == taylor[(interval, 0)]["calls"]


def test_order_two_wins_at_two_and_ten_loses_at_five(lab):
    # the page: higher order is not always better, with no cause claimed
    taylor = lab["taylor"]
    assert taylor[(2, 2)]["rms"] < taylor[(2, 1)]["rms"]
    assert taylor[(5, 2)]["rms"] > taylor[(5, 1)]["rms"]
    assert taylor[(10, 2)]["rms"] < taylor[(10, 1)]["rms"]
    assert taylor[(2, 1)]["calls"] == 26  # 48% of 50 saved, not FirstBlockCache's 26%


def test_few_steps_leave_nothing_to_reuse(lab):
    change = lab["change"]
    many, few = change[lab["args"].steps], change[lab["args"].few_steps]
    assert np.median(few) > 5 * np.median(many)
    # "more than its own size" holds for the median change, not for every step (0.918 at the first)
    assert np.median(few) > 1 > few.min()
    # every threshold up to 0.8 skips nothing at 4 steps; the ones that skip are far off
    n = lab["args"].few_steps
    assert all(row["calls"] == n for tau, row in lab["few"].items() if tau <= 0.8)
    skipping = [row for row in lab["few"].values() if row["calls"] < n]
    assert skipping and all(row["rms"] > 0.5 for row in skipping)
    # so "skips nothing" needs its threshold: 1.6 skips 3 of 4
    assert lab["few"][1.6]["calls"] == 1


def test_default_output(run_cli):
    run = run_cli(STARTER)
    assert run.returncode == 0, run.stderr
    assert "FirstBlockCache, 50 steps" in run.stdout and "TaylorSeer, 50 steps" in run.stdout


def test_figures_are_small(run_cli, tmp_path):
    run = run_cli(STARTER, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"calls-vs-error", "residual-change"}
    for entry in manifest.values():
        content = (tmp_path / entry["file"]).read_text()
        assert len(content) <= 60_000 and " id=" not in content
        assert len(entry["alt"]) > 80


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "1", "--few-steps", "1"],
        ["--steps", "1", "--few-steps", "1", "--thresholds", "0", "--cache-intervals", "1"],
        ["--steps", "2", "--few-steps", "1", "--warmup", "1"],
        ["--steps", "1", "--few-steps", "2", "--num-samples", "1"],
    ],
    ids=" ".join,
)
def test_one_step_runs_are_valid(run_cli, tmp_path, argv):
    """A 1-step run (a distilled model's step count; here the exact, undistilled model) is
    valid, with no second step to reuse: it prints its tables (labelled "1 step"), and
    with both runs at 1 step there is no step-to-step change to draw, so --figures writes
    calls-vs-error alone (line_chart of no series raised a ValueError). It prints the same
    with and without --figures: the build serves a plain run from the figures run of the
    same arguments."""
    run = run_cli(STARTER, *argv, "--figures", str(tmp_path))
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert "1 step: no second step, nothing to compare or reuse" in run.stdout
    assert "1 steps" not in run.stdout  # its labels say "1 step"
    manifest = json.loads((tmp_path / "figures.json").read_text())
    drawn = {"calls-vs-error"} | ({"residual-change"} if "2" in (argv[1], argv[3]) else set())
    assert set(manifest) == drawn
    plain = run_cli(STARTER, *argv)
    assert (plain.stdout, plain.stderr, plain.returncode) == (run.stdout, run.stderr, 0)


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "0"],
        ["--few-steps", "0"],
        ["--thresholds", "-0.1"],
        ["--thresholds", "0.1,x"],
        ["--cache-intervals", "0"],
        ["--num-samples", "0"],
        ["--seed", "x"],
        ["--steps", "1001"],
        ["--warmup", "0"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("step_caching.py: error: ")
