"""Real model sizes: parameter counts and weight bytes of the pipelines readers run.

``model_sizes.json`` (next to this file) holds, for the SD 1.5, SDXL, SD3 Medium and
Flux.1-dev denoisers, VAEs and text encoders, and for the SD3.5 Large, Qwen-Image and
Wan 2.1 (14B, 1.3B) transformers and Wan's VAE, the parameter count of the real
diffusers/transformers class built from its published config on the meta device
(no weights downloaded), its weight bytes in fp32/fp16/bf16, the config's source and
the published figure it was checked against. ``tests/verify/test_model_sizes.py``
regenerates and checks it (``make verify-refresh``); this module only reads it.

Bytes count parameters only (no buffers): params x 4 for fp32, x 2 for fp16 and bf16.
Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from importlib import resources
from typing import Any

DATA_FILE = "model_sizes.json"
#: tables print bytes in GB = 10**9 bytes (not GiB)
GB = 10**9


def load() -> dict[str, Any]:
    """The whole data file: versions, bytes_per_element, published_rtol, components."""
    text = resources.files("labkit").joinpath(DATA_FILE).read_text(encoding="utf-8")
    return json.loads(text)


def rows(pipelines: str | Iterable[str] | None = None) -> list[dict[str, Any]]:
    """One dict per component, in file order; optionally only the named pipelines."""
    components = load()["components"]
    if pipelines is None:
        return components
    wanted = [pipelines] if isinstance(pipelines, str) else list(pipelines)
    known = list(dict.fromkeys(row["pipeline"] for row in components))
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise ValueError(f"unknown pipeline(s) {unknown}; the data file has {known}")
    return [row for row in components if row["pipeline"] in wanted]


def format_params(n: int) -> str:
    """859520964 -> '859.5 M'; 2567463684 -> '2.57 B'."""
    if n >= 10**9:
        return f"{n / 1e9:.2f} B"
    if n >= 10**6:
        return f"{n / 1e6:.1f} M"
    return f"{n:,}"


def format_gb(n_bytes: int) -> str:
    """Bytes in GB (10**9 bytes), two decimals: 3438083856 -> '3.44 GB'."""
    return f"{n_bytes / GB:.2f} GB"


def published_agreement(row: dict[str, Any], components: list[dict[str, Any]]) -> float | None:
    """Counted / published - 1 for the row's published figure (None if it has none).

    A figure may total several components of the same pipeline (``published_covers``),
    e.g. SDXL's 817M for both text encoders.
    """
    if row.get("published_params") is None:
        return None
    counted = sum(
        other["params"]
        for other in components
        if other["pipeline"] == row["pipeline"] and other["component"] in row["published_covers"]
    )
    return counted / row["published_params"] - 1


def _published_cell(row: dict[str, Any], components: list[dict[str, Any]]) -> str:
    diff = published_agreement(row, components)
    if diff is None:
        return "none published"
    sign = "+" if diff >= 0 else "−"
    figure = row["published"].split(" (", 1)[0]
    return f"{figure} ({row['published_cite']}); counted {sign}{abs(diff) * 100:.2f} %"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(
    pipelines: str | Iterable[str] | None = None, notes: bool = True, totals: bool = False
) -> str:
    """A Markdown table of the recorded sizes, with a caption line and (optionally) notes.

    Columns: Pipeline | Component | Class | Parameters | fp32 | fp16 / bf16 | Published.
    ``pipelines`` picks pipelines by name ("SD 1.5", "SDXL", "SD3 Medium", "Flux.1-dev");
    ``totals`` adds a row per pipeline summing its components; ``notes`` lists the rows'
    notes (shared architectures, what is not counted) under the table.
    """
    data = load()
    selected = rows(pipelines)
    versions = data["versions"]
    rtol = data["published_rtol"]
    caption = (
        "Parameters of the real classes built from their published configs on the meta "
        "device (no weights), with diffusers {diffusers}, transformers {transformers}, "
        "torch {torch}. Bytes count parameters only, not buffers: × 4 for fp32, × 2 for "
        "fp16 and bf16; GB = 10⁹ bytes. Published figures are rounded; counts agree with "
        "them within {pct:g} %."
    ).format(pct=rtol * 100, **versions)
    lines = [
        caption,
        "",
        "| Pipeline | Component | Class | Parameters | fp32 | fp16 / bf16 | Published |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    size = data["bytes_per_element"]
    for i, row in enumerate(selected):
        cells = [
            row["pipeline"],
            f"`{row['component']}`",
            f"`{row['class']}`",
            format_params(row["params"]),
            format_gb(row["bytes"]["fp32"]),
            format_gb(row["bytes"]["fp16"]),
            _published_cell(row, data["components"]),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        last_of_pipeline = i + 1 == len(selected) or selected[i + 1]["pipeline"] != row["pipeline"]
        if totals and last_of_pipeline:
            total = sum(r["params"] for r in selected if r["pipeline"] == row["pipeline"])
            bold = [
                format_params(total),
                format_gb(total * size["fp32"]),
                format_gb(total * size["fp16"]),
            ]
            cells = [row["pipeline"], "**total**", "", *(f"**{b}**" for b in bold), ""]
            lines.append("| " + " | ".join(cells) + " |")
    noted = [row for row in selected if notes and row.get("note")]
    if noted:
        lines.append("")
        lines.extend(f"- {row['pipeline']} `{row['component']}`: {row['note']}" for row in noted)
    return "\n".join(lines) + "\n"


def layerwise_casting(pipeline: str, component: str) -> dict[str, Any]:
    """diffusers' ``enable_layerwise_casting`` (fp8 storage) applied to a real model.

    Counted on the meta device with diffusers' own skip patterns: ``cast_params`` stored in
    fp8 (1 byte), ``kept_params`` left in bf16 (2 bytes), ``kept`` by module name, ``bytes``.
    """
    return load()["layerwise_casting"][f"{pipeline}/{component}"]


def flux_1024px() -> dict[str, Any]:
    """One Flux.1-dev transformer call at 1024 px, counted on the meta device: ``flops``, the
    FLOPs inside the modules ``TaylorSeerCacheConfig()`` hooks by default, and the bytes of
    the Taylor factors it stores (order 0 and 1, bf16)."""
    return load()["flux_1024px"]


def atlas() -> list[dict[str, Any]]:
    """The model atlas (docs/handbook/models.md): one record per family, counted and observed
    on the meta device by ``tests/verify/sizes.py`` ``atlas_record``."""
    return load()["atlas"]


def _blocks_cell(blocks: dict[str, int]) -> str:
    if "down_blocks" in blocks:
        return f"{blocks['down_blocks']} down + {blocks['up_blocks']} up blocks"
    return " + ".join(f"{n} `{k}`" for k, n in blocks.items())


def _tokens_cell(row: dict[str, Any]) -> str:
    if row["tokens"] is None:
        return "— (UNet)"
    h, w = row["size"]
    at = f"{row['frames']} × {h} × {w}" if row["frames"] else f"{h} × {w}"
    return f"{row['tokens']:,} at {at}"


def _encoders_cell(row: dict[str, Any]) -> str:
    """Each text encoder the pipeline annotates, with its count where one is recorded (and the
    class counted, where the annotation names another or several), then the checkpoint named."""
    counted = row.get("text_encoder_params") or {}
    built = row.get("text_encoder_classes") or {}
    cells = []
    for name, cls in row["text_encoders"].items():
        if name not in counted:
            cells.append(f"`{cls}`")
        elif built.get(name, cls) != cls:
            cells.append(f"`{cls}` (as `{built[name]}`, {format_params(counted[name])})")
        else:
            cells.append(f"`{cls}` ({format_params(counted[name])})")
    text = ", ".join(cells)
    if row.get("text_encoder_named"):
        text += f": {row['text_encoder_named']}"
    return text


def _scheduler_cell(row: dict[str, Any]) -> str:
    if row.get("shipped_scheduler"):
        cls, _, settings = row["shipped_scheduler"].partition(", ")
        return f"`{cls}` ({settings})"
    return f"`{row['scheduler']}`"


def _guidance_cell(row: dict[str, Any]) -> str:
    text = _guidance_text(row["guidance"])
    for name, g in (row.get("variants") or {}).items():  # FLUX.3's step-distilled pipeline
        text += f"; `{name}`: {_guidance_text(g) or 'no guider'}"
    return text


def _guidance_text(guidance: dict[str, Any]) -> str:
    g = dict(guidance)
    parts = []
    if "guider" in g:
        parts.append(f"guider `{g.pop('guider')}`")
    embeds = g.pop("guidance_embeds", None)
    distilled = g.pop("is_distilled", None)
    # true CFG runs only when a negative prompt is passed (QwenImagePipeline: `do_true_cfg`)
    parts += [f"`{k}={v}`" + (" (only with a negative prompt)" if k == "true_cfg_scale" and (v or 0) > 1 else "") for k, v in g.items()]  # fmt: skip
    if embeds:
        parts.append("embedded (`guidance_embeds`)")
    if distilled is not None:
        parts.append("`is_distilled` flag")
    return ", ".join(parts)


def _literal_markdown(text: str) -> str:
    """``text`` with each ``__`` outside its code spans escaped, so that Markdown shows a
    dunder name as written (``__main__`` and ``__init__`` rendered as a bold "main" and
    "init", and garbled the rest of their line)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # the even parts lie outside code spans
        parts[i] = parts[i].replace("__", "\\_\\_")
    return "`".join(parts)


def atlas_table(sources: bool = False) -> str:
    """The atlas as a Markdown table; ``sources=True``: the list of each row's sources instead."""
    data = load()
    rows = data["atlas"]
    if sources:
        lines = []
        for r in rows:
            published = ""
            if r["published"]:
                diff = r["denoiser_params"] / r["published_params"] - 1
                published = f" Published: {r['published']} ({r['published_source']}); counted {'+' if diff >= 0 else '−'}{abs(diff) * 100:.2f} %."  # fmt: skip
            named = (
                f" Text encoder: {r['text_encoder_named']} ({r['text_encoder_source']})."
                if r.get("text_encoder_named")
                else ""
            )
            for name, source in (r.get("text_encoder_sources") or {}).items():
                named += f" `{name}` ({r['text_encoder_classes'][name]}): {source}."
            shipped = (
                f" Scheduler shipped: {r['shipped_scheduler']} ({r['shipped_scheduler_source']})."
                if r.get("shipped_scheduler")
                else ""
            )
            line = f"- {r['family']}: denoiser {r['denoiser_source']}; VAE {r['vae_source']}.{published}{named}{shipped}"  # fmt: skip
            lines.append(_literal_markdown(line))
        return "\n".join(lines) + "\n"
    v = data["versions"]
    lines = [
        f"Built on the meta device with diffusers {v['diffusers']}, transformers {v['transformers']}, torch {v['torch']}.",
        "",
        "| Family | Pipeline | Text encoder | Denoiser | Parameters | Blocks | Latents | Tokens | Guidance | Scheduler |",
        "|---|---|---|---|---:|---|---|---:|---|---|",
    ]
    for r in rows:
        kind = {"classic": "classic", "classic + modular": "classic, modular", "modular only": "**modular only**"}[r["kind"]]  # fmt: skip
        encoders = _encoders_cell(r)
        params = format_params(r["denoiser_params"])
        if r["denoisers"] > 1:
            params = f"{r['denoisers']} × {params}"
        latents = f"{r['latent_channels']} ch, {r['spatial_compression']}× space"
        if r["temporal_compression"]:
            latents += f", {r['temporal_compression']}× time"
        pipelines = ", ".join(f"`{p}`" for p in (r["pipeline"], *(r.get("variants") or {})))
        cells = [r["family"], f"{pipelines} ({kind})", encoders, f"`{r['denoiser']}`", params, _blocks_cell(r["blocks"]), latents, _tokens_cell(r), _guidance_cell(r), _scheduler_cell(r)]  # fmt: skip
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def render(args: list[str]) -> str:
    """What the ``model-sizes`` directive shows: ``--atlas`` (``--atlas-sources``) the atlas
    table (its sources), else the size table of the named pipelines (all if none), with totals."""
    if args == ["--atlas"]:
        return atlas_table()
    if args == ["--atlas-sources"]:
        return atlas_table(sources=True)
    return markdown_table(args or None, totals=True)
