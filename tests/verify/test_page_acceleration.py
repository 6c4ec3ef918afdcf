"""Acceleration (docs/handbook/acceleration.md) against the installed diffusers.

The section sums up Labs 14, 15 and 16; the diffusers behaviour it states is re-checked
here as the section phrases it, on the real classes: torch's dtypes, a tiny overflowing
``AutoencoderKL`` (``tiny.overflowing_vae``), a tiny random-config
``FluxTransformer2DModel`` (``tiny.four_block_flux_transformer``: 2 double-stream and 2
single-stream blocks) for layerwise casting, FirstBlockCache, the attention backends and
group offloading, and the pipelines' source
where the behaviour is a line of it. Nothing downloads weights and nothing needs a GPU:
the GPU-only kernels and quantization backends are named on the page as not run.
"""

from __future__ import annotations

import contextlib
import itertools
from types import SimpleNamespace

import pytest
import torch
from tiny import (
    cache_contexts_of_a_flux_call,
    count_dispatched_ops,
    count_transfers,
    embeds,
    euler_sdxl_pipeline,
    flux_prompt_embeds,
    four_block_flux_inputs,
    four_block_flux_transformer,
    hooked_forwards,
    logged_messages,
    overflowing_vae,
    quiet,
    replay_model_offload,
    run_four_block_flux,
    sdpa_kernels_seen,
    sdxl_call,
    simulated_ring,
    simulated_stream_offload,
    start_latents,
    tiny_flux_pipeline,
    tiny_sd_pipeline,
    tiny_unet,
    tiny_vae,
    tiny_wan_pipeline,
    tiny_wan_transformer,
    traffic,
)

#: a short flow-matching loop for the cache tests: (sigma, next sigma) pairs
SIGMAS = [1.0, 0.95, 0.9, 0.6, 0.55, 0.0]


def loop(model, context="cond"):
    """Euler steps of the tiny Flux transformer; each output moves the packed latents."""
    inputs = four_block_flux_inputs()
    latents = inputs.pop("hidden_states")
    inputs.pop("timestep")
    outputs = []
    with torch.no_grad():
        for sigma, sigma_next in itertools.pairwise(SIGMAS):
            with model.cache_context(context):
                noise_pred = model(hidden_states=latents, timestep=torch.tensor([sigma]), **inputs)[0]  # fmt: skip
            outputs.append(noise_pred)
            latents = latents + (sigma_next - sigma) * noise_pred
    return outputs


# ---------------------------------------------------------------- precision


def test_two_byte_and_one_byte_formats():
    """torch's float16 and bfloat16 both take 2 bytes; float16's largest value is 65504, bfloat16's is float32's order (about 3.4e38) with a coarser step (`eps` is `2**-7` against `2**-10`); `float8_e4m3fn` and `float8_e5m2` take 1 byte and stop at 448 and 57344."""
    fp16, bf16 = torch.finfo(torch.float16), torch.finfo(torch.bfloat16)
    e4m3, e5m2 = torch.finfo(torch.float8_e4m3fn), torch.finfo(torch.float8_e5m2)
    assert (fp16.bits, bf16.bits, e4m3.bits, e5m2.bits) == (16, 16, 8, 8)
    assert fp16.max == 65504 and e4m3.max == 448 and e5m2.max == 57344
    assert 3.3e38 < bf16.max < torch.finfo(torch.float32).max
    assert (fp16.eps, bf16.eps) == (2**-10, 2**-7)
    # past the top: float16 stores inf, bfloat16 a finite value
    assert torch.isinf(torch.tensor([70000.0]).to(torch.float16)).all()
    assert torch.isfinite(torch.tensor([70000.0]).to(torch.bfloat16)).all()


def test_fp16_decode_of_an_overflowing_vae_is_nan():
    """A tiny `AutoencoderKL` whose decoder activations pass 65504 decodes to all-NaN pixels in float16 and to finite pixels in bfloat16 and float32."""
    from diffusers.utils import logging

    logging.set_verbosity_error()
    z = start_latents()
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        with torch.no_grad():
            out[dtype] = overflowing_vae().to(dtype).decode(z.to(dtype)).sample.float()
    assert torch.isnan(out[torch.float16]).all()
    assert torch.isfinite(out[torch.bfloat16]).all() and torch.isfinite(out[torch.float32]).all()


def test_force_upcast_is_read_by_sdxl_not_by_sd15(record_calls):
    """`AutoencoderKL`'s `force_upcast` defaults to `True`; with it, a float16 `StableDiffusionXLPipeline` decodes in float32 (its deprecated `upcast_vae()`), a bfloat16 one decodes in bfloat16 (only a float16 VAE is upcast), and a float16 `StableDiffusionPipeline` decodes in float16 whatever the flag says: the dtype the decoder receives in tiny pipelines, whose overflowing VAE gives NaN images only in the float16 decode."""
    import numpy as np

    quiet()
    assert tiny_vae().config.force_upcast is True
    seen = {}
    for name, dtype in [("sdxl fp16", torch.float16), ("sdxl bf16", torch.bfloat16)]:
        pipe = euler_sdxl_pipeline(overflowing_vae()).to(dtype)
        decoder = record_calls(pipe.vae.decoder)
        # the float16 call takes the upcast path, whose deprecation warning is provoked here
        upcast = pytest.warns(FutureWarning, match="upcast_vae") if dtype == torch.float16 else contextlib.nullcontext()  # fmt: skip
        with upcast:
            images = sdxl_call(pipe, dtype, output_type="np")
        seen[name] = (decoder.calls[0][0][0].dtype, bool(np.isnan(images).any()))
    pipe = tiny_sd_pipeline(vae=overflowing_vae()).to(torch.float16)
    decoder = record_calls(pipe.vae.decoder)
    images = pipe(prompt_embeds=embeds(0).half(), latents=start_latents().half(),
                  num_inference_steps=2, guidance_scale=1.0, output_type="np").images  # fmt: skip
    seen["sd fp16"] = (decoder.calls[0][0][0].dtype, bool(np.isnan(images).all()))
    assert seen == {"sdxl fp16": (torch.float32, False), "sdxl bf16": (torch.bfloat16, False), "sd fp16": (torch.float16, True)}  # fmt: skip


# ---------------------------------------------------------------- weight quantization


def test_layerwise_casting_stores_fp8_weights_on_a_flux_transformer():
    """`enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)` on a tiny `FluxTransformer2DModel` hooks `Linear`, `Conv` and `Embedding` layers and skips every module whose name matches `pos_embed`, `patch_embed`, `norm`, `^proj_in$` or `^proj_out$` (plus Flux's `_skip_layerwise_casting_patterns`, `pos_embed` and `norm`): the attention and feed-forward `Linear` weights, and their biases too, are stored in float8 (1 byte each), while the AdaLN modulation Linears (`norm1.linear`, `norm1_context.linear`, `norm.linear`), `norm_out` and the top-level `proj_out` stay float32, while the single blocks' `proj_out` is cast (the patterns are anchored), and the output stays finite and within 0.2 relative RMS of the float32 model's (a plain cast, no scale)."""
    from diffusers.hooks._common import _GO_LC_SUPPORTED_PYTORCH_LAYERS
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN

    assert DEFAULT_SKIP_MODULES_PATTERN == ("pos_embed", "patch_embed", "norm", "^proj_in$", "^proj_out$")  # fmt: skip
    nn = torch.nn
    assert {nn.Linear, nn.Conv2d, nn.Embedding} <= set(_GO_LC_SUPPORTED_PYTORCH_LAYERS)
    reference, cast = four_block_flux_transformer(), four_block_flux_transformer()
    cast.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    linears = {n: m for n, m in cast.named_modules() if isinstance(m, torch.nn.Linear)}
    for name, module in linears.items():
        in_blocks = name.split(".")[0] in ("transformer_blocks", "single_transformer_blocks")
        if in_blocks:
            expected = torch.float32 if "norm" in name else torch.float8_e4m3fn
            assert module.weight.dtype == expected, name
    assert any("norm" in n for n in linears) and linears["proj_out"].weight.dtype == torch.float32
    assert type(cast)._skip_layerwise_casting_patterns == ["pos_embed", "norm"]
    for name in ["transformer_blocks.0.norm1.linear", "transformer_blocks.0.norm1_context.linear", "single_transformer_blocks.0.norm.linear", "norm_out.linear"]:  # fmt: skip
        assert linears[name].weight.dtype == torch.float32, name  # AdaLN modulation: kept
    assert linears["transformer_blocks.0.attn.to_q"].weight.dtype == torch.float8_e4m3fn
    assert linears["single_transformer_blocks.0.proj_out"].weight.dtype == torch.float8_e4m3fn
    assert linears["transformer_blocks.0.attn.to_q"].bias.dtype == torch.float8_e4m3fn
    y_ref, y_cast = run_four_block_flux(reference), run_four_block_flux(cast)
    assert torch.isfinite(y_cast).all()
    rel = ((y_cast - y_ref).norm() / y_ref.norm()).item()
    assert 0 < rel < 0.2


def test_layerwise_casting_also_skips_fp32_modules_and_adapter_layers():
    """`enable_layerwise_casting` also skips the model's `_keep_in_fp32_modules` and, when you pass no patterns and peft is installed, peft's adapter layers such as LoRA's `lora_A` and `lora_B`: on a tiny `Kandinsky5Transformer3DModel`, whose `_keep_in_fp32_modules` names its time embedding and modulation Linears and which has no skip patterns of its own, exactly the Linears under those names stay float32 (no default pattern matches them); on the tiny Flux transformer with a LoRA adapter on `to_q`, the base layer is stored in float8 and every adapter weight stays float32, while passing `skip_modules_pattern` yourself casts the adapter too."""
    import re

    from diffusers import Kandinsky5Transformer3DModel
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN
    from peft import LoraConfig

    fp8 = torch.float8_e4m3fn
    k5 = Kandinsky5Transformer3DModel(in_text_dim=32, in_text_dim2=16, time_dim=16, model_dim=32, ff_dim=64, num_text_blocks=1, num_visual_blocks=1, axes_dims=(4, 6, 6))  # fmt: skip
    keep = type(k5)._keep_in_fp32_modules
    assert keep and type(k5)._skip_layerwise_casting_patterns is None
    k5.enable_layerwise_casting(storage_dtype=fp8, compute_dtype=torch.float32)
    linears = {n: m.weight.dtype for n, m in k5.named_modules() if isinstance(m, torch.nn.Linear)}
    kept = {n for n in linears if any(re.search(k, n) for k in keep)}
    assert kept and not any(re.search(d, n) for d in DEFAULT_SKIP_MODULES_PATTERN for n in kept)
    assert {n for n, dtype in linears.items() if dtype == torch.float32} == kept

    def lora_flux(**patterns):
        model = four_block_flux_transformer()
        model.add_adapter(LoraConfig(r=4, target_modules=["to_q"]))
        model.enable_layerwise_casting(storage_dtype=fp8, compute_dtype=torch.float32, **patterns)
        return model.transformer_blocks[0].attn.to_q

    to_q = lora_flux()
    assert to_q.base_layer.weight.dtype == fp8
    adapters = [p for n, p in to_q.named_parameters() if not n.startswith("base_layer")]
    assert adapters and all(p.dtype == torch.float32 for p in adapters)
    to_q = lora_flux(skip_modules_pattern=DEFAULT_SKIP_MODULES_PATTERN)
    assert to_q.lora_A["default"].weight.dtype == to_q.lora_B["default"].weight.dtype == fp8


def test_gguf_blocks_and_dequantize_on_every_call(monkeypatch):
    """A GGUF `Q8_0` block holds 32 weights in 34 bytes and a `Q4_0` block 32 weights in 18 bytes (8.5 and 4.5 bits per weight); without `DIFFUSERS_GGUF_CUDA_KERNELS=true` a `GGUFLinear` runs `forward_native`, which dequantizes its whole weight inside every forward and calls an ordinary `linear` in `compute_dtype`; the opt-in CUDA path (`_fused_mul_mat_gguf`, run with a stand-in for its kernel) also dequantizes the whole weight, in one kernel call, and multiplies in the input's dtype; and `GGUFQuantizationConfig` is `pre_quantized`: GGUF weights come quantized from the file."""
    gguf = pytest.importorskip("gguf", reason="the verify extra includes gguf")
    import diffusers.quantizers.gguf.utils as gguf_utils
    import numpy as np
    from diffusers import GGUFQuantizationConfig

    sizes = gguf.GGML_QUANT_SIZES
    q8 = gguf.GGMLQuantizationType.Q8_0
    assert sizes[q8] == (32, 34) and sizes[gguf.GGMLQuantizationType.Q4_0] == (32, 18)
    assert gguf_utils.can_use_cuda_kernels is False and gguf_utils.ops is None
    w = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    layer = gguf_utils.GGUFLinear(64, 8, bias=False, compute_dtype=torch.bfloat16)
    layer.weight = gguf_utils.GGUFParameter(torch.from_numpy(gguf.quants.quantize(w, q8)), quant_type=q8)  # fmt: skip
    calls, original = [], gguf_utils.dequantize_gguf_tensor
    monkeypatch.setattr(gguf_utils, "dequantize_gguf_tensor", lambda t: calls.append(1) or original(t))  # fmt: skip
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        y = [layer(x) for _ in range(2)]
    assert len(calls) == 2 and y[0].dtype == torch.bfloat16
    dequantized = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w, q8), q8))
    torch.testing.assert_close(y[0], x @ dequantized.to(torch.float16).to(torch.bfloat16).T)
    # the opt-in CUDA path, with a stand-in for the kernel's whole-weight dequantization
    kernel_calls = []

    def ggml_dequantize(qweight, qtype, rows, cols):
        kernel_calls.append((rows, cols))
        return gguf_utils.GGUFParameter(original(layer.weight).float(), quant_type=q8)

    monkeypatch.setattr(gguf_utils, "ops", SimpleNamespace(ggml_dequantize=ggml_dequantize))
    y_cuda = gguf_utils._fused_mul_mat_gguf(x, layer.weight, int(q8))
    assert kernel_calls == [(8, 64)] and y_cuda.dtype == torch.bfloat16
    torch.testing.assert_close(y_cuda, y[0])
    assert GGUFQuantizationConfig(compute_dtype=torch.bfloat16).pre_quantized is True


# ------------------------------------------- low precision: torchao int8 W8A8, fp8, Nunchaku


def needs_torchao():
    """torchao is in the verify extra: skip where a venv lacks it, fail in CI (CI=true), which
    installs the extra, so that a missing torchao cannot pass as a skip."""
    import os

    if os.environ.get("CI"):
        import torchao  # noqa: F401
    else:
        pytest.importorskip("torchao", reason="the verify extra includes torchao")


def test_torchao_int8_weights_and_activations_run_here(tmp_path, monkeypatch):
    """`TorchAoConfig` takes torchao config objects only (a string such as `"int8dq"` raises `TypeError`); with `Int8DynamicActivationInt8WeightConfig()` a tiny Flux transformer loads with int8 `Linear` weights and a float32 scale per row, quantizes each input per token and multiplies in `torch._int_mm`, its output within 2% of bf16; run eagerly, each such `Linear` dispatches more than ten extra elementwise and reduction ops (the input's amax, scale, rounding, casts, the rescale) around its one `_int_mm`, where the bf16 `Linear` dispatches one `addmm`; `Int8WeightOnlyConfig()` widens the int8 weight to bf16 for an ordinary matmul (no integer matmul)."""
    needs_torchao()
    from diffusers import FluxTransformer2DModel, TorchAoConfig
    from torchao.quantization import (
        Int8DynamicActivationInt8WeightConfig,
        Int8Tensor,
        Int8WeightOnlyConfig,
    )

    with pytest.raises(TypeError, match="must be an AOBaseConfig instance"):
        TorchAoConfig("int8dq")
    four_block_flux_transformer().save_pretrained(tmp_path)
    quiet()
    load = lambda c=None: FluxTransformer2DModel.from_pretrained(tmp_path, torch_dtype=torch.bfloat16, quantization_config=c and TorchAoConfig(c))  # noqa: E731  # fmt: skip
    floats = ("hidden_states", "encoder_hidden_states", "pooled_projections")
    inputs = {k: v.to(torch.bfloat16) if k in floats else v for k, v in four_block_flux_inputs().items()}  # fmt: skip
    calls, int_mm = [], torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: calls.append(b.dtype) or int_mm(a, b))

    def run(model):
        with torch.no_grad():
            return model(**inputs)[0].float()

    y_ref = run(load())
    w8a8 = load(Int8DynamicActivationInt8WeightConfig())
    linears = [m for m in w8a8.modules() if isinstance(m, torch.nn.Linear)]
    for m in linears:
        assert m.weight.qdata.dtype == torch.int8 and m.weight.scale.dtype == torch.float32
        assert m.weight.scale.shape == (m.weight.shape[0], 1)
    scales, from_hp = [], Int8Tensor.from_hp.__func__  # each input's scale, as it is quantized
    monkeypatch.setattr(Int8Tensor, "from_hp", classmethod(lambda cls, x, *a, **k: scales.append((x.shape, (t := from_hp(cls, x, *a, **k)).scale.shape)) or t))  # fmt: skip
    y = run(w8a8)
    monkeypatch.setattr(Int8Tensor, "from_hp", classmethod(from_hp))
    assert len(calls) >= len(linears) and set(calls) == {torch.int8}
    # per token: input (batch, tokens, in) -> scale (batch, tokens, 1)
    assert len(scales) == len(calls) and all(sc == (*s[:-1], 1) for s, sc in scales)
    assert ((y - y_ref).norm() / y_ref.norm()).item() < 0.02
    # one Linear, eager: the activation quantization is separate ops around the integer matmul
    plain, quantized = load().transformer_blocks[0].attn.to_q, w8a8.transformer_blocks[0].attn.to_q
    x = inputs["hidden_states"].new_ones(1, 16, plain.in_features)
    with torch.no_grad():
        ops = {name: count_dispatched_ops(lambda m=m: m(x)) for name, m in [("bf16", plain), ("w8a8", quantized)]}  # fmt: skip
    compute = lambda c: sum(n for op, n in c.items() if op not in ("view", "t"))  # noqa: E731
    assert ops["bf16"]["addmm"] == compute(ops["bf16"]) == 1
    assert ops["w8a8"]["_int_mm"] == 1 and compute(ops["w8a8"]) > 10
    calls.clear()
    y = run(load(Int8WeightOnlyConfig()))
    assert calls == [] and ((y - y_ref).norm() / y_ref.norm()).item() < 0.02


def test_fp8_activations_and_nunchaku_check_the_gpu(monkeypatch):
    """`Float8DynamicActivationFloat8WeightConfig()` refuses on this CPU: torchao's `_check_hardware_support` asks for a CUDA capability of `(8, 9)` or more (or an MI300 or XPU); torchao's prototype `NVFP4DynamicActivationNVFP4WeightConfig()` without `sm_100` or more; `NunchakuLiteQuantizer.validate_environment` raises for capability major 9 ("not supported on Hopper"), asks `(10, 0)` for `nvfp4` and `(7, 5)`, Turing, for `int4` (capabilities simulated)."""
    needs_torchao()
    import diffusers.quantizers.nunchaku.nunchaku_quantizer as nunchaku
    from diffusers.quantizers.quantization_config import NunchakuLiteQuantizationConfig
    from torchao.prototype.mx_formats import NVFP4DynamicActivationNVFP4WeightConfig
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, quantize_

    with pytest.raises(
        AssertionError, match=r"requires CUDA compute capability ≥8\.9 or MI300\+ or XPU"
    ):
        quantize_(torch.nn.Linear(32, 32).to(torch.bfloat16), Float8DynamicActivationFloat8WeightConfig())  # fmt: skip
    with pytest.raises(AssertionError, match=r"only supported on sm100\+"):
        quantize_(torch.nn.Linear(64, 64).to(torch.bfloat16), NVFP4DynamicActivationNVFP4WeightConfig())  # fmt: skip
    monkeypatch.setattr(nunchaku, "is_kernels_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def check(capability, precision):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
        group = 16 if precision == "nvfp4" else 64
        svdq = {"precision": precision, "group_size": group, "rank": 32, "targets": ["proj_out"]}
        nunchaku.NunchakuLiteQuantizer(NunchakuLiteQuantizationConfig(svdq_w4a4=svdq)).validate_environment()  # fmt: skip

    for capability in ((9, 0), (9, 9)):
        with pytest.raises(ValueError, match="not supported on Hopper"):
            check(capability, "int4")
    with pytest.raises(ValueError, match="requires a Blackwell"):
        check((8, 9), "nvfp4")
    with pytest.raises(ValueError, match="requires a Turing"):
        check((7, 0), "int4")
    check((10, 0), "nvfp4")
    check((7, 5), "int4")


def test_native_backend_is_torch_sdpa(monkeypatch, default_backend):
    """The default attention backend `native` calls `torch.nn.functional.scaled_dot_product_attention` with every SDPA kernel left enabled, so torch chooses the kernel (seen inside each SDPA call of a tiny Flux transformer)."""
    seen = sdpa_kernels_seen(monkeypatch)
    run_four_block_flux(four_block_flux_transformer())
    assert len(seen) == 4 and all(s == {"flash", "efficient", "math", "cudnn"} for s in seen)


def test_block_modules_takes_the_mid_block_out_of_the_unmatched_group():
    """`enable_group_offload(..., offload_type="block_level", block_modules=["mid_block"])` takes a UNet's `mid_block` out of the always-onloaded group and gives each of its `resnets` and `attentions` blocks its own group (checked on the tiny UNet)."""
    from diffusers.hooks import HookRegistry

    cpu = torch.device("cpu")
    unet = tiny_unet()
    unet.enable_group_offload(onload_device=cpu, offload_device=cpu, offload_type="block_level", num_blocks_per_group=1, block_modules=["mid_block"])  # fmt: skip

    def group(module):
        return HookRegistry.check_if_exists_or_initialize(module).get_hook("group_offloading").group

    assert unet.mid_block not in group(unet).modules
    for block in [*unet.mid_block.resnets, *unet.mid_block.attentions]:
        assert group(block).modules == [block]


def test_quant_backend_constructs_only_where_both_libraries_configs_match(tmp_path):
    """`PipelineQuantizationConfig(quant_backend=...)` accepts only a backend whose diffusers and transformers config classes take the same arguments: of diffusers 0.42.1's registry, with transformers 5.23.0, `bitsandbytes_4bit`, `bitsandbytes_8bit` and `auto-round`; `torchao`, `quanto` and `gguf` raise `ValueError` (their signatures differ, `pipe_quant_config.py` L88-L109), as does a backend transformers lacks; `auto-round` then loads only pre-quantized checkpoints: `DiffusionPipeline.from_pretrained` of a saved, unquantized tiny `FluxPipeline` with `quant_backend="auto-round"` raises `ValueError`; the bitsandbytes quantizers raise "No GPU found" without an accelerator: they are not run here."""
    from diffusers import BitsAndBytesConfig, DiffusionPipeline, PipelineQuantizationConfig
    from diffusers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING
    from diffusers.quantizers.bitsandbytes import BnB4BitDiffusersQuantizer

    needs_torchao()
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    accepted, mismatched = set(), set()
    for backend in AUTO_QUANTIZATION_CONFIG_MAPPING:  # the registry, as installed
        try:
            PipelineQuantizationConfig(quant_backend=backend, quant_kwargs={"x": 1}, components_to_quantize=["transformer"])  # fmt: skip
            accepted.add(backend)
        except ValueError as error:
            if "signatures" in str(error):
                mismatched.add(backend)
    assert accepted == {"bitsandbytes_4bit", "bitsandbytes_8bit", "auto-round"}
    assert {"torchao", "quanto", "gguf"} <= mismatched
    with pytest.raises(ValueError, match="signatures"):  # a real torchao config changes nothing
        PipelineQuantizationConfig(quant_backend="torchao", quant_kwargs={"quant_type": Int8DynamicActivationInt8WeightConfig()})  # fmt: skip
    # auto-round constructs, but quantizes nothing as it loads: an unquantized checkpoint raises
    tiny_flux_pipeline().save_pretrained(tmp_path)
    absent = {f"{kind}{s}": None for kind in ("text_encoder", "tokenizer") for s in ("", "_2")}  # fmt: skip
    auto_round = PipelineQuantizationConfig(quant_backend="auto-round", quant_kwargs={"bits": 4}, components_to_quantize=["transformer"])  # fmt: skip
    with pytest.raises(ValueError, match="pre-quantized"):
        DiffusionPipeline.from_pretrained(str(tmp_path), quantization_config=auto_round, **absent)
    assert not torch.cuda.is_available()
    with pytest.raises(RuntimeError, match="No GPU found"):
        BnB4BitDiffusersQuantizer(BitsAndBytesConfig()).validate_environment()


def test_quant_mapping_quantizes_with_torchao_but_gguf_raises(tmp_path):
    """torchao and quanto (its `QuantoConfig` deprecated in 0.42.1) take `quant_mapping={"transformer": ...}` instead; GGUF and `bfl` do not: with their config in `quant_mapping`, `from_pretrained` raises `TypeError` (its `to_dict()` keeps a `torch.dtype` that `json.dumps` rejects, `modeling_utils.py` L1206), and they quantize nothing on load anyway: both load pre-quantized checkpoints only through `from_single_file` (GGUF from a `.gguf` file). Building a `QuantoConfig` raises a `FutureWarning` (removal in 1.0.0); both `GGUFQuantizationConfig` and `BFLQuantizationConfig` are `pre_quantized`. A tiny `FluxPipeline` saved and reloaded with `DiffusionPipeline.from_pretrained(dir, quantization_config=PipelineQuantizationConfig(quant_mapping=...))`: with `{"transformer": TorchAoConfig(Int8WeightOnlyConfig())}` every `nn.Linear` of the transformer holds a torchao tensor and the VAE keeps plain parameters; with `{"transformer": GGUFQuantizationConfig(compute_dtype=torch.bfloat16)}` or `BFLQuantizationConfig()` the load raises `TypeError` (quanto is not installed here: not run; that GGUF would quantize nothing on load is read from `gguf_quantizer.py` L95-L106, not run)."""
    from diffusers import (
        DiffusionPipeline,
        GGUFQuantizationConfig,
        PipelineQuantizationConfig,
        QuantoConfig,
        TorchAoConfig,
    )
    from diffusers.quantizers.quantization_config import BFLQuantizationConfig

    needs_torchao()
    from torchao.quantization import Int8WeightOnlyConfig

    tiny_flux_pipeline().save_pretrained(tmp_path)
    absent = {f"{kind}{s}": None for kind in ("text_encoder", "tokenizer") for s in ("", "_2")}  # fmt: skip

    def load(config):
        mapping = PipelineQuantizationConfig(quant_mapping={"transformer": config})
        return DiffusionPipeline.from_pretrained(str(tmp_path), quantization_config=mapping, **absent)  # fmt: skip

    pipe = load(TorchAoConfig(Int8WeightOnlyConfig()))
    linears = [m for m in pipe.transformer.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m.weight).__module__.startswith("torchao") for m in linears)
    assert all(type(p) is torch.nn.Parameter for p in pipe.vae.parameters())
    with pytest.raises(TypeError, match="not JSON serializable"):
        load(GGUFQuantizationConfig(compute_dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="not JSON serializable"):
        load(BFLQuantizationConfig())
    assert GGUFQuantizationConfig().pre_quantized is BFLQuantizationConfig().pre_quantized is True
    with pytest.warns(FutureWarning, match="`QuantoConfig` is deprecated and will be removed in version 1.0.0"):  # fmt: skip
        QuantoConfig(weights_dtype="int8")


class _SaysCuda(torch.Tensor):
    """A CPU tensor whose ``is_cuda`` is True: it reaches a CUDA branch's capability gate."""

    @property
    def is_cuda(self):
        return True


def test_bfl_linears_compute_in_fp8_and_nvfp4_by_capability(monkeypatch):
    """diffusers' `bfl` backend computes in low precision by GPU generation: `BFLFP8RLinear` quantizes each input row to fp8 e4m3 and calls `torch._scaled_mm` on a CUDA capability of `(8, 9)` or more when both feature sizes are multiples of 16, and dequantizes its weight for a bf16 `linear` otherwise and on the CPU; `BFLNVFP4Linear` calls `flashinfer.nvfp4_quantize` and `flashinfer.mm_fp4` only with flashinfer installed and capability major 10 or more, and otherwise dequantizes (`quantizers/bfl/utils.py`; the capability and the CUDA input simulated, `_scaled_mm` and flashinfer replaced by stand-ins: no GPU kernel runs here)."""
    from diffusers.quantizers.bfl import utils as bfl

    fp8 = bfl.BFLFP8RLinear(32, 32, bias=False, compute_dtype=torch.bfloat16)
    with torch.no_grad():
        fp8.weight.copy_(torch.randn(32, 32).to(torch.float8_e4m3fn))
        fp8.weight_scale.fill_(0.01)
    nvfp4 = bfl.BFLNVFP4Linear(32, 32, bias=False, compute_dtype=torch.bfloat16)
    with torch.no_grad():
        nvfp4.weight.zero_()
        nvfp4.weight_scale.copy_(torch.ones(32, 2).to(torch.float8_e4m3fn))
        nvfp4.weight_scale_2.fill_(1.0)
        nvfp4.input_scale.fill_(1.0)
    x = torch.randn(2, 32).to(torch.bfloat16)
    gemms = []

    def scaled_mm(a, b, scale_a, scale_b, **kwargs):
        gemms.append(("_scaled_mm", a.dtype, tuple(scale_a.shape)))
        return (a.float() * scale_a) @ (b.float() * scale_b)

    def mm_fp4(x, w, *args, **kwargs):
        gemms.append(("mm_fp4",))
        return torch.zeros(x.shape[0], 32, dtype=torch.bfloat16)

    flashinfer = SimpleNamespace(
        SfLayout=SimpleNamespace(layout_128x4=None),
        nvfp4_quantize=lambda x, scale, **kw: (x, scale),
        block_scale_interleave=lambda s: torch.zeros(4 * 128, dtype=torch.uint8),
        mm_fp4=mm_fp4,
    )
    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    monkeypatch.setattr(bfl, "flashinfer", flashinfer, raising=False)

    def route(layer, capability, flashinfer_installed=True, cuda=True):
        gemms.clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(bfl, "is_flashinfer_available", lambda: flashinfer_installed)
        inputs = x[:, : layer.in_features]
        layer(inputs.as_subclass(_SaysCuda) if cuda else inputs)
        return gemms[0][0] if gemms else "dequantize"

    assert route(fp8, (8, 9), cuda=False) == "dequantize"  # the CPU
    odd = bfl.BFLFP8RLinear(24, 32, bias=False, compute_dtype=torch.bfloat16)
    with torch.no_grad():
        odd.weight.copy_(torch.randn(32, 24).to(torch.float8_e4m3fn))
        odd.weight_scale.fill_(0.01)
    assert route(odd, (9, 0)) == "dequantize"  # 24 input features: not a multiple of 16
    assert [route(fp8, c) for c in [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0)]] == ["dequantize"] * 3 + ["_scaled_mm"] * 3  # fmt: skip
    route(fp8, (8, 9))
    assert gemms == [("_scaled_mm", torch.float8_e4m3fn, (2, 1))]  # one scale per input row
    assert [route(nvfp4, c) for c in [(8, 9), (9, 0), (10, 0), (12, 0)]] == ["dequantize"] * 2 + ["mm_fp4"] * 2  # fmt: skip
    assert route(nvfp4, (10, 0), flashinfer_installed=False) == "dequantize"


# ---------------------------------------------------------------- step caching


def test_caching_is_a_model_mixin_flux_has_and_the_unets_lack(monkeypatch):
    """`enable_cache` exists only on models with `CacheMixin`, over every model class diffusers exports: `FluxTransformer2DModel` has it, the SD 1.5 / SDXL `UNet2DConditionModel` and SD3's `SD3Transformer2DModel` do not; `FluxPipeline.__call__` runs its transformer inside `cache_context("cond")`, and `cache_context("uncond")` for the negative prompt's call (a 2-step true-CFG call of a tiny pipeline with FirstBlockCache on)."""
    import inspect

    import diffusers
    from diffusers.models.cache_utils import CacheMixin

    objects = (getattr(diffusers, n, None) for n in dir(diffusers) if not n.startswith("_") and "Pipeline" not in n)  # fmt: skip
    models = [c for c in objects if inspect.isclass(c) and issubclass(c, diffusers.ModelMixin)]
    assert len(models) > 100 and diffusers.FluxTransformer2DModel in models
    assert [c.__name__ for c in models if hasattr(c, "enable_cache") and not issubclass(c, CacheMixin)] == []  # fmt: skip
    assert issubclass(diffusers.FluxTransformer2DModel, CacheMixin)
    for cls in (diffusers.UNet2DConditionModel, diffusers.SD3Transformer2DModel):
        assert not issubclass(cls, CacheMixin) and not hasattr(cls, "enable_cache")
    assert cache_contexts_of_a_flux_call(monkeypatch) == ["cond", "uncond", "cond", "uncond"]


def test_first_block_cache_rule_and_taylorseer_extrapolation():
    """FirstBlockCache computes the remaining blocks when the first block's residual changed, as mean absolute change over the stored residual's mean absolute value, by more than `threshold` (its head hook's decision, called on set residuals), and always when nothing is stored yet; TaylorSeer computes on a fixed schedule (defaults `cache_interval=5`, `disable_cache_before_step=3`) and in between predicts a hooked module's output by extrapolating its last computed outputs: at order 1, the last output plus the per-step difference times the steps elapsed."""
    from diffusers import FirstBlockCacheConfig, TaylorSeerCacheConfig
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook
    from diffusers.hooks.taylorseer_cache import TaylorSeerState

    defaults = TaylorSeerCacheConfig()
    assert (defaults.cache_interval, defaults.disable_cache_before_step) == (5, 3)

    # the head hook's own decision, on residuals whose relative change is exactly 0.25
    model = four_block_flux_transformer()
    model.enable_cache(FirstBlockCacheConfig(threshold=0.2))
    hook = model.transformer_blocks[0]._diffusers_hook.get_hook("fbc_leader_block_hook")
    assert isinstance(hook, FBCHeadBlockHook)
    previous = torch.tensor([[1.0, -2.0, 4.0, -1.0]])  # mean |r_prev| = 2
    change = torch.tensor([[0.5, 0.5, -0.5, 0.5]])  # mean |r - r_prev| = 0.5
    with model.cache_context("cond"):
        assert hook._should_compute_remaining_blocks(previous)  # nothing stored yet
        hook.state_manager.get_state().head_block_residual = previous
        decisions = {}
        for threshold in (0.2, 0.25, 0.3):
            hook.threshold = threshold
            decisions[threshold] = hook._should_compute_remaining_blocks(previous + change)
    assert decisions == {0.2: True, 0.25: False, 0.3: False}
    # order 1: computed at steps 0 and 2, predicted at step 3 = f2 + (f2 - f0) / 2 * 1
    state = TaylorSeerState(taylor_factors_dtype=torch.float32, max_order=1)
    f0, f2 = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 6.0])
    for step, features in [(0, f0), (2, f2)]:
        state.current_step = step
        state.update((features,))
    state.current_step = 3
    torch.testing.assert_close(state.predict()[0], f2 + (f2 - f0) / 2)


def test_first_block_cache_threshold_trades_calls_for_exactness():
    """With `FirstBlockCacheConfig(threshold=0)` a 5-step loop on the tiny Flux transformer runs every block at every step and returns the uncached outputs exactly; with a huge threshold the blocks after the first run at step 1 only, and the outputs of later steps differ from the uncached ones, while a call with step 1's inputs returns step 1's output again (the first block's output plus the stored residual of the rest); outside `cache_context(...)` a cached model raises `ValueError`."""
    from diffusers import FirstBlockCacheConfig

    reference = loop(four_block_flux_transformer())
    for threshold, tail_calls in [(0.0, len(reference)), (1e9, 1)]:
        model = four_block_flux_transformer()
        model.enable_cache(FirstBlockCacheConfig(threshold=threshold))
        calls = []
        model.single_transformer_blocks[-1].attn.register_forward_pre_hook(
            lambda m, a, calls=calls: calls.append(1)
        )
        cached = loop(model)
        assert len(calls) == tail_calls
        if threshold:
            # a call with step 1's inputs: first block now + the tail residual stored at step 1
            inputs = four_block_flux_inputs()
            inputs["timestep"] = torch.tensor([SIGMAS[0]])
            with torch.no_grad(), model.cache_context("cond"):
                again = model(**inputs)[0]
            torch.testing.assert_close(again, reference[0], atol=1e-5, rtol=1e-5)
            with torch.no_grad(), pytest.raises(ValueError, match="No cache context is set"):
                model(**inputs)
        same = [torch.equal(a, b) for a, b in zip(cached, reference, strict=True)]
        assert all(same) if threshold == 0 else (same[0] and not any(same[1:]))


#: ten Euler steps for the cache-family counts
TEN_SIGMAS = [1 - i / 10 for i in range(11)]


def _stored_tensors(model):
    """Every tensor the cache hooks' states hold after a run, deduplicated by identity."""
    seen = {}

    def collect(obj):
        if isinstance(obj, torch.Tensor):
            seen.setdefault(id(obj), obj)
        elif isinstance(obj, (list, tuple)):
            for o in obj:
                collect(o)
        elif isinstance(obj, dict):
            for o in obj.values():
                collect(o)

    for module in model.modules():
        registry = getattr(module, "_diffusers_hook", None)
        for hook in registry.hooks.values() if registry is not None else ():
            manager = getattr(hook, "state_manager", None)
            states = list(manager._state_cache.values()) if manager is not None else []
            states += [hook.state] if hasattr(hook, "state") else []
            for state in states:
                collect(vars(state))
    return list(seen.values())


def _cache_run(config, sigmas=TEN_SIGMAS, seed=None):
    """A 10-step Euler loop of the tiny Flux transformer under ``config`` (None: uncached):
    real attention calls per block (a pre-hook on each ``attn.to_q``, below any cache hook),
    ``Tensor.item`` calls, the tensors the cache holds after the loop, the outputs."""
    model = four_block_flux_transformer()
    calls = {}

    def counter(block):
        calls[block] = 0
        return lambda module, args: calls.__setitem__(block, calls[block] + 1)

    for name, module in model.named_modules():
        if name.endswith(".attn.to_q"):
            module.register_forward_pre_hook(counter(name.removesuffix(".attn.to_q")))
    if config is not None:
        model.enable_cache(config)
    inputs = four_block_flux_inputs()
    latents = inputs.pop("hidden_states")
    if seed is not None:
        latents = torch.randn(latents.shape, generator=torch.Generator().manual_seed(seed))
    inputs.pop("timestep")
    items, item = [], torch.Tensor.item
    outputs = []
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(torch.Tensor, "item", lambda self: items.append(1) or item(self))
        for sigma, sigma_next in itertools.pairwise(sigmas):
            with contextlib.ExitStack() as stack:
                if config is not None:
                    stack.enter_context(model.cache_context("cond"))
                noise_pred = model(hidden_states=latents, timestep=torch.tensor([sigma]), **inputs)[0]  # fmt: skip
            outputs.append(noise_pred)
            latents = latents + (sigma_next - sigma) * noise_pred
    return SimpleNamespace(calls=list(calls.values()), items=len(items), stored=_stored_tensors(model), outputs=outputs)  # fmt: skip


def _pab():
    from diffusers import PyramidAttentionBroadcastConfig

    return PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2,
        spatial_attention_timestep_skip_range=(-1, 1001),
        current_timestep_callback=lambda: 500,
    )


@pytest.fixture(scope="module")
def cache_runs():
    from diffusers import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig

    flat = dict(mag_ratios=torch.ones(10), num_inference_steps=10)
    return {
        "none": _cache_run(None),
        "fbc": _cache_run(FirstBlockCacheConfig(threshold=0.3)),
        "mag": _cache_run(MagCacheConfig(**flat)),
        "mag_other_input": _cache_run(MagCacheConfig(**flat), seed=1),
        "mag_5_of_10": _cache_run(MagCacheConfig(**flat), TEN_SIGMAS[:6]),
        "mag_calibrate": _cache_run(MagCacheConfig(calibrate=True, num_inference_steps=10)),
        "taylorseer": _cache_run(TaylorSeerCacheConfig()),
        "pab": _cache_run(_pab()),
    }


def _accepted_cache_configs():
    """The classes named ``*Config`` that diffusers and ``diffusers.hooks`` export and that
    ``enable_cache`` accepts: each is handed to a fresh tiny Flux transformer as a bare
    instance; one it does not dispatch on raises "is not supported" before anything else."""
    import diffusers
    import diffusers.hooks

    names = {n for module in (diffusers, diffusers.hooks) for n in dir(module) if n.endswith("Config")}  # fmt: skip
    quiet()
    accepted = set()
    for name in sorted(names):
        cls = getattr(diffusers.hooks, name, None) or getattr(diffusers, name)
        if not isinstance(cls, type):
            continue
        try:
            bare = object.__new__(cls)
        except TypeError:  # not a plain Python class: not a cache config
            continue
        try:
            four_block_flux_transformer().enable_cache(bare)
        except ValueError as error:
            if "is not supported" in str(error):
                continue
        except Exception:
            pass
        accepted.add(name)
    return accepted


#: the timestep FasterCache's callback reads in the cache tests
_NOW = [2000]


def _skipping_configs():
    """Each cache config, set to skip on its second call if its state carries over."""
    import diffusers as d

    mag = dict(mag_ratios=torch.ones(10), num_inference_steps=10, retention_ratio=0.0)
    taylor = dict(disable_cache_before_step=1, cache_interval=10, max_order=0)
    # FasterCache always skips at its first in-range iteration, with nothing cached yet: the
    # clock starts out of range (a full call), then moves in (the skip)
    faster = dict(spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(-1, 1001), current_timestep_callback=lambda: _NOW[0], is_guidance_distilled=True)  # fmt: skip
    return {
        "FirstBlockCacheConfig": d.FirstBlockCacheConfig(threshold=1e9),
        "MagCacheConfig": d.MagCacheConfig(**mag),
        "TaylorSeerCacheConfig": d.TaylorSeerCacheConfig(**taylor),
        "PyramidAttentionBroadcastConfig": _pab(),
        "SeaCacheConfig": d.SeaCacheConfig(threshold=10.0),
        "FasterCacheConfig": d.FasterCacheConfig(**faster),
        "TextKVCacheConfig": d.TextKVCacheConfig(),
    }


def _text_call(model, seed, context):
    """One forward with seeded text (different prompts stand for cond and uncond)."""
    inputs = four_block_flux_inputs()
    inputs["encoder_hidden_states"] = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(seed))  # fmt: skip
    with torch.no_grad(), model.cache_context(context) if context else contextlib.nullcontext():
        return model(**inputs)[0]


def test_enable_cache_accepts_exactly_seven_configs():
    """`CacheMixin.enable_cache` in 0.42.1 takes exactly seven config classes, all exported by diffusers: `FasterCacheConfig`, `FirstBlockCacheConfig`, `MagCacheConfig`, `PyramidAttentionBroadcastConfig`, `SeaCacheConfig`, `TaylorSeerCacheConfig` and `TextKVCacheConfig` (every `*Config` diffusers exports, tried on a tiny Flux transformer; each of the seven enables there), there is no TeaCache config, and any other object raises `ValueError`; `TextKVCacheConfig` hooks only `NucleusMoEImageTransformerBlock`s, so on Flux it hooks nothing."""
    import diffusers

    assert _accepted_cache_configs() == set(_skipping_configs())
    assert not [n for n in dir(diffusers) if "teacache" in n.lower()]
    with pytest.raises(ValueError, match="is not supported"):
        four_block_flux_transformer().enable_cache(object())
    hooked = {}
    for name, config in _skipping_configs().items():
        model = four_block_flux_transformer()
        model.enable_cache(config)
        assert model.is_cache_enabled, name
        registries = [
            getattr(m, "_diffusers_hook", None) for m in model.modules() if m is not model
        ]
        hooked[name] = sum(bool(r and r.hooks) for r in registries)  # hooked submodules
    assert hooked.pop("TextKVCacheConfig") == 0 and all(hooked.values())


def _attention_calls(model):
    """A list whose one entry counts the attention calls that really run: a forward pre-hook on
    each block's ``attn.to_q`` (below every cache hook)."""
    calls = [0]
    for block in [*model.transformer_blocks, *model.single_transformer_blocks]:
        block.attn.to_q.register_forward_pre_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_what_each_cache_does_without_cache_context():
    """Not every cache needs `cache_context`: on the tiny Flux transformer a call outside it raises `ValueError` for FirstBlockCache and TaylorSeer; MagCache falls back to one default context of its own (a later call in `cache_context("cond")` starts fresh); SeaCache logs that it needs a context and runs every block; Pyramid Attention Broadcast and FasterCache (`is_guidance_distilled=True`) ignore the context, so a call in `cache_context("uncond")` continues the state of the `"cond"` call and reuses its attention; TextKVCache hooks nothing on Flux and runs every block. Every config `enable_cache` accepts is tried, so a new one fails this test; the attention calls that really run are counted with a forward pre-hook on each block's `attn.to_q`."""
    reference = {seed: _text_call(four_block_flux_transformer(), seed, None) for seed in (1, 2)}
    seen = {}
    for name, config in _skipping_configs().items():
        model = four_block_flux_transformer()
        model.enable_cache(config)
        calls = _attention_calls(model)
        _NOW[0] = 2000
        with logged_messages() as messages:
            try:
                _text_call(model, 1, None)
            except Exception as error:
                seen[name] = type(error).__name__
                continue
            # the next call, in a named context, with other text: fresh state or carried over?
            _NOW[0] = 500
            fresh = torch.equal(_text_call(model, 2, "cond"), reference[2])
        warned = any("requires a cache context" in m for m in messages)
        seen[name] = ("fresh" if fresh else "carried over", calls[0], warned)
    assert (
        seen
        == {  # 4 blocks: 8 attention calls in two calls when nothing is skipped, 4 when all are
            "FirstBlockCacheConfig": "ValueError",
            "TaylorSeerCacheConfig": "ValueError",
            "MagCacheConfig": ("fresh", 8, False),
            "SeaCacheConfig": ("fresh", 8, True),
            "PyramidAttentionBroadcastConfig": ("carried over", 4, False),
            "FasterCacheConfig": ("carried over", 4, False),
            "TextKVCacheConfig": ("fresh", 8, False),
        }
    )
    # inside contexts: "uncond" after "cond" starts fresh except under PAB and FasterCache; a
    # second call in the same context does skip (the configs skip whenever their state carries over)
    for name, config in _skipping_configs().items():
        if name in ("SeaCacheConfig", "TextKVCacheConfig"):
            continue
        model, again = four_block_flux_transformer(), four_block_flux_transformer()
        model.enable_cache(config)
        again.enable_cache(config)
        _NOW[0] = 2000
        _text_call(model, 1, "cond")
        _text_call(again, 1, "cond")
        _NOW[0] = 500
        separate = torch.equal(_text_call(model, 2, "uncond"), reference[2])
        assert separate is (name not in ("PyramidAttentionBroadcastConfig", "FasterCacheConfig")), name  # fmt: skip
        assert not torch.equal(_text_call(again, 2, "cond"), reference[2]), name


def test_faster_cache_runs_in_flux_pipeline_only_guidance_distilled():
    """FasterCache runs on Flux only with `is_guidance_distilled=True`: through a 10-step `FluxPipeline.__call__` of a tiny pipeline, with the default timestep ranges and `current_timestep_callback=lambda: pipe.current_timestep`, block 0's attention computes on 7 of the 10 steps and the latents stay within 0.01 of the uncached run's; with the default `is_guidance_distilled=False` (it expects the unconditional and conditional halves batched in one call) the call raises: `IndexError` at batch 1, `RuntimeError` with `num_images_per_prompt=2`."""
    from diffusers import FasterCacheConfig

    def run(images=1, **faster):
        pipe = tiny_flux_pipeline()
        calls = [0]
        pipe.transformer.transformer_blocks[0].attn.to_q.register_forward_pre_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))  # fmt: skip
        if faster:
            pipe.transformer.enable_cache(FasterCacheConfig(current_timestep_callback=lambda: pipe.current_timestep, **faster))  # fmt: skip
        text, pooled = flux_prompt_embeds()
        with torch.no_grad():
            latents = pipe(prompt_embeds=text[1:], pooled_prompt_embeds=pooled[1:], num_inference_steps=10, num_images_per_prompt=images, height=16, width=16, generator=torch.Generator().manual_seed(0), output_type="latent").images  # fmt: skip
        return latents, calls[0]

    uncached, calls = run()
    assert calls == 10
    cached, calls = run(is_guidance_distilled=True)
    assert calls == 7
    assert 0 < (cached - uncached).abs().max() < 0.01
    with pytest.raises(IndexError):
        run(is_guidance_distilled=False)
    with pytest.raises(RuntimeError):
        run(images=2, is_guidance_distilled=False)


def test_pyramid_attention_broadcast_shares_cond_and_uncond_in_flux_pipeline():
    """Under true CFG, `FluxPipeline` calls its transformer in `cache_context("cond")` and then `cache_context("uncond")`, but Pyramid Attention Broadcast keeps one state for both: with `spatial_attention_block_skip_range=2` the uncond call of a tiny pipeline returns, from every hooked attention, exactly the cond call's output, while without the cache the two differ."""
    from diffusers import PyramidAttentionBroadcastConfig

    def attention_outputs(cached):
        pipe = tiny_flux_pipeline()
        if cached:
            pipe.transformer.enable_cache(PyramidAttentionBroadcastConfig(
                spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(-1, 1001),
                current_timestep_callback=lambda: pipe.current_timestep))  # fmt: skip
        outputs = []
        for name, module in pipe.transformer.named_modules():
            if name.endswith(".attn"):
                module.register_forward_hook(lambda m, a, out: outputs.append(out if isinstance(out, tuple) else (out,)))  # fmt: skip
        text, pooled = flux_prompt_embeds()
        with torch.no_grad():
            pipe(prompt_embeds=text[1:], pooled_prompt_embeds=pooled[1:], negative_prompt_embeds=text[:1],
                 negative_pooled_prompt_embeds=pooled[:1], true_cfg_scale=4.0, num_inference_steps=1,
                 height=16, width=16, generator=torch.Generator().manual_seed(0), output_type="latent")  # fmt: skip
        half = len(outputs) // 2  # one step: the cond call's attentions, then the uncond call's
        return outputs[:half], outputs[half:]

    cond, uncond = attention_outputs(cached=True)
    assert cond and all(torch.equal(a, b) for c, u in zip(cond, uncond, strict=True) for a, b in zip(c, u, strict=True))  # fmt: skip
    cond, uncond = attention_outputs(cached=False)
    assert not all(torch.equal(c[0], u[0]) for c, u in zip(cond, uncond, strict=True))


def test_pab_and_faster_cache_compare_the_timestep_tensor_every_call(monkeypatch):
    """Pyramid Attention Broadcast and FasterCache call `.item()` never, but each hooked attention compares `current_timestep_callback()` with its timestep range on every call: with `lambda: pipe.current_timestep`, the pipeline's timestep tensor, that is a `bool()` of a 0-d tensor in every transformer call of a 4-step `FluxPipeline.__call__` of a tiny pipeline (a host sync where the tensor is on a GPU), while the uncached calls take none."""
    from diffusers import FasterCacheConfig, PyramidAttentionBroadcastConfig

    def syncs(make_config):
        pipe, seen, per_call, owner = tiny_flux_pipeline(), [], [], [None]
        if make_config:
            pipe.transformer.enable_cache(make_config(lambda: pipe.current_timestep))
        pipe.transformer.register_forward_pre_hook(lambda *a: seen.clear())
        pipe.transformer.register_forward_hook(lambda *a: per_call.append(tuple(seen)) and None)
        hooked = [n for n, m in pipe.transformer.named_modules() if n.endswith(".attn") and getattr(getattr(m, "_diffusers_hook", None), "hooks", None)]  # fmt: skip
        for name in hooked:  # which hooked attention is running when a bool() happens
            module = pipe.transformer.get_submodule(name)
            module.register_forward_pre_hook(lambda *a, name=name: owner.__setitem__(0, name))
            module.register_forward_hook(lambda *a: owner.__setitem__(0, None))
        to_bool, item = torch.Tensor.__bool__, torch.Tensor.item
        monkeypatch.setattr(torch.Tensor, "__bool__", lambda t: seen.append(("bool", t.dim(), owner[0])) or to_bool(t))  # fmt: skip
        monkeypatch.setattr(torch.Tensor, "item", lambda t: seen.append(("item", t.dim(), owner[0])) or item(t))  # fmt: skip
        text, pooled = flux_prompt_embeds()
        with torch.no_grad():
            pipe(prompt_embeds=text[1:], pooled_prompt_embeds=pooled[1:], num_inference_steps=4, height=16, width=16, output_type="latent")  # fmt: skip
        monkeypatch.undo()
        return hooked, per_call

    assert syncs(None) == ([], [()] * 4)

    def pab(timestep):
        return PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=2, current_timestep_callback=timestep)  # fmt: skip

    def faster(timestep):
        return FasterCacheConfig(is_guidance_distilled=True, current_timestep_callback=timestep)  # fmt: skip

    for make_config in (pab, faster):
        hooked, per_call = syncs(make_config)
        assert hooked and len(per_call) == 4
        assert all({kind for kind, *_ in call} == {"bool"} and {dim for _, dim, _ in call} == {0} for call in per_call), per_call  # fmt: skip
        # every hooked attention makes a bool() in every call
        assert all(set(hooked) <= {name for *_, name in call} for call in per_call), per_call


def test_seacache_syncs_in_each_call_whose_step_it_may_skip(monkeypatch):
    """SeaCache moves its gate's distance to the host (`float(... .cpu())`, `sea_cache.py` L226) in each call whose step it may skip, the cond and the uncond call alike, one per video in the batch: in an 8-step `WanPipeline.__call__` of a tiny pipeline with CFG (its default `guidance_scale`) and `SeaCacheConfig(threshold=10.0)`, steps 1, 2, 4 and 5 make one `.cpu()` in each of their two calls (two with `num_videos_per_prompt=2`), and the steps it must compute (the first, each after two cached steps, the last) none."""
    from diffusers import SeaCacheConfig

    text = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(0))
    to_cpu = torch.Tensor.cpu

    def syncs_per_step(videos):
        pipe, seen, per_call = tiny_wan_pipeline(), [], []
        pipe.transformer.enable_cache(SeaCacheConfig(threshold=10.0))
        pipe.transformer.register_forward_pre_hook(lambda *a: seen.clear())
        pipe.transformer.register_forward_hook(lambda *a: per_call.append(len(seen)) and None)
        monkeypatch.setattr(torch.Tensor, "cpu", lambda t, *a, **k: seen.append(1) or to_cpu(t, *a, **k))  # fmt: skip
        with torch.no_grad():
            pipe(num_inference_steps=8, height=16, width=16, num_frames=5, output_type="latent", prompt_embeds=text[1:], negative_prompt_embeds=text[:1], num_videos_per_prompt=videos)  # fmt: skip
        monkeypatch.undo()
        return [per_call[i : i + 2] for i in range(0, len(per_call), 2)]  # cond, uncond

    for v in (1, 2):  # Wan's indicator is one tensor per video in the batch
        may_skip = [0, v, v, 0, v, v, 0, 0]  # per step; forced: first, after two cached, last
        assert syncs_per_step(v) == [[n, n] for n in may_skip], v


def test_each_cache_cuts_real_attention_calls(cache_runs):
    """On a 10-step Euler loop of a tiny Flux transformer (2 double- and 2 single-stream blocks; a forward pre-hook on each block's `attn.to_q` counts the attention calls that really run): uncached, every block runs 10 times; `FirstBlockCacheConfig(threshold=0.3)` runs the first block every step and the other three on 4 steps; `MagCacheConfig` with flat `mag_ratios` skips all four blocks, the first included, on 6 steps (`retention_ratio=0.2` protects the first 2, `max_skip_steps=3` forces a compute after 3 skips); `TaylorSeerCacheConfig()` computes each attention on steps 0, 1, 2, 4 and 9 (5 of 10) and `PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=2)` on every other step (5 of 10), whatever the input."""
    assert cache_runs["none"].calls == [10, 10, 10, 10]
    assert cache_runs["fbc"].calls == [10, 4, 4, 4]
    assert cache_runs["mag"].calls == [4, 4, 4, 4]
    assert cache_runs["taylorseer"].calls == [5, 5, 5, 5]
    assert cache_runs["pab"].calls == [5, 5, 5, 5]
    for key in ("fbc", "mag", "taylorseer", "pab"):
        assert not torch.equal(cache_runs[key].outputs[-1], cache_runs["none"].outputs[-1])


def test_what_each_cache_keeps(cache_runs):
    """What each cache holds, read from its hooks' state after the loop (tokens: 16 image, 8 text; width 32): FirstBlockCache five activation-sized tensors (the first block's output, image and text, its image residual, and the residual of the remaining blocks, image and text); MagCache one residual of the image tokens over all blocks, `previous_residual`, dropped when the loop reaches `num_inference_steps`; TaylorSeer `max_order + 1` factors of every hooked attention output, in `taylor_factors_dtype` (bfloat16 by default: 12 tensors here); Pyramid Attention Broadcast the last output of every hooked attention (6 tensors, in the model's dtype)."""
    shapes = lambda run: sorted(tuple(t.shape) for t in run.stored)  # noqa: E731
    image, text, joint = (1, 16, 32), (1, 8, 32), (1, 24, 32)
    assert shapes(cache_runs["fbc"]) == sorted([image, image, image, text, text])
    # mid-loop: previous_residual, plus a reference to this call's input and 0-d accumulators
    mag = [t for t in cache_runs["mag_5_of_10"].stored if t.ndim]
    assert [tuple(t.shape) for t in mag] == [image, image]
    assert all(tuple(t.shape) == image for t in cache_runs["mag"].stored) and len(cache_runs["mag"].stored) == 1  # fmt: skip
    ts = cache_runs["taylorseer"].stored
    assert len(ts) == 12 and {t.dtype for t in ts} == {torch.bfloat16}
    assert shapes(cache_runs["taylorseer"]) == sorted([image, text] * 4 + [joint] * 4)
    pab = cache_runs["pab"].stored
    assert shapes(cache_runs["pab"]) == sorted([image, text] * 2 + [joint] * 2)
    assert {t.dtype for t in pab} == {torch.float32}


def test_taylorseer_default_hooks_flux_attention_and_nothing_on_wan():
    """TaylorSeer reuses each attention output on Flux: the default name patterns match no module of Wan. `TaylorSeerCacheConfig()` hooks exactly the attention modules of the tiny Flux transformer and, though `enable_cache` succeeds, none of a tiny `WanTransformer3DModel` (its attention modules are `blocks.*.attn1` and `blocks.*.attn2`; the patterns must match whole names)."""
    from diffusers import TaylorSeerCacheConfig
    from diffusers.hooks._common import _ATTENTION_CLASSES

    def hooked_and_attention(model):
        model.enable_cache(TaylorSeerCacheConfig())
        modules = dict(model.named_modules())
        hooked = {n for n, m in modules.items() if getattr(m, "_diffusers_hook", None) and m._diffusers_hook.get_hook("taylorseer_cache")}  # fmt: skip
        return hooked, {n for n, m in modules.items() if isinstance(m, _ATTENTION_CLASSES)}

    hooked, attention = hooked_and_attention(four_block_flux_transformer())
    assert hooked == attention and len(attention) == 4
    hooked, attention = hooked_and_attention(tiny_wan_transformer())
    assert attention == {f"blocks.{i}.attn{j}" for i in (0, 1) for j in (1, 2)}
    assert hooked == set()


def test_first_block_cache_pays_a_host_sync_per_call_magcache_none(cache_runs):
    """FirstBlockCache decides from the activations: its head hook calls `.item()` on the relative change once per call after the first (9 in 10 steps; `first_block_cache.py`, `_should_compute_remaining_blocks`), a device-to-host sync on a GPU; MagCache, TaylorSeer and Pyramid Attention Broadcast call `.item()` never while they run: MagCache's decision reads only the calibrated `mag_ratios`, so it skips the same steps for any input; its calibration run (`calibrate=True`) skips nothing and calls `.item()` once per step after the first (`_perform_calibration_step`)."""
    assert cache_runs["fbc"].items == 9
    for key in ("mag", "taylorseer", "pab", "none"):
        assert cache_runs[key].items == 0, key
    assert cache_runs["mag_other_input"].calls == cache_runs["mag"].calls
    assert cache_runs["mag_calibrate"].calls == [10, 10, 10, 10]
    assert cache_runs["mag_calibrate"].items == 9


def test_magcache_needs_calibrated_ratios():
    """`MagCacheConfig()` without `mag_ratios` raises `ValueError` unless `calibrate=True`; diffusers ships a calibrated set, `FLUX_MAG_RATIOS` (28 values, for Flux's default 28 steps), and a config for another step count resamples it to `num_inference_steps` by nearest neighbour."""
    from diffusers import MagCacheConfig
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS, nearest_interp

    with pytest.raises(ValueError, match="mag_ratios"):
        MagCacheConfig()
    assert len(FLUX_MAG_RATIOS) == 28
    four = MagCacheConfig(mag_ratios=FLUX_MAG_RATIOS, num_inference_steps=4).mag_ratios
    assert len(four) == 4 and torch.equal(four, nearest_interp(FLUX_MAG_RATIOS, 4))
    assert four[0] == FLUX_MAG_RATIOS[0] and four[-1] == FLUX_MAG_RATIOS[-1]


def test_seacache_needs_the_step_in_its_context_and_video_latents(monkeypatch):
    """`SeaCacheConfig` extrapolates the block stack's residual from the last two (`residual_order=1` by default) and ships adapters for Wan text-to-video and Cosmos 3 (`enable_cache` gives the root hook Wan's adapter on a tiny `WanTransformer3DModel` with 16 input and output channels, none with the image-to-video layout's 36 input channels or on Flux, and Cosmos 3's on a `Cosmos3OmniTransformer` built on the meta device); it also needs `step_index`, `sigma` and `num_inference_steps` in `cache_context`, which `WanPipeline` passes and `FluxPipeline` does not (the contexts each opens in a 2-step call of a tiny pipeline): on the tiny Flux transformer, inside `cache_context("cond")` as `FluxPipeline` enters it, and with a threshold that would skip almost every step, it runs every block on all 10 steps."""
    from diffusers import SeaCacheConfig
    from diffusers.hooks import sea_cache

    assert SeaCacheConfig().residual_order == 1

    def adapter(model):
        model.enable_cache(SeaCacheConfig())
        callback = model._diffusers_hook.get_hook(
            sea_cache._SEA_CACHE_ROOT_HOOK
        ).raw_vision_callback
        return callback and callback.__name__

    from diffusers import WanTransformer3DModel
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer

    wan = tiny_wan_transformer()
    i2v = WanTransformer3DModel.from_config({**wan.config, "in_channels": 36})
    with torch.device("meta"):
        cosmos = Cosmos3OmniTransformer(num_hidden_layers=2)
    found = [adapter(m) for m in (wan, i2v, four_block_flux_transformer(), cosmos)]
    assert found == ["_prepare_wan_t2v_raw_vision_metadata", None, None, "_prepare_cosmos3_raw_vision_metadata"]  # fmt: skip

    def contexts(pipe, **kwargs):
        opened, original = [], pipe.transformer.cache_context
        monkeypatch.setattr(pipe.transformer, "cache_context", lambda name, **kw: opened.append((name, set(kw))) or original(name, **kw))  # fmt: skip
        with torch.no_grad():
            pipe(num_inference_steps=2, height=16, width=16, output_type="latent", **kwargs)
        return opened

    text = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(0))
    wan = contexts(tiny_wan_pipeline(), prompt_embeds=text[1:], negative_prompt_embeds=text[:1], num_frames=5)  # fmt: skip
    assert wan and all({"step_index", "sigma", "num_inference_steps"} <= kw for _, kw in wan)
    flux_text, pooled = flux_prompt_embeds()
    flux = contexts(tiny_flux_pipeline(), prompt_embeds=flux_text[1:], pooled_prompt_embeds=pooled[1:])  # fmt: skip
    assert flux == [("cond", set())] * 2
    run = _cache_run(SeaCacheConfig(threshold=10.0))
    assert run.calls == [10, 10, 10, 10]
    assert torch.equal(run.outputs[-1], _cache_run(None).outputs[-1])


# ---------------------------------------------------------------- attention and offload


def test_attention_backend_reaches_flux_but_not_the_unet(default_backend):
    """diffusers' `AttentionBackendName` includes `native`, `_native_math`, `flex`, `flash`, `sage` and `xformers`; `set_attention_backend("_native_math")` sets `_attention_backend` on every attention processor of a tiny `FluxTransformer2DModel`, whose output then stays within 1e-5 of the `native` backend's, as it does inside `with attention_backend("_native_math"):`; the UNet's `AttnProcessor2_0` has no such attribute, so the setting does not reach it."""
    from diffusers.models.attention_dispatch import AttentionBackendName, attention_backend

    names = {b.value for b in AttentionBackendName}
    assert {"native", "_native_math", "flex", "flash", "sage", "xformers"} <= names
    model = four_block_flux_transformer()
    reference = run_four_block_flux(model)

    with attention_backend("_native_math"):
        assert (run_four_block_flux(model) - reference).abs().max() <= 1e-5
    model.set_attention_backend("_native_math")
    processors = list(model.attn_processors.values())
    assert processors and all(str(p._attention_backend) for p in processors)
    assert {p._attention_backend.value for p in processors} == {"_native_math"}
    assert (run_four_block_flux(model) - reference).abs().max() <= 1e-5
    unet_processors = tiny_unet().attn_processors.values()
    assert all(not hasattr(p, "_attention_backend") for p in unet_processors)


def test_attention_backend_context_yields_to_a_set_backend(monkeypatch, default_backend):
    """`with attention_backend(name):` changes only the process-wide default: a tiny Flux transformer whose processors were given `_native_math` by `set_attention_backend` keeps calling SDPA with the math kernel alone inside `attention_backend("native")`, while a fresh transformer follows the context (every SDPA kernel enabled)."""
    from diffusers.models.attention_dispatch import attention_backend

    pinned, fresh = four_block_flux_transformer(), four_block_flux_transformer()
    pinned.set_attention_backend("_native_math")
    seen = sdpa_kernels_seen(monkeypatch)
    with attention_backend("native"):
        run_four_block_flux(pinned)
        pinned_kernels, seen[:] = list(seen), []
        run_four_block_flux(fresh)
    assert pinned_kernels and all(k == {"math"} for k in pinned_kernels)
    assert seen and all(k == {"flash", "efficient", "math", "cudnn"} for k in seen)


def test_sd3_processor_calls_sdpa_itself_and_gpu_kernels_are_refused(monkeypatch, default_backend):
    """SD3's transformer ignores the backend setting: a tiny `SD3Transformer2DModel` calls SDPA with every kernel enabled even inside `attention_backend("_native_math")`, and its output is bit-identical to the default's; on this CPU machine `attention_backend("flash")`, `"sage"` and `"xformers"` are refused because their packages are missing: those kernels are not run here."""
    from diffusers import SD3Transformer2DModel
    from diffusers.models.attention_dispatch import attention_backend

    torch.manual_seed(0)
    sd3 = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=16).eval()  # fmt: skip
    g = torch.Generator().manual_seed(0)
    inputs = dict(hidden_states=torch.randn(1, 4, 8, 8, generator=g), encoder_hidden_states=torch.randn(1, 6, 16, generator=g), pooled_projections=torch.randn(1, 16, generator=g), timestep=torch.tensor([500]))  # fmt: skip
    seen = sdpa_kernels_seen(monkeypatch)
    with torch.no_grad():
        before = sd3(**inputs).sample
        with attention_backend("_native_math"):
            after = sd3(**inputs).sample
    assert len(seen) == 2 and all(s == {"flash", "efficient", "math", "cudnn"} for s in seen)
    assert torch.equal(before, after)
    for name, package in [("flash", "flash-attn"), ("sage", "sageattention"), ("xformers", "xformers")]:  # fmt: skip
        with pytest.raises(RuntimeError, match=package), attention_backend(name):
            pass


def test_ring_attention_gathers_then_merges_by_log_sum_exp(monkeypatch):
    """diffusers' `TemplatedRingAttention.forward`, run for each rank of a simulated 2-device ring on the CPU, gathers the key/value shards with one `all_gather_tensor` per rank and merges the partial outputs of the two shards as `out = prev_out - sigmoid(lse - prev_lse) * (prev_out - out)`: the result equals whole-sequence attention, while averaging the two partial outputs does not."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, 2, 8, generator=g) for _ in range(3))  # (B, N, heads, d)
    outs, gathers, partials = simulated_ring(q, k, v, 2, monkeypatch)
    assert gathers == 2
    full = torch.nn.functional.scaled_dot_product_attention(*(x.permute(0, 2, 1, 3) for x in (q, k, v))).permute(0, 2, 1, 3)  # fmt: skip
    assert (torch.cat(outs, dim=1) - full).abs().max() <= 1e-5
    for rank, out in enumerate(outs):
        (_, prev_out, prev_lse), (_, part, lse) = [(r, o, x.unsqueeze(-1)) for r, o, x in partials if r == rank]  # fmt: skip
        merged = prev_out - torch.sigmoid(lse - prev_lse) * (prev_out - part)
        torch.testing.assert_close(out, merged)
        assert ((prev_out + part) / 2 - out).abs().max() > 0.01


def test_group_offload_onloads_every_group_each_call_and_changes_no_number(
    monkeypatch, default_backend
):
    """`enable_group_offload(..., offload_type="block_level", num_blocks_per_group=1)` (CPU to CPU) onloads every block group plus one group for the rest on every forward (5 for the tiny transformer's 4 blocks, twice for two calls), and the output is bit-identical to the model without offloading."""
    reference = run_four_block_flux(four_block_flux_transformer())
    model = four_block_flux_transformer()
    model.enable_group_offload(onload_device=torch.device("cpu"), offload_device=torch.device("cpu"), offload_type="block_level", num_blocks_per_group=1)  # fmt: skip
    for _ in range(2):
        onloads, _ = count_transfers(model, monkeypatch)
        assert len(onloads) == 5
    assert torch.equal(run_four_block_flux(model), reference)


def test_what_group_offload_copies_back(tmp_path, monkeypatch, default_backend):
    """`enable_group_offload(offload_type="block_level")` without streams copies each group back after use (`module.to(offload_device)`); with `offload_to_disk_path` it copies nothing back and reads each group from its file again; `use_stream=True` offloads the block groups by pointing their weights back at the pinned CPU copy, but the unmatched group gets no stream, so it is still onloaded and copied back synchronously every call: on the tiny Flux transformer, the bytes `.to()` moves back in the groups' `offload_` in one call (after a first call), all the weights, none, and exactly the unmatched group's (the stream path simulated on the CPU with a stand-in stream and `pin_memory` as identity)."""
    import safetensors.torch
    from diffusers.hooks.group_offloading import ModuleGroup

    cpu = torch.device("cpu")
    weights = sum(t.numel() * t.element_size() for t in four_block_flux_transformer().parameters())
    back, reads = {}, []
    for case in ("memory", "disk", "stream"):
        model = four_block_flux_transformer()
        if case == "stream":
            unmatched, _ = simulated_stream_offload(model, monkeypatch)
        else:
            disk = tmp_path if case == "disk" else None
            model.enable_group_offload(onload_device=cpu, offload_device=cpu, offload_type="block_level", num_blocks_per_group=1, offload_to_disk_path=disk)  # fmt: skip
        run_four_block_flux(model)
        spy = pytest.MonkeyPatch()
        load_file = safetensors.torch.load_file
        spy.setattr(safetensors.torch, "load_file", lambda *a, case=case, load=load_file, **k: reads.append(case) or load(*a, **k))  # fmt: skip
        with traffic(model, spy, [(ModuleGroup, "onload_")], [(ModuleGroup, "offload_")]) as moved:
            run_four_block_flux(model)
        back[case] = moved["to_host"]
    own = {id(t): t for m in unmatched.modules for t in m.parameters()}
    assert back == {"memory": weights, "disk": 0, "stream": sum(t.numel() * t.element_size() for t in own.values())}  # fmt: skip
    assert 0 < back["stream"] < weights and reads == ["disk"] * 5  # 4 block groups + the rest


def test_disk_offload_writes_the_files_when_the_hooks_are_installed(tmp_path):
    """`enable_group_offload` writes each group to a safetensors file when it installs the hooks, before any call; after that, offloading swaps in empty CPU tensors: on the tiny Flux transformer (`block_level`, one block per group, `offload_to_disk_path`) all 5 groups' files (4 blocks and the modules outside them) exist right after `enable_group_offload` returns, every parameter then holds a new uninitialized CPU tensor of its shape (`torch.empty_like`, not the weights), and the first call still matches the model without offloading within 1e-6."""
    reference = run_four_block_flux(four_block_flux_transformer())
    model = four_block_flux_transformer()
    cpu = torch.device("cpu")
    before = [
        p.data for p in model.parameters()
    ]  # kept alive, so no new tensor reuses their memory
    model.enable_group_offload(onload_device=cpu, offload_device=cpu, offload_type="block_level", num_blocks_per_group=1, offload_to_disk_path=tmp_path)  # fmt: skip
    assert len(list(tmp_path.glob("*.safetensors"))) == 5  # before any call
    for old, p in zip(before, model.parameters(), strict=True):  # `torch.empty_like` on the CPU
        assert p.device == cpu and p.shape == old.shape and p.data_ptr() != old.data_ptr()
    torch.testing.assert_close(run_four_block_flux(model), reference, rtol=0, atol=1e-6)


def test_flux_pipeline_calls_its_transformer_28_times_by_default():
    """Flux.1-dev's transformer runs 28 times per image by default: a tiny `FluxPipeline` called without `num_inference_steps` (nor `true_cfg_scale`) calls its transformer 28 times, one call per step, each on a batch of one image (a forward pre-hook counts them; the blocks are replaced by a zero output to keep it fast); with `true_cfg_scale=2` and a negative prompt it makes two calls per step, 56."""
    pipe, calls = tiny_flux_pipeline(), []
    pipe.transformer.register_forward_pre_hook(lambda m, args, kwargs: calls.append(kwargs["hidden_states"].shape[0]), with_kwargs=True)  # fmt: skip
    # only the calls are counted: a zero velocity in place of the blocks keeps 84 calls cheap
    pipe.transformer.forward = lambda hidden_states, **kwargs: (torch.zeros_like(hidden_states),)
    text, pooled = flux_prompt_embeds()
    run = dict(prompt_embeds=text[1:], pooled_prompt_embeds=pooled[1:], height=16, width=16, output_type="latent")  # fmt: skip
    with torch.no_grad():
        pipe(**run)
        assert calls == [1] * 28
        calls.clear()
        pipe(**run, negative_prompt_embeds=text[:1], negative_pooled_prompt_embeds=pooled[:1], true_cfg_scale=2.0)  # fmt: skip
    assert calls == [1] * 56


def test_true_cfg_doubles_group_offload_traffic_not_model_offloads(monkeypatch):
    """The group-offload figures per step assume one transformer call per step; `FluxPipeline`'s true CFG (`true_cfg_scale > 1` with a negative prompt) makes two, doubling the bytes they move, while model offload still moves the transformer once per `pipe(...)` call: in a 2-step call of a tiny `FluxPipeline`, block-level group offload (one block per group) onloads twice as many groups with true CFG as without, and under `enable_model_cpu_offload` the transformer's hook, replayed with the meta device as the accelerator, moves it to the device and back once either way (2 or 4 transformer calls), also with `num_images_per_prompt=2`."""
    from diffusers.hooks.group_offloading import ModuleGroup

    text, pooled = flux_prompt_embeds()
    plain = dict(prompt_embeds=text[1:], pooled_prompt_embeds=pooled[1:], num_inference_steps=2, height=16, width=16, output_type="latent")  # fmt: skip
    cfg = dict(plain, negative_prompt_embeds=text[:1], negative_pooled_prompt_embeds=pooled[:1], true_cfg_scale=2.0)  # fmt: skip
    onloads, onload = [], ModuleGroup.onload_
    monkeypatch.setattr(ModuleGroup, "onload_", lambda group: onloads.append(group) or onload(group))  # fmt: skip
    counts, cpu = [], torch.device("cpu")
    for run in (plain, cfg):
        pipe = tiny_flux_pipeline()
        pipe.transformer.enable_group_offload(onload_device=cpu, offload_device=cpu, offload_type="block_level", num_blocks_per_group=1)  # fmt: skip
        onloads.clear()
        with torch.no_grad():
            pipe(**run)
        counts.append(len(onloads))
    monkeypatch.undo()
    assert counts[0] > 0 and counts[1] == 2 * counts[0]
    for run, calls in ((plain, 2), (cfg, 4), (dict(plain, num_images_per_prompt=2), 2)):
        forwards = hooked_forwards(tiny_flux_pipeline(), monkeypatch, **run)
        assert [name for name, _ in forwards].count("transformer") == calls
        crossings, _ = replay_model_offload(forwards, monkeypatch)
        assert crossings["transformer"] == 2  # to the device once, back once


def test_offload_schedules_in_the_source(monkeypatch):
    """`FluxPipeline.model_cpu_offload_seq` is `"text_encoder->text_encoder_2->image_encoder->transformer->vae"`; `enable_model_cpu_offload` hooks the components present in that order with accelerate's `cpu_offload_with_hook`, each handed the previous one's hook, and that hook, before its component's forward, offloads the previous component and moves its own to the execution device; `enable_sequential_cpu_offload` hooks every module that owns parameters with accelerate's `cpu_offload` (tiny pipelines, CPU as the device; the move is shown on the meta device); `use_stream=True` needs an accelerator (a `ValueError` on the CPU); a UNet's `mid_block` is not in a `ModuleList`, so `block_level` keeps it in the group of modules outside the block lists."""
    import accelerate
    from accelerate.hooks import CpuOffload, UserCpuOffloadHook
    from diffusers import FluxPipeline
    from diffusers.hooks import HookRegistry

    assert FluxPipeline.model_cpu_offload_seq == "text_encoder->text_encoder_2->image_encoder->transformer->vae"  # fmt: skip
    pipe, chained, original = tiny_flux_pipeline(), [], accelerate.cpu_offload_with_hook

    def cpu_offload_with_hook(model, device=None, prev_module_hook=None):
        chained.append((model, prev_module_hook))
        return original(model, device, prev_module_hook=prev_module_hook)

    monkeypatch.setattr(accelerate, "cpu_offload_with_hook", cpu_offload_with_hook)
    pipe.enable_model_cpu_offload(device="cpu")
    monkeypatch.undo()
    (transformer, first), (vae, prev) = chained  # no text encoders in the tiny pipeline
    assert (transformer, vae, first) == (pipe.transformer, pipe.vae, None)
    assert prev.model is pipe.transformer
    # the hook's move, with the meta device standing in for the accelerator
    offloaded, layer = [], torch.nn.Linear(4, 4)
    previous = UserCpuOffloadHook(torch.nn.Linear(4, 4).to("meta"), SimpleNamespace(init_hook=offloaded.append))  # fmt: skip
    CpuOffload(execution_device=torch.device("meta"), prev_module_hook=previous).pre_forward(layer, torch.ones(4))  # fmt: skip
    assert offloaded == [previous.model] and layer.weight.device.type == "meta"
    sd = tiny_sd_pipeline()
    owners = {n for n, m in sd.unet.named_modules() if any(True for _ in m.parameters(recurse=False))}  # fmt: skip
    sd.enable_sequential_cpu_offload(device="cpu")
    assert {n for n, m in sd.unet.named_modules() if hasattr(m, "_hf_hook")} == owners | {""}
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="streams"):
        four_block_flux_transformer().enable_group_offload(onload_device=cpu, offload_device=cpu, offload_type="block_level", num_blocks_per_group=1, use_stream=True)  # fmt: skip
    unet = tiny_unet()
    assert not isinstance(unet.mid_block, torch.nn.ModuleList)
    unet.enable_group_offload(onload_device=cpu, offload_device=cpu, offload_type="block_level", num_blocks_per_group=1)  # fmt: skip
    group = HookRegistry.check_if_exists_or_initialize(unet).get_hook("group_offloading").group
    assert unet.mid_block in group.modules
