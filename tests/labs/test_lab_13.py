"""Lab 13 Few-Step Sampling: DPM-Solver++ 2M, the LCM step, spacing and Flux's shift, in NumPy."""

import functools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from labs.exercise import Exercise, function_lines

STARTER = "code/lab-13-few-step-sampling/few_step.py"


@pytest.fixture(scope="module")
def lab():
    """The starter's globals after a default run (module-scoped: one run for all tests),
    with what it printed under ``"printed"``."""
    import contextlib
    import io
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    argv, sys.argv = sys.argv, ["few_step.py"]
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            lab = runpy.run_path(str(ROOT / STARTER), run_name="__main__")
    finally:
        sys.argv = argv
    return {**lab, "printed": out.getvalue()}


def run(lab, scheduler, steps, ideal=False):
    """Drive one of the starter's schedulers through its own loop; (N, 2) samples."""
    return lab["sample"](scheduler, steps, lab["ode_endpoint_eps"] if ideal else lab["unet"])


def test_dpm_solver_first_order_is_ddim(lab):
    # at 2 steps both DPM-Solver++ steps are first order (no history, then the final step),
    # and first-order DPM-Solver++ is DDIM: same trailing grid, DDIM ending at alpha_bar = 1
    from labkit.schedulers import DDIMScheduler

    dpm = lab["DPMSolverMultistepScheduler"](lab["betas"], timestep_spacing="trailing")
    ddim = DDIMScheduler(clip_sample=False, set_alpha_to_one=True, timestep_spacing="trailing", **lab["SD_BETAS"])  # fmt: skip
    np.testing.assert_allclose(run(lab, dpm, 2), run(lab, ddim, 2), atol=1e-9)
    # at 4 steps the middle steps are second order: the result differs
    dpm = lab["DPMSolverMultistepScheduler"](lab["betas"], timestep_spacing="trailing")
    ddim = DDIMScheduler(clip_sample=False, set_alpha_to_one=True, timestep_spacing="trailing", **lab["SD_BETAS"])  # fmt: skip
    assert np.abs(run(lab, dpm, 4) - run(lab, ddim, 4)).max() > 1e-3


def test_dpm_solver_final_sigmas(lab):
    dpm = lab["DPMSolverMultistepScheduler"](lab["betas"], timestep_spacing="trailing")
    dpm.set_timesteps(4)
    assert dpm.timesteps.tolist() == [999, 749, 499, 249] and dpm.sigmas[-1] == 0
    dpm = lab["DPMSolverMultistepScheduler"](lab["betas"], final_sigmas_type="sigma_min")
    dpm.set_timesteps(4)
    ab0 = lab["alphas_cumprod"][0]
    assert dpm.sigmas[-1] == pytest.approx(((1 - ab0) / ab0) ** 0.5)


def test_lcm_grid_and_last_step(lab):
    lcm = lab["LCMScheduler"](lab["betas"])
    lcm.set_timesteps(4)
    assert lcm.timesteps.tolist() == [999, 759, 499, 259]
    lcm.set_timesteps(1)
    x = lab["noise"][:5]
    out = lcm.step(lab["unet"](x, 999), 999, x)  # one step: no re-noising, returns denoised
    np.testing.assert_array_equal(out.prev_sample, out.pred_original_sample)
    c_skip, c_out = lcm.get_scalings_for_boundary_condition_discrete(0)
    assert (c_skip, c_out) == (1.0, 0.0)


def test_few_steps_need_a_distilled_model(lab):
    results, steps = lab["results"], lab["args"].steps
    assert steps == [1, 2, 4, 8]
    for name in ("ddim", "euler", "dpm++2m", "lcm"):
        # one step, at t = 999 (trailing; LCM's own grid), of the exact denoiser returns
        # E[x0 | noise]: the mixture's middle, no mode
        scheduler = lab["make_scheduler"](name)
        scheduler.set_timesteps(1)
        assert [int(t) for t in scheduler.timesteps] == [999], name
        assert results[name, 1].on_mode < 0.05
        on_mode = [results[name, n].on_mode for n in steps]
        assert on_mode == sorted(on_mode)  # more steps, more samples on a mode
    assert results["dpm++2m", 8].on_mode >= results["ddim", 8].on_mode
    for n in steps:  # an ideal consistency model is good at every step count
        assert results["lcm-ideal", n].on_mode > 0.95
    assert lab["reference"].on_mode > 0.98


def test_wrong_spacing(lab):
    rows = {(r[0], r[1], r[2]): r for r in lab["spacing_rows"]}
    assert rows["ddim", 4, "leading"][3] == "751, 501, 251, 1"
    assert rows["ddim", 4, "trailing"][3] == "999, 749, 499, 249"
    assert rows["dpm++2m", 4, "leading"][3] == "801, 601, 401, 201"
    assert rows["dpm++2m", 4, "custom"][3] == "999, 667, 334, 201"

    def pct(row):
        return float(row[6].rstrip("%"))

    # one step of an ideal consistency model at t = 1 (leading) hands back the noise
    assert rows["ddim-ideal", 1, "leading"][3] == "1"
    assert (
        pct(rows["ddim-ideal", 1, "leading"]) < 20 and pct(rows["ddim-ideal", 1, "trailing"]) > 90
    )
    # "one step puts 0.0% on a mode" holds for trailing only: leading's one call comes at
    # t = 1 (DDIM) or 501 (DPM-Solver++), where the exact denoiser keeps some samples on a mode
    for name, floor in (("ddim", 3), ("dpm++2m", 10)):
        assert pct(rows[name, 1, "trailing"]) < 1 and pct(rows[name, 1, "leading"]) > floor
    # DPM-Solver++'s on_mode follows its last timestep (201 against 249), not its first
    lead, trail, custom = (rows["dpm++2m", 4, s] for s in ("leading", "trailing", "custom"))
    assert pct(lead) - pct(trail) > 5 and abs(pct(custom) - pct(lead)) < 3
    # starting from pure noise at t = 751 or 801 costs mode weights
    for name in ("dpm++2m", "ddim-ideal"):
        assert float(rows[name, 4, "leading"][7]) > 1.5 * float(rows[name, 4, "trailing"][7])


def test_ddim_ideal_one_step_adds_sds_final_noise_to_the_end_point(lab):
    # the page: "ddim-ideal" at one step is exact only with set_alpha_to_one=True; the
    # starter's own DDIM keeps SD's False, so its one step lands on alpha_bar_0:
    # sqrt(alpha_bar_0) * end point + sqrt(1 - alpha_bar_0) * eps_hat, up to 0.109 away,
    # 99.4% on a mode against the end point's 99.9% (97.7% against 99.5%, 50-step solve);
    # each further deterministic jump leaves the ODE trajectory, so on_mode falls
    from labkit.schedulers import DDIMScheduler

    noise, ab = lab["noise"], lab["alphas_cumprod"]
    eps_hat = lab["ode_endpoint_eps"](noise, 999)
    end_point = (noise - (1 - ab[999]) ** 0.5 * eps_hat) / ab[999] ** 0.5
    ddim = lab["make_scheduler"]("ddim")  # the starter's DDIM, the one behind the quoted rows
    assert ddim.set_alpha_to_one is False and ddim.timestep_spacing == "trailing"
    one = run(lab, ddim, 1, ideal=True)
    np.testing.assert_allclose(one, ab[0] ** 0.5 * end_point + (1 - ab[0]) ** 0.5 * eps_hat, atol=1e-12)  # fmt: skip
    deviation = np.abs(one - end_point).max()
    assert 0.05 < deviation and f"max |prev_sample - end point| {deviation:.3f}" in lab["printed"]
    q = lab["sample_quality"](lab["mixture"], one)
    rows = {(r[0], r[1], r[2]): r for r in lab["spacing_rows"]}
    assert rows["ddim-ideal", 1, "trailing"][6] == f"{q.on_mode:.1%}"  # the table's 99.4%
    assert q.on_mode < lab["results"]["lcm-ideal", 1].on_mode == lab["q10"].on_mode
    assert lab["d10"].on_mode == q.on_mode and lab["d50"].on_mode < lab["q50"].on_mode

    def ddim_ideal(n):  # alpha_bar = 1 at the end: no noise added back
        ddim = DDIMScheduler(clip_sample=False, set_alpha_to_one=True, timestep_spacing="trailing", **lab["SD_BETAS"])  # fmt: skip
        return run(lab, ddim, n, ideal=True)

    np.testing.assert_allclose(ddim_ideal(1), end_point, atol=1e-12)  # exact with True only
    ends = {n: ddim_ideal(n) for n in (1, 2, 4, 8)}
    assert np.abs(ends[4] - ends[1]).max() > 0.1  # more jumps: another end point
    on_mode = [lab["sample_quality"](lab["mixture"], ends[n]).on_mode for n in (1, 2, 4, 8)]
    assert on_mode == sorted(on_mode, reverse=True) and on_mode[0] - on_mode[-1] > 0.02
    one, four = (float(rows["ddim-ideal", n, "trailing"][6].rstrip("%")) for n in (1, 4))
    assert one - four > 2  # the starter's own table: 99.4% against 94.8%


def test_predict_first_answers_name_tables_the_default_run_prints(run_cli):
    # the Default tab shows the whole stdout, so "the last table" is not a pointer: each
    # answer that points at a table names it in quotes, as the start of a printed title
    import re

    from infralens_docs.registry import ROOT

    page = (ROOT / "docs/labs/lab-13-few-step-sampling.md").read_text(encoding="utf-8")
    answers = next(ln for ln in page.splitlines() if ln.strip().startswith("Answers:"))
    pointers = dict((k, p) for p, k in re.findall(r"(.*?)\((\d)\)[,.]", answers))
    assert sorted(pointers) == ["1", "2", "3"]
    lines = run_cli(STARTER).stdout.splitlines()
    for k, pointer in pointers.items():
        if "table" not in pointer:
            continue
        names = re.findall(r'"([^"]+)"', pointer)
        assert names, f"answer ({k}) points at a table without naming it: {pointer!r}"
        for name in names:
            titles = [i for i, ln in enumerate(lines) if ln.startswith(name)]
            assert titles, f"answer ({k}): no printed table title starts with {name!r}"
    # question 3 (Flux.1-dev at 28 steps: 28 or 56 calls) is answered by the named table
    at = next(i for i, ln in enumerate(lines) if ln.startswith(re.findall(r'"([^"]+)"', pointers["3"])[0]))  # fmt: skip
    block = lines[at : next((i for i in range(at, len(lines)) if not lines[i]), len(lines))]
    assert any(ln.startswith("guidance_embeds") and ln.split()[-3:] == ["28", "28", "28"] for ln in block)  # fmt: skip
    assert any(ln.startswith("true_cfg_scale") and ln.split()[-3:] == ["28", "56", "56"] for ln in block)  # fmt: skip


def test_ideal_consistency_model_carries_its_10_step_solver_error(lab):
    # the pages: "lcm-ideal" and "ddim-ideal" solve the ODE in 10 DPM-Solver++ steps, not
    # converged; the printed 50-step solve is (within 0.02 of a 200-step one), and it puts
    # fewer samples on a mode at one step (99.5% against 99.9%) with a wider spread
    noise, a = lab["noise"], lab["alphas_cumprod"][999]

    def end_point(x, k):
        return (x - (1 - a) ** 0.5 * lab["ode_endpoint_eps"](x, 999, k)) / a**0.5

    sub = noise[:200]
    assert np.abs(end_point(sub, 50) - end_point(sub, 200)).max() < 0.02
    ends, q10, q50 = lab["ends"], lab["q10"], lab["q50"]
    assert np.abs(ends[10] - ends[50]).mean() > 0.01
    assert q10.on_mode == lab["results"]["lcm-ideal", 1].on_mode  # the table's 1-step row
    assert q50.on_mode < q10.on_mode and q50.spread > q10.spread + 0.05
    # "ddim-ideal" falls with the steps on a 50-step solve too
    from labkit.schedulers import DDIMScheduler

    def ddim_ideal(n):
        ddim = DDIMScheduler(clip_sample=False, set_alpha_to_one=False, timestep_spacing="trailing", **lab["SD_BETAS"])  # fmt: skip
        latents = lab["sample"](ddim, n, lambda x, t: lab["ode_endpoint_eps"](x, t, 50))
        return lab["sample_quality"](lab["mixture"], latents).on_mode

    assert ddim_ideal(1) - ddim_ideal(4) > 0.02


def test_default_prints_the_solver_error(run_cli):
    run = run_cli(STARTER)
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("ideal consistency model at t = 999"))  # fmt: skip
    assert "on_mode 99.9% against 99.5%" in line and "spread 0.85 against 0.96" in line


def test_zero_snr_run(lab):
    rows = {r[0]: r for r in lab["zero_snr_rows"]}
    plain, zero = rows["scaled_linear, epsilon"], rows["zero SNR, v_prediction"]
    assert zero[1] == "0.00e+00" and float(zero[2]) == 0.0  # x0_hat at t = 999: the data mean
    assert float(plain[2]) > 0.05  # the exact denoiser reads a signal pure noise lacks
    assert not lab["np"].isfinite(lab["x0_eps"]).any()  # epsilon at SNR 0: 0 / 0
    scheduler = lab["DDIMZeroSNRScheduler"](**lab["DDIM_TRAILING"])
    assert scheduler.alphas_cumprod[-1] == 0.0 and scheduler.betas[-1] == 1.0


def test_zero_terminal_snr(lab):
    betas = lab["betas"]
    rescaled = lab["rescale_zero_terminal_snr"](betas)
    ab, ab_new = np.cumprod(1 - betas), np.cumprod(1 - rescaled)
    assert ab_new[-1] < 1e-20 and ab[-1] > 4e-3
    assert ab_new[0] == pytest.approx(ab[0])
    assert np.all(np.diff(ab_new) <= 0)


def test_flux_shift(lab):
    shift = lab["calculate_shift"]
    assert shift(256) == pytest.approx(0.5) and shift(4096) == pytest.approx(1.15)
    sigmas = lab["shifted_sigmas"](28, shift(4096))
    assert sigmas[0] == 1.0 and np.all(np.diff(sigmas) < 0)
    # the larger the image, the later sigma falls
    grids = lab["grids"]
    assert grids[256][14] < grids[1024][14] < grids[2048][14]
    # mu = 0 is no shift at all
    np.testing.assert_allclose(lab["shifted_sigmas"](4, 0.0), np.linspace(1, 0.25, 4))


def test_guidance_calls(lab):
    rows = {(r[0], r[1]): r for r in lab["call_rows"]}
    assert rows["guidance_embeds (guidance_scale only)", 28][2] == 28
    assert rows["true_cfg_scale > 1 + negative prompt", 28][2] == 56


def test_fixed_costs(lab):
    # the decode's share falls as steps grow, is lower with CFG (more denoiser rows), and
    # AutoencoderTiny's decode is a small fraction of AutoencoderKL's
    for g in lab["GFLOPS"].values():
        shares = [lab["decode_share"](g, n, cfg=False) for n in lab["FIXED_STEPS"]]
        assert shares == sorted(shares, reverse=True)
        assert all(lab["decode_share"](g, n, cfg=True) < s for n, s in zip(lab["FIXED_STEPS"], shares, strict=True))  # fmt: skip
        assert g["taesd_decode"] < 0.1 * g["vae_decode"]
    sd15 = lab["GFLOPS"]["SD 1.5, 512 px"]
    assert lab["decode_share"](sd15, 1, cfg=False) > 0.5 > lab["decode_share"](sd15, 4, cfg=False)
    assert lab["decode_share"](sd15, 50, cfg=True) < 0.05


def test_default_output(run_cli):
    run = run_cli(STARTER)
    assert run.returncode == 0, run.stderr
    for title in ("on_mode", "timestep_spacing", "FluxPipeline's sigmas", "Denoiser work"):
        assert title in run.stdout


def test_figures_are_small(run_cli, tmp_path):
    run = run_cli(STARTER, "--figures", str(tmp_path))
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert set(manifest) == {"quality-vs-steps", "flux-sigmas"}
    for entry in manifest.values():
        content = (tmp_path / entry["file"]).read_text()
        assert len(content) <= 60_000 and " id=" not in content
        assert len(entry["alt"]) > 80


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "--steps: 0 is not in 1..50"),
        (["--steps", "51"], "--steps: 51 is not in 1..50"),
        (["--spacing-steps", "0"], "--spacing-steps: 0 is not in 1..50"),
        (["--samplers", "heun"], "--samplers: unknown sampler ['heun']"),
        (["--samplers", ","], "--samplers: no sampler given"),
        (["--num-samples", "0"], "argument --num-samples"),
        (["--seed", "x"], "argument --seed"),
    ],
    ids=[
        "--steps 0",
        "--steps 51",
        "--spacing-steps 0",
        "--samplers heun",
        "--samplers ,",
        "--num-samples 0",
        "--seed x",
    ],
)
def test_bad_arguments(run_cli, argv, message):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("few_step.py: error: " + message)
    if argv[0] == "--spacing-steps":  # the spacing runs (DDIM, DPM-Solver++) use no LCM grid
        assert "LCM" not in run.stderr


# --------------------------------------------------------------------------- your turn
# dpm_blanks.py is the reader's file; check_dpm.py checks it against the solution
# (dpm_solution.txt, off the site's pages) with labkit.blanks.check_function. The tests run
# a copy of the checker beside a reader's file written here: filled from the solution, with
# one of its typical MISTAKES planted, or with odd input.

FOLDER = Path(__file__).resolve().parents[2] / "code/lab-13-few-step-sampling"
CHECKER, BLANKS, SOLUTION = "check_dpm.py", "dpm_blanks.py", "dpm_solution.txt"
NAME = "dpm_solver_update"
VARIABLES = {1: "h", 2: "x_t", 3: "r0", 4: "D0, D1", 5: "x_t"}  # what each blank assigns
EXERCISE = Exercise(FOLDER, CHECKER, BLANKS, SOLUTION, NAME)
_mistakes, reader_file, blank_line = EXERCISE.mistakes, EXERCISE.reader_file, EXERCISE.blank_line
runpy_checker = EXERCISE.run_in_place


@pytest.fixture
def check(tmp_path, monkeypatch, capsys):
    """Run a copy of the checker beside a reader's file ``source`` (in this process):
    (exit code, stdout, stderr)."""
    return functools.partial(EXERCISE.run, tmp_path, monkeypatch, capsys)


def test_dpm_solution_is_the_blanks_file_filled_in_line_for_line():
    """The solution's dpm_solver_update is the reader's, except the five blank lines."""
    _, mine = function_lines(FOLDER / BLANKS, NAME)
    _, theirs = function_lines(FOLDER / SOLUTION, NAME)
    differ = [a.split("#")[0].strip() for a, b in zip(mine, theirs, strict=True) if a != b]
    assert differ == [f"{VARIABLES[k]} = blank({k})" for k in (1, 2, 3, 4, 5)]


def test_dpm_solution_is_the_starters_step(lab):
    """The solution returns what the starter's DPMSolverMultistepScheduler.step (shown on
    the page) does, step after step, on every case the checker tries (the same sigmas, x0_hat
    and samples): the verify test holds the solution to diffusers' step."""
    from labkit.blanks import load_function

    solution = load_function(FOLDER / SOLUTION, NAME)
    cases = runpy_checker("--solution")["CASES"]
    scheduler = None
    for label, (sigmas, i, sample, m0, m1) in cases:
        if i == 0:  # a new grid: the starter's scheduler, with the checker's sigmas
            scheduler = lab["DPMSolverMultistepScheduler"](lab["betas"], timestep_spacing="trailing", final_sigmas_type="sigma_min", lower_order_final=False)  # fmt: skip
            scheduler.set_timesteps(len(sigmas) - 1)
            assert np.allclose(scheduler.sigmas, sigmas, rtol=1e-12), label
        # the starter's step takes epsilon: the one whose x0_hat is m0 at this sample
        alpha, s = 1 / (sigmas[i] ** 2 + 1) ** 0.5, sigmas[i]
        eps = (sample - alpha * m0) / (s * alpha)
        if m1 is not None:
            assert np.allclose(scheduler.model_outputs[1], m1), label
        theirs = scheduler.step(eps, scheduler.timesteps[i], sample).prev_sample
        assert np.allclose(solution(sigmas, i, sample, m0, m1), theirs, rtol=1e-9, atol=1e-12), label  # fmt: skip
    assert {label.split(",")[2].strip() for label, _ in cases} == {"first order", "second order"}


def test_the_shipped_dpm_file_says_which_blanks_to_fill(check):
    """All five, though the run stops at blank 1's placeholder; with blank 1 written, the
    other four and that blank 1 matches."""
    code, out, err = check((FOLDER / BLANKS).read_text(encoding="utf-8"))
    lines = ", ".join(f"blank({k}) at line {blank_line(k)}" for k in (1, 2, 3, 4, 5))
    assert (code, err) == (0, "")
    assert out == f"5 of 5 blanks not filled in yet in dpm_blanks.py: {lines}\n"
    code, out, _ = check(reader_file(fill=(1,)))
    lines = ", ".join(f"blank({k}) at line {blank_line(k)}" for k in (2, 3, 4, 5))
    assert (code, out) == (0, f"4 of 5 blanks not filled in yet in dpm_blanks.py: {lines}; blank 1 matches the solution on every case it ran\n")  # fmt: skip


PASSED = "all 5 blanks match the solution on 15 cases\n"


def test_a_correct_dpm_fill_passes_and_the_solution_flag_checks_the_solution(check):
    assert check(reader_file(fill=(1, 2, 3, 4, 5))) == (0, PASSED, "")
    assert check((FOLDER / BLANKS).read_text(), "--solution")[:2] == (0, PASSED)


#: correct answers written otherwise: a helper variable, two lines, few_step.py's own form
OTHER_WAYS = {
    2: "decay = np.exp(-h)\n        x_t = (sigma_t / sigma_s0) * sample - alpha_t * (decay - 1.0) * m0",
    4: "D0 = m0\n    D1 = (m0 - m1) / r0",
    5: "x_t = (sigma_t / sigma_s0) * sample - alpha_t * (np.exp(-h) - 1.0) * (D0 + 0.5 * D1)",
}


@pytest.mark.parametrize("number", list(OTHER_WAYS))
def test_a_correct_dpm_answer_written_otherwise_passes(check, number):
    """A helper of the reader's (decay = e^-h) is no variable of the solution's, and a sum
    in another order rounds otherwise in the last bits: no traceback, a pass."""
    blank = {2: "x_t = blank(2)", 4: "D0, D1 = blank(4)", 5: "x_t = blank(5)"}[number]
    source = reader_file(fill={1, 2, 3, 4, 5} - {number}).replace(blank, OTHER_WAYS[number])
    assert check(source) == (0, PASSED, "")


@pytest.mark.parametrize("mistake", list(_mistakes()))
def test_each_typical_dpm_mistake_names_its_line_and_gets_its_hint(check, mistake):
    """Every typical mistake of the solution's table (h's order, the sign of e^-h - 1, the
    sigma ratio upside down, r0 upside down, D0 from the step before, D1's order, D1 without
    its 0.5, D1's sign, blank 2's slips repeated at blank 5), written in the reader's file with the other blanks right: exit 1, the blank,
    the reader's line and that mistake's hint."""
    number, _, _, hint = _mistakes()[mistake]
    code, out, err = check(reader_file(fill=(1, 2, 3, 4, 5), mistake=mistake))
    assert code == 1 and err == "", out + err
    assert out.startswith(f"blank {number} differs from the solution (num_inference_steps=")
    assert f"  dpm_blanks.py line {blank_line(number)} (blank {number}): {VARIABLES[number]} = " in out  # fmt: skip
    assert out.endswith(f"hint: {hint}\n"), out


def test_a_wrong_dpm_blank_1_is_caught_before_blank_2_is_written(check):
    code, out, _ = check(reader_file(fill=(1,), mistake="h-swapped"))
    assert code == 1 and out.startswith("blank 1 differs from the solution"), out
    assert re.search(r"yours:    h = -(\d\.\d+)\n  solution: h = \1\n", out), out


#: slips a reader makes that the checker must answer with a true hint: (blank, the reader's
#: line in place of the solution's, the hint it prints)
SLIPS = {
    "sigmas array's ratio": (2, "x_t = (s_t / s_s0) * sample - alpha_t * (np.exp(-h) - 1.0) * m0", "the sigmas: the sample is scaled by sigma_t / sigma_s0, the variance-preserving sigmas (s * alpha), not the sigmas array's s_t / s_s0"),
    "e^h": (2, "x_t = (sigma_t / sigma_s0) * sample - alpha_t * (np.exp(h) - 1.0) * m0", "the exponent: e^-h, below 1 since h > 0"),
    "D1 times r0": (4, "D0, D1 = m0, r0 * (m0 - m1)", "r0 divides: D1 = (m0 - m1) / r0"),
    "float32 x_t": (2, "x_t = ((sigma_t / sigma_s0) * sample - alpha_t * (np.exp(-h) - 1.0) * m0).astype(np.float32)", "the dtype: yours is float32, the solution's float64\n"),
    "after an empty line": (3, "\n    r0 = h / h_0", "blank 3's lines did not run as blank 3's: a blank's lines run from its # BLANK comment to the first empty line"),
    "D1's sign": (5, "x_t = (sigma_t / sigma_s0) * sample - alpha_t * (np.exp(-h) - 1.0) * D0 + 0.5 * alpha_t * (np.exp(-h) - 1.0) * D1", "the sign of D1's term: it is subtracted, as D0's is"),
    "D0's sign at blank 5": (5, "x_t = (sigma_t / sigma_s0) * sample - alpha_t * (1.0 - np.exp(-h)) * D0 - 0.5 * alpha_t * (np.exp(-h) - 1.0) * D1", "the sign of D0's term, as in blank 2"),
    "the ratio upside down at blank 5": (5, "x_t = (sigma_s0 / sigma_t) * sample - alpha_t * (np.exp(-h) - 1.0) * (D0 + 0.5 * D1)", "the ratio is upside down, as in blank 2"),
    "the sigmas array's ratio at blank 5": (5, "x_t = (s_t / s_s0) * sample - alpha_t * (np.exp(-h) - 1.0) * (D0 + 0.5 * D1)", "the sigmas, as in blank 2: the sample is scaled by sigma_t / sigma_s0"),
    "e^h at blank 5": (5, "x_t = (sigma_t / sigma_s0) * sample - alpha_t * (np.exp(h) - 1.0) * (D0 + 0.5 * D1)", "the exponent, as in blank 2: e^-h"),
    "flattened x_t": (5, "x_t = ((sigma_t / sigma_s0) * sample - alpha_t * (np.exp(-h) - 1.0) * (D0 + 0.5 * D1)).ravel()", "the shape: yours is (6,), the solution's (3, 2)"),
}  # fmt: skip


@pytest.mark.parametrize("slip", list(SLIPS))
def test_a_dpm_slip_gets_a_true_hint(check, slip):
    """Blank 2 with the sigmas array's s_t / s_s0 (the comment says the variance-preserving
    sigmas), e^+h, D1 multiplied by r0, a float32 x_t (no "after rounding": nothing rounds
    here), a wrong r0 written after an empty line (the checker then names blank 4's line: the
    hint says blank 3's did not run as its own), blank 5 with D1's term added, or with blank 2's
    slips (D0's sign, the ratio upside down, the sigmas array's ratio, e^+h; written as the
    solution's two terms or as one, (D0 + 0.5 D1)), a right x_t flattened to (6,) (the shape,
    not "the length", which is the same): exit 1 and the true hint."""
    number, line, hint = SLIPS[slip]
    blank = {2: "x_t = blank(2)", 3: "r0 = blank(3)  # noqa: F841", 4: "D0, D1 = blank(4)  # noqa: RUF059", 5: "x_t = blank(5)"}[number]  # fmt: skip
    source = reader_file(fill={1, 2, 3, 4, 5} - {number})
    assert source.count(blank) == 1
    code, out, err = check(source.replace(blank, line))
    assert (code, err) == (1, ""), out + err
    assert hint in out and "after rounding" not in out, out


def test_a_name_rebound_outside_the_blanks_is_named_at_its_line(check):
    """h doubled on a line of the reader's after an empty line (no blank's line): blank 5's
    x_t then differs, and the checker names the line that rebinds h, h's two values and
    that blank 1 assigns it, not blank 5's line."""
    after = "D0, D1 = m0, (1.0 / r0) * (m0 - m1)"
    source = reader_file(fill=(1, 2, 3, 4, 5)).replace(after, after + "\n\n    h = 2 * h")
    code, out, err = check(source)
    line = blank_line(4) + 2
    assert (code, err) == (1, "") and out.startswith("blank 5 differs"), out + err
    assert f"  dpm_blanks.py line {line}: h = 2 * h\n" in out, out
    assert re.search(r"yours:    h = (\d\.\d+)\n  solution: h = ", out), out
    assert "rebinds h, which blank 1 assigns" in out and "x_t = " not in out, out


def test_exit_0_with_blank_1_left_says_nothing_of_a_later_wrong_blank(check):
    """A wrong blank 3 (r0 upside down) with blank 1 still a placeholder: every run stops at
    blank(1), so blank 3 never runs: exit 0, blank 3 not named as matching, and the docstring's
    exit-0 sentence says only the blanks the runs reach match."""
    import ast

    source = reader_file().replace("r0 = blank(3)  # noqa: F841", "r0 = h / h_0")
    code, out, err = check(source)
    assert (code, err) == (0, ""), out + err
    assert "4 of 5 blanks not filled in yet" in out and "match" not in out, out
    doc = " ".join(ast.get_docstring(ast.parse((FOLDER / CHECKER).read_text(encoding="utf-8"))).split())  # fmt: skip
    assert "Exit 0: every filled blank the runs reach matches" in doc, doc


def test_a_right_line_after_an_empty_line_leaves_a_later_blanks_hint(check):
    """A right r0 written after an empty line (outside blank 3) with blank 5's 0.5 left out:
    the hint is blank 5's missing factor, not blank 3's empty line, which changed nothing."""
    source = reader_file(fill=(1, 2, 4, 5), mistake="no-half")
    code, out, err = check(source.replace("    r0 = blank(3)  # noqa: F841", "\n    r0 = h_0 / h"))
    assert (code, err) == (1, "") and out.startswith("blank 5 differs"), out + err
    assert out.endswith(f"hint: {_mistakes()['no-half'][3]}\n") and "blank 3" not in out, out


def test_the_checker_names_the_configuration_its_orders_are_diffusers():
    """check_dpm.py's docstring states its cases' orders (first order on the first step, second
    on the others) as diffusers' step with `final_sigmas_type="sigma_min"` and
    `lower_order_final=False`, the configuration the verify test runs: with
    `lower_order_final=False` alone, diffusers' default `final_sigmas_type="zero"` makes the
    last step first order (test_page_lab_13.py::test_dpm_solver_first_and_last_steps_are_first_order)."""
    import ast

    tree = ast.parse((FOLDER / CHECKER).read_text(encoding="utf-8"))
    doc = " ".join(ast.get_docstring(tree).split())
    said = doc.split("second order on the others")[1].split(")")[0]
    assert 'final_sigmas_type="sigma_min"' in said and "lower_order_final=False" in said, said


#: (the reader's line in blank 3, what the one-line error says about it)
ODD = {
    "syntax error": ("r0 = (h_0 / h", "syntax error: '(' was never closed"),
    "an integer": ("r0 = int(h_0 / h)", "r0 is an integer, 0;"),
    "an exception": ("r0 = h_0 / h_1", "NameError: name 'h_1' is not defined"),
    "Ctrl-C": ("raise KeyboardInterrupt", "KeyboardInterrupt: interrupted (Ctrl-C) there: a loop of yours that does not end?"),
    "exit()": ("raise SystemExit", "SystemExit: exit() ends the whole check: dpm_solver_update() must return its value"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(ODD))
def test_odd_dpm_input_is_one_line_exit_2_naming_the_readers_line(check, case):
    """A syntax error, a blank of another type (an integer where the ratio r0 goes), an
    exception in the reader's line, Ctrl-C (raised at the blank's line, as it would be on a
    loop that does not end) or exit(): one line on stderr, exit 2, naming the file and the
    line (and its blank, once it runs)."""
    line, said = ODD[case]
    source = reader_file(fill=(1, 2, 4, 5)).replace("r0 = blank(3)", line)
    code, out, err = check(source)
    assert code == 2 and out == "", out
    where = f"check_dpm.py: error: dpm_blanks.py line {blank_line(3)}"
    assert err.count("\n") == 1 and err.startswith(where), err
    assert said in err and ("(blank 3)" in err) == (case != "syntax error"), err


def test_the_dpm_solution_is_no_page_nav_entry_or_search_result(built_site):
    """dpm_solution.txt is no page of the site: no nav entry or search location names it;
    the reader's file and the checker are served as files (``page: false``), not pages, and the guide prints the
    checker's command. (The guide shows the starter's step, the same lines, before the
    exercise, folded as the answer: test_the_guide_folds_the_dpm_answer_above_the_exercise.)"""
    docs = json.loads((built_site / "search" / "search_index.json").read_text())["docs"]
    locations = {doc["location"].split("#")[0] for doc in docs}
    assert not any("dpm_solution" in location for location in locations)
    # (an exercise's blanks file and checker: served as .py files, with no notebook page)
    for page in ("dpm_blanks", "check_dpm"):
        assert (built_site / "code/lab-13-few-step-sampling" / f"{page}.py").is_file(), page
    page = (FOLDER.parents[1] / "docs/labs/lab-13-few-step-sampling.md").read_text()
    guide = page.split("\n---\n", 1)[1]  # the page below its front matter (the registry)
    assert "dpm_solution" not in guide and "python3 code/lab-13-few-step-sampling/check_dpm.py" in guide  # fmt: skip
    built = (built_site / "labs" / "lab-13-few-step-sampling" / "index.html").read_text()
    assert not re.findall(r'<a href="[^"]*dpm_solution[^"]*"', built)


def test_the_guide_folds_the_dpm_answer_above_the_exercise():
    """The starter's DPMSolverMultistepScheduler, whose step holds the five blanks' lines, is
    on the guide above "Your turn" only inside a collapsed block titled as the answer."""
    page = (FOLDER.parents[1] / "docs/labs/lab-13-few-step-sampling.md").read_text()
    lines = page.splitlines()
    include = next(i for i, line in enumerate(lines) if "few_step.py:dpm" in line)
    assert include < next(i for i, line in enumerate(lines) if line.startswith("### Your turn"))
    assert lines[include].startswith("    "), "the include is not inside a ??? block"
    opener = next(line for line in reversed(lines[:include]) if line and not line.startswith(" "))
    assert opener.startswith("??? ") and "answer" in opener.lower(), opener
