"""Lab 15 (step caching) against diffusers' cache hooks on a tiny FluxTransformer2DModel.

The tiny transformer (``tiny.three_block_flux_transformer``) has the config diffusers'
own tests use (``tests/models/transformers/test_models_transformer_flux.py``: patch_size
1, 4 input channels, two heads of 16, joint_attention_dim 32, axes_dims_rope [4, 4, 8]),
with two single-stream blocks so FirstBlockCache has a head, a middle and a tail block.
No weights, no hub. The starter's NumPy ``FirstBlockCache`` and ``TaylorSeer`` are fed the tensors
diffusers computed and must make the same decisions and predictions.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from sizes import flux_1024_record
from tiny import (
    cache_contexts_of_a_flux_call,
    flux_prompt_embeds,
    run_starter,
    three_block_flux_transformer,
    tiny_flux_pipeline,
)

LAB15 = "code/lab-15-step-caching/step_caching.py"
#: sigma-like timesteps of a short loop: small steps with a few jumps
TIMESTEPS = [1.0, 0.98, 0.96, 0.8, 0.78, 0.76, 0.5, 0.48, 0.46, 0.2]


@pytest.fixture(scope="module")
def starter():
    return run_starter(LAB15)


def flux_inputs():
    """A 4 x 4 latent grid as 16 tokens of 4 channels, 8 text tokens of width 32."""
    g = torch.Generator().manual_seed(0)
    return dict(
        hidden_states=torch.randn(1, 16, 4, generator=g),  # (B, h*w, C) packed latents
        encoder_hidden_states=torch.randn(1, 8, 32, generator=g),  # prompt_embeds
        pooled_projections=torch.randn(1, 32, generator=g),  # pooled_prompt_embeds
        img_ids=torch.randn(16, 3, generator=g),
        txt_ids=torch.randn(8, 3, generator=g),
    )


def run_loop(model, timesteps=TIMESTEPS, context="cond"):
    """A flow-matching Euler loop on the tiny transformer: each output moves the latents,
    so every call sees new hidden_states and a new timestep, as in a pipeline."""
    inputs = flux_inputs()
    latents, outputs = inputs.pop("hidden_states"), []
    sigmas = [*timesteps, 0.0]
    with torch.no_grad():
        for i, t in enumerate(timesteps):
            with model.cache_context(context):
                noise_pred = model(hidden_states=latents, timestep=torch.tensor([t]), **inputs).sample  # fmt: skip
            outputs.append(noise_pred)
            latents = latents + (sigmas[i + 1] - sigmas[i]) * noise_pred
    return outputs


class Counter:
    """Counts forward calls of a module through a pre-hook."""

    def __init__(self, module):
        self.n = 0
        self.handle = module.register_forward_pre_hook(self)

    def __call__(self, module, args):
        self.n += 1


def test_cache_configs_and_defaults():
    """diffusers exports `FirstBlockCacheConfig` (default `threshold=0.05`), `TaylorSeerCacheConfig` (defaults `cache_interval=5`, `disable_cache_before_step=3`, `max_order=1`, `taylor_factors_dtype=torch.bfloat16`), `MagCacheConfig`, `FasterCacheConfig`, `PyramidAttentionBroadcastConfig`, `SeaCacheConfig` and `TextKVCacheConfig`, and `CacheMixin` gives a model `enable_cache(config)`, `disable_cache()` and `cache_context(name)`."""
    import diffusers
    from diffusers.models.cache_utils import CacheMixin

    for name in ["FirstBlockCacheConfig", "TaylorSeerCacheConfig", "MagCacheConfig", "FasterCacheConfig", "PyramidAttentionBroadcastConfig", "SeaCacheConfig", "TextKVCacheConfig"]:  # fmt: skip
        assert hasattr(diffusers, name), name
    assert diffusers.FirstBlockCacheConfig().threshold == 0.05
    ts = diffusers.TaylorSeerCacheConfig()
    assert (ts.cache_interval, ts.disable_cache_before_step, ts.max_order) == (5, 3, 1)
    assert ts.taylor_factors_dtype == torch.bfloat16 and ts.disable_cache_after_step is None
    for method in ("enable_cache", "disable_cache", "cache_context"):
        assert callable(getattr(CacheMixin, method))


def exported_model_classes():
    """Every `ModelMixin` subclass diffusers exports (pipelines skipped: they are not models)."""
    import inspect

    import diffusers

    objects = (getattr(diffusers, n, None) for n in dir(diffusers) if not n.startswith("_") and "Pipeline" not in n)  # fmt: skip
    return [c for c in objects if inspect.isclass(c) and issubclass(c, diffusers.ModelMixin)]


def test_which_models_support_caching():
    """Only models with `CacheMixin` have `enable_cache`, over every model class diffusers exports: `FluxTransformer2DModel` inherits `CacheMixin`; Stable Diffusion 1.5 / SDXL's `UNet2DConditionModel` and SD3's `SD3Transformer2DModel` do not, and have no `enable_cache` method."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel, UNet2DConditionModel
    from diffusers.models.cache_utils import CacheMixin

    models = exported_model_classes()
    assert len(models) > 100 and FluxTransformer2DModel in models
    assert [c.__name__ for c in models if hasattr(c, "enable_cache") and not issubclass(c, CacheMixin)] == []  # fmt: skip
    assert issubclass(FluxTransformer2DModel, CacheMixin)
    for cls in (UNet2DConditionModel, SD3Transformer2DModel):
        assert not issubclass(cls, CacheMixin)
        assert not hasattr(cls, "enable_cache")


def test_cache_context_is_required():
    """With FirstBlockCache or TaylorSeer enabled, calling the model outside `cache_context(...)` raises `ValueError` ("No cache context is set"): their hooks keep one state per context name, such as `"cond"` and `"uncond"`."""
    from diffusers import FirstBlockCacheConfig, TaylorSeerCacheConfig

    inputs = flux_inputs()
    for config in (TaylorSeerCacheConfig(), FirstBlockCacheConfig(threshold=1e9)):
        model = three_block_flux_transformer()
        model.enable_cache(config)
        with torch.no_grad(), pytest.raises(ValueError, match="No cache context is set"):
            model(timestep=torch.tensor([1.0]), **inputs)
    # one state per name: with a huge threshold each name runs everything on its first call only
    tail = Counter(model.single_transformer_blocks[-1].attn)
    with torch.no_grad():
        for name in ["cond", "cond", "uncond", "uncond", "cond"]:
            with model.cache_context(name):
                model(timestep=torch.tensor([1.0]), **inputs)
    assert tail.n == 2


def test_enable_twice_raises_and_disable_restores():
    """`enable_cache` on a model that already has a cache raises `ValueError`; after `disable_cache()` a model that ran with FirstBlockCache returns, over a loop, exactly the uncached outputs."""
    from diffusers import FirstBlockCacheConfig

    model = three_block_flux_transformer()
    reference = run_loop(model)
    model.enable_cache(FirstBlockCacheConfig(threshold=10.0))
    assert model.is_cache_enabled
    with pytest.raises(ValueError, match="already been enabled"):
        model.enable_cache(FirstBlockCacheConfig(threshold=0.1))
    cached = run_loop(model)
    assert not all(torch.equal(a, b) for a, b in zip(cached, reference, strict=True))
    model.disable_cache()
    assert not model.is_cache_enabled
    for a, b in zip(run_loop(model), reference, strict=True):
        assert torch.equal(a, b)


def test_threshold_zero_gives_the_uncached_output():
    """With `FirstBlockCacheConfig(threshold=0)` every call of a 10-step loop on a tiny `FluxTransformer2DModel` runs all blocks and returns exactly the uncached output: a skip needs the relative change to be `<= 0`, i.e. an identical residual."""
    from diffusers import FirstBlockCacheConfig

    model = three_block_flux_transformer()
    reference = run_loop(model)
    model.enable_cache(FirstBlockCacheConfig(threshold=0.0))
    tail = Counter(model.single_transformer_blocks[-1].attn)  # runs only when the tail computes
    cached = run_loop(model)
    assert tail.n == len(TIMESTEPS)
    for a, b in zip(cached, reference, strict=True):
        assert torch.equal(a, b)


def test_huge_threshold_reuses_the_first_steps_tail_residual():
    """With a huge threshold only the first call runs the remaining blocks; every later call runs the first block and adds the tail residual stored at step 1 (tail block output minus first block output), so a call with step 1's inputs returns step 1's output (to float32 rounding) and the other calls differ from the uncached ones."""
    from diffusers import FirstBlockCacheConfig

    model = three_block_flux_transformer()
    inputs = flux_inputs()
    head, tail = model.transformer_blocks[0], model.single_transformer_blocks[-1]
    seen = {}

    def keep(name):
        return lambda module, args, kwargs, out: seen.setdefault(name, []).append(out)

    handles = [head.register_forward_hook(keep("head"), with_kwargs=True),
               tail.register_forward_hook(keep("tail"), with_kwargs=True)]  # fmt: skip
    with torch.no_grad():
        uncached = [model(timestep=torch.tensor([t]), **inputs).sample for t in TIMESTEPS[:3]]
    model.enable_cache(FirstBlockCacheConfig(threshold=1e9))
    middle = Counter(model.single_transformer_blocks[0].attn)
    last = Counter(tail.attn)
    with torch.no_grad(), model.cache_context("cond"):
        cached = [model(timestep=torch.tensor([t]), **inputs).sample for t in [*TIMESTEPS[:3], TIMESTEPS[0]]]  # fmt: skip
    for h in handles:
        h.remove()
    assert middle.n == last.n == 1  # only the first call ran the remaining blocks
    assert torch.equal(cached[0], uncached[0])
    # head + (tail - head) is tail up to float32 rounding
    torch.testing.assert_close(cached[3], cached[0], atol=1e-6, rtol=0)
    assert not torch.allclose(cached[1], uncached[1], atol=1e-4)
    # rebuild call 2 by hand: head block output now + (tail output - head output) at step 1
    step1_residual = seen["tail"][0][1] - seen["head"][0][1]  # (B, 16, D) hidden_states
    hidden = seen["head"][1][1] + step1_residual  # the head ran uncached at TIMESTEPS[1]
    with torch.no_grad():
        temb = model.time_text_embed(torch.tensor([TIMESTEPS[1]]) * 1000, inputs["pooled_projections"])  # fmt: skip
        rebuilt = model.proj_out(model.norm_out(hidden, temb))
    torch.testing.assert_close(cached[1], rebuilt, atol=1e-5, rtol=1e-5)


def residual(head, kwargs):
    """The first block's residual, hidden_states out minus in: (B, 16, D) -> float64 NumPy."""
    with torch.no_grad():
        return (head(**kwargs)[1] - kwargs["hidden_states"]).double().numpy()


def test_numpy_rule_reproduces_diffusers_skip_decisions(starter):
    """The starter's NumPy `FirstBlockCache` rule (`mean|r - r_prev| / mean|r_prev| > threshold`, with `r_prev` replaced only when the rest runs) makes the same compute/skip decision as diffusers' `FBCHeadBlockHook` at every step of a 10-step loop, fed the first block's residuals diffusers computed."""
    from diffusers import FirstBlockCacheConfig

    model = three_block_flux_transformer()
    head, tail_attn = model.transformer_blocks[0], model.single_transformer_blocks[-1].attn
    calls, ran = [], []  # the head block's kwargs per call; the calls in which the tail ran
    hooks = [head.register_forward_pre_hook(lambda m, a, kw: calls.append(kw), with_kwargs=True),
             tail_attn.register_forward_pre_hook(lambda m, a: ran.append(len(calls)))]  # fmt: skip
    # an uncached loop first: the median step-to-step change is a threshold that mixes both
    run_loop(model)
    first = list(calls)
    hooks[0].remove()  # residual() calls the head block again: stop recording first
    plain = [residual(head, kw) for kw in first]
    changes = [np.abs(b - a).mean() / np.abs(a).mean() for a, b in itertools.pairwise(plain)]
    threshold = float(np.median(changes))
    calls.clear()
    ran.clear()
    hooks[0] = head.register_forward_pre_hook(lambda m, a, kw: calls.append(kw), with_kwargs=True)
    model.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    run_loop(model)
    for h in hooks:
        h.remove()
    diffusers_computed = [k + 1 in ran for k in range(len(TIMESTEPS))]
    model.disable_cache()
    fbc = starter["FirstBlockCache"](threshold)
    ours = []
    for kw in calls:
        r = residual(head, kw)
        compute, _ = fbc.should_compute(r)
        if compute:  # as in the starter's transformer(): stored only when the rest runs
            fbc.head_block_residual = r
        ours.append(compute)
    assert ours == diffusers_computed
    assert True in ours[1:] and False in ours  # the threshold mixes runs and skips


def test_taylorseer_hooks_attention_modules_by_default():
    """In diffusers the hook wraps modules chosen by name: by default, on Flux, every attention module of the transformer blocks, and the norms and feed-forward layers around them still run. The default names must match whole, so on Wan, whose attention modules are `attn1` and `attn2`, it hooks nothing: `TaylorSeerCacheConfig()` on the tiny Flux transformer hooks exactly its attention modules (`transformer_blocks.0.attn` and both `single_transformer_blocks.*.attn`), and on a tiny `WanTransformer3DModel` none of its four (`blocks.*.attn1`, `blocks.*.attn2`), though `enable_cache` succeeds."""
    from diffusers import TaylorSeerCacheConfig
    from diffusers.hooks._common import _ATTENTION_CLASSES
    from tiny import tiny_wan_transformer

    def hooked_and_attention(model):
        model.enable_cache(TaylorSeerCacheConfig())
        modules = dict(model.named_modules())
        hooked = {n for n, m in modules.items() if getattr(m, "_diffusers_hook", None) and m._diffusers_hook.get_hook("taylorseer_cache")}  # fmt: skip
        return hooked, {n for n, m in modules.items() if isinstance(m, _ATTENTION_CLASSES)}

    hooked, attention = hooked_and_attention(three_block_flux_transformer())
    assert hooked == attention == {"transformer_blocks.0.attn", "single_transformer_blocks.0.attn", "single_transformer_blocks.1.attn"}  # fmt: skip
    hooked, attention = hooked_and_attention(tiny_wan_transformer())
    assert attention == {f"blocks.{i}.attn{j}" for i in (0, 1) for j in (1, 2)}
    assert hooked == set()


def test_taylorseer_default_schedule():
    """With the default `TaylorSeerCacheConfig()` (`disable_cache_before_step=3`, `cache_interval=5`) an attention module really runs at calls 0, 1, 2, 4 and 9 of a 10-step loop: call 3 is already a prediction."""
    from diffusers import TaylorSeerCacheConfig

    model = three_block_flux_transformer()
    model.enable_cache(TaylorSeerCacheConfig())
    calls, ran = [0], []
    attn = model.transformer_blocks[0].attn
    attn.to_q.register_forward_pre_hook(lambda m, a: ran.append(calls[0]))
    attn.register_forward_hook(lambda m, a, out: calls.__setitem__(0, calls[0] + 1))
    run_loop(model)
    assert calls[0] == len(TIMESTEPS) and ran == [0, 1, 2, 4, 9]


def test_numpy_taylorseer_matches_diffusers(starter):
    """With `cache_interval=3`, `disable_cache_before_step=2`, `max_order=2` (float32 factors), diffusers' TaylorSeer hook computes an attention module at calls 0, 1, 3, 6 and 9 of a 10-step loop and predicts the rest; the starter's NumPy `TaylorSeer` makes the same schedule and, fed the computed outputs, predicts the skipped ones to float32 rounding."""
    from diffusers import TaylorSeerCacheConfig

    model = three_block_flux_transformer()
    model.enable_cache(TaylorSeerCacheConfig(cache_interval=3, disable_cache_before_step=2, max_order=2, taylor_factors_dtype=torch.float32))  # fmt: skip
    attn = model.transformer_blocks[0].attn
    outs, ran = [], []  # attn's image-token output per call; the calls that really ran
    attn.to_q.register_forward_pre_hook(lambda m, a: ran.append(len(outs)))
    attn.register_forward_hook(lambda m, a, out: outs.append(out[0].double().numpy()))
    run_loop(model)
    computed = [k in ran for k in range(len(TIMESTEPS))]
    assert computed == [k in (0, 1, 3, 6, 9) for k in range(len(TIMESTEPS))]
    ts = starter["TaylorSeer"](cache_interval=3, disable_cache_before_step=2, max_order=2)
    for k, out in enumerate(outs):
        assert ts.should_compute() == computed[k]
        if computed[k]:
            ts.update(out)
        else:
            np.testing.assert_allclose(ts.predict(), out, rtol=1e-4, atol=1e-5)


def test_flux_pipeline_wraps_its_calls_in_cache_context(monkeypatch):
    """`FluxPipeline.__call__` runs each transformer call inside `transformer.cache_context("cond")`, and with true CFG (`true_cfg_scale > 1` and negative embeddings) the negative-prompt call inside `cache_context("uncond")`, so the two keep separate cache states (a 2-step call of a tiny pipeline whose transformer has FirstBlockCache enabled)."""
    assert cache_contexts_of_a_flux_call(monkeypatch) == ["cond", "uncond", "cond", "uncond"]


def test_flux_pipeline_runs_28_steps_by_default():
    """`FluxPipeline`'s default `num_inference_steps` is 28, the lab's `--steps 28`: a tiny `FluxPipeline` called without `num_inference_steps` calls its transformer 28 times, one call per step (a forward pre-hook counts them)."""
    pipe = tiny_flux_pipeline()
    text, pooled = flux_prompt_embeds()
    calls = []
    pipe.transformer.register_forward_pre_hook(lambda module, args: calls.append(module))
    with torch.no_grad():
        pipe(prompt_embeds=text[1:], pooled_prompt_embeds=pooled[1:], height=16, width=16, output_type="latent")  # fmt: skip
    assert len(calls) == 28


def test_taylorseer_without_warmup_cannot_start():
    """With `disable_cache_before_step=0` and `cache_interval=2`, TaylorSeer's first call is scheduled as a prediction with nothing computed yet, and diffusers raises `ValueError` ("Cannot predict without prior initialization/update"); with `cache_interval=1` every call computes and nothing raises."""
    from diffusers import TaylorSeerCacheConfig

    model = three_block_flux_transformer()
    model.enable_cache(TaylorSeerCacheConfig(disable_cache_before_step=0, cache_interval=2))
    with pytest.raises(ValueError, match="Cannot predict without prior initialization"):
        run_loop(model, TIMESTEPS[:1])
    model = three_block_flux_transformer()
    model.enable_cache(TaylorSeerCacheConfig(disable_cache_before_step=0, cache_interval=1))
    ran = []
    model.transformer_blocks[0].attn.to_q.register_forward_pre_hook(lambda m, a: ran.append(m))
    run_loop(model, TIMESTEPS[:3])
    assert len(ran) == 3


def test_taylorseer_on_real_flux_saves_only_the_attention_share(starter):
    """On the real Flux.1-dev transformer at 1024 px (built on the meta device), the 57 attention modules that `TaylorSeerCacheConfig()` hooks hold 42% of a call's FLOPs (torch's `FlopCounterMode`), so a predicted step still runs the feed-forward layers and projections, and the Taylor factors diffusers' hooks store after two computed steps take 3.23 GB: the figures the starter prints."""

    from labkit import model_sizes

    fresh = flux_1024_record()
    assert fresh == model_sizes.flux_1024px() == starter["flux"]
    assert round(100 * starter["attn_share"]) == 42
    assert f"{fresh['taylorseer_factor_bytes'] / 1e9:.2f}" == "3.23"


def test_taylorseer_lite_mode_hooks_blocks_and_proj_out():
    """`TaylorSeerCacheConfig(use_lite_mode=True)` hooks every top-level block as "inactive" (a predicted step returns zeros of the recorded shape, so the block is skipped) and extrapolates only `proj_out`'s output: the factors of one module instead of every attention module's."""
    from diffusers import TaylorSeerCacheConfig

    model = three_block_flux_transformer()
    model.enable_cache(TaylorSeerCacheConfig(use_lite_mode=True))
    hooks = {
        name: m._diffusers_hook.get_hook("taylorseer_cache")
        for name, m in model.named_modules()
        if getattr(m, "_diffusers_hook", None) and m._diffusers_hook.get_hook("taylorseer_cache")
    }
    blocks = {"transformer_blocks.0", "single_transformer_blocks.0", "single_transformer_blocks.1"}
    assert set(hooks) == blocks | {"proj_out"}
    # the state each hook keeps says which mode it runs in
    kwargs = {name: h.state_manager._init_kwargs["is_inactive"] for name, h in hooks.items()}
    assert kwargs == {name: name != "proj_out" for name in hooks}
