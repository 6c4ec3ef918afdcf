"""Lab 08 (LoRA injection) against the installed diffusers and peft.

Each test adds real peft LoRA adapters (``LoraConfig`` + ``UNet2DConditionModel.add_adapter``)
to the tiny random-config UNet of ``tiny`` and compares what the adapted layers return with
the starter's NumPy functions (taken from the executed starter, so the test checks the code
the page shows). The real-size parameter counts build SD 1.5's and SDXL's UNet from their
published configs (``model_configs``) on the meta device: shapes only, no memory.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny import count_dispatched_ops, run_starter

LAB08 = "code/lab-08-lora-injection-reading/lora_injection.py"
TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
LAYER = "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k"  # a cross-attention to_k


@pytest.fixture(scope="module")
def lab():
    """The starter's globals after a default run (its functions and lora_counts)."""
    return run_starter(LAB08)


def lora_config(r, alpha, init=True):
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, target_modules=TARGETS, init_lora_weights=init)


def add_adapter(unet, config, name, first):
    """``unet.add_adapter``; peft warns (a UserWarning) on purpose for every adapter after
    the first: several named adapters on one model is what these tests exercise."""
    if first:
        unet.add_adapter(config, adapter_name=name)
        return
    with pytest.warns(UserWarning, match="Already found a `peft_config` attribute"):
        unet.add_adapter(config, adapter_name=name)


def adapted_unet(*adapters):
    """The tiny UNet with one adapter per (name, r, alpha); every lora_B set to random."""
    from tiny import tiny_unet

    unet = tiny_unet()
    g = torch.Generator().manual_seed(1)
    for i, (name, r, alpha) in enumerate(adapters):
        add_adapter(unet, lora_config(r, alpha), name, first=i == 0)
        with torch.no_grad():
            for pname, p in unet.named_parameters():
                if f"lora_B.{name}." in pname:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return unet


def predict(unet, **kwargs):
    from tiny import embeds, start_latents

    with torch.no_grad():
        return unet(start_latents(), 500, encoder_hidden_states=embeds(1), **kwargs).sample


def np_weights(layer, name):
    """(W, bias, A, B) of a peft lora.Linear as float64 NumPy arrays."""

    def f(t):
        return None if t is None else t.detach().double().numpy()

    return (f(layer.base_layer.weight), f(layer.base_layer.bias),
            f(layer.lora_A[name].weight), f(layer.lora_B[name].weight))  # fmt: skip


def capture(layer, fn):
    """Run fn(); return (input, output) of ``layer``'s first call, as float64 NumPy."""
    seen = []
    handle = layer.register_forward_hook(lambda m, a, o: seen.append((a[0], o)))
    try:
        fn()
    finally:
        handle.remove()
    x, y = seen[0]
    return x.double().numpy(), y.double().numpy()


def test_fresh_adapter_returns_base_output(lab):
    """A LoRA added with `init_lora_weights=True` has `lora_B` all zero, so the UNet's output equals the base output exactly."""
    from tiny import tiny_unet

    unet = tiny_unet()
    base = predict(unet)
    unet.add_adapter(lora_config(4, 8))
    lora_b = [p for n, p in unet.named_parameters() if "lora_B" in n]
    assert lora_b and all(torch.count_nonzero(p) == 0 for p in lora_b)
    assert torch.equal(predict(unet), base)


def test_lora_linear_is_base_plus_scaled_low_rank_branch(lab):
    """An adapted `to_k` returns `x W^T + (lora_alpha / r) * (x A^T) B^T`, peft's `scaling` is `lora_alpha / r`, and the lab's `lora_linear` gives the same numbers."""
    unet = adapted_unet(("a", 4, 8))
    layer = unet.get_submodule(LAYER)
    assert layer.scaling["a"] == 8 / 4
    x, y = capture(layer, lambda: predict(unet))
    w, b, a, bb = np_weights(layer, "a")
    np.testing.assert_allclose(y, lab["lora_linear"](x, w, b, a, bb, 8, 4), atol=1e-5)


def test_set_adapters_adds_weighted_deltas(lab):
    """`set_adapters(["a", "b"], weights=[w1, w2])` makes every adapted layer return the base output plus `w1` times adapter a's branch plus `w2` times adapter b's, each with its own `lora_alpha / r`."""
    unet = adapted_unet(("a", 4, 8), ("b", 8, 16))
    unet.set_adapters(["a", "b"], weights=[0.7, 0.3])
    layer = unet.get_submodule(LAYER)
    assert layer.scaling == {"a": 0.7 * 8 / 4, "b": 0.3 * 16 / 8}
    x, y = capture(layer, lambda: predict(unet))
    w, bias, a1, b1 = np_weights(layer, "a")
    _, _, a2, b2 = np_weights(layer, "b")
    expected = lab["stacked_linear"](x, w, [(a1, b1, 8, 4), (a2, b2, 16, 8)], [0.7, 0.3])
    assert bias is None  # to_k has no bias (Attention's default bias=False)
    np.testing.assert_allclose(y, expected, atol=1e-5)


def test_cross_attention_kwargs_scale_multiplies_scaling_for_one_call(lab):
    """`cross_attention_kwargs={"scale": s}` multiplies every LoRA layer's `scaling` by `s` for that forward only (`apply_lora_scale` calls `scale_lora_layers`, then `unscale_lora_layers` in a `finally`), so the branch is `s * lora_alpha / r` times `B A x`; `s = 0` gives the base output."""
    from tiny import tiny_unet

    base = predict(tiny_unet())
    unet = adapted_unet(("a", 4, 8))
    layer = unet.get_submodule(LAYER)
    w, b, a, bb = np_weights(layer, "a")
    for s in (0.5, 1.5):
        x, y = capture(layer, lambda s=s: predict(unet, cross_attention_kwargs={"scale": s}))
        np.testing.assert_allclose(y, lab["lora_linear"](x, w, b, a, bb, 8, 4, scale=s), atol=1e-5)
        assert layer.scaling["a"] == 8 / 4  # restored after the call
    kwargs = {"scale": 0.0}
    torch.testing.assert_close(
        predict(unet, cross_attention_kwargs=kwargs), base, atol=1e-6, rtol=0
    )
    assert kwargs == {"scale": 0.0} and layer.scaling["a"] == 8 / 4  # the caller's dict is copied


def test_fuse_lora_matches_unfused_and_unfuse_restores_weights(lab):
    """`fuse_lora()` adds `(lora_alpha / r) * B A` into each `base_layer.weight` (the lab's `fused_weight`) and gives the unfused output within 1e-5; after fusing, `cross_attention_kwargs={"scale": 0}` no longer removes the LoRA; `unfuse_lora()` restores the base weights within 1e-6."""
    unet = adapted_unet(("a", 4, 8))
    layer = unet.get_submodule(LAYER)
    w, _, a, bb = np_weights(layer, "a")
    base_weights = {n: p.detach().clone() for n, p in unet.named_parameters() if "base_layer" in n}
    unfused = predict(unet)
    unet.fuse_lora()
    np.testing.assert_allclose(layer.base_layer.weight.double().detach().numpy(),
                               lab["fused_weight"](w, a, bb, 8, 4), atol=1e-6)  # fmt: skip
    torch.testing.assert_close(predict(unet), unfused, atol=1e-5, rtol=0)
    fused_scale0 = predict(unet, cross_attention_kwargs={"scale": 0.0})
    torch.testing.assert_close(fused_scale0, unfused, atol=1e-5, rtol=0)  # the delta stays
    unet.unfuse_lora()
    base = predict(unet, cross_attention_kwargs={"scale": 0.0})  # unfused again: scale 0 = base
    assert (fused_scale0 - base).abs().max() > 1e-3
    for n, p in unet.named_parameters():
        if "base_layer" in n:
            torch.testing.assert_close(p.detach(), base_weights[n], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family, config_name", [("sd15", "SD15_UNET"), ("sdxl", "SDXL_UNET")])
def test_lora_parameter_counts_on_real_configs(lab, family, config_name):
    """A peft `LoraConfig(r, target_modules=["to_q", "to_k", "to_v", "to_out.0"])` added with `add_adapter` to the real SD 1.5 or SDXL UNet (built on the meta device) has exactly the LoRA parameter count the lab prints at ranks 4 and 128 (the lab's other ranks are the same count scaled by r), and its `to_q`, `to_k`, `to_v`, `to_out.0` layers have the `(in_features, out_features)` shapes the lab's `attention_projections` derives from the config; every config key of the starter's `CONFIGS` entry (all but its `name`), the block types included, equals the published config's."""
    import model_configs
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel(**getattr(model_configs, config_name))
    starter = lab["CONFIGS"][family]
    real = getattr(model_configs, config_name)
    keys = set(starter) - {"name"}  # every config key the starter holds
    assert {"down_block_types", "up_block_types", "block_out_channels"} < keys
    for key in sorted(keys):
        a, b = starter[key], real[key]
        assert (list(a) if isinstance(a, tuple) else a) == b, key
    shapes = sorted(
        (m.in_features, m.out_features)
        for n, m in unet.named_modules()
        if n.endswith(tuple(f".{t}" for t in TARGETS)) and isinstance(m, torch.nn.Linear)
    )
    assert shapes == sorted((i, o) for _, i, o in lab["attention_projections"](starter))
    for r in (4, 128):
        add_adapter(unet, lora_config(r, r), f"r{r}", first=r == 4)
        n = sum(p.numel() for name, p in unet.named_parameters() if f".r{r}." in name)
        assert n == lab["lora_counts"][(family, r)]
    for r in lab["args"].rank:  # the others are linear in r: r * (d_in + d_out) per layer
        assert lab["lora_counts"][(family, r)] == lab["lora_counts"][(family, 4)] * r // 4


def test_scale_zero_call_resets_set_adapters_weight(lab):
    """In diffusers 0.42.1 a call with `cross_attention_kwargs={"scale": 0}` resets every active adapter's weight from `set_adapters` to 1: `unscale_lora_layers(unet, 0)` calls peft's `set_scale(name, 1.0)` for each active adapter, so its `scaling` becomes `lora_alpha / r` again; an inactive adapter keeps its weight."""
    unet = adapted_unet(("a", 4, 8))
    unet.set_adapters(["a"], weights=[0.5])
    layer = unet.get_submodule(LAYER)
    assert layer.scaling["a"] == 0.5 * 8 / 4
    predict(unet, cross_attention_kwargs={"scale": 0.5})
    assert layer.scaling["a"] == 0.5 * 8 / 4  # a nonzero scale is divided out again
    predict(unet, cross_attention_kwargs={"scale": 0.0})
    assert layer.scaling["a"] == 8 / 4  # the 0.5 from set_adapters is gone
    two = adapted_unet(("a", 4, 8), ("b", 4, 8))
    two.set_adapters(["a", "b"], weights=[0.5, 0.5])
    two.set_adapters(["a"], weights=[0.5])  # b loaded but inactive, at weight 0.5
    predict(two, cross_attention_kwargs={"scale": 0.0})
    assert two.get_submodule(LAYER).scaling == {"a": 8 / 4, "b": 0.5 * 8 / 4}


def test_pipeline_passes_scale_to_encode_prompt_as_lora_scale(lab, tmp_path):
    """`StableDiffusionPipeline.__call__` passes `cross_attention_kwargs["scale"]` to `encode_prompt` as `lora_scale`, which multiplies a text encoder LoRA's `scaling` by it during the text encoder's forward and divides it back afterwards."""
    from peft import LoraConfig
    from tiny import tiny_sd_pipeline, tiny_text_encoder, tiny_tokenizer

    pipe = tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer(tmp_path))
    pipe.text_encoder.add_adapter(
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "out_proj"])
    )
    layer = next(m for n, m in pipe.text_encoder.named_modules()
                 if n.endswith("layers.0.self_attn.k_proj"))  # fmt: skip
    seen = []
    handle = layer.register_forward_pre_hook(lambda m, a: seen.append(dict(m.scaling)))
    calls = []
    encode_prompt = pipe.encode_prompt

    def recording(*args, **kwargs):
        calls.append(kwargs.get("lora_scale"))
        return encode_prompt(*args, **kwargs)

    pipe.encode_prompt = recording
    try:
        pipe("abc", num_inference_steps=1, output_type="latent", guidance_scale=1.0,
             cross_attention_kwargs={"scale": 0.5})  # fmt: skip
    finally:
        handle.remove()
    assert calls == [0.5]
    assert seen == [{"default": 0.5 * 8 / 4}]  # scaled during the text encoder's forward
    assert layer.scaling == {"default": 8 / 4}  # and restored after


def test_pipeline_set_adapters_sets_unet_scaling(lab):
    """The pipeline's `set_adapters(["a", "b"], adapter_weights=[w1, w2])` sets `scaling` to `w1 * lora_alpha / r` for adapter a and `w2 * lora_alpha / r` for adapter b in every adapted UNet layer, and both stay active."""
    from tiny import tiny_sd_pipeline

    unet = adapted_unet(("a", 4, 8), ("b", 8, 16))
    pipe = tiny_sd_pipeline(unet=unet)
    pipe.set_adapters(["a", "b"], adapter_weights=[0.7, 0.3])
    layers = [
        m for n, m in unet.named_modules() if n.endswith(tuple(TARGETS)) and hasattr(m, "scaling")
    ]
    assert len(layers) == 32  # 4 transformer blocks (down, mid, 2 up) x 8 projections
    for layer in layers:
        assert layer.scaling == {"a": 0.7 * 8 / 4, "b": 0.3 * 16 / 8}
        assert sorted(layer.active_adapters) == ["a", "b"]


def test_scale_multiplies_the_set_adapters_weight(lab):
    """With `set_adapters(["a"], weights=[w])`, a call with `cross_attention_kwargs={"scale": s}` runs the branch at `s * w * lora_alpha / r`: the scale multiplies the adapter weight, it does not replace it."""
    unet = adapted_unet(("a", 4, 8))
    unet.set_adapters(["a"], weights=[0.5])
    layer = unet.get_submodule(LAYER)
    w, b, a, bb = np_weights(layer, "a")
    x, y = capture(layer, lambda: predict(unet, cross_attention_kwargs={"scale": 0.4}))
    np.testing.assert_allclose(
        y, lab["lora_linear"](x, w, b, a, bb, 8, 4, scale=0.4 * 0.5), atol=1e-5
    )


def test_bf16_fuse_unfuse_cycles_drift_the_base_weights(lab):
    """In bf16, `fuse_lora()` / `unfuse_lora()` cycles do not give the base weights back: peft adds and subtracts the delta in place in bf16, and over 30 cycles at `set_adapters` weights 1.0, 0.5, 0.8 in turn the weights after every cycle are exactly what the starter's `fuse_unfuse_cycle` (`round_to(x, "bf16")`) predicts, bit for bit, on the CPU (where peft computes `B @ A` in float32 before rounding)."""
    unet = adapted_unet(("a", 4, 4)).to(torch.bfloat16)
    layer = unet.get_submodule(LAYER)
    start = layer.base_layer.weight.detach().clone()
    expected = start.float().numpy().astype(np.float64)
    for i in range(30):
        unet.set_adapters(["a"], weights=[(1.0, 0.5, 0.8)[i % 3]])
        delta = layer.get_delta_weight("a").detach().float().numpy().astype(np.float64)
        unet.fuse_lora()
        unet.unfuse_lora()
        expected = lab["fuse_unfuse_cycle"](expected, delta)
        got = layer.base_layer.weight.detach()
        assert got.dtype == torch.bfloat16
        np.testing.assert_array_equal(got.float().numpy().astype(np.float64), expected)
    assert (got.float() - start.float()).abs().max() > 1e-3


def test_unfused_lora_adds_four_ops_per_adapted_layer(lab):
    """Unfused, peft's `lora.Linear` adds four ops to every UNet call per adapted layer, the `lora_A` and `lora_B` matmuls, the multiply by `scaling` and the add (the starter's `EXTRA_OPS`), so 512 on SD 1.5's 128 attention projections; fused, the UNet dispatches exactly the base model's ops, yet still holds every `lora_A` and `lora_B`, `r * (in_features + out_features)` parameters per layer."""
    from collections import Counter

    import model_configs
    from diffusers import UNet2DConditionModel
    from peft.tuners.lora import Linear as LoraLinear
    from tiny import tiny_unet

    def ops(unet):
        return count_dispatched_ops(lambda: predict(unet))

    base = ops(tiny_unet())
    unet = adapted_unet(("a", 4, 8))
    n = sum(isinstance(m, LoraLinear) for m in unet.modules())
    extra = ops(unet) - base
    views = {"t": 2 * n, "view": 2 * n, "_unsafe_view": 2 * n}  # no kernel
    assert extra == Counter(mm=2 * n, mul=n, add=n, **views)
    assert sum(extra.values()) - sum(views.values()) == lab["EXTRA_OPS"] * n
    unet.fuse_lora()
    assert ops(unet) == base
    layers = [m for m in unet.modules() if isinstance(m, LoraLinear)]
    assert len(layers) == n and all(  # merged, yet lora_A and lora_B stay, at rank 4
        m.merged and sum(p.numel() for p in [*m.lora_A.parameters(), *m.lora_B.parameters()])
        == 4 * (m.in_features + m.out_features) for m in layers
    )  # fmt: skip
    with torch.device("meta"):
        sd15 = UNet2DConditionModel(**model_configs.SD15_UNET)
    sd15.add_adapter(lora_config(4, 4))
    adapted = sum(isinstance(m, LoraLinear) for m in sd15.modules())
    assert adapted == lab["n_adapted"]["sd15"] == 128
    assert lab["EXTRA_OPS"] * adapted == 512


def test_demo_layer_follows_the_family(lab):
    """With `--family sdxl` the starter's demo layer is SDXL's first cross-attention `to_k` (`attn2` of `down_blocks.1`, 2048 -> 640), which is the shape of that layer in SDXL's real UNet."""
    import model_configs
    from diffusers import UNet2DConditionModel

    g = run_starter(LAB08, "--family", "sdxl")
    with torch.device("meta"):
        unet = UNet2DConditionModel(**model_configs.SDXL_UNET)
    first = next(m for n, m in unet.named_modules() if n.endswith("attn2.to_k"))
    assert (g["d_in"], g["d_out"]) == (first.in_features, first.out_features) == (2048, 640)
    assert g["weight"].shape == (640, 2048)


def test_scale_zero_call_while_fused_breaks_unfuse_only_off_weight_one(lab):
    """A call with `cross_attention_kwargs={"scale": 0}` while fused spoils the unfuse only when the fused `scaling` was not `lora_alpha / r`: after the pipeline's `fuse_lora()` at weight 1, `unfuse_lora()` still restores the base weights; after `set_adapters(..., adapter_weights=0.5)` or `fuse_lora(lora_scale=0.5)` it does not."""
    from peft.tuners.lora import Linear as LoraLinear
    from tiny import tiny_sd_pipeline

    restored = {}
    for weight, lora_scale in [(1.0, 1.0), (0.5, 1.0), (1.0, 0.5)]:
        pipe = tiny_sd_pipeline(unet=adapted_unet(("a", 4, 8)))
        layers = [m for m in pipe.unet.modules() if isinstance(m, LoraLinear)]
        before = [m.base_layer.weight.detach().clone() for m in layers]
        pipe.set_adapters("a", adapter_weights=weight)
        pipe.fuse_lora(components=["unet"], lora_scale=lora_scale)
        predict(pipe.unet, cross_attention_kwargs={"scale": 0.0})
        pipe.unfuse_lora(components=["unet"])
        restored[(weight, lora_scale)] = all(
            torch.allclose(m.base_layer.weight, w, atol=1e-6)
            for m, w in zip(layers, before, strict=True)
        )
    assert restored == {(1.0, 1.0): True, (0.5, 1.0): False, (1.0, 0.5): False}


def test_load_lora_weights_wraps_whatever_the_keys_name(lab):
    """`load_lora_weights` wraps the layers the file's keys name, not a fixed list: a LoRA with keys for the attention projections and for each feed-forward output (`ff.net.2`) gets those too, 36 layers on the tiny UNet instead of the 32 projections."""
    from peft.tuners.lora import Linear as LoraLinear
    from tiny import tiny_sd_pipeline, tiny_unet

    plain = tiny_unet()
    g = torch.Generator().manual_seed(0)
    state = {}
    for name, module in plain.named_modules():
        if name.endswith((*TARGETS, "ff.net.2")) and isinstance(module, torch.nn.Linear):
            state[f"unet.{name}.lora_A.weight"] = torch.randn(4, module.in_features, generator=g)
            state[f"unet.{name}.lora_B.weight"] = torch.randn(module.out_features, 4, generator=g)
    pipe = tiny_sd_pipeline()
    pipe.load_lora_weights(state, adapter_name="style")
    wrapped = {n for n, m in pipe.unet.named_modules() if isinstance(m, LoraLinear)}
    assert {n.removeprefix("unet.").removesuffix(".lora_A.weight") for n in state
            if n.endswith("lora_A.weight")} == wrapped  # fmt: skip
    assert len(wrapped) == 36 and sum(n.endswith("ff.net.2") for n in wrapped) == 4
