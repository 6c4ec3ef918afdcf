"""Run starters for the build without paying for a new interpreter each time.

A build runs most starters several times (once per ``infralens:run`` block or figures
run; a figures run also serves the plain run of its arguments). Most of each run was
interpreter start-up and ``import numpy``. A zygote is one interpreter started exactly
like a reader's run (``starter_env``: same hash seed, one BLAS thread, labkit
importable) that imports numpy, labkit and the other modules the starters import once
(``_preload``) and then forks one child per run. The
child resets what a fresh interpreter would have (argv, cwd, stdout and stderr to
temporary files) and runs the starter as ``__main__``; the zygote itself never runs a starter,
so no run sees another's state.

Only the build uses it. ``run_starter(..., cache=False)``, which the tests use to
check what the pages show, still starts a fresh interpreter per run, so the pages'
outputs are compared against a reader's real terminal run.

Protocol (one JSON object per line): the parent sends ``{"source", "args"}`` on the
zygote's stdin and reads ``{"stdout", "stderr", "returncode"}`` from its stdout.

A notebook zygote (``--notebook``, for the notebook pages: ``infralens_docs.notebooks``)
imports IPython too and takes ``{"cells", "cwd"}``: its child runs the code cells one
after another in one IPython shell, as ipykernel runs a notebook's cells (``run_cell``:
the value of a cell's last expression is displayed, ``display(...)`` publishes rich
output), stops at a cell that raises, as nbclient does, and replies with each cell's
outputs in nbformat's shape as the reply's ``stdout`` (JSON: ``outputs``, ``counts``,
``error``).
"""

from __future__ import annotations

import base64
import json
import os
import runpy
import sys
import tempfile
import traceback
import types


def _child(source: str, args: list[str], out: int, err: int) -> None:
    """In the forked child: become ``python <source> <args>`` and exit with its code."""
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdin = open(os.devnull, encoding="utf-8")
    sys.argv = [source, *args]
    sys.path[0] = os.path.dirname(source)  # as `python <source>` sets it
    code = 0
    try:
        runpy.run_path(source, run_name="__main__")
    except SystemExit as exc:  # argparse errors, sys.exit(...)
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # what the interpreter prints for an uncaught exception
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


class _CellStream:
    """``sys.stdout`` / ``sys.stderr`` of a notebook run: what a cell writes becomes its
    ``stream`` outputs, consecutive writes to one stream joined (as nbclient merges the
    kernel's flushes; ``notebooks.merge_adjacent_streams``). Before the first cell, to the
    zygote's own stream (as a kernel's start-up messages reach its terminal, not a cell)."""

    encoding = "utf-8"
    errors = "strict"

    def __init__(self, name: str, cells: list[list[dict]], fallback) -> None:
        self.name, self.cells, self.fallback = name, cells, fallback

    def write(self, text: str) -> int:
        if not self.cells:
            return self.fallback.write(text)
        outputs = self.cells[-1]
        if outputs and outputs[-1]["output_type"] == "stream" and outputs[-1]["name"] == self.name:
            outputs[-1]["text"] += text
        elif text:
            outputs.append({"output_type": "stream", "name": self.name, "text": text})
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.fallback.fileno()


def _jsonable(data: dict) -> dict:
    """A display's data as a kernel sends it: bytes (a PNG) base64-encoded."""
    return {
        mime: base64.b64encode(value).decode("ascii") if isinstance(value, bytes) else value
        for mime, value in data.items()
    }


def _notebook_shell(cells: list[list[dict]]):
    """An IPython shell whose rich output lands in ``cells[-1]`` as nbformat outputs, as
    ipykernel's shell sends it to nbclient: ``display(...)`` as ``display_data``, a cell's
    last value as ``execute_result``, an exception as ``error``."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets import Type
    from traitlets.config import Config

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, *args, **kwargs) -> None:
            cells[-1].append(
                {"output_type": "display_data", "data": _jsonable(data), "metadata": metadata or {}}
            )

        def clear_output(self, wait: bool = False) -> None:
            cells[-1].clear()

    class Hook(DisplayHook):
        def write_output_prompt(self) -> None:
            pass

        def write_format_data(self, format_dict, md_dict=None) -> None:
            cells[-1].append({
                "output_type": "execute_result", "execution_count": self.prompt_count,
                "data": _jsonable(format_dict), "metadata": md_dict or {},
            })  # fmt: skip

        def finish_displayhook(self) -> None:
            self._is_active = False

    class Shell(InteractiveShell):
        displayhook_class = Type(Hook)
        display_pub_class = Type(Publisher)

        def _showtraceback(self, etype, evalue, stb) -> None:
            cells[-1].append({
                "output_type": "error", "ename": etype.__name__, "evalue": str(evalue),
                "traceback": stb,
            })  # fmt: skip

    config = Config()
    config.HistoryManager.enabled = False  # no history database, no saving thread
    return Shell.instance(config=config)


def _notebook_child(cells: list[str], cwd: str, out: int, err: int) -> None:
    """In the forked child: run ``cells`` as a notebook's kernel would, from ``cwd``, write
    the outputs as JSON to ``out`` and exit. ``labkit.cli.in_notebook`` asks whether a
    Jupyter kernel runs the code: this child stands in for one (``ipykernel`` is named in
    ``sys.modules``, not imported), so a starter reads no command line and displays its
    figures, as on a reader's Jupyter."""
    os.dup2(err, 1)  # anything written below Python's streams: the reply's stderr
    os.dup2(err, 2)
    sys.stdin = open(os.devnull, encoding="utf-8")
    os.chdir(cwd)
    sys.argv = [""]
    sys.path[0] = ""  # as in a kernel: the working folder first
    sys.modules.setdefault("ipykernel", types.ModuleType("ipykernel"))
    outputs: list[list[dict]] = []
    sys.stdout = _CellStream("stdout", outputs, sys.__stdout__)
    sys.stderr = _CellStream("stderr", outputs, sys.__stderr__)
    counts: list[int | None] = []
    error = None
    try:
        shell = _notebook_shell(outputs)
        for index, source in enumerate(cells):
            outputs.append([])
            result = shell.run_cell(source, store_history=True)
            counts.append(result.execution_count)
            if not result.success:
                error = index
                break
        payload = {"outputs": outputs, "counts": counts, "error": error}
        os.write(out, json.dumps(payload).encode("utf-8"))
        code = 0
    except BaseException:  # the executor itself failed: the reply's stderr says why
        traceback.print_exc(file=sys.__stderr__)
        code = 1
    finally:
        sys.__stderr__.flush()
    os._exit(code)


#: Modules starters import beyond NumPy's and labkit's top level (``python -X importtime``
#: on every starter: ~20 ms of a run, numpy.random the most): imported once in the zygote,
#: not once in each child. None of them is a reader's to edit; labkit's modules, which are,
#: are added by :func:`_preload` with a check.
PRELOAD = ("numpy.random", "numpy.ma", "shutil", "locale", "pkgutil", "tempfile",
           "importlib.readers")  # fmt: skip
#: and in a notebook zygote, IPython's shell and ``IPython.display``, with what a notebook
#: child imports beyond them: the modules the shell's set-up imports, and the SVG parser
#: behind ``IPython.display.SVG`` (~13 ms a page)
NOTEBOOK_PRELOAD = ("IPython.core.interactiveshell", "IPython.display",
                    "IPython.core.completer", "IPython.core.completerlib",
                    "IPython.core.oinspect", "IPython.core.application",
                    "IPython.core.magics", "IPython.core.logger", "bdb", "xml.dom.minidom",
                    "xml.dom.expatbuilder")  # fmt: skip


def _labkit_modules() -> list[str]:
    """labkit and every module in its folder, found without importing any of them."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("labkit")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(next(iter(spec.submodule_search_locations)))
    names = ["labkit"]
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if parts and all(part.isidentifier() for part in parts):
            names.append(".".join(("labkit", *parts)))
    return names


#: how long the check of labkit's modules may take before the zygote preloads no more of
#: them (a reader's edit can make an import hang; a run that imports it then times out
#: alone, as in a fresh interpreter, instead of every run waiting on the zygote's start)
CHECK_TIMEOUT_S = float(os.environ.get("INFRALENS_PRELOAD_CHECK_TIMEOUT", "20"))


def _silent_prefix(names: list[str]) -> int:
    """How many of ``names``, imported one after another on top of what this process has
    imported, import without failing or writing anything to stdout or stderr before the
    first that does: tried in a forked child, so this process imports nothing that fails or
    prints. The count comes back as the child's exit status (labkit has far fewer than 256
    modules); -1 when the check takes longer than ``CHECK_TIMEOUT_S``."""
    import importlib
    import signal
    import time

    with tempfile.TemporaryFile() as sink:
        pid = os.fork()
        if pid == 0:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            count = 0
            try:
                for name in names[:255]:
                    importlib.import_module(name)
                    sys.stdout.flush()
                    sys.stderr.flush()
                    if os.fstat(sink.fileno()).st_size:
                        break
                    count += 1
            finally:
                os._exit(count)
        deadline = time.monotonic() + CHECK_TIMEOUT_S
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return max(os.waitstatus_to_exitcode(status), 0)
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return -1
            time.sleep(0.002)


def _preload(notebook: bool) -> None:
    """Import ``PRELOAD`` (and ``NOTEBOOK_PRELOAD`` in a notebook zygote), then labkit and
    each of its modules that imports without failing or writing anything (a reader's edit
    under ``mkdocs serve`` can do either). What is left out, each child imports itself, so
    a run that imports it fails, or prints what the import prints, as in a fresh
    interpreter; a module that imports it is left out too (its own check imports it). One
    forked check when every module is silent, one more per module left out; none of the
    rest once a check outlasts ``CHECK_TIMEOUT_S`` (an import that hangs)."""
    import importlib

    for name in [*PRELOAD, *(NOTEBOOK_PRELOAD if notebook else ())]:
        importlib.import_module(name)
    names = _labkit_modules()
    while names:
        silent = _silent_prefix(names)
        if silent < 0:  # an import hangs: the rest is left to the runs
            return
        for name in names[:silent]:
            importlib.import_module(name)
        names = names[silent + 1 :]  # the one after them failed or printed: left to the runs


def serve(notebook: bool = False) -> None:
    """The zygote's loop: one request line in, one fork, one reply line out. The replies
    go out on a copy of the zygote's stdout; its stdout itself is its stderr, so nothing
    the zygote prints can reach a reply."""
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(2, 1)

    import numpy  # noqa: F401 - imported once here, inherited by every child

    _preload(notebook)

    requests = sys.stdin
    root = os.getcwd()
    for line in requests:
        request = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            replies.flush()
            pid = os.fork()
            if pid == 0:
                os.chdir(root)
                if "cells" in request:
                    _notebook_child(request["cells"], request["cwd"], out.fileno(), err.fileno())
                _child(request["source"], request["args"], out.fileno(), err.fileno())
            _, status = os.waitpid(pid, 0)
            out.seek(0)
            err.seek(0)
            reply = {
                "stdout": out.read().decode("utf-8", "replace"),
                "stderr": err.read().decode("utf-8", "replace"),
                "returncode": os.waitstatus_to_exitcode(status),
            }
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    if "--notebook-once" in sys.argv[1:]:  # where the OS cannot fork: one notebook, here
        request = json.loads(sys.stdin.readline())
        _notebook_child(request["cells"], request["cwd"], os.dup(1), os.dup(2))
    serve(notebook="--notebook" in sys.argv[1:])
