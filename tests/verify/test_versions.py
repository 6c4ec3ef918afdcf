"""The lab pages state which diffusers they were verified against; keep that honest.

``verified_versions.json`` is read by the site build. This test compares it with
the installed versions. After a deliberate upgrade, refresh it with
``make verify-refresh`` (which sets INFRALENS_REFRESH_VERSIONS=1).
"""

import json
import os
from pathlib import Path

import diffusers
import torch

RECORD = Path(__file__).with_name("verified_versions.json")


def installed() -> dict[str, str]:
    return {"diffusers": diffusers.__version__, "torch": torch.__version__.split("+")[0]}


def test_recorded_versions_match_installed():
    if os.environ.get("INFRALENS_REFRESH_VERSIONS") == "1":
        RECORD.write_text(json.dumps(installed(), indent=2) + "\n", encoding="utf-8")
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))
    assert recorded == installed(), (
        f"pages say {recorded} but {installed()} is installed: run `make verify-refresh`"
    )


def test_every_scheduler_diffusers_exports_is_real():
    """Every scheduler name diffusers exports is its class here, not a dummy standing in for
    a missing optional package: the pages' claims over "every scheduler" are tested over
    the whole set (scipy and torchsde are in the verify extra for this)."""
    dummies = [
        name
        for name in dir(diffusers)
        if name.endswith("Scheduler") and type(getattr(diffusers, name)).__name__ == "DummyObject"
    ]
    assert dummies == []
