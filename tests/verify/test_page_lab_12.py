"""Lab 12 (end-to-end inference trace) against the real StableDiffusionPipeline.

No weights: the UNet and VAE are tiny and random (``tiny.py``), the DDIM scheduler has
SD 1.x's betas, and the prompt embeddings are passed in, so no tokenizer or text encoder
is downloaded. Wrappers and hooks record every array that crosses a stage boundary into
the same trace rows the lab's NumPy starter prints (stage, step, boundary, name, shape,
dtype, device), and the tests compare the two traces' structure.

What "the same structure" means, exactly (see ``test_real_trace_has_the_toys_structure``):

- the same boundaries, ``(stage, step, boundary)``, in the same order, for the same batch
  ``B`` and number of steps ``n``;
- every real shape equals the toy row's symbolic ``layout`` (``"2B, 4, h, w"``) expanded
  with the real pipeline's own sizes: ``h, w`` = its latent size and ``H = f * h`` with
  ``f = pipe.vae_scale_factor`` (2 here, 8 in SD; the toy's patch VAE has 8). That holds
  the rank, the batch doubling, the 4 latent channels and the image/latent factor;
- the condition rows are the exception: the toy's condition is a class label per
  row ``(B,)``, diffusers' is ``prompt_embeds`` ``(B, 77, D)``, so only the batch axis is
  compared there;
- the dtype kind (float, signed int, unsigned int) agrees on every other row; the
  device is ``cpu`` on both. Dtypes themselves differ: NumPy float64, torch float32.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest
import torch
from tiny import EMBED_DIM, embeds, run_starter, sd_with, start_latents, tiny_sd_pipeline

STARTER = "code/lab-12-end-to-end-inference-trace/pipeline_trace.py"
#: the tiny pipeline's trace: a batch of 2, 3 DDIM steps, 16 x 16 pixels, 8 x 8 latents
B, N, SIZE, GUIDANCE = 2, 3, 16, 7.5
#: stage timings use this thread's CPU time, not wall time: time spent waiting for a core
#: while other processes run (a shared CI machine) is not counted; see the timing test
CLOCK = time.thread_time


def real_trace(pipe, guidance_scale=GUIDANCE, batch=B, steps=N, timings=None):
    """Run ``pipe`` once with recording wrappers; return (trace rows, output images).

    Each row also keeps a copy of the array (``value``) for the tests that compare values.

    ``timings`` (a dict), if given, collects the CPU time of this thread per stage (``CLOCK``):
    prepare (encode_prompt, set_timesteps, prepare_latents), loop (every UNet call and
    scheduler.step) and decode (vae.decode and postprocess).
    """
    rows, step = [], [0]

    def add(stage, boundary, name, array, at_step=None):
        is_tensor = isinstance(array, torch.Tensor)
        rows.append(
            dict(stage=stage, step=at_step, boundary=boundary, name=name,
                 shape=tuple(array.shape), dtype=str(array.dtype).removeprefix("torch."),
                 device=array.device.type if is_tensor else "cpu",
                 value=array.detach().clone() if is_tensor else array.copy())
        )  # fmt: skip

    def wrap(owner, attr, stage, after):
        original = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            start = CLOCK()
            out = original(*args, **kwargs)
            if timings is not None:
                timings[stage] = timings.get(stage, 0.0) + CLOCK() - start
            after(args, kwargs, out)
            return out

        setattr(owner, attr, wrapper)

    def on_encode(args, kwargs, out):  # encode_prompt returns (prompt_embeds, negative_...)
        add("prepare", "prompt -> condition", "prompt_embeds", out[0])
        add("prepare", "negative prompt -> condition", "negative_prompt_embeds", out[1])

    def on_set_timesteps(args, kwargs, out):
        add("prepare", "set_timesteps", "timesteps", pipe.scheduler.timesteps)

    def on_prepare_latents(args, kwargs, out):
        add("prepare", "noise * init_noise_sigma", "latents", out)

    def on_step(args, kwargs, out):  # step(noise_pred, t, latents, return_dict=False)
        add("loop", "split + guidance", "noise_pred", args[0], step[0])
        add("loop", "scheduler.step(...).prev_sample", "latents", out[0], step[0])

    def on_decode(args, kwargs, out):  # vae.decode(latents / scaling_factor, ...)
        add("decode", "latents / scaling_factor", "latents", args[0])
        add("decode", "vae.decode", "image", out[0])

    wrap(pipe, "encode_prompt", "prepare", on_encode)
    wrap(pipe.scheduler, "set_timesteps", "prepare", on_set_timesteps)
    wrap(pipe, "prepare_latents", "prepare", on_prepare_latents)
    wrap(pipe.scheduler, "step", "loop", on_step)
    wrap(pipe.vae, "decode", "decode", on_decode)
    wrap(pipe.image_processor, "postprocess", "decode", lambda *_: None)

    unet_start = []

    def unet_pre(module, args, kwargs):
        step[0] += 1
        unet_start.append(CLOCK())
        add("loop", "cat([latents] * 2), scale_model_input", "latent_model_input", args[0], step[0])
        add("loop", "condition into the unet", "encoder_hidden_states",
            kwargs["encoder_hidden_states"], step[0])  # fmt: skip

    def unet_post(module, args, kwargs, output):  # return_dict=False: a tuple
        if timings is not None:
            timings["loop"] = timings.get("loop", 0.0) + CLOCK() - unet_start[-1]
        add("loop", "unet(...)", "noise_pred", output[0], step[0])

    handles = [
        pipe.unet.register_forward_pre_hook(unet_pre, with_kwargs=True),
        pipe.unet.register_forward_hook(unet_post, with_kwargs=True),
    ]
    try:
        with torch.no_grad():
            images = pipe(
                prompt_embeds=embeds(1, batch),
                negative_prompt_embeds=embeds(2, batch),
                num_inference_steps=steps,
                guidance_scale=guidance_scale,
                height=SIZE,
                width=SIZE,
                latents=start_latents(batch),
                output_type="np",
            ).images
    finally:
        for handle in handles:
            handle.remove()
    add("decode", 'postprocess(output_type="np")', "image", images)
    pixels = np.stack([np.asarray(p) for p in pipe.image_processor.numpy_to_pil(images)])
    add("decode", "(image * 255).round() to uint8", "image", pixels)
    return rows, images


@pytest.fixture(scope="module")
def toy(request):
    """The NumPy starter run at the same B, n and guidance_scale; returns its globals."""
    return run_starter(
        STARTER, "--num-samples", str(B), "--steps", str(N), "--guidance-scale", str(GUIDANCE)
    )


def kind(dtype: str) -> str:
    return np.dtype(dtype).kind


def test_real_trace_has_the_toys_structure(toy):
    """The real `StableDiffusionPipeline` crosses the same boundaries in the same order as the lab's NumPy trace, and every shape fits the lab's layout with the pipeline's own sizes: `latent_model_input` and the UNet's `noise_pred` `(2B, 4, h, w)` while guiding, `noise_pred` after guidance and `latents` after `scheduler.step` `(B, 4, h, w)`, the decoder input `(B, 4, h, w)`, the decoded image `(B, 3, H, W)` with `H = vae_scale_factor * h`, and the output `(B, H, W, 3)`."""
    pipe = tiny_sd_pipeline()
    rows, _ = real_trace(pipe)
    toy_rows = [r for r in toy["trace"] if r["stage"] != "load"]
    key = lambda r: (r["stage"], r["step"], r["boundary"])  # noqa: E731
    assert [key(r) for r in rows] == [key(r) for r in toy_rows]
    assert len(rows) == 4 + 5 * N + 4
    sizes = dict(B=B, n=N, h=SIZE // pipe.vae_scale_factor, w=SIZE // pipe.vae_scale_factor,
                 f=pipe.vae_scale_factor)  # fmt: skip
    assert pipe.vae_scale_factor == 2 and toy["vae"].config.patch_size == 8
    expand = toy["expand"]
    for real, mine in zip(rows, toy_rows, strict=True):
        expected = expand(mine["layout"], sizes)
        assert real["device"] == mine["device"] == "cpu"
        if "condition" in mine["boundary"]:  # class labels (B,) vs prompt_embeds (B, 77, D)
            assert real["shape"] == (*expected, 77, EMBED_DIM), real
            continue
        assert real["shape"] == expected, (real, mine["layout"])
        assert kind(real["dtype"]) == kind(mine["dtype"]), (real, mine)
    # the toy's own shapes fit the same layouts with its sizes (8x8 patches, 4 x 4 latents)
    toy_sizes = dict(B=B, n=N, h=4, w=4, f=8)
    assert all(r["shape"] == expand(r["layout"], toy_sizes) for r in toy_rows)


def test_passing_embeds_skips_the_text_encoder(tmp_path, record_calls):
    """In `StableDiffusionPipeline`, with `prompt_embeds` and `negative_prompt_embeds` passed, `encode_prompt` never calls the text encoder: the trace starts at the embeddings, and a pipeline built with `text_encoder=None` runs."""
    from tiny import tiny_text_encoder, tiny_tokenizer

    pipe = tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer(tmp_path))
    encoder = record_calls(pipe.text_encoder)
    rows, _ = real_trace(pipe)
    assert encoder.calls == []
    assert rows[0]["shape"] == (B, 77, EMBED_DIM)
    real_trace(tiny_sd_pipeline())  # text_encoder=None, tokenizer=None: still runs


def test_prompt_embeds_alone_encode_the_empty_negative_prompt(tmp_path, record_calls):
    """In `StableDiffusionPipeline`, with `prompt_embeds` alone and CFG on (`guidance_scale > 1` and a UNet without `time_cond_proj_dim`), the text encoder still runs once, on the empty negative prompt `""` padded to the length of `prompt_embeds`: 77 tokens for CLIP-encoded embeddings, and longer embeddings make the text encoder raise `ValueError`; with a UNet whose config sets `time_cond_proj_dim` (an LCM UNet) it does not run at `guidance_scale > 1`.

    ``encode_prompt`` tokenizes ``""`` with ``max_length = prompt_embeds.shape[1]``: the
    pipeline's own ``__call__`` at 77 and at 20 tokens, then at 78, one past CLIP's 77
    positions; then at 77 with a tiny UNet with ``time_cond_proj_dim=8``.
    """
    from tiny import tiny_text_encoder, tiny_tokenizer, tiny_unet

    pipe = tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer(tmp_path))
    encoder = record_calls(pipe.text_encoder)

    def call(length):
        prompt_embeds = (
            embeds(1, B)[:, :length] if length <= 77 else torch.randn(B, length, EMBED_DIM)
        )
        pipe(prompt_embeds=prompt_embeds, num_inference_steps=2, guidance_scale=GUIDANCE,
             height=SIZE, width=SIZE, latents=start_latents(B), output_type="latent")  # fmt: skip

    for length in [77, 20]:
        encoder.calls.clear()
        call(length)
        assert len(encoder.calls) == 1
        input_ids = encoder.calls[0][0][0]
        assert input_ids.shape == (B, length)
        expected = pipe.tokenizer(
            [""] * B, padding="max_length", max_length=length, return_tensors="pt"
        )
        torch.testing.assert_close(input_ids, expected.input_ids)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        call(78)
    encoder.calls.clear()
    pipe = sd_with(pipe, unet=tiny_unet(time_cond_proj_dim=8))  # an LCM UNet: no CFG
    call(77)
    assert encoder.calls == []


def test_prepare_latents_multiplies_by_init_noise_sigma():
    """`StableDiffusionPipeline.prepare_latents` multiplies the starting noise by `scheduler.init_noise_sigma`: 1 for DDIM, so the noise passes unchanged, and far above 1 for `EulerDiscreteScheduler`, whose latents live on the sigma scale."""
    from diffusers import EulerDiscreteScheduler
    from tiny import SD_BETAS

    # SD 1.5's steps_offset=1: with the default 0, StableDiffusionPipeline warns and rewrites it
    for scheduler in [None, EulerDiscreteScheduler(**SD_BETAS, steps_offset=1)]:
        pipe = tiny_sd_pipeline(scheduler=scheduler)
        pipe.scheduler.set_timesteps(N)
        sigma = float(pipe.scheduler.init_noise_sigma)
        out = pipe.prepare_latents(B, 4, SIZE, SIZE, torch.float32, "cpu", None, start_latents(B))
        torch.testing.assert_close(out, start_latents(B) * sigma)
        # the drawing branch too (latents=None): randn_tensor from the generator, then the scale
        drawn = pipe.prepare_latents(B, 4, SIZE, SIZE, torch.float32, "cpu",
                                     torch.Generator().manual_seed(3))  # fmt: skip
        side = SIZE // pipe.vae_scale_factor
        noise = torch.randn(B, 4, side, side, generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(drawn, noise * sigma)
        assert sigma == 1.0 if scheduler is None else sigma > 10.0


def value(rows, boundary, step=None):
    found = [r["value"] for r in rows if r["boundary"] == boundary and r["step"] == step]
    assert len(found) == 1, (boundary, step, len(found))
    return found[0]


def test_decoder_gets_the_last_latents_over_scaling_factor():
    """In `StableDiffusionPipeline`, the VAE decoder receives the loop's last `latents` divided by `vae.config.scaling_factor`, once, after the loop."""
    pipe = tiny_sd_pipeline()
    rows, _ = real_trace(pipe)
    last = value(rows, "scheduler.step(...).prev_sample", step=N)
    boundaries = [r["boundary"] for r in rows]
    assert boundaries.index("latents / scaling_factor") > max(
        i for i, r in enumerate(rows) if r["stage"] == "loop"
    )
    torch.testing.assert_close(
        value(rows, "latents / scaling_factor"), last / pipe.vae.config.scaling_factor
    )


def test_np_output_is_the_decoded_image_in_unit_range_channels_last():
    """In `StableDiffusionPipeline`, `output_type="np"` returns float32 `(B, H, W, 3)` in [0, 1]: the decoder output `(B, 3, H, W)` mapped by `x / 2 + 0.5`, clamped, channels moved last."""
    rows, images = real_trace(tiny_sd_pipeline())
    assert images.dtype == np.float32 and images.shape == (B, SIZE, SIZE, 3)
    assert images.min() >= 0.0 and images.max() <= 1.0
    decoded = value(rows, "vae.decode")
    assert decoded.shape == (B, 3, SIZE, SIZE)
    expected = (decoded / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(images, expected, rtol=0, atol=1e-6)


def test_call_not_encode_prompt_concatenates_the_condition():
    """`StableDiffusionPipeline.__call__` concatenates the two `encode_prompt` outputs before the loop (inference_trace.md): `encode_prompt` returns `prompt_embeds` and `negative_prompt_embeds` with `B` rows each, and every UNet call gets the same tensor, `cat([negative_prompt_embeds, prompt_embeds])`, `2B` rows, unconditional first.

    Recorded on the tiny pipeline's own guided ``__call__`` by ``real_trace``'s wrapper on
    ``encode_prompt`` and its pre-hook on the UNet; one more pre-hook keeps each call's
    ``encoder_hidden_states`` object: one object for all steps, so it is built once.
    """
    pipe = tiny_sd_pipeline()
    seen = []
    handle = pipe.unet.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["encoder_hidden_states"]), with_kwargs=True
    )
    try:
        rows, _ = real_trace(pipe)
    finally:
        handle.remove()
    assert len(seen) == N and all(x is seen[0] for x in seen)
    prompt = value(rows, "prompt -> condition")
    negative = value(rows, "negative prompt -> condition")
    assert prompt.shape == negative.shape == (B, 77, EMBED_DIM)
    for step in range(1, N + 1):
        into_unet = value(rows, "condition into the unet", step=step)
        torch.testing.assert_close(into_unet, torch.cat([negative, prompt]), rtol=0, atol=0)


def test_text_encoder_runs_before_the_loop_twice_when_guiding(tmp_path):
    """In `StableDiffusionPipeline`, the text encoder runs only before the loop, twice with CFG: prompt, then negative prompt; once without CFG.

    The tiny pipeline's own ``__call__`` with a tiny CLIP text encoder and tokenizer, prompts
    ``["a", "b"]`` (no embeddings passed), 3 steps: pre-hooks on the text encoder and the UNet
    log the order of the calls and the text encoder's ``input_ids``.
    """
    from tiny import tiny_text_encoder, tiny_tokenizer

    pipe = tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer(tmp_path))
    log = []
    handles = [
        pipe.text_encoder.register_forward_pre_hook(
            lambda module, args, kwargs: log.append(("text", args[0])), with_kwargs=True
        ),
        pipe.unet.register_forward_pre_hook(
            lambda module, args, kwargs: log.append(("unet", None)), with_kwargs=True
        ),
    ]

    def ids(prompts):
        return pipe.tokenizer(
            prompts, padding="max_length", max_length=77, truncation=True, return_tensors="pt"
        ).input_ids

    try:
        for guidance_scale, texts in [(GUIDANCE, [["a", "b"], ["", ""]]), (1.0, [["a", "b"]])]:
            log.clear()
            with torch.no_grad():
                pipe(prompt=["a", "b"], num_inference_steps=N, guidance_scale=guidance_scale,
                     height=SIZE, width=SIZE, output_type="latent")  # fmt: skip
            kinds = [kind for kind, _ in log]
            assert kinds == ["text"] * len(texts) + ["unet"] * N, kinds
            for (_, input_ids), prompts in zip(log, texts, strict=False):
                torch.testing.assert_close(input_ids, ids(prompts))
    finally:
        for handle in handles:
            handle.remove()


def test_numpy_to_pil_rounds_to_uint8():
    """`VaeImageProcessor.numpy_to_pil`, run here on `StableDiffusionPipeline`'s output, makes 8-bit pixels as `(image * 255).round()`, the lab's last boundary."""
    pipe = tiny_sd_pipeline()
    _, images = real_trace(pipe)
    pixels = np.stack([np.asarray(p) for p in pipe.image_processor.numpy_to_pil(images)])
    assert pixels.dtype == np.uint8 and pixels.shape == (B, SIZE, SIZE, 3)
    np.testing.assert_array_equal(pixels, (images * 255).round().astype(np.uint8))


def test_the_loop_takes_the_most_time_then_decode():
    """In the tiny real `StableDiffusionPipeline` at 3 guided steps (`B = 2`) the denoising loop takes more CPU time than decode, and decode more than prepare, the order of the lab's cost model (one torch thread, after a warm-up call, best of 5 calls per stage; `prompt_embeds` and `negative_prompt_embeds` are passed, so prepare runs no text encoder)."""
    # Why CPU time and not wall time: on a loaded machine a stage that lasts about a
    # millisecond (prepare) can be descheduled for a whole time slice and look ten times
    # slower. This thread's CPU time does not count that wait, one torch thread keeps
    # worker threads from spinning, and the minimum over 5 calls drops the remaining
    # noise. Unloaded, the margins are about 7x (loop/decode) and 6x (decode/prepare),
    # so the order is not an accident of noise, and the assertion fails if it is reversed.
    assert (N, B) == (3, 2) and GUIDANCE > 1  # real_trace's defaults: the run the page names
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pipe = tiny_sd_pipeline()
        best = {}
        real_trace(pipe)  # warm-up: the first call allocates and picks kernels
        for _ in range(5):  # keep the fastest time per stage
            timings = {}
            real_trace(pipe, timings=timings)
            for stage, seconds in timings.items():
                best[stage] = min(best.get(stage, seconds), seconds)
    finally:
        torch.set_num_threads(threads)
    assert best["loop"] > best["decode"] > best["prepare"] > 0, best


def test_passed_prompt_embeds_are_cast_and_repeated_not_encoded(tmp_path, record_calls):
    """In `StableDiffusionPipeline`, with `prompt_embeds` and `negative_prompt_embeds` passed, `encode_prompt` does not run the text encoder: it only casts them to `text_encoder.dtype`, or to `unet.dtype` in a pipeline without a text encoder, and repeats them `num_images_per_prompt` times (inference_trace.md); with `prompt_embeds` alone and CFG on, the text encoder still runs once, on the empty negative prompt."""
    from tiny import tiny_text_encoder, tiny_tokenizer

    encoder = tiny_text_encoder().to(torch.bfloat16)
    pipe = tiny_sd_pipeline(text_encoder=encoder, tokenizer=tiny_tokenizer(tmp_path))
    calls = record_calls(pipe.text_encoder).calls
    prompt_embeds, negative = embeds(1, 2), embeds(2, 2)  # float32, batch 2
    out, out_negative = pipe.encode_prompt(None, "cpu", 3, True, prompt_embeds=prompt_embeds,
                                           negative_prompt_embeds=negative)  # fmt: skip
    assert calls == []
    assert out.dtype == out_negative.dtype == torch.bfloat16 and out.shape == (6, 77, EMBED_DIM)
    expected = prompt_embeds.to(torch.bfloat16).repeat_interleave(3, dim=0)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    pipe.encode_prompt(None, "cpu", 1, True, prompt_embeds=prompt_embeds)  # no negative passed
    assert len(calls) == 1  # the text encoder runs, on ""
    no_encoder = tiny_sd_pipeline()  # text_encoder=None, as in the trace above
    no_encoder.unet.to(torch.bfloat16)
    out, out_negative = no_encoder.encode_prompt(None, "cpu", 1, True, prompt_embeds=prompt_embeds,
                                                 negative_prompt_embeds=negative)  # fmt: skip
    assert out.dtype == out_negative.dtype == torch.bfloat16  # unet.dtype


def test_sd15_prompt_embeds_are_b_77_768(tmp_path):
    """In `StableDiffusionPipeline`, with SD 1.5's text encoder, `encode_prompt` turns the prompts and the empty negative prompts into `prompt_embeds` and `negative_prompt_embeds` of `(B, 77, 768)` each, the width SD 1.5's UNet takes as `cross_attention_dim`.

    The pipeline's own ``encode_prompt``, guided, two prompts, with SD 1.5's CLIP ViT-L text
    encoder built on the meta device from its published config (``model_configs.py``).
    """
    from model_configs import CLIP_L_TEXT, SD15_UNET
    from tiny import tiny_tokenizer
    from transformers import CLIPTextConfig, CLIPTextModel

    with torch.device("meta"):
        encoder = CLIPTextModel(CLIPTextConfig(**CLIP_L_TEXT))
    pipe = tiny_sd_pipeline(text_encoder=encoder, tokenizer=tiny_tokenizer(tmp_path))
    prompt_embeds, negative = pipe.encode_prompt(["a", "b"], torch.device("meta"), 1, True)
    assert prompt_embeds.shape == negative.shape == (2, 77, 768)
    assert SD15_UNET["cross_attention_dim"] == 768


def test_latent_channels_and_factor_per_family():
    """Latents are `H/8 x W/8` with 4 channels for SD 1.x and SDXL; SD3 and FLUX.1 keep the factor 8 with 16 channels (inference_trace.md).

    Each family's ``AutoencoderKL``, built on the meta device from its published config
    (``model_configs.py``), encodes a 512 x 512 image.
    """
    from diffusers import AutoencoderKL
    from model_configs import FLUX_VAE, SD3_VAE, SD15_VAE, SDXL_VAE

    for config, channels in [(SD15_VAE, 4), (SDXL_VAE, 4), (SD3_VAE, 16), (FLUX_VAE, 16)]:
        with torch.device("meta"):
            vae = AutoencoderKL(**config)
            latent = vae.encode(torch.empty(1, 3, 512, 512)).latent_dist.mean
        assert latent.shape == (1, channels, 64, 64), config


@pytest.fixture(scope="module")
def sd15_flops():
    """FLOPs of SD 1.5's parts at 512 x 512 on the meta device (``sizes.sd15_flops``)."""
    from sizes import sd15_flops

    return sd15_flops()


def test_sd15_decode_against_the_loop_in_flops(sd15_flops, record_calls):
    """SD 1.5 (`StableDiffusionPipeline`) shows the same: at 512 × 512 its decode takes the FLOPs of about three UNet passes, 44% of the UNet and VAE FLOPs of a 4-step unguided DDIM call; at 20 guided steps the loop is 93% of SD 1.5's UNet and VAE FLOPs, with DDIM or with SD 1.5's shipped `PNDMScheduler`.

    The UNet rows are counted on the tiny pipeline's own ``__call__``: 4 unguided DDIM steps
    make 4 one-row calls, while the shipped PNDM makes 5 there (decode 39%, so the 44% needs
    DDIM); 20 guided steps make 20 two-row calls with DDIM and 21 with PNDM. The shares are
    of the UNet and VAE alone: with the text encoder (once per prompt, twice with CFG on)
    and the shipped safety checker (once per image) DDIM's are 43% and 92%.
    """
    from diffusers import PNDMScheduler
    from tiny import SD15_PNDM

    unet, decode = sd15_flops["unet"], sd15_flops["decode"]
    text, safety = sd15_flops["text"], sd15_flops["safety"]
    assert 2.9 < decode / unet < 3.3

    def rows(scheduler, steps, guidance_scale):  # UNet rows of one call, B = 1
        pipe = tiny_sd_pipeline(scheduler=scheduler)
        calls = record_calls(pipe.unet).calls
        pipe(prompt_embeds=embeds(1), negative_prompt_embeds=embeds(2), num_inference_steps=steps,
             guidance_scale=guidance_scale, height=SIZE, width=SIZE, latents=start_latents(1),
             output_type="latent")  # fmt: skip
        return sum(args[0].shape[0] for args, _ in calls)

    def pndm():
        return PNDMScheduler(**SD15_PNDM)

    short = {"DDIM": rows(None, 4, 1.0), "PNDM": rows(pndm(), 4, 1.0)}
    assert short == {"DDIM": 4, "PNDM": 5}
    assert round(100 * decode / (short["DDIM"] * unet + decode)) == 44
    assert round(100 * decode / (short["PNDM"] * unet + decode)) == 39  # not 44: DDIM only
    long = {"DDIM": rows(None, 20, GUIDANCE), "PNDM": rows(pndm(), 20, GUIDANCE)}
    assert long == {"DDIM": 2 * 20, "PNDM": 2 * 21}
    for loop_rows in long.values():
        assert round(100 * loop_rows * unet / (loop_rows * unet + decode)) == 93
    ddim_short, ddim_long = short["DDIM"] * unet, long["DDIM"] * unet
    assert round(100 * decode / (ddim_short + decode + text + safety)) == 43
    assert round(100 * ddim_long / (ddim_long + decode + 2 * text + safety)) == 92


def test_scheduler_step_and_the_vae_see_b_scale_model_input_sees_2b(monkeypatch):
    """In `StableDiffusionPipeline`, `scheduler.step` and the VAE only ever see `B`; with CFG, `scheduler.scale_model_input` gets the `2B` rows of `cat([latents] * 2)` (inference_trace.md).

    Spies on the three methods of the tiny pipeline's own ``__call__``, guided, ``B = 2``,
    with ``EulerDiscreteScheduler``, whose ``scale_model_input`` is not the identity.
    """
    from diffusers import EulerDiscreteScheduler
    from tiny import SD_SCHEDULER

    pipe = tiny_sd_pipeline(scheduler=EulerDiscreteScheduler.from_config(SD_SCHEDULER))
    rows = {"scale_model_input": [], "step": [], "decode": []}
    for owner, attr in [(pipe.scheduler, "scale_model_input"), (pipe.scheduler, "step"),
                        (pipe.vae, "decode")]:  # fmt: skip
        original = getattr(owner, attr)

        @functools.wraps(original)  # the pipeline reads step's signature
        def spy(sample_or_pred, *args, _attr=attr, _original=original, **kwargs):
            rows[_attr].append(sample_or_pred.shape[0])
            return _original(sample_or_pred, *args, **kwargs)

        monkeypatch.setattr(owner, attr, spy)
    real_trace(pipe)  # guided, B = 2, N = 3 steps
    assert rows == {"scale_model_input": [2 * B] * N, "step": [B] * N, "decode": [B]}


def test_latency_is_len_timesteps_unet_calls(record_calls):
    """In `StableDiffusionPipeline`, below 1000 steps, latency is `len(timesteps)` UNet calls ($n$ with DDIM) on `2B` rows with CFG: with SD 1.5's shipped `PNDMScheduler` the timesteps are `(n + 1,)` from $n = 2$ to 999, $n$ distinct values with one repeated, and the UNet runs `n + 1` times, once per entry of `scheduler.timesteps`, not once per distinct timestep (inference_trace.md); at $n = 1$ PNDM has one timestep and makes one call; at $n = 1000$ its `step` raises `IndexError` after the first UNet call.

    The tiny pipeline's own guided ``__call__`` at 1, 2 and ``N`` steps, UNet calls counted by a
    hook, and at 1000 steps with PNDM.
    """
    from diffusers import PNDMScheduler
    from tiny import SD15_PNDM

    for steps in [1, 2, N]:
        pndm = 1 if steps == 1 else steps + 1
        for scheduler, expected in [(None, steps), (PNDMScheduler(**SD15_PNDM), pndm)]:
            pipe = tiny_sd_pipeline(scheduler=scheduler)
            calls = record_calls(pipe.unet).calls
            real_trace(pipe, steps=steps)  # guided, B = 2
            assert len(calls) == len(pipe.scheduler.timesteps) == expected, (steps, scheduler)
            assert len(set(pipe.scheduler.timesteps.tolist())) == steps  # PNDM repeats one
            assert [int(args[1]) for args, _ in calls] == pipe.scheduler.timesteps.tolist()
            assert all(args[0].shape[0] == 2 * B for args, _ in calls)
    pipe = tiny_sd_pipeline(scheduler=PNDMScheduler(**SD15_PNDM))
    calls = record_calls(pipe.unet).calls
    with pytest.raises(IndexError) as raised:
        real_trace(pipe, steps=1000)
    assert len(pipe.scheduler.timesteps) == 1001 and len(calls) == 1
    assert raised.traceback[-1].path.name == "scheduling_pndm.py"
    pndm = PNDMScheduler(**SD15_PNDM)
    for steps in range(2, 1000):  # the timesteps' length between the steps run above
        pndm.set_timesteps(steps)
        assert len(pndm.timesteps) == steps + 1 and pndm.timesteps.max() < 1000, steps
    import re

    from infralens_docs.registry import ROOT

    page = (ROOT / "docs" / "labs" / "lab-12-end-to-end-inference-trace.md").read_text(
        encoding="utf-8"
    )
    counts = [  # every count of the loop's calls: mental model, interview hook, out loud
        part
        for part in re.split(r"(?<=[.!?])\s+", page)
        if "UNet once per entry of" in part or "len(timesteps)" in part
    ]
    assert len(counts) == 3, counts
    assert all("below 1000 steps" in part.lower() for part in counts), counts


def test_more_calls_than_steps_come_from_order_2_not_solver_order_2(record_calls):
    """In `StableDiffusionPipeline`, with a scheduler whose `order` is 2 (Heun) there are more calls than steps from 2 steps on, while a `solver_order=2` solver such as DPM-Solver++ 2M makes one per step (inference_trace.md).

    The tiny pipeline's own ``__call__``, guided, ``B = 1``, at 1, 2 and ``N`` steps, UNet calls
    counted by a hook. The order-2 set is every class in ``StableDiffusionPipeline``'s
    ``scheduler.compatibles`` with ``order == 2`` (Heun, the two KDPM2 schedulers and
    ``DPMSolverSDEScheduler`` here), read from the installed library: ``2n - 1`` calls, one at
    1 step. ``DPMSolverMultistepScheduler`` with its default ``solver_order=2`` (a second-order
    solver, ``order == 1``): ``n``.
    """
    from diffusers import DPMSolverMultistepScheduler, HeunDiscreteScheduler
    from tiny import SD_SCHEDULER

    base = tiny_sd_pipeline()  # one UNet and VAE; each scheduler swapped in with sd_with
    compatibles = sorted(base.scheduler.compatibles, key=lambda cls: cls.__name__)
    order_2 = [cls for cls in compatibles if getattr(cls, "order", None) == 2]
    assert HeunDiscreteScheduler in order_2 and len(order_2) >= 4, order_2
    dpm = DPMSolverMultistepScheduler.from_config(SD_SCHEDULER)
    assert dpm.order == 1 and dpm.config.solver_order == 2
    calls = record_calls(base.unet).calls
    # built once (KDPM2's __init__ computes 1000 timesteps); set_timesteps resets their state
    schedulers = [cls.from_config(SD_SCHEDULER) for cls in order_2]
    pipes = [sd_with(base, scheduler=scheduler) for scheduler in [*schedulers, dpm]]
    for steps in [1, 2, N]:
        expected = [2 * steps - 1] * len(schedulers) + [steps]
        for pipe, expected_calls in zip(pipes, expected, strict=True):
            scheduler = pipe.scheduler
            calls.clear()
            with torch.no_grad():
                pipe(
                    prompt_embeds=embeds(1), negative_prompt_embeds=embeds(2),
                    num_inference_steps=steps, guidance_scale=GUIDANCE, height=SIZE, width=SIZE,
                    latents=start_latents(1), output_type="latent",
                )  # fmt: skip
            assert len(calls) == expected_calls, (type(scheduler).__name__, steps)
            more = not isinstance(scheduler, DPMSolverMultistepScheduler) and steps >= 2
            assert (len(calls) > steps) == more, (type(scheduler).__name__, steps)


def test_one_thread_cpu_time_counts_all_the_work():
    """On a CPU, measure several calls per stage in CPU time with one torch thread (`torch.set_num_threads(1)`), as the timing test above does: with more threads, this thread's CPU clock misses the other threads' share of the work, and the process's clock adds it up.

    One convolution, the decoder's main operation, timed five times with ``time.thread_time``
    and ``time.process_time`` at one and at two torch threads.
    """
    conv = torch.nn.Conv2d(64, 64, 3, padding=1)
    x = torch.randn(2, 64, 96, 96)
    threads, seconds = torch.get_num_threads(), {}
    try:
        for n in [1, 2]:
            torch.set_num_threads(n)
            with torch.no_grad():
                conv(x)  # warm-up
                thread, process = time.thread_time(), time.process_time()
                for _ in range(5):
                    conv(x)
                seconds[n] = (time.thread_time() - thread, time.process_time() - process)
    finally:
        torch.set_num_threads(threads)
    assert seconds[1][0] > 0.9 * seconds[1][1]  # one thread: its clock is the process's
    assert seconds[2][0] < 0.75 * seconds[2][1], seconds  # two: it misses the other's work


def test_the_starters_guidance_rule_is_sd15s(record_calls):
    """The starter's rule, `guidance_scale > 1` doubles the batch, is `StableDiffusionPipeline`'s for an SD 1.5-style UNet: `2B` rows at 7.5, `B` at 1.0; with a UNet whose config sets `time_cond_proj_dim` (an LCM UNet) it runs `B` rows at 7.5 too.

    The tiny pipeline's own ``__call__`` through ``real_trace``, UNet rows counted by a hook.
    """
    from tiny import tiny_unet

    base = tiny_sd_pipeline()
    lcm = sd_with(base, unet=tiny_unet(time_cond_proj_dim=8))
    for pipe, scale, rows in [(base, GUIDANCE, 2 * B), (base, 1.0, B), (lcm, GUIDANCE, B)]:
        calls = record_calls(pipe.unet).calls
        real_trace(pipe, guidance_scale=scale)
        assert [args[0].shape[0] for args, _ in calls] == [rows] * N, (scale, pipe.unet.config)


def test_ddim_at_1000_steps_makes_one_call(record_calls):
    """In `StableDiffusionPipeline`, at 1000 steps SD 1.5's DDIM settings (`steps_offset=1`) put t = 1000 on the grid: the call makes one UNet call and raises `IndexError` in `scheduler.step`, so `len(timesteps)` calls hold below 1000 steps (inference_trace.md).

    The tiny pipeline's own guided ``__call__`` with its DDIM (SD 1.5's values).
    """
    pipe = tiny_sd_pipeline()
    calls = record_calls(pipe.unet).calls
    with pytest.raises(IndexError) as raised:
        real_trace(pipe, steps=1000)
    assert len(pipe.scheduler.timesteps) == 1000 and int(pipe.scheduler.timesteps[0]) == 1000
    assert len(calls) == 1 and raised.traceback[-1].path.name == "scheduling_ddim.py"


# ---------------------------------------------------------------- the Flux trace

FLUX_STARTER = "code/lab-12-end-to-end-inference-trace/flux_trace.py"


def real_flux_trace(monkeypatch, true_cfg_scale=1.0, batch=B, steps=N):
    """Run the tiny real ``FluxPipeline.__call__`` with wrappers and transformer hooks; return
    (trace rows, guidance shapes seen by each transformer call)."""
    import diffusers.pipelines.flux.pipeline_flux as pipeline_flux
    from tiny import DIT_TEXT, DIT_TOKENS, FLUX_VAE_FACTORS, tiny_flux_pipeline

    pipe = tiny_flux_pipeline(vae_config=FLUX_VAE_FACTORS)  # FLUX.1's scaling and shift
    rows, step, calls, guidance = [], [1], [0], []

    def add(stage, boundary, name, array, at_step=None):
        array = array if isinstance(array, torch.Tensor) else torch.as_tensor(np.asarray(array))
        rows.append(dict(stage=stage, step=at_step, boundary=boundary, name=name,
                         shape=tuple(array.shape), dtype=str(array.dtype).removeprefix("torch.")))  # fmt: skip

    def wrap(owner, attr, after):
        original = getattr(owner, attr)

        @functools.wraps(original)  # retrieve_timesteps reads set_timesteps' signature
        def wrapper(*args, **kwargs):
            out = original(*args, **kwargs)
            after(args, kwargs, out)
            return out

        monkeypatch.setattr(owner, attr, wrapper)

    encodes = []

    def on_encode(args, kwargs, out):  # (prompt_embeds, pooled_prompt_embeds, text_ids)
        neg = " (negative)" if encodes else ""
        pre = "negative_" if encodes else ""
        encodes.append(1)
        add("prepare", "encode_prompt" + (neg or " (T5 stand-in)"), pre + "prompt_embeds", out[0])
        add("prepare", "encode_prompt" + (neg or " (CLIP pooled stand-in)"),
            pre + "pooled_prompt_embeds", out[1])  # fmt: skip
        add("prepare", "encode_prompt" + neg, pre + "text_ids", out[2])

    def on_pack(args, kwargs, out):
        add("prepare", "prepare_latents: randn", "latents", args[0])
        add("prepare", "_pack_latents", "latents", out)

    def on_prepare_latents(args, kwargs, out):  # (latents, latent_image_ids)
        add("prepare", "_prepare_latent_image_ids", "latent_image_ids", out[1])

    mus = []

    def on_shift(args, kwargs, out):
        mus.append(out)
        add("prepare", "calculate_shift(image_seq_len)", "mu", np.asarray(out))

    def on_set_timesteps(args, kwargs, out):
        add("prepare", "set_timesteps(sigmas=..., mu=mu)", "timesteps", pipe.scheduler.timesteps)
        add("prepare", "set_timesteps(sigmas=..., mu=mu)", "sigmas", pipe.scheduler.sigmas)

    outputs = []

    def on_step(args, kwargs, out):  # step(noise_pred, t, latents, return_dict=False)
        if true_cfg_scale > 1:
            add("loop", "true CFG combine", "noise_pred", args[0], step[0])
            cond, uncond = outputs[-2:]  # this step's calls: the prompt's, then the negative's
            combined = uncond + true_cfg_scale * (cond - uncond)
            torch.testing.assert_close(args[0], combined)
        add("loop", "scheduler.step(...).prev_sample", "latents", out[0], step[0])
        step[0] += 1

    unpacked, timesteps_in = [], []

    def on_unpack(args, kwargs, out):
        unpacked.append(out)
        add("decode", "_unpack_latents", "latents", out)

    def on_decode(args, kwargs, out):
        config = pipe.vae.config  # the decoder gets the unpacked latents, unscaled and shifted
        torch.testing.assert_close(
            args[0], unpacked[-1] / config.scaling_factor + config.shift_factor
        )
        add("decode", "latents / scaling_factor + shift_factor", "latents", args[0])
        add("decode", "vae.decode", "image", out[0])

    def pre(module, args, kwargs):
        if calls[0] == 0:  # the guidance the pipeline built before its loop
            add("prepare", "torch.full(guidance_scale).expand", "guidance", kwargs["guidance"])
        neg = calls[0] % (2 if true_cfg_scale > 1 else 1) == 1
        calls[0] += 1
        timesteps_in.append(kwargs["timestep"])
        guidance.append(tuple(kwargs["guidance"].shape))
        add("loop", "transformer(negative)" if neg else "transformer(hidden_states=latents)",
            "latents", kwargs["hidden_states"], step[0])  # fmt: skip
        add("loop", "timestep / 1000" + (" (negative)" if neg else ""), "timestep",
            kwargs["timestep"], step[0])  # fmt: skip
        module._neg = neg

    def post(module, args, kwargs, output):
        outputs.append(output[0])
        neg = module._neg
        add("loop", "transformer(negative ...)" if neg else "transformer(...)",
            "neg_noise_pred" if neg else "noise_pred", output[0], step[0])  # fmt: skip

    wrap(pipe, "encode_prompt", on_encode)
    wrap(pipe, "_pack_latents", on_pack)
    wrap(pipe, "prepare_latents", on_prepare_latents)
    wrap(pipeline_flux, "calculate_shift", on_shift)
    wrap(pipe.scheduler, "set_timesteps", on_set_timesteps)
    wrap(pipe.scheduler, "step", on_step)
    wrap(pipe, "_unpack_latents", on_unpack)
    wrap(pipe.vae, "decode", on_decode)
    handles = [pipe.transformer.register_forward_pre_hook(pre, with_kwargs=True),
               pipe.transformer.register_forward_hook(post, with_kwargs=True)]  # fmt: skip
    g = torch.Generator().manual_seed(0)
    embeds = dict(prompt_embeds=torch.randn(batch, DIT_TOKENS, DIT_TEXT, generator=g),
                  pooled_prompt_embeds=torch.randn(batch, DIT_TEXT, generator=g))  # fmt: skip
    if true_cfg_scale > 1:
        embeds.update(negative_prompt_embeds=torch.randn(batch, DIT_TOKENS, DIT_TEXT, generator=g),
                      negative_pooled_prompt_embeds=torch.randn(batch, DIT_TEXT, generator=g))  # fmt: skip
    try:
        with torch.no_grad():
            images = pipe(**embeds, true_cfg_scale=true_cfg_scale, num_inference_steps=steps,
                          height=SIZE, width=SIZE, output_type="np",
                          generator=torch.Generator().manual_seed(1)).images  # fmt: skip
    finally:
        for handle in handles:
            handle.remove()
    add("decode", 'postprocess(output_type="np")', "image", images)
    # the values behind three rows' names: timestep / 1000 on every call, and the sigmas,
    # shifted by mu = calculate_shift(N), equal to labkit's, which the starter steps with
    from labkit.schedulers import FlowMatchEulerDiscreteScheduler as ToyScheduler

    per_call = 2 if true_cfg_scale > 1 else 1
    for i, t in enumerate(timesteps_in):
        expected = pipe.scheduler.timesteps[i // per_call].expand(batch) / 1000
        torch.testing.assert_close(t, expected.to(t.dtype))
    toy = ToyScheduler()
    toy.set_timesteps(steps, sigmas=np.linspace(1.0, 1 / steps, steps), mu=mus[0])
    np.testing.assert_allclose(pipe.scheduler.sigmas.numpy(), toy.sigmas, atol=1e-6)
    sizes = dict(B=batch, n=steps, C=pipe.transformer.config.in_channels // 4,
                 h=SIZE // pipe.vae_scale_factor, w=SIZE // pipe.vae_scale_factor,
                 f=pipe.vae_scale_factor, L=DIT_TOKENS, D=DIT_TEXT, P=DIT_TEXT)  # fmt: skip
    return rows, guidance, sizes


@pytest.mark.parametrize("true_cfg", [1.0, 2.0], ids=["guidance-embedding", "true-cfg"])
def test_real_flux_trace_has_the_toys_structure(monkeypatch, true_cfg):
    """The real `FluxPipeline.__call__` crosses the same boundaries in the same order as `flux_trace.py`, every shape equals the toy's layout expanded with the tiny pipeline's sizes (`prompt_embeds (B, L, D)`, `pooled_prompt_embeds (B, P)`, `text_ids (L, 3)`, latents packed to `(B, N, 4C)`, `latent_image_ids (N, 3)`, a scalar `mu`, `timesteps (n,)`, `sigmas (n+1,)`, `guidance (B,)`, `noise_pred (B, N, 4C)`, unpacked `(B, C, h, w)` before `vae.decode`), and each step calls the transformer once on B rows, twice (B rows each) with `true_cfg_scale > 1` and a negative prompt, the prompt's call first, combined as `neg_noise_pred + true_cfg_scale * (noise_pred - neg_noise_pred)` before `scheduler.step`; the values behind the rows' names hold too: every call's `timestep` is `timesteps[i] / 1000`, the sigmas (shifted by the pipeline's `mu = calculate_shift(N)`) equal labkit's to 1e-6, and `vae.decode` gets the unpacked latents `/ scaling_factor + shift_factor`; the starter's `calculate_shift` is the pipeline's (at its token count, 256 and 4,096)."""
    toy = run_starter(FLUX_STARTER, "--num-samples", str(B), "--steps", str(N),
                      "--true-cfg-scale", str(true_cfg))  # fmt: skip
    import diffusers.pipelines.flux.pipeline_flux as pipeline_flux

    for tokens in (toy["image_seq_len"], 256, 4096):  # the starter's mu is the pipeline's
        assert toy["calculate_shift"](tokens) == pytest.approx(
            pipeline_flux.calculate_shift(tokens)
        )
    rows, guidance, sizes = real_flux_trace(monkeypatch, true_cfg)
    toy_rows = [r for r in toy["trace"] if r["stage"] != "load"]
    key = lambda r: (r["stage"], r["step"], r["boundary"], r["name"])  # noqa: E731
    assert [key(r) for r in rows] == [key(r) for r in toy_rows]
    for real, mine in zip(rows, toy_rows, strict=True):
        assert real["shape"] == toy["expand"](mine["layout"], sizes), (real, mine["layout"])
        assert kind(real["dtype"]) == kind(mine["dtype"]), (real, mine)
    calls = 2 if true_cfg > 1 else 1
    assert guidance == [(B,)] * N * calls  # the guidance input: (B,) on every call
    loop_in = [
        r for r in rows if r["boundary"].startswith("transformer(") and r["name"] == "latents"
    ]
    assert [r["shape"][0] for r in loop_in] == [B] * N * calls  # B rows a call, never 2B
