"""How diffusers' group offloading would cut two real denoisers into groups.

``offload_groups.json`` (next to this file) records, for the Flux.1-dev transformer and
the SDXL UNet built from their published configs on the meta device (no weights), what
``enable_group_offload`` groups by: the parameter count of each top-level child, with
``torch.nn.ModuleList`` / ``torch.nn.Sequential`` children split into their blocks
(``offload_type="block_level"`` groups those blocks, ``num_blocks_per_group`` at a time;
every other child joins the always-onloaded "unmatched" group), and, for
``offload_type="leaf_level"``, the number and largest size of the layers it hooks one by
one (Linear, Conv, Embedding, ...) and the parameters outside them (norm weights).
``tests/verify/test_page_lab_16.py`` regenerates and checks it; this module only reads it.
Standard library only.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

DATA_FILE = "offload_groups.json"


def load() -> dict[str, Any]:
    """The whole data file: description, versions, models."""
    text = resources.files("labkit").joinpath(DATA_FILE).read_text(encoding="utf-8")
    return json.loads(text)


def model(pipeline: str, component: str) -> dict[str, Any]:
    """One model's record: params, children (``params`` or ``blocks``), leaf_level."""
    for row in load()["models"]:
        if (row["pipeline"], row["component"]) == (pipeline, component):
            return row
    raise ValueError(f"no offload record for {pipeline} {component}")
