"""The video-diffusion section against diffusers 0.42.1's Wan classes, on the CPU.

Shapes at the real sizes come from ``WanPipeline.prepare_latents`` on the meta device and
the classes' defaults; behaviour from ``WanPipeline`` around a tiny random-config
``AutoencoderKLWan`` and ``WanTransformer3DModel`` (``tiny.tiny_wan_pipeline``, stand-in
``prompt_embeds``, no UMT5). Lab 21's module (``test_page_lab_21.py``) holds the VAE's
frame-by-frame encode and decode. No weights, no hub.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
from tiny import WAN_TEXT, WAN_TEXT_TOKENS, logged_messages, tiny_wan_pipeline

pytestmark = pytest.mark.usefixtures("quiet_diffusers")


def real_latents(frames, height, width):
    """WanPipeline.prepare_latents with AutoencoderKLWan's default scale factors, on meta."""
    from diffusers import AutoencoderKLWan, WanPipeline

    vae = inspect.signature(AutoencoderKLWan.__init__).parameters
    scales = SimpleNamespace(vae_scale_factor_temporal=vae["scale_factor_temporal"].default,
                             vae_scale_factor_spatial=vae["scale_factor_spatial"].default)  # fmt: skip
    return WanPipeline.prepare_latents(scales, 1, 16, height, width, frames, torch.bfloat16, torch.device("meta"))  # fmt: skip


@pytest.mark.parametrize(
    "size, latent_shape, tokens",
    [((480, 832), (1, 16, 21, 60, 104), 32_760), ((720, 1280), (1, 16, 21, 90, 160), 75_600)],
)
def test_latent_shapes_and_tokens_of_81_frames(size, latent_shape, tokens):
    """`WanPipeline.prepare_latents` makes (B, 16, (F - 1) // 4 + 1, H/8, W/8) latents: 81 frames are 21 latent frames; with `patch_size` (1, 2, 2) that is 32,760 tokens at 480 x 832 (the pipeline's default size) and 75,600 at 720 x 1280."""
    from diffusers import WanTransformer3DModel

    latents = real_latents(81, *size)
    assert tuple(latents.shape) == latent_shape
    patch = inspect.signature(WanTransformer3DModel.__init__).parameters["patch_size"].default
    t, h, w = (n // p for n, p in zip(latents.shape[2:], patch, strict=True))
    assert t * h * w == tokens


def test_ltx_video_vae_compresses_differently():
    """Not every video VAE is 4x in time and 8x in space: `AutoencoderKLLTXVideo`'s defaults (LTX-Video) compress 8x in time and 32x in space, into 128 latent channels."""
    from diffusers import AutoencoderKLLTXVideo

    with torch.device("meta"):
        vae = AutoencoderKLLTXVideo()
    assert (vae.temporal_compression_ratio, vae.spatial_compression_ratio, vae.config.latent_channels) == (8, 32, 128)  # fmt: skip


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


@pytest.mark.parametrize("asked, latent_frames", [(80, 21), (82, 21), (83, 21), (84, 22), (81, 21)])
def test_num_frames_is_rounded_to_4k_plus_1(pipe, asked, latent_frames):
    """`WanPipeline.__call__` replaces a `num_frames` that is not 4k+1 by `num_frames // 4 * 4 + 1` with a logged warning (80, 82 and 83 become 81, 84 becomes 85: down, not to the nearest) and leaves 4k+1 alone."""
    with logged_messages() as messages, torch.no_grad():
        latents = pipe(**embeds(), num_frames=asked, height=16, width=16, num_inference_steps=1, output_type="latent").frames  # fmt: skip
    assert latents.shape[2] == latent_frames
    warned = any("`num_frames - 1` has to be divisible by 4" in m for m in messages)
    assert warned == (asked % 4 != 1)


def test_text_enters_by_cross_attention(pipe):
    """In `WanTransformer3DModel` the video tokens alone form the self-attention sequence (`attn1`); the text (`WanPipeline`'s `text_encoder` is a `UMT5EncoderModel`) reaches them through cross-attention (`attn2`), as keys and values."""
    from diffusers import WanPipeline
    from transformers import UMT5EncoderModel

    assert (
        inspect.signature(WanPipeline.__init__).parameters["text_encoder"].annotation
        is UMT5EncoderModel
    )
    block = pipe.transformer.blocks[0]
    seen = {}

    # WanTransformerBlock calls attn1(norm_hidden_states, None, None, rotary_emb) and
    # attn2(norm_hidden_states, encoder_hidden_states, None, None): positional arguments
    def self_attn(module, args):
        seen.update(self_=args[0].shape, self_ctx=args[1])

    def cross_attn(module, args):
        seen.update(cross=args[0].shape, cross_ctx=args[1].shape)

    hooks = [block.attn1.register_forward_pre_hook(self_attn), block.attn2.register_forward_pre_hook(cross_attn)]  # fmt: skip
    try:
        with torch.no_grad():
            pipe(**embeds(), num_frames=5, height=16, width=16, num_inference_steps=1, guidance_scale=1.0, output_type="latent")  # fmt: skip
    finally:
        for h in hooks:
            h.remove()
    assert seen["self_"][1] == 2 and seen["self_ctx"] is None  # 2 latent frames x 1 x 1 patches
    assert seen["cross"][1] == 2 and seen["cross_ctx"][1] == WAN_TEXT_TOKENS


def test_cfg_two_calls_per_step(pipe, record_calls):
    """With `guidance_scale` above 1 (the default is 5.0), `WanPipeline` calls the transformer twice a step, on the prompt's and the negative prompt's embeddings, and combines them as `noise_uncond + guidance_scale * (noise_pred - noise_uncond)`."""
    from diffusers import WanPipeline

    assert inspect.signature(WanPipeline.__call__).parameters["guidance_scale"].default == 5.0
    rec = record_calls(pipe.transformer)
    e = embeds()
    with torch.no_grad():
        pipe(**e, num_frames=5, height=16, width=16, num_inference_steps=3, output_type="latent")
    ctx = [k["encoder_hidden_states"] for _, k in rec.calls]
    assert len(ctx) == 6
    assert all(torch.equal(c, e["prompt_embeds"]) for c in ctx[0::2])
    assert all(torch.equal(c, e["negative_prompt_embeds"]) for c in ctx[1::2])
    assert "noise_uncond + current_guidance_scale * (noise_pred - noise_uncond)" in inspect.getsource(WanPipeline.__call__)  # fmt: skip


def test_wan22_boundary_switches_transformers(record_calls):
    """With `boundary_ratio` set, `WanPipeline` runs `transformer` on steps whose timestep is at or above `boundary_ratio * num_train_timesteps` and `transformer_2` on the later steps, with `guidance_scale_2` defaulting to `guidance_scale`."""
    from diffusers import WanPipeline
    from tiny import tiny_wan_transformer

    base = tiny_wan_pipeline()
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=base.vae, scheduler=base.scheduler,
                       transformer=base.transformer, transformer_2=tiny_wan_transformer(seed=1), boundary_ratio=0.5)  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    first, second = record_calls(pipe.transformer), record_calls(pipe.transformer_2)
    with torch.no_grad():
        pipe(**embeds(), num_frames=5, height=16, width=16, num_inference_steps=4, output_type="latent")  # fmt: skip
    ts = pipe.scheduler.timesteps
    high = int((ts >= 0.5 * pipe.scheduler.config.num_train_timesteps).sum())
    assert 0 < high < 4
    assert len(first.calls) == 2 * high and len(second.calls) == 2 * (4 - high)
    assert [float(k["timestep"][0]) for _, k in first.calls[::2]] == [float(t) for t in ts[:high]]
    assert pipe._guidance_scale_2 == pipe.guidance_scale == 5.0
