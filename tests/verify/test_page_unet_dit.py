"""The "UNet vs DiT" handbook section against the real diffusers classes.

Tiny random configs built here (no weights, no hub), and SD 1.5's full-size UNet config
on the meta device where only the structure is checked. Hooks record what each module
receives and returns; nothing is inferred from reading the source except where noted.
"""

from __future__ import annotations

import inspect

import pytest
import torch


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


def sd3(num_layers=2):
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    return SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=num_layers,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,
        caption_projection_dim=16,
        pooled_projection_dim=24,
        pos_embed_max_size=16,
    ).eval()


def output_of(module, store, key):
    return module.register_forward_hook(lambda m, a, o: store.__setitem__(key, o))


def test_sd15_unet_levels_channels_and_attention():
    """With SD 1.5's config (`UNet2DConditionModel` defaults with `cross_attention_dim=768`, on the meta device), the UNet has four levels of 320, 640, 1280 and 1280 channels; the first three down blocks and the mid block carry transformer blocks (2 per down block, 3 per up block, 16 in all), each with 8 heads, and the deepest down block has none."""
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        model = UNet2DConditionModel(cross_attention_dim=768)
    assert tuple(model.config.block_out_channels) == (320, 640, 1280, 1280)
    per_down = [len(getattr(b, "attentions", [])) for b in model.down_blocks]
    per_up = [len(getattr(b, "attentions", [])) for b in model.up_blocks]
    assert per_down == [2, 2, 2, 0] and per_up == [0, 3, 3, 3]
    assert len(model.mid_block.attentions) == 1
    attns = [m for n, m in model.named_modules() if n.endswith(("attn1", "attn2"))]
    assert len(attns) == 32 and {a.heads for a in attns} == {8}
    assert model.conv_in.in_channels == 4 and model.time_embedding.linear_2.out_features == 1280


def test_unet_time_embedding_is_added_in_every_resnet():
    """A `UNet2DConditionModel` embeds the timestep once (`time_proj`, then `time_embedding`) and every `ResnetBlock2D` receives that same `emb` and adds `time_emb_proj(SiLU(emb))[:, :, None, None]` to its `conv1` output: one shift per channel, the same at every position."""
    model = unet()
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


def test_every_attn2_reads_the_same_prompt_embeds():
    """In a UNet, every `attn2` receives the same, unchanged `encoder_hidden_states` that the UNet was called with: the prompt is read at every level and never updated."""
    model = unet()
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
    seen, temb = {}, []
    handles = [
        output_of(model.time_embedding, seen, "emb"),
        output_of(model.add_embedding, seen, "aug"),
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
    assert model.add_embedding.linear_1.in_features == 20 + 6 * 8
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
    """In SD3, each `JointTransformerBlock` attends over `T_img + T_txt` tokens and returns new text tokens that the next block receives, unlike a UNet's `attn2`; the last block is `context_pre_only` and updates only the image tokens."""
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


def test_dit_conditions_on_timestep_plus_class_label():
    """`DiTTransformer2DModel` has no text input: each block's `AdaLayerNormZero` regresses its shift, scale and gate from the sum of a timestep embedding and a class-label embedding (`CombinedTimestepLabelEmbeddings`)."""
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    model = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=1, sample_size=8,
        num_embeds_ada_norm=10,
    ).eval()  # fmt: skip
    assert "encoder_hidden_states" not in inspect.signature(model.forward).parameters
    emb = model.transformer_blocks[0].norm1.emb
    t, labels = torch.tensor([3, 700]), torch.tensor([1, 9])
    with torch.no_grad():
        got = emb(t, labels, hidden_dtype=torch.float32)
        expected = emb.timestep_embedder(emb.time_proj(t)) + emb.class_embedder(labels)
    torch.testing.assert_close(got, expected)


def test_adaln_zero_gates_are_not_zero_in_a_fresh_diffusers_model():
    """diffusers' constructors leave adaLN-Zero's modulation Linear at PyTorch's default random init: in a freshly built `DiTTransformer2DModel` and `SD3Transformer2DModel`, every `norm1.linear` has nonzero weights, so the zero-gate identity holds only where training code zeroes them."""
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    dit = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=2, sample_size=8,
        num_embeds_ada_norm=10,
    )  # fmt: skip
    for model in (dit, sd3()):
        for block in model.transformer_blocks:
            assert type(block.norm1).__name__ == "AdaLayerNormZero"
            assert block.norm1.linear.weight.abs().sum() > 0


def test_flux_puts_text_tokens_first():
    """Flux's attention processor concatenates the text (`encoder_*`) projections before the image ones (`torch.cat([encoder_query, query], dim=1)`), the opposite order to SD3's `JointAttnProcessor2_0` (read from the installed source)."""
    from diffusers.models.attention_processor import JointAttnProcessor2_0
    from diffusers.models.transformers import transformer_flux

    flux = inspect.getsource(transformer_flux.FluxAttnProcessor)
    assert "torch.cat([encoder_query, query], dim=1)" in flux
    sd3_source = inspect.getsource(JointAttnProcessor2_0)
    assert "torch.cat([query, encoder_hidden_states_query_proj], dim=2)" in sd3_source


def test_text_sequence_lengths_of_sd3_and_flux():
    """`StableDiffusion3Pipeline` defaults to `max_sequence_length=256` T5 tokens and concatenates them after the 77 CLIP tokens along the sequence axis (333 text tokens); `FluxPipeline` defaults to 512 T5 tokens."""
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    def default(cls):
        return inspect.signature(cls.__call__).parameters["max_sequence_length"].default

    assert default(StableDiffusion3Pipeline) == 256 and default(FluxPipeline) == 512
    source = inspect.getsource(StableDiffusion3Pipeline.encode_prompt)  # needs three encoders
    assert "torch.cat([clip_prompt_embeds, t5_prompt_embed], dim=-2)" in source


def test_flux_packs_2x2_patches_and_uses_rotary_positions():
    """Flux's transformer defaults to `patch_size=1` and `in_channels=64`, because `FluxPipeline._pack_latents` already turns `(B, 16, h, w)` latents into `(B, (h/2)*(w/2), 64)` tokens; it encodes positions with rotary embeddings (`FluxPosEmbed`), while DiT and SD3 add a fixed 2D sin-cos table in `PatchEmbed`."""
    from diffusers import DiTTransformer2DModel, FluxPipeline, FluxTransformer2DModel
    from diffusers.models.embeddings import get_2d_sincos_pos_embed

    params = inspect.signature(FluxTransformer2DModel.__init__).parameters
    assert params["patch_size"].default == 1 and params["in_channels"].default == 64
    assert FluxPipeline._pack_latents(torch.randn(1, 16, 8, 8), 1, 16, 8, 8).shape == (1, 16, 64)
    torch.manual_seed(0)
    flux = FluxTransformer2DModel(
        num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=24, axes_dims_rope=(4, 6, 6),
    )  # fmt: skip
    assert type(flux.pos_embed).__name__ == "FluxPosEmbed"
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
