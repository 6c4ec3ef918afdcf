"""Lab 07 (UNet / DiT conditioning) against the real diffusers classes.

No weights: each model is the real class with a tiny random config built here, or,
where only the structure matters, SD 1.5's full-size config on the meta device (no
memory, no forward). The lab's NumPy functions are taken from the executed starter
(``run_lab``), so each test checks the code the page shows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny import meta_unet_self_attention, run_starter, tiny_sd3_transformer

LAB07 = "code/lab-07-unet-dit-conditioning/conditioning.py"


@pytest.fixture(scope="module")
def lab():
    """The starter's globals after a default run (its functions and SD15_UNET)."""
    return run_starter(LAB07)


def sd15_like_unet():
    """SD 1.5's block layout (3 CrossAttnDown + Down, mid, Up + 3 CrossAttnUp, 2 layers per
    block, attention_head_dim=8) with tiny channels and random weights."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=16,
        block_out_channels=(32, 32, 64, 64),
        layers_per_block=2,
        attention_head_dim=8,
        cross_attention_dim=24,
        norm_num_groups=8,
    ).eval()


def tiny_sd3(num_layers=2):
    """``tiny_sd3_transformer`` with a 24-wide pooled input, ``num_layers`` joint blocks."""
    return tiny_sd3_transformer(pooled_projection_dim=24, num_layers=num_layers)


def pre_hooks(modules, store):
    """Record (args, kwargs) of each module's forward, in call order; returns the handles."""

    def hook(module, args, kwargs):
        store.append((module, args, kwargs))

    return [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]


@pytest.mark.parametrize(
    "flip_sin_to_cos, downscale_freq_shift, dim",
    [(True, 0, 320), (False, 1, 320), (True, 1, 256), (True, 0, 7)],
    ids=["sd-unet", "defaults", "dit-labels", "odd-width"],
)
def test_timestep_embedding_matches_get_timestep_embedding(
    lab, flip_sin_to_cos, downscale_freq_shift, dim
):
    """The lab's NumPy `timestep_embedding` equals diffusers' `get_timestep_embedding` for SD's flags (`flip_sin_to_cos=True`, `downscale_freq_shift=0`), for the function's defaults, for DiT's label-conditioned flags and for an odd width."""
    from diffusers.models.embeddings import get_timestep_embedding

    timesteps = np.array([0, 1, 250, 500, 999, 37.5])
    expected = get_timestep_embedding(
        torch.tensor(timesteps), dim, flip_sin_to_cos, downscale_freq_shift
    ).numpy()
    got = lab["timestep_embedding"](timesteps, dim, flip_sin_to_cos, downscale_freq_shift)
    assert got.shape == expected.shape == (len(timesteps), dim)
    np.testing.assert_allclose(got, expected, atol=2e-4)  # float32 angles up to 999 rad


def test_unet_time_proj_uses_sd_flags_and_widens_to_four_times(lab):
    """`UNet2DConditionModel` defaults to `flip_sin_to_cos=True` and `freq_shift=0`; its `time_proj` is a `Timesteps` of width `block_out_channels[0]` that equals the lab's embedding, and `time_embedding` widens it to `4 * block_out_channels[0]`."""
    from diffusers.models.embeddings import Timesteps

    unet = sd15_like_unet()
    assert unet.config.flip_sin_to_cos is True and unet.config.freq_shift == 0
    assert isinstance(unet.time_proj, Timesteps)
    c0 = unet.config.block_out_channels[0]
    t = torch.tensor([0, 500, 999])
    with torch.no_grad():
        t_emb = unet.time_proj(t)
        emb = unet.time_embedding(t_emb)
    expected = lab["timestep_embedding"](
        t.numpy(), c0, flip_sin_to_cos=True, downscale_freq_shift=0
    )
    np.testing.assert_allclose(t_emb.numpy(), expected, atol=2e-4)  # float32 rounding
    assert emb.shape == (3, 4 * c0)


def test_resnet_adds_one_time_value_per_channel(lab):
    """With SD 1.5's `resnet_time_scale_shift` (the default; `"scale_shift"` differs, see the UNet vs DiT page), each `ResnetBlock2D` adds `time_emb_proj(SiLU(emb))`, shape `(B, C_out)`, to its `conv1` output, broadcast over height and width, where `emb` is the UNet's `time_embedding` output."""
    from model_configs import SD15_UNET

    unet = sd15_like_unet()
    assert "resnet_time_scale_shift" not in SD15_UNET
    assert unet.config.resnet_time_scale_shift == "default"
    resnets = [m for m in unet.modules() if type(m).__name__ == "ResnetBlock2D"]
    seen = {}
    handles = [
        unet.time_embedding.register_forward_hook(lambda m, a, o: seen.__setitem__("emb", o))
    ]
    for i, resnet in enumerate(resnets):  # every ResnetBlock2D: down, mid and up
        handles += [
            resnet.conv1.register_forward_hook(
                lambda m, a, o, i=i: seen.__setitem__(("conv1", i), o)
            ),
            resnet.time_emb_proj.register_forward_hook(
                lambda m, a, o, i=i: seen.__setitem__(("proj", i), o)
            ),
            resnet.norm2.register_forward_pre_hook(
                lambda m, a, i=i: seen.__setitem__(("norm2_in", i), a[0])
            ),
            resnet.register_forward_pre_hook(
                lambda m, a, k, i=i: seen.__setitem__(
                    ("temb", i), a[1] if len(a) > 1 else k["temb"]
                ),
                with_kwargs=True,
            ),
        ]
    with torch.no_grad():
        unet(torch.randn(2, 4, 16, 16), 500, encoder_hidden_states=torch.randn(2, 77, 24))
    for h in handles:
        h.remove()
    assert len(resnets) > 20 and len(seen) == 1 + 4 * len(resnets)
    for i, resnet in enumerate(resnets):
        assert seen["proj", i].shape == (2, resnet.conv1.out_channels)
        torch.testing.assert_close(seen["temb", i], seen["emb"])
        torch.testing.assert_close(
            seen["norm2_in", i], seen["conv1", i] + seen["proj", i][:, :, None, None]
        )


def test_cross_attention_queries_come_from_latent_positions(lab):
    """In a `UNet2DConditionModel` with SD 1.5's block layout, every `attn2` gets `hidden_states` `(B, h*w, C)` from the latent positions of its level and `encoder_hidden_states` `(B, 77, cross_attention_dim)`; `attn1` gets none; the query lengths per block match the lab's `unet_attention_levels`."""
    unet = sd15_like_unet()
    calls1, calls2 = [], []
    handles = pre_hooks([m for n, m in unet.named_modules() if n.endswith("attn1")], calls1)
    handles += pre_hooks([m for n, m in unet.named_modules() if n.endswith("attn2")], calls2)
    with torch.no_grad():
        unet(torch.randn(1, 4, 16, 16), 10, encoder_hidden_states=torch.randn(1, 77, 24))
    for h in handles:
        h.remove()
    config = dict(lab["SD15_UNET"], block_out_channels=unet.config.block_out_channels)
    levels = lab["unet_attention_levels"](config, 16)
    expected = [(q, c) for _, _, q, c, _, _, n in levels for _ in range(n)]
    got = [(args[0].shape[1], args[0].shape[2]) for _, args, _ in calls2]
    assert got == expected and len(got) == 16
    for module, args, kwargs in calls2:
        assert kwargs["encoder_hidden_states"].shape == (1, 77, 24)
        assert module.to_k.in_features == module.to_v.in_features == 24
        assert module.to_q.in_features == args[0].shape[2]
    assert all(kwargs.get("encoder_hidden_states") is None for _, _, kwargs in calls1)


def test_attention_head_dim_is_the_number_of_heads_in_sd15(lab):
    """Built with SD 1.5's config (diffusers' `UNet2DConditionModel` defaults with `cross_attention_dim=768`, on the meta device), the UNet has 16 transformer blocks whose `attn1` and `attn2` all have `heads == 8` (`attention_head_dim=8`) and head widths 40, 80 and 160, as the lab's level table says; `attn2.to_k` takes 768-wide `prompt_embeds`. The head count is what SD's `CrossAttnDownBlock2D`, `UNetMidBlock2DCrossAttn` and `CrossAttnUpBlock2D` make of it, not the class's rule: built from `SimpleCrossAttnDownBlock2D` blocks, the same `attention_head_dim=8` is the head width."""
    from diffusers import UNet2DConditionModel

    config = lab["SD15_UNET"]
    with torch.device("meta"):
        unet = UNet2DConditionModel(
            block_out_channels=config["block_out_channels"],
            down_block_types=config["down_block_types"],
            up_block_types=config["up_block_types"],
            layers_per_block=config["layers_per_block"],
            attention_head_dim=config["attention_head_dim"],
            cross_attention_dim=config["cross_attention_dim"],
        )
    assert unet.config.attention_head_dim == 8
    attn2 = [m for n, m in unet.named_modules() if n.endswith("attn2")]
    attn1 = [m for n, m in unet.named_modules() if n.endswith("attn1")]
    levels = lab["unet_attention_levels"](config, 64)
    expected = [(h, c // h) for _, _, _, c, h, _, n in levels for _ in range(n)]
    for attns in (attn1, attn2):  # named_modules order: down, up, mid; compare as multisets
        assert sorted((a.heads, a.to_q.out_features // a.heads) for a in attns) == sorted(expected)
    assert {d for _, d in expected} == {40, 80, 160}
    assert all(a.to_k.in_features == 768 for a in attn2) and len(attn2) == 16
    assert {type(b).__name__ for b in [*unet.down_blocks, unet.mid_block, *unet.up_blocks]} >= {
        "CrossAttnDownBlock2D", "UNetMidBlock2DCrossAttn", "CrossAttnUpBlock2D"
    }  # fmt: skip
    with torch.device("meta"):
        simple = UNet2DConditionModel(
            block_out_channels=(32, 64), layers_per_block=1, attention_head_dim=8,
            down_block_types=("SimpleCrossAttnDownBlock2D",) * 2,
            up_block_types=("SimpleCrossAttnUpBlock2D",) * 2,
            mid_block_type="UNetMidBlock2DSimpleCrossAttn", cross_attention_dim=24,
            norm_num_groups=8,
        )  # fmt: skip
    attns = [m for m in simple.modules() if type(m).__name__ == "Attention"]
    assert len(attns) == 7 and {a.to_q.out_features // a.heads for a in attns} == {8}
    assert sorted({a.heads for a in attns}) == [32 // 8, 64 // 8]  # heads = channels // 8


@pytest.mark.parametrize("patch_size", [2, 4])
def test_dit_patch_embedding_is_patchify_then_linear(lab, patch_size):
    """A tiny `DiTTransformer2DModel`'s `PatchEmbed` (`pos_embed`) turns `(B, C, H, W)` latents into `(B, (H/p)*(W/p), D)` tokens: the lab's `patchify` followed by one Linear with the `Conv2d` weight reshaped to `(D, C*p*p)`, plus its sin-cos position table, which the forward adds (without it the tokens differ)."""
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    model = DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        num_layers=1,
        sample_size=8,
        patch_size=patch_size,
        num_embeds_ada_norm=10,
    ).eval()
    latents = torch.randn(2, 4, 8, 8)
    seen = {}
    handle = model.pos_embed.register_forward_hook(lambda m, a, o: seen.__setitem__("tokens", o))
    with torch.no_grad():
        out = model(latents, timestep=torch.tensor([1, 2]), class_labels=torch.tensor([0, 1]))
        projected = model.pos_embed.proj(latents).flatten(2).transpose(1, 2)
    handle.remove()
    n_tokens = (8 // patch_size) ** 2
    assert seen["tokens"].shape == (2, n_tokens, 16)
    assert out.sample.shape == latents.shape
    proj = model.pos_embed.proj
    weight = proj.weight.detach().numpy().reshape(proj.out_channels, -1)  # (D, C*p*p)
    tokens = lab["patchify"](latents.numpy(), patch_size) @ weight.T + proj.bias.detach().numpy()
    np.testing.assert_allclose(tokens, projected.numpy(), atol=1e-5)
    table = model.pos_embed.pos_embed.numpy()  # (1, (H/p)*(W/p), D) sin-cos buffer
    np.testing.assert_allclose(seen["tokens"].numpy(), tokens + table, atol=1e-5)
    assert not np.allclose(seen["tokens"].numpy(), tokens, atol=1e-3)  # the table is added


def test_flux_pack_latents_is_patchify_with_p2(lab):
    """`FluxPipeline._pack_latents` is the lab's `patchify` with `p = 2` (`(B, 16, h, w)` to `(B, (h/2)*(w/2), 64)`), and `_unpack_latents` is its `unpatchify`."""
    from diffusers import FluxPipeline

    latents = torch.randn(2, 16, 8, 12)
    packed = FluxPipeline._pack_latents(latents, 2, 16, 8, 12)
    assert packed.shape == (2, 4 * 6, 64)
    np.testing.assert_array_equal(packed.numpy(), lab["patchify"](latents.numpy(), 2))
    unpacked = FluxPipeline._unpack_latents(packed, 8 * 8, 12 * 8, 8)  # pixel height, width
    np.testing.assert_array_equal(unpacked.numpy(), lab["unpatchify"](packed.numpy(), 8, 12, 2))
    np.testing.assert_array_equal(unpacked.numpy(), latents.numpy())


def test_sd3_joint_attention_runs_over_image_then_text_tokens(monkeypatch):
    """In a tiny `SD3Transformer2DModel`, each `JointTransformerBlock` runs one attention over `T_img + T_txt` tokens: the image tokens' queries, keys and values, then the text tokens', concatenated along the sequence; the output `sample` has the latents' shape."""
    import torch.nn.functional as F  # noqa: N812

    model = tiny_sd3()
    seen, sdpa = [], F.scaled_dot_product_attention

    def recording_sdpa(query, key, value, *args, **kwargs):
        seen.append((query.clone(), key.shape, value.shape))
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording_sdpa)
    attn = model.transformer_blocks[0].attn
    proj = {}
    handles = [
        attn.to_q.register_forward_hook(lambda m, a, o: proj.__setitem__("img", o)),
        attn.add_q_proj.register_forward_hook(lambda m, a, o: proj.__setitem__("txt", o)),
    ]
    latents = torch.randn(1, 4, 8, 8)  # 16 image tokens with p = 2
    with torch.no_grad():
        out = model(
            hidden_states=latents,
            encoder_hidden_states=torch.randn(1, 10, 32),  # 10 text tokens
            pooled_projections=torch.randn(1, 24),
            timestep=torch.tensor([500]),
        )
    for h in handles:
        h.remove()
    assert len(seen) == 2  # one joint attention per block
    for query, key_shape, value_shape in seen:
        assert query.shape == key_shape == value_shape == (1, 2, 16 + 10, 8)  # (B, heads, N, d)
    joint_q = seen[0][0].transpose(1, 2).reshape(1, 26, 16)  # back to (B, N, heads * d)
    torch.testing.assert_close(joint_q[:, :16], proj["img"])  # image tokens first
    torch.testing.assert_close(joint_q[:, 16:], proj["txt"])  # then the text tokens
    assert out.sample.shape == latents.shape


def test_ada_layer_norm_zero_matches_the_labs_modulation(lab):
    """`AdaLayerNormZero` computes `Linear(SiLU(emb))`, splits it into `shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp` and returns `LayerNorm(x) * (1 + scale_msa) + shift_msa` with the other four, as the lab's `ada_ln_zero_modulation` does."""
    from diffusers.models.normalization import AdaLayerNormZero

    torch.manual_seed(0)
    norm = AdaLayerNormZero(16)
    x, emb = torch.randn(2, 5, 16), torch.randn(2, 16)
    with torch.no_grad():
        expected = norm(x, emb=emb)
    w = norm.linear.weight.detach().numpy().T  # (D, 6D)
    got = lab["ada_ln_zero_modulation"](
        x.numpy(), emb.numpy(), w, norm.linear.bias.detach().numpy()
    )
    assert len(got) == len(expected) == 5
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e.numpy(), atol=1e-5)


def test_diffusers_does_not_zero_init_adaln_zero():
    """`DiTTransformer2DModel`'s constructor does not zero-initialise adaLN-Zero: a freshly built DiT block's `norm1.linear` (in `AdaLayerNormZero`) holds nonzero random weights and the block changes its input; zeroing that Linear's weight and bias, as DiT's training code does at init, makes the block return its input exactly."""
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    model = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=1, sample_size=8,
        num_embeds_ada_norm=10,
    ).eval()  # fmt: skip
    block = model.transformer_blocks[0]
    assert block.norm_type == "ada_norm_zero"
    assert block.norm1.linear.weight.abs().sum() > 0
    x = torch.randn(2, 16, 16)
    kwargs = dict(timestep=torch.tensor([1, 500]), class_labels=torch.tensor([0, 3]))
    with torch.no_grad():
        assert not torch.allclose(block(x, **kwargs), x)
        block.norm1.linear.weight.zero_()
        block.norm1.linear.bias.zero_()
        assert torch.equal(block(x, **kwargs), x)


def test_zeroed_sd3_joint_block_is_the_identity_on_both_streams():
    """The same holds in SD3's `JointTransformerBlock`: with `norm1.linear` and `norm1_context.linear` zeroed, the block returns its image tokens and its text tokens unchanged; freshly built, it changes both."""
    model = tiny_sd3()
    block = model.transformer_blocks[0]
    assert not block.context_pre_only
    img, txt, temb = torch.randn(1, 16, 16), torch.randn(1, 10, 16), torch.randn(1, 16)
    with torch.no_grad():
        txt_out, img_out = block(hidden_states=img, encoder_hidden_states=txt, temb=temb)
        assert not torch.allclose(img_out, img) and not torch.allclose(txt_out, txt)
        for norm in (block.norm1, block.norm1_context):
            norm.linear.weight.zero_()
            norm.linear.bias.zero_()
        txt_out, img_out = block(hidden_states=img, encoder_hidden_states=txt, temb=temb)
    assert torch.equal(img_out, img) and torch.equal(txt_out, txt)


def test_sd3_last_block_does_not_update_the_text():
    """In SD3 the text tokens are updated by every `JointTransformerBlock` but the last, which is `context_pre_only`: it uses the text as keys and values and returns no text tokens, so no updated `prompt_embeds` leaves it."""
    model = tiny_sd3(num_layers=3)
    outs = []
    handles = [
        b.register_forward_hook(lambda m, a, o: outs.append(o)) for b in model.transformer_blocks
    ]
    with torch.no_grad():
        model(hidden_states=torch.randn(1, 4, 8, 8), encoder_hidden_states=torch.randn(1, 10, 32),
              pooled_projections=torch.randn(1, 24), timestep=torch.tensor([500]))  # fmt: skip
    for h in handles:
        h.remove()
    assert [b.context_pre_only for b in model.transformer_blocks] == [False, False, True]
    text_out = [o[0] for o in outs]  # (encoder_hidden_states, hidden_states) per block
    assert text_out[0].shape == text_out[1].shape == (1, 10, 16) and text_out[2] is None


def test_unfused_math_attention_holds_fp32_scores_and_softmax():
    """The lab's bytes are one fp16 score matrix per head, a lower bound: with fp16 inputs PyTorch's math backend of `scaled_dot_product_attention` (the unfused one) writes the scores and then the softmax as two `N x N` tensors per head, in fp32 by default (`allow_fp16_bf16_reduction_math_sdp` off), 4 times as much (checked on CPU)."""
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils._python_dispatch import TorchDispatchMode

    n, seen = 64, []

    class SquareOutputs(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.__name__.split(".")[0]
            if name in ("bmm", "_safe_softmax", "_softmax") and out.shape[-2:] == (n, n):
                seen.append((name, out.dtype))
            return out

    assert torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed() is False
    query = torch.randn(1, 2, n, 8, dtype=torch.float16)
    with sdpa_kernel(SDPBackend.MATH), SquareOutputs():
        F.scaled_dot_product_attention(query, query, query)
    assert seen == [("bmm", torch.float32), ("_safe_softmax", torch.float32)]


@pytest.mark.parametrize("model", ["SD 1.5", "SDXL"])
def test_unet_layout_table_matches_the_real_unet(lab, model):
    """The lab's `SD15_UNET` and `SDXL_UNET` hold the published configs' layout, and its `unet_attention_levels` table (queries and heads of every transformer block, at 512 px for SD 1.5 and 1024 px for SDXL) equals what forward hooks on every `attn1` record in the real `UNet2DConditionModel` built from those configs on the meta device."""
    from model_configs import SD15_UNET, SDXL_UNET

    published, config, side, added = {
        "SD 1.5": (SD15_UNET, lab["SD15_UNET"], 64, {}),
        "SDXL": (SDXL_UNET, lab["SDXL_UNET"], 128, {"text_embeds": (1, 1280), "time_ids": (1, 6)}),
    }[model]
    for key, value in config.items():
        expected = published.get(key, 1 if key == "transformer_layers_per_block" else None)
        assert (tuple(value) if isinstance(value, tuple) else value) == (
            tuple(expected) if isinstance(expected, list) else expected
        ), key
    calls, _ = meta_unet_self_attention(published, side, **added)
    rows = lab["unet_attention_levels"](config, side)
    expected = [(q, heads) for _, _, q, _, heads, _, n in rows for _ in range(n)]
    assert sorted(calls) == sorted(expected)


def test_transformer_head_counts_match_the_real_configs(lab):
    """The head counts the lab's attention table uses for SD3 Medium (24) and Flux.1-dev (24) are those of `SD3Transformer2DModel` and `FluxTransformer2DModel` built from the published configs on the meta device."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel
    from model_configs import FLUX_DEV_TRANSFORMER, SD3_MEDIUM_TRANSFORMER

    with torch.device("meta"):
        sd3 = SD3Transformer2DModel(**SD3_MEDIUM_TRANSFORMER)
        flux = FluxTransformer2DModel(**FLUX_DEV_TRANSFORMER)
    assert (
        lab["TRANSFORMERS"]["SD3 Medium"]["num_attention_heads"]
        == sd3.transformer_blocks[0].attn.heads
    )
    assert (
        lab["TRANSFORMERS"]["Flux.1-dev"]["num_attention_heads"]
        == flux.transformer_blocks[0].attn.heads
    )
    assert lab["TRANSFORMERS"]["SD3 Medium"]["patch_size"] == sd3.config.patch_size == 2


def test_dit_output_head_is_p_p_c_per_token(lab):
    """`DiTTransformer2DModel` unpatchifies its output head in `(p, p, C_out)` order per token, as the lab's `dit_unpatchify` does, not in the `(C, p, p)` order of `patchify`, `PatchEmbed`'s weight and Flux's packing; with `out_channels=8` (DiT-XL/2's learned variance for 4 latent channels) the output has `2C` channels."""
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    model = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
        num_layers=1, sample_size=8, patch_size=2, num_embeds_ada_norm=10,
    ).eval()  # fmt: skip
    head = {}
    handle = model.proj_out_2.register_forward_hook(lambda m, a, o: head.__setitem__("out", o))
    with torch.no_grad():
        sample = model(torch.randn(1, 4, 8, 8), timestep=torch.tensor([5]), class_labels=torch.tensor([1])).sample  # fmt: skip
    handle.remove()
    tokens = head["out"].numpy()
    assert tokens.shape == (1, 16, 2 * 2 * 8) and sample.shape == (1, 8, 8, 8)
    np.testing.assert_array_equal(lab["dit_unpatchify"](tokens, 8, 8, 2), sample.numpy())
    assert not np.array_equal(lab["unpatchify"](tokens, 8, 8, 2), sample.numpy())


def test_dit_pipeline_takes_class_labels_not_prompt_embeds():
    """A DiT does not take `prompt_embeds`: `DiTPipeline.__call__` (DiT-XL/2's pipeline) accepts class labels and no prompt, and hands `DiTTransformer2DModel` latents `(B, C, h, w)`, a timestep and `class_labels`, with no `encoder_hidden_states`."""
    from diffusers import DDIMScheduler, DiTPipeline, DiTTransformer2DModel
    from tiny import SD_SCHEDULER, tiny_vae

    torch.manual_seed(0)
    transformer = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=1,
        sample_size=8, num_embeds_ada_norm=10,
    ).eval()  # DiT-XL/2's learned variance: out_channels = 2C  # fmt: skip
    pipe = DiTPipeline(
        transformer=transformer, vae=tiny_vae(), scheduler=DDIMScheduler(**SD_SCHEDULER)
    )
    pipe.set_progress_bar_config(disable=True)
    calls = []
    transformer.register_forward_pre_hook(lambda m, a, k: calls.append((a, k)), with_kwargs=True)
    with pytest.raises(TypeError, match="prompt"):
        pipe(prompt="a cat", num_inference_steps=1, output_type="latent")
    pipe(class_labels=[3], guidance_scale=1.0, num_inference_steps=2, output_type="latent")
    assert len(calls) == 2
    for args, kwargs in calls:
        latents = args[0] if args else kwargs["hidden_states"]
        assert latents.shape == (1, 4, 8, 8)
        assert "timestep" in kwargs and torch.equal(kwargs["class_labels"], torch.tensor([3]))
        assert "encoder_hidden_states" not in kwargs
