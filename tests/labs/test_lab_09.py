"""Lab 09 ControlNet / Conditioning Reading: zero init, scale, controlnet_keep, cost, IP-Adapter."""

import numpy as np
import pytest

STARTER = "code/lab-09-controlnet-conditioning-reading/controlnet_conditioning.py"


@pytest.fixture
def lab(run_lab):
    return run_lab(STARTER)


def test_zero_initialised_controlnet_leaves_the_output_exactly_unchanged(lab):
    assert all(not r.any() for r in [*lab["down_res"], lab["mid_res"]])
    assert np.array_equal(lab["noise_pred_init"], lab["noise_pred_base"])
    assert lab["noise_pred_base"].shape == (256, 2) and lab["noise_pred_base"].dtype == np.float32
    # one residual per skip of the base encoder, same shapes
    skips, mid = lab["encoder"](lab["unet"], lab["latents"])
    assert [r.shape for r in lab["down_res"]] == [s.shape for s in skips]
    assert lab["mid_res"].shape == mid.shape
    assert "noise_pred == base exactly: True" in lab["__stdout__"]


def test_controlnet_copies_the_encoder_weights(lab):
    for key in ("conv_in", "down_0", "down_1", "mid"):
        assert np.array_equal(lab["controlnet"][key], lab["unet"][key])
        assert lab["controlnet"][key] is not lab["unet"][key]  # a copy, trained separately


def test_trained_residuals_are_linear_in_the_scale(lab):
    norm = lab["residual_norm"]
    np.testing.assert_allclose(norm / norm[10], lab["scale_grid"], rtol=1e-5, atol=1e-6)
    assert lab["deviation"][0] == 0.0 and lab["deviation"][10] > 0.1
    assert "residuals(0.5) == 0.5 * residuals(1.0): True" in lab["__stdout__"]


def test_guess_mode_ramp(lab):
    ramp = lab["guess_mode_scales"](3, 2.0)
    np.testing.assert_allclose(ramp, 2.0 * np.array([0.1, 10 ** (-2 / 3), 10 ** (-1 / 3), 1.0]))
    down, mid = lab["controlnet_forward"](
        lab["trained"], lab["latents"], lab["controlnet_cond"], 1.0, guess_mode=True
    )
    full_down, full_mid = lab["controlnet_forward"](
        lab["trained"], lab["latents"], lab["controlnet_cond"], 1.0
    )
    for d, f, s in zip(down, full_down, ramp[:-1] / 2, strict=True):
        np.testing.assert_allclose(d, s * f, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(mid, full_mid, rtol=1e-6)


def keep_reference(n, start, end):
    """The pipeline's formula, written independently with fractions."""
    from fractions import Fraction

    s, e = Fraction(start).limit_denominator(10**6), Fraction(end).limit_denominator(10**6)
    return [0.0 if Fraction(i, n) < s or Fraction(i + 1, n) > e else 1.0 for i in range(n)]


@pytest.mark.parametrize(
    "steps, start, end", [(50, 0.0, 1.0), (50, 0.0, 0.5), (20, 0.2, 0.8), (7, 0.5, 1.0)]
)
def test_controlnet_keep(run_lab, steps, start, end):
    g = run_lab(
        STARTER,
        "--steps", str(steps),
        "--control-guidance-start", str(start),
        "--control-guidance-end", str(end),
    )  # fmt: skip
    assert g["controlnet_keep"] == keep_reference(steps, start, end)
    assert len(g["controlnet_keep"]) == steps
    bits = "".join(str(int(k)) for k in g["controlnet_keep"])
    assert f"{steps} steps, start {start}, end {end}): {bits}" in g["__stdout__"]


def test_keep_window_examples(lab):
    keep = lab["controlnet_keep_for"]
    assert keep(10, 0.0, 0.5) == [1.0] * 5 + [0.0] * 5
    assert keep(10, 0.2, 0.8) == [0.0] * 2 + [1.0] * 6 + [0.0] * 2
    assert keep(4, 0.0, 1.0) == [1.0] * 4


def test_guess_mode_leaves_the_unconditional_half_alone(run_lab):
    g = run_lab(STARTER, "--guess-mode")
    assert np.array_equal(g["noise_pred_uncond"], g["noise_pred_base"])
    assert np.abs(g["noise_pred_text"] - g["noise_pred_base"]).mean() > 0.01
    plain = run_lab(STARTER)
    assert np.abs(plain["noise_pred_uncond"] - plain["noise_pred_base"]).mean() > 0.1


def test_cost_lines(lab):
    assert lab["unet_params"] == 859_520_964
    out = lab["__stdout__"]
    assert "ControlNet 361,279,120 (42.0% of the UNet)" in out
    assert "ControlNet +35.3% of the UNet's FLOPs per step" in out and "toy's +114%" in out
    assert lab["branch_flops"] > 0 and lab["base_flops"] > 0


def test_ip_adapter_scale_zero_is_text_attention(lab):
    w, heads = lab["w"], 4
    q = lab["hidden_states"] @ w["to_q"]
    text = lab["attention"](q, lab["text"] @ w["to_k"], lab["text"] @ w["to_v"], heads)
    np.testing.assert_allclose(lab["out_text"], text @ w["to_out"], rtol=1e-5, atol=1e-6)
    weights_sum = lab["attention"](q, q, np.ones_like(q), heads)  # softmax rows sum to 1
    np.testing.assert_allclose(weights_sum, 1.0, rtol=1e-5)
    assert np.abs(lab["out_ip"] - lab["out_text"]).mean() > 0.01


def test_figures(run_lab, tmp_path):
    run_lab(STARTER, "--figures", str(tmp_path))
    for name in ("scale-response", "controlnet-keep"):
        svg = (tmp_path / f"{name}.svg").read_text()
        assert " id=" not in svg and len(svg) < 60_000


@pytest.mark.parametrize(
    "argv",
    [
        ["--conditioning-scale", "-0.5"],
        ["--conditioning-scale", "nan"],
        ["--control-guidance-start", "0.6", "--control-guidance-end", "0.4"],
        ["--control-guidance-start", "0.5", "--control-guidance-end", "0.5"],
        ["--control-guidance-start", "-0.1"],
        ["--control-guidance-end", "1.5"],
        ["--control-guidance-start", "nan"],
        ["--control-guidance-end", "nan"],
        ["--steps", "0"],
        ["--steps", "x"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("controlnet_conditioning.py: error: ")
    assert run.stdout == ""
