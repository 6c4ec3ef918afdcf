"""Lab 10 Memory Optimization Reading: slicing, tiling, precision and offload, measured."""

import json
import re

import numpy as np
import pytest

STARTER = "code/lab-10-memory-optimization-reading/memory_optimization.py"


@pytest.fixture(scope="module")
def lab(request):
    """The starter's globals after a default run (module-scoped: one run for all tests)."""
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    argv, sys.argv = sys.argv, ["memory_optimization.py"]
    try:
        return runpy.run_path(str(ROOT / STARTER), run_name="__main__")
    finally:
        sys.argv = argv


def test_sliced_attention_is_exact_and_its_peak_falls_with_slice_size(lab):
    for diff, _ in lab["sliced"].values():
        assert diff == 0  # softmax is per row, and each row is the same float32 product
    q = lab["query"][:2]  # (2, N, d) float32
    assert lab["attention"](q, q, q).dtype == "float32"
    peaks = [lab["sliced"][s][1] for s in sorted(lab["sliced"])]
    assert peaks == sorted(peaks)  # smaller slices, smaller peak
    assert lab["sliced"][1][1] < 0.2 * lab["naive_peak"]
    assert lab["chunk_diff"] < 1e-6 and lab["chunk_peak"] < 0.5 * lab["naive_peak"]
    # the naive peak is the (B*heads, N, N) float32 scores and softmax's three temporaries
    assert 4 * lab["scores_bytes"] <= lab["naive_peak"] < 4.1 * lab["scores_bytes"]


def test_sd_score_sizes_from_shapes(lab):
    rows = {row[0]: row for row in lab["sd_rows"]}
    assert rows["512 px, B=2"][3] == "512.0 MiB"  # 16 * 4096**2 * 2 bytes
    assert rows["1024 px, B=2"][3] == "8.0 GiB"
    assert rows["512 px, B=1"][4] == "128.0 MiB"  # "auto": 4 rows of B*heads
    assert rows["512 px, B=2"][5] == "256.0 MiB"  # two slice-sized tensors alive at once


def test_tiling_blend_reduces_seams_and_peak(lab):
    assert lab["err_blend"] < 0.25 * lab["err_plain"]
    assert lab["mean_err"]["blend"] < lab["mean_err"]["plain"]
    assert lab["tiled_peak"] < 0.5 * lab["whole_peak"]
    assert lab["blended"].shape == lab["whole"].shape == (1, 3, 96, 96)
    # group norm's per-tile statistics spread the error over the whole tile
    assert lab["mean_err"]["gn"] > lab["mean_err"]["blend"]


def test_blend_matches_the_formula(lab):
    a = np.arange(2 * 3 * 6 * 6, dtype=float).reshape(2, 3, 6, 6)
    b = -a.copy()
    out = lab["blend_v"](a, b.copy(), 4)
    for y in range(4):
        np.testing.assert_allclose(out[:, :, y], a[:, :, 2 + y] * (1 - y / 4) + b[:, :, y] * y / 4)
    np.testing.assert_array_equal(out[:, :, 4:], b[:, :, 4:])


def test_precision_error_orders_by_mantissa(lab):
    devs = {
        n: np.abs(final - lab["runs"]["float64"][0]).max() for n, (final, _) in lab["runs"].items()
    }
    assert devs["float64"] == 0
    assert devs["float32"] < devs["float16"] < devs["bfloat16"]
    x = np.array([1.0 + 2**-8, 3.14159])
    assert lab["to_dtype"](x, "bfloat16")[0] == 1.0  # below bfloat16's 7-bit mantissa step
    assert abs(lab["to_dtype"](x, "bfloat16")[1] - 3.14159) < 2**-6
    # one emulation for the site: labkit.precision.round_to, round to nearest (no truncation)
    from labkit.precision import round_to

    y = np.random.default_rng(0).standard_normal(1000)
    for name in ("float32", "float16", "bfloat16"):
        np.testing.assert_array_equal(lab["to_dtype"](y, name), round_to(y, name))
    assert lab["to_dtype"](np.array([1.0 + 3 * 2**-9]), "bfloat16")[0] == 1.0 + 2**-7  # up


def test_truncation_would_be_about_ten_times_as_far_off(lab):
    """The bfloat16 fold: truncating float32's low 16 bits is biased towards zero and, on this
    loop, about ten times as far off as rounding (RMS deviation from float64: measured 12.5x)."""

    def truncate(x):
        bits = np.asarray(x, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
        return bits.view(np.float32).astype(np.float64)

    x = np.random.default_rng(0).standard_normal(1000)
    assert np.all(np.abs(truncate(x)) <= np.abs(x)) and truncate(x).mean() != x.mean()
    scheduler, unet, ref = lab["scheduler"], lab["unet"], lab["runs"]["float64"][0]
    latents = truncate(lab["start"] * scheduler.init_noise_sigma)
    for t in scheduler.timesteps:
        noise_pred = truncate(unet(scheduler.scale_model_input(latents, t), t))
        latents = truncate(scheduler.step(noise_pred, t, latents).prev_sample)
    rms = {n: np.sqrt(np.mean((x - ref) ** 2)) for n, x in [("trunc", latents), ("round", lab["runs"]["bfloat16"][0])]}  # fmt: skip
    assert 7 < rms["trunc"] / rms["round"] < 15


def test_offload_bytes_from_model_sizes(lab):
    from labkit import model_sizes

    steps = lab["args"].steps
    sd = {r["component"]: r["bytes"]["fp16"] for r in model_sizes.rows("SD 1.5")}
    checker = 2 * lab["safety_checker_params"]
    rows = {r[0]: r for r in lab["offload_rows"]}
    assert rows["SD 1.5, fp16"][3] == f"{2 * (sum(sd.values()) + checker) / 1e9:.2f}"  # out, in
    # sequential: every forward streams in what it runs; CFG encodes the prompt and "";
    # SD 1.5's shipped PNDM (skip_prk_steps) calls the UNet steps + 1 times; the VAE's
    # encoder (and quant_conv) never runs in a text-to-image call, so it never crosses
    assert lab["call_order"]("SD 1.5", sd, steps).count("unet") == steps + 1 == 31
    encoder = {p: lab["vae_encoder_params"](lab["vae_rows"][p]["config"]) for p in ("SD 1.5", "SD3 Medium")}  # fmt: skip
    assert encoder == {"SD 1.5": 34_163_664, "SD3 Medium": 34_274_208}  # meta counts, verify test
    seq = sum(sd.values()) + sd["text_encoder"] + sd["unet"] * steps - 2 * encoder["SD 1.5"]
    assert rows["SD 1.5, fp16"][5:] == [f"{seq / 1e9:.1f}", f"{seq / 25e9:.1f} s"] == ["53.9", "2.2 s"]  # fmt: skip
    sd3 = {r["component"]: r["bytes"]["fp16"] for r in model_sizes.rows("SD3 Medium")}
    clips = sd3["text_encoder"] + sd3["text_encoder_2"]
    # model offload: both CLIPs come back for "" while T5 stays: 4 crossings each
    assert rows["SD3 Medium, bf16"][3] == f"{(2 * sum(sd3.values()) + 2 * clips) / 1e9:.2f}" == "34.04"  # fmt: skip
    encoders = clips + sd3["text_encoder_3"]  # each runs twice
    seq3 = (
        sum(sd3.values()) + encoders + sd3["transformer"] * (steps - 1) - 2 * encoder["SD3 Medium"]
    )
    assert rows["SD3 Medium, bf16"][5] == f"{seq3 / 1e9:.1f}" == "144.1"  # 144.2 with the encoder
    # float16: T5's wo layers stay float32, 2 more bytes per wo weight, and T5 crosses twice
    wo = 2 * lab["t5_wo_params"]
    assert rows["SD3 Medium, fp16"][3] == f"{(2 * sum(sd3.values()) + 2 * clips + 2 * wo) / 1e9:.2f}" == "38.07"  # fmt: skip
    assert rows["SD3 Medium, fp16"][5] == f"{(seq3 + 2 * wo) / 1e9:.1f}" == "148.1"  # runs twice
    # not a weight: SD3's pos_embed buffer, 192**2 positions x 1536, crosses with the transformer
    assert lab["pos_embed_values"] == 192**2 * 1536 == 56_623_104
    for dtype in ("bf16", "fp16"):
        assert lab["crossings"][f"SD3 Medium, {dtype}"] == {"text_encoder": 4, "text_encoder_2": 4, "text_encoder_3": 2, "transformer": 2, "vae": 2}  # fmt: skip
    # SDXL: upcast_vae() casts the VAE to float32 before it crosses in (4 bytes, not 2)
    xl = {r["component"]: r["bytes"]["fp16"] for r in model_sizes.rows("SDXL")}
    assert rows["SDXL, fp16"][3] == f"{(2 * sum(xl.values()) + xl['vae']) / 1e9:.2f}" == "14.04"
    fits = {r[0]: r[2:] for r in lab["fit_rows"]}
    assert fits["Flux.1-dev, bf16"] == ["23.80", "no", "no", "offload", "yes"]
    # SD3: T5 (wo in fp32) shares the device with CLIP-G under model offload
    assert fits["SD3 Medium, fp16"] == ["12.93", "no", "offload", "yes", "yes"]
    assert fits["SD3 Medium, bf16"][:2] == ["10.91", "no"] and fits["SD3 Medium, bf16"][2] == "yes"
    assert fits["SD3 Medium, no T5"][1] == "yes"


def test_memory_timeline_comes_from_the_run(lab):
    """Each switch's line is the weights resident in each phase of one SD 1.5 call plus the
    tensors counted live there, all from this run's numbers: the model offload replay, two
    (16, N, N) scores tensors (two "auto" slices when sliced) and three of the VAE decoder's
    widest output (tests/verify/test_page_lab_10.py holds these counts to the real classes)."""
    from labkit import model_sizes

    sd = {r["component"]: r["bytes"]["fp16"] for r in model_sizes.rows("SD 1.5")}
    checker = 2 * lab["safety_checker_params"]
    scores, auto = 2 * 16 * 4096**2, 2 * 4 * 4096**2  # two live (16, N, N); two "auto" slices
    decode = 3 * 256 * 512 * 512  # three of the third up block's upsampled output
    assert (lab["scores_values"], lab["auto_values"], lab["decode_values"]) == (scores, auto, decode)  # fmt: skip
    loaded = sum(sd.values()) + checker
    t = lab["timeline"]
    assert t["float32"] == [2 * loaded, 2 * loaded, 2 * loaded + 4 * scores, 2 * loaded + 4 * decode]  # fmt: skip
    assert t["float16"] == [loaded, loaded, loaded + 2 * scores, loaded + 2 * decode]
    assert t["+ attn slicing"] == [loaded, loaded, loaded + 2 * auto, loaded + 2 * decode]
    # model offload: the checker alone before the call, then the component that runs with it
    assert t["+ model offload"] == [checker, checker + sd["text_encoder"], checker + sd["unet"] + 2 * auto, checker + sd["vae"] + 2 * decode]  # fmt: skip
    # each switch lowers the peak of the one above it; slicing moves it to the decode
    peaks = [max(row) for row in t.values()]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 4
    assert [row.index(max(row)) for row in t.values()] == [2, 2, 3, 2]
    # a flash or memory-efficient SDPA kernel stores no scores: float16 peaks in the decode
    assert lab["sdpa_row"] == [loaded, loaded, loaded, loaded + 2 * decode]


def test_memory_timeline_figure_shows_the_run(run_cli, tmp_path):
    run = run_cli(STARTER, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    entry = json.loads((tmp_path / "figures.json").read_text())["memory-timeline"]
    svg = (tmp_path / entry["file"]).read_text()
    for phase in ("loaded", "text encode", "denoise loop", "VAE decode"):
        assert f">{phase}</text>" in svg  # the phases label the x axis
    # the legend sits right of the plot, where no step line can cross it, and ends inside
    # the 394 px a phone shows of the 640-unit chart (8 px text): labels of at most 15 characters
    frame = re.search(r'<rect class="frame" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', svg)
    right = float(frame.group(1)) + float(frame.group(2))
    table = run.stdout.split("weights + the tensors counted live, GB")[1].split("\n\n")[0]
    rows = {line[:16].strip(): line[16:].split() for line in table.strip().splitlines()[2:6]}
    assert len(rows) == 4 and all(len(name) <= 15 for name in rows)
    for name in rows:
        assert float(re.search(rf'<text x="([\d.]+)" y="[\d.]+">{re.escape(name)}</text>', svg).group(1)) > right  # fmt: skip
    assert "SD 1.5" in entry["caption"] and "not a measurement" in entry["caption"]
    # the processor counted, the default kernel's case, and that the counts are a floor
    for words in ("AttnProcessor keeps them (not the processor a pipeline loads with)", "no scores are stored, and attention slicing lowers nothing", "a floor"):  # fmt: skip
        assert words in entry["caption"]
    assert "accounting (not a measurement)" in entry["alt"]
    for name, values in rows.items():
        peak = max(values, key=float)
        phase = ("loaded", "text encode", "denoise loop", "VAE decode")[values.index(peak)]
        assert f"{name} {peak} GB in the {phase}" in entry["alt"]
    assert "peak 3.14 GB in the VAE decode; attention slicing lowers nothing there" in run.stdout


def test_flop_per_byte_is_hundreds(lab):
    assert 300 < lab["flop_per_byte"] < 1000  # compute-bound already at one 512 px row


def test_default_output(run_cli):
    run = run_cli(STARTER)
    assert run.returncode == 0, run.stderr
    assert "SlicedAttn" not in run.stderr
    assert "What fits" in run.stdout and "Strategy summary" in run.stdout


def test_figures_are_small(run_cli, tmp_path):
    run = run_cli(STARTER, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"memory-timeline", "attention-peak", "seam-error", "precision-error"}
    for entry in manifest.values():
        content = (tmp_path / entry["file"]).read_text()
        assert len(content) <= 60_000 and " id=" not in content
        assert len(entry["alt"]) > 80


@pytest.mark.parametrize(
    "argv",
    [
        ["--tile", "4", "--overlap", "4"],
        ["--tile", "4", "--overlap", "6"],
        ["--tile", "10", "--overlap", "9"],  # int(10 * (1 - 0.9)) = 0: a zero stride
        ["--tile", "12", "--overlap", "5"],  # stride 6, row_limit 14: the tiles overrun the image
        ["--tile", "10", "--overlap", "8"],  # stride 1, row_limit 4 (a traceback before round 13)
        ["--dtypes", "float8"],
        ["--dtypes", "float64"],  # the reference: with nothing to compare, no chart
        ["--tokens", "2"],  # query chunks of tokens // 4 = 0 rows
        ["--tokens", "3"],
        ["--slice-sizes", "0"],
        ["--slice-sizes", "17"],
        ["--pcie-gbps", "0"],
        ["--steps", "0"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("memory_optimization.py: error: ")


def test_empty_dtypes_says_none_given(run_cli):
    run = run_cli(STARTER, "--dtypes", ",")
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert "--dtypes: no dtype given (choose from float32, float16, bfloat16" in run.stderr


def test_steps_stop_where_sd15s_pndm_does(run_cli):
    """SD 1.5's PNDM makes steps + 1 UNet calls up to 999 steps and raises at 1000: the starter
    prints 1000 calls at 999 and refuses 1000 (it printed 1001 calls there)."""
    run = run_cli(STARTER, "--steps", "999", "--dtypes", "float16")  # the PNDM line needs no dtype
    assert run.returncode == 0, run.stderr
    assert "SD 1.5's PNDM makes 1000 UNet calls at 999 steps" in run.stdout
    run = run_cli(STARTER, "--steps", "1000")
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert "IndexError" in run.stderr and "1001" not in run.stdout
