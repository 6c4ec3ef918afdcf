"""Lab 14 Precision and Quantization: number formats, fp16 overflow, GGUF blocks, sizes."""

import json

import numpy as np
import pytest

STARTER = "code/lab-14-precision-and-quantization/precision_quantization.py"


@pytest.fixture(scope="module")
def lab():
    """The starter's globals after a default run (module-scoped: one run for all tests)."""
    import contextlib
    import io
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    argv, sys.argv = sys.argv, ["precision_quantization.py"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return runpy.run_path(str(ROOT / STARTER), run_name="__main__")
    finally:
        sys.argv = argv


def test_starter_uses_the_one_emulation(lab):
    """The starter imports labkit.precision (its unit tests: tests/test_labkit.py)."""
    from labkit import precision

    assert lab["round_to"] is precision.round_to and lab["format_limits"] is precision.format_limits
    assert lab["FORMATS"] is precision.FORMATS
    assert lab["fp16_agrees"] and lab["fp32_agrees"]


def test_fp16_decode_overflows_and_the_fixes_do_not(lab):
    ref_peak = max(lab["ref_peaks"])
    assert ref_peak > 65504  # the exact activations pass fp16's top
    fp16_image, fp16_peaks = lab["decodes"]["fp16"]
    assert np.isinf(fp16_peaks).any() and np.isnan(fp16_image).all()
    for name in ("fp32 (force_upcast)", "bf16", "fp16, fixed weights"):
        image, peaks = lab["decodes"][name]
        assert np.isfinite(image).all() and np.isfinite(peaks).all(), name
    err = {n: np.abs(lab["decodes"][n][0] - lab["reference"]).max() for n in ("fp32 (force_upcast)", "bf16", "fp16, fixed weights")}  # fmt: skip
    assert err["fp32 (force_upcast)"] < 1e-5 < err["fp16, fixed weights"] < err["bf16"] < 0.1
    assert max(lab["decodes"]["fp16, fixed weights"][1]) < 100  # scaled weights: O(1) activations


def test_q8_0_and_q4_0_layout(lab):
    quantize, dequantize = lab["quantize"], lab["dequantize"]
    w = np.zeros((2, 64), np.float32)
    w[0, :32] = np.linspace(-1, 1, 32)
    w[1, 32:] = 3.0
    q8, q4 = quantize(w, "Q8_0"), quantize(w, "Q4_0")
    assert q8.shape == (2, 68) and q4.shape == (2, 36)  # 34 and 18 bytes per 32-value block
    d = q8[0, :2].copy().view(np.float16)[0]
    assert d == np.float16(np.float32(1) / np.float32(127))  # max|x| / 127, stored fp16
    assert q8[0, 2:34].view(np.int8)[[0, -1]].tolist() == [-127, 127]
    # an all-zero block: d = 0, q = 0 (Q8_0) or 8, the zero of Q4_0's offset code (0x88)
    assert np.all(q8[0, 34:] == 0) and np.all(q4[0, 20:] == 0x88)
    assert q4[0, 18:20].copy().view(np.float16)[0] == 0  # -0.0: 0 / -8 keeps the sign bit
    # Q4_0: the largest-magnitude value (3.0) maps to q = 0, i.e. -8 * d with d = -3/8
    assert q4[1, 18:20].copy().view(np.float16)[0] == np.float16(-0.375)
    assert np.all(q4[1, 20:] == 0)  # both nibbles 0
    np.testing.assert_array_equal(dequantize(q4, "Q4_0")[1, 32:], 3.0)
    # round trip: at most half a step (Q8_0) or one step (Q4_0: +8 clips to 7) per value,
    # plus what storing d in fp16 (11 significant bits) moves the largest q
    x = lab["weight"]
    blocks = x.reshape(-1, 32)
    for qtype, steps, q_max in (("Q8_0", 0.5, 127), ("Q4_0", 1.0, 8)):
        step = np.abs(blocks).max(axis=1, keepdims=True) / q_max
        err = np.abs(dequantize(quantize(x, qtype), qtype).reshape(-1, 32) - blocks)
        assert np.all(err <= (steps + q_max * 2.0**-11) * step * 1.001), qtype
        assert err.max() > 0.25 * steps * step.min()  # and the bound is not vacuous


def test_layer_and_loop_errors_order_by_bits(lab):
    layer = lab["layer"]
    assert layer["Q8_0"][0] == 8.5 and layer["Q4_0"][0] == 4.5
    assert layer["fp16"][2] < layer["bf16"][2] < layer["Q8_0"][2] < layer["fp8_e4m3"][2] < layer["fp8_e5m2"][2] < layer["Q4_0"][2]  # fmt: skip
    err = lab["pred_err"]
    assert err["float64 head"] < 1e-6
    assert err["Q8_0"] < err["fp8_e4m3"] < err["Q4_0"] < 0.05
    for name, final in lab["finals"].items():
        q = lab["sample_quality"](lab["mixture"], final)
        assert q.on_mode > 0.95, name  # the samples still land on the modes


def test_flux_sizes_from_model_sizes(lab):
    from labkit import model_sizes

    params = {r["component"]: r["params"] for r in model_sizes.rows("Flux.1-dev")}
    row = lab["size_rows"][0]
    assert row[0] == "transformer"
    assert row[2:] == [f"{params['transformer'] * b / 1e9:.2f}" for b in (2, 1, 34 / 32, 18 / 32)]
    assert float(row[5]) < 0.3 * float(row[2])  # Q4_0 is 9/32 of bf16
    lc = lab["layerwise"]
    assert lc == model_sizes.layerwise_casting("Flux.1-dev", "transformer")
    assert lc["cast_params"] + lc["kept_params"] == params["transformer"]
    assert 0.99 * lc["kept_params"] < lab["modulation"] < lc["kept_params"]


def test_dequantize_path_touches_more_bytes_than_a_resident_bf16_weight(lab):
    touched = lab["touched"]
    assert touched["bf16 resident"] == 2.0
    assert touched["Q8_0"] == 34 / 32 + 4 and touched["Q4_0"] == 18 / 32 + 4


def test_dequantize_on_the_fly_holds_a_full_weight_copy(lab):
    for peak in lab["on_the_fly"].values():
        assert peak >= lab["weight"].nbytes > 100 * lab["resident"]


def test_default_output_is_deterministic(run_cli):
    first, second = run_cli(STARTER), run_cli(STARTER)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert "timing" not in first.stdout and "Flux.1-dev weights" in first.stdout


def test_timing_flag_prints_measurements(run_cli):
    run = run_cli(STARTER, "--timing")
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("timing, batch") == 2


def test_figures_are_small(run_cli, tmp_path):
    run = run_cli(STARTER, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"activation-overflow", "bits-vs-error"}
    for entry in manifest.values():
        content = (tmp_path / entry["file"]).read_text()
        assert len(content) <= 60_000 and " id=" not in content
        assert len(entry["alt"]) > 80


@pytest.mark.parametrize(
    "argv",
    [
        ["--formats", "fp4"],
        ["--formats", ","],
        ["--block-size", "48"],
        ["--block-size", "0"],
        ["--steps", "0"],
        ["--num-samples", "0"],
        ["--gain", "0.5"],
        ["--layers", "0"],
        ["--seed", "x"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("precision_quantization.py: error: ")


# ---------------------------------------------------------------- w8a8_outliers.py

OUTLIERS = "code/lab-14-precision-and-quantization/w8a8_outliers.py"


@pytest.fixture(scope="module")
def w8a8():
    """w8a8_outliers.py's globals after a default run."""
    import contextlib
    import io
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    argv, sys.argv = sys.argv, ["w8a8_outliers.py"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return runpy.run_path(str(ROOT / OUTLIERS), run_name="__main__")
    finally:
        sys.argv = argv


def test_w8a8_uses_the_one_emulation(w8a8):
    from labkit import precision

    assert w8a8["quantize_scaled"] is precision.quantize_scaled
    assert w8a8["round_to"] is precision.round_to


def test_smoothing_leaves_the_product_unchanged(w8a8):
    x, w = w8a8["x"], w8a8["weight"]
    xs, ws = w8a8["smooth"](x, w, 0.5)
    np.testing.assert_allclose(xs @ ws.T, x @ w.T, rtol=1e-10, atol=1e-10)
    # alpha 0.5 gives both operands the same largest value per input channel
    np.testing.assert_allclose(np.abs(xs).max(axis=0), np.abs(ws).max(axis=0), rtol=1e-12)


def test_outliers_hurt_activation_quantization_and_not_weight_only(w8a8):
    e, calm = w8a8["errors"], w8a8["errors_calm"]
    # weight-only: the activations stay 16-bit, the outliers change nothing
    assert e["weight-only int8 (W8A16)"] == pytest.approx(calm["weight-only int8 (W8A16)"], rel=0.2)  # fmt: skip
    assert e["weight-only int8 (W8A16)"] < e["W8A8 int8, per-token x"] / 3
    # one scale per tensor or per token is set by the outliers: several times the calm error
    for name in ("W8A8 int8, per-tensor x", "W8A8 int8, per-token x"):
        assert e[name] > 2 * calm[name], name
    assert e["W8A8 int8, per-tensor x"] > e["W8A8 int8, per-token x"]
    # fp8's grid is relative: outliers barely matter, but 3 mantissa bits cost on calm data
    fp8 = "W8A8 fp8 e4m3, per-tensor"
    assert e[fp8] == pytest.approx(calm[fp8], rel=0.1) and calm[fp8] > 3 * calm["W8A8 int8, per-token x"]  # fmt: skip
    # SmoothQuant brings int8 W8A8 back to the per-channel reference that no GEMM can use
    smooth = e["SmoothQuant + W8A8 int8, per-token x"]
    assert smooth < 1.2 * e["W8A8 int8, per-channel x (not a GEMM)"] and smooth < e["W8A8 int8, per-token x"] / 2.5  # fmt: skip
    # 4 bits: smoothing helps, the low-rank 16-bit branch helps most
    svd = next(n for n in e if n.startswith("SVDQuant"))
    assert e[svd] < e["SmoothQuant + W4A4"] / 2 < e["W4A4 int4, per-group"] / 2


def test_low_rank_branch_is_the_top_singular_directions(w8a8):
    _, ws = w8a8["smooth"](w8a8["x"], w8a8["weight"], 0.5)
    u, sv, vt = np.linalg.svd(ws, full_matrices=False)
    r = w8a8["args"].rank
    low_rank = (u[:, :r] * sv[:r]) @ vt[:r]
    assert np.linalg.matrix_rank(low_rank) == r
    # the residual left for 4 bits has a smaller largest value than the smoothed weight
    assert np.abs(ws - low_rank).max() < np.abs(ws).max() / 2


def test_w8a8_figure(run_cli, tmp_path):
    run = run_cli(OUTLIERS, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"outliers-vs-error"}
    content = (tmp_path / manifest["outliers-vs-error"]["file"]).read_text()
    assert len(content) <= 60_000 and " id=" not in content
    assert "SVDQuant" in manifest["outliers-vs-error"]["alt"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--outlier-scale", "0.5"],
        ["--alpha", "1.5"],
        ["--group-size", "48"],
        ["--rank", "500"],
        ["--tokens", "0"],
        ["--outliers", "1000"],
        ["--outliers", "256"],  # every channel: no "rest" left to compare
        ["--seed", "x"],
    ],
    ids=" ".join,
)
def test_w8a8_bad_arguments(run_cli, argv):
    run = run_cli(OUTLIERS, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("w8a8_outliers.py: error: ")
