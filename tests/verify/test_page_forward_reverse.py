"""Claims of the handbook page "Forward vs reverse process", checked on the installed diffusers.

Schedules and steps run on the real scheduler classes; the loop claims run the real
``StableDiffusionPipeline`` (and ``StableDiffusionImg2ImgPipeline``) around a tiny UNet
and VAE with random weights, and the real ``StableDiffusion3Pipeline`` around a tiny
transformer. One pipeline uses a VAE with SD 1.x's four blocks, so its
``vae_scale_factor`` is 8 as in SD 1.x and ``latents`` are ``(B, 4, H/8, W/8)``.
"""

from __future__ import annotations

import functools
import inspect
import math
import typing
from pathlib import Path

import pytest
import torch
import yaml
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    PNDMScheduler,
    StableDiffusionImg2ImgPipeline,
)
from tiny import (
    EMBED_DIM,
    HEIGHT,
    SD15_PNDM,
    SD_BETAS,
    SD_SCHEDULER,
    WIDTH,
    abar,
    accepted_beta_schedules,
    close,
    embeds,
    randn,
    spy_step_kwarg,
    start_latents,
    tiny_sd3_pipeline,
    tiny_sd_pipeline,
)

SCHEDULES = ["linear", "scaled_linear", "squaredcos_cap_v2"]
#: the beta ranges Lab 01 uses per schedule (DDPM's and SD's; cosine ignores its range)
RANGES = {
    "linear": dict(beta_start=0.0001, beta_end=0.02),
    "scaled_linear": dict(beta_start=0.00085, beta_end=0.012),
    "squaredcos_cap_v2": dict(beta_start=0.0001, beta_end=0.02),
}


def posterior(scheduler, t: int, prev: int, x0, x_t):
    """DDPM eq. 7 with the effective beta across the stride: (mean, beta_tilde, beta)."""
    a_t, a_prev = abar(scheduler, t), abar(scheduler, prev)
    beta = 1 - a_t / a_prev
    mean = (a_prev.sqrt() * beta / (1 - a_t)) * x0 + (
        (1 - beta).sqrt() * (1 - a_prev) / (1 - a_t)
    ) * x_t
    return mean, (1 - a_prev) / (1 - a_t) * beta, beta


@pytest.fixture(scope="module")
def euler_pipe():
    """The tiny pipeline with SD 1.5's scheduler config swapped to EulerDiscreteScheduler the
    usual way (from_config): init_noise_sigma != 1."""
    sd_config = DDIMScheduler(**SD_SCHEDULER).config
    return tiny_sd_pipeline(scheduler=EulerDiscreteScheduler.from_config(sd_config))


# --- forward process ---------------------------------------------------------------


def test_add_noise_one_level_per_sample():
    r"""`DDPMScheduler.add_noise(original_samples, noise, timesteps)` with `timesteps` of shape `(B,)` noises each sample at its own level: $x_t = \sqrt{\bar\alpha_t}\, x_0 + \sqrt{1-\bar\alpha_t}\, \epsilon$ with $\bar\alpha_t$ = `alphas_cumprod[t]`, in one call (`EulerDiscreteScheduler.add_noise` returns $x_0 + \sigma\, \epsilon$ instead)."""
    scheduler = DDPMScheduler(**SD_BETAS)
    x0, eps = randn(0), randn(1)
    timesteps = torch.tensor([999, 3])
    out = scheduler.add_noise(x0, eps, timesteps)
    assert out.shape == x0.shape
    for i, t in enumerate(timesteps.tolist()):
        a = abar(scheduler, t)
        close(out[i], a.sqrt() * x0[i] + (1 - a).sqrt() * eps[i])
    euler = EulerDiscreteScheduler(**SD_BETAS)
    euler.set_timesteps(10)
    t = euler.timesteps[:2]
    close(euler.add_noise(x0, eps, t), x0 + euler.sigmas[:2].reshape(2, 1, 1, 1) * eps, tol=1e-5)
    # so the training diagram (tools/infralens_docs/diagrams.yml), which draws this formula
    # under add_noise, names the scheduler whose add_noise it is, in its caption and its alt
    file = Path(__file__).resolve().parents[2] / "tools" / "infralens_docs" / "diagrams.yml"
    training = yaml.safe_load(file.read_text(encoding="utf-8"))["forward-training"]
    assert any("sqrt(alpha_bar_t)" in line for _, _, lines in training["rows"] for line in lines)
    assert "DDPMScheduler" in training["caption"] and "DDPMScheduler.add_noise(" in training["alt"]


def test_betas_and_alphas_cumprod_are_indexed_by_timestep():
    r"""`DDPMScheduler`'s `betas` and `alphas_cumprod` are float32 tensors of shape `(num_train_timesteps,)` indexed by the integer timestep $0, \dots, 999$, and `alphas_cumprod[t]` is the product of `1 - betas[s]` for $s \le t$: `alphas_cumprod[0]` is `1 - betas[0]`, the paper's $\bar\alpha_1$."""
    scheduler = DDPMScheduler()
    for name in ["betas", "alphas_cumprod"]:
        tensor = getattr(scheduler, name)
        assert tensor.shape == (1000,) and tensor.dtype == torch.float32, name
    close(scheduler.alphas_cumprod, torch.cumprod(1 - scheduler.betas.double(), 0), tol=1e-5)
    assert scheduler.alphas_cumprod[0] == 1 - scheduler.betas[0]
    assert scheduler.timesteps.tolist() == list(range(999, -1, -1))


def test_snr_falls_monotonically():
    r"""For each `beta_schedule` `DDPMScheduler` accepts, $\text{SNR}(t) = \bar\alpha_t / (1-\bar\alpha_t)$ computed from `alphas_cumprod` falls strictly as `t` grows, with DDPM's and SD's beta ranges."""
    for schedule in sorted(accepted_beta_schedules()):
        for beta_range in [RANGES["linear"], RANGES["scaled_linear"]]:
            a = DDPMScheduler(beta_schedule=schedule, **beta_range).alphas_cumprod.double()
            snr = a / (1 - a)
            assert (snr.diff() < 0).all(), (schedule, beta_range)


def test_ddpm_scheduler_defaults():
    """`DDPMScheduler()` defaults to `num_train_timesteps=1000`, `beta_schedule="linear"`, `beta_start=0.0001`, `beta_end=0.02` and `variance_type="fixed_small"`."""
    config = DDPMScheduler().config
    assert config.num_train_timesteps == 1000
    assert config.beta_schedule == "linear"
    assert (config.beta_start, config.beta_end) == (0.0001, 0.02)
    assert config.variance_type == "fixed_small"


def test_linear_and_scaled_linear_betas():
    r"""`beta_schedule="linear"` spaces $\beta_t$ evenly from `beta_start` to `beta_end`; `"scaled_linear"` spaces $\sqrt{\beta_t}$ evenly from the square root of `beta_start` to that of `beta_end`, then squares."""
    linear = DDPMScheduler(beta_schedule="linear", beta_start=0.0001, beta_end=0.02)
    close(linear.betas, torch.linspace(0.0001, 0.02, 1000, dtype=torch.float64), tol=1e-7)
    scaled = DDPMScheduler(**SD_BETAS)
    roots = torch.linspace(math.sqrt(0.00085), math.sqrt(0.012), 1000, dtype=torch.float64)
    close(scaled.betas, roots**2, tol=1e-7)


def test_cosine_schedule():
    r"""`beta_schedule="squaredcos_cap_v2"` gives $\bar\alpha = f(t)/f(0)$ with $f(t) = \cos^2\big(\frac{t/T + 0.008}{1.008} \cdot \frac{\pi}{2}\big)$ (index `t` holding $f((t+1)/T)/f(0)$), caps each $\beta_t$ at 0.999, and ignores `beta_start` / `beta_end`."""
    scheduler = DDPMScheduler(beta_schedule="squaredcos_cap_v2")
    other_range = DDPMScheduler(
        beta_schedule="squaredcos_cap_v2", beta_start=0.00085, beta_end=0.012
    )
    assert torch.equal(scheduler.betas, other_range.betas)

    def f(x):
        return math.cos((x + 0.008) / 1.008 * math.pi / 2) ** 2

    T = 1000
    expected = torch.tensor([f((t + 1) / T) / f(0) for t in range(T - 1)], dtype=torch.float64)
    torch.testing.assert_close(scheduler.alphas_cumprod[:-1].double(), expected, rtol=1e-5, atol=0)
    assert scheduler.betas.max().item() == pytest.approx(0.999)
    assert scheduler.betas[-1].item() == pytest.approx(0.999)  # uncapped it would be ~1


def test_lab01_numbers_are_diffusers_values():
    r"""diffusers gives the page's numbers: $\text{SNR}(t)$ first drops below 1 at `t` = 259 (`linear`), 354 (`scaled_linear`) and 496 (`squaredcos_cap_v2`); under `linear`, `alphas_cumprod[750]` is 0.0033 and `alphas_cumprod[999]` is 4.04e-05; under `scaled_linear` (SD's betas) `alphas_cumprod[999]` is 4.66e-03, SNR about 0.0047.

    Lab 01 prints these from labkit (float64); the page quotes Lab 01's output.
    """
    crossing = {}
    a = {}
    for schedule in SCHEDULES:
        a[schedule] = DDPMScheduler(
            beta_schedule=schedule, **RANGES[schedule]
        ).alphas_cumprod.double()
        snr = a[schedule] / (1 - a[schedule])
        crossing[schedule] = int((snr < 1).nonzero()[0])
    assert crossing == {"linear": 259, "scaled_linear": 354, "squaredcos_cap_v2": 496}
    assert a["linear"][750].item() == pytest.approx(0.0033, abs=5e-5)
    assert a["linear"][999].item() == pytest.approx(4.04e-05, abs=5e-8)
    sd = a["scaled_linear"][999].item()
    assert sd == pytest.approx(4.66e-03, abs=5e-6)
    assert sd / (1 - sd) == pytest.approx(0.0047, abs=5e-5)


@pytest.mark.parametrize(
    "beta_range", [RANGES["linear"], RANGES["scaled_linear"]], ids=["DDPM", "SD"]
)
def test_no_standard_schedule_reaches_zero(beta_range):
    r"""No `beta_schedule` that `DDPMScheduler` accepts reaches $\bar\alpha = 0$ with DDPM's or SD's beta range: the three in the table plus `sigmoid` and `laplace`, read from the installed library, all end with `alphas_cumprod[999]` above 0, so `add_noise` at `t=999` still carries a trace of $x_0$ (two clean samples with the same noise give different $x_{999}$)."""
    accepted = accepted_beta_schedules()
    assert accepted == set(SCHEDULES) | {"sigmoid", "laplace"}
    eps, x0_a, x0_b = randn(1), randn(2), randn(3)
    t = torch.tensor([999, 999])
    for schedule in sorted(accepted):
        scheduler = DDPMScheduler(beta_schedule=schedule, **beta_range)
        assert scheduler.alphas_cumprod[-1] > 0, schedule
        gap = scheduler.add_noise(x0_a, eps, t) - scheduler.add_noise(x0_b, eps, t)
        expected = abar(scheduler, 999).sqrt() * (x0_a - x0_b)
        close(gap, expected, tol=1e-7)
        assert gap.abs().max() > 0, schedule


def test_cosine_terminal_signal_is_zero_in_practice():
    r"""Cosine's $\bar\alpha_{999}$, 2.43e-09, left only by the 0.999 cap, is zero in practice: `DDPMScheduler(beta_schedule="squaredcos_cap_v2")` ends with `alphas_cumprod[999]` below 1e-8, the cap times `alphas_cumprod[998]`, and `betas_for_alpha_bar` without the cap gives exactly 0; `linear` and `scaled_linear` keep more than 1e-5."""
    from diffusers.schedulers.scheduling_ddpm import betas_for_alpha_bar

    cosine = DDPMScheduler(beta_schedule="squaredcos_cap_v2").alphas_cumprod.double()
    assert f"{cosine[999].item():.2e}" == "2.43e-09"
    assert (cosine[999] / cosine[998]).item() == pytest.approx(1 - 0.999, rel=1e-3)
    uncapped = torch.cumprod(1 - betas_for_alpha_bar(1000, max_beta=1.0).double(), 0)
    assert uncapped[999].item() == 0.0 and uncapped[998].item() > 0
    for schedule in ["linear", "scaled_linear"]:
        scheduler = DDPMScheduler(beta_schedule=schedule, **RANGES[schedule])
        assert scheduler.alphas_cumprod[999] > 1e-5, schedule


# --- reverse process ---------------------------------------------------------------


@pytest.mark.parametrize("cls", [DDPMScheduler, DDIMScheduler], ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "spacing",
    # every value DDPMScheduler's annotation allows (DDIMScheduler takes the same three)
    typing.get_args(
        inspect.signature(DDPMScheduler.__init__).parameters["timestep_spacing"].annotation
    ),
)
def test_set_timesteps_runs_from_high_noise_to_low(cls, spacing):
    """`DDPMScheduler.set_timesteps(num_inference_steps)` and `DDIMScheduler`'s set `scheduler.timesteps` to strictly decreasing integer timesteps, from high noise to low, for every `timestep_spacing` at every count from 1 to 1000; not always `num_inference_steps` of them, nor all in `[0, 1000)`: `trailing` at 61 steps gives 62, the last -1, and `leading` with `steps_offset=1` starts at 1000 at 1000 steps."""
    for offset in (0, 1):
        scheduler = cls(timestep_spacing=spacing, steps_offset=offset)
        for n in range(1, 1001):
            scheduler.set_timesteps(n)
            ts = scheduler.timesteps
            assert not ts.is_floating_point() and (ts.diff() < 0).all(), (offset, n)
    edges = {
        "trailing": (0, 61, lambda ts: len(ts) == 62 and int(ts[-1]) == -1),
        "leading": (1, 1000, lambda ts: len(ts) == 1000 and int(ts[0]) == 1000),
    }
    if spacing in edges:
        offset, n, holds = edges[spacing]
        scheduler = cls(timestep_spacing=spacing, steps_offset=offset)
        scheduler.set_timesteps(n)
        assert holds(scheduler.timesteps)


def first_scale_model_input_sample(pipe, **kwargs):
    """Run the pipeline's __call__ (unguided) and return the `latents` its loop starts from
    and the first `t`: the arguments of the first `scale_model_input` call (a spy on the
    scheduler instance)."""
    seen = []
    original = pipe.scheduler.scale_model_input

    def spy(sample, t, *args, **kw):
        seen.append((sample.clone(), t))
        return original(sample, t, *args, **kw)

    pipe.scheduler.scale_model_input = spy
    try:
        pipe(guidance_scale=1.0, output_type="latent", **kwargs)
    finally:
        del pipe.scheduler.scale_model_input
    return seen[0]


def test_prepare_latents_scales_by_init_noise_sigma(euler_pipe, sd_pipe):
    r"""`StableDiffusionPipeline` starts from `latents` drawn from $\mathcal{N}(0, I)$ with the `generator` and multiplied by `scheduler.init_noise_sigma` (1.0 for `DDIMScheduler`; for `EulerDiscreteScheduler` from SD 1.5's config, whose spacing is `linspace`, it follows the grid: about 14.6 at 3 steps, 0.029 at 1 step, whose only timestep is 0)."""
    for pipe in [sd_pipe, euler_pipe]:
        pipe.scheduler.set_timesteps(3)
        sigma = pipe.scheduler.init_noise_sigma
        start, _ = first_scale_model_input_sample(
            pipe,
            prompt_embeds=embeds(0, batch=2),
            num_inference_steps=3,
            generator=torch.Generator().manual_seed(0),
        )
        noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
        close(start, noise * sigma)
    assert sd_pipe.scheduler.init_noise_sigma == 1.0
    assert euler_pipe.scheduler.config.timestep_spacing == "linspace"
    assert float(euler_pipe.scheduler.init_noise_sigma) == pytest.approx(14.6, abs=0.05)
    start, first_t = first_scale_model_input_sample(
        euler_pipe,
        prompt_embeds=embeds(0),
        num_inference_steps=1,
        generator=torch.Generator().manual_seed(0),
    )
    assert float(first_t) == 0.0
    noise = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    close(start, noise * 0.0292, tol=1e-3)


def test_sd3_starts_from_unscaled_noise(record_calls):
    r"""`StableDiffusion3Pipeline` does not scale its starting `latents`: the transformer's first input is the `generator`'s $\mathcal{N}(0, I)$ draw itself, and its `FlowMatchEulerDiscreteScheduler` has no `init_noise_sigma`."""
    pipe = tiny_sd3_pipeline(FlowMatchEulerDiscreteScheduler(shift=3.0))
    assert not hasattr(pipe.scheduler, "init_noise_sigma")
    recorder = record_calls(pipe.transformer)
    g = torch.Generator().manual_seed(1)
    pipe(
        prompt_embeds=torch.randn(1, 10, EMBED_DIM, generator=g),
        pooled_prompt_embeds=torch.randn(1, 16, generator=g),
        guidance_scale=1.0,
        num_inference_steps=2,
        height=HEIGHT,
        width=WIDTH,
        output_type="latent",
        generator=torch.Generator().manual_seed(5),
    )
    first = recorder.calls[0][1]["hidden_states"]
    assert first.shape == (1, 4, HEIGHT // 2, WIDTH // 2)
    close(first, torch.randn(first.shape, generator=torch.Generator().manual_seed(5)), tol=0)


def test_img2img_runs_the_forward_process_at_inference(sd_pipe, record_calls, monkeypatch):
    """At inference, `StableDiffusionImg2ImgPipeline` runs the forward process once, to noise the encoded input image with `scheduler.add_noise`: one call per `__call__`, before the first UNet call."""
    pipe = StableDiffusionImg2ImgPipeline(**sd_pipe.components, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    events, add_noise = [], pipe.scheduler.add_noise

    def spy(original_samples, noise, timesteps):
        events.append("add_noise")
        return add_noise(original_samples, noise, timesteps)

    monkeypatch.setattr(pipe.scheduler, "add_noise", spy)
    handle = pipe.unet.register_forward_pre_hook(lambda m, a: events.append("unet"))
    try:
        pipe(prompt_embeds=embeds(0), image=torch.rand(1, 3, 16, 16), strength=0.6,
             num_inference_steps=10, guidance_scale=1.0, output_type="latent")  # fmt: skip
    finally:
        handle.remove()
    assert events == ["add_noise"] + ["unet"] * 6  # strength 0.6 of 10 steps


def test_img2img_starts_from_a_noised_encoded_image(sd_pipe):
    """`StableDiffusionImg2ImgPipeline` starts from `scheduler.add_noise` applied to the encoded image (`vae.encode(image)` sampled, times `vae.config.scaling_factor`) at the first timestep."""
    pipe = StableDiffusionImg2ImgPipeline(**sd_pipe.components, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    image = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(5))  # in [0, 1]
    start, first_t = first_scale_model_input_sample(
        pipe,
        prompt_embeds=embeds(0),
        image=image,
        strength=0.6,
        num_inference_steps=10,
        generator=torch.Generator().manual_seed(0),
    )
    assert int(first_t) == 501  # strength 0.6 of SD's leading grid 901, 801, ..., 1
    g = torch.Generator().manual_seed(0)  # the pipeline's draws, in its order
    with torch.no_grad():
        encoded = pipe.vae.encode(image * 2 - 1).latent_dist.sample(g)
    encoded = encoded * pipe.vae.config.scaling_factor
    noise = torch.randn(encoded.shape, generator=g)
    close(start, pipe.scheduler.add_noise(encoded, noise, first_t.reshape(1)), tol=1e-5)


def test_reverse_loop_is_scale_model_input_unet_step(euler_pipe, record_calls):
    """`StableDiffusionPipeline` runs, for each `t` in `scheduler.timesteps` (high to low), `scale_model_input(latents, t)`, one UNet call with that scalar `t` for the whole batch, and `latents = scheduler.step(noise_pred, t, latents).prev_sample`: with SD 1.5's `PNDMScheduler`, 5 calls at `num_inference_steps=4`."""
    pipe, steps = euler_pipe, 4
    prompt_embeds, latents = embeds(0, batch=2), start_latents(batch=2)
    recorder = record_calls(pipe.unet)
    out = pipe(
        prompt_embeds=prompt_embeds,
        latents=latents.clone(),
        num_inference_steps=steps,
        guidance_scale=1.0,
        output_type="latent",
    ).images

    scheduler = pipe.scheduler
    scheduler.set_timesteps(steps)
    timesteps = scheduler.timesteps.clone()
    assert (timesteps.diff() < 0).all()
    seen = [args[1] for args, _ in recorder.calls]
    assert len(seen) == steps
    for t_seen, t in zip(seen, timesteps, strict=True):
        assert t_seen.ndim == 0 and t_seen == t
    assert all(args[0].shape[0] == 2 for args, _ in recorder.calls)

    x = latents * scheduler.init_noise_sigma
    with torch.no_grad():
        for t in timesteps:
            model_input = scheduler.scale_model_input(x, t)
            noise_pred = pipe.unet(model_input, t, encoder_hidden_states=prompt_embeds).sample
            x = scheduler.step(noise_pred, t, x).prev_sample
    close(out, x, tol=1e-5)
    pndm = tiny_sd_pipeline(scheduler=PNDMScheduler(**SD15_PNDM))
    recorder = record_calls(pndm.unet)
    pndm(prompt_embeds=embeds(0), num_inference_steps=4, guidance_scale=1.0, output_type="latent")
    assert len(recorder.calls) == len(pndm.scheduler.timesteps) == 5


def test_the_inference_diagram_draws_the_pipelines_order(euler_pipe, monkeypatch):
    """The inference diagram's order is `StableDiffusionPipeline`'s: `scheduler.set_timesteps` runs before the starting `latents` are drawn and multiplied by `scheduler.init_noise_sigma`, which for `EulerDiscreteScheduler` follows the grid `set_timesteps` made (`prepare_latents` reads the new grid's value), then `scale_model_input`, the UNet and `scheduler.step` once per entry of `scheduler.timesteps`, then one `vae.decode`."""
    pipe, order, sigmas = euler_pipe, [], []
    spied = [(pipe.scheduler, "set_timesteps"), (pipe, "prepare_latents"),
             (pipe.scheduler, "scale_model_input"), (pipe.scheduler, "step"), (pipe.vae, "decode")]  # fmt: skip
    for owner, name in spied:
        original = getattr(owner, name)

        @functools.wraps(original)
        def log(*args, _original=original, _name=name, **kwargs):
            order.append(_name)
            if _name == "prepare_latents":
                sigmas.append(float(pipe.scheduler.init_noise_sigma))
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, log)
    hook = pipe.unet.register_forward_pre_hook(lambda *_: order.append("unet"))
    try:
        pipe(prompt_embeds=embeds(0), num_inference_steps=1, guidance_scale=1.0, output_type="np")
    finally:
        hook.remove()
    loop = ["scale_model_input", "unet", "step"] * len(pipe.scheduler.timesteps)
    assert order == ["set_timesteps", "prepare_latents", *loop, "decode"]
    # 1 step on SD 1.5's linspace grid: t = 0, so the sigma read is the new grid's, not 14.6
    assert sigmas == [float(pipe.scheduler.init_noise_sigma)] and sigmas[0] < 1
    # and the diagram (tools/infralens_docs/diagrams.yml) draws its rows in that order
    file = Path(__file__).resolve().parents[2] / "tools" / "infralens_docs" / "diagrams.yml"
    marks = {"set_timesteps": "set_timesteps", "init_noise_sigma": "prepare_latents",
             "scale_model_input": "scale_model_input", "denoiser": "unet",
             "scheduler.step": "step", "vae.decode": "decode"}  # fmt: skip
    rows = yaml.safe_load(file.read_text(encoding="utf-8"))["reverse-inference"]["rows"]
    assert [next(e for m, e in marks.items() if m in op) for _, op, _ in rows] == [
        *dict.fromkeys(order)
    ]


def test_final_latents_decode_to_pixels(sd1_shaped_pipe):
    """In `StableDiffusionPipeline`, with a VAE of SD 1.x's four blocks, `latents` are `(B, 4, H/8, W/8)` and the image is `vae.decode(latents / vae.config.scaling_factor)`, of shape `(B, 3, H, W)`, mapped from `[-1, 1]` to `[0, 1]` for `output_type="pt"`."""
    pipe = sd1_shaped_pipe
    kwargs = dict(
        prompt_embeds=embeds(0),
        height=32,
        width=32,
        num_inference_steps=2,
        guidance_scale=1.0,
    )
    start = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(1))
    latents = pipe(**kwargs, latents=start.clone(), output_type="latent").images
    image = pipe(**kwargs, latents=start.clone(), output_type="pt").images
    assert latents.shape == (1, 4, 32 // 8, 32 // 8)
    assert image.shape == (1, 3, 32, 32)
    with torch.no_grad():
        decoded = pipe.vae.decode(latents / pipe.vae.config.scaling_factor).sample
    close(image, (decoded / 2 + 0.5).clamp(0, 1), tol=1e-5)


@pytest.mark.parametrize("variance_type", ["fixed_small", "fixed_large"])
def test_ddpm_step_samples_the_posterior(variance_type):
    r"""`DDPMScheduler.step` returns $\tilde\mu_t(x_t, \hat{x}_0) + \sigma_t z$ with $z$ drawn from the `generator`, and `variance_type` sets $\sigma_t^2$: $\tilde\beta_t$ for `"fixed_small"`, $\beta_t$ for `"fixed_large"`."""
    scheduler = DDPMScheduler(variance_type=variance_type, clip_sample=False, **SD_BETAS)
    x_t, eps, t = randn(0), randn(1), 500
    a = abar(scheduler, t)
    x0 = (x_t - (1 - a).sqrt() * eps) / a.sqrt()
    mean, beta_tilde, beta = posterior(scheduler, t, t - 1, x0, x_t)
    close(beta, scheduler.betas[t].double(), tol=1e-4)
    var = beta_tilde if variance_type == "fixed_small" else beta
    got = scheduler.step(eps, t, x_t, generator=torch.Generator().manual_seed(7)).prev_sample
    z = randn(7)
    close(got, mean + var.sqrt() * z, tol=1e-5)


def test_ddpm_step_across_a_stride_uses_the_effective_beta():
    r"""After `set_timesteps(10)`, `DDPMScheduler.step` from `t` to the previous timestep `t - 100` uses $\beta = 1 - \bar\alpha_t / \bar\alpha_{t-100}$ in place of `betas[t]`, in the mean and in the variance."""
    scheduler = DDPMScheduler(clip_sample=False, **SD_BETAS)
    scheduler.set_timesteps(10)
    x_t, eps, t = randn(0), randn(1), 500
    a = abar(scheduler, t)
    x0 = (x_t - (1 - a).sqrt() * eps) / a.sqrt()
    mean, beta_tilde, beta = posterior(scheduler, t, t - 100, x0, x_t)
    assert beta > 50 * scheduler.betas[t]
    got = scheduler.step(eps, t, x_t, generator=torch.Generator().manual_seed(7)).prev_sample
    close(got, mean + beta_tilde.sqrt() * randn(7), tol=1e-5)


def test_ddpm_final_step_adds_no_noise():
    r"""At `t=0`, `DDPMScheduler.step` adds no noise: `prev_sample` is `pred_original_sample`, whatever the `generator`; at the last entry of `scheduler.timesteps` (t = 1 on SD's grid, `steps_offset=1`) the default $\sigma_t^2 = \tilde\beta_t$ is zero (diffusers clamps it to 1e-20) and adds none above 1e-8, while `"fixed_large"` ($\beta_t$) adds noise there."""
    x_t, eps = randn(0), randn(1)

    def two_draws(scheduler, t):
        return [
            scheduler.step(eps, t, x_t, generator=torch.Generator().manual_seed(seed))
            for seed in (1, 2)
        ]

    results = two_draws(DDPMScheduler(clip_sample=False, **SD_BETAS), 0)
    close(results[0].prev_sample, results[1].prev_sample, tol=0)
    close(results[0].prev_sample, results[0].pred_original_sample, tol=1e-6)
    for variance_type in ["fixed_small", "fixed_large"]:
        scheduler = DDPMScheduler(
            clip_sample=False, steps_offset=1, variance_type=variance_type, **SD_BETAS
        )
        scheduler.set_timesteps(10)
        last = int(scheduler.timesteps[-1])
        assert last == 1
        a, b = two_draws(scheduler, last)
        gap = (a.prev_sample - b.prev_sample).abs().max()
        assert (gap < 1e-8) if variance_type == "fixed_small" else (gap > 1e-2), variance_type


def test_ddim_eta_zero_is_deterministic(sd_pipe, monkeypatch):
    r"""`DDIMScheduler.step` with `eta=0` (the default: `StableDiffusionPipeline.__call__` passes `eta=0.0` to every step) is deterministic and returns $\sqrt{\bar\alpha_{\text{prev}}}\, \hat{x}_0 + \sqrt{1-\bar\alpha_{\text{prev}}}\, \hat\epsilon$, where the previous timestep is `num_train_timesteps // num_inference_steps` below `t`."""
    assert isinstance(sd_pipe.scheduler, DDIMScheduler)
    etas = spy_step_kwarg(monkeypatch, sd_pipe.scheduler, "eta")
    sd_pipe(prompt_embeds=embeds(0), num_inference_steps=3, guidance_scale=1.0,
            output_type="latent")  # fmt: skip
    assert etas == [0.0] * 3
    scheduler = DDIMScheduler(clip_sample=False, **SD_BETAS)
    scheduler.set_timesteps(20)
    x_t, eps, t = randn(0), randn(1), 701
    a, a_prev = abar(scheduler, t), abar(scheduler, t - 50)
    x0 = (x_t - (1 - a).sqrt() * eps) / a.sqrt()
    results = [
        scheduler.step(eps, t, x_t, generator=torch.Generator().manual_seed(seed)).prev_sample
        for seed in (1, 2)
    ]
    close(results[0], results[1], tol=0)
    close(results[0], a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps)


def test_ddim_eta_one_is_ddpm():
    """With `clip_sample=False`, `DDIMScheduler.step(..., eta=1.0)` gives the same `prev_sample` as `DDPMScheduler.step` (`variance_type="fixed_small"`) on SD 1.x's betas and a 10-step `leading` grid (both step to the same previous timestep) with the same `generator`, at every step but the last under `set_alpha_to_one=False` (SD 1.x's shipped config), where DDIM stops at `alphas_cumprod[0]` and DDPM at alpha-bar 1.

    Every timestep of a 10-step grid, on diffusers' defaults, on SD 1.5's settings and on
    `set_alpha_to_one=False` with the default `steps_offset=0`, where DDIM's last step (t = 0)
    adds no noise: `final_alpha_cumprod` is `alphas_cumprod[0]`, its own level (round 11 cut
    "with noise"). At the classes' default `clip_sample=True` they part at every step but the
    last: DDIM clamps `pred_original_sample` but keeps the unclipped noise estimate, DDPM's mean
    uses the clamped one (round 11 added `clip_sample=False` to the sentence).
    """
    x_t, eps = randn(0), randn(1)
    for config in [{}, dict(steps_offset=1, set_alpha_to_one=False), dict(set_alpha_to_one=False)]:
        ddim = DDIMScheduler(clip_sample=False, **SD_BETAS, **config)
        ddpm = DDPMScheduler(
            clip_sample=False, steps_offset=config.get("steps_offset", 0), **SD_BETAS
        )
        ddim.set_timesteps(10)
        ddpm.set_timesteps(10)
        assert ddim.config.timestep_spacing == ddpm.config.timestep_spacing == "leading"
        assert ddim.timesteps.tolist() == ddpm.timesteps.tolist()
        last = int(ddim.timesteps[-1])
        for t in ddim.timesteps.tolist():
            g = torch.Generator().manual_seed(t)
            a = ddim.step(eps, t, x_t, eta=1.0, generator=g).prev_sample
            b = ddpm.step(eps, t, x_t, generator=torch.Generator().manual_seed(t))
            if t == last and not ddim.config.set_alpha_to_one:
                assert (a - b.prev_sample).abs().max() > 1e-2  # DDIM: alphas_cumprod[0]
                close(b.prev_sample, b.pred_original_sample, tol=1e-5)  # DDPM: x0_hat itself
                other = ddim.step(eps, t, x_t, eta=1.0, generator=torch.Generator().manual_seed(99))
                noised = (a - other.prev_sample).abs().max().item()
                assert (noised > 1e-3) == (t == 1), (t, noised)  # t = 0: no noise, t = 1: noise
                continue
            close(a, b.prev_sample, tol=1e-5)
            if t != last:
                assert (a - ddim.step(eps, t, x_t, eta=0.0).prev_sample).abs().max() > 1e-2
    ddim = DDIMScheduler(**SD_BETAS)  # clip_sample=True, the classes' default
    ddpm = DDPMScheduler(**SD_BETAS)
    for s in (ddim, ddpm):
        s.set_timesteps(10)
    parted = []
    for t in ddim.timesteps.tolist()[:-1]:
        a = ddim.step(eps, t, x_t, eta=1.0, generator=torch.Generator().manual_seed(t))
        b = ddpm.step(eps, t, x_t, generator=torch.Generator().manual_seed(t))
        parted.append((a.prev_sample - b.prev_sample).abs().max().item() > 1e-2)
    assert all(parted), parted
    page = (Path(__file__).resolve().parents[2] / "docs/handbook/forward-reverse.md").read_text()
    sentence = page[page.index("Setting $\\eta = 1$ restores") :].split("\n")[0]
    assert "`clip_sample=False`" in sentence and "with noise" not in sentence, sentence
