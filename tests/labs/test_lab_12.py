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


def test_no_guidance_no_doubling(run_lab):
    """guidance_scale <= 1 runs the conditional branch alone, as diffusers does."""
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
