"""Lab 03 Scheduler Reading: spacings, input scaling, prediction types, the mismatch trap."""

import functools
import json
import re

import numpy as np
import pytest

from infralens_docs.registry import ROOT
from labs.exercise import Exercise, function_lines

STARTER = "code/lab-03-scheduler-reading/scheduler_reading.py"


def test_spacings_differ_where_the_page_says(run_lab):
    out = run_lab(STARTER, "--steps", "10")["__stdout__"]
    assert "leading (steps_offset=1): timesteps [901" in out  # never reaches 999
    assert "trailing (steps_offset=0): timesteps [999" in out
    assert "linspace (steps_offset=0): timesteps [999" in out


def test_scale_model_input_brings_euler_back_to_unit_variance(run_lab):
    g = run_lab(STARTER)
    euler = g["euler"]
    assert euler.init_noise_sigma > 10  # sigma_max of SD's schedule, ~14.6
    latents = g["noise"] * euler.init_noise_sigma
    scaled = euler.scale_model_input(latents, euler.timesteps[0])
    assert abs(scaled.std() - 1.0) < 0.05
    ddim = g["ddim"]
    np.testing.assert_array_equal(ddim.scale_model_input(latents, ddim.timesteps[0]), latents)


def test_linear_schedule_tab_says_how_much_larger_sigma_max_gets(run_lab):
    """The `--beta-schedule linear` tab: the timestep grids are unchanged and Euler's sigma_max and
    `init_noise_sigma` are about eleven times larger (157.407 against 14.615: 10.8, not ten)."""
    runs = {b: run_lab(STARTER, "--beta-schedule", b, "--num-samples", "100") for b in ("scaled_linear", "linear")}  # fmt: skip
    ratio = (
        runs["linear"]["euler"].init_noise_sigma / runs["scaled_linear"]["euler"].init_noise_sigma
    )
    np.testing.assert_array_equal(runs["linear"]["ddim"].timesteps, runs["scaled_linear"]["ddim"].timesteps)  # fmt: skip
    page = (ROOT / "docs/labs/lab-03-scheduler-reading.md").read_text(encoding="utf-8")
    tab = page.split('=== "`--beta-schedule linear`"', 1)[1].split("<!--", 1)[0]
    assert round(ratio) == 11 and "about eleven times larger" in tab, (ratio, tab)


def test_three_prediction_types_give_one_update(run_lab):
    g = run_lab(STARTER)
    assert g["spread"] < 1e-10


def test_mismatch_breaks_sampling_and_match_does_not(run_lab):
    g = run_lab(STARTER, "--steps", "20")
    rows = {}
    for line in g["__stdout__"].splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[2].endswith("%"):
            rows[(parts[0], parts[1])] = float(parts[2].rstrip("%")) / 100
    assert rows[("v_prediction", "v_prediction")] > 0.95
    assert rows[("epsilon", "epsilon")] > 0.95
    assert rows[("v_prediction", "epsilon")] < 0.2
    assert rows[("epsilon", "sample")] < 0.5


@pytest.mark.parametrize("steps", ["10", "30"])
def test_sigma_grids_figure_shows_where_each_grid_starts_and_where_it_crowds(
    run_lab, tmp_path, steps
):
    """The figure sigma-grids: on SD's scaled_linear betas, trailing and linspace start at
    sigma_max (t = 999); leading with steps_offset=1 (SDXL's Euler config) starts below it and Karras shares leading's
    end points; trailing never visits the lowest noise; Karras puts more steps below sigma 0.5
    than any linear-in-t grid. The alt text carries the same numbers."""
    g = run_lab(STARTER, "--steps", steps, "--figures", str(tmp_path))
    lead, trail, lin, karras = (g["sigma_axis"][k] for k in g["sigma_axis"])
    ab = g["alphas_cumprod_"]
    train_sigmas = np.sqrt((1 - ab) / ab)  # (1000,)
    assert g["sigma_max"] == pytest.approx(train_sigmas[-1]) and g["sigma_max"] > 14
    n = int(steps)
    assert all(len(s) == n and np.all(np.diff(s) < 0) for s in (lead, trail, lin, karras))
    assert trail[0] == pytest.approx(train_sigmas[999]) and lin[0] == pytest.approx(trail[0])
    assert lead[0] == pytest.approx(train_sigmas[(n - 1) * (1000 // n) + 1])  # t = 901 at 10
    assert lead[0] < 0.9 * g["sigma_max"]
    assert karras[0] == pytest.approx(lead[0]) and karras[-1] == pytest.approx(lead[-1])
    assert lin[-1] == pytest.approx(train_sigmas[0]) and lead[-1] == pytest.approx(train_sigmas[1])
    trailing_last_t = round(1000 - (n - 1) * 1000 / n) - 1  # 99 at 10 steps, 32 at 30
    assert trail[-1] == pytest.approx(train_sigmas[trailing_last_t]) and trail[-1] > 4 * lead[-1]
    # the last grid built is Karras on leading: init_noise_sigma = sqrt(sigma_0^2 + 1), 8.45 at 10
    assert g["grid_euler"].init_noise_sigma == pytest.approx((karras[0] ** 2 + 1) ** 0.5)
    low = g["low"]
    assert low[3] > max(low[:3]) and np.median(karras) < np.median(lead)
    figure = json.loads((tmp_path / "figures.json").read_text())["sigma-grids"]
    assert (tmp_path / figure["file"]).is_file()
    assert f"sigma_max = {g['sigma_max']:.2f}" in figure["alt"]
    assert f"steps_offset=1 starts at {lead[0]:.2f}" in figure["alt"]
    assert f"Karras {low[3]}." in figure["alt"]


def test_sigma_grid_labels_name_the_family_that_ships_leading_euler(run_lab):
    """The sigma-grids series: `leading` with steps_offset=1 is SDXL's shipped Euler config;
    SD 1.5 ships PNDM, and Euler.from_config on it gets linspace, so no label says SD 1.5."""
    labels = list(run_lab(STARTER)["sigma_axis"])
    assert labels == ["leading (SDXL's Euler)", "trailing", "linspace", "Karras on leading"]


def test_scheduler_page_quotes_lab_11s_five_step_row(run_lab):
    """docs/handbook/scheduler.md (this lab's section) quotes Lab 11's 5-step on_mode and
    spread for DDPM, DDIM and Euler; they must be what Lab 11 prints."""
    out = run_lab(
        "code/lab-11-scheduler-loop-reading/scheduler_loop.py",
        "--steps", "5", "--schedulers", "ddpm,ddim,euler",
    )["__stdout__"]  # fmt: skip
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[1] == "5":
            rows[parts[0]] = (parts[3], parts[5])
    page = " ".join((ROOT / "docs" / "handbook" / "scheduler.md").read_text().split())
    quoted = re.search(
        r"`on_mode`(?: \([^)]*\))? ([\d.]+%) for DDPM, ([\d.]+%) for DDIM and ([\d.]+%) for "
        r"Euler.*?\(`spread`[^)]*?([\d.]+) and ([\d.]+)\)",
        page,
    )
    assert quoted is not None
    assert quoted.groups() == (
        rows["ddpm"][0], rows["ddim"][0], rows["euler"][0], rows["ddpm"][1], rows["ddim"][1],
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv", [["--steps", "0"], ["--steps", "1001"], ["--beta-schedule", "karras"]], ids=" ".join
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("scheduler_reading.py: error: ")


# --------------------------------------------------------------------------- your turn
# spacing_blanks.py is the reader's file; check_spacing.py checks it against the solution
# (spacing_solution.txt, off the site's pages) with labkit.blanks.check_function. The tests
# run a copy of the checker beside a reader's file written here: filled from the solution,
# with one of its typical MISTAKES planted, or with odd input.

FOLDER = ROOT / "code/lab-03-scheduler-reading"
CHECKER, BLANKS, SOLUTION = "check_spacing.py", "spacing_blanks.py", "spacing_solution.txt"
EXERCISE = Exercise(FOLDER, CHECKER, BLANKS, SOLUTION, "set_timesteps")
_mistakes, reader_file, blank_line = EXERCISE.mistakes, EXERCISE.reader_file, EXERCISE.blank_line


@pytest.fixture
def check(tmp_path, monkeypatch, capsys):
    """Run a copy of the checker beside a reader's file ``source`` (in this process):
    (exit code, stdout, stderr)."""
    return functools.partial(EXERCISE.run, tmp_path, monkeypatch, capsys)


def test_solution_is_the_blanks_file_filled_in_line_for_line():
    """The solution's set_timesteps is the reader's, except the three blank lines."""
    _, mine = function_lines(FOLDER / BLANKS, "set_timesteps")
    _, theirs = function_lines(FOLDER / SOLUTION, "set_timesteps")
    differ = [(a, b) for a, b in zip(mine, theirs, strict=True) if a != b]
    assert [a.strip() for a, _ in differ] == [f"timesteps = blank({k})" for k in (1, 2, 3)]


def test_the_shipped_file_says_which_blanks_to_fill(check):
    code, out, err = check((FOLDER / BLANKS).read_text(encoding="utf-8"))
    lines = ", ".join(f"blank({k}) at line {blank_line(k)}" for k in (1, 2, 3))
    assert (code, err) == (0, "")
    assert out == f"3 of 3 blanks not filled in yet in spacing_blanks.py: {lines}\n"


def test_a_correct_fill_passes_and_the_solution_flag_checks_the_solution(check):
    assert check(reader_file(fill=(1, 2, 3))) == (0, "all 3 blanks match the solution on 60 cases\n", "")  # fmt: skip
    assert check((FOLDER / BLANKS).read_text(), "--solution")[:2] == (0, "all 3 blanks match the solution on 60 cases\n")  # fmt: skip


@pytest.mark.parametrize("mistake", list(_mistakes()))
def test_each_typical_mistake_names_its_line_and_gets_its_hint(check, mistake):
    """Every typical mistake of the solution's table, written in the reader's file with the
    other blanks right: exit 1, the blank, the reader's line and that mistake's hint."""
    number, _, _, hint = _mistakes()[mistake]
    code, out, err = check(reader_file(fill=(1, 2, 3), mistake=mistake))
    assert code == 1 and err == "", out + err
    assert out.startswith(f"blank {number} differs from the solution (timestep_spacing=")
    assert f"  spacing_blanks.py line {blank_line(number)} (blank {number}): timesteps = " in out
    assert out.endswith(f"hint: {hint}\n"), out


def test_a_wrong_blank_is_caught_while_the_others_are_unfilled(check):
    code, out, _ = check(reader_file(fill=(2,), mistake="trailing-floor"))
    assert code == 1 and out.startswith("blank 2 differs from the solution"), out


def test_a_mistake_outside_the_table_gets_a_hint_from_the_values(check):
    """An offset of 2 on leading, a mistake no table entry makes: the hint says every entry is +2 off."""
    source = reader_file(fill=(1, 2, 3)).replace("astype(np.int64) + steps_offset", "astype(np.int64) + steps_offset + 2")  # fmt: skip
    code, out, _ = check(source)
    assert code == 1 and "hint: every entry is +2 off: a missing or extra term" in out, out


#: (the reader's line in blank 1, what the one-line error says about it)
ODD = {
    "syntax error": ("timesteps = np.arange(0, n) * (T // n) +", "syntax error: invalid syntax"),
    "a list": ("timesteps = list(range(T - 1, -1, -(T // n)))", "timesteps is a list, [999, 899"),
    "an exception": (
        "timesteps = np.arange(n) * stride",
        "NameError: name 'stride' is not defined",
    ),
}


@pytest.mark.parametrize("case", list(ODD))
def test_odd_input_is_one_line_exit_2_naming_the_readers_line(check, case):
    """A syntax error, a blank of another type (a list), an exception in the reader's line:
    one line on stderr, exit 2, naming the file and the line (and its blank, once it runs)."""
    line, said = ODD[case]
    code, out, err = check(reader_file(fill=(2, 3)).replace("timesteps = blank(1)", line))
    assert code == 2 and out == "", out
    where = f"check_spacing.py: error: spacing_blanks.py line {blank_line(1)}"
    assert err.count("\n") == 1 and err.startswith(where), err
    assert said in err and ("(blank 1)" in err) == (case != "syntax error"), err


def test_floats_where_int64_goes_get_the_dtype_hint(check):
    source = reader_file(fill=(2, 3)).replace(
        "timesteps = blank(1)", "timesteps = np.arange(n)[::-1] * (T // n) + steps_offset + 0.0"
    )
    code, out, _ = check(source)
    assert code == 1 and "hint: the dtype: yours is float64, the solution's int64" in out, out


def test_the_solution_is_no_page_nav_entry_or_search_result(built_site):
    """spacing_solution.txt is no page of the site: no nav entry or search location names it,
    and no page's searchable text holds its three filled-in lines as it spells them (the
    guide's collapsed depth note, in the search index, shows labkit's DDIM spacing, the same
    computations with labkit's names, and says so); the reader's file and the checker are
    served as files (``page: false``), not pages, and the guide prints the checker's command."""
    import html

    _, mine = function_lines(FOLDER / BLANKS, "set_timesteps")
    _, theirs = function_lines(FOLDER / SOLUTION, "set_timesteps")
    filled = [b.strip() for a, b in zip(mine, theirs, strict=True) if a != b]
    docs = json.loads((built_site / "search" / "search_index.json").read_text())["docs"]
    locations = {doc["location"].split("#")[0] for doc in docs}
    assert not any("spacing_solution" in location for location in locations)
    # (an exercise's blanks file and checker: served as .py files, with no notebook page)
    for page in ("spacing_blanks", "check_spacing"):
        assert (built_site / "code/lab-03-scheduler-reading" / f"{page}.py").is_file(), page
    text = html.unescape(" ".join(doc["text"] + doc["title"] for doc in docs))
    assert len(filled) == 3 and not [line for line in filled if line in " ".join(text.split())]
    guide = (built_site / "labs" / "lab-03-scheduler-reading" / "index.html").read_text()
    assert "python3 code/lab-03-scheduler-reading/check_spacing.py" in guide
    nav = re.findall(r'<a href="[^"]*spacing_solution[^"]*"', guide)
    assert nav == [] and "spacing_solution.txt</a>" not in guide


def _fill(number, line):
    """The reader's file with the other blanks right and ``line`` (one or more lines, 8
    spaces in) in place of blank ``number``."""
    return reader_file(fill={1, 2, 3} - {number}).replace(f"timesteps = blank({number})", line)


def test_a_correct_two_line_answer_with_a_helper_variable_passes(check):
    """diffusers' own spelling, a helper step_ratio then timesteps: no traceback, a pass; a
    wrong helper is caught by the line that uses it."""
    right = "step_ratio = T // n\n        timesteps = (np.arange(0, n) * step_ratio).round()[::-1].astype(np.int64) + steps_offset"  # fmt: skip
    assert check(_fill(1, right)) == (0, "all 3 blanks match the solution on 60 cases\n", "")
    code, out, err = check(_fill(1, right.replace("T // n", "T / n")))
    assert (code, err) == (1, ""), out + err
    assert f"line {blank_line(1) + 1} (blank 1): timesteps = " in out, out


#: the reader's blank 1 -> what the one-line error says
STOPS = {
    "raise KeyboardInterrupt": "KeyboardInterrupt: interrupted (Ctrl-C) there: a loop of yours that does not end?",
    "raise SystemExit": "SystemExit: exit() ends the whole check: set_timesteps() must return its value",
}  # fmt: skip


@pytest.mark.parametrize("line", list(STOPS))
def test_ctrl_c_or_exit_in_a_blank_is_one_line_exit_2(check, line):
    """Ctrl-C on a loop of the reader's that does not end (raised here at the blank's line, as
    Ctrl-C would be), or exit(): one line naming the reader's line, exit 2, no traceback."""
    code, out, err = check(_fill(1, line))
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    where = f"check_spacing.py: error: spacing_blanks.py line {blank_line(1)} (blank 1)"
    assert err.startswith(f"{where}: {STOPS[line]}"), err


def test_a_blank_line_below_an_empty_line_gets_a_hint_not_blanks_matching(check):
    source = _fill(2, "\n        timesteps = np.round(np.arange(T, 0, -T / n)).astype(np.int64)")
    code, out, _ = check(source)
    assert code == 1 and "its blanks all matching" not in out, out
    assert "hint: a blank's lines run from its # BLANK comment to the first empty line" in out, out


def test_one_entry_gets_no_every_entry_hint(check):
    """linspace counted down from T - 1 differs only at 1 step ([999] against diffusers' [0]):
    the hint says so, not "every entry is +999 off"."""
    from labkit.blanks import how_it_differs

    assert how_it_differs(np.array([999]), np.array([0])) == ""
    code, out, _ = check(_fill(3, "timesteps = np.linspace(T - 1, 0, n).round().astype(np.int64)"))
    assert code == 1 and "num_inference_steps=1," in out and "every entry" not in out, out
    assert out.endswith(f"hint: {_mistakes()['linspace-from-top'][3]}\n"), out


def test_int32_is_not_the_int64_the_blanks_ask_for(check):
    code, out, _ = check(_fill(1, "timesteps = (np.arange(0, n)[::-1] * (T // n) + steps_offset).astype(np.int32)"))  # fmt: skip
    assert code == 1 and "hint: the dtype: yours is int32, the solution's int64" in out, out


#: a line built from the formula: (blank, the line, the case it fails, its MISTAKES key)
FORMULA = {
    "trailing": (2, "timesteps = np.linspace(T, 0, n, endpoint=False).round().astype(np.int64) - 1", "num_inference_steps=61,", "trailing-linspace"),
    "linspace": (3, "timesteps = np.round(np.arange(n - 1, -1, -1) * (T - 1) / max(n - 1, 1)).astype(np.int64)", "num_inference_steps=27,", "linspace-formula"),
    "trailing, ties rounded up": (2, "timesteps = (np.arange(T, 0, -T / n) + 0.5).astype(np.int64) - 1", "num_inference_steps=16,", "trailing-half-up"),
    "trailing, 1 taken before rounding": (2, "timesteps = np.round(np.arange(T, 0, -T / n) - 1).astype(np.int64)", "num_inference_steps=16,", "trailing-minus-one-first"),
}  # fmt: skip


@pytest.mark.parametrize("spacing", list(FORMULA))
def test_a_line_from_the_formula_fails_where_diffusers_floats_part_from_it(check, spacing):
    """trailing with np.linspace(endpoint=False) (n entries at every n) and linspace from the
    exact formula pass every step count but 61 (trailing: diffusers has 62) and 27 (linspace:
    diffusers' middle timestep is 499, the formula's 500); trailing with ties rounded up or 1
    taken before np.round passes all but 16 (np.round sends 937.5 and 812.5 to the even
    integer): the checker tries all three."""
    number, line, case, key = FORMULA[spacing]
    code, out, _ = check(_fill(number, line))
    assert code == 1 and case in out and out.endswith(f"hint: {_mistakes()[key][3]}\n"), out
    assert "first difference: entry 13, yours 500, the solution's 499" in out or number == 2, out


#: blank -> its line with 1000 (or 999) written in for T
WRITTEN_IN = {
    1: "timesteps = np.arange(0, n)[::-1] * (1000 // n) + steps_offset",
    2: "timesteps = np.round(np.arange(1000, 0, -1000 / n)).astype(np.int64) - 1",
    3: "timesteps = np.linspace(0, 999, n).round()[::-1].astype(np.int64)",
}


@pytest.mark.parametrize("number", list(WRITTEN_IN))
def test_a_1000_written_in_for_num_train_timesteps_is_caught(check, number):
    code, out, _ = check(_fill(number, WRITTEN_IN[number]))
    assert code == 1 and "num_train_timesteps=500" in out, out


def test_the_leading_off_by_one_hint_quotes_the_solutions_numbers():
    """The leading-from-one hint's figures are the solution's: 901 at 10 steps with offset 1,
    1001 with the mistake (and at 1000 steps offset 1 leading does reach T = 1000)."""
    from labkit.blanks import load_function

    solution = load_function(FOLDER / SOLUTION, "set_timesteps")
    hint = _mistakes()["leading-from-one"][3]
    assert "never T" not in hint and "901 at 10 steps with offset 1, not 1001" in hint
    assert solution(10, "leading", 1).max() == 901 and solution(1000, "leading", 1).max() == 1000


def test_the_docstring_says_trailing_gives_one_more_at_61():
    """The set_timesteps docstring (reader's and solution's): n timesteps, one more for
    trailing at a few n, 62 at 61 steps, the last -1, as the solution returns."""
    from labkit.blanks import load_function

    for path in (FOLDER / BLANKS, FOLDER / SOLUTION):
        doc = " ".join(load_function(path, "set_timesteps").__doc__.split())
        assert "(n,)" not in doc and "62 at 61 steps, the last -1" in doc, path.name
    out = load_function(FOLDER / SOLUTION, "set_timesteps")(61, "trailing", 0)
    assert len(out) == 62 and out[-1] == -1


#: a right answer that rebinds a given name, in the blank it is written in
REBOUND = {
    2: "T = float(T)\n        timesteps = np.round(np.arange(T, 0, -T / n)).astype(np.int64) - 1",
    3: "T = T - 1\n        timesteps = np.linspace(0, T, n).round()[::-1].astype(np.int64)",
}


@pytest.mark.parametrize("number", list(REBOUND))
def test_a_right_answer_that_rebinds_a_given_name_passes(check, number):
    """A given name rebound before a right line (T = float(T) or T = T - 1) is no "T is a
    float" error and no "blank differs": it is named only if what follows then differs."""
    assert check(_fill(number, REBOUND[number])) == (0, "all 3 blanks match the solution on 60 cases\n", "")  # fmt: skip


@pytest.mark.parametrize("second", ["timesteps -= steps_offset"])
def test_the_report_names_the_last_line_that_assigns_the_blanks_variable(check, second):
    """A blank written in two lines whose second is wrong (timesteps -= steps_offset): the
    report quotes that line, the last that assigns timesteps, not the right first one."""
    two = f"timesteps = (np.arange(0, n) * (T // n)).round()[::-1].astype(np.int64)\n        {second}"  # fmt: skip
    code, out, _ = check(_fill(1, two))
    assert code == 1 and f"  spacing_blanks.py line {blank_line(1) + 1} (blank 1): {second}\n" in out, out  # fmt: skip


def test_a_helper_defined_outside_the_function_gets_its_reason(check):
    """A helper def or a constant at the top of the reader's file, used in a blank, is a
    NameError in the check (only the file's imports and set_timesteps() run): one line,
    exit 2, naming the reader's line and saying to define it inside set_timesteps()."""
    stride = "timesteps = (np.arange(0, n) * stride(T, n)).round()[::-1].astype(np.int64) + steps_offset"  # fmt: skip
    source = _fill(1, stride).replace("def set_timesteps(", "def stride(T, n):\n    return T // n\n\n\ndef set_timesteps(")  # fmt: skip
    code, out, err = check(source)
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "stride(T, n)).round()" in text)  # fmt: skip
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert f"spacing_blanks.py line {line} (blank 1): NameError: name 'stride' is not defined: only your file's imports and its set_timesteps() run in the check, so define it inside set_timesteps()" in err, err  # fmt: skip


@pytest.mark.parametrize(
    "page",
    [
        "labs/lab-01-forward-noise-process.md",
        "labs/lab-03-scheduler-reading.md",
        "labs/lab-04-cfg-code-reading.md",
    ],
)
def test_next_on_the_path_is_the_next_page_of_docs_paths(page):
    """A guide's "Next on the path/track: [X](link)" links the page docs/paths.yml puts after it
    (the footer's Next): Lab 03's track goes on to Lab 13, not the core path's few-step section."""
    import posixpath

    from infralens_docs import paths

    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    (link,) = re.findall(r"Next on (?:the path|this track): [^\[]*\[[^\]]*\]\(([^)#]+)", text)
    order = paths.load_paths().order
    assert (
        posixpath.normpath(posixpath.join(posixpath.dirname(page), link))
        == order[order.index(page) + 1]
    )


@pytest.mark.parametrize("steps", ["61", "103"])
def test_a_step_count_where_trailing_gives_one_more_runs(run_cli, steps):
    """`--steps` takes 1 to 1000 (the Bad input tab): at 61 and 103, where diffusers' `trailing`
    grid has one entry more (the last -1), the starter prints that grid and draws its figures,
    no traceback."""
    run = run_cli(STARTER, "--steps", steps)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    trailing = next(line for line in run.stdout.split("DDIM")[1:] if "trailing" in line)
    entries = trailing.split("[", 1)[1].split("]", 1)[0].split()
    assert len(entries) == int(steps) + 1 and entries[-1] == "-1"


@pytest.mark.parametrize("steps", ["1", "2", "10", "500", "1000"])
def test_figure_texts_hold_at_the_edge_step_counts(run_cli, tmp_path, steps):
    """The figures' alt texts and captions hold at the edge step counts: at 1 step `linspace`'s only
    timestep is 0 (sigma 0.029, not sigma_max), and at 500 and 1000 `leading` with
    steps_offset=1 starts at sigma_max too, so no text says which grids start at sigma_max;
    each alt states the start values the run's grids have. The sigma-grids caption says Karras
    moves steps toward low noise only when its grid has more steps below 0.5 than leading's:
    at 1 and 2 steps the two grids are the same (round 11)."""
    run = run_cli(STARTER, "--steps", steps, "--num-samples", "100", "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    figures = json.loads((tmp_path / "figures.json").read_text())
    for figure in figures.values():
        text = figure["alt"] + " " + figure["caption"]
        assert "start at sigma_max" not in text and "starts lower" not in text, text
        assert "training timesteps" not in text, text
    sigmas = [line for line in run.stdout.splitlines() if line.startswith("Euler karras=False")]
    first = float(sigmas[0].split("[", 1)[1].split()[0].rstrip("]"))
    assert f"Euler, linspace runs from {first:.3f}" in figures["sigmas"]["alt"]
    grids = figures["sigma-grids"]
    below = re.search(r"leading takes (\d+) steps.* Karras (\d+)\.$", grids["alt"])
    moved = int(below[2]) > int(below[1])
    assert moved == ("toward low noise" in grids["caption"]), grids
    assert moved == (steps == "10" or int(steps) >= 500), (steps, below.groups())
