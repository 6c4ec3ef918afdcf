"""The video-diffusion section against diffusers 0.42.1's Wan classes, on the CPU.

Shapes at the real sizes come from ``WanPipeline.prepare_latents`` on the meta device and
the classes' defaults; behaviour from ``WanPipeline`` around a tiny random-config
``AutoencoderKLWan`` and ``WanTransformer3DModel`` (``tiny.tiny_wan_pipeline``, stand-in
``prompt_embeds``, no UMT5). Lab 21's module (``test_page_lab_21.py``) holds the VAE's
frame-by-frame encode and decode. No weights, no hub.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from tiny import WAN_TEXT, WAN_TEXT_TOKENS, logged_messages, tiny_wan_pipeline

pytestmark = pytest.mark.usefixtures("quiet_diffusers")


@pytest.fixture(scope="module")
def wan21():
    """The real `WanPipeline` around Wan 2.1's default `AutoencoderKLWan()` and
    `WanTransformer3DModel()` (14B), built on the meta device: no weights, no text encoder."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )

    with torch.device("meta"):
        vae, transformer = AutoencoderKLWan(), WanTransformer3DModel()
    return WanPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(), transformer=transformer)  # fmt: skip


def tokens(pipe, latents):
    """Tokens of `latents` under the pipeline transformer's `patch_size`."""
    patch = pipe.transformer.config.patch_size
    t, h, w = (n // p for n, p in zip(latents.shape[2:], patch, strict=True))
    return t * h * w


def meta_latents(pipe, frames, height, width):
    """`pipe.prepare_latents` with the channels `__call__` passes it (`transformer.config.in_channels`), on meta."""
    channels = pipe.transformer.config.in_channels
    return pipe.prepare_latents(1, channels, height, width, frames, torch.bfloat16, torch.device("meta"))  # fmt: skip


@pytest.mark.parametrize(
    "size, latent_shape, n_tokens",
    [((480, 832), (1, 16, 21, 60, 104), 32_760), ((720, 1280), (1, 16, 21, 90, 160), 75_600)],
)
def test_latent_shapes_and_tokens_of_81_frames(wan21, size, latent_shape, n_tokens):
    """With Wan 2.1's VAE and transformer, `WanPipeline.prepare_latents` makes (B, 16, (F - 1) // 4 + 1, H/8, W/8) latents: 81 frames are 21 latent frames; with `patch_size` (1, 2, 2) that is 32,760 tokens at 480 x 832 (the pipeline's default size) and 75,600 at 720 x 1280."""
    latents = meta_latents(wan21, 81, *size)
    assert tuple(latents.shape) == latent_shape
    assert tokens(wan21, latents) == n_tokens


def tiny_ti2v_pipeline():
    """The real `WanPipeline` (`expand_timesteps=True`, as for Wan 2.2 TI2V-5B) around a tiny
    random `AutoencoderKLWan` configured like TI2V-5B's VAE (diffusers'
    scripts/convert_wan_to_diffusers.py `vae22_diffusers_config`: `z_dim=48`, `patch_size=2`,
    `scale_factor_spatial=16`, `is_residual=True`, 12 in/out channels; widths shrunk to 8) and
    a tiny `WanTransformer3DModel` with 48 in/out channels."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, decoder_base_dim=8, z_dim=48, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
                           patch_size=2, scale_factor_temporal=4, scale_factor_spatial=16,
                           latents_mean=[0.0] * 48, latents_std=[1.0] * 48).eval()  # fmt: skip
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=48,
                                        out_channels=48, text_dim=WAN_TEXT, freq_dim=256, ffn_dim=32, num_layers=2,
                                        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32).eval()  # fmt: skip
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
                       transformer=transformer, expand_timesteps=True)  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_wan22_ti2v_latents_are_48_channels_and_16x_in_space(record_calls):
    """`WanPipeline` takes the latents' channels from `transformer.config.in_channels` and the compression from `vae.config`, so (B, 16, ..., H/8, W/8) is Wan 2.1's shape: with a VAE configured like Wan 2.2 TI2V-5B's (`z_dim=48`, `patch_size=2`, `scale_factor_spatial=16`) and a 48-channel transformer, 9 frames at 64 x 96 px are latents (1, 48, 3, 4, 6), and TI2V-5B's 121 frames at 704 x 1280 are (1, 48, 31, 44, 80): 27,280 tokens."""
    from diffusers import WanPipeline
    from tiny import tiny_wan_vae

    pipe = tiny_ti2v_pipeline()
    rec = record_calls(pipe.transformer)
    video = torch.rand(1, 3, 9, 64, 96, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        assert tuple(pipe.vae.encode(video).latent_dist.mode().shape) == (1, 48, 3, 4, 6)
        latents = pipe(**embeds(), num_frames=9, height=64, width=96, num_inference_steps=1, output_type="latent").frames  # fmt: skip
    assert tuple(latents.shape) == (1, 48, 3, 4, 6)
    assert {tuple(k["hidden_states"].shape) for _, k in rec.calls} == {(1, 48, 3, 4, 6)}
    big = meta_latents(pipe, 121, 704, 1280)
    assert tuple(big.shape) == (1, 48, 31, 44, 80) and tokens(pipe, big) == 27_280
    # the channels are the transformer's: its 48 with Wan 2.1's 16-channel tiny VAE (latents only, no decode)
    mixed = WanPipeline(tokenizer=None, text_encoder=None, vae=tiny_wan_vae(), scheduler=pipe.scheduler, transformer=pipe.transformer)  # fmt: skip
    mixed.set_progress_bar_config(disable=True)
    with torch.no_grad():
        latents = mixed(**embeds(), num_frames=5, height=16, width=16, num_inference_steps=1, output_type="latent").frames  # fmt: skip
    assert mixed.vae.config.z_dim == 16 and tuple(latents.shape) == (1, 48, 2, 2, 2)


def test_ltx_video_vae_compresses_differently():
    """Not every video VAE is 4x in time and 8x in space: `AutoencoderKLLTXVideo`'s defaults (LTX-Video) compress 8x in time and 32x in space, into 128 latent channels. Run: `encode` of the default VAE on the meta device: 8k+1 frames at 64 x 64 px give k+1 latent frames of 2 x 2."""
    from diffusers import AutoencoderKLLTXVideo

    with torch.device("meta"), torch.no_grad():
        vae = AutoencoderKLLTXVideo()
        shapes = {f: tuple(vae.encode(torch.randn(1, 3, f, 64, 64)).latent_dist.mode().shape) for f in (1, 9, 17)}  # fmt: skip
    assert shapes == {1: (1, 128, 1, 2, 2), 9: (1, 128, 2, 2, 2), 17: (1, 128, 3, 2, 2)}


def test_81_frames_at_16_fps_is_the_documented_clip():
    """`WanPipeline`'s own example makes `num_frames=81` and writes them with `export_to_video(..., fps=16)`: 5 s of video."""
    from diffusers.pipelines.wan import pipeline_wan

    example = pipeline_wan.EXAMPLE_DOC_STRING
    assert "num_frames=81" in example and "fps=16" in example


@pytest.fixture(scope="module")
def pipe():
    return tiny_wan_pipeline()


def embeds():
    g = torch.Generator().manual_seed(0)
    return dict(prompt_embeds=torch.randn(1, WAN_TEXT_TOKENS, WAN_TEXT, generator=g),
                negative_prompt_embeds=torch.randn(1, WAN_TEXT_TOKENS, WAN_TEXT, generator=g))  # fmt: skip


def test_num_frames_is_rounded_to_the_nearest_4k_plus_1_ties_down(pipe):
    """`WanPipeline.__call__` replaces a `num_frames` that is not 4k+1 by `num_frames // 4 * 4 + 1` with a logged warning ("Rounding to the nearest number"): that is the nearest 4k+1, a tie (4k+3) going down, so 80, 82 and 83 become 81 and 84 becomes 85; a 4k+1 is left alone."""
    for asked in range(72, 90):
        below = (asked - 1) // 4 * 4 + 1
        nearest = below if asked - below <= below + 4 - asked else below + 4  # ties down
        with logged_messages() as messages, torch.no_grad():
            latents = pipe(**embeds(), num_frames=asked, height=16, width=16, num_inference_steps=1, output_type="latent").frames  # fmt: skip
        assert latents.shape[2] == (nearest - 1) // 4 + 1, asked
        warned = any("`num_frames - 1` has to be divisible by 4" in m for m in messages)
        assert warned == (asked % 4 != 1)
        assert (asked % 4 == 3) == (asked - nearest == 2)  # the ties, and only they, go down by 2


def test_height_and_width_must_be_multiples_of_16_then_are_floored_to_the_patch(pipe):
    """`WanPipeline.__call__` raises a `ValueError` unless `height` and `width` are multiples of 16, then floors them to multiples of `vae_scale_factor_spatial` x the transformer's patch with a logged warning: a no-op for Wan 2.1 (8 x 2 = 16), but 32 px for a TI2V-5B-like VAE (16x) and 2 x 2 patch, so 80 becomes 64 (and 720 would become 704)."""
    with pytest.raises(ValueError, match="divisible by 16"), torch.no_grad():
        pipe(**embeds(), num_frames=5, height=40, width=40, num_inference_steps=1, output_type="latent")  # fmt: skip
    ti2v = tiny_ti2v_pipeline()
    with logged_messages() as messages, torch.no_grad():
        latents = ti2v(**embeds(), num_frames=5, height=80, width=80, num_inference_steps=1, output_type="latent").frames  # fmt: skip
    assert tuple(latents.shape[3:]) == (64 // 16, 64 // 16)
    assert any("Adjusting (80, 80) -> (64, 64)" in m for m in messages)
    with logged_messages() as messages, torch.no_grad():
        latents = ti2v(**embeds(), num_frames=5, height=720, width=64, num_inference_steps=1, output_type="latent").frames  # fmt: skip
    assert latents.shape[3] == 704 // 16
    assert any("Adjusting (720, 64) -> (704, 64)" in m for m in messages)


def test_text_enters_by_cross_attention(pipe):
    """In every block of `WanTransformer3DModel` the video tokens alone form the self-attention sequence (`attn1`); the text (`WanPipeline`'s `text_encoder` is a `UMT5EncoderModel`) reaches them through cross-attention (`attn2`), as keys and values."""
    from diffusers import WanPipeline
    from transformers import UMT5EncoderModel

    assert (
        inspect.signature(WanPipeline.__init__).parameters["text_encoder"].annotation
        is UMT5EncoderModel
    )
    seen = {}

    # WanTransformerBlock calls attn1(norm_hidden_states, None, None, rotary_emb) and
    # attn2(norm_hidden_states, encoder_hidden_states, None, None): positional arguments
    def record(i, kind):
        def hook(module, args):  # returns None: the call's arguments are left as they are
            seen.setdefault((i, kind), (args[0].shape[1], None if args[1] is None else args[1].shape[1]))  # fmt: skip

        return hook

    blocks = pipe.transformer.blocks
    hooks = [h for i, b in enumerate(blocks) for h in (b.attn1.register_forward_pre_hook(record(i, "self")), b.attn2.register_forward_pre_hook(record(i, "cross")))]  # fmt: skip
    try:
        with torch.no_grad():
            pipe(**embeds(), num_frames=5, height=16, width=16, num_inference_steps=1, guidance_scale=1.0, output_type="latent")  # fmt: skip
    finally:
        for h in hooks:
            h.remove()
    # every block: 2 latent frames x 1 x 1 patches attend to themselves, then to the text
    assert len(blocks) > 1 and seen == {k: v for i in range(len(blocks)) for k, v in (((i, "self"), (2, None)), ((i, "cross"), (2, WAN_TEXT_TOKENS)))}  # fmt: skip


def guided_steps(pipe, calls_of, **kwargs):
    """Run a 4-step `pipe(...)`; return, per step, the transformer's (cond, uncond) outputs,
    the `model_output` passed to `scheduler.step`, and which transformer ran."""
    outs = []
    hooks = [m.register_forward_hook(lambda m, a, out: outs.append((m, out[0].clone())))
             for m in {pipe.transformer, pipe.transformer_2} - {None}]  # fmt: skip
    steps = calls_of(pipe.scheduler, "step")
    e = embeds()
    try:
        with torch.no_grad():
            pipe(**e, num_frames=5, height=16, width=16, num_inference_steps=4, output_type="latent", **kwargs)  # fmt: skip
    finally:
        for h in hooks:
            h.remove()
    assert len(outs) == 2 * len(steps) == 8
    return [(outs[2 * i][1], outs[2 * i + 1][1], args[0], outs[2 * i][0]) for i, (args, _) in enumerate(steps)]  # fmt: skip


def test_cfg_two_calls_per_step(pipe, record_calls, calls_of):
    """With `guidance_scale` above 1 (the default is 5.0), `WanPipeline` calls the transformer twice a step, on the prompt's and the negative prompt's embeddings, and combines them as `noise_uncond + guidance_scale * (noise_pred - noise_uncond)`."""
    rec = record_calls(pipe.transformer)
    e = embeds()
    steps = guided_steps(pipe, calls_of)  # guidance_scale not given: the default
    ctx = [k["encoder_hidden_states"] for _, k in rec.calls]
    assert all(torch.equal(c, e["prompt_embeds"]) for c in ctx[0::2])
    assert all(torch.equal(c, e["negative_prompt_embeds"]) for c in ctx[1::2])
    for cond, uncond, model_output, _ in steps:
        assert torch.equal(model_output, uncond + 5.0 * (cond - uncond))


def test_wan22_boundary_switches_transformers(calls_of):
    """With `boundary_ratio` set, `WanPipeline` runs `transformer` on steps whose timestep is at or above `boundary_ratio * num_train_timesteps` and `transformer_2` on the later steps, which use `guidance_scale_2` (by default `guidance_scale`) when `guidance_scale` is above 1; at `guidance_scale=1.0` every step makes one call and `guidance_scale_2` is ignored."""
    from diffusers import WanPipeline
    from tiny import tiny_wan_transformer

    base = tiny_wan_pipeline()
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=base.vae, scheduler=base.scheduler,
                       transformer=base.transformer, transformer_2=tiny_wan_transformer(seed=1), boundary_ratio=0.5)  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    for given, low_scale in [({"guidance_scale_2": 2.0}, 2.0), ({}, 5.0)]:
        steps = guided_steps(pipe, calls_of, **given)
        ts = pipe.scheduler.timesteps
        high = [bool(t >= 0.5 * pipe.scheduler.config.num_train_timesteps) for t in ts]
        assert 0 < sum(high) < 4 and high == sorted(high, reverse=True)
        for is_high, (cond, uncond, model_output, model) in zip(high, steps, strict=True):
            assert model is (pipe.transformer if is_high else pipe.transformer_2)
            scale = 5.0 if is_high else low_scale
            assert torch.equal(model_output, uncond + scale * (cond - uncond))
    # guidance_scale 1.0: no uncond call on either expert, whatever guidance_scale_2
    calls = []
    hooks = [m.register_forward_pre_hook(lambda m, a: calls.append(m)) for m in (pipe.transformer, pipe.transformer_2)]  # fmt: skip
    try:
        with torch.no_grad():
            pipe(**embeds(), num_frames=5, height=16, width=16, num_inference_steps=4, output_type="latent", guidance_scale=1.0, guidance_scale_2=4.0)  # fmt: skip
    finally:
        for h in hooks:
            h.remove()
    assert calls == [pipe.transformer if h else pipe.transformer_2 for h in high]


def test_latents_are_denormalised_per_channel_before_decode(pipe, calls_of):
    """Before `vae.decode`, `WanPipeline.__call__` de-normalises the loop's final latents per channel, `latents / (1 / latents_std) + latents_mean`, with the VAE config's 16 values of each (Wan 2.1's, the class defaults), not one `scaling_factor` as in SD."""
    decoded = calls_of(pipe.vae, "decode")
    final = {}

    def last_latents(p, i, t, tensors):
        final["latents"] = tensors["latents"].clone()
        return {}

    with torch.no_grad():
        pipe(**embeds(), num_frames=5, height=16, width=16, num_inference_steps=2, output_type="np", callback_on_step_end=last_latents)  # fmt: skip
    cfg = pipe.vae.config
    assert len(cfg.latents_mean) == len(cfg.latents_std) == cfg.z_dim == 16
    assert len(set(cfg.latents_std)) > 1 and not hasattr(cfg, "scaling_factor")
    mean, std = (torch.tensor(v).view(1, 16, 1, 1, 1) for v in (cfg.latents_mean, cfg.latents_std))
    ((args, _),) = decoded
    torch.testing.assert_close(args[0], final["latents"] * std + mean)
    assert not torch.allclose(args[0], final["latents"])


def test_wan_example_sets_flow_shift_by_resolution(calls_of):
    """diffusers' Wan example rebuilds the checkpoint's scheduler with `UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=5.0)` for 720p ("5.0 for 720P, 3.0 for 480P"); through `WanPipeline.__call__`, a flow-sigma `UniPCMultistepScheduler` at 5.0 puts every step at an equal or higher noise level than at 3.0."""
    from diffusers import UniPCMultistepScheduler, WanPipeline
    from diffusers.pipelines.wan import pipeline_wan

    example = pipeline_wan.EXAMPLE_DOC_STRING
    assert "flow_shift = 5.0  # 5.0 for 720P, 3.0 for 480P" in example
    assert (
        "UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=flow_shift)"
        in example
    )
    base = tiny_wan_pipeline()
    at_480p = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)  # fmt: skip
    sigmas = {}
    for shift in (3.0, 5.0):
        scheduler = UniPCMultistepScheduler.from_config(at_480p.config, flow_shift=shift)
        pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=base.vae, scheduler=scheduler, transformer=base.transformer)  # fmt: skip
        pipe.set_progress_bar_config(disable=True)
        steps = calls_of(pipe.scheduler, "step")
        with torch.no_grad():
            pipe(**embeds(), num_frames=5, height=16, width=16, num_inference_steps=8, output_type="latent")  # fmt: skip
        assert scheduler.config.use_flow_sigmas and scheduler.config.flow_shift == shift
        assert [
            int(args[1]) for args, _ in steps
        ] == scheduler.timesteps.tolist()  # the 8 steps run
        sigmas[shift] = scheduler.sigmas[:-1].clone()  # as set by the pipeline's set_timesteps
    assert torch.all(sigmas[5.0] >= sigmas[3.0]) and torch.any(sigmas[5.0] > sigmas[3.0])


def test_pab_cache_is_shared_by_cond_and_uncond_calls_and_counts_calls():
    """PAB's cache counts calls, not steps, and `WanPipeline`'s cond and uncond calls share it: inside PAB's timestep range, with skip 2 each uncond call reuses its step's cond attention and no step reuses another's, and with skip 3 cond calls reuse uncond's. Run: `PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=2 or 3)` with a timestep range covering every step, then skip 2 with the default range, where steps outside it compute both calls; 6 steps of the tiny `WanPipeline`, block 1's `attn1` output of each call (cond then uncond, batch 1) compared with every earlier call's; without the cache no two are equal."""
    from diffusers import PyramidAttentionBroadcastConfig

    pipe = tiny_wan_pipeline()
    outs, texts = [], []
    hooks = [pipe.transformer.blocks[1].attn1.register_forward_hook(lambda m, a, o: outs.append(o.clone())),
             pipe.transformer.register_forward_pre_hook(lambda m, a, k: texts.append(k["encoder_hidden_states"]), with_kwargs=True)]  # fmt: skip
    e = embeds()

    def run():
        """For each call, "C<step>"/"U<step>", and after "=" the earliest call whose output it equals."""
        outs.clear()
        texts.clear()
        with torch.no_grad():
            pipe(**e, num_frames=5, height=16, width=16, num_inference_steps=6, output_type="latent")  # fmt: skip
        assert len(outs) == 12
        assert all(torch.equal(t, e["prompt_embeds"]) for t in texts[0::2])
        assert all(torch.equal(t, e["negative_prompt_embeds"]) for t in texts[1::2])
        name = [f"{'CU'[i % 2]}{i // 2}" for i in range(12)]
        first = [
            next((j for j in range(i) if torch.equal(outs[j], o)), None) for i, o in enumerate(outs)
        ]
        return [name[i] + ("" if j is None else f"={name[j]}") for i, j in enumerate(first)]

    try:
        by_skip = {}
        for skip in (2, 3):
            config = PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=skip, spatial_attention_timestep_skip_range=(-1, 1001),
                                                     current_timestep_callback=lambda: pipe.current_timestep)  # fmt: skip
            pipe.transformer.enable_cache(config)
            by_skip[skip] = run()
            pipe.transformer.disable_cache()
        # skip 2 with the default timestep range: reuse inside it only
        config = PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=2, current_timestep_callback=lambda: pipe.current_timestep)  # fmt: skip
        pipe.transformer.enable_cache(config)
        default_range = run()
        pipe.transformer.disable_cache()
        low, high = config.spatial_attention_timestep_skip_range
        inside = [bool(low < t < high) for t in pipe.scheduler.timesteps]
        assert any(inside) and not all(inside)
        assert default_range == [x for s in range(6) for x in (f"C{s}", f"U{s}=C{s}" if inside[s] else f"U{s}")]  # fmt: skip
        # skip 2: every uncond call is its step's cond attention; no step reuses an earlier step's
        assert by_skip[2] == [x for s in range(6) for x in (f"C{s}", f"U{s}=C{s}")]
        # skip 3: calls 0, 3, 6, 9 compute; cond calls C1, C2, C4, C5 reuse a computed call, C2 and C5 an uncond's
        assert by_skip[3] == ["C0", "U0=C0", "C1=C0", "U1", "C2=U1", "U2=U1", "C3", "U3=C3", "C4=C3", "U4", "C5=U4", "U5=U4"]  # fmt: skip
        assert run() == [f"{'CU'[i % 2]}{i // 2}" for i in range(12)]  # no cache: all differ
    finally:
        for h in hooks:
            h.remove()


def test_tiled_decode_peak_grows_with_the_clip():
    """`enable_tiling()` brings the bf16 live-tensor peak of Wan 2.1's VAE decode at 720p to 0.73 GB for 9 frames but 2.09 GB for 81 frames (the decoder's repeated calls replayed, exact against a full run on a smaller tiled latent): `tiled_decode` keeps every decoded tile (they overlap: 1.65x the frame's pixels) until it blends them, then holds the blended rows, their concatenation and the clamped clip (0.45 GB each)."""
    from diffusers import AutoencoderKLWan
    from sizes import WAN_DECODE_720P_81, wan_vae_decode_record

    from labkit import model_sizes

    fresh = wan_vae_decode_record()
    assert fresh == model_sizes.load()["wan_vae_decode_720p"], "run `make verify-refresh`"
    peak = fresh["peak_bytes"]
    with torch.device("meta"):
        vae = AutoencoderKLWan()
    vae.enable_tiling()
    (_, _, frames_lat, h, w), s = WAN_DECODE_720P_81, vae.spatial_compression_ratio
    tile, stride = vae.tile_sample_min_height // s, vae.tile_sample_stride_height // s
    assert (tile, stride) == (vae.tile_sample_min_width // s, vae.tile_sample_stride_width // s)
    tile_pixels = sum(min(tile, h - i) for i in range(0, h, stride)) * sum(min(tile, w - j) for j in range(0, w, stride)) * s * s  # fmt: skip
    frames = (frames_lat - 1) * vae.config.scale_factor_temporal + 1
    clip_bytes, tiles_bytes = 3 * frames * h * w * s * s * 2, 3 * frames * tile_pixels * 2
    assert round(tile_pixels / (h * w * s * s), 2) == 1.65 and round(clip_bytes / 1e9, 2) == 0.45
    assert (round(peak["bf16_tiled"] / 1e9, 2), round(peak["bf16_tiled_81_frames"] / 1e9, 2)) == (0.73, 2.09)  # fmt: skip
    # the held tiles and three copies of the clip account for the peak (within 1%), far above
    # the 9-frame peak plus one copy of the decoded clip
    assert abs(peak["bf16_tiled_81_frames"] / (tiles_bytes + 3 * clip_bytes) - 1) < 0.01
    assert peak["bf16_tiled_81_frames"] > 1.5 * (peak["bf16_tiled"] + clip_bytes)


def test_untiled_decode_peak_grows_by_the_decoded_clip():
    """A decoder call's maps and caches do not grow with the clip, but the decoded clip grows call by call: untiled, the bf16 live-tensor peak of Wan 2.1's VAE decode is 9.4 GB for 9 frames and about 9.8 GB for 81 (the decoder's repeated calls replayed), the growth being the 72 more decoded frames that `_decode` concatenates (`torch.cat`, within 5%)."""
    from diffusers import AutoencoderKLWan
    from sizes import WAN_DECODE_720P, WAN_DECODE_720P_81, wan_vae_decode_record

    from labkit import model_sizes

    fresh = wan_vae_decode_record()
    assert fresh == model_sizes.load()["wan_vae_decode_720p"], "run `make verify-refresh`"
    peak = fresh["peak_bytes"]
    with torch.device("meta"):
        vae = AutoencoderKLWan()
    t, s = vae.config.scale_factor_temporal, vae.spatial_compression_ratio
    frames_9, frames_81 = ((lat[2] - 1) * t + 1 for lat in (WAN_DECODE_720P["latents"], WAN_DECODE_720P_81))  # fmt: skip
    assert (frames_9, frames_81) == (9, 81)
    clip_growth = (
        3 * (frames_81 - frames_9) * WAN_DECODE_720P_81[3] * WAN_DECODE_720P_81[4] * s * s * 2
    )  # bf16
    assert (round(peak["bf16"] / 1e9, 1), round(peak["bf16_81_frames"] / 1e9, 1)) == (9.4, 9.8)
    assert abs((peak["bf16_81_frames"] - peak["bf16"]) / clip_growth - 1) < 0.05
