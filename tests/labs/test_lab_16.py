"""Lab 16 Attention Kernels and Offload: tiled and ring attention, offload schedules."""

import functools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from labs.exercise import Exercise, function_lines

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
    # model offload: on before the first step, back after the last: one round trip per pipe(...) call
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
    # once per pipe(...) call, however many images it makes (not "per image")
    assert lines["model offload"][-4:] == ["1", "per", "pipe", "call"]


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


# --------------------------------------------------------------------------- your turn
# softmax_blanks.py is the reader's file; check_softmax.py checks it against the solution
# (softmax_solution.txt, off the site's pages) with labkit.blanks.check_function, blank by
# blank at every key/value block. The tests run a copy of the checker beside a reader's file
# written here: filled from the solution, with one of its typical MISTAKES planted, or with
# odd input.

FOLDER = Path(__file__).resolve().parents[2] / "code/lab-16-attention-kernels-and-offload"
CHECKER, BLANKS, SOLUTION = "check_softmax.py", "softmax_blanks.py", "softmax_solution.txt"
EXERCISE = Exercise(FOLDER, CHECKER, BLANKS, SOLUTION, "tiled_attention")
_mistakes, reader_file, blank_line = EXERCISE.mistakes, EXERCISE.reader_file, EXERCISE.blank_line
runpy_checker = EXERCISE.run_in_place


@pytest.fixture
def check(tmp_path, monkeypatch, capsys):
    """Run a copy of the checker beside a reader's file ``source`` (in this process):
    (exit code, stdout, stderr)."""
    return functools.partial(EXERCISE.run, tmp_path, monkeypatch, capsys)


#: what each blank assigns
VARIABLES = {1: "m_new", 2: "correction", 3: "p", 4: "l", 5: "acc", 6: "out"}
PASSED = "all 6 blanks match the solution on 7 cases\n"


def _fill(number, line):
    """The solution's fill with blank ``number``'s line replaced by ``line`` (its indent kept)."""
    return EXERCISE.fill_but(number, line, VARIABLES)


def test_solution_is_the_blanks_file_filled_in_line_for_line():
    """The solution's tiled_attention is the reader's, except the six blank lines."""
    _, mine = function_lines(FOLDER / BLANKS, "tiled_attention")
    _, theirs = function_lines(FOLDER / SOLUTION, "tiled_attention")
    differ = [a.split("#")[0].strip() for a, b in zip(mine, theirs, strict=True) if a != b]
    assert differ == [f"{VARIABLES[k]} = blank({k})" for k in VARIABLES]


def test_solution_is_the_starters_tiled_attention_and_naive_attention(lab):
    """The checker's solution returns what the starter's tiled_attention (shown on the page)
    returns, and naive attention's out and lse to float32 rounding, on every case the checker
    tries: one key per block, all keys in one block, a shorter last block, wide scores."""
    from labkit.blanks import load_function

    solution = load_function(FOLDER / SOLUTION, "tiled_attention")
    cases = runpy_checker("--solution")["CASES"]
    for label, args in cases:
        (out, lse), (ref, ref_lse) = solution(*args), lab["tiled_attention"](*args)
        assert out.dtype == lse.dtype == np.float32, label
        assert np.array_equal(out, ref) and np.array_equal(lse, ref_lse), label
        naive, naive_lse = lab["naive_attention"](*args[:3])
        np.testing.assert_allclose(out, naive, rtol=1e-5, atol=1e-6, err_msg=label)
        np.testing.assert_allclose(lse, naive_lse, rtol=1e-5, atol=1e-5, err_msg=label)
    sizes = {(args[1].shape[2], args[3]) for _, args in cases}
    assert {(8, 1), (8, 8), (10, 4)} <= sizes  # one key a block, one block, a short last one


def test_the_shipped_file_says_which_blanks_to_fill(check):
    """All six, though the run stops at blank 1's placeholder; with blanks 1 and 2 written,
    the other four, and that 1 and 2 match as far as the runs got (the first block)."""
    code, out, err = check((FOLDER / BLANKS).read_text(encoding="utf-8"))
    lines = ", ".join(f"blank({k}) at line {blank_line(k)}" for k in VARIABLES)
    assert (code, err) == (0, "")
    assert out == f"6 of 6 blanks not filled in yet in softmax_blanks.py: {lines}\n"
    code, out, _ = check(reader_file(fill=(1, 2)))
    lines = ", ".join(f"blank({k}) at line {blank_line(k)}" for k in (3, 4, 5, 6))
    assert (code, out) == (0, f"4 of 6 blanks not filled in yet in softmax_blanks.py: {lines}; blanks 1, 2 match the solution on every case they ran (as far as each run got: it stops at the first blank left, in key/value block 1)\n")  # fmt: skip


def test_a_correct_fill_passes_and_the_solution_flag_checks_the_solution(check):
    assert check(reader_file(fill=tuple(VARIABLES))) == (0, PASSED, "")
    assert check((FOLDER / BLANKS).read_text(), "--solution")[:2] == (0, PASSED)


@pytest.mark.parametrize(
    ("number", "lines"),
    [
        (3, "z = s - m_new\np = np.exp(z)"),  # a helper variable, two lines
        (4, "l = correction * l + np.sum(p, axis=3, keepdims=True)  # noqa: E741"),
        (5, "acc *= correction\nacc += np.einsum('bhqk,bhkd->bhqd', p, v)"),  # in place
        (3, "p = np.exp(s) / np.exp(m_new)"),  # entries that cancel in acc: 1e-4 apart
        (5, "acc = (acc * correction + p.astype(np.float64) @ v).astype(np.float32)"),
    ],
)
def test_a_correct_answer_in_other_words_passes(check, number, lines):
    """A helper of the reader's (z), another order of the same sum, an in-place update:
    each passes, blank by blank at every key/value block, to float32 rounding."""
    assert check(_fill(number, lines)) == (0, PASSED, "")


@pytest.mark.parametrize("mistake", list(_mistakes()))
def test_each_typical_mistake_names_its_line_and_gets_its_hint(check, mistake):
    """Every typical mistake of the solution's table (the max over the wrong axis or this
    block alone, the correction's sign, p under the old max, l or acc not rescaled, acc
    divided by l per block or its old terms divided by l, out not divided), written in the reader's file with the other
    blanks right: exit 1, the blank, the reader's line and that mistake's hint."""
    number, _, _, hint = _mistakes()[mistake]
    code, out, err = check(reader_file(fill=tuple(VARIABLES), mistake=mistake))
    assert code == 1 and err == "", out + err
    assert out.startswith(f"blank {number} differs from the solution (query "), out
    assert f"  softmax_blanks.py line {blank_line(number)} (blank {number}): {VARIABLES[number]} = " in out  # fmt: skip
    assert out.endswith(f"hint: {hint}\n"), out


@pytest.mark.parametrize(
    ("number", "line"),
    [
        (6, "out = acc / l * np.float32(1.00001)"),  # out off by 1e-5
        (3, "p = np.exp(s - m_new) * np.float32(1.000009)"),
        (2, "correction = np.exp(m - m_new) * np.float32(1.000005)"),
    ],
)
def test_a_line_off_by_a_tiny_factor_fails_at_its_own_blank(check, number, line):
    """Floats match to about 1e-6 of the array's largest entry, not 1e-5 entrywise: a blank
    off by a factor of 1 + 5e-6 fails, at its own line, not at a later (right) one."""
    code, out, _ = check(_fill(number, line))
    assert code == 1 and out.startswith(f"blank {number} differs from the solution"), out
    assert f"softmax_blanks.py line {blank_line(number)} (blank {number}): {line}" in out, out


def test_a_difference_an_earlier_blank_let_through_points_back_at_it(check):
    """A correction off by 1 + 1e-6, within rounding of its own entries, shows in acc's
    cancelling entries (blank 5, a right line): the hint names blank 2 (and l, blank 4, which
    it scaled), which matched only to rounding."""
    code, out, _ = check(_fill(2, "correction = np.exp(m - m_new) * np.float32(1.000001)"))
    assert code == 1 and out.startswith("blank 5 differs from the solution"), out
    assert out.endswith("hint: no typical mistake gives this value; blanks 2, 4 matched the solution only to float rounding on this case, not exactly: if this line is right, a small factor or term there is the difference\n"), out  # fmt: skip


@pytest.mark.parametrize(
    ("lines", "number"),
    [
        ({6: "out = acc / np.sqrt(l)"}, 6),  # out 0.31 where the solution's is 0.13
        ({4: "l = l * correction**2 + p.sum(axis=-1, keepdims=True)  # noqa: E741"}, 4),
    ],
)
def test_a_big_difference_is_not_put_down_to_a_line_that_matched_to_rounding(check, lines, number):
    """acc by einsum (right, rounded differently) and a grossly wrong later line: no hint that
    blank 5's rounding explains it (it cannot: the difference is 20 % and more, and l does
    not depend on acc)."""
    einsum = "acc = acc * correction + np.einsum('bhqk,bhkd->bhqd', p, v)"
    source = reader_file(fill=tuple(k for k in VARIABLES if k not in (5, *lines)))
    for k, line in {5: einsum, **lines}.items():
        old = next(x for x in source.splitlines() if f"= blank({k})" in x)
        source = source.replace(old, old[: len(old) - len(old.lstrip())] + line)
    code, out, _ = check(source)
    assert code == 1 and out.startswith(f"blank {number} differs from the solution"), out
    assert "only to float rounding" not in out, out


def test_the_divide_per_block_hint_holds_for_the_blocks_own_term_divided(check):
    """acc * correction + p @ v / l divides only this block's term: the hint does not say
    it divides the earlier blocks' terms again."""
    code, out, _ = check(_fill(5, "acc = acc * correction + p @ v / l"))
    hint = _mistakes()["acc-divided-per-block"][3]
    assert code == 1 and out.endswith(f"hint: {hint}\n"), out
    assert "earlier blocks' terms again" not in out, out


def test_the_old_acc_divided_by_l_gets_the_unnormalised_hint(check):
    """acc / l * correction + p @ v (the earlier blocks' sum divided by this block's l, then
    rescaled): exit 1 at blank 5's line, with the hint that acc stays unnormalised in the
    loop and is divided by l once, after the last block."""
    code, out, err = check(_fill(5, "acc = acc / l * correction + p @ v"))
    assert (code, err) == (1, "") and out.startswith("blank 5 differs from the solution"), out
    assert f"softmax_blanks.py line {blank_line(5)} (blank 5): acc = acc / l * correction" in out
    assert out.endswith(f"hint: {_mistakes()['acc-old-divided'][3]}\n"), out
    assert "acc stays unnormalised inside the loop" in out, out


def test_a_missing_rescale_is_caught_at_the_second_block(check):
    """Without the rescale, block 1 matches (acc and l start at 0): the checker names block 2."""
    code, out, _ = check(reader_file(fill=tuple(VARIABLES), mistake="acc-not-rescaled"))
    assert code == 1 and "block_size=4, key/value block 2 of 2):" in out, out
    assert "  first difference: entry (0, " in out and " entries differ)" in out, out


def test_a_wrong_blank_1_is_caught_before_blank_2_is_written(check):
    """The max over the wrong axis differs at the first block: caught with blank 2 empty.
    The max of this block alone equals the right max there, so with blank 2 empty the run
    cannot tell: the checker says how far it got instead of a plain "matches"."""
    code, out, _ = check(reader_file(fill=(1,), mistake="max-wrong-axis"))
    assert code == 1 and out.startswith("blank 1 differs from the solution"), out
    assert "key/value block 1 of 2" in out and "hint: the axis" in out, out
    code, out, _ = check(reader_file(fill=(1,), mistake="max-block-only"))
    assert code == 0 and out.endswith("; blank 1 matches the solution on every case it ran (as far as each run got: it stops at the first blank left, in key/value block 1)\n"), out  # fmt: skip
    code, out, _ = check(reader_file(fill=(1, 2, 3, 4, 5, 6), mistake="max-block-only"))
    assert code == 1 and "key/value block 2 of 2" in out, out


#: (the reader's line in blank 3, what the one-line error says about it)
ODD = {
    "syntax error": ("p = np.exp(s - m_new", "syntax error: '(' was never closed"),
    "an exception": ("p = np.exp(s - m_max)", "NameError: name 'm_max' is not defined"),
    "a list": ("p = np.exp(s - m_new).tolist()", "p is a list"),
    "exit()": ("p = exit()", "SystemExit: exit() ends the whole check"),
    "Ctrl-C": (
        "p = np.exp(s - m_new)\nraise KeyboardInterrupt",
        "KeyboardInterrupt: interrupted (Ctrl-C) there",
    ),
}


@pytest.mark.parametrize("case", list(ODD))
def test_odd_input_is_one_line_exit_2_naming_the_readers_line(check, case):
    """A syntax error, an exception in the reader's line, a blank of another type (a list
    where an array goes), exit(), Ctrl-C on a loop that does not end: one line on stderr,
    exit 2, naming the file and the line (and its blank, once it runs)."""
    line, said = ODD[case]
    source = _fill(3, line)
    code, out, err = check(source)
    assert code == 2 and out == "", out
    at = blank_line(3) + (1 if case == "Ctrl-C" else 0)
    where = f"check_softmax.py: error: softmax_blanks.py line {at}"
    assert err.count("\n") == 1 and err.startswith(where), err
    assert said in err and ("(blank 3)" in err) == (case != "syntax error"), err


def test_the_solution_is_no_page_nav_entry_or_search_result(built_site):
    """softmax_solution.txt is no page of the site: no nav entry or search location names
    it; the reader's file and the checker are served as files (``page: false``), not pages, and the guide prints
    the checker's command. (The guide shows the starter's tiled_attention, the same lines,
    before the exercise, folded as the answer: test_the_guide_folds_the_answer.)"""
    docs = json.loads((built_site / "search" / "search_index.json").read_text())["docs"]
    locations = {doc["location"].split("#")[0] for doc in docs}
    assert not any("softmax_solution" in location for location in locations)
    # (an exercise's blanks file and checker: served as .py files, with no notebook page)
    for page in ("softmax_blanks", "check_softmax"):
        assert (
            built_site / "code/lab-16-attention-kernels-and-offload" / f"{page}.py"
        ).is_file(), page
    page = (FOLDER.parents[1] / "docs/labs/lab-16-attention-kernels-and-offload.md").read_text()
    guide = page.split("\n---\n", 1)[1]  # the page below its front matter (the registry)
    assert "softmax_solution" not in guide and "python3 code/lab-16-attention-kernels-and-offload/check_softmax.py" in guide  # fmt: skip
    built = (built_site / "labs" / "lab-16-attention-kernels-and-offload" / "index.html").read_text()  # fmt: skip
    assert not re.findall(r'<a href="[^"]*softmax_solution[^"]*"', built)


def test_the_guide_folds_the_answer_above_the_exercise():
    """The starter's tiled_attention, the six blanks' lines, is on the guide above "Your
    turn" only inside a collapsed block titled as the answer, not as an open code block."""
    page = (FOLDER.parents[1] / "docs/labs/lab-16-attention-kernels-and-offload.md").read_text()
    lines = page.splitlines()
    include = next(i for i, line in enumerate(lines) if "attention_offload.py:attention" in line)
    assert include < next(i for i, line in enumerate(lines) if line.startswith("### Your turn"))
    assert lines[include].startswith("    "), "the include is not inside a ??? block"
    opener = next(line for line in reversed(lines[:include]) if line and not line.startswith(" "))
    assert opener.startswith("??? ") and "answer" in opener.lower(), opener
