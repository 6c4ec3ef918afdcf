"""Run starters for the build without paying for a new interpreter each time.

A build runs every starter several times (once per ``infralens:run`` block, once for
its figures). Most of each run was interpreter start-up and ``import numpy``. A
zygote is one interpreter started exactly like a reader's run (``starter_env``:
same hash seed, one BLAS thread, labkit importable) that imports numpy and labkit
once and then forks one child per run. The child resets what a fresh interpreter
would have (argv, cwd, stdout and stderr as pipes to files) and runs the starter
as ``__main__``; the zygote itself never runs a starter, so no run sees another's
state.

Only the build uses it. ``run_starter(..., cache=False)``, which the tests use to
check what the pages show, still starts a fresh interpreter per run, so the pages'
outputs are compared against a reader's real terminal run.

Protocol (one JSON object per line): the parent sends ``{"source", "args"}`` on the
zygote's stdin and reads ``{"stdout", "stderr", "returncode"}`` from its stdout.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
import traceback


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


def serve() -> None:
    """The zygote's loop: one request line in, one fork, one reply line out."""
    import numpy  # noqa: F401 - imported once here, inherited by every child

    import labkit  # noqa: F401

    requests, replies = sys.stdin, sys.stdout
    root = os.getcwd()
    for line in requests:
        request = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            replies.flush()
            pid = os.fork()
            if pid == 0:
                os.chdir(root)
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
    serve()
