"""`mkdocs serve` survives a reader's edit to a starter (issue 32, item 1).

Lab 17 asks the reader to edit ``rebuild_pipeline.py`` with the site served. A missing
``)`` used to fail the rebuild and leave every page hanging until the file was fixed. Now
(``infralens_docs.serving``) the page that runs the starter shows the error in a box, every
other page renders as before, requests are answered from the last good build while a
rebuild runs, and ``mkdocs build`` still fails on the same starter.

The served test runs in a copy of the repository (the real tree is never edited), with
the build caches of the session's strict build copied in, so only the edited starter runs
again.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from infralens_docs import directives, hooks, serving
from infralens_docs.registry import ROOT
from infralens_docs.runner import CACHE_ROOT, Run

pytestmark = pytest.mark.serve

STARTER = "code/lab-17-rebuild-the-pipeline/rebuild_pipeline.py"
LAB_PAGE = "labs/lab-17-rebuild-the-pipeline/"
OTHER_PAGE = "labs/lab-01-forward-noise-process/"
GOOD = "yours = load_solution() if args.solution else pipeline\n"
BROKEN = "yours = (load_solution() if args.solution else pipeline\n"  # the reader's missing )
BOX = 'class="admonition failure"'
#: the issue's budgets on this 2-core machine
HOME_S = 5
BOX_S = 60
WHOLE_S = 60
FIRST_BUILD_S = 600
#: what the copy leaves out: generated folders, and the caches (copied from CACHE_ROOT)
NOT_COPIED = {".git", ".venv", ".venv-latest", ".cache", "site", "offline", "node_modules"}


def _copy_repository(dest: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {"__pycache__", ".pytest_cache", ".ruff_cache"}
        return {n for n in names if n in skip or n.endswith(".tmp")} | (
            NOT_COPIED & set(names) if Path(folder) == ROOT else set()
        )

    def copy_if_there(src: str, dst: str) -> None:
        try:  # other test workers may be replacing a cache entry right now
            shutil.copy2(src, dst)
        except FileNotFoundError:
            pass

    shutil.copytree(ROOT, dest, ignore=ignore)
    if CACHE_ROOT.is_dir():
        shutil.copytree(CACHE_ROOT, dest / ".cache", ignore=ignore, copy_function=copy_if_there)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, timeout: float) -> tuple[float, str]:
    """Seconds to the whole response, and its body ('' if the request failed)."""
    start = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        body = ""
    return time.monotonic() - start, body


class Served:
    """``mkdocs serve`` on a free port in ``root``, its log in ``log``."""

    def __init__(self, root: Path, log: Path) -> None:
        self.url = f"http://127.0.0.1:{_free_port()}/"
        self.log = log
        env = dict(
            os.environ,
            # the copy's own tools and labkit, not this checkout's (installed in editable mode)
            PYTHONPATH=os.pathsep.join([str(root / "tools"), str(root / "code")]),
            NO_MKDOCS_2_WARNING="1",
            INFRALENS_CACHE_DIR=str(root / ".cache"),
            INFRALENS_REPO_URL="https://github.com/infralens/diffusion-handbook",
        )
        with log.open("w", encoding="utf-8") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mkdocs", "serve", "--dev-addr", self.url[7:-1]],
                cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # its kernels and zygotes stop with it
            )  # fmt: skip
        self.home_max = 0.0  # the slowest home page answer seen after the first build

    def page(self, path: str = "") -> str:
        return _get(self.url + path, timeout=30)[1]

    def home(self) -> None:
        seconds, body = _get(self.url, timeout=HOME_S + 5)
        assert body, f"the home page did not answer within {HOME_S + 5} s\n{self.tail()}"
        self.home_max = max(self.home_max, seconds)

    def wait(self, until, seconds: float, what: str) -> float:
        """Poll ``until(lab page)`` with the home page checked on every turn; return the
        seconds it took."""
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            assert self.proc.poll() is None, f"mkdocs serve exited\n{self.tail()}"
            self.home()
            if until(self.page(LAB_PAGE)):
                return time.monotonic() - start
            time.sleep(0.5)
        pytest.fail(f"{what}: not within {seconds} s\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # mkdocs shuts down and removes its folders
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever it left running
        except ProcessLookupError:
            pass
        self.proc.wait()


@pytest.mark.build
def test_a_broken_starter_shows_its_error_on_its_own_page_while_the_site_answers(
    built_site, tmp_path
):
    root = tmp_path / "repo"
    _copy_repository(root)
    starter = root / STARTER
    source = starter.read_text(encoding="utf-8")
    assert source.count(GOOD) == 1, f"{STARTER} no longer has the line this test breaks"
    served = Served(root, tmp_path / "serve.log")
    try:
        start = time.monotonic()
        while not served.page():
            assert time.monotonic() - start < FIRST_BUILD_S, served.tail()
            assert served.proc.poll() is None, f"mkdocs serve exited\n{served.tail()}"
            time.sleep(1)
        assert BOX not in served.page(LAB_PAGE)

        starter.write_text(source.replace(GOOD, BROKEN), encoding="utf-8")
        served.wait(lambda page: BOX in page, BOX_S, "the error box after the save")
        page = served.page(LAB_PAGE)
        line = source[: source.index(GOOD)].count("\n") + 1
        assert f"{STARTER}, line {line}" in page
        assert "was never closed" in page and "Fix the line and save" in page
        assert BOX in served.page(f"{STARTER[:-3]}/")  # the starter's own notebook page
        assert BOX not in served.page(OTHER_PAGE)  # every other page renders as before
        assert BOX not in served.page()

        starter.write_text(source, encoding="utf-8")
        served.wait(lambda page: page and BOX not in page, WHOLE_S, "the page whole after the fix")
        page = served.page(LAB_PAGE)
        assert "Output not shown" not in page and 'class="lab-figure"' in page
        assert served.home_max <= HOME_S, f"the home page took {served.home_max:.1f} s"
    finally:
        served.stop()


def _failing_run(starter, args=(), cache=True) -> Run:
    stderr = (
        "Traceback (most recent call last):\n"
        f'  File "{ROOT / STARTER}", line 437\n'
        "    yours = (load_solution() if args.solution else pipeline\n"
        "SyntaxError: '(' was never closed\n"
    )
    return Run(f"python3 {starter}", "", stderr, 1)


def test_a_failing_starter_fails_the_build_and_only_a_served_page_shows_it(monkeypatch):
    """Without ``serve`` the directive's error fails the build, as it always has; under
    ``serve`` the page gets the box under its title and a note where the output was."""
    monkeypatch.setattr(directives, "run_starter", _failing_run)
    page = types.SimpleNamespace(
        file=types.SimpleNamespace(src_uri="labs/lab-17-rebuild-the-pipeline.md"), meta={"lab": {}}
    )
    markdown = f"# Lab 17\n\nText.\n\n<!-- infralens:run {STARTER} --solution -->\n"
    monkeypatch.setattr(serving, "SERVING", False)
    with pytest.raises(hooks.PluginError, match="exited 1"):
        hooks.on_page_markdown(markdown, page, types.SimpleNamespace(), None)
    monkeypatch.setattr(serving, "SERVING", True)
    out = hooks.on_page_markdown(markdown, page, types.SimpleNamespace(), None)
    assert out.startswith('# Lab 17\n\n!!! failure "A starter this page runs fails"')
    assert f"`{STARTER}, line 437`**: `SyntaxError: '(' was never closed`" in out
    assert "Fix the line and save; the page rebuilds." in out
    assert "*Output not shown:" in out and "Text." in out


def test_a_failure_names_the_readers_frame_not_the_runners():
    zygote = ROOT / "tools" / "infralens_docs" / "zygote.py"
    stderr = (
        "Traceback (most recent call last):\n"
        f'  File "{zygote}", line 39, in _child\n'
        '    runpy.run_path(source, run_name="__main__")\n'
        f'  File "{ROOT / STARTER}", line 12, in <module>\n'
        "    main()\n"
        f'  File "{ROOT / "code" / "labkit" / "cli.py"}", line 3, in main\n'
        "    1 / 0\n"
        "ZeroDivisionError: division by zero\n"
    )
    failure = serving.describe(f"python3 {STARTER}", stderr, 1)
    assert (failure.file, failure.line) == ("code/labkit/cli.py", 3)
    assert failure.message == "ZeroDivisionError: division by zero"
    assert "zygote" not in failure.tail and str(ROOT) not in failure.tail
    one_line = serving.describe(f"python3 {STARTER} --steps 0", "x: error: --steps: 0\n", 2)
    assert (one_line.where, one_line.message) == (STARTER, "x: error: --steps: 0")
