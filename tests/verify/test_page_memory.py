"""The memory and speed optimizations page against the installed diffusers.

Tiny random-config parts from ``tiny.py``. The offload methods need an accelerator
unless they are given a device: with ``device="cpu"`` they install their real hooks on
the CPU, so the tests watch what model offload moves and when (a CPU-to-CPU move is
recorded, not timed). Slicing, `dtype=`, T5's float32 `wo` and SD3 without T5 run
through the real pipelines and `from_pretrained`.
"""

from __future__ import annotations

import pytest
import torch
from tiny import (
    EMBED_DIM,
    HEIGHT,
    SD15_PNDM,
    WIDTH,
    embeds,
    hooked_forwards,
    random_ip_adapter,
    replay_model_offload,
    sdxl_call,
    simulated_stream_offload,
    start_latents,
    text_to_image_pipelines,
    tiny_flux_pipeline,
    tiny_sd3_pipeline,
    tiny_sd_pipeline,
    tiny_sdxl_pipeline,
    tiny_text_encoder,
    tiny_tokenizer,
    tiny_unet,
    tiny_vae,
    traffic,
)

CPU = torch.device("cpu")


# ---------------------------------------------------------------- attention


def test_sdpa_is_the_default_attention(monkeypatch):
    """Without any switch, every attention layer of SD 1.5's `UNet2DConditionModel` (its published config on the meta device, and a tiny one of the same block types) uses `AttnProcessor2_0`, the processor that calls `F.scaled_dot_product_attention` on torch 2."""
    from diffusers import UNet2DConditionModel
    from diffusers.models.attention_processor import AttnProcessor2_0
    from model_configs import SD15_UNET

    with torch.device("meta"):
        sd15 = UNet2DConditionModel(**SD15_UNET)
    assert {type(p) for p in sd15.attn_processors.values()} == {AttnProcessor2_0}
    unet = tiny_unet()
    assert {type(p) for p in unet.attn_processors.values()} == {AttnProcessor2_0}
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))  # fmt: skip
    with torch.no_grad():
        unet(start_latents(), 10, encoder_hidden_states=embeds(0))
    assert len(calls) == len(unet.attn_processors)  # one SDPA call per attention layer


def test_auto_slice_is_half_the_heads():
    """`enable_attention_slicing("auto")` gives every attention layer of an SD UNet a `SlicedAttnProcessor` with `slice_size` equal to half its number of heads (`sliceable_head_dim // 2`), and `"max"` gives `slice_size = 1`: on a UNet whose levels have 2 and 4 heads, each layer gets half of its own."""
    from diffusers.models.attention_processor import Attention, SlicedAttnProcessor

    pipe = tiny_sd_pipeline(unet=tiny_unet(attention_head_dim=(2, 4)))
    pipe.enable_attention_slicing("auto")
    layers = [m for m in pipe.unet.modules() if isinstance(m, Attention)]
    assert {m.heads for m in layers} == {2, 4}  # per-layer, not one size for the model
    assert all(isinstance(m.processor, SlicedAttnProcessor) for m in layers)
    assert all(m.processor.slice_size == m.sliceable_head_dim // 2 == m.heads // 2 for m in layers)  # fmt: skip
    pipe.enable_attention_slicing("max")
    assert {p.slice_size for p in pipe.unet.attn_processors.values()} == {1}


def memory_flux_pipeline():
    """``tiny_flux_pipeline`` without guidance embedding, with quant convs in its VAE and no
    dynamic shifting: FluxPipeline around a one-block FluxTransformer2DModel."""
    return tiny_flux_pipeline(
        guidance_embeds=False,
        vae_config=dict(use_quant_conv=True, use_post_quant_conv=True, sample_size=32),
        use_dynamic_shifting=False,
    )


def test_attention_slicing_is_a_no_op_on_sd3_and_flux():
    """On `StableDiffusion3Pipeline` and `FluxPipeline`, `pipe.enable_attention_slicing()` changes nothing and raises nothing: the pipeline method only calls components that have `set_attention_slice`, and none of theirs (`SD3Transformer2DModel`, `FluxTransformer2DModel`, `AutoencoderKL`) has one."""
    for pipe in (tiny_sd3_pipeline(), memory_flux_pipeline()):
        modules = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
        assert {"transformer", "vae"} <= modules.keys()
        assert not any(hasattr(m, "set_attention_slice") for m in modules.values())
        before = {n: dict(m.attn_processors) for n, m in modules.items()}
        pipe.enable_attention_slicing()
        pipe.enable_attention_slicing("max")
        for n, m in modules.items():  # the same processor objects in every component
            assert m.attn_processors.keys() == before[n].keys()
            assert all(m.attn_processors[k] is before[n][k] for k in before[n])


def live_square_tensors(fn, n):
    """Run ``fn()`` under a dispatch mode: the most tensors with last two dims ``(n, n)``
    (score-shaped) alive at once after any aten op, and the shapes of those made."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    refs, shapes, most = [], [], 0

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            nonlocal most
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.dim() >= 2 and tuple(t.shape[-2:]) == (n, n):
                    refs.append(weakref.ref(t))
                    shapes.append(tuple(t.shape))
            alive = {r().untyped_storage().data_ptr() for r in refs if r() is not None}
            most = max(most, len(alive))
            return out

    with torch.no_grad(), Watch():
        fn()
    return most, shapes


def test_sdpa_stores_the_scores_only_in_its_math_backend():
    """On the CPU, `F.scaled_dot_product_attention` (what `AttnProcessor2_0` calls) by default makes no `(B, heads, N, N)` tensor, while under `sdpa_kernel(SDPBackend.MATH)` it materialises the scores; the sliced processor `SlicedAttnProcessor(slice_size)` keeps two `(slice_size, N, N)` tensors alive at once, the scores with `torch.baddbmm`'s `torch.empty` input, then the scores with their softmax."""
    from diffusers.models.attention_processor import (
        Attention,
        AttnProcessor2_0,
        SlicedAttnProcessor,
    )
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    n = 64
    attn = Attention(query_dim=32, heads=4, dim_head=8).eval()
    x = torch.randn(2, n, 32)
    attn.set_processor(AttnProcessor2_0())
    assert live_square_tensors(lambda: attn(x), n) == (0, [])
    with sdpa_kernel(SDPBackend.MATH):
        most, shapes = live_square_tensors(lambda: attn(x), n)
    assert most >= 1 and (2, 4, n, n) in shapes
    attn.set_processor(SlicedAttnProcessor(2))
    most, shapes = live_square_tensors(lambda: attn(x), n)
    assert most == 2 and set(shapes) == {(2, n, n)}  # 2 * 4 rows of B * heads, 2 at a time


def test_attention_slicing_drops_a_loaded_ip_adapter():
    """On a UNet, `enable_attention_slicing()` replaces every attention processor, so after `load_ip_adapter` it swaps the `IPAdapterAttnProcessor2_0` of each cross-attention layer for a `SlicedAttnProcessor`: the IP-Adapter's `to_k_ip` and `to_v_ip` are no longer used, and `disable_attention_slicing()` does not bring them back."""
    from diffusers.models.attention_processor import (
        AttnProcessor2_0,
        IPAdapterAttnProcessor2_0,
        SlicedAttnProcessor,
    )

    pipe = tiny_sd_pipeline()
    pipe.load_ip_adapter(random_ip_adapter(pipe.unet, std=1.0), subfolder="", weight_name="", image_encoder_folder=None)  # fmt: skip
    assert (
        sum(type(p) is IPAdapterAttnProcessor2_0 for p in pipe.unet.attn_processors.values()) == 4
    )
    pipe.enable_attention_slicing()
    assert {type(p) for p in pipe.unet.attn_processors.values()} == {SlicedAttnProcessor}
    pipe.disable_attention_slicing()
    assert {type(p) for p in pipe.unet.attn_processors.values()} == {AttnProcessor2_0}


# ---------------------------------------------------------------- VAE


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


def test_tiling_only_above_the_tile_size(monkeypatch):
    """`vae.enable_tiling()` sends latents larger than `tile_latent_min_size` to `tiled_decode` (`tile_overlap_factor` 0.25) and decodes the others, up to that size, whole; the tiled result differs from the whole decode at every pixel, not only at the seams (on the tiny VAE, every pixel of a `(1, 3, 48, 48)` image by more than 1e-3)."""
    vae = tiny_vae()
    assert vae.tile_overlap_factor == 0.25
    vae.enable_tiling()
    calls = []
    original = vae.tiled_decode
    monkeypatch.setattr(vae, "tiled_decode", lambda z, **kw: calls.append(z.shape) or original(z, **kw))  # fmt: skip
    small = torch.randn(1, 4, vae.tile_latent_min_size, vae.tile_latent_min_size)
    big = torch.randn(1, 4, 24, 24, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        vae.decode(small)
        assert calls == []
        tiled = vae.decode(big).sample
        vae.disable_tiling()
        whole = vae.decode(big).sample
    assert calls == [big.shape]
    per_pixel = (tiled - whole).abs().amax(dim=1)  # (1, 48, 48): the largest channel difference
    assert per_pixel.min().item() > 1e-3  # everywhere, seams and tile interiors alike


def test_tiling_acts_only_above_the_vae_sample_size(tmp_path):
    """`vae.enable_tiling()` tiles only a latent larger than the VAE's tile, its `sample_size`: 512 px for SD 1.5 and 1024 px for SDXL, SD3 and Flux.1 (their published VAE configs, on the meta device), each family's default resolution (the size `StableDiffusionPipeline`, `StableDiffusionXLPipeline`, `StableDiffusion3Pipeline` and `FluxPipeline` pick in `__call__` without `height` and `width`, from the published denoiser `sample_size`, for `FluxPipeline` its own `default_sample_size`, and a VAE with the factor 8), which therefore decodes whole, unchanged, while 8 px more is tiled; through a tiny `StableDiffusionPipeline` with `vae.enable_tiling()`, a call at its default height and width never reaches `tiled_decode`, and one 8 px larger does."""
    from tiny import pipeline_default_sides, real_vae_tiling

    tiled = {name: (side, calls) for name, (_, side, calls) in real_vae_tiling().items()}
    assert tiled == {"SD 1.5": (512, [65]), "SDXL": (1024, [129]), "SD3": (1024, [129]), "Flux.1": (1024, [129])}  # fmt: skip
    defaults = pipeline_default_sides(tmp_path)  # observed through each pipeline's __call__
    assert defaults == {"SD 1.5": (512, 512), "SDXL": (1024, 1024), "SD3 Medium": (1024, 1024), "Flux.1-dev": (1024, 1024)}  # fmt: skip
    pipe = tiny_sd_pipeline()
    pipe.vae.enable_tiling()
    calls, original = [], pipe.vae.tiled_decode
    pipe.vae.tiled_decode = lambda z, **kw: calls.append(tuple(z.shape)) or original(z, **kw)
    default = pipe.unet.config.sample_size * pipe.vae_scale_factor
    assert default == pipe.vae.config.sample_size == HEIGHT
    for size in (None, default + 8):  # None: the pipeline's default
        pipe(prompt_embeds=embeds(0), negative_prompt_embeds=embeds(1), height=size, width=size, num_inference_steps=1, output_type="np")  # fmt: skip
    assert calls == [(1, 4, 12, 12)]  # only the larger call: (16 + 8) px / 2


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


# ---------------------------------------------------------------- precision


def test_dtype_is_the_loading_argument(tmp_path):
    """`DiffusionPipeline.from_pretrained(..., dtype=torch.float16)` loads a tiny `StableDiffusionPipeline`'s UNet and VAE with every weight in float16 (not every component: SD3's T5 keeps its `wo` layers in float32, below); the older `torch_dtype=` still works but raises a `FutureWarning` that it is deprecated."""
    from diffusers import DiffusionPipeline

    tiny_sd_pipeline().save_pretrained(tmp_path)
    none = dict(text_encoder=None, tokenizer=None)  # the tiny pipeline runs on prompt_embeds
    pipe = DiffusionPipeline.from_pretrained(tmp_path, dtype=torch.float16, **none)
    loaded = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    assert loaded.keys() == {"unet", "vae"}  # the components the sentence names
    assert {p.dtype for m in loaded.values() for p in m.parameters()} == {torch.float16}
    with pytest.warns(FutureWarning, match="torch_dtype"):
        old = DiffusionPipeline.from_pretrained(tmp_path, torch_dtype=torch.float16, **none)
    assert old.unet.dtype == torch.float16


def test_t5_keeps_wo_in_float32_under_float16(tmp_path):
    """Loading with `dtype=torch.float16`, `DiffusionPipeline.from_pretrained` leaves SD3's `T5EncoderModel` `wo` layers (its `_keep_in_fp32_modules`) in float32, not with `torch.bfloat16`, and a later `pipe.to(dtype=torch.float16)` casts them to float16 too; in T5-XXL's published config they are 1,006,632,960 of its weights."""
    from diffusers import DiffusionPipeline
    from model_configs import T5_XXL
    from transformers import T5Config, T5EncoderModel

    assert T5EncoderModel._keep_in_fp32_modules == ["wo"]
    t5 = T5EncoderModel(T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4, feed_forward_proj="gated-gelu"))  # fmt: skip
    tiny_sd3_pipeline(text_encoder_3=t5).save_pretrained(tmp_path)
    absent = dict.fromkeys(["text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "tokenizer_3"])  # fmt: skip

    def dtypes(pipe):
        params = dict(pipe.text_encoder_3.named_parameters())
        wo = {p.dtype for n, p in params.items() if n.endswith(".wo.weight")}
        return wo, {p.dtype for n, p in params.items() if not n.endswith(".wo.weight")}

    for dtype, wo_dtype in [(torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16)]:
        pipe = DiffusionPipeline.from_pretrained(tmp_path, dtype=dtype, **absent)
        assert dtypes(pipe) == ({wo_dtype}, {dtype}) and pipe.transformer.dtype == dtype
    pipe.to(dtype=torch.float16)  # a cast after loading knows nothing of _keep_in_fp32_modules
    assert dtypes(pipe) == ({torch.float16}, {torch.float16})
    with torch.device("meta"):
        xxl = T5EncoderModel(T5Config(**T5_XXL))
    assert sum(p.numel() for n, p in xxl.named_parameters() if n.endswith(".wo.weight")) == 1_006_632_960  # fmt: skip


def test_sdxl_decodes_an_fp16_vae_in_float32():
    """`StableDiffusionXLPipeline.__call__` decodes a float16 `AutoencoderKL` whose `force_upcast` is true (the class default) in float32: `vae.decode` receives float32 `latents` while the decoder's weights are float32 (cast by the deprecated `upcast_vae()`, which raises a `FutureWarning`), and the VAE is cast back to float16 after the decode."""
    pipe = tiny_sdxl_pipeline()
    pipe.to(torch.float16)
    assert pipe.vae.config.force_upcast is True and pipe.vae.dtype == torch.float16
    seen, decode = [], pipe.vae.decode
    pipe.vae.decode = lambda z, *a, **k: seen.append((z.dtype, pipe.vae.decoder.conv_in.weight.dtype)) or decode(z, *a, **k)  # fmt: skip
    with pytest.warns(FutureWarning, match="upcast_vae"):  # the deprecated upcast_vae()
        sdxl_call(pipe, torch.float16, output_type="np")
    assert seen == [(torch.float32, torch.float32)] and pipe.vae.dtype == torch.float16


def test_sdxl_vae_crosses_in_as_float32_under_model_offload(monkeypatch):
    """SDXL's VAE is cast to float32 for the decode, so under model offload it crosses in at 4 bytes per weight: in a float16 `StableDiffusionXLPipeline` call under `enable_model_cpu_offload` (CPU as the device), the VAE's weights are already float32 when its accelerate hook (`CpuOffload.pre_forward`) copies it to the device, while the UNet's are float16."""
    import accelerate.hooks

    pipe = tiny_sdxl_pipeline()
    pipe.to(torch.float16)
    names = {id(m): n for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    seen, original = [], accelerate.hooks.CpuOffload.pre_forward

    def pre_forward(self, module, *a, **k):
        seen.append((names[id(module)], next(module.parameters()).dtype))
        return original(self, module, *a, **k)

    monkeypatch.setattr(accelerate.hooks.CpuOffload, "pre_forward", pre_forward)
    pipe.enable_model_cpu_offload(device="cpu")
    with pytest.warns(FutureWarning, match="upcast_vae"):  # the deprecated upcast_vae()
        sdxl_call(pipe, torch.float16, output_type="np")
    assert ("vae", torch.float32) in seen and ("vae", torch.float16) not in seen
    assert {d for n, d in seen if n == "unet"} == {torch.float16}


def test_sd3_runs_without_its_t5_encoder(tmp_path, record_calls):
    """`StableDiffusion3Pipeline` built with `text_encoder_3=None` and `tokenizer_3=None` encodes a prompt with its two CLIP encoders and passes zeros where the T5 tokens would be, so it runs without T5's weights."""

    def clip(seed):
        return tiny_text_encoder(16, seed=seed, with_projection=True, projection_dim=8, num_hidden_layers=1, num_attention_heads=2)  # fmt: skip

    tokenizer = tiny_tokenizer(tmp_path)
    pipe = tiny_sd3_pipeline(text_encoder=clip(0), text_encoder_2=clip(1), tokenizer=tokenizer, tokenizer_2=tokenizer)  # fmt: skip
    calls = record_calls(pipe.transformer).calls
    pipe(prompt="a cat", num_inference_steps=2, height=HEIGHT, width=WIDTH, latents=start_latents(), max_sequence_length=16, output_type="latent")  # fmt: skip
    hidden = calls[0][1]["encoder_hidden_states"]  # (2B, 77 CLIP + 16 T5 tokens, joint dim)
    assert hidden.shape == (2, 77 + 16, EMBED_DIM)
    assert hidden[:, 77:].abs().max() == 0 and hidden[:, :77].abs().max() > 0


# ---------------------------------------------------------------- offload


def tiny_safety_checker():
    """StableDiffusionSafetyChecker on a tiny CLIP vision config, with its image processor."""
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig, CLIPImageProcessor

    torch.manual_seed(0)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8)  # fmt: skip
    checker = StableDiffusionSafetyChecker(
        CLIPConfig(vision_config=vision, projection_dim=8)
    ).eval()
    return checker, CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})  # fmt: skip


def watch_moves(pipe, monkeypatch):
    """``(component, "in" | "out")`` for every `.to()` that changes where a component is.

    With ``enable_model_cpu_offload(device="cpu")`` the execution device is ``cpu:0`` and
    the offload device ``cpu``: the two are told apart by the index, as cuda:0 and cpu are.
    """
    names = {id(m): n for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    where = dict.fromkeys(names.values(), "out")
    moves = []
    original = torch.nn.Module.to

    def to(self, *args, **kwargs):
        target = args[0] if args else kwargs.get("device")
        if id(self) in names and isinstance(target, (str, torch.device)):
            side = "in" if torch.device(target).index is not None else "out"
            if where[names[id(self)]] != side:
                where[names[id(self)]] = side
                moves.append((names[id(self)], side))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", to)
    return moves


def test_model_offload_moves_each_component_in_and_out(monkeypatch, tmp_path):
    """Under `enable_model_cpu_offload`, a call moves each component to the GPU when its forward starts, in `model_cpu_offload_seq` order (`"text_encoder->image_encoder->unet->vae"`), and each hook holds the previous component's as `prev_module_hook`, which accelerate offloads when the forward starts if that component is not on the CPU (a move this CPU-only test sees only as the chain); at the end of the call `maybe_free_model_hooks` re-runs `enable_model_cpu_offload`, whose `pipe.to("cpu")` moves every component back, and the `safety_checker` (`_exclude_from_cpu_offload`, no hook) is moved to the GPU again right after. In `StableDiffusionPipeline`'s order each hooked component whose forward runs crosses the bus twice per call, and one whose forward never runs does not cross: with `output_type="latent"` the VAE stays off the GPU (the unhooked `safety_checker` still goes out and back in)."""
    from diffusers import StableDiffusionPipeline

    assert StableDiffusionPipeline.model_cpu_offload_seq == "text_encoder->image_encoder->unet->vae"
    assert StableDiffusionPipeline._exclude_from_cpu_offload == ["safety_checker"]
    checker, processor = tiny_safety_checker()
    pipe = tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer(tmp_path), safety_checker=checker, feature_extractor=processor)  # fmt: skip
    moves = watch_moves(pipe, monkeypatch)
    pipe.enable_model_cpu_offload(device="cpu")
    assert moves == [("safety_checker", "in")]
    chain = [(h.model, h.hook.prev_module_hook) for h in pipe._all_hooks]
    assert [m for m, _ in chain] == [pipe.text_encoder, pipe.unet, pipe.vae]
    assert [prev and prev.model for _, prev in chain] == [None, pipe.text_encoder, pipe.unet]
    for _ in range(2):  # the same every call: maybe_free_model_hooks re-arms the hooks
        moves.clear()
        pipe("a cat", num_inference_steps=3, height=HEIGHT, width=WIDTH, latents=start_latents(), output_type="np")  # fmt: skip
        # On a GPU each hook also offloads the previous component when its forward starts;
        # accelerate skips that when the previous one's weights report device "cpu", as here.
        assert moves == [
            ("text_encoder", "in"), ("unet", "in"), ("vae", "in"),  # each when its forward starts
            ("safety_checker", "out"), ("text_encoder", "out"), ("unet", "out"), ("vae", "out"),
            ("safety_checker", "in"),  # maybe_free_model_hooks: pipe.to("cpu"), then re-hooks
        ]  # fmt: skip
    moves.clear()  # no decode: the VAE's forward never starts, so it never comes in
    pipe("a cat", num_inference_steps=3, height=HEIGHT, width=WIDTH, latents=start_latents(), output_type="latent")  # fmt: skip
    assert moves == [
        ("text_encoder", "in"), ("unet", "in"),
        ("safety_checker", "out"), ("text_encoder", "out"), ("unet", "out"),
        ("safety_checker", "in"),
    ]  # fmt: skip


def test_model_offload_sends_a_component_out_when_the_next_in_the_chain_starts(
    monkeypatch, tmp_path
):
    """Under `enable_model_cpu_offload`, accelerate's hook copies a component in when its forward starts unless it is still on the device, and sends out only the previous component of `model_cpu_offload_seq`: with classifier-free guidance (not an LCM UNet's `time_cond_proj_dim` guidance, which encodes once at `guidance_scale=7.5`), `StableDiffusionPipeline` runs `text_encoder` twice (prompt, then `""`) and its UNet once per entry of `scheduler.timesteps` below 1000 steps: with SD 1.5's shipped `PNDMScheduler(skip_prk_steps=True)` `num_inference_steps + 1` times from 2 steps, once at 1 step, and at 1000 steps once before `step` raises `IndexError`; with guidance `StableDiffusion3Pipeline` runs its three text encoders twice each, so its two CLIP encoders cross 4 times per call and T5 shares the device with CLIP-L, then with CLIP-G."""
    from diffusers import PNDMScheduler

    pipes = text_to_image_pipelines(tmp_path)
    sd15, sd15_kwargs = pipes["SD 1.5"]
    shipped = type(sd15)(**{**sd15.components, "scheduler": PNDMScheduler(**SD15_PNDM)})
    shipped.set_progress_bar_config(disable=True)
    pipes["SD 1.5, shipped PNDM"] = (shipped, sd15_kwargs)
    expected = {
        "SD 1.5": (
            ["text_encoder"] * 2 + ["unet"] * 2 + ["vae"],
            {"text_encoder": 2, "unet": 2, "vae": 2},
        ),
        "SD 1.5, shipped PNDM": (  # 2 steps, 3 timesteps: steps + 1 UNet calls
            ["text_encoder"] * 2 + ["unet"] * 3 + ["vae"],
            {"text_encoder": 2, "unet": 2, "vae": 2},
        ),
        "SD3 Medium": (
            ["text_encoder", "text_encoder_2", "text_encoder_3"] * 2
            + ["transformer"] * 2
            + ["vae"],
            {
                "text_encoder": 4,
                "text_encoder_2": 4,
                "text_encoder_3": 2,
                "transformer": 2,
                "vae": 2,
            },
        ),
    }
    for name, (order, crossings) in expected.items():
        pipe, kwargs = pipes[name]
        forwards = hooked_forwards(pipe, monkeypatch, "a cat", num_inference_steps=2, height=HEIGHT, width=WIDTH, output_type="np", **kwargs)  # fmt: skip
        assert [n for n, _ in forwards] == order
        seen, resident = replay_model_offload(forwards, monkeypatch)
        assert seen == crossings
    assert {"text_encoder", "text_encoder_3"} in resident and {"text_encoder_2", "text_encoder_3"} in resident  # fmt: skip
    # classifier-free guidance, not guidance_scale alone: a UNet with time_cond_proj_dim (LCM)
    # embeds the guidance, so the same class encodes the prompt once, with no "" pass
    from diffusers import UNet2DConditionModel

    config = {k: v for k, v in sd15.unet.config.items() if not k.startswith("_")}
    lcm_unet = UNet2DConditionModel.from_config({**config, "time_cond_proj_dim": 8})
    assert lcm_unet.config.time_cond_proj_dim == 8
    lcm = type(sd15)(**{**sd15.components, "unet": lcm_unet})
    lcm.set_progress_bar_config(disable=True)
    once = hooked_forwards(lcm, monkeypatch, "a cat", num_inference_steps=1, guidance_scale=7.5, height=HEIGHT, width=WIDTH, output_type="latent", **sd15_kwargs)  # fmt: skip
    assert [n for n, _ in once].count("text_encoder") == 1 and not lcm.do_classifier_free_guidance
    # the edges of the PNDM count, through the same call: 1 step, 1000 steps
    one = hooked_forwards(shipped, monkeypatch, "a cat", num_inference_steps=1, height=HEIGHT, width=WIDTH, output_type="latent", **sd15_kwargs)  # fmt: skip
    assert [n for n, _ in one].count("unet") == 1 == len(shipped.scheduler.timesteps)
    unet_calls = []
    shipped.unet.register_forward_pre_hook(lambda *_: unet_calls.append(1))
    with pytest.raises(IndexError):
        hooked_forwards(shipped, monkeypatch, "a cat", num_inference_steps=1000, height=HEIGHT, width=WIDTH, output_type="latent", **sd15_kwargs)  # fmt: skip
    assert unet_calls == [1] and len(shipped.scheduler.timesteps) == 1001
    pndm = PNDMScheduler(**SD15_PNDM)  # the UNet's count between: one per entry, steps + 1
    for steps in range(2, 1000):
        pndm.set_timesteps(steps)
        assert len(pndm.timesteps) == steps + 1


def test_model_offload_keeps_a_component_outside_the_sequence_until_the_call_ends(monkeypatch):
    """Under `enable_model_cpu_offload` a component missing from `model_cpu_offload_seq` gets a hook of its own, outside the chain: no component sends it out, so it comes in at its first forward and stays until the end of the call. `StableDiffusionControlNetPipeline`'s sequence, `"text_encoder->image_encoder->unet->vae"`, has no `controlnet`: through `pipe(...)` with accelerate's real hooks, the ControlNet stays on the device with the UNet through the loop and with the VAE through the decode, and crosses twice per call."""
    from diffusers import StableDiffusionControlNetPipeline
    from tiny import tiny_controlnet, tiny_controlnet_pipeline

    seq = StableDiffusionControlNetPipeline.model_cpu_offload_seq
    assert seq == "text_encoder->image_encoder->unet->vae"
    unet = tiny_unet()
    pipe = tiny_controlnet_pipeline(unet, tiny_controlnet(unet))
    assert "controlnet" not in seq.split("->") + pipe._exclude_from_cpu_offload
    image = torch.zeros(1, 3, HEIGHT, WIDTH)
    forwards = hooked_forwards(pipe, monkeypatch, prompt_embeds=embeds(0), negative_prompt_embeds=embeds(1), image=image, latents=start_latents(), num_inference_steps=2, output_type="np")  # fmt: skip
    assert [n for n, _ in forwards] == ["controlnet", "unet"] * 2 + ["vae"]
    assert "controlnet" not in {prev for _, prev in forwards}  # nobody's previous component
    crossings, resident = replay_model_offload(forwards, monkeypatch)
    assert crossings == {"controlnet": 2, "unet": 2, "vae": 2}
    assert resident[1:] == [{"controlnet", "unet"}] * 3 + [{"controlnet", "vae"}]


def test_model_offload_moves_sd3s_pos_embed_buffer_with_the_transformer(monkeypatch, tmp_path):
    """Under `enable_model_cpu_offload` SD3's transformer crosses with its `pos_embed` buffer, a tensor that is not a weight: `from_pretrained(..., dtype=torch.bfloat16)` loads the persistent buffer in bfloat16, and in a `pipe(...)` call of `StableDiffusion3Pipeline` the buffer goes in and out each time the transformer's weights do (accelerate's `module.to()` moves buffers with parameters)."""
    from diffusers import DiffusionPipeline

    tiny_sd3_pipeline().save_pretrained(tmp_path)
    absent = dict.fromkeys(["text_encoder", "text_encoder_2", "text_encoder_3", "tokenizer", "tokenizer_2", "tokenizer_3"])  # fmt: skip
    pipe = DiffusionPipeline.from_pretrained(tmp_path, dtype=torch.bfloat16, **absent)
    pipe.set_progress_bar_config(disable=True)
    transformer = pipe.transformer
    assert [n for n, _ in transformer.named_buffers()] == ["pos_embed.pos_embed"]
    assert transformer.pos_embed.pos_embed.dtype == torch.bfloat16
    pipe.enable_model_cpu_offload(device="cpu")
    tracked = {  # looked up at each move: a move may replace the buffer's tensor
        "pos_embed": lambda: transformer.pos_embed.pos_embed,
        "weight": lambda: transformer.proj_out.weight,
    }
    moves, original = [], torch.Tensor.to

    def to(self, *args, **kwargs):
        target = args[0] if args else kwargs.get("device")
        for name, tensor in tracked.items():
            if isinstance(target, (str, torch.device)) and self.data_ptr() == tensor().data_ptr():
                moves.append((name, "in" if torch.device(target).index is not None else "out"))
        return original(self, *args, **kwargs)

    g = torch.Generator().manual_seed(0)
    text = [torch.randn(1, 8, EMBED_DIM, generator=g, dtype=torch.bfloat16) for _ in range(2)]
    pooled = [torch.randn(1, 16, generator=g, dtype=torch.bfloat16) for _ in range(2)]
    monkeypatch.setattr(torch.Tensor, "to", to)
    with torch.no_grad():
        pipe(prompt_embeds=text[0], negative_prompt_embeds=text[1], pooled_prompt_embeds=pooled[0], negative_pooled_prompt_embeds=pooled[1], num_inference_steps=2, output_type="latent")  # fmt: skip
    monkeypatch.setattr(torch.Tensor, "to", original)
    buffer_moves = [side for name, side in moves if name == "pos_embed"]
    assert {"in", "out"} <= set(buffer_moves)
    assert buffer_moves == [side for name, side in moves if name == "weight"]


def test_sequential_offload_keeps_weights_off_the_device(monkeypatch):
    """`enable_sequential_cpu_offload` leaves every UNet parameter on the `meta` device and gives each submodule that owns weights an accelerate hook with `offload=True` and a map of its CPU weights; the hook loads them for that submodule's forward and then sets them to `meta` again, with no copy back (on the CPU, torch 2.13 makes that last step raise `TypeError`). Components in `_exclude_from_cpu_offload`, SD's `safety_checker`, get no hook: they are moved to the device whole and stay there."""
    import accelerate.hooks

    checker, processor = tiny_safety_checker()
    pipe = tiny_sd_pipeline(safety_checker=checker, feature_extractor=processor)
    moves = watch_moves(pipe, monkeypatch)
    pipe.enable_sequential_cpu_offload(device="cpu")
    assert {p.device.type for p in pipe.unet.parameters()} == {"meta"}
    # the one whole-component move: the checker to the execution device (cpu:0 here, cuda:0
    # on a GPU); its tensors report "cpu" either way, so the spy is what sees the move
    assert moves == [("safety_checker", "in")]
    assert {str(p.device) for p in checker.parameters()} == {"cpu"}  # no meta, no hook
    monkeypatch.undo()
    assert not any(hasattr(m, "_hf_hook") for m in checker.modules())
    owners = [m for m in pipe.unet.modules() if list(m.parameters(recurse=False))]
    for module in owners:
        hook = module._hf_hook
        assert type(hook).__name__ == "AlignDevicesHook" and hook.offload and hook.weights_map is not None  # fmt: skip
    first = pipe.unet.time_embedding.linear_1  # the first submodule with weights to run
    cpu_weight = first._hf_hook.weights_map["weight"]
    assert cpu_weight.device.type == "cpu" and cpu_weight.shape == first.weight.shape
    seen, moves = [], []
    inner = first._old_forward  # the module's own forward, which accelerate's wrapper calls
    monkeypatch.setattr(first, "_old_forward", lambda *a, **k: seen.append(first.weight.detach().clone()) or inner(*a, **k))  # fmt: skip
    original = accelerate.hooks.set_module_tensor_to_device
    monkeypatch.setattr(accelerate.hooks, "set_module_tensor_to_device", lambda m, name, device, *a, **k: moves.append((m, name, str(device))) or original(m, name, device, *a, **k))  # fmt: skip
    # With accelerate 1.15 on torch 2.13 the hook's own move back to "meta" raises TypeError
    # (set_module_tensor_to_device rebuilds a plain Tensor with requires_grad=), so the
    # forward stops after this first submodule: enough to see the load and the drop.
    with torch.no_grad(), pytest.raises(TypeError, match="requires_grad"):
        pipe.unet(start_latents(), 10, encoder_hidden_states=embeds(0))
    assert len(seen) == 1 and torch.equal(seen[0], cpu_weight)  # loaded for its forward
    assert [(n, d) for m, n, d in moves if m is first and n == "weight"] == [("weight", "cpu:0"), ("weight", "meta")]  # fmt: skip
    # cpu:0 is the execution device here (cuda:0 on a GPU); the CPU copy stays where it was
    assert {device for _, _, device in moves} <= {"cpu:0", "meta"}  # none to "cpu": no copy back


def test_offload_needs_an_accelerator():
    """Called without a device on a machine with no accelerator, both `enable_model_cpu_offload` and `enable_sequential_cpu_offload` raise `RuntimeError` ("requires accelerator")."""
    if torch.cuda.is_available():
        pytest.skip("an accelerator is present")
    pipe = tiny_sd_pipeline()
    for method in (pipe.enable_model_cpu_offload, pipe.enable_sequential_cpu_offload):
        with pytest.raises(RuntimeError, match="requires accelerator"):
            method()


def group_hooked(model):
    from diffusers.hooks.group_offloading import _GROUP_OFFLOADING

    return {n for n, m in model.named_modules() if hasattr(m, "_diffusers_hook") and m._diffusers_hook.get_hook(_GROUP_OFFLOADING)}  # fmt: skip


def test_group_offload_block_modules_splits_the_mid_block():
    """`enable_group_offload(..., offload_type="block_level")` makes groups of the blocks in a model's `ModuleList`s and leaves every other child (a UNet's `mid_block`) in the group hooked on the model itself, on the device for the model's whole forward; `block_modules=["mid_block"]` makes the mid block's resnets and attentions groups of their own."""
    kwargs = dict(onload_device=CPU, offload_device=CPU, offload_type="block_level", num_blocks_per_group=1)  # fmt: skip
    plain = tiny_unet()
    plain.enable_group_offload(**kwargs)
    assert group_hooked(plain) == {"", "down_blocks.0", "down_blocks.1", "up_blocks.0", "up_blocks.1"}  # fmt: skip
    split = tiny_unet()
    split.enable_group_offload(**kwargs, block_modules=["mid_block"])
    assert group_hooked(split) - group_hooked(plain) == {"mid_block.resnets.0", "mid_block.resnets.1", "mid_block.attentions.0"}  # fmt: skip
    sample = start_latents()
    with torch.no_grad():
        out = split(sample, 10, encoder_hidden_states=embeds(0)).sample
        ref = tiny_unet()(sample, 10, encoder_hidden_states=embeds(0)).sample
    assert torch.equal(out, ref)


def test_group_offload_with_streams_still_copies_the_unmatched_group_back(monkeypatch):
    """Without `use_stream=True` each group is copied in and synchronously back; with streams the block groups keep a pinned CPU copy and copy nothing back, but the group outside the blocks (a UNet's `mid_block` included) gets no stream (`hooks/group_offloading.py`, lines 797-815 of diffusers 0.42.1), so it is still copied in and back synchronously every call: on the tiny UNet (`block_level`, one block per group; the stream path simulated on the CPU with a stand-in stream and `pin_memory` as identity), a call's offloads move all weight bytes back without streams and exactly that group's bytes with them."""
    from diffusers.hooks.group_offloading import ModuleGroup

    def tensors(modules):
        return {id(t): t for m in modules for t in [*m.parameters(), *m.buffers()]}

    def nbytes(ts):
        return sum(t.numel() * t.element_size() for t in ts.values())

    def unet_call(model):
        with torch.no_grad():
            return model(start_latents(), 10, encoder_hidden_states=embeds(0)).sample

    reference = unet_call(tiny_unet())
    back = {}
    for case in ("plain", "stream"):
        model, spy = tiny_unet(), pytest.MonkeyPatch()
        weights = nbytes(tensors([model]))
        if case == "stream":
            unmatched, blocks = simulated_stream_offload(model, spy)
            assert unmatched.stream is None and blocks and all(g.stream is not None for g in blocks)  # fmt: skip
            assert model.mid_block in unmatched.modules
            outside = nbytes(tensors(unmatched.modules))
        else:
            model.enable_group_offload(onload_device=CPU, offload_device=CPU, offload_type="block_level", num_blocks_per_group=1)  # fmt: skip
        unet_call(model)  # the first call records the order for the prefetch
        with traffic(model, spy, [(ModuleGroup, "onload_")], [(ModuleGroup, "offload_")]) as moved:  # fmt: skip
            out = unet_call(model)
        spy.undo()
        back[case] = moved["to_host"]
        assert moved["to_device"] == weights and torch.equal(out, reference)
    assert back == {"plain": weights, "stream": outside} and 0 < outside < weights
