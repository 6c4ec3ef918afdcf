"""Lab 18 Compilation and CUDA Graphs: a roofline-and-launch model of a FLUX.1-dev step."""

import itertools
import json

import numpy as np
import pytest

STARTER = "code/lab-18-compilation-and-cuda-graphs/launch_overhead.py"


@pytest.fixture(scope="module")
def lab():
    """The starter's globals after a default run (module-scoped: one run for all tests)."""
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    argv, sys.argv = sys.argv, ["launch_overhead.py"]
    try:
        return runpy.run_path(str(ROOT / STARTER), run_name="__main__")
    finally:
        sys.argv = argv


def test_kernel_flops_match_the_real_models_meta_count(lab):
    from labkit import model_sizes

    kernels = lab["flux_step"](1, 1024)
    counted = sum(k[2] for k in kernels if k[1] != "pointwise")
    assert counted == model_sizes.flux_1024px()["flops"]  # exact, from the meta-device count


def test_step_time_is_a_host_device_timeline(lab):
    launch = lab["LAUNCH"]
    # kernels much shorter than a launch: host-bound, K x launch plus the last kernel (each
    # kernel's device time hides behind the next launch), not K x (launch + roofline)
    tiny = [("k", "pointwise", 1, 2)] * 100
    dev = lab["device_times"](tiny)
    assert lab["step_time"](tiny) == pytest.approx(100 * launch + dev[-1], rel=1e-9)
    # one long kernel first: the host runs ahead and the launches after it hide
    long = [("mm", "matmul", lab["PEAK_FLOPS"] * 1.0, 2), *tiny]
    assert lab["step_time"](long) == pytest.approx(launch + 1.0 + dev.sum(), rel=1e-9)
    # a CUDA graph: one launch for the whole step
    assert lab["step_time"](tiny, cuda_graph=True) == pytest.approx(launch + dev.sum())


def test_fusion_keeps_the_flops_and_cuts_kernels(lab):
    eager = lab["flux_step"](1, 512)
    compiled = lab["fused"](eager)
    assert sum(k[2] for k in compiled) == sum(k[2] for k in eager)
    assert len(compiled) < 0.6 * len(eager)
    assert not any(a[1] == b[1] == "pointwise" for a, b in itertools.pairwise(compiled))
    assert sum(k[0] == "to_qkv" for k in compiled) == 19 * 2 + 38


def test_serialised_column_bounds_the_timeline_without_being_reached(lab):
    """The `serialised ms` column is launch plus roofline per kernel with no overlap: the
    timeline never exceeds it, and with every kernel shorter than a launch it is
    `K x launch` plus the last kernel, well below it (the page's W2 fix)."""
    launch = lab["LAUNCH"]
    for side, r in lab["rows"].items():
        kernels = lab["flux_step"](1, side)
        assert r["serialised"] == pytest.approx(launch * len(kernels) + lab["device_times"](kernels).sum())  # fmt: skip
        assert r["eager"] < r["serialised"]
    # 1,000 kernels of 1 to 15 us at a 20 us launch: the timeline is K x launch + the last
    rng = np.random.default_rng(0)
    short = [("k", "pointwise", 0, b) for b in rng.uniform(1e-6, 15e-6, 1000) * lab["BANDWIDTH"]]  # fmt: skip
    saved, lab["step_time"].__globals__["LAUNCH"] = launch, 20e-6
    try:
        dev = lab["device_times"](short)
        assert lab["step_time"](short) == pytest.approx(1000 * 20e-6 + dev[-1], rel=1e-9)
        assert lab["step_time"](short) < 0.8 * (1000 * 20e-6 + dev.sum())
    finally:
        lab["step_time"].__globals__["LAUNCH"] = saved


def test_orderings_and_the_host_bound(lab):
    for r in lab["rows"].values():
        assert r["device"] <= r["eager"] <= r["serialised"]
        assert r["graph"] <= r["compiled"] <= r["eager"]
    sweep = lab["sweep"]
    graph = np.array(sweep["compiled + CUDA graph"])
    assert np.ptp(graph) < 0.01 * graph.min()  # the graph hides the launch cost
    assert sweep["eager"][-1] > 3 * sweep["eager"][0]  # eager turns host-bound


def test_launches_matter_before_they_outlast_the_average_kernel(lab):
    """Launches matter as they near kernels' length: at 256 px a 10 us launch, shorter than
    the 10.9 us average kernel, already costs the eager step over 10% (runs of short pointwise
    kernels let the host fall behind), while 1 and 2 us cost next to nothing."""
    eager, launches = lab["sweep"]["eager"], lab["launch_us"].tolist()
    assert round(lab["per_kernel"], 1) == 10.9 and launches[:4] == [1, 2, 5, 10]
    assert eager[0] == pytest.approx(eager[1], rel=1e-3) and eager[3] > 1.1 * eager[0]


def test_cold_start_pays_back_later_with_fewer_steps(run_cli):
    run = run_cli(STARTER)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if "pays back after" in line]
    counts = [int(line.rsplit("after ", 1)[1].split()[0].replace(",", "")) for line in lines]
    assert len(counts) == 2 and counts[0] > 5 * counts[1]  # 4 steps, then 28


def test_shape_policies(lab):
    assert lab["static_compiles"] == lab["RECOMPILE_LIMIT"]
    assert lab["eager_fallback"] > 0
    assert lab["automatic_compiles"] == 3
    # the (batch, tokens) orders whose graph counts torch 2.13 gives on the tiny Flux model
    # (tests/verify/test_page_lab_18.py runs the first): a backed batch 1 stays a constant (mark_unbacked lifts that)
    count = lab["automatic_dynamic_compiles"]
    assert count([(1, 9), (1, 25), (1, 36), (2, 36), (4, 49), (1, 4)]) == 3
    assert count([(1, 9), (1, 25), (1, 36), (2, 36), (4, 49), (1, 4), (1, 1)]) == 4  # 1 token
    assert count([(4, 9), (1, 25), (2, 36), (4, 49), (1, 64)]) == 3
    assert count([(1, 9), (2, 9), (1, 25), (4, 36)]) == 4  # batch changed first: 4 graphs
    assert lab["bucket_shapes"] == 9 and lab["padding"] > 0


def test_buckets_count_against_the_recompile_limit(lab):
    """9 bucket shapes under recompile_limit 8: 8 compile and the ninth's requests run
    eagerly, as torch does on the tiny model (tests/verify/test_page_lab_18.py)."""
    assert lab["bucket_compiles"] == min(lab["bucket_shapes"], lab["RECOMPILE_LIMIT"]) == 8
    ninth = lab["bucket_order"][8]
    bucket_of = zip(lab["batches"].tolist(), lab["bucket"].tolist(), strict=True)
    assert lab["bucket_eager"] == sum(s == ninth for s in bucket_of) > 0


def test_pointwise_fusion_alone_is_what_torch_compile_does(lab, run_cli):
    """The toy's torch.compile fuses pointwise runs (946 kernels of 1,422); 794 needs
    fuse_qkv_projections() as well, which the default run prints."""
    eager = lab["flux_step"](1, 1024)
    alone, with_qkv = lab["fused"](eager, qkv=False), lab["fused"](eager)
    assert (len(eager), len(alone), len(with_qkv)) == (1422, 946, 794)
    assert not any(k[0].startswith("to_qk") for k in alone)
    assert len(alone) - len(with_qkv) == 2 * (19 * 2 + 38)  # two matmuls saved per q, k, v
    run = run_cli(STARTER)
    assert "leaves 946 kernels; fuse_qkv_projections() takes that to 794" in run.stdout


def test_figures_are_small(run_cli, tmp_path):
    run = run_cli(STARTER, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"launch-sweep", "cold-start"}
    for entry in manifest.values():
        content = (tmp_path / entry["file"]).read_text()
        assert len(content) <= 60_000 and " id=" not in content
        assert len(entry["alt"]) > 80


@pytest.mark.parametrize(
    "argv",
    [
        ["--seed", "x"],
        ["--no-such-flag"],
        ["--num-samples", "0"],
        ["--steps", "0"],
        ["--batch-size", "0"],
        ["--launch-us", "0"],
        ["--launch-us", "nan"],
        ["--tflops", "-1"],
        ["--resolutions", "100"],
        ["--resolutions", "x"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("launch_overhead.py: error: ")
