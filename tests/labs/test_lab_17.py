"""Lab 17 Rebuild the Pipeline: the parts and the plain run (rebuild_pipeline.py), the blanks
the reader fills in it, the solution (pipeline_solution.txt) and check_pipeline.py, which
checks them blank by blank with labkit.blanks.check_function, as labs 03, 13, 16 and 20 do."""

import ast
import functools
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from infralens_docs.registry import ROOT, load_labs
from infralens_docs.runner import starter_env
from tests.labs.exercise import Exercise, function_lines

FOLDER = ROOT / "code/lab-17-rebuild-the-pipeline"
READER = "code/lab-17-rebuild-the-pipeline/rebuild_pipeline.py"
LAB_12 = "code/lab-12-end-to-end-inference-trace/pipeline_trace.py"
CHECKER, BLANKS, SOLUTION = "check_pipeline.py", "rebuild_pipeline.py", "pipeline_solution.txt"
LEVEL_1 = Exercise(FOLDER, CHECKER, BLANKS, SOLUTION, "pipeline")
LEVEL_2 = Exercise(FOLDER, CHECKER, BLANKS, SOLUTION, "pipeline_any_scale")
MISTAKES = LEVEL_1.mistakes()


def text(name):
    return (FOLDER / name).read_text(encoding="utf-8")


def reader_file(fill=(), mistake=None):
    """rebuild_pipeline.py with the blanks in ``fill`` (1-9, both levels) written as the
    solution writes them, ``mistake`` (a key of MISTAKES) planted in its blank."""
    ones = LEVEL_1.reader_file([k for k in fill if k <= 6], mistake if mistake and MISTAKES[mistake][0] <= 6 else None)  # fmt: skip
    twos = LEVEL_2.reader_file([k for k in fill if k > 6], mistake if mistake and MISTAKES[mistake][0] > 6 else None)  # fmt: skip
    shipped = text(BLANKS).splitlines()
    merged = [a if a != s else b for a, b, s in zip(ones.splitlines(), twos.splitlines(), shipped, strict=True)]  # fmt: skip
    return "\n".join(merged) + "\n"


def blank_line(number):
    """The line of the first blank(number) in the shipped file."""
    return next(i for i, line in enumerate(text(BLANKS).splitlines(), 1) if f"= blank({number})" in line)  # fmt: skip


def fill_line(number, line, fill=None, nth=0):
    """reader_file with blanks ``fill`` (default: up to ``number``) and the ``nth`` line of
    blank ``number`` replaced by ``line`` (its indentation kept)."""
    source = reader_file(fill or range(1, number + 1)).splitlines()
    at = [i for i, s in enumerate(text(BLANKS).splitlines()) if f"= blank({number})" in s][nth]
    indent = source[at][: len(source[at]) - len(source[at].lstrip())]
    source[at] = "\n".join(indent + part for part in line.split("\n"))
    return "\n".join(source) + "\n"


@pytest.fixture
def check(tmp_path, monkeypatch, capsys):
    """Run a copy of check_pipeline.py beside a reader's rebuild_pipeline.py ``source`` (in
    this process): (exit code, stdout, stderr)."""
    return functools.partial(LEVEL_1.run, tmp_path, monkeypatch, capsys)


# --------------------------------------------------------------------------- the files


@pytest.mark.parametrize(
    "exercise, numbers",
    [(LEVEL_1, [1, 2, 3, 4, 4, 5, 6]), (LEVEL_2, [7, 7, 8, 9, 9, 9, 9, 9])],
    ids=["pipeline", "pipeline_any_scale"],
)
def test_the_solution_is_the_readers_function_filled_in_line_for_line(exercise, numbers):
    """Each function of the solution is the reader's with each blank's line replaced by its
    answer; no answer (nor the table of mistakes, which quotes them) is in the reader's file."""
    _, reader = function_lines(FOLDER / BLANKS, exercise.name)
    _, solution = function_lines(FOLDER / SOLUTION, exercise.name)
    changed = [(r, s) for r, s in zip(reader, solution, strict=True) if r != s]
    assert [int(re.search(r"blank\((\d)\)", r).group(1)) for r, _ in changed] == numbers
    assert not any("blank(" in s for _, s in changed)
    reader_file_text = text(BLANKS)
    if exercise is LEVEL_1:  # level 2's unet line is level 1's given line
        assert not any(s.split("  #")[0].strip() in reader_file_text for _, s in changed)
    assert "MISTAKES = {" not in reader_file_text


def test_the_solution_file_holds_the_two_functions_and_the_mistakes_only():
    """Everything else (parts, inputs, run, figures) lives once, in rebuild_pipeline.py."""
    body = ast.parse(text(SOLUTION)).body
    kinds = [type(node).__name__ for node in body]
    assert kinds == ["Expr", "Import", "ImportFrom", "FunctionDef", "FunctionDef", "Assign"]
    assert [body[3].name, body[4].name, body[5].targets[0].id] == ["pipeline", "pipeline_any_scale", "MISTAKES"]  # fmt: skip
    assert not (FOLDER / "solution.py").exists()


def test_the_registry_lists_the_checker_and_the_solution_as_a_file():
    """The lab's front matter lists its files: the starter and the checker (runnable: their
    notebook pages), the solution and rebuild_diffusers.py (not run), as lab 16 lists its own."""
    lab = next(lab for lab in load_labs() if lab.number == 17)
    assert [(s.path.name, s.runnable) for s in lab.starters] == [
        ("rebuild_pipeline.py", True), ("check_pipeline.py", True),
        ("pipeline_solution.txt", False), ("rebuild_diffusers.py", False),
    ]  # fmt: skip


def test_the_solution_is_no_page_nav_entry_or_search_result(built_site):
    """pipeline_solution.txt is no page of the site: no nav entry or search location names
    it, and the guide prints the checker's command and shows no answer line outside a
    collapsed fold."""
    docs = json.loads((built_site / "search" / "search_index.json").read_text())["docs"]
    locations = {doc["location"].split("#")[0] for doc in docs}
    assert not any("solution" in location for location in locations), locations
    pages = built_site / "code/lab-17-rebuild-the-pipeline"
    assert (pages / "rebuild_pipeline/index.html").is_file() and not list(
        pages.glob("*solution*/index.html")
    )
    page = (ROOT / "docs/labs/lab-17-rebuild-the-pipeline.md").read_text(encoding="utf-8")
    guide = page.split("\n---\n", 1)[1]  # the page below its front matter (the registry)
    assert "python3 code/lab-17-rebuild-the-pipeline/check_pipeline.py" in guide
    assert "pipeline_solution.txt:" not in guide and '--8<-- "code/lab-17-rebuild-the-pipeline/pipeline_solution' not in guide  # fmt: skip
    built = (built_site / "labs/lab-17-rebuild-the-pipeline/index.html").read_text(encoding="utf-8")
    assert not re.findall(r'<a href="[^"]*solution[^"]*"', built)


# --------------------------------------------------------------------------- the checker


def test_the_shipped_file_says_which_blanks_to_fill(check):
    """As shipped, all six blanks of level 1 are listed, each with its line: exit 0."""
    code, out, _ = check(text(BLANKS))
    lines = ", ".join(f"blank({k}) at line {blank_line(k)}" for k in range(1, 7))
    assert code == 0 and out == f"6 of 6 blanks not filled in yet in rebuild_pipeline.py: {lines}\n", out  # fmt: skip


def test_a_correct_fill_passes_and_offers_level_2_and_the_solution_flag_checks_both(check):
    code, out, _ = check(reader_file(range(1, 7)))
    assert code == 0 and out.startswith("all 6 blanks match the solution on 3 cases\nlevel 2 (optional)"), out  # fmt: skip
    code, out, _ = check(reader_file(range(1, 10)))
    assert code == 0 and out == "all 6 blanks match the solution on 3 cases\nlevel 2: all 3 blanks match the solution on 3 cases\n", out  # fmt: skip
    code, out, _ = check(text(BLANKS), "--solution")
    assert code == 0 and out.endswith("level 2: all 3 blanks match the solution on 3 cases\n"), out  # fmt: skip


#: (blank, a right line in other words, which of the blank's lines)
# fmt: off
OTHER_WORDS = [
    (2, "latent_model_input = np.concatenate([latents, latents])", 0),
    (4, "noise_pred_uncond, noise_pred_text = noise_pred[: len(noise_pred) // 2], noise_pred[len(noise_pred) // 2 :]", 0),
    (4, "noise_pred = (1 - guidance_scale) * noise_pred_uncond + guidance_scale * noise_pred_text", 1),
    (5, "latents = scheduler.step(noise_pred, t, latents)[0]", 0),  # diffusers' idiom
    (6, "latents = latents * (1 / vae.config.scaling_factor)", 0),
]
# fmt: on


@pytest.mark.parametrize("number, line, nth", OTHER_WORDS)
def test_a_correct_answer_in_other_words_passes(check, number, line, nth):
    """Slicing for np.split, the other form of the guidance line, step(...)[0] (labkit's
    output indexes like diffusers'), a division written as a product: all pass."""
    code, out, _ = check(fill_line(number, line, fill=range(1, 7), nth=nth))
    assert code == 0 and out.startswith("all 6 blanks match"), out


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_typical_mistake_names_its_line_and_gets_its_hint(check, mistake):
    """Each typical mistake (a sign, an order, a ratio, a missing call, the wrong field, a
    level-2 rule), with the blanks before it right and the later ones still empty: exit 1,
    its blank and line named, and its own hint."""
    number, _, _, hint = MISTAKES[mistake]
    fill = range(1, number + 1) if number <= 6 else [*range(1, 7), *range(7, number + 1)]
    code, out, _ = check(reader_file(fill, mistake))
    assert code == 1 and f"blank {number} differs from the solution" in out, out
    assert f"rebuild_pipeline.py line {blank_line(number)}" in out or number in (4, 7), out
    assert f"hint: {hint}" in out, out


def test_a_wrong_guidance_line_is_caught_before_the_step_is_written(check):
    """Blank 4 (the guidance line) with its sign flipped and blank 5 (the step) still a
    placeholder: named at step 1, with the sign hint, before the step exists."""
    code, out, _ = check(reader_file(range(1, 5), "guidance-sign"))
    assert code == 1 and out.startswith("blank 4 differs from the solution (euler, 4 steps, B = 2, guidance_scale 7.5, step 1 of 4)"), out  # fmt: skip
    assert "hint: the sign" in out


def test_swapping_both_orders_is_flagged_on_blank_1():
    """Swap the condition order and np.split's: the images agree, but blank 1 is named."""
    source = reader_file(range(1, 7), "order-swapped").replace(
        "noise_pred_uncond, noise_pred_text = np.split(noise_pred, 2)",
        "noise_pred_text, noise_pred_uncond = np.split(noise_pred, 2)",
    )
    assert source.count("noise_pred_text, noise_pred_uncond = np.split") == 1
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        for name in (CHECKER, SOLUTION):
            shutil.copy(FOLDER / name, Path(folder) / name)
        (Path(folder) / BLANKS).write_text(source)
        run = subprocess.run([sys.executable, str(Path(folder) / CHECKER)], capture_output=True, text=True, env=starter_env(), timeout=120)  # fmt: skip
    assert run.returncode == 1 and run.stdout.startswith("blank 1 differs"), run.stdout + run.stderr
    assert "hint: the order" in run.stdout


#: (blank, the reader's line, which of the blank's lines, what the one-line error says)
# fmt: off
ODD = {
    "a wrong batch": (
        1,
        "prompt_embeds = prompt_embeds",
        0,
        "prompt_embeds is int64 of shape (2,); the solution's is int64 of shape (4,)",
    ),
    "a wrong shape": (
        4,
        "noise_pred_uncond, noise_pred_text = noise_pred[0], noise_pred[1]",
        0,
        "is float64 of shape (4, 4, 4); the solution's is float64 of shape (2, 4, 4, 4)",
    ),
    "a wrong dtype": (
        3,
        "latent_model_input = scheduler.scale_model_input(latent_model_input, t).astype(np.float32)",
        0,
        "latent_model_input is float32 of shape (4, 4, 4, 4); the solution's is float64",
    ),
    "a SchedulerOutput": (
        5,
        "latents = scheduler.step(noise_pred, t, latents)",
        0,
        "latents is a SchedulerOutput",
    ),
    "[0] on the unet's output": (
        2,
        "latent_model_input = np.concatenate([latents] * 2)[0]",
        0,
        "latent_model_input is float64 of shape (4, 4, 4); the solution's is float64 of shape (4, 4, 4, 4)",
    ),
    "syntax error": (
        4,
        "noise_pred = noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond",
        1,
        "syntax error: '(' was never closed",
    ),
    "an exception": (
        3,
        "latent_model_input = scheduler.scale(latent_model_input, t)",
        0,
        "AttributeError: 'EulerDiscreteScheduler' object has no attribute 'scale'",
    ),
    "exit()": (5, "latents = exit()", 0, "SystemExit: exit() ends the whole check"),
    "return_dict": (
        5,
        "latents = scheduler.step(noise_pred, t, latents, return_dict=False)[0]",
        0,
        "TypeError: EulerDiscreteScheduler.step() got an unexpected keyword argument 'return_dict'",
    ),
    "a yield": (1, "prompt_embeds = yield", 0, "yield makes pipeline() a generator, which runs none of its lines"),
    "Ctrl-C": (
        3,
        "latent_model_input = scheduler.scale_model_input(latent_model_input, t)\nraise KeyboardInterrupt",
        0,
        "KeyboardInterrupt: interrupted (Ctrl-C) there",
    ),
}
# fmt: on


@pytest.mark.parametrize("case", list(ODD))
def test_odd_input_is_one_line_exit_2_naming_the_readers_line(check, case):
    """Each blank given a wrong batch, shape or dtype, a SchedulerOutput kept, [0] on an
    array, a syntax error, an exception, exit(), a yield, Ctrl-C on a loop that does not end:
    one line on stderr, exit 2, naming the file and the reader's line (and its blank, once it runs)."""
    number, line, nth, said = ODD[case]
    code, out, err = check(fill_line(number, line, nth=nth))
    at = [i for i, s in enumerate(text(BLANKS).splitlines(), 1) if f"= blank({number})" in s][nth] + (case == "Ctrl-C")  # fmt: skip
    assert code == 2 and out == "", out
    assert err.count("\n") == 1 and err.startswith(f"check_pipeline.py: error: rebuild_pipeline.py line {at}"), err  # fmt: skip
    assert said in err and (f"(blank {number})" in err) == (case != "syntax error"), err


def test_a_loop_that_stops_early_is_caught():
    """A ``break`` after the step (one step of four): the decoder's input differs, named at
    blank 6's line, with the hint that a line outside the blanks may be the cause."""
    from labkit.blanks import check_function  # the checker's own call, on a file with a break

    source = reader_file(range(1, 7)).replace(
        "        latents = scheduler.step(noise_pred, t, latents).prev_sample\n",
        "        latents = scheduler.step(noise_pred, t, latents).prev_sample\n        break\n",
    )
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / BLANKS
        path.write_text(source)
        g = LEVEL_1.run_in_place("--solution")
        verdict = check_function(path, "pipeline", FOLDER / SOLUTION, g["CASES"], blanks=6, rounds="step", contract=True)  # fmt: skip
    assert verdict.code == 1 and "blank 6 differs" in verdict.report, verdict.report


def test_level_2_always_doubling_is_one_line_at_guidance_1(check):
    """Level 2 with do_classifier_free_guidance right but the latents doubled anyway: at
    guidance_scale 1 the unet gets 2B latent rows and B condition rows and fails there: one
    line, exit 2, naming the unet's line in blank 9."""
    source = fill_line(9, "latent_model_input = scheduler.scale_model_input(np.concatenate([latents] * 2), t)", fill=range(1, 10))  # fmt: skip
    code, out, err = check(source)
    assert code == 2 and out == "" and err.count("\n") == 1, out + err
    assert f"rebuild_pipeline.py line {blank_line(9) + 1} (blank 9): ValueError" in err and "(level 2: euler, 3 steps, B = 2, guidance_scale 1)" in err, err  # fmt: skip


def test_the_guide_rule_hint_names_stable_diffusion_pipeline_not_all_of_diffusers(check):
    """Level 2's blank 7 as `guidance_scale >= 1`: named at the guidance_scale 1 case, and the
    hint states StableDiffusionPipeline's rule, not diffusers': LDMTextToImagePipeline guides
    at any guidance_scale != 1 and ZImagePipeline at any > 0, 1 included (diffusers 0.42.1)."""
    source = fill_line(7, "do_classifier_free_guidance = guidance_scale >= 1", fill=range(1, 10))
    code, out, _ = check(source)
    assert code == 1 and "blank 7 differs" in out and "guidance_scale 1)" in out, out
    assert "hint: StableDiffusionPipeline guides only when guidance_scale > 1" in out, out
    assert "diffusers guides" not in out, out


def test_the_order_hint_names_stable_diffusion_pipeline_not_all_of_diffusers(check):
    """A swapped blank 1 gets the order hint, and it states StableDiffusionPipeline's order,
    not one of all of diffusers (StableDiffusionInstructPix2PixPipeline puts the prompt's rows
    first); the starter's blank-1 comment, shown on the page, says the same."""
    code, out, _ = check(reader_file([1], "order-swapped"))
    assert code == 1 and out.startswith("blank 1 differs"), out
    assert "hint: the order: StableDiffusionPipeline puts the negative prompt's rows first" in out
    comment = " ".join(text(BLANKS).split("# BLANK 1 of 6")[1].split("prompt_embeds =")[0].split())
    assert "StableDiffusionPipeline # puts the negative prompt's rows first" in comment, comment
    assert "diffusers puts" not in out + comment


def test_level_2_needs_the_generator_in_step(check):
    """DDPM adds noise in step: a loop that does not pass the generator draws other noise,
    and blank 9 is named at step 1."""
    source = reader_file(range(1, 10)).replace("latents, generator=generator).prev_sample", "latents).prev_sample")  # fmt: skip
    code, out, _ = check(source)
    assert code == 1 and out.startswith("all 6 blanks match"), out
    assert "blank 9 differs from the solution (level 2: ddpm, 3 steps, B = 2, guidance_scale 7.5, step 1 of 3)" in out, out  # fmt: skip


LEVEL_2_OMISSIONS = {
    8: ("generator.standard_normal(shape) * scheduler.init_noise_sigma", "generator.standard_normal(shape)"),
    9: (
        "scheduler.scale_model_input(np.concatenate([latents] * 2) if do_classifier_free_guidance else latents, t)",
        "np.concatenate([latents] * 2) if do_classifier_free_guidance else latents",
    ),
}  # fmt: skip


@pytest.mark.parametrize("number", list(LEVEL_2_OMISSIONS))
def test_level_2_needs_init_noise_sigma_and_scale_model_input(check, number):
    """Level 2 is the loop __call__ runs: without init_noise_sigma (blank 8) or without
    scale_model_input (blank 9) it differs, named on its Euler case at guidance_scale 1
    (DDPM's init_noise_sigma is 1 and its scale_model_input the identity)."""
    old, new = LEVEL_2_OMISSIONS[number]
    source = reader_file(range(1, 10))
    assert source.count(old) == 1
    code, out, _ = check(source.replace(old, new))
    assert code == 1 and out.startswith("all 6 blanks match"), out
    assert f"blank {number} differs from the solution (level 2: euler, 3 steps, B = 2, guidance_scale 1" in out, out  # fmt: skip


@pytest.mark.parametrize(
    "number, line, fill",
    [
        (1, "prompt_embeds = np.concatenate([prompt_embeds] * 2)", range(1, 2)),
        (
            1,
            "prompt_embeds = np.stack([negative_prompt_embeds, prompt_embeds], 1).ravel()",
            range(1, 2),
        ),
        (7, "do_classifier_free_guidance = guidance_scale < 1", range(1, 8)),
    ],
    ids=["prompt twice", "rows interleaved", "guidance flag flipped"],
)
def test_a_label_or_flag_difference_gets_no_timestep_hint(check, number, line, fill):
    """The condition rows are class labels and blank 7's value a flag: a wrong one is named
    without the integer-grid hints meant for timesteps (rounding, an offset)."""
    code, out, _ = check(fill_line(number, line, fill=fill))
    assert code == 1 and f"blank {number} differs from the solution" in out, out
    assert "hint:" not in out, out


def test_a_warning_is_said_only_when_the_readers_own_run_gave_it(check):
    """scale_model_input called twice: blank 3 differs, and no 'a part warned' line (the
    planted no-scale-model-input copy the check runs for its hints warns, the reader's loop
    does not); level 2 without scale_model_input on Euler: the reader's own warning is said."""
    twice = "latent_model_input = scheduler.scale_model_input(scheduler.scale_model_input(latent_model_input, t), t)"  # fmt: skip
    code, out, _ = check(fill_line(3, twice, fill=range(1, 7)))
    assert code == 1 and "blank 3 differs" in out and "warned" not in out, out
    old, new = LEVEL_2_OMISSIONS[9]
    code, out, _ = check(reader_file(range(1, 10)).replace(old, new))
    assert code == 1 and out.endswith("a part warned during your runs: call scale_model_input before step: the model needs x / sqrt(sigma^2 + 1)\n"), out  # fmt: skip


# --------------------------------------------------------------------------- the plain run


@pytest.mark.parametrize("scale", ["7.5", "1", "0"])
def test_the_solution_reproduces_lab_12_with_its_scheduler_above_guidance_1(run_lab, scale):
    """With DDIM at --guidance-scale above 1, the solution's pipeline() gives exactly Lab 12's
    images for the same flags; at 1 or below Lab 12 follows StableDiffusionPipeline and stops guiding, the
    toy loop does not, so they differ (at 1 only by rounding, at 0 visibly)."""
    flags = ["--scheduler", "ddim", "--prompt", "hbar", "--steps", "10", "--seed", "3"]
    ours = run_lab(READER, "--solution", *flags, "--guidance-scale", scale)["image"]
    theirs = run_lab(LAB_12, *flags[2:], "--guidance-scale", scale)["image"]
    if float(scale) > 1:
        np.testing.assert_array_equal(ours, theirs)
    else:
        assert not np.array_equal(ours, theirs)
        assert (np.abs(ours - theirs).max() > 0.1) == (float(scale) == 0)


def test_level_2_at_any_scale_is_lab_12s_loop_with_ddim(run_lab):
    """Level 2's solution with DDIM follows StableDiffusionPipeline's rule: at guidance_scale 1 and 0 it
    gives Lab 12's images (the prompt's rows alone), as Lab 12 does for the same noise."""
    from labkit.blanks import load_function

    g = run_lab(READER, "--solution", "--scheduler", "ddim", "--prompt", "hbar", "--steps", "10", "--seed", "3")  # fmt: skip
    level_2 = load_function(FOLDER / SOLUTION, "pipeline_any_scale")
    for scale in ("1", "0", "7.5"):
        theirs = run_lab(LAB_12, "--prompt", "hbar", "--steps", "10", "--seed", "3", "--guidance-scale", scale)["image"]  # fmt: skip
        ours = level_2(g["unet"], g["make_scheduler"]("ddim"), g["vae"], g["class_labels"], g["negative_class_labels"], g["noise"].shape, np.random.default_rng(3), 10, float(scale))  # fmt: skip
        np.testing.assert_array_equal(ours, theirs)


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
    wrong = g["run"](g["load_solution"]("no-scale-model-input"))
    encode = lambda image: g["vae"].encode(image) * g["vae"].config.scaling_factor  # noqa: E731
    nearest, rms = g["training_set"].nearest(encode(wrong))
    ours, _ = g["training_set"].nearest(encode(g["image"]))
    assert rms.max() < 0.01 and (g["data"].labels[nearest] == g["SHAPES"].index("disc")).all()
    assert (nearest != ours).sum() > len(ours) // 2


@pytest.mark.parametrize("scale, purity", [("0", "25.0%"), ("1", "100.0%")])
def test_the_toy_loop_always_guides_and_says_so_at_guidance_scale_1_or_below(run_cli, scale, purity):  # fmt: skip
    """Level 1's loop has no guidance_scale <= 1 branch: at 0 it makes unconditional images
    (a quarter of them discs), at 1 the prompt's; the run says where StableDiffusionPipeline
    differs, and names that pipeline's rule as level 2's, not one rule of all of diffusers."""
    run = run_cli(READER, "--solution", "--guidance-scale", scale)
    assert run.returncode == 0 and run.stderr == ""
    assert f"nearest training latent has the prompt's label: {purity} of 8" in run.stdout
    assert "StableDiffusionPipeline does not guide at guidance_scale <= 1" in run.stdout
    assert "(level 2 runs StableDiffusionPipeline's rule)" in run.stdout
    assert "diffusers' rule" not in run.stdout
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


def test_the_plain_run_says_which_blank_is_next_and_an_error_is_one_line(run_cli, tmp_path):
    """As shipped: the next blank and its line, exit 0; a line of the reader's that raises:
    one line naming it and its blank, exit 2, no traceback."""
    run = run_cli(READER)
    assert run.returncode == 0 and run.stdout.startswith("blank 1 of 6 is not filled in yet: find blank(1) in rebuild_pipeline.py\n"), run.stdout  # fmt: skip
    path = tmp_path / BLANKS
    path.write_text(fill_line(3, "latent_model_input = scheduler.scale(latent_model_input, t)"))
    shutil.copy(FOLDER / SOLUTION, tmp_path / SOLUTION)
    run = subprocess.run([sys.executable, str(path)], env=dict(starter_env(), PYTHONPATH=str(ROOT / "code")), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.count("\n") == 1 and f"AttributeError at line {blank_line(3)} (blank 3)" in run.stderr, run.stderr  # fmt: skip


@pytest.mark.parametrize(
    "steps, raised",
    [
        ([], "line {b2} (blank 2) then raised ValueError"),
        (["--steps", "1"], "line {b6} (blank 6) then raised TypeError"),
    ],
    ids=["20 steps", "1 step"],
)
def test_the_plain_run_names_the_blank_that_kept_the_whole_step_output(tmp_path, steps, raised):
    """Blank 5 without .prev_sample keeps step's SchedulerOutput as latents; the next line
    that reads latents raises (blank 2's np.concatenate at the next step, blank 6's division
    at 1 step). The plain run names blank 5's line first, as check_pipeline.py does, then
    the line that raised: one line, exit 2, no traceback."""
    path = tmp_path / BLANKS
    kept = "latents = scheduler.step(noise_pred, t, latents)"
    path.write_text(fill_line(5, kept, fill=range(1, 7)))
    run = subprocess.run([sys.executable, str(path), *steps], env=dict(starter_env(), PYTHONPATH=str(ROOT / "code")), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2 and run.stdout == "" and run.stderr.count("\n") == 1, run.stdout + run.stderr  # fmt: skip
    assert "Traceback" not in run.stderr
    said = f"your pipeline()'s line {blank_line(5)} (blank 5) makes latents a SchedulerOutput, not an array, and "  # fmt: skip
    assert said in run.stderr, run.stderr
    assert raised.format(b2=blank_line(2), b6=blank_line(6)) in run.stderr, run.stderr


def test_the_plain_run_gives_a_syntax_error_as_pythons_own_message(tmp_path, check):
    """The page: an exception in the reader's lines is one line, a syntax error Python's own
    message (the file cannot catch its own); check_pipeline.py gives it in one line."""
    source = fill_line(1, "prompt_embeds = np.concatenate([negative_prompt_embeds, prompt_embeds]")
    path = tmp_path / BLANKS
    path.write_text(source)
    run = subprocess.run([sys.executable, str(path)], env=dict(starter_env(), PYTHONPATH=str(ROOT / "code")), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 1 and run.stderr.count("\n") > 1, run.stderr
    assert run.stderr.rstrip().endswith("SyntaxError: '(' was never closed"), run.stderr
    code, _, err = check(source)
    assert code == 2 and err.count("\n") == 1 and "syntax error: '(' was never closed" in err, err


def test_the_plain_run_says_exit_in_one_line(tmp_path):
    """exit() in a blank: one line saying what it does (SystemExit has no message of its own)."""
    path = tmp_path / BLANKS
    path.write_text(fill_line(6, "latents = exit()"))
    run = subprocess.run([sys.executable, str(path)], env=dict(starter_env(), PYTHONPATH=str(ROOT / "code")), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert f"SystemExit at line {blank_line(6)} (blank 6): exit() ends the run" in run.stderr, (
        run.stderr
    )


def test_eulers_init_noise_sigma_is_14_615_from_2_steps_on():
    """The page: init_noise_sigma is 14.615 from 2 steps on; at 1 step linspace's only
    timestep is 0, where it is 0.029 (the checker's third case)."""
    from labkit.schedulers import EulerDiscreteScheduler

    sd15 = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1)
    scheduler, found = EulerDiscreteScheduler(**sd15), {}
    for n in range(1, 1001):
        scheduler.set_timesteps(n)
        found.setdefault(round(float(scheduler.init_noise_sigma), 3), []).append(n)
    assert found == {0.029: [1], 14.615: list(range(2, 1001))}


def test_the_figures_rows_are_as_the_page_says(run_lab):
    """At the default flags: pred_original_sample carried gives one image eight times; the
    swapped order and the flipped sign go far outside the pixel range; without the division
    the images are the solution's at lower contrast (the affine decoder)."""
    g = run_lab(READER, "--solution")
    rows = {key: g["with_warnings"](g["run"], g["load_solution"](key))[0] for key in g["DRAWN"]}  # fmt: skip
    assert np.array_equal(rows["pred-original"], np.broadcast_to(rows["pred-original"][:1], rows["pred-original"].shape))  # fmt: skip
    assert all(np.abs(rows[key]).max() > 5 for key in ("order-swapped", "guidance-sign"))
    top, low = g["image"] - g["image"].mean(), rows["no-division"] - rows["no-division"].mean()
    assert np.corrcoef(top.ravel(), low.ravel())[0, 1] > 0.99 and low.std() < 0.6 * top.std()


def test_the_page_counts_the_typical_mistakes_the_figure_draws():
    """The page: "To see five typical mistakes' images at once": the figure draws DRAWN, some
    of the MISTAKES table's entries (not each), one row each."""
    from labkit.blanks import load_constant

    drawn = load_constant(FOLDER / BLANKS, "DRAWN")
    assert len(set(drawn)) == len(drawn) and set(drawn) < set(MISTAKES)
    word = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"][len(drawn)]  # fmt: skip
    page = (ROOT / "docs/labs/lab-17-rebuild-the-pipeline.md").read_text(encoding="utf-8")
    assert f"To see {word} typical mistakes' images at once" in page


def test_a_given_line_deleted_gets_no_in_place_hint(check):
    """The given init_noise_sigma line commented out: blank 2 is named (its latents differ from
    the solution's), without the hint that blank 2's lines changed latents in place: yours did
    not change, the solution's given line changed its own."""
    given = "    latents = latents * scheduler.init_noise_sigma"
    source = reader_file(range(1, 7))
    assert source.count(given) == 1
    code, out, _ = check(source.replace(given, "    # " + given.strip()))
    assert code == 1 and out.startswith("blank 2 differs from the solution"), out
    assert "in place" not in out, out


def test_the_plain_run_names_a_pipeline_that_returns_nothing_and_counts_one_call(tmp_path, run_cli):  # fmt: skip
    """A `return` in blank 6 (pipeline() returns None): one line, exit 2, not a silent exit 0;
    at --steps 1 the run says "1 call"."""
    path = tmp_path / BLANKS
    path.write_text(fill_line(6, "return", fill=range(1, 7)))
    run = subprocess.run([sys.executable, str(path)], env=dict(starter_env(), PYTHONPATH=str(ROOT / "code")), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2 and run.stdout == "" and run.stderr.count("\n") == 1, run.stdout + run.stderr  # fmt: skip
    assert "your pipeline() returns NoneType, not images (8, 3, 32, 32)" in run.stderr, run.stderr
    assert "unet: 1 call on 16 rows each\n" in run_cli(READER, "--solution", "--steps", "1").stdout


def test_figures(tmp_path, run_cli):
    run = run_cli(READER, "--solution", "--figures", str(tmp_path))
    assert run.returncode == 0 and run.stderr == "", run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"mistakes"}
    assert (tmp_path / "mistakes.png").stat().st_size <= 60_000
    assert len(manifest["mistakes"]["alt"]) > 80


@pytest.mark.parametrize(
    "argv",
    [["--steps", "0"], ["--prompt", "cat"], ["--guidance-scale", "-1"], ["--check"],
     ["--scheduler", "pndm"], ["--num-samples", "0"], ["--scheduler", "ddim", "--steps", "1000"]],
    ids=" ".join,
)  # fmt: skip
@pytest.mark.parametrize("solution", [[], ["--solution"]], ids=["reader", "solution"])
def test_bad_arguments(run_cli, solution, argv):
    """Each bad flag: one line on stderr, exit 2 (--check is the checker's now: an unknown flag)."""
    run = run_cli(READER, *solution, *argv)
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
    run = subprocess.run(
        [sys.executable, "-S", str(alone / "rebuild_pipeline.py")],
        cwd=alone, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(numpy_only)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "labkit (code/labkit) is not beside this file" in lines[0], lines


def test_a_copy_away_from_the_solution_says_so_in_one_line(tmp_path):
    """A reader who copies the file elsewhere and runs --solution gets one line, not a traceback."""
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(FOLDER / "rebuild_pipeline.py", alone)
    env = dict(starter_env(), PYTHONPATH=str(ROOT / "code"))
    run = subprocess.run(
        [sys.executable, str(alone / "rebuild_pipeline.py"), "--solution"],
        cwd=alone, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "pipeline_solution.txt is not beside this file" in lines[0]
