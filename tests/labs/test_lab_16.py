"""Lab 16 Attention Kernels and Offload: tiled and ring attention, offload schedules."""

import json

import numpy as np
import pytest

STARTER = "code/lab-16-attention-kernels-and-offload/attention_offload.py"


@pytest.fixture(scope="module")
def lab(request):
    """The starter's globals after a default run (module-scoped: one run for all tests)."""
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    argv, sys.argv = sys.argv, ["attention_offload.py"]
    try:
        return runpy.run_path(str(ROOT / STARTER), run_name="__main__")
    finally:
        sys.argv = argv


def test_tiled_attention_is_exact_and_its_peak_falls_with_block_size(lab):
    for diff, lse_diff, _ in lab["tiled"].values():
        assert diff < 1e-5 and lse_diff < 1e-5  # float32 rounding only
    out, lse = lab["tiled_attention"](lab["query"], lab["key"], lab["value"], 128)
    assert out.dtype == lse.dtype == "float32"  # as the page says: no float64 anywhere
    assert lab["naive_attention"](lab["query"], lab["key"], lab["value"])[0].dtype == "float32"
    sizes = sorted(lab["tiled"])
    peaks = [lab["tiled"][b][2] for b in sizes]
    assert peaks == sorted(peaks)  # smaller blocks, smaller peak
    assert lab["tiled"][sizes[0]][2] < 0.25 * lab["naive_peak"]
    # the naive peak is the (B, heads, N, N) float32 scores, `scores - m` and its exp
    assert 3 * lab["scores_bytes"] <= lab["naive_peak"] < 3.1 * lab["scores_bytes"]
    # one block of all N keys is naive attention with extra bookkeeping: no saving
    assert lab["tiled"][lab["N"]][2] >= 0.9 * lab["naive_peak"]


def test_online_softmax_rescales_when_the_max_grows(lab):
    # two key blocks, the second with a much larger score: the first block's sum must be
    # rescaled by exp(m_old - m_new), or its weight would be e^20 times too large
    query = np.ones((1, 1, 1, 1), dtype=np.float32)
    key = np.array([0.0, 20.0], dtype=np.float32).reshape(1, 1, 2, 1)
    value = np.array([1.0, 0.0], dtype=np.float32).reshape(1, 1, 2, 1)
    out, lse = lab["tiled_attention"](query, key, value, 1)
    w0 = np.exp(0.0) / (np.exp(0.0) + np.exp(20.0))  # softmax weight of value 1
    np.testing.assert_allclose(out.ravel(), [w0], rtol=1e-5)
    np.testing.assert_allclose(lse.ravel(), [np.logaddexp(0.0, 20.0)], rtol=1e-6)


def test_ring_merge_is_exact_and_a_plain_mean_is_not(lab):
    assert lab["ring_diff"] < 1e-5
    assert lab["mean_diff"] > 1e-2
    out, lse = lab["naive_attention"](lab["query"], lab["key"], lab["value"])
    halves = [
        lab["naive_attention"](lab["query"], lab["key"][:, :, s], lab["value"][:, :, s])
        for s in (slice(0, lab["N"] // 2), slice(lab["N"] // 2, None))
    ]
    merged, merged_lse = lab["merge"](*halves[0], *halves[1])
    np.testing.assert_allclose(merged, out, atol=1e-5)
    np.testing.assert_allclose(merged_lse, lse, atol=1e-5)
    # the merge is symmetric: the ring may visit the shards in any order
    swapped, _ = lab["merge"](*halves[1], *halves[0])
    np.testing.assert_allclose(swapped, merged, atol=1e-6)


def test_real_shapes_from_arithmetic(lab):
    rows = {row[0]: row for row in lab["real_rows"]}
    assert rows["Flux.1-dev 1024 px"][1] == 4608
    assert rows["Flux.1-dev 1024 px"][3] == "972.0 MiB"  # 24 * 4608**2 * 2 bytes
    assert rows["SDXL 1024 px, 64x64 level"][3] == "640.0 MiB"  # 2 * 10 * 4096**2 * 2


def test_offload_schedules_from_the_real_groups(lab):
    from labkit import model_sizes, offload_groups

    (flux,) = [r for r in model_sizes.rows("Flux.1-dev") if r["component"] == "transformer"]
    rows = {r[0]: r for r in lab["offload"]["Flux.1-dev transformer"]}
    total = flux["params"] * 2
    record = offload_groups.model("Flux.1-dev", "transformer")
    unmatched = sum(c["params"] for c in record["children"] if "params" in c) * 2
    assert 0 < unmatched < total
    steps = lab["args"].steps
    assert rows["all on the device"][1:4] == (total, 0, 0)
    # model offload: on before the first step, back after the last: one round trip per image
    assert rows["model offload"][2:4] == (total / steps, total / steps)
    for name, row in rows.items():
        if name.startswith(("block_level", "leaf_level", "sequential")):
            assert row[2] == total  # every byte goes to the device every step
            # without streams each group is copied back; sequential offload swaps pointers;
            # streams swap the block groups' pointers but copy the unmatched group back
            back = {"block_level, use_stream": unmatched, "sequential offload": 0}.get(name, total)
            assert row[3] == back
            assert row[1] < total
    peaks = [rows[f"block_level, n={n}"][1] for n in sorted(lab["args"].group_sizes)]
    assert peaks == sorted(peaks)  # bigger groups, bigger peak
    assert rows["block_level, n=1"][4] == 19 + 38 + 1  # one group per block + unmatched
    assert rows["leaf_level"][1] == rows["sequential offload"][1] < rows["block_level, n=1"][1]
    sdxl = {r[0]: r for r in lab["offload"]["SDXL unet"]}
    # the UNet's mid_block and its 1.2 B-parameter up_blocks[0] keep block_level's peak high
    assert sdxl["block_level, n=1"][1] > 0.6 * sdxl["all on the device"][1]


def test_printed_transfer_time_adds_both_directions(run_cli):
    run = run_cli(STARTER)
    assert run.returncode == 0, run.stderr
    flux = run.stdout.split("Flux.1-dev transformer, bf16")[1].split("SDXL unet")[0]
    lines = {line.split("  ")[0]: line.split() for line in flux.splitlines()}
    # to device, back to host, seconds: block_level without streams moves 23.80 GB there and
    # 23.80 GB back at 25 GB/s each, one after the other
    assert lines["block_level, n=1"][4:9:2] == ["23.80", "23.80", "1.90"]
    # streams: the block groups go back by pointer, the unmatched group (0.13 GB) by copy
    assert lines["block_level, use_stream"][4:9:2] == ["23.80", "0.13", "0.96"]
    assert lines["sequential offload"][4:9:2] == ["23.80", "0.00", "0.95"]
    assert lines["model offload"][4:9:2] == ["0.85", "0.85", "0.07"]


def test_default_output(run_cli):
    run = run_cli(STARTER)
    assert run.returncode == 0, run.stderr
    assert "ring attention over 4 simulated devices" in run.stdout
    assert "Attention backends" in run.stdout and "SDXL unet" in run.stdout


def test_figures_are_small(run_cli, tmp_path):
    run = run_cli(STARTER, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"attention-peak", "offload-tradeoff"}
    for entry in manifest.values():
        content = (tmp_path / entry["file"]).read_text()
        assert len(content) <= 60_000 and " id=" not in content
        assert len(entry["alt"]) > 80


@pytest.mark.parametrize(
    "argv",
    [
        ["--block-sizes", "48"],
        ["--block-sizes", "0"],
        ["--block-sizes", "x"],
        ["--devices", "3"],
        ["--devices", "0"],
        ["--tokens", "4096"],
        ["--group-sizes", "0"],
        ["--pcie-gbps", "0"],
        ["--steps", "0"],
        ["--seed", "x"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("attention_offload.py: error: ")


def test_say_it_out_loud_quotes_the_runs_peaks(lab):
    """The page's spoken summary quotes the naive and block-32 peaks the default run prints."""
    import re

    from infralens_docs.registry import ROOT

    page = (ROOT / "docs/labs/lab-16-attention-kernels-and-offload.md").read_text()
    spoken = page.split("## How to say it out loud")[1].split("\n## ")[0]
    naive, tiled = re.search(r"peak fell from ([\d.]+) MiB to ([\d.]+) MiB at block size 32", spoken).groups()  # fmt: skip
    assert naive == f"{lab['naive_peak'] / 2**20:.1f}"
    assert tiled == f"{lab['tiled'][32][2] / 2**20:.1f}"
