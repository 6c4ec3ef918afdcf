"""The parallel-inference section against diffusers 0.42.1: the sequence lengths it quotes
and the parallel configurations diffusers offers.

The runs across two, four and five processes (Ulysses and ring on a tiny Flux transformer
over gloo) are lab 19's (``test_page_lab_19.py``); this module checks the section's own
sentences: Wan 2.1's token count from ``WanPipeline.prepare_latents`` and
``WanTransformer3DModel``'s defaults, what ``ParallelConfig`` holds, and which models
tensor parallelism accepts. No weights, no hub.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch

pytestmark = pytest.mark.usefixtures("quiet_diffusers")


def test_wan_five_seconds_of_720p_is_75600_tokens():
    """`WanPipeline.__call__`'s default 81 frames reach the transformer as 21 latent frames (`(81 - 1) // 4 + 1`), `WanPipeline.prepare_latents` turns 720 x 1280 into (1, 16, 21, 90, 160) latents with Wan's VAE compression (4x in time, 8x in space), and `WanTransformer3DModel()`'s default `patch_size` (1, 2, 2) makes 21 x 45 x 80 = 75,600 tokens; its defaults are Wan 2.1 14B's 40 heads of 128 in 40 blocks."""
    from diffusers import WanTransformer3DModel
    from tiny import WAN_TEXT, WAN_TEXT_TOKENS, tiny_wan_pipeline

    pipe = tiny_wan_pipeline()  # the tiny VAE has Wan's real compression
    seen = []
    pipe.transformer.register_forward_pre_hook(
        lambda m, a, kw: seen.append(tuple(kw["hidden_states"].shape)), with_kwargs=True
    )
    text = torch.randn(1, WAN_TEXT_TOKENS, WAN_TEXT, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        pipe(prompt_embeds=text, negative_prompt_embeds=text, height=16, width=16,
             num_inference_steps=1, output_type="latent")  # fmt: skip
    assert seen[0] == (1, 16, 21, 2, 2)  # default num_frames: 21 latent frames
    latents = pipe.prepare_latents(1, 16, 720, 1280, 81, torch.bfloat16, torch.device("meta"))
    assert tuple(latents.shape) == (1, 16, 21, 90, 160)
    with torch.device("meta"):
        config = WanTransformer3DModel().config
    assert tuple(config.patch_size) == (1, 2, 2)
    assert (config.num_attention_heads, config.attention_head_dim, config.num_layers) == (40, 128, 40)  # fmt: skip
    t, h, w = (n // p for n, p in zip(latents.shape[2:], config.patch_size, strict=True))
    assert t * h * w == 75_600


def _calls(pipe, cond, uncond, **kwargs):
    """Each transformer call in a 2-step ``pipe(...)`` at 16 x 16 px: its batch size and
    whether its ``encoder_hidden_states`` are the prompt's (``cond``) or the negative
    prompt's (``uncond``) embeddings."""
    calls = []

    def record(m, a, kw):
        text = kw["encoder_hidden_states"]
        branch = [n for n, t in (("cond", cond), ("uncond", uncond)) if torch.equal(text, t)]
        calls.append((kw["hidden_states"].shape[0], *branch))

    pipe.transformer.register_forward_pre_hook(record, with_kwargs=True)
    with torch.no_grad():
        pipe(height=16, width=16, num_inference_steps=2, output_type="latent", **kwargs)
    return calls


def test_flux_true_cfg_and_wan_make_two_batch_one_calls_a_step():
    """With two guidance branches, `FluxPipeline.__call__` (`true_cfg_scale > 1` and a negative prompt) and `WanPipeline.__call__` (its default `guidance_scale` 5.0) each make two transformer calls a step, batch 1 each (cond, then uncond), not one batch-2 call: the two calls CFG-parallel can put on two GPUs."""
    from tiny import (
        WAN_TEXT,
        WAN_TEXT_TOKENS,
        flux_prompt_embeds,
        tiny_flux_pipeline,
        tiny_wan_pipeline,
    )

    text = torch.randn(2, WAN_TEXT_TOKENS, WAN_TEXT, generator=torch.Generator().manual_seed(0))
    wan_pipe = tiny_wan_pipeline()
    wan = _calls(wan_pipe, text[1:], text[:1], prompt_embeds=text[1:],
                 negative_prompt_embeds=text[:1], num_frames=5)  # fmt: skip
    assert wan_pipe.guidance_scale == 5.0  # the default the call used
    text, pooled = flux_prompt_embeds()
    flux = _calls(tiny_flux_pipeline(), text[1:], text[:1], true_cfg_scale=4.0,
                  prompt_embeds=text[1:], pooled_prompt_embeds=pooled[1:],
                  negative_prompt_embeds=text[:1], negative_pooled_prompt_embeds=pooled[:1])  # fmt: skip
    assert wan == flux == [(1, "cond"), (1, "uncond")] * 2  # 2 steps x (cond, uncond)


def test_parallel_config_is_context_or_tensor_parallel():
    """diffusers 0.42.1's `ParallelConfig` holds a `context_parallel_config` and a `tensor_parallel_config` and nothing else: no field of it, of `ContextParallelConfig` or of `TensorParallelConfig` sets CFG or data parallelism."""
    from diffusers import ContextParallelConfig, ParallelConfig
    from diffusers.models._modeling_parallel import TensorParallelConfig

    public = [f.name for f in dataclasses.fields(ParallelConfig) if not f.name.startswith("_")]
    assert public == ["context_parallel_config", "tensor_parallel_config"]
    names = {f.name for c in (ParallelConfig, ContextParallelConfig, TensorParallelConfig)
             for f in dataclasses.fields(c)}  # fmt: skip
    assert not [n for n in names if any(w in n for w in ("cfg", "guidance", "data", "batch"))]


def test_context_parallel_config_degrees():
    """`ContextParallelConfig` takes `ring_degree` and `ulysses_degree` (both default to 1, and one must be above 1), and `enable_parallelism` builds a (ring, ulysses) device mesh from them: 2 x 2 for `ring_degree=2, ulysses_degree=2` on torch's fake process group of 4."""
    from diffusers import ContextParallelConfig
    from tiny import tiny_flux_transformer

    config = ContextParallelConfig(ulysses_degree=4)
    assert (config.ring_degree, config.ulysses_degree) == (1, 4)
    assert ContextParallelConfig(ring_degree=2).ulysses_degree == 1
    with pytest.raises(ValueError, match="must be greater than 1"):
        ContextParallelConfig(ring_degree=1, ulysses_degree=1)

    def run():
        model = tiny_flux_transformer()
        model.enable_parallelism(config=ContextParallelConfig(ring_degree=2, ulysses_degree=2))
        mesh = model._parallel_config.context_parallel_config._mesh  # the mesh it built
        return tuple(mesh.shape), mesh.mesh_dim_names

    assert _on_a_fake_group(4, run) == ((2, 2), ("ring", "ulysses"))


def test_flux_1024px_is_4096_image_and_512_text_tokens(tmp_path):
    """`FluxPipeline.__call__` at 1024 x 1024 packs the latents into (1, 4096, 64) (a four-block VAE, 8x, as FLUX.1's; 2 x 2 patches of 16 channels), and by default it pads the prompt through `tokenizer_2` (T5's; a tiny stand-in here) to `max_sequence_length=512` tokens: 4,608 tokens in each joint attention; the packed `noise_pred` is 4,096 x 64 bf16 values, 0.52 MB."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline
    from tiny import DIT_TEXT, narrow_vae, tiny_flux_transformer, tiny_tokenizer
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(0)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=64, hidden_size=DIT_TEXT, intermediate_size=64, projection_dim=DIT_TEXT,
        num_hidden_layers=1, num_attention_heads=4, max_position_embeddings=77,
        bos_token_id=0, eos_token_id=1, pad_token_id=1)).eval()  # fmt: skip
    t5 = T5EncoderModel(T5Config(vocab_size=64, d_model=DIT_TEXT, d_kv=8, d_ff=64, num_layers=1,
                                 num_heads=4)).eval()  # fmt: skip
    tok = tiny_tokenizer(tmp_path)
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),
                        vae=narrow_vae(latent_channels=16), text_encoder=clip, tokenizer=tok,
                        text_encoder_2=t5, tokenizer_2=tok, transformer=tiny_flux_transformer())  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    seen = []
    pipe.transformer.register_forward_pre_hook(
        lambda m, a, kw: seen.append((kw["hidden_states"].shape, kw["encoder_hidden_states"].shape, kw["txt_ids"].shape)),
        with_kwargs=True,
    )  # fmt: skip
    with torch.no_grad():
        latents = pipe("a cat", height=1024, width=1024, num_inference_steps=1, output_type="latent").images  # fmt: skip
    assert pipe.vae_scale_factor == 8
    assert seen == [((1, 4096, 64), (1, 512, DIT_TEXT), (512, 3))]
    assert tuple(latents.shape) == (1, 4096, 64)
    assert latents.numel() * torch.tensor([], dtype=torch.bfloat16).element_size() == 524_288


def _on_a_fake_group(world, fn):
    """``fn()`` as rank 0 of torch's fake process group of ``world`` ranks (one process; its
    collectives move no data), with the accelerator count patched to 1 so that
    ``enable_parallelism`` runs on a CPU-only torch (lab 19 shows the refusal)."""
    from unittest import mock

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        with torch.no_grad(), mock.patch("torch.accelerator.device_count", return_value=1):
            return fn()
    finally:
        dist.destroy_process_group()


def _flux_inputs(image, text):
    """A tiny FLUX transformer's inputs: ``image`` packed latents (a 4-wide grid), ``text`` tokens."""
    g = torch.Generator().manual_seed(0)
    img_ids = torch.zeros(image, 3)
    img_ids[:, 1], img_ids[:, 2] = torch.arange(image // 4).repeat_interleave(4), torch.arange(4).repeat(image // 4)  # fmt: skip
    return dict(hidden_states=torch.randn(1, image, 64, generator=g),
                encoder_hidden_states=torch.randn(1, text, 32, generator=g),
                pooled_projections=torch.randn(1, 32, generator=g), timestep=torch.full((1,), 0.5),
                guidance=torch.full((1,), 3.5), img_ids=img_ids, txt_ids=torch.zeros(text, 3),
                return_dict=False)  # fmt: skip


def test_ulysses_anything_padding_must_be_smaller_than_a_ranks_share():
    """With `ulysses_anything=True`, diffusers 0.42.1 pads the heads up to a multiple of the Ulysses degree only while the padding is smaller than a rank's share: a tiny FLUX transformer with FLUX.1-dev's 24 heads under `enable_parallelism` on 16 ranks (8 padded, 2 a rank; torch's fake process group) raises AssertionError at its first attention (lab 19's five-process run shows 24 heads running on 5); neither `ulysses_anything` nor `ring_anything` takes a 2-D ring x Ulysses mesh (ValueError)."""
    from diffusers import ContextParallelConfig
    from tiny import tiny_flux_transformer

    def run():
        model = tiny_flux_transformer(num_attention_heads=24)
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=16, ulysses_anything=True))  # fmt: skip
        with pytest.raises(AssertionError, match="Padding head num 8 should be less than new local head num 2"):  # fmt: skip
            model(**_flux_inputs(32, 16))

    _on_a_fake_group(16, run)
    with pytest.raises(ValueError, match="ulysses_anything cannot be enabled when ring_degree > 1"):
        ContextParallelConfig(ring_degree=2, ulysses_degree=2, ulysses_anything=True)
    with pytest.raises(ValueError, match="ring_anything cannot be enabled when ulysses_degree > 1"):
        ContextParallelConfig(ring_degree=2, ulysses_degree=2, ring_anything=True)


def test_plain_ulysses_runs_flux_1024px_on_2_4_or_8_gpus_only():
    """By default R must divide the head count and (`EquipartitionSharder`) each split input's tokens: a tiny FLUX transformer with FLUX.1-dev's 24 heads, 4,096 image and 512 text tokens reaches its attention op under `ContextParallelConfig(ulysses_degree=R)` for R = 2, 4 and 8 only of 2 to 24 (each rank attending all 4,608 tokens for 24/R heads; torch's fake process group, stopped there); 16 fails in the head split (RuntimeError), every other R in the token split (AssertionError)."""
    from unittest import mock

    import diffusers.models.attention_dispatch as dispatch
    from diffusers import ContextParallelConfig
    from tiny import tiny_flux_transformer

    class ReachedAttentionError(Exception):
        pass

    def op(ctx, query, *a, **kw):  # stop before attending: the shapes are the claim
        raise ReachedAttentionError(tuple(query.shape))

    inputs, built = _flux_inputs(4096, 512), tiny_flux_transformer(
        num_attention_heads=24, attention_head_dim=8, axes_dims_rope=(2, 2, 4), num_single_layers=0)  # fmt: skip

    def run(ranks):
        model = copy.deepcopy(built)  # a fresh copy each time: enable_parallelism runs once a model
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=ranks))
        try:
            with mock.patch.object(dispatch, "_native_attention_forward_op", op):
                model(**inputs)
        except ReachedAttentionError as e:
            return e.args[0]  # (B, tokens, heads this rank attends, head_dim)
        except (AssertionError, RuntimeError) as e:
            return type(e).__name__

    got = {r: _on_a_fake_group(r, functools.partial(run, r)) for r in range(2, 25)}
    assert {r: q for r, q in got.items() if isinstance(q, tuple)} == {
        2: (1, 4608, 12, 8), 4: (1, 4608, 6, 8), 8: (1, 4608, 3, 8)}  # fmt: skip
    assert got[16] == "RuntimeError"  # 4,096 and 512 split; 24 heads do not
    assert {q for r, q in got.items() if r not in (2, 4, 8, 16)} == {"AssertionError"}


def test_the_backend_check_reads_the_first_attention_module_only():
    """`enable_parallelism` checks the backend of the first attention module only, and an attention module's own `set_attention_backend` skips the check: on torch's fake process group (Ulysses over 2), `_native_math` set on a tiny FLUX transformer's single-stream block passes `enable_parallelism`, set on its first block it raises ValueError, and once parallelism is enabled the first block's own `set_attention_backend("_native_math")` is accepted where the model's raises ValueError."""
    from diffusers import ContextParallelConfig
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry
    from tiny import tiny_flux_transformer

    active = _AttentionBackendRegistry.get_active_backend()[0]
    config = ContextParallelConfig(ulysses_degree=2)

    def run():
        later = tiny_flux_transformer()
        later.single_transformer_blocks[0].attn.set_attention_backend("_native_math")
        later.enable_parallelism(config=config)  # accepted
        first = tiny_flux_transformer()
        first.transformer_blocks[0].attn.set_attention_backend("_native_math")
        with pytest.raises(ValueError, match="'_native_math' which does not support context"):
            first.enable_parallelism(config=config)
        model = tiny_flux_transformer()
        model.enable_parallelism(config=config)
        model.transformer_blocks[0].attn.set_attention_backend("_native_math")  # accepted
        assert model.transformer_blocks[0].attn.processor._attention_backend.value == "_native_math"  # fmt: skip
        with pytest.raises(ValueError, match="'_native_math' does not support context"):
            model.set_attention_backend("_native_math")

    try:
        _on_a_fake_group(2, run)
    finally:  # set_attention_backend also sets the process-wide active backend
        _AttentionBackendRegistry.set_active_backend(active)


def test_set_attention_backend_refuses_every_non_context_parallel_backend_once_enabled():
    """Once `enable_parallelism` has run (Ulysses over 2 ranks of torch's fake process group), `set_attention_backend` raises ValueError ("does not support context parallelism") for each of the 16 attention backends the installed diffusers registers without context-parallel support, and accepts `native`."""
    from diffusers import ContextParallelConfig
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry
    from tiny import tiny_flux_transformer

    backends = _AttentionBackendRegistry.list_backends()
    refused = [b.value for b in backends if not _AttentionBackendRegistry._is_context_parallel_available(b)]  # fmt: skip
    active = _AttentionBackendRegistry.get_active_backend()[0]

    def run():
        model = tiny_flux_transformer()
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))
        for name in refused:
            with pytest.raises(ValueError, match=f"'{name}' does not support context parallelism"):
                model.set_attention_backend(name)
        model.set_attention_backend("native")

    try:
        _on_a_fake_group(2, run)
    finally:  # set_attention_backend also sets the process-wide active backend
        _AttentionBackendRegistry.set_active_backend(active)
    assert len(refused) == 16


@functools.cache
def _models_with_a_tp_plan():
    """Every ModelMixin subclass in the installed diffusers.models whose `_tp_plan` is set, by name."""
    import importlib
    import pkgutil

    import diffusers.models
    from diffusers.models.modeling_utils import ModelMixin

    found = {}
    for info in pkgutil.walk_packages(diffusers.models.__path__, "diffusers.models."):
        for obj in vars(importlib.import_module(info.name)).values():
            if isinstance(obj, type) and issubclass(obj, ModelMixin) and obj._tp_plan:
                found[obj.__name__] = obj
    return found


def test_tensor_parallelism_needs_a_tp_plan_that_only_flux_and_qwenimage_define():
    """In diffusers 0.42.1 only four model classes define the `_tp_plan` that `TensorParallelConfig` needs: `FluxTransformer2DModel`, `Flux2Transformer2DModel`, `QwenImageTransformer2DModel` and `QwenImage21Transformer2DModel`; `WanTransformer3DModel.enable_parallelism(config=TensorParallelConfig(tp_degree=2))` raises ValueError ("`_tp_plan` must be set")."""
    from diffusers.models._modeling_parallel import TensorParallelConfig
    from tiny import tiny_wan_transformer

    assert set(_models_with_a_tp_plan()) == {
        "FluxTransformer2DModel", "Flux2Transformer2DModel",
        "QwenImageTransformer2DModel", "QwenImage21Transformer2DModel",
    }  # fmt: skip
    with pytest.raises(ValueError, match="`_tp_plan` must be set on the model class"):
        tiny_wan_transformer().enable_parallelism(config=TensorParallelConfig(tp_degree=2))


def test_tensor_parallel_plans_shard_only_attention_and_mlp_linears():
    """Tensor parallelism shards the attention and MLP linear layers by columns or rows: for every model class with a `_tp_plan`, built on the meta device from its default config, `resolve_tp_shard_specs` (the function that maps each parameter tensor parallelism shards to its split) covers only parameters of attention (`attn`) and MLP (`ff`, `ff_context`, `img_mlp`, `txt_mlp`, `proj_mlp`, and FLUX.1's single-block `proj_out`, which takes both) layers; FLUX.1's adaLN modulation linears (`norm1.linear`, `norm1_context.linear`, `norm.linear`) stay whole on every rank."""
    import re

    from diffusers.hooks.tensor_parallel import resolve_tp_shard_specs

    mlp = {"ff", "ff_context", "img_mlp", "txt_mlp", "proj_mlp"}
    for name, cls in _models_with_a_tp_plan().items():
        with torch.device("meta"):
            model = cls()
        specs = resolve_tp_shard_specs(model, cls._tp_plan, 2)
        assert specs
        for param in specs:
            parts = param.split(".")
            single_out = parts[0] == "single_transformer_blocks" and parts[2] == "proj_out"
            assert "attn" in parts or mlp & set(parts) or single_out, (name, param)
        if name == "FluxTransformer2DModel":
            linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
            whole = {re.sub(r"\.\d+\.", ".*.", n) for n in linears - {s.rsplit(".", 1)[0] for s in specs}}  # fmt: skip
            assert {"transformer_blocks.*.norm1.linear", "transformer_blocks.*.norm1_context.linear",
                    "single_transformer_blocks.*.norm.linear"} <= whole  # fmt: skip
