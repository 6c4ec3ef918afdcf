"""Lab 04 CFG Code Reading: batch doubling, its cost, and the measured effects of the scale."""

import re

import numpy as np
import pytest

STARTER = "code/lab-04-cfg-code-reading/cfg_guidance.py"


def sweep(stdout: str) -> dict[str, dict[str, float]]:
    table = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[1].endswith("%"):
            purity, sx, sy, mean_x, rows = parts[1:]
            table[parts[0]] = {
                "purity": float(purity.rstrip("%")) / 100,
                "std_x": float(sx),
                "std_y": float(sy),
                "mean_x": float(mean_x),
                "rows": float(rows),
            }
    return table


@pytest.fixture(scope="module")
def table():
    from infralens_docs.runner import run_starter

    run = run_starter(STARTER, ["--guidance-scales", "1,2,4,8"], cache=False)
    assert run.returncode == 0, run.stderr
    return sweep(run.stdout)


def test_purity_rises_with_the_scale(table):
    assert table["uncond"]["purity"] < 0.6  # two equal classes: about half
    purities = [table[s]["purity"] for s in ["1", "2", "4", "8"]]
    assert purities == sorted(purities) and purities[0] < 0.95 and purities[-1] > 0.99


def test_diversity_falls_only_along_the_class_axis(table):
    std_x = [table[s]["std_x"] for s in ["1", "2", "4", "8"]]
    assert std_x == sorted(std_x, reverse=True) and std_x[-1] < 0.6 * std_x[0]
    std_y = [table[s]["std_y"] for s in ["uncond", "1", "2", "4", "8"]]
    assert max(std_y) - min(std_y) < 0.02  # the orthogonal axis is untouched


def test_high_scale_overshoots_the_class_mean(table):
    assert abs(table["1"]["mean_x"] - 0.7) < 0.1  # scale 1 = the conditional model
    assert table["8"]["mean_x"] > 1.5  # far past the class mean at x = 0.7


def test_guiding_doubles_the_rows_per_step(table):
    assert table["1"]["rows"] == 2000  # guidance_scale <= 1: cond branch only, as in SD's pipeline
    assert table["2"]["rows"] == 4000


def test_batch_doubling_matches_two_separate_calls(run_lab):
    """cat([latents] * 2) + one call + split == two calls, one per branch."""
    g = run_lab(STARTER, "--guidance-scales", "3", "--num-samples", "200", "--steps", "5")
    latents = g["noise"][:50]
    t = g["scheduler"].timesteps[2]
    guided = g["guided_noise_pred"](latents, t, 3.0)
    unet, uncond, cond = g["unet"], g["UNCOND"], g["target_class"]
    e_u = unet(latents, t, class_labels=uncond)
    e_c = unet(latents, t, class_labels=cond)
    np.testing.assert_allclose(guided, e_u + 3.0 * (e_c - e_u), atol=1e-12)


def test_negative_prompt_pushes_further_at_the_same_rows(run_lab):
    """A negative prompt pushes further than the empty one; 4000 rows per step either way."""
    g = run_lab(STARTER, "--guidance-scales", "1")
    lines = [line for line in g["__stdout__"].splitlines() if "uncond = " in line]
    (empty, rows_empty), (negative, rows_negative) = (
        (float(line.split("mean x")[1].split()[0]), line.split("rows/step")[1].strip())
        for line in lines
    )
    assert negative > empty
    assert rows_empty == rows_negative == "4000"  # the doubled batch of 2000 samples


def test_guidance_grid_on_images_follows_the_scale(run_lab, tmp_path):
    """The figure images: without a prompt few images are squares; from scale 1 on all are.
    As the scale grows the squares get larger (the class evidence guidance climbs) and rows
    that started from different noise end on fewer distinct training images."""
    g = run_lab(STARTER, "--figures", str(tmp_path))
    assert (tmp_path / "images.png").is_file()
    # 3,072 values an image (3 x 32 x 32) but 1,024 pixels, the unit of the shape areas
    assert g["data"].images.shape[1:] == (3, 32, 32) and g["data"].images[0].size == 3072
    assert 0 < g["area"].max() <= 32 * 32
    purity, distinct, area = g["image_purity"], g["image_distinct"], g["image_area"]
    scales = ["1", "2", "4", "7.5", "15"]
    assert list(purity) == ["uncond", *scales]
    assert purity["uncond"] < 0.5 and all(purity[s] == 1.0 for s in scales)
    assert [area[s] for s in scales] == sorted(area[s] for s in scales)
    assert area["15"] > area["1"] > area["uncond"]
    assert [distinct[s] for s in scales] == sorted((distinct[s] for s in scales), reverse=True)
    assert distinct["15"] < distinct["1"]
    # the grid shows exactly these images: rows are noises, columns the scales
    grid, R = g["grid_images"], g["R"]
    assert grid.shape == (R, 6, 3, 32, 32)
    changed = np.abs(grid[:, -1] - grid[:, 1]).max(axis=(1, 2, 3)) > 0.5  # (R,) per noise
    assert changed.any()
    # the page: guided x0_hat leaves the data range at high noise, the guidance term then
    # vanishes once both posteriors settle on one training image, and every output ends on
    # a training image (RMS 0.03: the last step's leftover noise, set_alpha_to_one=False)
    assert len(g["image_scheduler"].timesteps) == 15 and g["args"].steps == 30
    x0_hat_max, term = g["x0_hat_max"], g["guidance_term"]
    assert x0_hat_max[0] > 10 and max(x0_hat_max[5:]) < 0.9 + 1e-6  # data: [-0.8, 0.9]
    assert term[0] > 1.0 and max(term[5:]) < 1e-6  # from t = 595 on
    assert g["nearest_rms"].max() < 0.05 and np.abs(grid).max() < 1.0
    # within [-1, 1], not within the data's [-0.8, 0.9]: the leftover noise passes that range
    assert grid.min() < -0.8 and grid.max() > 0.9


@pytest.mark.parametrize(
    "argv",
    [
        ["--guidance-scales", "-1"],
        ["--guidance-scales", "x"],
        ["--guidance-scales", "1,1e200"],
        ["--guidance-scales", "100.5"],
        ["--steps", "0"],
        ["--steps", "1000"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("cfg_guidance.py: error: ")


def test_guidance_scales_from_0_to_100_run(run_cli):
    """Both ends of the accepted range run to the end with finite rows (past 100 is an error)."""
    run = run_cli(STARTER, "--guidance-scales", "0,100", "--num-samples", "100", "--steps", "5")
    assert run.returncode == 0, run.stderr
    rows = sweep(run.stdout)
    assert set(rows) == {"uncond", "0", "100"}
    assert all(np.isfinite(list(row.values())).all() for row in rows.values())


def test_a_scale_just_past_100_is_named_in_the_error(run_cli):
    """The one-line error names the offending scale exactly (not rounded to 100)."""
    run = run_cli(STARTER, "--guidance-scales", "100.0000000000001")
    assert run.returncode == 2 and "got 100.0000000000001" in run.stderr


def test_labs_index_lists_every_lab_that_samples_the_shape_images():
    """docs/labs/index.md names the labs whose exact denoiser is one of a finite set of shape
    images (labkit's `FiniteSet`, Lab 04's image grid among them): exactly the labs whose
    starters build a `FiniteSet`, read from code/, so a new lab on pictures fails here."""
    from infralens_docs.registry import ROOT

    builders = {
        int(path.parent.name[4:6])
        for path in (ROOT / "code").glob("lab-*/*.py")
        if "FiniteSet(" in path.read_text(encoding="utf-8")
    }
    index = (ROOT / "docs/labs/index.md").read_text(encoding="utf-8")
    listed = re.search(r"labs on pictures \(([^)]*)\)", " ".join(index.split())).group(1)
    assert {int(n) for n in re.findall(r"\d+", listed)} == builders
