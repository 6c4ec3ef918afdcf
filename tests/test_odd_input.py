"""Every starter keeps its promise on input a learner would type: a bad flag value gets one
line, ``<prog>: error: <message>``, and exit code 2, never a traceback, a hang or a run that
eats the machine. Each flag the starter's ``--help`` lists is given a corpus of odd values
(empty, not a number, negative, zero, huge, overflowing, NaN, infinite, a stray comma, an
unwritable figures folder), plus an unknown flag and a stray positional argument. A value the
starter accepts must then run to the end (exit 0) within the time limit."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from infralens_docs.registry import ROOT, load_labs

STARTERS = [s.path for lab in load_labs() for s in lab.starters if s.runnable]

#: Values tried on every flag that takes one (a choice flag gets its own wrong choice too):
#: the odd ones, and the smallest counts, where integer division and empty ranges bite.
ODD_VALUES = [
    "",
    "x",
    "-1",
    "0",
    "1",
    "2",
    "3",
    "0.5",
    "1e309",
    "nan",
    "-inf",
    "99999999999",
    ",",
    "1,,x",
]

#: Tried on a flag about steps too: a step count at the edge of the 1000 training timesteps,
#: where leading spacing with ``steps_offset=1`` reaches ``t = 1000`` (lab 04's and lab 20's
#: ``--steps 1000``, and labs 11 and 12's, raised an IndexError from ``alphas_cumprod[1000]``).
STEP_EDGE = ["1000", "1001"]  # 999 too ran clean on every starter (2026-11-29) at a full run each

#: Seconds a single run may take before it counts as a hang (the starters need well under
#: 1 s on a quiet machine; the limit leaves room for a loaded one).
LIMIT = 60

#: Runs each case in one process (runpy, argv set per case), so the corpus costs one NumPy
#: import per starter. A case whose arguments parse to ones already run in full stops after
#: parsing (labkit.cli.parse_args, the starters' shared parser entry, is wrapped to see
#: them). Reports exit code, stderr and any traceback or hang per case.
DRIVER = r"""
import contextlib, io, json, os, runpy, signal, sys, traceback
sys.path.insert(0, os.path.join(os.getcwd(), "code"))
import labkit.cli
starter, cases, limit = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
class Hang(BaseException):
    pass
class Seen(BaseException):
    pass
def alarm(*_):
    raise Hang()
signal.signal(signal.SIGALRM, alarm)
parse_args, seen = labkit.cli.parse_args, set()
def parse_once(*args, **kwargs):
    parsed = parse_args(*args, **kwargs)
    key = repr(sorted((k, v) for k, v in vars(parsed).items() if k != "figures"))
    if key in seen:
        raise Seen()
    seen.add(key)
    return parsed
labkit.cli.parse_args = parse_once
results = []
for argv in cases:
    err, out, code, trace = io.StringIO(), io.StringIO(), 0, ""
    signal.alarm(limit)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            sys.argv = [starter, *argv]
            runpy.run_path(starter, run_name="__main__")
    except Seen:
        pass
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if isinstance(stop.code, str):
            err.write(stop.code + "\n")
    except Hang:
        code, trace = "hang", f"still running after {limit} s"
    except BaseException:
        code, trace = "traceback", traceback.format_exc()
    finally:
        signal.alarm(0)
    results.append({"argv": argv, "code": code, "stderr": err.getvalue(), "trace": trace})
print(json.dumps(results))
"""


def flags(starter) -> list[tuple[str, list[str] | None]]:
    """(flag, its choices, or [] for a value, or None for a switch) from ``--help``."""
    text = subprocess.run(
        [sys.executable, starter, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    ).stdout
    found = {}
    for flag, rest in re.findall(r"^\s+(--[a-z][\w-]*)(.*)$", text, re.MULTILINE):
        choices = re.match(r"\s*\{([^}]*)\}", rest)
        takes = re.match(r"\s+[A-Z_]+|\s*\{", rest)
        found[flag] = choices.group(1).split(",") if choices else ([] if takes else None)
    return sorted(found.items())


def corpus(starter, tmp_path) -> list[list[str]]:
    cases = [["--no-such-flag"], ["stray"]]
    for flag, choices in flags(starter):
        if flag == "--help":
            continue
        if choices is None:
            continue  # a switch: its runs are the pages' own
        if flag == "--figures":
            blocker = tmp_path / "a-file"
            blocker.write_text("")
            cases += [[flag, ""], [flag, str(blocker / "sub")]]
            continue
        cases += [[flag, value] for value in ODD_VALUES]
        if "step" in flag:  # a step count at the training grid's edge (1000 timesteps)
            cases += [[flag, value] for value in STEP_EDGE]
        if choices:
            cases.append([flag, "no-such-choice"])
    return cases


@pytest.mark.parametrize("starter", STARTERS, ids=lambda p: p.name)
def test_odd_input_gets_one_line_and_exit_2(starter, tmp_path):
    cases = corpus(starter, tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", DRIVER, str(starter), json.dumps(cases), str(LIMIT)],
        cwd=ROOT, capture_output=True, text=True, timeout=LIMIT * len(cases) + 60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    broken = []
    for result in json.loads(run.stdout.splitlines()[-1]):
        argv, code, err = result["argv"], result["code"], result["stderr"].strip()
        if code in ("traceback", "hang"):
            broken.append(f"{argv}: {code}: {result['trace'].strip().splitlines()[-1]}")
        elif code == 2:
            lines = err.splitlines()
            if len(lines) != 1 or ": error: " not in lines[0]:
                broken.append(f"{argv}: exit 2 without a one-line error: {err[:300]!r}")
        elif code != 0:
            broken.append(f"{argv}: exit {code}: {err[-300:]!r}")
    assert broken == [], (
        f"{len(broken)} of {len(cases)} odd inputs broke the promise:\n" + "\n".join(broken)
    )


BLANKS = [s.path for lab in load_labs() for s in lab.starters if s.path.name.endswith("_blanks.py")]


@pytest.mark.parametrize("blanks", BLANKS, ids=lambda p: p.name)
def test_a_blanks_file_run_directly_names_its_checker(blanks):
    """A reader who runs the file of blanks instead of its checker gets one line naming the
    checker's command, and exit 2, not the traceback of a missing import or an unfilled blank."""
    run = subprocess.run(
        [sys.executable, str(blanks)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    checker = re.search(r"python3 (code/\S+/check_\w+\.py)", run.stderr)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr
    assert checker and (ROOT / checker.group(1)).is_file(), run.stderr
    assert checker.group(1).split("/")[1] == blanks.parent.name
