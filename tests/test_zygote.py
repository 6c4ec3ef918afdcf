"""The build's starter runs (through a zygote) print what a fresh interpreter prints."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from infralens_docs.runner import Zygote, _execute

SCRIPT = textwrap.dedent(
    """
    import argparse, os, sys
    print("argv", sys.argv[1:], "path0", sys.path[0] == os.path.dirname(__file__))
    print("name", __name__, "cwd", os.getcwd() == os.environ.get("EXPECT_CWD", os.getcwd()))
    parser = argparse.ArgumentParser(prog="probe.py")
    parser.add_argument("--mode", choices=["ok", "exit3", "raise", "message"], default="ok")
    args = parser.parse_args()
    print("to stderr", file=sys.stderr)
    if args.mode == "exit3":
        sys.exit(3)
    if args.mode == "raise":
        raise ValueError("boom")
    if args.mode == "message":
        sys.exit("a message")
    """
)


@pytest.fixture(scope="module")
def zygote():
    z = Zygote()
    yield z
    z.close()


@pytest.mark.parametrize(
    "argv",
    [[], ["--mode", "exit3"], ["--mode", "raise"], ["--mode", "message"], ["--mode", "nope"]],
    ids=str,
)
def test_zygote_run_equals_a_fresh_run(tmp_path, zygote, argv):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT, encoding="utf-8")
    fresh, forked = _execute(script, argv), zygote.run(script, argv)
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    if "raise" in argv:  # the traceback's last line; frames differ (runpy is one of them)
        assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1]
    else:
        assert forked.stderr == fresh.stderr


def test_a_run_does_not_see_the_previous_runs_state(tmp_path, zygote):
    script = tmp_path / "state.py"
    script.write_text(
        "import labkit\nprint(getattr(labkit, 'touched', False))\nlabkit.touched = True\n"
    )
    assert zygote.run(script, []).stdout == zygote.run(script, []).stdout == "False\n"


def test_a_run_that_hangs_times_out_and_takes_its_zygote_down(tmp_path):
    import subprocess

    script = tmp_path / "hang.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    zygote = Zygote()
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run(script, [], timeout=1)
    assert zygote.proc.poll() is not None  # the zygote (and its child's group) is gone


#: A notebook's cells as a starter page holds them: prints to both streams, rich displays
#: (an SVG, a PNG), a cell's last value, one silenced with ";", and what a starter asks.
NOTEBOOK_CELLS = [
    "import sys\nprint('a')\nprint('c & <d>')",
    "print('b', file=sys.stderr)",  # (a kernel orders the two streams by its flushes)
    "from IPython.display import SVG, Image, display\n"
    'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="2" height="2">'
    '<rect width="1" height="1"/></svg>\'))\n'
    "print('between')\n"
    "display(Image(data=PNG))\n"
    "1 + 1",
    "x = 3\nx;",
    "import labkit.cli\nprint(labkit.cli.in_notebook(), __name__, '__file__' in globals())\n"
    "print(sys.argv[1:] == [] or sys.argv[1:][0] == '-f')",
    "",
    "[x, 'y']",
]


def _png() -> bytes:
    """A 1 x 1 PNG, built here (no image library)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(
        b"IDAT", zlib.compress(b"\x00\x7f")
    ) + chunk(b"IEND", b"")  # fmt: skip


def _notebook(cells: list[str]):
    import nbformat

    png = f"PNG = {_png()!r}\n"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(png)] + [nbformat.v4.new_code_cell(c) for c in cells]
    return nb


def _outputs(nb) -> list:
    """Each code cell's execution count and outputs, stream outputs merged as the pages do."""
    from infralens_docs.notebooks import merge_adjacent_streams

    return [
        (cell.execution_count, merge_adjacent_streams([dict(o) for o in cell.outputs]))
        for cell in nb.cells
    ]


def test_notebook_cells_run_as_in_a_jupyter_kernel(tmp_path):
    """The notebook pages' executor (``runner.execute_cells`` then ``notebooks.fill``) gives
    a notebook the outputs a real Jupyter kernel gives it through nbclient: streams, both
    kinds of display, a cell's last value (not after ";"), blank cells skipped, and what
    ``labkit.cli.in_notebook`` and a starter's ``__name__`` see."""
    import nbformat

    from infralens_docs import notebooks
    from infralens_docs.runner import close_zygotes, execute_cells
    from infralens_docs.runner import starter_env as env

    kernel_nb, ours = _notebook(NOTEBOOK_CELLS), _notebook(NOTEBOOK_CELLS)
    # the kernel in a process of its own, with the starters' environment: looking up
    # Jupyter's kernel imports ipykernel, and a test process that has it thinks every
    # starter it runs later is inside a notebook (labkit.cli.in_notebook)
    script = (
        "import sys, nbformat; from nbclient import NotebookClient\n"
        "nb = nbformat.reads(sys.stdin.read(), as_version=4)\n"
        f"NotebookClient(nb, kernel_name='python3', resources={{'metadata': {{'path': {str(tmp_path)!r}}}}}).execute()\n"
        "sys.stdout.write(nbformat.writes(nb))\n"
    )
    kernel = subprocess.run(
        [sys.executable, "-c", script], input=nbformat.writes(kernel_nb), env=env(),
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert kernel.returncode == 0, kernel.stderr
    kernel_nb = nbformat.reads(kernel.stdout, as_version=4)
    try:
        result = execute_cells(notebooks.code_cells(ours), str(tmp_path))
    finally:
        close_zygotes()
    assert result.returncode == 0, result.stderr
    import json

    notebooks.fill(ours, json.loads(result.stdout))
    assert _outputs(ours) == _outputs(kernel_nb)
    assert ours.metadata["language_info"] == kernel_nb.metadata["language_info"]


def test_a_notebook_cell_that_raises_stops_the_notebook(tmp_path):
    """A cell that raises stops the run there, as nbclient does with ``allow_errors``
    off: ``notebooks.fill`` raises nbclient's ``CellExecutionError`` naming the cell and
    the exception, and no later cell ran."""
    import json

    from nbclient.exceptions import CellExecutionError

    from infralens_docs import notebooks
    from infralens_docs.runner import close_zygotes, execute_cells

    nb = _notebook(["print('before')", "raise ValueError('boom')", "print('after')"])
    try:
        result = execute_cells(notebooks.code_cells(nb), str(tmp_path))
    finally:
        close_zygotes()
    with pytest.raises(CellExecutionError) as error:
        notebooks.fill(nb, json.loads(result.stdout))
    message = re.sub(r"\x1b\[[0-9;]*m", "", str(error.value))  # IPython colours its traceback
    assert "raise ValueError('boom')" in message and "ValueError: boom" in message
    assert [o["text"] for o in nb.cells[1].outputs] == ["before\n"]
    assert nb.cells[3].outputs == [] and nb.cells[3].execution_count is None


def test_a_build_runs_most_starters_several_times_not_every_one():
    """A build runs most starters several times (once per ``infralens:run`` block or
    figures run; a figures run also serves the plain run of its arguments): counted on the
    jobs a build hands ``runner.prefetch`` (every page's run and figure directives, and each
    notebook page's default figures run). Not every starter: an exercise's checker and
    blanks file (``page: false``) run in no build, or once, and lab 17's
    ``rebuild_diffusers.py`` (not runnable: its notebook page alone executes it) in none."""
    from mkdocs.structure.files import File, Files

    from infralens_docs import hooks
    from infralens_docs.registry import ROOT, load_labs

    docs = ROOT / "docs"
    pages = Files(
        [
            File(p.relative_to(docs).as_posix(), str(docs), "/tmp/site", True)
            for p in sorted(docs.rglob("*.md"))
        ]
    )
    labs = load_labs()
    jobs = hooks._runs_the_pages_need(pages)
    jobs += [(s.path.as_posix(), [], True) for lab in labs for s in lab.starters if s.runnable and s.notebook]  # fmt: skip
    runs: dict[str, set] = {}
    for starter, args, figures in jobs:
        runs.setdefault(starter, set()).add((tuple(args), figures))
    counts = {}
    for lab in labs:
        for s in lab.starters:
            if s.path.suffix == ".py":
                done = runs.get(s.path.as_posix(), set())
                figures = {args for args, f in done if f}
                counts[s.path.as_posix()] = len(figures | {a for a, f in done if not f})
    several = [name for name, n in counts.items() if n >= 2]
    assert len(several) > len(counts) / 2
    once_or_never = {name for name, n in counts.items() if n < 2}
    assert once_or_never and all(
        "check_" in name or "blanks" in name or "rebuild_diffusers" in name
        for name in once_or_never
    ), once_or_never


def test_a_run_cache_key_folds_in_the_code_that_runs_it(tmp_path, monkeypatch):
    """A cached run's key (``runner._key``) changes with the code that runs a starter: an
    edit to ``zygote.py`` (the process a build's run gets) from the next build on (within a
    build its digest is taken once, as labkit's), and the ``runner`` module this process
    loaded (the environment, ``starter_env``)."""
    from pathlib import Path

    from infralens_docs import runner

    starter = Path(runner.ROOT) / "code" / "lab-01-forward-noise-process" / "forward_noise.py"
    (tmp_path / "zygote.py").write_bytes(Path(runner.__file__).with_name("zygote.py").read_bytes())
    monkeypatch.setattr(runner, "__file__", str(tmp_path / "runner.py"))
    runner.begin_build()
    try:
        before = runner._key("c", starter)
        with (tmp_path / "zygote.py").open("a", encoding="utf-8") as f:
            f.write("# an edit\n")
        assert runner._key("c", starter) == before  # the same build: the digest it took
    finally:
        runner.close_zygotes()
    runner.begin_build()
    try:
        after = runner._key("c", starter)  # the next build
    finally:
        runner.close_zygotes()
    assert after != before
    monkeypatch.setattr(runner, "_THIS_MODULE", "another runner")
    assert runner._key("c", starter) not in (before, after)


def test_a_notebook_runs_the_same_without_fork(tmp_path, monkeypatch):
    """Where the OS cannot fork, ``python -m infralens_docs.zygote --notebook-once`` runs
    one notebook in its own interpreter: the same outputs as a notebook zygote's child."""
    import json
    import os

    from infralens_docs import runner

    cells = ["import labkit.cli\nprint(labkit.cli.in_notebook())", "x = 2\nx * 3", "print('é')"]
    zygote = runner.Zygote(notebook=True)
    try:
        forked = json.loads(zygote.run_cells(cells, str(tmp_path)).stdout)
    finally:
        zygote.close()
    commands, run = [], subprocess.run

    def spy(command, *args, **kwargs):
        commands.append(command)
        return run(command, *args, **kwargs)

    monkeypatch.delattr(os, "fork")  # the build's path on an OS without fork
    monkeypatch.setattr(runner.subprocess, "run", spy)
    once = runner.execute_cells(cells, tmp_path)
    assert commands == [[sys.executable, "-m", "infralens_docs.zygote", "--notebook-once"]]
    assert once.returncode == 0, once.stderr
    assert json.loads(once.stdout) == forked
    assert forked["outputs"][0] == [{"output_type": "stream", "name": "stdout", "text": "True\n"}]


def test_a_runs_key_follows_numpy_from_the_next_process_on(tmp_path, monkeypatch):
    """The starter outputs are cached on the NumPy version too, from the next process on:
    a run's key (``runner._key``) in a process that finds another NumPy installed differs,
    while one process (``mkdocs serve``, a build after another) keeps the version it read."""
    import os
    from pathlib import Path

    from infralens_docs import runner

    starter = Path(runner.ROOT) / "code" / "lab-01-forward-noise-process" / "forward_noise.py"
    fake = tmp_path / "numpy-99.0.dist-info"  # what an upgrade leaves: another version's metadata
    fake.mkdir()
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 99.0\n")
    script = (
        "from pathlib import Path; from infralens_docs import runner\n"
        f"print(runner._key('c', Path({str(starter)!r})))\n"
    )

    def key_in_a_new_process(*first: str) -> str:
        path = os.pathsep.join([*first, *filter(None, [os.environ.get("PYTHONPATH")])])
        env = {**os.environ, "PYTHONPATH": path}
        proc = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    runner.begin_build()
    try:
        before = runner._key("c", starter)
    finally:
        runner.close_zygotes()
    monkeypatch.syspath_prepend(str(tmp_path))  # the upgrade, seen by importlib.metadata
    runner.begin_build()
    try:
        assert runner._key("c", starter) == before  # the next build of this process
    finally:
        runner.close_zygotes()
    assert key_in_a_new_process() == before
    assert key_in_a_new_process(str(tmp_path)) != before


def test_labkit_modules_that_fail_or_print_on_import_are_left_to_the_runs(tmp_path, monkeypatch):
    """The zygote imports labkit's modules before it serves (zygote._preload), but not one
    whose import fails or writes anything (a reader's edit), nor one that imports such a
    module: a run that imports it fails, or prints what the import prints, as a fresh
    interpreter's does, and every run still gets its own reply."""
    package = tmp_path / "lib" / "labkit"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "good.py").write_text("VALUE = 1\n", encoding="utf-8")
    (package / "broken.py").write_text("def f(:\n", encoding="utf-8")
    (package / "noisy.py").write_text("print('imported noisy')\n", encoding="utf-8")
    (package / "uses_noisy.py").write_text("from labkit import noisy\n", encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "lib"))  # before the installed labkit
    scripts = {
        "preloaded": "import sys\nprint(sorted(m for m in sys.modules if m.startswith('labkit')))\n",
        "broken": "import labkit.broken\n",
        "noisy": "import labkit.uses_noisy\nprint('after')\n",
        "good": "import labkit.good\nprint(labkit.good.VALUE)\n",
    }
    for name, text in scripts.items():
        (tmp_path / f"{name}.py").write_text(text, encoding="utf-8")
    z = Zygote()
    try:
        forked = {name: z.run(tmp_path / f"{name}.py", []) for name in scripts}
    finally:
        z.close()
    fresh = {name: _execute(tmp_path / f"{name}.py", []) for name in scripts}
    # the silent modules were imported before the run began; a fresh interpreter has none
    assert forked["preloaded"].stdout == "['labkit', 'labkit.good']\n"
    assert fresh["preloaded"].stdout == "[]\n"
    for name in ("noisy", "good"):
        assert (forked[name].returncode, forked[name].stdout, forked[name].stderr) == (
            fresh[name].returncode, fresh[name].stdout, fresh[name].stderr
        ), name  # fmt: skip
    assert forked["noisy"].stdout == "imported noisy\nafter\n"
    assert forked["broken"].returncode == fresh["broken"].returncode == 1
    assert forked["broken"].stderr.splitlines()[-1] == fresh["broken"].stderr.splitlines()[-1]
    assert "SyntaxError" in fresh["broken"].stderr.splitlines()[-1]


def test_a_labkit_import_that_hangs_does_not_hold_the_zygote(tmp_path, monkeypatch):
    """When the check of labkit's modules outlasts zygote.CHECK_TIMEOUT_S (a reader's edit
    made an import hang), the zygote preloads no more of them and serves: a run that does
    not import the hanging module prints what a fresh interpreter prints, at once."""
    import time

    package = tmp_path / "lib" / "labkit"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "good.py").write_text("VALUE = 1\n", encoding="utf-8")
    (package / "hangs.py").write_text("import time\ntime.sleep(60)\n", encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "lib"))
    monkeypatch.setenv("INFRALENS_PRELOAD_CHECK_TIMEOUT", "0.5")
    script = tmp_path / "good_user.py"
    script.write_text("import labkit.good\nprint(labkit.good.VALUE)\n", encoding="utf-8")
    start = time.monotonic()
    z = Zygote()
    try:
        forked = z.run(script, [], timeout=10)
    finally:
        z.close()
    assert time.monotonic() - start < 10
    fresh = _execute(script, [])
    assert (forked.returncode, forked.stdout, forked.stderr) == (0, "1\n", fresh.stderr)
