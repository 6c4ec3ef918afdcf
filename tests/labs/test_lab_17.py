"""Lab 17 Rebuild the Pipeline: the blanks, the solution, and a checker that names the wrong blank."""

import ast
import json
import re
import runpy
import shutil
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from infralens_docs.registry import ROOT
from infralens_docs.runner import starter_env

FOLDER = ROOT / "code/lab-17-rebuild-the-pipeline"
READER = "code/lab-17-rebuild-the-pipeline/rebuild_pipeline.py"
LAB_12 = "code/lab-12-end-to-end-inference-trace/pipeline_trace.py"


def text(name):
    return (FOLDER / name).read_text(encoding="utf-8")


def pipeline_of(source):
    """The ``pipeline`` snippet section of a file's text: the ``def`` with its blank lines."""
    return source.split("# --8<-- [start:pipeline]\n")[1].split("# --8<-- [end:pipeline]")[0]


def edit(body, old, new):
    """``body`` with ``old`` replaced by ``new`` (each must occur there once); a tuple of
    ``old`` strings and one of ``new`` strings make several edits."""
    for a, b in zip(*((old, new) if isinstance(old, tuple) else ((old,), (new,))), strict=True):
        assert body.count(a) == 1, a
        body = body.replace(a, b)
    return body


def filled(old=None, new=None):
    """rebuild_pipeline.py with its pipeline() replaced by solution.py's: what a reader who
    filled in every blank has; with ``old`` replaced by ``new`` (it must occur there once)."""
    reader, solution = text("rebuild_pipeline.py"), pipeline_of(text("solution.py"))
    if old is not None:
        solution = edit(solution, old, new)
    return reader.replace(pipeline_of(reader), solution)


def run_copy(tmp_path, source, *argv, name="rebuild_pipeline.py"):
    """Run ``source`` (the text of a filled-in rebuild_pipeline.py) as the reader would,
    from a copy ``name`` in ``tmp_path`` with the real solution.py beside it."""
    shutil.copy(FOLDER / "solution.py", tmp_path / "solution.py")
    path = tmp_path / name
    path.write_text(source, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(path), *argv],
        cwd=ROOT, env=starter_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def shown_on_stderr(message, category, filename, lineno, file=None, line=None):
    """Python's own display of a warning, on stderr, as a fresh interpreter shows it."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@pytest.fixture
def run_here(tmp_path, monkeypatch, capsys):
    """run_copy in this process: the copy beside the real solution.py, run by runpy as
    __main__ with the same argv, warnings shown on stderr under Python's default filters,
    and sys.exit turned into a return code. Its module code is the one a subprocess runs,
    without a new interpreter's start (about 2 s of a test's wall time each on a loaded
    machine); an exception it does not catch fails the test, as a traceback would."""

    def run(source, *argv, name="rebuild_pipeline.py"):
        shutil.copy(FOLDER / "solution.py", tmp_path / "solution.py")
        path = tmp_path / name
        path.write_text(source, encoding="utf-8")
        monkeypatch.setattr(sys, "argv", [str(path), *argv])
        monkeypatch.setattr(sys, "path", list(sys.path))  # the file puts code/ first
        capsys.readouterr()
        code = 0
        with warnings.catch_warnings():
            warnings.resetwarnings()  # Python's defaults: show each warning once per line
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):  # fmt: skip
                warnings.simplefilter("ignore", category)
            warnings.showwarning = shown_on_stderr
            try:
                runpy.run_path(str(path), run_name="__main__")
            except SystemExit as stop:
                if isinstance(stop.code, str):  # sys.exit("text"): the text, exit 1
                    print(stop.code, file=sys.stderr)
                code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        out = capsys.readouterr()
        return subprocess.CompletedProcess(sys.argv, code, out.out, out.err)

    return run


@pytest.fixture(scope="module")
def checker():
    """rebuild_pipeline.py run in this process with --solution, once per scheduler: its
    check(), load_function and parts, to judge many fills without a subprocess each."""
    import runpy

    runs = {}

    def get(scheduler="euler"):
        if scheduler not in runs:
            old, sys.argv = (
                sys.argv,
                ["rebuild_pipeline.py", "--solution", "--scheduler", scheduler],
            )
            try:
                runs[scheduler] = runpy.run_path(str(ROOT / READER), run_name="__main__")
            finally:
                sys.argv = old
        return runs[scheduler]

    return get


def check_fill(checker, tmp_path, capsys, old, new, scheduler="euler"):
    """The checker's verdict on a copy of solution.py, mine.py, with ``old`` replaced by
    ``new`` in its pipeline(), judged in this process: (passed, stdout, stderr, the copy)."""
    solution = text("solution.py")
    body = pipeline_of(solution)
    source = solution.replace(body, edit(body, old, new))
    path = tmp_path / "mine.py"
    path.write_text(source, encoding="utf-8")
    g = checker(scheduler)
    capsys.readouterr()
    passed = g["check"](g["load_function"](path, "pipeline"), "pipeline() of mine.py")
    out = capsys.readouterr()
    return passed, out.out, out.err, source


def line_of(source, statement):
    """The 1-based line of ``source`` that holds ``statement``, stripped."""
    return [line.strip() for line in source.splitlines()].index(statement) + 1


def test_the_two_pipelines_differ_only_on_the_blank_lines():
    """The reader's pipeline() is the solution's with each blank's line(s) replaced by blank(n)."""
    reader = pipeline_of(text("rebuild_pipeline.py")).splitlines()
    solution = pipeline_of(text("solution.py")).splitlines()
    assert len(reader) == len(solution)
    changed = [(r, s) for r, s in zip(reader, solution, strict=True) if r != s]
    numbers = [int(re.search(r"blank\((\d)\)", r).group(1)) for r, _ in changed]
    assert numbers == [1, 1, 2, 3, 3, 4, 5]
    assert not any("blank(" in s for _, s in changed)
    # the answers (and the planted mistakes, which quote them) are in solution.py only
    reader_file = text("rebuild_pipeline.py")
    assert not any(s.split("#")[0].strip() in reader_file for _, s in changed)
    assert "MISTAKES = " not in reader_file


def test_solution_py_holds_the_function_and_the_mistakes_only():
    """Everything else (parts, inputs, run, checker, figures) lives once, in rebuild_pipeline.py."""
    body = ast.parse(text("solution.py")).body
    kinds = [type(node).__name__ for node in body]
    assert kinds == ["Expr", "Import", "FunctionDef", "Assign"]  # docstring, numpy, def, table
    assert body[2].name == "pipeline" and body[3].targets[0].id == "MISTAKES"


@pytest.mark.parametrize("scale", ["7.5", "1", "0"])
def test_the_solution_reproduces_lab_12_with_its_scheduler_above_guidance_1(run_lab, scale):
    """With DDIM at --guidance-scale above 1, the solution's pipeline() gives exactly Lab 12's
    images for the same flags; at 1 or below Lab 12 follows diffusers and stops guiding, the
    toy loop does not, so they differ (at 1 only by rounding, at 0 visibly)."""
    flags = ["--scheduler", "ddim", "--prompt", "hbar", "--steps", "10", "--seed", "3"]
    ours = run_lab(READER, "--solution", *flags, "--guidance-scale", scale)["image"]
    theirs = run_lab(LAB_12, *flags[2:], "--guidance-scale", scale)["image"]
    if float(scale) > 1:
        np.testing.assert_array_equal(ours, theirs)
    else:
        assert not np.array_equal(ours, theirs)
        assert (np.abs(ours - theirs).max() > 0.1) == (float(scale) == 0)


def test_the_solutions_images_are_training_images_of_the_prompt(run_lab):
    g = run_lab(READER, "--solution", "--prompt", "vbar")
    assert g["image"].shape == (8, 3, 32, 32)
    assert "nearest training latent has the prompt's label: 100.0% of 8" in g["__stdout__"]
    assert g["unet"].calls == 20 and g["unet"].rows == 20 * 16  # one call per step, 2B rows


def test_without_scale_model_input_the_exact_denoiser_still_snaps_to_training_images(run_lab):
    """Euler's images without scale_model_input are still training images of the prompted
    class only because the toy's exact denoiser snaps any input to one (the page's caveat):
    each decodes onto a training latent, mostly other ones than the solution's."""
    g = run_lab(READER, "--solution")
    _, wrong, error = g["run_on_spies"](g["load_solution"](2))
    assert error is None
    nearest, rms = g["training_set"].nearest(
        g["vae"].encode(wrong) * g["vae"].config.scaling_factor
    )
    ours, _ = g["training_set"].nearest(
        g["vae"].encode(g["image"]) * g["vae"].config.scaling_factor
    )
    assert rms.max() < 0.01 and (g["data"].labels[nearest] == g["SHAPES"].index("disc")).all()
    assert (nearest != ours).sum() > len(ours) // 2


@pytest.mark.parametrize("scale, purity", [("0", "25.0%"), ("1", "100.0%")])
def test_the_toy_loop_always_guides_and_says_so_at_guidance_scale_1_or_below(
    run_cli, scale, purity
):
    """The toy's loop has no guidance_scale <= 1 branch: at 0 it makes unconditional images
    (a quarter of them discs), at 1 the prompt's; the run says where diffusers differs."""
    run = run_cli(READER, "--solution", "--guidance-scale", scale)
    assert run.returncode == 0 and run.stderr == ""
    assert f"nearest training latent has the prompt's label: {purity} of 8" in run.stdout
    assert "StableDiffusionPipeline does not guide at guidance_scale <= 1" in run.stdout
    assert "does not guide" not in run_cli(READER, "--solution").stdout


@pytest.mark.parametrize("kind", ["euler", "ddim"])
def test_labkit_step_output_indexes_like_diffusers(kind):
    """labkit's SchedulerOutput[0] is prev_sample and [1] pred_original_sample, as diffusers'
    BaseOutput indexes its fields that are not None; iterating it is an error, not keys."""
    from labkit.schedulers import DDIMScheduler, EulerDiscreteScheduler, SchedulerOutput

    sd15 = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1)
    scheduler = EulerDiscreteScheduler(**sd15) if kind == "euler" else DDIMScheduler(**sd15)
    scheduler.set_timesteps(4)
    t, sample = scheduler.timesteps[0], np.ones((2, 4, 4, 4))
    out = scheduler.step(np.zeros_like(sample), t, scheduler.scale_model_input(sample, t))
    assert out[0] is out.prev_sample and out[1] is out.pred_original_sample
    assert out["prev_sample"] is out.prev_sample and out[:] == (out[0], out[1])
    assert SchedulerOutput(sample)[:] == (sample,)  # no pred_original_sample: one field
    with pytest.raises(TypeError):
        iter(out)


@pytest.mark.parametrize("scheduler", ["euler", "ddim"])
def test_the_checker_passes_the_solution(run_cli, scheduler):
    run = run_cli(READER, "--solution", "--check", "--scheduler", scheduler)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert "all 5 blanks match: 61 calls compared (20 steps)" in run.stdout
    assert "images: max |yours - solution| 0\n" in run.stdout


def test_a_missing_call_names_the_blank_that_owns_it(checker, tmp_path, capsys):
    """A step left out names blank 4 (its owner), not blank 2 or 5 whose call came next."""
    old = "scheduler.step(noise_pred, t, latents).prev_sample"
    _, out, _, _ = check_fill(checker, tmp_path, capsys, old, "noise_pred")
    assert "blank 4 differs from the solution (step 1 of 20)" in out, out
    assert "yours calls scheduler.scale_model_input, skipping scheduler.step" in out


GUIDE = "        noise_pred = noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)\n"  # fmt: skip
DOUBLE = "    prompt_embeds = np.concatenate([negative_prompt_embeds, prompt_embeds])\n"
#: loops that stop early: (id, old, new, the statement that ends the loop, the verdict's
#: first line, where the message puts that statement)
STOPPED = [
    ("break in blank 4", ".prev_sample\n", ".prev_sample\n        break\n", "break",
     "blank 4 differs from the solution (step 2 of 20)", "loop stopped after 1 step of 20, at line {} (in blank 4)"),
    ("break in blank 3", GUIDE, GUIDE + "        if t < 500:\n            break\n", "break",
     "blank 3 differs from the solution (step 11 of 20)", "loop stopped after 10 steps of 20, at line {} (in blank 3)"),
    ("return in blank 4", ".prev_sample\n", ".prev_sample\n        return latents\n", "return latents",
     "blank 4 differs from the solution (step 2 of 20)", "loop stopped after 1 step of 20, at line {} (in blank 4)"),
    ("decode in blank 1", DOUBLE, DOUBLE + "    return vae.decode(latents / vae.config.scaling_factor)\n",
     "return vae.decode(latents / vae.config.scaling_factor)",
     "blank 1 differs from the solution (step 1 of 20)", "loop stopped after 0 steps of 20, at line {} (in blank 1)"),
    ("return after the last step", ".prev_sample\n", ".prev_sample\n        if t == scheduler.timesteps[-1]:\n            return latents\n",
     "return latents", "blank 4 differs from the solution (after the loop)", "pipeline() returned, at line {} (in blank 4)"),
    ("the for line", "for t in scheduler.timesteps:", "for t in scheduler.timesteps[:5]:", "for t in scheduler.timesteps[:5]:",
     "a line outside the blanks differs from the solution (step 6 of 20)", "loop stopped after 5 steps of 20, at line {} (the for line, outside the blanks)"),
]  # fmt: skip


@pytest.mark.parametrize("old, new, statement, verdict, where", [v[1:] for v in STOPPED], ids=[v[0] for v in STOPPED])  # fmt: skip
def test_a_loop_that_stops_early_is_named_by_the_line_that_left_it(checker, tmp_path, capsys, old, new, statement, verdict, where):  # fmt: skip
    """A break or return, in any blank, or a shortened for line: the checker names the line
    that left the loop and its blank (or says it is outside the blanks), not blank 4, 2 or 5,
    whose calls are the ones missing."""
    passed, out, err, source = check_fill(checker, tmp_path, capsys, old, new)
    assert not passed and err == "", out + err
    lines = out.splitlines()
    assert lines[1] == verdict + ":", out
    assert f"your {where.format(line_of(source, statement))}" in lines[2], out


def test_the_plain_run_names_the_line_of_a_loop_that_never_ran(run_here):
    """A return in blank 1, before the loop: the plain run names that line and blank in one
    line and exits 1 (it once divided by the unet's zero calls, with a traceback)."""
    source = filled(DOUBLE, DOUBLE + "    return vae.decode(latents / vae.config.scaling_factor)\n")
    run = run_here(source)
    assert run.returncode == 1 and run.stderr == "", run.stdout + run.stderr
    line = line_of(source, "return vae.decode(latents / vae.config.scaling_factor)")
    assert (
        run.stdout.splitlines()[0]
        == f"your loop stopped after 0 steps of 20, at line {line} (in blank 1)"
    )


SCALE = "        latent_model_input = scheduler.scale_model_input"
#: blank 1's first line written as a for statement of its own: a right answer
FOR_1 = "    rows = []\n    for embeds in (negative_prompt_embeds, prompt_embeds):\n        rows.append(embeds)\n    prompt_embeds = np.concatenate(rows)\n"  # fmt: skip
#: the same with an empty line inside, so that its for line is outside the blanks
FOR_1_GAP = FOR_1.replace("rows = []\n", "rows = []\n\n")
#: the loop's for line as two nested loops, half the timesteps each (the inner for indented
#: one space more, so the body's lines stay as they are): a right answer
FOR_LINE = "    for t in scheduler.timesteps:\n"
NESTED = "    for chunk in np.array_split(scheduler.timesteps, 2):\n     for t in chunk:\n"
#: a continue that cuts iterations short, the loop running to its end: (id, old, new, the
#: blank it sits in, the first iteration it cuts, that step's verdict)
SKIPPED = [
    ("early steps, blank 2", SCALE, "        if t > 500:\n            continue\n" + SCALE, 2, 1),
    ("late steps, blank 2", SCALE, "        if t < 500:\n            continue\n" + SCALE, 2, 11),
    ("late steps, blank 3", GUIDE, GUIDE + "        if t < 500:\n            continue\n", 3, 11),
    ("early steps, a for in blank 1", (DOUBLE, SCALE), (FOR_1, "        if t > 500:\n            continue\n" + SCALE), 2, 1),
    ("late steps, a for in blank 1", (DOUBLE, SCALE), (FOR_1, "        if t < 500:\n            continue\n" + SCALE), 2, 11),
    ("early steps, a for after an empty line in blank 1", (DOUBLE, SCALE), (FOR_1_GAP, "        if t > 500:\n            continue\n" + SCALE), 2, 1),
    ("late steps, a for after an empty line in blank 1", (DOUBLE, SCALE), (FOR_1_GAP, "        if t < 500:\n            continue\n" + SCALE), 2, 11),
    ("late steps, the loop as two nested loops", (FOR_LINE, GUIDE), (NESTED, GUIDE + "        if t < 500:\n            continue\n"), 3, 11),
]  # fmt: skip
#: the loop's for line written as a while loop: a right answer, and one with a continue
WHILE = "    i = 0\n    while i < len(scheduler.timesteps):\n        t = scheduler.timesteps[i]\n        i += 1\n"
WHILE_CONTINUE = WHILE + "        if i % 2 == 0:\n            continue\n"


@pytest.mark.parametrize("old, new, number, iteration", [v[1:] for v in SKIPPED], ids=[v[0] for v in SKIPPED])  # fmt: skip
def test_a_continue_is_named_by_its_line_not_as_the_for_line_stopping_the_loop(checker, tmp_path, capsys, old, new, number, iteration):  # fmt: skip
    """A continue in a blank skips the calls of some iterations while the for line runs to its
    end: --check names the continue's line and blank, not the for line, and says no loop
    stopped (it once blamed the for line, outside the blanks; and again when blank 1 held a
    for statement of its own, taken for the loop)."""
    passed, out, err, source = check_fill(checker, tmp_path, capsys, old, new)
    assert not passed and err == "", out + err
    assert out.splitlines()[1] == f"blank {number} differs from the solution (step {iteration} of 20):", out  # fmt: skip
    line = line_of(source, "continue")
    assert f"your loop cut iteration {iteration} of 20 short before its step, at line {line} (in blank {number})" in out, out  # fmt: skip
    assert "for line" not in out and "stopped" not in out, out


@pytest.mark.parametrize("old, new, number, iteration", [v[1:] for v in SKIPPED], ids=[v[0] for v in SKIPPED])  # fmt: skip
def test_the_plain_run_names_a_continue_too(run_here, old, new, number, iteration):
    """The plain run of a continue: one line naming it, exit 1 (it once said the loop stopped
    after 10 steps, at the for line)."""
    source = filled(old, new)
    run = run_here(source)
    assert run.returncode == 1 and run.stderr == "", run.stdout + run.stderr
    line = line_of(source, "continue")
    assert run.stdout.splitlines()[0] == f"your loop cut iteration {iteration} of 20 short before its step, at line {line} (in blank {number}): 10 steps of 20 ran"  # fmt: skip


@pytest.mark.parametrize("argv", [[], ["--check"]], ids=["run", "check"])
def test_a_continue_in_a_while_loop_is_named_by_its_line(run_here, argv):
    """The for line rewritten as a while loop whose continue skips every other step: both modes
    name the continue's line, outside the blanks (the plain run once said the loop stopped at
    the while line, --check blamed "the for line")."""
    source = filled("    for t in scheduler.timesteps:\n", WHILE_CONTINUE)
    run = run_here(source, *argv)
    assert run.returncode == 1 and run.stderr == "", run.stdout + run.stderr
    line = line_of(source, "continue")
    assert f"your loop cut iteration 2 of 20 short before its step, at line {line} (outside the blanks)" in run.stdout, run.stdout  # fmt: skip
    assert "for line" not in run.stdout and "stopped" not in run.stdout, run.stdout


def test_a_decode_the_loop_goes_on_after_is_an_extra_call_not_a_stopped_loop(checker, tmp_path, capsys):  # fmt: skip
    """A preview vae.decode after blank 4's step, the loop running all 20 steps: blank 4 made
    an extra call (the message once said the loop stopped after 1 step)."""
    preview = ".prev_sample\n        preview = vae.decode(latents / vae.config.scaling_factor)\n"
    passed, out, err, _ = check_fill(checker, tmp_path, capsys, ".prev_sample\n", preview)
    assert not passed and err == "", out + err
    assert out.splitlines()[1:3] == [
        "blank 4 differs from the solution (step 2 of 20):",
        "the solution calls scheduler.scale_model_input here; yours calls vae.decode, an extra call (your loop goes on after it)",
    ], out  # fmt: skip


@pytest.mark.parametrize("argv", [[], ["--check"]], ids=["run", "check"])
def test_a_yield_is_told_it_makes_a_generator(run_here, argv):
    """A yield in the loop makes pipeline() a generator that runs none of its lines: both modes
    say so in one line and exit 1 (the plain run once named "line None", --check blank 2)."""
    run = run_here(filled(".prev_sample\n", ".prev_sample\n        yield latents\n"), *argv)  # fmt: skip
    assert run.returncode == 1 and run.stderr == "", run.stdout + run.stderr
    verdict = run.stdout.splitlines()[1 if argv else 0]
    assert verdict.startswith("your pipeline() returns a generator (a yield makes pipeline() a generator, which runs none of its lines)"), run.stdout  # fmt: skip
    assert "line None" not in run.stdout and "blank 2" not in run.stdout


STEP = "        latents = scheduler.step(noise_pred, t, latents).prev_sample\n"
#: a debugger's breakpoint(), as pdb runs it, told to continue (its prompt goes to a buffer)
BREAKPOINT = "        __import__('pdb').Pdb(stdin=__import__('io').StringIO('c\\n'), stdout=__import__('io').StringIO(), nosigint=True, readrc=False).set_trace()\n"  # fmt: skip
#: right answers in another shape, which the line tracer and the latents check must not flag
RIGHT = [
    ("a helper that calls step", STEP, "        def advance(x):\n            return scheduler.step(noise_pred, t, x).prev_sample\n\n        latents = advance(latents)\n"),
    ("a continue after the step", STEP, STEP + "        continue\n"),
    ("a for in blank 1", DOUBLE, FOR_1),
    ("a for after an empty line in blank 1", DOUBLE, FOR_1_GAP),
    ("a while loop for the for line", "    for t in scheduler.timesteps:\n", WHILE),
    ("two nested loops for the for line", FOR_LINE, NESTED),
    ("a breakpoint() that continues", GUIDE, BREAKPOINT + GUIDE),
    ("a continue in a loop of blank 3's own", GUIDE, "        for half in range(2):\n            if half:\n                continue\n" + GUIDE),
    ("the other form of the guidance formula", GUIDE, "        noise_pred = (1 - guidance_scale) * noise_pred_uncond + guidance_scale * noise_pred_text\n"),
    ("slicing for np.split", "np.split(noise_pred, 2)", "noise_pred[: len(noise_pred) // 2], noise_pred[len(noise_pred) // 2 :]"),
]  # fmt: skip


@pytest.mark.parametrize("old, new", [v[1:] for v in RIGHT], ids=[v[0] for v in RIGHT])
@pytest.mark.parametrize("argv", [[], ["--check"]], ids=["run", "check"])
def test_a_right_loop_in_another_shape_passes(run_here, argv, old, new):
    """step called from a helper of the reader's (whose frame holds no latents), a continue
    after the step, blank 1 written as a for statement, or blank 3 by slicing or the other
    form of the guidance formula: the plain run and --check pass (the helper was once
    blamed on blank 3)."""
    run = run_here(filled(old, new), *argv)
    assert run.returncode == 0 and run.stderr == "", run.stdout + run.stderr
    assert ("all 5 blanks match" in run.stdout) if argv else ("pipeline(): prompt" in run.stdout)


def test_a_debuggers_tracer_still_sees_your_lines(checker):
    """The checker records which lines pipeline() runs, and passes every trace event on to a
    tracer set before it, such as pdb's: a breakpoint in a blank still stops (the checker's
    own tracer once replaced it for the whole run)."""
    g = checker()
    fn, seen = g["load_solution"](), []

    def debugger(frame, event, arg):  # stands in for pdb: the lines of pipeline() it sees
        if frame.f_code is fn.__code__:
            seen.append((event, frame.f_lineno))
            return debugger
        return None

    sys.settrace(debugger)
    try:
        calls, image, error = g["run_on_spies"](fn)
    finally:
        sys.settrace(None)
    assert error is None and image is not None
    lines = [line for event, line in seen if event == "line"]
    assert lines and lines == g["EXECUTED"][fn][:-1]  # the same lines (the last: its return)
    step = next(call.line for call in calls if call.method == "scheduler.step")
    assert lines.count(step) == 20  # the debugger saw every step's line


def test_ctrl_c_while_a_part_runs_names_the_part_running_not_failing(checker):
    """Ctrl-C while the unet runs (where a slow run spends its time): the line and the part
    that was running, not "inside unet, which failed on the arguments your blanks gave it"."""
    g = checker()
    fn, here = g["load_solution"](), g["run_on_spies"].__globals__  # the module's own globals
    unet = here["unet"]

    def interrupted(sample, timestep, class_labels=None):  # Ctrl-C lands inside the unet
        raise KeyboardInterrupt

    here["unet"] = interrupted
    try:
        calls, image, error = g["run_on_spies"](fn)
    finally:
        here["unet"] = unet
    line = next(call.line for call in calls if call.method == "unet")
    assert isinstance(error, KeyboardInterrupt) and image is None
    said = f"your pipeline raised KeyboardInterrupt at line {line}, while unet ran: interrupted there (Ctrl-C): a loop of yours that does not end?"  # fmt: skip
    assert g["raised"](error, fn, calls) == said


#: a debugger's breakpoint() in blank 3 (pdb, told to continue) and a loop that skips or stops:
#: (id, old, new, --check's verdict line)
PDB_STOP = [
    ("a continue in blank 2", (GUIDE, SCALE), (BREAKPOINT + GUIDE, "        if t > 500:\n            continue\n" + SCALE), "your pipeline() differs from the solution (step 1 of 20):"),
    ("a continue in blank 4, after the unet", (GUIDE, STEP), (BREAKPOINT + GUIDE, "        if t > 500:\n            continue\n" + STEP), "blank 4 differs from the solution (step 1 of 20):"),
    ("a break in blank 2", (GUIDE, SCALE), (BREAKPOINT + GUIDE, "        if t < 500:\n            break\n" + SCALE), "your pipeline() differs from the solution (step 11 of 20):"),
]  # fmt: skip


@pytest.mark.parametrize("old, new, verdict", [v[1:] for v in PDB_STOP], ids=[v[0] for v in PDB_STOP])  # fmt: skip
def test_a_breakpoint_that_took_over_the_trace_names_no_line(checker, tmp_path, capsys, run_here, old, new, verdict):  # fmt: skip
    """pdb's breakpoint() replaces the trace that records your lines: the plain run and
    --check then name no line of the loop and say why (they once named the return line, in
    blank 5, and the for line, for a continue in blank 2); the plain run still refuses a loop
    that made 10 steps of 20 (it once passed a continue after the unet, exit 0), and --check
    names no blank for a break it cannot place (it once named blank 4)."""
    passed, out, err, _ = check_fill(checker, tmp_path, capsys, old, new)
    assert not passed and err == "", out + err
    untraced = "(a breakpoint() in your pipeline() replaced the trace that records its lines: no line of the loop is named; run without it to see which)"  # fmt: skip
    assert untraced in out.splitlines() and "for line" not in out, out
    assert out.splitlines()[1] == verdict, out
    run = run_here(filled(old, new))
    assert run.returncode == 1 and run.stderr == "", run.stdout + run.stderr
    assert run.stdout.splitlines()[0] == f"your loop made 10 steps of 20 {untraced}", run.stdout


#: INIT, the given line that scales the noise to the scheduler's start
INIT = "    latents = latents * scheduler.init_noise_sigma  # the std the scheduler starts from\n"


def test_latents_wrong_before_a_right_doubling_blame_no_blank(checker, tmp_path, capsys):
    """The given init_noise_sigma line deleted: blank 1 doubles the latents it gets, as it
    should, so --check names no blank and says your latents differ before that call (it once
    said blank 1 differs)."""
    passed, out, err, _ = check_fill(checker, tmp_path, capsys, INIT, "")
    assert not passed and err == "", out + err
    lines = out.splitlines()
    assert lines[1] == "your pipeline() differs from the solution (step 1 of 20):", out
    assert lines[3] == "  (that is your latents, doubled as blank 1 should; your latents already differ here: compare the lines before this call)", out  # fmt: skip
    assert "blank 1 differs" not in out, out


def test_the_plain_run_blames_no_blank_for_latents_wrong_before_a_right_doubling(run_here):
    """The given init_noise_sigma line cast to float32: blank 1 doubles the latents it gets, as
    it should, so the plain run names no blank and says your latents break the contract before
    blank 1 doubles them (it once said blank 1 breaks it); --check shows the dtypes and no
    "1 x the solution's" ratio that only rounds to 1."""
    source = filled("latents = latents * scheduler.init_noise_sigma", "latents = (latents * scheduler.init_noise_sigma).astype(np.float32)")  # fmt: skip
    plain = run_here(source)
    assert plain.returncode == 1 and plain.stdout.startswith("your latents break the contract before blank 1 doubles them (step 1 of 20): they are (8, 4, 4, 4) float32"), plain.stdout  # fmt: skip
    assert "blank 1 breaks" not in plain.stdout, plain.stdout
    check = run_here(source, "--check")
    assert check.returncode == 1 and "your pipeline() differs from the solution (step 1 of 20)" in check.stdout, check.stdout  # fmt: skip
    assert "(16, 4, 4, 4) float32" in check.stdout and "yours is 1 x" not in check.stdout, check.stdout  # fmt: skip


@pytest.mark.parametrize("argv", [[], ["--check"]], ids=["run", "check"])
def test_quitting_the_debugger_says_so(run_here, argv):
    """pdb's q at a breakpoint() in blank 3: the line and its blank, and that you quit the
    debugger there, in one line (it once printed an empty reason and the note on empty lines)."""
    quit_pdb = BREAKPOINT.replace("StringIO('c\\n')", "StringIO('q\\n')")
    source = filled(GUIDE, quit_pdb + GUIDE)
    run = run_here(source, *argv)
    assert run.returncode == 1 and run.stderr == "", run.stdout + run.stderr
    line = line_of(source, GUIDE.strip())
    said = f"your pipeline raised BdbQuit at line {line} (in blank 3): you quit the debugger (pdb's q) there"  # fmt: skip
    assert said in run.stdout.splitlines(), run.stdout


def test_ctrl_c_on_a_given_line_is_not_explained_by_the_empty_line_rule(checker):
    """Ctrl-C landing on a line the file gives (here the for line, on its 5th pass): that line,
    outside the blanks, without the note on empty lines ending a blank, which explains an
    error, not an interrupt."""
    g = checker()
    fn = g["load_solution"]()
    line = g["loop_heads"](fn)[0]
    passes = []

    def interrupting(frame, event, arg):  # a SIGINT that lands on the for line
        if frame.f_code is not fn.__code__:
            return None

        def local(frame, event, arg):
            if event == "line" and frame.f_lineno == line:
                passes.append(line)
                if len(passes) == 5:
                    raise KeyboardInterrupt
            return local

        return local

    sys.settrace(interrupting)
    try:
        calls, image, error = g["run_on_spies"](fn)
    finally:
        sys.settrace(None)
    assert isinstance(error, KeyboardInterrupt) and image is None
    said = f"your pipeline raised KeyboardInterrupt at line {line}, outside the blanks: interrupted there (Ctrl-C): a loop of yours that does not end?"  # fmt: skip
    assert g["raised"](error, fn, calls) == said


def test_the_plain_run_refuses_images_that_are_not_finite(run_here):
    """Blank 5 dividing by 0.0: the plain run says the images hold NaN and inf, exit 1 (it once
    printed "range nan..nan" and exited 0); Python's own warning names the line."""
    source = filled("latents / vae.config.scaling_factor", "latents / 0.0")
    run = run_here(source)
    assert run.returncode == 1, run.stdout + run.stderr
    assert re.fullmatch(r"the images hold \d+ NaN and \d+ inf values of 24576: no image to judge", run.stdout.splitlines()[1]), run.stdout  # fmt: skip
    line = line_of(source, "image = vae.decode(latents / 0.0)  # (B, 3, H, W), about [-1, 1]")
    assert f":{line}: RuntimeWarning: divide by zero" in run.stderr, run.stderr


def test_the_figures_rows_as_the_page_describes_them(checker):
    """Rows 2 and 4 of the figure (the order swapped, the guidance sign flipped) go far outside
    the pixel range in places, most of their pixels inside it; the others stay about [-1, 1];
    row 5 (pred_original_sample carried) is one image eight times."""
    g = checker()
    rows = {k: g["run_on_spies"](g["load_solution"](k))[1] for k in range(1, 6)}
    for k in (1, 3):
        assert np.abs(rows[k]).max() > 5 and (np.abs(rows[k]) > 1).mean() < 0.5
    for k in (2, 4, 5):
        assert np.abs(rows[k]).max() < 1.5
    assert len(rows[4]) == 8 and all(np.array_equal(image, rows[4][0]) for image in rows[4])


#: arguments that are arrays but not numbers, and what the checker shows of them
NOT_NUMBERS = [
    ("[negative_prompt_embeds, prompt_embeds])", "[negative_prompt_embeds, prompt_embeds]).astype(str)", "(16,) <U21"),
    ("np.concatenate([latents] * 2)", "np.array([None] * 16)", "(16,) object"),
]  # fmt: skip


@pytest.mark.parametrize("old, new, shown", NOT_NUMBERS, ids=["strings", "objects"])
def test_an_array_of_strings_or_objects_is_described_without_a_traceback(checker, tmp_path, capsys, old, new, shown):  # fmt: skip
    """--check on condition rows of strings, or latents of None: blank 1 named and the array
    described by shape and dtype (the checker's show() once raised on np.abs of them); the
    unet that fails on them is named as the part that failed, not as an empty line in a blank."""
    passed, out, err, source = check_fill(checker, tmp_path, capsys, old, new)
    assert not passed and err == "", out + err
    assert out.splitlines()[1] == "blank 1 differs from the solution (step 1 of 20):", out
    assert f"  yours:    {shown}\n" in out
    line = next(k for k, text in enumerate(source.splitlines(), 1) if "= unet(" in text)
    assert (
        f"at line {line}, inside unet, which failed on the arguments your blanks gave it" in out
    ), out
    assert "outside the blanks" not in out


def test_an_inf_of_yours_is_compared_without_a_warning_from_the_checker(checker, tmp_path, capsys):  # fmt: skip
    """Blank 5 dividing by 0.0: the learner's own line warns (Python names it); the checker's
    comparisons of inf and NaN raise no warning of their own."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        passed, out, _, _ = check_fill(checker, tmp_path, capsys, "latents / vae.config.scaling_factor", "latents / 0.0")  # fmt: skip
    assert not passed and "blank 5 differs from the solution (after the loop)" in out, out
    assert [w.filename for w in caught] == [str(tmp_path / "mine.py")], [(w.filename, str(w.message)) for w in caught]  # fmt: skip


@pytest.mark.parametrize("argv", [[], ["--check"]], ids=["run", "check"])
def test_blank_1_doubling_latents_itself_is_blamed_on_blank_1_not_on_step(run_here, argv):
    """`latents = np.concatenate([latents] * 2)` in blank 1, then scale_model_input(latents, t):
    every argument up to step matches, but latents changed before step 1's step: blank 1."""
    source = filled("latent_model_input = np.concatenate([latents] * 2)", "latents = np.concatenate([latents] * 2)")  # fmt: skip
    source = source.replace("scale_model_input(latent_model_input, t)", "scale_model_input(latents, t)")  # fmt: skip
    run = run_here(source, *argv)
    assert run.returncode == 1 and run.stderr == "", run.stdout + run.stderr
    verdict = run.stdout.splitlines()[1 if argv else 0]
    assert verdict.startswith("blank 1 "), run.stdout
    assert "your latents" in verdict or "your latents" in run.stdout.splitlines()[2], run.stdout


def test_the_spy_passes_attribute_writes_to_the_part_and_records_them():
    """A write through the Spy (scheduler._step_index += 1) reaches the part, as without it."""
    from labkit.blanks import Spy

    class Part:
        x = 1

        def f(self, a):
            return a + self.x

    part, calls = Part(), []
    spy = Spy("part", part, calls, ["f"])
    spy.x += 1
    assert part.x == 2 and spy.f(1) == 3
    del spy.x
    assert part.x == 1 and "x" not in vars(part)
    assert [c.method for c in calls] == ["part.x =", "part.f", "del part.x"]
    assert calls[0].arguments == {"value": 2}


def test_the_checker_says_when_your_loops_t_differs_outside_the_blanks(run_here):
    """Reversed timesteps change the for line, which is not a blank: the checker says so. The
    plain run does not: it prints what it found, the error step raised in blank 4's line, exit
    1 and no traceback (so the page says "prints what it found", not "where it went wrong")."""
    source = filled("for t in scheduler.timesteps:", "for t in scheduler.timesteps[::-1]:")
    run = run_here(source, "--check")
    assert "a line outside the blanks differs from the solution (step 1 of 20)" in run.stdout, run.stdout  # fmt: skip
    assert "your loop's t, which differs: the for line" in run.stdout
    plain = run_here(source)
    assert plain.returncode == 1 and plain.stderr == "" and "Traceback" not in plain.stdout
    assert "(in blank 4)" in plain.stdout and "for line" not in plain.stdout, plain.stdout


def test_swapping_both_orders_is_flagged_on_blank_1_while_the_images_agree(run_here):
    """The condition rows prompt first and chunk(2) read in that order: the numbers agree, but
    --check flags blank 1 against diffusers' order (the page's "things to try")."""
    source = filled(
        (
            "[negative_prompt_embeds, prompt_embeds]",
            "noise_pred_uncond, noise_pred_text = np.split",
        ),
        (
            "[prompt_embeds, negative_prompt_embeds]",
            "noise_pred_text, noise_pred_uncond = np.split",
        ),
    )
    run = run_here(source, "--check")
    assert run.returncode == 1 and "blank 1 differs from the solution (step 1 of 20)" in run.stdout, run.stdout  # fmt: skip
    assert "images: max |yours - solution| 0\n" in run.stdout


def test_an_empty_line_inside_a_blank_is_explained(run_here):
    """blank_at ends a blank's lines at the first empty line: an error after one says so."""
    source = filled("        noise_pred = noise_pred_uncond +", "\n        noise_pred = noise_pred_uncondd +")  # fmt: skip
    run = run_here(source)
    assert "outside the blanks (a blank's lines end at the first empty line after its # BLANK comment)" in run.stdout, run.stdout  # fmt: skip


def test_check_prints_its_header_first_and_ctrl_c_names_your_line(tmp_path):
    """A loop of the reader's that never ends: --check has already said what it checks, and
    Ctrl-C prints the line it was running and its blank, exit 1, no traceback, and no frame
    of the checker's as the reader's (its line tracer once showed as "from your on_line()")."""
    started = tmp_path / "started"  # the reader's loop touches it: then Ctrl-C
    source = filled("        noise_pred = noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)\n",
                    f"        open({str(started)!r}, 'w').close()\n"
                    "        while noise_pred_uncond is not None:\n            pass\n")  # fmt: skip
    shutil.copy(FOLDER / "solution.py", tmp_path / "solution.py")
    (tmp_path / "rebuild_pipeline.py").write_text(source, encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "rebuild_pipeline.py"), "--check"],
        cwd=ROOT, env=starter_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        header = proc.stdout.readline()  # printed before both runs
        assert header.startswith("checking pipeline() of rebuild_pipeline.py"), header
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # the solution's run, then into the reader's loop
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    line = source.splitlines().index("        while noise_pred_uncond is not None:") + 1
    assert proc.returncode == 1 and err == "", out + err
    said = "(in blank 3): interrupted there (Ctrl-C): a loop of yours that does not end?"
    first = out.splitlines()[0]  # the whole line: no frame of the checker's named as yours
    assert first in [f"your pipeline raised KeyboardInterrupt at line {k} {said}" for k in (line, line + 1)], out  # fmt: skip


def test_the_checker_passes_a_filled_in_copy(tmp_path):
    run = run_copy(tmp_path, filled(), "--check")
    assert run.returncode == 0 and "all 5 blanks match" in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize("argv", [[], ["--check"]], ids=["run", "check"])
def test_unfilled_blanks_say_which_is_next_without_a_traceback(run_cli, argv):
    run = run_cli(READER, *argv)
    assert run.returncode == 0 and run.stderr == ""
    assert "blank 1 of 5 is not filled in yet" in run.stdout and "rebuild_pipeline.py" in run.stdout


def test_a_partly_filled_copy_points_at_the_next_blank(run_here):
    partly = text("rebuild_pipeline.py")
    for line in ["prompt_embeds = np.concatenate([negative_prompt_embeds, prompt_embeds])",
                 "latent_model_input = np.concatenate([latents] * 2)"]:  # fmt: skip
        partly = partly.replace(f"{line.split(' = ')[0]} = blank(1)", line)
    run = run_here(partly, "--check")
    assert run.returncode == 0, run.stderr
    assert "blank 2 of 5 is not filled in yet" in run.stdout


#: wrong answers a reader may write, per blank: (old, new) in the solution's pipeline(),
#: scheduler, blank
WRONG = [
    ("[negative_prompt_embeds, prompt_embeds]", "[prompt_embeds, negative_prompt_embeds]", "euler", 1),
    ("np.concatenate([latents] * 2)", "np.repeat(latents, 2, axis=0)", "euler", 1),
    ("scheduler.scale_model_input(latent_model_input, t)", "latent_model_input", "euler", 2),
    # blank 1 is right, blank 2 scales the undoubled latents: blamed on 2, not on the doubling
    ("scale_model_input(latent_model_input, t)", "scale_model_input(latents, t)", "euler", 2),
    # DDIM's scale_model_input is the identity: the numbers agree, the missing call does not
    ("scheduler.scale_model_input(latent_model_input, t)", "latent_model_input", "ddim", 2),
    ("(noise_pred_text - noise_pred_uncond)", "(noise_pred_uncond - noise_pred_text)", "euler", 3),
    ("noise_pred_uncond, noise_pred_text = np.split", "noise_pred_text, noise_pred_uncond = np.split", "euler", 3),
    ("scheduler.step(noise_pred, t, latents)", "scheduler.step(noise_pred, t, latent_model_input)", "euler", 4),
    ("scheduler.step(noise_pred, t, latents)", "scheduler.step(noise_pred, scheduler.timesteps[0], latents)", "ddim", 4),
    (".prev_sample", ".pred_original_sample", "euler", 4),
    # blank 3's guided noise_pred is right; blank 4 hands step the unguided half
    ("step(noise_pred, t, latents)", "step(noise_pred_text, t, latents)", "euler", 4),
    ("latents / vae.config.scaling_factor", "latents", "euler", 5),
    ("latents / vae.config.scaling_factor", "latents * vae.config.scaling_factor", "ddim", 5),
    # a skipped call is blamed on the blank that owns it, not on the one whose call came next
    ("scheduler.step(noise_pred, t, latents).prev_sample", "noise_pred", "euler", 4),
    ("scheduler.step(noise_pred, t, latents).prev_sample", "noise_pred", "ddim", 4),
    (".prev_sample\n", ".prev_sample if t != scheduler.timesteps[-1] else latents\n", "euler", 4),
    # a loop that stops early decodes mid-loop: blank 4, not blank 5
    (".prev_sample\n", ".prev_sample\n        break\n", "euler", 4),
    # a continue in a loop of blank 4's own skips step at early steps: blank 4, its owner
    (STEP, "        for _ in range(1):\n            if t > 500:\n                continue\n    " + STEP, "euler", 4),
    # writes to a part reach it through the Spy, as without it, and count as extra calls
    (".prev_sample\n", ".prev_sample\n        scheduler._step_index += 1\n", "euler", 4),
    (".prev_sample\n", ".prev_sample\n        scheduler.step_index += 1\n", "euler", 4),
    ("        latent_model_input = scheduler.scale_model_input", "        scheduler._step_index = 0\n        latent_model_input = scheduler.scale_model_input", "euler", 2),
    ("        latent_model_input = scheduler.scale_model_input", "        scheduler.sigmas = scheduler.sigmas * 0.5\n        latent_model_input = scheduler.scale_model_input", "euler", 2),
]  # fmt: skip


@pytest.mark.parametrize("old, new, scheduler, number", WRONG, ids=lambda v: str(v)[:24])
def test_the_checker_names_the_wrong_blank(checker, tmp_path, capsys, old, new, scheduler, number):  # fmt: skip
    """Judged in this process (check() fails, as --check then exits 1); the odd inputs below
    run the reader's way, as subprocesses."""
    passed, out, err, _ = check_fill(checker, tmp_path, capsys, old, new, scheduler)
    assert not passed and err == "", out + err
    assert f"blank {number} differs from the solution" in out, out


#: odd learner inputs, per blank: (id, old, new, blank). Each breaks the contract between
#: the parts (a wrong batch, shape or dtype, a SchedulerOutput where an array goes, [0] on
#: an array) or fails in the learner's own code; blank None: a syntax error, whose line
#: Python itself names
ODD = [
    ("1 batch 3B labels", "[negative_prompt_embeds, prompt_embeds])", "[negative_prompt_embeds, prompt_embeds, prompt_embeds])", 1),
    ("1 batch 3B latents", "np.concatenate([latents] * 2)", "np.concatenate([latents] * 3)", 1),
    ("1 shape axis=1", "np.concatenate([latents] * 2)", "np.concatenate([latents] * 2, axis=1)", 1),
    ("1 labels axis=1", "[negative_prompt_embeds, prompt_embeds])", "[negative_prompt_embeds, prompt_embeds], axis=1)", 1),
    ("1 dtype float16", "np.concatenate([latents] * 2)", "np.concatenate([latents] * 2).astype(np.float16)", 1),
    ("1 dtype int", "np.concatenate([latents] * 2)", "np.concatenate([latents] * 2).astype(int)", 1),
    ("1 dtype float labels", "[negative_prompt_embeds, prompt_embeds])", "[negative_prompt_embeds, prompt_embeds]).astype(float)", 1),
    ("1 [0]", "np.concatenate([latents] * 2)", "np.concatenate([latents] * 2)[0]", 1),
    ("1 batch empty", "np.concatenate([latents] * 2)", "np.concatenate([latents] * 2)[:0]", 1),
    ("2 batch B", "scale_model_input(latent_model_input, t)", "scale_model_input(latents, t)", 2),
    ("2 shape", "scale_model_input(latent_model_input, t)", "scale_model_input(latent_model_input, t)[:, :2]", 2),
    ("2 dtype float16", "scale_model_input(latent_model_input, t)", "scale_model_input(latent_model_input, t).astype(np.float16)", 2),
    ("2 [0]", "scale_model_input(latent_model_input, t)", "scale_model_input(latent_model_input, t)[0]", 2),
    ("3 shape axis=1", "np.split(noise_pred, 2)", "np.split(noise_pred, 2, axis=1)", 3),
    ("3 batch 2B", "np.split(noise_pred, 2)", "noise_pred, noise_pred", 3),
    ("3 [0]", "np.split(noise_pred, 2)", "noise_pred[0], noise_pred[1]", 3),
    ("3 dtype float16", "noise_pred = noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)",
     "noise_pred = (noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)).astype(np.float16)", 3),
    ("3 NameError", "(noise_pred_text - noise_pred_uncond)", "(noise_pred_txt - noise_pred_uncond)", 3),
    ("3 own raise", "np.split(noise_pred, 2)", "np.split(noise_pred, 2)\n        raise RuntimeError('my own check failed')", 3),
    ("3 own helper raises", "        noise_pred = noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)\n",
     "        def guide(u, c):\n            raise RuntimeError('not written yet')\n        noise_pred = guide(noise_pred_uncond, noise_pred_text)\n", 3),
    ("3 exit()", "noise_pred = noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)", "raise SystemExit(0)", 3),
    ("3 KeyboardInterrupt", "noise_pred = noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)", "raise KeyboardInterrupt", 3),
    ("3 syntax error", "(noise_pred_text - noise_pred_uncond)", "(noise_pred_text - noise_pred_uncond", None),
    ("4 batch 2B", "scheduler.step(noise_pred, t, latents)", "scheduler.step(noise_pred, t, latent_model_input)", 4),
    ("4 shape", ".prev_sample", ".prev_sample[:, :2]", 4),
    ("4 dtype float16", ".prev_sample", ".prev_sample.astype(np.float16)", 4),
    ("4 dtype int", ".prev_sample", ".prev_sample.astype(int)", 4),
    ("4 output kept", ".prev_sample\n", "\n", 4),
    ("4 output as sample", "scheduler.step(noise_pred, t, latents).prev_sample", "scheduler.step(noise_pred, t, scheduler.step(noise_pred, t, latents))", 4),
    ("5 batch 2B latent_model_input", "latents / vae.config.scaling_factor", "latent_model_input / vae.config.scaling_factor", 5),
    ("5 batch 2B doubled", "latents / vae.config.scaling_factor", "np.concatenate([latents] * 2) / vae.config.scaling_factor", 5),
    ("5 shape", "latents / vae.config.scaling_factor", "latents[:, :2] / vae.config.scaling_factor", 5),
    ("5 dtype float16", "latents / vae.config.scaling_factor", "(latents / vae.config.scaling_factor).astype(np.float16)", 5),
    ("5 dtype int", "latents / vae.config.scaling_factor", "(latents / vae.config.scaling_factor).astype(int)", 5),
    ("5 [0]", "latents / vae.config.scaling_factor", "latents[0] / vae.config.scaling_factor", 5),
    ("5 batch empty", "latents / vae.config.scaling_factor", "latents[:0] / vae.config.scaling_factor", 5),
    ("5 output decoded", "latents / vae.config.scaling_factor", "scheduler.step(noise_pred, t, latents)", 5),
]  # fmt: skip


@pytest.mark.parametrize("old, new, number", [v[1:] for v in ODD], ids=[v[0] for v in ODD])
def test_odd_input_gets_a_message_naming_the_blank_never_a_traceback(tmp_path, run_here, old, new, number):  # fmt: skip
    """The plain run and --check each exit 1 and name the blank (or the reader's line) on
    odd input: a wrong batch, shape or dtype, a SchedulerOutput where an array goes, [0]
    on an array, a NameError, the reader's own raise, a syntax error; no traceback. Run in
    this process (run_here), but for the syntax error, which Python reports before any of
    the file runs: that one runs as a subprocess."""
    source = filled(old, new)
    parts = [part.strip() for part in new.splitlines() if part.strip()]
    mine = [k + 1 for k, line in enumerate(source.splitlines()) if any(p in line for p in parts)]
    for argv in [], ["--check"]:
        run = run_copy(tmp_path, source, *argv) if number is None else run_here(source, *argv)
        out = run.stdout + run.stderr
        assert run.returncode == 1 and "Traceback" not in out, out
        if number is None:  # Python's own SyntaxError: the file, the reader's line, one caret
            assert "SyntaxError" in run.stderr and f"line {mine[0]}" in run.stderr, out
            continue
        verdict = run.stdout.splitlines()[1 if argv else 0]  # --check prints a header first
        assert re.search(rf"\bblank {number}\b", verdict), out
        if "raised" in verdict:  # the reader's own line failed: its line is named
            assert any(f"line {k}" in verdict for k in mine), out


def test_the_diffusers_idiom_step_0_is_prev_sample(run_here):
    """scheduler.step(...)[0] is prev_sample, as diffusers' BaseOutput[0]: the checker passes it."""
    for argv in [], ["--check"]:
        run = run_here(filled(".prev_sample", "[0]"), *argv)
        assert run.returncode == 0 and run.stderr == "", run.stdout + run.stderr
    assert "all 5 blanks match" in run.stdout


def test_the_checker_reports_your_own_error_by_line(run_here):
    """An error in the reader's own code (not a part's call) is reported with its line."""
    source = filled("np.split(noise_pred, 2)", "np.split(noise_pred, 3)")
    run = run_here(source, "--check")
    line = source.splitlines().index("        noise_pred_uncond, noise_pred_text = np.split(noise_pred, 3)") + 1  # fmt: skip
    assert run.returncode == 1 and run.stderr == ""
    assert f"your pipeline raised ValueError at line {line}" in run.stdout


def test_the_checker_names_the_variable_passed_in_place_of_the_right_one(run_here):
    source = filled("step(noise_pred, t, latents)", "step(noise_pred_text, t, latents)")
    run = run_here(source, "--check")
    assert "(your noise_pred matches the solution's; blank 4 passes noise_pred_text instead)" in run.stdout  # fmt: skip
    source = filled("scale_model_input(latent_model_input, t)", "scale_model_input(latents, t)")
    run = run_here(source, "--check")
    assert "blank 2 differs from the solution (step 1 of 20)" in run.stdout
    assert "blank 2 passes latents instead" in run.stdout


@pytest.mark.parametrize("argv", [[], ["--check"]], ids=["run", "check"])
def test_the_whole_step_output_kept_is_blamed_on_blank_4_not_where_it_fails(run_here, argv):
    """Without .prev_sample the loop fails at the next doubling (blank 1's line): blank 4 is named."""
    run = run_here(filled(".prev_sample\n", "\n"), *argv)
    assert run.returncode == 1 and run.stderr == "", run.stderr
    assert run.stdout.count("blank 4 is wrong: latents is a SchedulerOutput, not an array") == 1
    assert "so your pipeline raised ValueError at line " in run.stdout


@pytest.mark.parametrize("argv", [[], ["--check"]], ids=["run", "check"])
def test_an_error_in_your_code_is_one_line_with_its_blank_never_a_traceback(run_here, argv):
    """torch's .chunk on a NumPy array: the run and the checker name the line and blank 3."""
    source = filled("np.split(noise_pred, 2)", "noise_pred.chunk(2)")
    line = source.splitlines().index("        noise_pred_uncond, noise_pred_text = noise_pred.chunk(2)") + 1  # fmt: skip
    run = run_here(source, *argv)
    assert run.returncode == 1 and run.stderr == "", run.stderr
    assert f"your pipeline raised AttributeError at line {line} (in blank 3): " in run.stdout


@pytest.mark.parametrize("argv", [[], ["--check"]], ids=["run", "check"])
@pytest.mark.parametrize(
    "returned, what", [("latents", "(8, 4, 4, 4) float64"), ("None", "a NoneType")]
)
def test_the_run_and_the_checker_judge_the_returned_images_too(run_here, argv, returned, what):
    """Every call can match and the function still return the wrong thing."""
    run = run_here(filled("    return image\n", f"    return {returned}\n"), *argv)
    assert run.returncode == 1 and run.stderr == ""
    assert (
        f"your pipeline() returns {what}; return the decoded images, (8, 3, 32, 32) float64"
        in run.stdout
    )


def test_scale_model_input_and_scaling_factor_mistakes_show_their_factor(run_cli):
    run = run_cli(READER, "--demo-wrong", "5")
    assert "yours is 0.4778 x the solution's, everywhere" in run.stdout
    g = run_cli(READER, "--demo-wrong", "2")
    assert "the solution calls scheduler.scale_model_input here; yours calls unet" in g.stdout
    assert "scheduler.step warned: call scale_model_input before step" in g.stdout


@pytest.mark.parametrize("number", range(1, 6))
def test_demo_wrong_plants_the_mistake_and_the_checker_names_it(run_cli, number):
    run = run_cli(READER, "--demo-wrong", str(number))
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert f"blank {number} differs from the solution" in run.stdout


def test_a_carried_x0_is_caught_one_step_late(run_cli):
    """step's inputs are right at step 1; what the loop keeps of its output shows at step 2."""
    run = run_cli(READER, "--demo-wrong", "4")
    assert "blank 4 differs from the solution (step 2 of 20)" in run.stdout


#: blank-4 mistakes seen only in the latents handed to the decoder: (old, new, flags)
LAST_STEP = [
    (".prev_sample", ".pred_original_sample", ["--steps", "1", "--scheduler", "ddim"]),
    (".prev_sample", ".prev_sample.astype(np.float32)", ["--steps", "1", "--scheduler", "ddim"]),
    (".prev_sample", ".prev_sample * 1.01", ["--steps", "1", "--scheduler", "ddim"]),
    (".prev_sample", ".prev_sample * (1.01 if t == scheduler.timesteps[-1] else 1)", []),
]


@pytest.mark.parametrize("old, new, flags", LAST_STEP, ids=["x0", "float32", "x1.01", "last only"])
def test_a_blank_4_mistake_seen_only_by_the_decoder_is_blamed_on_blank_4(run_here, old, new, flags):
    """When the decoder's input differs because the latents the last step left differ, the
    checker names blank 4, not blank 5 (the one-step-late rule, for the decoder)."""
    run = run_here(filled(old, new), "--check", *flags)
    assert run.returncode == 1 and run.stderr == "", run.stdout + run.stderr
    assert "blank 4 differs from the solution (after the loop)" in run.stdout, run.stdout
    assert "your latents after the loop differ" in run.stdout
    if "float32" in new:  # the plain run's contract check says the same
        plain = run_here(filled(old, new), *flags)
        assert plain.stdout.startswith("blank 4 breaks the contract (after the loop)"), plain.stdout


def test_with_one_step_the_checker_names_blank_4_for_ddim_and_sees_nothing_for_euler(run_cli):
    """--demo-wrong 4 --steps 1: DDIM's pred_original_sample differs from prev_sample, so the
    checker names blank 4; Euler's last step goes to sigma 0, where the two are equal."""
    ddim = run_cli(READER, "--demo-wrong", "4", "--steps", "1", "--scheduler", "ddim")
    assert "blank 4 differs from the solution (after the loop)" in ddim.stdout, ddim.stdout
    euler = run_cli(READER, "--demo-wrong", "4", "--steps", "1")
    assert "all 5 blanks match: 4 calls compared (1 step)" in euler.stdout, euler.stdout
    assert (
        "Euler's last step goes to sigma 0, where prev_sample is pred_original_sample"
        in euler.stdout
    )


@pytest.mark.parametrize(
    ("old", "new", "number"),
    [
        (
            (
                "latent_model_input = np.concatenate([latents] * 2)",
                "scheduler.scale_model_input(latent_model_input, t)",
            ),
            (
                "latent_model_input = latents",
                "np.concatenate([scheduler.scale_model_input(latent_model_input, t)] * 2)",
            ),
            1,
        ),
        (  # blank 1 doubles as given; blank 2 scales your latents and doubles them itself
            "latent_model_input = scheduler.scale_model_input(latent_model_input, t)",
            "latent_model_input = np.concatenate([scheduler.scale_model_input(latents, t)] * 2)",
            2,
        ),
    ],
    ids=["in blank 1", "in blank 2"],
)
def test_scaling_b_rows_then_doubling_gives_the_same_images_and_is_still_flagged(run_here, old, new, number):  # fmt: skip
    """Scaling the B latents and then doubling gives bit-identical images (Euler's scale is one
    number per step), but diffusers doubles first: the run and the checker flag step 1's
    scale_model_input, which gets B rows, and name the blank that scaled them (blank 1 leaving
    B rows, with a note on diffusers' order; blank 2 scaling your latents: blank 2)."""
    source = filled(old, new)
    check = run_here(source, "--check")
    assert check.returncode == 1 and f"blank {number} differs from the solution (step 1 of 20)" in check.stdout, check.stdout  # fmt: skip
    assert "scheduler.scale_model_input(sample=...)" in check.stdout
    assert "(8, 4, 4, 4) float64" in check.stdout
    assert "images: max |yours - solution| 0\n" in check.stdout
    plain = run_here(source)
    assert plain.returncode == 1 and plain.stdout.startswith(
        f"blank {number} breaks the contract (step 1 of 20): scheduler.scale_model_input(sample=...) gets (8, 4, 4, 4)"
    ), plain.stdout  # fmt: skip
    if number == 1:  # blank 1 left B rows: the note says whose order the checker follows
        assert (
            "diffusers doubles, then scales" in check.stdout and "diffusers doubles" in plain.stdout
        )


def test_an_if_guide_branch_is_told_the_toy_loop_always_guides(run_here):
    """rebuild_diffusers.py's `if guide` branch, copied, breaks the toy's contract at
    --guidance-scale 0; the note that the toy loop always guides comes with that message."""
    source = filled("latent_model_input = np.concatenate([latents] * 2)",
                    "latent_model_input = np.concatenate([latents] * 2) if guidance_scale > 1 else latents")  # fmt: skip
    run = run_here(source, "--guidance-scale", "0")
    assert run.returncode == 1 and "blank 1 breaks the contract" in run.stdout, run.stdout
    assert "StableDiffusionPipeline does not guide at guidance_scale <= 1" in run.stdout


def test_messages_name_your_file_and_count_in_words(run_here, run_lab):
    """A copy named mine.py is told to find the blank in mine.py; one step is "1 step"."""
    describe = run_lab(READER, "--solution")["describe"]
    assert describe(1) == "an int" and describe(None) == "a NoneType"
    run = run_here(text("rebuild_pipeline.py"), "--check", name="mine.py")
    assert "find blank(1) in mine.py" in run.stdout and "rebuild_pipeline.py" not in run.stdout
    run = run_here(filled(), "--steps", "1")
    assert "1 step of EulerDiscreteScheduler" in run.stdout and "unet: 1 call on" in run.stdout


@pytest.mark.parametrize("argv", [[], ["--check"]], ids=["run", "check"])
def test_errors_outside_the_blanks_and_in_the_call_itself_say_so(run_here, argv):
    """An error on a given line names no blank and says so; a renamed parameter is reported
    as the call of pipeline() failing, not as "line None"; diffusers' return_dict gets a hint."""
    source = filled("num_inference_steps, guidance_scale,\n", "steps, guidance_scale,\n")
    run = run_here(source, *argv)
    assert (
        "calling your pipeline() raised TypeError" in run.stdout and "line None" not in run.stdout
    )
    source = filled(
        "    scheduler.set_timesteps(num_inference_steps)", "    scheduler.set_timesteps(-1)"
    )
    run = run_here(source, *argv)
    assert "outside the blanks" in run.stdout, run.stdout
    source = filled(
        "step(noise_pred, t, latents).prev_sample",
        "step(noise_pred, t, latents, return_dict=False)[0]",
    )
    run = run_here(source, *argv)
    assert "the toy's step has no return_dict: step(...)[0] or .prev_sample" in run.stdout, (
        run.stdout
    )


def test_figures(tmp_path, run_cli):
    run = run_cli(READER, "--solution", "--figures", str(tmp_path))
    assert run.returncode == 0 and run.stderr == "", run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"mistakes"}
    assert (tmp_path / "mistakes.png").stat().st_size <= 60_000
    assert len(manifest["mistakes"]["alt"]) > 80


@pytest.mark.parametrize(
    "argv",
    [["--steps", "0"], ["--prompt", "cat"], ["--guidance-scale", "-1"], ["--demo-wrong", "6"],
     ["--scheduler", "pndm"], ["--num-samples", "0"], ["--scheduler", "ddim", "--steps", "1000"],
     ["--check", "--figures", "figures"]],
    ids=" ".join,
)  # fmt: skip
@pytest.mark.parametrize("solution", [[], ["--solution"]], ids=["reader", "solution"])
def test_bad_arguments(run_here, solution, argv):
    """Each bad flag: one line on stderr, exit 2, before any part is built (run in this process)."""
    run = run_here(text("rebuild_pipeline.py"), *solution, *argv)
    assert run.returncode == 2 and run.stdout == ""
    assert len(run.stderr.splitlines()) == 1 and ": error: " in run.stderr


def test_a_copy_away_from_the_repository_with_numpy_alone_says_so_in_one_line(tmp_path):
    """The page's setup, a Python with NumPy and nothing else: a copy of the file outside the
    repository (no labkit beside it, no PYTHONPATH) prints one line and exits 2."""
    numpy_only = tmp_path / "site"
    numpy_only.mkdir()
    for package in ["numpy", "numpy.libs"]:  # NumPy's package and its bundled libraries
        source = ROOT / ".venv/lib/python3.11/site-packages" / package
        if source.exists():
            (numpy_only / package).symlink_to(source)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(FOLDER / "rebuild_pipeline.py", alone)
    for argv in [], ["--check"]:
        run = subprocess.run(
            [sys.executable, "-S", str(alone / "rebuild_pipeline.py"), *argv],
            cwd=alone, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(numpy_only)},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and "labkit (code/labkit) is not beside this file" in lines[0], lines


def test_a_copy_away_from_solution_py_says_so_in_one_line(tmp_path):
    """A reader who copies the file elsewhere and runs --check gets one line, not a traceback."""
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(FOLDER / "rebuild_pipeline.py", alone)
    env = dict(starter_env(), PYTHONPATH=str(ROOT / "code"))
    run = subprocess.run(
        [sys.executable, str(alone / "rebuild_pipeline.py"), "--check"],
        cwd=alone, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "solution.py is not beside this file" in lines[0]
