"""The parallel-inference section against diffusers 0.42.1: the sequence lengths it quotes
and the parallel configurations diffusers offers.

The runs across two processes (Ulysses and ring on a tiny Flux transformer over gloo) are
lab 19's (``test_page_lab_19.py``); this module checks the section's own sentences: Wan
2.1's token count from ``WanPipeline.prepare_latents`` and ``WanTransformer3DModel``'s
defaults, and what ``ParallelConfig`` holds. No weights, no hub.
"""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.usefixtures("quiet_diffusers")


def test_wan_five_seconds_of_720p_is_75600_tokens():
    """`WanPipeline.prepare_latents` turns 81 frames of 720 x 1280 into (1, 16, 21, 90, 160) latents (`(81 - 1) // 4 + 1` latent frames, 8x spatial), and `WanTransformer3DModel`'s default `patch_size` (1, 2, 2) makes 21 x 45 x 80 = 75,600 tokens; its defaults are Wan 2.1 14B's 40 heads of 128 in 40 blocks."""
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    vae = inspect.signature(AutoencoderKLWan.__init__).parameters
    scales = dict(
        vae_scale_factor_temporal=vae["scale_factor_temporal"].default,
        vae_scale_factor_spatial=vae["scale_factor_spatial"].default,
    )
    latents = WanPipeline.prepare_latents(
        SimpleNamespace(**scales), 1, 16, 720, 1280, 81, torch.bfloat16, torch.device("meta")
    )
    assert tuple(latents.shape) == (1, 16, 21, 90, 160)
    defaults = {k: v.default for k, v in inspect.signature(WanTransformer3DModel.__init__).parameters.items()}  # fmt: skip
    assert defaults["patch_size"] == (1, 2, 2)
    assert (defaults["num_attention_heads"], defaults["attention_head_dim"], defaults["num_layers"]) == (40, 128, 40)  # fmt: skip
    t, h, w = (n // p for n, p in zip(latents.shape[2:], defaults["patch_size"], strict=True))
    assert t * h * w == 75_600
    assert inspect.signature(WanPipeline.__call__).parameters["num_frames"].default == 81


def test_parallel_config_is_context_or_tensor_parallel():
    """diffusers 0.42.1's `ParallelConfig` holds a `context_parallel_config` and a `tensor_parallel_config` and nothing else, and its source lists "CFG/Data Parallel" as not yet supported."""
    from diffusers import ParallelConfig
    from diffusers.models import _modeling_parallel

    public = [f.name for f in dataclasses.fields(ParallelConfig) if not f.name.startswith("_")]
    assert public == ["context_parallel_config", "tensor_parallel_config"]
    assert "# - CFG/Data Parallel" in inspect.getsource(_modeling_parallel)


def test_context_parallel_config_degrees():
    """`ContextParallelConfig` takes `ring_degree` and `ulysses_degree` (both default to 1, and one must be above 1), and its mesh is (ring, ulysses)."""
    from diffusers import ContextParallelConfig

    config = ContextParallelConfig(ulysses_degree=4)
    assert (config.ring_degree, config.ulysses_degree) == (1, 4)
    assert config.mesh_shape == (1, 4) and config.mesh_dim_names == ("ring", "ulysses")
    with pytest.raises(ValueError, match="must be greater than 1"):
        ContextParallelConfig(ring_degree=1, ulysses_degree=1)


def test_flux_1024px_is_4096_image_and_512_text_tokens():
    """`FluxPipeline.prepare_latents` packs a 1024 x 1024 image into (1, 4096, 64) latents (8x VAE, 2 x 2 patches of 16 channels), and `FluxPipeline.__call__` pads the T5 prompt to `max_sequence_length=512` by default: 4,608 tokens in each joint attention; the packed `noise_pred` is 4,096 x 64 bf16 values, 0.52 MB."""
    from diffusers import FluxPipeline

    pipe = SimpleNamespace(vae_scale_factor=8, _pack_latents=FluxPipeline._pack_latents,
                           _prepare_latent_image_ids=FluxPipeline._prepare_latent_image_ids)  # fmt: skip
    latents, ids = FluxPipeline.prepare_latents(pipe, 1, 16, 1024, 1024, torch.bfloat16, torch.device("meta"), None)  # fmt: skip
    assert tuple(latents.shape) == (1, 4096, 64) and ids.shape[0] == 4096
    assert inspect.signature(FluxPipeline.__call__).parameters["max_sequence_length"].default == 512  # fmt: skip
    assert latents.numel() * latents.element_size() == 524_288


def test_ulysses_anything_pads_heads_up_to_a_multiple_of_the_degree():
    """With `ulysses_anything=True`, diffusers 0.42.1 pads the heads up to a multiple of the Ulysses degree (`_maybe_pad_qkv_head`), and only while the padding is smaller than a rank's share: FLUX.1-dev's 24 heads run on 5 ranks (1 padded head, 5 a rank) but not on 16 (8 padded, 2 a rank: AssertionError); `ulysses_anything` cannot be combined with `ring_degree > 1`."""
    from unittest import mock

    import diffusers.models.attention_dispatch as dispatch
    from diffusers import ContextParallelConfig

    x = torch.zeros(1, 2, 24, 4)  # (B, S_LOCAL, H, D)
    with mock.patch.object(dispatch.dist, "get_world_size", return_value=5):
        padded, pad = dispatch._maybe_pad_qkv_head(x, 24, group=None)
    assert pad == 1 and padded.shape[2] == 25
    with (
        mock.patch.object(dispatch.dist, "get_world_size", return_value=16),
        pytest.raises(
            AssertionError, match="Padding head num 8 should be less than new local head num 2"
        ),
    ):
        dispatch._maybe_pad_qkv_head(x, 24, group=None)
    with pytest.raises(ValueError, match="ulysses_anything cannot be enabled when ring_degree > 1"):
        ContextParallelConfig(ring_degree=2, ulysses_degree=2, ulysses_anything=True)
