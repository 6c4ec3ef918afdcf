"""Lab 07 UNet / DiT Conditioning: embeddings, attention shapes, patch tokens, adaLN-Zero."""

import numpy as np
import pytest

STARTER = "code/lab-07-unet-dit-conditioning/conditioning.py"


@pytest.fixture
def lab(run_lab):
    return run_lab(STARTER)


def test_sd_timestep_embedding_is_cos_first(lab):
    t_emb = lab["t_emb"]  # timesteps 0, 1, 500, 999 at width 320
    assert t_emb.shape == (4, 320) and t_emb.dtype == np.float32
    assert np.all(t_emb[0, :160] == 1.0) and np.all(t_emb[0, 160:] == 0.0)  # cos(0), sin(0)
    assert np.allclose(t_emb[:, :160] ** 2 + t_emb[:, 160:] ** 2, 1.0, atol=1e-5)


def test_latents_embeddings_and_weights_are_float32(lab):
    """The starter's comment: latents, embeddings and weights are float32 (its bookkeeping
    arrays, such as the integer timesteps and the float64 periods, are not)."""
    names = ["latents", "hidden_states", "prompt_embeds", "t_emb", "emb", "c", "txt", "x"]
    names += ["w_time", "to_q", "to_k", "to_v", "w_qkv", "w_mlp", "random_w", "w_img", "w_txt"]
    assert {name: lab[name].dtype for name in names} == dict.fromkeys(names, np.float32)
    assert lab["timesteps"].dtype != np.float32 and lab["periods"].dtype == np.float64


def test_time_term_is_one_value_per_channel(lab):
    assert lab["temb"].shape == (1, 320, 1, 1)
    added = lab["hidden_states_t"] - lab["hidden_states"]
    per_channel = added.reshape(320, -1)
    assert np.allclose(per_channel, per_channel[:, :1], atol=1e-5)


def test_cross_attention_shapes_at_512(lab):
    assert lab["query"].shape == (1, 4096, 40)
    assert lab["key"].shape == lab["value"].shape == (1, 77, 40)
    assert lab["weights"].shape == (1, 4096, 77)
    np.testing.assert_allclose(lab["weights"].sum(-1), 1.0, rtol=1e-5)
    assert lab["out"].shape == (1, 4096, 40)


def test_unet_levels_for_sd15_at_512(lab):
    levels = lab["levels"]
    queries = [row[2] for row in levels]
    assert queries == [4096, 1024, 256, 64, 256, 1024, 4096]
    assert [row[5] for row in levels] == [40, 80, 160, 160, 160, 80, 40]  # head_dim
    assert lab["total_blocks"] == 16


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_patchify_round_trip_and_token_count(lab, p):
    latents = np.random.default_rng(1).standard_normal((2, 16, 32, 48)).astype(np.float32)
    tokens = lab["patchify"](latents, p)
    assert tokens.shape == (2, (32 // p) * (48 // p), 16 * p * p)
    assert np.array_equal(lab["unpatchify"](tokens, 32, 48, p), latents)


def test_patchify_keeps_each_patch_together(lab):
    latents = np.arange(1 * 2 * 4 * 4, dtype=np.float32).reshape(1, 2, 4, 4)
    tokens = lab["patchify"](latents, 2)
    # token 0 is the top-left 2x2 patch: channel 0's four values, then channel 1's
    np.testing.assert_array_equal(tokens[0, 0], [0, 1, 4, 5, 16, 17, 20, 21])


@pytest.mark.parametrize("resolution, patch", [(256, 2), (512, 2), (1024, 2), (512, 4)])
def test_printed_token_count(run_lab, resolution, patch):
    g = run_lab(STARTER, "--resolution", str(resolution), "--patch-size", str(patch))
    n = (resolution // 8 // patch) ** 2
    assert g["patch_tokens"].shape[1] == n
    assert f"= {n} tokens" in g["__stdout__"]
    assert f"DiT-XL/{patch} head: tokens (1, {n}, {patch * patch * 8})" in g["__stdout__"]


def test_adaln_zero_block_is_identity_at_init(lab):
    assert np.array_equal(lab["y_zero"], lab["x_block"])
    assert np.abs(lab["y_random"] - lab["x_block"]).max() > 0.1


def test_joint_attention_over_text_and_image(run_lab):
    g = run_lab(STARTER, "--text-tokens", "77")
    assert g["joint_weights"].shape == (1, 1024 + 77, 1024 + 77)
    assert g["img_out"].shape == (1, 1024, 64) and g["txt_out"].shape == (1, 77, 64)
    np.testing.assert_allclose(g["joint_weights"].sum(-1), 1.0, rtol=1e-5)


def test_table_bytes(lab):
    out = lab["__stdout__"]
    assert "  512     64x64    4096         32.0 MiB" in out  # 4096^2 * 2 bytes
    assert " 2048   256x256   65536          8.0 GiB" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--patch-size", "3"],
        ["--resolution", "500"],
        ["--resolution", "2048"],
        ["--resolution", "32"],
        ["--text-tokens", "0"],
    ],
    ids=" ".join,
)
def test_bad_arguments(run_cli, argv):
    run = run_cli(STARTER, *argv)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("conditioning.py: error: ")
    assert run.stdout == ""


def test_sdxl_levels_have_no_first_level_attention(lab):
    rows = lab["unet_attention_levels"](lab["SDXL_UNET"], 128)  # 1024 px
    assert max(row[2] for row in rows) == 4096 and sum(row[-1] for row in rows) == 70
    assert {row[5] for row in rows} == {64}  # head width 64 at every level
    largest = lab["largest_self_attention"](1024)
    assert largest["SD 1.5 UNet"] == (16384, 8) and largest["SDXL UNet"] == (4096, 10)


def test_dit_unpatchify_reads_p_p_c(lab):
    tokens = np.arange(1 * 4 * 2 * 2 * 3, dtype=np.float32).reshape(1, 4, 12)  # 2x2 grid, p=2, C=3
    out = lab["dit_unpatchify"](tokens, 4, 4, 2)
    assert out.shape == (1, 3, 4, 4)
    # token 0, patch row 0, column 1, channel 2 sits at (p=0, q=1, c=2) -> index 1*3 + 2 = 5
    assert out[0, 2, 0, 1] == tokens[0, 0, 5]


def layer_bytes(lab, px):
    """{model: fp16 bytes of its largest self-attention layer, all heads} at ``px``."""
    return {
        name: n * n * heads * 2 for name, (n, heads) in lab["largest_self_attention"](px).items()
    }


def test_only_the_unet_and_dit_curves_grow_16_fold_from_the_start(lab):
    """The UNet and DiT curves grow 16-fold per doubling everywhere; SD3's and Flux's less
    at first, because their text tokens do not grow (Flux: 768 -> 1536 tokens, 4-fold)."""
    for small, large in [(256, 512), (512, 1024), (1024, 2048)]:
        a, b = layer_bytes(lab, small), layer_bytes(lab, large)
        for name in ("SD 1.5 UNet", "SDXL UNet", "DiT-XL/2"):
            assert b[name] == 16 * a[name]
        for name in ("SD3 Medium", "Flux.1-dev"):
            assert b[name] < 16 * a[name]
    a, b = layer_bytes(lab, 256), layer_bytes(lab, 512)
    assert b["Flux.1-dev"] == 4 * a["Flux.1-dev"] and b["SD3 Medium"] < 6 * a["SD3 Medium"]


@pytest.mark.parametrize(
    "px, text_counts_more", [(256, True), (512, True), (1024, False), (2048, False)]
)
def test_heads_or_text_lift_sd3_and_flux_above_dit(lab, px, text_counts_more):
    """Above DiT-XL/2, SD3 and Flux gain 24/16 = 1.5x from heads and (N_img + N_txt)^2 / N_img^2
    from text: the text factor is larger at 512 px and below, smaller from 1024 px up."""
    n_dit = lab["largest_self_attention"](px)["DiT-XL/2"][0]
    for name in ("SD3 Medium", "Flux.1-dev"):
        n, heads = lab["largest_self_attention"](px)[name]
        assert ((n / n_dit) ** 2 > heads / 16) == text_counts_more
