"""Run a starter the way a reader would, for outputs shown on the site.

``run_starter`` executes ``python <starter> <args>`` from the repository root
and returns what the terminal would show. Results are cached under
``.cache/infralens-run/`` keyed on the starter and the files beside it that it may
read, the labkit sources, the arguments, the code that runs it (this module and
``zygote.py``) and the Python and NumPy versions, so a warm rebuild does not rerun
anything and an edit to any of them does (to ``zygote.py`` from the next build on; to
this module and NumPy's version, from the next process on: ``mkdocs serve`` keeps the
module it loaded and the version it read, ``_numpy_version``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from infralens_docs.registry import ROOT

#: Every build cache lives here: ``.cache/`` unless INFRALENS_CACHE_DIR names another folder
#: (the reproducibility test builds once more with empty caches).
CACHE_ROOT = Path(os.environ.get("INFRALENS_CACHE_DIR") or ROOT / ".cache")
CACHE_DIR = CACHE_ROOT / "infralens-run"


def evict_unused(folder: Path, pattern: str, used: set[str], max_age_s: float = 86400) -> None:
    """Remove the entries of ``folder`` matching ``pattern`` whose stem no build used this
    time (``used``, then cleared) and none touched for ``max_age_s``: a cache folder does
    not grow forever, and entries another build still uses survive (later_cache, the render
    cache)."""
    if used and folder.is_dir():
        now = time.time()
        for entry in folder.glob(pattern):
            try:
                old = now - entry.stat().st_mtime > max_age_s
            except OSError:
                continue
            if entry.stem not in used and old:
                entry.unlink(missing_ok=True)
    used.clear()


@dataclass(frozen=True)
class Run:
    command: str  # as a reader types it, e.g. "python3 code/lab-01-.../forward_noise.py --seed 1"
    stdout: str
    stderr: str
    returncode: int


#: Within a build (``begin_build`` to ``close_zygotes``), labkit's digest, taken once.
_BUILD_DIGEST: dict[str, str] = {}
_IN_BUILD: list[bool] = []


def begin_build() -> None:
    """A build starts: labkit's digest is taken once, for all of its runs' keys (a source
    edited during the build is the next build's). ``close_zygotes`` ends it."""
    _BUILD_DIGEST.clear()
    _IN_BUILD[:] = [True]


def labkit_digest() -> str:
    """Hash of the shared package's sources: a change there can change every output.

    Every cached run's key holds it (hundreds per build): within a build it is taken once
    (``begin_build``); outside one, the files are read again only when one's size,
    modification time or inode changed (``_labkit_digest``)."""
    if _IN_BUILD:
        if "labkit" not in _BUILD_DIGEST:
            _BUILD_DIGEST["labkit"] = _labkit_digest_now()
        return _BUILD_DIGEST["labkit"]
    return _labkit_digest_now()


def _labkit_digest_now() -> str:
    files = []
    for path in sorted((ROOT / "code" / "labkit").rglob("*")):
        if path.suffix not in {".py", ".json"} or not path.is_file():
            continue  # sources and data (model_sizes.json), not __pycache__
        stat = path.stat()
        files.append((path, stat.st_size, stat.st_mtime_ns, stat.st_ino))
    return _labkit_digest(tuple(files))


@functools.lru_cache(maxsize=4)
def _labkit_digest(files: tuple[tuple[Path, int, int, int], ...]) -> str:
    h = hashlib.sha256()
    for path, *_ in files:
        h.update(path.relative_to(ROOT).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


# One BLAS thread: the same sums in the same order whatever the machine's core count, and
# no thread-pool spin-up for the labs' small matrices, which made lab 05 ~30% slower with
# the default pool. The kernel OpenBLAS and NumPy pick still depends on the CPU, so the
# last digits of rounding-level results do too: prose quotes none that moves under the
# other kernels tests/test_build.py::test_numbers_in_lab_prose_hold_on_other_cpu_kernels
# tries. The notebook pages' zygote gets them too (``starter_env``).
BLAS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def starter_env() -> dict[str, str]:
    """A deterministic environment: fixed hash seed, one BLAS thread, no user site. No
    PYTHONPATH is added: a starter finds labkit itself (it puts code/ on sys.path), so the
    build runs the command exactly as the page prints it."""
    env = dict(os.environ)
    env.update(BLAS_ENV)
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONNOUSERSITE"] = "1"
    return env


#: What a starter's run may read beside it: the lab's other starters, an exercise's blanks
#: file and its ``*_solution.txt`` (lab 17's ``rebuild_pipeline.py --solution`` reads one).
BESIDE_SUFFIXES = (".py", ".txt")


def beside(source: Path) -> list[str]:
    """The names and contents of the files beside ``source`` that its run may read."""
    found = sorted(
        p for p in source.parent.iterdir()
        if p != source and p.suffix in BESIDE_SUFFIXES and p.is_file()
    )  # fmt: skip
    return [f"{p.name}\0{p.read_text(encoding='utf-8')}" for p in found]


def _key(command: str, source: Path, extra: str = "") -> str:
    """Everything that can change a starter's output, hashed: its own source, the files
    beside it that it may read (``beside``), labkit's, the code that runs it."""
    parts = [command, _own_sources(source), labkit_digest(), _runner_digest(), sys.version]
    return hashlib.sha256(json.dumps([*parts, _numpy_version(), extra]).encode()).hexdigest()


def _runner_digest() -> str:
    """The code a run goes through, hashed: the zygote's file (each build starts its zygotes
    afresh from it: taken once per build, as labkit's digest) and this module's (the
    environment; the one loaded in this process, so taken once per process)."""
    if _IN_BUILD:
        if "zygote" not in _BUILD_DIGEST:
            _BUILD_DIGEST["zygote"] = _zygote_digest()
        return _BUILD_DIGEST["zygote"] + _THIS_MODULE
    return _zygote_digest() + _THIS_MODULE


def _zygote_digest() -> str:
    return hashlib.sha256(Path(__file__).with_name("zygote.py").read_bytes()).hexdigest()


_THIS_MODULE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _own_sources(source: Path) -> str:
    """The starter's text and ``beside``'s, joined; a build asks for it hundreds of times,
    so it is read again only when a file in the starter's folder changed (its name, size,
    modification time or inode)."""
    stats = []
    for path in sorted(source.parent.iterdir()):
        try:
            stat = path.stat()
        except OSError:
            continue
        stats.append((path.name, stat.st_size, stat.st_mtime_ns, stat.st_ino))
    return _own_sources_read(source, tuple(stats))


@functools.lru_cache(maxsize=256)
def _own_sources_read(source: Path, stats: tuple) -> str:
    return "\0".join([source.read_text(encoding="utf-8"), *beside(source)])


@functools.cache
def _numpy_version() -> str:
    return version("numpy")


def _source(starter: str | Path) -> tuple[Path, Path]:
    starter = Path(starter)
    if starter.is_absolute():
        starter = starter.relative_to(ROOT)
    source = ROOT / starter
    if not source.is_file():
        raise FileNotFoundError(f"starter not found: {starter}")
    return starter, source


def _execute(source: Path, args: list[str] | tuple[str, ...]) -> subprocess.CompletedProcess:
    """``python <source> <args>`` in a fresh interpreter, as a reader runs it."""
    return subprocess.run(
        [sys.executable, str(source), *args],
        cwd=ROOT,
        env=starter_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


class StarterError(RuntimeError):
    """A starter run the build needed exited non-zero (or saved no figures); its
    ``stderr`` is kept whole, for the error box a served page shows (``serving``)."""

    def __init__(self, message: str, command: str, returncode: int, stderr: str) -> None:
        super().__init__(message)
        self.command, self.returncode, self.stderr = command, returncode, stderr


class Zygote:
    """A client of one ``infralens_docs.zygote`` process (see that module): the same
    run as :func:`_execute`, without the interpreter start-up. One run at a time per
    zygote; a thread that wants parallel runs uses a zygote of its own. A notebook zygote
    (``notebook=True``) runs notebook pages' cells (:meth:`run_cells`)."""

    def __init__(self, notebook: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infralens_docs.zygote", *(["--notebook"] if notebook else [])],
            cwd=ROOT, env=starter_env(), text=True, encoding="utf-8",
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout stops its children too
        )  # fmt: skip

    def _request(self, request: dict, command: list[str], timeout: float) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        # one reply line per request, so nothing is left in the reader's buffer between runs
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise subprocess.TimeoutExpired(command, timeout)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the starter zygote exited ({self.proc.wait()})")
        return json.loads(line)

    def run(
        self, source: Path, args: list[str] | tuple[str, ...], timeout: float = 120
    ) -> subprocess.CompletedProcess:
        command = [sys.executable, str(source), *args]
        reply = self._request({"source": str(source), "args": list(args)}, command, timeout)
        return subprocess.CompletedProcess(
            command, reply["returncode"], reply["stdout"], reply["stderr"]
        )

    def run_cells(
        self, cells: list[str], cwd: str, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        """Run a notebook's code ``cells`` (see ``zygote._notebook_child``); the result's
        stdout is the outputs as JSON."""
        command = [sys.executable, "-m", "infralens_docs.zygote", "--notebook-once"]
        reply = self._request({"cells": cells, "cwd": cwd}, command, timeout)
        return subprocess.CompletedProcess(
            command, reply["returncode"], reply["stdout"], reply["stderr"]
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=10)


_zygotes = threading.local()


def _execute_for_build(source: Path, args: list[str] | tuple[str, ...]):
    """The build's runs go through this thread's zygote (started on first use); where
    the OS cannot fork (Windows), through a fresh interpreter as a reader runs it."""
    if not hasattr(os, "fork"):
        return _execute(source, args)
    zygote = getattr(_zygotes, "zygote", None)
    if zygote is None or zygote.proc.poll() is not None:
        zygote = _zygotes.zygote = Zygote()
        _ALL_ZYGOTES.append(zygote)
    try:
        return zygote.run(source, args)
    except (RuntimeError, OSError):
        # the zygote died (it could not import NumPy or a module of zygote.PRELOAD, or was
        # killed; a labkit that fails to import is left to the runs): a fresh interpreter
        # runs it and reports what goes wrong
        return _execute(source, args)


def execute_cells(cells: list[str], cwd: str | Path) -> subprocess.CompletedProcess:
    """Run a notebook page's code ``cells`` through this thread's notebook zygote (started
    on first use; where the OS cannot fork, in a fresh interpreter), with the starters'
    environment (``starter_env``). The result's stdout is the outputs as JSON."""
    request = {"cells": cells, "cwd": str(cwd)}
    once = [sys.executable, "-m", "infralens_docs.zygote", "--notebook-once"]
    if hasattr(os, "fork"):
        zygote = getattr(_zygotes, "notebook", None)
        if zygote is None or zygote.proc.poll() is not None:
            zygote = _zygotes.notebook = Zygote(notebook=True)
            _ALL_ZYGOTES.append(zygote)
        try:
            return zygote.run_cells(cells, str(cwd))
        except (RuntimeError, OSError):
            pass  # the zygote died (as in _execute_for_build): a fresh interpreter says why
    return subprocess.run(
        once, input=json.dumps(request) + "\n", cwd=ROOT, env=starter_env(),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


_ALL_ZYGOTES: list[Zygote] = []


def close_zygotes() -> None:
    """Stop every zygote (after a build: the next build must see edited labkit sources)."""
    while _ALL_ZYGOTES:
        _ALL_ZYGOTES.pop().close()
    _zygotes.__dict__.clear()
    _IN_BUILD.clear()
    _BUILD_DIGEST.clear()


def run_starter(
    starter: str | Path, args: list[str] | tuple[str, ...] = (), cache: bool = True
) -> Run:
    starter, source = _source(starter)
    command = shlex.join(["python3", starter.as_posix(), *args])
    cached = CACHE_DIR / f"{_key(command, source)}.json"
    if cache:
        _wait_for_prefetch(cached)
    if cache and cached.is_file():
        return Run(**json.loads(cached.read_text(encoding="utf-8")))
    # cached runs are the build's (through a zygote); uncached ones are the tests' checks
    proc = _execute_for_build(source, args) if cache else _execute(source, args)
    run = Run(command, proc.stdout, proc.stderr, proc.returncode)
    if cache:
        _write_run(cached, run)
    return run


def _write_run(cached: Path, run: Run) -> None:
    """Written whole, then renamed: a build or test reading the cache at the same time
    (`make test` runs on several workers) sees the old file or the new one."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(run.__dict__), encoding="utf-8")
    tmp.replace(cached)


def starter_figures(starter: str | Path, args: list[str] | tuple[str, ...] = ()) -> Path:
    """Run ``python <starter> <args> --figures DIR`` once (cached) and return DIR.

    DIR holds the figures the starter saved with ``labkit.figures.save`` and their
    ``figures.json`` manifest (file, alt text, caption per figure name).
    """
    starter, source = _source(starter)
    command = shlex.join(["python3", starter.as_posix(), *args])
    directory = CACHE_DIR / f"{_key(command, source, 'figures')}-figures"
    _wait_for_prefetch(directory)
    if (directory / "figures.json").is_file():
        return directory
    # a folder of this process and thread alone: two builds sharing the cache (a served site
    # and a test build) once wrote one `.tmp` folder together and cut a manifest short
    tmp = directory.with_name(f"{directory.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    proc = _execute_for_build(source, [*args, "--figures", str(tmp)])
    if proc.returncode == 0 and not (tmp / "figures.json").exists():
        # a run that saves no figures (lab 17's starter before its blanks are filled): an
        # empty manifest, cached like any other, so a build does not run it again (a
        # directive that asks it for a figure fails on the name)
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "figures.json").write_text("{}", encoding="utf-8")
    if proc.returncode != 0 or not (tmp / "figures.json").is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        raise StarterError(
            f"`{command} --figures DIR` exited {proc.returncode} without figures: "
            f"{proc.stderr.strip()[-500:]}",
            f"{command} --figures DIR",
            proc.returncode,
            proc.stderr,
        )
    # What it printed is what `python3 <starter> <args>` prints: --figures changes only what
    # a starter writes to DIR (tests/test_build.py compares every run shown on a page with
    # a fresh terminal run), so the plain run's cache entry comes with it, one run for two.
    plain = CACHE_DIR / f"{_key(command, source)}.json"
    if not plain.is_file():
        _write_run(plain, Run(command, proc.stdout, proc.stderr, proc.returncode))
    if directory.exists() and not (directory / "figures.json").is_file():
        shutil.rmtree(directory, ignore_errors=True)  # a folder left without its manifest
    try:
        tmp.rename(directory)  # atomic; fails if another build got there first
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (directory / "figures.json").is_file():
            raise
    return directory


# ------------------------------------------------------------------------ prefetch
# A build asks for runs one page at a time, while the notebook pages keep the main thread
# busy. ``prefetch`` starts every run the pages will ask for on worker threads (each with
# its own zygote) as soon as the build knows the pages; ``run_starter`` and
# ``starter_figures`` then wait for the one they need instead of starting it again.

_PREFETCH: dict[Path, Future] = {}
_PREFETCH_LOCK = threading.Lock()
_worker = threading.local()


def _wait_for_prefetch(target: Path) -> None:
    if getattr(_worker, "active", False):
        return
    with _PREFETCH_LOCK:
        future = _PREFETCH.get(target)
    if future is not None:
        future.result()  # re-raises what went wrong in the worker


def prefetch(jobs: list[tuple[str, list[str], bool]], workers: int = 0) -> None:
    """Start ``(starter, args, figures)`` runs whose results are not cached yet.

    ``figures`` True means ``starter_figures(starter, args)``, else ``run_starter``.
    Workers default to the machine's cores (at least 1).
    """
    if not workers:  # the cores this process may use (sched_getaffinity is Linux-only)
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        workers = len(cores) if cores else os.cpu_count() or 1
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="infralens-run")
    seen: dict[Path, Future] = {}
    # a plain run with a figures run of the same arguments comes with it (starter_figures)
    twins = {(starter, tuple(args)) for starter, args, figures in jobs if figures}
    jobs = sorted(jobs, key=lambda job: not job[2])  # the figures runs first
    for starter, args, figures in jobs:
        try:
            rel, source = _source(starter)
        except FileNotFoundError:
            continue  # the directive reports it with the page's name
        command = shlex.join(["python3", rel.as_posix(), *args])
        if figures:
            target = CACHE_DIR / f"{_key(command, source, 'figures')}-figures"
            done = (target / "figures.json").is_file()
            call = functools.partial(starter_figures, rel, args)
        else:
            target = CACHE_DIR / f"{_key(command, source)}.json"
            done = target.is_file()
            call = functools.partial(run_starter, rel, args)
        if done or target in seen:
            continue
        twin = CACHE_DIR / f"{_key(command, source, 'figures')}-figures"
        if not figures and (starter, tuple(args)) in twins and twin in seen:
            # done when the figures run is (it raises if that run failed: this one then
            # runs by itself when a page asks for it)
            seen[target] = future = Future()
            seen[twin].add_done_callback(lambda _, future=future: future.set_result(None))
        else:
            seen[target] = future = pool.submit(_prefetched, call)
        with _PREFETCH_LOCK:
            _PREFETCH[target] = future
    pool.shutdown(wait=False)


def _prefetched(call):
    """Run ``call`` on a worker thread, which never waits for a prefetch itself."""
    _worker.active = True
    return call()


def finish_prefetch() -> None:
    """Wait for every prefetched run, then forget them (end of a build)."""
    with _PREFETCH_LOCK:
        futures = list(_PREFETCH.values())
        _PREFETCH.clear()
    for future in futures:
        future.exception()  # wait; errors were reported by the directive that needed it
