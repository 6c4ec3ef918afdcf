"""Lab 05 VAE Latent Space: shapes, scaling_factor, the cost of forgetting it, memory arithmetic."""

import json

import numpy as np
import pytest

STARTER = "code/lab-05-vae-latent-space/vae_latents.py"


@pytest.fixture(scope="module")
def lab(request):
    """The starter's globals after a default run (module-scoped: one run for all tests)."""
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    argv, sys.argv = sys.argv, ["vae_latents.py"]
    try:
        return runpy.run_path(str(ROOT / STARTER), run_name="__main__")
    finally:
        sys.argv = argv


def test_shape_contract(lab):
    assert lab["train"].images.shape == (256, 3, 32, 32)
    assert lab["latents_raw"].shape == (256, 4, 4, 4)  # (B, 4, H/8, W/8)
    assert lab["recon"].shape == (256, 3, 32, 32)


def test_scaling_factor_is_one_over_std_and_gives_unit_variance(lab):
    assert lab["scaling_factor"] == pytest.approx(1 / lab["latents_raw"].std())
    assert lab["latents"].std() == pytest.approx(1.0)
    assert abs(lab["shift_factor"]) < 1e-9  # PCA centres the latents


def test_reconstruction_error_falls_with_channels(lab):
    held_out = [lab["errors"][c][1] for c in (1, 4, 8, 16)]
    assert held_out == sorted(held_out, reverse=True)
    for train_rmse, test_rmse in lab["errors"].values():
        assert train_rmse <= test_rmse < 1.2 * train_rmse  # a small generalisation gap


def test_unscaled_latents_shift_the_snr(lab):
    ratio = lab["snr_unscaled"] / lab["snr_scaled"]
    np.testing.assert_allclose(ratio, lab["latents_raw"].var() / lab["latents"].var())
    assert ratio[0] > 1  # this VAE's raw latents have std > 1, like SD's


def test_correct_decode_lands_on_training_images_and_mistakes_do_not(lab):
    nearest = lab["nearest"]
    images = dict(lab["decoded"])
    correct, forgot, twice = images.values()
    # exact denoiser: the samples are training latents, so the error is the VAE's own
    assert nearest(correct)[1].mean() < lab["errors"][4][1]
    # each correct decode is exactly the reconstruction of the training image it landed on,
    # and the printed table compares it with all reconstructions on the same measure
    landed = lab["unet"].mixture.nearest(lab["sample"])[0]
    np.testing.assert_allclose(correct, lab["recon"][landed], atol=1e-9)
    assert f"{nearest(lab['recon'])[1].mean():.3f}" == "0.197"
    assert f"{nearest(correct)[1].mean():.3f}" == "0.188"
    # 0.188 and 0.197 are means: single samples sit from 0.140 to 0.268 (the page says "on average")
    assert np.ptp(nearest(correct)[1]) > 0.1 and np.ptp(nearest(lab["recon"])[1]) > 0.1
    assert forgot.std() < correct.std() < twice.std()
    assert np.mean(np.abs(twice) > 1) > np.mean(np.abs(correct) > 1)


def test_decoder_walk_for_sd_vae(lab):
    walk = dict(lab["decoder_activation_shapes"](size=512, **lab["sd_vae"]))
    assert walk["input"] == (1, 4, 64, 64)
    assert walk["mid_block"] == (1, 512, 64, 64)
    assert walk["up_blocks.2.upsamplers.0"] == (1, 256, 512, 512)
    assert walk["up_blocks.3.resnets.2"] == (1, 128, 512, 512)
    assert walk["conv_out"] == (1, 3, 512, 512)
    assert "up_blocks.3.upsamplers.0" not in walk  # the last block does not upsample


def test_memory_arithmetic(lab):
    nbytes = lab["nbytes"]
    assert nbytes((1, 3, 512, 512)) == 1_572_864  # fp16
    assert nbytes((1, 3, 512, 512)) // nbytes((1, 4, 64, 64)) == 48
    assert nbytes((1, 3, 512, 512)) // nbytes((1, 16, 64, 64)) == 12  # SD3 / Flux: 16 channels
    assert lab["fmt"](2 * 1024**3) == "2.0 GiB"


def test_default_output_quotes_the_tables(run_cli):
    run = run_cli(STARTER)
    assert run.returncode == 0
    assert "widest output" in run.stdout and "(1, 256, 2048, 2048)" in run.stdout
    assert "scaling_factor = 1 / " in run.stdout
    assert "(their reconstructions)" in run.stdout  # the samples' RMS beside the reconstructions'


def test_figures_are_small(run_cli, tmp_path):
    run = run_cli(STARTER, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"latents", "reconstructions", "forgot-scaling", "recon-error"}
    for entry in manifest.values():
        assert (tmp_path / entry["file"]).stat().st_size <= 60_000
        assert len(entry["alt"]) > 80


@pytest.mark.parametrize(
    "argv",
    [
        ["--resolutions", "500"],
        ["--resolutions", "0"],
        ["--latent-channels", "0"],
        ["--latent-channels", "193"],
        ["--steps", "0"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("vae_latents.py: error: ")
