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
    # diffusers' get_timesteps also calls set_begin_index on a scheduler that has it: DDIM has none
    assert not hasattr(scheduler, "set_begin_index")


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
    # time_shift of sigma 0.6 with mu 1.15 (FLUX.1-dev's max_shift at 4096 tokens)
    assert lab["mu"] == pytest.approx(1.15)
    assert lab["sigma_first"] == pytest.approx(np.exp(1.15) / (np.exp(1.15) + 1 / 0.6 - 1))
    assert 0.82 < lab["sigma_first"] < 0.83


def test_strength_trades_faithfulness(lab):
    """The shares the page quotes, from the default run of 256 samples (one standard error
    at most 3.1 points): 100, 89, 65, 18 and 2% at strength 0.2 to 1.0."""
    assert lab["B"] == 256 and f"{50 / np.sqrt(lab['B']):.1f}" == "3.1"
    share = {s: round(100 * lab["results"][s][1]) for s in lab["strengths"]}
    assert share == {0.2: 100, 0.4: 89, 0.6: 65, 0.8: 18, 1.0: 2}


def test_strength_one_leaks_the_image_in_the_toy(lab):
    """At strength 1.0 more samples land on the input's nearest training image than from
    text-to-image with the same noise (2% against 0% by default), for other seeds too."""
    assert round(100 * lab["results"][1.0][1]) == 2 and lab["t2i_share"] == 0.0
    scheduler, unet, nearest = lab["scheduler"], lab["unet"], lab["training_set"].nearest
    target = lab["init_nearest"][0]
    for seed in (1, 2, 3):
        i2i = lab["img2img"](lab["init_latents"], 1.0, 50, seed)
        scheduler.set_timesteps(50)
        pure = np.random.default_rng(seed).standard_normal(i2i.shape) * scheduler.init_noise_sigma
        for t in scheduler.timesteps:
            pure = scheduler.step(unet(pure, t), t, pure).prev_sample
        hits = (np.sum(nearest(i2i)[0] == target), np.sum(nearest(pure)[0] == target))
        assert hits[0] >= 4 and hits[0] > 2 * hits[1], (seed, hits)


def test_float32_denoiser_lands_where_float64_does(lab):
    """FiniteSet32 (float32) and labkit's FiniteSet (float64) give the same posterior mean
    to float32 precision, and the same training image for every sample of a default-seed
    img2img run. (The page's "about half float64's CPU time" was measured, 0.10-0.13 s
    against 0.21-0.30 s for five runs; timing is not asserted: a loaded machine would make
    it flaky.)"""
    from labkit import ExactDenoiser
    from labkit.images import FiniteSet

    latents = np.random.default_rng(5).standard_normal((64, 4, 4, 4))
    for alpha, sigma in ((0.9, 0.4), (0.3, 0.95)):
        exact = lab["training_set"].posterior_mean(latents, alpha, sigma)
        fast = lab["unet"].mixture.posterior_mean(latents, alpha, sigma)
        np.testing.assert_allclose(fast, exact, atol=1e-4)
    assert isinstance(lab["training_set"], FiniteSet)
    f64 = ExactDenoiser(lab["training_set"], lab["scheduler"].alphas_cumprod, "epsilon")
    for strength in (0.2, 0.4, 0.6, 0.8, 1.0):
        a = lab["img2img"](lab["init_latents"], strength, 50, 0)
        b = lab["img2img"](lab["init_latents"], strength, 50, 0, denoiser=f64)
        assert np.array_equal(lab["training_set"].nearest(a)[0], lab["training_set"].nearest(b)[0])


def test_blending_is_less_consistent_than_conditioning(lab):
    """49% of the 256 blended samples are consistent, 100% of the conditioned ones; the
    input's known (left) half is plain background: its shape lies in the masked half."""
    assert lab["consistent_share"](lab["conditioned"]) == 1.0
    assert round(100 * lab["consistent_share"](lab["blended"])) == 49
    assert len(lab["consistent"]) == 30
    # blending keeps the known latents exactly; the conditioned path only nearly
    keep = lab["keep"]
    assert np.array_equal(lab["blended"][:, :, keep], np.broadcast_to(lab["image_latents"][:, :, keep], lab["blended"][:, :, keep].shape))  # fmt: skip
    assert lab["known_drift"] < 0.1
    image = lab["data"].images[lab["j"]]  # (3, 32, 32): the shape only in columns 16-31
    assert np.all(image[:, :, :16] == -0.8) and np.any(image[:, :, 16:] != -0.8)
    # "nearly all the rest are a right half from a picture whose left half differs":
    # 125 of the 131 inconsistent samples are within 0.05 RMS of another picture's right half
    blended, training = lab["blended"], lab["training_latents"]
    d = np.stack([lab["rms_over"](blended, training[k : k + 1], ~keep) for k in range(256)], 1)
    others = np.setdiff1d(np.arange(256), lab["consistent"])
    inconsistent = d[:, lab["consistent"]].min(1) >= 0.05
    from_another = d[:, others].min(1) < 0.05
    assert (int(inconsistent.sum()), int((inconsistent & from_another).sum())) == (131, 125)


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
        ["--num-samples", "1025"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("img2img_inpainting.py: error: ")
