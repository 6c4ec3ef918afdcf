"""Lab 22 Guidance Beyond CFG: the combine rules, their overshoot and their calls per step."""

import numpy as np
import pytest

STARTER = "code/lab-22-guidance-beyond-cfg/guiders.py"


def table(stdout: str) -> dict[tuple[str, float], dict[str, float]]:
    rows = {}
    for line in stdout.splitlines():
        parts = line.rsplit(maxsplit=5)
        if len(parts) == 6 and parts[2].endswith("%"):
            rule, scale, purity, mean_x, std_x, calls = parts
            rows[rule.strip(), float(scale)] = {
                "purity": float(purity.rstrip("%")) / 100,
                "mean_x": float(mean_x),
                "std_x": float(std_x),
                "calls": float(calls),
            }
    return rows


@pytest.fixture(scope="module")
def default():
    from infralens_docs.runner import run_starter

    run = run_starter(STARTER, [], cache=False)
    assert run.returncode == 0, run.stderr
    return table(run.stdout)


def test_cfg_purity_saturates_while_the_mean_overshoots(default):
    cfg = [default["CFG", s] for s in (1.0, 4.0, 15.0)]
    assert abs(cfg[0]["mean_x"] - 0.7) < 0.15  # scale 1: the conditional model
    assert cfg[1]["purity"] > 0.99 and cfg[2]["purity"] > 0.99
    assert cfg[2]["mean_x"] > cfg[1]["mean_x"] + 0.5 > 1.5  # still moving after purity saturates


def test_apg_and_zero_star_hold_the_mean_back_none_reaches_the_class(default):
    cfg = default["CFG", 15.0]["mean_x"]
    for rule in ("APG, eta=0", "CFG-Zero*"):
        assert default[rule, 15.0]["mean_x"] < cfg - 0.7, rule
    for rule in ("APG, eta=0", "CFG-Zero*", "tangential CFG", "PAG/SLG"):
        assert default[rule, 15.0]["mean_x"] > 0.9, rule  # overshoot remains
    assert abs(default["PAG/SLG", 15.0]["mean_x"] - cfg) < 0.1


def test_calls_per_step(default):
    for rule in ("CFG", "APG, eta=0", "CFG-Zero*", "tangential CFG"):
        assert default[rule, 4.0]["calls"] == 2.0 and default[rule, 1.0]["calls"] == 1.0
    assert default["PAG/SLG", 4.0]["calls"] == round(2 + 5 / 30, 2)  # steps 1-5 of 30


def test_perturbed_window_is_strict_at_its_start(run_lab):
    g = run_lab(STARTER, "--guidance-scales", "2", "--num-samples", "100", "--steps", "2")
    window = g["perturbed_window"]
    assert [i for i in range(30) if window(i, 30)] == [1, 2, 3, 4, 5]
    assert [i for i in range(10) if window(i, 10, 0.0, 1.0)] == list(range(1, 10))


def test_rules_reduce_to_cfg_where_they_should(run_lab):
    g = run_lab(STARTER, "--guidance-scales", "2", "--num-samples", "100", "--steps", "2")
    rng = np.random.default_rng(0)
    c, u = rng.standard_normal((2, 5, 2))
    cfg = g["ClassifierFreeGuidance"](c, u, 3.0)
    np.testing.assert_allclose(cfg, u + 3.0 * (c - u))
    np.testing.assert_allclose(g["ClassifierFreeGuidance"](c, u, 1.0), c)
    # APG with eta=1 and a high threshold is CFG; eta=0 removes the part parallel to pred_cond
    np.testing.assert_allclose(g["AdaptiveProjectedGuidance"](c, u, 3.0, eta=1.0, norm_threshold=1e9), cfg)  # fmt: skip
    update = (g["AdaptiveProjectedGuidance"](c, u, 3.0, eta=0.0, norm_threshold=0.0) - u) / 3.0
    np.testing.assert_allclose((update * c).sum(axis=1), 0.0, atol=1e-12)
    # CFG-Zero*: zeros at step 0; the projected scale is 1 when cond == uncond
    assert not g["ClassifierFreeZeroStarGuidance"](c, u, 0, 3.0).any()
    np.testing.assert_allclose(g["ClassifierFreeZeroStarGuidance"](c, c, 1, 3.0), c, atol=1e-6)
    # tangential CFG: pred_uncond parallel to pred_cond is kept whole, so it is CFG
    np.testing.assert_allclose(g["TangentialClassifierFreeGuidance"](c, 0.5 * c, 3.0), g["ClassifierFreeGuidance"](c, 0.5 * c, 3.0))  # fmt: skip
    # the perturbed line with a skip branch equal to pred_cond is CFG
    np.testing.assert_allclose(g["PerturbedAttentionGuidance"](c, u, c, 3.0), cfg)


@pytest.mark.parametrize("prediction_type", ["epsilon", "flow"])
def test_apg_norm_threshold_never_binds_on_the_toy(run_lab, prediction_type):
    """APG's default norm threshold (15.0) never binds in the page's runs: the push stays far below it."""
    g = run_lab(STARTER, "--guidance-scales", "4,15", "--prediction-type", prediction_type)
    module = g["sample"].__globals__  # the starter's own namespace, which `sample` reads
    apg, norms = module["AdaptiveProjectedGuidance"], []

    def spy(pred_cond, pred_uncond, *args, **kwargs):
        norms.append(np.linalg.norm(pred_cond - pred_uncond, axis=1).max())
        assert kwargs.get("norm_threshold", 15.0) == 15.0
        return apg(pred_cond, pred_uncond, *args, **kwargs)

    module["AdaptiveProjectedGuidance"] = spy
    try:
        for scale in (4.0, 15.0):  # the page's runs' scales above 1 (at 1, APG is not called)
            g["sample"]("APG, eta=0", scale)
    finally:
        module["AdaptiveProjectedGuidance"] = apg
    assert len(norms) == 60 and max(norms) < 15.0 / 5


def test_flow_space_runs_and_cfg_still_overshoots(run_cli):
    run = run_cli(STARTER, "--prediction-type", "flow", "--guidance-scales", "1,15")
    assert run.returncode == 0, run.stderr
    rows = table(run.stdout)
    assert rows["CFG", 15.0]["mean_x"] > 2.0 and rows["CFG-Zero*", 15.0]["mean_x"] < 2.0


@pytest.mark.parametrize("argv", [["--guidance-scales", "0.5"], ["--steps", "1"], ["--prediction-type", "v"]])  # fmt: skip
def test_bad_input_is_one_line(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_pag_at_scale_1_takes_the_unconditional_branch(run_lab):
    """At `guidance_scale=1` the starter's `PAG/SLG` rule runs its extra call in the window on the
    unconditional branch (`UNCOND`) of the full denoiser, the inputs diffusers' guider batches
    there with `use_original_formulation=False`; above scale 1 that call is `weak_unet`'s on
    class 1."""
    g = run_lab(STARTER, "--guidance-scales", "2", "--num-samples", "100", "--steps", "10")
    module = g["sample"].__globals__
    unet, weak, seen = module["unet"], module["weak_unet"], []

    def spy(name, model):
        return lambda x, t, class_labels: seen.append((name, class_labels)) or model(x, t, class_labels=class_labels)  # fmt: skip

    module["unet"], module["weak_unet"] = spy("unet", unet), spy("weak", weak)
    try:
        g["sample"]("PAG/SLG", 1.0)  # 10 steps: the window is step 1 alone
        at_one, seen[:] = list(seen), []
        g["sample"]("PAG/SLG", 4.0)
        above = list(seen)
    finally:
        module["unet"], module["weak_unet"] = unet, weak
    assert ("weak", module["target_class"]) not in at_one
    # step 1's extra call is on the negative prompt (class_labels=UNCOND), full denoiser
    assert at_one.count(("unet", module["UNCOND"])) == 1
    assert ("weak", module["target_class"]) in above


def test_scale_within_isclose_of_one_is_off_as_in_the_guiders(run_lab):
    """The starter switches `pred_uncond` off as diffusers' guiders do, with `math.isclose`: at
    `guidance_scale=1 + 1e-10` every two-prediction rule makes one call per step, as at 1."""
    g = run_lab(STARTER, "--guidance-scales", "2", "--num-samples", "100", "--steps", "10")
    for rule in ("CFG", "APG, eta=0", "tangential CFG"):
        near, calls = g["sample"](rule, 1 + 1e-10)
        assert calls == 1.0, rule
        np.testing.assert_array_equal(near, g["sample"](rule, 1.0)[0])


@pytest.mark.parametrize(("prediction_type", "stays"), [("epsilon", False), ("flow", True)])
def test_a_zero_prediction_moves_under_ddim_not_under_flow_euler(run_lab, prediction_type, stays):
    """Under the toy's DDIM a zero noise prediction still moves the latents; under the flow run's
    flow-matching Euler a zero velocity leaves them where they are (CFG-Zero*'s zeroed step)."""
    g = run_lab(STARTER, "--guidance-scales", "2", "--num-samples", "100", "--steps", "30", "--prediction-type", prediction_type)  # fmt: skip
    scheduler, latents = g["scheduler"], g["noise"] * g["scheduler"].init_noise_sigma
    scheduler.set_timesteps(30)
    t = scheduler.timesteps[0]
    prev = scheduler.step(np.zeros_like(latents), t, latents).prev_sample
    assert np.array_equal(prev, latents) is stays
