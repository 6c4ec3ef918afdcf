"""The memory and speed optimizations page against the installed diffusers.

Tiny random-config parts from ``tiny.py``; the offload methods need an accelerator,
so on a CPU-only machine their error is checked and their mechanism is read from
their source (which accelerate function each calls, and in what order).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from tiny import tiny_sd_pipeline, tiny_unet, tiny_vae


def test_sdpa_is_the_default_attention():
    """Without any switch, every attention layer of `UNet2DConditionModel` uses `AttnProcessor2_0`, the processor that calls `F.scaled_dot_product_attention` on torch 2."""
    from diffusers.models.attention_processor import AttnProcessor2_0

    unet = tiny_unet()
    assert {type(p) for p in unet.attn_processors.values()} == {AttnProcessor2_0}
    assert "scaled_dot_product_attention" in inspect.getsource(AttnProcessor2_0)


def test_auto_slice_is_half_the_heads():
    """`enable_attention_slicing("auto")` gives every attention layer a `SlicedAttnProcessor` with `slice_size` equal to half its number of heads (`sliceable_head_dim // 2`), and `"max"` gives `slice_size = 1`."""
    from diffusers.models.attention_processor import SlicedAttnProcessor

    pipe = tiny_sd_pipeline()
    pipe.enable_attention_slicing("auto")
    procs = list(pipe.unet.attn_processors.values())
    assert all(isinstance(p, SlicedAttnProcessor) for p in procs)
    layers = [m for m in pipe.unet.modules() if hasattr(m, "sliceable_head_dim")]
    assert {p.slice_size for p in procs} == {m.sliceable_head_dim // 2 for m in layers} == {2}
    pipe.enable_attention_slicing("max")
    assert {p.slice_size for p in pipe.unet.attn_processors.values()} == {1}


def test_vae_slicing_splits_the_batch(record_calls):
    """`vae.enable_slicing()` makes `AutoencoderKL.decode` decode a batch one image at a time, with the same result up to float rounding (at most 1e-5 on the tiny VAE)."""
    vae = tiny_vae()
    z = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        whole = vae.decode(z).sample
        vae.enable_slicing()
        rec = record_calls(vae.decoder)
        sliced = vae.decode(z).sample
    assert [c[0][0].shape[0] for c in rec.calls] == [1, 1]
    assert (sliced - whole).abs().max().item() <= 1e-5


def test_tiling_only_above_the_tile_size(record_calls):
    """`vae.enable_tiling()` sends latents larger than `tile_latent_min_size` to `tiled_decode` (`tile_overlap_factor` 0.25) and decodes smaller ones whole; the tiled result differs from the whole decode."""
    vae = tiny_vae()
    assert vae.tile_overlap_factor == 0.25
    vae.enable_tiling()
    calls = []
    original = vae.tiled_decode
    vae.tiled_decode = lambda z, **kw: calls.append(z.shape) or original(z, **kw)
    small = torch.randn(1, 4, vae.tile_latent_min_size, vae.tile_latent_min_size)
    big = torch.randn(1, 4, 24, 24, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        vae.decode(small)
        assert calls == []
        tiled = vae.decode(big).sample
        vae.disable_tiling()
        whole = vae.decode(big).sample
    assert calls == [big.shape]
    assert (tiled - whole).abs().max().item() > 0.1


def test_decoder_resnets_use_group_norm():
    """Every resnet of the `AutoencoderKL` decoder normalises with `GroupNorm`, whose statistics are taken over the whole (tile of the) feature map it is given."""
    vae = tiny_vae()
    resnets = [m for m in vae.decoder.modules() if type(m).__name__ == "ResnetBlock2D"]
    assert resnets and all(isinstance(r.norm1, torch.nn.GroupNorm) for r in resnets)


def test_vae_methods_not_pipeline_methods():
    """`StableDiffusionPipeline` in this version has no `enable_vae_slicing` or `enable_vae_tiling`; the switches are `AutoencoderKL.enable_slicing` and `AutoencoderKL.enable_tiling`."""
    from diffusers import AutoencoderKL, StableDiffusionPipeline

    for name in ("enable_vae_slicing", "enable_vae_tiling"):
        assert not hasattr(StableDiffusionPipeline, name)
    assert callable(AutoencoderKL.enable_slicing) and callable(AutoencoderKL.enable_tiling)


def test_model_offload_chains_one_hook_per_component():
    """`enable_model_cpu_offload` moves the pipeline to the CPU and chains one accelerate `cpu_offload_with_hook` per component in the order of `model_cpu_offload_seq`, which is `"text_encoder->image_encoder->unet->vae"` for `StableDiffusionPipeline`."""
    from diffusers import DiffusionPipeline, StableDiffusionPipeline

    source = inspect.getsource(DiffusionPipeline.enable_model_cpu_offload)
    assert "cpu_offload_with_hook(model, device, prev_module_hook=hook)" in source
    assert 'self.model_cpu_offload_seq.split("->")' in source
    assert 'self.to("cpu"' in source
    assert StableDiffusionPipeline.model_cpu_offload_seq == "text_encoder->image_encoder->unet->vae"


def test_sequential_offload_uses_accelerate_cpu_offload():
    """`enable_sequential_cpu_offload` calls accelerate's `cpu_offload`, which keeps the weights on the CPU and loads each submodule's weights only for its own forward."""
    from diffusers import DiffusionPipeline

    source = inspect.getsource(DiffusionPipeline.enable_sequential_cpu_offload)
    assert "from accelerate import cpu_offload" in source
    assert "cpu_offload(model, device, offload_buffers=offload_buffers)" in source


def test_offload_needs_an_accelerator():
    """On a machine with no accelerator, both `enable_model_cpu_offload` and `enable_sequential_cpu_offload` raise `RuntimeError` ("requires accelerator")."""
    if torch.cuda.is_available():
        pytest.skip("an accelerator is present")
    pipe = tiny_sd_pipeline()
    for method in (pipe.enable_model_cpu_offload, pipe.enable_sequential_cpu_offload):
        with pytest.raises(RuntimeError, match="requires accelerator"):
            method()
