"""Notebook pages: how mkdocs-jupyter runs the starters, and running them ahead of time.

mkdocs-jupyter renders each starter page (a jupytext percent-format ``.py``) by executing
it in a Jupyter kernel and exporting the result with nbconvert, one page after another,
on the build's main thread. :func:`configure` sets how that happens (IPC kernels, one
kernel per build, stable cell ids, merged stream outputs).

That render was most of a cold build: the kernel computes while the main thread waits,
then the main thread spends ~0.4 s in nbconvert's HTML export per page. Yet mkdocs
renders the notebook pages last (the starters are added after ``docs/``), so
:func:`prebuild` hands them to worker processes (``python -m infralens_docs.notebooks``,
each with its own kernel) as soon as the build knows its files. A worker does exactly
what mkdocs-jupyter's render does on a cache miss (``convert.nb2html`` and the TOC, with
the plugin's own options) and writes mkdocs-jupyter's own cache entry; while the Markdown
pages render, the notebooks execute and export on the other cores. When the build
reaches a notebook page, :func:`wait_for` blocks until its worker is done, and
mkdocs-jupyter's render finds the entry in its cache. If a worker fails, the page
renders in the build as before, so a broken starter fails the build with the real error.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import types
from concurrent.futures import Future
from pathlib import Path

import jupytext
from mkdocs.exceptions import PluginError

from infralens_docs.registry import ROOT


def _socket_folder() -> Path:
    """This user's folder for the kernels' sockets, in the system's temporary folder (a
    socket's path may not pass about 100 bytes: 107 on Linux, 103 on macOS, which one under
    a deep checkout or a test's temporary folder does). Readable by this user alone; if the
    name is taken by another user or a link, a fresh private folder instead."""
    folder = Path(tempfile.gettempdir()) / f"infralens-kernel-ipc-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.is_symlink() or folder.stat().st_uid != os.getuid():
        return Path(tempfile.mkdtemp(prefix="infralens-ipc-"))
    return folder


def _key_on_the_files_beside() -> None:
    """Wrap ``mkdocs_jupyter.plugin._compute_cache_key`` (the plugin and :func:`prebuild`
    look it up at each call) to hash the files beside the notebook's starter too."""
    import hashlib

    from mkdocs_jupyter import plugin

    from infralens_docs.runner import beside

    original = plugin._compute_cache_key

    def key(nb_path, config, exec_nb):
        parts = [original(nb_path, config, exec_nb), *beside(Path(nb_path))]
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    plugin._compute_cache_key = key


def configure() -> None:
    """Four settings for mkdocs-jupyter's notebook runs, applied once.

    - Kernels over IPC (Unix sockets in a private folder of the system's temporary folder,
      ``_socket_folder``) instead of TCP: nbclient starts each kernel with the exporter's
      traitlets config, so ``KernelManager.transport = "ipc"`` there keeps the build off the
      network and silences ipykernel's "running over TCP without encryption" warning.
      mkdocs-jupyter builds that config in ``get_nbconvert_app``; wrap it.
    - Adjacent stream outputs merged and stable cell ids, so that two clean builds of the
      same sources give byte-identical pages.
    - One kernel for all the starter pages of a build, reset before each (``%reset -f``,
      the notebook's folder as cwd, the execution count back to 1): starting a kernel
      took most of a notebook page's build time. :func:`shutdown_kernel` stops
      it when the build ends, so the next build (``mkdocs serve``) imports edited labkit
      sources afresh. The tests compare every notebook page with a fresh run of its script.

    - A page's cache key folds in the files beside its starter that a run may read
      (``runner.beside``): mkdocs-jupyter keys on the notebook file alone, so an edit to a
      file beside a starter that its run reads left its page as it was
      (``_key_on_the_files_beside``).

    Each process that renders notebooks (the build, and each prebuild worker) calls it.
    """
    from mkdocs_jupyter import nbconvert2
    from nbconvert.preprocessors import ExecutePreprocessor

    if getattr(nbconvert2.get_nbconvert_app, "infralens_ipc", False):
        return
    _key_on_the_files_beside()
    original = nbconvert2.get_nbconvert_app
    sockets = _socket_folder()

    def get_nbconvert_app(*args, **kwargs):
        app = original(*args, **kwargs)
        # one socket prefix per process: two workers must not pick the same socket names
        ip = str(sockets / f"k{os.getpid()}")
        app.config.update({"KernelManager": {"transport": "ipc", "ip": ip}})
        return app

    # How the kernel happened to flush stdout (one message or two, depending on load) must
    # not change the page. nbclient's ``coalesce_streams`` is not a configurable trait, and
    # it would also move text printed after a figure to before it; merge only neighbours.
    execute_cell = ExecutePreprocessor.preprocess_cell

    def preprocess_cell(self, cell, resources, index):
        cell, resources = execute_cell(self, cell, resources, index)
        if "outputs" in cell:
            cell["outputs"] = merge_adjacent_streams(cell["outputs"])
        return cell, resources

    ExecutePreprocessor.preprocess_cell = preprocess_cell
    run_notebook = ExecutePreprocessor.preprocess

    def preprocess(self, nb, resources=None, km=None):
        if km is not None:  # a caller with its own kernel: leave it alone
            return run_notebook(self, nb, resources, km)
        path = ((resources or {}).get("metadata") or {}).get("path") or str(ROOT)
        km = _notebook_kernel(self, path)
        try:
            return run_notebook(self, nb, resources, km)
        finally:
            if self.kc is not None:  # nbclient leaves the client of a kernel it does not own
                self.kc.stop_channels()
                self.kc = None

    ExecutePreprocessor.preprocess = preprocess
    get_nbconvert_app.infralens_ipc = True  # type: ignore[attr-defined]
    nbconvert2.get_nbconvert_app = get_nbconvert_app
    # mkdocs-jupyter reads the .py starters with jupytext; read them with stable cell ids.
    nbconvert2.jupytext = types.SimpleNamespace(read=read_starter, writes=jupytext.writes)


_KERNEL: dict = {}  # "km": the build's running notebook kernel


def _notebook_kernel(client, path: str):
    """The build's kernel (started on first use), reset for a notebook in ``path``."""
    from jupyter_core.utils import run_sync

    km = _KERNEL.get("km")
    if km is None or not run_sync(km.is_alive)():
        km = client.kernel_manager_class(kernel_name=client.kernel_name, config=client.config)
        run_sync(km.start_kernel)(extra_arguments=client.extra_arguments, cwd=path)
        _KERNEL["km"] = km
    kc = km.blocking_client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        code = (
            "%reset -f\n"
            f"import os as _os; _os.chdir({path!r}); del _os\n"
            "get_ipython().history_manager.reset(new_session=True)\n"
            "get_ipython().execution_count = 1\n"
        )
        reply = kc.execute_interactive(
            code, store_history=False, timeout=60, output_hook=lambda msg: None
        )
        if reply["content"]["status"] != "ok":
            raise PluginError(f"could not reset the notebook kernel: {reply['content']}")
    finally:
        kc.stop_channels()
    return km


def shutdown_kernel() -> None:
    """Stop the build's notebook kernel, if one runs."""
    from jupyter_core.utils import run_sync

    km = _KERNEL.pop("km", None)
    if km is not None and run_sync(km.is_alive)():
        run_sync(km.shutdown_kernel)(now=True)


def merge_adjacent_streams(outputs: list) -> list:
    """Join each run of consecutive ``stream`` outputs of one name (stdout, stderr) into
    one output; every other output, and the order of all of them, stays as it was."""
    merged: list = []
    for output in outputs:
        previous = merged[-1] if merged else None
        if (
            previous is not None
            and output.get("output_type") == "stream"
            and previous.get("output_type") == "stream"
            and previous.get("name") == output.get("name")
        ):
            previous["text"] += output["text"]
        else:
            merged.append(output)
    return merged


def read_starter(path):
    """``jupytext.read`` with stable cell ids. jupytext gives each cell a random id, which
    lands in the page's HTML and the .ipynb download, so two builds of the same starter
    differed; ``cell-<index>`` keeps them byte-identical."""
    notebook = jupytext.read(path)
    for index, cell in enumerate(notebook.cells):
        cell["id"] = f"cell-{index}"
    return notebook


# --------------------------------------------------------------------------- prebuild

#: Options of mkdocs-jupyter's ``convert.nb2html`` a worker passes on from the plugin config.
NB2HTML_OPTIONS = [
    "kernel_name", "theme", "allow_errors", "show_input", "no_input", "no_prompt",
    "remove_tag_config", "highlight_extra_classes", "include_requirejs", "custom_mathjax_url",
]  # fmt: skip
#: A worker that sends no reply for this long is stopped (a notebook runs in seconds).
JOB_TIMEOUT_S = 300

_jobs: dict[str, Future] = {}  # abs_src_path -> done when the cache entry is written
_queue: queue.Queue = queue.Queue()
_threads: list[threading.Thread] = []


def prebuild(plugin, files, serving: bool = False) -> None:
    """Start rendering, on worker processes, each notebook page ``plugin`` (mkdocs-jupyter)
    will render whose result is not in its cache yet.

    ``serving`` (``mkdocs serve``): a starter that does not compile gets no worker (nor a
    kernel): its page shows the error (``hooks.on_pre_page``)."""
    from mkdocs_jupyter.plugin import _compute_cache_key, _get_cache_path

    config = plugin.config
    if not config["cache"] or config["execute_ignore"]:
        return  # (both would need mkdocs-jupyter's per-page decisions; not used here)
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    cores = len(cores) if cores else os.cpu_count() or 1
    # INFRALENS_NOTEBOOK_WORKERS=0 renders every notebook page in the build itself (the
    # reproducibility test compares that with a build that used the workers)
    workers = int(os.environ.get("INFRALENS_NOTEBOOK_WORKERS", cores))
    if workers <= 0:
        return
    for file in files:
        if not plugin.should_include(file):
            continue
        path = file.abs_src_path
        cache_path = _get_cache_path(
            config["cache_dir"], _compute_cache_key(path, config, config["execute"])
        )
        if cache_path.exists() or path in _jobs:
            continue
        if serving:
            try:
                compile(Path(path).read_bytes(), path, "exec")
            except (SyntaxError, ValueError) as exc:
                _jobs[path] = future = Future()
                future.set_exception(exc)
                continue
        job = {
            "path": path,
            "cache_path": str(cache_path),
            "execute": config["execute"],
            "toc_depth": config["toc_depth"],
            **{name: config[name] for name in NB2HTML_OPTIONS},
        }
        _jobs[path] = future = Future()
        _queue.put((job, future))
    for _ in range(min(len(_jobs), workers) - len(_threads)):
        thread = threading.Thread(target=_drive_worker, name="infralens-notebooks", daemon=True)
        thread.start()
        _threads.append(thread)


def wait_for(path: str) -> BaseException | None:
    """Block until the worker rendering ``path`` is done (nothing if none is); return what
    went wrong in the worker, if anything. A failure is not raised here: the build renders
    the page itself and reports the real error (under ``mkdocs serve``, the page shows it)."""
    future = _jobs.get(path)
    if future is not None and not future.cancelled():
        return future.exception()
    return None


def finish() -> None:
    """Stop the workers (end of a build). Jobs no page waited for (a build that failed
    before its notebook pages) are dropped rather than run."""
    while True:
        try:
            item = _queue.get_nowait()
        except queue.Empty:
            break
        if item is not None:
            item[1].cancel()
    for _ in _threads:
        _queue.put(None)
    for thread in _threads:
        thread.join()
    _threads.clear()
    _jobs.clear()


def _drive_worker() -> None:
    """Feed queued jobs to one worker process, starting it on first use."""
    proc = None
    try:
        while (item := _queue.get()) is not None:
            job, future = item
            try:
                if proc is None or proc.poll() is not None:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "infralens_docs.notebooks"],
                        cwd=ROOT, text=True, encoding="utf-8",
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # stderr: the build's
                        start_new_session=True,  # a timeout stops its kernel too
                    )  # fmt: skip
                proc.stdin.write(json.dumps(job) + "\n")
                proc.stdin.flush()
                if not select.select([proc.stdout], [], [], JOB_TIMEOUT_S)[0]:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    raise TimeoutError(f"{job['path']}: no reply in {JOB_TIMEOUT_S} s")
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"the notebook worker exited ({proc.wait()})")
                reply = json.loads(line)
                if not reply["ok"]:
                    raise RuntimeError(reply["error"])
                future.set_result(None)
            except Exception as exc:  # the page renders itself and reports it
                future.set_exception(exc)
    finally:
        if proc is not None and proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _serve() -> None:
    """The worker: one job per stdin line, one reply per stdout line, until stdin closes.

    It renders as mkdocs-jupyter's ``new_render`` does on a cache miss and writes the same
    cache entry (content, TOC tokens, title)."""
    from mkdocs_jupyter import convert
    from mkdocs_jupyter.plugin import _get_nb_toc_tokens

    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything else printed goes to the build's stderr, not into the protocol
    configure()
    try:
        for line in sys.stdin:
            job = json.loads(line)
            try:
                content = convert.nb2html(
                    job["path"],
                    execute=job["execute"],
                    **{name: job[name] for name in NB2HTML_OPTIONS},
                )
                toc_tokens, title = _get_nb_toc_tokens(job["path"], job["toc_depth"])
                entry = {"content": content, "toc_tokens": toc_tokens, "title": title}
                cache_path = Path(job["cache_path"])
                cache_path.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache_path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(entry), encoding="utf-8")
                tmp.replace(cache_path)
                reply = {"ok": True}
            except Exception as exc:
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            replies.write(json.dumps(reply) + "\n")
            replies.flush()
    finally:
        shutdown_kernel()


if __name__ == "__main__":
    _serve()
