"""Lab 20 Image-to-Image and Inpainting: strength, add_noise, and inpainting two ways."""

import functools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from labs.exercise import Exercise, function_lines

STARTER = "code/lab-20-img2img-and-inpainting/img2img_inpainting.py"


@pytest.fixture(scope="module")
def lab():
    """The starter's globals after a default run (module-scoped: one run for all tests)."""
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    argv, sys.argv = sys.argv, ["img2img_inpainting.py"]
    try:
        return runpy.run_path(str(ROOT / STARTER), run_name="__main__")
    finally:
        sys.argv = argv


def test_get_timesteps_keeps_the_last_int_n_strength(lab):
    scheduler, get_timesteps = lab["scheduler"], lab["get_timesteps"]
    for n in (4, 10, 25, 50):
        scheduler.set_timesteps(n)
        for s in (0.0, 0.1, 0.35, 0.5, 0.99, 1.0):
            timesteps, count = get_timesteps(scheduler, n, s)
            assert count == len(timesteps) == int(n * s)
            assert list(timesteps) == list(scheduler.timesteps[n - int(n * s) :])
    assert lab["calls"][0.35, 10] == 3 and lab["calls"][0.5, 50] == 25
    # StableDiffusionImg2ImgPipeline.get_timesteps also calls set_begin_index on a scheduler that
    # has it: DDIM has none
    assert not hasattr(scheduler, "set_begin_index")


def test_img2img_starts_from_add_noise_at_the_first_timestep(lab):
    scheduler = lab["scheduler"]
    scheduler.set_timesteps(50)
    assert int(scheduler.timesteps[0]) == lab["t_first"] == 981
    assert lab["leak"] == pytest.approx(np.sqrt(scheduler.alphas_cumprod[981]))
    assert 0.06 < lab["leak_999"] < lab["leak"] < 0.08
    # strength 0 runs nothing: the input latents come back unchanged
    out = lab["img2img"](lab["init_latents"], 0.0, 50, 0)
    assert np.array_equal(out[0], lab["init_latents"][0])


def test_flux_first_sigma_is_shifted(lab):
    # time_shift of sigma 0.6 with mu 1.15 (FLUX.1-dev's max_shift at 4096 tokens)
    assert lab["mu"] == pytest.approx(1.15)
    assert lab["sigma_first"] == pytest.approx(np.exp(1.15) / (np.exp(1.15) + 1 / 0.6 - 1))
    assert 0.82 < lab["sigma_first"] < 0.83


def test_strength_trades_faithfulness(lab):
    """The shares the page quotes, from the default run of 256 samples (one standard error
    at most 3.1 points): 100, 89, 65, 18 and 2% at strength 0.2 to 1.0."""
    assert lab["B"] == 256 and f"{50 / np.sqrt(lab['B']):.1f}" == "3.1"
    share = {s: round(100 * lab["results"][s][1]) for s in lab["strengths"]}
    assert share == {0.2: 100, 0.4: 89, 0.6: 65, 0.8: 18, 1.0: 2}
    assert lab["results"][0.2][1] == 1.0  # "all samples", not 99.6% rounded up


def test_strength_one_leaks_the_image_in_the_toy(lab):
    """At strength 1.0 more samples land on the input's nearest training image than from
    text-to-image with the same noise (2% against 0% by default), for other seeds too."""
    assert round(100 * lab["results"][1.0][1]) == 2 and lab["t2i_share"] == 0.0
    scheduler, unet, nearest = lab["scheduler"], lab["unet"], lab["training_set"].nearest
    target = lab["init_nearest"][0]
    for seed in (1, 2, 3):
        i2i = lab["img2img"](lab["init_latents"], 1.0, 50, seed)
        scheduler.set_timesteps(50)
        pure = np.random.default_rng(seed).standard_normal(i2i.shape) * scheduler.init_noise_sigma
        for t in scheduler.timesteps:
            pure = scheduler.step(unet(pure, t), t, pure).prev_sample
        hits = (np.sum(nearest(i2i)[0] == target), np.sum(nearest(pure)[0] == target))
        assert hits[0] >= 4 and hits[0] > 2 * hits[1], (seed, hits)


def test_float32_denoiser_lands_where_float64_does(lab):
    """FiniteSet32 (float32) and labkit's FiniteSet (float64) give the same posterior mean
    to float32 precision, and the same training image for every sample of a default-seed
    img2img run. (The page's "about half float64's CPU time" was measured, 0.10-0.13 s
    against 0.21-0.30 s for five runs; timing is not asserted: a loaded machine would make
    it flaky.)"""
    from labkit import ExactDenoiser
    from labkit.images import FiniteSet

    latents = np.random.default_rng(5).standard_normal((64, 4, 4, 4))
    for alpha, sigma in ((0.9, 0.4), (0.3, 0.95)):
        exact = lab["training_set"].posterior_mean(latents, alpha, sigma)
        fast = lab["unet"].mixture.posterior_mean(latents, alpha, sigma)
        np.testing.assert_allclose(fast, exact, atol=1e-4)
    assert isinstance(lab["training_set"], FiniteSet)
    f64 = ExactDenoiser(lab["training_set"], lab["scheduler"].alphas_cumprod, "epsilon")
    for strength in (0.2, 0.4, 0.6, 0.8, 1.0):
        a = lab["img2img"](lab["init_latents"], strength, 50, 0)
        b = lab["img2img"](lab["init_latents"], strength, 50, 0, denoiser=f64)
        assert np.array_equal(lab["training_set"].nearest(a)[0], lab["training_set"].nearest(b)[0])


def test_blending_is_less_consistent_than_conditioning(lab):
    """49% of the 256 blended samples are consistent, 100% of the conditioned ones; the
    input's known (left) half is plain background: its shape lies in the masked half."""
    assert lab["consistent_share"](lab["conditioned"]) == 1.0
    assert round(100 * lab["consistent_share"](lab["blended"])) == 49
    assert len(lab["consistent"]) == 30
    # blending keeps the known latents exactly; the conditioned path only nearly
    keep = lab["keep"]
    assert np.array_equal(lab["blended"][:, :, keep], np.broadcast_to(lab["image_latents"][:, :, keep], lab["blended"][:, :, keep].shape))  # fmt: skip
    assert lab["known_drift"] < 0.1
    image = lab["data"].images[lab["j"]]  # (3, 32, 32): the shape only in columns 16-31
    assert np.all(image[:, :, :16] == -0.8) and np.any(image[:, :, 16:] != -0.8)
    # "nearly all the rest are a right half from a picture whose left half differs":
    # 125 of the 131 inconsistent samples are within 0.05 RMS of another picture's right half
    blended, training = lab["blended"], lab["training_latents"]
    d = np.stack([lab["rms_over"](blended, training[k : k + 1], ~keep) for k in range(256)], 1)
    others = np.setdiff1d(np.arange(256), lab["consistent"])
    inconsistent = d[:, lab["consistent"]].min(1) >= 0.05
    from_another = d[:, others].min(1) < 0.05
    assert (int(inconsistent.sum()), int((inconsistent & from_another).sum())) == (131, 125)


def test_reference_editing_numbers(lab):
    assert lab["N"] == 4096 and lab["L0"] == 4096 + 512 and lab["L1"] == 2 * 4096 + 512
    assert lab["side"] == 264


def test_figures(run_cli, tmp_path):
    run = run_cli(STARTER, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"img2img", "inpainting", "calls"}
    for entry in manifest.values():
        assert (tmp_path / entry["file"]).stat().st_size <= 60_000
        assert len(entry["alt"]) > 80


@pytest.mark.parametrize(
    "argv",
    [
        ["--seed", "x"],
        ["--no-such-flag"],
        ["--strength", "1.5"],
        ["--strength", "-0.1"],
        ["--strength", "nan"],
        ["--steps", "0"],
        ["--steps", "1001"],
        ["--num-samples", "0"],
        ["--num-samples", "1025"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("img2img_inpainting.py: error: ")


# --------------------------------------------------------------------------- your turn
# strength_blanks.py is the reader's file; check_strength.py checks it against the solution
# (strength_solution.txt, off the site's pages) with labkit.blanks.check_function. The tests
# run a copy of the checker beside a reader's file written here: filled from the solution,
# with one of its typical MISTAKES planted, or with odd input.

FOLDER = Path(__file__).resolve().parents[2] / "code/lab-20-img2img-and-inpainting"
CHECKER, BLANKS, SOLUTION = "check_strength.py", "strength_blanks.py", "strength_solution.txt"
VARIABLES = {1: "init_timestep", 2: "t_start", 3: "timesteps"}  # what each blank assigns
EXERCISE = Exercise(FOLDER, CHECKER, BLANKS, SOLUTION, "get_timesteps")
_mistakes, reader_file, blank_line = EXERCISE.mistakes, EXERCISE.reader_file, EXERCISE.blank_line
runpy_checker = EXERCISE.run_in_place


@pytest.fixture
def check(tmp_path, monkeypatch, capsys):
    """Run a copy of the checker beside a reader's file ``source`` (in this process):
    (exit code, stdout, stderr)."""
    return functools.partial(EXERCISE.run, tmp_path, monkeypatch, capsys)


def test_solution_is_the_blanks_file_filled_in_line_for_line():
    """The solution's get_timesteps is the reader's, except the three blank lines."""
    _, mine = function_lines(FOLDER / BLANKS, "get_timesteps")
    _, theirs = function_lines(FOLDER / SOLUTION, "get_timesteps")
    differ = [a.split("#")[0].strip() for a, b in zip(mine, theirs, strict=True) if a != b]
    assert differ == [f"{VARIABLES[k]} = blank({k})" for k in (1, 2, 3)]


def test_solution_is_the_starters_get_timesteps(lab):
    """The checker's solution returns what the starter's get_timesteps (shown on the page)
    does, on every case the checker tries: the verify test holds both to diffusers'."""
    from labkit.blanks import load_function

    solution = load_function(FOLDER / SOLUTION, "get_timesteps")
    cases = runpy_checker("--solution")["CASES"]
    for label, args in cases:
        mine, theirs = solution(*args), lab["get_timesteps"](*args)
        assert np.array_equal(mine[0], theirs[0]) and mine[1] == theirs[1], label
    assert {(args[1], args[2]) for _, args in cases} >= {(10, 1.0), (10, 0.05), (10, 0.1), (1, 1.0), (1, 0.5)}  # fmt: skip


def test_the_shipped_file_says_which_blanks_to_fill(check):
    """All three, though the run stops at blank 1's placeholder; with blank 1 written, the
    other two and that blank 1 matches."""
    code, out, err = check((FOLDER / BLANKS).read_text(encoding="utf-8"))
    lines = ", ".join(f"blank({k}) at line {blank_line(k)}" for k in (1, 2, 3))
    assert (code, err) == (0, "")
    assert out == f"3 of 3 blanks not filled in yet in strength_blanks.py: {lines}\n"
    code, out, _ = check(reader_file(fill=(1,)))
    lines = ", ".join(f"blank({k}) at line {blank_line(k)}" for k in (2, 3))
    assert (code, out) == (0, f"2 of 3 blanks not filled in yet in strength_blanks.py: {lines}; blank 1 matches the solution on every case it ran\n")  # fmt: skip


def test_a_correct_answer_with_a_helper_variable_passes(check):
    """A helper of the reader's (steps = n * strength) is no variable of the solution's: no
    traceback, a pass."""
    two = "steps = num_inference_steps * strength\n    init_timestep = min(int(steps), num_inference_steps)"  # fmt: skip
    source = reader_file(fill=(2, 3)).replace("init_timestep = blank(1)  # noqa: F841", two)
    assert check(source) == (0, "all 3 blanks match the solution on 22 cases\n", "")


def test_a_correct_fill_passes_and_the_solution_flag_checks_the_solution(check):
    passed = "all 3 blanks match the solution on 22 cases\n"
    assert check(reader_file(fill=(1, 2, 3))) == (0, passed, "")
    assert check((FOLDER / BLANKS).read_text(), "--solution")[:2] == (0, passed)


@pytest.mark.parametrize("mistake", list(_mistakes()))
def test_each_typical_mistake_names_its_line_and_gets_its_hint(check, mistake):
    """Every typical mistake of the solution's table (int vs round, strength's complement,
    t_start as the steps kept or one off, the slice without scheduler.order or from the
    wrong end), written in the reader's file with the other blanks right: exit 1, the blank,
    the reader's line and that mistake's hint."""
    number, _, _, hint = _mistakes()[mistake]
    code, out, err = check(reader_file(fill=(1, 2, 3), mistake=mistake))
    assert code == 1 and err == "", out + err
    assert out.startswith(f"blank {number} differs from the solution (scheduler=")
    assert f"  strength_blanks.py line {blank_line(number)} (blank {number}): {VARIABLES[number]} = " in out  # fmt: skip
    assert out.endswith(f"hint: {hint}\n"), out


def test_the_rounding_hint_is_not_given_to_a_line_that_rounds(check):
    """Entries 1 off from a line that rounds already (timesteps scaled by 1.001, then
    .round()) get no advice to round, only the count of entries 1 off and which way (above
    the solution's); the same entries from a line that does not round keep the advice,
    which says which rounding: up, where the solution does not."""
    right = "timesteps = scheduler.timesteps[t_start * scheduler.order :]"
    source = reader_file(fill=(1, 2, 3))
    rounds = "timesteps = (scheduler.timesteps[t_start * scheduler.order :] * 1.001).round().astype(scheduler.timesteps.dtype)"  # fmt: skip
    code, out, _ = check(source.replace(right, rounds))
    assert code == 1 and out.startswith("blank 3 differs from the solution"), out
    assert out.endswith("hint: 1 of 6 entries are 1 above the solution's\n"), out
    cuts = "timesteps = scheduler.timesteps[t_start * scheduler.order :] + (scheduler.timesteps[t_start * scheduler.order :] > 500)"  # fmt: skip
    code, out, _ = check(source.replace(right, cuts))
    assert code == 1 and out.endswith("hint: 1 of 6 entries are 1 above the solution's: yours rounds up where the solution does not (np.ceil or + 0.5, where it has int(), .astype or np.round)\n"), out  # fmt: skip


def test_the_order_factor_is_caught_on_the_second_order_grid(check):
    code, out, _ = check(reader_file(fill=(1, 2, 3), mistake="no-order"))
    assert code == 1 and "(scheduler=second-order (order 2, 19 entries), num_inference_steps=10, strength=0.6)" in out, out  # fmt: skip


def test_a_wrong_blank_1_is_caught_before_blank_2_is_written(check):
    code, out, _ = check(reader_file(fill=(1,), mistake="round"))
    assert code == 1 and out.startswith("blank 1 differs from the solution"), out
    assert "yours:    init_timestep = 4\n  solution: init_timestep = 3\n" in out


#: (the reader's line in blank 2, what the one-line error says about it)
ODD = {
    "syntax error": (
        "t_start = max(num_inference_steps - init_timestep, 0",
        "syntax error: '(' was never closed",
    ),
    "a float": ("t_start = num_inference_steps * (1 - strength)", "t_start is a float, 4.0"),
    "an exception": (
        "t_start = num_inference_steps - init_timestep + offset",
        "NameError: name 'offset' is not defined",
    ),
}


@pytest.mark.parametrize("case", list(ODD))
def test_odd_input_is_one_line_exit_2_naming_the_readers_line(check, case):
    """A syntax error, a blank of another type (a float where the count of skipped steps
    goes), an exception in the reader's line: one line on stderr, exit 2, naming the file
    and the line (and its blank, once it runs)."""
    line, said = ODD[case]
    source = reader_file(fill=(1, 3)).replace("t_start = blank(2)", line)
    code, out, err = check(source)
    assert code == 2 and out == "", out
    where = f"check_strength.py: error: strength_blanks.py line {blank_line(2)}"
    assert err.count("\n") == 1 and err.startswith(where), err
    assert said in err and ("(blank 2)" in err) == (case != "syntax error"), err


def test_the_solution_is_no_page_nav_entry_or_search_result(built_site):
    """strength_solution.txt is no page of the site: no nav entry or search location names
    it; the reader's file and the checker are served as files (``page: false``), not pages, and the guide prints
    the checker's command. (The guide shows the starter's get_timesteps, the same lines,
    before the exercise, folded as the answer: test_the_guide_folds_the_answer.)"""
    docs = json.loads((built_site / "search" / "search_index.json").read_text())["docs"]
    locations = {doc["location"].split("#")[0] for doc in docs}
    assert not any("strength_solution" in location for location in locations)
    # (an exercise's blanks file and checker: served as .py files, with no notebook page)
    for page in ("strength_blanks", "check_strength"):
        assert (built_site / "code/lab-20-img2img-and-inpainting" / f"{page}.py").is_file(), page
    page = (FOLDER.parents[1] / "docs/labs/lab-20-img2img-and-inpainting.md").read_text()
    guide = page.split("\n---\n", 1)[1]  # the page below its front matter (the registry)
    assert "strength_solution" not in guide and "python3 code/lab-20-img2img-and-inpainting/check_strength.py" in guide  # fmt: skip
    built = (built_site / "labs" / "lab-20-img2img-and-inpainting" / "index.html").read_text()
    assert not re.findall(r'<a href="[^"]*strength_solution[^"]*"', built)


def test_the_guide_folds_the_answer_above_the_exercise():
    """The starter's get_timesteps, the three blanks' lines, is on the guide above "Your turn"
    only inside a collapsed block titled as the answer, not as an open code block."""
    page = (FOLDER.parents[1] / "docs/labs/lab-20-img2img-and-inpainting.md").read_text()
    lines = page.splitlines()
    include = next(i for i, line in enumerate(lines) if "img2img_inpainting.py:timesteps" in line)
    assert include < next(i for i, line in enumerate(lines) if line.startswith("### Your turn"))
    assert lines[include].startswith("    "), "the include is not inside a ??? block"
    opener = next(line for line in reversed(lines[:include]) if line and not line.startswith(" "))
    assert opener.startswith("??? ") and "answer" in opener.lower(), opener


def test_a_blank_that_rebinds_a_given_name_is_named_not_the_blank_after_it(check):
    """Blank 1 rebinding num_inference_steps (to the steps that run) makes blank 2's own,
    right line give another t_start: the report names blank 1's line, where the change is,
    and says the lines after it see the rebound value; a rebind that changes nothing after
    it still passes (test_lab_03's T = float(T))."""
    rebind = "num_inference_steps = min(int(num_inference_steps * strength), num_inference_steps)"  # fmt: skip
    source = reader_file(fill=(1, 2, 3)).replace(
        "    init_timestep = min(int(num_inference_steps * strength), num_inference_steps)",
        f"    {rebind}\n    init_timestep = num_inference_steps",
    )
    code, out, err = check(source)
    assert (code, err) == (1, ""), (code, out, err)
    assert out.startswith("blank 1 differs from the solution (") and "(blank 2)" not in out, out
    assert f"  strength_blanks.py line {blank_line(1)} (blank 1): {rebind}\n" in out, out
    assert "  yours:    num_inference_steps = 6\n  solution: num_inference_steps = 10\n" in out, out  # fmt: skip
    assert "the lines after it see yours" in out and "t_start in blank 2" in out, out


def test_a_blank_that_writes_the_scheduler_is_checked_against_the_real_solution(check):
    """A blank 3 that cuts scheduler.timesteps in place returns the right entries: each run
    gets its own copy of the case, so the solution's run never sees the cut grid (it used
    to, and the report quoted the cut grid's entries as the solution's, with a false hint)."""
    cut = "scheduler.timesteps = scheduler.timesteps[t_start * scheduler.order :]\n    timesteps = scheduler.timesteps"  # fmt: skip
    source = reader_file(fill=(1, 2, 3)).replace(
        "    timesteps = scheduler.timesteps[t_start * scheduler.order :]", f"    {cut}"
    )
    code, out, err = check(source)
    assert (code, out, err) == (0, "all 3 blanks match the solution on 22 cases\n", ""), out


# --------------------------------------------------------------------------- rounding advice
# labkit.blanks' advice when the reader's value is off by a rounding says which one (int32 for
# int64, a float left unrounded or cut, entries rounded down or up, a slice one entry long or
# short): in how_it_differs itself, and in the checkers of labs 03 and 20, which give it.

GRID = np.array([901, 801, 701, 601, 501, 401, 301, 201, 101, 1], dtype=np.int64)

#: (yours, the solution's, the hint)
# fmt: off
ROUNDINGS = {
    "int32 for int64": (GRID.astype(np.int32), GRID, "the dtype: yours is int32, the solution's int64, the values the same: cast with .astype(np.int64)"),
    "a float, rounded": (GRID - 0.3, GRID, "the dtype: yours is float64, the solution's int64, the values the solution's once rounded: np.round, then .astype(np.int64)"),
    "a float, cut": (GRID + 0.7, GRID, "the dtype: yours is float64, the solution's int64, the values the solution's once cut toward 0: .astype(np.int64) alone, without rounding"),
    "a float, whole": (GRID * 1.0, GRID, "the dtype: yours is float64, the solution's int64, the values the same here: .astype(np.int64) casts them, cutting toward 0 (round first where the solution rounds)"),
    "rounded down": (GRID - (GRID > 500), GRID, "5 of 10 entries are 1 below the solution's: yours rounds down where the solution rounds (int() and .astype cut toward 0: np.round first, then cast)"),
    "rounded up": (GRID + (GRID > 500), GRID, "5 of 10 entries are 1 above the solution's: yours rounds up where the solution does not (np.ceil or + 0.5, where it has int(), .astype or np.round)"),
    "both ways": (GRID + (GRID > 500) - (GRID < 300), GRID, "8 of 10 entries are 1 off: rounding (round before .astype; int() floors)"),
    "one more, first": (np.r_[1001, GRID], GRID, "the length: yours has 11 entries, the solution's 10: one more, at the start (a slice or range off by one)"),
    "one more, last": (np.r_[GRID, 0], GRID, "the length: yours has 11 entries, the solution's 10: one more, at the end (a slice or range off by one)"),
    "one fewer, first": (GRID[1:], GRID, "the length: yours has 9 entries, the solution's 10: the solution's first entry missing (a slice or range off by one)"),
    "one fewer, last": (GRID[:-1], GRID, "the length: yours has 9 entries, the solution's 10: the solution's last entry missing (a slice or range off by one)"),
    "another length": (GRID[2:], GRID, "the length: yours has 8 entries, the solution's 10"),
}
# fmt: on


@pytest.mark.parametrize("case", list(ROUNDINGS))
def test_how_it_differs_says_which_rounding(case):
    """Each rounding gets advice that names it: the dtype with what the values are (the same,
    the solution's once rounded, once cut toward 0), entries 1 below or 1 above the
    solution's (rounded down where it rounds, or up where it does not), a length one entry
    long or short at the end where it differs."""
    from labkit.blanks import how_it_differs

    yours, theirs, hint = ROUNDINGS[case]
    assert how_it_differs(yours, theirs) == hint


LAB_03 = Exercise(FOLDER.parent / "lab-03-scheduler-reading", "check_spacing.py", "spacing_blanks.py", "spacing_solution.txt", "set_timesteps")  # fmt: skip
LAB_20 = EXERCISE
SLICE = "timesteps = scheduler.timesteps[t_start * scheduler.order :]"

#: (exercise, blank, the reader's line, how the checker's hint ends)
# fmt: off
CHECKERS = {
    "lab 03, int32": (LAB_03, 1, "timesteps = (np.arange(0, n)[::-1] * (T // n) + steps_offset).astype(np.int32)", "the values the same: cast with .astype(np.int64)"),
    "lab 03, ceil": (LAB_03, 3, "timesteps = np.ceil(np.linspace(0, T - 1, n))[::-1].astype(np.int64)", "2 of 7 entries are 1 above the solution's: yours rounds up where the solution does not (np.ceil or + 0.5, where it has int(), .astype or np.round)"),
    "lab 03, a range one long": (LAB_03, 1, "timesteps = (np.arange(0, n + 1) * (T // n)).round()[::-1].astype(np.int64) + steps_offset", "one more, at the start (a slice or range off by one)"),
    "lab 20, int32": (LAB_20, 3, SLICE.replace(":]", ':].astype("int32")'), "the values the same: cast with .astype(np.int64)"),
    "lab 20, a slice one early": (LAB_20, 3, SLICE.replace("order :]", "order - 1 :]"), "the length: yours has 7 entries, the solution's 6: one more, at the start (a slice or range off by one)"),
    "lab 20, a slice one late": (LAB_20, 3, SLICE.replace("order :]", "order + 1 :]"), "the length: yours has 5 entries, the solution's 6: the solution's first entry missing (a slice or range off by one)"),
    "lab 20, cut down": (LAB_20, 3, SLICE.replace(":]", ":] - (scheduler.timesteps[t_start * scheduler.order :] > 500)"), "1 of 6 entries are 1 below the solution's: yours rounds down where the solution rounds (int() and .astype cut toward 0: np.round first, then cast)"),
}
# fmt: on


@pytest.mark.parametrize("case", list(CHECKERS))
def test_the_checkers_of_labs_03_and_20_give_that_advice(tmp_path, monkeypatch, capsys, case):
    """Labs 03 and 20 check with labkit.blanks: a blank off by a rounding no typical mistake
    of theirs gives is named with its line and that advice, exit 1."""
    exercise, number, line, hint = CHECKERS[case]
    source = exercise.fill_but(number, line, (1, 2, 3))
    code, out, err = exercise.run(tmp_path, monkeypatch, capsys, source)
    assert (code, err) == (1, ""), out + err
    assert out.startswith(f"blank {number} differs from the solution"), out
    assert f" (blank {number}): {line}\n" in out and out.endswith(f"{hint}\n"), out
