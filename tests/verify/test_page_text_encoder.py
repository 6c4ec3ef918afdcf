"""Text encoder and conditioning (docs/handbook/text-encoder.md) against the installed diffusers.

Everything runs on the real classes with tiny random-config parts built in code, no
weights and no hub: ``CLIPTokenizer`` (``tiny.tiny_tokenizer``: letters are tokens, and
``model_max_length`` is 77 as in SD), ``CLIPTextModel`` / ``CLIPTextModelWithProjection``
from tiny ``CLIPTextConfig``s, a ``T5EncoderModel`` from a tiny ``T5Config`` with a
``T5TokenizerFast`` built over an in-memory Unigram vocabulary, and the real
``StableDiffusionPipeline``, ``StableDiffusionXLPipeline`` and
``StableDiffusion3Pipeline`` around them. The widths are small and all different
(CLIP-L stand-in 16, CLIP-G stand-in 24 with projection 20, T5 stand-in 64), so every
concatenation and padding shows in the shapes. Defaults are observed by calling or
building with the argument left out, not read from signatures.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import string

import pytest
import torch
from diffusers import (
    EulerDiscreteScheduler,
    FluxPipeline,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
)
from tiny import (
    EMBED_DIM,
    HEIGHT,
    WIDTH,
    hooked_forwards,
    logged_messages,
    replay_model_offload,
    start_latents,
    tiny_image_encoder,
    tiny_sd3_pipeline,
    tiny_sd3_transformer,
    tiny_sd_pipeline,
    tiny_sdxl_unet,
    tiny_text_encoder,
    tiny_tokenizer,
    tiny_unet,
    tiny_vae,
)
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    T5Config,
    T5EncoderModel,
    T5TokenizerFast,
)

#: stand-ins for CLIP ViT-L/14 (768), OpenCLIP ViT-bigG/14 (1280, projection 1280) and
#: T5-v1.1-XXL (4096): small, and all different so that each join shows in the shapes
CLIP_L, CLIP_G, CLIP_G_PROJ, T5_WIDTH = 16, 24, 20, 64
#: SDXL's addition_time_embed_dim is 256; six micro-conditioning numbers are embedded
TIME_EMBED = 8
#: a prompt of 80 one-letter words: with the tiny tokenizer, 80 tokens + start + end
LONG_PROMPT = " ".join(string.ascii_lowercase[i % 26] for i in range(80))


# ---------------------------------------------------------------- builders (this page only)


def clip(hidden_size, projection_dim=None, layers=3, seed=0):
    """A tiny CLIP text encoder; with ``projection_dim``, the ...WithProjection class."""
    return tiny_text_encoder(
        hidden_size,
        seed=seed,
        with_projection=bool(projection_dim),
        num_hidden_layers=layers,
        projection_dim=projection_dim or hidden_size,
    )


def t5_tokenizer():
    """A real T5TokenizerFast over an in-memory Unigram vocabulary: letters, no model file."""
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [("\u2581" + c, -1.0) for c in string.ascii_lowercase]
    vocab += [(c, -3.0) for c in string.ascii_lowercase]
    return T5TokenizerFast(vocab=vocab, extra_ids=0)


def t5_encoder():
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=64, d_model=T5_WIDTH, d_kv=8, d_ff=2 * T5_WIDTH, num_layers=1, num_heads=4
    )
    return T5EncoderModel(config).eval()


def sdxl_unet():
    """A UNet2DConditionModel with SDXL's `text_time` added conditioning, two levels."""
    return tiny_sdxl_unet(CLIP_G_PROJ, cross_attention_dim=CLIP_L + CLIP_G)


def sdxl_pipeline(tokenizers, encoders=True, **config):
    """The real SDXL pipeline; ``encoders=False``: no text encoder and no tokenizer at all."""
    pipe = StableDiffusionXLPipeline(
        vae=tiny_vae(),
        text_encoder=clip(CLIP_L, seed=1) if encoders else None,
        text_encoder_2=clip(CLIP_G, projection_dim=CLIP_G_PROJ, seed=2) if encoders else None,
        tokenizer=tokenizers[0] if encoders else None,
        tokenizer_2=tokenizers[1] if encoders else None,
        unet=sdxl_unet(),
        scheduler=EulerDiscreteScheduler(),
        add_watermarker=False,
        **config,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sd3_pipeline(tokenizers, with_t5=True, with_clip=True):
    """The real SD3 pipeline; ``with_clip=False`` / ``with_t5=False`` drop those encoders."""
    transformer = tiny_sd3_transformer(
        joint_attention_dim=T5_WIDTH, pooled_projection_dim=CLIP_L + CLIP_G_PROJ
    )
    return tiny_sd3_pipeline(
        transformer=transformer,
        text_encoder=clip(CLIP_L, projection_dim=CLIP_L, seed=1) if with_clip else None,
        text_encoder_2=clip(CLIP_G, projection_dim=CLIP_G_PROJ, seed=2) if with_clip else None,
        text_encoder_3=t5_encoder() if with_t5 else None,
        tokenizer=tokenizers[0] if with_clip else None,
        tokenizer_2=tokenizers[1] if with_clip else None,
        tokenizer_3=t5_tokenizer() if with_t5 else None,
    )


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """Two tiny CLIP tokenizers (SDXL and SD3 have one per CLIP encoder)."""
    return [tiny_tokenizer(tmp_path_factory.mktemp(f"tok{i}")) for i in (1, 2)]


@pytest.fixture(scope="module")
def sd_text_pipe(tokenizers):
    """The real StableDiffusionPipeline with a tiny tokenizer and CLIPTextModel (width 32)."""
    return tiny_sd_pipeline(tokenizer=tokenizers[0], text_encoder=tiny_text_encoder())


@pytest.fixture(scope="module")
def sdxl_pipe(tokenizers):
    return sdxl_pipeline(tokenizers)


@pytest.fixture(scope="module")
def sd3_pipe(tokenizers):
    return sd3_pipeline(tokenizers)


@pytest.fixture
def legacy_clip_layout(monkeypatch):
    """Give ``CLIPTextModel`` back a ``text_model`` attribute (the model itself).

    transformers 5 flattened ``CLIPTextModel``: ``final_layer_norm`` sits on the model, and
    the ``text_model`` submodule that ``StableDiffusionPipeline``'s ``clip_skip`` branch
    reads is gone (see ``test_clip_skip_fails_with_a_flattened_clip_text_model``). This
    restores the old attribute path the way downstream projects patch it, so the branch's
    own behaviour can be checked: ``text_model.final_layer_norm`` is the same module.
    """
    monkeypatch.setattr(CLIPTextModel, "text_model", property(lambda self: self), raising=False)


def diffusers_warnings():
    """Collect what diffusers logs at its default level, WARNING (its logger does not propagate)."""
    return logged_messages("diffusers", logging.WARNING)


def ids(tokenizer, prompt, length=77):
    return tokenizer(
        prompt, padding="max_length", max_length=length, truncation=True, return_tensors="pt"
    ).input_ids


def hidden(encoder, input_ids):
    with torch.no_grad():
        return encoder(input_ids, output_hidden_states=True)


# ---------------------------------------------------------------- the CLIP window


def test_clip_text_config_has_77_positions():
    """`CLIPTextConfig` defaults to `max_position_embeddings=77`: CLIP's text encoder has a learned position embedding for 77 token positions and no more."""
    config = CLIPTextConfig()
    assert config.max_position_embeddings == 77
    model = clip(8, layers=1)
    assert model.embeddings.position_embedding.weight.shape[0] == 77


def test_encode_prompt_pads_to_77_and_returns_the_last_hidden_state(sd_text_pipe):
    """`StableDiffusionPipeline.encode_prompt` pads every prompt to `tokenizer.model_max_length` (77) and returns the text encoder's per-token last hidden state as `prompt_embeds`, `(B, 77, hidden_size)`: `(B, 77, 768)` for SD 1.x."""
    pipe = sd_text_pipe
    for prompt in (["a cat", "abc"], ["ab cd ef gh ij", LONG_PROMPT]):
        prompt_embeds, _ = pipe.encode_prompt(prompt, "cpu", 1, False)
        assert prompt_embeds.shape == (2, 77, EMBED_DIM)
        expected = hidden(pipe.text_encoder, ids(pipe.tokenizer, prompt)).last_hidden_state
        torch.testing.assert_close(prompt_embeds, expected)


def test_long_prompt_is_truncated_with_a_warning(sd_text_pipe, sdxl_pipe):
    """In `StableDiffusionPipeline` and `StableDiffusionXLPipeline`, a prompt of more than 75 tokens (77 with the start and end tokens) keeps its start token, its first 75 tokens and an end token; `encode_prompt` logs a warning that lists the removed text (SDXL one per tokenizer that cuts), and the removed words change nothing; a prompt of 75 tokens is not cut. A `negative_prompt` of more than 75 tokens is cut the same way with no warning at all.

    With the tiny tokenizer each one-letter word is one token: 75, 76 and 80 words are tried,
    as the prompt of both pipelines and (80) as their negative prompt.
    """
    pipe = sd_text_pipe
    kept = " ".join(LONG_PROMPT.split()[:75])
    with diffusers_warnings() as messages:
        long_embeds, _ = pipe.encode_prompt(LONG_PROMPT, "cpu", 1, False)
    assert len(messages) == 1
    assert "truncated because CLIP can only handle sequences up to 77 tokens" in messages[0]
    assert messages[0].endswith("['x y z a b']")  # words 76 to 80
    with diffusers_warnings() as messages:
        kept_embeds, _ = pipe.encode_prompt(kept, "cpu", 1, False)
    assert messages == []  # 75 tokens + start + end = 77: nothing cut
    torch.testing.assert_close(long_embeds, kept_embeds)
    assert ids(pipe.tokenizer, LONG_PROMPT)[0, -1] == pipe.tokenizer.eos_token_id
    with diffusers_warnings() as messages:  # the edge: 76 tokens are one too many
        pipe.encode_prompt(" ".join(LONG_PROMPT.split()[:76]), "cpu", 1, False)
    assert len(messages) == 1 and messages[0].endswith("['x']")
    with diffusers_warnings() as messages:
        xl_long = sdxl_pipe.encode_prompt(
            LONG_PROMPT, device="cpu", do_classifier_free_guidance=False
        )
    assert len(messages) == 2 and all(m.endswith("['x y z a b']") for m in messages)
    with diffusers_warnings() as messages:
        xl_kept = sdxl_pipe.encode_prompt(kept, device="cpu", do_classifier_free_guidance=False)
    assert messages == []  # SDXL's edge: 75 tokens pass both tokenizers uncut
    torch.testing.assert_close(xl_long[0], xl_kept[0])  # prompt_embeds
    torch.testing.assert_close(xl_long[2], xl_kept[2])  # pooled_prompt_embeds
    for prompt_2, warned in ((None, 2), ("ab", 1)):  # 76 tokens; a short prompt_2 is not cut
        with diffusers_warnings() as messages:
            sdxl_pipe.encode_prompt(" ".join(LONG_PROMPT.split()[:76]), prompt_2=prompt_2,
                                    device="cpu", do_classifier_free_guidance=False)  # fmt: skip
        assert len(messages) == warned and all(m.endswith("['x']") for m in messages)
    # the negative prompt: cut to the same 75 tokens, silently, in both pipelines
    with diffusers_warnings() as messages:
        negative = pipe.encode_prompt("ab", "cpu", 1, True, negative_prompt=LONG_PROMPT)[1]
        xl_negative = sdxl_pipe.encode_prompt("ab", device="cpu", negative_prompt=LONG_PROMPT)
    assert messages == []
    torch.testing.assert_close(negative, kept_embeds)
    torch.testing.assert_close(xl_negative[1], xl_kept[0])  # negative_prompt_embeds
    torch.testing.assert_close(xl_negative[3], xl_kept[2])  # negative_pooled_prompt_embeds


def test_clip_is_causal_and_padding_carries_the_prompt(sd_text_pipe, record_calls):
    """CLIP's text encoder is causal and `StableDiffusionPipeline.encode_prompt` passes it no attention mask: a token's vector does not depend on the words after it, and the padding positions after the end token (`CLIPTokenizer` pads with `<|endoftext|>` by default) differ from prompt to prompt."""
    pipe = sd_text_pipe
    assert pipe.tokenizer.pad_token == pipe.tokenizer.eos_token == "<|endoftext|>"
    calls = record_calls(pipe.text_encoder).calls
    embeds, _ = pipe.encode_prompt(["ab cd", "ab ef"], "cpu", 1, False)
    assert calls[0][1].get("attention_mask") is None
    # [start, a, b</w>, c|e, d</w>|f</w>, end, pad...]: positions 0-2 see the same words
    torch.testing.assert_close(embeds[0, :3], embeds[1, :3])
    assert not torch.allclose(embeds[0, 3:], embeds[1, 3:])
    assert (embeds[0, 10:] - embeds[1, 10:]).abs().amax(dim=-1).min() > 1e-4


def test_pooled_output_is_the_projected_end_token():
    """`CLIPTextModelWithProjection` returns one pooled vector per prompt, `text_embeds` `(B, projection_dim)`: the final-layer-normed hidden state at the first end-of-text token, passed through `text_projection`."""
    encoder = clip(CLIP_G, projection_dim=CLIP_G_PROJ)
    input_ids = torch.tensor([[0, 2, 5, 1] + [1] * 73, [0, 2, 4, 6, 9, 1] + [1] * 71])
    out = hidden(encoder, input_ids)
    assert out.text_embeds.shape == (2, CLIP_G_PROJ)
    last = out.last_hidden_state
    at_end = torch.stack([last[0, 3], last[1, 5]])  # the first end-of-text token of each row
    torch.testing.assert_close(out.text_embeds, encoder.text_projection(at_end))
    final_norm = encoder.text_model.final_layer_norm
    torch.testing.assert_close(last, final_norm(out.hidden_states[-1]))


# ---------------------------------------------------------------- clip_skip and negatives


def test_clip_skip_takes_an_earlier_layer_through_the_final_layer_norm(
    sd_text_pipe, legacy_clip_layout
):
    """In `StableDiffusionPipeline.encode_prompt`, `clip_skip=k` takes `hidden_states[-(k + 1)]` of the `num_hidden_layers + 1` hidden states (embeddings, then each layer; `clip_skip=1` is the penultimate layer) and passes it through `text_encoder.text_model.final_layer_norm`, as the last hidden state is.

    Runs with ``legacy_clip_layout``: the installed transformers has no
    ``CLIPTextModel.text_model`` (next test).
    """
    pipe = sd_text_pipe
    out = hidden(pipe.text_encoder, ids(pipe.tokenizer, "ab cd"))
    # the embedding output, then one entry per layer
    assert len(out.hidden_states) == pipe.text_encoder.config.num_hidden_layers + 1
    final_norm = pipe.text_encoder.final_layer_norm
    for k in (1, 2):
        prompt_embeds, _ = pipe.encode_prompt("ab cd", "cpu", 1, False, clip_skip=k)
        torch.testing.assert_close(prompt_embeds, final_norm(out.hidden_states[-(k + 1)]))
        assert not torch.allclose(prompt_embeds, out.hidden_states[-(k + 1)])
    no_skip, _ = pipe.encode_prompt("ab cd", "cpu", 1, False)
    torch.testing.assert_close(no_skip, out.last_hidden_state)
    torch.testing.assert_close(no_skip, final_norm(out.hidden_states[-1]))


def test_clip_skip_fails_with_a_flattened_clip_text_model(sd_text_pipe, sdxl_pipe, sd3_pipe):
    """With the installed transformers, `CLIPTextModel` has no `text_model` submodule, so `StableDiffusionPipeline.encode_prompt` raises `AttributeError` for any `clip_skip` (diffusers issue [#14124](https://github.com/huggingface/diffusers/issues/14124)); `clip_skip=None` and the `clip_skip` of `StableDiffusionXLPipeline` and `StableDiffusion3Pipeline` are unaffected."""
    pipe = sd_text_pipe
    assert not hasattr(pipe.text_encoder, "text_model")
    with pytest.raises(AttributeError, match="text_model"):
        pipe.encode_prompt("ab cd", "cpu", 1, False, clip_skip=1)
    assert pipe.encode_prompt("ab cd", "cpu", 1, False)[0].shape == (1, 77, EMBED_DIM)
    xl = sdxl_pipe.encode_prompt("ab", device="cpu", do_classifier_free_guidance=False, clip_skip=1)
    assert xl[0].shape == (1, 77, CLIP_L + CLIP_G)
    sd3 = sd3_pipe.encode_prompt(
        "ab", None, None, device="cpu", do_classifier_free_guidance=False, clip_skip=1
    )
    assert sd3[0].shape == (1, 77 + 256, T5_WIDTH)


def test_negative_prompt_defaults_to_the_encoded_empty_string(sd_text_pipe):
    """With CFG on and no `negative_prompt`, `StableDiffusionPipeline.encode_prompt` encodes `""` padded to 77 tokens through the same tokenizer and text encoder: `negative_prompt_embeds` has the shape of `prompt_embeds` and is not zeros."""
    pipe = sd_text_pipe
    prompt_embeds, negative = pipe.encode_prompt(["ab", "cd"], "cpu", 1, True)
    assert negative.shape == prompt_embeds.shape == (2, 77, EMBED_DIM)
    empty = hidden(pipe.text_encoder, ids(pipe.tokenizer, ["", ""])).last_hidden_state
    torch.testing.assert_close(negative, empty)
    assert negative.abs().min() > 0
    _, other = pipe.encode_prompt(["ab", "cd"], "cpu", 1, True, negative_prompt=["ef", "gh"])
    torch.testing.assert_close(other, pipe.encode_prompt(["ef", "gh"], "cpu", 1, False)[0])


def test_clip_skip_does_not_reach_the_negative_prompt(sd_text_pipe, sdxl_pipe, legacy_clip_layout):
    """`clip_skip` changes only `prompt_embeds`: the negative prompt is encoded from the last hidden state in `StableDiffusionPipeline` and from `hidden_states[-2]` in `StableDiffusionXLPipeline`, whatever `clip_skip` is."""
    pipe = sd_text_pipe
    _, negative = pipe.encode_prompt("ab", "cpu", 1, True, negative_prompt="cd", clip_skip=1)
    torch.testing.assert_close(negative, pipe.encode_prompt("cd", "cpu", 1, False)[0])
    xl = sdxl_pipe
    plain = xl.encode_prompt("cd", device="cpu", do_classifier_free_guidance=False)[0]
    skipped = xl.encode_prompt(
        "ab", device="cpu", negative_prompt="cd", clip_skip=1, do_classifier_free_guidance=True
    )[1]
    torch.testing.assert_close(skipped, plain)


# ---------------------------------------------------------------- SDXL: two encoders


def test_sdxl_concatenates_penultimate_states_on_the_channel_axis(sdxl_pipe):
    """`StableDiffusionXLPipeline.encode_prompt` runs both CLIP encoders on the prompt (`text_encoder_2` on `prompt_2` if given), takes `hidden_states[-2]` (the penultimate layer, without the final layer norm) from each, and concatenates them on the channel axis: `(B, 77, 768 + 1280)` = `(B, 77, 2048)` in SDXL, the UNet's `cross_attention_dim`."""
    pipe = sdxl_pipe
    prompt_embeds, _, _, _ = pipe.encode_prompt(
        ["ab cd", "ef"], device="cpu", do_classifier_free_guidance=False
    )
    assert prompt_embeds.shape == (2, 77, CLIP_L + CLIP_G)
    assert prompt_embeds.shape[-1] == pipe.unet.config.cross_attention_dim
    first = hidden(pipe.text_encoder, ids(pipe.tokenizer, ["ab cd", "ef"]))
    second = hidden(pipe.text_encoder_2, ids(pipe.tokenizer_2, ["ab cd", "ef"]))
    torch.testing.assert_close(prompt_embeds[..., :CLIP_L], first.hidden_states[-2])
    torch.testing.assert_close(prompt_embeds[..., CLIP_L:], second.hidden_states[-2])
    final_norm = pipe.text_encoder.final_layer_norm
    assert not torch.allclose(prompt_embeds[..., :CLIP_L], final_norm(first.hidden_states[-2]))
    # prompt_2 goes to text_encoder_2 only
    both = pipe.encode_prompt(
        "ab cd", prompt_2="gh", device="cpu", do_classifier_free_guidance=False
    )
    torch.testing.assert_close(both[0][..., :CLIP_L], prompt_embeds[:1, :, :CLIP_L])
    second_only = hidden(pipe.text_encoder_2, ids(pipe.tokenizer_2, "gh"))
    torch.testing.assert_close(both[0][..., CLIP_L:], second_only.hidden_states[-2])
    torch.testing.assert_close(both[2], second_only.text_embeds)


def test_sdxl_pooled_embeds_come_from_text_encoder_2(sdxl_pipe):
    """`StableDiffusionXLPipeline`'s `pooled_prompt_embeds` is the projected end-token vector `text_embeds` of `text_encoder_2` alone, `(B, projection_dim)`: `(B, 1280)` in SDXL."""
    pipe = sdxl_pipe
    _, _, pooled, _ = pipe.encode_prompt(
        ["ab cd", "ef"], device="cpu", do_classifier_free_guidance=False
    )
    assert pooled.shape == (2, CLIP_G_PROJ)
    second = hidden(pipe.text_encoder_2, ids(pipe.tokenizer_2, ["ab cd", "ef"]))
    torch.testing.assert_close(pooled, second.text_embeds)


def test_sdxl_clip_skip_counts_from_the_penultimate_layer(sdxl_pipe, sd3_pipe):
    """In `StableDiffusionXLPipeline.encode_prompt` and `StableDiffusion3Pipeline.encode_prompt`, `clip_skip=k` takes `hidden_states[-(k + 2)]` of both CLIP encoders, counting from the penultimate layer, and applies no final layer norm."""
    pipe = sdxl_pipe
    prompt_embeds = pipe.encode_prompt(
        "ab cd", device="cpu", do_classifier_free_guidance=False, clip_skip=1
    )[0]
    first = hidden(pipe.text_encoder, ids(pipe.tokenizer, "ab cd")).hidden_states[-3]
    second = hidden(pipe.text_encoder_2, ids(pipe.tokenizer_2, "ab cd")).hidden_states[-3]
    torch.testing.assert_close(prompt_embeds, torch.cat([first, second], dim=-1))
    sd3 = sd3_pipe
    for k in (1, 2):
        clip_part = sd3.encode_prompt("ab cd", None, None, device="cpu", clip_skip=k,
                                      do_classifier_free_guidance=False, max_sequence_length=8)[0][:, :77]  # fmt: skip
        first = hidden(sd3.text_encoder, ids(sd3.tokenizer, "ab cd")).hidden_states[-(k + 2)]
        second = hidden(sd3.text_encoder_2, ids(sd3.tokenizer_2, "ab cd")).hidden_states[-(k + 2)]
        torch.testing.assert_close(clip_part[..., : CLIP_L + CLIP_G], torch.cat([first, second], dim=-1))  # fmt: skip


def test_sdxl_force_zeros_for_empty_prompt(tokenizers, sdxl_pipe, tmp_path):
    """With `force_zeros_for_empty_prompt=True` (the default of `StableDiffusionXLPipeline`) and no `negative_prompt`, `negative_prompt_embeds` and `negative_pooled_prompt_embeds` are zeros; an explicit `negative_prompt=""`, or the flag set to `False`, encodes the empty string instead; `save_pretrained` writes the flag to `model_index.json`, and `StableDiffusionXLPipeline.from_pretrained` reads it back from there unless the flag is passed to it."""
    assert sdxl_pipe.config.force_zeros_for_empty_prompt is True  # built without the flag
    pipe = sdxl_pipe
    prompt_embeds, negative, pooled, negative_pooled = pipe.encode_prompt("ab", device="cpu")
    assert negative.shape == prompt_embeds.shape and negative_pooled.shape == pooled.shape
    assert not negative.any() and not negative_pooled.any()
    empty = pipe.encode_prompt("", device="cpu", do_classifier_free_guidance=False)
    explicit = pipe.encode_prompt("ab", device="cpu", negative_prompt="")
    torch.testing.assert_close(explicit[1], empty[0])
    torch.testing.assert_close(explicit[3], empty[2])
    assert explicit[1].abs().min() > 0
    unflagged = sdxl_pipeline(tokenizers, force_zeros_for_empty_prompt=False)
    unflagged.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "model_index.json").read_text(encoding="utf-8"))
    assert saved["force_zeros_for_empty_prompt"] is False
    off = unflagged.encode_prompt("ab", device="cpu")
    torch.testing.assert_close(off[1], empty[0])
    torch.testing.assert_close(off[3], empty[2])
    loaded = StableDiffusionXLPipeline.from_pretrained(tmp_path)  # as saved, not the default
    assert loaded.config.force_zeros_for_empty_prompt is False
    torch.testing.assert_close(loaded.encode_prompt("ab", device="cpu")[1], empty[0])
    passed = StableDiffusionXLPipeline.from_pretrained(tmp_path, force_zeros_for_empty_prompt=True)
    assert passed.config.force_zeros_for_empty_prompt is True
    assert not passed.encode_prompt("ab", device="cpu")[1].any()


def test_sdxl_add_time_ids_are_six_numbers(sdxl_pipe):
    """`StableDiffusionXLPipeline._get_add_time_ids` returns `original_size + crops_coords_top_left + target_size` as a `(1, 6)` tensor, and raises `ValueError` unless `addition_time_embed_dim * 6 + text_encoder_projection_dim` equals the UNet's `add_embedding.linear_1.in_features` (256 * 6 + 1280 = 2816 in SDXL)."""
    pipe = sdxl_pipe
    time_ids = pipe._get_add_time_ids(
        (1024, 768), (32, 16), (512, 512), torch.float32, text_encoder_projection_dim=CLIP_G_PROJ
    )
    assert time_ids.tolist() == [[1024.0, 768.0, 32.0, 16.0, 512.0, 512.0]]
    assert pipe.unet.add_embedding.linear_1.in_features == 6 * TIME_EMBED + CLIP_G_PROJ
    with pytest.raises(ValueError, match="Model expects an added time embedding vector"):
        pipe._get_add_time_ids(
            (64, 64), (0, 0), (64, 64), torch.float32, text_encoder_projection_dim=CLIP_G
        )


def test_sdxl_pipeline_passes_pooled_text_and_time_ids(sdxl_pipe, record_calls):
    """With CFG on, `StableDiffusionXLPipeline` gives the UNet `added_cond_kwargs={"text_embeds": ..., "time_ids": ...}` at batch `2B`, negative rows first, with `original_size` and `target_size` defaulting to `(height, width)` and `crops_coords_top_left` to `(0, 0)`."""
    pipe = sdxl_pipe
    calls = record_calls(pipe.unet).calls
    _, _, pooled, negative_pooled = pipe.encode_prompt("ab cd", device="cpu")
    pipe(
        "ab cd",
        num_inference_steps=2,
        height=HEIGHT,
        width=WIDTH,
        latents=start_latents(),
        output_type="latent",
    )
    assert len(calls) == 2
    for _, kwargs in calls:
        assert kwargs["encoder_hidden_states"].shape == (2, 77, CLIP_L + CLIP_G)
        added = kwargs["added_cond_kwargs"]
        torch.testing.assert_close(added["text_embeds"], torch.cat([negative_pooled, pooled]))
        assert added["time_ids"].tolist() == [[HEIGHT, WIDTH, 0, 0, HEIGHT, WIDTH]] * 2


def test_sdxl_unet_adds_pooled_text_and_time_ids_to_the_time_embedding(sdxl_pipe, record_calls):
    """Inside `UNet2DConditionModel` (`addition_embed_type="text_time"`), each of the six `time_ids` is embedded sinusoidally to `addition_time_embed_dim` channels, concatenated after `text_embeds`, passed through `add_embedding`, and added to the timestep embedding that every ResNet block receives."""
    unet = sdxl_pipe.unet
    g = torch.Generator().manual_seed(0)
    text_embeds = torch.randn(2, CLIP_G_PROJ, generator=g)
    time_ids = torch.tensor([[64.0, 64, 0, 0, 64, 64], [128.0, 96, 8, 4, 64, 64]])
    t = torch.tensor(500)
    added = record_calls(unet.add_embedding).calls
    resnet = record_calls(unet.down_blocks[0].resnets[0]).calls
    with torch.no_grad():
        unet(
            torch.randn(2, 4, 8, 8, generator=g),
            t,
            encoder_hidden_states=torch.randn(2, 77, CLIP_L + CLIP_G, generator=g),
            added_cond_kwargs={"text_embeds": text_embeds, "time_ids": time_ids},
        )
        time_embeds = unet.add_time_proj(time_ids.flatten()).reshape(2, 6 * TIME_EMBED)
        torch.testing.assert_close(added[0][0][0], torch.cat([text_embeds, time_embeds], dim=-1))
        emb = unet.time_embedding(unet.time_proj(t.expand(2)))
        expected = emb + unet.add_embedding(added[0][0][0])
    torch.testing.assert_close(resnet[0][0][1], expected)


# ---------------------------------------------------------------- SD3: three encoders


def test_sd3_joins_clip_and_t5_tokens(sd3_pipe):
    """`StableDiffusion3Pipeline.encode_prompt` concatenates the two CLIP encoders' `hidden_states[-2]` on the channel axis, zero-pads them to T5's width, and appends the T5 tokens on the sequence axis: `prompt_embeds` is `(B, 77 + max_sequence_length, 4096)` in SD3."""
    pipe = sd3_pipe
    prompt_embeds, _, _, _ = pipe.encode_prompt(
        ["ab cd", "ef"],
        None,
        None,
        device="cpu",
        do_classifier_free_guidance=False,
        max_sequence_length=12,
    )
    assert prompt_embeds.shape == (2, 77 + 12, T5_WIDTH)
    first = hidden(pipe.text_encoder, ids(pipe.tokenizer, ["ab cd", "ef"])).hidden_states[-2]
    second = hidden(pipe.text_encoder_2, ids(pipe.tokenizer_2, ["ab cd", "ef"])).hidden_states[-2]
    clip_part = prompt_embeds[:, :77]
    torch.testing.assert_close(clip_part[..., :CLIP_L], first)
    torch.testing.assert_close(clip_part[..., CLIP_L : CLIP_L + CLIP_G], second)
    assert not clip_part[..., CLIP_L + CLIP_G :].any()  # zero padding up to T5's width
    t5_ids = ids(pipe.tokenizer_3, ["ab cd", "ef"], length=12)
    with torch.no_grad():
        t5 = pipe.text_encoder_3(t5_ids).last_hidden_state
    torch.testing.assert_close(prompt_embeds[:, 77:], t5)


def test_sd3_pooled_is_clip_l_then_clip_g(sd3_pipe):
    """`StableDiffusion3Pipeline`'s `pooled_prompt_embeds` is CLIP-L's projected end-token vector followed by CLIP-G's: `(B, 768 + 1280)` = `(B, 2048)` in SD3; T5 contributes no pooled vector."""
    pipe = sd3_pipe
    _, _, pooled, _ = pipe.encode_prompt(
        "ab cd", None, None, device="cpu", do_classifier_free_guidance=False
    )
    assert pooled.shape == (1, CLIP_L + CLIP_G_PROJ)
    first = hidden(pipe.text_encoder, ids(pipe.tokenizer, "ab cd")).text_embeds
    second = hidden(pipe.text_encoder_2, ids(pipe.tokenizer_2, "ab cd")).text_embeds
    torch.testing.assert_close(pooled, torch.cat([first, second], dim=-1))


def test_sd3_max_sequence_length_defaults_to_256(sd3_pipe, record_calls):
    """`max_sequence_length` defaults to 256 in `StableDiffusion3Pipeline.__call__` and `encode_prompt`, and `check_inputs` rejects values above 512.

    ``__call__`` and ``encode_prompt`` run without the argument; ``__call__`` with 512 runs
    and with 513 raises from ``check_inputs``.
    """
    pipe = sd3_pipe
    common = dict(num_inference_steps=1, height=HEIGHT, width=WIDTH, output_type="latent")
    calls = record_calls(pipe.transformer).calls
    pipe("ab", **common)
    assert calls[0][1]["encoder_hidden_states"].shape == (2, 77 + 256, T5_WIDTH)
    prompt_embeds = pipe.encode_prompt(
        "ab", None, None, device="cpu", do_classifier_free_guidance=False
    )[0]
    assert prompt_embeds.shape == (1, 77 + 256, T5_WIDTH)
    calls.clear()
    pipe("ab", guidance_scale=1.0, max_sequence_length=512, **common)
    assert calls[0][1]["encoder_hidden_states"].shape == (1, 77 + 512, T5_WIDTH)
    with pytest.raises(ValueError, match="cannot be greater than 512"):
        pipe("ab", max_sequence_length=513, **common)


def test_sd3_t5_pads_and_truncates_to_max_sequence_length(sd3_pipe):
    """T5 tokens are padded to `max_sequence_length` and truncated there with a logged warning, so the T5 part of `prompt_embeds` always has exactly `max_sequence_length` rows whatever the prompt's length."""
    pipe = sd3_pipe
    for length in (8, 20):
        with diffusers_warnings() as messages:
            t5 = pipe._get_t5_prompt_embeds("ab cd ef gh ij kl", max_sequence_length=length)
        assert t5.shape == (1, length, T5_WIDTH)
        truncated = [m for m in messages if "`max_sequence_length` is set to" in m]
        assert len(truncated) == (length == 8)  # 6 words of 2 tokens + end token = 13


def test_sd3_t5_runs_without_an_attention_mask(sd3_pipe, record_calls):
    """`_get_t5_prompt_embeds` (SD3's and Flux's) passes T5 no attention mask, and T5's encoder attends in both directions: the prompt's own T5 vectors attend to the padding, so changing `max_sequence_length` changes them, not only the number of rows."""
    pipe = sd3_pipe
    flux = FluxPipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None,
                        text_encoder_2=pipe.text_encoder_3, tokenizer_2=pipe.tokenizer_3,
                        transformer=None)  # fmt: skip
    calls = record_calls(pipe.text_encoder_3).calls
    flux_t5 = functools.partial(flux._get_t5_prompt_embeds, dtype=torch.float32)  # no CLIP here
    for get_t5 in (pipe._get_t5_prompt_embeds, flux_t5):
        calls.clear()
        short = get_t5("ab cd", max_sequence_length=8)
        long = get_t5("ab cd", max_sequence_length=20)
        assert [kwargs.get("attention_mask") for _, kwargs in calls] == [None, None]
        assert [len(args) for args, _ in calls] == [1, 1]  # input_ids only, no mask
        # "ab cd" is 4 tokens + the end token; with a mask the 5 rows would match exactly
        assert (short[:, :5] - long[:, :5]).abs().amax() > 1e-4
    with torch.no_grad():
        t5_ids = ids(pipe.tokenizer_3, "ab cd", length=20)
        masked = pipe.text_encoder_3(t5_ids, attention_mask=(t5_ids != 0).long())[0]
        masked_short = pipe.text_encoder_3(
            t5_ids[:, :8], attention_mask=(t5_ids[:, :8] != 0).long()
        )[0]
    torch.testing.assert_close(masked[:, :5], masked_short[:, :5])


def test_no_attention_mask_reaches_encoders_or_denoiser(
    sd_text_pipe, sdxl_pipe, sd3_pipe, record_calls
):
    """In `StableDiffusionPipeline`, `StableDiffusionXLPipeline` and `StableDiffusion3Pipeline` (SD 1.x, SDXL and SD3) no attention mask reaches the encoders (CLIP or T5) or the denoiser: in each pipeline's `__call__` with CFG, every text encoder gets the input ids alone and every denoiser call carries no mask.

    A pre-hook on every text encoder and on the UNet or transformer records each call's
    arguments; one step each.
    """
    cases = [(sd_text_pipe, {}), (sdxl_pipe, {}), (sd3_pipe, {"max_sequence_length": 12})]
    for pipe, extra in cases:
        encoders = [getattr(pipe, n, None) for n in ("text_encoder", "text_encoder_2", "text_encoder_3")]  # fmt: skip
        encoder_calls = [record_calls(e).calls for e in encoders if e is not None]
        denoiser = pipe.unet if hasattr(pipe, "unet") else pipe.transformer
        denoiser_calls = record_calls(denoiser).calls
        pipe("ab cd", num_inference_steps=1, height=HEIGHT, width=WIDTH,
             output_type="latent", **extra)  # fmt: skip
        for calls in encoder_calls:
            assert calls, type(pipe).__name__
            for args, kwargs in calls:
                assert len(args) == 1 and kwargs.get("attention_mask") is None
        assert len(denoiser_calls) == 1
        for _, kwargs in denoiser_calls:
            assert kwargs["encoder_hidden_states"].shape[0] == 2  # CFG on
            masks = {k: v for k, v in kwargs.items() if "mask" in k and v is not None}
            assert masks == {} and not (kwargs.get("cross_attention_kwargs") or {})


def test_sd3_without_t5_uses_zeros(tokenizers, record_calls):
    """With `text_encoder_3=None`, `_get_t5_prompt_embeds` returns zeros of shape `(B, max_sequence_length, joint_attention_dim)`, so `prompt_embeds` keeps its shape and only the CLIP tokens carry the prompt; in `StableDiffusion3Pipeline.__call__` the transformer still receives those zero rows, 77 + `max_sequence_length` text tokens, at every step."""
    pipe = sd3_pipeline(tokenizers, with_t5=False)
    t5 = pipe._get_t5_prompt_embeds(["ab", "cd"], num_images_per_prompt=2, max_sequence_length=12)
    assert t5.shape == (4, 12, pipe.transformer.config.joint_attention_dim)
    assert not t5.any()
    prompt_embeds, _, _, _ = pipe.encode_prompt(
        "ab", None, None, device="cpu", do_classifier_free_guidance=False, max_sequence_length=12
    )
    assert prompt_embeds.shape == (1, 77 + 12, T5_WIDTH)
    assert not prompt_embeds[:, 77:].any() and prompt_embeds[:, :77].any()
    calls = record_calls(pipe.transformer).calls
    with torch.no_grad():
        pipe("ab", guidance_scale=1.0, num_inference_steps=2, max_sequence_length=12,
             height=HEIGHT, width=HEIGHT, output_type="latent")  # fmt: skip
    assert len(calls) == 2
    for _, kwargs in calls:
        text = kwargs["encoder_hidden_states"]
        assert text.shape == (1, 77 + 12, T5_WIDTH)
        assert not text[:, 77:].any() and text[:, :77].any()


def test_sd3_negative_prompt_is_the_encoded_empty_string(sd3_pipe):
    """`StableDiffusion3Pipeline` has no `force_zeros_for_empty_prompt`: a missing negative prompt is `""`, encoded through all three encoders with `clip_skip=None`, so `negative_prompt_embeds` is not zeros."""
    pipe = sd3_pipe
    assert "force_zeros_for_empty_prompt" not in pipe.config
    empty = pipe.encode_prompt(
        "", None, None, device="cpu", do_classifier_free_guidance=False, max_sequence_length=12
    )
    out = pipe.encode_prompt("ab", None, None, device="cpu", clip_skip=1, max_sequence_length=12)
    torch.testing.assert_close(out[1], empty[0])
    torch.testing.assert_close(out[3], empty[2])
    assert out[1][:, 77:].abs().amax() > 0


def test_sd3_transformer_defaults_match_the_joined_widths(record_calls):
    """`SD3Transformer2DModel` defaults to `joint_attention_dim=4096` (T5's width) and `pooled_projection_dim=2048` (768 + 1280); every transformer block gets the text tokens through `context_embedder` and a `temb` that is the timestep embedding plus the projected pooled vector."""
    with torch.device("meta"):  # every default: shapes only, no memory
        default = SD3Transformer2DModel()
    assert default.config.joint_attention_dim == default.context_embedder.in_features == 4096
    pooled_in = default.time_text_embed.text_embedder.linear_1.in_features
    assert default.config.pooled_projection_dim == pooled_in == 2048
    torch.manual_seed(0)
    model = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=T5_WIDTH,
        caption_projection_dim=16,
        pooled_projection_dim=36,
        pos_embed_max_size=16,
    ).eval()
    g = torch.Generator().manual_seed(0)
    text, pooled = torch.randn(1, 89, T5_WIDTH, generator=g), torch.randn(1, 36, generator=g)
    t = torch.tensor([500.0])
    blocks = [record_calls(block).calls for block in model.transformer_blocks]
    with torch.no_grad():
        model(torch.randn(1, 4, 8, 8, generator=g), text, pooled, t)
        embed = model.time_text_embed
        temb = embed.timestep_embedder(embed.time_proj(t)) + embed.text_embedder(pooled)
        torch.testing.assert_close(
            blocks[0][0][1]["encoder_hidden_states"], model.context_embedder(text)
        )
    for calls in blocks:
        ((_, kwargs),) = calls
        torch.testing.assert_close(kwargs["temb"], temb)
        assert kwargs["encoder_hidden_states"].shape == (1, 89, 16)
        assert kwargs["hidden_states"].shape == (1, 16, 16)  # (8/2) * (8/2) image tokens


def test_unet_cross_attention_takes_any_number_of_text_tokens():
    """`UNet2DConditionModel` cross-attends to `encoder_hidden_states` of any sequence length: 77 is the CLIP text encoder's window, not a limit of the UNet."""
    unet = tiny_unet()
    g = torch.Generator().manual_seed(0)
    sample = torch.randn(1, 4, 8, 8, generator=g)
    outputs = []
    for length in (5, 77, 154):
        text = torch.randn(1, length, EMBED_DIM, generator=g)
        with torch.no_grad():
            outputs.append(unet(sample, 500, encoder_hidden_states=text).sample)
    assert all(out.shape == sample.shape for out in outputs)
    assert not torch.allclose(outputs[1], outputs[2])


def test_sd3_pipeline_feeds_the_joined_sequence_to_the_transformer(sd3_pipe, record_calls):
    """With CFG on, `StableDiffusion3Pipeline`'s transformer receives `encoder_hidden_states` of shape `(2B, 77 + max_sequence_length, joint_attention_dim)` and `pooled_projections` of shape `(2B, 2048)` (here the stand-in widths) at every step, negative rows first."""
    pipe = sd3_pipe
    calls = record_calls(pipe.transformer).calls
    embeds = pipe.encode_prompt("ab cd", None, None, device="cpu", max_sequence_length=12)
    pipe(
        "ab cd",
        num_inference_steps=2,
        height=HEIGHT,
        width=WIDTH,
        latents=start_latents(),
        output_type="latent",
        max_sequence_length=12,
    )
    assert len(calls) == 2
    for _, kwargs in calls:
        torch.testing.assert_close(
            kwargs["encoder_hidden_states"], torch.cat([embeds[1], embeds[0]])
        )
        torch.testing.assert_close(kwargs["pooled_projections"], torch.cat([embeds[3], embeds[2]]))
        assert kwargs["encoder_hidden_states"].shape == (2, 77 + 12, T5_WIDTH)


# ---------------------------------------------------------------- cost: once per call


def test_text_encoder_runs_once_per_call_not_per_step(sd_text_pipe, record_calls):
    """In a `StableDiffusionPipeline` call with CFG, the text encoder runs twice before the loop (prompt and `""`) on `batch_size` rows, then `prompt_embeds` is repeated to `batch_size * num_images_per_prompt`; the UNet runs once per step on all 77 positions (no `encoder_attention_mask`), so text encoding does not grow with `num_inference_steps`."""
    pipe = sd_text_pipe
    text_calls = record_calls(pipe.text_encoder).calls
    unet_calls = record_calls(pipe.unet).calls
    for steps in (2, 5):
        text_calls.clear(), unet_calls.clear()
        pipe(
            ["ab", "cd"],
            num_inference_steps=steps,
            num_images_per_prompt=3,
            height=HEIGHT,
            width=WIDTH,
            output_type="latent",
        )
        assert [args[0].shape[0] for args, _ in text_calls] == [2, 2]
        assert len(unet_calls) == steps
        assert unet_calls[0][1]["encoder_hidden_states"].shape == (2 * 2 * 3, 77, EMBED_DIM)
        assert unet_calls[0][1].get("encoder_attention_mask") is None  # all 77 positions
    prompt_embeds, _ = pipe.encode_prompt(["ab", "cd"], "cpu", 3, False)
    torch.testing.assert_close(prompt_embeds[:3], prompt_embeds[:1].expand(3, -1, -1))


def test_each_encoder_runs_twice_per_guided_call(sd_text_pipe, sdxl_pipe, sd3_pipe, record_calls):
    """The text encoders run once per call, twice with CFG when the negative prompt is encoded: with CFG on, every encoder of `StableDiffusionPipeline` and `StableDiffusion3Pipeline` runs twice (a missing negative prompt is `""`), and `StableDiffusionXLPipeline`'s twice with a `negative_prompt` but once with its default zeros; with `guidance_scale=1` each runs once.

    Each pipeline's ``__call__`` runs one step; a pre-hook counts every encoder's forwards.
    """
    common = dict(num_inference_steps=1, height=HEIGHT, width=WIDTH, output_type="latent")
    cases = [  # pipeline, extra kwargs, forwards per encoder: CFG on, guidance_scale=1
        (sd_text_pipe, {}, ["text_encoder"], 2),
        (sdxl_pipe, {}, ["text_encoder", "text_encoder_2"], 1),  # force_zeros_for_empty_prompt
        (sdxl_pipe, {"negative_prompt": "cd"}, ["text_encoder", "text_encoder_2"], 2),
        (sd3_pipe, {"max_sequence_length": 8}, ["text_encoder", "text_encoder_2", "text_encoder_3"], 2),
    ]  # fmt: skip
    for pipe, kwargs, names, guided in cases:
        recorders = [record_calls(getattr(pipe, name)).calls for name in names]
        for guidance_scale, expected in ((None, guided), (1.0, 1)):
            for calls in recorders:
                calls.clear()
            scale = {} if guidance_scale is None else {"guidance_scale": guidance_scale}
            pipe("ab", **common, **kwargs, **scale)  # the pipeline's default scale: CFG on
            assert [len(calls) for calls in recorders] == [expected] * len(names), (pipe, kwargs)


def test_passing_prompt_embeds_skips_the_text_encoder(sd_text_pipe, record_calls):
    """In `StableDiffusionPipeline`, passing `prompt_embeds` and `negative_prompt_embeds` skips the tokenizer and the text encoder entirely, so embeddings computed once can be reused and the encoder need not be loaded at all."""
    pipe = sd_text_pipe
    prompt_embeds, negative = pipe.encode_prompt("ab", "cpu", 1, True)
    text_calls = record_calls(pipe.text_encoder).calls
    unet_calls = record_calls(pipe.unet).calls
    pipe(
        prompt_embeds=prompt_embeds,
        negative_prompt_embeds=negative,
        num_inference_steps=2,
        height=HEIGHT,
        width=WIDTH,
        output_type="latent",
    )
    assert text_calls == [] and len(unet_calls) == 2
    bare = tiny_sd_pipeline()  # text_encoder=None, tokenizer=None
    bare(
        prompt_embeds=prompt_embeds,
        negative_prompt_embeds=negative,
        num_inference_steps=1,
        height=HEIGHT,
        width=WIDTH,
        output_type="latent",
    )


def test_sdxl_and_sd3_run_from_embeddings_without_text_encoders(tokenizers, record_calls):
    """`StableDiffusionXLPipeline` and `StableDiffusion3Pipeline` built with every text encoder and tokenizer set to `None` run `__call__` with CFG from `prompt_embeds`, `negative_prompt_embeds` and the pooled pair, and the denoiser receives exactly those tensors."""
    for full, bare in (
        (sdxl_pipeline(tokenizers), sdxl_pipeline(tokenizers, encoders=False)),
        (sd3_pipeline(tokenizers), sd3_pipeline(tokenizers, with_t5=False, with_clip=False)),
    ):
        kwargs = (
            dict(device="cpu")
            if bare.__class__ is StableDiffusionXLPipeline
            else dict(prompt_2=None, prompt_3=None, device="cpu", max_sequence_length=12)
        )
        text, negative, pooled, negative_pooled = full.encode_prompt("ab cd", **kwargs)
        assert all(v is None for k, v in bare.components.items() if k.startswith(("text_", "tok")))
        denoiser = getattr(bare, "unet", None) or bare.transformer
        calls = record_calls(denoiser).calls
        extra = {} if bare.__class__ is StableDiffusionXLPipeline else {"max_sequence_length": 12}
        bare(
            prompt_embeds=text,
            negative_prompt_embeds=negative,
            pooled_prompt_embeds=pooled,
            negative_pooled_prompt_embeds=negative_pooled,
            num_inference_steps=2,
            height=HEIGHT,
            width=WIDTH,
            latents=start_latents(),
            output_type="latent",
            **extra,
        )
        assert len(calls) == 2
        torch.testing.assert_close(
            calls[0][1]["encoder_hidden_states"], torch.cat([negative, text])
        )
        pooled_key = "added_cond_kwargs" if hasattr(bare, "unet") else "pooled_projections"
        received = calls[0][1][pooled_key]
        received = received["text_embeds"] if isinstance(received, dict) else received
        torch.testing.assert_close(received, torch.cat([negative_pooled, pooled]))


def test_model_offload_runs_each_encoder_before_the_loop_only(tokenizers, monkeypatch):
    """In `StableDiffusion3Pipeline`, `StableDiffusionPipeline` and `StableDiffusionXLPipeline`, with `enable_model_cpu_offload`, each component of `model_cpu_offload_seq` gets an accelerate hook chained to the previous loaded one, whose offload it triggers before its own forward, the text encoders run only before the loop whatever `num_inference_steps`, and the end of the call sends them back to the CPU: a round trip per call, not per step. With CFG and an encoded negative prompt, SDXL runs `text_encoder`, `text_encoder_2`, `text_encoder`, `text_encoder_2`, and SD3 its three encoders twice in that order, so `text_encoder` (and SD3's `text_encoder_2`) run again after the next encoder has pushed them out: two round trips.

    Real hooks with the CPU standing in for the GPU (``device="cpu"``). On the CPU,
    ``CpuOffload.pre_forward`` skips every move (the previous module is already on the CPU,
    the current one already on the execution device), so what is observed is the order of
    the forwards, the hook chain and the end-of-call return to the CPU; the trip count
    follows from ``pre_forward`` (accelerate ``hooks.py``): it offloads the previous module
    if that one is not on the CPU, and moves its own module in if not already there.
    """
    from accelerate.hooks import CpuOffload
    from diffusers import DiffusionPipeline

    sd = tiny_sd_pipeline(tokenizer=tokenizers[0], text_encoder=tiny_text_encoder())
    cases = [
        (sd, {}, ["text_encoder", "text_encoder"]),
        (sdxl_pipeline(tokenizers), {"negative_prompt": "cd"},
         ["text_encoder", "text_encoder_2"] * 2),
        (sd3_pipeline(tokenizers), {"negative_prompt": "cd", "max_sequence_length": 8},
         ["text_encoder", "text_encoder_2", "text_encoder_3"] * 2),
    ]  # fmt: skip
    back, phase, original_to = [], [False], torch.nn.Module.to

    def to(self, *args, **kwargs):
        if phase[0] and args and torch.device(args[0]).type == "cpu":
            back.append(self)
        return original_to(self, *args, **kwargs)

    def at_end(*args, **kwargs):
        phase[0] = True
        try:
            return free(*args, **kwargs)
        finally:
            phase[0] = False

    free = DiffusionPipeline.maybe_free_model_hooks
    monkeypatch.setattr(torch.nn.Module, "to", to)
    monkeypatch.setattr(DiffusionPipeline, "maybe_free_model_hooks", at_end)
    for pipe, kwargs, encoders in cases:
        pipe.enable_model_cpu_offload(device="cpu")
        chain = [n for n in pipe.model_cpu_offload_seq.split("->") if getattr(pipe, n, None)]
        for previous, name in itertools.pairwise(chain):
            hook = getattr(pipe, name)._hf_hook
            assert isinstance(hook, CpuOffload)
            assert hook.prev_module_hook.model is getattr(pipe, previous)
        denoiser = chain[-2]  # ... -> unet / transformer -> vae
        order: list[str] = []
        for name in [*encoders[: len(encoders) // 2], denoiser]:
            getattr(pipe, name).register_forward_pre_hook(
                lambda m, a, n=name, seen=order: seen.append(n)
            )
        for steps in (2, 5):
            order.clear()
            back.clear()
            pipe("ab", num_inference_steps=steps, height=HEIGHT, width=WIDTH,
                 output_type="latent", **kwargs)  # fmt: skip
            assert order == encoders + [denoiser] * steps
            assert all(any(m is getattr(pipe, n) for m in back) for n in encoders)


def test_model_offload_keeps_the_text_encoder_while_an_idle_image_encoder_sits_in_the_chain(
    tokenizers, monkeypatch
):
    """In `StableDiffusionPipeline`, `StableDiffusionXLPipeline` and `StableDiffusion3Pipeline`, model offload keeps an encoder resident until its chain's next component runs or the call ends: with an `image_encoder` loaded and no IP-Adapter image in the call, the denoiser's hook offloads the idle `image_encoder`, and the last text encoder stays on the device beside the denoiser for the whole loop, until the call ends.

    ``StableDiffusionPipeline.__call__`` runs under the real ``enable_model_cpu_offload``
    (``tiny.hooked_forwards``: each forward and the previous component its hook offloads),
    with and without a tiny ``image_encoder``, and ``StableDiffusionXLPipeline.__call__`` with
    one (its ``text_encoder_2`` stays), and ``StableDiffusion3Pipeline.__call__`` with one (the
    tiny CLIP vision model standing in for SD3's SigLIP; its ``text_encoder_3`` stays); the
    forwards are then replayed through
    accelerate's real hooks with ``"meta"`` as the device (``tiny.replay_model_offload``:
    what is on the device after each forward).
    """
    common = dict(num_inference_steps=2, height=HEIGHT, width=WIDTH, output_type="latent")
    image_encoder = tiny_image_encoder(hidden_size=32, intermediate_size=37, num_attention_heads=4)  # fmt: skip
    seen = {}
    for loaded in (False, True):
        extra = {"image_encoder": image_encoder} if loaded else {}
        pipe = tiny_sd_pipeline(tokenizer=tokenizers[0], text_encoder=tiny_text_encoder(), **extra)
        forwards = hooked_forwards(pipe, monkeypatch, "ab", **common)
        _, resident = replay_model_offload(forwards, monkeypatch)
        seen[loaded] = forwards, resident
    forwards, resident = seen[False]
    assert [p for n, p in forwards if n == "unet"] == ["text_encoder"] * 2
    assert resident[2:] == [{"unet"}] * 2  # the UNet's first forward sent the encoder out
    forwards, resident = seen[True]
    assert [n for n, _ in forwards] == ["text_encoder"] * 2 + ["unet"] * 2  # image_encoder idle
    assert [p for n, p in forwards if n == "unet"] == ["image_encoder"] * 2
    assert resident[2:] == [{"text_encoder", "unet"}] * 2  # at every step
    # SDXL: text_encoder_2, the last of its chain, stays (no negative prompt: zeros, one pass)
    xl = sdxl_pipeline(tokenizers, image_encoder=image_encoder)
    forwards = hooked_forwards(xl, monkeypatch, "ab", **common)
    _, resident = replay_model_offload(forwards, monkeypatch)
    assert [n for n, _ in forwards] == ["text_encoder", "text_encoder_2", "unet", "unet"]
    assert resident[2:] == [{"text_encoder_2", "unet"}] * 2
    # SD3: text_encoder_3, the last of its chain, stays (CFG: each encoder twice, then the loop)
    sd3 = sd3_pipeline(tokenizers)
    sd3.register_modules(image_encoder=image_encoder)
    forwards = hooked_forwards(sd3, monkeypatch, "ab", max_sequence_length=8, **common)
    _, resident = replay_model_offload(forwards, monkeypatch)
    encoders = ["text_encoder", "text_encoder_2", "text_encoder_3"] * 2
    assert [n for n, _ in forwards] == encoders + ["transformer"] * 2  # image_encoder idle
    assert [p for n, p in forwards if n == "transformer"] == ["image_encoder"] * 2
    assert resident[6:] == [{"text_encoder_3", "transformer"}] * 2


def test_t5_xxl_loaded_in_fp16_takes_about_2_gb_more(tmp_path):
    """SD3's T5-v1.1-XXL encoder is 9.52 GB at two bytes a parameter (bf16), but about 2 GB more when loaded with `dtype=torch.float16`: transformers keeps its `wo` layers, 24 × 10240 × 4096 weights, in float32.

    Which weights stay float32 is read from a tiny gated-GELU ``T5EncoderModel`` saved and
    reloaded with ``dtype=torch.float16``; the counts from T5-v1.1-XXL's config
    (t5.1.1.xxl.gin: d_model 4096, d_ff 10240, 24 layers, 64 heads, d_kv 64, vocab 32128)
    built on the meta device.
    """
    config = dict(d_kv=8, num_heads=4, num_layers=2, feed_forward_proj="gated-gelu",
                  tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    T5EncoderModel(T5Config(vocab_size=64, d_model=T5_WIDTH, d_ff=2 * T5_WIDTH, **config)).save_pretrained(tmp_path)  # fmt: skip
    for dtype, kept_suffixes in ((torch.float16, {"DenseReluDense.wo.weight"}), (torch.bfloat16, set())):  # fmt: skip
        loaded = T5EncoderModel.from_pretrained(tmp_path, dtype=dtype)
        fp32 = {".".join(n.split(".")[-3:]) for n, w in loaded.named_parameters() if w.dtype == torch.float32}  # fmt: skip
        assert fp32 == kept_suffixes
    xxl = dict(config, d_kv=64, num_heads=64, num_layers=24)
    with torch.device("meta"):
        model = T5EncoderModel(T5Config(vocab_size=32128, d_model=4096, d_ff=10240, **xxl))
    total = sum(w.numel() for w in model.parameters())
    kept = sum(w.numel() for n, w in model.named_parameters() if n.endswith("DenseReluDense.wo.weight"))  # fmt: skip
    assert 2 * total == 9_524_621_312  # 9.52 GB, the bf16 load
    assert kept == 24 * 10240 * 4096
    fp16_load = 2 * total + 2 * kept  # the kept weights take 4 bytes instead of 2
    assert round(fp16_load / 1e9, 2) == 11.54 and 1.9e9 < fp16_load - 2 * total < 2.1e9


def test_model_offload_order_puts_text_encoders_first():
    """`model_cpu_offload_seq` lists the text encoders before the denoiser: `text_encoder->image_encoder->unet->vae` (SD), `text_encoder->text_encoder_2->image_encoder->unet->vae` (SDXL) and `text_encoder->text_encoder_2->text_encoder_3->image_encoder->transformer->vae` (SD3)."""
    assert StableDiffusionPipeline.model_cpu_offload_seq == "text_encoder->image_encoder->unet->vae"
    assert (
        StableDiffusionXLPipeline.model_cpu_offload_seq
        == "text_encoder->text_encoder_2->image_encoder->unet->vae"
    )
    assert (
        StableDiffusion3Pipeline.model_cpu_offload_seq
        == "text_encoder->text_encoder_2->text_encoder_3->image_encoder->transformer->vae"
    )


def test_t5_keeps_its_feed_forward_output_in_float32_when_loaded_in_float16(tmp_path):
    """transformers keeps T5's feed-forward output projections (`wo`, `T5PreTrainedModel._keep_in_fp32_modules`) in float32 when a T5 encoder is loaded with `dtype=torch.float16`, and casts the activations to float32 before them; the other weights are float16, and a later `.to(torch.float16)`, on the model or on a `StableDiffusion3Pipeline` holding it as `text_encoder_3`, casts `wo` too (checked on a tiny gated-GELU `T5EncoderModel` saved and reloaded here)."""
    torch.manual_seed(0)
    config = T5Config(vocab_size=64, d_model=T5_WIDTH, d_kv=8, d_ff=2 * T5_WIDTH, num_layers=1,
                      num_heads=4, feed_forward_proj="gated-gelu")  # fmt: skip
    T5EncoderModel(config).save_pretrained(tmp_path)
    model = T5EncoderModel.from_pretrained(tmp_path, dtype=torch.float16)
    assert T5EncoderModel._keep_in_fp32_modules == ["wo"]
    ff = model.encoder.block[0].layer[1].DenseReluDense
    assert ff.wo.weight.dtype == torch.float32 and ff.wi_0.weight.dtype == torch.float16
    seen = []
    ff.wo.register_forward_pre_hook(lambda m, a: seen.append(a[0].dtype))
    with torch.no_grad():
        out = model(torch.tensor([[5, 6, 7, 1]])).last_hidden_state
    assert seen == [torch.float32] and out.dtype == torch.float16
    model.to(torch.float16)
    assert ff.wo.weight.dtype == torch.float16
    t5 = T5EncoderModel.from_pretrained(tmp_path, dtype=torch.float16)  # wo float32 again
    wo = t5.encoder.block[0].layer[1].DenseReluDense.wo
    pipe = tiny_sd3_pipeline(text_encoder_3=t5, tokenizer_3=t5_tokenizer())
    assert wo.weight.dtype == torch.float32
    pipe.to(torch.float16)
    assert pipe.text_encoder_3 is t5 and wo.weight.dtype == torch.float16
