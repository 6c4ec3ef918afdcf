"""Lab 10 (memory optimization reading) against the real diffusers switches.

Everything runs on the tiny random-config parts of ``tiny.py``: the real
``StableDiffusionPipeline``, ``UNet2DConditionModel`` and ``AutoencoderKL`` classes,
so the processors, the tile parameters and the blend code are diffusers' own.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tiny import (
    HEIGHT,
    SD15_PNDM,
    SD_BETAS,
    WIDTH,
    embeds,
    hooked_forwards,
    replay_model_offload,
    run_starter,
    start_latents,
    text_to_image_pipelines,
    tiny_sd_pipeline,
    tiny_vae,
)

LAB10 = "code/lab-10-memory-optimization-reading/memory_optimization.py"


@pytest.fixture(scope="module")
def starter():
    return run_starter(LAB10)


@pytest.fixture(scope="module")
def built_pipelines(tmp_path_factory):
    """``text_to_image_pipelines`` built once; each test takes a deep copy to hook."""
    return text_to_image_pipelines(tmp_path_factory.mktemp("tok"))


def call(pipe):
    return pipe(
        prompt_embeds=embeds(0, 2),
        negative_prompt_embeds=embeds(1, 2),
        latents=start_latents(2),
        num_inference_steps=3,
        guidance_scale=7.5,
        output_type="np",
    ).images


def test_default_processor_is_sdpa(monkeypatch, tmp_path):
    """On torch 2 every attention layer of SD's UNet defaults to `AttnProcessor2_0`, which calls `F.scaled_dot_product_attention` on a 4-D `(B, heads, N, head_dim)` query: a `StableDiffusionPipeline` call on `prompt_embeds`, without a `safety_checker`, makes one such call per attention layer per UNet call, and one for the VAE decoder's attention when it decodes (`output_type="np"` here); given a prompt, its CLIP text encoder (transformers' `sdpa` attention) adds one per encoder layer per encode."""
    from diffusers.models.attention_processor import AttnProcessor2_0

    pipe = tiny_sd_pipeline()
    assert pipe.safety_checker is None
    assert {type(p) for p in pipe.unet.attn_processors.values()} == {AttnProcessor2_0}
    calls, unet_calls = [], []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(a[0].shape) or sdpa(*a, **k))  # fmt: skip
    pipe.unet.register_forward_pre_hook(lambda *_: unet_calls.append(1))
    call(pipe)
    assert len(calls) == len(unet_calls) * len(pipe.unet.attn_processors) + len([k for k in pipe.vae.attn_processors if k.startswith("decoder.")])  # fmt: skip
    assert {len(shape) for shape in calls} == {4} and {shape[0] for shape in calls} >= {
        4
    }  # 2 CFG x 2
    assert unet_calls and {type(p) for p in pipe.vae.attn_processors.values()} == {AttnProcessor2_0}  # fmt: skip
    calls.clear()
    unet_calls.clear()
    pipe(prompt_embeds=embeds(0), negative_prompt_embeds=embeds(1), num_inference_steps=2, output_type="latent")  # fmt: skip
    assert len(calls) == len(unet_calls) * len(pipe.unet.attn_processors)  # no decode: no VAE call
    from tiny import tiny_text_encoder, tiny_tokenizer

    texted = tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer(tmp_path))
    calls.clear()
    unet_calls, encodes = [], []
    texted.unet.register_forward_pre_hook(lambda *_: unet_calls.append(1))
    texted.text_encoder.register_forward_pre_hook(lambda *_: encodes.append(1))
    texted("a cat", num_inference_steps=2, height=HEIGHT, width=WIDTH, output_type="np")
    decoder = len([k for k in texted.vae.attn_processors if k.startswith("decoder.")])
    layers = texted.text_encoder.config.num_hidden_layers
    assert encodes == [1, 1] and layers > 0  # the prompt, then "" for guidance
    assert texted.text_encoder.config._attn_implementation == "sdpa"
    assert len(calls) == len(unet_calls) * len(texted.unet.attn_processors) + decoder + 2 * layers


def test_attention_slicing_installs_sliced_processor_and_keeps_output():
    """`pipe.enable_attention_slicing()` ("auto") installs `SlicedAttnProcessor` with `slice_size = heads // 2` on every UNet attention layer, and changes the tiny `StableDiffusionPipeline`'s images by at most 1e-5 (measured about 2e-6, float32 rounding)."""
    from diffusers.models.attention_processor import AttnProcessor2_0, SlicedAttnProcessor

    pipe = tiny_sd_pipeline()
    before = call(pipe)
    pipe.enable_attention_slicing()
    procs = list(pipe.unet.attn_processors.values())
    assert all(isinstance(p, SlicedAttnProcessor) for p in procs)
    heads = {m.heads for m in pipe.unet.modules() if hasattr(m, "set_attention_slice") and hasattr(m, "heads")}  # fmt: skip
    assert heads == {4} and {p.slice_size for p in procs} == {2}
    after = call(pipe)
    assert np.abs(after - before).max() <= 1e-5
    pipe.disable_attention_slicing()
    assert all(isinstance(p, AttnProcessor2_0) for p in pipe.unet.attn_processors.values())


def test_sliced_processor_loops_over_batch_times_heads():
    """`SlicedAttnProcessor` slices the first axis of the `(B * heads, N, d)` query, key and value, `slice_size` rows per `get_attention_scores` call, so `slice_size=1` on B=2 with 4 heads makes 8 calls of shape `(1, N, N)`."""
    from diffusers.models.attention_processor import Attention, SlicedAttnProcessor

    torch.manual_seed(0)
    attn = Attention(query_dim=16, heads=4, dim_head=4)
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        whole = attn(x)
        attn.set_processor(SlicedAttnProcessor(1))
        shapes, scores = [], []
        original = attn.get_attention_scores
        attn.get_attention_scores = lambda q, k, m=None: shapes.append(q.shape) or scores.append(original(q, k, m)) or scores[-1]  # fmt: skip
        sliced = attn(x)
    assert shapes == [torch.Size([1, 10, 4])] * 8  # (1, N, d) queries
    assert [s.shape for s in scores] == [torch.Size([1, 10, 10])] * 8  # (1, N, N) scores
    torch.testing.assert_close(sliced, whole, atol=1e-5, rtol=0)


def test_tiny_vae_tile_parameters():
    """The tiny `AutoencoderKL` (two blocks, `sample_size=16`) has `tile_sample_min_size = 16`, `tile_latent_min_size = 16 / 2 = 8` and `tile_overlap_factor = 0.25`, the values set in its `__init__`."""
    vae = tiny_vae()
    assert (vae.tile_sample_min_size, vae.tile_latent_min_size, vae.tile_overlap_factor) == (16, 8, 0.25)  # fmt: skip
    assert vae.use_tiling is False and vae.use_slicing is False


def test_vae_tiling_is_not_exact(record_calls):
    """With `vae.enable_tiling()` the tiny VAE decodes `(1, 4, 24, 24)` latents through `tiled_decode` into the same `(1, 3, 48, 48)` shape, but not the same numbers: the max abs diff to the whole decode is above 0.1 and below 2 (measured 1.67 with random weights and 8-latent tiles)."""
    vae = tiny_vae()
    z = torch.randn(1, 4, 24, 24, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = vae.decode(z).sample
        vae.enable_tiling()
        decoder = record_calls(vae.decoder)
        tiled = vae.decode(z).sample
    assert tiled.shape == whole.shape == (1, 3, 48, 48)
    # tiles start every int(8 * 0.75) = 6 latents: 4 x 4 tiles of at most 8 x 8
    assert len(decoder.calls) == 16
    assert max(c[0][0].shape[-1] for c in decoder.calls) == 8
    assert 0.1 < (tiled - whole).abs().max().item() < 2.0


def test_real_vaes_tile_only_above_their_sample_size(tmp_path):
    """`vae.enable_tiling()` leaves the default resolution of SD 1.5, SDXL, SD3 and Flux.1 whole: `AutoencoderKL.decode` on their published VAE configs (meta device) reaches `tiled_decode` only for a latent larger than the VAE's tile, `sample_size` pixels, 512 px for SD 1.5 and 1024 px for SDXL, SD3 and Flux.1, which is the size `StableDiffusionPipeline`, `StableDiffusionXLPipeline`, `StableDiffusion3Pipeline` and `FluxPipeline` pick in `__call__` without `height` and `width` (from the published denoiser `sample_size`, for `FluxPipeline` its own `default_sample_size`, and a VAE with the factor 8); it decodes `(1, C, H/8, W/8)` latents, `C` = 4 for SD 1.5 and SDXL and 16 for SD3 and Flux.1, to `(1, 3, H, W)`."""
    from tiny import pipeline_default_sides, real_vae_tiling

    seen = real_vae_tiling()
    assert seen == {"SD 1.5": (4, 512, [65]), "SDXL": (4, 1024, [129]), "SD3": (16, 1024, [129]), "Flux.1": (16, 1024, [129])}  # fmt: skip
    defaults = pipeline_default_sides(tmp_path)  # observed through each pipeline's __call__
    assert defaults == {"SD 1.5": (512, 512), "SDXL": (1024, 1024), "SD3 Medium": (1024, 1024), "Flux.1-dev": (1024, 1024)}  # fmt: skip


def test_vae_slicing_decodes_one_image_at_a_time(record_calls):
    """`vae.enable_slicing()` makes `decode` split a batch of 3 latents into 3 decoder calls of batch 1, and changes the output by at most 1e-5 (measured about 3e-6)."""
    vae = tiny_vae()
    z = torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = vae.decode(z).sample
        vae.enable_slicing()
        decoder = record_calls(vae.decoder)
        sliced = vae.decode(z).sample
    assert [c[0][0].shape[0] for c in decoder.calls] == [1, 1, 1]
    assert (sliced - whole).abs().max().item() <= 1e-5


def test_blend_formula_matches_the_starter(starter):
    """`AutoencoderKL.blend_v` and `blend_h` give the same tensors as the starter's NumPy `blend_v` and `blend_h`: a linear fade over `blend_extent` rows or columns from the previous tile into the next."""
    vae = tiny_vae()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 1, 3, 12, 12))
    for name in ("blend_v", "blend_h"):
        ours = starter[name](a.copy(), b.copy(), 6)
        theirs = getattr(vae, name)(torch.from_numpy(a.copy()), torch.from_numpy(b.copy()), 6)
        np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-12)


def test_vae_switches_live_on_the_vae():
    """In this diffusers version the VAE switches are methods of the VAE, `pipe.vae.enable_slicing()` and `pipe.vae.enable_tiling()`; `StableDiffusionPipeline` has no `enable_vae_slicing` or `enable_vae_tiling`."""
    from diffusers import AutoencoderKL, StableDiffusionPipeline

    assert hasattr(AutoencoderKL, "enable_slicing") and hasattr(AutoencoderKL, "enable_tiling")
    assert not hasattr(StableDiffusionPipeline, "enable_vae_slicing")
    assert not hasattr(StableDiffusionPipeline, "enable_vae_tiling")


def test_offload_methods_and_sequence():
    """`enable_model_cpu_offload` gives each whole component one accelerate hook, chained in the order of `StableDiffusionPipeline.model_cpu_offload_seq`, `"text_encoder->image_encoder->unet->vae"` (components the pipeline lacks are skipped); called without a device on a machine with no accelerator, both offload methods raise `RuntimeError`."""
    from diffusers import StableDiffusionPipeline
    from tiny import tiny_text_encoder

    assert StableDiffusionPipeline.model_cpu_offload_seq == "text_encoder->image_encoder->unet->vae"
    pipe = tiny_sd_pipeline(text_encoder=tiny_text_encoder())
    pipe.enable_model_cpu_offload(device="cpu")  # the real hooks, with the CPU as "device"
    assert [h.model for h in pipe._all_hooks] == [pipe.text_encoder, pipe.unet, pipe.vae]
    if torch.cuda.is_available():
        pytest.skip("an accelerator is present; the CPU-only error does not apply")
    pipe = tiny_sd_pipeline()
    for method in (pipe.enable_model_cpu_offload, pipe.enable_sequential_cpu_offload):
        with pytest.raises(RuntimeError, match="requires accelerator"):
            method()


def test_offload_counts_are_the_pipelines_forwards(starter, monkeypatch, built_pipelines):
    """In `FluxPipeline`, `StableDiffusion3Pipeline`, `StableDiffusionPipeline` and `StableDiffusionXLPipeline`, the starter's `FORWARDS` is the order of the hooked forwards in one `pipe("a cat")` call at the default guidance (SD 1.5's `text_encoder` twice, for the prompt and for `""`; SD3's three text encoders twice each; SDXL's and Flux's once, SDXL's `""` becoming zeros; the denoiser once per entry of `scheduler.timesteps` below 1000 steps, which SD 1.5's shipped `PNDMScheduler(skip_prk_steps=True)` makes `num_inference_steps + 1` long from 2 steps, 3 at the 2 steps run here), its `OFFLOAD_SEQ` is each class's `model_cpu_offload_seq`, and its `model_offload` gives the crossings, the peak resident set and the set resident during each forward that accelerate's real hooks give on that order: a component comes in when its forward starts unless it is still on the device, and goes out when the next component in `model_cpu_offload_seq` starts or at the end of the call, so SD3's `text_encoder` and `text_encoder_2` cross 4 times per call and T5 shares the device with CLIP-L, then CLIP-G. Of the VAE, every family's call runs the `decoder` only, never the `encoder` or `quant_conv`."""
    from diffusers import PNDMScheduler

    variants = {"SD3 Medium, no T5": starter["sd3_no_t5"]}
    for name, (pipe, kwargs) in copy.deepcopy(built_pipelines).items():
        family = name.split(",")[0]
        parts = variants.get(name, starter["sizes"][family])
        if family == "SD 1.5":  # the scheduler SD 1.5's checkpoint ships
            pipe.scheduler = PNDMScheduler(**SD15_PNDM)
        assert starter["OFFLOAD_SEQ"][family] == type(pipe).model_cpu_offload_seq
        vae_runs = []
        for child in ("encoder", "quant_conv", "decoder"):
            if getattr(pipe.vae, child, None) is not None:
                getattr(pipe.vae, child).register_forward_pre_hook(lambda m, a, c=child, runs=vae_runs: runs.append(c))  # fmt: skip
        forwards = hooked_forwards(pipe, monkeypatch, "a cat", num_inference_steps=2, height=HEIGHT, width=WIDTH, output_type="np", **kwargs)  # fmt: skip
        order = starter["call_order"](family, parts, 2)
        assert [n for n, _ in forwards] == order, name
        assert set(vae_runs) == {"decoder"}, name
        crossings, resident = replay_model_offload(forwards, monkeypatch)
        stays = starter["stays"].get(family, 0)
        mine, peak = starter["model_offload"](order, starter["OFFLOAD_SEQ"][family], parts, stays)
        assert mine == crossings, name
        assert peak == stays + max(sum(parts[c] for c in on) for on in resident), name
        during = []  # the bytes on the device during each forward: the timeline's offload line
        starter["model_offload"](order, starter["OFFLOAD_SEQ"][family], parts, stays, during)
        assert during == [stays + sum(parts[c] for c in on) for on in resident], name
        if name == "SD3 Medium":
            assert (crossings["text_encoder"], crossings["text_encoder_2"], crossings["text_encoder_3"]) == (4, 4, 2)  # fmt: skip
            assert {"text_encoder", "text_encoder_3"} in resident
            assert {"text_encoder_2", "text_encoder_3"} in resident


def sd15_meta(cls, component):
    """The real SD 1.5 ``cls`` built in float16 on the meta device from ``model_sizes``' config."""
    from labkit import model_sizes

    config = next(r for r in model_sizes.rows("SD 1.5") if r["component"] == component)["config"]
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)  # build in float16: no .to() cast
    try:
        with torch.device("meta"):
            return cls(**{k: v for k, v in config.items() if not k.startswith("_")})
    finally:
        torch.set_default_dtype(old)


def test_memory_timeline_loop_counts_two_score_tensors(starter):
    """The memory timeline's loop counts what the real SD 1.5 UNet keeps live, not one scores tensor: built from the published config on the meta device in float16, on guidance's batch of 2 at 512 px, its live tensors peak within 10% above the starter's two `(16, 4096, 4096)` with `AttnProcessor` (`get_attention_scores` keeps `baddbmm`'s empty input with the scores, then the scores with their softmax) and within 30% above its two `"auto"` slices after `set_attention_slice("auto")`. Live tensor storages are counted; weights and inputs are not."""
    from diffusers import UNet2DConditionModel
    from diffusers.models.attention_processor import AttnProcessor
    from sizes import _live_tensor_peak

    unet = sd15_meta(UNet2DConditionModel, "unet")
    with torch.device("meta"):
        x, t = torch.zeros(2, 4, 64, 64, dtype=torch.float16), torch.tensor(500)
        context = torch.zeros(2, 77, 768, dtype=torch.float16)
    inputs = [*unet.parameters(), *unet.buffers(), x, t, context]
    unet.set_attn_processor(AttnProcessor())
    whole, _ = _live_tensor_peak(lambda: unet(x, t, context), inputs)
    assert 2 * starter["scores_values"] <= whole < 1.1 * 2 * starter["scores_values"]
    unet.set_attention_slice("auto")
    sliced, _ = _live_tensor_peak(lambda: unet(x, t, context), inputs)
    assert 2 * starter["auto_values"] <= sliced < 1.3 * 2 * starter["auto_values"]


def test_memory_timeline_decode_counts_three_widest_outputs(starter):
    """The memory timeline's decode counts what the real SD 1.5 VAE keeps live, three tensors of its decoder's widest output, not one: `AutoencoderKL.decode` of `(1, 4, 64, 64)`, built from the published config on the meta device in float16, peaks within 0.1% above the starter's count (the last up block's first resnet holds its input for the shortcut, its `GroupNorm` output and their SiLU). Live tensor storages are counted; weights and the latents are not."""
    from diffusers import AutoencoderKL
    from sizes import _live_tensor_peak

    vae = sd15_meta(AutoencoderKL, "vae")
    with torch.device("meta"):
        z = torch.zeros(1, 4, 64, 64, dtype=torch.float16)
    decode, _ = _live_tensor_peak(lambda: vae.decode(z), [*vae.parameters(), *vae.buffers(), z])
    assert 2 * starter["decode_values"] <= decode < 1.001 * 2 * starter["decode_values"]


def test_sequential_bytes_leave_out_the_vae_encoder(starter):
    """The starter's `vae_encoder_params`, from each family's published VAE config in `model_sizes`, equals the parameters of `AutoencoderKL`'s `encoder` and `quant_conv` built from that config on the meta device (34,163,664 for SD 1.5 and SDXL, 34,274,208 for SD3 and Flux.1, which have no `quant_conv`)."""
    from diffusers import AutoencoderKL

    seen = {}
    for family, row in starter["vae_rows"].items():
        with torch.device("meta"):
            vae = AutoencoderKL.from_config(row["config"])
        quant = sum(p.numel() for p in vae.quant_conv.parameters()) if vae.quant_conv is not None else 0  # fmt: skip
        assert starter["vae_encoder_params"](row["config"]) == sum(p.numel() for p in vae.encoder.parameters()) + quant, family  # fmt: skip
        assert row["params"] == sum(p.numel() for p in vae.parameters()), family
        seen[family] = starter["vae_encoder_params"](row["config"])
    assert seen == {"SD 1.5": 34_163_664, "SDXL": 34_163_664, "SD3 Medium": 34_274_208, "Flux.1-dev": 34_274_208}  # fmt: skip


def test_sequential_offload_streams_what_each_forward_runs(starter, monkeypatch, built_pipelines):
    """In `FluxPipeline`, `StableDiffusion3Pipeline`, `StableDiffusionPipeline` and `StableDiffusionXLPipeline`, under the real `enable_sequential_cpu_offload`, one `pipe("a cat")` call loads, over the hooks of each component's submodules, that component's whole weight bytes once per forward in the starter's `call_order`, except the VAE's `encoder` and `quant_conv`, which never load: the rule behind the starter's sequential column, on every family's tiny pipeline. SDXL's float16 VAE, upcast by the pipeline, loads 4 bytes per weight."""
    from contextlib import nullcontext

    import accelerate.hooks
    from diffusers import PNDMScheduler

    original = accelerate.hooks.set_module_tensor_to_device
    for name, (pipe, kwargs) in copy.deepcopy(built_pipelines).items():
        if name == "SD3 Medium, no T5":  # shares its parts with "SD3 Medium"
            continue
        family = name.split(",")[0]
        if family == "SD 1.5":  # the scheduler SD 1.5's checkpoint ships
            pipe.scheduler = PNDMScheduler(**SD15_PNDM)
        if family == "SDXL":
            pipe.vae.to(torch.float16)  # force_upcast: the pipeline casts it to float32
        owner = {id(m): c for c, part in pipe.components.items() if isinstance(part, torch.nn.Module) for m in part.modules()}  # fmt: skip
        size = lambda module: sum(p.numel() * p.element_size() for p in module.parameters())  # noqa: E731
        parts = {c: size(owner_part) for c, owner_part in pipe.components.items() if isinstance(owner_part, torch.nn.Module)}  # fmt: skip
        skipped = sum(size(m) for m in (pipe.vae.encoder, pipe.vae.quant_conv) if m is not None)
        loaded = dict.fromkeys(parts, 0)

        def spy(module, tensor, device, value=None, *a, loaded=loaded, owner=owner, **k):
            if str(device) == "meta" and tensor in module._parameters:
                # the hook's drop after the forward; on torch 2.13 its own call raises
                # TypeError on the CPU (see the memory page's test), so drop by hand
                old = module._parameters[tensor]
                module._parameters[tensor] = torch.nn.Parameter(old.detach().to("meta"), requires_grad=False)  # fmt: skip
                return None
            if value is not None and tensor in module._parameters:  # a load, cast to its dtype
                loaded[owner[id(module)]] += value.numel() * module._parameters[tensor].element_size()  # fmt: skip
            return original(module, tensor, device, value, *a, **k)

        monkeypatch.setattr(accelerate.hooks, "set_module_tensor_to_device", spy)
        pipe.enable_sequential_cpu_offload(device="cpu")
        upcast = pytest.warns(FutureWarning, match="upcast_vae") if family == "SDXL" else nullcontext()  # fmt: skip
        with torch.no_grad(), upcast:  # SDXL: the deprecated upcast_vae()
            pipe("a cat", num_inference_steps=2, height=HEIGHT, width=WIDTH, output_type="np", **kwargs)  # fmt: skip
        monkeypatch.setattr(accelerate.hooks, "set_module_tensor_to_device", original)
        factor = 2 if family == "SDXL" else 1  # float32 loads of a float16 VAE
        expected = dict.fromkeys(parts, 0)
        for component in starter["call_order"](family, parts, 2):
            expected[component] += parts[component] * (factor if component == "vae" else 1)
        per_weight = factor * parts["vae"] // sum(p.numel() for p in pipe.vae.parameters())
        assert skipped * factor == starter["vae_encoder_params"](pipe.vae.config) * per_weight, name
        expected["vae"] -= skipped * factor
        assert loaded == expected, name
        assert sum(loaded.values()) > 0 and loaded["vae"] > 0, name


def test_denoiser_calls_are_the_shipped_schedulers_timesteps(starter):
    """The starter's denoiser count, `DENOISER_CALLS`, is `len(scheduler.timesteps)` after `set_timesteps(n)` for every `n` from 1 to 50 with the scheduler each family ships: `num_inference_steps + 1` (from 2 steps) with SD 1.5's `PNDMScheduler(skip_prk_steps=True, steps_offset=1)`, 31 UNet calls at 30 steps, and `num_inference_steps` with SDXL's `EulerDiscreteScheduler` and SD3's and Flux's `FlowMatchEulerDiscreteScheduler`."""
    from diffusers import EulerDiscreteScheduler, FlowMatchEulerDiscreteScheduler, PNDMScheduler

    shipped = {
        "SD 1.5": PNDMScheduler(**SD15_PNDM),
        "SDXL": EulerDiscreteScheduler(**SD_BETAS, steps_offset=1, timestep_spacing="leading"),
        "SD3 Medium": FlowMatchEulerDiscreteScheduler(shift=3.0),
        "Flux.1-dev": FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),
    }
    for family, scheduler in shipped.items():
        parts = starter["sizes"][family]
        denoiser = "unet" if "unet" in parts else "transformer"
        for n in range(1, 51):
            kwargs = {"mu": 1.0} if family == "Flux.1-dev" else {}
            scheduler.set_timesteps(n, **kwargs)
            assert starter["call_order"](family, parts, n).count(denoiser) == len(scheduler.timesteps), (family, n)  # fmt: skip
    assert starter["call_order"]("SD 1.5", starter["sizes"]["SD 1.5"], 30).count("unet") == 31


def test_sd15_pndm_counts_hold_to_999_steps_and_step_raises_at_1000(starter, run_cli):
    """SD 1.5's `PNDMScheduler(skip_prk_steps=True)` gives `steps + 1` timesteps from 2 to 999 steps, and `step` over them runs at 999; at 1000 steps its `step` raises `IndexError`, so the starter's `--steps` stops at 999 (one-line error at 1000), its `DENOISER_CALLS` matches the scheduler at 999, and each sentence of the page and of its tested-sentences list that says "once per entry" carries "below 1000 steps", and each that says `+ 1` carries "from 2"."""
    from diffusers import PNDMScheduler

    def run(n):
        scheduler, x = PNDMScheduler(**SD15_PNDM), torch.zeros(1, 1)
        scheduler.set_timesteps(n)
        for t in scheduler.timesteps:
            x = scheduler.step(torch.zeros(1, 1), t, x).prev_sample
        return len(scheduler.timesteps)

    assert run(999) == 1000 == starter["DENOISER_CALLS"]["SD 1.5"](999)
    pndm = PNDMScheduler(**SD15_PNDM)
    for steps in range(2, 1000):  # the length at every step count the starter accepts
        pndm.set_timesteps(steps)
        assert len(pndm.timesteps) == steps + 1 == starter["DENOISER_CALLS"]["SD 1.5"](steps)
    with pytest.raises(IndexError):
        run(1000)
    refused = run_cli(LAB10, "--steps", "1000")
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    import re

    from infralens_docs.registry import ROOT

    page = (ROOT / "docs" / "labs" / "lab-10-memory-optimization-reading.md").read_text(
        encoding="utf-8"
    )
    # the page's prose, and the tested sentences it renders: this module's docstrings
    shown = [f.__doc__.split("\n\n")[0] for n, f in globals().items() if n.startswith("test_")]
    sentences = [part for text in [page, *shown] for part in re.split(r"(?<=[.!?])\s+", text)]
    counts = [part for part in sentences if "once per entry of `scheduler.timesteps`" in part]
    assert len(counts) == 2 and all("below 1000 steps" in c.lower() for c in counts), counts
    plus_one = [part for part in sentences if "+ 1`" in part]
    assert len(plus_one) >= 4 and all("from 2" in c for c in plus_one), plus_one


def test_to_dtype_matches_torch_casts_of_float32_values(starter):
    """The starter's `to_dtype` (`labkit.precision.round_to`) gives what torch 2.13.0's CPU casts to `torch.float16` and `torch.bfloat16` give for float32 values, bit for bit, but not always for the float64 values the lab stores: torch casts a float64 tensor through float32, rounding twice (`1 + 2**-8 + 2**-30` becomes 1.0 in `torch.bfloat16`, 1.0078125 in `to_dtype`)."""
    import re

    from infralens_docs.registry import ROOT

    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 100.0
    bits = torch.randint(-(2**31), 2**31 - 1, (100_000,), generator=torch.Generator().manual_seed(1), dtype=torch.int64)  # fmt: skip
    edges = torch.tensor([65504.0, 65519.0, 65520.0, 3e-8, 1e-40, 3.4e38, float("inf"), -0.0])
    x = torch.cat([x, bits.to(torch.int32).view(torch.float32), edges])  # any float32 bit pattern
    near_tie = torch.tensor([1 + 2**-8 + 2**-30], dtype=torch.float64)
    for name, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        expected = x.to(dtype).double().numpy()
        np.testing.assert_array_equal(starter["to_dtype"](x.double().numpy(), name), expected)
    assert near_tie.to(torch.bfloat16).item() == 1.0
    assert starter["to_dtype"](near_tie.numpy(), "bfloat16")[0] == 1.0078125
    # so every sentence of the page and the starter that compares it with torch's casts
    # names float32 values (the lab's own values are float64)
    texts = [(ROOT / "docs/labs/lab-10-memory-optimization-reading.md").read_text(encoding="utf-8"), (ROOT / LAB10).read_text(encoding="utf-8")]  # fmt: skip
    sentences = [p for t in texts for p in re.split(r"(?<=[.!?])\s+", t.replace("\n# ", " "))]
    casts = [p for p in sentences if "torch's" in p and "casts" in p]
    assert casts and all("float32" in p for p in casts), casts


def test_safety_checker_count_from_shapes(starter):
    """The starter's `clip_vision_params` count of SD's `safety_checker` equals the parameters of diffusers' `StableDiffusionSafetyChecker` built on the meta device from CLIP ViT-L/14's vision configuration (hidden 1024, 24 layers, MLP 4096, patch 14, 224 px, projection 768)."""
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig

    vision = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16, patch_size=14, image_size=224)  # fmt: skip
    with torch.device("meta"):
        checker = StableDiffusionSafetyChecker(CLIPConfig(vision_config=vision, projection_dim=768))
    assert starter["safety_checker_params"] == sum(p.numel() for p in checker.parameters())


def test_t5_wo_count_from_the_config(starter):
    """The starter's count of T5-XXL's `wo` weights, `num_layers * d_ff * d_model` from the published config in `model_sizes`, equals the parameters of the `wo` layers of `T5EncoderModel` built from that config on the meta device."""
    from model_configs import T5_XXL
    from transformers import T5Config, T5EncoderModel

    with torch.device("meta"):
        t5 = T5EncoderModel(T5Config(**T5_XXL))
    wo = sum(p.numel() for n, p in t5.named_parameters() if n.endswith(".wo.weight"))
    assert starter["t5_wo_params"] == wo


def test_sd3_pos_embed_buffer_from_the_config(starter):
    """The starter's SD3 `pos_embed` count, `pos_embed_max_size**2 * num_attention_heads * attention_head_dim` from the published config in `model_sizes`, is the one buffer of `SD3Transformer2DModel` built from that config on the meta device: 56,623,104 values, persistent (in the `state_dict`, so `from_pretrained` loads it in the pipeline's dtype) and not a parameter."""
    from diffusers import SD3Transformer2DModel
    from model_configs import SD3_MEDIUM_TRANSFORMER

    with torch.device("meta"):
        transformer = SD3Transformer2DModel(**SD3_MEDIUM_TRANSFORMER)
    buffers = dict(transformer.named_buffers())
    assert list(buffers) == ["pos_embed.pos_embed"] and "pos_embed.pos_embed" in transformer.state_dict()  # fmt: skip
    assert starter["pos_embed_values"] == buffers["pos_embed.pos_embed"].numel() == 56_623_104


def test_unet_flops_from_layer_shapes(starter):
    """The starter's `unet_macs`, counted from the layer shapes of SD 1.5's published UNet config, equals half the FLOPs `torch.utils.flop_counter.FlopCounterMode` counts for one forward of the real `UNet2DConditionModel` on a `(1, 4, 64, 64)` latent and 77 text tokens, built on the meta device."""
    from diffusers import UNet2DConditionModel
    from torch.utils.flop_counter import FlopCounterMode

    from labkit import model_sizes

    config = next(r for r in model_sizes.rows("SD 1.5") if r["component"] == "unet")["config"]
    with torch.device("meta"):
        unet = UNet2DConditionModel(**config)
        sample, text, t = torch.empty(1, 4, 64, 64), torch.empty(1, 77, 768), torch.tensor([500])
    with FlopCounterMode(display=False) as counter:
        unet(sample, t, encoder_hidden_states=text)
    assert 2 * starter["unet_macs"](config) == counter.get_total_flops() == starter["row_flops"]
