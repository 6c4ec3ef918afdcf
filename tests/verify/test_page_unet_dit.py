"""The "UNet vs DiT" handbook section against the real diffusers classes.

Tiny random configs built here (no weights, no hub), and SD 1.5's full-size UNet config
on the meta device where only the structure is checked. Hooks record what each module
receives and returns; nothing is inferred from reading the source except where noted.
"""

from __future__ import annotations

import pytest
import torch
from tiny import (
    SD_SCHEDULER,
    meta_unet_self_attention,
    no_text_encoders,
    tiny_flux_transformer,
    tiny_sd3_pipeline,
    tiny_sd3_transformer,
    tiny_vae,
)


def unet(**overrides):
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    config = dict(
        sample_size=8,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        layers_per_block=1,
        attention_head_dim=4,
        cross_attention_dim=24,
        norm_num_groups=8,
    )
    config.update(overrides)
    return UNet2DConditionModel(**config).eval()


@pytest.fixture(scope="module")
def sdxl_like():
    """SDXL's published block types, layers per block and `text_time` addition, tiny widths."""
    from model_configs import SDXL_UNET

    model = unet(
        sample_size=16, block_out_channels=(32, 32, 64), attention_head_dim=(2, 2, 4),
        down_block_types=tuple(SDXL_UNET["down_block_types"]),
        up_block_types=tuple(SDXL_UNET["up_block_types"]),
        layers_per_block=SDXL_UNET["layers_per_block"], transformer_layers_per_block=(1, 2, 2),
        use_linear_projection=True, addition_embed_type=SDXL_UNET["addition_embed_type"],
        addition_time_embed_dim=8, projection_class_embeddings_input_dim=20 + 6 * 8,
    )  # fmt: skip
    added = {"text_embeds": torch.randn(1, 20), "time_ids": torch.tensor([[64.0] * 6])}
    return model, added


def sd3(num_layers=2):
    """``tiny_sd3_transformer`` with a 24-wide pooled input, ``num_layers`` joint blocks."""
    return tiny_sd3_transformer(pooled_projection_dim=24, num_layers=num_layers)


def output_of(module, store, key):
    return module.register_forward_hook(lambda m, a, o: store.__setitem__(key, o))


def test_sd15_unet_levels_channels_and_attention():
    """With SD 1.5's published config (on the meta device, at 512 px), the UNet has four levels of 320, 640, 1280 and 1280 channels; every down block but the last halves the side; the first three levels and the mid block carry transformer blocks (2 per down block, 3 per up block, 16 in all), each with 8 heads, and the largest self-attention runs over 4096 tokens, one per latent position."""
    from model_configs import SD15_UNET

    calls, model = meta_unet_self_attention(SD15_UNET, 64)
    assert tuple(model.config.block_out_channels) == (320, 640, 1280, 1280)
    assert [b.downsamplers is not None for b in model.down_blocks] == [True, True, True, False]
    per_down = [len(getattr(b, "attentions", [])) for b in model.down_blocks]
    per_up = [len(getattr(b, "attentions", [])) for b in model.up_blocks]
    assert per_down == [2, 2, 2, 0] and per_up == [0, 3, 3, 3]
    assert len(model.mid_block.attentions) == 1
    assert len(calls) == 16 and {heads for _, heads in calls} == {8}
    assert sorted({n for n, _ in calls}) == [64, 256, 1024, 4096]
    assert model.conv_in.in_channels == 4 and model.time_embedding.linear_2.out_features == 1280


def test_sdxl_unet_has_no_attention_at_its_first_level():
    """SDXL's UNet (its published config, on the meta device, at 1024 px) has three levels and no attention at the first (`DownBlock2D`): its largest self-attention runs over 4096 tokens at `H/16` with 10 heads of 64, its 70 transformer blocks (`transformer_layers_per_block=[1, 2, 10]`) sit at `H/16` and `H/32`, and `attention_head_dim=[5, 10, 20]` is again the head count per level."""
    from model_configs import SDXL_UNET

    calls, model = meta_unet_self_attention(SDXL_UNET, 128, text_embeds=(1, 1280), time_ids=(1, 6))
    assert type(model.down_blocks[0]).__name__ == "DownBlock2D"
    assert len(calls) == 70
    assert sorted(set(calls)) == [(1024, 20), (4096, 10)]  # (tokens, heads): H/32, H/16
    assert all(
        m.to_q.out_features // m.heads == 64
        for n, m in model.named_modules()
        if n.endswith("attn1")
    )


def test_unet_time_embedding_is_added_in_every_resnet(sdxl_like):
    """With SD 1.x's and SDXL's `resnet_time_scale_shift` (the default), a `UNet2DConditionModel` embeds the timestep once (`time_proj`, then `time_embedding`) and every `ResnetBlock2D` receives that same `emb` (with SDXL's `text_time`, plus `add_embedding`'s output) and adds `time_emb_proj(SiLU(emb))[:, :, None, None]` to its `conv1` output: one shift per channel, the same at every position (not with `"scale_shift"`, where `norm2` receives `conv1`'s output unchanged)."""
    from model_configs import SD15_UNET, SDXL_UNET

    assert "resnet_time_scale_shift" not in SD15_UNET and "resnet_time_scale_shift" not in SDXL_UNET
    model = unet()
    assert model.config.resnet_time_scale_shift == "default"
    seen, resnets = {}, [m for m in model.modules() if type(m).__name__ == "ResnetBlock2D"]
    handles = [output_of(model.time_embedding, seen, "emb")]
    temb_in, added = [], []
    for r in resnets:
        handles.append(
            r.register_forward_pre_hook(
                lambda m, a, k: temb_in.append(a[1] if len(a) > 1 else k["temb"]),
                with_kwargs=True,
            )
        )
        handles.append(output_of(r.conv1, seen, f"conv1-{id(r)}"))
        handles.append(output_of(r.time_emb_proj, seen, f"proj-{id(r)}"))
        handles.append(
            r.norm2.register_forward_pre_hook(
                lambda m, a, r=r: added.append((r, a[0])),
            )
        )
    with torch.no_grad():
        model(torch.randn(2, 4, 8, 8), 300, encoder_hidden_states=torch.randn(2, 77, 24))
    for h in handles:
        h.remove()
    assert len(temb_in) == len(resnets) > 4
    for t in temb_in:
        torch.testing.assert_close(t, seen["emb"])
    for r, norm2_in in added:
        proj = seen[f"proj-{id(r)}"]
        torch.testing.assert_close(norm2_in, seen[f"conv1-{id(r)}"] + proj[:, :, None, None])
    xl, added_cond_kwargs = sdxl_like  # SDXL: every resnet gets emb + add_embedding's output
    xl_resnets = [m for m in xl.modules() if type(m).__name__ == "ResnetBlock2D"]
    seen, temb_in, added = {}, [], []
    handles = [output_of(xl.time_embedding, seen, "emb"), output_of(xl.add_embedding, seen, "aug")]
    for r in xl_resnets:
        handles.append(r.register_forward_pre_hook(
            lambda m, a, k: temb_in.append(a[1] if len(a) > 1 else k["temb"]), with_kwargs=True
        ))  # fmt: skip
        handles.append(output_of(r.conv1, seen, f"conv1-{id(r)}"))
        handles.append(output_of(r.time_emb_proj, seen, f"proj-{id(r)}"))
        handles.append(r.norm2.register_forward_pre_hook(lambda m, a, r=r: added.append((r, a[0]))))
    with torch.no_grad():
        xl(torch.randn(1, 4, 16, 16), 300, encoder_hidden_states=torch.randn(1, 77, 24),
           added_cond_kwargs=added_cond_kwargs)  # fmt: skip
    for h in handles:
        h.remove()
    assert len(temb_in) == len(added) == len(xl_resnets) > 4
    for t in temb_in:
        torch.testing.assert_close(t, seen["emb"] + seen["aug"])
        assert not torch.allclose(t, seen["emb"])
    for r, norm2_in in added:
        proj = seen[f"proj-{id(r)}"]
        torch.testing.assert_close(norm2_in, seen[f"conv1-{id(r)}"] + proj[:, :, None, None])
    handles = []
    other, conv1, norm2 = unet(resnet_time_scale_shift="scale_shift"), [], []
    for r in [m for m in other.modules() if type(m).__name__ == "ResnetBlock2D"]:
        handles.append(r.conv1.register_forward_hook(lambda m, a, o: conv1.append(o)))
        handles.append(r.norm2.register_forward_pre_hook(lambda m, a: norm2.append(a[0])))
    with torch.no_grad():
        other(torch.randn(2, 4, 8, 8), 300, encoder_hidden_states=torch.randn(2, 77, 24))
    for h in handles:
        h.remove()
    assert len(conv1) == len(norm2) == len(resnets)
    assert all(torch.equal(a, b) for a, b in zip(conv1, norm2, strict=True))


def test_every_attn2_reads_the_same_prompt_embeds(sdxl_like):
    """In a UNet with SD 1.x's and SDXL's configs (no `encoder_hid_dim`), every `attn2` receives the same, unchanged `encoder_hidden_states` that the UNet was called with: the prompt is never updated. SDXL's first level has no `attn2`, so no query there reads it. Not every `UNet2DConditionModel`: with `encoder_hid_dim` set (`encoder_hid_dim_type="text_proj"`), every `attn2` reads `encoder_hid_proj`'s output instead."""
    from model_configs import SD15_UNET, SDXL_UNET

    assert "encoder_hid_dim" not in SD15_UNET and "encoder_hid_dim" not in SDXL_UNET
    model = unet()
    assert model.config.encoder_hid_dim is None
    prompt_embeds = torch.randn(1, 77, 24)
    got = []
    handles = [
        m.register_forward_pre_hook(
            lambda m, a, k: got.append(k["encoder_hidden_states"]), with_kwargs=True
        )
        for n, m in model.named_modules()
        if n.endswith("attn2")
    ]
    with torch.no_grad():
        model(torch.randn(1, 4, 8, 8), 10, encoder_hidden_states=prompt_embeds)
    for h in handles:
        h.remove()
    assert len(got) == 4  # 1 down + 1 mid + 2 up transformer blocks
    assert all(torch.equal(g, prompt_embeds) for g in got)
    xl, added_cond_kwargs = sdxl_like
    got, queries = [], []
    handles = [
        m.register_forward_pre_hook(
            lambda m, a, k: got.append(k["encoder_hidden_states"]) or queries.append(a[0].shape[1]),
            with_kwargs=True,
        )
        for n, m in xl.named_modules()
        if n.endswith("attn2")
    ]
    with torch.no_grad():
        xl(torch.randn(1, 4, 16, 16), 10, encoder_hidden_states=prompt_embeds,
           added_cond_kwargs=added_cond_kwargs)  # fmt: skip
    for h in handles:
        h.remove()
    assert len(got) == 22 and all(torch.equal(g, prompt_embeds) for g in got)
    assert sorted(set(queries)) == [4 * 4, 8 * 8]  # H/16 and H/32: none of level 1's 16 x 16
    projected = unet(encoder_hid_dim=40, encoder_hid_dim_type="text_proj")
    got, seen = [], {}
    handles = [output_of(projected.encoder_hid_proj, seen, "proj")] + [
        m.register_forward_pre_hook(
            lambda m, a, k: got.append(k["encoder_hidden_states"]), with_kwargs=True
        )
        for n, m in projected.named_modules()
        if n.endswith("attn2")
    ]
    wide = torch.randn(1, 77, 40)
    with torch.no_grad():
        projected(torch.randn(1, 4, 8, 8), 10, encoder_hidden_states=wide)
    for h in handles:
        h.remove()
    assert len(got) == 4 and all(g is seen["proj"] for g in got)  # not the prompt it was given
    assert seen["proj"].shape == (1, 77, 24) != wide.shape


def test_sdxl_pooled_text_and_time_ids_join_the_time_embedding():
    """With `addition_embed_type="text_time"` (SDXL), the UNet requires `added_cond_kwargs` with `text_embeds` (pooled text) and `time_ids`; it embeds `time_ids` with sinusoids, concatenates them to `text_embeds`, projects with `add_embedding`, and adds the result to the time embedding that the ResNet blocks receive."""
    model = unet(
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=20 + 6 * 8,
    )
    x, t, hidden = torch.randn(1, 4, 8, 8), 400, torch.randn(1, 77, 24)
    added_cond_kwargs = {"text_embeds": torch.randn(1, 20), "time_ids": torch.tensor([[64.0] * 6])}
    with pytest.raises(ValueError, match="text_embeds"):
        model(x, t, encoder_hidden_states=hidden, added_cond_kwargs={})
    with pytest.raises(ValueError, match="time_ids"):  # pooled text alone is not enough
        model(x, t, encoder_hidden_states=hidden,
              added_cond_kwargs={"text_embeds": added_cond_kwargs["text_embeds"]})  # fmt: skip
    seen, temb = {}, []
    handles = [
        output_of(model.time_embedding, seen, "emb"),
        output_of(model.add_embedding, seen, "aug"),
        model.add_embedding.register_forward_pre_hook(lambda m, a: seen.__setitem__("in", a[0])),
        model.down_blocks[0]
        .resnets[0]
        .register_forward_pre_hook(
            lambda m, a, k: temb.append(a[1] if len(a) > 1 else k["temb"]), with_kwargs=True
        ),
    ]
    with torch.no_grad():
        model(x, t, encoder_hidden_states=hidden, added_cond_kwargs=added_cond_kwargs)
    for h in handles:
        h.remove()
    from diffusers.models.embeddings import get_timestep_embedding

    sinusoids = get_timestep_embedding(  # time_ids through sinusoids, after the pooled text
        added_cond_kwargs["time_ids"].flatten(), 8, flip_sin_to_cos=model.config.flip_sin_to_cos,
        downscale_freq_shift=model.config.freq_shift,
    ).reshape(1, -1)  # fmt: skip
    assert sinusoids.shape == (1, 6 * 8)
    torch.testing.assert_close(
        seen["in"], torch.cat([added_cond_kwargs["text_embeds"], sinusoids], dim=-1)
    )
    torch.testing.assert_close(temb[0], seen["emb"] + seen["aug"])


def test_sd3_pooled_projections_join_the_timestep_and_text_is_projected():
    """In `SD3Transformer2DModel`, the conditioning vector `temb` is the timestep embedding plus a projection of `pooled_projections` (`time_text_embed`), and `encoder_hidden_states` of width `joint_attention_dim` is projected by `context_embedder` to the transformer width before the first block."""
    model = sd3()
    seen, first = {}, []
    handles = [
        output_of(model.time_text_embed, seen, "temb"),
        output_of(model.context_embedder, seen, "context"),
        model.transformer_blocks[0].register_forward_pre_hook(
            lambda m, a, k: first.append(k), with_kwargs=True
        ),
    ]
    t, pooled = torch.tensor([500]), torch.randn(1, 24)
    with torch.no_grad():
        model(
            hidden_states=torch.randn(1, 4, 8, 8),
            encoder_hidden_states=torch.randn(1, 10, 32),
            pooled_projections=pooled,
            timestep=t,
        )
        emb = model.time_text_embed
        expected = emb.timestep_embedder(emb.time_proj(t)) + emb.text_embedder(pooled)
    for h in handles:
        h.remove()
    torch.testing.assert_close(seen["temb"], expected)
    assert seen["context"].shape == (1, 10, 16)  # (B, T_txt, caption_projection_dim)
    torch.testing.assert_close(first[0]["temb"], seen["temb"])
    torch.testing.assert_close(first[0]["encoder_hidden_states"], seen["context"])


def test_sd3_updates_the_text_tokens_block_by_block(monkeypatch):
    """In SD3, each `JointTransformerBlock` attends over `T_img + T_txt` tokens and returns new text tokens that the next block receives, unlike a UNet's `attn2`; the last block is `context_pre_only` and updates only the image tokens, and its text stream's norm (`AdaLayerNormContinuous`) returns no gate: adaLN-Zero drives its image stream only."""
    import torch.nn.functional as F  # noqa: N812

    model = sd3(num_layers=3)
    sdpa, shapes, received = F.scaled_dot_product_attention, [], []

    def recording(query, key, value, *args, **kwargs):
        shapes.append(tuple(query.shape))
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    handles = [
        b.register_forward_pre_hook(
            lambda m, a, k: received.append(k["encoder_hidden_states"]), with_kwargs=True
        )
        for b in model.transformer_blocks
    ]
    context_norm = []  # what each block's text-stream norm returns in the forward
    handles += [
        b.norm1_context.register_forward_hook(lambda m, a, k, o: context_norm.append(o),
                                              with_kwargs=True)
        for b in model.transformer_blocks
    ]  # fmt: skip
    with torch.no_grad():
        model(
            hidden_states=torch.randn(1, 4, 8, 8),
            encoder_hidden_states=torch.randn(1, 10, 32),
            pooled_projections=torch.randn(1, 24),
            timestep=torch.tensor([500]),
        )
    for h in handles:
        h.remove()
    assert shapes == [(1, 2, 16 + 10, 8)] * 3  # (B, heads, T_img + T_txt, head_dim)
    assert not torch.allclose(received[0], received[1])
    assert not torch.allclose(received[1], received[2])
    flags = [b.context_pre_only for b in model.transformer_blocks]
    assert flags == [False, False, True]
    assert [isinstance(o, tuple) and len(o) == 5 for o in context_norm] == [True, True, False]
    assert isinstance(context_norm[2], torch.Tensor)  # normalised text only: no shift, gate
    assert type(model.transformer_blocks[-1].norm1_context).__name__ == "AdaLayerNormContinuous"
    last = model.transformer_blocks[-1]
    with torch.no_grad():
        text_out, _ = last(hidden_states=torch.randn(1, 16, 16), encoder_hidden_states=received[2],
                           temb=torch.randn(1, 16))  # fmt: skip
    assert text_out is None  # the last block returns image tokens only


def test_dit_conditions_on_timestep_plus_class_label():
    """`DiTTransformer2DModel` has no text input: in its forward, each block's `AdaLayerNormZero` regresses its shift, scale and gate from the sum of a timestep embedding and a class-label embedding (`CombinedTimestepLabelEmbeddings`)."""
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    model = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=2, sample_size=8,
        num_embeds_ada_norm=10,
    ).eval()  # fmt: skip
    t, labels = torch.tensor([3, 700]), torch.tensor([1, 9])
    with pytest.raises(TypeError, match="encoder_hidden_states"):  # the forward takes no text
        model(torch.randn(2, 4, 8, 8), timestep=t, class_labels=labels,
              encoder_hidden_states=torch.randn(2, 5, 16))  # fmt: skip
    into_linear = []
    handles = [
        b.norm1.linear.register_forward_pre_hook(lambda m, a: into_linear.append(a[0]))
        for b in model.transformer_blocks
    ]
    with torch.no_grad():
        model(torch.randn(2, 4, 8, 8), timestep=t, class_labels=labels)
        embs = [b.norm1.emb for b in model.transformer_blocks]  # each block has its own
        expected = [e.timestep_embedder(e.time_proj(t)) + e.class_embedder(labels) for e in embs]
    for h in handles:
        h.remove()
    assert {type(e).__name__ for e in embs} == {"CombinedTimestepLabelEmbeddings"}
    assert len(into_linear) == 2
    for got, want in zip(into_linear, expected, strict=True):  # Linear(SiLU(t emb + class emb))
        torch.testing.assert_close(got, torch.nn.functional.silu(want))


def test_adaln_zero_gates_are_random_in_dit_sd3_and_flux():
    """`DiTTransformer2DModel`, `SD3Transformer2DModel` and `FluxTransformer2DModel` leave adaLN-Zero's modulation Linear (`norm1.linear`) at PyTorch's default random init (nonzero, within `nn.Linear`'s bound `1/sqrt(in_features)`), so in these three the zero-gate identity holds only where training code zeroes it."""
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    dit = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=2, sample_size=8,
        num_embeds_ada_norm=10,
    )  # fmt: skip
    for model in (dit, sd3(), tiny_flux()):
        for block in model.transformer_blocks:
            assert type(block.norm1).__name__ == "AdaLayerNormZero"
            linear, bound = block.norm1.linear, block.norm1.linear.in_features**-0.5
            for w in (linear.weight, linear.bias):  # nn.Linear's default: U(-bound, bound)
                assert 0.9 * bound < w.abs().max() <= bound


def tiny_flux():
    """``tiny_flux_transformer`` without guidance embedding, pooled width 24."""
    return tiny_flux_transformer(False, pooled_projection_dim=24, axes_dims_rope=(4, 6, 6))


def run_tiny_flux(model, n_txt=10, n_img=16):
    return model(
        hidden_states=torch.randn(1, n_img, 64),  # packed latents (B, N, 64)
        encoder_hidden_states=torch.randn(1, n_txt, 32),
        pooled_projections=torch.randn(1, 24),
        timestep=torch.tensor([0.5]),
        img_ids=torch.zeros(n_img, 3),
        txt_ids=torch.zeros(n_txt, 3),
    )


def test_flux_puts_text_tokens_first(monkeypatch):
    """In a tiny `FluxTransformer2DModel`, the double-stream block's attention runs over the text tokens' values followed by the image tokens', and the single-stream block normalises the concatenation text-then-image, the opposite order to SD3's joint attention."""
    from diffusers.models.transformers import transformer_flux

    model = tiny_flux()
    attn = model.transformer_blocks[0].attn
    dispatch, values, proj, single_in = transformer_flux.dispatch_attention_fn, [], {}, {}

    def recording(query, key, value, *args, **kwargs):
        values.append(value)
        return dispatch(query, key, value, *args, **kwargs)

    monkeypatch.setattr(transformer_flux, "dispatch_attention_fn", recording)
    single = model.single_transformer_blocks[0]
    handles = [
        attn.to_v.register_forward_hook(lambda m, a, o: proj.__setitem__("img", o)),
        attn.add_v_proj.register_forward_hook(lambda m, a, o: proj.__setitem__("txt", o)),
        single.register_forward_pre_hook(
            lambda m, a, k: single_in.update(k, args=a), with_kwargs=True
        ),
        single.norm.register_forward_pre_hook(lambda m, a: single_in.__setitem__("x", a[0])),
    ]
    with torch.no_grad():
        run_tiny_flux(model)
    for h in handles:
        h.remove()
    joint_v = values[0].flatten(2)  # (B, T_txt + T_img, heads * d)
    torch.testing.assert_close(joint_v[:, :10], proj["txt"])  # text first
    torch.testing.assert_close(joint_v[:, 10:], proj["img"])
    txt = single_in.get(
        "encoder_hidden_states", single_in["args"][1] if len(single_in["args"]) > 1 else None
    )
    img = single_in.get("hidden_states", single_in["args"][0] if single_in["args"] else None)
    torch.testing.assert_close(single_in["x"], torch.cat([txt, img], dim=1))


def test_flux_dev_has_double_and_single_stream_blocks():
    """Flux.1-dev's transformer (its published config, on the meta device) takes packed latents 64 wide (`x_embedder`) and is not SD3's MMDiT: 19 double-stream blocks (`AdaLayerNormZero`, 6 modulation vectors per stream) then 38 single-stream blocks (`AdaLayerNormZeroSingle`, 3 vectors: shift, scale, gate, with attention and MLP in parallel on one text-plus-image sequence), and a guidance embedder (`guidance_embeds=True`) in its `time_text_embed`."""
    from diffusers import FluxTransformer2DModel
    from model_configs import FLUX_DEV_TRANSFORMER

    with torch.device("meta"):
        model = FluxTransformer2DModel(**FLUX_DEV_TRANSFORMER)
    dim = 24 * 128
    assert model.x_embedder.in_features == 64
    assert len(model.transformer_blocks) == 19 and len(model.single_transformer_blocks) == 38
    for block in model.transformer_blocks:
        assert (
            type(block.norm1).__name__ == type(block.norm1_context).__name__ == "AdaLayerNormZero"
        )
        assert block.norm1.linear.out_features == 6 * dim
    for block in model.single_transformer_blocks:
        assert type(block.norm).__name__ == "AdaLayerNormZeroSingle"
        assert block.norm.linear.out_features == 3 * dim
    assert type(model.time_text_embed).__name__ == "CombinedTimestepGuidanceTextProjEmbeddings"
    assert model.time_text_embed.guidance_embedder.linear_2.out_features == dim


def test_flux_dev_adds_the_guidance_embedding_to_the_timestep_one():
    """In a forward of a tiny `FluxTransformer2DModel` with `guidance_embeds=True` (Flux.1-dev's setting), the conditioning vector `temb` that every block receives is the timestep embedding plus the guidance embedding (each from sinusoids of 1000 times its input) plus the projected pooled text, and another `guidance` changes it."""
    from tiny import tiny_flux_transformer

    model = tiny_flux_transformer()  # guidance_embeds=True
    emb, temb = model.time_text_embed, []
    blocks = [*model.transformer_blocks, *model.single_transformer_blocks]
    for block in blocks:  # double- and single-stream
        block.register_forward_pre_hook(lambda m, a, k: temb.append(k["temb"]), with_kwargs=True)
    g = torch.Generator().manual_seed(0)
    n_img, n_txt = 16, 4
    inputs = dict(
        hidden_states=torch.randn(1, n_img, 64, generator=g),
        encoder_hidden_states=torch.randn(1, n_txt, model.config.joint_attention_dim, generator=g),
        pooled_projections=torch.randn(1, model.config.pooled_projection_dim, generator=g),
        timestep=torch.tensor([0.5]), img_ids=torch.zeros(n_img, 3), txt_ids=torch.zeros(n_txt, 3),
    )  # fmt: skip
    with torch.no_grad():
        for guidance in (3.5, 1.0):
            model(**inputs, guidance=torch.tensor([guidance]))
        expected = (
            emb.timestep_embedder(emb.time_proj(torch.tensor([500.0])))
            + emb.guidance_embedder(emb.time_proj(torch.tensor([3500.0])))
            + emb.text_embedder(inputs["pooled_projections"])
        )
    first, second = temb[: len(blocks)], temb[len(blocks) :]
    assert len(first) == len(second) == len(blocks) >= 2
    for got in first:
        torch.testing.assert_close(got, expected)
    assert not torch.allclose(first[0], second[0])


def test_flux_single_stream_block_runs_attention_and_mlp_side_by_side():
    """In a forward of a tiny `FluxTransformer2DModel`, its single-stream block (`FluxSingleTransformerBlock`) feeds the same `AdaLayerNormZeroSingle` output to its attention and to its MLP's first projection (`proj_mlp`), and `proj_out` takes their two outputs concatenated along the feature axis: attention and MLP in parallel, not one after the other."""
    from tiny import tiny_flux_transformer

    model = tiny_flux_transformer()
    block = model.single_transformer_blocks[0]
    seen = {}
    hooks = [
        block.norm.register_forward_hook(lambda m, a, out: seen.__setitem__("norm", out[0])),
        block.attn.register_forward_hook(
            lambda m, a, kw, out: seen.update(attn_in=kw["hidden_states"], attn_out=out),
            with_kwargs=True,
        ),
        block.proj_mlp.register_forward_hook(
            lambda m, a, out: seen.update(mlp_in=a[0], mlp_out=out)
        ),
        block.proj_out.register_forward_hook(lambda m, a, out: seen.__setitem__("out_in", a[0])),
    ]
    g = torch.Generator().manual_seed(0)
    n_img, n_txt = 16, 4
    with torch.no_grad():
        model(hidden_states=torch.randn(1, n_img, 64, generator=g),
              encoder_hidden_states=torch.randn(1, n_txt, model.config.joint_attention_dim, generator=g),
              pooled_projections=torch.randn(1, model.config.pooled_projection_dim, generator=g),
              timestep=torch.tensor([0.5]), guidance=torch.tensor([3.5]),
              img_ids=torch.zeros(n_img, 3), txt_ids=torch.zeros(n_txt, 3))  # fmt: skip
    for hook in hooks:
        hook.remove()
    assert seen["attn_in"] is seen["norm"] and seen["mlp_in"] is seen["norm"]
    expected = torch.cat([seen["attn_out"], block.act_mlp(seen["mlp_out"])], dim=2)
    assert torch.equal(seen["out_in"], expected)


def test_text_sequence_lengths_of_sd3_and_flux():
    """With stand-in text encoders (each CLIP giving 77 tokens, its tokenizer's length), `StableDiffusion3Pipeline.__call__` asks T5 for `max_sequence_length=256` tokens by default, joins the two CLIP outputs along the feature axis, zero-pads them to T5's width, and puts the T5 tokens after them, so its transformer receives 77 + 256 = 333 text tokens; `FluxPipeline.__call__` asks T5 for 512 by default and passes those alone."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    transformer = tiny_sd3_transformer(joint_attention_dim=64, pooled_projection_dim=24)
    pipe = tiny_sd3_pipeline(transformer=transformer)
    # stand-ins (no weights here): CLIP-L of width 16 filled with 1, CLIP-G of width 24
    # filled with 2 (pooled 12 + 12), T5 of width 64 filled with 3, as many tokens as asked
    asked = []
    pipe._get_clip_prompt_embeds = lambda prompt, clip_model_index=0, **k: (
        torch.full((1, 77, (16, 24)[clip_model_index]), 1.0 + clip_model_index),
        torch.zeros(1, 12),
    )
    pipe._get_t5_prompt_embeds = lambda prompt, max_sequence_length, **k: (
        asked.append(max_sequence_length) or torch.full((1, max_sequence_length, 64), 3.0)
    )
    received = []
    handle = pipe.transformer.register_forward_pre_hook(
        lambda m, a, k: received.append(k["encoder_hidden_states"]), with_kwargs=True
    )
    pipe(prompt="a cat", num_inference_steps=1, guidance_scale=1.0, height=16, width=16,
         output_type="latent")  # fmt: skip
    handle.remove()
    (text,) = received
    assert asked == [256] and text.shape == (1, 77 + 256, 64)
    assert (text[:, :77, :16] == 1).all() and (text[:, :77, 16:40] == 2).all()
    assert (text[:, :77, 40:] == 0).all() and (text[:, 77:] == 3).all()

    flux = FluxPipeline(
        transformer=tiny_flux(), vae=tiny_vae(), scheduler=FlowMatchEulerDiscreteScheduler(),
        **no_text_encoders(2),
    )  # fmt: skip
    flux.set_progress_bar_config(disable=True)
    asked.clear(), received.clear()
    flux._get_clip_prompt_embeds = lambda prompt, **k: torch.zeros(1, 24)  # pooled only
    flux._get_t5_prompt_embeds = lambda prompt, max_sequence_length, **k: (
        asked.append(max_sequence_length) or torch.full((1, max_sequence_length, 32), 3.0)
    )
    handle = flux.transformer.register_forward_pre_hook(
        lambda m, a, k: received.append(k["encoder_hidden_states"]), with_kwargs=True
    )
    flux(prompt="a cat", num_inference_steps=1, guidance_scale=1.0, height=16, width=16,
         output_type="latent")  # fmt: skip
    handle.remove()
    assert asked == [512] and received[0].shape == (1, 512, 32) and (received[0] == 3).all()


def test_flux_packs_2x2_patches_and_uses_rotary_positions():
    """Flux's transformer defaults to `patch_size=1` and `in_channels=64`, because `FluxPipeline._pack_latents` already turns `(B, 16, h, w)` latents into `(B, (h/2)*(w/2), 64)` tokens; it encodes positions by rotating every query and key with `FluxPosEmbed`'s output and adds no position table, while DiT's and SD3's `PatchEmbed` adds a 2D sin-cos table it builds to the projected patches in its forward (SD3: the table's centre crop; not a parameter)."""
    from diffusers import DiTTransformer2DModel, FluxPipeline, FluxTransformer2DModel
    from diffusers.models.embeddings import get_2d_sincos_pos_embed

    with torch.device("meta"):
        default = FluxTransformer2DModel()  # every argument at its default: Flux.1's layout
    assert default.config.patch_size == 1 and default.x_embedder.in_features == 64
    assert FluxPipeline._pack_latents(torch.randn(1, 16, 8, 8), 1, 16, 8, 8).shape == (1, 16, 64)
    torch.manual_seed(0)
    flux = FluxTransformer2DModel(
        num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=24, axes_dims_rope=(4, 6, 6),
    )  # fmt: skip
    from diffusers.models.transformers import transformer_flux

    rotated, rotate = [], transformer_flux.apply_rotary_emb
    pos_out, embedded, first_in = [], [], []
    flux.pos_embed.register_forward_hook(lambda m, a, o: pos_out.append(o))
    flux.x_embedder.register_forward_hook(lambda m, a, o: embedded.append(a[0]))
    flux.transformer_blocks[0].register_forward_pre_hook(
        lambda m, a, k: first_in.append(k.get("hidden_states", a[0] if a else None)),
        with_kwargs=True,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transformer_flux, "apply_rotary_emb",
                   lambda x, emb, **k: rotated.append(emb) or rotate(x, emb, **k))  # fmt: skip
        with torch.no_grad():
            run_tiny_flux(flux)
    assert len(pos_out) == 1 and len(rotated) == 4  # queries and keys, in both blocks
    assert all(emb[0] is pos_out[0][0] and emb[1] is pos_out[0][1] for emb in rotated)
    projected = torch.nn.functional.linear(
        embedded[0], flux.x_embedder.weight, flux.x_embedder.bias
    )
    torch.testing.assert_close(first_in[0], projected)  # the Linear alone: no position table
    dit = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=1, sample_size=8,
        num_embeds_ada_norm=10,
    )  # fmt: skip
    for patch_embed in (dit.pos_embed, sd3().pos_embed):
        table = patch_embed.pos_embed
        assert "pos_embed" not in dict(patch_embed.named_parameters())  # a buffer: not learned
        grid = int(table.shape[1] ** 0.5)
        expected = get_2d_sincos_pos_embed(
            table.shape[-1], grid, base_size=patch_embed.base_size,
            interpolation_scale=patch_embed.interpolation_scale, output_type="pt",
        )  # fmt: skip
        torch.testing.assert_close(table[0], expected.float())
        latents = torch.randn(1, 4, 8, 8)  # a 4 x 4 patch grid
        with torch.no_grad():
            tokens = patch_embed(latents)
            projected = patch_embed.proj(latents).flatten(2).transpose(1, 2)
        side = grid // 2 - 2  # the centre 4 x 4 of the table (DiT's is 4 x 4 already)
        crop = table.reshape(1, grid, grid, -1)[:, side : side + 4, side : side + 4]
        torch.testing.assert_close(tokens, projected + crop.reshape(1, 16, -1))
        assert not torch.allclose(tokens, projected, atol=1e-3)  # the table is added


def test_dit_pipeline_steps_on_the_first_c_of_2c_channels():
    """With `out_channels = 2C` (DiT-XL/2's learned variance), `DiTPipeline.__call__` hands `scheduler.step` only the first `C` channels of the transformer's output, the noise prediction, and its latents keep `C` channels."""
    from diffusers import DDIMScheduler, DiTPipeline, DiTTransformer2DModel

    torch.manual_seed(0)
    transformer = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
        num_layers=1, sample_size=8, num_embeds_ada_norm=10,
    ).eval()  # fmt: skip
    pipe = DiTPipeline(
        transformer=transformer, vae=tiny_vae(), scheduler=DDIMScheduler(**SD_SCHEDULER)
    )
    pipe.set_progress_bar_config(disable=True)
    predicted, stepped, step = [], [], pipe.scheduler.step
    handle = transformer.register_forward_hook(lambda m, a, out: predicted.append(out.sample))
    pipe.scheduler.step = lambda out, t, x, **k: stepped.append(out) or step(out, t, x, **k)
    image = pipe(class_labels=[3], guidance_scale=1.0, num_inference_steps=2, output_type="pt")
    handle.remove()
    assert len(predicted) == len(stepped) == 2
    for full, used in zip(predicted, stepped, strict=True):
        assert full.shape == (1, 8, 8, 8) and used.shape == (1, 4, 8, 8)
        torch.testing.assert_close(used, full[:, :4])
    assert image.images.shape == (1, 3, 16, 16)  # the tiny VAE: f = 2


@pytest.mark.parametrize("pipeline", ["PixArtAlphaPipeline", "PixArtSigmaPipeline"])
def test_pixart_also_returns_2c_channels_and_its_pipelines_drop_the_variance(pipeline):
    """DiT-XL/2 is not the only one: `PixArtTransformer2DModel` defaults to `out_channels=8` for 4 latent channels (PixArt's learned variance), so the transformer returns `2C` channels, and `PixArtAlphaPipeline.__call__` and `PixArtSigmaPipeline.__call__` hand `scheduler.step` only the first `C`; the prompt reaches the transformer only as `encoder_hidden_states`, with no pooled text among its inputs, and every block's cross-attention `attn2` reads it after `caption_projection`."""
    import diffusers
    from diffusers import DDIMScheduler, PixArtTransformer2DModel

    torch.manual_seed(0)
    transformer = PixArtTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=2, sample_size=8,
        caption_channels=32, cross_attention_dim=16,
    ).eval()  # out_channels left at its default  # fmt: skip
    assert transformer.config.out_channels == 8
    pipe = getattr(diffusers, pipeline)(
        tokenizer=None, text_encoder=None, vae=tiny_vae(), transformer=transformer,
        scheduler=DDIMScheduler(**SD_SCHEDULER),
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    predicted, stepped, step = [], [], pipe.scheduler.step
    handle = transformer.register_forward_hook(lambda m, a, out: predicted.append(out[0]))
    pipe.scheduler.step = lambda out, t, x, **k: stepped.append(out) or step(out, t, x, **k)
    inputs, projected, read = [], [], []
    hooks = [
        transformer.register_forward_pre_hook(lambda m, a, k: inputs.append(k), with_kwargs=True),
        transformer.caption_projection.register_forward_hook(lambda m, a, o: projected.append(o)),
        *[b.attn2.register_forward_pre_hook(
            lambda m, a, k: read.append(k["encoder_hidden_states"]), with_kwargs=True
        ) for b in transformer.transformer_blocks],
    ]  # fmt: skip
    with torch.no_grad():
        latents = pipe(prompt_embeds=torch.randn(1, 5, 32), prompt_attention_mask=torch.ones(1, 5),
                       num_inference_steps=2, height=16, width=16, guidance_scale=1.0,
                       use_resolution_binning=False, output_type="latent").images  # fmt: skip
    for h in [handle, *hooks]:
        h.remove()
    assert len(inputs) == len(projected) == 2 and len(read) == 4  # two steps, two blocks
    for kwargs in inputs:  # the prompt comes in as encoder_hidden_states only: no pooled text
        assert set(kwargs) == {"encoder_hidden_states", "encoder_attention_mask", "timestep",
                               "added_cond_kwargs", "return_dict"}  # fmt: skip
        assert set(kwargs["added_cond_kwargs"]) <= {"resolution", "aspect_ratio"}
    for i, got in enumerate(read):  # both blocks of each call read that call's projection
        torch.testing.assert_close(got, projected[i // 2])
    assert len(predicted) == len(stepped) == 2
    for full, used in zip(predicted, stepped, strict=True):
        assert full.shape == (1, 8, 8, 8) and used.shape == (1, 4, 8, 8)
        torch.testing.assert_close(used, full[:, :4])
    assert latents.shape == (1, 4, 8, 8)


def test_flux_pack_and_unpack_latents_are_exact_inverses():
    """`FluxPipeline._pack_latents` turns latents `(B, 16, h, w)` into `(B, (h/2)(w/2), 64)` tokens, row by row, each holding one 2 x 2 patch ordered (channel, row, column); `_unpack_latents(packed, H, W, vae_scale_factor)` gives back `(B, 16, H/8, W/8)` exactly."""
    from diffusers import FluxPipeline

    latents = torch.randn(2, 16, 6, 8)  # (B, C, H/8, W/8) for a 48 x 64 px image
    packed = FluxPipeline._pack_latents(latents, 2, 16, 6, 8)
    assert packed.shape == (2, 3 * 4, 64)
    # token 5 = patch row 1, patch column 1: latent rows 2-3, columns 2-3
    torch.testing.assert_close(packed[:, 5], latents[:, :, 2:4, 2:4].reshape(2, 64))
    unpacked = FluxPipeline._unpack_latents(packed, 48, 64, 8)
    assert unpacked.shape == latents.shape and torch.equal(unpacked, latents)


def test_flux_position_ids_are_three_axes_and_text_ids_are_zero():
    """`FluxPipeline.__call__` passes the transformer `txt_ids` of shape `(N_txt, 3)`, all zero (from `encode_prompt`), and `img_ids` `(N_img, 3)` from `_prepare_latent_image_ids`: axis 0 zero, axis 1 the patch row, axis 2 the patch column; `FluxPosEmbed` rotates each head's dimensions in three groups of `axes_dims_rope`, which in Flux.1-dev's published config are (16, 56, 56), summing to its head width 128."""
    from model_configs import FLUX_DEV_TRANSFORMER

    assert sum(FLUX_DEV_TRANSFORMER["axes_dims_rope"]) == FLUX_DEV_TRANSFORMER["attention_head_dim"] == 128  # fmt: skip
    from tiny import DIT_TEXT, DIT_TOKENS, tiny_flux_pipeline

    pipe = tiny_flux_pipeline()
    calls = []
    pipe.transformer.register_forward_pre_hook(lambda m, a, k: calls.append(k), with_kwargs=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        pipe(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
             pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g), height=16, width=16,
             num_inference_steps=1, output_type="latent")  # fmt: skip
    kwargs = calls[0]
    n_txt = kwargs["encoder_hidden_states"].shape[1]
    assert kwargs["txt_ids"].shape == (n_txt, 3) and not kwargs["txt_ids"].any()
    img_ids = kwargs["img_ids"]  # 16 px, vae_scale_factor 2: 8 x 8 latents, 4 x 4 patches
    assert img_ids.shape == (16, 3) and not img_ids[:, 0].any()
    rows, cols = torch.meshgrid(torch.arange(4.0), torch.arange(4.0), indexing="ij")
    torch.testing.assert_close(img_ids[:, 1], rows.flatten())
    torch.testing.assert_close(img_ids[:, 2], cols.flatten())
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    axes = FLUX_DEV_TRANSFORMER["axes_dims_rope"]  # (16, 56, 56)
    rope = FluxPosEmbed(theta=10000, axes_dim=list(axes))
    ids = torch.zeros(6, 3)
    cos, sin = rope(ids)
    assert cos.shape == sin.shape == (6, 128)
    bounds = [0, axes[0], axes[0] + axes[1], 128]
    for axis in range(3):  # moving one axis's id rotates only that axis's group of dims
        moved = ids.clone()
        moved[:, axis] = 7.0
        changed = (rope(moved)[1] != sin).any(dim=0).nonzero().flatten()
        assert changed.min() >= bounds[axis] and changed.max() < bounds[axis + 1]


def test_flux_dev_takes_guidance_scale_as_an_input_in_one_pass():
    """With `guidance_embeds=True` (Flux.1-dev), `FluxPipeline.__call__` runs the transformer once per step on batch 1 and passes `guidance_scale` as its `guidance` input, embedded beside the timestep, instead of a second, unconditional batch; only `true_cfg_scale > 1` with a negative prompt adds a second (negative-prompt) call per step."""
    from tiny import DIT_TEXT, DIT_TOKENS, tiny_flux_pipeline

    pipe = tiny_flux_pipeline(guidance_embeds=True)
    calls = []
    pipe.transformer.register_forward_pre_hook(lambda m, a, k: calls.append(k), with_kwargs=True)
    with torch.no_grad():
        pipe(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT),
             pooled_prompt_embeds=torch.randn(1, DIT_TEXT), guidance_scale=3.5, height=16,
             width=16, num_inference_steps=2, output_type="latent")  # fmt: skip
    assert len(calls) == 2
    assert all(k["hidden_states"].shape[0] == 1 for k in calls)
    assert all(torch.equal(k["guidance"], torch.tensor([3.5])) for k in calls)
    calls.clear()
    with torch.no_grad():
        pipe(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT),
             pooled_prompt_embeds=torch.randn(1, DIT_TEXT),
             negative_prompt_embeds=torch.zeros(1, DIT_TOKENS, DIT_TEXT),
             negative_pooled_prompt_embeds=torch.zeros(1, DIT_TEXT), true_cfg_scale=2.0,
             height=16, width=16, num_inference_steps=2, output_type="latent")  # fmt: skip
    assert len(calls) == 4 and all(k["hidden_states"].shape[0] == 1 for k in calls)
    negative = dict(negative_prompt_embeds=torch.zeros(1, DIT_TOKENS, DIT_TEXT),
                    negative_pooled_prompt_embeds=torch.zeros(1, DIT_TEXT))  # fmt: skip
    for extra in ({**negative, "true_cfg_scale": 1.0}, {"true_cfg_scale": 2.0}):
        calls.clear()  # a negative prompt at true_cfg_scale 1, or true_cfg_scale 2 without one
        with torch.no_grad():
            pipe(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT),
                 pooled_prompt_embeds=torch.randn(1, DIT_TEXT), height=16, width=16,
                 num_inference_steps=2, output_type="latent", **extra)  # fmt: skip
        assert len(calls) == 2, extra.keys()


def test_unfused_math_path_holds_fp32_scores_and_softmax():
    """PyTorch SDPA's math backend, the unfused one, holds the scores and the softmax as two `N x N` tensors per head, in fp32 for fp16 inputs by default (`allow_fp16_bf16_reduction_math_sdp` off): at least 4 times the fp16 bytes of the memory table (checked on CPU)."""
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils._python_dispatch import TorchDispatchMode

    n = 64

    class SquareOutputs(TorchDispatchMode):
        """Record (op, dtype) of every op that writes a new (.., N, N) tensor."""

        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.__name__.split(".")[0]
            if name in ("bmm", "_safe_softmax", "_softmax") and out.shape[-2:] == (n, n):
                self.seen.append((name, out.dtype))
            return out

    query = torch.randn(1, 2, n, 8, dtype=torch.float16)
    allowed = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    assert allowed is False  # torch's default
    try:
        for reduce_in_fp16, dtype in [(False, torch.float32), (True, torch.float16)]:
            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(reduce_in_fp16)
            with sdpa_kernel(SDPBackend.MATH), SquareOutputs() as spy:
                F.scaled_dot_product_attention(query, query, query)
            assert spy.seen == [("bmm", dtype), ("_safe_softmax", dtype)]  # scores, then probs
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(allowed)


def test_flash_backend_never_holds_the_score_matrix():
    """PyTorch's flash backend never stores the `N x N` score matrix (measured on CPU for fp16, bf16 and fp32 inputs, N = 1024): SDPA's flash path dispatches one op that writes only the output `(B, H, N, d)` and a logsumexp `(B, H, N)`, and no allocation during the call, its scratch tiles included, is as large as one head's `N x N` in the input dtype, while the math backend allocates `N x N` scores; the other fused kernels (memory-efficient, cuDNN, xFormers) are not run here."""
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile
    from torch.utils._python_dispatch import TorchDispatchMode

    n = 1024  # larger than the CPU kernel's tiles of queries and keys

    class Outputs(TorchDispatchMode):
        """Record (op, shapes of the tensors it writes) for every dispatched op."""

        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            outs = out if isinstance(out, (tuple, list)) else (out,)
            shapes = [tuple(o.shape) for o in outs if isinstance(o, torch.Tensor)]
            self.seen.append((func.__name__.split(".")[0], shapes))
            return out

    def square(seen):
        return [op for op, shapes in seen if any(sh[-2:] == (n, n) for sh in shapes)]

    def largest_allocation(backend, query):
        """Bytes of the largest allocation the call makes, inside kernels too (profiler)."""
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(query, query, query)
        events = prof.profiler.kineto_results.events()
        return max(e.nbytes() for e in events if e.name() == "[memory]")

    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        query = torch.randn(1, 2, n, 8, dtype=dtype)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), Outputs() as flash:
            F.scaled_dot_product_attention(query, query, query)
        assert flash.seen == [
            ("_scaled_dot_product_flash_attention_for_cpu", [(1, 2, n, 8), (1, 2, n)])
        ]
        assert square(flash.seen) == []
        one_head = n * n * query.element_size()  # one head's N x N in the input dtype
        assert largest_allocation(SDPBackend.FLASH_ATTENTION, query) < one_head
        with sdpa_kernel(SDPBackend.MATH), Outputs() as math:
            F.scaled_dot_product_attention(query, query, query)
        assert square(math.seen)  # the same spy sees the unfused path's scores
        assert largest_allocation(SDPBackend.MATH, query) >= 2 * n * n * 4  # both heads, fp32
