"""Lab 08 LoRA Injection Reading: the update, fusing, stacking, scale, sizes and FLOPs."""

import numpy as np
import pytest

STARTER = "code/lab-08-lora-injection-reading/lora_injection.py"


@pytest.fixture
def lab(run_lab):
    return run_lab(STARTER)


def test_zero_b_gives_base_output_exactly(lab):
    assert np.array_equal(lab["key_init"], lab["key_base"])
    assert lab["key_base"].shape == (1, 77, 320) and lab["key_base"].dtype == np.float32


def test_fused_equals_unfused_to_float32_rounding(lab):
    assert lab["fuse_gap"] < 1e-4 < lab["lora_effect"]
    assert lab["weight_fused"].shape == lab["weight"].shape == (320, 768)
    np.testing.assert_allclose(lab["weight_back"], lab["weight"], atol=1e-6)


def test_delta_has_rank_r(lab):
    a, b = lab["lora_A"], lab["lora_B"]
    assert np.linalg.matrix_rank(lab["lora_delta"](a, b, 8.0, 4)) == 4


def test_stacking_adds_weighted_deltas(lab):
    assert lab["stack_gap"] < 1e-4


def test_scale_is_linear(lab):
    scales, moved = np.array(lab["args"].scales), np.array(lab["scale_effect"])
    assert moved[scales == 0] == 0
    np.testing.assert_allclose(moved, scales * moved[scales == 1][0], rtol=1e-5)


def test_sd15_counts(lab):
    projections = lab["attention_projections"](lab["CONFIGS"]["sd15"])
    assert len(projections) == 128  # 16 transformer blocks x 8 Linears
    assert lab["lora_counts"][("sd15", 4)] == 797_184
    assert lab["lora_counts"][("sd15", 128)] == 32 * 797_184


def test_sdxl_counts(lab):
    projections = lab["attention_projections"](lab["CONFIGS"]["sdxl"])
    assert len(projections) == 560  # 70 transformer blocks
    assert lab["lora_counts"][("sdxl", 4)] == 5_806_080


def test_bytes_printed_at_fp16(lab):
    assert "     4      797,184    1,594,368" in lab["__stdout__"]


def test_flops_per_token(lab):
    assert "102,400     4            2,560          2.50%" in lab["__stdout__"]
    assert "SD 1.5 unfused: 4 more ops per adapted Linear" in lab["__stdout__"]
    assert "512 per UNet call" in lab["__stdout__"] and "2,240 per UNet call" in lab["__stdout__"]


def test_figures(run_lab, tmp_path):
    run_lab(STARTER, "--figures", str(tmp_path))
    for name in ("lora-bytes", "lora-scale"):
        svg = (tmp_path / f"{name}.svg").read_text()
        assert " id=" not in svg and len(svg) < 60_000


def test_rank_list_and_family(run_lab):
    g = run_lab(STARTER, "--rank", "16,2", "--family", "sdxl")
    assert set(g["lora_counts"]) == {("sdxl", 16), ("sdxl", 2)}
    assert g["rank"] == 16


@pytest.mark.parametrize(
    "argv",
    [
        ["--rank", "0"],
        ["--rank", "-4"],
        ["--rank", "4,0"],
        ["--rank", "x"],
        ["--rank", "512"],
        ["--family", "sd3"],
        ["--family", ","],
        ["--scales", "a,b"],
        ["--scales", "-1"],
        ["--scales", ""],
        ["--alpha", "0"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("lora_injection.py: error: ")
    assert run.stdout == ""
