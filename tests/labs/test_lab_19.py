"""Lab 19 Parallel Inference Across GPUs: Ulysses and ring on simulated ranks, and their traffic."""

import functools
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from labs.exercise import Exercise, function_lines

STARTER = "code/lab-19-parallel-inference/parallel_attention.py"


def run_lab(*argv):
    """The starter's globals after a run with ``argv``."""
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    old, sys.argv = sys.argv, ["parallel_attention.py", *argv]
    try:
        return runpy.run_path(str(ROOT / STARTER), run_name="__main__")
    finally:
        sys.argv = old


@pytest.fixture(scope="module")
def lab():
    """The starter's globals after a default run (module-scoped: one run for all tests)."""
    return run_lab()


@pytest.mark.parametrize("argv", [[], ["--ranks", "8"], ["--ranks", "3", "--heads", "6", "--tokens", "30"], ["--ranks", "1"]])  # fmt: skip
def test_both_splits_equal_full_attention(argv):
    g = run_lab(*argv)
    assert g["ulysses_diff"] < 1e-12 and g["ring_diff"] < 1e-12
    assert g["ulysses_sent_bytes"] == g["ulysses_bytes"](g["T"], g["H"], g["HEAD_DIM"], g["R"])
    assert g["ring_sent_bytes"] == g["ring_bytes"](g["T"], g["H"], g["HEAD_DIM"], g["R"])


def test_merge_is_softmax_over_the_union(lab):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((5, 2, 4)) for _ in range(3))
    full, full_lse = lab["attention"](q, k, v)
    a, b = lab["attention"](q, k[:2], v[:2]), lab["attention"](q, k[2:], v[2:])
    out, lse = lab["merge"](*a, *b)
    np.testing.assert_allclose(out, full, atol=1e-14)
    np.testing.assert_allclose(lse, full_lse, atol=1e-14)
    assert np.abs((a[0] + b[0]) / 2 - full).max() > 1e-2  # averaging is not the merge


def test_all_to_all_moves_tokens_to_heads(lab):
    shards = [np.full((2, 4, 1), r, dtype=float) for r in range(2)]  # (T/R, H, d) per rank
    moved, sent = lab["all_to_all"](shards, split_axis=1, concat_axis=0)
    assert [m.shape for m in moved] == [(4, 2, 1), (4, 2, 1)]
    assert moved[1][:, 0, 0].tolist() == [0, 0, 1, 1]  # every rank's tokens, rank 1's heads
    assert sent == 4  # half of the rank's 8 elements leave it


def test_traffic_formulas_at_real_sizes(lab):
    u, g = lab["ulysses_bytes"], lab["ring_bytes"]
    flux, wan = lab["FLUX"], lab["WAN"]
    assert (flux["tokens"], flux["heads"], flux["head_dim"], flux["layers"]) == (4608, 24, 128, 57)
    assert wan["tokens"] == 75_600
    args = (flux["tokens"], flux["heads"], flux["head_dim"])
    assert u(*args, 2) == g(*args, 2)  # equal at 2 ranks
    for r in (4, 8, 16):
        assert g(*args, r) == pytest.approx(u(*args, r) * r / 2, rel=1e-9)  # ring / Ulysses = R/2
    assert u(*args, 8) < u(*args, 4) < u(*args, 2)
    assert g(*args, 2) < g(*args, 4) < g(*args, 8) < 4 * flux["tokens"] * 3072  # tends to 4 T H d


def test_schemes_latency_and_throughput(lab):
    s, steps = lab["schemes"], lab["args"].steps

    def latency(name):
        return steps * (s[name][1] + s[name][2])

    def rate(name):
        return s[name][3] / latency(name)

    one_gpu = "1 GPU, 2 calls a step"  # FluxPipeline (true CFG) and WanPipeline: two batch-1 calls
    assert latency("data parallel") == latency(one_gpu)
    assert rate("data parallel") == pytest.approx(2 * rate(one_gpu))
    assert latency("CFG-parallel") < latency("Ulysses 2") < latency("data parallel")
    # data parallel and CFG-parallel give the same images/s here (0.47): noise_pred is tiny
    assert rate("data parallel") == pytest.approx(rate("CFG-parallel"), rel=1e-3)
    assert rate("data parallel x4") > rate("CFG-parallel x Ulysses 2") > rate("Ulysses 4")


def test_ring_overlap_needs_long_blocks(lab, run_cli):
    """At assumed peak rates a rotating ring hides a block's K/V send behind its attention once
    T/R >= peak FLOP/s / link bytes/s (2,198 tokens at 989 TFLOP/s and 450 GB/s): at 2, 4 and 8 ranks
    true for Wan 2.1's video, for FLUX.1-dev at 1024 px only at 2."""
    a = lab["args"]
    flops, link = a.tflops * 1e12, a.link_gbs * 1e9
    assert lab["min_block_tokens"] == pytest.approx(flops / link)
    assert round(lab["min_block_tokens"]) == 2198
    expected = []
    for m in (lab["FLUX"], lab["WAN"]):
        width = m["heads"] * m["head_dim"]
        for r in lab["RANKS"]:
            block = m["tokens"] // r
            attend_s, send_s = 4 * block**2 * width / flops, 4 * block * width / link  # K+V bf16
            expected.append((m["name"], r, "hidden" if send_s <= attend_s else "exposed"))
    assert [v for _, _, v in expected] == ["hidden", "exposed", "exposed"] + ["hidden"] * 3
    rows = [line.split("|") for line in run_cli(STARTER).stdout.splitlines()
            if line.rstrip().endswith(("hidden", "exposed"))]  # fmt: skip
    assert [(c[0].strip(), int(c[1]), c[-1].split()[-1]) for c in rows] == expected


def test_weights_replicated_per_rank(run_cli):
    """Context parallelism replicates the weights; the starter prints Wan 2.1 14B's
    transformer from labkit's meta-device count: 14,288,491,584 parameters, 28.6 GB in bf16."""
    out = run_cli(STARTER).stdout
    assert "Wan 2.1 T2V 14B transformer 14,288,491,584 parameters, 28.6 GB in bf16" in out


def test_figure(run_cli, tmp_path):
    run = run_cli(STARTER, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"traffic-per-rank"}
    entry = manifest["traffic-per-rank"]
    content = (tmp_path / entry["file"]).read_text()
    assert len(content) <= 60_000 and " id=" not in content
    assert len(entry["alt"]) > 80 and "75,600" in entry["alt"]
    # Ulysses at 16 ranks divides neither model's heads; the caption says so for both
    assert 24 % 16 and 40 % 16 and "24 heads" in entry["caption"] and "40" in entry["caption"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--seed", "x"],
        ["--no-such-flag"],
        ["--ranks", "0"],
        ["--ranks", "5", "--tokens", "120", "--heads", "24"],
        ["--ranks", "5"],
        ["--tokens", "0"],
        ["--tokens", "100000"],
        # within each flag's own limit, but NumPy would hold a 64 GiB (or 4.3 GB) score matrix
        ["--tokens", "8192", "--heads", "128", "--head-dim", "256", "--ranks", "64"],
        ["--tokens", "8192"],
        ["--link-gbs", "0"],
        ["--tflops", "nan"],
        ["--steps", "x"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("parallel_attention.py: error: ")


def test_heads_must_divide_for_ulysses(run_cli):
    run = run_cli(STARTER, "--ranks", "5", "--tokens", "120", "--heads", "24")
    assert "Ulysses gives each rank heads/ranks whole heads" in run.stderr


# --------------------------------------------------------------------------- your turn
# ring_blanks.py is the reader's file; check_ring.py checks it against the solution
# (ring_solution.txt, off the site's pages) with labkit.blanks.check_function, blank by
# blank at every ring step. The tests run a copy of the checker beside a reader's file
# written here: filled from the solution, with one of its typical MISTAKES planted, or with
# odd input.

FOLDER = Path(__file__).resolve().parents[2] / "code/lab-19-parallel-inference"
CHECKER, BLANKS, SOLUTION = "check_ring.py", "ring_blanks.py", "ring_solution.txt"
EXERCISE = Exercise(FOLDER, CHECKER, BLANKS, SOLUTION, "ring_attention")
_mistakes, reader_file, blank_line = EXERCISE.mistakes, EXERCISE.reader_file, EXERCISE.blank_line
PAGE = FOLDER.parents[1] / "docs/labs/lab-19-parallel-inference.md"


@pytest.fixture
def check(tmp_path, monkeypatch, capsys):
    """Run a copy of the checker beside a reader's file ``source`` (in this process):
    (exit code, stdout, stderr)."""
    return functools.partial(EXERCISE.run, tmp_path, monkeypatch, capsys)


#: what each blank assigns
VARIABLES = {1: "peak", 2: "block_lse", 3: "lse_new", 4: "w_old", 5: "w_new", 6: "out"}
PASSED = "all 6 blanks match the solution on 7 cases\n"


def _fill(number, line):
    """The solution's fill with blank ``number``'s line replaced by ``line`` (its indent kept)."""
    return EXERCISE.fill_but(number, line, VARIABLES)


def test_solution_is_the_blanks_file_filled_in_line_for_line():
    """The solution's ring_attention is the reader's, except the six blank lines."""
    _, mine = function_lines(FOLDER / BLANKS, "ring_attention")
    _, theirs = function_lines(FOLDER / SOLUTION, "ring_attention")
    differ = [a.split("#")[0].strip() for a, b in zip(mine, theirs, strict=True) if a != b]
    assert differ == [f"{VARIABLES[k]} = blank({k})" for k in VARIABLES]


def test_solution_is_the_starters_merge_and_full_attention(lab):
    """The checker's solution returns what the starter's ring returns (its attention() on each
    block, folded with its merge()), bit for bit, and full attention's out and lse to float64
    rounding, on every case the checker tries: one block, two, four, unequal, wide scores,
    one head."""
    from labkit.blanks import load_function

    solution = load_function(FOLDER / SOLUTION, "ring_attention")
    cases = EXERCISE.run_in_place("--solution")["CASES"]
    for label, (query, key_blocks, value_blocks) in cases:
        out, lse = solution(query, key_blocks, value_blocks)
        ring = [
            lab["attention"](query, k, v) for k, v in zip(key_blocks, value_blocks, strict=True)
        ]
        ref, ref_lse = ring[0]
        for block in ring[1:]:
            ref, ref_lse = lab["merge"](ref, ref_lse, *block)
        assert np.array_equal(out, ref) and np.array_equal(lse, ref_lse), label
        full, full_lse = lab["attention"](query, np.concatenate(key_blocks), np.concatenate(value_blocks))  # fmt: skip
        np.testing.assert_allclose(out, full, rtol=1e-12, atol=1e-12, err_msg=label)
        np.testing.assert_allclose(lse, full_lse, rtol=1e-12, atol=1e-12, err_msg=label)
    blocks = {tuple(len(k) for k in args[1]) for _, args in cases}
    assert {(6,), (6, 6), (4, 4, 4, 4), (3, 1, 6)} <= blocks  # one, two, four, unequal
    assert any(args[0].shape[0] == args[0].shape[1] for _, args in cases)  # Tq == heads
    assert any(args[0].shape[1] == 1 for _, args in cases)  # one head


def test_the_shipped_file_says_which_blanks_to_fill(check):
    """All six, though the run stops at blank 1's placeholder; with blanks 1 to 3 written,
    the other three, and that 1 to 3 match as far as the runs got (the first ring step)."""
    code, out, err = check((FOLDER / BLANKS).read_text(encoding="utf-8"))
    lines = ", ".join(f"blank({k}) at line {blank_line(k)}" for k in VARIABLES)
    assert (code, err) == (0, "")
    assert out == f"6 of 6 blanks not filled in yet in ring_blanks.py: {lines}\n"
    code, out, _ = check(reader_file(fill=(1, 2, 3)))
    lines = ", ".join(f"blank({k}) at line {blank_line(k)}" for k in (4, 5, 6))
    assert (code, out) == (0, f"3 of 6 blanks not filled in yet in ring_blanks.py: {lines}; blanks 1, 2, 3 match the solution on every case they ran (as far as each run got: it stops at the first blank left, in ring step 1)\n")  # fmt: skip


def test_a_correct_fill_passes_and_the_solution_flag_checks_the_solution(check):
    assert check(reader_file(fill=tuple(VARIABLES))) == (0, PASSED, "")
    assert check((FOLDER / BLANKS).read_text(), "--solution")[:2] == (0, PASSED)


@pytest.mark.parametrize(
    ("number", "lines"),
    [
        (
            2,
            "log_total = np.log(total)\nblock_lse = np.transpose(peak[..., 0] + log_total[..., 0])",
        ),  # a helper
        (
            3,
            "top = np.maximum(lse, block_lse)\nlse_new = top + np.log(np.exp(lse - top) + np.exp(block_lse - top))",
        ),  # max + log(exp + exp)
        (4, "w_old = np.exp(lse - lse_new)[:, :, np.newaxis]"),
        (6, "out = w_old * out + w_new * block_out"),  # the other order of each product
    ],
)
def test_a_correct_answer_in_other_words_passes(check, number, lines):
    """A helper of the reader's (log_total, top), the max + log(exp + exp) form of logaddexp,
    another way to add the axis, another order: each passes, blank by blank at every ring
    step, to rounding."""
    assert check(_fill(number, lines)) == (0, PASSED, "")


@pytest.mark.parametrize("mistake", list(_mistakes()))
def test_each_typical_mistake_names_its_line_and_gets_its_hint(check, mistake):
    """Every typical mistake of the solution's table (the max over the wrong axis, lse as
    (heads, tokens), lse squeezed, lse without its peak, lse_a + lse_b, the max alone, a weight exp(lse)
    not divided by the new sum, a weight's sign, a weight without its last axis, outputs
    added unweighted or averaged), written in the reader's file with the other blanks right:
    exit 1, the blank, the reader's line and that mistake's hint."""
    number, _, _, hint = _mistakes()[mistake]
    code, out, err = check(reader_file(fill=tuple(VARIABLES), mistake=mistake))
    assert code == 1 and err == "", out + err
    assert out.startswith(f"blank {number} differs from the solution (query "), out
    assert f"  ring_blanks.py line {blank_line(number)} (blank {number}): {VARIABLES[number]} = " in out  # fmt: skip
    assert out.endswith(f"hint: {hint}\n"), out


def test_a_wrong_early_blank_is_caught_while_later_ones_are_empty(check):
    """The max over the wrong axis (blank 1) and a transposed lse (blank 2) differ at the first
    step: each is caught with every later blank still a placeholder. Adding the lse's (blank
    3) is caught at the first step too (-inf + x is -inf), with blanks 4 to 6 empty."""
    for fill, mistake, number in [((1,), "peak-wrong-axis", 1), ((1, 2), "lse-heads-first", 2), ((1, 2, 3), "lse-added", 3)]:  # fmt: skip
        code, out, _ = check(reader_file(fill=fill, mistake=mistake))
        assert code == 1 and out.startswith(f"blank {number} differs from the solution"), out
        assert out.endswith(f"hint: {_mistakes()[mistake][3]}\n"), out


def test_a_squeezed_lse_is_caught_on_one_head(check):
    """`(peak + np.log(total)).squeeze().T` is right while a rank attends two heads or more; with
    one head it drops the head axis too, and the checker's one-head case names blank 2."""
    code, out, _ = check(_fill(2, "block_lse = (peak + np.log(total)).squeeze().T"))
    assert code == 1 and out.startswith("blank 2 differs from the solution (query (3, 1, 4), "), out
    assert "  solution: block_lse = float64 array of shape (3, 1)" in out, out


def test_a_blank_that_changes_lse_in_place_is_named(check):
    """`np.logaddexp(lse, block_lse, out=lse)` gives lse_new the right value but overwrites lse,
    which w_old reads next: the checker names that line of blank 3, not the given line that
    first assigned lse, and says the given lines set lse (it is no argument of ring_attention)."""
    code, out, _ = check(_fill(3, "lse_new = np.logaddexp(lse, block_lse, out=lse)"))
    assert code == 1 and out.startswith("blank 4 differs from the solution"), out
    assert f"  ring_blanks.py line {blank_line(3)} (blank 3): lse_new = np.logaddexp(lse, block_lse, out=lse)\n" in out  # fmt: skip
    assert "hint: blank 3's lines change lse, which the given lines set, in place" in out, out


@pytest.mark.parametrize(
    "lines", ["np.subtract(scores, peak, out=scores)", "s = scores\ns -= peak"]
)
def test_blank_1_changing_scores_in_place_is_named_not_the_given_line(check, lines):
    """A blank 1 that subtracts its peak from scores in place (out=scores, or through a second
    name) makes blank 2's right line give another block_lse: the checker names blank 1's line
    that writes scores, not the given line that computed scores as the solution does."""
    fill = "peak = scores.max(axis=-1, keepdims=True)\n" + lines
    code, out, _ = check(_fill(1, fill))
    assert code == 1 and out.startswith("blank 2 differs from the solution"), out
    line = blank_line(1) + fill.count("\n")
    assert f"  ring_blanks.py line {line} (blank 1): {fill.splitlines()[-1]}\n" in out, out
    assert "hint: blank 1's lines change scores, which the given lines set, in place" in out, out


def test_a_later_blank_that_overwrites_lse_new_in_place_is_named(check):
    """Blank 5 writing its exponent into lse_new (out=lse_new) gives w_new the right value, but
    `lse = lse_new` then carries the overwritten array out: the checker names blank 5 and
    lse_new, not the return line with the hint about empty lines."""
    fill = "w_new = np.exp(np.subtract(block_lse, lse_new, out=lse_new))[..., None]"
    code, out, _ = check(_fill(5, fill))
    assert code == 1 and out.startswith("your ring_attention() returns another value"), out
    assert f"  ring_blanks.py line {blank_line(5)} (blank 5): {fill}\n" in out, out
    assert "hint: blank 5's lines change lse_new, which blank 3 assigns, in place" in out, out


@pytest.mark.parametrize(
    ("number", "lines", "variable", "owner"),
    [
        (5, "w_old = np.exp(block_lse - lse_new)[..., None]", "w_old", 4),  # w_new meant
        (5, "w_new = np.exp(block_lse - lse_new)[..., None]\nlse_new = lse", "lse_new", 3),
        (4, "block_lse = block_lse + 1\nw_old = np.exp(lse - lse_new)[..., None]", "block_lse", 2),
    ],
)
def test_a_blank_that_assigns_another_blanks_variable_gets_a_hint(check, number, lines, variable, owner):  # fmt: skip
    """A blank's line that assigns another blank's variable (w_old written in blank 5, where
    blank 5 gives w_new; lse_new or block_lse rebound after their own blank): the checker
    names that line and says whose variable it is, and which is this blank's."""
    code, out, _ = check(_fill(number, lines))
    assert code == 1 and out.startswith(f"blank {number} differs from the solution"), out
    at = blank_line(number) + next(i for i, x in enumerate(lines.splitlines()) if x.startswith(f"{variable} ="))  # fmt: skip
    assert f"  ring_blanks.py line {at} (blank {number}): {variable} = " in out, out
    assert out.endswith(f"hint: blank {number}'s lines assign {variable}, blank {owner}'s variable (blank {number}'s is {VARIABLES[number]}): the lines after them read yours, not blank {owner}'s\n"), out  # fmt: skip


def test_a_return_in_a_blank_is_named_as_the_cause(check):
    """A return in blank 4 ends ring_attention() after the first ring step: the checker names
    that line and says the return ends the function there."""
    code, out, _ = check(_fill(4, "w_old = np.exp(lse - lse_new)[..., None]\nreturn out, lse"))
    assert code == 1 and out.startswith("your ring_attention() returns another value"), out
    assert f"  ring_blanks.py line {blank_line(4) + 1} (blank 4): return out, lse\n" in out, out
    assert out.endswith("hint: this return in blank 4 ends ring_attention() there, before the lines after the blank run: a blank gives its variable to the lines after it\n"), out  # fmt: skip


def test_a_file_that_is_not_utf8_is_one_line_naming_it(check, monkeypatch):
    """A reader's file that is not UTF-8 text (saved as Latin-1: its "·" is byte 0xb7): one
    line, exit 2, naming ring_blanks.py."""
    latin1 = lambda path, text, encoding=None: path.write_bytes(text.encode("latin-1"))  # noqa: E731
    monkeypatch.setattr(Path, "write_text", latin1)
    code, out, err = check(reader_file(fill=tuple(VARIABLES)))
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith("check_ring.py: error: ring_blanks.py: UnicodeDecodeError: "), err


def test_an_unweighted_sum_is_caught_at_the_second_ring_step(check):
    """At the first step out is 0, so out + block_out matches: the checker names step 2."""
    code, out, _ = check(reader_file(fill=tuple(VARIABLES), mistake="out-unweighted"))
    assert code == 1 and "K/V blocks of 6, 6 tokens, ring step 2 of 2):" in out, out
    assert "  first difference: entry (0, 0, 0), " in out and " entries differ)" in out, out


#: (the reader's line in blank 3, what the one-line error says about it)
ODD = {
    "syntax error": ("lse_new = np.logaddexp(lse, block_lse", "syntax error: '(' was never closed"),
    "an exception": (
        "lse_new = np.logaddexp(lse, lse_b)",
        "NameError: name 'lse_b' is not defined",
    ),
    "a list": ("lse_new = np.logaddexp(lse, block_lse).tolist()", "lse_new is a list"),
    "exit()": ("lse_new = exit()", "SystemExit: exit() ends the whole check"),
    "Ctrl-C": (
        "lse_new = np.logaddexp(lse, block_lse)\nraise KeyboardInterrupt",
        "KeyboardInterrupt: interrupted (Ctrl-C) there",
    ),
    "yield": (
        "lse_new = np.logaddexp(lse, block_lse)\nyield lse_new",
        "yield makes ring_attention() a generator",
    ),
    "GeneratorExit": (
        "lse_new = np.logaddexp(lse, block_lse)\nraise GeneratorExit",
        "GeneratorExit",
    ),
}


@pytest.mark.parametrize("case", list(ODD))
def test_odd_input_is_one_line_exit_2_naming_the_readers_line(check, case):
    """A syntax error, an exception in the reader's line, a blank of another type (a list
    where an array goes), exit(), Ctrl-C on a loop that does not end, a yield, even a raised
    GeneratorExit: one line on stderr, exit 2, naming the file and the line (and its blank,
    once it runs)."""
    line, said = ODD[case]
    code, out, err = check(_fill(3, line))
    assert code == 2 and out == "", out
    at = blank_line(3) + (case in ("Ctrl-C", "yield", "GeneratorExit"))
    where = f"check_ring.py: error: ring_blanks.py line {at}"
    assert err.count("\n") == 1 and err.startswith(where), err
    assert said in err and ("(blank 3)" in err) == (case != "syntax error"), err


def test_a_complex_blank_gets_the_dtype_hint_and_nothing_on_stderr(check):
    """A complex peak is named by its dtype, with no NumPy cast warning from the checker."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning the checker's comparison raises fails here
        code, out, err = check(_fill(1, "peak = scores.max(axis=-1, keepdims=True) + 0j"))
    assert (code, err) == (1, ""), out + err
    assert out.endswith("hint: the dtype: yours is complex128, the solution's float64\n"), out


def test_the_solution_is_no_page_nav_entry_or_search_result(built_site):
    """ring_solution.txt is no page of the site (the build copies it as a plain file, as it
    does the other labs' solutions): no HTML page, nav entry or search location names it;
    the reader's file and the checker are served as files (``page: false``), not pages, and the guide prints the
    checker's command. (The guide shows the starter's attention and merge, the same lines,
    before the exercise, folded as the answer: test_the_guide_folds_the_answer.)"""
    docs = json.loads((built_site / "search" / "search_index.json").read_text())["docs"]
    locations = {doc["location"].split("#")[0] for doc in docs}
    assert not any("ring_solution" in location for location in locations)
    assert not [p for p in built_site.rglob("*.html") if "ring_solution" in str(p)]
    for page in ("ring_blanks", "check_ring"):
        assert (built_site / "code/lab-19-parallel-inference" / f"{page}.py").is_file(), page
    guide = PAGE.read_text().split("\n---\n", 1)[1]  # the page below its front matter
    assert "ring_solution" not in guide and "python3 code/lab-19-parallel-inference/check_ring.py" in guide  # fmt: skip
    built = (built_site / "labs" / "lab-19-parallel-inference" / "index.html").read_text()
    assert not re.findall(r'<a href="[^"]*ring_solution[^"]*"', built)
    assert "ring_solution" not in (built_site / "sitemap.xml").read_text()


def test_the_guide_folds_the_answer_above_the_exercise():
    """The starter's attention and merge, the six blanks' lines, are on the guide above "Your
    turn" only inside collapsed blocks titled as the answer, not as open code blocks; "Your
    turn" closes "Run it" and shows no solution line."""
    lines = PAGE.read_text().splitlines()
    turn = next(i for i, line in enumerate(lines) if line.startswith("### Your turn"))
    run_it = next(i for i, line in enumerate(lines) if line == "## Run it")
    after = next(i for i, line in enumerate(lines) if i > run_it and line.startswith("## "))
    assert run_it < turn < after
    for section in ("parallel_attention.py:attention", "parallel_attention.py:ring"):
        include = next(i for i, line in enumerate(lines) if section in line)
        assert include < turn and lines[include].startswith("    "), section
        opener = next(line for line in reversed(lines[:include]) if line and not line.startswith(" "))  # fmt: skip
        assert opener.startswith("??? ") and "answer" in opener.lower(), opener
    _, mine = function_lines(FOLDER / BLANKS, "ring_attention")
    _, theirs = function_lines(FOLDER / SOLUTION, "ring_attention")
    answers = [b.split("= ", 1)[1] for a, b in zip(mine, theirs, strict=True) if a != b]
    assert len(answers) == 6
    assert not [a for a in answers if a in "\n".join(lines[turn:after])]
