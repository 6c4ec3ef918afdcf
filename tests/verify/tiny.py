"""Tiny random-config parts and shared helpers for the verify tests, built in code.

No weights and no hub: each part is the real diffusers (or transformers) class with a
small config and seeded random weights, so a whole pipeline call runs on the CPU in a
fraction of a second. Import from test modules: ``from tiny import ...``; a test module
never imports another test module. Shared fixtures live in ``conftest.py``.

Sections: Stable Diffusion 1.x and CLIP; SDXL; SD3 and Flux; ControlNet and IP-Adapter;
spies and hooks; scheduler helpers; starters and numerics.
"""

from __future__ import annotations

import contextlib
import functools
import logging

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
#: SD 1.5's shipped scheduler settings as PNDMScheduler keyword arguments (the file below)
SD15_PNDM = dict(skip_prk_steps=True, steps_offset=1, set_alpha_to_one=False, **SD_BETAS)
#: SD 1.5's scheduler/scheduler_config.json as shipped, but for its "_diffusers_version"
#: (stable-diffusion-v1-5/stable-diffusion-v1-5)
SD15_SCHEDULER_FILE = {
    "_class_name": "PNDMScheduler",
    "num_train_timesteps": 1000,
    **SD_BETAS,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "trained_betas": None,
    "clip_sample": False,
}
#: the pooled text width of the tiny SDXL pipeline's UNet (SDXL: 1280)
POOLED_DIM = 16
#: the stand-in text width (joint_attention_dim) and token count of the tiny SD3 and Flux
#: transformers' prompt_embeds
DIT_TEXT, DIT_TOKENS = 32, 8
#: the latent normalisation of SD3's and FLUX.1's VAEs (their vae/config.json)
SD3_VAE_FACTORS = dict(scaling_factor=1.5305, shift_factor=0.0609)
FLUX_VAE_FACTORS = dict(scaling_factor=0.3611, shift_factor=0.1159)


# ---------------------------------------------------------------- Stable Diffusion 1.x and CLIP


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


def tiny_vae(**overrides):
    """An AutoencoderKL with two blocks: vae_scale_factor 2, 4 latent channels.

    ``overrides`` change its config (``scaling_factor=``, ``shift_factor=``...), not its
    weights: the same seed draws the same modules.
    """
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    config = dict(
        block_out_channels=(32, 64),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=4,
        sample_size=HEIGHT,
    )
    config.update(overrides)
    return AutoencoderKL(**config).eval()


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


def tiny_tokenizer(directory=None):
    """A real CLIPTokenizer over a made-up character vocabulary (54 entries).

    Letters are single tokens; there are no merges. It pads and truncates to 77 like
    SD's tokenizer (``model_max_length``), with the same special tokens. With a
    ``directory`` it is loaded from ``vocab.json`` and ``merges.txt`` written there, as
    ``from_pretrained`` loads one; without, it is built from the in-memory vocabulary.
    """
    import json
    from pathlib import Path

    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in "abcdefghijklmnopqrstuvwxyz":
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    if directory is None:
        return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)
    directory = Path(directory)
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    return CLIPTokenizer(
        str(directory / "vocab.json"), str(directory / "merges.txt"), model_max_length=77
    )


def tiny_text_encoder(hidden_size: int = EMBED_DIM, seed=0, with_projection=False, **overrides):
    """A CLIPTextModel with a tiny random config and SD's 77-position window.

    Two layers, four heads, ``intermediate_size = 2 * hidden_size``, 64 token ids (room for
    ``tiny_tokenizer``'s 54); ``overrides`` change any CLIPTextConfig field. With
    ``with_projection`` it is a CLIPTextModelWithProjection (SDXL's and SD3's second
    encoder): ``text_embeds`` (B, projection_dim) besides the hidden states (B, 77, width).
    """
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    config = dict(
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
    config.update(overrides)
    model = CLIPTextModelWithProjection if with_projection else CLIPTextModel
    return model(CLIPTextConfig(**config)).eval()


def tiny_clip_with_projection(seed):
    """An 8-wide CLIPTextModelWithProjection (projection 8) for SD3's two CLIP slots.

    Two heads and exactly ``tiny_tokenizer``'s 54 token ids; ``seed`` tells the two apart.
    """
    return tiny_text_encoder(
        8, seed=seed, with_projection=True, vocab_size=2 + 2 * 26, num_attention_heads=2,
        projection_dim=8,
    )  # fmt: skip


def tiny_image_encoder(**overrides):
    """A CLIPVisionModelWithProjection for IP-Adapter: 32 x 32 images in 8 x 8 patches,
    ``image_embeds`` (B, 16); 16 wide, two layers and two heads unless ``overrides``."""
    import torch
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.manual_seed(0)
    config = dict(
        hidden_size=16,
        intermediate_size=32,
        projection_dim=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    config.update(overrides)
    return CLIPVisionModelWithProjection(CLIPVisionConfig(**config)).eval()


def sd_with(pipe, **components):
    """A new StableDiffusionPipeline sharing ``pipe``'s models, with some parts replaced."""
    from diffusers import StableDiffusionPipeline

    parts = dict(pipe.components)
    parts.update(components)
    new = StableDiffusionPipeline(**parts, requires_safety_checker=False)
    new.set_progress_bar_config(disable=True)
    return new


def sd1_shaped_pipeline():
    """The tiny pipeline with a VAE of SD 1.x's four blocks (32 channels each):
    vae_scale_factor 8, so 32 px images give (B, 4, 4, 4) latents for a 4 x 4 UNet."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=(32, 32, 32, 32),
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        latent_channels=4,
        sample_size=32,
    ).eval()
    return tiny_sd_pipeline(vae=vae, unet=tiny_unet(sample_size=4))


def narrow_vae(block_out_channels=(8, 16, 16, 16), latent_channels=4, **overrides):
    """A real AutoencoderKL with SD's block types, a few channels per block, one layer per
    block: ``len(block_out_channels)`` blocks downsample by ``2 ** (blocks - 1)``."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    n = len(block_out_channels)
    config = dict(
        block_out_channels=block_out_channels,
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        latent_channels=latent_channels,
        layers_per_block=1,
        norm_num_groups=4,
    )
    config.update(overrides)
    return AutoencoderKL(**config).eval()


def images(batch=2, size=32):
    """Seeded images (batch, 3, size, size) in [-1, 1], as the VAE's encoder takes them."""
    import torch

    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(0)) * 2 - 1


def tiny_consistency_decoder_vae():
    """A tiny random ``ConsistencyDecoderVAE`` (f = 2, 4 latent channels): a VAE whose
    ``decode`` samples, drawing noise from the ``generator`` it is given."""
    import torch
    from diffusers import ConsistencyDecoderVAE

    torch.manual_seed(0)
    return ConsistencyDecoderVAE(
        encoder_block_out_channels=(8, 16), encoder_down_block_types=("DownEncoderBlock2D",) * 2,
        encoder_norm_num_groups=4, encoder_layers_per_block=1,
        decoder_block_out_channels=(16, 32), decoder_down_block_types=("ResnetDownsampleBlock2D",) * 2,
        decoder_up_block_types=("ResnetUpsampleBlock2D",) * 2, decoder_norm_num_groups=4,
        decoder_layers_per_block=1,
    ).eval()  # fmt: skip


def decode_randomness(vae) -> tuple[float, float]:
    """Largest pixel difference between ``StableDiffusionPipeline.__call__`` runs (tiny UNet,
    DDIM with eta 0, which draws no noise, ``vae`` as given) on the same ``latents``: with
    ``generator`` seeds 1 and 2, and with seed 1 twice. Only the decode can make them differ."""
    import torch

    pipe = tiny_sd_pipeline(vae=vae)
    run = dict(prompt_embeds=embeds(1), num_inference_steps=2, guidance_scale=1.0,
               height=HEIGHT, width=WIDTH, output_type="pt")  # fmt: skip
    with torch.no_grad():
        a, b, c = (
            pipe(**run, latents=start_latents(), generator=torch.Generator().manual_seed(s)).images
            for s in (1, 2, 1)
        )
    return (a - b).abs().max().item(), (a - c).abs().max().item()


#: scale of the overflowing VAE decoder's first conv: its output reaches ~1.6e5, past
#: fp16's 65504
OVERFLOW_SCALE = 1e5


def overflowing_vae(force_upcast=True):
    """``tiny_vae`` with ``decoder.conv_in`` scaled by ``OVERFLOW_SCALE``: the residual stream
    after it passes 65504, and the decoder's GroupNorms divide the scale out again."""
    import torch

    vae = tiny_vae()
    vae.register_to_config(force_upcast=force_upcast)
    with torch.no_grad():
        vae.decoder.conv_in.weight.mul_(OVERFLOW_SCALE)
        vae.decoder.conv_in.bias.mul_(OVERFLOW_SCALE)
    return vae


# ---------------------------------------------------------------- SDXL


def tiny_text_time_unet(**overrides):
    """``tiny_unet`` (SD 1.x's blocks) with SDXL's "text_time" added conditioning: six
    ``time_ids`` embedded at 8 each plus a ``POOLED_DIM``-wide pooled text embedding."""
    return tiny_unet(
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + POOLED_DIM,
        **overrides,
    )


def tiny_sdxl_pipeline(scheduler=None, unet=None, vae=None, **config):
    """The real StableDiffusionXLPipeline around ``tiny_text_time_unet()`` and ``tiny_vae``
    (or ``unet`` and ``vae``), no text encoders: pass ``prompt_embeds`` (B, 77, EMBED_DIM)
    and ``pooled_prompt_embeds`` (B, POOLED_DIM). The scheduler defaults to Euler with SD's
    settings; ``config`` goes to the pipeline (``force_zeros_for_empty_prompt``...)."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline

    unet = unet or tiny_text_time_unet()
    pipe = StableDiffusionXLPipeline(
        vae=vae or tiny_vae(),
        text_encoder=None,
        text_encoder_2=None,
        tokenizer=None,
        tokenizer_2=None,
        unet=unet,
        scheduler=scheduler or EulerDiscreteScheduler.from_config(SD_SCHEDULER),
        **config,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def euler_sdxl_pipeline(vae=None):
    """``tiny_sdxl_pipeline`` around ``vae`` with a default ``EulerDiscreteScheduler()`` (its
    own betas, not SD's) and ``force_zeros_for_empty_prompt=True``."""
    from diffusers import EulerDiscreteScheduler

    return tiny_sdxl_pipeline(EulerDiscreteScheduler(), vae=vae, force_zeros_for_empty_prompt=True)


def sdxl_call(pipe, dtype, **kwargs):
    """The images of a 2-step, guidance 1 call of a tiny SDXL pipeline on seeded stand-in
    embeddings in ``dtype`` (zeros for the negative ones); ``kwargs`` go to the call."""
    import torch

    pooled = torch.randn(1, POOLED_DIM, generator=torch.Generator().manual_seed(2)).to(dtype)
    prompt_embeds = embeds(1).to(dtype)
    return pipe(
        prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled,
        negative_prompt_embeds=torch.zeros_like(prompt_embeds),
        negative_pooled_prompt_embeds=torch.zeros_like(pooled),
        num_inference_steps=2, guidance_scale=1.0, height=HEIGHT, width=WIDTH, **kwargs,
    ).images  # fmt: skip


def tiny_sdxl_unet(pooled, cross_attention_dim=EMBED_DIM):
    """A UNet2DConditionModel with SDXL's block layout (a plain block first, linear
    projections, two and four heads) and its "text_time" conditioning: 6 x 8 + ``pooled``."""
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        cross_attention_dim=cross_attention_dim,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + pooled,
    ).eval()


# ---------------------------------------------------------------- SD3 and Flux


def no_text_encoders(n):
    """``text_encoder``, ``tokenizer``, ... ``_2`` (and ``_3`` for n = 3), all None."""
    return {f"{kind}{s}": None for kind in ("text_encoder", "tokenizer") for s in ("", "_2", "_3")[:n]}  # fmt: skip


def tiny_dit_vae(seed=0, **overrides):
    """A 16-channel two-block AutoencoderKL (32, 32) without quant convs, as SD3's and
    Flux's: vae_scale_factor 2, so 16 px images give (B, 16, 8, 8) latents.

    ``seed=None`` draws its weights from the random stream as it stands (right after a
    transformer, say); ``overrides`` change its config (``SD3_VAE_FACTORS``...).
    """
    import torch
    from diffusers import AutoencoderKL

    if seed is not None:
        torch.manual_seed(seed)
    config = dict(
        block_out_channels=(32, 32),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=16,
        norm_num_groups=8,
        use_quant_conv=False,
        use_post_quant_conv=False,
        sample_size=HEIGHT,
    )
    config.update(overrides)
    return AutoencoderKL(**config).eval()


def tiny_sd3_transformer(
    in_channels=4, pooled_projection_dim=16, joint_attention_dim=EMBED_DIM, num_layers=1
):
    """An SD3Transformer2DModel on 8 x 8 latents in 2 x 2 patches (16 tokens), two heads of
    8; text (B, N, joint_attention_dim) and pooled (B, pooled_projection_dim)."""
    import torch
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    return SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=in_channels,
        out_channels=in_channels,
        num_layers=num_layers,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=joint_attention_dim,
        caption_projection_dim=16,
        pooled_projection_dim=pooled_projection_dim,
        pos_embed_max_size=16,
    ).eval()


def tiny_sd3_pipeline(scheduler=None, transformer=None, vae=None, **components):
    """The real StableDiffusion3Pipeline around ``tiny_sd3_transformer()`` and ``tiny_vae``
    (4 latent channels), no text encoders unless ``components`` gives them: pass
    ``prompt_embeds`` (B, N, EMBED_DIM) and ``pooled_prompt_embeds`` (B, 16)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    parts = no_text_encoders(3)
    parts.update(components)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer or tiny_sd3_transformer(),
        scheduler=scheduler or FlowMatchEulerDiscreteScheduler(),
        vae=vae or tiny_vae(),
        **parts,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_sd3_pipeline_16ch(scheduler=None):
    """``tiny_sd3_pipeline`` with SD3's latent layout: a 16-channel transformer (pooled
    DIT_TEXT) and ``tiny_dit_vae`` with SD3's factors; SD3's scheduler
    (``FlowMatchEulerDiscreteScheduler(shift=3.0)``) unless ``scheduler``. Pass
    ``dit_embeds``; 16 px images give (B, 16, 8, 8) latents."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return tiny_sd3_pipeline(
        scheduler or FlowMatchEulerDiscreteScheduler(shift=3.0),
        transformer=tiny_sd3_transformer(in_channels=16, pooled_projection_dim=DIT_TEXT),
        vae=tiny_dit_vae(**SD3_VAE_FACTORS),
    )


def dit_embeds(seed, width=DIT_TEXT):
    """Stand-in (prompt_embeds (1, DIT_TOKENS, width), pooled_prompt_embeds (1, DIT_TEXT))
    for the tiny SD3 and Flux pipelines, seeded."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, DIT_TOKENS, width, generator=g), torch.randn(1, DIT_TEXT, generator=g)


def tiny_sd3_parts():
    """SD3's layout, tiny and random: a 16-channel transformer (pooled 16) and a two-block
    ``narrow_vae`` with 16 latent channels, no quant convs and SD3's factors; no text
    encoders (pass ``prompt_embeds`` (B, N, 32) and ``pooled_prompt_embeds`` (B, 16))."""
    return _narrow_dit_parts(tiny_sd3_transformer(in_channels=16), SD3_VAE_FACTORS, 3)


def tiny_flux_transformer(
    guidance_embeds=True, pooled_projection_dim=DIT_TEXT, axes_dims_rope=(4, 4, 8), **overrides
):
    """A FluxTransformer2DModel with one double- and one single-stream block, two heads of
    16, on packed tokens of 64 (16 latent channels x a 2 x 2 patch) and DIT_TEXT-wide text.

    ``guidance_embeds`` as FLUX.1-dev (on) or FLUX.1-schnell (off); ``overrides`` change
    any other config field (``num_layers``, ``in_channels``...).
    """
    import torch
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    config = dict(
        patch_size=1,
        in_channels=64,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=DIT_TEXT,
        pooled_projection_dim=pooled_projection_dim,
        guidance_embeds=guidance_embeds,
        axes_dims_rope=axes_dims_rope,
    )
    config.update(overrides)
    return FluxTransformer2DModel(**config).eval()


def tiny_flux_pipeline(guidance_embeds=True, vae_seed=None, vae_config=None, **scheduler_config):
    """The real FluxPipeline around ``tiny_flux_transformer(guidance_embeds)`` and
    ``tiny_dit_vae``, no text encoders: pass ``prompt_embeds`` (B, DIT_TOKENS, DIT_TEXT) and
    ``pooled_prompt_embeds`` (B, DIT_TEXT). 16 px images: 8 x 8 latents, 16 tokens of 64.

    The VAE's weights follow the transformer's in the random stream unless ``vae_seed``
    re-seeds; ``vae_config`` changes its config (``FLUX_VAE_FACTORS``...). The scheduler is
    FLUX.1's ``FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)``, updated by
    ``scheduler_config``.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    transformer = tiny_flux_transformer(guidance_embeds)
    vae = tiny_dit_vae(seed=vae_seed, **(vae_config or {}))
    scheduler = FlowMatchEulerDiscreteScheduler(**{"use_dynamic_shifting": True, **scheduler_config})  # fmt: skip
    pipe = FluxPipeline(
        scheduler=scheduler, vae=vae, transformer=transformer, **no_text_encoders(2)
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def flux_prompt_embeds():
    """Stand-in Flux text, rows [negative, positive]: prompt_embeds (2, DIT_TOKENS, DIT_TEXT)
    and pooled_prompt_embeds (2, DIT_TEXT), seeded."""
    import torch

    text = torch.randn(2, DIT_TOKENS, DIT_TEXT, generator=torch.Generator().manual_seed(5))
    pooled = torch.randn(2, DIT_TEXT, generator=torch.Generator().manual_seed(6))
    return text, pooled


def flux_image_and_calls(pipe, record_calls, **kwargs):
    """Image (1, 16, 16, 3) and the transformer's recorded calls for one 2-step call of a
    ``tiny_flux_pipeline`` on seeded stand-in embeddings."""
    import torch

    g = torch.Generator().manual_seed(0)
    embeds = dict(
        prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
        pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g),
    )
    recorder = record_calls(pipe.transformer)
    with torch.no_grad():
        image = pipe(**embeds, **kwargs, height=HEIGHT, width=HEIGHT, num_inference_steps=2,
                     generator=torch.Generator().manual_seed(1), output_type="np").images  # fmt: skip
    recorder.remove()
    return image, recorder.calls


def cache_contexts_of_a_flux_call(monkeypatch, steps=2):
    """Run a ``tiny_flux_pipeline()`` with true CFG and FirstBlockCache on its transformer;
    return the name of the cache context each transformer call ran in (None: outside any)."""
    import inspect

    import torch
    from diffusers import FirstBlockCacheConfig

    pipe = tiny_flux_pipeline()
    assert inspect.signature(type(pipe).__call__).parameters["num_inference_steps"].default == 28
    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.0))
    current, seen, original = [None], [], pipe.transformer.cache_context

    @contextlib.contextmanager
    def cache_context(name):
        current[0] = name
        with original(name):
            yield
        current[0] = None

    monkeypatch.setattr(pipe.transformer, "cache_context", cache_context)
    pipe.transformer.register_forward_pre_hook(lambda module, args: seen.append(current[0]))
    g = torch.Generator().manual_seed(0)
    text, pooled = torch.randn(2, DIT_TOKENS, DIT_TEXT, generator=g), torch.randn(2, DIT_TEXT, generator=g)  # fmt: skip
    pipe(prompt_embeds=text[:1], pooled_prompt_embeds=pooled[:1],
         negative_prompt_embeds=text[1:], negative_pooled_prompt_embeds=pooled[1:],
         true_cfg_scale=2.0, num_inference_steps=steps, height=HEIGHT, width=WIDTH,
         generator=torch.Generator().manual_seed(1), output_type="latent")  # fmt: skip
    return seen


def three_block_flux_transformer():
    """``tiny_flux_transformer`` in diffusers' own test config (4-channel packed tokens,
    pooled DIT_TEXT, no guidance embedding) with 1 double- and 2 single-stream blocks, so
    FirstBlockCache has a head, a middle and a tail block."""
    return tiny_flux_transformer(False, in_channels=4, num_single_layers=2)


def tiny_flux_parts():
    """Flux's layout, tiny and random: ``tiny_flux_transformer`` without guidance embedding
    (pooled 24) and a two-block ``narrow_vae`` with 16 latent channels, no quant convs and
    FLUX.1's factors; no text encoders (pass ``prompt_embeds`` (B, N, 32) and
    ``pooled_prompt_embeds`` (B, 24))."""
    transformer = tiny_flux_transformer(False, pooled_projection_dim=24, axes_dims_rope=(4, 6, 6))
    return _narrow_dit_parts(transformer, FLUX_VAE_FACTORS, 2)


def _narrow_dit_parts(transformer, factors, n_text_encoders):
    """``transformer``, a two-block 16-channel ``narrow_vae`` (8, 16) without quant convs
    with ``factors``, the default FlowMatchEulerDiscreteScheduler and no text encoders."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    vae = narrow_vae(
        (8, 16), latent_channels=16, use_quant_conv=False, use_post_quant_conv=False, **factors
    )
    return dict(
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        **no_text_encoders(n_text_encoders),
    )


def four_block_flux_transformer():
    """A FluxTransformer2DModel with 2 double-stream and 2 single-stream blocks on 4-channel
    packed tokens, pooled width 16, random weights (for block-level offload counts)."""
    return tiny_flux_transformer(
        False, pooled_projection_dim=16, axes_dims_rope=(4, 6, 6), in_channels=4,
        num_layers=2, num_single_layers=2,
    )  # fmt: skip


def four_block_flux_inputs():
    """Packed latents (1, 16, 4) for a 4 x 4 latent grid, 8 text tokens (1, 8, 32)."""
    import torch

    g = torch.Generator().manual_seed(0)
    img_ids = torch.zeros(16, 3)
    img_ids[:, 1] = torch.arange(4).repeat_interleave(4)  # row of each latent token
    img_ids[:, 2] = torch.arange(4).repeat(4)  # column
    return dict(
        hidden_states=torch.randn(1, 16, 4, generator=g),
        encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
        pooled_projections=torch.randn(1, 16, generator=g),
        timestep=torch.tensor([0.5]),
        img_ids=img_ids,
        txt_ids=torch.zeros(8, 3),
        return_dict=False,
    )


def run_four_block_flux(model, **kw):
    """One no-grad forward of ``four_block_flux_transformer`` on its fixed inputs."""
    import torch

    with torch.no_grad():
        return model(**four_block_flux_inputs(), **kw)[0]


def count_transfers(model, monkeypatch):
    """(groups onloaded, class names of modules given `.to(...)`) during one forward of a
    ``four_block_flux_transformer``."""
    import torch
    from diffusers.hooks.group_offloading import ModuleGroup

    onloads, to_calls = [], []
    original_onload, original_to = ModuleGroup.onload_, torch.nn.Module.to

    def onload(self):
        onloads.append(self)
        return original_onload(self)

    def to(self, *a, **kw):
        to_calls.append(type(self).__name__)
        return original_to(self, *a, **kw)

    monkeypatch.setattr(ModuleGroup, "onload_", onload)
    monkeypatch.setattr(torch.nn.Module, "to", to)
    run_four_block_flux(model)
    monkeypatch.undo()
    return onloads, to_calls


@contextlib.contextmanager
def traffic(module, monkeypatch, to_device, to_host):
    """Count the bytes of ``module``'s parameters and buffers that ``.to()`` moves while the
    methods in ``to_device`` (onto the accelerator) and ``to_host`` (back) run, as a GPU
    would copy them: a tensor counts once per trip, only when it is not already on that side
    (every tensor starts on the host). Methods are ``(class, name)`` pairs, e.g.
    ``(ModuleGroup, "onload_")``. Yields ``{"to_device": bytes, "to_host": bytes}``."""
    import torch

    sizes = {t.data_ptr(): t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()]}  # fmt: skip
    on_device, phase, moved = set(), [None], {"to_device": 0, "to_host": 0}
    original_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        ptr = self.data_ptr()
        if phase[0] is not None and ptr in sizes and (ptr in on_device) != (phase[0] == "to_device"):  # fmt: skip
            moved[phase[0]] += sizes[ptr]
            (on_device.add if phase[0] == "to_device" else on_device.discard)(ptr)
        return original_to(self, *args, **kwargs)

    def during(label, method):
        def wrapped(*args, **kwargs):
            previous, phase[0] = phase[0], label
            try:
                return method(*args, **kwargs)
            finally:
                phase[0] = previous

        return wrapped

    monkeypatch.setattr(torch.Tensor, "to", to)
    for label, methods in (("to_device", to_device), ("to_host", to_host)):
        for cls, name in methods:
            monkeypatch.setattr(cls, name, during(label, getattr(cls, name)))
    yield moved
    monkeypatch.undo()


class _StandInStream:
    """A stream for group offloading's stream path on the CPU: there is nothing to wait for."""

    def synchronize(self):
        pass


def simulated_stream_offload(model, monkeypatch):
    """Apply block-level group offloading (one block per group) as `use_stream=True` sets it
    up, on the CPU: `enable_group_offload` refuses streams without an accelerator, so this calls
    diffusers' `_apply_group_offloading` with the config it would build, a stand-in stream,
    `pin_memory` as identity and the CPU's current stream replaced by the stand-in. Returns
    (the unmatched group, [the block groups])."""
    import torch
    from diffusers.hooks import group_offloading as go

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.cpu, "current_stream", lambda *a, **k: _StandInStream())
    if not hasattr(torch.cpu, "stream"):
        monkeypatch.setattr(torch.cpu, "stream", lambda s: contextlib.nullcontext(), raising=False)  # fmt: skip
    cpu = torch.device("cpu")
    config = go.GroupOffloadingConfig(
        onload_device=cpu, offload_device=cpu, offload_type=go.GroupOffloadingType.BLOCK_LEVEL,
        num_blocks_per_group=1, non_blocking=False, stream=_StandInStream(), record_stream=False,
        low_cpu_mem_usage=False, offload_to_disk_path=None, block_modules=None, exclude_kwargs=None,
    )  # fmt: skip
    go._apply_group_offloading(model, config)

    def group(module):
        registry = getattr(module, "_diffusers_hook", None)
        hook = registry.get_hook("group_offloading") if registry else None
        return hook.group if hook else None

    unmatched = group(model)
    blocks = {id(g): g for m in model.modules() if m is not model and (g := group(m))}
    return unmatched, list(blocks.values())


# ---------------------------------------------------------------- ControlNet and IP-Adapter


def tiny_controlnet(unet, seed=0, trained=False, channels=(16, 32)):
    """``ControlNetModel.from_unet(unet)`` (conditioning embedding ``channels``); with
    ``trained``, its zero-initialised output layers are re-drawn from N(0, 0.2), as after
    training, so its residuals are not zeros."""
    import torch
    from diffusers import ControlNetModel

    torch.manual_seed(seed)
    controlnet = ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=channels)
    if trained:
        with torch.no_grad():
            for module in [
                controlnet.controlnet_down_blocks,
                controlnet.controlnet_mid_block,
                controlnet.controlnet_cond_embedding.conv_out,
            ]:
                for p in module.parameters():
                    p.normal_(0, 0.2)
    return controlnet.eval()


def tiny_controlnet_pipeline(unet, controlnet, scheduler=None, **parts):
    """The real StableDiffusionControlNetPipeline around ``unet``, ``controlnet`` and
    ``tiny_vae``, no text encoder: pass ``prompt_embeds`` and a control ``image``
    (B, 3, HEIGHT, WIDTH). The scheduler defaults to DDIM with SD's betas."""
    from diffusers import DDIMScheduler, StableDiffusionControlNetPipeline

    pipe = StableDiffusionControlNetPipeline(
        vae=tiny_vae(),
        text_encoder=None,
        tokenizer=None,
        unet=unet,
        controlnet=controlnet,
        scheduler=scheduler or DDIMScheduler(set_alpha_to_one=False, **SD_BETAS),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
        **parts,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def random_ip_adapter(unet, image_embed_dim=16, seed=0, std=0.2):
    """A plain IP-Adapter state dict in the layout ``load_ip_adapter`` reads, random values.

    ``image_proj``: ``ImageProjection``'s ``proj`` Linear (to 4 tokens) and ``norm``;
    ``ip_adapter``: ``to_k_ip`` / ``to_v_ip`` for each cross-attention layer, keyed 1, 3,
    5, ... in ``unet.attn_processors`` order, as the loader counts them. The random
    weights are N(0, ``std``).
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    dim = unet.config.cross_attention_dim
    image_proj = {
        "proj.weight": torch.randn(4 * dim, image_embed_dim, generator=g) * std,
        "proj.bias": torch.zeros(4 * dim),
        "norm.weight": torch.ones(dim),
        "norm.bias": torch.zeros(dim),
    }
    layers, key = {}, 1
    for name in unet.attn_processors:
        if name.endswith("attn2.processor"):
            inner = unet.get_submodule(name.removesuffix(".processor")).to_k.out_features
            for kind in ["to_k_ip", "to_v_ip"]:
                layers[f"{key}.{kind}.weight"] = torch.randn(inner, dim, generator=g) * std
            key += 2
    return {"image_proj": image_proj, "ip_adapter": layers}


# ---------------------------------------------------------------- spies and hooks


def guided(noise_pred, guidance_scale):
    """The CFG combination of a doubled prediction, [uncond, text] halves."""
    noise_pred_uncond, noise_pred_text = noise_pred.chunk(2)
    return noise_pred_uncond + guidance_scale * (noise_pred_text - noise_pred_uncond)


def spy_step(monkeypatch, scheduler):
    """The (model_output, sample) of every ``scheduler.step`` call, cloned."""
    seen, original = [], scheduler.step

    @functools.wraps(original)
    def step(model_output, timestep, sample, *args, **kwargs):
        seen.append((model_output.detach().clone(), sample.detach().clone()))
        return original(model_output, timestep, sample, *args, **kwargs)

    monkeypatch.setattr(scheduler, "step", step)
    return seen


def spy_step_kwarg(monkeypatch, scheduler, name):
    """The keyword ``name`` of every ``scheduler.step`` call ("absent" when not passed): what
    the pipeline's ``prepare_extra_step_kwargs`` hands the scheduler (it reads ``step``'s
    signature, kept by ``functools.wraps``)."""
    seen, original = [], scheduler.step

    @functools.wraps(original)
    def step(*args, **kwargs):
        seen.append(kwargs.get(name, "absent"))
        return original(*args, **kwargs)

    monkeypatch.setattr(scheduler, "step", step)
    return seen


def spy_set_timesteps(pipe, monkeypatch):
    """Record the keyword arguments of every ``pipe.scheduler.set_timesteps`` call."""
    seen = []
    original = pipe.scheduler.set_timesteps

    @functools.wraps(original)  # retrieve_timesteps reads its signature
    def spy(*args, **kwargs):
        seen.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(pipe.scheduler, "set_timesteps", spy)
    return seen


def count_dispatched_ops(fn):
    """The aten ops ``fn()`` dispatches, counted by name (a ``collections.Counter``)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    with OpCounter() as counter:
        fn()
    return counter.ops


def meta_unet_self_attention(config, latent_side, **added):
    """Run the real UNet2DConditionModel built from ``config`` on the meta device (shapes
    only, no memory) on latents (1, 4, side, side); return (query length, heads) of every
    ``attn1`` call and the model. ``added``: name -> shape of each ``added_cond_kwargs``."""
    import torch
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        model = UNet2DConditionModel(**config)
        sample = torch.zeros(1, 4, latent_side, latent_side)
        context = torch.zeros(1, 77, config["cross_attention_dim"])
        added = {k: torch.zeros(*v) for k, v in added.items()}
    calls = []
    handles = [
        m.register_forward_pre_hook(
            lambda m, a, k: calls.append(((a[0] if a else k["hidden_states"]).shape[1], m.heads)),
            with_kwargs=True,
        )
        for n, m in model.named_modules()
        if n.endswith("attn1")
    ]
    with torch.no_grad():
        kwargs = {"added_cond_kwargs": added} if added else {}
        out = model(sample, torch.tensor(10, device="meta"), context, **kwargs).sample
    for h in handles:
        h.remove()
    assert out.shape == sample.shape
    return calls, model


def sdpa_kernels_seen(monkeypatch) -> list[set[str]]:
    """Spy on `F.scaled_dot_product_attention`: per call, the SDPA kernels torch may choose
    from at that moment (`torch.backends.cuda.*_sdp_enabled`, which `sdpa_kernel` narrows)."""
    import torch

    cuda, sdpa, seen = torch.backends.cuda, torch.nn.functional.scaled_dot_product_attention, []

    def spy(*args, **kwargs):
        flags = {"flash": cuda.flash_sdp_enabled(), "efficient": cuda.mem_efficient_sdp_enabled(),
                 "math": cuda.math_sdp_enabled(), "cudnn": cuda.cudnn_sdp_enabled()}  # fmt: skip
        seen.append({name for name, on in flags.items() if on})
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return seen


def simulated_ring(q, k, v, world, monkeypatch):
    """diffusers' own `TemplatedRingAttention.forward` for every rank of a simulated ring.

    ``q, k, v``: (B, N, heads, d). The collective is replaced by an in-process gather of
    every rank's flattened (key, value) shard; the per-shard attention (``forward_op``) is
    plain softmax attention that also returns its log-sum-exp. Returns the ranks' outputs
    (B, N / world, heads, d), the number of gathers, and every ``forward_op`` result in
    call order, ``(rank, out, lse)``, as the merge received it.
    """
    from types import SimpleNamespace

    import torch
    from diffusers.models import attention_dispatch as ad

    q_shards, k_shards, v_shards = (x.chunk(world, dim=1) for x in (q, k, v))  # (B, N/w, H, d)
    gathers, partials, rank_now = [], [], [0]

    def all_gather_tensor(buffer, gather_dim, group):
        gathers.append(buffer.numel())
        return torch.cat([torch.cat([kk.flatten(), vv.flatten()]) for kk, vv in zip(k_shards, v_shards, strict=True)])  # fmt: skip

    def forward_op(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, _save_ctx=True, _parallel_config=None):  # fmt: skip
        qh, kh, vh = (x.permute(0, 2, 1, 3) for x in (query, key, value))  # (B, H, S, d)
        scores = qh @ kh.transpose(-1, -2) / qh.shape[-1] ** 0.5
        out = (torch.softmax(scores, -1) @ vh).permute(0, 2, 1, 3)  # (B, S, H, d)
        lse = torch.logsumexp(scores, -1).permute(0, 2, 1)  # (B, S, H)
        partials.append((rank_now[0], out, lse))
        return out, lse

    monkeypatch.setattr(ad.funcol, "all_gather_tensor", all_gather_tensor)
    outs = []
    for rank in range(world):
        rank_now[0] = rank
        cp = SimpleNamespace(_ring_mesh=SimpleNamespace(get_group=lambda: None), _ring_local_rank=rank, ring_degree=world, convert_to_fp32=True)  # fmt: skip
        outs.append(ad.TemplatedRingAttention.forward(SimpleNamespace(), q_shards[rank], k_shards[rank], v_shards[rank], None, 0.0, False, None, False, False, forward_op, None, SimpleNamespace(context_parallel_config=cp)))  # fmt: skip
    monkeypatch.undo()
    return outs, len(gathers), partials


def quiet():
    """Silence diffusers' "modules to keep in float32" notes when casting a model with .to()."""
    from diffusers.utils import logging

    logging.set_verbosity_error()


@contextlib.contextmanager
def logged_messages(name="diffusers", level=logging.WARNING):
    """Collect what the logger ``name`` logs at ``level`` or above inside the block (diffusers'
    loggers do not propagate to pytest's caplog); the logger is set to ``level`` meanwhile,
    so an earlier test's verbosity does not hide them."""
    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Collect(level)
    logger = logging.getLogger(name)
    previous = logger.level
    logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


# ---------------------------------------------------------------- scheduler helpers


def timestep_grid(cls, spacing, n):
    """``cls(**SD_BETAS)``'s timesteps for ``n`` steps with ``spacing``; ``leading`` with
    SD's ``steps_offset=1``, the others with none."""
    offset = 1 if spacing == "leading" else 0
    scheduler = cls(**SD_BETAS, timestep_spacing=spacing, steps_offset=offset)
    scheduler.set_timesteps(n)
    return scheduler.timesteps.tolist()


def orders_used(n, **config):
    """Which update `DPMSolverMultistepScheduler.step` runs at each of ``n`` steps: 1 or 2."""
    import torch
    from diffusers import DPMSolverMultistepScheduler

    scheduler = DPMSolverMultistepScheduler(**SD_BETAS, timestep_spacing="trailing", **config)
    scheduler.set_timesteps(n)
    used = []
    first, second = scheduler.dpm_solver_first_order_update, scheduler.multistep_dpm_solver_second_order_update  # fmt: skip
    scheduler.dpm_solver_first_order_update = lambda *a, **k: used.append(1) or first(*a, **k)
    scheduler.multistep_dpm_solver_second_order_update = lambda *a, **k: used.append(2) or second(*a, **k)  # fmt: skip
    sample = torch.randn(4, 2, generator=torch.Generator().manual_seed(0))
    for t in scheduler.timesteps:
        sample = scheduler.step(torch.zeros_like(sample), t, sample).prev_sample
    return used


# ---------------------------------------------------------------- starters and numerics


def run_starter(relpath, *argv):
    """A lab starter's globals after running it as ``__main__`` with ``argv``, stdout
    swallowed (for module-scoped fixtures; ``run_lab`` is the per-test one)."""
    import io
    import runpy
    import sys
    from pathlib import Path

    from infralens_docs.registry import ROOT

    saved, sys.argv = sys.argv, [Path(relpath).name, *argv]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return runpy.run_path(str(ROOT / relpath), run_name="__main__")
    finally:
        sys.argv = saved


def t64(x):
    """A NumPy array as a contiguous float64 torch tensor."""
    import numpy as np
    import torch

    return torch.from_numpy(np.ascontiguousarray(x)).to(torch.float64)


def canonical_beta_range(schedule: str) -> dict:
    """labkit's canonical ``beta_start`` / ``beta_end`` for ``schedule``, as kwargs."""
    from labkit.schedules import CANONICAL_BETA_RANGE

    start, end = CANONICAL_BETA_RANGE[schedule]
    return {"beta_start": start, "beta_end": end}


#: the latents-like shape of the numerics helpers: (B, C, h, w)
SHAPE = (2, 4, 8, 8)


def randn(seed: int, shape=SHAPE):
    """Seeded float64 normal noise of ``shape``."""
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def abar(scheduler, t: int):
    """``scheduler.alphas_cumprod[t]`` in float64."""
    import torch

    return scheduler.alphas_cumprod[t].to(torch.float64)


def close(a, b, tol=1e-6):
    """assert_close in float64 with ``tol`` as both the relative and absolute tolerance."""
    import torch

    torch.testing.assert_close(a.to(torch.float64), b.to(torch.float64), rtol=tol, atol=tol)


# ---------------------------------------------------------------- Wan (video): lab 21


def tiny_wan_vae(seed=0):
    """``AutoencoderKLWan`` with diffusers' own test config (``base_dim=3``, one resnet per
    level) and the real compression: ``z_dim=16``, temporal downsampling at the last two
    levels (4x in time), three spatial downsamplings (8x). Random weights, eval mode."""
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])  # fmt: skip
    return vae.eval()


#: the tiny Wan transformer's text width; prompt_embeds are (B, WAN_TEXT_TOKENS, WAN_TEXT)
WAN_TEXT, WAN_TEXT_TOKENS = 32, 8


def tiny_wan_transformer(seed=0):
    """``WanTransformer3DModel`` with the real ``patch_size=(1, 2, 2)`` and 16 latent
    channels; 2 blocks, 2 heads of 12 (diffusers' test config). Random weights."""
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
        out_channels=16, text_dim=WAN_TEXT, freq_dim=256, ffn_dim=32, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    ).eval()  # fmt: skip


def tiny_wan_pipeline():
    """The real ``WanPipeline`` around ``tiny_wan_vae`` and ``tiny_wan_transformer``, no
    tokenizer or UMT5 text encoder: pass ``prompt_embeds`` and ``negative_prompt_embeds``
    (B, WAN_TEXT_TOKENS, WAN_TEXT). A flow-matching scheduler,
    ``FlowMatchEulerDiscreteScheduler(shift=3.0)``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=tiny_wan_vae(),
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                       transformer=tiny_wan_transformer())  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---------------------------------------------------------------- image-to-image and inpainting


def tiny_sd_variant(cls_name, unet=None):
    """The real ``StableDiffusionImg2ImgPipeline`` or ``StableDiffusionInpaintPipeline``
    (``cls_name``) around ``tiny_sd_pipeline``'s parts, ``unet`` replaced if given (an
    inpainting UNet: ``tiny_unet(in_channels=9)``). 16 px images, (B, 4, 8, 8) latents."""
    import diffusers

    parts = dict(tiny_sd_pipeline().components)
    if unet is not None:
        parts["unet"] = unet
    pipe = getattr(diffusers, cls_name)(**parts, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pil_image_and_mask(size=HEIGHT, hole=None):
    """A seeded RGB PIL image ``size`` px square and an L mask, white (repaint) over ``hole``
    = (x1, y1, x2, y2), default the right half."""
    import numpy as np
    import PIL.Image

    rng = np.random.default_rng(0)
    image = PIL.Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
    x1, y1, x2, y2 = hole or (size // 2, 0, size, size)
    mask = np.zeros((size, size), dtype=np.uint8)
    mask[y1:y2, x1:x2] = 255
    return image, PIL.Image.fromarray(mask)


# ---------------------------------------------------------------- model offload, per call


def text_to_image_pipelines(directory):
    """``{family: (pipeline, call kwargs)}``: tiny SD 1.5, SDXL, SD3 (and SD3 with
    ``text_encoder_3=None``) and Flux pipelines with real text encoders (CLIP, and T5 for SD3
    and Flux) over ``tiny_tokenizer``, so ``pipe("a cat", **kwargs)`` runs every encoder."""
    import torch
    from diffusers import FluxPipeline, StableDiffusionXLPipeline
    from transformers import T5Config, T5EncoderModel

    def t5(width):
        torch.manual_seed(0)
        return T5EncoderModel(T5Config(vocab_size=64, d_model=width, d_kv=8, d_ff=32, num_layers=1, num_heads=4)).eval()  # fmt: skip

    def clip(seed):
        return tiny_text_encoder(16, seed=seed, with_projection=True, projection_dim=8, num_hidden_layers=1, num_attention_heads=2)  # fmt: skip

    tok = tiny_tokenizer(directory)
    sd = tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tok)
    xl = StableDiffusionXLPipeline(**{**tiny_sdxl_pipeline().components, "text_encoder": tiny_text_encoder(16), "tokenizer": tok, "text_encoder_2": tiny_text_encoder(16, seed=1, with_projection=True, projection_dim=POOLED_DIM), "tokenizer_2": tok})  # fmt: skip
    sd3 = dict(text_encoder=clip(0), text_encoder_2=clip(1), tokenizer=tok, tokenizer_2=tok, vae=tiny_vae(shift_factor=0.0))  # fmt: skip
    fl = FluxPipeline(**{**tiny_flux_pipeline(vae_config=FLUX_VAE_FACTORS).components, "text_encoder": tiny_text_encoder(DIT_TEXT), "tokenizer": tok, "text_encoder_2": t5(DIT_TEXT), "tokenizer_2": tok})  # fmt: skip
    pipes = {
        "SD 1.5": (sd, {}),
        "SDXL": (xl, {}),
        "SD3 Medium": (
            tiny_sd3_pipeline(text_encoder_3=t5(EMBED_DIM), tokenizer_3=tok, **sd3),
            {"max_sequence_length": 16},
        ),
        "SD3 Medium, no T5": (tiny_sd3_pipeline(**sd3), {"max_sequence_length": 16}),
        "Flux.1-dev": (fl, {"max_sequence_length": 16}),
    }
    for pipe, _ in pipes.values():
        pipe.set_progress_bar_config(disable=True)
    return pipes


def hooked_forwards(pipe, monkeypatch, *args, **kwargs):
    """``[(component, previous component in the hook chain or None)]``, one per forward that
    accelerate's `CpuOffload` hook sees in ``pipe(*args, **kwargs)`` under the real
    ``enable_model_cpu_offload(device="cpu")``."""
    import accelerate.hooks
    import torch

    names = {id(m): n for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    log = []
    original = accelerate.hooks.CpuOffload.pre_forward

    def pre_forward(self, module, *a, **k):
        prev = self.prev_module_hook.model if self.prev_module_hook is not None else None
        log.append((names[id(module)], names.get(id(prev))))
        return original(self, module, *a, **k)

    monkeypatch.setattr(accelerate.hooks.CpuOffload, "pre_forward", pre_forward)
    pipe.enable_model_cpu_offload(device="cpu")
    with torch.no_grad():
        pipe(*args, **kwargs)
    monkeypatch.setattr(accelerate.hooks.CpuOffload, "pre_forward", original)
    return log


def replay_model_offload(forwards, monkeypatch):
    """Replay ``hooked_forwards``' log through accelerate's real `cpu_offload_with_hook` on
    one-weight stand-ins, with ``"meta"`` as the accelerator (on the CPU the real hooks cannot
    tell the two sides apart): ``(bus crossings per component, the set on the device after
    each forward)``; the end of the call is ``maybe_free_model_hooks``' ``pipe.to("cpu")``."""
    import torch
    from accelerate import cpu_offload_with_hook

    stand, hooks = {}, {}
    for name, prev in forwards:  # the previous component of the chain ran first
        if name not in stand:
            stand[name] = torch.nn.Linear(1, 1)
            _, hooks[name] = cpu_offload_with_hook(stand[name], "meta", prev_module_hook=hooks.get(prev))  # fmt: skip
    crossings = dict.fromkeys(stand, 0)
    ident = {id(m): n for n, m in stand.items()}
    original = torch.nn.Module.to

    def to(self, *args, **kwargs):
        if id(self) in ident:
            target = torch.device(args[0] if args else kwargs["device"])
            here = next(self.parameters()).device
            if target.type != here.type:
                crossings[ident[id(self)]] += 1
                if here.type == "meta":  # back from the "device": allocate, nothing to copy
                    return self.to_empty(device=target)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", to)
    resident = []
    for name, _ in forwards:
        stand[name](torch.zeros(1, 1))
        resident.append({n for n, m in stand.items() if next(m.parameters()).device.type == "meta"})  # fmt: skip
    for module in stand.values():
        module.to("cpu")
    monkeypatch.setattr(torch.nn.Module, "to", original)
    return crossings, resident


class SingleFileSeenError(Exception):
    """Raised by ``single_file_vae_config``'s spies to stop ``from_single_file``."""


def single_file_vae_config(tmp_path, monkeypatch, original_config=None, **kwargs):
    """What ``AutoencoderKL.from_single_file`` (given ``kwargs`` too) builds its config from,
    on a stand-in checkpoint (one tensor): ``("original", config dict)`` when ``original_config`` is
    given (the dict ``create_vae_diffusers_config_from_ldm`` returns), else
    ``("repo", (repo id, subfolder))`` that it asks ``load_config`` for. Stops there."""
    import torch
    from diffusers import AutoencoderKL
    from diffusers.loaders.single_file_model import SINGLE_FILE_LOADABLE_CLASSES
    from safetensors.torch import save_file

    path = tmp_path / "vae.safetensors"
    save_file({"encoder.conv_in.weight": torch.zeros(1)}, str(path))
    mapping = SINGLE_FILE_LOADABLE_CLASSES["AutoencoderKL"]
    convert = getattr(mapping["config_mapping_fn"], "__wrapped__", mapping["config_mapping_fn"])

    def spy_mapping(original_config, checkpoint, **kwargs):
        raise SingleFileSeenError("original", convert(original_config, checkpoint, **kwargs))

    def spy_load_config(*args, **kwargs):
        repo = kwargs.get("pretrained_model_name_or_path")
        raise SingleFileSeenError("repo", (repo, kwargs.get("subfolder")))

    spy_mapping.__wrapped__ = convert
    monkeypatch.setitem(mapping, "config_mapping_fn", spy_mapping)
    monkeypatch.setattr(AutoencoderKL, "load_config", spy_load_config)
    try:
        AutoencoderKL.from_single_file(str(path), original_config=original_config, **kwargs)
    except SingleFileSeenError as seen:
        return seen.args
    raise AssertionError("from_single_file built a model from neither source")


def accepted_beta_schedules() -> set[str]:
    """The `beta_schedule` values the installed `DDPMScheduler` accepts: the names in its
    annotation, plus "laplace", which its ``__init__`` handles but the annotation leaves out
    (each is constructed, so a name the library drops fails here)."""
    import inspect
    import typing

    from diffusers import DDPMScheduler

    annotation = inspect.signature(DDPMScheduler.__init__).parameters["beta_schedule"].annotation
    names = set(typing.get_args(annotation)) | {"laplace"}
    for name in names:
        DDPMScheduler(beta_schedule=name)
    return names


@functools.cache
def real_vae_tiling() -> dict[str, tuple[int, int, list[int]]]:
    """Where `vae.enable_tiling()` starts to tile on the published VAE configs (meta device):
    per family, (latent channels, the default image side in px, the latent sides of the two
    decodes, at the default side and one latent pixel more, that reached ``tiled_decode``).
    The default side is the one each pipeline makes: the denoiser's `sample_size` (SD 1.5,
    SDXL, SD3 Medium) or `FluxPipeline`'s `default_sample_size`, times the VAE's factor 8."""
    import torch
    from diffusers import AutoencoderKL
    from diffusers.models.autoencoders.vae import DecoderOutput
    from model_configs import (
        FLUX_VAE,
        SD3_MEDIUM_TRANSFORMER,
        SD3_VAE,
        SD15_UNET,
        SD15_VAE,
        SDXL_UNET,
        SDXL_VAE,
    )

    families = {  # the VAE config, the latent side of the pipeline's default height
        "SD 1.5": (SD15_VAE, SD15_UNET["sample_size"]),
        "SDXL": (SDXL_VAE, SDXL_UNET["sample_size"]),
        "SD3": (SD3_VAE, SD3_MEDIUM_TRANSFORMER["sample_size"]),
        "Flux.1": (FLUX_VAE, tiny_flux_pipeline().default_sample_size),  # 128 in __init__
    }
    seen = {}
    for name, (config, side) in families.items():
        with torch.device("meta"):
            vae = AutoencoderKL(**config)
        vae.enable_tiling()
        calls = []  # record, skip the (slow) tiled decode itself
        vae.tiled_decode = lambda z, calls=calls, **kw: calls.append(z.shape[-1]) or DecoderOutput(sample=z)  # fmt: skip
        for s in (side, side + 1):
            z = torch.empty(1, config["latent_channels"], s, s, device="meta")
            with torch.no_grad():
                image = vae.decode(z).sample
            if s == side:
                assert image.shape == (1, 3, 8 * side, 8 * side)
        seen[name] = (config["latent_channels"], 8 * side, calls)
    return seen


def pipeline_default_sides(directory) -> dict[str, tuple[int, int]]:
    """``{family: (height, width)}`` that each pipeline's own ``__call__`` picks when given
    neither: ``text_to_image_pipelines``' SD 1.5, SDXL, SD3 and Flux pipelines rebuilt with the
    published denoiser ``sample_size`` (Flux's ``default_sample_size`` is set in its
    ``__init__``) and a four-block VAE (factor 8, as each family's), stopped at
    ``prepare_latents``, which receives the pixel size."""
    from model_configs import SD3_MEDIUM_TRANSFORMER, SD15_UNET, SDXL_UNET

    class StopAtLatentsError(Exception):
        pass

    sample_sizes = {"SD 1.5": SD15_UNET["sample_size"], "SDXL": SDXL_UNET["sample_size"], "SD3 Medium": SD3_MEDIUM_TRANSFORMER["sample_size"], "Flux.1-dev": None}  # fmt: skip
    seen = {}
    for name, (pipe, kwargs) in text_to_image_pipelines(directory).items():
        if name not in sample_sizes:
            continue
        parts = {**pipe.components, "vae": narrow_vae()}
        denoiser = parts["unet"] if "unet" in parts else parts["transformer"]
        if sample_sizes[name] is not None:  # __init__ reads it: set it before building
            denoiser.register_to_config(sample_size=sample_sizes[name])
        built = type(pipe)(**parts)

        def stop(*args, name=name, **kw):
            seen[name] = (args[2], args[3])  # (batch, channels, height, width, ...)
            raise StopAtLatentsError

        built.prepare_latents = stop
        try:
            built("a cat", **kwargs)
        except StopAtLatentsError:
            pass
    return seen


# ---------------------------------------------------------------- SDXL's modular pipeline
# The handbook's modular-pipeline claims (pipeline, loop, interview pages): the tiny SDXL parts
# saved as a classic pipeline and loaded into SDXL's own modular blocks, as a reader would from a
# hub folder. Lab 23's module builds its own the same way.

#: batch and steps of the modular-pipeline claims
MODULAR_B, MODULAR_STEPS = 1, 3


def sdxl_modular_blocks():
    """``StableDiffusionXLAutoBlocks`` less the blocks that need text encoders or an image
    (``sub_blocks.pop``, as diffusers' own modular tests do): pass the prompt embeddings."""
    from diffusers import StableDiffusionXLAutoBlocks

    blocks = StableDiffusionXLAutoBlocks()
    for name in ("text_encoder", "ip_adapter", "vae_encoder"):
        blocks.sub_blocks.pop(name)
    return blocks


def tiny_modular_sdxl(folder, unet=None):
    """(modular, classic): ``tiny_sdxl_pipeline(unet=unet)`` saved into ``folder`` by the classic
    ``save_pretrained``, and SDXL's modular pipeline built on that folder (``init_pipeline``,
    ``load_components``), so both hold the same weights. Build it once per module."""
    classic = tiny_sdxl_pipeline(unet=unet)
    classic.save_pretrained(folder)
    modular = sdxl_modular_blocks().init_pipeline(str(folder))
    modular.load_components()
    modular.set_progress_bar_config(disable=True)
    return modular, classic


def sdxl_modular_inputs(seed=0, steps=MODULAR_STEPS):
    """Inputs both SDXL pipelines take: embeddings (zeros as the negative ones), size, steps,
    ``output_type="np"`` and a seeded generator."""
    import torch

    pooled = torch.randn(MODULAR_B, POOLED_DIM, generator=torch.Generator().manual_seed(2))
    prompt_embeds = embeds(1, batch=MODULAR_B)
    return dict(
        prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled,
        negative_prompt_embeds=torch.zeros_like(prompt_embeds),
        negative_pooled_prompt_embeds=torch.zeros_like(pooled),
        num_inference_steps=steps, height=HEIGHT, width=WIDTH, output_type="np",
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip


@contextlib.contextmanager
def guider_swapped(pipe, guider):
    """``pipe.update_components(guider=guider)`` for the block, the old guider restored after."""
    old = pipe.guider
    pipe.update_components(guider=guider)
    try:
        yield pipe
    finally:
        pipe.update_components(guider=old)


@contextlib.contextmanager
def schedulers_swapped(modular, classic, cls):
    """Both SDXL pipelines' schedulers replaced by ``cls.from_config`` of their own configs
    (``update_components`` for the modular one), the old ones restored after."""
    old_modular, old_classic = modular.scheduler, classic.scheduler
    modular.update_components(scheduler=cls.from_config(old_modular.config))
    classic.scheduler = cls.from_config(old_classic.config)
    try:
        yield modular, classic
    finally:
        modular.update_components(scheduler=old_modular)
        classic.scheduler = old_classic


def unet_batches_of(pipe, **kwargs):
    """(the batch of every UNet call of one ``pipe(**kwargs)``, in order; its output)."""
    batches = []
    handle = pipe.unet.register_forward_pre_hook(lambda m, a: batches.append(a[0].shape[0]))
    try:
        out = pipe(**kwargs)
    finally:
        handle.remove()
    return batches, out


def _block_tree(block):
    for sub in getattr(block, "sub_blocks", {}).values():
        yield sub
        yield from _block_tree(sub)


def leaf_block_calls(pipe, **kwargs):
    """(class names of the leaf blocks one modular ``pipe(**kwargs)`` runs, in order, found by
    walking ``pipe.blocks`` and spying each leaf class's ``__call__``; the call's output)."""
    names = []
    with pytest.MonkeyPatch.context() as patch:
        for block in {type(b): b for b in _block_tree(pipe.blocks)}.values():
            if getattr(block, "sub_blocks", None):
                continue
            original = type(block).__call__

            def spy(self, *args, _original=original, **kw):
                names.append(type(self).__name__)
                return _original(self, *args, **kw)

            patch.setattr(type(block), "__call__", spy)
        out = pipe(**kwargs)
    return names, out


def flux_img2img_scale_noise_calls(strength=1.0, num_inference_steps=2, side=16):
    """A tiny ``FluxImg2ImgPipeline`` (dynamic shifting, no text encoders) run once on a
    red ``side`` x ``side`` image with random prompt embeddings; returns the pipeline and,
    for each ``scheduler.scale_noise(sample, timestep, noise)`` call its ``__call__`` made,
    ``(sample, noise, output)`` (the image latents, the noise, the starting latents)."""
    import PIL.Image
    import torch
    from diffusers import FluxImg2ImgPipeline

    pipe = tiny_flux_family(FluxImg2ImgPipeline)
    seen, original = [], pipe.scheduler.scale_noise

    def spy(sample, timestep, noise=None):
        out = original(sample, timestep, noise)
        seen.append((sample.clone(), noise.clone(), out.clone()))
        return out

    pipe.scheduler.scale_noise = spy
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        pipe(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT, generator=g),
             pooled_prompt_embeds=torch.randn(1, DIT_TEXT, generator=g),
             image=PIL.Image.new("RGB", (side, side), (200, 30, 30)), strength=strength,
             height=side, width=side, num_inference_steps=num_inference_steps, output_type="latent")  # fmt: skip
    return pipe, seen


def tiny_flux_family(pipeline_class):
    """A tiny pipeline of the FLUX.1 family (``FluxPipeline``, ``FluxImg2ImgPipeline``,
    ``FluxKontextPipeline``...): a dynamically shifted ``FlowMatchEulerDiscreteScheduler``,
    the tiny DiT VAE with FLUX.1's scaling and shift factors, the tiny Flux transformer and
    no text encoders (calls pass ``prompt_embeds`` and ``pooled_prompt_embeds``)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    pipe = pipeline_class(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),
        vae=tiny_dit_vae(**FLUX_VAE_FACTORS), transformer=tiny_flux_transformer(),
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    return pipe
