"""Meta-device records of the real Flux.1-dev transformer and Wan 2.1 VAE, and SD 1.5's FLOPs, shared by the verify tests.

Built from its published config (``model_configs``) on the meta device: no weights, no
memory. ``test_model_sizes`` writes these records to ``labkit/model_sizes.json``; the lab
pages' tests compare them with what the starters print. Import with ``from sizes import
...``; a test module never imports another test module.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from model_configs import COMPONENTS, PUBLISHED, build, count_params

#: tests/conftest.py's ``once_per_run`` bound to the session (the verify conftest sets it):
#: made once per test run, shared by pytest-xdist's workers. None outside pytest.
RUN_ONCE = None


def once_per_run(fn):
    """``fn()`` computed once per test run, not once per worker process, through conftest's
    ``once_per_run`` (the first worker computes it under a file lock and leaves it as JSON;
    the others read it). The records are meta-device counts, the same in every process; each
    caller gets the JSON form, whichever process computed it."""

    @functools.cache
    @functools.wraps(fn)
    def once():
        if RUN_ONCE is None:
            return json.loads(json.dumps(fn()))

        def make(folder: Path) -> Path:
            (folder / "record.json").write_text(json.dumps(fn()), encoding="utf-8")
            return folder / "record.json"

        return json.loads(RUN_ONCE(fn.__name__, make).read_text(encoding="utf-8"))

    return once


def _flux_transformer():
    """The real Flux.1-dev transformer from its published config, on the meta device."""
    (flux,) = [c for c in COMPONENTS if (c.pipeline, c.component) == ("Flux.1-dev", "transformer")]
    return build(flux)


def _pattern(name: str) -> str:
    """'transformer_blocks.7.norm1.linear.weight' -> 'transformer_blocks.*.norm1.linear'."""
    parts = name.split(".")[:-1]
    return ".".join("*" if p.isdigit() else p for p in parts)


def layerwise_casting_record() -> dict:
    """Flux.1-dev's transformer after diffusers' own `enable_layerwise_casting` (fp8 storage).

    Runs the real method on the meta-device model, so the skip patterns are the ones
    diffusers applies (DEFAULT_SKIP_MODULES_PATTERN plus the class's
    `_skip_layerwise_casting_patterns`, matched by re.search on each module's name; a match
    skips the whole subtree). The kept parameters are counted at 2 bytes: the model loaded
    with `dtype=torch.bfloat16`.
    """
    import torch
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN

    model = _flux_transformer()
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    cast, kept = 0, {}
    for name, p in model.named_parameters():
        if p.dtype == torch.float8_e4m3fn:
            cast += p.numel()
        else:
            kept[_pattern(name)] = kept.get(_pattern(name), 0) + p.numel()
    return {
        "Flux.1-dev/transformer": {
            "storage_dtype": "float8_e4m3fn",
            "compute_dtype": "bfloat16",
            "skip_patterns": sorted(
                {*DEFAULT_SKIP_MODULES_PATTERN, *type(model)._skip_layerwise_casting_patterns}
            ),
            "cast_params": cast,
            "kept_params": sum(kept.values()),
            "kept": dict(sorted(kept.items(), key=lambda kv: -kv[1])),
            "bytes": cast + 2 * sum(kept.values()),
        }
    }


#: Flux.1-dev at 1024 x 1024 px: (1024 / 8 / 2) ** 2 image tokens, 512 T5 tokens
FLUX_1024 = {"image_tokens": 4096, "text_tokens": 512}


@once_per_run
def flux_1024_record() -> dict:
    """One Flux.1-dev transformer call at 1024 px on the meta device: its FLOPs, the share
    in the modules TaylorSeer hooks by default, and the bytes of TaylorSeer's stored factors.

    FLOPs: torch's FlopCounterMode, per module. Factors: diffusers' own
    `TaylorSeerCacheConfig()` hooks, run for two computed steps (orders 0 and 1 stored).
    """
    import torch
    from diffusers import TaylorSeerCacheConfig
    from diffusers.hooks.taylorseer_cache import TaylorSeerState
    from torch.utils.flop_counter import FlopCounterMode

    model = _flux_transformer()
    n_img, n_txt = FLUX_1024["image_tokens"], FLUX_1024["text_tokens"]
    cfg = model.config
    with torch.device("meta"):
        inputs = dict(
            hidden_states=torch.randn(1, n_img, cfg.in_channels),
            encoder_hidden_states=torch.randn(1, n_txt, cfg.joint_attention_dim),
            pooled_projections=torch.randn(1, cfg.pooled_projection_dim),
            guidance=torch.tensor([3.5]),
            img_ids=torch.randn(n_img, 3),
            txt_ids=torch.randn(n_txt, 3),
        )
    counter = FlopCounterMode(display=False, depth=None)
    with torch.no_grad(), counter:
        model(timestep=torch.tensor([1.0], device="meta"), **inputs)
    counts = counter.get_flop_counts()
    total = sum(counts["Global"].values())
    model.enable_cache(TaylorSeerCacheConfig())
    hooked = [n for n, m in model.named_modules() if getattr(m, "_diffusers_hook", None) and m._diffusers_hook.get_hook("taylorseer_cache")]  # fmt: skip
    hooked_flops = sum(sum(counts[f"{type(model).__name__}.{n}"].values()) for n in hooked)
    states = []
    original = TaylorSeerState.update

    def update(self, outputs):
        states.append(self) if self not in states else None
        return original(self, outputs)

    TaylorSeerState.update = update
    try:
        with torch.no_grad(), model.cache_context("cond"):
            for t in (1.0, 0.9):  # steps 0 and 1: both computed (disable_cache_before_step=3)
                model(timestep=torch.tensor([t], device="meta"), **inputs)
    finally:
        TaylorSeerState.update = original
    factor_bytes = sum(
        f.numel() * f.element_size() for s in states for fs in s.taylor_factors.values() for f in fs.values()
    )  # fmt: skip
    return {
        **FLUX_1024,
        "flops": total,
        "taylorseer_hooked_modules": len(hooked),
        "taylorseer_hooked_flops": hooked_flops,
        "taylorseer_factor_bytes": factor_bytes,
        "taylorseer_config": "TaylorSeerCacheConfig() defaults: max_order=1, taylor_factors_dtype=torch.bfloat16",
    }


#: Wan 2.1's VAE decoding 9 frames of 720p: 3 latent frames of 90 x 160
WAN_DECODE_720P = {"latents": [1, 16, 3, 90, 160], "frames": 9, "height": 720, "width": 1280}
#: and a 5 s clip, 81 frames: 21 latent frames (replayed, tiled and untiled)
WAN_DECODE_720P_81 = [1, 16, 21, 90, 160]
#: the replay's check when tiled: 3 latent frames (the third repeats the second's kind) in 2 x 3
#: tiles of the default 32-latent tiles at stride 24 (heights 32 and 8, widths 32, 32 and 8),
#: so tile kinds repeat across the row as at 720p: 18 decoder calls where 720p has 84
WAN_REPLAY_CHECK_TILED = [1, 16, 3, 32, 56]


def _live_tensor_peak(run, exclude, replay=None):
    """Peak bytes of live tensor storages while ``run()`` executes, and the float32 bytes live
    at that peak. A TorchDispatchMode adds each op's new output storages and drops a storage
    once it is freed (a weak reference expires); ``exclude`` (weights, inputs) is not counted.
    On the meta device nothing is allocated: the bytes are what the shapes and dtypes need.

    ``replay``: a Wan decoder whose calls repeat (``tiled_decode`` calls it once per tile and
    latent frame). The first call of each kind (input shape, ``first_chunk``, the shapes in
    its ``feat_cache``) runs and is measured: how far the live bytes rise above their value at
    the call's start, and the output and cache shapes it leaves. A later call of that kind is
    replayed: the live bytes at its start plus that rise count toward the peak, and new meta
    tensors of the recorded shapes take the output's and the caches' places (the float32
    share is then not known). ``wan_vae_decode_record`` checks that this gives the full run's
    peak, tiled on ``WAN_REPLAY_CHECK_TILED`` (tile kinds repeat across rows of tiles and
    latent frames, as at 720p, in fewer tiles) and untiled on 13 frames (4 latent frames:
    untiled, 9 frames' three decoder calls are each of a new kind, so none would be replayed)."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    excluded = {StorageWeakRef(t.untyped_storage()).cdata for t in exclude}
    live = {}  # storage -> (weak reference, bytes, float32?)
    state = {"now": 0, "peak": 0, "fp32_at_peak": 0, "rise": 0}

    def settle():
        for key, (ref, n, _) in list(live.items()):
            if ref.expired():
                del live[key]
                state["now"] -= n

    def reach(now):
        state["rise"] = max(state["rise"], now)
        if now > state["peak"]:
            state["peak"] = now
            state["fp32_at_peak"] = sum(n for _, n, fp32 in live.values() if fp32)

    class Live(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            settle()
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    ref = StorageWeakRef(t.untyped_storage())
                    if ref.cdata not in excluded and ref.cdata not in live:
                        n = t.untyped_storage().nbytes()
                        live[ref.cdata] = (ref, n, t.dtype == torch.float32)
                        state["now"] += n
            reach(state["now"])
            return out

    def kind(x):
        return x if x is None or isinstance(x, str) else (tuple(x.shape), x.dtype)

    def new(k):
        return k if k is None or isinstance(k, str) else torch.empty(k[0], dtype=k[1], device="meta")  # fmt: skip

    seen = {}
    if replay is not None:
        forward = replay.forward

        def replayed(x, feat_cache=None, feat_idx=(0,), first_chunk=False):
            settle()
            start, key = state["now"], (kind(x), first_chunk, tuple(kind(c) for c in feat_cache))
            if key not in seen:
                state["rise"] = start
                out = forward(x, feat_cache=feat_cache, feat_idx=feat_idx, first_chunk=first_chunk)
                seen[key] = (state["rise"] - start, kind(out), [kind(c) for c in feat_cache], feat_idx[0])  # fmt: skip
                return out
            rise, out_kind, cache_kinds, idx = seen[key]
            reach(start + rise)
            feat_cache[:] = [new(k) for k in cache_kinds]
            feat_idx[0] = idx
            return new(out_kind)

        replay.forward = replayed
    try:
        with torch.no_grad(), Live():
            run()
    finally:
        if replay is not None:
            del replay.forward
    return state["peak"], state["fp32_at_peak"]


@once_per_run
def wan_vae_decode_record() -> dict:
    """The live-tensor peak of the real Wan 2.1 VAE (`AutoencoderKLWan()`, its defaults) in
    `vae.decode` of 3 latent frames of 720p, built on the meta device: in bfloat16, in
    float32 (diffusers' Wan example loads the VAE so), and in bfloat16 after
    `vae.enable_tiling()` with its defaults. Weights and the input latents are not counted.
    Also 81 frames (21 latent frames), tiled and untiled. The tiled peaks and the untiled
    81-frame one replay the decoder's repeated calls (``_live_tensor_peak``'s ``replay``: 720p's
    84 tiled decoder calls on 3 latent frames run as their few kinds), checked against the full
    run: tiled on ``WAN_REPLAY_CHECK_TILED``, untiled on 13 frames (4 latent frames; on 3 an
    untiled decode replays none of its calls).
    Computed once per test run (``once_per_run``)."""
    import torch
    from diffusers import AutoencoderKLWan

    def peak(dtype, tiling=False, latents=WAN_DECODE_720P["latents"], replay=False):
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # build in dtype: no .to() cast
        try:
            with torch.device("meta"):
                vae = AutoencoderKLWan()
                z = torch.randn(latents)
        finally:
            torch.set_default_dtype(old)
        if tiling:
            vae.enable_tiling()
        out = []
        bytes_, fp32 = _live_tensor_peak(lambda: out.append(vae.decode(z).sample.shape), [*vae.parameters(), *vae.buffers(), z], vae.decoder if replay else None)  # fmt: skip
        frames = (latents[2] - 1) * vae.config.scale_factor_temporal + 1
        s = vae.spatial_compression_ratio
        assert list(out[0]) == [1, 3, frames, latents[3] * s, latents[4] * s]
        return bytes_, fp32

    bf16, bf16_fp32 = peak(torch.bfloat16)
    small = WAN_REPLAY_CHECK_TILED  # replaying is exact on repeated tile kinds, then at 720p
    assert peak(torch.bfloat16, tiling=True, latents=small, replay=True)[0] == peak(torch.bfloat16, tiling=True, latents=small)[0]  # fmt: skip
    tiled = peak(torch.bfloat16, tiling=True, replay=True)[0]
    frames_13 = [1, 16, 4, 90, 160]  # the 4th decoder call repeats the 3rd's kind: one replay
    assert peak(torch.bfloat16, latents=frames_13, replay=True)[0] == peak(torch.bfloat16, latents=frames_13)[0]  # fmt: skip
    tiled_81 = peak(torch.bfloat16, tiling=True, latents=WAN_DECODE_720P_81, replay=True)[0]
    untiled_81 = peak(torch.bfloat16, latents=WAN_DECODE_720P_81, replay=True)[0]
    return {
        **WAN_DECODE_720P,
        "peak_bytes": {
            "bf16": bf16,
            "fp32": peak(torch.float32)[0],
            "bf16_tiled": tiled,
            "bf16_tiled_81_frames": tiled_81,
            "bf16_81_frames": untiled_81,
        },
        "bf16_peak_float32_bytes": bf16_fp32,
        "method": "AutoencoderKLWan() defaults (Wan 2.1) on the meta device; peak of live tensor storages during vae.decode (new op outputs added, freed storages dropped; weights and input latents not counted); tiled: enable_tiling() defaults; bf16_tiled_81_frames and bf16_81_frames: latents (1, 16, 21, 90, 160), tiled and untiled; bf16_tiled and the 81-frame peaks with the decoder's repeated calls replayed from the first of each kind (exact against full runs: tiled on latents (1, 16, 3, 32, 56), untiled on 13 frames)",
    }


@once_per_run
def sd15_flops() -> dict[str, int]:
    """FLOPs of SD 1.5's parts at 512 x 512, one row, counted by torch's ``FlopCounterMode``
    on the meta device from the published configs (``model_configs``; no weights, no memory):
    one UNet call (``unet``), one VAE decode (``decode``), one text-encoder call on 77 tokens
    (``text``) and the shipped safety checker's vision tower on its 224 x 224 input
    (``safety``). Counted once per test run (``once_per_run``): several pages quote shares of these."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from model_configs import CLIP_L14_VISION, CLIP_L_TEXT, SD15_UNET, SD15_VAE
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import CLIPConfig, CLIPTextConfig, CLIPTextModel

    def flops(fn) -> int:
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            fn()
        return counter.get_total_flops()

    with torch.device("meta"):
        unet, vae = UNet2DConditionModel(**SD15_UNET), AutoencoderKL(**SD15_VAE)
        text_encoder = CLIPTextModel(CLIPTextConfig(**CLIP_L_TEXT))
        safety = StableDiffusionSafetyChecker(
            CLIPConfig(vision_config=CLIP_L14_VISION, projection_dim=768)
        )
        x, text = torch.randn(1, 4, 64, 64), torch.randn(1, 77, 768)
        return dict(
            unet=flops(lambda: unet(x, torch.tensor(999), encoder_hidden_states=text)),
            decode=flops(lambda: vae.decode(torch.randn(1, 4, 64, 64))),
            text=flops(lambda: text_encoder(torch.zeros(1, 77, dtype=torch.long))),
            safety=flops(lambda: safety.vision_model(torch.randn(1, 3, 224, 224))),
        )


def _blocks(denoiser) -> dict[str, int]:
    """The built denoiser's block lists, counted: each ``nn.ModuleList`` child by its attribute
    name (``transformer_blocks``, a UNet's ``down_blocks`` and ``up_blocks``, Z-Image's refiners)."""
    import torch

    return {n: len(m) for n, m in denoiser.named_children() if isinstance(m, torch.nn.ModuleList)}


def _patch(config: dict) -> tuple[int, int, int]:
    """(time, height, width) latent positions per token, from the denoiser's own config."""
    p = config.get("patch_size", (config.get("all_patch_size") or [1])[0])
    if isinstance(p, (list, tuple)):
        return tuple(p)
    return (config.get("patch_size_t") or 1, p, p)


def _text_encoders(family) -> dict[str, str]:
    """The text encoder classes the pipeline's ``__init__`` annotates (classic), or its default
    blocks' ``expected_components`` (modular only)."""
    import inspect
    import typing

    import diffusers

    cls = getattr(diffusers, family.pipeline)
    if family.folder_kind == "modular only":
        blocks = getattr(diffusers, cls.default_blocks_name)()
        specs = {s.name: s.type_hint for s in blocks.expected_components}
    else:
        specs = {k: p.annotation for k, p in inspect.signature(cls.__init__).parameters.items()}
    out = {}
    for name, hint in specs.items():
        if name.startswith("text_encoder"):
            args = typing.get_args(hint) or (hint,)
            out[name] = " | ".join(a.__name__ for a in args if a is not type(None))
    return out


def _kind(folder: str) -> str:
    import importlib.util

    classic = importlib.util.find_spec(f"diffusers.pipelines.{folder}") is not None
    modular = importlib.util.find_spec(f"diffusers.modular_pipelines.{folder}") is not None
    return {(True, False): "classic", (True, True): "classic + modular", (False, True): "modular only"}[classic, modular]  # fmt: skip


#: the ``__call__`` arguments the atlas shows as guidance settings: the scale of CFG
#: (``guidance_scale``, FLUX.1's and Qwen-Image's ``true_cfg_scale``) and of LTX-2's
#: spatio-temporal and modality guidance, with their ``audio_`` twins (not Wan's
#: ``guidance_scale_2``: its default None runs ``transformer_2`` at ``guidance_scale``)
GUIDANCE_ARGS = re.compile(r"^(audio_)?(guidance|true_cfg|stg|modality)_scale$")


def _guidance(pipeline: str, kind: str, config: dict) -> dict:
    """The guidance settings the pipeline takes: its ``__call__`` arguments that ``GUIDANCE_ARGS``
    names, with their defaults, its ``guider`` component and ``is_distilled`` flag where ``__init__``
    has one (modular only: the guider its default blocks declare, with the scale they give it), and
    the denoiser config's ``guidance_embeds`` where it has the key."""
    import inspect

    import diffusers

    cls = getattr(diffusers, pipeline)
    out = {}
    if kind == "modular only":
        for spec in getattr(diffusers, cls.default_blocks_name)().expected_components:
            if spec.name == "guider":
                out["guider"] = spec.type_hint.__name__
                out.update({k: v for k, v in (spec.config or {}).items() if k == "guidance_scale"})
    else:
        call = inspect.signature(cls.__call__).parameters
        out.update({k: p.default for k, p in call.items() if GUIDANCE_ARGS.match(k)})
        init = inspect.signature(cls.__init__).parameters
        if "guider" in init:
            out["guider"] = init["guider"].annotation.__name__
        if "is_distilled" in init:
            out["is_distilled"] = init["is_distilled"].default
    if "guidance_embeds" in config:
        out["guidance_embeds"] = config["guidance_embeds"]
    return out


def _blocks_scheduler(pipeline: str) -> tuple[str | None, dict]:
    """A modular pipeline's scheduler as its default blocks declare it: the class and the config
    the blocks create it with (``default_creation_method="from_config"``)."""
    import diffusers

    cls = getattr(diffusers, pipeline)
    for spec in getattr(diffusers, cls.default_blocks_name)().expected_components:
        if spec.name == "scheduler":
            return spec.type_hint.__name__, dict(spec.config or {})
    return None, {}


@once_per_run
def atlas_record() -> list[dict]:
    """One record per ``model_configs.ATLAS`` family, from the installed library on the meta
    device: the pipeline's kind (its folder under ``diffusers/pipelines`` and/or
    ``diffusers/modular_pipelines``), its text encoder and scheduler classes, the text encoders'
    parameters (the size table's, or built from ``Family.encoders``' public configs), the denoiser's
    parameters and blocks, the VAE's latent channels and compression observed by encoding a
    meta tensor of the counted size, and the tokens the denoiser sees at that size."""
    import dataclasses
    import inspect

    import diffusers
    import torch
    from model_configs import ATLAS

    out, encoded, vaes = [], {}, {}
    for fam in ATLAS:
        kind = _kind(fam.folder)
        fam_k = dataclasses.replace(fam)
        object.__setattr__(fam_k, "folder_kind", kind)
        cls = getattr(diffusers, fam.pipeline)
        denoiser = build(fam.denoiser)
        config = dict(denoiser.config)
        vae_key = (fam.vae.cls, json.dumps(fam.vae.config, sort_keys=True))
        if vae_key not in vaes:  # several families share one VAE config: build it once
            vaes[vae_key] = build(fam.vae)
        vae = vaes[vae_key]
        h, w = fam.size
        # the compression is observed on a small input (9 frames, 64 x 64 px: cheap on meta),
        # once per VAE config (several families share one)
        video_vae = fam.frames or "z_dim" in vae.config  # Wan-style VAEs take (B, C, F, H, W)
        rgb = vae.config.get("in_channels", 3) if vae.config.get("patch_size", 1) is None else 3
        probe = (1, rgb, 9 if fam.frames else 1, 64, 64) if video_vae else (1, 3, 64, 64)
        key = (fam.vae.cls, json.dumps(fam.vae.config, sort_keys=True), probe)
        if key not in encoded:
            with torch.no_grad():  # the VAE is on meta already: no device context (it costs)
                encoded[key] = tuple(vae.encode(torch.empty(probe, device="meta")).latent_dist.mode().shape)  # fmt: skip
        small = encoded[key]
        spatial = 64 // small[-1]
        temporal = 8 // (small[2] - 1) if fam.frames else None
        frames = (fam.frames - 1) // temporal + 1 if fam.frames else 1
        lat = (1, small[1], *([frames] if len(small) == 5 else []), h // spatial, w // spatial)
        pt, ph, pw = _patch(config)
        ph, pw = ph * fam.pack, pw * fam.pack
        tokens = None
        if "down_block_types" not in config:
            tokens = (frames // pt) * (lat[-2] // ph) * (lat[-1] // pw)
        shift = fam.shift
        if kind == "modular only":
            scheduler, created = _blocks_scheduler(fam.pipeline)
            if created:  # the blocks create it themselves: its settings are the installed library's
                settings = ", ".join(f"{k}={v}" for k, v in created.items())
                shift = (f"{scheduler}, {settings}", f"diffusers {diffusers.__version__}: the default blocks of {', '.join((fam.pipeline, *fam.variants))} create it from this config (from_config)")  # fmt: skip
                assert all(_blocks_scheduler(v) == (scheduler, created) for v in fam.variants)
        else:
            ann = inspect.signature(cls.__init__).parameters["scheduler"].annotation
            scheduler = getattr(ann, "__name__", str(ann))
        params = sum(p.numel() for p in denoiser.parameters())
        # its text encoders: the size table's (``encoders_of``), else those built from a public config
        encoders = [c for c in COMPONENTS if c.pipeline == fam.encoders_of and c.component.startswith("text_encoder")]  # fmt: skip
        encoders += fam.encoders
        # the denoiser's published size: the family's own, else the size table's for that component
        published = fam.published or PUBLISHED.get((fam.denoiser.pipeline, fam.denoiser.component))
        if published is not None and published.covers != (fam.denoiser.component,):
            published = None
        out.append(
            {
                "family": fam.name,
                "pipeline": fam.pipeline,
                "kind": kind,
                "folder": fam.folder,
                "text_encoders": _text_encoders(fam_k),
                "text_encoder_params": {c.component: count_params(c) for c in encoders},
                "text_encoder_classes": {c.component: c.cls for c in encoders},
                "text_encoder_sources": {c.component: c.source for c in fam.encoders},
                "text_encoder_named": fam.encoder_named[0] if fam.encoder_named else None,
                "text_encoder_source": fam.encoder_named[1] if fam.encoder_named else None,
                "guidance": _guidance(fam.pipeline, kind, config),
                "variants": {v: _guidance(v, kind, config) for v in fam.variants},
                "shipped_scheduler": shift[0] if shift else None,
                "shipped_scheduler_source": shift[1] if shift else None,
                "scheduler": scheduler,
                "denoiser": fam.denoiser.cls,
                "denoisers": fam.denoisers,
                "denoiser_params": params,
                "denoiser_source": fam.denoiser.source,
                "blocks": _blocks(denoiser),
                "vae": fam.vae.cls,
                "vae_source": fam.vae.source,
                "latent_channels": lat[1],
                "spatial_compression": spatial,
                "temporal_compression": temporal,
                "size": list(fam.size),
                "frames": fam.frames,
                "latent_shape": list(lat),
                "patch": [pt, ph, pw],
                "pack": fam.pack,
                "tokens": tokens,
                "published": published.figure if published else None,
                "published_params": published.params if published else None,
                "published_cite": published.cite if published else None,
                "published_source": published.source if published else None,
            }
        )
    return out
