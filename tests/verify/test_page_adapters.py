"""LoRA, ControlNet and IP-Adapter (docs/handbook/adapters.md) against the installed diffusers.

Everything runs the real classes on tiny random-config parts built in code (``tiny``):
LoRA adapters loaded into a ``StableDiffusionPipeline`` from an in-memory state dict in
PEFT's key layout (peft is the backend), ``ControlNetModel.from_unet`` on the tiny UNet,
``MultiControlNetModel`` inside ``StableDiffusionControlNetPipeline``, an IP-Adapter
loaded by ``load_ip_adapter`` from a random state dict (no image-encoder download: a tiny
``CLIPVisionModelWithProjection`` is passed in), ``IPAdapterAttnProcessor2_0`` on a tiny
``Attention``, and a tiny ``T2IAdapter``. The real-size counts (SD 1.5 and SDXL) build the
UNet from its published config on the meta device (``model_configs``): shapes only.

The loop-level facts (where the residuals and image embeddings enter each UNet call, how
``cross_attention_kwargs["scale"]`` is popped) are tested in ``test_page_loop.py``; this
module tests what the adapters themselves do.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from diffusers import (
    ControlNetModel,
    DDIMScheduler,
    StableDiffusionAdapterPipeline,
    T2IAdapter,
    UNet2DConditionModel,
)
from diffusers.models.attention_processor import (
    Attention,
    AttnProcessor2_0,
    IPAdapterAttnProcessor2_0,
)
from diffusers.models.controlnets.multicontrolnet import MultiControlNetModel
from model_configs import SD15_UNET, SDXL_UNET
from peft import LoraConfig
from peft.tuners.lora import Linear as LoraLinear
from tiny import (
    EMBED_DIM,
    HEIGHT,
    SD_BETAS,
    WIDTH,
    count_dispatched_ops,
    embeds,
    random_ip_adapter,
    start_latents,
    tiny_controlnet,
    tiny_controlnet_pipeline,
    tiny_image_encoder,
    tiny_sd_pipeline,
    tiny_unet,
    tiny_vae,
)
from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

PROMPT, NEGATIVE = embeds(1), embeds(2)  # (1, 77, EMBED_DIM) stand-in prompt_embeds
X, T = start_latents(), torch.tensor(500)  # (1, 4, 8, 8) latents, one timestep
PROJECTIONS = ("to_q", "to_k", "to_v", "to_out.0")  # the usual LoRA targets in a UNet
CONTROL_IMAGE = torch.rand(1, 3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(3))


# ---------------------------------------------------------------- helpers (this page only)


def predict(unet, **kwargs):
    """One UNet forward on the fixed latents, timestep and prompt: ``noise_pred``."""
    with torch.no_grad():
        return unet(X, T, encoder_hidden_states=PROMPT, **kwargs).sample


def lora_state_dict(unet, rank=2, seed=0, std=0.3, suffixes=PROJECTIONS):
    """A LoRA for ``unet``'s Linear layers named by ``suffixes`` (the attention projections
    unless told) in PEFT's key layout, random values.

    ``unet.<module>.lora_A.weight`` is ``(rank, in_features)`` and ``lora_B.weight`` is
    ``(out_features, rank)``; both random here (a trained LoRA), so it changes the output.
    """
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, module in unet.named_modules():
        if name.endswith(suffixes) and isinstance(module, torch.nn.Linear):
            a = torch.randn(rank, module.in_features, generator=g) * std
            b = torch.randn(module.out_features, rank, generator=g) * std
            state[f"unet.{name}.lora_A.weight"] = a
            state[f"unet.{name}.lora_B.weight"] = b
    return state


def lora_pipe(*names, rank=2):
    """The tiny pipeline with one random LoRA per name loaded by ``load_lora_weights``."""
    pipe, plain = tiny_sd_pipeline(), tiny_unet()  # keys come from the unwrapped layers
    for seed, name in enumerate(names):
        if seed == 0:
            pipe.load_lora_weights(lora_state_dict(plain, rank, seed), adapter_name=name)
            continue
        # peft warns (a UserWarning, not a deprecation) on purpose when a second adapter
        # joins the model: several named adapters is exactly what these tests exercise
        with pytest.warns(UserWarning, match="Already found a `peft_config` attribute"):
            pipe.load_lora_weights(lora_state_dict(plain, rank, seed), adapter_name=name)
    return pipe


def dispatched_ops(unet):
    """The aten ops of one UNet forward on the fixed inputs, counted by name."""
    return count_dispatched_ops(lambda: predict(unet))


def first_projection(unet):
    return unet.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_q


def run(pipe, steps=2, **kwargs):
    """One CFG call of a tiny pipeline on the stand-in embeddings; returns final latents."""
    return pipe(
        prompt_embeds=PROMPT,
        negative_prompt_embeds=NEGATIVE,
        guidance_scale=7.5,
        num_inference_steps=steps,
        height=HEIGHT,
        width=WIDTH,
        latents=start_latents(),
        output_type="latent",
        **kwargs,
    ).images


def meta_unet(config):
    """The real UNet class built from a published config on the meta device: no memory."""
    with torch.device("meta"):
        return UNet2DConditionModel(**config)


def as_tuple(value):
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def unscoped_paragraphs(*triggers, names=("StableDiffusionPipeline",)):
    """Paragraphs (one line each) of this page and of the interview page that contain every
    word of one of ``triggers`` (tuples of words) but not every one of ``names``: by default
    ``StableDiffusionPipeline``, the pipeline the IP-Adapter tests run. Others differ in
    diffusers 0.42.1: ``FluxPipeline.__call__`` also encodes a black image for a plain adapter
    (pipeline_flux.py), ``FluxIPAdapterAttnProcessor`` has no scale-0 skip, and
    ``StableDiffusionXLPipeline`` passes ``added_cond_kwargs`` as a dict, so a call without
    image embeddings raises the UNet's ``ValueError``, not a ``TypeError``."""
    from infralens_docs.registry import ROOT

    found = []
    for page in ("adapters.md", "interview.md"):
        text = (ROOT / "docs" / "handbook" / page).read_text(encoding="utf-8")
        for paragraph in text.splitlines():
            if any(all(w in paragraph for w in words) for words in triggers):
                if not all(name in paragraph for name in names):
                    found.append(paragraph.strip()[:80])
    return found


# ---------------------------------------------------------------- LoRA


def test_lora_wraps_each_targeted_linear():
    """`load_lora_weights` replaces each targeted `nn.Linear` of the UNet with a PEFT `lora.Linear` that keeps the original layer as `base_layer` and adds `lora_A` `(r, in_features)` and `lora_B` `(out_features, r)`; its output is `base_layer(x) + lora_B(lora_A(x)) * lora_alpha / r`, and it adds `r * (in_features + out_features)` parameters. A targeted convolution becomes a PEFT `lora.Conv2d` instead, whose `lora_A` keeps the layer's kernel: a 3 x 3 convolution adds `r * (9 * in_channels + out_channels)`, not `r * (in + out)`."""
    pipe = lora_pipe("style", rank=2)
    layer = first_projection(pipe.unet)
    assert isinstance(layer, LoraLinear) and isinstance(layer.base_layer, torch.nn.Linear)
    a, b = layer.lora_A["style"].weight, layer.lora_B["style"].weight
    assert a.shape == (2, layer.in_features) and b.shape == (layer.out_features, 2)
    config = pipe.unet.peft_config["style"]
    assert config.r == 2 and set(config.target_modules) == set(PROJECTIONS)
    assert layer.scaling["style"] == config.lora_alpha / config.r
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = layer.base_layer(x) + (x @ a.T @ b.T) * layer.scaling["style"]
        torch.testing.assert_close(layer(x), expected)
    wrapped = [m for m in pipe.unet.modules() if isinstance(m, LoraLinear)]
    targets = [n for n, _ in tiny_unet().named_modules() if n.endswith(PROJECTIONS)]
    assert len(wrapped) == len(targets) == 32  # 8 attention layers x 4 projections
    # The lora-linear diagram (tools/infralens_docs/diagrams.yml) gives scaling as loaded,
    # the value checked above, and no formula over the two handles: after one call at
    # cross_attention_kwargs={"scale": 0}, diffusers' unscale_lora_layers resets scaling to
    # lora_alpha / r (set_scale(name, 1.0)), so set_adapters' weight no longer applies.
    pipe.set_adapters("style", adapter_weights=0.5)
    predict(pipe.unet, cross_attention_kwargs={"scale": 0.0})
    assert layer.scaling["style"] == config.lora_alpha / config.r
    from pathlib import Path

    import yaml

    file = Path(__file__).resolve().parents[2] / "tools" / "infralens_docs" / "diagrams.yml"
    rows = yaml.safe_load(file.read_text(encoding="utf-8"))["lora-linear"]["rows"]
    lines = [line for _, _, row_lines in rows for line in row_lines]
    assert "scaling = lora_alpha / r" in lines and "(as loaded)" in lines
    assert not [line for line in lines if "set_adapters" in line or "call's scale" in line]
    from peft.tuners.lora import Conv2d as LoraConv2d

    conv = tiny_unet().down_blocks[0].resnets[0].conv1  # a 3 x 3 convolution
    convs = tiny_sd_pipeline()
    convs.load_lora_weights(
        {"unet.down_blocks.0.resnets.0.conv1.lora_A.weight": torch.randn(2, conv.in_channels, 3, 3),
         "unet.down_blocks.0.resnets.0.conv1.lora_B.weight": torch.randn(conv.out_channels, 2, 1, 1)},
        adapter_name="style",
    )  # fmt: skip
    wrapped_conv = convs.unet.down_blocks[0].resnets[0].conv1
    assert isinstance(wrapped_conv, LoraConv2d) and conv.kernel_size == (3, 3)
    assert wrapped_conv.lora_A["style"].kernel_size == conv.kernel_size  # peft's own layer
    added = sum(p.numel() for n, p in wrapped_conv.named_parameters() if "lora_" in n)
    assert added == 2 * (conv.in_channels * 9 + conv.out_channels)  # 640, not 2 * (32 + 32)
    assert all(
        n_params(m.lora_A) + n_params(m.lora_B) == 2 * (m.in_features + m.out_features)
        for m in wrapped
    )


def test_a_fresh_lora_adapter_leaves_the_output_unchanged():
    """An adapter added with PEFT's default initialisation (`init_lora_weights=True`: `lora_A` random, `lora_B` zeros) leaves the UNet's output exactly unchanged, so fine-tuning starts from the base model."""
    unet = tiny_unet()
    base = predict(unet)
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=list(PROJECTIONS)))
    layer = first_projection(unet)
    assert layer.lora_B["default"].weight.abs().max() == 0
    assert layer.lora_A["default"].weight.abs().max() > 0
    torch.testing.assert_close(predict(unet), base, rtol=0, atol=0)


def test_unfused_lora_runs_four_more_ops_per_layer_and_fused_none():
    """Unfused, every adapted layer runs `lora_A` and then `lora_B` on every UNet call of `StableDiffusionPipeline`, on top of its full-size `base_layer`: four more ops per layer in the UNet's forward (two thin matmuls, the multiply by `scaling`, the add); after `fuse_lora` neither runs, and the UNet's forward dispatches exactly the base model's ops."""
    pipe = lora_pipe("style")
    adapted = [m for m in pipe.unet.modules() if isinstance(m, LoraLinear)]
    counts = {"A": 0, "B": 0}
    for layer in adapted:
        layer.lora_A["style"].register_forward_hook(
            lambda *a: counts.__setitem__("A", counts["A"] + 1)
        )
        layer.lora_B["style"].register_forward_hook(
            lambda *a: counts.__setitem__("B", counts["B"] + 1)
        )
    run(pipe, steps=3)
    assert counts == {"A": 3 * len(adapted), "B": 3 * len(adapted)}  # one each per layer per call
    base, n = dispatched_ops(tiny_unet()), len(adapted)
    views = {"t": 2 * n, "view": 2 * n, "_unsafe_view": 2 * n}  # free: no kernel
    assert dispatched_ops(pipe.unet) - base == Counter(mm=2 * n, mul=n, add=n, **views)
    pipe.fuse_lora(components=["unet"])
    counts.update(A=0, B=0)
    run(pipe, steps=3)
    assert counts == {"A": 0, "B": 0}
    assert dispatched_ops(pipe.unet) == base


def test_fuse_lora_folds_the_delta_into_the_weights_and_unfuse_restores_them():
    """`fuse_lora(lora_scale=s)` adds `s * lora_B.weight @ lora_A.weight * lora_alpha / r` to each `base_layer.weight`, which leaves the output as it was with the adapter at weight `s` (up to float rounding), and `unfuse_lora` subtracts it again and restores the original weights."""
    pipe = lora_pipe("style")
    layer = first_projection(pipe.unet)
    original = layer.base_layer.weight.detach().clone()
    a, b = layer.lora_A["style"].weight.detach(), layer.lora_B["style"].weight.detach()
    delta = b @ a * layer.scaling["style"]
    at_half = predict(pipe.unet, cross_attention_kwargs={"scale": 0.5})
    pipe.fuse_lora(components=["unet"], lora_scale=0.5)
    assert layer.merged and pipe.num_fused_loras == 1
    torch.testing.assert_close(layer.base_layer.weight, original + 0.5 * delta)
    torch.testing.assert_close(predict(pipe.unet), at_half, rtol=0, atol=1e-5)
    pipe.unfuse_lora(components=["unet"])
    assert not layer.merged and pipe.num_fused_loras == 0
    torch.testing.assert_close(layer.base_layer.weight, original, rtol=0, atol=1e-6)


def test_after_fuse_lora_the_call_scale_does_nothing():
    """After `fuse_lora`, `cross_attention_kwargs={"scale": ...}` no longer changes the UNet's output: the delta is inside the weights."""
    pipe = lora_pipe("style")
    full = predict(pipe.unet)
    assert not torch.allclose(predict(pipe.unet, cross_attention_kwargs={"scale": 0.0}), full)
    pipe.fuse_lora(components=["unet"])
    for scale in [0.0, 0.5, 2.0]:
        out = predict(pipe.unet, cross_attention_kwargs={"scale": scale})
        torch.testing.assert_close(out, full, rtol=0, atol=1e-5)


def test_unload_after_fuse_keeps_the_fused_weights():
    """`unload_lora_weights()` after `fuse_lora` removes the PEFT layers, so the UNet holds plain `nn.Linear` layers again, and keeps the fused weights: the output stays the LoRA's."""
    pipe = lora_pipe("style")
    with_lora = predict(pipe.unet)
    pipe.fuse_lora(components=["unet"])
    pipe.unload_lora_weights()
    assert not any(isinstance(m, LoraLinear) for m in pipe.unet.modules())
    assert type(first_projection(pipe.unet)) is torch.nn.Linear
    torch.testing.assert_close(predict(pipe.unet), with_lora, rtol=0, atol=1e-5)


def test_call_scale_and_adapter_weight_scale_the_same_branch():
    """`cross_attention_kwargs={"scale": s}` and `set_adapters(name, adapter_weights=s)` scale the same LoRA branch and give the same output; `s = 0` gives the base model's output, either way, and `disable_lora()` does too."""
    base = predict(tiny_unet())
    pipe = lora_pipe("style")
    by_call = predict(pipe.unet, cross_attention_kwargs={"scale": 0.5})
    pipe.set_adapters("style", adapter_weights=0.5)
    torch.testing.assert_close(predict(pipe.unet), by_call, rtol=0, atol=0)
    assert not torch.allclose(by_call, base)
    pipe.set_adapters("style", adapter_weights=0.0)
    torch.testing.assert_close(predict(pipe.unet), base)
    pipe.set_adapters("style", adapter_weights=1.0)
    torch.testing.assert_close(predict(pipe.unet, cross_attention_kwargs={"scale": 0.0}), base)
    pipe.disable_lora()
    torch.testing.assert_close(predict(pipe.unet), base)
    pipe.enable_lora()


def test_the_per_call_scale_kwarg_depends_on_the_family():
    """The per-call LoRA scale is `cross_attention_kwargs={"scale": s}` on the UNet pipelines (`StableDiffusionPipeline`, `StableDiffusionXLPipeline`) and `joint_attention_kwargs={"scale": s}` on `StableDiffusion3Pipeline` and `FluxPipeline`: each scales the denoiser's LoRA layers by `s` for that call. Given the other name, SD3 and Flux raise a `TypeError`, while the UNet pipelines (whose `__call__` takes `**kwargs`) ignore it without a word and leave the LoRA unscaled."""
    from tiny import (
        POOLED_DIM,
        dit_embeds,
        flux_prompt_embeds,
        logged_messages,
        tiny_flux_pipeline,
        tiny_sd3_pipeline,
        tiny_sdxl_pipeline,
        tiny_text_encoder,
    )

    pooled = torch.randn(1, POOLED_DIM, generator=torch.Generator().manual_seed(2))
    text, flux_pooled = flux_prompt_embeds()
    sd3_text, sd3_pooled = dit_embeds(7, width=EMBED_DIM)
    cases = [  # (pipeline, denoiser, the kwarg it takes, the one it rejects, call inputs)
        (tiny_sd_pipeline(text_encoder=tiny_text_encoder()), "unet", "cross_attention_kwargs",
         "joint_attention_kwargs", dict(prompt_embeds=PROMPT)),  # scale also goes to it
        (tiny_sdxl_pipeline(), "unet", "cross_attention_kwargs", "joint_attention_kwargs",
         dict(prompt_embeds=PROMPT, pooled_prompt_embeds=pooled)),
        (tiny_sd3_pipeline(), "transformer", "joint_attention_kwargs", "cross_attention_kwargs",
         dict(prompt_embeds=sd3_text, pooled_prompt_embeds=sd3_pooled[:, :16])),
        (tiny_flux_pipeline(), "transformer", "joint_attention_kwargs", "cross_attention_kwargs",
         dict(prompt_embeds=text[1:], pooled_prompt_embeds=flux_pooled[1:])),
    ]  # fmt: skip
    for pipe, name, takes, rejects, inputs in cases:
        denoiser = getattr(pipe, name)
        denoiser.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q"]))
        layer = next(m for m in denoiser.modules() if isinstance(m, LoraLinear))
        seen = []
        layer.register_forward_pre_hook(lambda m, a, seen=seen: seen.append(m.scaling["default"]))
        call = dict(inputs, num_inference_steps=1, guidance_scale=1.0, height=HEIGHT,
                    width=WIDTH, output_type="latent")  # fmt: skip
        pipe(**call, **{takes: {"scale": 0.5}})
        assert seen and set(seen) == {0.5}, type(pipe).__name__  # lora_alpha / r = 1, times s
        assert layer.scaling["default"] == 1.0  # restored after the call
        seen.clear()
        if name == "unet":  # swallowed by **kwargs: no error, no log line, no scale
            with logged_messages() as messages:
                pipe(**call, **{rejects: {"scale": 0.5}})
            assert seen and set(seen) == {1.0} and messages == []
        else:
            with pytest.raises(TypeError, match=rejects):
                pipe(**call, **{rejects: {"scale": 0.5}})


def test_several_loras_add_their_weighted_deltas():
    """With two LoRAs loaded under their own `adapter_name`, `set_adapters(["a", "b"], adapter_weights=[wa, wb])` makes each adapted layer return `base_layer(x) + wa * delta_a(x) + wb * delta_b(x)`, `set_adapters("a")` alone switches `b` off, and `fuse_lora()` folds every active adapter into the weights at its current weight."""
    pipe = lora_pipe("a", "b")
    layer = first_projection(pipe.unet)
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(2))

    def delta(name):
        a, b = layer.lora_A[name].weight, layer.lora_B[name].weight
        return x @ a.T @ b.T * layer.scaling[name]

    with torch.no_grad():
        base, delta_a, delta_b = layer.base_layer(x), delta("a"), delta("b")
        pipe.set_adapters(["a", "b"], adapter_weights=[0.7, 0.2])
        assert sorted(pipe.get_active_adapters()) == ["a", "b"]
        torch.testing.assert_close(layer(x), base + 0.7 * delta_a + 0.2 * delta_b)
        pipe.set_adapters("a")
        torch.testing.assert_close(layer(x), base + delta_a)
        pipe.set_adapters(["a", "b"], adapter_weights=[0.7, 0.2])
        weight = layer.base_layer.weight.clone()
        pipe.fuse_lora(components=["unet"])
        assert sorted(pipe.fused_loras) == ["a", "b"]

        def matrix(name):  # B @ A * lora_alpha / r, before any adapter weight
            config = pipe.unet.peft_config[name]
            b, a = layer.lora_B[name].weight, layer.lora_A[name].weight
            return b @ a * config.lora_alpha / config.r

        expected = weight + 0.7 * matrix("a") + 0.2 * matrix("b")
        torch.testing.assert_close(layer.base_layer.weight, expected)


def test_set_adapters_takes_per_block_weights():
    """An adapter weight may be a dict by UNet part, for example `{"unet": {"down": 0.0, "mid": 1.0, "up": 0.5}}` in the pipeline's `set_adapters`, or a list per block with one entry per attention module (`{"down": {"block_0": [0.2, 0.4]}}`); `set_adapters` expands it to one weight per attention module, shared by all the transformer blocks inside it."""
    deep = dict(layers_per_block=2, transformer_layers_per_block=2)  # 2 modules x 2 blocks
    pipe = tiny_sd_pipeline(unet=tiny_unet(**deep))
    pipe.load_lora_weights(lora_state_dict(tiny_unet(**deep)), adapter_name="style")

    def weights():  # {attention module: set of its LoRA layers' weights}
        out = {}
        for name, module in pipe.unet.named_modules():
            if isinstance(module, LoraLinear):
                out.setdefault(name.split(".transformer_blocks.")[0], set()).add(
                    (name.split(".transformer_blocks.")[1][0], module.scaling["style"])
                )
        return {m: {w for _, w in v} for m, v in out.items()}, out

    pipe.set_adapters("style", adapter_weights={"unet": {"down": 0.0, "mid": 1.0, "up": 0.5}})
    per_module, _ = weights()
    for part, weight in [("down_blocks", 0.0), ("mid_block", 1.0), ("up_blocks", 0.5)]:
        assert {w for m, ws in per_module.items() if m.startswith(part) for w in ws} == {weight}
    pipe.set_adapters("style", adapter_weights={"unet": {"down": {"block_0": [0.2, 0.4]}}})
    per_module, blocks = weights()
    assert {b for b, _ in blocks["down_blocks.0.attentions.0"]} == {"0", "1"}  # two blocks
    assert per_module["down_blocks.0.attentions.0"] == {0.2}  # both blocks, one weight
    assert per_module["down_blocks.0.attentions.1"] == {0.4}


def test_part_weights_follow_attention_modules_only():
    """`set_adapters` expands a dict of part weights to one weight per attention module (`down_blocks.i.attentions.j`), shared by all its transformer blocks; LoRA layers outside the attention modules do not reliably follow their part: under `{"down": 0.3, "mid": 0.0, "up": 0.0}` the layers in blocks without attention and in the mid block's resnets keep weight 1, and a LoRA on `time_embedding` makes `set_adapters` raise an `IndexError`."""
    deep = tiny_unet(transformer_layers_per_block=2)  # two transformer blocks per module
    pipe = tiny_sd_pipeline(unet=tiny_unet(transformer_layers_per_block=2))
    pipe.load_lora_weights(lora_state_dict(deep, suffixes=(*PROJECTIONS, "time_emb_proj")),
                           adapter_name="style")  # fmt: skip
    pipe.set_adapters("style", adapter_weights={"unet": {"down": 0.3, "mid": 0.0, "up": 0.0}})
    weights = {
        name: module.scaling["style"]
        for name, module in pipe.unet.named_modules()
        if isinstance(module, LoraLinear)
    }
    attention = {n: w for n, w in weights.items() if ".attentions." in n}
    assert {n.split(".transformer_blocks.")[1][0] for n in attention} == {"0", "1"}
    assert {w for n, w in attention.items() if n.startswith("down_blocks")} == {0.3}
    assert {w for n, w in attention.items() if not n.startswith("down_blocks")} == {0.0}
    kept = {n for n, w in weights.items() if w == 1.0}  # blocks without attention, mid resnets
    assert kept == {
        "down_blocks.1.resnets.0.time_emb_proj",
        "up_blocks.0.resnets.0.time_emb_proj",
        "up_blocks.0.resnets.1.time_emb_proj",
        "mid_block.resnets.0.time_emb_proj",
        "mid_block.resnets.1.time_emb_proj",
    }
    timed = tiny_sd_pipeline()
    timed.load_lora_weights(
        lora_state_dict(tiny_unet(), suffixes=("to_q", "time_embedding.linear_1")),
        adapter_name="style",
    )
    with pytest.raises(IndexError):
        timed.set_adapters("style", adapter_weights={"unet": {"down": 0.5}})


def test_lora_size_on_sd15_attention_projections():
    """A rank-4 LoRA on the `to_q`, `to_k`, `to_v` and `to_out.0` projections of SD 1.5's UNet (128 layers) has `4 * (in_features + out_features)` parameters per layer, 797,184 in all: under 2 MB in fp16, against 859,520,964 in the UNet."""
    unet = meta_unet(SD15_UNET)
    assert n_params(unet) == 859_520_964
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=list(PROJECTIONS)))
    layers = [m for m in unet.modules() if isinstance(m, LoraLinear)]
    assert len(layers) == 128
    for m in layers:
        assert n_params(m.lora_A) + n_params(m.lora_B) == 4 * (m.in_features + m.out_features)
    lora = sum(p.numel() for n, p in unet.named_parameters() if ".lora_" in n)
    assert lora == 797_184 and 2 * lora < 2_000_000


# ---------------------------------------------------------------- ControlNet


def test_controlnet_from_unet_copies_the_encoder_half():
    """`ControlNetModel.from_unet` builds a ControlNet from the UNet's config and copies the weights of `conv_in`, `time_proj`, `time_embedding`, every `down_blocks` entry and the `mid_block` (and `add_embedding`, for SDXL's added conditioning); it has no up blocks and no `conv_out`, and adds `controlnet_cond_embedding`, `controlnet_down_blocks` and `controlnet_mid_block`."""
    unet = tiny_unet()
    controlnet = ControlNetModel.from_unet(unet)
    for part in ["conv_in", "time_proj", "time_embedding", "down_blocks", "mid_block"]:
        ours, theirs = getattr(controlnet, part).state_dict(), getattr(unet, part).state_dict()
        assert ours.keys() == theirs.keys()
        for key in ours:
            torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0)
    children = {name for name, _ in controlnet.named_children()}
    assert "up_blocks" not in children and "conv_out" not in children
    assert {
        "controlnet_cond_embedding",
        "controlnet_down_blocks",
        "controlnet_mid_block",
    } <= children
    from tiny import tiny_text_time_unet

    sdxl_like = tiny_text_time_unet()
    ours = ControlNetModel.from_unet(sdxl_like).add_embedding.state_dict()
    for key, value in sdxl_like.add_embedding.state_dict().items():
        torch.testing.assert_close(ours[key], value, rtol=0, atol=0)


def test_controlnet_outputs_are_zero_initialised():
    """A new `ControlNetModel` zero-initialises (`zero_module`) its `controlnet_down_blocks`, one 1 x 1 convolution per UNet skip connection, its `controlnet_mid_block` and the last convolution of `controlnet_cond_embedding`, so before training every residual is zero and the UNet's output is unchanged."""
    unet = tiny_unet()
    controlnet = ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=(16, 32))
    zeroed = [
        controlnet.controlnet_down_blocks,
        controlnet.controlnet_mid_block,
        controlnet.controlnet_cond_embedding.conv_out,
    ]
    assert all(p.abs().max() == 0 for m in zeroed for p in m.parameters())
    assert all(c.kernel_size == (1, 1) for c in controlnet.controlnet_down_blocks)
    with torch.no_grad():
        down, mid = controlnet(
            X, T, encoder_hidden_states=PROMPT, controlnet_cond=CONTROL_IMAGE, return_dict=False
        )
    assert len(down) == 4  # conv_in, 2 in the first down block, 1 in the last
    assert all(r.abs().max() == 0 for r in [*down, mid])
    out = predict(unet, down_block_additional_residuals=down, mid_block_additional_residual=mid)
    torch.testing.assert_close(out, predict(unet), rtol=0, atol=0)


def test_conditioning_scale_multiplies_every_residual():
    """Outside guess mode, `ControlNetModel` multiplies each of its residuals by `conditioning_scale`, which `StableDiffusionControlNetPipeline` passes from `controlnet_conditioning_scale`; under `guess_mode` it weights them by `conditioning_scale` times a factor rising geometrically from a tenth at the first skip connection to 1 at the mid block, unless its config sets `global_pool_conditions`. A `controlnet_conditioning_scale` of 0 still runs the ControlNet at every step."""
    unet = tiny_unet()
    controlnet = tiny_controlnet(unet, trained=True)

    def residuals(scale, guess_mode=False, net=controlnet):
        with torch.no_grad():
            down, mid = net(
                X,
                T,
                encoder_hidden_states=PROMPT,
                controlnet_cond=CONTROL_IMAGE,
                conditioning_scale=scale,
                guess_mode=guess_mode,
                return_dict=False,
            )
        return [*down, mid]

    for full, half in zip(residuals(1.0), residuals(0.5), strict=True):
        assert full.abs().max() > 0
        torch.testing.assert_close(half, 0.5 * full)
    guessed = residuals(0.5, guess_mode=True)  # 4 skip residuals and the mid block's
    weights = [(g / f).flatten()[0].item() for g, f in zip(guessed, residuals(1.0), strict=True)]
    assert weights == pytest.approx([0.5 * 10 ** (k / 4 - 1) for k in range(5)])  # 0.05 to 0.5
    pooled = tiny_controlnet(unet, trained=True)
    pooled.register_to_config(global_pool_conditions=True)
    for plain, guessed in zip(
        residuals(0.5, net=pooled), residuals(0.5, True, pooled), strict=True
    ):
        torch.testing.assert_close(guessed, plain, rtol=0, atol=0)  # no per-depth weights
    pipe = tiny_controlnet_pipeline(unet, controlnet)
    scales = []
    controlnet.register_forward_pre_hook(
        lambda m, a, k: scales.append(k["conditioning_scale"]), with_kwargs=True
    )
    run(pipe, steps=3, image=CONTROL_IMAGE, controlnet_conditioning_scale=0.0)
    assert scales == [0.0, 0.0, 0.0]


def test_control_image_enters_after_conv_in():
    """`controlnet_cond_embedding` maps the control image `(B, 3, H, W)` to the shape of `conv_in`'s output, `(B, block_out_channels[0], h, w)`, and the ControlNet adds the two before its first down block."""
    controlnet = tiny_controlnet(tiny_unet(), trained=True)
    seen = []
    controlnet.down_blocks[0].register_forward_pre_hook(
        lambda m, a, k: seen.append(k.get("hidden_states", a[0] if a else None)), with_kwargs=True
    )
    with torch.no_grad():
        controlnet(X, T, encoder_hidden_states=PROMPT, controlnet_cond=CONTROL_IMAGE)
        embedded = controlnet.controlnet_cond_embedding(CONTROL_IMAGE)
        expected = controlnet.conv_in(X) + embedded
    assert embedded.shape == (1, 32, 8, 8)  # block_out_channels[0] at the latent size
    torch.testing.assert_close(seen[0], expected)


def test_guess_mode_runs_the_controlnet_on_the_conditional_half():
    """Under CFG a ControlNet runs every step at the UNet's batch, `2B` rows, except in guess mode: with `guess_mode=True`, or by itself when the ControlNet's config sets `global_pool_conditions` (for a list of ControlNets, the first one's config decides), `StableDiffusionControlNetPipeline` runs it on the conditional half only, `B` rows, half its cost per step, while the UNet still gets `2B`."""
    unet = tiny_unet()
    controlnet = tiny_controlnet(unet, trained=True)
    pooled, pooled_too = (tiny_controlnet(unet, seed=s, trained=True) for s in (1, 2))
    for net in (pooled, pooled_too):
        net.register_to_config(global_pool_conditions=True)
    rows = {"controlnet": [], "pooled": [], "pooled_too": [], "unet": []}
    for key, module in [("controlnet", controlnet), ("pooled", pooled),
                        ("pooled_too", pooled_too), ("unet", unet)]:  # fmt: skip
        module.register_forward_pre_hook(  # a list calls each ControlNet with sample=...
            lambda m, a, k, key=key: rows[key].append((a[0] if a else k["sample"]).shape[0]),
            with_kwargs=True,
        )

    def rows_of(nets, **kwargs):
        for key in rows:
            rows[key].clear()
        image = [CONTROL_IMAGE] * len(nets) if isinstance(nets, list) else CONTROL_IMAGE
        run(tiny_controlnet_pipeline(unet, nets), steps=2, image=image, **kwargs)
        return {key: value for key, value in rows.items() if value}

    assert rows_of(controlnet) == {"controlnet": [2, 2], "unet": [2, 2]}  # B = 1
    assert rows_of(controlnet, guess_mode=True) == {"controlnet": [1, 1], "unet": [2, 2]}
    assert rows_of(pooled) == {"pooled": [1, 1], "unet": [2, 2]}  # guess_mode=False passed
    both = rows_of([pooled, pooled_too])  # the first one pooled: guess mode for both
    assert both == {"pooled": [1, 1], "pooled_too": [1, 1], "unet": [2, 2]}
    second = rows_of([controlnet, pooled])  # only the second: no guess mode
    assert second == {"controlnet": [2, 2], "pooled": [2, 2], "unet": [2, 2]}


def test_multicontrolnet_sums_the_residuals_of_every_controlnet():
    """In `StableDiffusionControlNetPipeline`, a list of ControlNets is wrapped in `MultiControlNetModel`, which on every step runs each ControlNet on its own control image and `controlnet_conditioning_scale` entry and adds their residuals element-wise, so the UNet still gets one `down_block_additional_residuals` list, one tensor per skip connection, and one `mid_block_additional_residual`."""
    unet = tiny_unet()
    first = tiny_controlnet(unet, seed=1, trained=True)
    second = tiny_controlnet(unet, seed=2, trained=True)
    pipe = tiny_controlnet_pipeline(unet, [first, second])
    assert isinstance(pipe.controlnet, MultiControlNetModel)
    images = [CONTROL_IMAGE, torch.rand(1, 3, HEIGHT, WIDTH)]
    calls = {"first": [], "second": []}  # (args, kwargs) of each ControlNet's forward

    def recorder(key):
        def hook(module, args, kwargs):
            calls[key].append((args, dict(kwargs)))

        return hook

    first.register_forward_pre_hook(recorder("first"), with_kwargs=True)
    second.register_forward_pre_hook(recorder("second"), with_kwargs=True)
    unet_kwargs = []
    unet.register_forward_pre_hook(
        lambda m, a, k: unet_kwargs.append({key: k[key] for key in k}), with_kwargs=True
    )
    run(pipe, steps=2, image=images, controlnet_conditioning_scale=[0.5, 1.0])
    assert len(calls["first"]) == len(calls["second"]) == len(unet_kwargs) == 2  # every step
    for step, kwargs in enumerate(unet_kwargs):
        outputs = []
        for key, net, scale, image in [("first", first, 0.5, 0), ("second", second, 1.0, 1)]:
            args, cn_kwargs = calls[key][step]
            assert cn_kwargs["conditioning_scale"] == scale
            assert cn_kwargs["controlnet_cond"].shape == (2, 3, HEIGHT, WIDTH)  # CFG: 2B
            torch.testing.assert_close(cn_kwargs["controlnet_cond"][1], images[image][0])
            with torch.no_grad():  # the same call again, outside the wrapper
                outputs.append(net(*args, **cn_kwargs))
        (down_1, mid_1), (down_2, mid_2) = outputs
        residuals = kwargs["down_block_additional_residuals"]
        assert type(residuals) is list and len(residuals) == len(down_1) == 4  # not a tuple
        for total, one, two in zip(residuals, down_1, down_2, strict=True):
            torch.testing.assert_close(total, one + two)
        torch.testing.assert_close(kwargs["mid_block_additional_residual"], mid_1 + mid_2)


def test_controlnet_size_on_the_meta_device():
    """Built with `ControlNetModel.from_unet` from the published UNet configs, a full-size ControlNet has 361,279,120 parameters for SD 1.5 (42% of its UNet, about 723 MB in fp16, with 12 `controlnet_down_blocks`) and 1,251,014,160 for SDXL (49%, about 2,502 MB in fp16)."""
    cases = [(SD15_UNET, 361_279_120, 42, 723), (SDXL_UNET, 1_251_014_160, 49, 2502)]
    for config, expected, share, megabytes in cases:
        unet = meta_unet(config)
        with torch.device("meta"):
            controlnet = ControlNetModel.from_unet(unet, load_weights_from_unet=False)
        count = n_params(controlnet)
        assert count == expected
        if config is SD15_UNET:
            assert len(controlnet.controlnet_down_blocks) == 12
        assert round(100 * count / n_params(unet)) == share
        assert round(2 * count / 1e6) == megabytes  # fp16: 2 bytes a parameter


def test_controlnet_flops_per_step_on_the_meta_device():
    """Counted with torch's `FlopCounterMode` on the meta device, one call of a full-size ControlNet (`ControlNetModel.from_unet`) costs 35% of the FLOPs of one UNet call for SD 1.5 at 512 x 512, and 45% for SDXL at 1024 x 1024."""
    from torch.utils.flop_counter import FlopCounterMode

    shares = {}
    for name, config, side in [("SD 1.5", SD15_UNET, 512), ("SDXL", SDXL_UNET, 1024)]:
        unet = meta_unet(config)
        with torch.device("meta"):
            controlnet = ControlNetModel.from_unet(unet, load_weights_from_unet=False)
            latents = torch.empty(1, 4, side // 8, side // 8)
            kwargs = dict(encoder_hidden_states=torch.empty(1, 77, config["cross_attention_dim"]))
            if config is SDXL_UNET:  # pooled text embeds and the six size/crop ids
                kwargs["added_cond_kwargs"] = {
                    "text_embeds": torch.empty(1, 1280),
                    "time_ids": torch.empty(1, 6),
                }
            flops = []
            for module, extra in [
                (unet, {}),
                (controlnet, {"controlnet_cond": torch.empty(1, 3, side, side)}),
            ]:
                with torch.no_grad(), FlopCounterMode(display=False) as counter:
                    module(latents, 500, **kwargs, **extra)
                flops.append(counter.get_total_flops())
        shares[name] = round(100 * flops[1] / flops[0])
    assert shares == {"SD 1.5": 35, "SDXL": 45}


# ---------------------------------------------------------------- IP-Adapter


def test_ip_adapter_processor_adds_a_second_attention_over_image_tokens():
    """`IPAdapterAttnProcessor2_0` computes the layer's own text attention, with `to_q`, `to_k` and `to_v`, adds `scale` times a second attention of the same queries over the image tokens through its own `to_k_ip` and `to_v_ip`, and applies the layer's `to_out` to the sum."""
    torch.manual_seed(0)
    attn = Attention(query_dim=32, cross_attention_dim=EMBED_DIM, heads=4, dim_head=8).eval()
    processor = IPAdapterAttnProcessor2_0(hidden_size=32, cross_attention_dim=EMBED_DIM, scale=0.6)
    attn.set_processor(processor)
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 16, 32, generator=g)  # (B, h*w, C) query tokens
    text = torch.randn(2, 77, EMBED_DIM, generator=g)  # (B, 77, D) prompt tokens
    image = torch.randn(2, 4, EMBED_DIM, generator=g)  # (B, 4, D) projected image tokens

    def attend(q, k, v):
        split = [t.view(2, -1, 4, 8).transpose(1, 2) for t in (q, k, v)]
        out = torch.nn.functional.scaled_dot_product_attention(*split)
        return out.transpose(1, 2).reshape(2, -1, 32)

    with torch.no_grad():
        q = attn.to_q(hidden)
        expected = attend(q, attn.to_k(text), attn.to_v(text)) + 0.6 * attend(
            q, processor.to_k_ip[0](image), processor.to_v_ip[0](image)
        )
        expected = attn.to_out[0](expected)
        out = attn(hidden, encoder_hidden_states=(text, [image]))
    torch.testing.assert_close(out, expected)
    assert processor.to_k_ip[0].bias is None and processor.to_k_ip[0].weight.shape == (
        32,
        EMBED_DIM,
    )


def test_ip_adapter_scale_zero_skips_only_the_image_attention():
    """`set_ip_adapter_scale(0)` makes every IP-Adapter processor skip the image attention, so `to_k_ip` and `to_v_ip` do not run and `StableDiffusionPipeline` returns the latents of a pipeline without the adapter; but the `image_encoder` still runs once per call, `unet.encoder_hid_proj` in every UNet call, and a call without `ip_adapter_image` or `ip_adapter_image_embeds` fails (`TypeError`), from any pipeline sharing that UNet, until `unload_ip_adapter()`."""
    from diffusers import StableDiffusionPipeline

    base = run(tiny_sd_pipeline(), steps=3)
    pipe = tiny_sd_pipeline(image_encoder=tiny_image_encoder())
    pipe.load_ip_adapter(
        random_ip_adapter(pipe.unet), subfolder="", weight_name="", image_encoder_folder=None
    )
    pipe.set_ip_adapter_scale(0.0)
    ran = Counter()
    pipe.image_encoder.register_forward_hook(lambda *a: ran.update(["encoder"]))
    pipe.unet.encoder_hid_proj.register_forward_hook(lambda *a: ran.update(["projection"]))
    for processor in pipe.unet.attn_processors.values():
        if isinstance(processor, IPAdapterAttnProcessor2_0):
            processor.to_k_ip[0].register_forward_hook(lambda *a: ran.update(["to_k_ip"]))
            processor.to_v_ip[0].register_forward_hook(lambda *a: ran.update(["to_v_ip"]))
    reference = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    out = run(pipe, steps=3, ip_adapter_image=reference)
    assert ran == Counter(encoder=1, projection=3)  # no to_k_ip / to_v_ip
    torch.testing.assert_close(out, base, rtol=0, atol=1e-6)
    for caller in (pipe, StableDiffusionPipeline.from_pipe(pipe, image_encoder=None)):
        with pytest.raises(TypeError):  # the UNet now requires image_embeds on every call
            run(caller, steps=1)
    pipe.unload_ip_adapter()
    torch.testing.assert_close(run(pipe, steps=3), base, rtol=0, atol=1e-6)
    # the page states the skip and the failure of this pipeline, not of every one
    assert unscoped_paragraphs(("skips only",), ("TypeError", "image embeddings")) == []


def test_load_ip_adapter_changes_only_the_cross_attention_processors():
    """`load_ip_adapter` (here from a state dict, with `image_encoder_folder=None`) replaces the processor of every cross-attention layer (`attn2`) with an `IPAdapterAttnProcessor2_0` holding that layer's `to_k_ip` and `to_v_ip`, gives self-attention (`attn1`) a new instance of its processor class (`AttnProcessor2_0` by default), and adds the image projection as `unet.encoder_hid_proj`."""
    pipe = tiny_sd_pipeline()
    before = dict(pipe.unet.attn_processors)
    pipe.load_ip_adapter(
        random_ip_adapter(pipe.unet), subfolder="", weight_name="", image_encoder_folder=None
    )
    processors = pipe.unet.attn_processors
    for name, processor in processors.items():
        expected = IPAdapterAttnProcessor2_0 if ".attn2." in name else AttnProcessor2_0
        assert type(processor) is expected, name
        assert processor is not before[name]  # a new instance, even for attn1
    assert sum(type(p) is IPAdapterAttnProcessor2_0 for p in processors.values()) == 4
    assert type(pipe.unet.encoder_hid_proj).__name__ == "MultiIPAdapterImageProjection"
    assert pipe.unet.config.encoder_hid_dim_type == "ip_image_proj"


def test_load_ip_adapter_loads_the_image_encoder_next_to_the_weights(tmp_path):
    """If the pipeline has no `image_encoder`, `load_ip_adapter` loads a `CLIPVisionModelWithProjection` from the `image_encoder` folder next to the weights (`<subfolder>/image_encoder`) and registers it as `pipe.image_encoder`, with a `CLIPImageProcessor` as `feature_extractor`; `image_encoder_folder=None` skips it."""
    pipe = tiny_sd_pipeline()
    assert pipe.image_encoder is None
    encoder = tiny_image_encoder()
    encoder.save_pretrained(tmp_path / "models" / "image_encoder")  # a local folder, no hub
    torch.save(random_ip_adapter(pipe.unet), tmp_path / "models" / "ip-adapter.bin")
    pipe.load_ip_adapter(str(tmp_path), subfolder="models", weight_name="ip-adapter.bin")
    assert isinstance(pipe.image_encoder, CLIPVisionModelWithProjection)
    for key, value in encoder.state_dict().items():
        torch.testing.assert_close(pipe.image_encoder.state_dict()[key], value, rtol=0, atol=0)
    assert "CLIPImageProcessor" in type(pipe.feature_extractor).__name__
    assert pipe.feature_extractor.size["shortest_edge"] == 32  # the encoder's image_size
    skipped = tiny_sd_pipeline()
    skipped.load_ip_adapter(
        random_ip_adapter(skipped.unet), subfolder="", weight_name="", image_encoder_folder=None
    )
    assert skipped.image_encoder is None


def test_set_ip_adapter_scale_global_and_per_block():
    """`set_ip_adapter_scale(s)` sets `scale` on every IP-Adapter processor; a dict such as `{"up": {"block_1": [0.0, 1.0]}}` sets the named attention modules and puts 0 on every one it does not name."""
    pipe = tiny_sd_pipeline()
    pipe.load_ip_adapter(
        random_ip_adapter(pipe.unet), subfolder="", weight_name="", image_encoder_folder=None
    )

    def scales():
        return {
            name.removesuffix(".transformer_blocks.0.attn2.processor"): p.scale
            for name, p in pipe.unet.attn_processors.items()
            if isinstance(p, IPAdapterAttnProcessor2_0)
        }

    pipe.set_ip_adapter_scale(0.6)
    assert set(map(tuple, scales().values())) == {(0.6,)}
    pipe.set_ip_adapter_scale({"up": {"block_1": [0.0, 1.0]}})
    assert scales() == {
        "down_blocks.0.attentions.0": [0.0],
        "mid_block.attentions.0": [0.0],
        "up_blocks.1.attentions.0": [0.0],
        "up_blocks.1.attentions.1": [1.0],
    }


def ip_scales(unet):
    """``{processor name: scale list}`` of every IP-Adapter processor, non-zero ones only."""
    return {
        name.removesuffix(".processor"): p.scale
        for name, p in unet.attn_processors.items()
        if isinstance(p, IPAdapterAttnProcessor2_0) and any(p.scale)
    }


def test_set_ip_adapter_scale_block_names_follow_the_unet_layout():
    """`set_ip_adapter_scale`'s "style+layout" example, `{"down": {"block_2": [0.0, 1.0]}, "up": {"block_0": [0.0, 1.0, 0.0]}}`, names blocks of SDXL's layout, where it switches on one attention each in `down_blocks.2` and `up_blocks.0`; on SD 1.5's layout `up_blocks.0` has no attention, so `{"up": {"block_0": [0.0, 1.0, 0.0]}}` (its "style block only" example) is silently ignored and every IP-Adapter scale is 0."""
    layouts = {  # the block types and layers_per_block of the two UNet configs, tiny widths
        "SDXL": dict(block_out_channels=(32, 32, 64), layers_per_block=2,
                     down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * 2,
                     up_block_types=("CrossAttnUpBlock2D",) * 2 + ("UpBlock2D",)),
        "SD 1.5": dict(block_out_channels=(32, 32, 64, 64), layers_per_block=2,
                       down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
                       up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3),
    }  # fmt: skip
    for name, config in [("SDXL", SDXL_UNET), ("SD 1.5", SD15_UNET)]:
        for key in ("down_block_types", "up_block_types", "layers_per_block"):
            assert list(as_tuple(layouts[name][key])) == list(as_tuple(config[key])), key
    pipes = {}
    for name, layout in layouts.items():
        pipes[name] = tiny_sd_pipeline(unet=tiny_unet(**layout))
        state = random_ip_adapter(pipes[name].unet)
        pipes[name].load_ip_adapter(state, subfolder="", weight_name="", image_encoder_folder=None)
    style_and_layout = {"down": {"block_2": [0.0, 1.0]}, "up": {"block_0": [0.0, 1.0, 0.0]}}
    pipes["SDXL"].set_ip_adapter_scale(style_and_layout)
    assert ip_scales(pipes["SDXL"].unet) == {
        "down_blocks.2.attentions.1.transformer_blocks.0.attn2": [1.0],
        "up_blocks.0.attentions.1.transformer_blocks.0.attn2": [1.0],
    }
    pipes["SD 1.5"].set_ip_adapter_scale({"up": {"block_0": [0.0, 1.0, 0.0]}})
    assert ip_scales(pipes["SD 1.5"].unet) == {}


def test_image_encoder_runs_once_per_call():
    """In `StableDiffusionPipeline`, with `ip_adapter_image`, a plain IP-Adapter's `image_encoder` (`CLIPVisionModelWithProjection`) runs once per pipeline call, whatever the number of steps, and the unconditional image embedding for CFG is zeros, not an encoded blank image; the image projection `unet.encoder_hid_proj` and each layer's `to_k_ip` and `to_v_ip` run again in every UNet call. With precomputed `ip_adapter_image_embeds` the encoder does not run, and under CFG the unconditional image embedding is the first half of what is passed."""
    pipe = tiny_sd_pipeline(image_encoder=tiny_image_encoder())
    pipe.load_ip_adapter(
        random_ip_adapter(pipe.unet), subfolder="", weight_name="", image_encoder_folder=None
    )
    encoder_calls, unet_calls = [], []
    pipe.image_encoder.register_forward_hook(lambda *a: encoder_calls.append(1))
    pipe.unet.register_forward_pre_hook(
        lambda m, a, k: unet_calls.append(k["added_cond_kwargs"]), with_kwargs=True
    )
    projections = []
    pipe.unet.encoder_hid_proj.register_forward_hook(lambda *a: projections.append("proj"))
    for processor in pipe.unet.attn_processors.values():
        if isinstance(processor, IPAdapterAttnProcessor2_0):
            processor.to_k_ip[0].register_forward_hook(lambda *a: projections.append("k"))
            processor.to_v_ip[0].register_forward_hook(lambda *a: projections.append("v"))
    reference = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    run(pipe, steps=4, ip_adapter_image=reference)
    assert len(encoder_calls) == 1 and len(unet_calls) == 4
    assert projections.count("k") == projections.count("v") == 4 * 4  # 4 layers x 4 steps
    assert projections.count("proj") == 4  # the image projection: once per UNet call
    (image_embeds,) = unet_calls[0]["image_embeds"]  # (2B, 1, projection_dim)
    assert image_embeds.shape == (2, 1, 16)
    assert image_embeds[0].abs().max() == 0 and image_embeds[1].abs().max() > 0
    with torch.no_grad():
        encoded = pipe.image_encoder(reference).image_embeds
    torch.testing.assert_close(image_embeds[1], encoded)
    encoder_calls.clear(), unet_calls.clear()
    own = torch.cat([torch.ones_like(encoded), encoded])[:, None]  # [negative, positive] halves
    run(pipe, steps=2, ip_adapter_image_embeds=[own])
    assert encoder_calls == [] and len(unet_calls) == 2  # precomputed embeds: no encoder call
    torch.testing.assert_close(unet_calls[0]["image_embeds"][0][0], torch.ones_like(encoded))
    # the page states these counts of this pipeline, not of every one, and of calls given
    # `ip_adapter_image`, not of calls given precomputed `ip_adapter_image_embeds`
    assert unscoped_paragraphs(("once per", "encod"), ("unconditional embedding", "zeros")) == []
    ip_counts = ("once per", "encod", "IP-Adapter"), ("once per", "CLIP")
    assert unscoped_paragraphs(*ip_counts, ("unconditional embedding", "zeros"),
                               names=("StableDiffusionPipeline", "ip_adapter_image")) == []  # fmt: skip


def plus_ip_adapter(unet, embed_dim=16, hidden_dims=64, seed=0):
    """A Plus IP-Adapter state dict in the original checkpoints' layout, random values:
    an ``IPAdapterPlusImageProjection`` (a 4-layer Resampler over the encoder's hidden
    states, 4 queries) renamed to the keys ``load_ip_adapter`` converts, and the plain
    adapter's ``to_k_ip`` / ``to_v_ip``."""
    from diffusers.models.embeddings import IPAdapterPlusImageProjection

    torch.manual_seed(seed)
    projection = IPAdapterPlusImageProjection(
        embed_dims=embed_dim, output_dims=unet.config.cross_attention_dim,
        hidden_dims=hidden_dims, heads=hidden_dims // 64, num_queries=4,
    )  # fmt: skip
    renames = {"ln0": "0.norm1", "ln1": "0.norm2", "attn.to_q": "0.to_q",
               "attn.to_out.0": "0.to_out", "ff.0": "1.0", "ff.1.net.0.proj": "1.1",
               "ff.1.net.2": "1.3"}  # fmt: skip
    state = {}
    for key, value in projection.state_dict().items():
        for new, old in renames.items():
            key = key.replace(f".{new}.", f".{old}.")
        state[key] = value
    for i in range(len(projection.layers)):
        k, v = state.pop(f"layers.{i}.attn.to_k.weight"), state.pop(f"layers.{i}.attn.to_v.weight")
        state[f"layers.{i}.0.to_kv.weight"] = torch.cat([k, v])
    return {"image_proj": state, "ip_adapter": random_ip_adapter(unet)["ip_adapter"]}


def test_ip_adapter_plus_encodes_the_image_and_a_zeros_image():
    """In `StableDiffusionPipeline`, a Plus IP-Adapter (its projection an `IPAdapterPlusImageProjection`, loaded by `load_ip_adapter`) runs the `image_encoder` twice per pipeline call, on the image and on a zeros image for the unconditional embedding, with CFG and without it."""
    pipe = tiny_sd_pipeline(image_encoder=tiny_image_encoder())
    pipe.load_ip_adapter(
        plus_ip_adapter(pipe.unet), subfolder="", weight_name="", image_encoder_folder=None
    )
    assert type(pipe.unet.encoder_hid_proj.image_projection_layers[0]).__name__ == (
        "IPAdapterPlusImageProjection"
    )
    inputs = []
    pipe.image_encoder.register_forward_hook(lambda m, a, o: inputs.append(a[0].clone()))
    reference = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    run(pipe, steps=3, ip_adapter_image=reference)
    assert len(inputs) == 2
    assert inputs[0].abs().max() > 0 and inputs[1].abs().max() == 0
    inputs.clear()
    pipe(prompt_embeds=PROMPT, guidance_scale=1.0, num_inference_steps=3, height=HEIGHT,
         width=WIDTH, latents=start_latents(), output_type="latent", ip_adapter_image=reference)  # fmt: skip
    assert len(inputs) == 2  # no CFG: the zeros image is still encoded


def full_face_ip_adapter(unet, hidden=16, seed=0):
    """An IP-Adapter Full-face state dict in the original layout, random values: its
    projection (``proj.0``, ``proj.2``, ``proj.3``: an ``IPAdapterFullImageProjection`` of the
    encoder's hidden states, 257 tokens for ViT-H) and the plain adapter's ``to_k_ip`` /
    ``to_v_ip``."""
    g = torch.Generator().manual_seed(seed)
    dim = unet.config.cross_attention_dim
    image_proj = {
        "proj.0.weight": torch.randn(hidden, hidden, generator=g) * 0.2,
        "proj.0.bias": torch.zeros(hidden),
        "proj.2.weight": torch.randn(dim, hidden, generator=g) * 0.2,
        "proj.2.bias": torch.zeros(dim),
        "proj.3.weight": torch.ones(dim),
        "proj.3.bias": torch.zeros(dim),
    }
    return {"image_proj": image_proj, "ip_adapter": random_ip_adapter(unet)["ip_adapter"]}


def test_image_encoder_runs_per_ip_adapter_and_twice_for_hidden_state_ones():
    """In `StableDiffusionPipeline`, the `image_encoder` runs once per loaded IP-Adapter in each pipeline call (two plain adapters: two encoder calls), and twice for every adapter that reads the encoder's hidden states, not only the Plus ones: the Full-face adapter (`IPAdapterFullImageProjection`) also encodes the image and a zeros image."""
    reference = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    two = tiny_sd_pipeline(image_encoder=tiny_image_encoder())
    two.load_ip_adapter([random_ip_adapter(two.unet), random_ip_adapter(two.unet, seed=1)],
                        subfolder=["", ""], weight_name=["", ""], image_encoder_folder=None)  # fmt: skip
    calls = []
    two.image_encoder.register_forward_hook(lambda m, a, o: calls.append(a[0].abs().max()))
    run(two, steps=2, ip_adapter_image=[reference, reference])
    assert len(calls) == 2 and all(c > 0 for c in calls)
    full = tiny_sd_pipeline(image_encoder=tiny_image_encoder())
    full.load_ip_adapter(
        full_face_ip_adapter(full.unet), subfolder="", weight_name="", image_encoder_folder=None
    )
    assert type(full.unet.encoder_hid_proj.image_projection_layers[0]).__name__ == (
        "IPAdapterFullImageProjection"
    )
    calls.clear()
    full.image_encoder.register_forward_hook(lambda m, a, o: calls.append(a[0].abs().max()))
    run(full, steps=2, ip_adapter_image=reference)
    assert len(calls) == 2 and calls[0] > 0 and calls[1] == 0  # the image, then zeros


def test_ip_adapter_size_on_sd15():
    """A plain IP-Adapter loaded by `load_ip_adapter` into SD 1.5's UNet (built on the meta device) puts `to_k_ip` and `to_v_ip` on each of its 16 cross-attention layers, 19,169,280 parameters, and a 3,150,336-parameter image projection: 22,319,616 in all, the paper's 22M."""
    pipe = tiny_sd_pipeline(unet=meta_unet(SD15_UNET))
    state = random_ip_adapter(pipe.unet, image_embed_dim=1024)  # ViT-H/14's projection_dim
    pipe.load_ip_adapter(state, subfolder="", weight_name="", image_encoder_folder=None)
    processors = [
        p for p in pipe.unet.attn_processors.values() if isinstance(p, IPAdapterAttnProcessor2_0)
    ]
    assert len(processors) == 16
    assert sum(n_params(p) for p in processors) == 19_169_280
    assert n_params(pipe.unet.encoder_hid_proj) == 3_150_336
    assert 19_169_280 + 3_150_336 == 22_319_616


#: The image encoders of h94/IP-Adapter (``models/image_encoder/config.json``, OpenCLIP
#: ViT-H/14, and ``sdxl_models/image_encoder/config.json``, OpenCLIP ViT-bigG/14): the
#: published config keys; the model card gives 632.08M and 1844.9M parameters.
IP_IMAGE_ENCODERS = {
    "ViT-H/14": dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                     num_attention_heads=16, projection_dim=1024),
    "ViT-bigG/14": dict(hidden_size=1664, intermediate_size=8192, num_hidden_layers=48,
                        num_attention_heads=16, projection_dim=1280),
}  # fmt: skip


def test_ip_adapter_image_encoders_dwarf_the_adapter():
    """Built on the meta device from their published configs, IP-Adapter's image encoders (`CLIPVisionModelWithProjection`) have 632,076,800 parameters (OpenCLIP ViT-H/14, used with SD 1.5 and by the `_vit-h` SDXL adapters) and 1,844,907,264 (ViT-bigG/14, used by `ip-adapter_sdxl`): over 30 times the SD 1.5 adapter's 19,169,280 `to_k_ip` / `to_v_ip` weights."""
    counts = {}
    for name, keys in IP_IMAGE_ENCODERS.items():
        config = CLIPVisionConfig(
            image_size=224, patch_size=14, hidden_act="gelu", layer_norm_eps=1e-5, **keys
        )
        with torch.device("meta"):
            counts[name] = n_params(CLIPVisionModelWithProjection(config))
    assert counts == {"ViT-H/14": 632_076_800, "ViT-bigG/14": 1_844_907_264}
    assert counts["ViT-H/14"] > 30 * 19_169_280


# ---------------------------------------------------------------- T2I-Adapter and combinations


def test_t2i_adapter_runs_once_per_call():
    """`StableDiffusionAdapterPipeline` runs its `T2IAdapter` once per call, before the loop, scales its features by `adapter_conditioning_scale`, and passes copies of them to every UNet call as `down_intrablock_additional_residuals`; with its default (SD 1.x) config a `T2IAdapter` has 77,369,280 parameters."""
    torch.manual_seed(0)
    adapter = T2IAdapter(
        in_channels=3, channels=[32, 64], num_res_blocks=1, downscale_factor=2
    ).eval()
    pipe = StableDiffusionAdapterPipeline(
        vae=tiny_vae(),
        text_encoder=None,
        tokenizer=None,
        unet=tiny_unet(),
        adapter=adapter,
        scheduler=DDIMScheduler(set_alpha_to_one=False, **SD_BETAS),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    adapter_calls, seen = [], []
    adapter.register_forward_hook(lambda m, a, o: adapter_calls.append([f.clone() for f in o]))
    pipe.unet.register_forward_pre_hook(
        lambda m, a, k: seen.append([r.clone() for r in k["down_intrablock_additional_residuals"]]),
        with_kwargs=True,
    )
    run(pipe, steps=3, image=CONTROL_IMAGE, adapter_conditioning_scale=0.5)
    assert len(adapter_calls) == 1 and len(seen) == 3
    for residuals in seen:
        for feature, residual in zip(adapter_calls[0], residuals, strict=True):
            torch.testing.assert_close(residual, torch.cat([0.5 * feature] * 2))  # CFG: 2B
    with torch.device("meta"):
        assert n_params(T2IAdapter()) == 77_369_280


def test_lora_ip_adapter_and_controlnet_in_one_call():
    """In one `StableDiffusionControlNetPipeline` call, `load_lora_weights` and `load_ip_adapter` change only the UNet: the ControlNet keeps plain `nn.Linear` layers and default attention processors and is called without `image_embeds`, while every UNet call gets the LoRA layers, the image tokens and the ControlNet's residuals."""
    unet = tiny_unet()
    controlnet = tiny_controlnet(unet, trained=True)
    pipe = tiny_controlnet_pipeline(unet, controlnet, image_encoder=None)
    pipe.load_lora_weights(lora_state_dict(unet), adapter_name="style")
    pipe.load_ip_adapter(
        random_ip_adapter(unet), subfolder="", weight_name="", image_encoder_folder=None
    )
    assert not any(isinstance(m, LoraLinear) for m in controlnet.modules())
    assert all(type(p) is AttnProcessor2_0 for p in controlnet.attn_processors.values())
    assert any(isinstance(m, LoraLinear) for m in unet.modules())
    cn_calls, unet_calls = [], []
    controlnet.register_forward_pre_hook(lambda m, a, k: cn_calls.append(k), with_kwargs=True)
    unet.register_forward_pre_hook(lambda m, a, k: unet_calls.append(k), with_kwargs=True)
    image_embeds = torch.randn(2, 1, 16, generator=torch.Generator().manual_seed(4))
    run(pipe, steps=2, image=CONTROL_IMAGE, ip_adapter_image_embeds=[image_embeds])
    assert len(cn_calls) == len(unet_calls) == 2
    for cn_kwargs, unet_kwargs in zip(cn_calls, unet_calls, strict=True):
        assert "added_cond_kwargs" not in cn_kwargs
        assert unet_kwargs["added_cond_kwargs"]["image_embeds"][0].shape == (2, 1, 16)
        assert len(unet_kwargs["down_block_additional_residuals"]) == 4


# ---------------------------------------------------------------- LoRA: scale state and serving


def base_weights(unet):
    """Every LoRA layer's ``base_layer.weight``, cloned: what fusing writes into."""
    return {
        name: module.base_layer.weight.detach().clone()
        for name, module in unet.named_modules()
        if isinstance(module, LoraLinear)
    }


def test_fuse_lora_scale_compounds_across_refuses():
    """`fuse_lora(lora_scale=s)` multiplies each layer's `scaling` by `s` (peft's `scale_layer`) and never divides it back, so `fuse_lora(lora_scale=0.5)`, `unfuse_lora()`, `fuse_lora(lora_scale=0.8)` merges the delta at 0.4, not 0.8, and an unfused call after the first unfuse runs the branch at 0.5; `set_adapters(name, adapter_weights=w)` sets an absolute weight, so `set_adapters` then `fuse_lora()` fuses at exactly `w`."""
    pipe = lora_pipe("style")
    layer = first_projection(pipe.unet)
    start = layer.scaling["style"]
    original = layer.base_layer.weight.detach().clone()
    a, b = layer.lora_A["style"].weight.detach(), layer.lora_B["style"].weight.detach()
    unit = b @ a * start  # the delta at weight 1
    at = {w: predict(pipe.unet, cross_attention_kwargs={"scale": w}) for w in (0.4, 0.5, 0.8)}
    pipe.fuse_lora(components=["unet"], lora_scale=0.5)
    assert layer.scaling["style"] == 0.5 * start  # left scaled after fusing
    pipe.unfuse_lora(components=["unet"])
    assert layer.scaling["style"] == 0.5 * start  # and after unfusing
    torch.testing.assert_close(predict(pipe.unet), at[0.5], rtol=0, atol=1e-5)  # unfused: 0.5
    pipe.fuse_lora(components=["unet"], lora_scale=0.8)
    torch.testing.assert_close(layer.base_layer.weight, original + 0.4 * unit)
    torch.testing.assert_close(predict(pipe.unet), at[0.4], rtol=0, atol=1e-5)
    assert not torch.allclose(predict(pipe.unet), at[0.8], atol=1e-4)
    pipe.unfuse_lora(components=["unet"])
    pipe.set_adapters("style", adapter_weights=0.8)  # absolute: 0.8 * lora_alpha / r
    assert layer.scaling["style"] == 0.8 * start
    pipe.fuse_lora(components=["unet"])
    torch.testing.assert_close(layer.base_layer.weight, original + 0.8 * unit)
    torch.testing.assert_close(predict(pipe.unet), at[0.8], rtol=0, atol=1e-5)


def test_set_adapters_writes_no_weights():
    """`set_adapters` writes no weights: it sets which adapters are active and each layer's `scaling`, and every `base_layer.weight`, `lora_A` and `lora_B` stays bit-identical."""
    pipe = lora_pipe("a", "b")
    layer = first_projection(pipe.unet)
    before = {n: p.detach().clone() for n, p in pipe.unet.named_parameters()}
    scaling = dict(layer.scaling)
    pipe.set_adapters(["a", "b"], adapter_weights=[0.3, 0.9])
    after = dict(pipe.unet.named_parameters())
    assert before.keys() == after.keys()
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert layer.scaling == {"a": 0.3 * scaling["a"], "b": 0.9 * scaling["b"]}
    assert sorted(layer.active_adapters) == ["a", "b"]


def test_scale_zero_call_after_fuse_breaks_unfuse():
    """After `set_adapters(name, adapter_weights=w)` with `w != 1` and `fuse_lora()`, one call with `cross_attention_kwargs={"scale": 0}` resets `scaling` to `lora_alpha / r` (`unscale_lora_layers` with weight 0 calls peft's `set_scale(name, 1.0)`), so a later `unfuse_lora()` subtracts the weight-1 delta and the base weights are not restored."""
    pipe = lora_pipe("style")
    layer = first_projection(pipe.unet)
    start = layer.scaling["style"]
    original = base_weights(pipe.unet)
    a, b = layer.lora_A["style"].weight.detach(), layer.lora_B["style"].weight.detach()
    pipe.set_adapters("style", adapter_weights=0.5)
    pipe.fuse_lora(components=["unet"])
    fused = predict(pipe.unet)
    out = predict(pipe.unet, cross_attention_kwargs={"scale": 0.0})
    torch.testing.assert_close(out, fused, rtol=0, atol=1e-5)  # merged: the call changes nothing
    assert layer.scaling["style"] == start  # but the 0.5 is gone
    pipe.unfuse_lora(components=["unet"])
    torch.testing.assert_close(
        layer.base_layer.weight, original[next(iter(original))] - 0.5 * (b @ a) * start
    )
    restored = base_weights(pipe.unet)
    assert all(not torch.allclose(restored[n], original[n], atol=1e-4) for n in original)


def test_lora_without_alpha_keys_gets_alpha_equal_to_rank(tmp_path):
    """A LoRA file with neither alpha keys nor adapter metadata, loaded with `load_lora_weights` (here a local `.safetensors` file in PEFT's key layout), gets `lora_alpha = r` (diffusers' `get_peft_kwargs`), so its `scaling` is 1: `B @ A` is added as stored. A file written by `save_lora_weights(..., unet_lora_adapter_metadata=...)` also has no alpha keys, but its header's `lora_alpha` is used: rank 4 with `lora_alpha` 8 loads at `scaling` 2."""
    from safetensors.torch import save_file

    state = lora_state_dict(tiny_unet(), rank=4)
    save_file(state, tmp_path / "style.safetensors")
    pipe = tiny_sd_pipeline()
    pipe.load_lora_weights(str(tmp_path), weight_name="style.safetensors", adapter_name="style")
    config = pipe.unet.peft_config["style"]
    assert config.r == config.lora_alpha == 4
    layers = [m for m in pipe.unet.modules() if isinstance(m, LoraLinear)]
    assert len(layers) == 32 and all(m.scaling["style"] == 1.0 for m in layers)
    from diffusers import StableDiffusionPipeline
    from safetensors import safe_open

    metadata = {"r": 4, "lora_alpha": 8, "target_modules": list(PROJECTIONS)}
    StableDiffusionPipeline.save_lora_weights(
        tmp_path / "meta",
        unet_lora_layers={k.removeprefix("unet."): v for k, v in state.items()},
        unet_lora_adapter_metadata=metadata,
    )
    with safe_open(tmp_path / "meta" / "pytorch_lora_weights.safetensors", "pt") as f:
        assert not any("alpha" in key for key in f.keys())
    pipe = tiny_sd_pipeline()
    pipe.load_lora_weights(str(tmp_path / "meta"), adapter_name="style")
    config = pipe.unet.peft_config["style"]
    assert (config.r, config.lora_alpha) == (4, 8)
    assert first_projection(pipe.unet).scaling["style"] == 2.0


def test_hotswap_copies_same_or_smaller_ranks_in_place():
    """`load_lora_weights(..., adapter_name=..., hotswap=True)` copies a new LoRA of the same or a smaller rank into the loaded adapter's tensors and writes no base weight (here one rank for every layer, with the output of a fresh load); a larger rank writes no base weight either, but swaps in new, larger tensors."""
    plain = tiny_unet()
    for rank, in_place in [(2, True), (1, True), (4, False)]:  # the first LoRA has rank 2
        pipe = tiny_sd_pipeline()
        pipe.load_lora_weights(lora_state_dict(plain, rank=2), adapter_name="style")
        storage = {n: p.data_ptr() for n, p in pipe.unet.named_parameters() if ".lora_" in n}
        original = base_weights(pipe.unet)
        pipe.load_lora_weights(lora_state_dict(plain, rank=rank, seed=1), adapter_name="style",
                               hotswap=True)  # fmt: skip
        swapped = base_weights(pipe.unet)
        assert all(torch.equal(swapped[n], original[n]) for n in original)  # no base weight
        after = {n: p.data_ptr() for n, p in pipe.unet.named_parameters() if ".lora_" in n}
        assert after.keys() == storage.keys() and len(storage) == 64
        assert sum(after[n] == storage[n] for n in storage) == (64 if in_place else 0), rank
        fresh = tiny_sd_pipeline()
        fresh.load_lora_weights(lora_state_dict(plain, rank=rank, seed=1), adapter_name="style")
        torch.testing.assert_close(predict(pipe.unet), predict(fresh.unet), rtol=0, atol=1e-5)


def test_pipelines_sharing_a_unet_share_the_lora_and_ip_adapter_scale():
    """The active adapters and LoRA weights from `set_adapters`, the per-call `scale` (while the forward runs) and the IP-Adapter `scale` live on the UNet's own modules, so two `StableDiffusionPipeline` objects that share one UNet (as `from_pipe` builds them) share them too: switching the LoRA, `set_adapters` or `set_ip_adapter_scale` on one changes the other's output, and one pipeline object per request does not isolate requests."""
    from diffusers import StableDiffusionPipeline

    pipe = lora_pipe("style", "subject")
    pipe.set_adapters("style")  # the request before: one LoRA active
    pipe.load_ip_adapter(
        random_ip_adapter(pipe.unet), subfolder="", weight_name="", image_encoder_folder=None
    )
    other = StableDiffusionPipeline.from_pipe(pipe)
    assert other.unet is pipe.unet
    image_embeds = [torch.randn(2, 1, 16, generator=torch.Generator().manual_seed(4))]
    before = run(other, steps=1, ip_adapter_image_embeds=image_embeds)
    pipe.set_adapters("style", adapter_weights=0.2)  # on the first pipeline only
    after_lora = run(other, steps=1, ip_adapter_image_embeds=image_embeds)
    assert not torch.allclose(before, after_lora)
    during = []  # the call's scale is written on the shared module while it runs
    first_projection(pipe.unet).register_forward_pre_hook(
        lambda m, a: during.append(m.scaling["style"])
    )
    with torch.no_grad():  # a UNet call with a per-call scale, as the pipeline makes it
        pipe.unet(X, T, encoder_hidden_states=PROMPT, cross_attention_kwargs={"scale": 0.5},
                  added_cond_kwargs={"image_embeds": [image_embeds[0][1:]]})  # fmt: skip
    assert during[-1] == 0.5 * first_projection(other.unet).scaling["style"]
    pipe.set_ip_adapter_scale(0.0)
    after_ip = run(other, steps=1, ip_adapter_image_embeds=image_embeds)
    assert not torch.allclose(after_lora, after_ip)
    layer = first_projection(other.unet)
    assert layer.scaling["style"] == 0.2 * other.unet.peft_config["style"].lora_alpha / 2
    pipe.set_adapters("subject")  # another request switches LoRAs on the first pipeline
    assert layer.active_adapters == ["subject"]
    after_switch = run(other, steps=1, ip_adapter_image_embeds=image_embeds)
    assert not torch.allclose(after_ip, after_switch)


def test_controlnet_is_outside_the_model_offload_chain():
    """`StableDiffusionControlNetPipeline.model_cpu_offload_seq` is `"text_encoder->image_encoder->unet->vae"`: the ControlNet is not in the chain, so `enable_model_cpu_offload` gives it a hook of its own that no other component's forward offloads, and during the loop it stays on the GPU beside the UNet until the call ends (`maybe_free_model_hooks`)."""
    unet = tiny_unet()
    pipe = tiny_controlnet_pipeline(unet, tiny_controlnet(unet, trained=True))
    assert type(pipe).model_cpu_offload_seq == "text_encoder->image_encoder->unet->vae"
    assert "controlnet" not in pipe.model_cpu_offload_seq.split("->")
    assert "controlnet" not in pipe._exclude_from_cpu_offload
    pipe.enable_model_cpu_offload(device="cpu")  # accelerate's hooks; "cpu" stands in for cuda
    hooks = {type(h.model).__name__: h for h in pipe._all_hooks}
    assert hooks["ControlNetModel"].hook.prev_module_hook is None
    assert all(h.hook.prev_module_hook is not hooks["ControlNetModel"] for h in hooks.values())
    events = []

    def spy(name, offload):
        def recorded():
            events.append(f"offload {name}")
            return offload()

        return recorded

    for name, hook in hooks.items():
        hook.offload = spy(name, hook.offload)
    for module in (unet, pipe.controlnet):
        label = type(module).__name__
        module.register_forward_pre_hook(lambda m, a, label=label: events.append(label))
    pipe(prompt_embeds=PROMPT, negative_prompt_embeds=NEGATIVE, num_inference_steps=2,
         height=HEIGHT, width=WIDTH, image=CONTROL_IMAGE, output_type="latent")  # fmt: skip
    assert events == ["ControlNetModel", "UNet2DConditionModel"] * 2  # no offload in the loop
