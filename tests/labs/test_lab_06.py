"""Lab 06 Diffusers Pipeline Components: the model_index.json round trip, the four maps,
the scheduler swap and the compatibility checker's verdicts."""

import json

import pytest

STARTER = "code/lab-06-diffusers-pipeline-components/pipeline_components.py"
FAMILIES = ["sd15", "sdxl", "sd3", "flux"]


@pytest.mark.parametrize("family", FAMILIES)
def test_model_index_round_trip_gives_back_the_map(run_lab, tmp_path, family):
    g = run_lab(STARTER, "--family", family)
    pipeline = g["PIPELINES"][family]
    assert g["pipeline_class"] == pipeline["_class_name"]
    assert g["component_map"] == {k: tuple(v) for k, v in pipeline["components"].items()}
    assert g["pipeline_config"] == pipeline["config"]
    path = g["write_model_index"](tmp_path, pipeline)
    index = json.loads(path.read_text(encoding="utf-8"))
    assert list(index) == sorted(index)  # diffusers writes sorted keys
    assert index["_class_name"] == pipeline["_class_name"]
    for name, (_library, cls) in pipeline["components"].items():
        line = next(x for x in g["__stdout__"].splitlines() if x.split()[:1] == [name])
        assert (cls or "(optional, absent") in line


def test_the_side_by_side_maps_show_the_family_differences(run_lab):
    out = run_lab(STARTER)["__stdout__"]
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line[:1].isalpha()}
    assert rows["text_encoder_2"] == ["CLIPTextModelWithProjection", "T5EncoderModel"]  # sd3, flux
    assert rows["transformer"] == ["SD3Transformer2DModel", "FluxTransformer2DModel"]
    assert rows["unet"] == ["-", "-"]


def test_scheduler_swap_resets_what_the_file_did_not_set(run_lab):
    g = run_lab(STARTER)
    config = g["pipe_scheduler_config"]
    assert (
        config["timestep_spacing"] == "leading"
        and "timestep_spacing" in config["_use_default_values"]
    )
    values, carried, _defaulted, ignored = g["from_config"]("EulerDiscreteScheduler", config)
    assert values["timestep_spacing"] == "linspace"  # Euler's default, not PNDM's leading
    assert carried["beta_schedule"] == "scaled_linear" and carried["steps_offset"] == 1
    assert "skip_prk_steps" in ignored
    values, carried, _, ignored = g["from_config"]("FlowMatchEulerDiscreteScheduler", config)
    assert list(carried) == ["num_train_timesteps"] and "beta_schedule" in ignored


def test_checker_passes_the_published_pipelines_and_flags_the_bad_swaps(run_lab):
    g = run_lab(STARTER)
    for family in FAMILIES:
        shipped = g["CONFIGS"][family]
        assert all(ok for *_, ok in g["check"](shipped, shipped["scheduler"])), family
    verdicts = {
        title: sorted(rule for rule, *_, ok in g["check"](c, s) if not ok)
        for title, c, s in g["scenarios"]
    }
    assert verdicts == {
        "SD 1.5 UNet + SD3's 16-channel VAE": ["latent channels"],
        "SD 1.5 UNet + SD 2.1's text encoder (1024)": ["text width"],
        "SD 2.1-v checkpoint + SD 1.5's scheduler": ["prediction_type"],
        "SDXL + DPMSolverMultistepScheduler": [],
        "SDXL UNet + SD 1.5's text encoder only": ["pooled width", "text width"],
        "Flux + EulerDiscreteScheduler": ["objective"],
        "SD3 + DPM-Solver on flow sigmas": [],
        "Flux + the same DPM-Solver": ["objective"],  # FluxPipeline passes mu: it asserts
    }


def test_shapes_follow_the_configs(run_lab):
    g = run_lab(STARTER)
    shapes = {f: dict(g["boundary_shapes"](f)) for f in FAMILIES}
    assert shapes["sd15"]["latents"] == "(B, 4, 64, 64)"
    assert shapes["sdxl"]["latents"] == "(B, 4, 128, 128)"
    assert shapes["sd3"]["latents"] == "(B, 16, 128, 128)"
    assert shapes["flux"]["packed latents"] == "(B, 4096, 64)" == shapes["flux"]["noise_pred"]
    assert shapes["sd3"]["image tokens"].startswith("4096 ")


@pytest.mark.parametrize("family", FAMILIES)
def test_graph_figure_is_small_accessible_and_dark_mode_ready(run_cli, tmp_path, family):
    run = run_cli(STARTER, "--family", family, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text(encoding="utf-8"))
    entry = manifest[f"graph-{family}"]
    svg = (tmp_path / entry["file"]).read_text(encoding="utf-8")
    assert len(svg.encode()) <= 60_000
    assert 'stroke="currentColor"' in svg and "#000" not in svg and "black" not in svg
    assert "prompt_embeds" in entry["alt"] and len(entry["alt"]) > 80
    # the loop runs once per scheduler timestep: SD 1.5's PNDM makes 51 UNet calls at 50 steps
    # (no open-ended "+ 1": 1 at 1 step, IndexError at 1000; tests/verify/test_page_lab_06.py)
    assert "x len(scheduler.timesteps)" in svg and "num_inference_steps times" not in entry["alt"]
    assert "from 2 steps on" not in entry["alt"]
    pndm_rule = "51 at 50 steps with SD 1.5's PNDMScheduler"
    assert (pndm_rule in entry["alt"]) == (family == "sd15")


@pytest.mark.parametrize(
    "argv", [["--family", "sd9"], ["--family"], ["--no-such-flag"]], ids=" ".join
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and run.stdout == "" and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("pipeline_components.py: error: ")
