"""Lab 13 Few-Step Sampling: DPM-Solver++ 2M, the LCM step, spacing and Flux's shift, in NumPy."""

import json

import numpy as np
import pytest

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
