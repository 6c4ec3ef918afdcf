"""Run a starter the way a reader would, for outputs shown on the site.

``run_starter`` executes ``python <starter> <args>`` from the repository root
and returns what the terminal would show. Results are cached under
``.cache/infralens-run/`` keyed on everything that can change the output (the
starter, the labkit sources, the arguments, the Python and NumPy versions), so
a warm rebuild does not rerun anything and an edit always does.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from infralens_docs.registry import ROOT

CACHE_DIR = ROOT / ".cache" / "infralens-run"


@dataclass(frozen=True)
class Run:
    command: str  # as a reader types it, e.g. "python code/lab-01-.../forward_noise.py --seed 1"
    stdout: str
    stderr: str
    returncode: int


def labkit_digest() -> str:
    """Hash of the shared package's sources: a change there can change every output."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "code" / "labkit").rglob("*.py")):
        h.update(path.relative_to(ROOT).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def starter_env() -> dict[str, str]:
    """A deterministic environment: fixed hash seed, no user site, labkit importable."""
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "code"), env.get("PYTHONPATH", "")) if p
    )
    return env


def run_starter(
    starter: str | Path, args: list[str] | tuple[str, ...] = (), cache: bool = True
) -> Run:
    starter = Path(starter)
    if starter.is_absolute():
        starter = starter.relative_to(ROOT)
    source = ROOT / starter
    if not source.is_file():
        raise FileNotFoundError(f"starter not found: {starter}")
    command = shlex.join(["python", starter.as_posix(), *args])
    key = hashlib.sha256(
        json.dumps(
            [
                command,
                source.read_text(encoding="utf-8"),
                labkit_digest(),
                sys.version,
                version("numpy"),
            ]
        ).encode()
    ).hexdigest()
    cached = CACHE_DIR / f"{key}.json"
    if cache and cached.is_file():
        return Run(**json.loads(cached.read_text(encoding="utf-8")))
    proc = subprocess.run(
        [sys.executable, str(source), *args],
        cwd=ROOT,
        env=starter_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    run = Run(command, proc.stdout, proc.stderr, proc.returncode)
    if cache:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(run.__dict__), encoding="utf-8")
    return run
