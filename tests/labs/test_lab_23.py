"""Lab 23 Modular Diffusers: a NumPy block runner that rebuilds Lab 12's call as blocks."""

import json
import runpy
import sys

import numpy as np
import pytest

STARTER = "code/lab-23-modular-diffusers/blocks.py"
LAB_12 = "code/lab-12-end-to-end-inference-trace/pipeline_trace.py"


def run(starter, *argv):
    """The starter's globals after a run with ``argv``."""
    from infralens_docs.registry import ROOT

    old, sys.argv = sys.argv, [starter.rsplit("/", 1)[-1], *argv]
    try:
        return runpy.run_path(str(ROOT / starter), run_name="__main__")
    finally:
        sys.argv = old


def walk(block):
    """Every block in the tree under ``block``."""
    for sub in getattr(block, "sub_blocks", {}).values():
        yield sub
        yield from walk(sub)


@pytest.fixture(scope="module")
def lab():
    """Lab 23's globals after a default run (one run for the module)."""
    return run(STARTER)


@pytest.mark.parametrize("argv", [(), ("--guidance-scale", "1")])
def test_blocks_equal_lab_12s_monolithic_run(lab, argv):
    """The block-built images equal what Lab 12's own starter computes, bit for bit."""
    twelve = run(LAB_12, *argv)
    ours = lab if not argv else run(STARTER, *argv)
    np.testing.assert_array_equal(ours["images"], twelve["image_np"])
    # the in-starter monolithic call is Lab 12's too, at both scales
    np.testing.assert_array_equal(ours["reference"], twelve["image_np"])
    if not argv:
        np.testing.assert_array_equal(
            ours["plain"], run(LAB_12, "--guidance-scale", "1")["image_np"]
        )


def test_swapping_the_guider_halves_the_calls_and_changes_the_images(lab):
    steps = lab["args"].steps
    assert lab["cfg_calls"] == 2 * steps and lab["swapped_calls"] == steps
    assert isinstance(lab["pipe"].components.guider, lab["NoGuidance"])
    assert np.abs(lab["swapped"] - lab["images"]).max() > 0.1
    np.testing.assert_array_equal(lab["swapped"], lab["plain"])


def test_each_boundary_writes_exactly_the_declared_outputs(lab):
    """Every trace row's keys are its block's intermediate_outputs, in the documented order."""
    lab["trace"].clear()
    lab["pipe"].update_components(guider=lab["ClassifierFreeGuidance"](7.5))
    lab["pipe"](output="images", **lab["call"])
    paths = [path for path, _, _ in lab["trace"]]
    assert paths == [
        "text_encoder", "set_timesteps", "prepare_latents[noise]",
        "denoise.before_denoiser (step 1)", "denoise.denoiser (step 1)",
        "denoise.after_denoiser (step 1)", "denoise", "decode",
    ]  # fmt: skip
    declared = {type(b).__name__: b.intermediate_outputs for b in walk(lab["blocks"])}
    for _, cls, written in lab["trace"]:
        assert list(written) == [p.name for p in declared[cls]], cls
    shapes = {k: v for _, _, w in lab["trace"] for k, v in w.items()}
    assert shapes["latents"] == "(8, 4, 4, 4) float64"
    assert shapes["images"] == "(8, 32, 32, 3) float64"


def test_auto_block_picks_the_branch_from_the_inputs(lab):
    prepare = lab["blocks"].sub_blocks["prepare_latents"]
    state = lab["PipelineState"](latents=np.zeros(1))
    assert prepare.select_block(state) == "given"
    assert prepare.select_block(lab["PipelineState"]()) == "noise"
    # a composite's input is required only where every branch requires it
    required = {p.name: p.required for p in prepare.inputs}
    assert required["latents"] is False and required["class_labels"] is False
    # as diffusers': a present trigger beats the default wherever it sits; no default: skipped
    given, noise = prepare.sub_blocks["given"], prepare.sub_blocks["noise"]
    default_first = type("DefaultFirst", (lab["AutoPipelineBlocks"],), {"block_trigger_inputs": (None, "latents")})  # fmt: skip
    assert default_first(noise=noise, given=given).select_block(state) == "given"
    no_default = type("NoDefault", (lab["AutoPipelineBlocks"],), {"block_trigger_inputs": ("latents",)})  # fmt: skip
    empty = lab["PipelineState"]()
    assert no_default(given=given)(None, empty) == (None, empty) and not empty.values


def test_missing_required_input_and_unloaded_component_are_errors(lab):
    with pytest.raises(ValueError, match="Required input 'prompt' is missing"):
        lab["pipe"](output="images", num_inference_steps=2)
    fresh = lab["ModularPipeline"](lab["blocks"])
    with pytest.raises(ValueError, match="components not loaded"):
        fresh(output="images", prompt="disc")
    fresh.load_components(["scheduler", "guider", "unet", "vae"])
    np.testing.assert_array_equal(fresh(output="images", **lab["call"]), lab["images"])


def test_figure_is_the_block_graph(tmp_path):
    g = run(STARTER, "--steps", "3", "--figures", str(tmp_path))
    meta = json.loads((tmp_path / "figures.json").read_text())["blocks"]
    svg = (tmp_path / "blocks.svg").read_text()
    for cls in ("TextEncoderStep", "SetTimestepsStep", "PrepareNoiseLatentsStep",
                "LoopBeforeDenoiser", "LoopDenoiser", "LoopAfterDenoiser", "DecodeStep"):  # fmt: skip
        assert cls in svg and cls in meta["alt"]
    assert "scaled_latents (8, 4, 4, 4) float64" in svg
    assert "x 3 steps" in svg
    assert g["swapped_calls"] == 3
