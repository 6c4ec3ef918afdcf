"""Lab 09 (ControlNet / conditioning reading) against the real diffusers classes.

No weights: ``ControlNetModel.from_unet`` on the tiny UNet (``tiny.tiny_unet``), a tiny
``StableDiffusionControlNetPipeline`` around it, ``IPAdapterAttnProcessor2_0`` on a tiny
``Attention``, a tiny ``T2IAdapter``, and SD 1.5's full-size UNet config on the meta
device for the parameter count. The lab's NumPy functions come from the executed starter
(``lab``), so each test checks the code the page shows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny import run_starter, tiny_controlnet, tiny_controlnet_pipeline

LAB09 = "code/lab-09-controlnet-conditioning-reading/controlnet_conditioning.py"


@pytest.fixture(scope="module")
def lab():
    """The starter's globals after a default run (its functions and constants)."""
    return run_starter(LAB09)


# ---------------------------------------------------------------- helpers (this page only)


def inputs():
    """Fixed latents (1, 4, 8, 8), timestep, prompt_embeds (1, 77, 32), control image."""
    from tiny import EMBED_DIM, HEIGHT, WIDTH, start_latents

    g = torch.Generator().manual_seed(5)
    prompt_embeds = torch.randn(1, 77, EMBED_DIM, generator=g)
    control_image = torch.rand(1, 3, HEIGHT, WIDTH, generator=g)
    return start_latents(), torch.tensor(500), prompt_embeds, control_image


def new_controlnet(unet, trained=False):
    """``ControlNetModel.from_unet``; ``trained`` re-draws the zero-initialised layers."""
    return tiny_controlnet(unet, seed=1, trained=trained)


def residuals(controlnet, **kwargs):
    x, t, prompt_embeds, control_image = inputs()
    with torch.no_grad():
        down, mid = controlnet(
            x, t, encoder_hidden_states=prompt_embeds, controlnet_cond=control_image,
            return_dict=False, **kwargs,
        )  # fmt: skip
    return list(down), mid


def starter_stdout(*argv):
    """What the starter prints when run as ``__main__`` with ``argv``."""
    import contextlib
    import io
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    out, saved, sys.argv = io.StringIO(), sys.argv, [LAB09.rsplit("/", 1)[1], *argv]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(ROOT / LAB09), run_name="__main__")
    finally:
        sys.argv = saved
    return out.getvalue()


def call(pipe, steps, **kwargs):
    """One CFG call (guidance_scale 7.5) on stand-in embeddings; returns latents.

    ``image`` defaults to the control image of ``inputs``; a list of ControlNets takes a list.
    """
    from tiny import HEIGHT, WIDTH, embeds, start_latents

    return pipe(
        prompt_embeds=embeds(1), negative_prompt_embeds=embeds(2), guidance_scale=7.5,
        num_inference_steps=steps, height=HEIGHT, width=WIDTH, latents=start_latents(),
        output_type="latent", **{"image": inputs()[3], **kwargs},
    ).images  # fmt: skip


# ---------------------------------------------------------------- ControlNetModel


def test_fresh_controlnet_residuals_are_all_zero(record_calls):
    """A fresh `ControlNetModel.from_unet` returns residuals that are exactly zero, because its output projections `controlnet_down_blocks` and `controlnet_mid_block` are zero-initialised (and so is the `conv_out` of `controlnet_cond_embedding`), so attaching it changes nothing: `StableDiffusionControlNetPipeline.__call__` with it, calling it at every step, returns the same latents as `StableDiffusionPipeline.__call__` on the same UNet, bit for bit."""
    from diffusers import DDIMScheduler
    from tiny import HEIGHT, SD_SCHEDULER, WIDTH, embeds, start_latents, tiny_sd_pipeline, tiny_unet

    unet = tiny_unet()
    controlnet = new_controlnet(unet)
    for module in [
        *controlnet.controlnet_down_blocks,
        controlnet.controlnet_mid_block,
        controlnet.controlnet_cond_embedding.conv_out,
    ]:
        assert all(not p.any() for p in module.parameters())
    down, mid = residuals(controlnet)
    assert all(not r.any() for r in [*down, mid])
    calls = record_calls(controlnet)
    pipe = tiny_controlnet_pipeline(unet, controlnet, scheduler=DDIMScheduler(**SD_SCHEDULER))
    with_control = call(pipe, 3)
    assert len(calls.calls) == 3
    base = tiny_sd_pipeline(unet=unet, scheduler=DDIMScheduler(**SD_SCHEDULER))(
        prompt_embeds=embeds(1), negative_prompt_embeds=embeds(2), guidance_scale=7.5,
        num_inference_steps=3, height=HEIGHT, width=WIDTH, latents=start_latents(),
        output_type="latent",
    ).images  # fmt: skip
    assert torch.equal(with_control, base)


def test_one_residual_per_unet_skip_with_its_shape():
    """The ControlNet returns one residual per UNet skip tensor (the `conv_in` output, each resnet's output of the down blocks, taken after its transformer in a cross-attention block, and each downsampler's output), each with that skip's shape, plus one residual shaped like the mid-block output."""
    from tiny import tiny_unet

    unet = tiny_unet()
    skips, mid_out, block_res, transformer_out = [], [], [], []
    unet.conv_in.register_forward_hook(lambda m, a, o: skips.append(o.shape))
    for block in unet.down_blocks:
        block.register_forward_hook(lambda m, a, o: skips.extend(r.shape for r in o[1]))
        block.register_forward_hook(lambda m, a, o: block_res.append(o[1]))
        for transformer in getattr(block, "attentions", []):  # CrossAttnDownBlock2D only
            transformer.register_forward_hook(lambda m, a, o: transformer_out.append(o[0]))
    unet.mid_block.register_forward_hook(lambda m, a, o: mid_out.append(o.shape))
    x, t, prompt_embeds, _ = inputs()
    with torch.no_grad():
        unet(x, t, encoder_hidden_states=prompt_embeds)
    down, mid = residuals(new_controlnet(unet, trained=True))
    assert [r.shape for r in down] == skips and len(skips) == 4
    assert mid.shape == mid_out[0]
    # in the cross-attention block the skip is its transformer's output, not its ResNet's
    assert type(unet.down_blocks[0]).__name__ == "CrossAttnDownBlock2D"
    assert len(transformer_out) == 1 and block_res[0][0] is transformer_out[0]


def test_from_unet_copies_the_encoder_and_embeds_the_control_image():
    """`ControlNetModel.from_unet` copies the UNet's `conv_in`, `time_embedding`, `down_blocks` and `mid_block` weights and has no up blocks; inside the ControlNet, `controlnet_cond_embedding(controlnet_cond)` is added to the `conv_in` output before the first down block."""
    from tiny import tiny_unet

    unet = tiny_unet()
    controlnet = new_controlnet(unet)
    for name in ("conv_in", "time_embedding", "down_blocks", "mid_block"):
        ours, theirs = getattr(controlnet, name).state_dict(), getattr(unet, name).state_dict()
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert not hasattr(controlnet, "up_blocks")
    seen = []
    controlnet.down_blocks[0].register_forward_pre_hook(
        lambda m, a, k: seen.append(k.get("hidden_states", a[0] if a else None)), with_kwargs=True
    )
    x, _, _, control_image = inputs()
    residuals(controlnet)
    with torch.no_grad():
        expected = controlnet.conv_in(x) + controlnet.controlnet_cond_embedding(control_image)
    torch.testing.assert_close(seen[0], expected)


def test_zero_projections_move_at_the_first_update_the_cond_embedding_at_the_second():
    """A fresh `ControlNetModel.from_unet`'s zero-initialised output projections (`controlnet_down_blocks`, `controlnet_mid_block`) get a nonzero weight gradient at the first training update, their inputs (the copied encoder's features) not being zero, so one SGD step moves them; the zero `conv_out` of `controlnet_cond_embedding`, whose gradient passes through those projections, gets exactly zero at the first update and moves from the second."""
    from tiny import tiny_unet

    unet = tiny_unet().requires_grad_(False)  # the frozen base
    controlnet = new_controlnet(unet)
    projections = [*controlnet.controlnet_down_blocks, controlnet.controlnet_mid_block]
    cond_out = controlnet.controlnet_cond_embedding.conv_out
    x, t, prompt_embeds, control_image = inputs()
    target = torch.randn(x.shape, generator=torch.Generator().manual_seed(9))  # the noise
    optimizer = torch.optim.SGD(controlnet.parameters(), lr=0.1)
    for update in (1, 2):
        optimizer.zero_grad()
        down, mid = controlnet(
            x, t, encoder_hidden_states=prompt_embeds, controlnet_cond=control_image,
            return_dict=False,
        )  # fmt: skip
        noise_pred = unet(
            x, t, encoder_hidden_states=prompt_embeds,
            down_block_additional_residuals=down, mid_block_additional_residual=mid,
        ).sample  # fmt: skip
        torch.nn.functional.mse_loss(noise_pred, target).backward()
        assert all(p.weight.grad.abs().max() > 0 for p in projections)
        assert bool(cond_out.weight.grad.abs().max() > 0) == (update == 2)
        optimizer.step()
        assert all(p.weight.abs().max() > 0 for p in projections)
        assert bool(cond_out.weight.abs().max() > 0) == (update == 2)


def test_unet_adds_the_residuals_to_its_skips_and_mid_block():
    """`UNet2DConditionModel` adds `down_block_additional_residuals[i]` to its i-th skip tensor and `mid_block_additional_residual` to the mid-block output before the up blocks read them."""
    from tiny import tiny_unet

    unet = tiny_unet()
    down, mid = residuals(new_controlnet(unet, trained=True))
    skips, mid_out, up_in = [], [], []
    unet.conv_in.register_forward_hook(lambda m, a, o: skips.append(o))
    for block in unet.down_blocks:
        block.register_forward_hook(lambda m, a, o: skips.extend(o[1]))
    unet.mid_block.register_forward_hook(lambda m, a, o: mid_out.append(o))
    for block in unet.up_blocks:
        block.register_forward_pre_hook(lambda m, a, k: up_in.append(k), with_kwargs=True)
    x, t, prompt_embeds, _ = inputs()
    with torch.no_grad():
        unet(
            x, t, encoder_hidden_states=prompt_embeds,
            down_block_additional_residuals=down, mid_block_additional_residual=mid,
        )  # fmt: skip
    torch.testing.assert_close(up_in[0]["hidden_states"], mid_out[0] + mid)
    read = [r for k in up_in for r in reversed(k["res_hidden_states_tuple"])]
    expected = [s + r for s, r in zip(skips, down, strict=True)][::-1]
    assert len(read) == len(expected)
    for a, b in zip(read, expected, strict=True):
        torch.testing.assert_close(a, b)


def test_conditioning_scale_is_linear_in_the_residuals(lab):
    """`ControlNetModel.forward` multiplies every residual by `conditioning_scale`, so half the scale gives exactly half the residuals, as the starter's `controlnet_forward` does."""
    from tiny import tiny_unet

    controlnet = new_controlnet(tiny_unet(), trained=True)
    full, half = (
        residuals(controlnet, conditioning_scale=1.0),
        residuals(controlnet, conditioning_scale=0.5),
    )
    for a, b in zip([*full[0], full[1]], [*half[0], half[1]], strict=True):
        assert a.abs().max() > 0
        torch.testing.assert_close(b, 0.5 * a)
    down, _ = lab["controlnet_forward"](lab["trained"], lab["latents"], lab["controlnet_cond"], 0.5)
    ref, _ = lab["controlnet_forward"](lab["trained"], lab["latents"], lab["controlnet_cond"])
    for d, r in zip(down, ref, strict=True):
        np.testing.assert_allclose(d, 0.5 * r, rtol=1e-6)


def test_guess_mode_scales_residuals_by_a_logspace_ramp(lab):
    """With `guess_mode=True` (and `global_pool_conditions` false) `ControlNetModel.forward` scales the i-th residual by `torch.logspace(-1, 0, len(down_block_res_samples) + 1)[i] * conditioning_scale`: 0.1 for the first skip, rising to 1.0 for the mid block, the ramp the starter's `guess_mode_scales` reproduces."""
    from tiny import tiny_unet

    controlnet = new_controlnet(tiny_unet(), trained=True)
    plain_down, plain_mid = residuals(controlnet, conditioning_scale=1.0)
    down, mid = residuals(controlnet, conditioning_scale=0.8, guess_mode=True)
    ramp = torch.logspace(-1, 0, len(plain_down) + 1) * 0.8
    np.testing.assert_allclose(
        ramp.numpy(), lab["guess_mode_scales"](len(plain_down), 0.8), rtol=1e-6
    )
    for r, p, s in zip(down, plain_down, ramp[:-1], strict=True):
        torch.testing.assert_close(r, s * p)
    torch.testing.assert_close(mid, ramp[-1] * plain_mid)
    unit = torch.logspace(-1, 0, len(plain_down) + 1)
    assert unit[0].item() == pytest.approx(0.1) and unit[-1].item() == 1.0
    controlnet.register_to_config(global_pool_conditions=True)  # no ramp: scale, then mean-pool
    down, mid = residuals(controlnet, conditioning_scale=0.8, guess_mode=True)
    for r, p in zip([*down, mid], [*plain_down, plain_mid], strict=True):
        torch.testing.assert_close(r, (0.8 * p).mean(dim=(2, 3), keepdim=True))


# ---------------------------------------------------------------- the pipeline


def test_controlnet_keep_sets_the_scale_of_every_call(lab, record_calls):
    """`StableDiffusionControlNetPipeline` calls the ControlNet at every step with `conditioning_scale = controlnet_conditioning_scale * controlnet_keep[i]`, where `controlnet_keep[i] = 1.0 - float(i / len(timesteps) < control_guidance_start or (i + 1) / len(timesteps) > control_guidance_end)`, as the starter's `controlnet_keep_for` computes; steps outside the window still run the ControlNet, with scale 0, and so does every step of a call with `controlnet_conditioning_scale=0.0`. A list of ControlNets (`MultiControlNetModel`) runs every net at every step too, one at scale 0.0 included."""
    from tiny import tiny_unet

    unet = tiny_unet()
    controlnet = new_controlnet(unet, trained=True)
    pipe = tiny_controlnet_pipeline(unet, controlnet)
    # DDIM: one timestep per step here; the lab's 20-step run is the next test's
    for steps, start, end, scale in [
        (10, 0.2, 0.8, 0.7), (5, 0.0, 0.5, 0.7), (4, 0.5, 1.0, 0.7), (3, 0.0, 1.0, 0.0),
    ]:  # fmt: skip
        recorder = record_calls(controlnet)
        call(pipe, steps, controlnet_conditioning_scale=scale,
             control_guidance_start=start, control_guidance_end=end)  # fmt: skip
        scales = [kwargs["conditioning_scale"] for _, kwargs in recorder.calls]
        keep = lab["controlnet_keep_for"](steps, start, end)
        assert scales == [scale * k for k in keep] and len(scales) == steps
        assert 0.0 in scales
        recorder.remove()
    second = new_controlnet(unet)
    recorders = [record_calls(net) for net in (controlnet, second)]
    call(tiny_controlnet_pipeline(unet, [controlnet, second]), 2, image=[inputs()[3]] * 2,
         controlnet_conditioning_scale=[0.0, 0.7])  # fmt: skip
    scales = [[kwargs["conditioning_scale"] for _, kwargs in r.calls] for r in recorders]
    assert scales == [[0.0, 0.0], [0.7, 0.7]]  # 2 steps: each net at both


def test_controlnet_runs_once_per_timestep_for_every_compatible_scheduler(lab, record_calls):
    """Below 1000 steps, `StableDiffusionControlNetPipeline` calls the ControlNet once per entry of `scheduler.timesteps`, with `controlnet_keep` built over `len(timesteps)`, for every scheduler in its `scheduler.compatibles`; at 20 steps and the window 0.2 to 0.8, DDIM makes 20 calls (20 timesteps with `leading`, `linspace` and `trailing` spacing), 12 with control (the starter's `steps with control: 12 of 20`, which counts no calls), and SD 1.5's shipped `PNDMScheduler` 21, 11 with control; at 1000 steps that `PNDMScheduler` puts t = 1000 first: one ControlNet call, then an `IndexError`."""
    from diffusers import DDIMScheduler, PNDMScheduler
    from tiny import SD15_PNDM, SD_SCHEDULER, tiny_unet

    unet = tiny_unet()
    controlnet = new_controlnet(unet, trained=True)
    pipe = tiny_controlnet_pipeline(unet, controlnet, scheduler=PNDMScheduler(**SD15_PNDM))
    sd15_config = pipe.scheduler.config

    def run(scheduler, steps):
        pipe.scheduler = scheduler
        recorder = record_calls(controlnet)
        call(pipe, steps, controlnet_conditioning_scale=0.7,
             control_guidance_start=0.2, control_guidance_end=0.8)  # fmt: skip
        recorder.remove()
        scales = [kwargs["conditioning_scale"] for _, kwargs in recorder.calls]
        keep = lab["controlnet_keep_for"](len(scheduler.timesteps), 0.2, 0.8)
        assert scales == [0.7 * k for k in keep]
        return len(scales), int(sum(keep))

    classes = pipe.scheduler.compatibles
    assert {"PNDMScheduler", "HeunDiscreteScheduler", "DPMSolverSDEScheduler"} <= {
        c.__name__ for c in classes
    }
    counts = {}
    for cls in classes:  # 2 steps: order-2 schedulers and PNDM make 3 calls
        scheduler = cls.from_config(sd15_config)
        counts[cls.__name__], _ = run(scheduler, 2)
        assert counts[cls.__name__] == len(scheduler.timesteps), cls.__name__
    assert counts["PNDMScheduler"] == counts["HeunDiscreteScheduler"] == 3
    assert run(DDIMScheduler(**SD_SCHEDULER), 20) == (20, 12)
    for spacing in ("leading", "linspace", "trailing"):
        ddim = DDIMScheduler.from_config(SD_SCHEDULER, timestep_spacing=spacing)
        ddim.set_timesteps(20)
        assert len(ddim.timesteps) == 20, spacing
    assert run(PNDMScheduler(**SD15_PNDM), 20) == (21, 11)
    out = starter_stdout("--steps", "20", "--control-guidance-start", "0.2",
                         "--control-guidance-end", "0.8")  # fmt: skip
    assert (
        "steps with control: 12 of 20 (the pipeline still calls the ControlNet at a 0 step" in out
    )
    assert "calls with" not in out  # the starter states no call count: it depends on the scheduler
    pipe.scheduler = PNDMScheduler(**SD15_PNDM)
    recorder = record_calls(controlnet)
    with pytest.raises(IndexError):
        call(pipe, 1000)
    recorder.remove()
    assert len(recorder.calls) == 1 and int(pipe.scheduler.timesteps[0]) == 1000
    import re

    from infralens_docs.registry import ROOT

    page = (ROOT / "docs" / "labs" / "lab-09-controlnet-conditioning-reading.md").read_text(
        encoding="utf-8"
    )
    counts = [
        part
        for part in re.split(r"(?<=[.!?])\s+", page)
        if any(phrase in part for phrase in ("once per entry of `timesteps`",))
    ]
    assert len(counts) == 1 and all("below 1000 steps" in c.lower() for c in counts), counts


def test_multi_controlnet_union_skips_a_net_at_scale_zero():
    """Not every diffusers ControlNet path runs at scale 0: `StableDiffusionXLControlNetUnionPipeline` wraps a list of `ControlNetUnionModel`s in `MultiControlNetUnionModel`, whose forward skips a net whose `conditioning_scale` is 0.0; through `__call__` with two nets, a net at `controlnet_conditioning_scale` 0.0 never runs, and with windows 0 to 0.5 and 0.5 to 1 over 4 steps each net runs at 2 steps, not 4."""
    from diffusers import (
        ControlNetUnionModel,
        EulerDiscreteScheduler,
        StableDiffusionXLControlNetUnionPipeline,
    )
    from tiny import HEIGHT, POOLED_DIM, SD_SCHEDULER, WIDTH, embeds, tiny_text_time_unet, tiny_vae

    unet = tiny_text_time_unet()
    config = dict(ControlNetUnionModel.from_unet(unet, conditioning_embedding_out_channels=(16, 32)).config)  # fmt: skip
    c0 = unet.config.block_out_channels[0]  # the union's task tokens match conv_in's width
    config.update(num_trans_channel=c0, num_proj_channel=c0, num_trans_head=2)
    torch.manual_seed(1)
    nets = [ControlNetUnionModel(**{k: v for k, v in config.items() if not k.startswith("_")}).eval()
            for _ in range(2)]  # fmt: skip
    pipe = StableDiffusionXLControlNetUnionPipeline(
        vae=tiny_vae(), text_encoder=None, text_encoder_2=None, tokenizer=None, tokenizer_2=None,
        unet=unet, controlnet=nets, scheduler=EulerDiscreteScheduler.from_config(SD_SCHEDULER),
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    assert type(pipe.controlnet).__name__ == "MultiControlNetUnionModel"
    calls = [[], []]
    for i, net in enumerate(nets):
        net.register_forward_pre_hook(
            lambda m, a, k, i=i: calls[i].append(k["conditioning_scale"]), with_kwargs=True
        )
    image, pooled = torch.rand(1, 3, HEIGHT, WIDTH), torch.randn(1, POOLED_DIM)

    def run(**kwargs):
        for c in calls:
            c.clear()
        with torch.no_grad():
            pipe(prompt_embeds=embeds(1), pooled_prompt_embeds=pooled,
                 negative_prompt_embeds=embeds(2), negative_pooled_prompt_embeds=pooled * 0,
                 control_image=[image, image], control_mode=[0, 1], num_inference_steps=4,
                 guidance_scale=5.0, height=HEIGHT, width=WIDTH, output_type="latent", **kwargs)  # fmt: skip
        return [len(c) for c in calls]

    assert run(controlnet_conditioning_scale=[0.0, 0.7]) == [0, 4]
    assert run(controlnet_conditioning_scale=[0.7, 0.7], control_guidance_start=[0.0, 0.5],
               control_guidance_end=[0.5, 1.0]) == [2, 2]  # fmt: skip


def test_guidance_window_checks(record_calls):
    """`StableDiffusionControlNetPipeline.check_inputs` rejects a `control_guidance_start` that is not smaller than `control_guidance_end`, a start below 0 and an end above 1, with a `ValueError`; a NaN start or end passes (every comparison with NaN is false), which the starter rejects. A negative `controlnet_conditioning_scale` such as -0.5 runs, the ControlNet called with it."""
    from tiny import tiny_unet

    unet = tiny_unet()
    controlnet = new_controlnet(unet)
    pipe = tiny_controlnet_pipeline(unet, controlnet)
    for start, end in [(0.5, 0.5), (0.6, 0.4), (-0.1, 1.0), (0.0, 1.5)]:
        with pytest.raises(ValueError, match="control guidance"):
            call(pipe, 2, control_guidance_start=start, control_guidance_end=end)
    for start, end in [(float("nan"), 1.0), (0.0, float("nan"))]:
        call(pipe, 1, control_guidance_start=start, control_guidance_end=end)
    recorder = record_calls(controlnet)
    call(pipe, 1, controlnet_conditioning_scale=-0.5)
    assert [kwargs["conditioning_scale"] for _, kwargs in recorder.calls] == [-0.5]


def test_guess_mode_runs_the_controlnet_on_the_conditional_half(record_calls):
    """With `guess_mode=True` and CFG, `StableDiffusionControlNetPipeline` runs the ControlNet on the conditional half only (batch B, the positive `prompt_embeds`, the control image `(B, 3, H, W)` in pixels, not doubled) and gives the UNet zeros for the unconditional half of every residual; without `guess_mode` the ControlNet sees the whole `2B` batch."""
    from tiny import HEIGHT, WIDTH, embeds, tiny_unet

    unet = tiny_unet()
    controlnet = new_controlnet(unet, trained=True)
    pipe = tiny_controlnet_pipeline(unet, controlnet)
    cn, un = record_calls(controlnet), record_calls(unet)
    call(pipe, 2, guess_mode=True)
    for (args, kwargs), (_, unet_kwargs) in zip(cn.calls, un.calls, strict=True):
        assert args[0].shape[0] == 1 and kwargs["controlnet_cond"].shape == (1, 3, HEIGHT, WIDTH)
        torch.testing.assert_close(kwargs["encoder_hidden_states"], embeds(1))
        for r in [*unet_kwargs["down_block_additional_residuals"],
                  unet_kwargs["mid_block_additional_residual"]]:  # fmt: skip
            assert r.shape[0] == 2 and not r[0].any() and r[1].abs().max() > 0
    cn.remove()
    cn = record_calls(controlnet)
    call(pipe, 2)
    assert all(args[0].shape[0] == 2 for args, _ in cn.calls)
    assert all(kwargs["controlnet_cond"].shape[0] == 2 for _, kwargs in cn.calls)


def test_sd15_controlnet_size_matches_the_starter(lab):
    """`ControlNetModel.from_unet` on SD 1.5's UNet config, counted on the meta device, has 361,279,120 parameters (the starter's `CONTROLNET_SD15_PARAMS`), 42.0% of the UNet's 859,520,964, with 12 `controlnet_down_blocks`, one per UNet skip (its down blocks are three `CrossAttnDownBlock2D`s, then a `DownBlock2D`)."""
    from diffusers import ControlNetModel, UNet2DConditionModel
    from model_configs import SD15_UNET

    with torch.device("meta"):
        unet = UNet2DConditionModel(**SD15_UNET)
        controlnet = ControlNetModel.from_unet(unet, load_weights_from_unet=False)
    count = sum(p.numel() for p in controlnet.parameters())
    unet_count = sum(p.numel() for p in unet.parameters())
    assert count == lab["CONTROLNET_SD15_PARAMS"] == 361_279_120
    assert unet_count == lab["unet_params"] == 859_520_964
    assert f"{count / unet_count:.1%}" == "42.0%"
    assert len(controlnet.controlnet_down_blocks) == 12
    kinds = [type(block).__name__ for block in unet.down_blocks]
    assert kinds == ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"]


def test_sd15_controlnet_flops_share_matches_the_starter(lab):
    """Counted with torch's `FlopCounterMode` on the meta device, one call of SD 1.5's full-size ControlNet (`ControlNetModel.from_unet`) at 512 x 512 costs 35.3% of the FLOPs of one UNet call (the starter's `CONTROLNET_SD15_FLOPS_SHARE`), against the toy's 114%."""
    from diffusers import ControlNetModel, UNet2DConditionModel
    from model_configs import SD15_UNET
    from torch.utils.flop_counter import FlopCounterMode

    flops = []
    with torch.device("meta"):
        unet = UNet2DConditionModel(**SD15_UNET)
        controlnet = ControlNetModel.from_unet(unet, load_weights_from_unet=False)
        latents, prompt_embeds = torch.empty(1, 4, 64, 64), torch.empty(1, 77, 768)
        for module, extra in [
            (unet, {}),
            (controlnet, {"controlnet_cond": torch.empty(1, 3, 512, 512)}),
        ]:
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                module(latents, 500, encoder_hidden_states=prompt_embeds, **extra)
            flops.append(counter.get_total_flops())
    assert round(flops[1] / flops[0], 3) == lab["CONTROLNET_SD15_FLOPS_SHARE"] == 0.353
    assert round(lab["branch_flops"] / lab["base_flops"], 2) == 1.14


def test_control_image_is_pixels_for_sd_and_latents_for_sd3(record_calls):
    """`StableDiffusionControlNetPipeline` hands the control image to the ControlNet in pixels, `(2B, 3, H, W)` under CFG, and never runs the VAE's encoder; `StableDiffusion3ControlNetPipeline` encodes it with the VAE first and hands the ControlNet latents, `(2B, 16, H/f, W/f)` with SD3's 16 latent channels and the VAE's downsampling factor `f`."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3ControlNetModel,
        SD3Transformer2DModel,
        StableDiffusion3ControlNetPipeline,
    )
    from tiny import HEIGHT, WIDTH, tiny_unet

    unet = tiny_unet()
    controlnet = new_controlnet(unet, trained=True)
    pipe = tiny_controlnet_pipeline(unet, controlnet)
    encoder, cn = record_calls(pipe.vae.encoder), record_calls(controlnet)
    call(pipe, 2)
    assert encoder.calls == []
    assert all(k["controlnet_cond"].shape == (2, 3, HEIGHT, WIDTH) for _, k in cn.calls)

    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=2,
        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32,
        caption_projection_dim=16, pooled_projection_dim=16, pos_embed_max_size=16,
    ).eval()  # fmt: skip
    sd3_controlnet = SD3ControlNetModel.from_transformer(
        transformer, num_layers=1, num_extra_conditioning_channels=0
    ).eval()
    vae = AutoencoderKL(
        block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=16, layers_per_block=1,
        norm_num_groups=4, use_quant_conv=False, use_post_quant_conv=False,
        scaling_factor=1.5305, shift_factor=0.0609,
    ).eval()  # fmt: skip
    none = {f"{kind}{n}": None for kind in ("text_encoder", "tokenizer") for n in ("", "_2", "_3")}
    sd3 = StableDiffusion3ControlNetPipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
        controlnet=sd3_controlnet, **none,
    )  # fmt: skip
    sd3.set_progress_bar_config(disable=True)
    encoder, cn = record_calls(vae.encoder), record_calls(sd3_controlnet)
    g = torch.Generator().manual_seed(0)
    prompt_embeds, pooled = torch.randn(1, 77, 32, generator=g), torch.randn(1, 16, generator=g)
    sd3(
        prompt_embeds=prompt_embeds, negative_prompt_embeds=prompt_embeds,
        pooled_prompt_embeds=pooled, negative_pooled_prompt_embeds=pooled,
        control_image=inputs()[3], num_inference_steps=2, height=HEIGHT, width=WIDTH,
        output_type="latent",
    )  # fmt: skip
    assert [args[0].shape for args, _ in encoder.calls] == [(2, 3, HEIGHT, WIDTH)]
    assert all(k["controlnet_cond"].shape == (2, 16, HEIGHT // 2, WIDTH // 2) for _, k in cn.calls)


# ---------------------------------------------------------------- IP-Adapter, T2I-Adapter


def test_ip_adapter_processor_matches_the_numpy_decoupled_attention(lab):
    """`IPAdapterAttnProcessor2_0` returns `to_out(softmax(Q K_text^T / sqrt(d)) V_text + scale * softmax(Q K_img^T / sqrt(d)) V_img)`, with the image keys and values from its own `to_k_ip` and `to_v_ip`, which is the starter's `ip_adapter_attention` to float rounding."""
    from diffusers.models.attention_processor import Attention, IPAdapterAttnProcessor2_0

    torch.manual_seed(0)
    attn = Attention(query_dim=32, cross_attention_dim=24, heads=4, dim_head=8).eval()
    processor = IPAdapterAttnProcessor2_0(hidden_size=32, cross_attention_dim=24, scale=0.6)
    attn.set_processor(processor)
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 16, 32, generator=g)  # (B, h*w, C)
    text = torch.randn(2, 77, 24, generator=g)  # prompt_embeds (B, 77, D)
    image = torch.randn(2, 4, 24, generator=g)  # projected image tokens (B, 4, D)
    with torch.no_grad():
        for p in processor.parameters():
            p.normal_(0, 0.3)  # trained-looking image projections
        out = attn(hidden, encoder_hidden_states=(text, [image])).numpy()
    w = {
        "to_q": attn.to_q.weight.T, "to_k": attn.to_k.weight.T, "to_v": attn.to_v.weight.T,
        "to_k_ip": processor.to_k_ip[0].weight.T, "to_v_ip": processor.to_v_ip[0].weight.T,
        "to_out": attn.to_out[0].weight.T, "to_out_bias": attn.to_out[0].bias,
    }  # fmt: skip
    w = {k: v.detach().numpy() for k, v in w.items()}
    expected = lab["ip_adapter_attention"](
        hidden.numpy(), text.numpy(), image.numpy(), w, 0.6, heads=4
    )
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    text_only = lab["ip_adapter_attention"](
        hidden.numpy(), text.numpy(), image.numpy(), w, 0.0, heads=4
    )
    assert np.abs(out - text_only).mean() > 1e-3


def test_ip_adapter_scale_zero_gives_the_text_attention(lab, record_calls):
    """At scale 0 `IPAdapterAttnProcessor2_0` skips the image branch (`to_k_ip` and `to_v_ip` do not run) and returns the layer's plain text attention."""
    from diffusers.models.attention_processor import Attention, IPAdapterAttnProcessor2_0

    torch.manual_seed(0)
    attn = Attention(query_dim=32, cross_attention_dim=24, heads=4, dim_head=8).eval()
    processor = IPAdapterAttnProcessor2_0(hidden_size=32, cross_attention_dim=24, scale=0.0)
    attn.set_processor(processor)
    g = torch.Generator().manual_seed(2)
    hidden, text = torch.randn(1, 16, 32, generator=g), torch.randn(1, 77, 24, generator=g)
    image = torch.randn(1, 4, 24, generator=g)
    k_ip, v_ip = record_calls(processor.to_k_ip[0]), record_calls(processor.to_v_ip[0])
    with torch.no_grad():
        out = attn(hidden, encoder_hidden_states=(text, [image])).numpy()
    assert k_ip.calls == [] and v_ip.calls == []
    w = {
        "to_q": attn.to_q.weight.T, "to_k": attn.to_k.weight.T, "to_v": attn.to_v.weight.T,
        "to_out": attn.to_out[0].weight.T, "to_out_bias": attn.to_out[0].bias,
    }  # fmt: skip
    w = {k: v.detach().numpy() for k, v in w.items()}
    expected = lab["ip_adapter_attention"](hidden.numpy(), text.numpy(), None, w, 0.0, heads=4)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_t2i_adapter_features_are_computed_once_per_call(record_calls):
    """`StableDiffusionAdapterPipeline` runs its `T2IAdapter` once per call, before the denoising loop, and passes the same features to every UNet call as `down_intrablock_additional_residuals`."""
    from diffusers import DDIMScheduler, StableDiffusionAdapterPipeline, T2IAdapter
    from tiny import SD_BETAS, tiny_unet, tiny_vae

    torch.manual_seed(0)
    adapter = T2IAdapter(in_channels=3, channels=[32, 64], num_res_blocks=1, downscale_factor=2)
    pipe = StableDiffusionAdapterPipeline(
        vae=tiny_vae(), text_encoder=None, tokenizer=None, unet=tiny_unet(),
        adapter=adapter.eval(), scheduler=DDIMScheduler(set_alpha_to_one=False, **SD_BETAS),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    adapter_calls, unet_calls = record_calls(adapter), record_calls(pipe.unet)
    order = []
    adapter.register_forward_pre_hook(lambda m, a: order.append("adapter"))
    pipe.unet.register_forward_pre_hook(lambda m, a: order.append("unet"))
    call(pipe, 3)
    assert order == ["adapter", "unet", "unet", "unet"]
    assert len(adapter_calls.calls) == 1 and len(unet_calls.calls) == 3
    first = unet_calls.calls[0][1]["down_intrablock_additional_residuals"]
    for _, kwargs in unet_calls.calls[1:]:
        for a, b in zip(first, kwargs["down_intrablock_additional_residuals"], strict=True):
            torch.testing.assert_close(a, b)
