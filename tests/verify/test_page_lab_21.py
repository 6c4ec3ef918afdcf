"""Lab 21 (video diffusion) against diffusers' Wan classes, on the CPU.

The models are tiny random-config ``AutoencoderKLWan`` (``tiny.tiny_wan_vae``: diffusers'
own test config, ``base_dim=3``, with the real 16 latent channels, 4x temporal and 8x
spatial compression) and ``WanTransformer3DModel`` (``tiny.tiny_wan_transformer``: the real
``patch_size=(1, 2, 2)``, 2 blocks of 2 heads), and ``WanPipeline`` around them
(``tiny.tiny_wan_pipeline``: no tokenizer or UMT5 text encoder, stand-in
``prompt_embeds``). The real models' shapes come from the classes' defaults, and the real
default VAE's decode peak from ``sizes.wan_vae_decode_record`` (meta device). No weights,
no hub.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from tiny import WAN_TEXT, WAN_TEXT_TOKENS, logged_messages, tiny_wan_pipeline, tiny_wan_vae

pytestmark = pytest.mark.usefixtures("quiet_diffusers")


@pytest.fixture(scope="module")
def vae():
    return tiny_wan_vae()


def clip(frames, size=16, seed=0):
    """A random video (1, 3, frames, size, size) in [-1, 1]."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, 3, frames, size, size, generator=g) * 2 - 1


def encode(vae, video):
    with torch.no_grad():
        return vae.encode(video).latent_dist.mode()


@pytest.fixture(scope="module")
def starter():
    """The starter's globals after a default run."""
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    old, sys.argv = sys.argv, ["video_latents.py"]
    try:
        return runpy.run_path(str(ROOT / "code/lab-21-video-diffusion/video_latents.py"), run_name="__main__")  # fmt: skip
    finally:
        sys.argv = old


def test_wan_defaults_the_starter_uses(starter):
    """`AutoencoderKLWan`'s defaults are Wan 2.1's VAE: `z_dim=16`, `scale_factor_temporal=4`, `scale_factor_spatial=8`, `base_dim=96`; `WanTransformer3DModel`'s are Wan 2.1 14B: `patch_size=(1, 2, 2)`, 40 blocks, 40 heads of 128, `ffn_dim=13824`: the starter's constants."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    with torch.device("meta"):
        v, t = AutoencoderKLWan().config, WanTransformer3DModel().config
    assert (v.z_dim, v.scale_factor_temporal, v.scale_factor_spatial, v.base_dim) == (starter["Z_DIM"], starter["T_DOWN"], starter["S_DOWN"], 96)  # fmt: skip
    assert tuple(t.patch_size) == starter["PATCH"]
    assert dict(layers=t.num_layers, heads=t.num_attention_heads, head_dim=t.attention_head_dim, ffn_dim=t.ffn_dim) == starter["WAN"]  # fmt: skip
    assert (v.z_dim, v.scale_factor_temporal, v.scale_factor_spatial, t.num_layers) == (
        16,
        4,
        8,
        40,
    )


@pytest.mark.parametrize("k", [0, 1, 2])
def test_encode_4k_plus_1_frames(vae, k):
    """`AutoencoderKLWan.encode` turns a (1, 3, 4k+1, H, W) video into (1, 16, k+1, H/8, W/8) latents, and `decode` gives back 4k+1 frames."""
    z = encode(vae, clip(4 * k + 1))
    assert tuple(z.shape) == (1, 16, k + 1, 2, 2)
    with torch.no_grad():
        assert tuple(vae.decode(z).sample.shape) == (1, 3, 4 * k + 1, 16, 16)


def test_encoder_sees_frame_0_alone_then_groups_of_4(vae, record_calls):
    """`AutoencoderKLWan._encode` calls the encoder once per latent frame: on frame 0 alone, then on frames 1-4, 5-8, ..."""
    rec = record_calls(vae.encoder)
    encode(vae, clip(9))
    assert [a[0].shape[2] for a, _ in rec.calls] == [1, 4, 4]


def test_encoding_is_causal(vae):
    """Changing frames 1-4 of a 9-frame clip leaves latent frame 0 unchanged (it is frame 0's alone) and changes latent frame 1; changing frames 5-8 leaves latent frames 0 and 1 unchanged and changes latent frame 2; changing frame 0 changes every latent frame."""
    video = clip(9)
    z = encode(vae, video)
    mid, late, early = video.clone(), video.clone(), video.clone()
    mid[:, :, 1:5] = clip(4, seed=1)[:, :, :4]
    late[:, :, 5:] = clip(4, seed=1)[:, :, :4]
    early[:, :, 0] = -early[:, :, 0]
    z_mid, z_late, z_early = encode(vae, mid), encode(vae, late), encode(vae, early)
    assert torch.equal(z_mid[:, :, 0], z[:, :, 0]) and not torch.allclose(z_mid[:, :, 1], z[:, :, 1])  # fmt: skip
    assert torch.equal(z_late[:, :, :2], z[:, :, :2]) and not torch.allclose(z_late[:, :, 2], z[:, :, 2])  # fmt: skip
    assert all(not torch.allclose(z_early[:, :, i], z[:, :, i]) for i in range(3))


def test_frame_count_not_4k_plus_1_drops_the_tail(vae):
    """Given 8 frames, `AutoencoderKLWan.encode` raises nothing and warns nothing: it makes 1 + (8 - 1) // 4 = 2 latent frames, equal to the first 5 frames' latents, so frames 5-7 are silently dropped, and decoding gives 5 frames."""
    import warnings

    video = clip(8)
    with logged_messages() as messages, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        z = encode(vae, video)
    assert messages == [] and caught == []  # neither diffusers' logger nor a Python warning
    assert tuple(z.shape) == (1, 16, 2, 2, 2)
    assert torch.equal(z, encode(vae, video[:, :, :5]))
    with torch.no_grad():
        assert vae.decode(z).sample.shape[2] == 5


def test_decoder_runs_one_latent_frame_at_a_time(vae, record_calls):
    """`AutoencoderKLWan._decode` calls the decoder once per latent frame, each call on one latent frame; the first call returns 1 frame, each later call 4."""
    z = encode(vae, clip(9))
    rec = record_calls(vae.decoder)
    outs = []
    hook = vae.decoder.register_forward_hook(lambda m, a, out: outs.append(out.shape[2]))
    try:
        with torch.no_grad():
            vae.decode(z)
    finally:
        hook.remove()
    assert [a[0].shape[2] for a, _ in rec.calls] == [1, 1, 1]
    assert outs == [1, 4, 4]


def test_decoder_cache_holds_2_frames_per_causal_conv(vae):
    """Between the decoder's per-latent-frame calls, `AutoencoderKLWan` caches at most `CACHE_T = 2` frames of each causal convolution's input, so the caches do not grow with the clip (the decoded clip, concatenated call by call, does)."""
    from diffusers.models.autoencoders import autoencoder_kl_wan

    assert autoencoder_kl_wan.CACHE_T == 2
    z = encode(vae, clip(13))
    cached = []
    hook = vae.decoder.register_forward_hook(lambda m, a, out: cached.append(max(c.shape[2] for c in vae._feat_map if isinstance(c, torch.Tensor))))  # fmt: skip
    try:
        with torch.no_grad():
            vae.decode(z)
    finally:
        hook.remove()
    assert len(cached) == 4 and max(cached) == 2


@pytest.fixture(scope="module")
def pipe():
    return tiny_wan_pipeline()


def run(pipe, **kwargs):
    """One 2-step WanPipeline call (16 x 16 px unless given) on stand-in embeddings: returns
    (frames or latents, the transformer's hidden_states shape per call, the first block's
    hidden_states shape per call, diffusers' logged warnings)."""
    g = torch.Generator().manual_seed(0)
    embeds = dict(prompt_embeds=torch.randn(1, WAN_TEXT_TOKENS, WAN_TEXT, generator=g),
                  negative_prompt_embeds=torch.randn(1, WAN_TEXT_TOKENS, WAN_TEXT, generator=g))  # fmt: skip
    calls, blocks = [], []
    h1 = pipe.transformer.register_forward_pre_hook(lambda m, a, k: calls.append(tuple(k["hidden_states"].shape)), with_kwargs=True)  # fmt: skip
    h2 = pipe.transformer.blocks[0].register_forward_pre_hook(lambda m, a: blocks.append(tuple(a[0].shape)))  # fmt: skip
    if kwargs:  # run(pipe) alone passes nothing: the pipeline's own defaults
        kwargs = {"height": 16, "width": 16, "num_inference_steps": 2, **kwargs}
    try:
        with logged_messages() as messages, torch.no_grad():
            out = pipe(**embeds, generator=torch.Generator().manual_seed(1), **kwargs).frames
    finally:
        h1.remove()
        h2.remove()
    return out, calls, blocks, messages


def test_transformer_tokens_are_latent_frames_times_patches(pipe):
    """In `WanPipeline`, the transformer's patch embedding turns (1, 16, T, H/8, W/8) latents into one sequence of T x H/16 x W/16 tokens: 9 frames at 32 x 48 px are latents (1, 16, 3, 4, 6) and 3 x 2 x 3 = 18 tokens in the first block."""
    _, calls, blocks, _ = run(pipe, num_frames=9, height=32, width=48, output_type="latent")
    assert calls[0] == (1, 16, 3, 4, 6)
    assert blocks[0][:2] == (1, 18)


def test_pipeline_rounds_num_frames_with_a_warning(pipe):
    """`WanPipeline.__call__` with `num_frames=80` logs "`num_frames - 1` has to be divisible by 4. Rounding to the nearest number." and makes 81 frames (`num_frames // 4 * 4 + 1`): 21 latent frames."""
    frames, calls, _, messages = run(pipe, num_frames=80, num_inference_steps=1)
    assert "`num_frames - 1` has to be divisible by 4. Rounding to the nearest number." in messages
    assert calls[0][2] == 21 and frames.shape[:2] == (1, 81)


def test_guidance_runs_the_transformer_twice_a_step(pipe, monkeypatch):
    """`WanPipeline.__call__` defaults to `guidance_scale=5.0`, `num_inference_steps=50`, `num_frames=81`, 480 x 832; with guidance_scale > 1 each step calls the transformer twice (cond, then uncond, each on batch 1), with `guidance_scale=1.0` once."""

    class StopCallError(Exception):
        pass

    seen = {}

    def prepare_latents(batch, channels, height, width, num_frames, *args, **kwargs):
        seen.update(guidance_scale=pipe.guidance_scale, steps=len(pipe.scheduler.timesteps),
                    num_frames=num_frames, height=height, width=width)  # fmt: skip
        raise StopCallError  # before any transformer call: the defaults are what __call__ passed

    with monkeypatch.context() as m:
        m.setattr(pipe, "prepare_latents", prepare_latents)
        with pytest.raises(StopCallError):
            run(pipe)  # no guidance_scale, steps, num_frames, height or width given
    assert seen == dict(guidance_scale=5.0, steps=50, num_frames=81, height=480, width=832)
    _, calls, _, _ = run(pipe, num_frames=5, output_type="latent")
    assert len(calls) == 4 and all(c[0] == 1 for c in calls)
    _, calls, _, _ = run(pipe, num_frames=5, output_type="latent", guidance_scale=1.0)
    assert len(calls) == 2


def test_enable_tiling_is_spatial(record_calls):
    """`AutoencoderKLWan.enable_tiling` tiles height and width (`tile_sample_min_height` 256, stride 192 by default) and has no time option; time stays split one latent frame per decoder call: with 8 px tiles, a (1, 16, 3, 2, 2) latent decodes in 3 x 4 calls, each on one latent frame of 1 x 1."""
    from diffusers import AutoencoderKLWan

    assert list(inspect.signature(AutoencoderKLWan.enable_tiling).parameters) == [
        "self", "tile_sample_min_height", "tile_sample_min_width", "tile_sample_stride_height", "tile_sample_stride_width"
    ]  # fmt: skip
    vae = tiny_wan_vae()
    # its only switches are slicing (the batch) and tiling: no use_framewise_* or other use_* flag
    assert {name for name in vars(vae) if name.startswith("use_")} == {"use_slicing", "use_tiling"}
    assert (vae.tile_sample_min_height, vae.tile_sample_min_width) == (256, 256)
    assert (vae.tile_sample_stride_height, vae.tile_sample_stride_width) == (192, 192)
    z = encode(vae, clip(9))
    vae.enable_tiling(tile_sample_min_height=8, tile_sample_min_width=8, tile_sample_stride_height=8, tile_sample_stride_width=8)  # fmt: skip
    rec = record_calls(vae.decoder)
    with torch.no_grad():
        assert vae.decode(z).sample.shape == (1, 3, 9, 16, 16)
    assert len(rec.calls) == 12 and {tuple(a[0].shape[2:]) for a, _ in rec.calls} == {(1, 1, 1)}


def test_real_decoder_caches_7_full_resolution_maps():
    """The default (Wan 2.1) `AutoencoderKLWan` decoder, built on the meta device and run through `_decode`'s per-latent-frame loop on two latent frames of 720p, caches 7 tensors of 96 channels at full resolution (720 x 1280), 1 frame each after the first call (which returns 1 frame) and 2 after the second (which returns 4), and `WanPipeline`'s example loads the VAE in float32."""
    from diffusers import AutoencoderKLWan
    from diffusers.pipelines.wan import pipeline_wan

    assert 'AutoencoderKLWan.from_pretrained(model_id, subfolder="vae", torch_dtype=torch.float32)' in pipeline_wan.EXAMPLE_DOC_STRING  # fmt: skip
    with torch.device("meta"):
        vae = AutoencoderKLWan().to(torch.bfloat16)
        z = torch.randn(1, 16, 2, 90, 160, dtype=torch.bfloat16)
    seen, frames_out = [], []  # per decoder call (_decode clears its cache at the end)
    hook = vae.decoder.register_forward_hook(lambda m, a, out: seen.append([tuple(c.shape) for c in vae._feat_map if isinstance(c, torch.Tensor)]) or frames_out.append(out.shape[2]))  # fmt: skip
    try:
        with torch.no_grad():
            vae._decode(z)
    finally:
        hook.remove()
    assert frames_out == [1, 4]
    for call, cached in zip(seen, (1, 2), strict=True):
        full = [s for s in call if s[-2:] == (720, 1280)]
        assert full == [(1, 96, cached, 720, 1280)] * 7


def test_starter_flops_estimate_is_within_5_percent_of_torch(starter):
    """The starter's `call_flops` estimate of one Wan 2.1 14B call at 81 frames of 720p (75,600 tokens) is within 5% of what torch's `FlopCounterMode` counts for `WanTransformer3DModel()` with its default config on the meta device."""
    from diffusers import WanTransformer3DModel
    from torch.utils.flop_counter import FlopCounterMode

    estimate = sum(starter["call_flops"](starter["tokens"](81, 720, 1280)))
    with torch.device("meta"):
        model = WanTransformer3DModel()
        x = torch.randn(1, 16, 21, 90, 160)
        text = torch.randn(1, 512, model.config.text_dim)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x, timestep=torch.tensor([500], device="meta"), encoder_hidden_states=text)
    assert abs(estimate / counter.get_total_flops() - 1) < 0.05


def test_real_decode_peak_is_about_3x_the_cache_bound_and_tiling_cuts_it(starter):
    """The real Wan 2.1 VAE (`AutoencoderKLWan()`) decoding 9 frames of 720p on the meta device peaks at about 9.4 GB of live tensors in bf16 (2.8 GB of them float32 copies), about 3 times the 3.19 GB of full-resolution caches and outputs, and at about 18.0 GB in float32; `vae.enable_tiling()` with its defaults brings the bf16 peak below 1 GB: the figures the starter prints."""
    from sizes import wan_vae_decode_record

    from labkit import model_sizes

    fresh = wan_vae_decode_record()
    assert fresh == model_sizes.load()["wan_vae_decode_720p"] == starter["DECODE"], "run `make verify-refresh`"  # fmt: skip
    assert (fresh["latents"][2], fresh["frames"]) == (3, 9)  # the run the figures are of
    peak = fresh["peak_bytes"]
    assert 9.0e9 < peak["bf16"] < 9.8e9 and 2.5e9 < fresh["bf16_peak_float32_bytes"] < 3.1e9
    assert 2.8 < peak["bf16"] / (starter["feature_map_gb"](starter["per_call"]) * 1e9) < 3.2
    assert 17.0e9 < peak["fp32"] < 19.0e9
    assert peak["bf16_tiled"] < 1e9


def test_umt5_xxl_text_encoder_weights(starter):
    """Wan 2.1's text encoder, a `UMT5EncoderModel` with the umt5-xxl config (Wan2.1's `wan/modules/t5.py` `umt5_xxl`: 24 layers, width 4,096, 64 heads of 64, FFN 10,240, a 256,384-token vocabulary, a position bias per layer), built on the meta device, has 5.68 B parameters: 11.4 GB in bf16, more than the VAE decode's 9.4 GB peak: the starter's `UMT5_XXL_PARAMS`."""
    from diffusers import WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    from labkit import model_sizes

    assert inspect.signature(WanPipeline.__init__).parameters["text_encoder"].annotation is UMT5EncoderModel  # fmt: skip
    config = UMT5Config(vocab_size=256_384, d_model=4096, d_kv=64, d_ff=10_240, num_layers=24, num_heads=64,
                        relative_attention_num_buckets=32, feed_forward_proj="gated-gelu", tie_word_embeddings=False)  # fmt: skip
    with torch.device("meta"):
        model = UMT5EncoderModel(config)
    params = sum(p.numel() for p in model.parameters())
    assert params == starter["UMT5_XXL_PARAMS"]
    assert (round(params / 1e9, 2), round(2 * params / 1e9, 1)) == (5.68, 11.4)
    assert 2 * params > model_sizes.load()["wan_vae_decode_720p"]["peak_bytes"]["bf16"]


def test_float32_at_the_bf16_decode_peak_is_wan_rms_norms_upcast(monkeypatch):
    """At the bf16 decode peak of the real Wan 2.1 VAE (9 frames of 720p, meta device), the 2.8 GB of float32 live tensors are `WanRMS_norm`'s: it normalises a bf16 input in float32 (`x.float()`, then `F.normalize`). With the upsampler's float32 copy (`WanUpsample`) removed, the peak's float32 is unchanged; with `WanRMS_norm`'s removed, the upsampler's sets a peak almost as high, with about as much float32; with both removed, no float32 is live at the peak."""
    from diffusers import AutoencoderKLWan
    from diffusers.models.autoencoders import autoencoder_kl_wan as wan
    from sizes import WAN_DECODE_720P, _live_tensor_peak
    from torch.nn import functional

    from labkit import model_sizes

    record = model_sizes.load()["wan_vae_decode_720p"]
    assert round(record["bf16_peak_float32_bytes"] / 1e9, 1) == 2.8

    def rms_norm_in_bf16(self, x):  # WanRMS_norm.forward without x.float()
        return functional.normalize(x, dim=(1 if self.channel_first else -1)) * self.scale * self.gamma + self.bias  # fmt: skip

    def upsample_in_bf16(self, x):  # WanUpsample.forward without x.float()
        return torch.nn.Upsample.forward(self, x)

    def peak(patches):
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device("meta"):
                vae = AutoencoderKLWan()
                z = torch.randn(WAN_DECODE_720P["latents"])
        finally:
            torch.set_default_dtype(old)
        with monkeypatch.context() as m:
            for cls, forward in patches:
                m.setattr(cls, "forward", forward)
            return _live_tensor_peak(lambda: vae.decode(z), [*vae.parameters(), *vae.buffers(), z])  # fmt: skip

    assert peak([(wan.WanUpsample, upsample_in_bf16)])[1] == record["bf16_peak_float32_bytes"]
    no_rms_upcast = peak([(wan.WanRMS_norm, rms_norm_in_bf16)])
    assert (round(no_rms_upcast[0] / 1e9, 2), round(no_rms_upcast[1] / 1e9, 2)) == (9.36, 2.83)
    assert peak([(wan.WanUpsample, upsample_in_bf16), (wan.WanRMS_norm, rms_norm_in_bf16)])[1] == 0  # fmt: skip
