"""Lab 07: how do UNet and DiT take in the timestep and the prompt, and what does attention cost?

The state is the latent ``(B, C, H/8, W/8)``. A UNet keeps it a feature map: the
timestep enters as a sinusoidal embedding added to every ResNet block, the prompt
through cross-attention (queries from the latent positions, keys and values from
``prompt_embeds`` ``(B, 77, D)``). A DiT cuts it into ``(H/8/p) * (W/8/p)`` tokens,
conditions every block through adaLN-Zero (scale, shift and a gate, zeroed for training),
and MMDiT (SD3, Flux) attends over text and image tokens as one sequence. The
trade-off: self-attention memory grows with the square of the token count, and the
token count with the square of the resolution.

Run it:  python3 code/lab-07-unet-dit-conditioning/conditioning.py --resolution 1024
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import figures
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    in_notebook,
    int_at_least,
    parse_args,
)

# %% [markdown]
# ## 1. Setup / contract
#
# In: an image size in pixels (`--resolution`, square), the DiT patch size `p`
# (`--patch-size`, 2 as DiT-XL/2, SD3 and Flux use), the number of text tokens an
# MMDiT prepends or appends (`--text-tokens`, 333 for SD3: 77 CLIP + 256 T5). The
# VAE divides each side by 8, so the latent is `(B, 4, H/8, W/8)` for SD 1.x and
# `(B, 16, H/8, W/8)` for SD3 and Flux.1. `SD15_UNET` mirrors Stable Diffusion 1.5's
# `unet/config.json` (diffusers' `UNet2DConditionModel` defaults, with
# `cross_attention_dim=768`). Latents, embeddings and weights are float32, as a fp32
# pipeline would hold them.

# %%
# --8<-- [start:setup]
parser = LabArgumentParser(prog="conditioning.py", description=__doc__.splitlines()[0])
parser.add_argument("--resolution", type=int_at_least(64), default=512, help="image side, px")
parser.add_argument("--patch-size", type=int_at_least(1), default=2, help="DiT patch size p")
parser.add_argument(
    "--text-tokens", type=int_at_least(1, 4096), default=333, help="MMDiT text tokens"
)
parser.add_argument("--seed", type=int, default=0)
add_figures_argument(parser)
args = parse_args(parser)
if args.resolution % 8:
    parser.error(
        f"--resolution must be a multiple of 8 (the VAE downsamples by 8), got {args.resolution}"
    )
if args.resolution > 1024:
    parser.error(f"--resolution must be <= 1024 for the NumPy demos, got {args.resolution}")
latent_hw = args.resolution // 8  # H/8 = W/8: the latent side
if latent_hw % args.patch_size:
    parser.error(
        f"--patch-size {args.patch_size} does not divide the {latent_hw}x{latent_hw} latent"
        f" of a {args.resolution} px image"
    )

SD15_UNET = dict(  # Stable Diffusion 1.5 unet/config.json
    block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    layers_per_block=2,
    attention_head_dim=8,  # a naming quirk: for SD 1.x this is the number of heads
    cross_attention_dim=768,  # CLIP ViT-L/14 text width: prompt_embeds (B, 77, 768)
    in_channels=4,
)
SDXL_UNET = dict(  # SDXL base unet/config.json: three levels, no attention at the first
    block_out_channels=(320, 640, 1280),
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    layers_per_block=2,
    attention_head_dim=(5, 10, 20),  # heads per level again: channels // 64
    transformer_layers_per_block=(1, 2, 10),
    cross_attention_dim=2048,  # CLIP ViT-L (768) + OpenCLIP bigG (1280), concatenated
    in_channels=4,
)
# the transformers' attention: patch size, heads, default text tokens in the joint sequence
TRANSFORMERS = {
    "DiT-XL/2": dict(patch_size=2, num_attention_heads=16, text_tokens=0),  # class labels
    "SD3 Medium": dict(patch_size=2, num_attention_heads=24, text_tokens=333),  # 77 + 256
    "Flux.1-dev": dict(patch_size=2, num_attention_heads=24, text_tokens=512),  # packed 2x2
}
FP16_BYTES = 2
rng = np.random.default_rng(args.seed)
print(f"resolution {args.resolution} px -> latents (1, 4, {latent_hw}, {latent_hw}) for SD 1.x")
# --8<-- [end:setup]

# %% [markdown]
# ## 2. The timestep embedding
#
# diffusers' `get_timestep_embedding`: frequencies
# `exp(-ln(max_period) * i / (half_dim - downscale_freq_shift))` for `i < half_dim`,
# `sin` and `cos` of `t * freq`, concatenated; `flip_sin_to_cos=True` puts `cos` first.
# SD's `UNet2DConditionModel` builds `Timesteps(block_out_channels[0],
# flip_sin_to_cos=True, downscale_freq_shift=0)`: a `(B, 320)` embedding that
# `time_embedding` (Linear, SiLU, Linear) turns into `emb` `(B, 1280)`.


# %%
# --8<-- [start:timestep]
def timestep_embedding(
    timesteps, embedding_dim, flip_sin_to_cos=False, downscale_freq_shift=1.0, scale=1.0,
    max_period=10000,
):  # fmt: skip
    """(B,) timesteps -> (B, embedding_dim) float32 sinusoids, as get_timestep_embedding."""
    half_dim = embedding_dim // 2
    exponent = -float(np.log(max_period)) * np.arange(half_dim, dtype=np.float32)
    exponent = exponent / (half_dim - downscale_freq_shift)
    freqs = np.exp(exponent)  # (half_dim,) from 1 down to ~1/max_period
    angles = scale * np.asarray(timesteps, np.float32)[:, None] * freqs[None, :]  # (B, half)
    emb = np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)  # (B, 2 * half)
    if flip_sin_to_cos:
        emb = np.concatenate([emb[:, half_dim:], emb[:, :half_dim]], axis=-1)  # cos first
    if embedding_dim % 2 == 1:
        emb = np.pad(emb, ((0, 0), (0, 1)))  # odd width: one zero column
    return emb.astype(np.float32)


def cosine(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


channels0 = SD15_UNET["block_out_channels"][0]  # 320: the sinusoid width
timesteps = np.array([0, 1, 500, 999])
t_emb = timestep_embedding(timesteps, channels0, flip_sin_to_cos=True, downscale_freq_shift=0)
half = channels0 // 2
periods = 2 * np.pi * np.power(10000.0, np.arange(half) / half)  # steps per full turn
print(f"t_emb = timestep_embedding(timesteps, {channels0}, flip_sin_to_cos=True, "
      f"downscale_freq_shift=0): shape {t_emb.shape}")  # fmt: skip
print(f"periods: {periods[0]:.3f} steps (dim 0) to {periods[-1]:.0f} steps (dim {half - 1})")
print(f"t=0: cos half all {t_emb[0, :half].min():.1f}, sin half all {t_emb[0, half:].max():.1f}")
for a, b in [(0, 1), (1, 500), (500, 999), (0, 999)]:
    ia, ib = list(timesteps).index(a), list(timesteps).index(b)
    print(f"cosine(t_emb[t={a}], t_emb[t={b}]) = {cosine(t_emb[ia], t_emb[ib]):.3f}")
print(f"time_embedding: (B, {channels0}) -> Linear, SiLU, Linear -> emb (B, {4 * channels0})")
# --8<-- [end:timestep]

# %% [markdown]
# ## 3. UNet: the time embedding is added to every ResNet block
#
# `ResnetBlock2D.forward`: `hidden_states = conv1(...)`, then
# `hidden_states + time_emb_proj(SiLU(emb))[:, :, None, None]`. A Linear
# `(1280 -> C_out)` gives one number per channel, broadcast over every position:
# the timestep shifts whole feature maps, the same at every pixel.

# %%
# --8<-- [start:unet_time]
emb = rng.standard_normal((1, 4 * channels0), dtype=np.float32)  # stands in for time_embedding
hidden_states = rng.standard_normal((1, channels0, latent_hw, latent_hw), dtype=np.float32)
w_time = rng.standard_normal((4 * channels0, channels0), dtype=np.float32) / 36  # time_emb_proj
silu = emb / (1 + np.exp(-emb))  # SiLU(emb) (1, 1280)
temb = (silu @ w_time)[:, :, None, None]  # (1, 320, 1, 1): one value per channel
hidden_states_t = hidden_states + temb  # (1, 320, h, w): broadcast over h and w
print(f"ResNet: hidden_states {hidden_states.shape} + time_emb_proj(SiLU(emb)) {temb.shape}")
print(f"  {temb.size} numbers (one per channel) shift all {hidden_states.size} entries "
      f"({latent_hw * latent_hw} positions x {channels0} channels)")  # fmt: skip
# --8<-- [end:unet_time]

# %% [markdown]
# ## 4. UNet: cross-attention shapes, one head computed for real
#
# `Transformer2DModel` flattens a level's feature map `(B, C, h, w)` into
# `(B, h*w, C)`: every latent position is a query. In `attn2`, the keys and values
# come from `prompt_embeds` `(B, 77, 768)`. One head of SD 1.5's first level,
# with random weights: `to_q` `(320 -> 40)`, `to_k` and `to_v` `(768 -> 40)`.


# %%
# --8<-- [start:cross_attention]
def softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def attention(query, key, value):
    """One head: (B, Nq, d), (B, Nk, d), (B, Nk, d) -> output (B, Nq, d), weights (B, Nq, Nk)."""
    scores = query @ key.transpose(0, 2, 1) / query.shape[-1] ** 0.5  # (B, Nq, Nk)
    weights = softmax(scores)  # each row sums to 1 over the keys
    return weights @ value, weights


heads = SD15_UNET["attention_head_dim"]  # 8 heads (the config key says head_dim; it is not)
head_dim = channels0 // heads  # 320 / 8 = 40
prompt_embeds = rng.standard_normal((1, 77, SD15_UNET["cross_attention_dim"]), dtype=np.float32)
tokens = hidden_states_t.transpose(0, 2, 3, 1).reshape(1, latent_hw * latent_hw, channels0)
to_q = rng.standard_normal((channels0, head_dim), dtype=np.float32) / channels0**0.5
to_k = rng.standard_normal((768, head_dim), dtype=np.float32) / 768**0.5
to_v = rng.standard_normal((768, head_dim), dtype=np.float32) / 768**0.5
query = tokens @ to_q  # (1, h*w, 40): from the latent positions
key, value = prompt_embeds @ to_k, prompt_embeds @ to_v  # (1, 77, 40): from the prompt
out, weights = attention(query, key, value)
print(f"attn2, one of {heads} heads (head_dim {head_dim}): hidden_states {tokens.shape}, "
      f"prompt_embeds {prompt_embeds.shape}")  # fmt: skip
print(f"  query {query.shape}  key {key.shape}  value {value.shape}")
print(f"  weights {weights.shape}, rows sum to 1: {np.allclose(weights.sum(-1), 1)}  "
      f"output {out.shape}")  # fmt: skip
# --8<-- [end:cross_attention]

# %% [markdown]
# ## 5. UNet: attention per level
#
# Each `CrossAttnDownBlock2D` holds `layers_per_block` attention layers, each
# `CrossAttnUpBlock2D` one more, and the mid block one, at the deepest level; each
# attention layer stacks `transformer_layers_per_block` transformer blocks (1 in SD 1.5;
# 1, 2, 10 per level in SDXL, which has no attention at its first level). Every
# transformer block has `attn1` (self-attention, `(h*w) x (h*w)` per head) and
# `attn2` (cross-attention, `(h*w) x 77`). Bytes are one fp16 score matrix, per head
# and per image: a lower bound for a kernel that materialises it (PyTorch's unfused math
# backend holds fp32 scores and their softmax by default, 4x).


# %%
# --8<-- [start:unet_levels]
def per_level(value, levels):
    """A config value given once for all levels (an int) or per level (a tuple)."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * levels


def unet_attention_levels(config, latent_side):
    """Rows (where, side, query positions, channels, heads, head_dim, blocks) of a UNet."""
    rows, side = [], latent_side
    channels = config["block_out_channels"]
    n_heads = per_level(config["attention_head_dim"], len(channels))  # heads, per level
    depth = per_level(config.get("transformer_layers_per_block", 1), len(channels))
    sides = []
    for i, block in enumerate(config["down_block_types"]):
        sides.append(side)
        if block.startswith("CrossAttn"):
            c = channels[i]
            rows.append((f"down {i}", side, side * side, c, n_heads[i], c // n_heads[i],
                         config["layers_per_block"] * depth[i]))  # fmt: skip
        if i < len(channels) - 1:  # every down block but the last halves the side
            side = -(-side // 2)  # a stride-2 conv: ceil(side / 2)
    c = channels[-1]
    rows.append(("mid", side, side * side, c, n_heads[-1], c // n_heads[-1], depth[-1]))
    for i, block in enumerate(config["up_block_types"]):
        level = len(channels) - 1 - i
        if block.startswith("CrossAttn"):
            c, s = channels[level], sides[level]
            rows.append((f"up {i}", s, s * s, c, n_heads[level], c // n_heads[level],
                         (config["layers_per_block"] + 1) * depth[level]))  # fmt: skip
    return rows


def mib(n_bytes):
    """Bytes in binary units: KiB, MiB or GiB, one decimal."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n_bytes >= size:
            return f"{n_bytes / size:.1f} {unit}"
    return f"{n_bytes / 2**10:.1f} KiB"


def print_levels(name, levels):
    print(f"{name}, {args.resolution} px:")
    print(f"{'block':>7} {'h x w':>9} {'queries':>8} {'C':>5} {'heads':>5} {'head_dim':>8} "
          f"{'blocks':>6} {'attn1/head':>12} {'attn2/head':>11}")  # fmt: skip
    for where, side, q, c, h, d, n in levels:
        print(f"{where:>7} {f'{side}x{side}':>9} {q:>8} {c:>5} {h:>5} {d:>8} {n:>6} "
              f"{mib(q * q * FP16_BYTES):>12} {mib(q * 77 * FP16_BYTES):>11}")  # fmt: skip


levels = unet_attention_levels(SD15_UNET, latent_hw)
print_levels("SD 1.5 UNet", levels)
total_blocks = sum(row[-1] for row in levels)
first = levels[0]
layer_bytes = first[2] ** 2 * first[4] * FP16_BYTES  # all heads of one attn1 at level 0
print(f"{total_blocks} transformer blocks; one first-level attn1 with all {first[4]} heads: "
      f"{mib(layer_bytes)} per image, {mib(2 * layer_bytes)} for a CFG batch of 2")  # fmt: skip
levels_xl = unet_attention_levels(SDXL_UNET, latent_hw)
print_levels("SDXL UNet (attention at H/16 and H/32 only)", levels_xl)
print(f"{sum(row[-1] for row in levels_xl)} transformer blocks; largest attn1: "
      f"{max(row[2] for row in levels_xl)} queries")  # fmt: skip
# --8<-- [end:unet_levels]

# %% [markdown]
# ## 6. DiT: patchify and unpatchify
#
# A DiT cuts the latent into `p x p` patches and flattens each into one token of
# width `C * p * p`: `(B, C, h, w) -> (B, (h/p) * (w/p), C * p * p)`. This is the
# order FluxPipeline's `_pack_latents` uses (channels, then the patch's rows and
# columns), and the layout of a `Conv2d(C, D, kernel_size=p, stride=p)` weight, so DiT's
# `PatchEmbed` is "patchify, one Linear, + a position table". `unpatchify` inverts patchify
# (FluxPipeline's `_unpack_latents`). DiT's output head orders each token differently,
# `(p, p, C_out)`, and DiT-XL/2 learns the variance too: `C_out = 2 C`
# (`out_channels=8`); `dit_unpatchify` follows `DiTTransformer2DModel`.


# %%
# --8<-- [start:patchify]
def patchify(latents, p):
    """(B, C, h, w) -> (B, (h/p)*(w/p), C*p*p): one token per p x p patch, row-major."""
    b, c, h, w = latents.shape
    x = latents.reshape(b, c, h // p, p, w // p, p)  # split each side into (patches, p)
    x = x.transpose(0, 2, 4, 1, 3, 5)  # (B, h/p, w/p, C, p, p)
    return x.reshape(b, (h // p) * (w // p), c * p * p)


def unpatchify(tokens, h, w, p):
    """(B, (h/p)*(w/p), C*p*p) -> (B, C, h, w), the inverse of patchify."""
    b, _, width = tokens.shape
    c = width // (p * p)
    x = tokens.reshape(b, h // p, w // p, c, p, p).transpose(0, 3, 1, 4, 2, 5)  # (B,C,h/p,p,w/p,p)
    return x.reshape(b, c, h, w)


def dit_unpatchify(tokens, h, w, p):
    """DiT's head (B, (h/p)*(w/p), p*p*C_out) -> (B, C_out, h, w): (p, p, C_out) per token."""
    b, _, width = tokens.shape
    c_out = width // (p * p)
    x = tokens.reshape(b, h // p, w // p, p, p, c_out)  # diffusers: "nhwpqc->nchpwq"
    return x.transpose(0, 5, 1, 3, 2, 4).reshape(b, c_out, h, w)


p = args.patch_size
latents = rng.standard_normal((1, 16, latent_hw, latent_hw), dtype=np.float32)  # SD3 / Flux.1
patch_tokens = patchify(latents, p)
print(f"patchify p={p}: latents {latents.shape} -> tokens {patch_tokens.shape}: "
      f"({args.resolution}/8/{p})^2 = {(latent_hw // p) ** 2} tokens")  # fmt: skip
print(
    f"unpatchify(patchify(latents)) == latents: "
    f"{np.array_equal(unpatchify(patch_tokens, latent_hw, latent_hw, p), latents)}"
)
head_out = np.random.default_rng(args.seed + 1).standard_normal(  # own stream
    (1, (latent_hw // p) ** 2, p * p * 8), dtype=np.float32
)
noise_pred, variance = np.split(dit_unpatchify(head_out, latent_hw, latent_hw, p), 2, axis=1)
print(f"DiT-XL/{p} head: tokens {head_out.shape} (p*p*2C, C = 4) -> noise_pred {noise_pred.shape}"
      f" + learned variance {variance.shape}")  # fmt: skip
print(f"  (C, p, p) order would misplace it: "
      f"{not np.array_equal(unpatchify(head_out, latent_hw, latent_hw, p), dit_unpatchify(head_out, latent_hw, latent_hw, p))}")  # fmt: skip
# --8<-- [end:patchify]

# %% [markdown]
# ## 7. Tokens and attention bytes against resolution
#
# Self-attention scores form an `N x N` matrix per head. For a UNet, `N` is the `h*w`
# of its highest-resolution attention level: `(H/8) * (W/8)` in SD 1.5, but
# `(H/16) * (W/16)` in SDXL, which has no attention at its first level. For a DiT,
# `(H/8/p) * (W/8/p)`; for MMDiT, image tokens plus text tokens. fp16 bytes per image,
# per head and per layer (all heads).


# %%
# --8<-- [start:table]
def tokens_at(px, patch=2):
    return (px // 8) ** 2, (px // 8 // patch) ** 2  # UNet first-level queries, DiT tokens


def largest_self_attention(px):
    """{model: (tokens N, heads)} of the largest self-attention, from the configs above."""
    largest = {}
    for name, config in (("SD 1.5 UNet", SD15_UNET), ("SDXL UNet", SDXL_UNET)):
        row = max(unet_attention_levels(config, px // 8), key=lambda r: r[2])
        largest[name] = (row[2], row[4])
    for name, config in TRANSFORMERS.items():
        n_img = (px // 8 // config["patch_size"]) ** 2
        largest[name] = (n_img + config["text_tokens"], config["num_attention_heads"])
    return largest


print(f"{'px':>5} {'model':>12} {'N':>6} {'heads':>5} {'attn/head':>10} {'attn/layer':>11}")
for px in (512, 1024, 2048):
    for name, (n, n_heads) in largest_self_attention(px).items():
        per_head = n * n * FP16_BYTES
        print(f"{px:>5} {name:>12} {n:>6} {n_heads:>5} {mib(per_head):>10} "
              f"{mib(per_head * n_heads):>11}")  # fmt: skip
print(f"{'px':>5} {'latent':>9} {'UNet N':>7} {'UNet attn1/head':>16} {'UNet attn2/head':>16}"
      f" {'DiT N':>6} {'DiT attn/head':>14}  (SD 1.5's first level; DiT p=2)")  # fmt: skip
for px in (256, 512, 1024, 2048):
    n_unet, n_dit = tokens_at(px)
    print(f"{px:>5} {f'{px // 8}x{px // 8}':>9} {n_unet:>7} {mib(n_unet**2 * FP16_BYTES):>16} "
          f"{mib(n_unet * 77 * FP16_BYTES):>16} {n_dit:>6} "
          f"{mib(n_dit**2 * FP16_BYTES):>14}")  # fmt: skip
print(f"{'px':>5} {'text':>5} {'N = img + text':>15} {'text share':>10} {'joint attn/head':>16}")
for px in (256, 512, 1024, 2048):
    for text in (77, 333, 512):
        n_img = tokens_at(px)[1]
        n = n_img + text
        print(f"{px:>5} {text:>5} {f'{n_img} + {text}':>15} {text / n:>10.1%} "
              f"{mib(n**2 * FP16_BYTES):>16}")  # fmt: skip
# --8<-- [end:table]

# %% [markdown]
# ## 8. adaLN-Zero against the UNet's added embedding
#
# A DiT block regresses six vectors from the conditioning `c` (DiT-XL/2: timestep
# plus class embedding): `shift, scale, gate` for attention and for the MLP,
# in diffusers' `AdaLayerNormZero` order. Each branch is
# `x + gate * f(LayerNorm(x) * (1 + scale) + shift)`. DiT initialises the
# modulation Linear to zero, so every gate is 0 and the block is the identity.


# %%
# --8<-- [start:adaln]
def layer_norm(x, eps=1e-6):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)  # no affine: elementwise_affine=False


def ada_ln_zero_modulation(x, c, w, b):
    """AdaLayerNormZero: Linear(SiLU(c)) -> 6 chunks; returns the modulated x and the rest."""
    mod = (c / (1 + np.exp(-c))) @ w + b  # (B, 6D)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = np.split(mod, 6, axis=1)
    x_mod = layer_norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
    return x_mod, gate_msa, shift_mlp, scale_mlp, gate_mlp


def dit_block(x, c, w_mod, b_mod, w_qkv, w_mlp):
    """(B, N, D) tokens, (B, D) conditioning -> (B, N, D); single-head attention, ReLU MLP."""
    x_mod, gate_msa, shift_mlp, scale_mlp, gate_mlp = ada_ln_zero_modulation(x, c, w_mod, b_mod)
    q, k, v = np.split(x_mod @ w_qkv, 3, axis=-1)
    x = x + gate_msa[:, None] * attention(q, k, v)[0]  # gated residual branch
    x_mod = layer_norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    return x + gate_mlp[:, None] * (np.maximum(x_mod @ w_mlp, 0) @ w_mlp.T)


dim = 64  # a small hidden width (DiT-XL/2: 1152)
x = patch_tokens @ (rng.standard_normal((patch_tokens.shape[-1], dim), dtype=np.float32) / 8)
c = timestep_embedding([500], dim, flip_sin_to_cos=True, downscale_freq_shift=1)  # (1, D)
w_qkv = rng.standard_normal((dim, 3 * dim), dtype=np.float32) / 8
w_mlp = rng.standard_normal((dim, 4 * dim), dtype=np.float32) / 8
zero_w, zero_b = np.zeros((dim, 6 * dim), np.float32), np.zeros(6 * dim, np.float32)
random_w = rng.standard_normal((dim, 6 * dim), dtype=np.float32) / 8  # std 0.125: ~1.7x nn.Linear's
x_block = x[:, :256]  # (1, 256, D): the first 256 tokens are enough to show it
y_zero = dit_block(x_block, c, zero_w, zero_b, w_qkv, w_mlp)
y_random = dit_block(x_block, c, random_w, zero_b, w_qkv, w_mlp)
print(f"adaLN-Zero block on tokens {x_block.shape}, c {c.shape}, modulation Linear "
      f"{dim} -> {6 * dim}")  # fmt: skip
print(f"  zero-init modulation:   block(x) == x exactly: {np.array_equal(y_zero, x_block)}")
print(f"  random-init modulation: max |block(x) - x| = {np.abs(y_random - x_block).max():.3f}")
# --8<-- [end:adaln]

# %% [markdown]
# ## 9. MMDiT: joint attention over text and image tokens
#
# SD3's `JointTransformerBlock` projects image tokens and text tokens with separate
# weights, concatenates them along the sequence (image first in
# `JointAttnProcessor2_0`; Flux puts text first), runs one attention over
# `N = T_img + T_txt`, and splits the output back. One head, random weights.

# %%
# --8<-- [start:joint]
n_img, n_txt = patch_tokens.shape[1], args.text_tokens
img = x  # (1, T_img, D): the patch tokens
txt = rng.standard_normal((1, n_txt, dim), dtype=np.float32)  # context_embedder(prompt_embeds)
w_img = rng.standard_normal((dim, 3 * dim), dtype=np.float32) / 8  # to_q, to_k, to_v
w_txt = rng.standard_normal((dim, 3 * dim), dtype=np.float32) / 8  # add_q/k/v_proj


def joint_attention(img, txt):
    """(B, T_img, D), (B, T_txt, D) -> image out, text out, weights (B, N, N); N = T_img + T_txt."""
    q, k, v = (np.concatenate(pair, axis=1) for pair in zip(
        np.split(img @ w_img, 3, -1), np.split(txt @ w_txt, 3, -1), strict=True))  # fmt: skip
    out, weights = attention(q, k, v)  # one softmax over all N keys
    return out[:, : img.shape[1]], out[:, img.shape[1] :], weights  # split back: image first


img_out, txt_out, joint_weights = joint_attention(img, txt)
img_out2, _, _ = joint_attention(img, txt + 1)  # another prompt, same image
_, txt_out2, _ = joint_attention(img + 1, txt)  # another image, same prompt
print(f"joint attention: {n_img} image + {n_txt} text tokens -> one sequence of {n_img + n_txt}")
print(f"  weights {joint_weights.shape} = ({n_img} + {n_txt})^2 entries, "
      f"{mib(joint_weights[0].size * FP16_BYTES)} per head in fp16")  # fmt: skip
print(f"  split back: image {img_out.shape}, text {txt_out.shape}")
print(f"  another prompt changes the image tokens' output: {not np.allclose(img_out, img_out2)}")
print(f"  another image changes the text tokens' output:  {not np.allclose(txt_out, txt_out2)}")
# --8<-- [end:joint]

# %% [markdown]
# ## 10. Picture it
#
# The largest self-attention layer's bytes (all heads) against resolution, log scale,
# for the five models of the table, against an 80 GB reference line. Then a heatmap of
# SD's timestep embedding.

# %%
# --8<-- [start:figures]
px = np.arange(256, 2049, 64)
per_layer = {name: [] for name in largest_self_attention(512)}
for side in px:
    for name, (n, n_heads) in largest_self_attention(int(side)).items():
        per_layer[name].append(float(n) ** 2 * n_heads * FP16_BYTES)
series = {name: (px, np.array(values)) for name, values in per_layer.items()}
series["80 GB reference"] = (px[[0, -1]], np.array([80e9, 80e9]))  # a reference line
chart = figures.line_chart(series, "image side (px)", "bytes per layer, all heads (fp16)",
                           logy=True)  # fmt: skip
figures.save(
    args.figures, "attention-bytes", chart,
    alt="Log-scale line chart of the largest self-attention layer's score bytes, all heads, "
    "fp16, one image, against image side from 256 to 2048 px, for five models. SD 1.5's UNet, "
    "which attends at its first level, is highest and grows 16-fold per doubling of the side, "
    "to 64 GiB at 2048 px, just under the 80 GB reference line; SDXL's UNet, whose largest attention is at the "
    "H/16 level with 10 heads, sits about 13 times lower, near DiT-XL/2 with 16 heads; SD3 "
    "Medium and Flux.1-dev, with 24 heads and their text tokens in the sequence, sit above "
    "the DiT.",
    caption="Largest self-attention layer, score bytes with all heads (fp16, one image), "
    "against resolution.",
)  # fmt: skip
if args.figures is not None or in_notebook():  # PNG encoding costs time: only when shown
    grid_t = np.arange(0, 1000, 5)  # 200 timesteps, one per row
    heat = timestep_embedding(grid_t, channels0, flip_sin_to_cos=True, downscale_freq_shift=0)
    level = (np.round((heat + 1) / 2 * 8) / 8)[..., None]  # (200, 320, 1): 9 levels in [0, 1]
    blue, red, white = np.array([40, 90, 200]), np.array([200, 60, 40]), np.array([240, 240, 240])
    rgb = np.where(
        level < 0.5, blue + (white - blue) * 2 * level, white + (red - white) * (2 * level - 1)
    )
    heatmap = figures.png(rgb.round().astype(np.uint8), scale=2)
    figures.save(
        args.figures, "timestep-embedding", heatmap,
        alt="Heatmap of Stable Diffusion's 320-wide timestep embedding, one row per timestep "
        "from 0 at the top to 995 at the bottom, blue for -1 and red for +1. The left half is "
        "the cosine half, the right half the sine half; columns near each half's left edge "
        "oscillate fast, columns further right change slowly, so nearby timesteps get similar "
        "rows.",
        caption="SD's timestep embedding (flip_sin_to_cos=True, downscale_freq_shift=0), "
        "t = 0 to 995.",
    )  # fmt: skip
if in_notebook():
    from IPython.display import SVG, Image, display

    display(SVG(chart))
    display(Image(data=heatmap))
# --8<-- [end:figures]
