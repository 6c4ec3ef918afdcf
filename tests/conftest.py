"""Shared fixtures: run a starter in-process (for its variables) or as a reader would."""

from __future__ import annotations

import functools
import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

from infralens_docs.registry import ROOT, Lab, load_labs
from infralens_docs.runner import BLAS_ENV, Run, run_starter

# One BLAS thread in the test processes and in every starter or build they start, as the
# build runs starters (runner.BLAS_ENV); set before NumPy's first import, which reads them.
# With OpenBLAS's default (a thread per core) the starters' small matrix products spun on
# both cores while the other pytest worker needed one: the odd-input runs of labs 10 and 15
# took 300 s instead of 69 s on this 2-core machine.
for _name, _value in BLAS_ENV.items():
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def labs() -> list[Lab]:
    return load_labs()


@pytest.fixture
def run_lab(monkeypatch, capsys) -> Callable[..., dict]:
    """Execute a starter in this process with the given argv; return its globals.

    Tests read the starter's own variables (``latent``, ``noise_pred``...) instead
    of re-deriving them, so a test checks the code the page shows.
    """

    def run(relpath: str, *argv: str) -> dict:
        path = ROOT / relpath
        monkeypatch.setattr(sys, "argv", [path.name, *argv])
        namespace = runpy.run_path(str(path), run_name="__main__")
        namespace["__stdout__"] = capsys.readouterr().out
        return namespace

    return run


@pytest.fixture
def run_cli() -> Callable[..., Run]:
    """Run a starter as a subprocess, exactly as a reader types it (no cache)."""

    def run(relpath: str | Path, *argv: str) -> Run:
        return run_starter(relpath, list(argv), cache=False)

    return run


#: the repository address the test builds link their "Edit this page" buttons to (the Pages
#: workflow passes its own; mkdocs.yml reads INFRALENS_REPO_URL)
TEST_REPO_URL = "https://github.com/infralens/diffusion-handbook"


def strict_build(site: Path, **env_vars: str) -> Path:
    """``mkdocs build --strict`` into ``site`` as a subprocess, as `make build`/CI run it;
    fails on a non-zero exit or on any WARNING line (strict mode would also abort, but
    this names the warning in the test report)."""
    import subprocess

    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", INFRALENS_REPO_URL=TEST_REPO_URL)
    env.update(env_vars)
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = proc.stdout + proc.stderr
    # any WARNING fails, the notebook pages' executor's included (infralens_docs/notebooks.py)
    warnings = [line for line in log.splitlines() if "WARNING" in line]
    if proc.returncode != 0 or warnings:
        pytest.fail(f"mkdocs build --strict failed (exit {proc.returncode}):\n{log[-6000:]}")
    return site


def once_per_run(tmp_path_factory, name: str, make: Callable[[Path], Path]) -> Path:
    """``make(folder)``'s result, made once per test run. `make test` runs the suite on
    several pytest-xdist workers (each its own session): the first worker to ask makes it
    in the run's shared temporary folder while a file lock holds the others, which then
    take what it made. Without xdist, in this session's own folder."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # pytest-N/, above every popen-gwK/
    folder, made, failed = shared / name, shared / f"{name}.made", shared / f"{name}.failed"
    with FileLock(shared / f"{name}.lock"):
        if failed.exists():  # made and failed once: the other workers report it, not redo it
            pytest.fail(f"{name} failed on another worker:\n{failed.read_text(encoding='utf-8')}")
        if not made.exists():
            folder.mkdir()
            try:
                result = make(folder)
            except BaseException as error:
                failed.write_text(f"{type(error).__name__}: {error}"[-6000:], encoding="utf-8")
                raise
            made.write_text(str(result), encoding="utf-8")
    return Path(made.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def run_once(tmp_path_factory) -> Callable[[str, Callable[[Path], Path]], Path]:
    """``once_per_run`` bound to this session: ``run_once(name, make)``."""
    return functools.partial(once_per_run, tmp_path_factory)


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> Path:
    """One strict build per test run, into a temporary site_dir."""
    return once_per_run(tmp_path_factory, "site", strict_build)


@pytest.fixture(scope="session")
def offline_site(tmp_path_factory, built_site) -> Path:
    """The offline build (``make offline``: INFRALENS_OFFLINE=1), after ``built_site`` so
    it reuses that build's caches."""
    # (built without a repository address: a build without one has no edit links)
    return once_per_run(
        tmp_path_factory,
        "offline",
        lambda folder: strict_build(folder, INFRALENS_OFFLINE="1", INFRALENS_REPO_URL=""),
    )
