"""Lab 12 End-to-End Inference Trace: the trace's boundaries, the result, the cost model."""

import json

import numpy as np
import pytest

from labkit.images import SHAPES

STARTER = "code/lab-12-end-to-end-inference-trace/pipeline_trace.py"


@pytest.fixture(scope="module")
def default_run():
    from infralens_docs.runner import run_starter

    run = run_starter(STARTER, [], cache=False)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_every_row_fits_its_layout_and_the_loop_repeats(run_lab):
    g = run_lab(STARTER, "--steps", "4", "--num-samples", "3")
    trace, expand = g["trace"], g["expand"]
    sizes = dict(K=256, B=3, n=4, h=4, w=4, f=8)
    assert all(row["shape"] == expand(row["layout"], sizes) for row in trace)
    stages = [row["stage"] for row in trace]
    assert stages == ["load"] * 2 + ["prepare"] * 4 + ["loop"] * 20 + ["decode"] * 4
    loop = [row for row in trace if row["stage"] == "loop"]
    assert [row["step"] for row in loop] == [s for s in range(1, 5) for _ in range(5)]
    # guiding: the unet sees 2B rows, the scheduler B
    assert [row["shape"][0] for row in loop[:5]] == [6, 6, 6, 3, 3]
    assert trace[-1]["dtype"] == "uint8" and trace[-1]["shape"] == (3, 32, 32, 3)


@pytest.mark.parametrize("n", [20, 50])
def test_leading_timesteps_start_at_n_minus_1_strides_plus_offset(run_lab, n):
    """The `prepare` comment: SD 1.5's DDIM settings give `(n,)` int64 timesteps from
    `(n - 1) * (1000 // n) + 1` down to 1 (951 for the default 20 steps, 981 only for 50)."""
    g = run_lab(STARTER, "--steps", str(n), "--num-samples", "2")
    timesteps = g["scheduler"].timesteps
    assert timesteps.shape == (n,) and timesteps.dtype == np.int64
    assert timesteps[0] == (n - 1) * (1000 // n) + 1 and timesteps[-1] == 1
    assert np.all(np.diff(timesteps) == -(1000 // n))


def test_no_guidance_no_doubling(run_lab):
    """guidance_scale <= 1 runs the conditional branch alone, as StableDiffusionPipeline does
    with an SD 1.5-style UNet (no time_cond_proj_dim)."""
    g = run_lab(STARTER, "--guidance-scale", "1", "--steps", "2", "--num-samples", "3")
    loop = [row for row in g["trace"] if row["stage"] == "loop"]
    assert all(row["shape"][0] == 3 for row in loop)
    assert g["unet"].rows == 2 * 3


def test_decode_boundaries_are_the_pipelines(run_lab):
    g = run_lab(STARTER, "--steps", "5", "--num-samples", "2")
    vae, latents = g["vae"], g["latents"]
    np.testing.assert_allclose(g["image"], vae.decode(latents / vae.config.scaling_factor))
    expected = (np.clip(g["image"] / 2 + 0.5, 0, 1) * 255).round().astype(np.uint8)
    np.testing.assert_array_equal(g["pixels"], expected.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("prompt", SHAPES)
def test_every_prompt_returns_training_images_of_its_class(run_lab, prompt):
    """The exact denoiser is the memorising optimum: samples sit on training latents."""
    g = run_lab(STARTER, "--prompt", prompt, "--steps", "10")
    nearest, rms = g["training_set"].nearest(g["latents"])
    assert np.all(g["data"].labels[nearest] == SHAPES.index(prompt))
    floor = np.sqrt(1 - g["scheduler"].alphas_cumprod[0])  # DDIM's last-step noise
    assert rms.max() < 1.5 * floor


def test_two_steps_stop_short_of_the_training_images(run_lab):
    """Things to try: `--prompt vbar --steps 2`, where the samples stop short of the training
    images: every sample's RMS distance to its nearest training latent is several times the
    noise DDIM's last step leaves (at 10 steps, the test above, all are within 1.5 times it)."""
    g = run_lab(STARTER, "--prompt", "vbar", "--steps", "2")
    _, rms = g["training_set"].nearest(g["latents"])
    floor = np.sqrt(1 - g["scheduler"].alphas_cumprod[0])  # DDIM's last-step noise
    assert rms.min() > 5 * floor, rms


def test_default_output_reports_purity_and_cost(default_run):
    assert "nearest training latent has the prompt's label: 100.0% of 8" in default_run
    shares = {}
    for line in default_run.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] in {"load", "prepare", "loop", "decode"}:
            shares[parts[0]] = int(parts[1].replace(",", ""))
    assert shares["loop"] > shares["decode"] > shares["prepare"]
    assert shares["load"] > shares["loop"]  # the toy fits its vae at load: a one-time cost
    assert shares["loop"] / (shares["loop"] + shares["decode"] + shares["prepare"]) > 0.9


def test_loop_cost_is_linear_in_steps_and_guidance_doubles_the_rows(run_lab):
    costs = {}
    for steps, scale in [(10, "7.5"), (20, "7.5"), (20, "1")]:
        g = run_lab(STARTER, "--steps", str(steps), "--guidance-scale", scale)
        costs[(steps, scale)] = g["cost"]
    assert costs[(20, "7.5")]["loop"] == 2 * costs[(10, "7.5")]["loop"]
    assert costs[(20, "7.5")]["decode"] == costs[(10, "7.5")]["decode"]
    # the cond branch alone compares with one class's latents; guiding adds all K per row
    assert costs[(20, "1")]["loop"] < costs[(20, "7.5")]["loop"] / 3


def test_figures(tmp_path, run_cli):
    run = run_cli(STARTER, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"pipeline", "images", "timeline"}
    for entry in manifest.values():
        assert (tmp_path / entry["file"]).stat().st_size <= 60_000
        assert len(entry["alt"]) > 80
    svg = (tmp_path / "timeline.svg").read_text()
    assert svg.count('class="c2 dot"') == 2 * 20 + 1  # one block per step in both bars, legend
    # the pipeline diagram: one box per boundary it draws, the loop stage marked as repeated
    diagram = (tmp_path / "pipeline.svg").read_text()
    assert diagram.count('class="box"') == 9 and "x 20 steps" in diagram
    for text in ["prompt_embeds (2B, 77, 768)", "SD 1.5: (2, 4, 64, 64)", "(16, 4, 4, 4) float64",
                 "SD 1.5: (1, 512, 512, 3)", "(8, 32, 32, 3) uint8"]:  # fmt: skip
        assert text in diagram
    assert "x 20 steps" in manifest["pipeline"]["alt"] or "20 times" in manifest["pipeline"]["alt"]


def test_diagram_gives_sd15s_timesteps_with_ddim_and_with_its_shipped_pndm(tmp_path, run_cli):
    """The diagram's SD 1.5 column is the layout expanded at 50 steps, which is DDIM's count:
    the timesteps arrow also gives the (51,) of SD 1.5's shipped PNDMScheduler (n + 1,
    test_page_loop.py), and the caption says which scheduler each shape is for."""
    run = run_cli(STARTER, "--steps", "3", "--num-samples", "2", "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    diagram = (tmp_path / "pipeline.svg").read_text()
    assert "SD 1.5: (50,) DDIM, (51,) PNDM" in diagram
    caption = json.loads((tmp_path / "figures.json").read_text())["pipeline"]["caption"]
    assert "DDIM" in caption and "PNDM" in caption


def test_pipeline_diagram_follows_the_run(tmp_path, run_cli):
    """Without guidance the batch never doubles, and the diagram says so."""
    run = run_cli(STARTER, "--guidance-scale", "1", "--steps", "4", "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    diagram = (tmp_path / "pipeline.svg").read_text()
    assert "x 4 steps" in diagram and "2B" not in diagram and "(no guidance)" in diagram


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "0"],
        ["--prompt", "cat"],
        ["--guidance-scale", "-1"],
        ["--guidance-scale", "nan"],
        ["--num-samples", "0"],
        ["--steps", "1001"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and run.stdout == ""
    assert len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("pipeline_trace.py: error: ")


# ---------------------------------------------------------------- flux_trace.py

FLUX = "code/lab-12-end-to-end-inference-trace/flux_trace.py"


def test_flux_packing_round_trip_is_the_identity(run_lab):
    """`_unpack_latents(_pack_latents(x))` returns `x` exactly, and token `(i, j)` holds the 2 x 2 block at row `2i`, column `2j`, channel-major."""
    g = run_lab(FLUX, "--steps", "2")
    x = np.random.default_rng(1).standard_normal((3, 4, 6, 8))
    packed = g["_pack_latents"](x, 3, 4, 6, 8)
    assert packed.shape == (3, 12, 16)
    np.testing.assert_array_equal(g["_unpack_latents"](packed, 6, 8), x)
    # token 5 = (i, j) = (1, 1): rows 2-3, columns 2-3; its first 4 numbers are channel 0
    np.testing.assert_array_equal(packed[:, 5, :4], x[:, 0, 2:4, 2:4].reshape(3, 4))


def test_flux_ids(run_lab):
    """`text_ids` is `(L, 3)` of zeros; `latent_image_ids` is `(N, 3)` = (0, row, column) of each token, N = (h/2)(w/2)."""
    g = run_lab(FLUX, "--steps", "2")
    assert not g["text_ids"].any() and g["text_ids"].shape == (1, 3)
    ids = g["latent_image_ids"]
    assert ids.shape == (4, 3)
    np.testing.assert_array_equal(ids, [[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1]])


@pytest.mark.parametrize("true_cfg", ["1", "2"])
def test_flux_per_step_batch(run_lab, true_cfg):
    """Each step calls the transformer once on B rows with guidance `(B,)`; with true CFG twice, again on B rows each, never 2B."""
    g = run_lab(FLUX, "--steps", "3", "--num-samples", "5", "--true-cfg-scale", true_cfg)
    calls = 2 if true_cfg == "2" else 1
    assert g["transformer"].rows == [5] * 3 * calls
    assert g["guidance"].shape == (5,) and g["guidance"].dtype == np.float32
    loop = [r for r in g["trace"] if r["stage"] == "loop"]
    assert all(r["shape"][0] == 5 for r in loop)
    assert len(loop) == 3 * (8 if calls == 2 else 4)


def test_flux_shift_and_sigmas(run_lab):
    """`mu` is `calculate_shift(N)` and the sigmas are `e^mu / (e^mu + 1/s - 1)` of `linspace(1, 1/n, n)`, then 0."""
    g = run_lab(FLUX, "--steps", "4")
    mu = g["mu"]
    assert mu == pytest.approx(0.5 + (1.15 - 0.5) / (4096 - 256) * (4 - 256))
    s = np.linspace(1, 1 / 4, 4)
    expected = np.exp(mu) / (np.exp(mu) + 1 / s - 1)
    np.testing.assert_allclose(g["scheduler"].sigmas, [*expected, 0.0])
    np.testing.assert_allclose(g["scheduler"].timesteps, expected * 1000)


def test_flux_decode_undo(run_lab):
    """The decoder gets `_unpack_latents(latents) / scaling_factor + shift_factor`, the inverse of the training latents' `(z - shift_factor) * scaling_factor`."""
    g = run_lab(FLUX, "--steps", "6")
    vae = g["vae"]
    np.testing.assert_allclose(
        g["vae_input"], g["latents"] / vae.config.scaling_factor + vae.config.shift_factor
    )
    np.testing.assert_allclose(g["image"], vae.decode(g["vae_input"]))
    z = g["z"]
    back = g["training_latents"] / vae.config.scaling_factor + vae.config.shift_factor
    np.testing.assert_allclose(back, z)


def test_flux_figure(tmp_path, run_cli):
    """The starter writes one SVG figure with alt text from the run's values."""
    run = run_cli(FLUX, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"flux"}
    assert "(B, N, 4C)" in (tmp_path / "flux.svg").read_text()
    assert "one transformer call of 2 rows" in manifest["flux"]["alt"]


@pytest.mark.parametrize(
    "argv",
    [["--steps", "0"], ["--true-cfg-scale", "-1"], ["--true-cfg-scale", "nan"],
     ["--prompt", "cat"], ["--num-samples", "0"]],
    ids=" ".join,
)  # fmt: skip
def test_flux_bad_arguments(run_cli, argv):
    """Bad input gives one line on stderr and exit code 2, no traceback."""
    run = run_cli(FLUX, *argv)
    assert run.returncode == 2 and run.stdout == ""
    assert len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("flux_trace.py: error: ")


def test_the_vae_is_lab_05s_patch_pca_as_the_page_says(run_lab):
    """Predict first: "The VAE is Lab 05's linear `AutoencoderKL` stand-in: each 8 × 8 patch
    becomes its coordinates on the training patches' top 4 principal components." The
    starter's `vae` is Lab 05's class with the page's patch size and component count, and its
    `encode` projects each mean-removed patch onto the top principal directions of the
    training images' patches."""
    import re

    from infralens_docs.registry import ROOT
    from labkit.vae import PatchPCAAutoencoder, patchify

    page = (ROOT / "docs/labs/lab-12-end-to-end-inference-trace.md").read_text(encoding="utf-8")
    said = re.search(
        r"\[Lab 05\]\([^)]*\)'s linear `AutoencoderKL` stand-in: each (\d+) × (\d+) patch becomes"
        r" its coordinates on the training patches' top (\d+) principal components",
        page,
    )
    assert said, "the sentence is gone or reworded: update this test with it"
    size, channels = int(said.group(1)), int(said.group(3))
    assert said.group(1) == said.group(2)
    lab_05 = run_lab("code/lab-05-vae-latent-space/vae_latents.py")["vae"]
    g = run_lab(STARTER, "--steps", "2", "--num-samples", "2")
    vae, images = g["vae"], g["data"].images
    assert type(vae) is type(lab_05) is PatchPCAAutoencoder
    assert (vae.config.patch_size, vae.config.latent_channels) == (size, channels)
    rows = patchify(images, size).reshape(-1, 3 * size**2)  # (patches, 192)
    centred = rows - rows.mean(axis=0)
    _, vectors = np.linalg.eigh(centred.T @ centred)
    top = vectors[:, ::-1][:, :channels]  # (192, channels): the top principal directions
    latents = vae.encode(images).transpose(0, 2, 3, 1).reshape(-1, channels)
    np.testing.assert_allclose(np.abs(latents), np.abs(centred @ top), atol=1e-8)
