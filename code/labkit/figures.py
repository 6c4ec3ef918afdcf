"""Figures from NumPy alone: SVG charts and PNG image grids, for the lab pages.

A starter given ``--figures DIR`` writes its figures there with :func:`save`; the
site build runs the starter that way and puts each figure on the lab page (the
``figure`` directive of ``infralens_docs``). Nothing here needs matplotlib:

- :func:`line_chart` and :func:`scatter_panels` return SVG text. Colours are CSS
  classes (``c0`` ... ``c5``) and axes use ``currentColor``, so the page's stylesheet
  colours them for the light and the dark scheme alike.
- :func:`flow_diagram` returns SVG text too: a top-to-bottom chain of operations, the
  tensor that crosses each arrow, and the stages that group them (one may repeat).
- :func:`png` encodes a ``(H, W, 3)`` uint8 array as PNG bytes (zlib, stdlib only).

:func:`save` records each figure's alt text and caption in ``figures.json`` beside
it; the page shows both, so every figure has a text equivalent.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from html import escape
from pathlib import Path

import numpy as np

WIDTH, HEIGHT = 640, 360
MARGIN = dict(left=56, right=16, top=28, bottom=44)


def _fmt(v: float) -> str:
    """Short tick labels: 0.5, 10, 1e-3."""
    if v == 0:
        return "0"
    if float(v).is_integer() and abs(v) < 1e6:
        return str(int(v))
    if abs(v) >= 1e4 or abs(v) < 1e-2:
        return f"{v:.0e}".replace("e-0", "e-").replace("e+0", "e")
    return f"{v:.3g}"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    step = 10 ** np.floor(np.log10(raw))
    step *= min((m for m in (1, 2, 2.5, 5, 10) if m * step >= raw), default=10)
    first = np.ceil(lo / step) * step
    return [float(round(t, 10)) for t in np.arange(first, hi + step * 1e-9, step)]


class _Axes:
    """Maps data to pixels inside one plotting box; draws its frame, ticks and labels."""

    def __init__(self, box, xlim, ylim, logx=False, logy=False):
        self.x0, self.y0, self.w, self.h = box
        self.logx, self.logy = logx, logy
        self.xlim = tuple(np.log10(xlim)) if logx else xlim
        self.ylim = tuple(np.log10(ylim)) if logy else ylim

    def px(self, x, y):
        x = np.log10(x) if self.logx else np.asarray(x, dtype=float)
        y = np.log10(y) if self.logy else np.asarray(y, dtype=float)
        (a, b), (c, d) = self.xlim, self.ylim
        return self.x0 + (x - a) / (b - a or 1) * self.w, self.y0 + self.h - (y - c) / (
            d - c or 1
        ) * self.h

    def frame(self, xlabel="", ylabel="", title="", xticks=None) -> list[str]:
        """``xticks`` maps x positions to labels, in place of numeric ticks."""
        out = [
            f'<rect class="frame" x="{self.x0}" y="{self.y0}" width="{self.w}" height="{self.h}"/>'
        ]
        for axis, lim, log in (("x", self.xlim, self.logx), ("y", self.ylim, self.logy)):
            ticks = (
                [10.0**e for e in range(int(np.ceil(lim[0])), int(np.floor(lim[1])) + 1)]
                if log
                else _ticks(*lim)
            )
            if axis == "x" and xticks:
                ticks = list(xticks)
            for t in ticks:
                if axis == "x":
                    x, _ = self.px(t, 10 ** self.ylim[0] if self.logy else self.ylim[0])
                    y = self.y0 + self.h
                    out.append(
                        f'<line class="tick" x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}"/>'
                    )
                    label = escape(xticks[t]) if xticks else _fmt(t)
                    out.append(
                        f'<text x="{x:.1f}" y="{y + 17}" text-anchor="middle">{label}</text>'
                    )
                else:
                    _, y = self.px(10 ** self.xlim[0] if self.logx else self.xlim[0], t)
                    out.append(
                        f'<line class="grid" x1="{self.x0}" y1="{y:.1f}" x2="{self.x0 + self.w}" y2="{y:.1f}"/>'
                    )
                    out.append(
                        f'<text x="{self.x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>'
                    )
        if xlabel:
            out.append(
                f'<text x="{self.x0 + self.w / 2}" y="{self.y0 + self.h + 36}" text-anchor="middle">{escape(xlabel)}</text>'
            )
        if ylabel:
            cy = self.y0 + self.h / 2
            out.append(
                f'<text transform="translate({self.x0 - 44},{cy}) rotate(-90)" text-anchor="middle">{escape(ylabel)}</text>'
            )
        if title:
            out.append(
                f'<text class="title" x="{self.x0 + self.w / 2}" y="{self.y0 - 10}" text-anchor="middle">{escape(title)}</text>'
            )
        return out


def _svg(body: list[str], width: int, height: int) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="lab-chart" viewBox="0 0 {width} {height}"'
        f' width="{width}" height="{height}" aria-hidden="true" focusable="false">'
        + "".join(body)
        + "</svg>\n"
    )


def _legend(names: Sequence[str], x: float, y: float) -> list[str]:
    out = []
    for i, name in enumerate(names):
        yy = y + 16 * i
        out.append(f'<line class="c{i % 6}" x1="{x}" y1="{yy}" x2="{x + 18}" y2="{yy}"/>')
        out.append(f'<text x="{x + 24}" y="{yy + 4}">{escape(name)}</text>')
    return out


def line_chart(
    series: dict[str, tuple[np.ndarray, np.ndarray]],
    xlabel: str = "",
    ylabel: str = "",
    title: str = "",
    logx: bool = False,
    logy: bool = False,
    markers: bool = False,
    max_points: int = 160,
    xticks: dict[float, str] | None = None,
    legend_outside: bool = False,
) -> str:
    """One SVG line chart; ``series`` maps a legend name to ``(x, y)`` arrays; ``xticks``
    (optional) maps x positions to tick labels, such as the phases of a call;
    ``legend_outside`` puts the legend right of the plot, where no line can cross it."""
    xs = np.concatenate([np.asarray(x, float) for x, _ in series.values()])
    ys = np.concatenate([np.asarray(y, float) for _, y in series.values()])
    pad = 0.0 if logy else 0.05 * (ys.max() - ys.min() or 1)
    ylim = (
        (ys.min(), ys.max())
        if logy
        else (min(ys.min() - pad, 0 if ys.min() >= 0 else ys.min() - pad), ys.max() + pad)
    )
    box = (
        MARGIN["left"],
        MARGIN["top"],
        WIDTH - MARGIN["left"] - MARGIN["right"] - (170 if legend_outside else 0),
        HEIGHT - MARGIN["top"] - MARGIN["bottom"],
    )
    ax = _Axes(box, (xs.min(), xs.max()), ylim, logx, logy)
    body = ax.frame(xlabel, ylabel, title, xticks)
    for i, (x, y) in enumerate(series.values()):
        x, y = np.asarray(x, float), np.asarray(y, float)
        if len(x) > max_points:  # an even subsample keeps the SVG small; ends stay exact
            keep = np.unique(np.linspace(0, len(x) - 1, max_points).round().astype(int))
            x, y = x[keep], y[keep]
        px, py = ax.px(x, y)
        points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px, py, strict=True))
        body.append(f'<polyline class="c{i % 6}" points="{points}"/>')
        if markers:
            body += [
                f'<circle class="c{i % 6} dot" cx="{a:.1f}" cy="{b:.1f}" r="3"/>'
                for a, b in zip(px, py, strict=True)
            ]
    legend_x = box[0] + box[2] + (12 if legend_outside else -150)
    body += _legend(list(series), legend_x, box[1] + 14)
    return _svg(body, WIDTH, HEIGHT)


def scatter_panels(
    panels: Sequence[tuple],
    lim: float,
    columns: int = 4,
    size: int = 180,
) -> str:
    """Small multiples of 2-D point clouds: ``(title, points (N, 2), colour index (N,) or None)``,
    optionally with a fourth item ``paths (S, K, 2)``: K trajectories of S states each,
    drawn as lines under the points.

    Every panel shares the square window ``[-lim, lim]^2``, so panels compare directly.
    Points are zero-length round-capped path segments: about 12 bytes each.
    """
    rows = -(-len(panels) // columns)
    cols = min(columns, len(panels))
    width, height = cols * (size + 16) + 8, rows * (size + 36) + 8
    body = []
    for k, (title, points, colour, *rest) in enumerate(panels):
        x0, y0 = 12 + (k % columns) * (size + 16), 28 + (k // columns) * (size + 36)
        ax = _Axes((x0, y0, size, size), (-lim, lim), (-lim, lim))
        body.append(f'<rect class="frame" x="{x0}" y="{y0}" width="{size}" height="{size}"/>')
        if rest and rest[0] is not None:  # trajectories: one polyline per sample, oldest first
            paths = np.clip(np.asarray(rest[0], float), -lim, lim)
            for j in range(paths.shape[1]):
                px, py = ax.px(paths[:, j, 0], paths[:, j, 1])
                pts = " ".join(f"{a:.0f},{b:.0f}" for a, b in zip(px, py, strict=True))
                body.append(f'<polyline class="trail" points="{pts}"/>')
        body.append(
            f'<text class="title" x="{x0 + size / 2}" y="{y0 - 8}" text-anchor="middle">{escape(title)}</text>'
        )
        px, py = ax.px(points[:, 0], points[:, 1])
        inside = (px >= x0) & (px <= x0 + size) & (py >= y0) & (py <= y0 + size)
        groups = np.zeros(len(points), int) if colour is None else np.asarray(colour)
        for g in np.unique(groups):
            sel = inside & (groups == g)
            d = "".join(f"M{a:.0f} {b:.0f}h0" for a, b in zip(px[sel], py[sel], strict=True))
            body.append(f'<path class="c{int(g) % 6} pts" d="{d}"/>')
    return _svg(body, width, height)


def flow_diagram(
    rows: Sequence[tuple[str, str, Sequence[str]]],
    repeat: dict[str, str] | None = None,
    title: str = "",
    width: int = 640,
) -> str:
    """A top-to-bottom chain: one box per operation, one arrow per tensor that leaves it.

    ``rows`` holds ``(stage, operation, label_lines)`` in execution order; consecutive rows
    of one stage share a shaded band named on the left, and ``label_lines`` (the tensor's
    name, shape, dtype) sit beside the arrow leaving the box. ``repeat`` maps a stage to a
    label (``"x 50 steps"``): that stage gets an arrow from its last box back to its first.
    Text is in ``currentColor``, so it reads in the light and the dark scheme alike.
    """
    repeat = repeat or {}
    longest = max(len(operation) for _, operation, _ in rows)
    # about 8 px per character of a 13 px monospace font, plus padding
    box_x, box_w, box_h, gap, line = 138, max(236, 8 * longest + 20), 28, 20, 15
    label_x = box_x + box_w / 2 + 14
    y = 40.0 if title else 12.0
    body: list[str] = []
    if title:
        body.append(
            f'<text class="title" x="{width / 2}" y="20" text-anchor="middle">{escape(title)}</text>'
        )
    spans: dict[str, list[float]] = {}  # stage -> [top, bottom]
    boxes: list[tuple[str, float]] = []  # (stage, top of its box)
    for k, (stage, operation, labels) in enumerate(rows):
        if k and rows[k - 1][0] != stage:
            y += 10  # a little air between two stages' bands
        spans.setdefault(stage, [y - 6, 0.0])
        boxes.append((stage, y))
        body.append(
            f'<rect class="box" x="{box_x}" y="{y}" width="{box_w}" height="{box_h}" rx="4"/>'
            f'<text class="mono" x="{box_x + box_w / 2}" y="{y + box_h / 2 + 4.5}" '
            f'text-anchor="middle">{escape(operation)}</text>'
        )
        arrow = max(gap + 8, line * len(labels) + 12)
        x0, y0, y1 = box_x + box_w / 2, y + box_h, y + box_h + arrow
        body.append(_arrow_down(x0, y0, y1))
        top = y0 + (arrow - line * len(labels)) / 2 + line - 3
        for j, text in enumerate(labels):
            cls = ' class="mono"' if j == 0 else ""
            body.append(f'<text{cls} x="{label_x}" y="{top + j * line:.1f}">{escape(text)}</text>')
        spans[stage][1] = y1 - (0 if k + 1 < len(rows) and rows[k + 1][0] == stage else 4)
        y = y1
    bands = []
    for stage, (top, bottom) in spans.items():
        bands.append(
            f'<rect class="band" x="6" y="{top}" width="{width - 12}" height="{bottom - top}" rx="6"/>'
            f'<text class="title" x="16" y="{top + 20}">{escape(stage)}</text>'
        )
        if stage in repeat:
            tops = [t for s, t in boxes if s == stage]
            first, last = tops[0] + box_h / 2, tops[-1] + box_h / 2
            x = box_x - 14
            bands.append(
                f'<path class="arrow" d="M{box_x} {last} H{x} V{first} H{box_x - 7}"/>'
                f'<polygon class="head" points="{box_x},{first} {box_x - 8},{first - 4} '
                f'{box_x - 8},{first + 4}"/>'
                f'<text x="16" y="{top + 38}">{escape(repeat[stage])}</text>'
            )
    return _svg(bands + body, width, int(y + 12))


def _arrow_down(x: float, y0: float, y1: float) -> str:
    return (
        f'<line class="arrow" x1="{x}" y1="{y0}" x2="{x}" y2="{y1 - 7}"/>'
        f'<polygon class="head" points="{x},{y1} {x - 4.5},{y1 - 8} {x + 4.5},{y1 - 8}"/>'
    )


def png(pixels: np.ndarray, scale: int = 1) -> bytes:
    """``(H, W, 3)`` uint8 RGB -> PNG bytes; ``scale`` repeats pixels (nearest neighbour)."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError("png() takes an (H, W, 3) uint8 array")
    if scale > 1:
        pixels = pixels.repeat(scale, axis=0).repeat(scale, axis=1)
    h, w, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[i].tobytes() for i in range(h))  # filter type 0 per row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def save(
    directory: str | Path | None, name: str, content: str | bytes, alt: str, caption: str
) -> None:
    """Write figure ``name`` (``.svg`` for text, ``.png`` for bytes) and its alt text.

    ``directory`` None (the starter was run without ``--figures``) writes nothing.
    """
    if directory is None:
        return
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    suffix = ".svg" if isinstance(content, str) else ".png"
    path = directory / f"{name}{suffix}"
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    manifest = directory / "figures.json"
    entries = json.loads(manifest.read_text(encoding="utf-8")) if manifest.is_file() else {}
    entries[name] = {"file": path.name, "alt": alt, "caption": caption}
    manifest.write_text(json.dumps(entries, indent=1, sort_keys=True), encoding="utf-8")
