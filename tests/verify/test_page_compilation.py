"""The compilation section against torch 2.13 and diffusers 0.42.1, on the CPU.

The section states the switches and defaults; the counted behaviour (graphs, recompiles,
graph breaks, LoRA hotswap) is run in Lab 18's module, ``test_page_lab_18.py``. These
tests read the real classes and configs, and build tiny random-config models where a
method has to run; nothing compiles.
"""

from __future__ import annotations

import pytest
import torch


def test_repeated_blocks_per_model():
    """`compile_repeated_blocks` reads the model's `_repeated_blocks`: `FluxTransformer2DModel` lists `FluxTransformerBlock` and `FluxSingleTransformerBlock`, `UNet2DConditionModel` lists `BasicTransformerBlock` (its attention blocks, not its ResNet blocks), and `SD3Transformer2DModel` lists none, so there it raises a `ValueError`."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel, UNet2DConditionModel

    assert FluxTransformer2DModel._repeated_blocks == ["FluxTransformerBlock", "FluxSingleTransformerBlock"]  # fmt: skip
    assert UNet2DConditionModel._repeated_blocks == ["BasicTransformerBlock"]
    assert not SD3Transformer2DModel._repeated_blocks
    torch.manual_seed(0)
    sd3 = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
        pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16,
    )  # fmt: skip
    with pytest.raises(ValueError, match="_repeated_blocks"):
        sd3.compile_repeated_blocks()


def test_compile_modes():
    """`mode="reduce-overhead"` asks inductor for CUDA graphs (`triton.cudagraphs`), and `mode="max-autotune"` adds them to autotuning; the default mode sets neither."""
    from torch._inductor import list_mode_options

    assert list_mode_options("reduce-overhead") == {"triton.cudagraphs": True}
    assert list_mode_options("max-autotune")["triton.cudagraphs"] is True
    assert list_mode_options("max-autotune")["max_autotune"] is True
    assert list_mode_options("default") == {}


def test_dynamo_shape_defaults():
    """In torch 2.13 dynamo makes a dimension symbolic after it changes once (`automatic_dynamic_shapes=True`) and keeps at most 8 compiled versions of a function (`recompile_limit=8`)."""
    assert torch.__version__.startswith("2.13")
    assert torch._dynamo.config.automatic_dynamic_shapes is True
    assert torch._dynamo.config.recompile_limit == 8


def test_hotswap_must_come_first():
    """`enable_lora_hotswap` must be called before the first adapter is loaded: after one it raises a `RuntimeError` (with the default `check_compiled="error"`)."""
    import inspect

    from diffusers.loaders.peft import PeftAdapterMixin
    from tiny import tiny_flux_transformer

    assert inspect.signature(PeftAdapterMixin.enable_lora_hotswap).parameters["target_rank"].default == 128  # fmt: skip
    model = tiny_flux_transformer(False, in_channels=4, pooled_projection_dim=16, axes_dims_rope=(4, 6, 6))  # fmt: skip
    g = torch.Generator().manual_seed(0)
    q = model.transformer_blocks[0].attn.to_q
    state = {
        "transformer_blocks.0.attn.to_q.lora_A.weight": torch.randn(4, q.in_features, generator=g),
        "transformer_blocks.0.attn.to_q.lora_B.weight": torch.randn(q.out_features, 4, generator=g),
    }
    model.load_lora_adapter(state, prefix=None, adapter_name="a")
    with pytest.raises(RuntimeError, match="before loading the first adapter"):
        model.enable_lora_hotswap(target_rank=8)


def test_cache_hooks_are_compiler_disabled():
    """diffusers marks FirstBlockCache's decision (`_should_compute_remaining_blocks`, which calls `.item()`) and MagCache's block hooks with `torch.compiler.disable`, so dynamo does not trace into them (Lab 18 counts the graph breaks this makes)."""
    import inspect

    from diffusers.hooks.first_block_cache import FBCHeadBlockHook
    from diffusers.hooks.mag_cache import MagCacheBlockHook, MagCacheHeadHook

    decide = FBCHeadBlockHook._should_compute_remaining_blocks
    assert decide._torchdynamo_disable and ".item()" in inspect.getsource(decide)
    assert MagCacheHeadHook.new_forward._torchdynamo_disable
    assert MagCacheBlockHook.new_forward._torchdynamo_disable


def test_mega_cache_functions():
    """torch 2.13's Mega-Cache API: `torch.compiler.save_cache_artifacts()` takes no argument and `torch.compiler.load_cache_artifacts(serialized_artifacts)` takes the bytes it saved (what they fill is cited from PyTorch's caching recipe, which needs a compile to run)."""
    import inspect

    assert not inspect.signature(torch.compiler.save_cache_artifacts).parameters
    assert list(inspect.signature(torch.compiler.load_cache_artifacts).parameters) == ["serialized_artifacts"]  # fmt: skip
