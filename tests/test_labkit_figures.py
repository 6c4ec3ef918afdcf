"""labkit.figures: SVG charts and PNG images from NumPy alone, with their alt text."""

from __future__ import annotations

import json
import struct
import xml.etree.ElementTree as ET
import zlib

import numpy as np
import pytest

from labkit import figures


def test_line_chart_is_valid_svg_with_one_polyline_per_series():
    x = np.arange(1000)
    svg = figures.line_chart({"a": (x, x**0.5), "b": (x, np.log1p(x))}, "x", "y", title="t")
    root = ET.fromstring(svg)
    polylines = root.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(polylines) == 2
    # long series are subsampled so the page stays light; the ends are kept exactly
    points = polylines[0].get("points").split()
    assert len(points) <= 160
    assert "id=" not in svg  # inline on pages: no ids that could collide


def test_log_axis_needs_positive_values_and_gets_decade_ticks():
    svg = figures.line_chart({"s": (np.arange(5), 10.0 ** np.arange(5))}, logy=True)
    labels = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert {"1", "10", "100", "1000", "10000"} <= set(labels)


def test_scatter_panels_share_one_window_and_draw_paths():
    rng = np.random.default_rng(0)
    pts = rng.standard_normal((50, 2))
    paths = rng.standard_normal((4, 3, 2))
    svg = figures.scatter_panels([("a", pts, None), ("b", pts, np.arange(50) % 3, paths)], lim=2)
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 3  # one per trajectory
    assert len(root.findall(f"{ns}path")) == 1 + 3  # one path per colour group


def test_flow_diagram_draws_boxes_arrows_bands_and_the_repeat():
    rows = [("a", "first()", ["x (B,)", "toy: (8,)"]), ("b", "second(x)", ["y (B, 2)"]),
            ("b", "third(y)", ["z <B>"])]  # fmt: skip
    svg = figures.flow_diagram(rows, repeat={"b": "x 3 steps"}, title="t")
    root = ET.fromstring(svg)  # valid XML: "<B>" is escaped
    ns = "{http://www.w3.org/2000/svg}"
    assert [r.get("class") for r in root.iter(ns + "rect")].count("box") == 3
    assert [r.get("class") for r in root.iter(ns + "rect")].count("band") == 2  # stages a, b
    assert len(root.findall(ns + "polygon")) == 3 + 1  # one head per arrow, one for the repeat
    texts = [t.text for t in root.iter(ns + "text")]
    assert {"t", "a", "b", "x 3 steps", "first()", "z <B>", "toy: (8,)"} <= set(texts)
    assert "id=" not in svg
    # a long operation widens the boxes rather than overflowing them
    wide = figures.flow_diagram([("a", "o" * 60, ["x"])])
    assert float(ET.fromstring(wide).find(ns + "rect").get("width")) >= 8 * 60


def test_png_is_a_valid_image():
    pixels = np.zeros((4, 5, 3), dtype=np.uint8)
    pixels[1, 2] = (255, 0, 10)
    data = figures.png(pixels, scale=2)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (10, 8)
    idat = data[data.index(b"IDAT") + 4 : data.index(b"IEND") - 8]
    raw = zlib.decompress(idat)
    rows = [raw[i * (1 + 30) + 1 : (i + 1) * (1 + 30)] for i in range(8)]
    assert rows[2][12:15] == bytes([255, 0, 10]) and rows[3][15:18] == bytes([255, 0, 10])


def test_png_rejects_other_arrays():
    with pytest.raises(ValueError):
        figures.png(np.zeros((4, 4), dtype=np.uint8))


def test_save_writes_the_figure_and_its_alt_text(tmp_path):
    figures.save(tmp_path, "one", "<svg/>", alt="A description", caption="Cap")
    figures.save(tmp_path, "two", b"\x89PNG", alt="Another", caption="Cap 2")
    manifest = json.loads((tmp_path / "figures.json").read_text())
    assert manifest["one"] == {"file": "one.svg", "alt": "A description", "caption": "Cap"}
    assert (tmp_path / "two.png").read_bytes() == b"\x89PNG"


def test_save_without_a_directory_writes_nothing(tmp_path):
    figures.save(None, "x", "<svg/>", alt="a", caption="c")
    assert list(tmp_path.iterdir()) == []
