"""Lab 19 (parallel inference) against diffusers' context parallelism, on 2, 4 and 5 CPU processes.

diffusers 0.42.1 splits a transformer's sequence across processes with
``ContextParallelConfig(ring_degree=..., ulysses_degree=...)`` passed to
``ModelMixin.enable_parallelism(config=...)``; the model's ``_cp_plan`` says which inputs
are split and which output is gathered. One module-scoped fixture launches five processes
once (this one as rank 0, four of this file: ``python test_page_lab_19.py RANK OUT
_all_main``, torchrun's environment variables set by hand), which form three ``gloo``
process groups on the CPU in turn (``GROUPS``), each initialised, used and destroyed before
the next, on its own port; a process outside a group waits until that group's results are
written. The group of two processes (ranks 0 and 1) runs every case on a tiny random-config
``FluxTransformer2DModel`` (``tiny.tiny_flux_transformer``: 1 double- and 1 single-stream
block, 2 heads of 16, 16 image and 8 text tokens), and one case on a tiny
``WanTransformer3DModel``; each rank writes its results as JSON, and the tests read them
(fixture ``ranks``). The group of four (``mesh_ranks``) runs what needs more than two ranks:
a ring over 4 (one block against all of the gathered K/V) and ring 2 x Ulysses 2 (diffusers'
unified attention). The group of five (``five_ranks``): token counts and head counts that 5
does not divide, and ``ulysses_anything`` / ``ring_anything`` on unequal token shares, run
once with gloo's ``all_gather`` (which refuses unequal shards) and once with an NCCL-style
one substituted (``_nccl_style_all_gather``). The reference is the same model without
parallelism, in the same process.

What the run found on this CPU-only machine: ``enable_parallelism`` refuses before it
builds a device mesh, because ``_resolve_parallel_config`` picks the device as
``rank % torch.accelerator.device_count()`` and a CPU-only torch counts 0 accelerators.
With that count patched to 1 (``unittest.mock``, in the worker only: nothing else is
changed), Ulysses runs diffusers' own code end to end; ring then stops at the native
(SDPA) backend, whose forward op cannot return the log-sum-exp the ring merge needs. With
that op also replaced by one that returns it (plain torch, ``_lse_forward_op`` below),
diffusers' ring runs. Separately, the same two splits are written by hand with
``torch.distributed`` on gloo (``batch_isend_irecv`` for a rotating ring,
``all_to_all`` for Ulysses) on the q, k, v the real model's first attention receives.

Warnings in the workers are recorded, not filtered: one test reports the FutureWarning
that diffusers' context-parallel code raises through torch.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

WORLD = 2


#: how long a collective waits for the slowest rank: rank 0 (in pytest, diffusers already
#: imported) reaches its first barrier while the other ranks still import diffusers, which
#: can take minutes on a loaded 2-core machine
TIMEOUT = timedelta(seconds=300)


def _flux_inputs(image=16, text=8):
    """``image`` image tokens (rows of 4 packed 64-channel latents; 16 by default, a 4 x 4
    grid) and ``text`` text tokens."""
    import torch

    g = torch.Generator().manual_seed(0)
    img_ids = torch.zeros(image, 3)
    img_ids[:, 1] = torch.arange(image // 4).repeat_interleave(4)
    img_ids[:, 2] = torch.arange(4).repeat(image // 4)
    return dict(
        hidden_states=torch.randn(1, image, 64, generator=g),
        encoder_hidden_states=torch.randn(1, text, 32, generator=g),
        pooled_projections=torch.randn(1, 32, generator=g),
        timestep=torch.full((1,), 0.5),
        guidance=torch.full((1,), 3.5),
        img_ids=img_ids,
        txt_ids=torch.zeros(text, 3),
        return_dict=False,
    )


def _lse_forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False, return_lse=False, _save_ctx=True,
                    _parallel_config=None):  # fmt: skip
    """The native forward op's attention, (B, S, H, D) in and out, plus its log-sum-exp
    (B, S, H): softmax written out in torch, the one thing the native op lacks for ring."""
    import torch

    q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
    scores = q @ k.transpose(-1, -2) * (scale or q.shape[-1] ** -0.5)
    out = torch.softmax(scores, dim=-1) @ v
    return out.permute(0, 2, 1, 3), torch.logsumexp(scores, dim=-1).permute(0, 2, 1)


def _error(e):
    return [type(e).__name__, str(e)]


def _rank_main(rank, out_path):
    """One rank: every case, results to ``out_path.RANK`` as JSON (rank 0 runs inside pytest:
    every patch is a context manager, and the process group is destroyed at the end)."""
    import time
    import warnings
    from unittest import mock

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    start = time.perf_counter()
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=TIMEOUT)

    import diffusers.models.attention_dispatch as dispatch
    import diffusers.models.transformers.transformer_flux as transformer_flux
    from diffusers import ContextParallelConfig
    from tiny import tiny_flux_transformer

    res = {}
    attention_calls = []
    real_dispatch = transformer_flux.dispatch_attention_fn

    def spy(query, key, value, *a, **kw):
        out = real_dispatch(query, key, value, *a, **kw)
        attention_calls.append((query, key, value, out))
        return out

    def diff(model):
        return (model(**_flux_inputs())[0] - reference).abs().max().item()

    no_accelerator_count = mock.patch("torch.accelerator.device_count", return_value=1)
    real_all_to_all = dispatch.funcol.all_to_all_single

    def counting_all_to_all(calls):
        def all_to_all(x, *a, **kw):
            calls.append(list(x.shape))
            return real_all_to_all(x, *a, **kw)

        return mock.patch.object(dispatch.funcol, "all_to_all_single", all_to_all)

    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mock.patch.object(transformer_flux, "dispatch_attention_fn", spy):
            reference = tiny_flux_transformer()(**_flux_inputs())[0]  # (1, 16, 64)
        res["reference_shape"] = list(reference.shape)

        # 1. as installed: the refusal
        try:
            tiny_flux_transformer().enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))  # fmt: skip
            res["as_installed"] = "ran"
        except Exception as e:
            res["as_installed"] = _error(e)

        with no_accelerator_count:
            # 2. Ulysses, diffusers' own code end to end; the shapes the first block sees
            model = tiny_flux_transformer()
            model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))
            seen = []
            model.transformer_blocks[0].register_forward_pre_hook(
                lambda m, a, kw: seen.append(
                    [list(kw["hidden_states"].shape), list(kw["encoder_hidden_states"].shape)]
                ),
                with_kwargs=True,
            )
            ulysses_calls = []
            with counting_all_to_all(ulysses_calls):
                res["ulysses"] = diff(model)
            res["ulysses_all_to_alls"] = len(ulysses_calls)
            res["block_inputs"] = seen[0]

            # 3. ring on the native backend. The ring issues its K/V all-gather before the
            # native op raises; that gather is never used, so it is waited for here (else torch
            # reports "1 unwaited collective calls" when the process exits)
            real_gather, real_wait = dispatch.funcol.all_gather_tensor, dispatch.funcol.wait_tensor
            issued = []

            def keeping_gather(tensor, *a, **kw):
                issued.append(real_gather(tensor, *a, **kw))
                return issued[-1]

            model = tiny_flux_transformer()
            model.enable_parallelism(config=ContextParallelConfig(ring_degree=2))
            with mock.patch.object(dispatch.funcol, "all_gather_tensor", keeping_gather):
                try:
                    res["ring_native"] = diff(model)
                except Exception as e:
                    res["ring_native"] = _error(e)
            res["ring_native_gathers"] = len(issued)
            for tensor in issued:
                dispatch._wait_tensor(tensor)

            # 4. ring with a forward op that returns the log-sum-exp; count its all-gathers and
            # record the order of gather, block attention and wait (funcol's wait_tensor)
            gathers, events = [], []

            def counting_gather(tensor, *a, **kw):
                out = real_gather(tensor, *a, **kw)
                gathers.append([tensor.numel(), out.numel()])
                events.append("gather")
                return out

            def recording_wait(tensor):
                events.append("wait")
                return real_wait(tensor)

            def recording_op(*a, **kw):
                out = _lse_forward_op(*a, **kw)
                events.append("attention")  # one block's attention, done
                return out

            with mock.patch.object(dispatch, "_native_attention_forward_op", recording_op):
                model = tiny_flux_transformer()
                model.enable_parallelism(config=ContextParallelConfig(ring_degree=2))
                with (
                    mock.patch.object(dispatch.funcol, "all_gather_tensor", counting_gather),
                    mock.patch.object(dispatch.funcol, "wait_tensor", recording_wait),
                ):
                    res["ring_lse"] = diff(model)
            res["ring_gathers"] = gathers
            res["ring_events"] = events

            # 5. heads that the Ulysses degree does not divide (3 heads, 2 ranks); with
            # ulysses_anything, the q each forward op call receives and every all-to-all buffer
            real_op, real_a2a = dispatch._native_attention_forward_op, dispatch.funcol.all_to_all_single  # fmt: skip
            op_q, a2a_in = [], []

            def op_spy(ctx, query, *a, **kw):
                op_q.append(list(query.shape))  # (B, S, heads this rank attends, D)
                return real_op(ctx, query, *a, **kw)

            def a2a_spy(x, *a, **kw):
                a2a_in.append(list(x.shape))  # (R * S_LOCAL, B, head slots per rank, D)
                return real_a2a(x, *a, **kw)

            three = dict(num_attention_heads=3)
            for name, config in (
                ("ulysses_3_heads", ContextParallelConfig(ulysses_degree=2)),
                (
                    "ulysses_anything_3_heads",
                    ContextParallelConfig(ulysses_degree=2, ulysses_anything=True),
                ),
            ):
                want = tiny_flux_transformer(**three)(**_flux_inputs())[0]
                model = tiny_flux_transformer(**three)
                model.enable_parallelism(config=config)
                try:
                    with (
                        mock.patch.object(dispatch, "_native_attention_forward_op", op_spy),
                        mock.patch.object(dispatch.funcol, "all_to_all_single", a2a_spy),
                    ):
                        res[name] = (model(**_flux_inputs())[0] - want).abs().max().item()
                except Exception as e:
                    res[name] = _error(e)
                res[name + "_op_q"], res[name + "_all_to_all"] = op_q[:], a2a_in[:]
                op_q.clear()
                a2a_in.clear()

            # 6. every attention backend the installed diffusers registers, set on the model's
            # processors as `set_attention_backend` sets it (without its kernel-install check,
            # as most kernels are CUDA-only): does `enable_parallelism` take it?
            res["backends"] = {}
            for backend in dispatch._AttentionBackendRegistry.list_backends():
                model = tiny_flux_transformer()
                for module in model.modules():
                    if hasattr(getattr(module, "processor", None), "_attention_backend"):
                        module.processor._attention_backend = backend.value
                try:
                    model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))
                    res["backends"][backend.value] = "accepted"
                except Exception as e:
                    res["backends"][backend.value] = _error(e)

            # 7. Wan under Ulysses: what its first block receives (its text enters by
            # cross-attention), and the output against the one-process model
            from tiny import WAN_TEXT, WAN_TEXT_TOKENS, tiny_wan_transformer

            g = torch.Generator().manual_seed(0)
            wan_inputs = dict(hidden_states=torch.randn(1, 16, 2, 4, 4, generator=g),  # 8 tokens
                              encoder_hidden_states=torch.randn(1, WAN_TEXT_TOKENS, WAN_TEXT, generator=g),
                              timestep=torch.full((1,), 500.0), return_dict=False)  # fmt: skip
            want = tiny_wan_transformer()(**wan_inputs)[0]
            model = tiny_wan_transformer()
            model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))
            seen = []  # the first block's cross-attention: (hidden_states, encoder_hidden_states)
            model.blocks[0].attn2.register_forward_pre_hook(
                lambda m, a, kw: seen.append([list(x.shape) for x in a[:2]]), with_kwargs=True
            )
            res["wan_ulysses"] = (model(**wan_inputs)[0] - want).abs().max().item()
            res["wan_cross_attention_inputs"] = seen[0]

            # 8. a backend without context-parallel support, chosen after enable_parallelism:
            # through the attention_backend() context manager, then through set_attention_backend
            from diffusers.models.attention_dispatch import attention_backend

            # (the math op spied in the registry, as the context manager looks it up per call)
            model = tiny_flux_transformer()
            model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))
            math = dispatch.AttentionBackendName._NATIVE_MATH
            real_math = dispatch._AttentionBackendRegistry._backends[math]
            math_q, math_calls = [], []

            def math_spy(query, key, *a, **kw):
                # (B, tokens, heads, D) of the query and of the key this rank attends to
                math_q.append([list(query.shape), list(key.shape)])
                return real_math(query, key, *a, **kw)

            try:
                with (
                    attention_backend("_native_math"),
                    mock.patch.dict(dispatch._AttentionBackendRegistry._backends, {math: math_spy}),
                    counting_all_to_all(math_calls),
                ):
                    res["ulysses_under_native_math"] = diff(model)
            except Exception as e:
                res["ulysses_under_native_math"] = _error(e)
            res["native_math_all_to_alls"], res["native_math_op_q"] = len(math_calls), math_q[:]
            try:
                model.set_attention_backend("_native_math")
                res["set_native_math_after"] = "accepted"
            except Exception as e:
                res["set_native_math_after"] = _error(e)

            # the same context manager on a model given a backend by set_attention_backend first
            # (which also sets the process-wide active backend: restored, as rank 0 is pytest)
            active = dispatch._AttentionBackendRegistry.get_active_backend()[0]
            try:
                model = tiny_flux_transformer()
                model.set_attention_backend("native")
                model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))
                math_q.clear()
                preset_calls = []
                with (
                    attention_backend("_native_math"),
                    mock.patch.dict(dispatch._AttentionBackendRegistry._backends, {math: math_spy}),
                    counting_all_to_all(preset_calls),
                ):
                    res["preset_under_native_math"] = diff(model)
            finally:
                dispatch._AttentionBackendRegistry.set_active_backend(active)
            res["preset_all_to_alls"], res["preset_math_op_calls"] = len(preset_calls), len(math_q)

        # 9. by hand on the real first attention's q, k, v (B, S, H, D), token shard per rank
        query, key, value, out = attention_calls[0]
        tokens = query.shape[1]
        mine = slice(rank * tokens // WORLD, (rank + 1) * tokens // WORLD)
        q, k, v, want = query[:, mine], key[:, mine], value[:, mine], out[:, mine]
        kv = torch.cat([k, v]).contiguous()
        acc = lse = None
        for step in range(WORLD):
            if step:  # send my block to rank + 1, receive rank - 1's
                incoming = torch.empty_like(kv)
                ops = [dist.P2POp(dist.isend, kv, (rank + 1) % WORLD),
                       dist.P2POp(dist.irecv, incoming, (rank - 1) % WORLD)]  # fmt: skip
                for work in dist.batch_isend_irecv(ops):
                    work.wait()
                kv = incoming
            block_out, block_lse = _lse_forward_op(None, q, kv[:1], kv[1:])
            if acc is None:
                acc, lse = block_out, block_lse
            else:
                new = torch.logaddexp(lse, block_lse)
                acc = acc * (lse - new).exp()[..., None] + block_out * (block_lse - new).exp()[..., None]  # fmt: skip
                lse = new
        res["hand_ring"] = (acc - want.reshape(acc.shape)).abs().max().item()

        def all_to_all(x, scatter, gather):
            parts = [p.contiguous() for p in x.chunk(WORLD, dim=scatter)]
            received = [torch.empty_like(p) for p in parts]
            dist.all_to_all(received, parts)
            return torch.cat(received, dim=gather)

        heads = [all_to_all(x, 2, 1) for x in (q, k, v)]  # (B, S, H/2, D): all tokens, my heads
        res["hand_ulysses_heads_shape"] = list(heads[0].shape)
        local = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in heads))  # fmt: skip
        back = all_to_all(local.transpose(1, 2), 1, 2)  # (B, S/2, H, D)
        res["hand_ulysses"] = (back - want.reshape(back.shape)).abs().max().item()
        sent = torch.arange(2.0) + 10 * rank
        got = torch.empty(2)
        dist.all_to_all_single(got, sent)
        res["all_to_all_single"] = got.tolist()

    res["warnings"] = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    res["seconds"] = time.perf_counter() - start
    res["world_size"] = dist.get_world_size()
    Path(f"{out_path}.{rank}").write_text(json.dumps(res))
    dist.destroy_process_group()


MESH = 4


def _mesh_main(rank, out_path):
    """One of four ranks: ring over 4 ranks, and ring 2 x Ulysses 2 (diffusers' unified
    attention), both with the native op replaced by ``_lse_forward_op``; results as JSON."""
    import time
    import warnings
    from unittest import mock

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    start = time.perf_counter()
    dist.init_process_group("gloo", rank=rank, world_size=MESH, timeout=TIMEOUT)

    import diffusers.models.attention_dispatch as dispatch
    from diffusers import ContextParallelConfig
    from tiny import tiny_flux_transformer

    res, events, unified = {}, [], []
    real_gather, real_wait = dispatch.funcol.all_gather_tensor, dispatch.funcol.wait_tensor
    real_unified = dispatch._templated_unified_attention

    def counting_gather(tensor, *a, **kw):
        out = real_gather(tensor, *a, **kw)
        events.append(["gather", tensor.numel(), out.numel()])  # sent, received (no wait)
        return out

    def recording_wait(tensor):
        events.append(["wait"])
        return real_wait(tensor)

    def recording_op(*a, **kw):
        out = _lse_forward_op(*a, **kw)
        events.append(["attention"])
        return out

    def unified_spy(*a, **kw):
        unified.append("unified")
        return real_unified(*a, **kw)

    with torch.no_grad(), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        reference = tiny_flux_transformer()(**_flux_inputs())[0]
        with (
            mock.patch("torch.accelerator.device_count", return_value=1),
            mock.patch.object(dispatch, "_native_attention_forward_op", recording_op),
            mock.patch.object(dispatch.funcol, "all_gather_tensor", counting_gather),
            mock.patch.object(dispatch.funcol, "wait_tensor", recording_wait),
            mock.patch.object(dispatch, "_templated_unified_attention", unified_spy),
        ):
            model = tiny_flux_transformer()
            model.enable_parallelism(config=ContextParallelConfig(ring_degree=4))
            res["ring4"] = (model(**_flux_inputs())[0] - reference).abs().max().item()
            res["ring4_events"], res["ring4_unified_calls"] = events[:], len(unified)
            events.clear()
            model = tiny_flux_transformer()
            model.enable_parallelism(config=ContextParallelConfig(ring_degree=2, ulysses_degree=2))
            res["unified"] = (model(**_flux_inputs())[0] - reference).abs().max().item()
            res["unified_calls"] = len(unified)
            res["unified_events"] = events[:]
    res["seconds"] = time.perf_counter() - start
    res["world_size"] = dist.get_world_size()
    Path(f"{out_path}.{rank}").write_text(json.dumps(res))
    dist.destroy_process_group()


FIVE = 5

#: the five-rank cases: name, heads, image tokens, text tokens, ContextParallelConfig keywords;
#: a name ending in ``_nccl_gather`` runs with ``dist.all_gather`` replaced (``_nccl_style_all_gather``)
FIVE_CASES = [
    ("ring_16_8", 2, 16, 8, dict(ring_degree=5)),  # 16 and 8 tokens: 5 divides neither
    ("ring_20_10", 2, 20, 10, dict(ring_degree=5)),
    ("ulysses_5_heads_16_8", 5, 16, 8, dict(ulysses_degree=5)),
    ("ulysses_5_heads_20_10", 5, 20, 10, dict(ulysses_degree=5)),
    ("ulysses_24_heads", 24, 20, 10, dict(ulysses_degree=5)),
    ("ulysses_anything_24_heads", 24, 20, 10, dict(ulysses_degree=5, ulysses_anything=True)),
    ("ulysses_anything_8_heads", 8, 20, 10, dict(ulysses_degree=5, ulysses_anything=True)),
    ("ulysses_anything_16_8", 24, 16, 8, dict(ulysses_degree=5, ulysses_anything=True)),
    ("ring_anything_16_8", 2, 16, 8, dict(ring_degree=5, ring_anything=True)),
    ("ulysses_anything_16_8_nccl_gather", 24, 16, 8, dict(ulysses_degree=5, ulysses_anything=True)),
    ("ring_anything_16_8_nccl_gather", 2, 16, 8, dict(ring_degree=5, ring_anything=True)),
]


def _nccl_style_all_gather(real_all_gather, uneven):
    """``torch.distributed.all_gather`` with NCCL's result for output tensors of unequal sizes.

    gloo refuses them (``ProcessGroupGloo::allgather: invalid tensor size``); torch documents
    uneven sizes as supported (``all_gather``'s docstring, ``distributed_c10d.py:4196``) and
    ``ProcessGroupNCCL::allgather`` serves them by falling back to broadcasts when the sizes
    differ. Here: pad every shard to the largest, gather on gloo, trim. Equal sizes go to
    the real collective untouched; each unequal call's output shapes go to ``uneven``."""
    import torch

    def all_gather(outputs, tensor, group=None, async_op=False):
        if all(o.shape == tensor.shape for o in outputs):
            return real_all_gather(outputs, tensor, group=group, async_op=async_op)
        uneven.append([list(o.shape) for o in outputs])
        size = max(o.numel() for o in outputs)
        flat = torch.zeros(size, dtype=tensor.dtype)
        flat[: tensor.numel()] = tensor.reshape(-1)
        padded = [torch.empty(size, dtype=tensor.dtype) for _ in outputs]
        real_all_gather(padded, flat, group=group)
        for o, p in zip(outputs, padded, strict=True):
            o.copy_(p[: o.numel()].reshape(o.shape))

    return all_gather


def _five_main(rank, out_path):
    """One of five ranks (a degree that is not a power of two): each of ``FIVE_CASES`` on a
    tiny Flux transformer against the same model in one process, ring cases with the native
    op replaced by ``_lse_forward_op``; results (max difference or the error) as JSON."""
    import time
    import warnings
    from unittest import mock

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    start = time.perf_counter()
    dist.init_process_group("gloo", rank=rank, world_size=FIVE, timeout=TIMEOUT)

    import diffusers.models.attention_dispatch as dispatch
    from diffusers import ContextParallelConfig
    from tiny import tiny_flux_transformer

    res = {}
    uneven = []
    nccl_style = _nccl_style_all_gather(dist.all_gather, uneven)
    with (
        torch.no_grad(),
        warnings.catch_warnings(record=True),
        mock.patch("torch.accelerator.device_count", return_value=1),
    ):
        warnings.simplefilter("always")
        for name, heads, image, text, config in FIVE_CASES:
            op = _lse_forward_op if "ring_degree" in config else dispatch._native_attention_forward_op  # fmt: skip
            gather = nccl_style if name.endswith("_nccl_gather") else dist.all_gather
            with (
                mock.patch.object(dispatch, "_native_attention_forward_op", op),
                mock.patch.object(dist, "all_gather", gather),
            ):
                uneven.clear()
                want = tiny_flux_transformer(num_attention_heads=heads)(**_flux_inputs(image, text))[0]  # fmt: skip
                model = tiny_flux_transformer(num_attention_heads=heads)
                try:
                    model.enable_parallelism(config=ContextParallelConfig(**config))
                    got = model(**_flux_inputs(image, text))[0]
                    res[name] = (got - want).abs().max().item()
                except Exception as e:
                    res[name] = _error(e)
                res[name + "_uneven_gathers"] = uneven[:]
            dist.barrier()
    res["seconds"] = time.perf_counter() - start
    res["world_size"] = dist.get_world_size()
    Path(f"{out_path}.{rank}").write_text(json.dumps(res))
    dist.destroy_process_group()


#: the process groups one launch of FIVE processes forms in turn: (name, size, what its
#: ranks run); each is a new default group (world_size = size) on its own MASTER_PORT_<NAME>
GROUPS = [("two", WORLD, _rank_main), ("mesh", MESH, _mesh_main), ("five", FIVE, _five_main)]


def _all_main(rank, out_path):
    """One of the FIVE processes: each group of ``GROUPS`` that has this rank, in turn, with
    its results in ``out_path.NAME.RANK``; a rank outside a group waits until that group's
    ranks have written theirs (so that no rendezvous waits longer than it would alone)."""
    import time

    for name, size, main in GROUPS:
        if rank < size:
            os.environ.update(MASTER_PORT=os.environ[f"MASTER_PORT_{name.upper()}"], WORLD_SIZE=str(size))  # fmt: skip
            main(rank, f"{out_path}.{name}")
            continue
        deadline = time.monotonic() + 2 * TIMEOUT.total_seconds()
        while not all(Path(f"{out_path}.{name}.{r}").exists() for r in range(size)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank}: the group {name!r} wrote no results")
            time.sleep(0.2)


if __name__ == "__main__":
    {"_all_main": _all_main, "_rank_main": _rank_main, "_mesh_main": _mesh_main, "_five_main": _five_main}[sys.argv[3]](int(sys.argv[1]), sys.argv[2])  # fmt: skip
    sys.exit(0)


# ---------------------------------------------------------------- the tests

import pytest  # noqa: E402
import torch  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_diffusers")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(out, world, main, **extra_env):
    """Run ``main`` on ``world`` processes: ranks 1.. are processes of this file, rank 0 runs
    ``main`` here (one import of diffusers fewer); torchrun's variables set by hand, plus
    ``extra_env``. Each rank writes its own results; a failed rank's stderr fails the call."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(world), **extra_env}  # fmt: skip
    children = [subprocess.Popen([sys.executable, __file__, str(r), str(out), main.__name__],
                                 env=dict(os.environ, **env, RANK=str(r)), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for r in range(1, world)]  # fmt: skip
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    errors = []
    try:
        main(0, out)
    finally:
        if torch.distributed.is_initialized():  # rank 0 failed mid-way: leave no group behind
            torch.distributed.destroy_process_group()
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        for child in children:
            try:  # the children's collectives time out if rank 0 is gone
                _, err = child.communicate(timeout=2 * TIMEOUT.total_seconds())
            except subprocess.TimeoutExpired:
                child.kill()
                _, err = child.communicate()
            errors += [err[-3000:]] if child.returncode else []
    assert not errors, errors


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """Every group's results, by name, rank by rank: one launch of FIVE processes
    (``_all_main``), which form the groups of ``GROUPS`` in turn."""
    out = tmp_path_factory.mktemp("lab19") / "rank"
    ports = {f"MASTER_PORT_{name.upper()}": str(_free_port()) for name, _, _ in GROUPS}
    _run_ranks(out, FIVE, _all_main, **ports)
    found = {name: [json.loads(Path(f"{out}.{name}.{r}").read_text()) for r in range(size)] for name, size, _ in GROUPS}  # fmt: skip
    for name, size, _ in GROUPS:  # each group had its size: every rank saw that world size
        assert [r["world_size"] for r in found[name]] == [size] * size, name
    return found


@pytest.fixture(scope="module")
def ranks(launch):
    """Both ranks' results of ``_rank_main``, on a gloo group of two processes."""
    return launch["two"]


@pytest.fixture(scope="module")
def mesh_ranks(launch):
    """The four ranks' results of ``_mesh_main``, on a gloo group of four processes."""
    return launch["mesh"]


@pytest.fixture(scope="module")
def five_ranks(launch):
    """The five ranks' results of ``_five_main``, on a gloo group of five processes."""
    return launch["five"]


def test_enable_parallelism_needs_an_initialised_process_group():
    """`enable_parallelism` raises a RuntimeError unless `torch.distributed` is initialised first."""
    from diffusers import ContextParallelConfig
    from tiny import tiny_flux_transformer

    assert not torch.distributed.is_initialized()
    with pytest.raises(RuntimeError, match=r"torch\.distributed must be available and initialized"):
        tiny_flux_transformer().enable_parallelism(config=ContextParallelConfig(ring_degree=2))


def test_enable_parallelism_refuses_a_cpu_only_torch(ranks):
    """On a CPU-only torch, `enable_parallelism` raises ZeroDivisionError ("integer modulo by zero") on both gloo ranks: `torch.accelerator.device_count()` is 0, and with it patched to 1 the same calls run (the tests below)."""
    assert torch.accelerator.device_count() == 0
    for r in ranks:
        assert r["as_installed"] == ["ZeroDivisionError", "integer modulo by zero"]


def test_the_same_refusal_in_one_process():
    """The refusal needs no second process: a one-rank gloo group raises the same ZeroDivisionError, from `ModelMixin._resolve_parallel_config`, which picks the device as `rank % torch.accelerator.device_count()`."""
    from diffusers import ContextParallelConfig
    from tiny import tiny_flux_transformer

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        with pytest.raises(ZeroDivisionError, match="integer modulo by zero") as raised:
            tiny_flux_transformer().enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))  # fmt: skip
        assert raised.traceback[-1].name == "_resolve_parallel_config"
    finally:
        torch.distributed.destroy_process_group()
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def test_ulysses_equals_one_process(ranks):
    """With the accelerator count patched to 1, `enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))` runs diffusers' Ulysses attention over gloo, and each rank's output equals the single-process model's to within 1e-5."""
    for r in ranks:
        assert r["ulysses"] < 1e-5
        assert r["reference_shape"] == [1, 16, 64]


def test_flux_cp_plan_splits_image_and_text_tokens(ranks):
    """FluxTransformer2DModel's `_cp_plan` splits `hidden_states` and `encoder_hidden_states` on the token axis (and the ids with them) and gathers `proj_out`'s output: each rank's blocks see 8 of the 16 image tokens and 4 of the 8 text tokens."""
    from diffusers import FluxTransformer2DModel

    plan = FluxTransformer2DModel._cp_plan
    assert {k: v.split_dim for k, v in plan[""].items()} == {
        "hidden_states": 1, "encoder_hidden_states": 1, "img_ids": 0, "txt_ids": 0}  # fmt: skip
    assert plan["proj_out"].gather_dim == 1
    for r in ranks:
        assert r["block_inputs"] == [[1, 8, 32], [1, 4, 32]]


def test_wan_cp_plan_splits_video_tokens_not_text(ranks):
    """`WanTransformer3DModel`'s `_cp_plan` splits only the video tokens: under `ulysses_degree=2` each rank's first block cross-attends its 4 of the 8 video tokens to all 8 text tokens (`encoder_hidden_states` is not split), and the output equals the single-process model to within 1e-5."""
    for r in ranks:
        assert r["wan_cross_attention_inputs"] == [[1, 4, 24], [1, 8, 24]]  # text projected to 24
        assert r["wan_ulysses"] < 1e-5


def test_ring_stops_at_the_native_backend(ranks):
    """`native`, the default backend, passes `enable_parallelism`'s check, but `ContextParallelConfig(ring_degree=2)` on it raises ValueError "Native attention does not support return_lse=True" at the first attention call: the ring merge needs the log-sum-exp, and the native forward op cannot return it."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    assert _AttentionBackendRegistry.get_active_backend()[0] == AttentionBackendName.NATIVE
    for r in ranks:
        assert r["backends"]["native"] == "accepted"
        assert r["ring_native"] == ["ValueError", "Native attention does not support return_lse=True"]  # fmt: skip


def test_ring_equals_one_process_with_an_lse_op(ranks):
    """With the native forward op replaced by one that also returns the log-sum-exp, diffusers' ring attention (`TemplatedRingAttention`) over gloo equals the single-process model to within 1e-5."""
    for r in ranks:
        assert r["ring_lse"] < 1e-5


def test_ring_all_gathers_kv_once_per_attention(ranks):
    """diffusers 0.42.1's `TemplatedRingAttention` does not rotate K/V blocks: it calls `all_gather_tensor` once per attention layer on its K and V concatenated and receives every rank's block at once (2 layers here: 2 gathers of 768 elements to 1,536, then one of the output at `proj_out`); `rotate_method="alltoall"` raises NotImplementedError, although `ContextParallelConfig`'s docstring says ring "only holds 1/N of KV at a time"."""
    from diffusers import ContextParallelConfig

    doc = " ".join(ContextParallelConfig.__doc__.split())
    assert "overlaps compute with communication" in doc and "only holds 1/N of KV at a time" in doc
    with pytest.raises(NotImplementedError, match="Only rotate_method='allgather'"):
        ContextParallelConfig(ring_degree=2, rotate_method="alltoall")
    for r in ranks:
        # the two attention layers' K/V, then the hook that gathers proj_out's (1, 8, 64) output
        assert r["ring_gathers"] == [[768, 1536], [768, 1536], [512, 1024]]


def test_ring_gather_overlaps_only_the_local_block(mesh_ranks):
    """The ring's all-gather is asynchronous and brings every block at once: on four gloo processes (`ring_degree=4`), each attention layer issues one gather that receives all 4 K/V blocks, the rank's own block's attention completes before the gather is first waited for, and the other 3 blocks' attention comes after that wait, so one block of compute can overlap all of the K/V traffic; the output equals the single-process model to within 1e-5."""
    # per layer: the gather (384 elements sent, 1,536 received); own block; then for each other
    # block a wait (its key and value views) and its attention; last, the gather of proj_out
    other_block = [["wait"], ["wait"], ["attention"]]
    layer = [["gather", 384, 1536], ["attention"], *other_block * 3]
    for r in mesh_ranks:
        assert r["ring4_events"] == layer + layer + [["gather", 256, 1024], ["wait"]]
        assert r["ring4"] < 1e-5


def test_ring_and_ulysses_compose_as_unified_attention(mesh_ranks):
    """With `ContextParallelConfig(ring_degree=2, ulysses_degree=2)` on four gloo processes, diffusers 0.42.1 runs `_templated_unified_attention` in every attention layer (Ulysses all-to-alls around a ring of 2), and the output equals the single-process model to within 1e-5; `ring_degree=4` alone never calls it."""
    for r in mesh_ranks:
        assert r["unified_calls"] == 2 and r["ring4_unified_calls"] == 0  # 2 attention layers
        assert r["unified"] < 1e-5
        # the ring inside is 2 ranks: each layer's gather receives 2 blocks (after Ulysses, a
        # rank's K/V block is its ring pair's 12 tokens of 1 head)
        assert [e for e in r["unified_events"] if e[0] == "gather"][:2] == [["gather", 384, 768]] * 2  # fmt: skip


def test_ulysses_anything_drops_padded_heads_before_attention(ranks):
    """With 3 heads on 2 ranks and `ulysses_anything=True`, diffusers 0.42.1 pads the heads to 4 for the all-to-alls (every buffer carries 2 head slots a rank) but drops the padding before attention: the forward op attends 2 heads on rank 0 and 1 head on rank 1, over all 24 tokens, and the output equals the single-process model to within 1e-5."""
    heads_attended = []
    for r in ranks:
        assert r["ulysses_anything_3_heads"] < 1e-5
        # 2 attention layers x (q, k, v, o): (R * S_LOCAL, B, head slots per rank, D)
        assert r["ulysses_anything_3_heads_all_to_all"] == [[24, 1, 2, 16]] * 8
        shapes = r["ulysses_anything_3_heads_op_q"]
        assert len(shapes) == 2 and len({tuple(x) for x in shapes}) == 1
        heads_attended.append(shapes[0])
    assert heads_attended == [[1, 24, 2, 16], [1, 24, 1, 16]]


#: the backends the pages name as accepted by `enable_parallelism`
CONTEXT_PARALLEL_BACKENDS = {
    "flash", "flash_hub", "flash_varlen_hub", "_flash_3_hub", "_flash_3_varlen_hub", "native",
    "_native_cudnn", "_native_flash", "_native_npu", "sage", "sage_hub",
}  # fmt: skip


def test_enable_parallelism_accepts_only_context_parallel_backends(ranks):
    """Of the 27 attention backends diffusers 0.42.1 registers, `enable_parallelism` accepts the 11 registered with context-parallel support (`flash`, `flash_hub`, `flash_varlen_hub`, `_flash_3_hub`, `_flash_3_varlen_hub`, `native`, `_native_cudnn`, `_native_flash`, `_native_npu`, `sage`, `sage_hub`) and raises ValueError for each of the other 16."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    registered = {b.value for b in _AttentionBackendRegistry.list_backends()}
    flagged = {b.value for b in _AttentionBackendRegistry.list_backends()
               if _AttentionBackendRegistry._is_context_parallel_available(b)}  # fmt: skip
    assert len(registered) == 27 and flagged == CONTEXT_PARALLEL_BACKENDS
    for r in ranks:
        assert set(r["backends"]) == registered  # every backend tried on both ranks
        accepted = {name for name, got in r["backends"].items() if got == "accepted"}
        assert accepted == flagged
        for name in registered - flagged:
            kind, message = r["backends"][name]
            assert kind == "ValueError" and f"'{name}' which does not support context parallelism" in message  # fmt: skip


def test_native_npu_op_cannot_return_the_lse():
    """`_native_npu`, also registered with context-parallel support, has a forward op that raises ValueError for `return_lse=True`, as the native op does: neither can run ring attention."""
    import diffusers.models.attention_dispatch as dispatch

    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="NPU attention backend does not support setting `return_lse=True`"):  # fmt: skip
        dispatch._npu_attention_forward_op(None, q, q, q, return_lse=True)
    with pytest.raises(ValueError, match="Native attention does not support return_lse=True"):
        dispatch._native_attention_forward_op(None, q, q, q, return_lse=True)


def test_the_failed_native_ring_issued_one_gather(ranks):
    """The native-backend ring issues its K/V all-gather before the native op raises at the first attention: one gather, never used."""
    for r in ranks:
        assert r["ring_native_gathers"] == 1


def test_ulysses_needs_heads_divisible_by_the_degree(ranks):
    """Ulysses with 3 heads on 2 ranks fails at the first attention (a reshape to heads/2 per rank); `ulysses_anything=True` runs it and equals the single-process model to within 1e-5."""
    for r in ranks:
        assert r["ulysses_3_heads"][0] == "RuntimeError" and "invalid for input of size" in r["ulysses_3_heads"][1]  # fmt: skip
        assert r["ulysses_anything_3_heads"] < 1e-5


def test_config_validation():
    """`ContextParallelConfig()` with both degrees 1 raises ValueError, and a `ParallelConfig` holding both a context- and a tensor-parallel config raises ValueError."""
    from diffusers import ContextParallelConfig, ParallelConfig
    from diffusers.models._modeling_parallel import TensorParallelConfig

    with pytest.raises(ValueError, match="Either ring_degree or ulysses_degree must be greater than 1"):  # fmt: skip
        ContextParallelConfig()
    with pytest.raises(ValueError, match="Combining context parallelism and tensor parallelism"):
        ParallelConfig(context_parallel_config=ContextParallelConfig(ring_degree=2),
                       tensor_parallel_config=TensorParallelConfig(tp_degree=2))  # fmt: skip


def test_tensor_parallelism_refuses_a_cpu_mesh():
    """Tensor parallelism is not run here: on a CPU-only torch `enable_parallelism(config=TensorParallelConfig(tp_degree=2))` on a tiny FLUX transformer raises the same ZeroDivisionError, and with the accelerator count patched to 1 it builds a CPU device mesh and refuses it with ValueError, naming the device types it takes (cuda, neuron, tpu and xpu); run as rank 0 of torch's two-rank fake process group (one process)."""
    from unittest import mock

    from diffusers.models._modeling_parallel import TensorParallelConfig
    from tiny import tiny_flux_transformer
    from torch.testing._internal.distributed.fake_pg import FakeStore

    config = TensorParallelConfig(tp_degree=2)
    torch.distributed.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        with pytest.raises(ZeroDivisionError, match="integer modulo by zero"):
            tiny_flux_transformer().enable_parallelism(config=config)
        with (
            mock.patch("torch.accelerator.device_count", return_value=1),
            pytest.raises(ValueError, match="not supported on device type 'cpu'") as raised,
        ):
            tiny_flux_transformer().enable_parallelism(config=config)
        assert "['cuda', 'neuron', 'tpu', 'xpu']" in str(raised.value)
    finally:
        torch.distributed.destroy_process_group()


def test_diffusers_cp_warns_through_torch(ranks):
    """diffusers' context-parallel code calls `torch.distributed._functional_collectives.all_gather_tensor`, which torch 2.13 deprecates with a FutureWarning (use `all_gather_single`); it is the only warning the two-process workers raise."""
    for r in ranks:
        # exactly this one: any other warning in the workers (which record rather than raise) fails here
        assert r["warnings"] == [
            "FutureWarning: `torch.distributed._functional_collectives.all_gather_tensor` is deprecated. "
            "Please use `torch.distributed._functional_collectives.all_gather_single` instead."
        ]


def test_the_same_splits_by_hand_on_gloo(ranks):
    """By hand with `torch.distributed` on gloo, on the q, k, v of the tiny model's first attention: a ring that rotates K/V with `batch_isend_irecv` and merges by log-sum-exp, and Ulysses with `all_to_all` (each rank then holds all 24 tokens of 1 head), each equal the real attention's output to within 1e-5; gloo also runs `all_to_all_single`."""
    for rank, r in enumerate(ranks):
        assert r["hand_ring"] < 1e-5 and r["hand_ulysses"] < 1e-5
        assert r["hand_ulysses_heads_shape"] == [1, 24, 1, 16]
        assert r["all_to_all_single"] == [rank, 10 + rank]


def test_token_counts_must_divide_by_the_ranks(five_ranks):
    """By default (`EquipartitionSharder`) each input the model's `_cp_plan` splits must divide by the number of ranks, for ring as for Ulysses: on five gloo processes `ring_degree=5`, and `ulysses_degree=5` with 5 heads, raise AssertionError ("divisible by mesh size") on 16 image and 8 text tokens, while both equal the single-process model on 20 and 10 (ring with 2 heads: it has no head limit)."""
    for r in five_ranks:
        for name in ("ring_16_8", "ulysses_5_heads_16_8"):
            assert r[name] == ["AssertionError", "Tensor size along dimension to be sharded must be divisible by mesh size"]  # fmt: skip
        assert r["ring_20_10"] < 1e-5 and r["ulysses_5_heads_20_10"] < 1e-5


def test_ulysses_anything_runs_24_heads_on_five_ranks(five_ranks):
    """On five gloo processes, FLUX.1-dev's 24 heads fail plain `ulysses_degree=5` (a reshape to 24/5 heads) and run with `ulysses_anything=True` (padded to 25, 5 a rank), equal to the single-process model to within 1e-5; 8 heads do not run (padded to 10: 2 padded heads are not fewer than the 2 a rank, AssertionError)."""
    for r in five_ranks:
        kind, message = r["ulysses_24_heads"]
        assert kind == "RuntimeError" and "invalid for input of size" in message
        assert r["ulysses_anything_24_heads"] < 1e-5
        assert r["ulysses_anything_8_heads"] == ["AssertionError", "Padding head num 2 should be less than new local head num 2"]  # fmt: skip


def test_anything_modes_cut_uneven_tokens_that_gloo_cannot_gather(five_ranks):
    """`ulysses_anything=True` and `ring_anything=True` cut token counts the ranks do not divide (16 and 8 tokens on 5 ranks) into unequal shares (`PartitionAnythingSharder`), and gloo cannot all-gather the unequal output shards (`ProcessGroupGloo::allgather: invalid tensor size`)."""
    for r in five_ranks:
        for name in ("ulysses_anything_16_8", "ring_anything_16_8"):
            kind, message = r[name]
            assert kind == "RuntimeError" and "ProcessGroupGloo::allgather: invalid tensor size" in message  # fmt: skip
            assert r[name + "_uneven_gathers"] == []  # gloo's own all_gather ran, and refused


def test_anything_modes_run_uneven_tokens_with_an_nccl_style_gather(five_ranks):
    """With an NCCL-style all-gather substituted for gloo's (unequal shards padded, gathered, trimmed: what `ProcessGroupNCCL::allgather` serves by broadcasts), `ulysses_anything=True` with FLUX.1-dev's 24 heads and `ring_anything=True` run 16 image and 8 text tokens on five gloo processes and equal the single-process model to within 1e-5; the only unequal gather is of `proj_out`'s output (4 image tokens on rank 0, 3 on the others)."""
    for r in five_ranks:
        for name in ("ulysses_anything_16_8_nccl_gather", "ring_anything_16_8_nccl_gather"):
            assert r[name] < 1e-5
            assert r[name + "_uneven_gathers"] == [[[1, 4, 64]] + [[1, 3, 64]] * 4]


def test_the_attention_backend_context_manager_skips_the_check(ranks):
    """The context-parallel backend check runs in `enable_parallelism` and in the model's `set_attention_backend` once parallelism is enabled, not in the `attention_backend()` context manager: on two gloo processes a Ulysses model run under `attention_backend("_native_math")` raises nothing, runs no all-to-all (8 under the default backend: Q, K, V and the output in each of 2 layers) and attends each rank's own 12 of the 24 tokens (query and key), both heads, so it differs from the single-process model by more than 0.01, while `set_attention_backend("_native_math")` on the same model raises ValueError; on a model without parallelism `set_attention_backend("_native_math")` is accepted. A model given a backend by `set_attention_backend` (here `native`) before `enable_parallelism` ignores the context manager: 8 all-to-alls, the math op never called, the output equal to the single-process model's to within 1e-5."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry
    from tiny import tiny_flux_transformer

    active = _AttentionBackendRegistry.get_active_backend()[0]
    try:  # no parallel config yet: no check (it also sets the process-wide active backend)
        tiny_flux_transformer().set_attention_backend("_native_math")
    finally:
        _AttentionBackendRegistry.set_active_backend(active)
    for r in ranks:
        assert isinstance(r["ulysses_under_native_math"], float)
        assert r["ulysses_all_to_alls"] == 8 and r["native_math_all_to_alls"] == 0
        # query and key: 8 image + 4 text tokens, both heads, in each of 2 layers
        assert r["native_math_op_q"] == [[[1, 12, 2, 16], [1, 12, 2, 16]]] * 2
        assert r["ulysses_under_native_math"] > 0.01
        kind, message = r["set_native_math_after"]
        assert kind == "ValueError" and "'_native_math' does not support context" in message
        # a backend set on the model's processors wins over the context manager's
        assert r["preset_all_to_alls"] == 8 and r["preset_math_op_calls"] == 0
        assert r["preset_under_native_math"] < 1e-5


def test_cudnn_and_flash_ops_return_the_lse():
    """`_native_cudnn`'s and `_native_flash`'s forward ops (`_cudnn_attention_forward_op`, `_native_flash_attention_forward_op`) return the output and its (B, S, H) float32 log-sum-exp when asked with `return_lse=True`, as ring attention asks; run here on the meta device (shapes only), as their aten kernels need CUDA."""
    import diffusers.models.attention_dispatch as dispatch

    q = torch.empty(1, 8, 2, 16, device="meta", dtype=torch.bfloat16)  # (B, S, H, D)
    for op in (dispatch._cudnn_attention_forward_op, dispatch._native_flash_attention_forward_op):
        out, lse = op(None, q, q, q, return_lse=True, _save_ctx=False)
        assert tuple(out.shape) == (1, 8, 2, 16) and tuple(lse.shape) == (1, 8, 2)
        assert lse.dtype == torch.float32
