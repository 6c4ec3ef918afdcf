"""The real components' configs, each with the official source it was read from.

Every config is the keyword set the real class takes (diffusers ``Cls(**config)``,
transformers ``Cls(ConfigCls(**config))``). ``count_params`` builds a component
under ``torch.device("meta")``: shapes only, no memory, no weights, no hub.

Sources are public repositories at the commit they were read at (``repo@commit path``);
the Hugging Face hub is not reachable from this repo's tests, so a config published only
there (Qwen-Image's) is taken from a public repository that quotes it verbatim. Where diffusers names a setting differently from the original code, the original
parameters are transcribed below too (``*_ORIGINAL``) and test_model_sizes.py checks that
diffusers' own conversion (``single_file_utils``) or the documented mapping gives the
config used here.

Published totals are rounded figures from the named paper, README, blog, release post, model
card or docs; each covers one or more components of the same pipeline and must agree within ``PUBLISHED_RTOL``.
``labkit/model_sizes.json`` records the result; ``make verify-refresh`` rewrites it.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass

# Where each source was read (the snapshot's commit).
SD1 = "runwayml/stable-diffusion@08ab4d326c96"  # CompVis/stable-diffusion@21f890f9da3c: same YAML
SGM = "Stability-AI/generative-models@0ad7de9a5cb5"
SD3 = "Stability-AI/sd3.5@fbf8f483f992"
FLUX = "black-forest-labs/flux@802fb4713906"
DIFFUSERS = "huggingface/diffusers@58eb52c0803e"
OPEN_CLIP = "mlfoundations/open_clip@89fb801f1e60"
OPENAI_CLIP = "openai/CLIP@d05afc436d78"
T5_REPO = "google-research/text-to-text-transfer-transformer@e081111ccd51"
WAN = "Wan-Video/Wan2.1@9737cba9c1c3"
QWEN_IMAGE = "QwenLM/Qwen-Image@6b5e1f5cec98"
MUSUBI_QWEN_IMAGE = (
    "kohya-ss/musubi-tuner@4953fe371683 src/musubi_tuner/qwen_image/qwen_image_model.py"
)

#: a published total is a rounded number: counts must agree within this relative tolerance
PUBLISHED_RTOL = 0.03

BYTES_PER_ELEMENT = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class Component:
    pipeline: str
    component: str  # the pipeline attribute diffusers gives it (unet, vae, text_encoder_2...)
    cls: str
    library: str  # "diffusers" or "transformers"
    config: dict
    source: str
    note: str | None = None


@dataclass(frozen=True)
class Published:
    figure: str  # as published: "860M", "817M for both text encoders"
    params: int  # the figure as a number
    cite: str  # a short name for the table: "Stable Diffusion v1 README"
    source: str  # where exactly: repo@commit path and quote, paper and table, or page and quote
    covers: tuple[str, ...]  # components of the same pipeline the figure totals


# --- The original parameters, transcribed --------------------------------------------

#: runwayml/stable-diffusion configs/stable-diffusion/v1-inference.yaml (model.params),
#: the keys diffusers' create_*_diffusers_config_from_ldm read
SD15_LDM_ORIGINAL = {
    "model": {
        "params": {
            "scale_factor": 0.18215,
            "unet_config": {
                "params": {
                    "image_size": 32,
                    "in_channels": 4,
                    "out_channels": 4,
                    "model_channels": 320,
                    "attention_resolutions": [4, 2, 1],
                    "num_res_blocks": 2,
                    "channel_mult": [1, 2, 4, 4],
                    "num_heads": 8,
                    "use_spatial_transformer": True,
                    "transformer_depth": 1,
                    "context_dim": 768,
                    "legacy": False,
                }
            },
            "first_stage_config": {
                "params": {
                    "embed_dim": 4,
                    "ddconfig": {
                        "double_z": True,
                        "z_channels": 4,
                        "resolution": 256,
                        "in_channels": 3,
                        "out_ch": 3,
                        "ch": 128,
                        "ch_mult": [1, 2, 4, 4],
                        "num_res_blocks": 2,
                        "attn_resolutions": [],
                    },
                }
            },
        }
    }
}

#: Stability-AI/generative-models configs/inference/sd_xl_base.yaml (model.params)
SDXL_SGM_ORIGINAL = {
    "model": {
        "params": {
            "scale_factor": 0.13025,
            "network_config": {
                "params": {
                    "adm_in_channels": 2816,
                    "num_classes": "sequential",
                    "in_channels": 4,
                    "out_channels": 4,
                    "model_channels": 320,
                    "attention_resolutions": [4, 2],
                    "num_res_blocks": 2,
                    "channel_mult": [1, 2, 4],
                    "num_head_channels": 64,
                    "use_linear_in_transformer": True,
                    "transformer_depth": [1, 2, 10],
                    "context_dim": 2048,
                }
            },
            "first_stage_config": {
                "params": {
                    "embed_dim": 4,
                    "ddconfig": {
                        "double_z": True,
                        "z_channels": 4,
                        "resolution": 256,
                        "in_channels": 3,
                        "out_ch": 3,
                        "ch": 128,
                        "ch_mult": [1, 2, 4, 4],
                        "num_res_blocks": 2,
                        "attn_resolutions": [],
                    },
                }
            },
        }
    }
}

#: black-forest-labs/flux src/flux/util.py configs["flux-dev"].params and .ae_params
FLUX_DEV_ORIGINAL = {
    "in_channels": 64,
    "out_channels": 64,
    "vec_in_dim": 768,
    "context_in_dim": 4096,
    "hidden_size": 3072,
    "mlp_ratio": 4.0,
    "num_heads": 24,
    "depth": 19,
    "depth_single_blocks": 38,
    "axes_dim": [16, 56, 56],
    "theta": 10_000,
    "qkv_bias": True,
    "guidance_embed": True,
}
FLUX_AE_ORIGINAL = {
    "resolution": 256,
    "in_channels": 3,
    "ch": 128,
    "out_ch": 3,
    "ch_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "z_channels": 16,
    "scale_factor": 0.3611,
    "shift_factor": 0.1159,
}

#: SD3 Medium's MMDiT. Stability-AI/sd3.5 sd3_impls.py BaseModel reads the shape from the
#: checkpoint: depth = hidden // 64, num_heads = depth, hidden = 64 * depth, patch 2,
#: 16 latent channels, adm_in_channels (pooled CLIP-L 768 + CLIP-G 1280 = 2048),
#: context_embedder Linear(4096 -> hidden). diffusers' single_file_utils.py identifies
#: SD3 Medium ("sd3") by these two checkpoint shapes:
SD3_MEDIUM_CHECKPOINT_SHAPES = {
    # joint_blocks.0.context_block.adaLN_modulation.1.bias: 6 modulations x hidden
    "adaLN_modulation_width": 9216,
    # pos_embed.shape[1]: pos_embed_max_size ** 2 patches
    "pos_embed_patches": 36864,
}

#: Stability-AI/sd3.5 sd3_infer.py: the text encoders as SD3 (and SD3.5) load them.
#: other_impls.py adds vocab 49408, 77 positions and a square text_projection (no bias)
#: to both CLIPs; T5 uses d_kv = d_model // num_heads = 64, gated-GELU, no biases.
SD3_CLIPL_CONFIG_ORIGINAL = {
    "hidden_act": "quick_gelu",
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
}
SD3_CLIPG_CONFIG_ORIGINAL = {
    "hidden_act": "gelu",
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "num_attention_heads": 20,
    "num_hidden_layers": 32,
}
SD3_T5_CONFIG_ORIGINAL = {
    "d_ff": 10240,
    "d_model": 4096,
    "num_heads": 64,
    "num_layers": 24,
    "vocab_size": 32128,
}

#: mlfoundations/open_clip src/open_clip/model_configs/*.json text_cfg (+ embed_dim);
#: CLIPTextCfg defaults mlp_ratio 4.0, proj_bias False
OPEN_CLIP_TEXT_ORIGINAL = {
    "ViT-L-14": {
        "embed_dim": 768,
        "context_length": 77,
        "vocab_size": 49408,
        "width": 768,
        "heads": 12,
        "layers": 12,
    },
    "ViT-bigG-14": {
        "embed_dim": 1280,
        "context_length": 77,
        "vocab_size": 49408,
        "width": 1280,
        "heads": 20,
        "layers": 32,
    },
}

# --- The configs the real classes are built from -------------------------------------

SD15_UNET = {
    "sample_size": 64,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": [
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "DownBlock2D",
    ],
    "up_block_types": [
        "UpBlock2D",
        "CrossAttnUpBlock2D",
        "CrossAttnUpBlock2D",
        "CrossAttnUpBlock2D",
    ],
    "block_out_channels": [320, 640, 1280, 1280],
    "layers_per_block": 2,
    "cross_attention_dim": 768,
    "attention_head_dim": 8,
    "transformer_layers_per_block": 1,
    "use_linear_projection": False,
}

SDXL_UNET = {
    "sample_size": 128,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "block_out_channels": [320, 640, 1280],
    "layers_per_block": 2,
    "cross_attention_dim": 2048,
    # diffusers' historical name: these are head counts (channels // num_head_channels 64)
    "attention_head_dim": [5, 10, 20],
    "transformer_layers_per_block": [1, 2, 10],
    "use_linear_projection": True,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816,
}

#: the KL-f8 autoencoder of SD 1.x and SDXL (4 latent channels, with quant convs)
KL_F8_VAE = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2,
    "latent_channels": 4,
}
SD15_VAE = {**KL_F8_VAE, "sample_size": 512, "scaling_factor": 0.18215}
SDXL_VAE = {**KL_F8_VAE, "sample_size": 1024, "scaling_factor": 0.13025}

#: the 16-channel autoencoder of SD3 and Flux.1: no quant_conv / post_quant_conv
SD3_VAE = {
    **KL_F8_VAE,
    "sample_size": 1024,
    "latent_channels": 16,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "scaling_factor": 1.5305,
    "shift_factor": 0.0609,
}
FLUX_VAE = {**SD3_VAE, "scaling_factor": 0.3611, "shift_factor": 0.1159}

SD3_MEDIUM_TRANSFORMER = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": 16,
    "num_layers": 24,
    "attention_head_dim": 64,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048,
    "pos_embed_max_size": 192,
}

FLUX_DEV_TRANSFORMER = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": True,
    "axes_dims_rope": [16, 56, 56],
}

#: SD3.5 Large's MMDiT: sd3_impls.py's rule (hidden = 64 x depth, heads = depth, head 64)
#: at depth 38 (diffusers' single_file_utils identifies "sd35_large" by joint_blocks.37),
#: with QK-norm (sd3_impls.py sets qk_norm "rms" when the checkpoint has ln_q/ln_k).
#: pos_embed_max_size is a buffer's size, not counted: SD3's 192 is assumed here.
SD35_LARGE_TRANSFORMER = {
    **SD3_MEDIUM_TRANSFORMER,
    "num_layers": 38,
    "num_attention_heads": 38,
    "caption_projection_dim": 64 * 38,
    "qk_norm": "rms_norm",
}

#: Qwen/Qwen-Image transformer/config.json (on the Hugging Face hub, which these tests do
#: not reach), as quoted verbatim in a string literal in MUSUBI_QWEN_IMAGE's create_model
QWEN_IMAGE_PUBLISHED = {
    "_class_name": "QwenImageTransformer2DModel",
    "_diffusers_version": "0.34.0.dev0",
    "attention_head_dim": 128,
    "axes_dims_rope": [16, 56, 56],
    "guidance_embeds": False,
    "in_channels": 64,
    "joint_attention_dim": 3584,
    "num_attention_heads": 24,
    "num_layers": 60,
    "out_channels": 16,
    "patch_size": 2,
    "pooled_projection_dim": 768,
}
#: "pooled_projection_dim" is not an __init__ argument of QwenImageTransformer2DModel
#: (from_config would drop it), so the counted config leaves it out with the metadata;
#: test_model_sizes checks both that and that the rest equals the class's defaults
QWEN_IMAGE_TRANSFORMER = {
    k: v
    for k, v in QWEN_IMAGE_PUBLISHED.items()
    if k not in ("_class_name", "_diffusers_version", "pooled_projection_dim")
}

#: Wan 2.1 text-to-video transformers: Wan-Video/Wan2.1 wan/configs/wan_t2v_14B.py and
#: wan_t2v_1_3B.py, as diffusers' scripts/convert_wan_to_diffusers.py maps them
_WAN_COMMON = {
    "patch_size": [1, 2, 2],
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-06,
    "added_kv_proj_dim": None,
}
WAN_T2V_14B_TRANSFORMER = {
    **_WAN_COMMON,
    "num_attention_heads": 40,
    "ffn_dim": 13824,
    "num_layers": 40,
}
WAN_T2V_1_3B_TRANSFORMER = {
    **_WAN_COMMON,
    "num_attention_heads": 12,
    "ffn_dim": 8960,
    "num_layers": 30,
}

#: Wan 2.1's causal 3D VAE: convert_wan_to_diffusers.py builds AutoencoderKLWan() with its
#: defaults; Wan2.1 wan/modules/vae.py _video_vae (dim 96, z_dim 16, dim_mult [1,2,4,4],
#: num_res_blocks 2, attn_scales [], temperal_downsample [False, True, True])
WAN_VAE = {
    "base_dim": 96,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
}

#: OpenAI CLIP ViT-L/14 text tower (QuickGELU, openai/CLIP clip/model.py)
#: the vision tower of SD 1.5's ``safety_checker`` (CompVis/stable-diffusion-safety-checker): CLIP
#: ViT-L/14 at 224 px, Radford et al. 2021 (arXiv:2103.00020), Table 20: width 1024, 24 layers,
#: 16 heads (MLP 4 x width); ``StableDiffusionSafetyChecker`` runs it once per image
CLIP_L14_VISION = dict(
    hidden_size=1024,
    intermediate_size=4096,
    num_attention_heads=16,
    num_hidden_layers=24,
    patch_size=14,
    image_size=224,
)

CLIP_L_TEXT = {
    "vocab_size": 49408,
    "max_position_embeddings": 77,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "hidden_act": "quick_gelu",
    "projection_dim": 768,
}

#: OpenCLIP ViT-bigG/14 text tower (GELU), with its 1280 x 1280 text projection
CLIP_BIGG_TEXT = {
    "vocab_size": 49408,
    "max_position_embeddings": 77,
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "num_hidden_layers": 32,
    "num_attention_heads": 20,
    "hidden_act": "gelu",
    "projection_dim": 1280,
}

#: T5 v1.1 XXL (t5.1.1.xxl.gin: d_model 4096, 24 layers, d_ff 10240, 64 heads; d_kv 64 from
#: bi_bert_base.gin; GEGLU feed-forward; no embedding/classifier sharing)
T5_XXL = {
    "vocab_size": 32128,
    "d_model": 4096,
    "d_kv": 64,
    "d_ff": 10240,
    "num_layers": 24,
    "num_heads": 64,
    "feed_forward_proj": "gated-gelu",
    "tie_word_embeddings": False,
}

#: T5's fp16 bytes: transformers keeps `T5EncoderModel._keep_in_fp32_modules` (["wo"]) in float32
#: when loading with dtype=torch.float16 (not bfloat16); test_model_sizes checks both numbers
T5_FP16_NOTE = (
    "The encoder half of T5 v1.1 XXL; its token embedding is counted once. Loaded with "
    "`dtype=torch.float16`, transformers keeps its 1,006,632,960 `wo` weights in float32 "
    "(`_keep_in_fp32_modules`): 11.54 GB, not the fp16 column's figure, which puts its pipeline "
    "2.01 GB above the total row in fp16; bf16 loads them in bf16."
)

#: SD 1.5's model_index.json ships a safety_checker (StableDiffusionSafetyChecker on CLIP_L14_VISION),
#: which the table does not count; test_model_sizes counts it on the meta device
SD15_SAFETY_NOTE = (
    "Not in this table or its total: the safety checker SD 1.5 ships "
    "(`StableDiffusionSafetyChecker`, 304.0 M parameters: 1.22 GB in fp32, 0.61 GB in fp16)."
)
#: diffusers' from_pretrained keeps WanTransformer3DModel._keep_in_fp32_modules in float32 in a
#: 16-bit load (fp16 and bf16 alike; from_single_file casts them): test_model_sizes loads a tiny one
WAN_14B_NOTE = (
    "Not in this table or its total: its text encoder (UMT5-XXL). Loaded by `from_pretrained` in "
    "bf16 or fp16 (not `from_single_file`), diffusers keeps its 29,184,000 `time_embedder`, `norm2` and `scale_shift_table` weights "
    "in float32 (`_keep_in_fp32_modules`): 28.64 GB, not the fp16 / bf16 column's figure, "
    "and 28.89 GB for the total."
)
WAN_1_3B_NOTE = (
    "The model's name says 1.3B; its counted parameters are about 9% more (no published count "
    "to check against). Not in this table or its total: its VAE (the 14B model's) and its text "
    "encoder (UMT5-XXL). By `from_pretrained` in bf16 or fp16 (not `from_single_file`), 3,127,296 "
    "of its weights stay float32 (see the 14B row): 2.84 GB still."
)

_SD15_YAML = f"{SD1} configs/stable-diffusion/v1-inference.yaml"
_SDXL_YAML = f"{SGM} configs/inference/sd_xl_base.yaml"
_LDM_MAPPING = f"mapped by diffusers' create_unet_diffusers_config_from_ldm ({DIFFUSERS} src/diffusers/loaders/single_file_utils.py)"
_VAE_MAPPING = f"mapped by diffusers' create_vae_diffusers_config_from_ldm ({DIFFUSERS} src/diffusers/loaders/single_file_utils.py)"
_CLIP_L_SOURCE = (
    f"{OPEN_CLIP} src/open_clip/model_configs/ViT-L-14.json text_cfg (width 768, 12 heads, "
    f"12 layers, 77 tokens, vocab 49408, mlp_ratio 4 -> 3072); QuickGELU per {OPENAI_CLIP} "
    f"clip/model.py; confirmed by {SD3} sd3_infer.py CLIPL_CONFIG"
)
_CLIP_BIGG_SOURCE = (
    f"{OPEN_CLIP} src/open_clip/model_configs/ViT-bigG-14.json text_cfg (width 1280, 20 heads, "
    f"32 layers, 77 tokens, vocab 49408, embed_dim 1280 -> text_projection 1280x1280 without "
    f"bias, mlp_ratio 4 -> 5120, GELU); confirmed by {SD3} sd3_infer.py CLIPG_CONFIG"
)
_T5_SOURCE = (
    f"{SD3} sd3_infer.py T5_CONFIG (d_model 4096, d_ff 10240, 64 heads, 24 layers, vocab 32128) "
    f"and other_impls.py T5 (gated-GELU, no biases); {T5_REPO} t5/models/gin/models/"
    f"t5.1.1.xxl.gin (same shape; d_kv 64 from bi_bert_base.gin)"
)

COMPONENTS: list[Component] = [
    Component(
        "SD 1.5",
        "unet",
        "UNet2DConditionModel",
        "diffusers",
        SD15_UNET,
        f"{_SD15_YAML} unet_config (model_channels 320, channel_mult [1,2,4,4], "
        f"attention_resolutions [4,2,1], num_res_blocks 2, num_heads 8, context_dim 768), "
        f"{_LDM_MAPPING}",
        note=SD15_SAFETY_NOTE,
    ),
    Component(
        "SD 1.5",
        "vae",
        "AutoencoderKL",
        "diffusers",
        SD15_VAE,
        f"{_SD15_YAML} first_stage_config (ch 128, ch_mult [1,2,4,4], num_res_blocks 2, "
        f"z_channels 4, embed_dim 4), {_VAE_MAPPING}",
        note="Same architecture as the SDXL VAE (SDXL retrained the weights); includes quant_conv and post_quant_conv.",
    ),
    Component(
        "SD 1.5",
        "text_encoder",
        "CLIPTextModel",
        "transformers",
        CLIP_L_TEXT,
        f"{SD1} ldm/modules/encoders/modules.py FrozenCLIPEmbedder loads "
        f"openai/clip-vit-large-patch14 as transformers CLIPTextModel; {_CLIP_L_SOURCE}",
    ),
    Component(
        "SDXL",
        "unet",
        "UNet2DConditionModel",
        "diffusers",
        SDXL_UNET,
        f"{_SDXL_YAML} network_config (model_channels 320, channel_mult [1,2,4], "
        f"attention_resolutions [4,2], transformer_depth [1,2,10], num_head_channels 64, "
        f"context_dim 2048, adm_in_channels 2816, use_linear_in_transformer), {_LDM_MAPPING}",
    ),
    Component(
        "SDXL",
        "vae",
        "AutoencoderKL",
        "diffusers",
        SDXL_VAE,
        f"{_SDXL_YAML} first_stage_config (ch 128, ch_mult [1,2,4,4], num_res_blocks 2, "
        f"z_channels 4, embed_dim 4), {_VAE_MAPPING}",
        note="Same architecture as the SD 1.5 VAE (new weights); includes quant_conv and post_quant_conv.",
    ),
    Component(
        "SDXL",
        "text_encoder",
        "CLIPTextModel",
        "transformers",
        CLIP_L_TEXT,
        f"{_SDXL_YAML} conditioner emb_models[0] FrozenCLIPEmbedder ({SGM} "
        f"sgm/modules/encoders/modules.py: openai/clip-vit-large-patch14 as CLIPTextModel); "
        f"{_CLIP_L_SOURCE}",
    ),
    Component(
        "SDXL",
        "text_encoder_2",
        "CLIPTextModelWithProjection",
        "transformers",
        CLIP_BIGG_TEXT,
        f"{_SDXL_YAML} conditioner emb_models[1] FrozenOpenCLIPEmbedder2 (arch ViT-bigG-14, "
        f"laion2b_s39b_b160k, text tower only); {_CLIP_BIGG_SOURCE}",
    ),
    Component(
        "SD3 Medium",
        "transformer",
        "SD3Transformer2DModel",
        "diffusers",
        SD3_MEDIUM_TRANSFORMER,
        f"{SD3} sd3_impls.py BaseModel (hidden = 64 x depth, heads = depth, patch 2, 16 latent "
        f"channels, adm_in_channels 2048, context 4096) with {DIFFUSERS} "
        f"scripts/convert_sd3_to_diffusers.py (SD3Transformer2DModel arguments); depth 24 and "
        f"pos_embed_max_size 192 from {DIFFUSERS} src/diffusers/loaders/single_file_utils.py, "
        f"which identifies SD3 Medium by adaLN width 9216 = 6 x 1536 and pos_embed 36864 = 192^2",
        note="Not counted: pos_embed, a fixed sin-cos table of 192 × 192 × 1536 = 56,623,104 values that diffusers keeps as a persistent buffer and the checkpoint stores.",
    ),
    Component(
        "SD3 Medium",
        "vae",
        "AutoencoderKL",
        "diffusers",
        SD3_VAE,
        f"{DIFFUSERS} scripts/convert_sd3_to_diffusers.py (the SDXL VAE config with "
        f"latent_channels 16, use_quant_conv False, use_post_quant_conv False, scaling 1.5305, "
        f"shift 0.0609); {SD3} sd3_impls.py SDVAE (ch 128, ch_mult (1,2,4,4), "
        f"num_res_blocks 2, z_channels 16, no quant convs)",
        note="Same architecture as the Flux.1 VAE: 16 latent channels, no quant_conv or post_quant_conv.",
    ),
    Component(
        "SD3 Medium",
        "text_encoder",
        "CLIPTextModelWithProjection",
        "transformers",
        CLIP_L_TEXT,
        f"{SD3} sd3_infer.py CLIPL_CONFIG and other_impls.py CLIPTextModel (vocab 49408, "
        f"77 positions, 768x768 text_projection without bias); {_CLIP_L_SOURCE}",
        note="The SD 1.5 CLIP ViT-L/14 text tower plus its 768 × 768 text projection (589,824 parameters).",
    ),
    Component(
        "SD3 Medium",
        "text_encoder_2",
        "CLIPTextModelWithProjection",
        "transformers",
        CLIP_BIGG_TEXT,
        f"{SD3} sd3_infer.py CLIPG_CONFIG and other_impls.py CLIPTextModel; {_CLIP_BIGG_SOURCE}",
        note="Identical to SDXL's text_encoder_2.",
    ),
    Component(
        "SD3 Medium",
        "text_encoder_3",
        "T5EncoderModel",
        "transformers",
        T5_XXL,
        _T5_SOURCE,
        note=T5_FP16_NOTE,
    ),
    Component(
        "Flux.1-dev",
        "transformer",
        "FluxTransformer2DModel",
        "diffusers",
        FLUX_DEV_TRANSFORMER,
        f"{FLUX} src/flux/util.py configs['flux-dev'].params (hidden 3072 = 24 heads x 128, "
        f"depth 19, depth_single_blocks 38, in_channels 64, context_in_dim 4096, vec_in_dim 768, "
        f"axes_dim [16,56,56], guidance_embed True), mapped as {DIFFUSERS} "
        f"scripts/convert_flux_to_diffusers.py does",
    ),
    Component(
        "Flux.1-dev",
        "vae",
        "AutoencoderKL",
        "diffusers",
        FLUX_VAE,
        f"{FLUX} src/flux/util.py configs['flux-dev'].ae_params (ch 128, ch_mult [1,2,4,4], "
        f"num_res_blocks 2, z_channels 16; src/flux/modules/autoencoder.py has no quant convs); "
        f"{DIFFUSERS} scripts/convert_flux_to_diffusers.py uses the SD3 VAE config with "
        f"scaling 0.3611, shift 0.1159",
        note="Same architecture as the SD3 VAE.",
    ),
    Component(
        "Flux.1-dev",
        "text_encoder",
        "CLIPTextModel",
        "transformers",
        CLIP_L_TEXT,
        f"{FLUX} src/flux/util.py load_clip and src/flux/modules/conditioner.py "
        f"(openai/clip-vit-large-patch14 as CLIPTextModel); {_CLIP_L_SOURCE}",
    ),
    Component(
        "Flux.1-dev",
        "text_encoder_2",
        "T5EncoderModel",
        "transformers",
        T5_XXL,
        f"{FLUX} src/flux/util.py load_t5 and src/flux/modules/conditioner.py "
        f"(google/t5-v1_1-xxl as T5EncoderModel); {_T5_SOURCE}",
        note="Same T5 v1.1 XXL encoder as SD3's text_encoder_3 (in fp16 its `wo` layers stay float32, 2.01 GB more here and on the pipeline's total: see that row).",
    ),
    Component(
        "SD3.5 Large",
        "transformer",
        "SD3Transformer2DModel",
        "diffusers",
        SD35_LARGE_TRANSFORMER,
        f"{SD3} sd3_impls.py BaseModel (hidden = 64 x depth, heads = depth, patch 2, qk_norm "
        f"'rms' when the checkpoint has ln_k) at depth 38, which {DIFFUSERS} "
        f"src/diffusers/loaders/single_file_utils.py uses to identify sd35_large "
        f"(joint_blocks.37.x_block.mlp.fc1.weight); other settings as SD3 Medium",
        note="Not counted: pos_embed, a buffer; its size (192 per side here, as SD3 Medium) is assumed, not read from the checkpoint. Not in this table or its total: the text encoders and VAE (SD3 Medium's).",
    ),
    Component(
        "Qwen-Image",
        "transformer",
        "QwenImageTransformer2DModel",
        "diffusers",
        QWEN_IMAGE_TRANSFORMER,
        f"Qwen/Qwen-Image transformer/config.json as quoted in {MUSUBI_QWEN_IMAGE} "
        f"create_model (60 double-stream blocks, 24 heads x 128, text width 3584, packed "
        f"64-channel tokens); equal to {DIFFUSERS} QwenImageTransformer2DModel's defaults",
        note="Not in this table or its total: its text encoder (Qwen2.5-VL-7B with its vision tower, counted in the model atlas) and its VAE.",
    ),
    Component(
        "Wan 2.1 T2V 14B",
        "transformer",
        "WanTransformer3DModel",
        "diffusers",
        WAN_T2V_14B_TRANSFORMER,
        f"{WAN} wan/configs/wan_t2v_14B.py (dim 5120, ffn_dim 13824, freq_dim 256, 40 heads, "
        f"40 layers, patch (1, 2, 2), eps 1e-6), mapped by {DIFFUSERS} "
        f"scripts/convert_wan_to_diffusers.py (Wan-T2V-14B)",
        note=WAN_14B_NOTE,
    ),
    Component(
        "Wan 2.1 T2V 14B",
        "vae",
        "AutoencoderKLWan",
        "diffusers",
        WAN_VAE,
        f"{WAN} wan/modules/vae.py _video_vae (dim 96, z_dim 16, dim_mult [1,2,4,4], "
        f"num_res_blocks 2, attn_scales [], temperal_downsample [False, True, True]); "
        f"{DIFFUSERS} scripts/convert_wan_to_diffusers.py builds AutoencoderKLWan() with these defaults",
        note="A causal 3D VAE: 4x in time, 8x in space, 16 channels; the same VAE serves the 1.3B model.",
    ),
    Component(
        "Wan 2.1 T2V 1.3B",
        "transformer",
        "WanTransformer3DModel",
        "diffusers",
        WAN_T2V_1_3B_TRANSFORMER,
        f"{WAN} wan/configs/wan_t2v_1_3B.py (dim 1536, ffn_dim 8960, freq_dim 256, 12 heads, "
        f"30 layers), mapped by {DIFFUSERS} scripts/convert_wan_to_diffusers.py (Wan-T2V-1.3B)",
        note=WAN_1_3B_NOTE,
    ),
]

_SD1_README = f'{SD1} README.md: "With its 860M UNet and 123M text encoder"'
_SDXL_TABLE = "Podell et al. 2023, SDXL, arXiv:2307.01952, Table 1"
_T5_DOCS = (
    f"{DIFFUSERS} docs/source/en/api/pipelines/stable_diffusion/stable_diffusion_3.md: "
    f'"the memory-intensive 4.7B parameter T5-XXL text encoder"'
)
_CLIP_L_123M = Published(
    "123M", 123_000_000, "Stable Diffusion v1 README", _SD1_README, ("text_encoder",)
)


def _t5_xxl_47b(component: str) -> Published:
    return Published("4.7B", 4_700_000_000, "diffusers SD3 docs", _T5_DOCS, (component,))


#: (pipeline, component) -> the published figure shown on that row
PUBLISHED: dict[tuple[str, str], Published] = {
    ("SD 1.5", "unet"): Published(
        "860M", 860_000_000, "Stable Diffusion v1 README", _SD1_README, ("unet",)
    ),
    ("SD 1.5", "text_encoder"): _CLIP_L_123M,
    ("SDXL", "unet"): Published(
        "2.6B", 2_600_000_000, "SDXL paper, Table 1", f"{_SDXL_TABLE}: UNet", ("unet",)
    ),
    ("SDXL", "text_encoder"): _CLIP_L_123M,
    ("SDXL", "text_encoder_2"): Published(
        "817M for both text encoders",
        817_000_000,
        "SDXL paper, Table 1",
        f"{_SDXL_TABLE}: text encoders CLIP ViT-L & OpenCLIP ViT-bigG, 817M",
        ("text_encoder", "text_encoder_2"),
    ),
    ("SD3 Medium", "transformer"): Published(
        "2B",
        2_000_000_000,
        "Hugging Face SD3 release blog",
        'huggingface/blog@04fdd03d5565 sd3.md: "Stable Diffusion 3 Medium, with 2B parameters"',
        ("transformer",),
    ),
    ("SD3 Medium", "text_encoder_3"): _t5_xxl_47b("text_encoder_3"),
    ("Flux.1-dev", "transformer"): Published(
        "12B",
        12_000_000_000,
        "FLUX.1-dev model card",
        f'{FLUX} model_cards/FLUX.1-dev.md: "a 12 billion parameter rectified flow transformer"',
        ("transformer",),
    ),
    ("Flux.1-dev", "text_encoder"): _CLIP_L_123M,
    ("Flux.1-dev", "text_encoder_2"): _t5_xxl_47b("text_encoder_2"),
    ("SD3.5 Large", "transformer"): Published(
        "8.1B",
        8_100_000_000,
        "SD3.5 release post",
        'Stability AI, "Introducing Stable Diffusion 3.5" (stability.ai/news/introducing-stable-diffusion-3-5): '
        '"Stable Diffusion 3.5 Large: At 8.1 billion parameters"',
        ("transformer",),
    ),
    ("Qwen-Image", "transformer"): Published(
        "20B",
        20_000_000_000,
        "Qwen-Image README",
        f'{QWEN_IMAGE} README.md: "Qwen-Image, a 20B MMDiT image foundation model"',
        ("transformer",),
    ),
    ("Wan 2.1 T2V 14B", "transformer"): Published(
        "14B",
        14_000_000_000,
        "Wan2.1 README",
        f'{WAN} README.md: "two Text-to-Video models (1.3B and 14B)"',
        ("transformer",),
    ),
}


def build(component: Component):
    """The real class built from ``component.config`` on the meta device (no memory)."""
    import torch

    cls = getattr(importlib.import_module(component.library), component.cls)
    with torch.device("meta"):
        if component.library == "transformers":
            return cls(cls.config_class(**component.config))
        return cls(**component.config)


_COUNTED: dict[tuple[str, str, str, str], int] = {}


def count_params(component: Component) -> int:
    """Parameters of the real class (each tensor once, tied ones once); buffers excluded.
    Counted once per process for each (pipeline, component, class, config)."""
    key = (component.pipeline, component.component, component.cls, json.dumps(component.config, sort_keys=True))  # fmt: skip
    if key not in _COUNTED:
        _COUNTED[key] = sum(p.numel() for p in build(component).parameters())
    return _COUNTED[key]


def installed_versions() -> dict[str, str]:
    import diffusers
    import torch
    import transformers

    return {
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
    }


def record() -> dict:
    """What ``labkit/model_sizes.json`` should hold, counted now from the real classes."""
    counts = {(c.pipeline, c.component): count_params(c) for c in COMPONENTS}
    rows = []
    for c in COMPONENTS:
        params = counts[(c.pipeline, c.component)]
        published = PUBLISHED.get((c.pipeline, c.component))
        rows.append(
            {
                "pipeline": c.pipeline,
                "component": c.component,
                "class": c.cls,
                "library": c.library,
                "params": params,
                "bytes": {dtype: params * n for dtype, n in BYTES_PER_ELEMENT.items()},
                "config": c.config,
                "source": c.source,
                "note": c.note,
                "published": f"{published.figure} ({published.source})" if published else None,
                "published_params": published.params if published else None,
                "published_cite": published.cite if published else None,
                "published_covers": list(published.covers) if published else None,
            }
        )
    data = {
        "description": (
            "Parameter counts and weight bytes of the real components of eight diffusion "
            "pipelines, counted by instantiating the real diffusers/transformers classes from "
            "their published configs on the meta device (no weights downloaded). Bytes count "
            "parameters only, not buffers: params x 4 (fp32) or x 2 (fp16, bf16). Configs and "
            "sources: tests/verify/model_configs.py. Regenerate with `make verify-refresh`."
        ),
        "bytes_per_element": BYTES_PER_ELEMENT,
        "published_rtol": PUBLISHED_RTOL,
        "versions": installed_versions(),
        "components": rows,
    }
    return json.loads(json.dumps(data))  # as the file will hold it (tuples become lists)


# --- The model atlas (docs/handbook/models.md) ---------------------------------------------
# One row per family: its denoiser and VAE built on the meta device, as above, from a public
# repository's config where one states it, else from the installed class's defaults (said so
# in the row's ``source``: the hub's config.json files are not reachable from these tests).

FLUX2_REPO = "black-forest-labs/flux2@ab7cca68018a"
ZIMAGE_REPO = "Tongyi-MAI/Z-Image@c7ec13578cc2"
_DIFFUSERS_SCRIPTS = f"{DIFFUSERS} scripts"
CLASS_DEFAULTS = "class defaults of the installed diffusers (no public config reachable)"

#: huggingface/diffusers scripts/convert_flux2_to_diffusers.py get_flux2_transformer_config
_FLUX2_COMMON = {
    "patch_size": 1,
    "in_channels": 128,
    "attention_head_dim": 128,
    "timestep_guidance_channels": 256,
    "mlp_ratio": 3.0,
    "axes_dims_rope": [32, 32, 32, 32],
    "rope_theta": 2000,
    "eps": 1e-6,
}
FLUX2_DEV_TRANSFORMER = {
    **_FLUX2_COMMON,
    "num_layers": 8,
    "num_single_layers": 48,
    "num_attention_heads": 48,
    "joint_attention_dim": 15360,
}
FLUX2_KLEIN_4B_TRANSFORMER = {
    **_FLUX2_COMMON,
    "num_layers": 5,
    "num_single_layers": 20,
    "num_attention_heads": 24,
    "joint_attention_dim": 7680,
    "guidance_embeds": False,
}
FLUX2_KLEIN_9B_TRANSFORMER = {
    **_FLUX2_COMMON,
    "num_layers": 8,
    "num_single_layers": 24,
    "num_attention_heads": 32,
    "joint_attention_dim": 12288,
    "guidance_embeds": False,
}

#: Tongyi-MAI/Z-Image src/config/model.py DEFAULT_TRANSFORMER_* and ROPE_* (the values its
#: src/utils/loader.py builds ZImageTransformer2DModel with when config.json omits a key)
ZIMAGE_TRANSFORMER = {
    "all_patch_size": [2],
    "all_f_patch_size": [1],
    "in_channels": 16,
    "dim": 3840,
    "n_layers": 30,
    "n_refiner_layers": 2,
    "n_heads": 30,
    "n_kv_heads": 30,
    "norm_eps": 1e-5,
    "qk_norm": True,
    "cap_feat_dim": 2560,
    "rope_theta": 256.0,
    "t_scale": 1000.0,
    "axes_dims": [32, 48, 48],
    "axes_lens": [1536, 512, 512],
}

#: huggingface/diffusers scripts/convert_hunyuan_video1_5_to_diffusers.py TRANSFORMER_CONFIGS
#: ["720p_t2v"]; every other argument is the class default
HUNYUAN_VIDEO_15_720P_T2V = {"target_size": 960, "task_type": "t2v"}

#: huggingface/diffusers scripts/convert_ltx2_to_diffusers.py get_ltx2_transformer_config("2.0")
LTX2_TRANSFORMER = {
    "in_channels": 128,
    "out_channels": 128,
    "patch_size": 1,
    "patch_size_t": 1,
    "num_attention_heads": 32,
    "attention_head_dim": 128,
    "cross_attention_dim": 4096,
    "vae_scale_factors": [8, 32, 32],
    "pos_embed_max_pos": 20,
    "base_height": 2048,
    "base_width": 2048,
    "gated_attn": False,
    "cross_attn_mod": False,
    "audio_in_channels": 128,
    "audio_out_channels": 128,
    "audio_patch_size": 1,
    "audio_patch_size_t": 1,
    "audio_num_attention_heads": 32,
    "audio_attention_head_dim": 64,
    "audio_cross_attention_dim": 2048,
    "audio_scale_factor": 4,
    "audio_pos_embed_max_pos": 20,
    "audio_sampling_rate": 16000,
    "audio_hop_length": 160,
    "audio_gated_attn": False,
    "audio_cross_attn_mod": False,
    "num_layers": 48,
    "activation_fn": "gelu-approximate",
    "qk_norm": "rms_norm_across_heads",
    "norm_elementwise_affine": False,
    "norm_eps": 1e-6,
    "caption_channels": 3840,
    "attention_bias": True,
    "attention_out_bias": True,
    "rope_theta": 10000.0,
    "rope_double_precision": True,
    "causal_offset": 1,
    "timestep_scale_multiplier": 1000,
    "cross_attn_timestep_scale_multiplier": 1000,
    "rope_type": "split",
    "use_prompt_embeddings": True,
    "perturbed_attn": False,
}
#: the same script's get_ltx2_video_vae_config("2.0") (timestep_conditioning False): the keys
#: that differ from AutoencoderKLLTX2Video's defaults; the rest equal them
LTX2_VIDEO_VAE = {
    "decoder_causal": False,
    "spatial_compression_ratio": 32,
    "temporal_compression_ratio": 8,
}

#: huggingface/diffusers scripts/convert_wan_to_diffusers.py "Wan2.2-TI2V-5B" and
#: vae22_diffusers_config (its latents_mean / latents_std, 48 numbers each that no layer holds
#: as a parameter, left at the class's defaults)
WAN22_TI2V_5B_TRANSFORMER = {
    **_WAN_COMMON,
    "in_channels": 48,
    "out_channels": 48,
    "num_attention_heads": 24,
    "ffn_dim": 14336,
    "num_layers": 30,
}
WAN22_VAE = {
    "base_dim": 160,
    "z_dim": 48,
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "decoder_base_dim": 256,
    "scale_factor_temporal": 4,
    "scale_factor_spatial": 16,
    "patch_size": 2,
}

# --- Text encoders of the atlas families (beyond the size table's) ---------------------------
# Each is the config a public repository builds the family's text encoder from, transcribed as
# it stands there (JSON as Python); the hub's config.json files are not reachable from the tests.

MUSUBI = "kohya-ss/musubi-tuner@30c658c4f4b0"
WAN22 = "Wan-Video/Wan2.2@42bf4cfaa384"
LTX2_REPO = "Lightricks/LTX-2@4f8905737aac"
GEMMA_REPO = "google-deepmind/gemma@7691fd4e7f26"
BYT5_REPO = "google-research/byt5@7d4efdddf704"
HUNYUAN_VIDEO_15_REPO = "Tencent-Hunyuan/HunyuanVideo-1.5@60783e704160"

#: Wan-Video/Wan2.1 (and Wan2.2, the same file) wan/modules/t5.py umt5_xxl(): the encoder that
#: T5EncoderModel builds with encoder_only=True (its per-layer position buckets: shared_pos=False)
UMT5_XXL_ORIGINAL = {
    "vocab_size": 256384,
    "dim": 4096,
    "dim_attn": 4096,
    "dim_ffn": 10240,
    "num_heads": 64,
    "encoder_layers": 24,
    "decoder_layers": 24,
    "num_buckets": 32,
    "shared_pos": False,
    "dropout": 0.1,
}
#: the same encoder as transformers' UMT5EncoderModel (the class WanPipeline annotates): d_kv is
#: dim_attn / num_heads; Wan's T5FeedForward is a GELU-gated feed-forward (gated-gelu)
UMT5_XXL = {
    "vocab_size": 256384,
    "d_model": 4096,
    "d_kv": 64,
    "d_ff": 10240,
    "num_layers": 24,
    "num_heads": 64,
    "relative_attention_num_buckets": 32,
    "feed_forward_proj": "gated-gelu",
}

#: Lightricks/LTX-2 packages/ltx-core/src/ltx_core/text_encoders/gemma/config.py
#: GEMMA3_CONFIG_FOR_LTX (Gemma3ConfigData().to_dict()), which encoders/encoder_configurator.py
#: builds as Gemma3ForConditionalGeneration on the meta device
GEMMA3_12B_FOR_LTX = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "cache_implementation": "hybrid",
        "final_logit_softcapping": None,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 3840,
        "initializer_range": 0.02,
        "intermediate_size": 15360,
        "max_position_embeddings": 131072,
        "model_type": "gemma3_text",
        "num_attention_heads": 16,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "rope_theta": 1000000,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": 262208,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "vision_config": {
        "attention_dropout": 0.0,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "layer_norm_eps": 1e-06,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_channels": 3,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "torch_dtype": "float32",
        "vision_use_head": False,
    },
}
#: google-deepmind/gemma gemma/gm/nn/_gemma.py Gemma3_12B's TransformerConfig and its vision
#: encoder, gm/nn/vision/_vision.py SigLiPFromPatches and _vision_utils.py ViTModel defaults
#: (its num_embed, 262144, is not compared: the Hugging Face layout LTX-2 loads has 262208 rows)
GEMMA3_12B_ORIGINAL = {
    "embed_dim": 30 * 128,
    "hidden_dim": 8 * 30 * 128 // 2,
    "num_heads": 16,
    "head_dim": 256,
    "num_kv_heads": 8,
    "num_layers": 48,
    "sliding_window_size": 1024,
    "local_base_frequency": 10_000,
    "global_base_frequency": 1_000_000,
    "global_scale_factor": 8.0,
    "vision": {"patch_size": 14, "width": 1152, "depth": 27, "mlp_dim": 4304, "num_heads": 16},
    "image_height": 896,
    "num_mm_tokens_per_image": 256,
}

#: MUSUBI src/musubi_tuner/flux_2/flux2_utils.py Mistral3Embedder's M3_CONFIG_JSON: the config
#: it loads FLUX.2 [dev]'s text encoder files into (load_state_dict strict=True, with the
#: checkpoint's `language_model.lm_head` renamed to `lm_head`)
MISTRAL3_FLUX2_QUOTED = {
    "architectures": ["Mistral3ForConditionalGeneration"],
    "dtype": "bfloat16",
    "image_token_index": 10,
    "model_type": "mistral3",
    "multimodal_projector_bias": False,
    "projector_hidden_act": "gelu",
    "spatial_merge_size": 2,
    "text_config": {
        "attention_dropout": 0.0,
        "dtype": "bfloat16",
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "initializer_range": 0.02,
        "intermediate_size": 32768,
        "max_position_embeddings": 131072,
        "model_type": "mistral",
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000000.0,
        "sliding_window": None,
        "use_cache": True,
        "vocab_size": 131072,
    },
    "transformers_version": "4.57.1",
    "vision_config": {
        "attention_dropout": 0.0,
        "dtype": "bfloat16",
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "image_size": 1540,
        "initializer_range": 0.02,
        "intermediate_size": 4096,
        "model_type": "pixtral",
        "num_attention_heads": 16,
        "num_channels": 3,
        "num_hidden_layers": 24,
        "patch_size": 14,
        "rope_theta": 10000.0,
    },
    "vision_feature_layer": -1,
}
#: counted with its own lm_head: the quoted JSON names no top-level tie_word_embeddings, which
#: the installed Mistral3Config defaults to True (one shared matrix), but the checkpoint stores
#: an lm_head, and from_pretrained leaves two stored, different matrices untied
#: (test_model_sizes loads a tiny one so)
MISTRAL3_FLUX2 = {**MISTRAL3_FLUX2_QUOTED, "tie_word_embeddings": False}

#: MUSUBI src/musubi_tuner/zimage/zimage_utils.py load_qwen3's QWEN3_4B_CONFIG_JSON (Z-Image's
#: text encoder, and FLUX.2 [klein] 4B's: flux2_utils.py FLUX2_MODEL_INFO qwen_variant "4B")
QWEN3_4B_QUOTED = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 9728,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
#: the same function's QWEN3_8B_CONFIG_JSON (FLUX.2 [klein] 9B's: qwen_variant "8B"): the 4B
#: config with these three keys changed
QWEN3_8B_QUOTED = {
    **QWEN3_4B_QUOTED,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "tie_word_embeddings": False,
}

#: MUSUBI src/musubi_tuner/qwen_image/qwen_image_utils.py load_qwen2_5_vl's QWEN2_5_VL_CONFIG_JSON:
#: Qwen2.5-VL-7B, which it loads Qwen-Image's and HunyuanVideo 1.5's text encoder into
#: (hv_1_5_cache_text_encoder_outputs.py); its text_config's layer_types are 28 "full_attention"
QWEN2_5_VL_7B_QUOTED = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "image_token_id": 151655,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 128000,
    "max_window_layers": 28,
    "model_type": "qwen2_5_vl",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "text_config": {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_act": "silu",
        "hidden_size": 3584,
        "image_token_id": None,
        "initializer_range": 0.02,
        "intermediate_size": 18944,
        "layer_types": ["full_attention"] * 28,
        "max_position_embeddings": 128000,
        "max_window_layers": 28,
        "model_type": "qwen2_5_vl_text",
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "video_token_id": None,
        "vision_end_token_id": 151653,
        "vision_start_token_id": 151652,
        "vision_token_id": 151654,
        "vocab_size": 152064,
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.53.1",
    "use_cache": True,
    "use_sliding_window": False,
    "video_token_id": 151656,
    "vision_config": {
        "depth": 32,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "hidden_act": "silu",
        "hidden_size": 1280,
        "in_channels": 3,
        "in_chans": 3,
        "initializer_range": 0.02,
        "intermediate_size": 3420,
        "model_type": "qwen2_5_vl",
        "num_heads": 16,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "temporal_patch_size": 2,
        "tokens_per_second": 2,
        "torch_dtype": "float32",
        "window_size": 112,
    },
    "vision_end_token_id": 151653,
    "vision_start_token_id": 151652,
    "vision_token_id": 151654,
    "vocab_size": 152064,
}

#: MUSUBI src/musubi_tuner/hunyuan_video_1_5/hunyuan_video_1_5_text_encoder.py load_byt5's
#: BYT5_CONFIG_JSON (google/byt5-small; its `_name_or_path`, a local path, left out)
BYT5_SMALL_QUOTED = {
    "architectures": ["T5ForConditionalGeneration"],
    "d_ff": 3584,
    "d_kv": 64,
    "d_model": 1472,
    "decoder_start_token_id": 0,
    "dropout_rate": 0.1,
    "eos_token_id": 1,
    "feed_forward_proj": "gated-gelu",
    "gradient_checkpointing": False,
    "initializer_factor": 1.0,
    "is_encoder_decoder": True,
    "layer_norm_epsilon": 1e-06,
    "model_type": "t5",
    "num_decoder_layers": 4,
    "num_heads": 6,
    "num_layers": 12,
    "pad_token_id": 0,
    "relative_attention_num_buckets": 32,
    "tie_word_embeddings": False,
    "tokenizer_class": "ByT5Tokenizer",
    "transformers_version": "4.7.0.dev0",
    "use_cache": True,
    "vocab_size": 384,
}
#: google-research/byt5 byt5/gin/models/byt5.small.gin (the rest from t5.1.1.small.gin)
BYT5_SMALL_GIN = {"d_model": 1472, "d_ff": 3584, "encoder_layers": 12, "decoder_layers": 4}
#: the tokens Glyph-SDXL-v2 adds to byt5-small's 384 before its weights load (add_special_token,
#: as HunyuanVideo-1.5 hyvideo/models/text_encoders/byT5/__init__.py and diffusers'
#: convert_hunyuan_video1_5_to_diffusers.py load_byt5 call it, then resize_token_embeddings):
#: one `<color-i>` per entry of assets/color_idx.json, one `<xx-font-i>` per entry of
#: assets/multilingual_10-lang_idx.json, counted in the copies MUSUBI's
#: hunyuan_video_1_5_text_encoder.py keeps (COLOR_IDX_JSON, MULTILINGUAL_10_LANG_IDX_JSON:
#: 988 entries, 988 distinct tokens)
GLYPH_SDXL_V2_ADDED_TOKENS = {"color": 138, "font": 988}
#: ByT5 as HunyuanVideo 1.5 runs it: byt5-small with the added tokens' embedding rows
BYT5_GLYPH_SDXL_V2 = {
    **BYT5_SMALL_QUOTED,
    "vocab_size": BYT5_SMALL_QUOTED["vocab_size"] + sum(GLYPH_SDXL_V2_ADDED_TOKENS.values()),
}

_MUSUBI_FLUX2 = f"{MUSUBI} src/musubi_tuner/flux_2/flux2_utils.py"
_MUSUBI_QWEN3 = f"{MUSUBI} src/musubi_tuner/zimage/zimage_utils.py load_qwen3"
_MUSUBI_QWEN25VL = f"{MUSUBI} src/musubi_tuner/qwen_image/qwen_image_utils.py load_qwen2_5_vl QWEN2_5_VL_CONFIG_JSON"
_UMT5_SOURCE = (
    f"{WAN} wan/modules/t5.py umt5_xxl (dim 4096, dim_attn 4096, dim_ffn 10240, 64 heads, "
    f"24 encoder layers, 32 buckets per layer, vocab 256384), the encoder its T5EncoderModel "
    f"builds; the same file and t5_model 'umt5_xxl' in {WAN22}"
)


def _encoder(family, component, cls, config, source):
    return Component(family, component, cls, "transformers", config, source)


#: one UMT5-XXL encoder for the three Wan rows (counted once per run)
_UMT5_XXL_ENCODER = _encoder("Wan", "text_encoder", "UMT5EncoderModel", UMT5_XXL, _UMT5_SOURCE)
_QWEN3_4B_NOTE = "tie_word_embeddings True: its lm_head is the embedding matrix, counted once"


@dataclass(frozen=True)
class Family:
    name: str
    folder: str  # diffusers/pipelines/<folder> (classic) or diffusers/modular_pipelines/<folder>
    pipeline: str  # the classic pipeline class, or the modular pipeline class when modular only
    denoiser: Component
    vae: Component
    denoisers: int = 1  # Wan 2.2 A14B: `transformer` and `transformer_2`, one config
    frames: int | None = None  # video: frames counted (the pipeline's default `num_frames`)
    size: tuple[int, int] = (1024, 1024)  # (height, width) the tokens are counted at
    published: Published | None = None  # the denoiser's published total
    pack: int = 1  # the pipeline packs pack x pack latent positions into one token's channels
    #: the size table's pipeline whose text encoders this family loads (their counts are shown)
    encoders_of: str | None = None
    #: the text encoder checkpoint(s) a public source names, and that source
    encoder_named: tuple[str, str] | None = None
    #: its text encoders built from a config a public repository states (transformers classes,
    #: `component` the pipeline's attribute), for a family whose encoders the size table lacks
    encoders: tuple[Component, ...] = ()
    #: the scheduler a public source ships with the checkpoint (class and shift), and that source
    shift: tuple[str, str] | None = None
    #: the family's other pipelines of the same folder (FLUX.3's step-distilled one)
    variants: tuple[str, ...] = ()


def _c(family, component, cls, config, source, library="diffusers"):
    return Component(family, component, cls, library, config, source)


def _existing(pipeline: str, component: str) -> Component:
    (c,) = [c for c in COMPONENTS if (c.pipeline, c.component) == (pipeline, component)]
    return c


_FLUX2_SCRIPT = f"{_DIFFUSERS_SCRIPTS}/convert_flux2_to_diffusers.py"
_FLUX2_VAE = _c(
    "FLUX.2",
    "vae",
    "AutoencoderKLFlux2",
    {},
    f"{_FLUX2_SCRIPT} main() builds AutoencoderKLFlux2() with its defaults",
)
_WAN22_SCRIPT = f"{_DIFFUSERS_SCRIPTS}/convert_wan_to_diffusers.py"

ATLAS: list[Family] = [
    Family(
        "SD 1.5",
        "stable_diffusion",
        "StableDiffusionPipeline",
        _existing("SD 1.5", "unet"),
        _existing("SD 1.5", "vae"),
        size=(512, 512),
        encoders_of="SD 1.5",
    ),
    Family(
        "SDXL",
        "stable_diffusion_xl",
        "StableDiffusionXLPipeline",
        _existing("SDXL", "unet"),
        _existing("SDXL", "vae"),
        encoders_of="SDXL",
    ),
    Family(
        "SD3.5 Large",
        "stable_diffusion_3",
        "StableDiffusion3Pipeline",
        _existing("SD3.5 Large", "transformer"),
        _existing("SD3 Medium", "vae"),
        encoders_of="SD3 Medium",
    ),
    Family(
        "FLUX.1-dev",
        "flux",
        "FluxPipeline",
        _existing("Flux.1-dev", "transformer"),
        _existing("Flux.1-dev", "vae"),
        pack=2,
        encoders_of="Flux.1-dev",
    ),
    Family(
        "FLUX.2 dev",
        "flux2",
        "Flux2Pipeline",
        _c(
            "FLUX.2 dev",
            "transformer",
            "Flux2Transformer2DModel",
            FLUX2_DEV_TRANSFORMER,
            f"{_FLUX2_SCRIPT} get_flux2_transformer_config('flux2-dev')",
        ),
        _FLUX2_VAE,
        pack=2,
        encoder_named=(
            "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
            f"{_FLUX2_SCRIPT} main(): text_encoder_id",
        ),
        encoders=(
            _encoder(
                "FLUX.2 dev",
                "text_encoder",
                "Mistral3ForConditionalGeneration",
                MISTRAL3_FLUX2,
                f"{_MUSUBI_FLUX2} Mistral3Embedder M3_CONFIG_JSON, into which it loads FLUX.2 [dev]'s "
                "text encoder strictly (docs/flux_2.md: the split files of black-forest-labs/FLUX.2-dev), "
                "lm_head included; counted with tie_word_embeddings False, the stored lm_head untied",
            ),
        ),
        published=Published(
            "32B",
            32_000_000_000,
            "FLUX.2 model card",
            f'{FLUX2_REPO} model_cards/FLUX.2-dev.md: "a 32 billion parameter rectified flow transformer"',
            ("transformer",),
        ),
    ),
    Family(
        "FLUX.2 klein 4B",
        "flux2",
        "Flux2KleinPipeline",
        _c(
            "FLUX.2 klein 4B",
            "transformer",
            "Flux2Transformer2DModel",
            FLUX2_KLEIN_4B_TRANSFORMER,
            f"{_FLUX2_SCRIPT} get_flux2_transformer_config('klein-4b')",
        ),
        _FLUX2_VAE,
        pack=2,
        encoder_named=(
            "Qwen3-4B",
            f"{_MUSUBI_FLUX2} FLUX2_MODEL_INFO['klein-4b'] qwen_variant '4B', and docs/flux_2.md "
            "('Qwen3 4B Text Encoder' from black-forest-labs/FLUX.2-klein-4B)",
        ),
        encoders=(
            _encoder(
                "FLUX.2 klein 4B",
                "text_encoder",
                "Qwen3ForCausalLM",
                QWEN3_4B_QUOTED,
                f"{_MUSUBI_QWEN3} QWEN3_4B_CONFIG_JSON, which flux2_utils.py load_text_embedder "
                f"uses for qwen_variant '4B' ({_QWEN3_4B_NOTE})",
            ),
        ),
    ),
    Family(
        "FLUX.2 klein 9B",
        "flux2",
        "Flux2KleinPipeline",
        _c(
            "FLUX.2 klein 9B",
            "transformer",
            "Flux2Transformer2DModel",
            FLUX2_KLEIN_9B_TRANSFORMER,
            f"{_FLUX2_SCRIPT} get_flux2_transformer_config('klein-9b')",
        ),
        _FLUX2_VAE,
        pack=2,
        encoder_named=(
            "Qwen3-8B",
            f"{_MUSUBI_FLUX2} FLUX2_MODEL_INFO['klein-9b'] qwen_variant '8B', and docs/flux_2.md "
            "('Qwen3 8B Text Encoder' from black-forest-labs/FLUX.2-klein-9B)",
        ),
        encoders=(
            _encoder(
                "FLUX.2 klein 9B",
                "text_encoder",
                "Qwen3ForCausalLM",
                QWEN3_8B_QUOTED,
                f"{_MUSUBI_QWEN3} QWEN3_8B_CONFIG_JSON, which flux2_utils.py load_text_embedder "
                "uses for qwen_variant '8B' (tie_word_embeddings False: the class builds a separate lm_head, "
                "counted, which load_qwen3 fills from the embedding)",
            ),
        ),
    ),
    Family(
        "FLUX.3",
        "flux3",
        "Flux3ModularPipeline",
        _c("FLUX.3", "transformer", "Flux3Transformer2DModel", {}, CLASS_DEFAULTS),
        _c(
            "FLUX.3",
            "vae",
            "AutoencoderKLFlux2",
            {},
            f"{CLASS_DEFAULTS}; the class its blocks' ComponentSpec names",
        ),
        pack=2,
        variants=("Flux3DistilledModularPipeline",),
    ),
    Family(
        "Z-Image",
        "z_image",
        "ZImagePipeline",
        _c(
            "Z-Image",
            "transformer",
            "ZImageTransformer2DModel",
            ZIMAGE_TRANSFORMER,
            f"{ZIMAGE_REPO} src/config/model.py DEFAULT_TRANSFORMER_* and ROPE_*, as src/utils/loader.py builds it; "
            "the checkpoint that repository releases is Z-Image-Turbo, 'A distilled version of Z-Image' (README.md: 8 NFEs, "
            "`guidance_scale=0.0`; src/config/inference.py DEFAULT_GUIDANCE_SCALE = 0.0), not the pipeline's default 5.0",
        ),
        _c(
            "Z-Image",
            "vae",
            "AutoencoderKL",
            FLUX_VAE,
            f"Flux.1-dev's config, assumed: {ZIMAGE_REPO} src/zimage/autoencoder.py is 'Modified from' black-forest-labs/flux's autoencoder and its transformer takes 16 channels; the hub's vae/config.json is not reachable",
        ),
        encoder_named=(
            "Qwen3-4B",
            f"{_MUSUBI_QWEN3} ('Load Qwen3-4B/8B model', called for Z-Image with is_8b False) and "
            "docs/zimage.md ('Text Encoder (Qwen3)')",
        ),
        encoders=(
            _encoder(
                "Z-Image",
                "text_encoder",
                "Qwen3Model",
                QWEN3_4B_QUOTED,
                f"{_MUSUBI_QWEN3} QWEN3_4B_CONFIG_JSON; built as Qwen3Model, the class "
                f"{ZIMAGE_REPO} src/utils/loader.py's AutoModel.from_pretrained makes of a qwen3 "
                f"config; Qwen3ForCausalLM counts the same ({_QWEN3_4B_NOTE})",
            ),
        ),
        published=Published(
            "6B",
            6_000_000_000,
            "Z-Image README",
            f'{ZIMAGE_REPO} README.md: "Z-Image is a powerful and highly efficient image generation model with **6B** parameters"',
            ("transformer",),
        ),
        shift=(
            "FlowMatchEulerDiscreteScheduler, shift=3.0",
            f"{ZIMAGE_REPO} src/config/model.py DEFAULT_SCHEDULER_SHIFT, which src/utils/loader.py uses when scheduler_config.json names none (the hub's is not reachable)",
        ),
    ),
    Family(
        "Qwen-Image",
        "qwenimage",
        "QwenImagePipeline",
        _existing("Qwen-Image", "transformer"),
        _c("Qwen-Image", "vae", "AutoencoderKLQwenImage", {}, CLASS_DEFAULTS),
        encoder_named=(
            "Qwen2.5-VL-7B",
            f"{MUSUBI} docs/qwen_image.md ('Text Encoder (Qwen2.5-VL)': qwen_2.5_vl_7b.safetensors)",
        ),
        encoders=(
            _encoder(
                "Qwen-Image",
                "text_encoder",
                "Qwen2_5_VLForConditionalGeneration",
                QWEN2_5_VL_7B_QUOTED,
                f"{_MUSUBI_QWEN25VL}, into which it loads Qwen-Image's text encoder strictly",
            ),
        ),
    ),
    Family(
        "Qwen-Image 2.1",
        "qwenimage21",
        "QwenImage21Pipeline",
        _c("Qwen-Image 2.1", "transformer", "QwenImage21Transformer2DModel", {}, CLASS_DEFAULTS),
        _c("Qwen-Image 2.1", "vae", "AutoencoderKLQwenImage21", {}, CLASS_DEFAULTS),
    ),
    Family(
        "HunyuanVideo 1.5 720p",
        "hunyuan_video1_5",
        "HunyuanVideo15Pipeline",
        _c(
            "HunyuanVideo 1.5 720p",
            "transformer",
            "HunyuanVideo15Transformer3DModel",
            HUNYUAN_VIDEO_15_720P_T2V,
            f"{_DIFFUSERS_SCRIPTS}/convert_hunyuan_video1_5_to_diffusers.py TRANSFORMER_CONFIGS['720p_t2v'] (the rest class defaults)",
        ),
        _c(
            "HunyuanVideo 1.5 720p",
            "vae",
            "AutoencoderKLHunyuanVideo15",
            {},
            f"{_DIFFUSERS_SCRIPTS}/convert_hunyuan_video1_5_to_diffusers.py convert_vae() builds AutoencoderKLHunyuanVideo15() with its defaults",
        ),
        frames=121,
        size=(720, 1280),
        encoder_named=(
            "Qwen/Qwen2.5-VL-7B-Instruct, ByT5 Glyph-SDXL-v2",
            f"{_DIFFUSERS_SCRIPTS}/convert_hunyuan_video1_5_to_diffusers.py load_mllm() and --byt5_path",
        ),
        encoders=(
            _encoder(
                "HunyuanVideo 1.5 720p",
                "text_encoder",
                "Qwen2_5_VLTextModel",
                QWEN2_5_VL_7B_QUOTED["text_config"],
                f"{_MUSUBI_QWEN25VL} text_config (its hv_1_5_cache_text_encoder_outputs.py loads "
                "HunyuanVideo 1.5's Qwen2.5-VL through it): the language model alone, as "
                f"{_DIFFUSERS_SCRIPTS}/convert_hunyuan_video1_5_to_diffusers.py load_mllm() keeps it",
            ),
            _encoder(
                "HunyuanVideo 1.5 720p",
                "text_encoder_2",
                "T5EncoderModel",
                BYT5_GLYPH_SDXL_V2,
                f"{MUSUBI} src/musubi_tuner/hunyuan_video_1_5/hunyuan_video_1_5_text_encoder.py "
                "load_byt5 BYT5_CONFIG_JSON (byt5-small: d_model 1472, d_ff 3584, 12 encoder layers, as "
                f"{BYT5_REPO} byt5/gin/models/byt5.small.gin), its 384-token vocabulary grown by "
                "Glyph-SDXL-v2's 138 color and 988 font tokens to 1510 (add_special_token, before "
                f"the weights load; {HUNYUAN_VIDEO_15_REPO} hyvideo/models/text_encoders/byT5/__init__.py)",
            ),
        ),
        shift=(
            "FlowMatchEulerDiscreteScheduler, shift=9.0",
            f"{_DIFFUSERS_SCRIPTS}/convert_hunyuan_video1_5_to_diffusers.py SCHEDULER_CONFIGS['720p_t2v']",
        ),
    ),
    Family(
        "LTX-2",
        "ltx2",
        "LTX2Pipeline",
        _c(
            "LTX-2",
            "transformer",
            "LTX2VideoTransformer3DModel",
            LTX2_TRANSFORMER,
            f"{_DIFFUSERS_SCRIPTS}/convert_ltx2_to_diffusers.py get_ltx2_transformer_config('2.0')",
        ),
        _c(
            "LTX-2",
            "vae",
            "AutoencoderKLLTX2Video",
            LTX2_VIDEO_VAE,
            f"{_DIFFUSERS_SCRIPTS}/convert_ltx2_to_diffusers.py get_ltx2_video_vae_config('2.0')",
        ),
        frames=121,
        size=(704, 1280),
        encoder_named=(
            "google/gemma-3-12b-it-qat-q4_0-unquantized",
            f"{_DIFFUSERS_SCRIPTS}/convert_ltx2_to_diffusers.py get_args(): the text encoder's default",
        ),
        encoders=(
            _encoder(
                "LTX-2",
                "text_encoder",
                "Gemma3ForConditionalGeneration",
                GEMMA3_12B_FOR_LTX,
                f"{LTX2_REPO} packages/ltx-core/src/ltx_core/text_encoders/gemma/config.py "
                "GEMMA3_CONFIG_FOR_LTX, which encoders/encoder_configurator.py builds as "
                f"Gemma3ForConditionalGeneration; the shape of {GEMMA_REPO} gemma/gm/nn/_gemma.py "
                "Gemma3_12B with its SigLIP vision encoder",
            ),
        ),
        shift=(
            "FlowMatchEulerDiscreteScheduler, use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05, base_image_seq_len=1024, shift_terminal=0.1",
            f"{_DIFFUSERS_SCRIPTS}/convert_ltx2_to_diffusers.py main(): the scheduler of a checkpoint that is not distilled",
        ),
    ),
    Family(
        "Wan 2.1 T2V 14B",
        "wan",
        "WanPipeline",
        _existing("Wan 2.1 T2V 14B", "transformer"),
        _existing("Wan 2.1 T2V 14B", "vae"),
        frames=81,
        size=(720, 1280),
        encoder_named=(
            "google/umt5-xxl",
            f"{_WAN22_SCRIPT} __main__: UMT5EncoderModel.from_pretrained",
        ),
        encoders=(_UMT5_XXL_ENCODER,),
        shift=(
            "UniPCMultistepScheduler, prediction_type='flow_prediction', use_flow_sigmas=True, flow_shift=3.0",
            f"{_WAN22_SCRIPT} __main__: UniPCMultistepScheduler(prediction_type='flow_prediction', use_flow_sigmas=True, flow_shift=...)",
        ),
    ),
    Family(
        "Wan 2.2 T2V A14B",
        "wan",
        "WanPipeline",
        _c(
            "Wan 2.2 T2V A14B",
            "transformer",
            "WanTransformer3DModel",
            WAN_T2V_14B_TRANSFORMER,
            f"{_WAN22_SCRIPT} 'Wan2.2-T2V-A14B' (the same config for transformer and transformer_2)",
        ),
        _existing("Wan 2.1 T2V 14B", "vae"),
        denoisers=2,
        frames=81,
        size=(720, 1280),
        encoder_named=(
            "google/umt5-xxl",
            f"{_WAN22_SCRIPT} __main__: UMT5EncoderModel.from_pretrained",
        ),
        encoders=(_UMT5_XXL_ENCODER,),
        shift=(
            "UniPCMultistepScheduler, prediction_type='flow_prediction', use_flow_sigmas=True, flow_shift=3.0",
            f"{_WAN22_SCRIPT} __main__: UniPCMultistepScheduler(prediction_type='flow_prediction', use_flow_sigmas=True, flow_shift=...)",
        ),
    ),
    Family(
        "Wan 2.2 TI2V 5B",
        "wan",
        "WanPipeline",
        _c(
            "Wan 2.2 TI2V 5B",
            "transformer",
            "WanTransformer3DModel",
            WAN22_TI2V_5B_TRANSFORMER,
            f"{_WAN22_SCRIPT} 'Wan2.2-TI2V-5B'",
        ),
        _c(
            "Wan 2.2 TI2V 5B",
            "vae",
            "AutoencoderKLWan",
            WAN22_VAE,
            f"{_WAN22_SCRIPT} vae22_diffusers_config",
        ),
        frames=81,
        size=(704, 1280),
        encoder_named=(
            "google/umt5-xxl",
            f"{_WAN22_SCRIPT} __main__: UMT5EncoderModel.from_pretrained",
        ),
        encoders=(_UMT5_XXL_ENCODER,),
        shift=(
            "UniPCMultistepScheduler, prediction_type='flow_prediction', use_flow_sigmas=True, flow_shift=5.0",
            f"{_WAN22_SCRIPT} __main__: UniPCMultistepScheduler(prediction_type='flow_prediction', use_flow_sigmas=True, flow_shift=...)",
        ),
    ),
]
