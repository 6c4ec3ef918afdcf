"""Serving extension (docs/handbook/serving.md) against the installed diffusers.

Everything runs on the real classes: the tiny ``StableDiffusionPipeline`` of ``tiny``
(random-config UNet and VAE, ``prompt_embeds`` passed directly), its ``UNet2DConditionModel``
called by hand for the step-level batching loop, and the real schedulers stepped on
random tensors. Nothing here is timed.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DEISMultistepScheduler,
    DPMSolverMultistepScheduler,
    DPMSolverSDEScheduler,
    DPMSolverSinglestepScheduler,
    EDMEulerScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    HeunDiscreteScheduler,
    KDPM2AncestralDiscreteScheduler,
    KDPM2DiscreteScheduler,
    LCMScheduler,
    LMSDiscreteScheduler,
    PNDMScheduler,
    StableDiffusionPipeline,
    UniPCMultistepScheduler,
)
from tiny import (
    EMBED_DIM,
    HEIGHT,
    SD_BETAS,
    SD_SCHEDULER,
    WIDTH,
    embeds,
    random_ip_adapter,
    sd_with,
    start_latents,
    tiny_text_encoder,
)

PROMPT, NEGATIVE = embeds(1), embeds(2)  # (1, 77, EMBED_DIM) stand-in prompt_embeds
LATENT = (1, 4, HEIGHT // 2, WIDTH // 2)  # the tiny VAE downsamples by 2
#: SD 1.x's shipped settings for schedulers that go into a pipeline (steps_offset=1, no
#: clipping), so the pipeline's outdated-config deprecation does not fire
SD_DDPM = dict(SD_BETAS, steps_offset=1, clip_sample=False)
SD_EULER = dict(SD_BETAS, steps_offset=1)


def run(pipe, steps=3, guidance_scale=7.5, prompt=PROMPT, negative=NEGATIVE, **kwargs):
    """One call of the tiny pipeline; returns ``.images`` (the final latents by default)."""
    kwargs.setdefault("latents", start_latents())
    kwargs.setdefault("output_type", "latent")
    return pipe(
        prompt_embeds=prompt,
        negative_prompt_embeds=negative if guidance_scale > 1 else None,
        num_inference_steps=steps,
        guidance_scale=guidance_scale,
        height=HEIGHT,
        width=WIDTH,
        **kwargs,
    ).images


def rand(seed, shape=LATENT):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- one call, one schedule


def test_stages_split_at_prompt_embeds_and_latents(sd_pipe, record_calls, calls_of):
    """`StableDiffusionPipeline` splits into three stages at its own arguments: given `prompt_embeds` and `negative_prompt_embeds` it never calls the text encoder, with `output_type="latent"` it never calls `vae.decode` and returns the final `latents` `(B, 4, h, w)`, and decoding those separately with `vae.decode(latents / scaling_factor)` and `image_processor.postprocess` gives the image of a full call without a safety checker (`safety_checker=None` here)."""
    pipe = sd_with(sd_pipe, text_encoder=tiny_text_encoder())
    encoder = record_calls(pipe.text_encoder).calls
    decodes = calls_of(pipe.vae, "decode")
    latents = run(pipe, steps=3)
    assert encoder == [] and decodes == [] and latents.shape == LATENT
    full = run(pipe, steps=3, output_type="np")
    assert encoder == [] and len(decodes) == 1
    with torch.no_grad():
        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor).sample
    separate = pipe.image_processor.postprocess(image, output_type="np")
    torch.testing.assert_close(torch.from_numpy(separate), torch.from_numpy(full))


def flagging_safety_checker():
    """A ``StableDiffusionSafetyChecker`` on a tiny ``CLIPConfig`` whose concept thresholds
    flag every image (``concept_embeds_weights`` far below any cosine score), and a small
    ``CLIPImageProcessor`` as its ``feature_extractor``."""
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig, CLIPImageProcessor

    torch.manual_seed(0)
    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
    config = CLIPConfig(
        text_config=dict(tower, vocab_size=64, bos_token_id=0, eos_token_id=1, pad_token_id=1),
        vision_config=dict(tower, image_size=32, patch_size=8),
        projection_dim=32,
    )
    checker = StableDiffusionSafetyChecker(config).eval()
    with torch.no_grad():
        checker.concept_embeds_weights.fill_(-10.0)
    processor = CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    return checker, processor


def test_text_encoding_and_decode_are_one_batched_call_per_request(sd_pipe, record_calls, calls_of):
    """Text encoding and the VAE decode run once per pipeline call, over all its rows, not once per prompt or image: given two prompts with `num_images_per_prompt=2` and guidance on, `StableDiffusionPipeline` calls its text encoder once on both prompts and once more on both negative prompts, the UNet on 8 rows per step, and `vae.decode` once, on all 4 `latents` rows, with one forward pass of the VAE's decoder; without guidance (`guidance_scale=1.0`) the text encoder runs once, on both prompts (the interview's "one cheap, cacheable CLIP call (two with CFG)")."""
    from tiny import tiny_tokenizer

    pipe = sd_with(sd_pipe, text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer())
    encoder = record_calls(pipe.text_encoder).calls
    unet = record_calls(pipe.unet).calls
    decoder = record_calls(pipe.vae.decoder).calls
    decodes = calls_of(pipe.vae, "decode")
    with torch.no_grad():
        images = pipe(["a cat", "a dog"], num_images_per_prompt=2, guidance_scale=7.5,
                      num_inference_steps=2, height=HEIGHT, width=WIDTH, output_type="pt").images  # fmt: skip
    assert images.shape[0] == 4
    assert [args[0].shape for args, _ in encoder] == [(2, 77), (2, 77)]
    assert [args[0].shape[0] for args, _ in unet] == [8, 8]
    assert [args[0].shape[0] for args, _ in decodes] == [4] and len(decoder) == 1
    encoder.clear()
    with torch.no_grad():
        pipe(["a cat", "a dog"], guidance_scale=1.0, num_inference_steps=1, height=HEIGHT,
             width=WIDTH, output_type="latent")  # fmt: skip
    assert [args[0].shape for args, _ in encoder] == [(2, 77)]


def test_split_decode_skips_the_safety_checker(sd_pipe):
    """In `StableDiffusionPipeline`, decoding `output_type="latent"` output separately skips the safety checker: with one (SD 1.5 ships one), a full call runs `run_safety_checker` and returns a flagged image black, while `vae.decode` and `postprocess` alone return it (an image it does not flag is the same either way); the decode stage matches the full call when it runs `pipe.run_safety_checker` and passes its flags to `postprocess` as `do_denormalize`."""
    checker, processor = flagging_safety_checker()
    pipe = StableDiffusionPipeline(
        **{**sd_pipe.components, "safety_checker": checker, "feature_extractor": processor}
    )
    pipe.set_progress_bar_config(disable=True)
    full = pipe(prompt_embeds=PROMPT, negative_prompt_embeds=NEGATIVE, num_inference_steps=2,
                height=HEIGHT, width=WIDTH, latents=start_latents(), output_type="np")  # fmt: skip
    assert full.nsfw_content_detected == [True] and full.images.max() == 0  # blacked out
    latents = run(pipe, steps=2)
    with torch.no_grad():
        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor).sample
    separate = pipe.image_processor.postprocess(image, output_type="np")
    assert separate.max() > 0  # the same latents, not blacked out
    checked, flags = pipe.run_safety_checker(image, image.device, image.dtype)
    staged = pipe.image_processor.postprocess(
        checked, output_type="np", do_denormalize=[not f for f in flags]
    )
    np.testing.assert_array_equal(staged, full.images)
    with torch.no_grad():  # thresholds no score reaches: nothing flagged
        checker.concept_embeds_weights.fill_(10.0)
        checker.special_care_embeds_weights.fill_(10.0)
    unflagged = pipe(prompt_embeds=PROMPT, negative_prompt_embeds=NEGATIVE, num_inference_steps=2,
                     height=HEIGHT, width=WIDTH, latents=start_latents(), output_type="np")  # fmt: skip
    assert unflagged.nsfw_content_detected == [False]
    np.testing.assert_array_equal(unflagged.images, separate)


def test_the_safety_checker_is_resident_where_the_decode_runs_it(sd_pipe, record_calls):
    """Residency in `StableDiffusionPipeline`: the safety checker SD 1.5 ships is needed where the decode runs it, not in the loop stage: a call with `output_type="latent"` never runs the checker, while a full call and a decode stage that matches it (`pipe.run_safety_checker`) run it once each.

    The tiny pipeline's own ``__call__`` with a tiny ``StableDiffusionSafetyChecker``; a
    forward hook counts the checker's calls.
    """
    checker, processor = flagging_safety_checker()
    pipe = StableDiffusionPipeline(
        **{**sd_pipe.components, "safety_checker": checker, "feature_extractor": processor}
    )
    pipe.set_progress_bar_config(disable=True)
    runs = record_calls(pipe.safety_checker).calls
    latents = run(pipe, steps=1)  # the loop stage
    assert runs == []
    run(pipe, steps=1, output_type="np")  # a full call
    assert len(runs) == 1
    with torch.no_grad():
        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor).sample
    pipe.run_safety_checker(image, image.device, image.dtype)  # the decode stage
    assert len(runs) == 2


def test_a_second_request_on_shared_state_changes_the_first(sd_pipe, record_calls):
    """A pipeline keeps per-call state on itself (among it `_guidance_scale`, `_cross_attention_kwargs`, which its later UNet calls read, `_interrupt`, which `__call__` resets to `False` when it starts, `_num_timesteps`, and the scheduler's timesteps), and `StableDiffusionPipeline(**pipe.components)` and `from_pipe` share the same `scheduler` object as well as the models: a second request run while the first is between steps, on the same object or on such a twin, silently changes the first request's `latents`, while a pipeline object with its own scheduler (`from_config`) leaves them as in a solo run."""
    calls = record_calls(sd_pipe.unet).calls
    sd_pipe._interrupt = True  # left over from another call: the next call clears it
    solo = run(sd_pipe, steps=4)
    assert len(calls) == 4
    own = sd_with(sd_pipe, scheduler=DDIMScheduler.from_config(sd_pipe.scheduler.config))
    intruders = {  # (pipeline, steps, guidance_scale) of the second request
        "same object": (sd_pipe, 5, 4.0),
        "components twin": (sd_with(sd_pipe), 6, 7.5),
        "from_pipe": (StableDiffusionPipeline.from_pipe(sd_pipe), 6, 7.5),
        "own scheduler": (own, 6, 4.0),
    }
    assert intruders["from_pipe"][0].scheduler is sd_pipe.scheduler
    for name, (other, steps, scale) in intruders.items():

        def second_request(pipe, i, t, callback_kwargs, other=other, steps=steps, scale=scale):
            if i == 1:  # the first request is between its steps 1 and 2
                # scale 1.0: no LoRA to scale, but the dict lands on the pipeline object
                run(other, steps=steps, guidance_scale=scale, cross_attention_kwargs={"scale": 1.0})
            return {}

        calls.clear()
        first = run(sd_pipe, steps=4, callback_on_step_end=second_request)
        if name == "same object":  # its last two UNet calls read the second request's state
            seen = [kwargs.get("cross_attention_kwargs") for _, kwargs in calls]
            assert seen[:2] == [None, None] and seen[-2:] == [{"scale": 1.0}] * 2
            assert len(calls) == 2 + 5 + 2 and sd_pipe.num_timesteps == 5  # not its own 4
        if name.endswith("twin") or name == "from_pipe":  # the twin reset the shared timesteps
            assert len(sd_pipe.scheduler.timesteps) == 6
        if name == "own scheduler":
            torch.testing.assert_close(first, solo, rtol=0, atol=0)
        else:  # no error, a different image
            assert not torch.allclose(first, solo, atol=1e-3), name


def test_adapter_settings_live_on_the_shared_denoiser(sd_pipe):
    """In `StableDiffusionPipeline`, a pipeline object per request does not separate adapter settings, because they live on the modules of the shared UNet: a call with `cross_attention_kwargs={"scale": 0.5}` rescales the UNet's LoRA layers themselves for its duration, and `set_adapters` or `set_ip_adapter_scale` on one pipeline changes the `latents` a twin built from the same components returns."""
    from peft import LoraConfig

    fresh_unet = type(sd_pipe.unet).from_config(sd_pipe.unet.config)
    pipe = sd_with(sd_pipe, unet=fresh_unet, text_encoder=tiny_text_encoder())
    for name in ("a", "b"):  # lora_B random, as trained: the adapters change the output
        config = LoraConfig(r=4, lora_alpha=4, target_modules=["to_q"], init_lora_weights=False)
        if name == "a":
            pipe.unet.add_adapter(config, adapter_name=name)
            continue
        # peft warns on purpose when a second adapter joins: two adapters is the point here
        with pytest.warns(UserWarning, match="Already found a `peft_config` attribute"):
            pipe.unet.add_adapter(config, adapter_name=name)
    twin = sd_with(pipe)
    assert twin.unet is pipe.unet
    layer = pipe.unet.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_q
    seen = []
    handle = layer.register_forward_pre_hook(lambda m, a: seen.append(dict(m.scaling)))
    try:
        run(twin, steps=1, cross_attention_kwargs={"scale": 0.5})
    finally:
        handle.remove()
    assert pipe.unet.active_adapters() == ["b"]  # the last one added
    assert seen[0] == {"a": 1.0, "b": 0.5}  # lora_alpha / r = 1, times the call's scale
    assert dict(layer.scaling) == {"a": 1.0, "b": 1.0}  # restored after the forward
    with_b = run(twin, steps=2)
    pipe.set_adapters("a")  # on the other pipeline object
    with_a = run(twin, steps=2)
    assert not torch.allclose(with_a, with_b, atol=1e-4)
    pipe.load_ip_adapter(random_ip_adapter(pipe.unet, std=1.0), subfolder="", weight_name="", image_encoder_folder=None)  # fmt: skip
    image_embeds = [torch.randn(2, 1, 16, generator=torch.Generator().manual_seed(4))]
    full = run(twin, steps=2, ip_adapter_image_embeds=image_embeds)
    pipe.set_ip_adapter_scale(0.3)
    weaker = run(twin, steps=2, ip_adapter_image_embeds=image_embeds)
    assert not torch.allclose(full, weaker, atol=1e-4)


def test_guidance_scale_at_or_below_one_runs_without_guidance(sd_pipe, record_calls):
    """A request with `guidance_scale <= 1` runs without CFG in `StableDiffusionPipeline` with an SD 1.5-style UNet (no `time_cond_proj_dim`): it makes one-row UNet calls for it and never applies the scale, so `guidance_scale` 0.0, 0.5 and 1.0 give identical `latents`. FLUX.1-dev's `FluxPipeline` (`guidance_embeds=True`) makes one-row calls at any scale but passes the scale to the transformer as `guidance`, so there 0.5 and 1.0 give different `latents`."""
    calls = record_calls(sd_pipe.unet).calls
    outs = [run(sd_pipe, steps=3, guidance_scale=g) for g in (0.0, 0.5, 1.0)]
    assert [sample.shape[0] for (sample, _), _ in calls] == [1] * 9
    for out in outs[:2]:
        torch.testing.assert_close(out, outs[2], rtol=0, atol=0)
    assert not torch.allclose(run(sd_pipe, steps=3, guidance_scale=1.5), outs[2], atol=1e-4)
    from tiny import flux_prompt_embeds, tiny_flux_pipeline

    flux = tiny_flux_pipeline()
    text, pooled = flux_prompt_embeds()
    seen = record_calls(flux.transformer).calls
    flux_out = {
        g: flux(prompt_embeds=text[1:], pooled_prompt_embeds=pooled[1:], guidance_scale=g,
                num_inference_steps=2, height=HEIGHT, width=WIDTH, output_type="latent",
                generator=torch.Generator().manual_seed(0)).images
        for g in (0.5, 1.0)
    }  # fmt: skip
    assert [(k["hidden_states"].shape[0], k["guidance"].item()) for _, k in seen] == [
        (1, 0.5), (1, 0.5), (1, 1.0), (1, 1.0)
    ]  # fmt: skip
    assert not torch.allclose(flux_out[0.5], flux_out[1.0], atol=1e-3)


def test_an_lcm_unet_takes_the_guidance_scale_as_an_embedding(sd_pipe, record_calls):
    """`StableDiffusionPipeline` runs CFG only when `guidance_scale > 1 and unet.config.time_cond_proj_dim is None`: with a UNet whose config sets `time_cond_proj_dim` it makes one-row UNet calls at any scale and passes `guidance_scale - 1` to the UNet as a `timestep_cond` embedding, so there `guidance_scale` 0.5 and 1.0 give different `latents`.

    The config decides, not the distillation: a UNet carrying a LoRA adapter (the form in
    which LCM-LoRA loads) keeps ``time_cond_proj_dim`` unset, and at ``guidance_scale=1.5``
    the pipeline calls it on CFG's two rows.
    """
    from peft import LoraConfig
    from tiny import tiny_unet

    lora = tiny_unet()
    lora.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q"], init_lora_weights=False))  # fmt: skip
    rows = record_calls(lora).calls
    run(sd_with(sd_pipe, unet=lora), steps=1, guidance_scale=1.5)
    assert lora.config.time_cond_proj_dim is None
    assert [args[0].shape[0] for args, _ in rows] == [2]  # guided: an LCM-LoRA is not an LCM UNet

    pipe = sd_with(sd_pipe, unet=tiny_unet(time_cond_proj_dim=8))
    calls = record_calls(pipe.unet).calls
    outs = {g: run(pipe, steps=2, guidance_scale=g) for g in (0.5, 1.0, 7.5)}
    assert [(args[0].shape[0], k["timestep_cond"] is not None) for args, k in calls] == [
        (1, True)
    ] * 6  # one row a call, even at 7.5
    embedded = pipe.get_guidance_scale_embedding(torch.tensor([7.5 - 1]), embedding_dim=8)
    torch.testing.assert_close(calls[-1][1]["timestep_cond"], embedded)
    assert not torch.allclose(outs[0.5], outs[1.0], atol=1e-4)


def test_a_shared_call_takes_one_set_of_call_settings_for_every_row(sd_pipe):
    """Text encoding can share a batch only among prompts encoded with the same call settings, and a step's UNet call only among requests with the same adapter settings: a UNet call's LoRA scale (`cross_attention_kwargs={"scale": s}`) applies to every row, so a row batched with a request at 0.5 gets the 0.5 output, not the output of its own call at 1.0; and likewise `StableDiffusionPipeline.encode_prompt`'s `lora_scale` applies to every prompt it encodes.

    The tiny UNet with a random LoRA on ``to_q``, called as a step-level loop calls it, on two
    rows at different timesteps; the tiny CLIP text encoder with a random LoRA on ``q_proj``
    through ``encode_prompt`` (the pipeline passes a call's LoRA scale there as ``lora_scale``).
    """
    from peft import LoraConfig
    from tiny import tiny_tokenizer

    unet = type(sd_pipe.unet).from_config(sd_pipe.unet.config)
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q"], init_lora_weights=False))  # fmt: skip
    sample, timesteps = torch.cat([rand(0), rand(1)]), torch.tensor([801, 401])
    hidden = embeds(7, batch=2)
    with torch.no_grad():
        together = unet(sample, timesteps, encoder_hidden_states=hidden,
                        cross_attention_kwargs={"scale": 0.5}).sample  # fmt: skip
        own = {s: unet(sample[1:], timesteps[1:], encoder_hidden_states=hidden[1:],
                       cross_attention_kwargs={"scale": s}).sample for s in (0.5, 1.0)}  # fmt: skip
    torch.testing.assert_close(together[1:], own[0.5], rtol=1e-3, atol=1e-4)
    assert not torch.allclose(together[1:], own[1.0], atol=1e-3)
    encoder = tiny_text_encoder()
    encoder.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj"], init_lora_weights=False))  # fmt: skip
    pipe = sd_with(sd_pipe, text_encoder=encoder, tokenizer=tiny_tokenizer())
    encoded = {s: pipe.encode_prompt(["a red disc", "a blue bar"], "cpu", 1, False, lora_scale=s)[0]
               for s in (0.5, 1.0)}  # fmt: skip
    alone = pipe.encode_prompt("a blue bar", "cpu", 1, False, lora_scale=1.0)[0]
    torch.testing.assert_close(encoded[1.0][1:], alone, rtol=1e-3, atol=1e-4)
    assert not torch.allclose(encoded[0.5][1:], alone, atol=1e-3)  # the batch's scale, not its own


def test_prompt_embeddings_are_cached_per_prompt_and_call_settings(sd_pipe):
    """Prompt embeddings can also be cached, but not by prompt alone: with a LoRA on the text encoder, the call's LoRA scale (`StableDiffusionPipeline.encode_prompt`'s `lora_scale`) changes them, the empty negative prompt's too.

    ``encode_prompt`` with CFG on and no negative prompt, on the tiny CLIP text encoder with a
    random LoRA on ``q_proj``: the empty negative prompt's rows are the same beside any prompt
    at one scale, and ``lora_scale=0.5`` gives other rows.
    """
    from peft import LoraConfig
    from tiny import tiny_tokenizer

    encoder = tiny_text_encoder()
    encoder.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj"], init_lora_weights=False))  # fmt: skip
    pipe = sd_with(sd_pipe, text_encoder=encoder, tokenizer=tiny_tokenizer())

    def negative(prompts, **settings):
        return pipe.encode_prompt(prompts, "cpu", 1, True, **settings)[1]

    default = negative(["a red disc", "a blue bar"])
    torch.testing.assert_close(negative("a cat"), default[:1])  # any prompt, one scale
    assert not torch.allclose(negative("a cat", lora_scale=0.5), default[:1], atol=1e-3)


def test_a_loop_stage_without_text_encoder_rejects_a_call_lora_scale(sd_pipe):
    """A `StableDiffusionPipeline` built with `text_encoder=None` for a loop stage fails on a call with `cross_attention_kwargs={"scale": s}`, `s != 1` (an `AttributeError`: `encode_prompt` calls `scale_lora_layers` on the missing text encoder), while `set_adapters(..., adapter_weights=s)` scales the UNet's LoRA there."""
    from peft import LoraConfig

    fresh_unet = type(sd_pipe.unet).from_config(sd_pipe.unet.config)
    pipe = sd_with(sd_pipe, unet=fresh_unet)
    assert pipe.text_encoder is None
    pipe.unet.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q"]), adapter_name="a")
    with pytest.raises(AttributeError):
        run(pipe, steps=1, cross_attention_kwargs={"scale": 0.5})
    run(pipe, steps=1, cross_attention_kwargs={"scale": 1.0})  # 1: nothing to scale, no error
    layer = pipe.unet.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_q
    seen = []
    layer.register_forward_pre_hook(lambda m, a: seen.append(m.scaling["a"]))
    pipe.set_adapters("a", adapter_weights=0.5)
    run(pipe, steps=1)
    assert seen == [0.5]


@pytest.fixture(scope="module")
def sd15_flops():
    """FLOPs of SD 1.5's parts at 512 x 512 on the meta device (``sizes.sd15_flops``)."""
    from sizes import sd15_flops

    return sd15_flops()


def test_real_sd15_flop_shares_of_loop_and_decode(sd_pipe, record_calls, sd15_flops):
    """Counted in FLOPs on SD 1.5's real UNet, VAE and CLIP text encoder at 512 px, with the UNet calls a `StableDiffusionPipeline` call makes, the loop is 92.7% of a guided 20-step call with `DDIMScheduler` and 93.0% with SD 1.5's shipped `PNDMScheduler` (21 UNet calls), both below Lab 12's toy 97.4%; the decode is 43.8% of an unguided 4-step call with DDIM and 38.4% with PNDM (5 UNet calls), either side of the toy's 40.4%. The safety checker is left out. `FlopCounterMode` counts one UNet call per row, one `vae.decode` and one text-encoder call per prompt row, all built on the meta device from the published configs; the calls and rows are counted on the tiny pipeline's own `__call__`."""
    from tiny import SD15_PNDM

    counted = sd15_flops
    row, decode, encode = counted["unet"], counted["decode"], counted["text"]
    recorded = record_calls(sd_pipe.unet).calls

    def shares(scheduler, steps, guidance_scale):  # the UNet rows the pipeline's own call runs
        recorded.clear()
        run(sd_with(sd_pipe, scheduler=scheduler), steps=steps, guidance_scale=guidance_scale)
        rows = sum(args[0].shape[0] for args, _ in recorded)  # 2 a call when guided
        prompts = rows // len(recorded)  # text-encoder rows: prompt, and negative if guided
        total = rows * row + decode + prompts * encode
        return len(recorded), round(100 * rows * row / total, 1), round(100 * decode / total, 1)

    ddim = [DDIMScheduler(**SD_SCHEDULER) for _ in range(2)]
    pndm = [PNDMScheduler(**SD15_PNDM) for _ in range(2)]
    assert shares(ddim[0], 20, 7.5)[:2] == (20, 92.7) and shares(pndm[0], 20, 7.5)[:2] == (21, 93.0)
    assert shares(ddim[1], 4, 1.0)[::2] == (4, 43.8) and shares(pndm[1], 4, 1.0)[::2] == (5, 38.4)


def test_a_unet_rows_cost_grows_faster_than_the_latent_area(sd15_flops):
    """The loop's cost is steps × rows × a per-row cost that grows faster than the latent area (self-attention): one row of SD 1.5's real UNet at 1024 px costs more than 4 times its FLOPs at 512 px, for 4 times the latent area.

    ``FlopCounterMode`` on SD 1.5's ``UNet2DConditionModel`` built on the meta device from
    its published config: latents ``(1, 4, 128, 128)`` against the ``(1, 4, 64, 64)`` of
    ``sizes.sd15_flops``.
    """
    from diffusers import UNet2DConditionModel
    from model_configs import SD15_UNET
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        unet = UNet2DConditionModel(**SD15_UNET)
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            unet(torch.randn(1, 4, 128, 128), torch.tensor(999),
                 encoder_hidden_states=torch.randn(1, 77, 768))  # fmt: skip
    ratio = counter.get_total_flops() / sd15_flops["unet"]
    assert ratio > 4.5, ratio  # not 4: attention over 4x the tokens costs 16x


def test_one_call_has_one_timesteps_list_for_the_whole_batch(sd_pipe, record_calls, calls_of):
    """A `StableDiffusionPipeline` call runs `set_timesteps` once and passes every UNet call one 0-d `t` for all `2B` rows, so all requests in a batch share `num_inference_steps`, the timesteps and `guidance_scale`."""
    sets = calls_of(sd_pipe.scheduler, "set_timesteps")
    calls = record_calls(sd_pipe.unet).calls
    three = embeds(3, batch=3)
    run(sd_pipe, steps=4, prompt=three, negative=embeds(4, batch=3), latents=start_latents(3))
    assert len(sets) == 1 and len(calls) == 4
    for (sample, t), kwargs in calls:
        assert sample.shape[0] == 6 and kwargs["encoder_hidden_states"].shape == (6, 77, EMBED_DIM)
        assert torch.is_tensor(t) and t.ndim == 0


def test_len_timesteps_unet_calls_below_1000_steps(sd_pipe, record_calls):
    """Below 1000 steps, the loop makes `len(timesteps)` UNet calls at `2B` rows with CFG, with each scheduler in `StableDiffusionPipeline`'s `compatibles` (DDIM 4 at 4 steps, Heun 7); at 1000 steps SD 1.5's DDIM settings (`steps_offset=1`) put t = 1000 on the grid, and the call raises `IndexError` after one UNet call.

    The tiny pipeline's own guided ``__call__`` at 4 steps with every class in the pipeline's
    ``scheduler.compatibles``, read from the installed library (PNDM with SD 1.5's shipped
    settings), UNet calls counted by a hook; DDIM's ``set_timesteps`` at every step count
    from 1 to 999 stays below t = 1000.
    """
    from tiny import SD15_PNDM

    calls = record_calls(sd_pipe.unet).calls
    counted = {}
    for cls in sorted(sd_pipe.scheduler.compatibles, key=lambda c: c.__name__):
        config = SD15_PNDM if cls is PNDMScheduler else SD_SCHEDULER
        pipe = sd_with(sd_pipe, scheduler=cls.from_config(config))
        calls.clear()
        run(pipe, steps=4)
        assert len(calls) == len(pipe.scheduler.timesteps), cls
        assert all(args[0].shape[0] == 2 for args, _ in calls)
        counted[cls] = len(calls)
    assert counted[DDIMScheduler] == 4 and counted[HeunDiscreteScheduler] == 7
    ddim = DDIMScheduler(**SD_SCHEDULER)
    calls.clear()
    with pytest.raises(IndexError):
        run(sd_with(sd_pipe, scheduler=ddim), steps=1000)
    assert len(calls) == 1 and len(ddim.timesteps) == 1000 and ddim.timesteps.max() == 1000
    for steps in range(1, 1000):
        ddim.set_timesteps(steps)
        assert ddim.timesteps.max() < 1000, steps


def test_batched_rows_equal_separate_calls(sd_pipe):
    """Two requests batched in one call, with one `torch.Generator` per image passed as a list, get the same `latents`, up to float32 rounding, as two separate calls with those generators, with every scheduler in `StableDiffusionPipeline`'s `compatibles` but `DPMSolverSDEScheduler`. `DPMSolverSDEScheduler` ignores the generators for its step noise: with its default `noise_sampler_seed=None`, two solo calls with the same generator differ at 2 steps, though not at 1.

    The tiny pipeline's own guided ``__call__``, 2 steps, each compatible class built
    ``from_config`` with SD 1.5's values (PNDM with its shipped ``skip_prk_steps``), read from
    the installed library, so a new class is checked too; the batch's second row against its
    own call.
    """
    from tiny import SD15_PNDM

    prompts, negatives = embeds(5, batch=2), embeds(6, batch=2)

    def call(pipe, rows, seeds, steps=2):
        generator = [torch.Generator().manual_seed(s) for s in seeds]
        return run(pipe, steps=steps, prompt=prompts[rows], negative=negatives[rows], latents=None,
                   generator=generator if len(seeds) > 1 else generator[0])  # fmt: skip

    differ = []
    for cls in sorted(sd_pipe.scheduler.compatibles, key=lambda c: c.__name__):
        config = SD15_PNDM if cls is PNDMScheduler else SD_SCHEDULER
        pipe = sd_with(sd_pipe, scheduler=cls.from_config(config))
        together = call(pipe, slice(0, 2), [10, 11])[1:]
        alone = call(pipe, slice(1, 2), [11])
        if not torch.allclose(together, alone, rtol=1e-3, atol=1e-4):
            differ.append(cls.__name__)
            assert pipe.scheduler.config.noise_sampler_seed is None  # its default
            assert not torch.allclose(call(pipe, slice(1, 2), [11]), alone, atol=1e-3)
            one_step = [call(pipe, slice(1, 2), [11], steps=1) for _ in range(2)]
            torch.testing.assert_close(one_step[0], one_step[1], rtol=0, atol=0)  # not at 1 step
    assert differ == ["DPMSolverSDEScheduler"], differ


def test_the_generator_list_has_one_generator_per_image(sd_pipe):
    """`StableDiffusionPipeline` takes one `torch.Generator` per image, not per request: at `num_images_per_prompt=2`, a list of one generator per prompt raises a `ValueError`, and with one per image the second request's two images in a batch of two requests equal its own call's, with `EulerAncestralDiscreteScheduler`, whose `step` draws noise from them.

    The tiny pipeline's own guided ``__call__``, 2 steps, SD 1.5's scheduler values.
    """
    pipe = sd_with(sd_pipe, scheduler=EulerAncestralDiscreteScheduler.from_config(SD_SCHEDULER))
    prompts, negatives = embeds(5, batch=2), embeds(6, batch=2)

    def call(rows, seeds):
        return run(pipe, steps=2, prompt=prompts[rows], negative=negatives[rows], latents=None,
                   num_images_per_prompt=2,
                   generator=[torch.Generator().manual_seed(s) for s in seeds])  # fmt: skip

    with pytest.raises(ValueError, match="list of generators of length 2"):
        call(slice(0, 2), [10, 11])  # one per request
    together = call(slice(0, 2), [10, 11, 12, 13])
    torch.testing.assert_close(together[2:], call(slice(1, 2), [12, 13]), rtol=1e-3, atol=1e-4)


# ---------------------------------------------------------------- cancellation


def serving_diagram() -> dict[str, list[list]]:
    """The serving diagram's rows (tools/infralens_docs/diagrams.yml), by stage."""
    from pathlib import Path

    import yaml

    file = Path(__file__).resolve().parents[2] / "tools" / "infralens_docs" / "diagrams.yml"
    rows = yaml.safe_load(file.read_text(encoding="utf-8"))["serving-stages"]["rows"]
    return {stage: [row for row in rows if row[0] == stage] for stage, _, _ in rows}


def test_the_text_stage_hands_the_loop_both_embeddings(sd_pipe):
    """The serving diagram's text stage passes on `prompt_embeds` and `negative_prompt_embeds`, and a `StableDiffusionPipeline` loop stage built without tokenizer and text encoder runs a guided call on them; given `prompt_embeds` alone, `encode_prompt` encodes the empty negative prompt itself, and there it fails (`AttributeError`)."""
    assert sd_pipe.text_encoder is None and sd_pipe.tokenizer is None
    handed = {"prompt_embeds": PROMPT, "negative_prompt_embeds": NEGATIVE}
    lines = " ".join(line for row in serving_diagram()["text queue"] for line in row[2])
    passed = {name: handed[name] for name in re.findall(r"\b\w*prompt_embeds\b", lines)}
    kwargs = dict(num_inference_steps=2, guidance_scale=7.5, output_type="latent")
    assert sd_pipe(**passed, **kwargs).images.shape == LATENT
    with pytest.raises(AttributeError):
        sd_pipe(prompt_embeds=PROMPT, **kwargs)


def test_interrupt_still_decodes_the_last_latents(sd_pipe, record_calls, calls_of):
    """A cancelled request is not free: after `pipe._interrupt = True` the loop stops calling the UNet, but unless `output_type="latent"` `StableDiffusionPipeline` still runs `vae.decode` once, on the `latents` of the last step that ran, then `run_safety_checker` and `postprocess`, and returns a full-size image."""
    calls = record_calls(sd_pipe.unet).calls
    decodes = calls_of(sd_pipe.vae, "decode")
    checks = calls_of(sd_pipe, "run_safety_checker")
    kept = {}

    def cancel_after_two(pipe, i, t, callback_kwargs):
        kept[i] = callback_kwargs["latents"].clone()
        if i == 1:
            pipe._interrupt = True
        return {}

    image = run(sd_pipe, steps=6, output_type="np", callback_on_step_end=cancel_after_two)
    assert len(calls) == 2 and len(decodes) == 1 and len(checks) == 1
    scaling = sd_pipe.vae.config.scaling_factor
    torch.testing.assert_close(decodes[0][0][0], kept[1] / scaling)
    assert image.shape == (1, HEIGHT, WIDTH, 3)


def test_interrupt_is_read_only_between_steps(sd_pipe, calls_of):
    """In `StableDiffusionPipeline`, `pipe.interrupt` is read only at the top of each iteration: a flag set while a UNet call runs lets that step finish, with its `scheduler.step` and its callback, and stops the loop before the next UNet call."""
    steps = calls_of(sd_pipe.scheduler, "step")
    seen = []

    def flag_during_second_call(module, args, kwargs):
        if len(seen) == 1:  # the UNet call of iteration 1 is starting
            sd_pipe._interrupt = True

    def callback(pipe, i, t, callback_kwargs):
        seen.append(i)
        return {}

    handle = sd_pipe.unet.register_forward_pre_hook(flag_during_second_call, with_kwargs=True)
    try:
        run(sd_pipe, steps=5, callback_on_step_end=callback)
    finally:
        handle.remove()
    assert seen == [0, 1] and len(steps) == 2


def test_a_callbacks_cancel_stops_every_request_of_the_call(sd_pipe, record_calls, calls_of):
    """In one `StableDiffusionPipeline` call, `scheduler.step` runs once per step on all `B` rows and a `callback_on_step_end` that sets `pipe._interrupt` stops every request of the call, so the serving diagram's per-request step, preview and cancel are the service's own code, not the pipeline's callback."""
    unet = record_calls(sd_pipe.unet).calls
    steps = calls_of(sd_pipe.scheduler, "step")

    def cancel(pipe, i, t, callback_kwargs):
        pipe._interrupt = True
        return {}

    two = dict(prompt=embeds(1, batch=2), negative=embeds(2, batch=2), latents=start_latents(2))
    run(sd_pipe, steps=4, callback_on_step_end=cancel, **two)
    assert len(unet) == 1 and unet[0][0][0].shape[0] == 4  # 2 requests x 2 rows, then none
    assert len(steps) == 1 and steps[0][0][2].shape[0] == 2  # one step on both requests
    loop = serving_diagram()["loop queue"]
    assert all("callback_on_step_end" not in operation for _, operation, _ in loop)
    assert any("each request" in operation for _, operation, _ in loop)


# ---------------------------------------------------------------- per-sample timesteps


def test_unet_accepts_a_per_sample_timestep_tensor(sd_pipe):
    """`UNet2DConditionModel` accepts a timestep tensor of shape `(B,)`, one entry per row: a call on rows at different timesteps, each with its own `encoder_hidden_states`, equals calling the UNet on each row alone, up to float32 rounding."""
    unet = sd_pipe.unet
    sample = torch.cat([rand(s) for s in range(3)])  # (3, 4, 8, 8)
    timesteps = torch.tensor([981, 500, 21])
    hidden = embeds(9, batch=3)
    with torch.no_grad():
        together = unet(sample, timesteps, encoder_hidden_states=hidden).sample
        for row in range(3):
            alone = unet(
                sample[row : row + 1], timesteps[row], encoder_hidden_states=hidden[row : row + 1]
            ).sample
            torch.testing.assert_close(together[row : row + 1], alone, rtol=1e-3, atol=1e-4)


def test_step_level_batching_across_requests(sd_pipe):
    """A service's own step-level loop on `StableDiffusionPipeline`'s UNet that keeps one `EulerDiscreteScheduler` per request and makes one UNet call per tick on the concatenated `(2B, 4, h, w)` rows of requests with different `num_inference_steps`, start times and `guidance_scale`, with a `(2B,)` timestep tensor, gives each request the same `latents`, up to float32 rounding, as its own `StableDiffusionPipeline` call."""
    pipe = sd_with(sd_pipe, scheduler=EulerDiscreteScheduler(**SD_EULER))
    requests = [  # (num_inference_steps, guidance_scale, start tick, prompt seed)
        dict(steps=3, scale=7.5, start=0, prompt=embeds(20), negative=embeds(21)),
        dict(steps=5, scale=4.0, start=1, prompt=embeds(22), negative=embeds(23)),
    ]
    for k, r in enumerate(requests):
        r["scheduler"] = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
        r["scheduler"].set_timesteps(r["steps"])
        r["latents"] = rand(30 + k) * r["scheduler"].init_noise_sigma
        r["i"] = 0
    tick, shared = 0, 0
    while any(r["i"] < r["steps"] for r in requests):
        active = [r for r in requests if r["start"] <= tick and r["i"] < r["steps"]]
        shared += len(active) == 2
        inputs, ts, hidden = [], [], []
        for r in active:
            t = r["scheduler"].timesteps[r["i"]]
            x = r["scheduler"].scale_model_input(torch.cat([r["latents"]] * 2), t)
            inputs.append(x)
            ts.append(t.expand(2))
            hidden.append(torch.cat([r["negative"], r["prompt"]]))
        with torch.no_grad():
            noise_pred = pipe.unet(
                torch.cat(inputs), torch.cat(ts), encoder_hidden_states=torch.cat(hidden)
            ).sample
        for r, out in zip(active, noise_pred.split(2), strict=True):
            uncond, text = out.chunk(2)
            guided = uncond + r["scale"] * (text - uncond)
            t = r["scheduler"].timesteps[r["i"]]
            r["latents"] = r["scheduler"].step(guided, t, r["latents"]).prev_sample
            r["i"] += 1
        tick += 1
    assert tick == 6 and shared == 2  # the 5-step request started one tick late
    for k, r in enumerate(requests):
        alone = run(
            pipe,
            steps=r["steps"],
            guidance_scale=r["scale"],
            prompt=r["prompt"],
            negative=r["negative"],
            latents=rand(30 + k),
        )
        torch.testing.assert_close(r["latents"], alone, rtol=1e-3, atol=1e-4)


# ---------------------------------------------------------------- scheduler state


def test_scheduler_state_per_request():
    """Schedulers keep per-request state between `step` calls: `EulerDiscreteScheduler` a `step_index` (`None` after `set_timesteps`, then one more per `step`), `DPMSolverMultistepScheduler` its last `solver_order` converted outputs in `model_outputs`, and `PNDMScheduler` a list `ets` of past model outputs; `DDIMScheduler` keeps none, its `step` reads only `t` and the `set_timesteps` result."""
    x, eps = rand(0), rand(1)
    euler = EulerDiscreteScheduler(**SD_BETAS)
    euler.set_timesteps(5)
    assert euler.step_index is None
    for k, t in enumerate(euler.timesteps[:3]):
        euler.step(eps, t, x)
        assert euler.step_index == k + 1
    dpm = DPMSolverMultistepScheduler(**SD_BETAS)
    dpm.set_timesteps(5)
    assert dpm.config.solver_order == 2 and dpm.model_outputs == [None, None]
    for t in dpm.timesteps[:2]:
        dpm.step(eps, t, x)
    assert all(torch.is_tensor(m) for m in dpm.model_outputs)
    assert dpm.lower_order_nums == 2 and dpm.step_index == 2
    pndm = PNDMScheduler(skip_prk_steps=True, **SD_BETAS)
    pndm.set_timesteps(5)
    for t in pndm.timesteps[:3]:
        pndm.step(eps, t, x)
    assert len(pndm.ets) == 2  # the repeated first timestep stores no new entry
    ddim = DDIMScheduler(**SD_BETAS)
    ddim.set_timesteps(5)
    before = {k: v for k, v in vars(ddim).items() if not torch.is_tensor(v)}
    first = ddim.step(eps, ddim.timesteps[2], x).prev_sample
    ddim.step(eps, ddim.timesteps[0], x)
    assert {k: v for k, v in vars(ddim).items() if not torch.is_tensor(v)} == before
    torch.testing.assert_close(ddim.step(eps, ddim.timesteps[2], x).prev_sample, first)


def test_sharing_one_euler_instance_between_requests_corrupts_them():
    """Two requests interleaved on one `EulerDiscreteScheduler` instance get wrong results: the second request's first `step` uses the `sigma` of the shared `step_index`, not of its own timestep, and the shared index runs off the end of the sigma table (`IndexError`); with one instance per request (`from_config`) both match their solo runs."""

    def model(sample, t):  # a fixed stand-in denoiser: any function of (sample, t) shows it
        return 0.1 * sample + 1e-3 * t

    def solo(seed):
        scheduler = EulerDiscreteScheduler(**SD_BETAS)
        scheduler.set_timesteps(4)
        x = rand(seed) * scheduler.init_noise_sigma
        for t in scheduler.timesteps:
            x = scheduler.step(model(scheduler.scale_model_input(x, t), t), t, x).prev_sample
        return x

    def interleaved(schedulers):
        xs = [rand(seed) * schedulers[0].init_noise_sigma for seed in (0, 1)]
        for t in schedulers[0].timesteps:
            for k, s in enumerate(schedulers):
                xs[k] = s.step(model(s.scale_model_input(xs[k], t), t), t, xs[k]).prev_sample
        return xs

    shared = EulerDiscreteScheduler(**SD_BETAS)
    shared.set_timesteps(4)
    with pytest.raises(IndexError):  # 8 steps on a 4-step sigma table run off its end
        interleaved([shared, shared])
    shared.set_timesteps(4)
    shared.step(rand(2), shared.timesteps[0], rand(0))  # request A's first step
    assert shared.step_index == 1  # request B's first step would now use sigmas[1]
    own = [EulerDiscreteScheduler.from_config(shared.config) for _ in range(2)]
    for s in own:
        s.set_timesteps(4)
    for x, seed in zip(interleaved(own), (0, 1), strict=True):
        torch.testing.assert_close(x, solo(seed))


@pytest.mark.parametrize(
    "make",
    [
        lambda: DPMSolverMultistepScheduler(**SD_BETAS),
        lambda: PNDMScheduler(skip_prk_steps=True, **SD_BETAS),
    ],
    ids=["DPMSolverMultistep", "PNDM"],
)
def test_sharing_a_multistep_instance_mixes_the_requests(make):
    """Two requests with the same step count interleaved on one `DPMSolverMultistepScheduler` or `PNDMScheduler` instance get results different from their solo runs, because each `step` reads state the other request advanced (`step_index` and `model_outputs`, or `counter` and `ets`); one instance per request reproduces the solo runs."""

    def model(sample, t):
        return 0.1 * sample + 1e-3 * t

    def go(schedulers, n_steps):
        xs = [rand(seed) for seed in (0, 1)]
        for t in schedulers[0].timesteps[:n_steps]:
            for k, s in enumerate(schedulers):
                xs[k] = s.step(model(xs[k], t), t, xs[k]).prev_sample
        return xs

    def fresh():
        s = make()
        s.set_timesteps(6)
        return s

    solo = go([fresh(), fresh()], 3)  # one instance per request
    shared = fresh()
    for x, alone in zip(go([shared, shared], 3), solo, strict=True):
        assert not torch.allclose(x, alone, atol=1e-3)
    own = go([fresh(), fresh()], 3)
    for x, alone in zip(own, solo, strict=True):
        torch.testing.assert_close(x, alone, rtol=0, atol=0)
    first_alone = fresh()
    torch.testing.assert_close(go([first_alone], 3)[0], solo[0], rtol=0, atol=0)


def test_ddim_instance_is_reusable_across_requests_with_the_same_step_count():
    """One `DDIMScheduler` instance, set once with `set_timesteps(n)`, can step several interleaved requests that all use `n` steps and gives each the result of its solo run, because its `step` keeps no per-step state."""

    def model(sample, t):
        return 0.1 * sample + 1e-3 * t

    def go(schedulers):
        xs = [rand(seed) for seed in (0, 1)]
        for t in schedulers[0].timesteps:
            for k, s in enumerate(schedulers):
                xs[k] = s.step(model(xs[k], t), t, xs[k]).prev_sample
        return xs

    shared = DDIMScheduler(**SD_BETAS)
    shared.set_timesteps(4)
    own = [DDIMScheduler(**SD_BETAS) for _ in range(2)]
    for s in own:
        s.set_timesteps(4)
    for a, b in zip(go([shared, shared]), go(own), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---------------------------------------------------------------- streaming previews


X0_FIELDS = {  # what step returns next to prev_sample, as the page's table says
    DDIMScheduler: "pred_original_sample",
    DDPMScheduler: "pred_original_sample",
    EulerDiscreteScheduler: "pred_original_sample",
    EulerAncestralDiscreteScheduler: "pred_original_sample",
    HeunDiscreteScheduler: "pred_original_sample",
    KDPM2DiscreteScheduler: "pred_original_sample",
    KDPM2AncestralDiscreteScheduler: "pred_original_sample",
    LMSDiscreteScheduler: "pred_original_sample",
    DPMSolverSDEScheduler: "pred_original_sample",
    EDMEulerScheduler: "pred_original_sample",
    LCMScheduler: "denoised",
    PNDMScheduler: None,
    DPMSolverMultistepScheduler: None,
    DPMSolverSinglestepScheduler: None,
    UniPCMultistepScheduler: None,
    DEISMultistepScheduler: None,
    FlowMatchEulerDiscreteScheduler: None,
}


def test_the_x0_table_covers_every_compatible_scheduler(sd_pipe):
    """The table of what `step` returns covers every scheduler in `StableDiffusionPipeline`'s `compatibles`, read from the installed library."""
    missing = set(sd_pipe.scheduler.compatibles) - set(X0_FIELDS)
    assert not missing, sorted(cls.__name__ for cls in missing)


@pytest.mark.parametrize(
    "cls, field",
    list(X0_FIELDS.items()),
    ids=lambda v: v.__name__ if isinstance(v, type) else str(v),
)
def test_which_step_outputs_carry_an_x0_prediction(cls, field):
    """`step` returns an x0 prediction next to `prev_sample` (`pred_original_sample`, also as element 1 of the `return_dict=False` tuple) for `DDIMScheduler`, `DDPMScheduler`, `EulerDiscreteScheduler`, `EulerAncestralDiscreteScheduler`, `HeunDiscreteScheduler`, `KDPM2DiscreteScheduler`, `KDPM2AncestralDiscreteScheduler`, `LMSDiscreteScheduler`, `DPMSolverSDEScheduler` and `EDMEulerScheduler`; `LCMScheduler` returns it as `denoised`; `PNDMScheduler`, `DPMSolverMultistepScheduler`, `DPMSolverSinglestepScheduler`, `UniPCMultistepScheduler`, `DEISMultistepScheduler` and `FlowMatchEulerDiscreteScheduler` return `prev_sample` alone."""
    no_betas = (FlowMatchEulerDiscreteScheduler, EDMEulerScheduler)
    kwargs = {} if cls in no_betas else dict(SD_BETAS)
    if cls is PNDMScheduler:
        kwargs["skip_prk_steps"] = True
    x, eps = rand(0), rand(1)
    outputs = {}
    for return_dict in [True, False]:
        scheduler = cls(**kwargs)
        scheduler.set_timesteps(4)
        outputs[return_dict] = scheduler.step(
            eps, scheduler.timesteps[0], x, return_dict=return_dict
        )
    out, tup = outputs[True], outputs[False]
    if field is None:
        assert list(out.keys()) == ["prev_sample"] and len(tup) == 1
    else:
        assert list(out.keys()) == ["prev_sample", field] and len(tup) == 2
        assert torch.is_tensor(out[field]) and out[field].shape == x.shape
        torch.testing.assert_close(tup[1], out[field])


def test_callback_preview_from_a_wrapped_step(sd_pipe, record_calls, monkeypatch):
    """The callback gets only the tensors in `callback_on_step_end_tensor_inputs` (for `StableDiffusionPipeline` any of `latents`, `prompt_embeds` and `negative_prompt_embeds`; another name raises a `ValueError`), not the `step` output, so a preview of x0 needs the `pred_original_sample` kept by a wrapper around `pipe.scheduler.step` (the pipeline keeps element 0 of its tuple); for DDIM with `epsilon` it equals `(x_t - sqrt(1 - alpha_bar_t) * noise_pred) / sqrt(alpha_bar_t)`, and `vae.decode` of it divided by `scaling_factor` gives a `(B, 3, H, W)` preview."""
    scheduler = sd_pipe.scheduler
    assert isinstance(scheduler, DDIMScheduler) and scheduler.config.prediction_type == "epsilon"
    kept = []
    original = scheduler.step

    def step(model_output, timestep, sample, *args, **kwargs):
        assert kwargs["return_dict"] is False  # the pipeline keeps out[0] only
        out = original(model_output, timestep, sample, *args, **kwargs)
        kept.append((model_output.clone(), timestep, sample.clone(), out[1].clone()))
        return out

    monkeypatch.setattr(scheduler, "step", step)
    previews, seen = [], []

    def preview(pipe, i, t, callback_kwargs):
        seen.append(set(callback_kwargs))
        x0 = kept[-1][3]
        with torch.no_grad():
            image = pipe.vae.decode(x0 / pipe.vae.config.scaling_factor).sample
        previews.append(image)
        return {}

    run(sd_pipe, steps=3, callback_on_step_end=preview)
    assert seen == [{"latents"}] * 3 and len(previews) == 3
    for (noise_pred, t, sample, x0), image in zip(kept, previews, strict=True):
        alpha_bar = scheduler.alphas_cumprod[t]
        expected = (sample - (1 - alpha_bar).sqrt() * noise_pred) / alpha_bar.sqrt()
        torch.testing.assert_close(x0, expected, rtol=1e-3, atol=1e-4)
        assert image.shape == (1, 3, HEIGHT, WIDTH)
    names = ["latents", "prompt_embeds", "negative_prompt_embeds"]  # all a callback can get
    got = []
    run(sd_pipe, steps=1, callback_on_step_end=lambda p, i, t, kw: got.append(set(kw)) or {},
        callback_on_step_end_tensor_inputs=names)  # fmt: skip
    assert got == [set(names)]
    for other in ["noise_pred", "noise_pred_text", "latent_model_input", "t", "timesteps"]:
        with pytest.raises(ValueError, match=other):  # the loop's other tensors: refused
            run(sd_pipe, steps=1, callback_on_step_end=lambda p, i, t, kw: {},
                callback_on_step_end_tensor_inputs=[other])  # fmt: skip


def test_dpmsolver_model_outputs_hold_the_x0_prediction(sd_pipe, monkeypatch):
    """`DPMSolverMultistepScheduler`, with its default `algorithm_type="dpmsolver++"`, stores the x0 prediction of the latest `step` in `scheduler.model_outputs[-1]` (run here in `StableDiffusionPipeline`), so a callback can read a preview from `pipe.scheduler` without wrapping `step`.

    The tiny pipeline's own ``__call__``, guided, 4 steps: a ``callback_on_step_end`` reads
    ``pipe.scheduler.model_outputs[-1]`` after each step, and it equals
    ``(x_t - sqrt(1 - alpha_bar_t) * noise_pred) / sqrt(alpha_bar_t)`` of that step's inputs
    (recorded by a spy that only observes).
    """
    scheduler = DPMSolverMultistepScheduler.from_config(SD_SCHEDULER)
    assert scheduler.config.algorithm_type == "dpmsolver++"
    pipe = sd_with(sd_pipe, scheduler=scheduler)
    inputs, read = [], []
    original = scheduler.step

    def observe(model_output, timestep, sample, *args, **kwargs):
        inputs.append((model_output.clone(), timestep, sample.clone()))
        return original(model_output, timestep, sample, *args, **kwargs)

    monkeypatch.setattr(scheduler, "step", observe)

    def preview(pipe, i, t, callback_kwargs):
        read.append(pipe.scheduler.model_outputs[-1].clone())
        return {}

    run(pipe, steps=4, callback_on_step_end=preview)
    assert len(read) == len(inputs) == 4
    for (noise_pred, t, sample), x0 in zip(inputs, read, strict=True):
        alpha_bar = scheduler.alphas_cumprod[t]
        expected = (sample - (1 - alpha_bar).sqrt() * noise_pred) / alpha_bar.sqrt()
        torch.testing.assert_close(x0, expected, rtol=1e-3, atol=1e-4)
