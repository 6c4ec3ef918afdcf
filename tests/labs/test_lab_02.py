"""Lab 02 Denoising Step: conversions, one DDPM/DDIM step, and the mismatch trap."""

import numpy as np
import pytest

STARTER = "code/lab-02-denoising-step/denoising_step.py"


def test_shapes_at_every_boundary(run_lab):
    g = run_lab(STARTER, "--num-samples", "256")
    for name in ["latent", "noise_pred", "pred_original_sample", "v_pred",
                 "latent_prev_ddpm", "latent_prev_ddim"]:  # fmt: skip
        assert g[name].shape == (256, 2) and g[name].dtype == np.float64, name


def test_conversions_are_exact(run_lab):
    g = run_lab(STARTER)
    errors = [
        float(line.split()[-1]) for line in g["__stdout__"].splitlines() if "converted" in line
    ]
    assert len(errors) == 2 and max(errors) < 1e-12


def test_noise_pred_is_the_conditional_mean_not_the_added_noise(run_lab):
    g = run_lab(STARTER)
    mse = np.mean((g["noise_pred"] - g["noise"]) ** 2)
    assert 0.01 < mse < 0.5  # far better than guessing 0 (mse 1), yet not the noise itself


def test_small_strides_keep_the_marginal(run_lab):
    g = run_lab(STARTER, "--num-inference-steps", "1000")
    for x in (g["latent_prev_ddpm"], g["latent_prev_ddim"]):
        assert g["moment_error"](x, g["alpha_prod_t_prev"]) < 0.03


def test_large_strides_show_the_fixed_small_variance_shortfall(run_lab):
    """At stride 100 DDPM's fixed_small variance omits Var[x0 | x_t]: the batch comes
    out too narrow. DDIM keeps the marginal better. One 500-step jump breaks both."""
    g = run_lab(STARTER, "--num-inference-steps", "10")
    ddpm = g["moment_error"](g["latent_prev_ddpm"], g["alpha_prod_t_prev"])
    ddim = g["moment_error"](g["latent_prev_ddim"], g["alpha_prod_t_prev"])
    assert ddpm > 2 * ddim
    cov_ddpm = np.cov(g["latent_prev_ddpm"], rowvar=False)
    cov_true = g["alpha_prod_t_prev"] * g["mixture"].covariance() + (
        1 - g["alpha_prod_t_prev"]
    ) * np.eye(2)
    assert np.trace(cov_ddpm) < np.trace(cov_true)
    g2 = run_lab(STARTER, "--num-inference-steps", "2")
    assert g2["moment_error"](g2["latent_prev_ddim"], g2["alpha_prod_t_prev"]) > 1.0


def test_mismatch_table_is_zero_only_on_the_diagonal(run_lab):
    g = run_lab(STARTER)
    lines = g["__stdout__"].splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("trained (row)"))
    for i, row in enumerate(lines[start + 1 : start + 4]):
        x0_errors = [float(cell.split("/")[0]) for cell in row.split(" | ")[1:]]
        assert len(x0_errors) == 3
        for j, err in enumerate(x0_errors):
            assert (err == 0.0) == (i == j), row


def test_mismatch_hides_at_low_noise(run_lab):
    """epsilon read as v (and back) barely matters when alpha_bar ~ 1, and matters a lot at t=500."""

    def eps_v_error(timestep: str) -> float:
        g = run_lab(STARTER, "--timestep", timestep)
        eps_out = g["noise_pred"]
        return float(
            np.sqrt(
                np.mean((g["x0_from"](eps_out, "v_prediction") - g["pred_original_sample"]) ** 2)
            )
        )

    assert eps_v_error("50") < 0.1 < 1.0 < eps_v_error("500")


@pytest.mark.parametrize(
    "argv",
    [["--timestep", "-1"], ["--timestep", "1000"], ["--num-inference-steps", "0"],
     ["--num-inference-steps", "1001"], ["--schedule", "karras"]],
    ids=" ".join,
)  # fmt: skip
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("denoising_step.py: error: ")
