"""Claims of the handbook page "Noise-prediction objective", checked on the installed diffusers.

Everything runs on the real classes: schedulers are built in code, and the pipeline is
the real ``StableDiffusionPipeline`` around a tiny UNet and a tiny four-block VAE (the
block count of SD 1.x's VAE, so latents are 1/8 of the pixel size), random weights.
The conversion tests feed ``step`` outputs of all three ``prediction_type`` values
built from one known (x0, noise) pair, so a wrong conversion shows up as a mismatch.
"""

from __future__ import annotations

import functools
import inspect
import json

import diffusers
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DEISMultistepScheduler,
    DPMSolverMultistepInverseScheduler,
    DPMSolverMultistepScheduler,
    DPMSolverSinglestepScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    HeliosDMDScheduler,
    HeliosScheduler,
    PNDMScheduler,
    SASolverScheduler,
    SchedulerMixin,
    SCMScheduler,
    StableDiffusion3Pipeline,
    StableDiffusionPipeline,
    UnCLIPScheduler,
    UNet2DConditionModel,
    UniPCMultistepScheduler,
)
from diffusers.training_utils import compute_snr
from tiny import (
    EMBED_DIM,
    HEIGHT,
    SD15_SCHEDULER_FILE,
    SD_BETAS,
    WIDTH,
    abar,
    close,
    embeds,
    randn,
    start_latents,
    tiny_sd3_pipeline,
    tiny_unet,
)


def targets(scheduler, x0, eps, t):
    """x_t and the three consistent model outputs (epsilon, sample, v) at integer t."""
    a = abar(scheduler, t)
    x_t = a.sqrt() * x0 + (1 - a).sqrt() * eps
    v = a.sqrt() * eps - (1 - a).sqrt() * x0
    return x_t, {"epsilon": eps, "sample": x0, "v_prediction": v}


def test_add_noise_is_the_forward_formula():
    r"""`scheduler.add_noise(original_samples, noise, timesteps)` returns $\sqrt{\bar\alpha_t}\, x_0 + \sqrt{1-\bar\alpha_t}\, \epsilon$ with $\bar\alpha_t$ = `alphas_cumprod[t]`, the cumulative product of `1 - betas`, for one timestep per sample.

    DDPMScheduler.add_noise (DDIMScheduler's is a copy); alphas_cumprod is built in __init__.
    """
    scheduler = DDPMScheduler(**SD_BETAS)
    close(scheduler.alphas_cumprod, torch.cumprod(1 - scheduler.betas.double(), 0), tol=1e-5)
    x0, eps = randn(0), randn(1)
    timesteps = torch.tensor([10, 700])
    out = scheduler.add_noise(x0, eps, timesteps)
    for i, t in enumerate(timesteps.tolist()):
        a = abar(scheduler, t)
        close(out[i], a.sqrt() * x0[i] + (1 - a).sqrt() * eps[i])


def test_sd_latents_and_noise_pred_shapes(sd1_shaped_pipe):
    """With a VAE of SD 1.x's four blocks, `StableDiffusionPipeline` denoises `latents` of shape `(B, 4, H/8, W/8)`, and SD 1.x's text-to-image UNet returns `noise_pred` in the shape of its input, `(2B, 4, H/8, W/8)` under the default guidance.

    The call leaves ``guidance_scale`` at the pipeline's default (7.5); a forward hook records
    each UNet call's input and output shapes. Text-to-image only: SD 1.x's inpainting UNet takes
    9 channels and returns 4 (test_glossary_noise_pred_is_shaped_like_the_input_in_sd1_text_to_image).
    """
    pipe = sd1_shaped_pipe
    assert pipe.vae_scale_factor == 8
    shapes = []
    handle = pipe.unet.register_forward_hook(
        lambda m, args, out: shapes.append((args[0].shape, out[0].shape))
    )
    try:
        latents = pipe(
            prompt_embeds=embeds(0, batch=2),
            negative_prompt_embeds=embeds(1, batch=2),
            height=32,
            width=32,
            num_inference_steps=2,
            output_type="latent",
        ).images
    finally:
        handle.remove()
    assert latents.shape == (2, 4, 32 // 8, 32 // 8)
    assert shapes == [((4, 4, 4, 4), (4, 4, 4, 4))] * 2  # (2B, 4, H/8, W/8) in and out


def test_prediction_type_belongs_to_the_scheduler(sd_pipe):
    """`prediction_type` is a config field of the scheduler, not of the UNet: `UNet2DConditionModel(...)` raises `TypeError` on a `prediction_type` argument, `DDPMScheduler` defaults to `prediction_type="epsilon"`, and `StableDiffusionPipeline` runs one UNet under two schedulers that differ only in `prediction_type` without an error, to different finite `latents`."""
    with pytest.raises(TypeError, match="prediction_type"):
        UNet2DConditionModel(prediction_type="v_prediction")
    assert "prediction_type" not in tiny_unet().config
    assert DDPMScheduler().config.prediction_type == "epsilon"
    assert DDIMScheduler().config.prediction_type == "epsilon"
    config = sd_pipe.scheduler.config
    assert config.prediction_type == "epsilon"
    as_v = StableDiffusionPipeline(
        **{
            **sd_pipe.components,
            "scheduler": DDIMScheduler.from_config(config, prediction_type="v_prediction"),
        }
    )
    as_v.set_progress_bar_config(disable=True)
    kwargs = dict(
        prompt_embeds=embeds(0), num_inference_steps=3, guidance_scale=1.0, output_type="latent"
    )
    latents = {
        name: pipe(latents=start_latents(), **kwargs).images
        for name, pipe in [("epsilon", sd_pipe), ("v_prediction", as_v)]
    }
    assert as_v.unet is sd_pipe.unet
    assert all(torch.isfinite(x).all() for x in latents.values())
    assert (latents["epsilon"] - latents["v_prediction"]).abs().max() > 0.1


def test_scheduler_config_json_records_prediction_type(tmp_path):
    """A scheduler saved with `save_pretrained` writes its `prediction_type` to `scheduler_config.json`, and `from_pretrained` reads it back."""
    DDPMScheduler(prediction_type="v_prediction").save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "scheduler_config.json").read_text())
    assert saved["prediction_type"] == "v_prediction"
    assert DDIMScheduler.from_pretrained(tmp_path).config.prediction_type == "v_prediction"


@functools.cache
def scheduler_classes_taking(parameter: str) -> list[type]:
    """Every scheduler class of the installed diffusers whose ``__init__`` takes ``parameter``
    (those behind an optional package included: the verify extra installs scipy and torchsde,
    and test_versions.py fails if any scheduler is exported as a dummy)."""
    classes = [getattr(diffusers, name) for name in dir(diffusers) if name.endswith("Scheduler")]
    return [
        cls
        for cls in classes
        if isinstance(cls, type)
        and issubclass(cls, SchedulerMixin)
        and parameter in inspect.signature(cls.__init__).parameters
    ]


def test_from_config_keeps_prediction_type():
    """A scheduler swapped in with `DDIMScheduler.from_config(config)`, `config` another scheduler's config, keeps its recorded `prediction_type` (and its betas), and so does `from_config` on every scheduler class of the installed diffusers whose `__init__` takes `prediction_type`; on SD's `scaled_linear` config `UnCLIPScheduler`, which takes only the cosine schedule, raises `ValueError` instead.

    The classes include those behind an optional package (scipy, torchsde). The
    first source configs use the cosine schedule, the one every such class accepts, on 100
    training timesteps (the KDPM2 schedulers build their grid over all of them in
    ``__init__``), recording ``v_prediction`` and then ``epsilon``, so every class is handed a
    value other than its own default; the last is SD 1.5's shipped file, at 1000 (about 4 s).
    """
    old = DDPMScheduler(prediction_type="v_prediction", **SD_BETAS)
    new = DDIMScheduler.from_config(old.config)
    assert new.config.prediction_type == "v_prediction"
    close(new.alphas_cumprod, old.alphas_cumprod)
    classes = scheduler_classes_taking("prediction_type")
    assert len(classes) > 20 and DDIMScheduler in classes
    for recorded in ("v_prediction", "epsilon"):
        source = DDPMScheduler(
            prediction_type=recorded, beta_schedule="squaredcos_cap_v2", num_train_timesteps=100
        ).config
        assert "prediction_type" not in source._use_default_values
        for cls in classes:
            assert cls.from_config(source).config.prediction_type == recorded, cls.__name__
    # SD 1.5's shipped scheduler_config.json, 1000 timesteps, read as a v_prediction checkpoint
    sd = PNDMScheduler.from_config(
        {**SD15_SCHEDULER_FILE, "prediction_type": "v_prediction"}
    ).config
    raising = []
    for cls in classes:
        try:
            kept = cls.from_config(sd).config.prediction_type
        except ValueError:
            raising.append(cls)
            continue
        assert kept == "v_prediction", cls.__name__
    assert raising == [UnCLIPScheduler]


def test_from_config_does_not_carry_a_prediction_type_the_file_omits():
    """A value the source never set is listed in its config's `_use_default_values` and not carried: from SD 1.5's file the new class's default applies, `epsilon` for most but `flow_prediction` for the Helios schedulers, `trigflow` for `SCMScheduler` and `v_prediction` for `CosineDPMSolverMultistepScheduler`.

    SD 1.5's shipped scheduler_config.json has no ``prediction_type``; every scheduler class
    taking one (those behind an optional package included) is built from it, and its value
    compared with the class's own default (read from the class built without that key, on
    100 training timesteps).
    """
    assert "prediction_type" not in SD15_SCHEDULER_FILE
    sd = PNDMScheduler.from_config(SD15_SCHEDULER_FILE).config
    assert sd.prediction_type == "epsilon" and "prediction_type" in sd._use_default_values
    got, raising = {}, []
    for cls in scheduler_classes_taking("prediction_type"):
        try:
            got[cls] = cls.from_config(sd).config.prediction_type
        except ValueError:  # UnCLIP: cosine schedule only
            raising.append(cls)
            continue
        own = cls.from_config({"num_train_timesteps": 100}).config.prediction_type
        assert got[cls] == own, cls.__name__
    assert raising == [UnCLIPScheduler]
    changed = {cls: value for cls, value in got.items() if value != "epsilon"}
    (cosine_dpmsolver,) = (c for c in got if c.__name__ == "CosineDPMSolverMultistepScheduler")
    assert changed == {
        HeliosScheduler: "flow_prediction",
        HeliosDMDScheduler: "flow_prediction",
        SCMScheduler: "trigflow",
        cosine_dpmsolver: "v_prediction",
    }


def test_unclip_keeps_v_prediction_but_cannot_read_it():
    """Carrying the value over is not reading it: `UnCLIPScheduler` keeps a cosine config's `v_prediction`, then its `step` raises, since it reads only `epsilon` and `sample`.

    scheduling_unclip.py:295-302; the same step with `epsilon` or `sample` runs.
    """
    source = DDPMScheduler(prediction_type="v_prediction", beta_schedule="squaredcos_cap_v2").config
    unclip = UnCLIPScheduler.from_config(source)
    assert unclip.config.prediction_type == "v_prediction"
    unclip.set_timesteps(5)
    t, x_t, out = unclip.timesteps[0], randn(0), randn(1)
    with pytest.raises(ValueError, match="must be one of `epsilon` or `sample`"):
        unclip.step(out, t, x_t)
    for readable in ("epsilon", "sample"):
        reading = UnCLIPScheduler.from_config(source, prediction_type=readable)
        reading.set_timesteps(5)
        assert torch.isfinite(reading.step(out, t, x_t).prev_sample).all(), readable


def test_use_flow_sigmas_schedulers():
    """The scheduler classes whose `__init__` takes `use_flow_sigmas` are DPM-Solver's (multistep, singlestep, inverse), DEIS, SA-Solver, UniPC and the Helios video schedulers; the Helios ones default to `prediction_type="flow_prediction"` with `use_flow_sigmas=True`."""
    classes = scheduler_classes_taking("use_flow_sigmas")
    helios = {HeliosScheduler, HeliosDMDScheduler}
    assert set(classes) == set(FLOW_SOLVERS) | {DPMSolverMultistepInverseScheduler} | helios
    for cls in helios:
        config = cls().config
        assert (config.prediction_type, config.use_flow_sigmas) == ("flow_prediction", True)


@pytest.mark.parametrize("prediction_type", ["epsilon", "sample", "v_prediction"])
def test_ddim_step_uses_the_conversion_formulas(prediction_type):
    r"""For each `prediction_type`, `DDIMScheduler.step` turns any `model_output` into `pred_original_sample` ($\hat{x}_0$) and a noise estimate ($\hat\epsilon$) with the formulas above; at `eta=0`, `prev_sample` is $\sqrt{\bar\alpha_{\text{prev}}}\, \hat{x}_0 + \sqrt{1-\bar\alpha_{\text{prev}}}\, \hat\epsilon$.

    The model output is random (not consistent with any x0), so each formula is checked on
    its own. pred_epsilon is not returned; it is read back from prev_sample.
    """
    scheduler = DDIMScheduler(prediction_type=prediction_type, clip_sample=False, **SD_BETAS)
    scheduler.set_timesteps(10)
    t, prev = 500, 400
    x_t, out = randn(0), randn(1)
    a, a_prev = abar(scheduler, t), abar(scheduler, prev)
    if prediction_type == "epsilon":
        eps = out
        x0 = (x_t - (1 - a).sqrt() * eps) / a.sqrt()
    elif prediction_type == "sample":
        x0 = out
        eps = (x_t - a.sqrt() * x0) / (1 - a).sqrt()
    else:
        x0 = a.sqrt() * x_t - (1 - a).sqrt() * out
        eps = (1 - a).sqrt() * x_t + a.sqrt() * out
    result = scheduler.step(out, t, x_t, eta=0.0)
    close(result.pred_original_sample, x0)
    close(result.prev_sample, a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps)


def test_ddim_rederives_epsilon_from_the_clipped_x0():
    r"""`DDIMScheduler.step` recovers $\hat\epsilon$ from $\hat{x}_0$ for `sample`, and for every type with `use_clipped_model_output=True`, from the clipped $\hat{x}_0$.

    With ``clip_sample=True`` and a model output whose $\hat{x}_0$ leaves [-1, 1], each
    ``prediction_type`` is stepped at ``eta=0`` with and without the flag: with it,
    ``prev_sample`` is built from the clipped x0 and the noise recovered from it; without it,
    from the clipped x0 and the type's own noise estimate (the ``sample`` case is in the
    parametrized test above).
    """
    t, prev = 500, 400
    x_t, out = randn(0), 3 * randn(1)
    for prediction_type in ["epsilon", "sample", "v_prediction"]:
        scheduler = DDIMScheduler(prediction_type=prediction_type, clip_sample=True, **SD_BETAS)
        scheduler.set_timesteps(10)
        a, a_prev = abar(scheduler, t), abar(scheduler, prev)
        x0 = {
            "epsilon": (x_t - (1 - a).sqrt() * out) / a.sqrt(),
            "sample": out,
            "v_prediction": a.sqrt() * x_t - (1 - a).sqrt() * out,
        }[prediction_type]
        assert x0.abs().max() > 1.5
        clipped = x0.clamp(-1, 1)
        eps = (x_t - a.sqrt() * clipped) / (1 - a).sqrt()
        got = scheduler.step(out, t, x_t, eta=0.0, use_clipped_model_output=True)
        close(got.pred_original_sample, clipped)
        close(got.prev_sample, a_prev.sqrt() * clipped + (1 - a_prev).sqrt() * eps)
        if prediction_type != "sample":
            plain = scheduler.step(out, t, x_t, eta=0.0).prev_sample
            assert (plain - got.prev_sample).abs().max() > 1e-3, prediction_type


@pytest.mark.parametrize("cls", [DDPMScheduler, DDIMScheduler], ids=lambda c: c.__name__)
def test_three_targets_give_one_estimate(cls):
    """Outputs of the three types built from one `(x0, noise)` pair give the same `pred_original_sample` (equal to `x0`) and the same `prev_sample` in `DDPMScheduler.step` and `DDIMScheduler.step`: the targets carry the same information."""
    x0, eps = randn(0), randn(1)
    results = {}
    for prediction_type in ["epsilon", "sample", "v_prediction"]:
        scheduler = cls(prediction_type=prediction_type, clip_sample=False, **SD_BETAS)
        scheduler.set_timesteps(10)
        t = 700
        x_t, outputs = targets(scheduler, x0, eps, t)
        results[prediction_type] = scheduler.step(
            outputs[prediction_type], t, x_t, generator=torch.Generator().manual_seed(3)
        )
    for result in results.values():
        close(result.pred_original_sample, x0, tol=1e-5)
        close(result.prev_sample, results["epsilon"].prev_sample, tol=1e-5)


def test_which_schedulers_return_pred_original_sample():
    """DDPM, DDIM and Euler return their estimate of $x_0$ as `pred_original_sample` (here exactly `x0`, from an `epsilon` output built from it); `PNDMScheduler`, which SD 1.x ships, returns only `prev_sample`."""
    x0, eps = randn(0), randn(1)
    for cls in [DDPMScheduler, DDIMScheduler]:
        scheduler = cls(clip_sample=False, **SD_BETAS)
        scheduler.set_timesteps(10)
        t = int(scheduler.timesteps[4])
        x_t, _ = targets(scheduler, x0, eps, t)
        close(scheduler.step(eps, t, x_t).pred_original_sample, x0, tol=1e-5)
    euler = EulerDiscreteScheduler(**SD_BETAS)
    euler.set_timesteps(10)
    t, sigma = euler.timesteps[2], euler.sigmas[2]
    sample = x0 + sigma * eps  # Euler's state: x0 + sigma * noise
    euler.scale_model_input(sample, t)  # the call order a pipeline uses
    close(euler.step(eps, t, sample).pred_original_sample, x0, tol=1e-5)
    pndm = PNDMScheduler(skip_prk_steps=True, steps_offset=1, set_alpha_to_one=False, **SD_BETAS)
    pndm.set_timesteps(10)
    t = pndm.timesteps[0]
    x_t, _ = targets(pndm, x0, eps, int(t))
    assert list(pndm.step(eps, t, x_t).keys()) == ["prev_sample"]


@pytest.mark.parametrize("cls", [DDPMScheduler, DDIMScheduler], ids=lambda c: c.__name__)
def test_get_velocity_builds_the_v_target(cls):
    r"""`get_velocity(sample, noise, timesteps)` returns $v = \sqrt{\bar\alpha_t}\, \epsilon - \sqrt{1-\bar\alpha_t}\, x_0$, one timestep per sample, on `DDPMScheduler` and `DDIMScheduler`."""
    scheduler = cls(**SD_BETAS)
    x0, eps = randn(0), randn(1)
    timesteps = torch.tensor([50, 900])
    v = scheduler.get_velocity(x0, eps, timesteps)
    for i, t in enumerate(timesteps.tolist()):
        a = abar(scheduler, t)
        close(v[i], a.sqrt() * eps[i] - (1 - a).sqrt() * x0[i])


@pytest.mark.parametrize(
    "cls", [DDPMScheduler, DDIMScheduler, EulerDiscreteScheduler], ids=lambda c: c.__name__
)
def test_wrong_prediction_type_runs_silently(cls):
    """In DDPM, DDIM and Euler, a checkpoint read as another of their three targets raises no error: at every timestep of the grid, `step` returns finite `latents` that differ from the correct ones, for every pairing of `epsilon`, `sample` and `v_prediction`.

    One model output and one state are stepped under each ``prediction_type``; the three
    readings are compared pairwise at each of the 10 steps (Euler after ``scale_model_input``,
    the call order a pipeline uses; DDPM with one seeded generator per step).
    """
    x_t, out = randn(0), randn(1)
    kwargs = {} if cls is EulerDiscreteScheduler else {"clip_sample": False}
    prev = {}
    for prediction_type in ["epsilon", "sample", "v_prediction"]:
        scheduler = cls(prediction_type=prediction_type, **kwargs, **SD_BETAS)
        scheduler.set_timesteps(10)
        prev[prediction_type] = []
        for t in scheduler.timesteps:
            scheduler.scale_model_input(x_t, t)
            generator = torch.Generator().manual_seed(3)
            result = scheduler.step(out, t, x_t, generator=generator).prev_sample
            assert torch.isfinite(result).all(), (prediction_type, t)
            prev[prediction_type].append(result)
    for a, b in [("epsilon", "sample"), ("epsilon", "v_prediction"), ("sample", "v_prediction")]:
        for step, (x, y) in enumerate(zip(prev[a], prev[b], strict=True)):
            assert (x - y).abs().max() > 1e-4, (a, b, step)


def test_thresholding_replaces_clipping():
    r"""With `thresholding=True`, `step` instead divides each sample's $\hat{x}_0$ by $s$, the `dynamic_thresholding_ratio` quantile of its absolute values clamped to `[1, sample_max_value]`, after clamping it to $[-s, s]$, so `pred_original_sample` always ends in $[-1, 1]$."""
    # prediction_type "sample" reads model_output as x0 directly; only thresholding acts on it
    scheduler = DDPMScheduler(
        prediction_type="sample", thresholding=True, sample_max_value=4.0, **SD_BETAS
    )
    scheduler.set_timesteps(10)
    x0 = randn(0)
    x0[1] *= 0.3  # second sample: quantile below 1, so s = 1 (plain clipping)
    x_t = randn(1)
    got = scheduler.step(x0, 100, x_t).pred_original_sample
    flat = x0.reshape(2, -1)
    ratio = scheduler.config.dynamic_thresholding_ratio
    s = torch.quantile(flat.abs(), ratio, dim=1).clamp(1.0, 4.0)
    assert 1.5 < s[0] < 4.0 and s[1] == 1.0
    expected = torch.stack([(flat[i].clamp(-s[i], s[i]) / s[i]) for i in range(2)])
    close(got, expected.reshape(x0.shape))
    assert got.abs().max() <= 1.0 and x0.abs().max() > 2.0


def test_epsilon_errors_are_amplified_at_t_999():
    r"""Under `DDPMScheduler()`'s `linear` schedule, $\sqrt{\bar\alpha_{999}} \approx 0.0064$, so an error $\delta$ in an `epsilon` output moves `pred_original_sample` at `t=999` by about $157\,\delta$; a `v_prediction` error moves it by at most $\delta$."""
    x_t, out, delta = randn(0), randn(1), 1e-3
    shift = {}
    for prediction_type in ["epsilon", "v_prediction"]:
        scheduler = DDPMScheduler(prediction_type=prediction_type, clip_sample=False)
        assert abar(scheduler, 999).sqrt().item() == pytest.approx(0.0064, abs=5e-5)
        x0 = scheduler.step(out, 999, x_t).pred_original_sample
        x0_moved = scheduler.step(out + delta, 999, x_t).pred_original_sample
        shift[prediction_type] = ((x0_moved - x0) / delta).abs().mean().item()
    assert shift["epsilon"] == pytest.approx(157, rel=0.01)
    assert shift["v_prediction"] < 1.0 + 1e-4


def test_compute_snr():
    r"""`diffusers.training_utils.compute_snr(noise_scheduler, timesteps)` returns $\text{SNR}(t) = \bar\alpha_t / (1-\bar\alpha_t)$ for each entry of `timesteps`."""
    scheduler = DDPMScheduler(**SD_BETAS)
    timesteps = torch.tensor([0, 259, 999])
    a = scheduler.alphas_cumprod.double()[timesteps]
    close(compute_snr(scheduler, timesteps), a / (1 - a), tol=1e-4)


def test_flow_matching_velocity_step(record_calls, monkeypatch):
    r"""`StableDiffusion3Pipeline`, typed with `FlowMatchEulerDiscreteScheduler` (which has no `prediction_type`), at `guidance_scale=1` (no CFG) hands each transformer output to `step`, which moves `latents` along it as a velocity, `sample + (sigma_next - sigma) * model_output`; `scale_noise` builds $x_t = (1-t)\, x_0 + t\, \epsilon$ with $t$ = `sigmas`, and `step` with the velocity $\epsilon - x_0$ as `model_output` lands exactly on $x$ at the next sigma."""
    annotation = inspect.signature(StableDiffusion3Pipeline.__init__).parameters["scheduler"]
    assert annotation.annotation is FlowMatchEulerDiscreteScheduler
    pipe = tiny_sd3_pipeline(FlowMatchEulerDiscreteScheduler(shift=3.0))
    assert "prediction_type" not in pipe.scheduler.config
    outputs, steps, original = [], [], pipe.scheduler.step
    pipe.transformer.register_forward_hook(lambda m, a, out: outputs.append(out[0].clone()))

    def step(model_output, timestep, sample, *args, **kwargs):
        result = original(model_output, timestep, sample, *args, **kwargs)
        steps.append((model_output.clone(), sample.clone(), result[0].clone()))
        return result

    monkeypatch.setattr(pipe.scheduler, "step", step)
    g = torch.Generator().manual_seed(1)
    pipe(prompt_embeds=torch.randn(1, 10, EMBED_DIM, generator=g),
         pooled_prompt_embeds=torch.randn(1, 16, generator=g), guidance_scale=1.0,
         num_inference_steps=3, height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
    sigmas = pipe.scheduler.sigmas
    assert len(steps) == len(outputs) == 3
    assert all(out.shape[0] == 1 for out in outputs)  # guidance_scale=1: no CFG, batch B
    for i, ((model_output, sample, prev), out) in enumerate(zip(steps, outputs, strict=True)):
        close(model_output, out, tol=0)
        close(prev, sample + (sigmas[i + 1] - sigmas[i]) * model_output, tol=1e-5)

    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(10)
    x0, eps = randn(0).float(), randn(1).float()
    t0 = scheduler.timesteps[0]
    s0, s1 = scheduler.sigmas[0], scheduler.sigmas[1]
    x_t = scheduler.scale_noise(x0, t0[None], eps)
    close(x_t, (1 - s0) * x0 + s0 * eps, tol=1e-5)
    prev = scheduler.step(eps - x0, t0, x_t).prev_sample
    close(prev, (1 - s1) * x0 + s1 * eps, tol=1e-5)


FLOW_SOLVERS = [
    DPMSolverMultistepScheduler,
    DPMSolverSinglestepScheduler,
    DEISMultistepScheduler,
    SASolverScheduler,
    UniPCMultistepScheduler,
]


@pytest.mark.parametrize("cls", FLOW_SOLVERS, ids=lambda c: c.__name__)
def test_dpmsolver_flow_prediction_reads_the_velocity(cls):
    r"""DPM-Solver (multistep and singlestep), DEIS, SA-Solver and UniPC with `prediction_type="flow_prediction"` and `use_flow_sigmas=True` read `model_output` as the velocity $\epsilon - x_0$ on the path $x = (1-\sigma)\, x_0 + \sigma\, \epsilon$: the first step lands on that path at the next sigma; with `flow_prediction` alone each raises nothing and lands off the path."""
    scheduler = cls(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    scheduler.set_timesteps(10)
    x0, eps = randn(0).float(), randn(1).float()
    s0, s1 = scheduler.sigmas[0], scheduler.sigmas[1]
    assert 0.9 < s0 < 1.0
    x_t = (1 - s0) * x0 + s0 * eps
    prev = scheduler.step(eps - x0, scheduler.timesteps[0], x_t).prev_sample
    close(prev, (1 - s1) * x0 + s1 * eps, tol=2e-4)  # DEIS: 7e-5 from float32 logs

    alone = cls(prediction_type="flow_prediction")
    alone.set_timesteps(10)
    assert not alone.config.use_flow_sigmas
    prev = alone.step(eps - x0, alone.timesteps[0], x_t).prev_sample
    assert torch.isfinite(prev).all()
    assert (prev - ((1 - s1) * x0 + s1 * eps)).abs().mean() > 0.1


def exact_gaussian_velocity(module, args, kwargs, output, mean=0.5, std=0.3):
    """Forward hook: the transformer's output replaced by the exact velocity for data
    x0 ~ N(mean, std**2 I) at the level it is told (sigma = timestep / 1000); the flow ODE
    then maps the starting noise z to mean + std * z."""
    x = kwargs["hidden_states"].double()
    sigma = kwargs["timestep"].double().reshape(-1, 1, 1, 1) / 1000
    gain = (1 - sigma) * std**2 / ((1 - sigma) ** 2 * std**2 + sigma**2)
    x0_hat = mean + gain * (x - (1 - sigma) * mean)
    return ((x - x0_hat) / sigma).to(output[0].dtype), *output[1:]


def test_deis_and_sa_solver_stop_short_of_sigma_zero_in_sd3():
    """In `StableDiffusion3Pipeline.__call__` with `prediction_type="flow_prediction"`, `use_flow_sigmas=True` and `flow_shift=3.0`, DPM-Solver (multistep, singlestep) and UniPC step to sigma 0 and, on an exact flow denoiser at 25 steps, land closer to the exact samples than `FlowMatchEulerDiscreteScheduler(shift=3.0)`; DEIS and SA-Solver stop short of sigma 0 (their last `sigmas` entry repeats the one before it, 0.111 at 25 steps), leaving noise, and land farther from them."""
    pipe = tiny_sd3_pipeline()
    pipe.transformer.register_forward_hook(exact_gaussian_velocity, with_kwargs=True)
    z = start_latents()
    flow = dict(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0)
    errors, last_sigma = {}, {}
    for cls in [FlowMatchEulerDiscreteScheduler, *FLOW_SOLVERS]:
        pipe.scheduler = cls(shift=3.0) if cls is FlowMatchEulerDiscreteScheduler else cls(**flow)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            final = pipe(prompt_embeds=torch.randn(1, 10, EMBED_DIM, generator=g),
                         pooled_prompt_embeds=torch.randn(1, 16, generator=g), guidance_scale=1.0,
                         num_inference_steps=25, height=HEIGHT, width=WIDTH, output_type="latent",
                         latents=z.clone()).images  # fmt: skip
        errors[cls] = (final - (0.5 + 0.3 * z)).abs().mean().item()
        last_sigma[cls] = pipe.scheduler.sigmas[-1].item()
    euler = errors.pop(FlowMatchEulerDiscreteScheduler)
    reach = {DPMSolverMultistepScheduler, DPMSolverSinglestepScheduler, UniPCMultistepScheduler}
    for cls, error in errors.items():
        if cls in reach:
            assert last_sigma[cls] == 0 and error < euler, (cls.__name__, errors)
        else:
            assert last_sigma[cls] == pytest.approx(0.111, abs=5e-4), cls.__name__
            assert error > euler, (cls.__name__, errors)
    assert set(errors) - reach == {DEISMultistepScheduler, SASolverScheduler}


def test_vae_decodes_once_at_the_end(sd1_shaped_pipe, monkeypatch):
    """With `output_type="pt"`, `StableDiffusionPipeline` calls `vae.decode` once, after the last UNet call: every step before it maps `latents` to `latents`."""
    pipe = sd1_shaped_pipe
    events = []
    decode = pipe.vae.decode

    def counting_decode(*args, **kwargs):
        events.append("decode")
        return decode(*args, **kwargs)

    monkeypatch.setattr(pipe.vae, "decode", counting_decode)
    handle = pipe.unet.register_forward_pre_hook(lambda m, a: events.append("unet"))
    try:
        image = pipe(
            prompt_embeds=embeds(0),
            height=32,
            width=32,
            num_inference_steps=3,
            guidance_scale=1.0,
            output_type="pt",
        ).images
    finally:
        handle.remove()
    assert events == ["unet"] * 3 + ["decode"]
    assert image.shape == (1, 3, 32, 32)


def test_glossary_noise_pred_is_shaped_like_the_input_in_sd1_text_to_image():
    """The denoiser's output at one step, in SD 1.x text-to-image shaped like its input (glossary, `noise_pred`): `StableDiffusionPipeline`'s UNet returns its `(2B, 4, h, w)` input's shape, while `StableDiffusionInpaintPipeline`'s 9-channel UNet takes `(2B, 9, h, w)` and returns 4 channels, the latents' shape."""
    from tiny import pil_image_and_mask, tiny_sd_pipeline, tiny_sd_variant

    image, mask = pil_image_and_mask()
    runs = {
        "text-to-image": (tiny_sd_pipeline(), {"height": HEIGHT, "width": WIDTH}),
        "inpaint": (
            tiny_sd_variant("StableDiffusionInpaintPipeline", unet=tiny_unet(in_channels=9)),
            {"image": image, "mask_image": mask},
        ),
    }
    shapes = {}
    for name, (pipe, kwargs) in runs.items():
        seen = []
        hook = pipe.unet.register_forward_hook(
            lambda module, args, output, seen=seen: seen.append(
                (tuple(args[0].shape), tuple(output[0].shape))
            )
        )
        with torch.no_grad():
            pipe(prompt_embeds=embeds(1), negative_prompt_embeds=embeds(2), guidance_scale=7.5,
                 num_inference_steps=2, output_type="latent", **kwargs)  # fmt: skip
        hook.remove()
        assert len(seen) == 2 and len(set(seen)) == 1, (name, seen)
        shapes[name] = seen[0]
    (t2i_in, t2i_out), (inpaint_in, inpaint_out) = shapes["text-to-image"], shapes["inpaint"]
    assert t2i_in == t2i_out and t2i_in[:2] == (2, 4)
    assert inpaint_in[:2] == (2, 9) and inpaint_out == (2, 4, *inpaint_in[2:])
