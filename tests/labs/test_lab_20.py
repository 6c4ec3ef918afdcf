"""Lab 20 Image-to-Image and Inpainting: strength, add_noise, and inpainting two ways."""

import json

import numpy as np
import pytest

STARTER = "code/lab-20-img2img-and-inpainting/img2img_inpainting.py"


@pytest.fixture(scope="module")
def lab():
    """The starter's globals after a default run (module-scoped: one run for all tests)."""
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    argv, sys.argv = sys.argv, ["img2img_inpainting.py"]
    try:
        return runpy.run_path(str(ROOT / STARTER), run_name="__main__")
    finally:
        sys.argv = argv


def test_get_timesteps_keeps_the_last_int_n_strength(lab):
    scheduler, get_timesteps = lab["scheduler"], lab["get_timesteps"]
    for n in (4, 10, 25, 50):
        scheduler.set_timesteps(n)
        for s in (0.0, 0.1, 0.35, 0.5, 0.99, 1.0):
            timesteps, count = get_timesteps(scheduler, n, s)
            assert count == len(timesteps) == int(n * s)
            assert list(timesteps) == list(scheduler.timesteps[n - int(n * s) :])
    assert lab["calls"][0.35, 10] == 3 and lab["calls"][0.5, 50] == 25


def test_img2img_starts_from_add_noise_at_the_first_timestep(lab):
    scheduler = lab["scheduler"]
    scheduler.set_timesteps(50)
    assert int(scheduler.timesteps[0]) == lab["t_first"] == 981
    assert lab["leak"] == pytest.approx(np.sqrt(scheduler.alphas_cumprod[981]))
    assert 0.06 < lab["leak_999"] < lab["leak"] < 0.08
    # strength 0 runs nothing: the input latents come back unchanged
    out = lab["img2img"](lab["init_latents"], 0.0, 50, 0)
    assert np.array_equal(out[0], lab["init_latents"][0])


def test_flux_first_sigma_is_shifted(lab):
    # time_shift of sigma 0.6 with mu 1.15 (FLUX.1's max_shift at 4096 tokens)
    assert lab["mu"] == pytest.approx(1.15)
    assert lab["sigma_first"] == pytest.approx(np.exp(1.15) / (np.exp(1.15) + 1 / 0.6 - 1))
    assert 0.82 < lab["sigma_first"] < 0.83


def test_strength_trades_faithfulness(lab):
    share = {s: lab["results"][s][1] for s in lab["strengths"]}
    assert share[0.2] == 1.0 and share[1.0] <= 0.1
    assert share[0.2] >= share[0.4] >= share[0.6] >= share[0.8]


def test_blending_is_less_consistent_than_conditioning(lab):
    assert lab["consistent_share"](lab["conditioned"]) == 1.0
    assert lab["consistent_share"](lab["blended"]) < 0.9
    # blending keeps the known latents exactly; the conditioned path only nearly
    keep = lab["keep"]
    assert np.array_equal(lab["blended"][:, :, keep], np.broadcast_to(lab["image_latents"][:, :, keep], lab["blended"][:, :, keep].shape))  # fmt: skip
    assert lab["known_drift"] < 0.1


def test_reference_editing_numbers(lab):
    assert lab["N"] == 4096 and lab["L0"] == 4096 + 512 and lab["L1"] == 2 * 4096 + 512
    assert lab["side"] == 264


def test_figures(run_cli, tmp_path):
    run = run_cli(STARTER, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"img2img", "inpainting", "calls"}
    for entry in manifest.values():
        assert (tmp_path / entry["file"]).stat().st_size <= 60_000
        assert len(entry["alt"]) > 80


@pytest.mark.parametrize(
    "argv",
    [
        ["--seed", "x"],
        ["--no-such-flag"],
        ["--strength", "1.5"],
        ["--strength", "-0.1"],
        ["--strength", "nan"],
        ["--steps", "0"],
        ["--steps", "1001"],
        ["--num-samples", "0"],
        ["--num-samples", "257"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("img2img_inpainting.py: error: ")
