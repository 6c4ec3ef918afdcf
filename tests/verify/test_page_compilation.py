"""The compilation section against torch 2.13 and diffusers 0.42.1, on the CPU.

The section states the switches and defaults; the counted behaviour (graphs, recompiles,
graph breaks, cache hooks, LoRA hotswap) is run in Lab 18's module, ``test_page_lab_18.py``.
These tests read torch's config switches and call the named functions on tiny random-config
models; one test compiles a small function with inductor, in three subprocesses, to
see its on-disk cache hit. CUDA graphs need a CUDA device: their constraints are cited from
torch's source on the page, and only the switches that select them are read here.
"""

from __future__ import annotations

import pytest
import torch


def compiled_classes(model):
    """Class names of the submodules ``compile_repeated_blocks`` compiled (``Module.compile``
    sets ``_compiled_call_impl``), and of those it left eager."""
    compiled = {type(m).__name__ for m in model.modules() if m._compiled_call_impl is not None}
    eager = {type(m).__name__ for m in model.modules() if m._compiled_call_impl is None}
    return compiled, eager


def test_repeated_blocks_per_model():
    """`compile_repeated_blocks` compiles the modules whose class the model lists in `_repeated_blocks`: on tiny models it compiles every `FluxTransformerBlock` and `FluxSingleTransformerBlock` of `FluxTransformer2DModel` and only the `BasicTransformerBlock`s (its attention blocks) of `UNet2DConditionModel`, whose `ResnetBlock2D`s stay eager; `SD3Transformer2DModel` lists none, so there it raises a `ValueError`."""
    from diffusers import SD3Transformer2DModel
    from tiny import tiny_flux_transformer, tiny_unet

    flux = tiny_flux_transformer(False, in_channels=4, pooled_projection_dim=16, axes_dims_rope=(4, 6, 6))  # fmt: skip
    unet = tiny_unet()
    for model in (flux, unet):  # the eager backend: which modules compile, not code generation
        model.compile_repeated_blocks(backend="eager")
    flux_compiled, _ = compiled_classes(flux)
    assert flux_compiled == {"FluxTransformerBlock", "FluxSingleTransformerBlock"}
    assert all(m._compiled_call_impl is not None for m in [*flux.transformer_blocks, *flux.single_transformer_blocks])  # fmt: skip
    unet_compiled, unet_eager = compiled_classes(unet)
    assert unet_compiled == {"BasicTransformerBlock"} and "ResnetBlock2D" in unet_eager
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
    """In torch 2.13 dynamo makes a dimension symbolic after it changes once (`automatic_dynamic_shapes=True`) and keeps at most 8 compiled entries per code object (`recompile_limit=8`), which whole-model compiles of many diffusers models share (counted in Lab 18's tests)."""
    assert torch.__version__.startswith("2.13")
    assert torch._dynamo.config.automatic_dynamic_shapes is True
    assert torch._dynamo.config.recompile_limit == 8


def test_hotswap_must_come_first():
    """`enable_lora_hotswap` must be called before the first adapter is loaded: after one it raises a `RuntimeError` (with the default `check_compiled="error"`), through `FluxPipeline.load_lora_weights` and `pipe.enable_lora_hotswap`."""
    from tiny import tiny_flux_pipeline

    pipe = tiny_flux_pipeline()
    g = torch.Generator().manual_seed(0)
    q = pipe.transformer.transformer_blocks[0].attn.to_q
    key = "transformer.transformer_blocks.0.attn.to_q"
    state = {
        f"{key}.lora_A.weight": torch.randn(4, q.in_features, generator=g),
        f"{key}.lora_B.weight": torch.randn(q.out_features, 4, generator=g),
    }
    pipe.load_lora_weights(state, adapter_name="a")
    with pytest.raises(RuntimeError, match="before loading the first adapter"):
        pipe.enable_lora_hotswap(target_rank=8)


CHILD = """
import json
import sys

import torch
from torch._dynamo.utils import counters

torch.set_num_threads(1)
mode, path = sys.argv[1], sys.argv[2]
if mode == "load":
    with open(path, "rb") as fh:
        torch.compiler.load_cache_artifacts(fh.read())
f = torch.compile(lambda x: torch.nn.functional.gelu(x * 2 + 1).sum(-1))
f(torch.randn(4, 8))
if mode == "save":
    artifacts, _ = torch.compiler.save_cache_artifacts()
    with open(path, "wb") as fh:
        fh.write(artifacts)
print(json.dumps({"inductor": dict(counters["inductor"]), "frames": dict(counters["frames"])}))
"""


def compile_in_a_new_process(mode, cache_dir, artifacts):
    """Inductor's and dynamo's counters after compiling one small function in a fresh
    Python with ``TORCHINDUCTOR_CACHE_DIR=cache_dir``; ``mode`` "save" writes Mega-Cache's
    artifacts to the file ``artifacts`` afterwards, "load" loads them first."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir), OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", CHILD, mode, str(artifacts)], env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_inductor_caches_compiled_code_on_disk(tmp_path):
    """Inductor caches compiled code on disk by default: `fx_graph_cache` and `autotune_local_cache` are on, in the directory `TORCHINDUCTOR_CACHE_DIR` names (by default `torchinductor_<user>` in the temp directory), so a second process compiling the same graph into the same directory gets an FX graph cache hit instead of a miss, while dynamo still traces the function again in that process; and Mega-Cache's `torch.compiler.save_cache_artifacts()` in the first process and `load_cache_artifacts(...)` in a third, with an empty cache directory, give that third process the hit too."""
    import getpass
    import os
    import tempfile

    import torch._inductor.config as inductor
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert inductor.fx_graph_cache is True and inductor.autotune_local_cache is True
    assert default_cache_dir() == os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")  # fmt: skip
    machine, fresh, artifacts = tmp_path / "machine", tmp_path / "fresh", tmp_path / "mega.bin"
    first = compile_in_a_new_process("save", machine, artifacts)
    restarted = compile_in_a_new_process("plain", machine, artifacts)
    moved = compile_in_a_new_process("load", fresh, artifacts)
    assert first["inductor"].get("fxgraph_cache_miss") == 1 and not first["inductor"].get("fxgraph_cache_hit")  # fmt: skip
    for later in (restarted, moved):
        assert later["inductor"].get("fxgraph_cache_hit") == 1 and not later["inductor"].get("fxgraph_cache_miss")  # fmt: skip
    assert (
        first["frames"]["ok"] == restarted["frames"]["ok"] == moved["frames"]["ok"] >= 1
    )  # traced each time


def test_cuda_graph_switches():
    """inductor's CUDA graphs are off unless asked for (`triton.cudagraphs`, which `mode="reduce-overhead"` sets), use CUDA Graph Trees (`triton.cudagraph_trees=True`), and under dynamic shapes record a graph for each distinct shape rather than skip dynamic graphs (`triton.cudagraph_skip_dynamic_graphs=False`): the switches as torch 2.13 sets them, read on the CPU; the recording itself needs a CUDA device and is not run here."""
    import os

    import torch._inductor.config as inductor
    from torch._inductor import list_mode_options

    assert inductor.triton.cudagraphs is (os.environ.get("TORCHINDUCTOR_CUDAGRAPHS") == "1")
    assert list_mode_options("reduce-overhead") == {"triton.cudagraphs": True}
    assert inductor.triton.cudagraph_trees is True
    assert inductor.triton.cudagraph_skip_dynamic_graphs is False


def test_cuda_graph_trees_warn_past_eight_sizes():
    """Past 8 distinct input sizes, inductor's CUDA-graph check warns that recording a graph per size "may lead to extra overhead" and suggests padding to a few shapes (`triton.cudagraph_dynamic_shape_warn_limit=8`): `maybe_warning_due_to_dynamic_shape`, called on the CPU with 7 and 8 recorded sizes, warns only when the new one is the ninth."""
    import logging

    import torch._inductor.config as inductor
    from torch._inductor.cudagraph_utils import maybe_warning_due_to_dynamic_shape

    assert inductor.triton.cudagraph_dynamic_shape_warn_limit == 8
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("torch._inductor.cudagraph_utils")  # cudagraphs_log's parent
    log.addHandler(handler)
    try:
        eighth = maybe_warning_due_to_dynamic_shape({(n,): None for n in range(7)}, (7,))
        ninth = maybe_warning_due_to_dynamic_shape({(n,): None for n in range(8)}, (8,))
    finally:
        log.removeHandler(handler)
    assert (eighth, ninth) == (False, True)
    assert len(records) == 1 and "extra overhead" in records[0].getMessage()
    assert "padding inputs" in records[0].getMessage()
