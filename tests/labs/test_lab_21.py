"""Lab 21 Video Diffusion: a causal 4x-time, 8x-space toy VAE, token counts and the cost of frames."""

import json

import numpy as np
import pytest

STARTER = "code/lab-21-video-diffusion/video_latents.py"


def run_lab(*argv):
    """The starter's globals after a run with ``argv``."""
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    old, sys.argv = sys.argv, ["video_latents.py", *argv]
    try:
        return runpy.run_path(str(ROOT / STARTER), run_name="__main__")
    finally:
        sys.argv = old


@pytest.fixture(scope="module")
def lab():
    """The starter's globals after a default run (module-scoped: one run for all tests)."""
    return run_lab()


@pytest.mark.parametrize("frames", [1, 5, 17, 33])
def test_latent_shape_is_1_plus_frames_minus_1_over_4(frames):
    g = run_lab("--frames", str(frames))
    assert g["latents"].shape == (16, 1 + (frames - 1) // 4, 4, 4)
    assert g["recon"].shape == g["video"].shape == (frames, 3, 32, 32)


def test_encoder_is_causal(lab):
    video = lab["video"].copy()
    z = lab["encode"](video)
    video[-4:] = 0.0  # change the last group of 4 frames
    z2 = lab["encode"](video)
    np.testing.assert_array_equal(z2[:, :-1], z[:, :-1])
    assert not np.allclose(z2[:, -1], z[:, -1])


def test_projection_is_orthonormal_and_rows_0_2_are_mean_colour(lab):
    proj = lab["PROJ"]
    np.testing.assert_allclose(proj @ proj.T, np.eye(16), atol=1e-12)
    flat = np.zeros((3, 4, 8, 8))
    flat[1] = 0.5  # a patch of constant green 0.5
    assert lab["PROJ"][:3] @ flat.ravel() == pytest.approx([0.0, 0.5 * 16, 0.0])
    # a clip that is constant per patch survives the round trip exactly
    const = np.full((5, 3, 32, 32), 0.25)
    np.testing.assert_allclose(lab["decode"](lab["encode"](const)), const, atol=1e-12)


def test_tokens_and_real_shapes(lab):
    assert lab["latent_shape"](81, 720, 1280) == (1, 16, 21, 90, 160)
    assert lab["tokens"](81, 720, 1280) == 75_600
    assert lab["tokens"](81, 480, 832) == 32_760
    assert lab["FLUX_TOKENS"] == 4096
    lin, att = lab["call_flops"](75_600)
    assert att / (lin + att) > 0.7  # attention dominates at 5 s of 720p
    lin1, att1 = lab["call_flops"](3600)
    assert att1 < lin1
    # doubling tokens: linear x2, attention x4
    assert lab["call_flops"](7200)[1] == 4 * att1 and lab["call_flops"](7200)[0] == 2 * lin1


def test_figures(run_cli, tmp_path):
    run = run_cli(STARTER, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"frames-and-latents", "attention-cost"}
    svg = (tmp_path / manifest["attention-cost"]["file"]).read_text()
    assert len(svg) <= 60_000 and " id=" not in svg
    assert "75,600" in manifest["attention-cost"]["alt"]
    assert (tmp_path / manifest["frames-and-latents"]["file"]).stat().st_size < 80_000


@pytest.mark.parametrize(
    "argv",
    [
        ["--frames", "80"],
        ["--frames", "0"],
        ["--frames", "x"],
        ["--frames", "85"],
        ["--speed", "9"],
        ["--seed", "x"],
        ["--no-such-flag"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("video_latents.py: error: ")


def test_frames_must_be_4k_plus_1(run_cli):
    run = run_cli(STARTER, "--frames", "80")
    assert "--frames must be 4k+1" in run.stderr and "use 77 or 81" in run.stderr


def test_decode_memory_prints_the_measured_peak_beside_the_bound(run_cli):
    """The 3.19 GB cache bound is printed with the real decoder's measured peak (the record a
    verify test writes to labkit/model_sizes.json), about three times the bound, tiling's (its
    repeated decoder calls replayed, as labelled), and the untiled 81-frame peak (9.8 GB, 0.41 GB
    above 9 frames: the decoded clip)."""
    from labkit import model_sizes

    run = run_cli(STARTER)
    assert run.returncode == 0, run.stderr
    peak = {k: v / 1e9 for k, v in model_sizes.load()["wan_vae_decode_720p"]["peak_bytes"].items()}
    assert "= 3.19 GB (a lower bound)" in run.stdout
    assert f"peaks at {peak['bf16']:.1f} GB of live tensors in bf16" in run.stdout
    assert f"{peak['fp32']:.1f} GB in float32" in run.stdout
    # the tiled peak of 9 frames is replayed (sizes.wan_vae_decode_record), and says so
    assert f"with vae.enable_tiling() {peak['bf16_tiled']:.2f} GB (9 frames, the decoder's repeated calls replayed;" in run.stdout  # fmt: skip
    assert f"untiled, 81 frames: measured {peak['bf16_81_frames']:.1f} GB in bf16" in run.stdout
    assert (
        "untiled, 81 frames: measured 9.8 GB in bf16" in run.stdout
        and "+0.41 GB over 9 frames" in run.stdout
    )
    assert (
        "a later decoder call's 4 frames before conv_out + 7 caches x 2 frames = 3.19 GB"
        in run.stdout
    )
    assert 2.8 < peak["bf16"] / 3.19 < 3.2 and peak["bf16_tiled"] < 1
    assert "weights, bf16: Wan 2.1 14B's transformer 28.6 GB" in run.stdout
    assert "its UMT5-XXL text encoder 11.4 GB (5.68 B parameters)" in run.stdout


def test_tiled_decode_of_81_frames_is_the_held_tiles_plus_three_copies(lab, run_cli):
    """Tiled, 81 frames of 720p peak at the measured 2.09 GB, not 0.73 GB plus the 0.45 GB clip:
    the starter's bookkeeping (every overlapping tile held, 1.65x the frame's pixels, plus the
    blended rows, their concatenation and the clamped clip) is within 1% of it."""
    from labkit import model_sizes

    measured = model_sizes.load()["wan_vae_decode_720p"]["peak_bytes"]["bf16_tiled_81_frames"]
    bookkept = lab["tiles_bytes"] + 3 * lab["clip_bytes"]
    assert abs(measured / bookkept - 1) < 0.01
    assert measured > 1.5 * (model_sizes.load()["wan_vae_decode_720p"]["peak_bytes"]["bf16_tiled"] + lab["clip_bytes"])  # fmt: skip
    assert round(lab["tile_pixels"] / (720 * 1280), 2) == 1.65
    run = run_cli(STARTER)
    assert "tiled, 81 frames: measured 2.09 GB (replayed)." in run.stdout
    assert "(tiles overlap: 1.65x the frame's pixels, 0.74 GB)" in run.stdout
    assert "clamped clip (0.45 GB each): 2.08 GB" in run.stdout


@pytest.mark.parametrize(
    "frames, suggested", [(79, "use 77 or 81"), (78, "use 77 or 81"), (2, "use 1 or 5")]
)
def test_frame_suggestions_stay_within_the_limit(run_cli, frames, suggested):
    """A frame count that is not 4k+1 gets two 4k+1 suggestions, both accepted (<= 81); past 81
    the limit itself is the error, so 83 is never told to try 85."""
    assert suggested in run_cli(STARTER, "--frames", str(frames)).stderr
    for v in suggested.removeprefix("use ").split(" or "):
        assert run_cli(STARTER, "--frames", v).returncode == 0
    run = run_cli(STARTER, "--frames", "83")
    assert run.returncode == 2 and "--frames must be <= 81" in run.stderr and "85" not in run.stderr
