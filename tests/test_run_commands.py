"""Every run command the site prints works verbatim from the root of a fresh clone with a
Python that has NumPy and nothing else: no venv of ours, no ``pip install -e .``, no
PYTHONPATH. The commands are read where a reader meets them: each lab card's
``python3 <starter>``, the "Run it:" line of each starter's docstring, and the
``python3 code/...`` lines of the docs pages. They run in a throwaway venv holding only
NumPy (the version the project pins), so a starter that needed labkit installed, or any
other package, fails here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import venv
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import once_per_run

from infralens_docs.hooks import DIRECTIVE_RE
from infralens_docs.registry import ROOT, load_labs

#: ``python3 code/lab-NN-.../x.py [flags]`` wherever a page or a docstring prints one
COMMAND_RE = re.compile(r"(?m)(?:^|Run it:|`)\s*(python3 code/lab-[\w./-]+\.py(?: [^`\n]*)?)")


def printed_commands() -> list[str]:
    commands = {f"python3 {s.path.as_posix()}" for lab in load_labs() for s in lab.starters if s.runnable}  # fmt: skip
    sources = [*sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "code").glob("lab-*/*.py"))]
    for source in sources:
        text = source.read_text(encoding="utf-8")
        for match in COMMAND_RE.finditer(text):
            commands.add(match.group(1).strip().rstrip("`").strip())
        # the `run` directive prints "$ python3 <starter> <flags>" above the starter's output
        for match in DIRECTIVE_RE.finditer(text):
            args = shlex.split(match.group("args"))
            if match.group("name") == "run" and args and "--expect-error" not in args:
                commands.add(shlex.join(["python3", *args]))
    return sorted(commands)


COMMANDS = printed_commands()


def test_the_commands_were_found():
    """One card command per runnable starter, and the pages' and docstrings' examples."""
    runnable = [s for lab in load_labs() for s in lab.starters if s.runnable]
    assert len(COMMANDS) > len(runnable)
    assert any("--" in c for c in COMMANDS)  # the examples with flags are among them


@pytest.fixture(scope="session")
def numpy_only_python(tmp_path_factory) -> Path:
    """A new venv with NumPy alone (pip from the venv itself, the pinned NumPy), one per
    test run."""

    def make(where: Path) -> Path:
        venv.create(where, with_pip=True, clear=True)
        python = where / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             f"numpy=={version('numpy')}"],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
        return python

    python = once_per_run(tmp_path_factory, "numpy-only", make)
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert {line.split("==")[0].lower() for line in listed.split()} <= {"numpy", "pip", "setuptools"}  # fmt: skip
    return python


@pytest.mark.parametrize("command", COMMANDS)
def test_command_runs_verbatim_with_numpy_alone(command, numpy_only_python, tmp_path):
    argv = shlex.split(command)
    assert argv[0] == "python3"  # what Debian and macOS name it; a venv has both names
    # a clean environment: nothing of this checkout's venv, no PYTHONPATH, no user site;
    # the working directory is the repository root, where the pages tell readers to be
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "PYTHONNOUSERSITE": "1"}
    if sys.platform == "win32":
        env["SYSTEMROOT"] = os.environ.get("SYSTEMROOT", "")
    proc = subprocess.run(
        [str(numpy_only_python), *argv[1:]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{proc.stderr[-2000:]}"
    assert proc.stdout.strip(), f"`{command}` printed nothing"
