"""The verify tests run only where the `verify` extra (torch + diffusers) is installed."""

import pytest

pytest.importorskip(
    "torch", reason="the verify extra is not installed (pip install -e '.[verify]')"
)
pytest.importorskip(
    "diffusers", reason="the verify extra is not installed (pip install -e '.[verify]')"
)


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.verify)
