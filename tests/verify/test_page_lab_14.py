"""Lab 14 (precision and quantization) against torch's dtypes, the `gguf` package and diffusers.

The starter's NumPy rounding and GGUF block code are compared with torch's casts and with
the `gguf` package byte for byte; the fp16 VAE overflow and its fixes run on the real
``AutoencoderKL``, ``StableDiffusionXLPipeline`` and ``StableDiffusionPipeline`` classes
with tiny random configs (``tiny.py``), and the quantization API is read from diffusers.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sizes import layerwise_casting_record
from tiny import (
    embeds,
    euler_sdxl_pipeline,
    overflowing_vae,
    quiet,
    run_starter,
    sdxl_call,
    start_latents,
    tiny_flux_pipeline,
    tiny_sd_pipeline,
    tiny_unet,
    tiny_vae,
)

gguf = pytest.importorskip("gguf", reason="the verify extra includes gguf")

LAB14 = "code/lab-14-precision-and-quantization/precision_quantization.py"


@pytest.fixture(scope="module")
def starter():
    return run_starter(LAB14)


def test_numpy_rounding_matches_torch_casts():
    """`labkit.precision.round_to`, the one emulation the labs share, rounds float32 values exactly as torch 2.13.0's CPU casts to `torch.bfloat16`, `torch.float16`, `torch.float8_e4m3fn` and `torch.float8_e5m2` do, on 100,000 random values and the edge cases: ties to even, subnormals, fp16 and e5m2 overflowing to inf, and `float8_e4m3fn` saturating at ±448, even for inf (a plain cast's saturation depends on the torch version and device; this is the one checked)."""
    from labkit.precision import round_to

    assert torch.__version__.split("+")[0] == "2.13.0" and not torch.cuda.is_available()
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0)) * 300.0
    edges = [1 + 2**-8, 1 + 3 * 2**-8, 2.0**-9, 2.0**-10, 2.0**-17, 448.0, 464.0, 470.0, 1e6,
             65504.0, 65519.0, 65520.0, 57344.0, 61440.0, 3.4e38, float("inf"), -float("inf")]  # fmt: skip
    x = torch.cat([x, torch.tensor(edges), -torch.tensor(edges)])
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16,
              "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}  # fmt: skip
    for name, dtype in dtypes.items():
        expected = x.to(dtype).to(torch.float64).numpy()
        np.testing.assert_array_equal(round_to(x.double().numpy(), name), expected, err_msg=name)
    assert x.new_tensor([float("inf")]).to(torch.float8_e4m3fn).item() == 448.0
    assert x.new_tensor([1e6]).to(torch.float8_e5m2).item() == float("inf")


def test_format_limits_match_torch_finfo(starter):
    """The largest value, smallest normal and ulp at 1 that `labkit.precision.format_limits` (which the starter imports) derives from exponent and mantissa bits equal `torch.finfo` for float32, float16 (max 65504), bfloat16, float8_e4m3fn (max 448) and float8_e5m2 (max 57344), and so do the bytes per element."""
    from labkit import precision

    assert starter["format_limits"] is precision.format_limits
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
              "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}  # fmt: skip
    for name, dtype in dtypes.items():
        top, normal, _, ulp, nbytes = precision.format_limits(name)
        info = torch.finfo(dtype)
        assert (top, normal, ulp) == (info.max, info.tiny, info.eps), name
        assert nbytes == torch.empty(0, dtype=dtype).element_size()


def test_tiny_vae_overflows_in_float16_only():
    """A tiny `AutoencoderKL` whose `decoder.conv_in` is scaled by 1e5 has a decoder activation past 65504 in float32; decoded in float16, every output pixel is NaN, while bfloat16 and float32 decode finite images (bfloat16 within 0.05 of float32)."""
    quiet()
    vae = overflowing_vae()
    z = start_latents()  # (1, 4, 8, 8)
    peaks = []
    hooks = [m.register_forward_hook(lambda m, i, o: peaks.append(o.abs().max().item()))
             for m in vae.decoder.modules() if isinstance(m, torch.nn.Conv2d)]  # fmt: skip
    with torch.no_grad():
        reference = vae.decode(z).sample
    for h in hooks:
        h.remove()
    assert 65504 < max(peaks) < 1e7 and torch.isfinite(reference).all()
    out = {}
    for dtype in (torch.bfloat16, torch.float16):
        with torch.no_grad():
            out[dtype] = vae.to(dtype).decode(z.to(dtype)).sample.float()
    assert torch.isnan(out[torch.float16]).all()
    assert torch.isfinite(out[torch.bfloat16]).all()
    assert (out[torch.bfloat16] - reference).abs().max().item() < 0.05


def test_sdxl_force_upcast_decodes_in_float32(record_calls):
    """In a float16 `StableDiffusionXLPipeline` whose VAE has `force_upcast=True` (the `AutoencoderKL` default), `__call__` calls the deprecated `upcast_vae()` (a `FutureWarning` that says to use `pipe.vae.to(torch.float32)`), the decoder receives float32 latents, the VAE is float16 again afterwards, and the overflowing tiny VAE's images are finite."""
    quiet()
    pipe = euler_sdxl_pipeline(overflowing_vae(force_upcast=True)).to(torch.float16)
    decoder = record_calls(pipe.vae.decoder)
    with pytest.warns(FutureWarning, match=r"upcast_vae.*vae\.to\(torch\.float32\)"):
        images = sdxl_call(pipe, torch.float16, output_type="np")
    assert decoder.calls[0][0][0].dtype == torch.float32
    assert pipe.vae.dtype == torch.float16
    assert np.isfinite(images).all()


def test_sdxl_without_force_upcast_gives_nan(record_calls):
    """With `vae.config.force_upcast=False` the same float16 `StableDiffusionXLPipeline` decodes in float16, and every pixel of the tiny overflowing VAE's output is NaN."""
    quiet()
    pipe = euler_sdxl_pipeline(overflowing_vae(force_upcast=False)).to(torch.float16)
    decoder = record_calls(pipe.vae.decoder)
    images = sdxl_call(pipe, torch.float16, output_type="np")
    assert decoder.calls[0][0][0].dtype == torch.float16
    assert np.isnan(images).all()


def test_vae_to_float32_alone_fails_inside_the_sdxl_call(monkeypatch):
    """`pipe.vae.to(torch.float32)` on an otherwise float16 `StableDiffusionXLPipeline` is not enough inside `__call__`: the pipeline casts the latents only when it upcasts itself (and casts the VAE to the latents' dtype only when Apple MPS is available, which undoes the fix: NaN images), so float16 latents meet float32 weights and the decode raises a dtype `RuntimeError`. With `output_type="latent"` and a float32 decode by hand, the image is finite."""
    quiet()
    pipe = euler_sdxl_pipeline(overflowing_vae(force_upcast=True)).to(torch.float16)
    pipe.vae.to(torch.float32)
    with pytest.raises(RuntimeError, match="should be the same"):
        sdxl_call(pipe, torch.float16, output_type="np")
    latents = sdxl_call(pipe, torch.float16, output_type="latent")
    assert latents.dtype == torch.float16
    with torch.no_grad():
        image = pipe.vae.decode(latents.float() / pipe.vae.config.scaling_factor).sample
    assert torch.isfinite(image).all()
    # where MPS is available (stood in for here), the call casts the VAE back to float16
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    images = sdxl_call(pipe, torch.float16, output_type="np")
    assert pipe.vae.dtype == torch.float16 and np.isnan(images).all()


def test_bfloat16_pipeline_needs_no_upcast(record_calls):
    """A whole `StableDiffusionXLPipeline` in bfloat16 never upcasts (`needs_upcasting` tests for float16 only): the decoder runs in bfloat16 and the overflowing tiny VAE's images are finite."""
    quiet()
    pipe = euler_sdxl_pipeline(overflowing_vae(force_upcast=True)).to(torch.bfloat16)
    decoder = record_calls(pipe.vae.decoder)
    images = sdxl_call(pipe, torch.bfloat16, output_type="np")
    assert decoder.calls[0][0][0].dtype == torch.bfloat16
    assert np.isfinite(images).all()


def test_sd15_pipeline_never_reads_force_upcast(record_calls):
    """`StableDiffusionPipeline` (SD 1.x) never reads `force_upcast`: in float16 it decodes in float16, and the overflowing tiny VAE gives NaN images even with `force_upcast=True`."""
    quiet()
    pipe = tiny_sd_pipeline(vae=overflowing_vae(force_upcast=True)).to(torch.float16)
    assert pipe.vae.config.force_upcast is True
    decoder = record_calls(pipe.vae.decoder)
    images = pipe(prompt_embeds=embeds(0).half(), latents=start_latents().half(),
                  num_inference_steps=2, guidance_scale=1.0, output_type="np").images  # fmt: skip
    assert decoder.calls[0][0][0].dtype == torch.float16
    assert np.isnan(images).all()


def test_nan_images_come_out_black():
    """`VaeImageProcessor.postprocess` keeps NaN through its clamp to [0, 1], and the uint8 cast behind `output_type="pil"` turns NaN into 0 on this machine (x86-64): a black image."""
    from diffusers.image_processor import VaeImageProcessor

    nan = torch.full((1, 3, 4, 4), float("nan"))
    processor = VaeImageProcessor()
    assert np.isnan(processor.postprocess(nan, output_type="np")).all()
    # NumPy warns when it casts NaN to uint8: provoked on purpose, it is the claim
    with pytest.warns(RuntimeWarning, match="invalid value encountered in cast"):
        image = processor.postprocess(nan, output_type="pil")[0]
    assert np.asarray(image).max() == 0


def test_force_upcast_default_and_the_fp16_fix(record_calls):
    """`AutoencoderKL`'s `force_upcast` defaults to `True`; a VAE whose decoder activations stay below 65504, which is what an fp16-fixed VAE such as `madebyollin/sdxl-vae-fp16-fix` is fine-tuned for, can set it to `False`: a float16 `StableDiffusionXLPipeline` then decodes in float16, with no upcast and finite images (the tiny VAE without the overflowing scale)."""
    import warnings

    quiet()
    assert tiny_vae().config.force_upcast is True
    vae = tiny_vae()
    vae.register_to_config(force_upcast=False)
    pipe = euler_sdxl_pipeline(vae).to(torch.float16)
    decoder = record_calls(pipe.vae.decoder)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # upcast_vae() would warn
        images = sdxl_call(pipe, torch.float16, output_type="np")
    assert decoder.calls[0][0][0].dtype == torch.float16
    assert np.isfinite(images).all()


def test_numpy_gguf_blocks_equal_the_gguf_package(starter):
    """The starter's NumPy `quantize` writes, byte for byte, the blocks of the `gguf` package's `gguf.quants.quantize` for Q8_0 and Q4_0 (`GGML_QUANT_SIZES`: 32 values in 34 and 18 bytes), on weights spanning five orders of magnitude and on all-zero and constant blocks; the starter's `dequantize` equals `gguf.quants.dequantize`."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 256)) * rng.choice([1e-3, 1.0, 100.0], size=(64, 1))).astype(np.float32)  # fmt: skip
    w[0, :32], w[1, :32], w[2, :32] = 0.0, 5.0, -5.0
    for name, size in (("Q8_0", (32, 34)), ("Q4_0", (32, 18))):
        qtype = getattr(GGMLQuantizationType, name)
        assert GGML_QUANT_SIZES[qtype] == size
        ours, theirs = starter["quantize"](w, name), gguf.quants.quantize(w, qtype)
        assert ours.dtype == theirs.dtype == np.uint8
        np.testing.assert_array_equal(ours, theirs, err_msg=name)
        np.testing.assert_array_equal(starter["dequantize"](ours, name), gguf.quants.dequantize(theirs, qtype))  # fmt: skip


def test_diffusers_dequantizers_decode_the_numpy_blocks(starter):
    """diffusers' own GGUF dequantizers (`dequantize_functions` in `diffusers.quantizers.gguf.utils`) decode the starter's Q8_0 and Q4_0 bytes to exactly the starter's values when called with `dtype=torch.float32`; `dequantize_gguf_tensor`, the path `GGUFLinear` uses, leaves `dtype` unset and computes `d * q` in float16, so there each weight is the float32 value rounded to fp16."""
    from diffusers.quantizers.gguf.utils import (
        GGML_QUANT_SIZES,
        GGUFParameter,
        dequantize_functions,
        dequantize_gguf_tensor,
    )
    from gguf import GGMLQuantizationType

    w = starter["weight"]  # (256, in) float32
    for name in ("Q8_0", "Q4_0"):
        qtype = getattr(GGMLQuantizationType, name)
        packed = starter["quantize"](w, name)
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        blocks = torch.from_numpy(packed.reshape(-1, type_size))
        ours = starter["dequantize"](packed, name)
        theirs = dequantize_functions[qtype](blocks, block_size, type_size, torch.float32)
        np.testing.assert_array_equal(theirs.reshape(w.shape).numpy(), ours)
        runtime = dequantize_gguf_tensor(GGUFParameter(torch.from_numpy(packed), quant_type=qtype))
        assert runtime.dtype == torch.float16 and runtime.shape == w.shape
        np.testing.assert_array_equal(runtime.numpy(), ours.astype(np.float16))


def test_a_gguf_file_of_the_numpy_blocks_loads_in_diffusers(starter, tmp_path):
    """A `.gguf` file written by the `gguf` package's `GGUFWriter` from the starter's Q8_0 and Q4_0 bytes loads through diffusers' `load_state_dict` (the reader behind `from_single_file`) as `GGUFParameter`s holding the same bytes, with `quant_type` set and the logical shape `(out, in)` as `quant_shape`; a `GGUFLinear` given the loaded Q4_0 parameter computes `x @ W.T` with the starter's dequantized weight."""
    from diffusers.models.model_loading_utils import load_state_dict
    from diffusers.quantizers.gguf.utils import GGUFParameter
    from gguf import GGMLQuantizationType

    w = starter["weight"]
    packed = {name: starter["quantize"](w, name) for name in ("Q8_0", "Q4_0")}
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "flux")
    for name, blocks in packed.items():
        writer.add_tensor(f"{name}.weight", blocks, raw_dtype=getattr(GGMLQuantizationType, name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    state_dict = load_state_dict(str(path))
    for name, blocks in packed.items():
        param = state_dict[f"{name}.weight"]
        assert isinstance(param, GGUFParameter)
        assert param.quant_type == getattr(GGMLQuantizationType, name)
        assert tuple(param.quant_shape) == w.shape
        np.testing.assert_array_equal(param.as_tensor().numpy(), blocks)
    # and GGUFLinear runs on the parameter read from the file: d * q in fp16, then F.linear
    from diffusers.quantizers.gguf.utils import GGUFLinear

    layer = GGUFLinear(w.shape[1], w.shape[0], bias=False, compute_dtype=torch.float32)
    layer.weight = state_dict["Q4_0.weight"]
    x = torch.from_numpy(starter["x"][:4])
    expected = x @ torch.from_numpy(starter["dequantize"](packed["Q4_0"], "Q4_0").astype(np.float16)).float().T  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-5)


def test_from_single_file_replaces_every_linear_not_in_f32_or_f16(starter, tmp_path):
    """GGUF checkpoints are loaded pre-quantized from a `.gguf` file with `from_single_file` and `GGUFQuantizationConfig(compute_dtype=torch.bfloat16)`, which on a tiny Flux transformer's file puts `GGUFLinear` in place of every `nn.Linear` whose weight the file holds in a type other than F32 or F16, quantized or BF16, and leaves the F32 and F16 ones plain: the tiny four-block Flux transformer written by the `gguf` package with the starter's Q8_0 blocks for each Linear weight whose rows divide into blocks of 32 (but the first block's `attn.to_q` in BF16, an unquantized type that still becomes a `GGUFLinear`), `proj_out` in F16 and the rest in F32, loaded back with `FluxTransformer2DModel.from_single_file(path, config=dir, quantization_config=...)`; its bfloat16 output stays within 2% of the unquantized model's."""
    from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig
    from diffusers.quantizers.gguf.utils import GGUFLinear
    from gguf import GGMLQuantizationType
    from tiny import four_block_flux_transformer

    model = four_block_flux_transformer()
    model.save_pretrained(tmp_path)  # the config from_single_file reads
    writer, kept = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), "flux"), set()
    for key, value in model.state_dict().items():
        w = value.float().numpy()
        if key == "proj_out.weight":
            writer.add_tensor(key, w.astype(np.float16))  # stored F16
        elif key == "transformer_blocks.0.attn.to_q.weight":  # BF16: not quantized, yet wrapped
            writer.add_tensor(key, gguf.quants.quantize(w, GGMLQuantizationType.BF16), raw_dtype=GGMLQuantizationType.BF16)  # fmt: skip
            continue
        elif w.ndim == 2 and w.shape[1] % 32 == 0:
            writer.add_tensor(key, starter["quantize"](w, "Q8_0"), raw_dtype=GGMLQuantizationType.Q8_0)  # fmt: skip
            continue
        else:
            writer.add_tensor(key, w)  # stored F32
        kept.add(key.removesuffix(".weight"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config = GGUFQuantizationConfig(compute_dtype=torch.bfloat16)
    loaded = FluxTransformer2DModel.from_single_file(str(tmp_path / "tiny.gguf"), config=str(tmp_path), quantization_config=config)  # fmt: skip
    linears = {n: type(m) for n, m in loaded.named_modules() if isinstance(m, torch.nn.Linear)}
    assert {n for n, cls in linears.items() if cls is torch.nn.Linear} == kept & set(linears)
    assert {"proj_out", "x_embedder"} <= kept  # one F16, one F32 whose rows do not divide by 32
    assert {n for n, cls in linears.items() if cls is GGUFLinear} == set(linears) - kept
    assert len(set(linears) - kept) > 30
    assert loaded.transformer_blocks[0].attn.to_q.weight.quant_type == GGMLQuantizationType.BF16
    with torch.no_grad():
        y = loaded(**_bf16_inputs())[0].float()
        y_ref = model.to(torch.bfloat16)(**_bf16_inputs())[0].float()
    assert ((y - y_ref).norm() / y_ref.norm()).item() < 0.02


def test_gguf_linear_dequantizes_on_every_call(starter, monkeypatch):
    """Unless `DIFFUSERS_GGUF_CUDA_KERNELS` is `true`, `1` or `yes` (and a CUDA GPU is present), `GGUFLinear.forward` takes `forward_native`, which dequantizes the whole weight on every forward and then runs `F.linear` in `compute_dtype`: two calls make two dequantizations, and the output equals `x @ W.T` with the dequantized `W`."""
    import os

    import diffusers.quantizers.gguf.utils as gguf_utils
    from gguf import GGMLQuantizationType

    assert os.environ.get("DIFFUSERS_GGUF_CUDA_KERNELS") is None
    assert gguf_utils.can_use_cuda_kernels is False and gguf_utils.ops is None
    w = starter["weight"]
    packed = starter["quantize"](w, "Q4_0")
    layer = gguf_utils.GGUFLinear(w.shape[1], w.shape[0], bias=False, compute_dtype=torch.float32)
    layer.weight = gguf_utils.GGUFParameter(torch.from_numpy(packed), quant_type=GGMLQuantizationType.Q4_0)  # fmt: skip
    assert layer.weight.dtype == torch.uint8 and tuple(layer.weight.quant_shape) == w.shape
    calls, native = [], []
    original, original_native = gguf_utils.dequantize_gguf_tensor, gguf_utils.GGUFLinear.forward_native  # fmt: skip
    monkeypatch.setattr(gguf_utils, "dequantize_gguf_tensor", lambda t: calls.append(1) or original(t))  # fmt: skip
    monkeypatch.setattr(gguf_utils.GGUFLinear, "forward_native", lambda self, x: native.append(1) or original_native(self, x))  # fmt: skip
    x = torch.from_numpy(starter["x"][:4])
    with torch.no_grad():
        first, second = layer(x), layer(x)
    assert len(native) == 2 and len(calls) == 2 and torch.equal(first, second)
    expected = x @ torch.from_numpy(starter["dequantize"](packed, "Q4_0").astype(np.float16)).float().T  # fmt: skip
    torch.testing.assert_close(first, expected, rtol=1e-5, atol=1e-5)


def fresh_copy(monkeypatch, dotted):
    """Executes a fresh copy of the diffusers module ``dotted`` (its module-level code, the
    GPU and kernel gates included) under a private name, with whatever stand-ins the caller
    has set; the imported module and its classes stay as they are."""
    import importlib.util

    import diffusers

    path = os.path.join(os.path.dirname(diffusers.__file__), *dotted.split(".")[1:]) + ".py"
    name = dotted.rsplit(".", 1)[0] + "._lab14_fresh_copy"  # same package: relative imports resolve
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def test_gguf_cuda_kernels_are_opt_in(monkeypatch):
    """diffusers' GGUF CUDA path is opt-in: `can_use_cuda_kernels` is true only with `DIFFUSERS_GGUF_CUDA_KERNELS` set to `true`, `1` or `yes` (in any case; `on` does not count) and a CUDA GPU of compute capability 7 or more (7.0 passes, 6.9 does not), and its kernel (`ops`) loads only if the `kernels` package is installed; then, in 0.42.1, importing the module raises `ValueError` unless `DIFFUSERS_TRUST_REMOTE_KERNELS=true`, because the kernel, `Isotr0py/ggml`, is downloaded from the Hub and executed (with the flag set, the stand-in kernel is fetched). The module's own code runs for each setting, a fresh copy of it executed with a stand-in CUDA device and `kernels` package."""
    import diffusers.quantizers.gguf.utils as imported  # as imported, before any stand-in
    import diffusers.utils
    import diffusers.utils.constants as constants

    fetched = []
    kernels = SimpleNamespace(get_kernel=lambda repo, **kw: fetched.append(repo) or "the Hub kernel")  # fmt: skip
    monkeypatch.setitem(sys.modules, "kernels", kernels)  # diffusers imports get_kernel from it

    def gate(opt_in, capability, has_kernels, trust=False):
        monkeypatch.delenv("DIFFUSERS_GGUF_CUDA_KERNELS", raising=False)
        if opt_in:
            monkeypatch.setenv("DIFFUSERS_GGUF_CUDA_KERNELS", "true" if opt_in is True else opt_in)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: capability is not None)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
        monkeypatch.setattr(diffusers.utils, "is_kernels_available", lambda: has_kernels)
        monkeypatch.setattr(constants, "DIFFUSERS_TRUST_REMOTE_KERNELS", trust)
        module = fresh_copy(monkeypatch, "diffusers.quantizers.gguf.utils")
        return module.can_use_cuda_kernels, module.ops

    assert gate(True, None, True) == (False, None)  # no CUDA
    assert gate(True, (6, 9), True) == (False, None)  # compute capability below 7
    assert gate(False, (7, 0), True) == (False, None)  # not opted in
    assert gate(True, (7, 0), False) == (True, None)  # no kernels package
    for value in ("1", "yes", "TRUE", "on", "false", "0"):  # the values the opt-in accepts
        assert gate(value, (7, 0), False)[0] is (value.lower() in ("1", "yes", "true")), value
    with pytest.raises(ValueError, match=r"`Isotr0py/ggml`.*DIFFUSERS_TRUST_REMOTE_KERNELS=true"):
        gate(True, (7, 0), True)  # all set but the trust flag
    assert fetched == []
    assert gate(True, (7, 0), True, trust=True) == (True, "the Hub kernel")
    assert fetched == ["Isotr0py/ggml"]
    assert imported.can_use_cuda_kernels is False and imported.ops is None


def test_gguf_cuda_path_still_dequantizes_then_matmuls(starter, monkeypatch):
    """The opt-in CUDA path is no quantized matmul either: for a Q8_0 weight, `_fused_mul_mat_gguf` (diffusers 0.42.1) calls the kernel's `ggml_dequantize` once for the whole `(out, in)` weight and then an ordinary matmul in the input's dtype (run with a stand-in for the kernel that returns the dequantized weight)."""
    import diffusers.quantizers.gguf.utils as gguf_utils
    from gguf import GGMLQuantizationType

    w = starter["weight"]
    qtype = GGMLQuantizationType.Q8_0
    qweight = gguf_utils.GGUFParameter(torch.from_numpy(starter["quantize"](w, "Q8_0")), quant_type=qtype)  # fmt: skip
    seen = []

    def ggml_dequantize(q, t, rows, cols):  # what the kernel returns: the whole weight
        seen.append((int(t), rows, cols))
        return gguf_utils.GGUFParameter(torch.from_numpy(starter["dequantize"](q.numpy(), "Q8_0")), quant_type=qtype)  # fmt: skip

    monkeypatch.setattr(gguf_utils, "ops", SimpleNamespace(ggml_dequantize=ggml_dequantize))
    x = torch.from_numpy(starter["x"][:4])
    y = gguf_utils._fused_mul_mat_gguf(x, qweight, int(qtype))
    assert seen == [(int(qtype), *w.shape)]
    torch.testing.assert_close(y, x @ torch.from_numpy(starter["dequantize"](starter["quantize"](w, "Q8_0"), "Q8_0")).T)  # fmt: skip


def test_flux_fp8_layerwise_casting_keeps_the_modulation_in_bf16(starter):
    """On the real Flux.1-dev transformer (built on the meta device), `enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn)` skips every module whose name matches `norm` or `pos_embed` (`DEFAULT_SKIP_MODULES_PATTERN` plus the class's `_skip_layerwise_casting_patterns`); a match skips the whole subtree, so the AdaLN modulation Linears (`norm1.linear`, `norm1_context.linear`, `norm.linear`) stay bf16 and the weights are 15.15 GB, not fp8's 11.90 GB: the figure the starter prints."""
    from diffusers import FluxTransformer2DModel

    from labkit import model_sizes

    assert FluxTransformer2DModel._skip_layerwise_casting_patterns == ["pos_embed", "norm"]
    fresh = layerwise_casting_record()["Flux.1-dev/transformer"]
    assert fresh == model_sizes.layerwise_casting("Flux.1-dev", "transformer") == starter["layerwise"]  # fmt: skip
    assert f"{fresh['bytes'] / 1e9:.2f}" == "15.15"
    assert fresh["kept"]["transformer_blocks.*.norm1.linear"] > 1e9


def test_layerwise_casting_stores_fp8_and_computes_in_float32(monkeypatch):
    """`enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)` on the tiny UNet hooks only `Linear`, `Conv`, `ConvTranspose` and `Embedding` layers, stores their weights in float8, casts each to `compute_dtype` before its forward and back after it (added casts, the same float32 matmuls: it saves memory, not time), and skips the modules matching `norm` (`DEFAULT_SKIP_MODULES_PATTERN` is `pos_embed`, `patch_embed`, `norm`, `^proj_in$`, `^proj_out$`), so parameter bytes fall to about a quarter; its output equals, bit for bit, an fp32 UNet whose hooked weights were rounded to float8 and back, and stays within 0.2 relative RMS of the fp32 output (bfloat16 storage: below 0.01)."""
    from diffusers.hooks._common import _GO_LC_SUPPORTED_PYTORCH_LAYERS
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN

    assert DEFAULT_SKIP_MODULES_PATTERN == ("pos_embed", "patch_embed", "norm", "^proj_in$", "^proj_out$")  # fmt: skip
    nn = torch.nn
    assert set(_GO_LC_SUPPORTED_PYTORCH_LAYERS) == {
        nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
        nn.ConvTranspose3d, nn.Linear, nn.Embedding,
    }  # fmt: skip
    reference, cast = tiny_unet(), tiny_unet()
    cast.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    hooked = {n for n, m in cast.named_modules()
              if getattr(m, "_diffusers_hook", None) and m._diffusers_hook.get_hook("layerwise_casting")}  # fmt: skip
    for name, p in cast.named_parameters():
        module = name.rsplit(".", 1)[0]
        assert p.dtype == (torch.float8_e4m3fn if module in hooked else torch.float32), name
        assert (module in hooked) == ("norm" not in module), name
    nbytes = lambda m: sum(p.numel() * p.element_size() for p in m.parameters())  # noqa: E731
    assert nbytes(cast) < 0.3 * nbytes(reference)
    by_hand = tiny_unet()
    with torch.no_grad():
        for name, module in by_hand.named_modules():
            if name in hooked:
                for p in module.parameters(recurse=False):
                    p.copy_(p.to(torch.float8_e4m3fn).float())
    args = (start_latents(), torch.tensor(500), embeds(0))
    seen, linear = [], torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, b=None: seen.append(w.dtype) or linear(x, w, b))  # fmt: skip
    with torch.no_grad():
        y_cast = cast(*args).sample
    monkeypatch.undo()
    assert seen and set(seen) == {torch.float32}  # every matmul ran on float32 weights
    assert {p.dtype for n, p in cast.named_parameters() if n.rsplit(".", 1)[0] in hooked} == {torch.float8_e4m3fn}  # fmt: skip
    with torch.no_grad():
        y_ref, y_hand = (m(*args).sample for m in (reference, by_hand))
    assert torch.equal(y_cast, y_hand)
    rel = ((y_cast - y_ref).norm() / y_ref.norm()).item()
    assert 0.01 < rel < 0.2
    bf16 = tiny_unet()
    bf16.enable_layerwise_casting(storage_dtype=torch.bfloat16, compute_dtype=torch.float32)
    with torch.no_grad():
        y_bf16 = bf16(*args).sample
    assert ((y_bf16 - y_ref).norm() / y_ref.norm()).item() < 0.01


def test_layerwise_casting_skip_patterns_include_fp32_modules_and_lora():
    """Its skip patterns (`pos_embed`, `patch_embed`, `norm`, `^proj_in$`, `^proj_out$`, plus the model's `_skip_layerwise_casting_patterns` and `_keep_in_fp32_modules` and, when you pass no patterns and peft is installed, peft's adapter layers such as LoRA's `lora_A` and `lora_B`) are matched with `re.search` against each module's full name: a tiny `Kandinsky5Transformer3DModel` keeps exactly the Linears its `_keep_in_fp32_modules` names in float32, and a LoRA adapter on the tiny Flux transformer's `to_q` stays float32 while its base layer is stored in float8 (with your own `skip_modules_pattern`, the adapter is cast too)."""
    import re

    from diffusers import Kandinsky5Transformer3DModel
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN
    from peft import LoraConfig
    from tiny import four_block_flux_transformer

    fp8 = torch.float8_e4m3fn
    k5 = Kandinsky5Transformer3DModel(in_text_dim=32, in_text_dim2=16, time_dim=16, model_dim=32, ff_dim=64, num_text_blocks=1, num_visual_blocks=1, axes_dims=(4, 6, 6))  # fmt: skip
    keep = type(k5)._keep_in_fp32_modules
    k5.enable_layerwise_casting(storage_dtype=fp8, compute_dtype=torch.float32)
    linears = {n: m.weight.dtype for n, m in k5.named_modules() if isinstance(m, torch.nn.Linear)}
    kept = {n for n in linears if any(re.search(k, n) for k in keep)}
    assert kept and not any(re.search(d, n) for d in DEFAULT_SKIP_MODULES_PATTERN for n in kept)
    assert {n for n, dtype in linears.items() if dtype == torch.float32} == kept
    for patterns in ({}, {"skip_modules_pattern": DEFAULT_SKIP_MODULES_PATTERN}):
        flux = four_block_flux_transformer()
        flux.add_adapter(LoraConfig(r=4, target_modules=["to_q"]))
        flux.enable_layerwise_casting(storage_dtype=fp8, compute_dtype=torch.float32, **patterns)
        to_q = flux.transformer_blocks[0].attn.to_q
        assert to_q.base_layer.weight.dtype == fp8
        lora = {to_q.lora_A["default"].weight.dtype, to_q.lora_B["default"].weight.dtype}
        assert lora == ({fp8} if patterns else {torch.float32})


def test_quantization_backends_of_diffusers():
    """diffusers 0.42.1 maps ten backend names to quantization configs (`AUTO_QUANTIZATION_CONFIG_MAPPING`): `bfl`, `bitsandbytes_4bit`, `bitsandbytes_8bit`, `gguf`, `quanto`, `torchao`, `modelopt`, `auto-round`, `nunchaku_lite` and `sdnq`. Only `gguf`'s and `torchao`'s libraries are part of this project's verify extra (bitsandbytes, optimum-quanto, modelopt, auto-round, sdnq and the `kernels` package Nunchaku needs are not installed)."""
    import importlib.util

    from diffusers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING

    for name in ("bitsandbytes", "optimum", "modelopt", "auto_round", "sdnq", "kernels"):
        assert importlib.util.find_spec(name) is None, name

    assert list(AUTO_QUANTIZATION_CONFIG_MAPPING) == [
        "bfl", "bitsandbytes_4bit", "bitsandbytes_8bit", "gguf", "quanto", "torchao",
        "modelopt", "auto-round", "nunchaku_lite", "sdnq",
    ]  # fmt: skip


def test_quant_backend_constructs_for_three_backends_only(monkeypatch):
    """Through `quant_backend`, with transformers 5.23.0, only `bitsandbytes_4bit`, `bitsandbytes_8bit` and `auto-round` construct: the others raise `ValueError`, because their diffusers and transformers configs take different arguments or transformers lacks them ([`pipe_quant_config.py`](https://github.com/huggingface/diffusers/blob/v0.42.1/src/diffusers/quantizers/pipe_quant_config.py#L88-L152)) (every backend of `AUTO_QUANTIZATION_CONFIG_MAPPING` tried, as installed). `bitsandbytes_4bit` quantizes to FP4 by default, to NF4 with `bnb_4bit_quant_type="nf4"` (the transformer's config resolved as `from_pretrained` resolves it, the bitsandbytes version check given a stand-in)."""
    from diffusers import PipelineQuantizationConfig
    from diffusers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING

    constructs, reasons = set(), {}
    for backend in AUTO_QUANTIZATION_CONFIG_MAPPING:
        try:
            PipelineQuantizationConfig(quant_backend=backend, quant_kwargs={"x": 1}, components_to_quantize=["transformer"])  # fmt: skip
            constructs.add(backend)
        except ValueError as error:
            reasons[backend] = "signatures" if "signatures" in str(error) else "not found" if "not found" in str(error) else str(error)  # fmt: skip
    assert constructs == {"bitsandbytes_4bit", "bitsandbytes_8bit", "auto-round"}
    # bitsandbytes_4bit is FP4 unless told NF4: the transformer's config, resolved as from_pretrained
    # does (its version check given a stand-in bitsandbytes 0.45.0: the package is not installed)
    import importlib.metadata

    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.45.0" if name == "bitsandbytes" else real_version(name))  # fmt: skip
    for kwargs, method in (({}, "fp4"), ({"bnb_4bit_quant_type": "nf4"}, "nf4")):
        bnb = PipelineQuantizationConfig(quant_backend="bitsandbytes_4bit", quant_kwargs={"load_in_4bit": True, **kwargs}, components_to_quantize=["transformer"])  # fmt: skip
        assert bnb._resolve_quant_config(is_diffusers=True, module_name="transformer").quantization_method() == method  # fmt: skip
    assert set(reasons.values()) == {"signatures", "not found"}
    assert reasons["torchao"] == reasons["quanto"] == reasons["gguf"] == "signatures"


def test_pipeline_quantization_config_maps_components(tmp_path):
    """GGUF and `bfl` in `quant_mapping` raise `TypeError` at load (`json.dumps` of their config's `torch.dtype`, [`modeling_utils.py`](https://github.com/huggingface/diffusers/blob/v0.42.1/src/diffusers/models/modeling_utils.py#L1206)); both load pre-quantized checkpoints only through `from_single_file`: of the registry's configs that construct here with their defaults, exactly these two fail `json.dumps(config.to_dict())`, are `pre_quantized`, and raise `TypeError` when a saved tiny `FluxPipeline` is loaded with them in `quant_mapping` (the others stop earlier: bitsandbytes at the missing GPU, quanto at its missing package, and `auto-round` with `ValueError` because its quantizer loads only pre-quantized checkpoints, through `quant_backend="auto-round"` too; that `from_single_file` loads `bfl` is read from the source, not run; GGUF's is run above). `QuantoConfig` and its quantizer are deprecated in 0.42.1: building them raises a `FutureWarning`. A tiny `FluxPipeline` saved and reloaded with `DiffusionPipeline.from_pretrained(dir, quantization_config=PipelineQuantizationConfig(quant_mapping={"transformer": ...}))`: `GGUFQuantizationConfig(compute_dtype=torch.bfloat16)` raises `TypeError`, `TorchAoConfig(Int8WeightOnlyConfig())` puts a torchao tensor in every `nn.Linear` of the transformer and leaves the VAE's parameters plain. `quant_backend="gguf"` with `quant_kwargs` raises `ValueError`; `GGUFQuantizationConfig` is `pre_quantized`; `from_pretrained` rejects a `quantization_config` that is not a `PipelineQuantizationConfig`."""
    import contextlib
    import json

    from diffusers import (
        DiffusionPipeline,
        GGUFQuantizationConfig,
        PipelineQuantizationConfig,
        TorchAoConfig,
    )
    from diffusers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING

    needs_torchao()
    from torchao.quantization import Int8WeightOnlyConfig

    config = GGUFQuantizationConfig(compute_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="signatures of the __init__ methods"):
        PipelineQuantizationConfig(quant_backend="gguf", quant_kwargs={"compute_dtype": torch.bfloat16})  # fmt: skip
    assert config.pre_quantized is True
    with pytest.raises(ValueError, match="must be an instance of `PipelineQuantizationConfig`"):
        DiffusionPipeline.from_pretrained(str(tmp_path), quantization_config=config)
    tiny_flux_pipeline().save_pretrained(tmp_path)
    absent = {f"{kind}{s}": None for kind in ("text_encoder", "tokenizer") for s in ("", "_2")}  # fmt: skip

    def load(component_config):
        mapping = PipelineQuantizationConfig(quant_mapping={"transformer": component_config})
        return DiffusionPipeline.from_pretrained(str(tmp_path), quantization_config=mapping, **absent)  # fmt: skip

    with pytest.raises(TypeError, match="not JSON serializable"):
        load(config)
    unserializable, type_errors, stops = set(), set(), {}
    for backend, config_class in AUTO_QUANTIZATION_CONFIG_MAPPING.items():  # as installed
        # quanto is deprecated in 0.42.1: its config and its quantizer say so as they are built
        deprecated = lambda b=backend: pytest.warns(FutureWarning, match="Quanto.* is deprecated") if b == "quanto" else contextlib.nullcontext()  # noqa: E731  # fmt: skip
        try:
            with deprecated():
                default = config_class()
        except (TypeError, ValueError, ImportError):  # needs arguments or a package: not built here
            continue
        try:
            json.dumps(default.to_dict())
        except TypeError:
            unserializable.add(backend)
            assert default.pre_quantized is True, backend
        try:
            with deprecated():
                load(default)
        except TypeError as error:
            assert "not JSON serializable" in str(error)
            type_errors.add(backend)
        except ImportError:
            stops[backend] = "package"
        except RuntimeError as error:
            assert "No GPU found" in str(error), backend
            stops[backend] = "GPU"
        except ValueError as error:
            assert "require the model to be pre-quantized" in str(error), backend
            stops[backend] = "pre-quantized only"
    assert unserializable == type_errors == {"gguf", "bfl"}
    assert stops == {"bitsandbytes_4bit": "GPU", "bitsandbytes_8bit": "GPU", "quanto": "package", "auto-round": "pre-quantized only"}  # fmt: skip
    # auto-round is one of the three backends `quant_backend` constructs, and it stops the same way
    auto_round = PipelineQuantizationConfig(quant_backend="auto-round", quant_kwargs={"bits": 4}, components_to_quantize=["transformer"])  # fmt: skip
    with pytest.raises(ValueError, match="require the model to be pre-quantized"):
        DiffusionPipeline.from_pretrained(str(tmp_path), quantization_config=auto_round, **absent)
    pipe = load(TorchAoConfig(Int8WeightOnlyConfig()))
    linears = [m for m in pipe.transformer.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m.weight).__module__.startswith("torchao") for m in linears)
    assert all(type(p) is torch.nn.Parameter for p in pipe.vae.parameters())


def test_gpu_only_backends_refuse_to_run_here(monkeypatch):
    """The bitsandbytes quantizers refuse to run without an accelerator (`validate_environment` raises "No GPU found" on this CPU machine), and the Nunchaku quantizer raises unless CUDA is available (here, even with the `kernels` package it asks for first taken as present): this page describes them and runs neither."""
    import diffusers.quantizers.nunchaku.nunchaku_quantizer as nunchaku
    from diffusers import BitsAndBytesConfig
    from diffusers.quantizers.bitsandbytes import (
        BnB4BitDiffusersQuantizer,
        BnB8BitDiffusersQuantizer,
    )
    from diffusers.quantizers.quantization_config import NunchakuLiteQuantizationConfig

    assert not torch.cuda.is_available()
    for quantizer in (BnB4BitDiffusersQuantizer, BnB8BitDiffusersQuantizer):
        with pytest.raises(RuntimeError, match="No GPU found"):
            quantizer(BitsAndBytesConfig()).validate_environment()
    config = NunchakuLiteQuantizationConfig(awq_w4a16={"precision": "int4", "group_size": 64, "targets": ["proj_out"]})  # fmt: skip
    monkeypatch.setattr(nunchaku, "is_kernels_available", lambda: True)
    with pytest.raises(ValueError, match="requires a CUDA-capable NVIDIA GPU"):
        nunchaku.NunchakuLiteQuantizer(config).validate_environment()


# ------------------------------------------------ torchao: weights and activations in int8

#: torchao is in the verify extra (and in the drift watch's venv)
NEEDS_TORCHAO = "the verify extra includes torchao"


def needs_torchao():
    """Skip where torchao is missing (a venv made before it joined the verify extra), but
    fail in CI (CI=true), which installs the verify extra: there a skip would hide a failure."""
    if os.environ.get("CI"):
        import torchao  # noqa: F401  (ModuleNotFoundError: the verify extra is incomplete)
    else:
        pytest.importorskip("torchao", reason=NEEDS_TORCHAO)


def _bf16_inputs():
    """The four-block Flux transformer's fixed inputs, its float tensors in bfloat16."""
    from tiny import four_block_flux_inputs

    floats = ("hidden_states", "encoder_hidden_states", "pooled_projections")
    return {k: v.to(torch.bfloat16) if k in floats else v for k, v in four_block_flux_inputs().items()}  # fmt: skip


@pytest.fixture(scope="module")
def torchao_flux(tmp_path_factory):
    """A tiny random Flux transformer saved to disk, loaded back three ways: bf16, and
    through `TorchAoConfig` with int8 weights and int8 dynamic activations, or int8 weights
    only (diffusers quantizes at load time, so the model goes through from_pretrained)."""
    needs_torchao()
    from diffusers import FluxTransformer2DModel, TorchAoConfig
    from tiny import four_block_flux_transformer
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig

    directory = tmp_path_factory.mktemp("tiny-flux")
    four_block_flux_transformer().save_pretrained(directory)
    load = lambda **kw: FluxTransformer2DModel.from_pretrained(directory, torch_dtype=torch.bfloat16, **kw)  # noqa: E731  # fmt: skip
    quiet()
    return SimpleNamespace(
        directory=directory,
        bf16=load(),
        w8a8=load(quantization_config=TorchAoConfig(Int8DynamicActivationInt8WeightConfig())),
        w8=load(quantization_config=TorchAoConfig(Int8WeightOnlyConfig())),
    )


def _forward(model, monkeypatch=None, calls=None):
    if monkeypatch is not None:  # record every integer matmul torch runs
        int_mm = torch._int_mm
        monkeypatch.setattr(torch, "_int_mm", lambda a, b: calls.append((a.dtype, b.dtype)) or int_mm(a, b))  # fmt: skip
    with torch.no_grad():
        out = model(**_bf16_inputs())[0]
    if monkeypatch is not None:
        monkeypatch.undo()
    return out.float()


def test_torchao_config_takes_torchao_config_objects(monkeypatch):
    """diffusers 0.42.1's `TorchAoConfig` takes one of torchao's config objects (`Int8DynamicActivationInt8WeightConfig()`, `Int8WeightOnlyConfig()`, `Float8DynamicActivationFloat8WeightConfig()`...) and needs torchao >= 0.15; the old string names such as `"int8dq"` are gone, not deprecated: a string raises `TypeError` (checked with torchao 0.18.0, the verify extra's)."""
    needs_torchao()
    from diffusers import TorchAoConfig
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig

    with pytest.raises(TypeError, match="quant_type must be an AOBaseConfig instance, got str"):
        TorchAoConfig("int8dq")
    import diffusers.quantizers.quantization_config as qc

    with monkeypatch.context() as m:  # an older torchao, as diffusers' version check sees it
        m.setattr(qc, "is_torchao_version", lambda op, v: op == "<" and v == "0.15.0")
        with pytest.raises(ValueError, match=r"requires torchao >= 0\.15\.0"):
            TorchAoConfig(Float8DynamicActivationFloat8WeightConfig())
    config = TorchAoConfig(Float8DynamicActivationFloat8WeightConfig())
    assert config.quant_method == "torchao"
    fp8 = config.quant_type
    assert fp8.activation_dtype == fp8.weight_dtype == torch.float8_e4m3fn
    assert [type(g).__name__ for g in fp8.granularity] == ["PerTensor", "PerTensor"]


def test_torchao_int8_stores_int8_weights_with_a_scale_per_row(torchao_flux):
    """Loaded through `TorchAoConfig(Int8DynamicActivationInt8WeightConfig())`, every `nn.Linear` weight of a tiny Flux transformer becomes torchao's `Int8Tensor`: `int8` values `(out, in)` and one float32 scale per output row, about half the bfloat16 bytes; the model's other weights (norms, biases) stay bfloat16. Each row's scale is its largest magnitude over 127.5 (rounded to bfloat16 for a bfloat16 model) and the values are `round(w / scale)` clipped to [-128, 127], the rule `labkit.precision.quantize_scaled(weight, "int8", axis=-1)` emulates: on float32 values it gives torchao's int8 values, value for value."""
    from torchao.quantization import Int8Tensor, PerRow

    from labkit.precision import quantize_scaled, round_to

    ref = dict(torchao_flux.bf16.named_modules())
    linear_bytes = bf16_bytes = 0
    for name, module in torchao_flux.w8a8.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        w = module.weight
        assert isinstance(w, Int8Tensor), name
        assert w.qdata.dtype == torch.int8 and w.qdata.shape == w.shape
        assert w.scale.dtype == torch.float32 and w.scale.shape == (w.shape[0], 1)
        linear_bytes += w.qdata.nbytes + w.scale.nbytes
        bf16_bytes += ref[name].weight.nbytes
        assert module.bias is None or module.bias.dtype == torch.bfloat16
        # torchao's rule: s = amax / 127.5 per row (rounded to bf16, the model's dtype),
        # q = round(w / s) clipped to [-128, 127]
        w_ref = ref[name].weight.detach().double().numpy()
        s = w.scale.double().numpy()
        np.testing.assert_array_equal(s[:, 0], round_to(np.abs(w_ref).max(axis=1) / 127.5, "bf16"))
        np.testing.assert_array_equal(w.qdata.numpy(), np.clip(np.round(w_ref / s), -128, 127))
        # labkit's emulation (its scale unrounded) lands within one int8 step of every value
        stored = w.qdata.double().numpy() * s  # what the integer matmul multiplies
        assert np.all(np.abs(quantize_scaled(w_ref, "int8", axis=-1) - stored) <= s * 1.01)
    # on float32 values (no bf16 rounding of the scale) labkit's rule IS torchao's, value for
    # value: same q everywhere, the scales equal to float32 precision. The one exception is
    # a row's most negative value when it is the row's amax: -127.5 steps, a tie that
    # float32 and float64 may break to -127 or -128.
    w32 = torch.randn(96, 256, generator=torch.Generator().manual_seed(1)) * 0.05
    theirs = Int8Tensor.from_hp(w32, PerRow())
    ours = quantize_scaled(w32.double().numpy(), "int8", axis=-1)
    s32 = theirs.scale.double().numpy()
    np.testing.assert_allclose(s32[:, 0], np.abs(w32.double().numpy()).max(axis=1) / 127.5, rtol=1e-6)  # fmt: skip
    q_ours, q_theirs = np.round(ours / s32), theirs.qdata.double().numpy()
    ties = w32.double().numpy() == -np.abs(w32.double().numpy()).max(axis=1, keepdims=True)
    assert np.array_equal(q_ours[~ties], q_theirs[~ties])
    assert np.all(np.abs(q_ours - q_theirs)[ties] <= 1) and q_theirs.max() <= 127
    assert 0.5 < linear_bytes / bf16_bytes < 0.6
    norms = [p.dtype for n, p in torchao_flux.w8a8.named_parameters() if "norm" in n and "linear" not in n]  # fmt: skip
    assert norms and set(norms) == {torch.bfloat16}


def test_torchao_int8_dynamic_activations_run_an_integer_matmul(torchao_flux, monkeypatch):
    """With int8 weights *and* dynamic int8 activations, each `Linear` quantizes its input per token on every call and multiplies int8 by int8 in `torch._int_mm` (int32 accumulation), on this CPU too (a CPU with VNNI and no AMX gets the activations shifted to uint8 first); its output stays within 2% (relative RMS) of the bfloat16 model's. With `Int8WeightOnlyConfig` no integer matmul runs: the int8 weight is cast to bfloat16 for an ordinary matmul, the weight-only path."""
    from torchao.quantization import Int8Tensor

    calls, scales = [], []
    y_ref = _forward(torchao_flux.bf16)
    from_hp = Int8Tensor.from_hp.__func__  # record each activation's scale shape as it is quantized
    spy = classmethod(lambda cls, x, *a, **k: scales.append((x.shape, (t := from_hp(cls, x, *a, **k)).scale.shape)) or t)  # fmt: skip
    monkeypatch.setattr(Int8Tensor, "from_hp", spy)
    y_w8a8 = _forward(torchao_flux.w8a8, monkeypatch, calls)
    # one float32 scale per token: hidden_states (batch, tokens, in) -> scale (batch, tokens, 1)
    assert len(scales) == len(calls)
    assert all(sc == (*shape[:-1], 1) for shape, sc in scales), scales[:3]
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in torchao_flux.w8a8.modules())
    assert len(calls) >= n_linear and {b for _, b in calls} == {torch.int8}
    # torchao's CPU path shifts the int8 activations to uint8 (+128) where the CPU has VNNI but
    # no AMX (kernel/intmm.py); elsewhere, as on this machine, it multiplies int8 by int8
    from torchao.utils import _cpu_is_amx_tile_supported, _cpu_is_vnni_supported

    shifted = _cpu_is_vnni_supported() and not _cpu_is_amx_tile_supported()
    assert {a for a, _ in calls} == {torch.uint8 if shifted else torch.int8}
    w8a8 = {type(m.weight.act_quant_kwargs.granularity).__name__ for m in torchao_flux.w8a8.modules() if isinstance(m, torch.nn.Linear)}  # fmt: skip
    assert w8a8 == {"PerRow"}  # one activation scale per token (row of hidden_states)
    calls.clear()
    y_w8 = _forward(torchao_flux.w8, monkeypatch, calls)
    assert calls == []
    assert all(m.weight.act_quant_kwargs is None for m in torchao_flux.w8.modules() if isinstance(m, torch.nn.Linear))  # fmt: skip
    for y in (y_w8a8, y_w8):
        assert 0 < ((y - y_ref).norm() / y_ref.norm()).item() < 0.02


def test_torchao_fp8_activations_refuse_this_cpu(torchao_flux):
    """`Float8DynamicActivationFloat8WeightConfig` (fp8 weights and activations) cannot load here: torchao's `_check_hardware_support` (`torchao/float8/inference.py`) asserts "Float8 dynamic quantization requires CUDA compute capability ≥8.9 or MI300+ or XPU", i.e. an Ada or Hopper GPU or newer; fp8 *weight-only* (`Float8WeightOnlyConfig`) loads on the CPU."""
    from diffusers import FluxTransformer2DModel, TorchAoConfig
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Float8WeightOnlyConfig,
    )

    load = lambda c: FluxTransformer2DModel.from_pretrained(torchao_flux.directory, torch_dtype=torch.bfloat16, quantization_config=TorchAoConfig(c))  # noqa: E731  # fmt: skip
    with pytest.raises(AssertionError, match=r"requires CUDA compute capability ≥8\.9"):
        load(Float8DynamicActivationFloat8WeightConfig())
    fp8_weights = load(Float8WeightOnlyConfig()).transformer_blocks[0].attn.to_q.weight
    assert fp8_weights.qdata.dtype == torch.float8_e4m3fn


def test_nunchaku_refuses_hopper_and_asks_blackwell_for_nvfp4(monkeypatch):
    """diffusers 0.42.1's Nunchaku backend (`nunchaku_lite`, pre-quantized SVDQuant W4A4 and AWQ W4A16 checkpoints with kernels from the Hub) checks the GPU in `NunchakuLiteQuantizer.validate_environment` (`quantizers/nunchaku/nunchaku_quantizer.py`): it raises on any compute capability 9.x ("not supported on Hopper"), asks for 10.0 or newer (Blackwell) for `nvfp4` and 7.5 or newer (Turing) for `int4`; an int4 checkpoint passes on 7.5 and 8.9 (Ada) and nvfp4 on 10.0 and 12.0 (capability simulated, kernels package taken as present)."""
    import diffusers.quantizers.nunchaku.nunchaku_quantizer as nunchaku
    from diffusers.quantizers.quantization_config import NunchakuLiteQuantizationConfig

    def check(capability, precision):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
        group = 16 if precision == "nvfp4" else 64
        svdq = {"precision": precision, "group_size": group, "rank": 32, "targets": ["proj_out"]}
        nunchaku.NunchakuLiteQuantizer(NunchakuLiteQuantizationConfig(svdq_w4a4=svdq)).validate_environment()  # fmt: skip

    monkeypatch.setattr(nunchaku, "is_kernels_available", lambda: True)
    for precision in ("int4", "nvfp4"):
        with pytest.raises(ValueError, match="not supported on Hopper"):
            check((9, 0), precision)
    with pytest.raises(ValueError, match="NVFP4 checkpoints requires a Blackwell"):
        check((8, 9), "nvfp4")
    with pytest.raises(ValueError, match="INT4 checkpoints on CUDA requires a Turing"):
        check((7, 0), "int4")
    check((7, 5), "int4")  # the edge
    check((8, 9), "int4")
    check((10, 0), "nvfp4")
    check((12, 0), "nvfp4")


def test_torchao_import_logs_warnings_with_diffusers_0421():
    """With torchao 0.18.0 installed, `from diffusers import FluxTransformer2DModel` prints warnings to stderr (logs, not Python warnings): diffusers 0.42.1's torchao quantizer logs "Unable to import `torchao` Tensor objects", because `_update_torch_safe_globals` looks for `NF4Tensor` and the `Uintx` tensors in `torchao.dtypes`, which 0.18.0 no longer has (it still registers the `torch.uint1`...`uint7` dtypes, and the configs run here never load through those classes), and torchao logs the compiled extensions it cannot load on this CPU machine, and torch's `_pytree` logs that registering torchao's enums (`KernelPreference`, `ScaleCalculationMode`) is deprecated."""
    import subprocess

    needs_torchao()
    import torchao.dtypes
    from diffusers.quantizers.torchao import torchao_quantizer
    from tiny import logged_messages

    assert not hasattr(torchao.dtypes, "NF4Tensor")
    with logged_messages("diffusers.quantizers.torchao.torchao_quantizer") as messages:
        torchao_quantizer._update_torch_safe_globals()
    assert messages == ["Unable to import `torchao` Tensor objects. This may affect loading checkpoints serialized with `torchao`"]  # fmt: skip
    run = subprocess.run([sys.executable, "-W", "error", "-c", "from diffusers import FluxTransformer2DModel"], capture_output=True, text=True, check=True)  # fmt: skip
    assert "Unable to import `torchao` Tensor objects" in run.stderr
    assert "Failed to load" in run.stderr and run.stdout == ""
    pytree = [line for line in run.stderr.splitlines() if "_pytree.py" in line]
    assert all("register_constant() on Enum subclasses is deprecated" in line for line in pytree)
    assert {e for e in ("KernelPreference", "ScaleCalculationMode") if any(e in line for line in pytree)} == {"KernelPreference", "ScaleCalculationMode"}  # fmt: skip


def test_nunchaku_layer_holds_svdquant_pieces(monkeypatch):
    """diffusers 0.42.1's Nunchaku layer `SVDQW4A4Linear` (`quantizers/nunchaku/utils.py`) holds SVDQuant's pieces: `smooth_factor` (one per input channel), the 16-bit low-rank branch `proj_down` `(in, rank)` and `proj_up` `(out, rank)`, the 4-bit weight `qweight` packed two values per int8 byte `(out, in / 2)`, and `wscales` per group of inputs, per 64 in the layer's compute dtype for `int4` (bf16 by default, fp16 in a layer built for fp16) and fp8 e4m3 per 16 for `nvfp4`; besides a `bias`, those are all its parameters for `int4`, and `nvfp4` adds `wcscales` (one per output row) and `wtscale` (one per tensor). Its forward quantizes each input to 4 bits: it hands `quantize_w4a4_act_fuse_lora` a `uint8` buffer of `(rows rounded up to 256, in / 2)`, two 4-bit values a byte, and a scale per 64 (int4) or 16 (nvfp4) inputs, and `gemm_w4a4` multiplies exactly that buffer by `qweight`. The backend's weight-only layer, `AWQW4A16Linear`, is not widened to bf16 in diffusers: it hands its packed 4-bit weight (`int32`, eight values each) to fused kernels, `awq_gemm_w4a16_g64_int32` from 16 rows on and `gemv_awq` below, for a layer of 256 inputs and 128 outputs. (A fresh copy of the module executed with a stand-in `kernels` package whose ops record their arguments: diffusers fetches the real kernel from the Hub at import.)"""
    import diffusers.utils
    import diffusers.utils.constants as constants

    calls = {}
    ops = SimpleNamespace(
        quantize_w4a4_act_fuse_lora=lambda x, packed, scales, *_: calls.update(
            quantized=(packed, scales)
        ),
        gemm_w4a4=lambda act, wgt, out, _, scales, *rest: calls.update(gemm=(act, wgt, scales)),
        awq_gemm_w4a16_g64_int32=lambda x, w, *_: calls.update(awq_gemm=w) or x[:, :128] * 0,
        gemv_awq=lambda x, w, *_: calls.update(gemv_awq=w) or x[:, :128] * 0,
    )
    fetched = []
    kernels = SimpleNamespace(get_kernel=lambda repo, **kw: fetched.append(repo) or SimpleNamespace(ops=ops))  # fmt: skip
    monkeypatch.setitem(sys.modules, "kernels", kernels)
    monkeypatch.setattr(diffusers.utils, "is_kernels_available", lambda: True)
    monkeypatch.setattr(diffusers.utils, "is_kernels_version", lambda *a: True)
    monkeypatch.setattr(constants, "DIFFUSERS_TRUST_REMOTE_KERNELS", True)
    module = fresh_copy(monkeypatch, "diffusers.quantizers.nunchaku.utils")
    assert fetched == ["rootonchair/nunchaku-lite-kernels"]
    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    for precision, group, scale_dtype in (("int4", 64, bf16), ("nvfp4", 16, fp8)):
        layer = module.SVDQW4A4Linear(256, 128, rank=32, precision=precision, group_size=group, device="cpu")  # fmt: skip
        params = {name: (tuple(p.shape), p.dtype) for name, p in layer.named_parameters()}
        expected = {
            "smooth_factor": ((256,), bf16), "proj_down": ((256, 32), bf16),
            "proj_up": ((128, 32), bf16), "qweight": ((128, 128), torch.int8),
            "wscales": ((256 // group, 128), scale_dtype), "bias": ((128,), bf16),
        }  # fmt: skip
        if precision == "nvfp4":
            expected |= {"wcscales": ((128,), bf16), "wtscale": ((1,), bf16)}
        assert params == expected, precision
        calls.clear()
        y = layer(torch.randn(3, 256, dtype=bf16))  # 3 tokens, padded to 256 rows
        (packed, ascales), (act, weight, gemm_scales) = calls["quantized"], calls["gemm"]
        assert packed.dtype == torch.uint8 and packed.shape == (256, 128)  # two 4-bit values a byte
        assert ascales.dtype == scale_dtype and ascales.shape == (256 // group, 256)
        assert act is packed and gemm_scales is ascales and weight is layer.qweight
        assert y.shape == (3, 128)
    # the int4 scales follow the layer's compute dtype; nvfp4's stay fp8
    for precision, group, scale_dtype in (("int4", 64, torch.float16), ("nvfp4", 16, fp8)):
        layer = module.SVDQW4A4Linear(256, 128, precision=precision, group_size=group, torch_dtype=torch.float16, device="meta")  # fmt: skip
        assert layer.wscales.dtype == scale_dtype and layer.proj_down.dtype == torch.float16
    # weight-only AWQ W4A16: the packed weight goes to a fused kernel, with no bf16 copy made
    awq = module.AWQW4A16Linear(256, 128, device="cpu")
    assert awq.qweight.dtype == torch.int32 and awq.qweight.numel() * 8 == 128 * 256
    for rows, kernel in ((16, "awq_gemm"), (15, "gemv_awq"), (3, "gemv_awq")):
        calls.clear()
        assert awq(torch.randn(rows, 256, dtype=bf16)).shape == (rows, 128)
        assert list(calls) == [kernel] and calls[kernel] is awq.qweight, rows
