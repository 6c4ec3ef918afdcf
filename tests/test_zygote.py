"""The build's starter runs (through a zygote) print what a fresh interpreter prints."""

from __future__ import annotations

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
