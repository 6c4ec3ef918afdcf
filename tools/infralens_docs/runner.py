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
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from infralens_docs.registry import ROOT

#: Every build cache lives here: ``.cache/`` unless INFRALENS_CACHE_DIR names another folder
#: (the reproducibility test builds once more with empty caches).
CACHE_ROOT = Path(os.environ.get("INFRALENS_CACHE_DIR") or ROOT / ".cache")
CACHE_DIR = CACHE_ROOT / "infralens-run"


@dataclass(frozen=True)
class Run:
    command: str  # as a reader types it, e.g. "python code/lab-01-.../forward_noise.py --seed 1"
    stdout: str
    stderr: str
    returncode: int


def labkit_digest() -> str:
    """Hash of the shared package's sources: a change there can change every output."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "code" / "labkit").rglob("*")):
        if not path.is_file() or path.suffix not in {".py", ".json"}:
            continue  # sources and data (model_sizes.json), not __pycache__
        h.update(path.relative_to(ROOT).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


# One BLAS thread: the same sums in the same order on every machine (a 2-core CI box and a
# 16-core laptop print the same digits), and no thread-pool spin-up for the labs' small
# matrices, which made lab 05 ~30% slower with the default pool. Notebook kernels inherit
# these through the build's environment (hooks.on_config).
BLAS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def starter_env() -> dict[str, str]:
    """A deterministic environment: fixed hash seed, one BLAS thread, no user site,
    labkit importable."""
    env = dict(os.environ)
    env.update(BLAS_ENV)
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "code"), env.get("PYTHONPATH", "")) if p
    )
    return env


def _key(command: str, source: Path, extra: str = "") -> str:
    """Everything that can change a starter's output, hashed."""
    parts = [command, source.read_text(encoding="utf-8"), labkit_digest(), sys.version]
    return hashlib.sha256(json.dumps([*parts, version("numpy"), extra]).encode()).hexdigest()


def _source(starter: str | Path) -> tuple[Path, Path]:
    starter = Path(starter)
    if starter.is_absolute():
        starter = starter.relative_to(ROOT)
    source = ROOT / starter
    if not source.is_file():
        raise FileNotFoundError(f"starter not found: {starter}")
    return starter, source


def _execute(source: Path, args: list[str] | tuple[str, ...]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(source), *args],
        cwd=ROOT,
        env=starter_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_starter(
    starter: str | Path, args: list[str] | tuple[str, ...] = (), cache: bool = True
) -> Run:
    starter, source = _source(starter)
    command = shlex.join(["python", starter.as_posix(), *args])
    cached = CACHE_DIR / f"{_key(command, source)}.json"
    if cache and cached.is_file():
        return Run(**json.loads(cached.read_text(encoding="utf-8")))
    proc = _execute(source, args)
    run = Run(command, proc.stdout, proc.stderr, proc.returncode)
    if cache:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(run.__dict__), encoding="utf-8")
    return run


def starter_figures(starter: str | Path, args: list[str] | tuple[str, ...] = ()) -> Path:
    """Run ``python <starter> <args> --figures DIR`` once (cached) and return DIR.

    DIR holds the figures the starter saved with ``labkit.figures.save`` and their
    ``figures.json`` manifest (file, alt text, caption per figure name).
    """
    starter, source = _source(starter)
    command = shlex.join(["python", starter.as_posix(), *args])
    directory = CACHE_DIR / f"{_key(command, source, 'figures')}-figures"
    if (directory / "figures.json").is_file():
        return directory
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    proc = _execute(source, [*args, "--figures", str(tmp)])
    if proc.returncode != 0 or not (tmp / "figures.json").is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(
            f"`{command} --figures DIR` exited {proc.returncode} without figures: "
            f"{proc.stderr.strip()[-500:]}"
        )
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory
