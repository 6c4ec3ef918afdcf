"""Lab 18 (compilation and CUDA graphs) against torch.compile and diffusers, on the CPU.

With static shapes dynamo's graphs, guards, recompiles and graph breaks do not depend on
the backend (under dynamic shapes inductor can add shape guards while it lowers a graph, so
``CompileCounter`` may undercount recompiles there), so the counting tests compile with ``torch._dynamo.testing.CompileCounter`` (a backend that
counts compiled frames and their ops and runs them eagerly) or ``torch._dynamo.explain``:
the real capture path, minus code generation. One test compiles with the default
inductor backend. ``mode="reduce-overhead"`` (CUDA graphs) needs a CUDA device: the page
cites it, nothing here runs it. Every test starts from ``torch._dynamo.reset()``.

Importing inductor's lowering imports ``torch.utils.mkldnn``, whose class body calls
``torch.jit.script_method``, which raises torch's own DeprecationWarning ("`torch.jit.script_method`
is deprecated", advising torch.compile). No name a page teaches is involved, so the one test
that compiles with inductor lets that warning through with a ``default`` filter (it is shown
in the run's warnings summary, not hidden); any other DeprecationWarning still fails it.

The models are tiny random-config ``FluxTransformer2DModel`` (``tiny.tiny_flux_transformer``
with 1 or 2 double- and 1 to 4 single-stream blocks of width 32 on 4-channel packed tokens
and 8 text tokens; ``tiny.tiny_flux_pipeline`` for the LoRA tests) and
``UNet2DConditionModel`` (``tiny.tiny_unet``); no weights, no hub.
"""

from __future__ import annotations

import functools

import pytest
import torch
from tiny import (
    DIT_TEXT,
    DIT_TOKENS,
    EMBED_DIM,
    tiny_flux_pipeline,
    tiny_flux_transformer,
    tiny_unet,
)
from torch._dynamo.testing import CompileCounter
from torch.utils._python_dispatch import TorchDispatchMode

pytestmark = pytest.mark.usefixtures("quiet_diffusers")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts and ends with dynamo's caches and counters empty."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def two_block_flux(guidance_embeds=False):
    """``tiny.four_block_flux_transformer``'s config with one double- and one single-stream block:
    the same capture, half the ops to trace. ``guidance_embeds=True`` as FLUX.1-dev."""
    return tiny_flux_transformer(
        guidance_embeds, pooled_projection_dim=16, axes_dims_rope=(4, 6, 6), in_channels=4
    )


def flux_inputs(side, batch=1, width=None, guidance=False):
    """A side x width latent grid (square by default) as packed tokens of 4 channels. Token
    counts 9, 25, 36 differ from every other input size (8 text tokens of 32, pooled 16, 4
    channels, 3 id columns), so under ``dynamic=True`` no size shares a symbol with them.
    ``guidance=True`` adds ``guidance`` of shape (batch,), as ``FluxPipeline`` passes it
    (``pipeline_flux.py:847-849``) to a transformer with ``guidance_embeds=True``."""
    g = torch.Generator().manual_seed(0)
    width = width or side
    img_ids = torch.zeros(side * width, 3)
    img_ids[:, 1] = torch.arange(side).repeat_interleave(width)
    img_ids[:, 2] = torch.arange(width).repeat(side)
    inputs = dict(
        hidden_states=torch.randn(batch, side * width, 4, generator=g),
        encoder_hidden_states=torch.randn(batch, 8, 32, generator=g),
        pooled_projections=torch.randn(batch, 16, generator=g),
        timestep=torch.full((batch,), 0.5),
        img_ids=img_ids,
        txt_ids=torch.zeros(8, 3),
        return_dict=False,
    )
    if guidance:
        inputs["guidance"] = torch.full((batch,), 3.5)
    return inputs


def graphs_per_side(compiled, counter, sides, mark=False):
    """Frames compiled so far after each call, one call per side: an int (a square grid,
    batch 1) or a ``flux_inputs`` argument tuple (side, batch[, width])."""
    seen = []
    with torch.no_grad():
        for side in sides:
            inputs = flux_inputs(*side) if isinstance(side, tuple) else flux_inputs(side)
            if mark:
                torch._dynamo.mark_dynamic(inputs["hidden_states"], 1)
                torch._dynamo.mark_dynamic(inputs["img_ids"], 0)
            compiled(**inputs)
            seen.append(counter.frame_count)
    return seen


@pytest.mark.filterwarnings("default:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_inductor_compiles_a_flux_block_on_cpu():
    """`torch.compile` with the default inductor backend compiles a `FluxSingleTransformerBlock` on the CPU, and its output matches eager to within 1e-5."""
    from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock

    torch.manual_seed(0)
    block = FluxSingleTransformerBlock(dim=32, num_attention_heads=2, attention_head_dim=16).eval()
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(1, 9, 32, generator=g), torch.randn(1, 8, 32, generator=g), torch.randn(1, 32, generator=g))  # fmt: skip
    with torch.no_grad():
        want = block(*args)
        got = torch.compile(block)(*args)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_whole_models_capture_without_graph_breaks():
    """`torch._dynamo.explain` captures a tiny `FluxTransformer2DModel` and a tiny `UNet2DConditionModel` each as one graph, with no graph break."""
    flux = two_block_flux()
    unet = tiny_unet()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        flux_explain = torch._dynamo.explain(flux)(**flux_inputs(3))
        unet_explain = torch._dynamo.explain(unet)(
            torch.randn(1, 4, 8, 8, generator=g), torch.tensor(10),
            torch.randn(1, 77, EMBED_DIM, generator=g), return_dict=False,
        )  # fmt: skip
    for explained in (flux_explain, unet_explain):
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def block_kind_backend(counter, kinds, gm, example_inputs):
    """A dynamo backend: notes which Flux block a graph is (a double-stream block's graph
    reads norm1's weights, a single-stream one's norm's), then counts it with ``counter``."""
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    kinds.append("double" if any("norm1" in n for n in names) else "single")
    return counter(gm, example_inputs)


def test_regional_compile_graphs_do_not_grow_with_depth():
    """`compile_repeated_blocks` compiles the classes in `_repeated_blocks`, not each block: with 2 or with 4 single-stream blocks, a tiny Flux transformer makes the same 3 graphs, one for `FluxTransformerBlock` and two for `FluxSingleTransformerBlock` (the second single-stream block's input is a slice of the first's output, so a stride guard fails once), while a whole-model compile traces more ops for the deeper model."""
    from torch._dynamo.utils import guard_failures

    regional, whole, reasons = {}, {}, {}
    for singles in (2, 4):
        model = tiny_flux_transformer(
            False, pooled_projection_dim=16, axes_dims_rope=(4, 6, 6), in_channels=4,
            num_layers=2, num_single_layers=singles,
        )  # fmt: skip
        counter = CompileCounter()
        torch._dynamo.reset()
        torch.compile(model, backend=counter)(**flux_inputs(3))
        whole[singles] = counter.op_count
        counter, kinds = CompileCounter(), []
        backend = functools.partial(block_kind_backend, counter, kinds)
        torch._dynamo.reset()
        model.compile_repeated_blocks(backend=backend)
        with torch.no_grad():
            model(**flux_inputs(3))
        regional[singles] = (counter.frame_count, counter.op_count, sorted(kinds))
        reasons[singles] = [r for failures in guard_failures.values() for r in failures]
    assert regional[2] == regional[4] == (3, regional[2][1], ["double", "single", "single"])
    for failed in reasons.values():  # the one recompile: hidden_states' stride, not its shape
        assert len(failed) == 1 and "'hidden_states' stride mismatch" in failed[0]
    assert whole[4] > whole[2] > regional[2][1]


def test_new_resolution_recompiles_static_and_once_by_default():
    """With `dynamic=False` every new resolution compiles a new graph (2 sizes, 2 graphs), a size seen before reuses its graph, and under `torch.compiler.set_stance("fail_on_recompile")` a new size raises instead of compiling; with the default `dynamic=None` the first new size recompiles once, with the token count made symbolic, and later token counts above 1 compile nothing, while a size of 1 stays a constant: batch 2 compiles a graph with a symbolic batch, which batch 4 reuses, and a 1-token call (a 16 px FLUX.1 image) compiles one more."""
    model = two_block_flux()
    counter = CompileCounter()
    static = torch.compile(model, backend=counter, dynamic=False)
    assert graphs_per_side(static, counter, [3, 5, 3]) == [1, 2, 2]
    with torch.compiler.set_stance("fail_on_recompile"), torch.no_grad():
        static(**flux_inputs(5))  # a compiled shape runs
        with pytest.raises(RuntimeError, match="fail_on_recompile"):
            static(**flux_inputs(7))
    torch._dynamo.reset()
    counter = CompileCounter()
    default = torch.compile(model, backend=counter)
    sides = [3, 5, 6, (6, 2), (7, 4), (2, 1), (1, 1)]  # (side, batch)
    assert graphs_per_side(default, counter, sides) == [1, 2, 2, 3, 3, 3, 4]


def test_dynamic_true_or_mark_dynamic_compile_once():
    """With `dynamic=True`, or with `torch._dynamo.mark_dynamic` on the token dimension of `hidden_states` and `img_ids`, three resolutions compile one graph, and a later token count of 1 (a 16 px FLUX.1 image) compiles a second, since a size of 1 is specialised; and under `dynamic=True` a first call whose 32 image tokens equal another input's size (the text width of `encoder_hidden_states`, fixed at 32 by `context_embedder`'s weight) shares that size's symbol, so the token count is specialised and the next resolution recompiles."""
    model = two_block_flux()
    counter = CompileCounter()
    assert graphs_per_side(torch.compile(model, backend=counter, dynamic=True), counter, [3, 5, 6, 1]) == [1, 1, 1, 2]  # fmt: skip
    torch._dynamo.reset()
    counter = CompileCounter()
    sides = [(4, 1, 8), 5, 6]  # a 4 x 8 grid: 32 tokens, then 25 and 36
    assert graphs_per_side(torch.compile(model, backend=counter, dynamic=True), counter, sides) == [1, 2, 2]  # fmt: skip
    torch._dynamo.reset()
    counter = CompileCounter()
    static = torch.compile(model, backend=counter, dynamic=False)
    assert graphs_per_side(static, counter, [3, 5, 6, 1], mark=True) == [1, 1, 1, 2]


def test_duck_shape_off_keeps_the_token_count_symbolic():
    """With `torch.fx.experimental._config.use_duck_shape = False`, as diffusers' Accelerate inference guide pairs with `dynamic=True`, equal input sizes get separate symbols: the first call's 32 image tokens, equal to the text width of 32, stay symbolic, and three resolutions compile one graph."""
    import torch.fx.experimental._config as fx_config

    counter = CompileCounter()
    with fx_config.patch(use_duck_shape=False):
        compiled = torch.compile(two_block_flux(), backend=counter, dynamic=True)
        assert graphs_per_side(compiled, counter, [(4, 1, 8), 5, 6]) == [1, 1, 1]


def test_mark_dynamic_needs_img_ids_and_batches_still_recompile():
    """`torch._dynamo.mark_dynamic` has to mark the token dimension of both the packed `latents` passed as `hidden_states` (dim 1) and `img_ids` (dim 0): marking only `hidden_states` raises `ConstraintViolationError`, because `img_ids`' static length pins the token count; and neither option covers batch sizes: under `dynamic=True` batch 1 and batch 2 need two graphs (batch 4 reuses the second), and with both marks under `dynamic=False` each batch size compiles its own graph."""
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

    model = two_block_flux()
    for dynamic in (False, None):
        torch._dynamo.reset()
        inputs = flux_inputs(3)
        torch._dynamo.mark_dynamic(inputs["hidden_states"], 1)  # img_ids left static
        with torch.no_grad(), pytest.raises(ConstraintViolationError, match="hidden_states"):
            torch.compile(model, backend=CompileCounter(), dynamic=dynamic)(**inputs)
    sides = [(3, 1), (5, 1), (5, 2), (6, 4)]  # (side, batch): 9, 25, 25, 36 tokens
    torch._dynamo.reset()
    counter = CompileCounter()
    assert graphs_per_side(torch.compile(model, backend=counter, dynamic=True), counter, sides) == [1, 1, 2, 2]  # fmt: skip
    torch._dynamo.reset()
    counter = CompileCounter()
    static = torch.compile(model, backend=counter, dynamic=False)
    assert graphs_per_side(static, counter, sides, mark=True) == [1, 1, 2, 3]


def test_default_graph_count_depends_on_the_order():
    """Under the default automatic dynamic shapes the graph count depends on the order of requests: had the batch gone from 1 to 2 before any token count changed, the shapes (batch 1, 9 tokens), (2, 9), (1, 25), (4, 36), (2, 49), (1, 36) compile 4 graphs, not 3."""
    model = two_block_flux()
    counter = CompileCounter()
    sides = [(3, 1), (3, 2), (5, 1), (6, 4), (7, 2), (6, 1)]  # (side, batch): tokens = side**2
    assert graphs_per_side(torch.compile(model, backend=counter), counter, sides) == [1, 2, 3, 4, 4, 4]  # fmt: skip


def test_recompile_limit_falls_back_to_eager():
    """Past `torch._dynamo.config.recompile_limit` (8 by default) compiled versions of a function, dynamo compiles no more and runs new shapes eagerly, with the same output; compiled with `fullgraph=True`, the call past the limit raises instead."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    assert torch._dynamo.config.recompile_limit == 8
    model = two_block_flux()
    counter = CompileCounter()
    static = torch.compile(model, backend=counter, dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=1), torch.no_grad():
        assert graphs_per_side(static, counter, [3, 5, 6]) == [1, 1, 1]
        torch.testing.assert_close(static(**flux_inputs(6))[0], model(**flux_inputs(6))[0])
        torch._dynamo.reset()
        full = torch.compile(model, backend=CompileCounter(), dynamic=False, fullgraph=True)
        full(**flux_inputs(3))
        with pytest.raises(FailOnRecompileLimitHit):
            full(**flux_inputs(5))


def test_nine_static_buckets_pass_the_recompile_limit():
    """Nine static buckets (3 token counts by batch 1, 2 and 4) compiled with `dynamic=False` under the default `recompile_limit` of 8 make 8 graphs: the ninth bucket runs eagerly, with the same output, and once it has fallen back outside the stance `torch.compiler.set_stance("fail_on_recompile")` does not raise for it; and raising `recompile_limit` after that fallback compiles nothing more: it has to be raised before the warm-up (that the limit caps the graphs at its value is `test_recompile_limit_falls_back_to_eager`'s, with a limit of 1)."""
    from torch._dynamo.utils import counters

    counters.clear()
    model = two_block_flux()
    counter = CompileCounter()
    static = torch.compile(model, backend=counter, dynamic=False)
    buckets = [(side, batch) for side in (3, 5, 6) for batch in (1, 2, 4)]  # 9, 25, 36 tokens
    assert graphs_per_side(static, counter, buckets) == [1, 2, 3, 4, 5, 6, 7, 8, 8]
    assert (counters["frames"]["total"], counters["frames"]["ok"]) == (9, 8)
    with torch.no_grad():
        with torch.compiler.set_stance("fail_on_recompile"):
            out = static(**flux_inputs(6, 4))[0]  # the ninth bucket: eager, no error
        torch.testing.assert_close(out, model(**flux_inputs(6, 4))[0])
        with torch._dynamo.config.patch(recompile_limit=9):
            static(**flux_inputs(6, 4))  # too late: the function is past its limit
    assert counter.frame_count == 8


def test_regional_compile_spends_the_limit_per_block_class():
    """`compile_repeated_blocks(dynamic=False)` spends `recompile_limit` (8) per block class, not per model: on a tiny Flux transformer with one double- and two single-stream blocks each new token count compiles `FluxTransformerBlock` once and `FluxSingleTransformerBlock` twice (the stride recompile), so from the fifth shape only the double-stream block compiles and every single-stream block runs eagerly."""
    model = tiny_flux_transformer(
        False, pooled_projection_dim=16, axes_dims_rope=(4, 6, 6), in_channels=4,
        num_layers=1, num_single_layers=2,
    )  # fmt: skip
    counter, kinds = CompileCounter(), []
    model.compile_repeated_blocks(backend=functools.partial(block_kind_backend, counter, kinds), dynamic=False)  # fmt: skip
    seen = []
    with torch.no_grad():
        for side in (3, 4, 5, 6, 7):
            model(**flux_inputs(side))
            seen.append(counter.frame_count)
    assert seen == [3, 6, 9, 12, 13]
    assert kinds.count("single") == 8 and kinds.count("double") == 5


def test_a_new_shape_reaching_the_limit_under_fail_on_recompile_raises():
    """A shape that first reaches `recompile_limit` (8) under `torch.compiler.set_stance("fail_on_recompile")` raises (dynamo's stance check runs before its limit check); outside the stance the same shape falls back to eager, and after that fallback it runs under the stance without error. `torch._dynamo.config.fail_on_recompile_limit_hit = True` makes the limit itself an error."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    model = two_block_flux()
    counter = CompileCounter()
    static = torch.compile(model, backend=counter, dynamic=False)
    buckets = [(side, batch) for side in (3, 5, 6) for batch in (1, 2, 4)]
    assert graphs_per_side(static, counter, buckets[:8])[-1] == 8
    with torch.no_grad():
        with torch.compiler.set_stance("fail_on_recompile"):
            with pytest.raises(RuntimeError, match="fail_on_recompile"):
                static(**flux_inputs(6, 4))  # the ninth bucket, first seen here
        static(**flux_inputs(6, 4))  # outside the stance: past the limit, eager
        with torch.compiler.set_stance("fail_on_recompile"):
            static(**flux_inputs(6, 4))  # fallen back already: no error
            static(**flux_inputs(7, 1))  # a tenth new shape: no error either
        assert counter.frame_count == 8
        torch._dynamo.reset()
        limited = torch.compile(model, backend=CompileCounter(), dynamic=False)
        with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True):
            limited(**flux_inputs(3))
            with pytest.raises(FailOnRecompileLimitHit):
                limited(**flux_inputs(5))


def pipe_frames(pipe, counter, sides, latents=None):
    """Frames compiled so far after each 2-step `pipe(...)` call, one per image side in px or
    per (side, batch): ``batch`` rows of prompt_embeds, one image each."""
    seen = []
    for side in sides:
        side, batch = side if isinstance(side, tuple) else (side, 1)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            pipe(
                prompt_embeds=torch.randn(batch, DIT_TOKENS, DIT_TEXT, generator=g),
                pooled_prompt_embeds=torch.randn(batch, DIT_TEXT, generator=g),
                height=side, width=side, num_inference_steps=2, latents=latents,
                generator=torch.Generator().manual_seed(1), output_type="latent",
            )  # fmt: skip
        seen.append(counter.frame_count)
    return seen


def test_mark_unbacked_through_flux_pipeline_shares_one_graph_across_batch_sizes():
    """Through `FluxPipeline.__call__` with FLUX.1-dev's config (`guidance_embeds=True`), a forward pre-hook on the `torch.compile(pipe.transformer, dynamic=False)` wrapper that marks the token dimension with `mark_dynamic` and the batch dimension of `hidden_states`, `encoder_hidden_states`, `pooled_projections`, `timestep` and `guidance` with `torch._dynamo.decorators.mark_unbacked` makes the batch an unbacked symbol, not specialised at 1: batch 1, 2 and 4 at the tiny pipeline's 16, 32 and 48 px (16 to 144 tokens) share one dynamo graph, with the eager pipeline's latents, if the hook passes `guidance.contiguous()`; `FluxPipeline` builds `guidance` with `.expand(batch)` (stride 1 at batch 1, 0 from batch 2), and without that copy batch 2 fails the graph's stride guard on `guidance` and recompiles."""
    from torch._dynamo.decorators import mark_unbacked

    contiguous, tokens = [False], set()

    def mark(module, args, kwargs):
        tokens.add(kwargs["hidden_states"].shape[1])
        if contiguous[0]:
            kwargs = dict(kwargs, guidance=kwargs["guidance"].contiguous())
        torch._dynamo.mark_dynamic(kwargs["hidden_states"], 1)
        torch._dynamo.mark_dynamic(kwargs["img_ids"], 0)
        for name in ("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "guidance"):  # fmt: skip
            mark_unbacked(kwargs[name], 0)
        return args, kwargs

    pipe, counter = tiny_flux_pipeline(guidance_embeds=True), CompileCounter()
    eager = pipe.transformer
    compiled = torch.compile(eager, backend=counter, dynamic=False)
    compiled.register_forward_pre_hook(mark, with_kwargs=True)  # runs before dynamo
    pipe.transformer = compiled
    assert pipe_frames(pipe, counter, [(16, 1)]) == [1]  # batch 1: guidance's stride is 1
    with torch.compiler.set_stance("fail_on_recompile"):  # raises where it would recompile
        with pytest.raises(RuntimeError, match=r"kwargs\['guidance'\]' stride mismatch"):
            pipe_frames(pipe, counter, [(32, 2)])  # the pipeline's expanded guidance
    contiguous[0] = True
    assert pipe_frames(pipe, counter, [(32, 2), (48, 4)]) == [1, 1]
    latents = []
    for transformer in (compiled, eager):
        pipe.transformer = transformer
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            latents.append(pipe(
                prompt_embeds=torch.randn(4, DIT_TOKENS, DIT_TEXT, generator=g),
                pooled_prompt_embeds=torch.randn(4, DIT_TEXT, generator=g),
                height=48, width=48, num_inference_steps=2,
                generator=torch.Generator().manual_seed(1), output_type="latent",
            ).images)  # fmt: skip
    assert counter.frame_count == 1 and sorted(tokens) == [16, 64, 144]
    torch.testing.assert_close(*latents)


def test_mark_dynamic_through_flux_pipeline_needs_a_pre_hook_on_the_compiled_wrapper():
    """Through `FluxPipeline.__call__`, which builds `img_ids` itself, `mark_dynamic` works from a forward pre-hook registered on the `torch.compile(pipe.transformer, dynamic=False)` wrapper that marks `hidden_states` (dim 1) and `img_ids` (dim 0) on every call: the tiny pipeline's 16, 32 and 48 px, 16, 64 and 144 packed tokens (its VAE halves the side), share one graph; marking only the `latents` passed to `pipe(...)` raises `ConstraintViolationError`, and the same hook inside `pipe.transformer.compile()` is traced and fails."""
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

    tokens = []

    def mark(module, args, kwargs):
        torch._dynamo.mark_dynamic(kwargs["hidden_states"], 1)
        torch._dynamo.mark_dynamic(kwargs["img_ids"], 0)
        tokens.append(kwargs["hidden_states"].shape[1])

    pipe = tiny_flux_pipeline()
    counter = CompileCounter()
    compiled = torch.compile(pipe.transformer, backend=counter, dynamic=False)
    compiled.register_forward_pre_hook(mark, with_kwargs=True)  # runs before dynamo
    pipe.transformer = compiled
    assert pipe_frames(pipe, counter, [16, 32, 48]) == [1, 1, 1]
    assert tokens[::2] == [16, 64, 144]  # 2 steps a call; none is 1 token, FLUX.1's 16 px
    torch._dynamo.reset()
    pipe = tiny_flux_pipeline()
    pipe.transformer.compile(backend=CompileCounter(), dynamic=False)
    latents = torch.randn(1, 16, 64)  # 16 px: 16 packed tokens of 64
    torch._dynamo.mark_dynamic(latents, 1)
    with pytest.raises(ConstraintViolationError):
        pipe_frames(pipe, counter, [16], latents=latents)
    torch._dynamo.reset()
    pipe = tiny_flux_pipeline()
    pipe.transformer.register_forward_pre_hook(mark, with_kwargs=True)
    pipe.transformer.compile(backend=CompileCounter(), dynamic=False)
    with pytest.raises(Exception, match="mark_dynamic"):
        pipe_frames(pipe, counter, [16])


@pytest.fixture(scope="module")
def uncached_ops():
    """``cached_op_counts(None)``'s op count, traced once for the module's cache tests (the
    same model config and input in each: one capture, not one per test)."""
    torch._dynamo.reset()
    try:
        return cached_op_counts(None)[1]
    finally:
        torch._dynamo.reset()


def cached_op_counts(config):
    """(frames, ops, blocks) that ``CompileCounter`` captures for one call of ``two_block_flux``
    with ``config`` enabled through ``enable_cache`` (None: no cache); ``blocks`` is, for each
    transformer block, the share of its parameters that a captured graph takes as inputs."""
    import contextlib

    model = two_block_flux()
    if config is not None:
        model.enable_cache(config)
    counter, captured = CompileCounter(), set()

    def backend(gm, example_inputs):  # CompileCounter, noting which tensors each graph takes
        captured.update(id(t) for t in example_inputs if isinstance(t, torch.Tensor))
        return counter(gm, example_inputs)

    compiled = torch.compile(model, backend=backend)
    context = model.cache_context("cond") if config is not None else contextlib.nullcontext()
    with torch.no_grad(), context:
        compiled(**flux_inputs(3))
    blocks = [*model.transformer_blocks, *model.single_transformer_blocks]
    shares = [sum(id(p) in captured for p in b.parameters()) / len(list(b.parameters())) for b in blocks]  # fmt: skip
    return counter.frame_count, counter.op_count, shares


def test_first_block_cache_breaks_the_graph(monkeypatch, uncached_ops):
    """With FirstBlockCache enabled the tiny Flux transformer no longer captures as one graph: the hook's `_should_compute_remaining_blocks`, which calls `.item()`, is wrapped in `torch.compiler.disable`, `torch._dynamo.explain` reports graph breaks there, and `torch.compile(..., fullgraph=True)` raises at that break instead of splitting the graph; the blocks themselves stay compiled (every block's parameters and nearly all of the uncached model's ops are captured)."""
    import sys

    from diffusers import FirstBlockCacheConfig
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook
    from torch._dynamo.exc import Unsupported

    assert FBCHeadBlockHook._should_compute_remaining_blocks._torchdynamo_disable
    callers, item = [], torch.Tensor.item

    def spy(tensor):  # who calls .item() in an eager cached call
        callers.append(sys._getframe(1).f_code.co_name)
        return item(tensor)

    eager = two_block_flux()
    eager.enable_cache(FirstBlockCacheConfig(threshold=0.1))
    with torch.no_grad(), eager.cache_context("cond"):
        monkeypatch.setattr(torch.Tensor, "item", spy)
        eager(**flux_inputs(3))  # the first call stores the head block's residual
        eager(**flux_inputs(3))  # the second compares against it
        monkeypatch.undo()
    assert "_should_compute_remaining_blocks" in callers
    model = two_block_flux()
    model.enable_cache(FirstBlockCacheConfig(threshold=0.1))
    with torch.no_grad(), model.cache_context("cond"):
        explained = torch._dynamo.explain(model)(**flux_inputs(3))
    assert explained.graph_break_count > 0 and explained.graph_count > 1
    assert any("_should_compute_remaining_blocks" in str(r.reason) for r in explained.break_reasons)  # fmt: skip
    torch._dynamo.reset()
    with torch.no_grad(), model.cache_context("cond"), pytest.raises(Unsupported, match="disable"):
        torch.compile(model, backend=CompileCounter(), fullgraph=True)(**flux_inputs(3))
    torch._dynamo.reset()
    frames, ops, blocks = cached_op_counts(FirstBlockCacheConfig(threshold=0.1))
    assert frames > 1 and ops >= 0.95 * uncached_ops
    assert blocks == [1.0, 1.0]  # every block's parameters are inputs of a captured graph


def test_mag_cache_runs_its_blocks_outside_the_graph(uncached_ops):
    """MagCache's head and block hooks run their whole `new_forward` under `torch.compiler.disable`, and that function calls the block's own forward, so with MagCache enabled a compiled Flux transformer runs every transformer block eagerly: `torch._dynamo.explain` reports graph breaks, `CompileCounter` captures under a third of the uncached model's ops and no block's parameters, and `fullgraph=True` raises."""
    from diffusers import MagCacheConfig
    from diffusers.hooks.mag_cache import MagCacheBlockHook, MagCacheHeadHook
    from torch._dynamo.exc import Unsupported

    assert MagCacheHeadHook.new_forward._torchdynamo_disable
    assert MagCacheBlockHook.new_forward._torchdynamo_disable
    config = MagCacheConfig(mag_ratios=[1.0] * 4, num_inference_steps=4)
    model = two_block_flux()
    model.enable_cache(config)
    with torch.no_grad(), model.cache_context("cond"):
        explained = torch._dynamo.explain(model)(**flux_inputs(3))
    assert explained.graph_break_count > 0 and explained.graph_count > 1
    torch._dynamo.reset()
    with torch.no_grad(), model.cache_context("cond"), pytest.raises(Unsupported, match="disable"):
        torch.compile(model, backend=CompileCounter(), fullgraph=True)(**flux_inputs(3))
    torch._dynamo.reset()
    _, ops, blocks = cached_op_counts(MagCacheConfig(mag_ratios=[1.0] * 4, num_inference_steps=4))
    assert ops < uncached_ops / 3
    assert blocks == [0.0, 0.0]  # no block's parameters reach any captured graph


def test_fuse_qkv_projections_keeps_the_output():
    """`fuse_qkv_projections()` on a tiny `FluxTransformer2DModel` gives every attention one `to_qkv` linear (and each double-stream block's text stream one `to_added_qkv`), and on a tiny `UNet2DConditionModel` each self-attention one `to_qkv` and each cross-attention one `to_kv`, with `FusedAttnProcessor2_0`; the forward then calls the fused linear once where it called `to_q`, `to_k` and `to_v` (forward hooks count the calls), and both outputs stay unchanged to within 1e-5."""
    from collections import Counter

    from diffusers.models.transformers.transformer_flux import FluxAttention

    def projection_calls(model, run):
        """Calls of each q/k/v projection (by its last name) during ``run()``."""
        calls, names = Counter(), ("to_q", "to_k", "to_v", "to_qkv", "to_kv", "to_added_qkv", "add_q_proj", "add_k_proj", "add_v_proj")  # fmt: skip
        leaves = [(name.rsplit(".", 1)[-1], m) for name, m in model.named_modules()]
        hooks = [m.register_forward_hook(lambda *_, n=n: calls.update([n])) for n, m in leaves if n in names]  # fmt: skip
        with torch.no_grad():
            out = run()
        for h in hooks:
            h.remove()
        return out, dict(calls)

    flux = two_block_flux()
    want, before = projection_calls(flux, lambda: flux(**flux_inputs(3))[0])
    flux.fuse_qkv_projections()
    got, after = projection_calls(flux, lambda: flux(**flux_inputs(3))[0])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert before == {"to_q": 2, "to_k": 2, "to_v": 2, "add_q_proj": 1, "add_k_proj": 1, "add_v_proj": 1}  # fmt: skip
    assert after == {"to_qkv": 2, "to_added_qkv": 1}, after  # one matmul where there were three
    double = {id(b.attn) for b in flux.transformer_blocks}
    attns = [m for m in flux.modules() if isinstance(m, FluxAttention)]
    assert len(attns) == 2 and all(m.fused_projections and hasattr(m, "to_qkv") for m in attns)
    assert all(hasattr(m, "to_added_qkv") == (id(m) in double) for m in attns)
    from diffusers.models.attention_processor import Attention, FusedAttnProcessor2_0

    unet = tiny_unet()
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(1, 4, 8, 8, generator=g), torch.tensor(10), torch.randn(1, 77, EMBED_DIM, generator=g))  # fmt: skip
    want, before = projection_calls(unet, lambda: unet(*args).sample)
    unet.fuse_qkv_projections()
    got, after = projection_calls(unet, lambda: unet(*args).sample)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    attns = [m for m in unet.modules() if isinstance(m, Attention)]
    n_self = sum(not m.is_cross_attention for m in attns)
    assert before == {p: len(attns) for p in ("to_q", "to_k", "to_v")}
    assert after == {"to_qkv": n_self, "to_q": len(attns) - n_self, "to_kv": len(attns) - n_self}, after  # fmt: skip
    assert attns and all(isinstance(m.processor, FusedAttnProcessor2_0) for m in attns)
    assert all(hasattr(m, "to_kv") if m.is_cross_attention else hasattr(m, "to_qkv") for m in attns)  # fmt: skip
    assert any(not m.is_cross_attention for m in attns) and any(m.is_cross_attention for m in attns)


def lora(pipe, rank, seed, targets=("attn.to_q", "attn.to_v"), component="transformer"):
    """A random diffusers-format LoRA on every Linear of ``pipe.<component>`` whose name ends
    in one of ``targets`` (by default every attention's to_q and to_v), as a state dict."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, module in getattr(pipe, component).named_modules():
        if name.endswith(targets):
            state[f"{component}.{name}.lora_A.weight"] = 0.3 * torch.randn(rank, module.in_features, generator=g)  # fmt: skip
            state[f"{component}.{name}.lora_B.weight"] = 0.3 * torch.randn(module.out_features, rank, generator=g)  # fmt: skip
    return state


def transformer_inputs():
    """One call of tiny_flux_pipeline's transformer: 16 packed tokens of 64, 8 text tokens."""
    g = torch.Generator().manual_seed(0)
    return dict(
        hidden_states=torch.randn(1, 16, 64, generator=g),
        encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
        pooled_projections=torch.randn(1, 32, generator=g),
        timestep=torch.tensor([0.5]),
        guidance=torch.tensor([3.5]),
        img_ids=torch.zeros(16, 3),
        txt_ids=torch.zeros(8, 3),
        return_dict=False,
    )


@pytest.fixture(scope="module")
def rank8_reference():
    """The eager transformer's output with the rank-8 LoRA loaded, and both LoRAs."""
    pipe = tiny_flux_pipeline()
    rank4, rank8 = lora(pipe, 4, 1), lora(pipe, 8, 2)
    pipe.load_lora_weights(dict(rank8), adapter_name="b")
    with torch.no_grad():
        return pipe.transformer(**transformer_inputs())[0], rank4, rank8


def test_lora_hotswap_on_a_compiled_model_does_not_recompile(rank8_reference):
    """After `pipe.enable_lora_hotswap(target_rank=8)` and a first `load_lora_weights`, `load_lora_weights(..., hotswap=True)` swaps a rank-8 LoRA, and then a rank-2 one, into the compiled Flux transformer without a recompile, and the output equals the eager model with that LoRA; a rank-16 LoRA on the same layers, above `target_rank`, swaps without an error but recompiles."""
    want, rank4, rank8 = rank8_reference
    pipe = tiny_flux_pipeline()
    pipe.enable_lora_hotswap(target_rank=8)
    pipe.load_lora_weights(dict(rank4), adapter_name="default_0")
    counter = CompileCounter()
    pipe.transformer.compile(backend=counter)
    with torch.no_grad():
        first = pipe.transformer(**transformer_inputs())[0]
        pipe.load_lora_weights(dict(rank8), adapter_name="default_0", hotswap=True)
        swapped = pipe.transformer(**transformer_inputs())[0]
    assert counter.frame_count == 1
    assert not torch.allclose(first, want)
    torch.testing.assert_close(swapped, want, atol=1e-6, rtol=1e-6)
    for rank, graphs in [(2, 1), (16, 2)]:  # below target_rank: in place; above: new tensors
        state = lora(pipe, rank, 3)
        eager = tiny_flux_pipeline()
        eager.load_lora_weights(dict(state), adapter_name="default_0")
        with torch.no_grad():
            pipe.load_lora_weights(state, adapter_name="default_0", hotswap=True)
            swapped, want = (p.transformer(**transformer_inputs())[0] for p in (pipe, eager))
        assert counter.frame_count == graphs, rank
        torch.testing.assert_close(swapped, want, atol=1e-6, rtol=1e-6)


def test_set_adapters_on_a_compiled_model_recompiles(rank8_reference):
    """`set_adapters` recompiles for each new adapter: on a compiled Flux transformer with two loaded LoRAs, `set_adapters` "a", then "b", "a", "b" gives graphs 1, 2, 2, 2 (switching back reuses the adapter's graph), with b's output at the end."""
    want, rank4, rank8 = rank8_reference
    pipe = tiny_flux_pipeline()
    pipe.load_lora_weights(dict(rank4), adapter_name="a")
    pipe.load_lora_weights(dict(rank8), adapter_name="b")
    counter, graphs = CompileCounter(), []
    pipe.transformer.compile(backend=counter)
    with torch.no_grad():
        for name in "abab":
            pipe.set_adapters(name)
            switched = pipe.transformer(**transformer_inputs())[0]
            graphs.append(counter.frame_count)
    assert graphs == [1, 2, 2, 2]
    torch.testing.assert_close(switched, want, atol=1e-6, rtol=1e-6)


def test_lora_hotswap_needs_the_first_adapters_layers_and_no_text_encoder():
    """A hotswapped LoRA may target only layers the first-loaded adapter already targets: through `FluxPipeline.load_lora_weights(..., hotswap=True)`, an adapter on `to_q` and `to_v` swapped into one loaded on `to_q` alone raises peft's `RuntimeError` ("unexpected keys"), and the failed call also drops the loaded adapter, leaving the base model's output when it was the only one; and a LoRA with text-encoder weights cannot be hotswapped (a `ValueError`), raised after the transformer's part is already swapped: the transformer then gives a fresh load's output of the new LoRA."""
    from tiny import tiny_text_encoder

    pipe = tiny_flux_pipeline()
    pipe.enable_lora_hotswap(target_rank=8)
    pipe.load_lora_weights(lora(pipe, 4, 1, targets=("attn.to_q",)), adapter_name="default_0")
    with pytest.raises(RuntimeError, match="unexpected keys found"):
        pipe.load_lora_weights(lora(pipe, 4, 2), adapter_name="default_0", hotswap=True)
    assert "default_0" not in getattr(pipe.transformer, "peft_config", {})
    with torch.no_grad():  # no LoRA left: the base model's output (tiny_flux_pipeline is seeded)
        torch.testing.assert_close(pipe.transformer(**transformer_inputs())[0], tiny_flux_pipeline().transformer(**transformer_inputs())[0])  # fmt: skip
    pipe = tiny_flux_pipeline()
    pipe.register_modules(text_encoder=tiny_text_encoder())  # FluxPipeline's CLIPTextModel slot
    pipe.enable_lora_hotswap(target_rank=8)
    both = lambda seed: {**lora(pipe, 4, seed), **lora(pipe, 4, seed, ("q_proj",), "text_encoder")}  # noqa: E731
    pipe.load_lora_weights(both(1), adapter_name="default_0")
    assert "default_0" in pipe.text_encoder.peft_config  # loaded without hotswap: fine
    with pytest.raises(ValueError, match="hotswapping is not supported for text encoders"):
        pipe.load_lora_weights(both(2), adapter_name="default_0", hotswap=True)
    fresh = tiny_flux_pipeline()  # the transformer's part of both(2), loaded the plain way
    fresh.load_lora_weights(lora(fresh, 4, 2), adapter_name="default_0")
    with torch.no_grad():
        swapped, want = (p.transformer(**transformer_inputs())[0] for p in (pipe, fresh))
    torch.testing.assert_close(swapped, want, atol=1e-6, rtol=1e-6)


def test_lora_hotswap_conditions_are_not_sufficient():
    """`load_lora_weights(..., hotswap=True)` swaps only if the LoRA targets just the first's layers and has no text-encoder weights, and these are not enough: through `FluxPipeline.load_lora_weights`, a LoRA on the first's `to_q` and `to_v` with ranks 4 and 2 (under `target_rank=8`), no text-encoder weights, swapped into a rank-4 adapter, raises a `ValueError` (its per-layer ranks make an `alpha_pattern` the first lacks)."""
    pipe = tiny_flux_pipeline()
    pipe.enable_lora_hotswap(target_rank=8)
    pipe.load_lora_weights(lora(pipe, 4, 1), adapter_name="default_0")
    mixed = {**lora(pipe, 4, 2, targets=("attn.to_q",)), **lora(pipe, 2, 3, targets=("attn.to_v",))}  # fmt: skip
    assert {k.rsplit(".lora_", 1)[0] for k in mixed} == {k.rsplit(".lora_", 1)[0] for k in lora(pipe, 4, 1)}  # fmt: skip
    with pytest.raises(ValueError, match="alpha_pattern"):
        pipe.load_lora_weights(mixed, adapter_name="default_0", hotswap=True)


def test_lora_hotswap_enabled_after_the_first_load_recompiles():
    """Hotswap, enabled before the first load, need not recompile; enabled after it, it does: through `FluxPipeline.load_lora_weights`, `pipe.enable_lora_hotswap(target_rank=8, check_compiled="warn")` called after the first load only logs a warning, and a rank-8 LoRA on the first's layers, with no text-encoder weights, hotswapped into the compiled transformer then recompiles (a second graph), with a fresh load's output."""
    from tiny import logged_messages

    pipe = tiny_flux_pipeline()
    pipe.load_lora_weights(lora(pipe, 4, 1), adapter_name="default_0")
    with logged_messages() as messages:
        pipe.enable_lora_hotswap(target_rank=8, check_compiled="warn")
    assert any("before loading the first adapter" in m for m in messages), messages
    counter = CompileCounter()
    pipe.transformer.compile(backend=counter)
    state = lora(pipe, 8, 2)
    eager = tiny_flux_pipeline()
    eager.load_lora_weights(dict(state), adapter_name="default_0")
    with torch.no_grad():
        pipe.transformer(**transformer_inputs())
        assert counter.frame_count == 1
        pipe.load_lora_weights(dict(state), adapter_name="default_0", hotswap=True)
        swapped, want = (p.transformer(**transformer_inputs())[0] for p in (pipe, eager))
    assert counter.frame_count == 2
    torch.testing.assert_close(swapped, want, atol=1e-6, rtol=1e-6)


class DispatchCounter(TorchDispatchMode):
    """Counts the aten operations a forward dispatches, views (outputs aliasing an input) left out."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        aliases = any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)  # fmt: skip
        self.count += not aliases
        return func(*args, **(kwargs or {}))


def dispatched_ops(num_layers, num_single_layers):
    """Non-view aten ops of one bfloat16 call of a tiny FLUX.1-dev-like transformer (guidance
    embedder on) with the given block counts; img_ids and txt_ids in bfloat16, as FluxPipeline
    passes them."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built and fed in bf16, as a bf16 pipeline runs it
    try:
        model = tiny_flux_transformer(
            True, pooled_projection_dim=16, axes_dims_rope=(4, 6, 6), in_channels=4,
            num_layers=num_layers, num_single_layers=num_single_layers,
        )  # fmt: skip
        inputs = dict(flux_inputs(3), guidance=torch.full((1,), 3.5))
        with torch.no_grad(), DispatchCounter() as counter:
            model(**inputs)
    finally:
        torch.set_default_dtype(default)
    return counter.count


def test_diffusers_flux_forward_dispatches_far_more_ops_than_the_toy_counts():
    """Diffusers' `FluxTransformer2DModel` forward in bfloat16, counted on tiny models and scaled to FLUX.1-dev's 19 double- and 38 single-stream blocks, dispatches about 3,700 non-view aten operations per step, more than twice the lab's 1,422 kernels (a count of operations, not of CUDA kernels: a fused RMSNorm or an op with several kernels would move it)."""
    base = dispatched_ops(1, 1)
    double, single = dispatched_ops(2, 1) - base, dispatched_ops(1, 2) - base
    per_step = base + 18 * double + 37 * single  # FLUX.1-dev: 19 and 38 blocks
    assert round(per_step, -2) == 3700 and per_step > 2 * 1422


def test_compiled_diffusers_models_share_the_recompile_limit():
    """The whole-model limit counts entries per code object, and a compiled diffusers model enters through the `wrapper` of `apply_lora_scale` (`diffusers/utils/peft_utils.py:301`), which `FluxTransformer2DModel` and `UNet2DConditionModel` share: by default, with `recompile_limit` at 3, after 2 static Flux shapes a compiled tiny UNet gets only 1 dynamo graph, and its second size runs eagerly, with the same output; the same UNet compiled with `torch.compile(..., isolate_recompiles=True)` keeps entries of its own and compiles that size."""
    flux, unet = two_block_flux(), tiny_unet()
    assert type(flux).forward.__code__ is type(unet).forward.__code__  # one shared `wrapper`
    counter = CompileCounter()
    compiled_flux = torch.compile(flux, backend=counter, dynamic=False)
    compiled_unet = torch.compile(unet, backend=counter, dynamic=False)
    isolated = torch.compile(unet, backend=counter, dynamic=False, isolate_recompiles=True)
    g = torch.Generator().manual_seed(0)
    text = torch.randn(1, 77, EMBED_DIM, generator=g)
    latents = {side: torch.randn(1, 4, side, side, generator=g) for side in (8, 16)}
    seen = []
    # a limit of 3 instead of the default 8 (test_dynamo_shape_defaults): the same sharing, fewer compiles
    with torch._dynamo.config.patch(recompile_limit=3), torch.no_grad():
        assert graphs_per_side(compiled_flux, counter, [2, 3]) == [1, 2]
        for side in (8, 16):
            out = compiled_unet(latents[side], torch.tensor(10), text, return_dict=False)[0]
            seen.append(counter.frame_count)
        torch.testing.assert_close(out, unet(latents[16], torch.tensor(10), text, return_dict=False)[0])  # fmt: skip
        isolated(latents[16], torch.tensor(10), text, return_dict=False)
        seen.append(counter.frame_count)
    assert seen == [3, 3, 4]


def test_the_shared_budget_counts_model_configurations_not_classes():
    """Size the shared limit as buckets × compiled model configurations, not classes: a second compiled tiny Flux transformer with the same config (other weights) reuses the first's dynamo graph for a shape, while one of the same class with FLUX.1-dev's `guidance_embeds=True` (FLUX.1-schnell's config has it off) spends an entry of its own."""
    schnell, other, dev = two_block_flux(), two_block_flux(), two_block_flux(guidance_embeds=True)
    counter = CompileCounter()
    seen = []
    with torch.no_grad():
        for model, guidance in ((schnell, False), (other, False), (dev, True)):
            torch.compile(model, backend=counter, dynamic=False)(**flux_inputs(3, guidance=guidance))  # fmt: skip
            seen.append(counter.frame_count)
    assert seen == [1, 1, 2]


def test_many_but_not_all_diffusers_models_share_apply_lora_scales_wrapper():
    """Many diffusers models share one `forward` code object, the `wrapper` of `apply_lora_scale`, Flux's `FluxTransformer2DModel` and the SD UNet's `UNet2DConditionModel` among them, but not every model: of the `ModelMixin` classes diffusers exports, `DiTTransformer2DModel` and others have their own `forward`."""
    import inspect

    import diffusers
    from diffusers.models.modeling_utils import ModelMixin

    shared = diffusers.FluxTransformer2DModel.forward.__code__
    models = {}
    for name in dir(diffusers):  # every class diffusers exports (lazily imported here)
        cls = getattr(diffusers, name, None)
        if inspect.isclass(cls) and issubclass(cls, ModelMixin) and cls is not ModelMixin:
            models[name] = cls
    sharing = {n for n, c in models.items() if getattr(c.forward, "__code__", None) is shared}
    assert shared.co_name == "wrapper" and "UNet2DConditionModel" in sharing
    assert "DiTTransformer2DModel" in models.keys() - sharing
    assert 10 < len(sharing) < len(models) - 10
