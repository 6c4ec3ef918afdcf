"""Tiny random-config Stable Diffusion parts for the verify tests, built in code.

No weights and no hub: each part is the real diffusers class with a small config
and seeded random weights, so a whole StableDiffusionPipeline call runs on the
CPU in a fraction of a second. Import from test modules: ``from tiny import ...``.
"""

from __future__ import annotations

import pytest

#: the tiny pipeline's text width (SD 1.x: 768) and image size in pixels; its VAE
#: downsamples by 2 (two blocks), so latents are (B, 4, 8, 8)
EMBED_DIM = 32
HEIGHT = WIDTH = 16
#: Stable Diffusion 1.x's scheduler betas (its scheduler_config.json)
SD_BETAS = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)
#: the rest of SD 1.5's scheduler_config.json that StableDiffusionPipeline checks: with
#: diffusers' defaults (steps_offset=0, clip_sample=True) its __init__ raises a
#: FutureWarning ("the configuration file of this scheduler ... is outdated") and rewrites
#: the config, so a test built on the defaults would not run SD's real settings
SD_SCHEDULER = dict(SD_BETAS, steps_offset=1, clip_sample=False, set_alpha_to_one=False)


def tiny_unet(**overrides):
    """A UNet2DConditionModel with SD 1.x's block types, two levels, random weights."""
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    config = dict(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=EMBED_DIM,
        attention_head_dim=4,
    )
    config.update(overrides)
    return UNet2DConditionModel(**config).eval()


def tiny_vae():
    """An AutoencoderKL with two blocks: vae_scale_factor 2, 4 latent channels."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(
        block_out_channels=(32, 64),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        sample_size=HEIGHT,
    ).eval()


def tiny_sd_pipeline(scheduler=None, **components):
    """The real StableDiffusionPipeline around tiny parts; pass prompt_embeds directly."""
    pytest.importorskip("transformers", reason="StableDiffusionPipeline needs transformers")
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    parts = dict(
        vae=tiny_vae(),
        text_encoder=None,
        tokenizer=None,
        unet=tiny_unet(),
        # SD 1.x's scheduler settings, with DDIM (leading spacing, as SD ships it)
        scheduler=scheduler or DDIMScheduler(**SD_SCHEDULER),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    parts.update(components)
    pipe = StableDiffusionPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def embeds(seed: int, batch: int = 1):
    """Stand-in prompt_embeds (batch, 77, EMBED_DIM), seeded."""
    import torch

    return torch.randn(batch, 77, EMBED_DIM, generator=torch.Generator().manual_seed(seed))


def start_latents(batch: int = 1, seed: int = 0):
    """Fixed starting latents (batch, 4, 8, 8) for the tiny pipeline."""
    import torch

    return torch.randn(batch, 4, 8, 8, generator=torch.Generator().manual_seed(seed))


def tiny_tokenizer(directory):
    """A real CLIPTokenizer over a made-up character vocabulary, written to ``directory``.

    Letters are single tokens; there are no merges. It pads and truncates to 77 like
    SD's tokenizer (``model_max_length``), with the same special tokens.
    """
    import json
    from pathlib import Path

    from transformers import CLIPTokenizer

    directory = Path(directory)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in "abcdefghijklmnopqrstuvwxyz":
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    return CLIPTokenizer(
        str(directory / "vocab.json"), str(directory / "merges.txt"), model_max_length=77
    )


def tiny_text_encoder(hidden_size: int = EMBED_DIM):
    """A CLIPTextModel with a tiny random config and SD's 77-position window."""
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    config = CLIPTextConfig(
        vocab_size=64,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    return CLIPTextModel(config).eval()
