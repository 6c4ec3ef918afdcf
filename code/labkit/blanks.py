"""Blanks for the reader to fill in, and a checker that compares them with a solution.

Labs 03, 13, 16, 17, 19 and 20 leave blanks in a function of a file the reader edits, beside a
checker script and the solution (``X_solution.txt``, no page of the site):

- :func:`blank` raises :class:`UnfilledBlankError`, which knows its number and the line that called
  it, so an unfilled file says which blank is next instead of failing with a traceback;
- :func:`load_function` reads one function from another file (that file's imports and the
  ``def``; nothing else in it runs), optionally with one piece of its text replaced, so the
  checker can run the solution beside the reader's version, or a copy with a known mistake;
- :func:`load_constant` reads one top-level constant (a literal: numbers, strings, tuples,
  dicts) from another file without running it, such as the solution's table of mistakes;
- :func:`error_site` finds, for an exception raised inside a function, the line of that
  function that raised it, the blank whose comment heads that line's paragraph
  (:func:`blank_at`), and the function's variables there; :func:`innermost_line` finds the
  deepest line of the reader's file, so an error raised in a helper of theirs names it too;
  :func:`handed_on` finds, for an error raised on a value of another type than the blanks
  hand on (lab 17: a SchedulerOutput where an array goes), the line that assigned it;
- :func:`check_function` runs the reader's function and the solution's on a list of cases
  (:func:`run_traced` records each one's variables), compares what each blank assigns,
  blank by blank and pass by pass, and names the first that differs, with the hint of the
  solution's typical mistake that gives the same value (:func:`how_it_differs` when none
  does); :func:`exercise` and :func:`finish` are a checker script's start and end.

NumPy is the only dependency, as for the rest of labkit.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import inspect
import io
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FunctionType
from typing import Any, NoReturn

import numpy as np


class UnfilledBlankError(Exception):
    """Blank ``number`` is still a placeholder; ``filename`` and ``line`` say where."""

    def __init__(self, number: int, filename: str, line: int) -> None:
        super().__init__(f"blank {number} is not filled in yet ({Path(filename).name}:{line})")
        self.number, self.filename, self.line = number, filename, line


def blank(number: int) -> NoReturn:
    """The placeholder of blank ``number``: replace the call with your code."""
    caller = sys._getframe(1)  # the line that holds the blank
    raise UnfilledBlankError(number, caller.f_code.co_filename, caller.f_lineno)


def load_function(path: str | Path, name: str, edit: tuple[str, str] | None = None) -> Callable:
    """Function ``name`` of the Python file ``path``, defined by running only that file's
    top-level imports and its ``def name``: the file's script part does not run.

    ``edit = (old, new)`` first replaces the text ``old``, which must occur exactly once in
    the function, by ``new``: a copy of the function with one planted change. Line numbers
    stay the file's, so a traceback points at the right line.
    """
    path = Path(path)
    source = path.read_text(encoding="utf-8")
    defs = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(defs) != 1:
        raise ValueError(f"{path.name} defines {len(defs)} top-level functions {name!r}, not one")
    if edit is not None:
        old, new = edit
        lines = source.splitlines(keepends=True)
        first, last = defs[0].lineno - 1, defs[0].end_lineno  # the def's lines, 0-based
        body = "".join(lines[first:last])
        if body.count(old) != 1:
            raise ValueError(f"{old!r} occurs {body.count(old)} times in {name}(), not once")
        source = "".join([*lines[:first], body.replace(old, new), *lines[last:]])
    tree = ast.parse(source, filename=str(path))
    keep = [
        node
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        or (isinstance(node, ast.FunctionDef) and node.name == name)
    ]
    namespace: dict[str, Any] = {"__name__": f"labkit.blanks.loaded.{path.stem}"}
    exec(compile(ast.Module(keep, type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def load_constant(path: str | Path, name: str) -> Any:
    """The value of ``name = <literal>`` at the top level of the Python file ``path``, read
    with :func:`ast.literal_eval`: nothing in the file runs."""
    path = Path(path)
    values = [
        node.value
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == name for target in node.targets)
    ]
    if len(values) != 1:
        raise ValueError(f"{path.name} assigns {name!r} {len(values)} times at the top level, not once")  # fmt: skip
    return ast.literal_eval(values[0])


def error_site(error: BaseException, fn: FunctionType) -> tuple[int | None, int | None, dict]:
    """Where ``error`` left ``fn``: (the innermost line of ``fn`` in its traceback, the blank
    whose ``# BLANK n`` comment heads that line's paragraph (no empty line between them) or
    None, ``fn``'s variables there). ``(None, None, {})`` if ``fn`` is not in the traceback."""
    line, variables, tb = None, {}, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is fn.__code__:
            line, variables = tb.tb_lineno, dict(tb.tb_frame.f_locals)
        tb = tb.tb_next
    if line is None:
        return None, None, {}
    return line, blank_at(fn, line), variables


def source_line(fn: FunctionType, line: int | None) -> str:
    """The text of line ``line`` of ``fn``'s file, stripped ("" for no line)."""
    import linecache

    return linecache.getline(fn.__code__.co_filename, line).strip() if line else ""


def blank_at(fn: FunctionType, line: int | None) -> int | None:
    """The blank whose ``# BLANK n`` comment heads the paragraph (no empty line between
    them) that holds line ``line`` of ``fn``'s file, or None."""
    number = None
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    if line is None or not first <= line < first + len(lines):
        return None
    for text in lines[: line - first + 1]:
        if not text.strip():  # an empty line ends a blank's paragraph
            number = None
        elif text.strip().startswith("# BLANK ") and text.split("# BLANK ")[1][:1].isdigit():
            number = int(text.split("# BLANK ")[1][0])
    return number


def innermost_line(error: BaseException, filename: str) -> tuple[str, int] | None:
    """(function name, line) of the deepest frame of ``error``'s traceback in ``filename``:
    where the reader's own code raised, even inside a helper they wrote. None if no frame
    of the traceback is in that file."""
    found, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            found = tb.tb_frame.f_code.co_name, tb.tb_lineno
        tb = tb.tb_next
    return found


def handed_on(
    error: BaseException, fn: FunctionType, *args: Any, wanted: type = np.ndarray
) -> tuple[str, int, Any] | None:
    """For ``error``, raised by ``fn(*args)``: (variable, line, its value) when the statement
    of ``fn`` that raised reads a variable that a blank's lines assign and that holds no
    ``wanted`` (lab 17: a SchedulerOutput where every blank hands on an array), ``line`` being
    the line of ``fn`` that last assigned it before the error, which may sit in an earlier
    blank than the one that raised: the line that made the mistake. Found by calling
    ``fn(*args)`` again under :func:`run_traced` (give it fresh arguments: a scheduler changes
    as it runs). None when no such variable is read, or the second call raises otherwise."""
    at, _, variables = error_site(error, fn)
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    if at is None:
        return None
    tree = ast.parse("".join(lines))
    span = lambda n: (first + n.lineno - 1, first + n.end_lineno - 1)  # noqa: E731
    covering = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and span(n)[0] <= at <= span(n)[1]]  # fmt: skip
    if not covering:
        return None
    statement = min(covering, key=lambda n: span(n)[1] - span(n)[0])
    # a compound statement (for, if, with) raised in its header: only the header reads
    roots = [getattr(statement, f) for f in ("iter", "test", "items") if hasattr(statement, f)] if hasattr(statement, "body") else [statement]  # fmt: skip
    read = [n.id for r in roots for m in (r if isinstance(r, list) else [r]) for n in ast.walk(m) if isinstance(n, ast.Name)]  # fmt: skip
    blanks_assign = {v for names in blank_assignments(fn).values() for v in names}
    odd = [v for v in dict.fromkeys(read) if v in blanks_assign and v in variables and not isinstance(variables[v], wanted)]  # fmt: skip
    if not odd:
        return None
    run = run_traced(fn, *args)
    if type(run.error) is not type(error):
        return None
    end = len(run.lines)  # the lines before the raising statement's last run
    while end and span(statement)[0] <= run.lines[end - 1] <= span(statement)[1]:
        end -= 1
    for variable in odd:
        assigns = {}  # each line of a statement that assigns variable -> the statement's first line
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(n, ast.Name) and n.id == variable for t in targets for n in ast.walk(t)):  # fmt: skip
                    assigns |= dict.fromkeys(range(span(node)[0], span(node)[1] + 1), span(node)[0])  # fmt: skip
        ran = [assigns[x] for x in run.lines[:end] if x in assigns]
        if ran:
            return variable, ran[-1], variables[variable]
    return None


# --------------------------------------------------------------------------- function blanks
# Labs 03, 13, 16, 19 and 20 leave blanks in one small function (lab 20's get_timesteps) that
# the reader edits in its own file; a checker script beside it runs that function and the
# solution's on the same cases and compares the variables each blank assigns, blank by blank.


@dataclass
class Traced:
    """One call of a function: its result or error, its local variables when it returned or
    raised, and the lines it ran."""

    result: Any = None
    error: BaseException | None = None
    variables: dict[str, Any] = field(default_factory=dict)
    lines: list[int] = field(default_factory=list)
    #: (blank, its variables) each time the run left a blank's lines without an error, in
    #: order: a blank inside a loop (lab 16's key/value blocks) is compared pass by pass
    passes: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    #: for each pass, how many of ``lines`` had run when it was recorded (the lines between two
    #: passes are ``lines[marks[i]:marks[j]]``)
    marks: list[int] = field(default_factory=list)


def _snapshot(variables: dict[str, Any]) -> dict[str, Any]:
    """``variables`` with their arrays copied (a later ``acc *= ...`` must not change them)."""
    return {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in variables.items()}


def run_traced(fn: FunctionType, *args: Any) -> Traced:
    """Call ``fn(*args)`` and record (:class:`Traced`) what it returned or raised, its local
    variables at that moment and the lines it ran; a tracer set before (a debugger's) still
    gets every event."""
    traced, previous = Traced(), sys.gettrace()
    try:
        source, first = inspect.getsourcelines(fn)
        heads, number = {}, None  # blank_at of every line, in one pass over the source
        for k, text in enumerate(source):
            if not text.strip():  # an empty line ends a blank's paragraph
                number = None
            elif text.strip().startswith("# BLANK ") and text.split("# BLANK ")[1][:1].isdigit():
                number = int(text.split("# BLANK ")[1][0])
            heads[first + k] = number
    except (OSError, TypeError):
        heads = {}

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        local = previous(frame, event, arg) if previous is not None else None
        if frame.f_code is not fn.__code__:
            return local
        inside, raised = None, False  # the blank whose lines run; an exception since

        def on_line(frame: Any, event: str, arg: Any) -> Any:
            nonlocal local, inside, raised
            if event == "line":
                traced.lines.append(frame.f_lineno)
                number = heads.get(frame.f_lineno)
                if inside is not None and number != inside and not raised:
                    traced.passes.append((inside, _snapshot(frame.f_locals)))
                    traced.marks.append(len(traced.lines) - 1)  # this line has not run yet
                inside, raised = number, False
            elif event == "exception":
                raised = True
            elif event == "return":  # also after an exception left the frame
                if inside is not None and not raised:
                    traced.passes.append((inside, _snapshot(frame.f_locals)))
                    traced.marks.append(len(traced.lines))
                traced.variables = dict(frame.f_locals)
            if local is not None:
                local = local(frame, event, arg)
            return on_line

        return on_line

    sys.settrace(on_call)
    try:
        traced.result = fn(*args)
    except BaseException as error:  # the reader's error, Ctrl-C, even a raise GeneratorExit
        traced.error = error  # on a loop that does not end, or exit(): one line from the checker
    finally:
        sys.settrace(previous)
    return traced


def blank_assignments(fn: FunctionType) -> dict[int, dict[str, int]]:
    """Blank number -> {variable: the last line that assigns it} for every assignment in a blank's
    paragraph of ``fn`` (the blank's lines: :func:`blank_at`)."""
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return {}
    found: dict[int, dict[str, int]] = {}
    for node in ast.walk(ast.parse("".join(lines))):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            line = first + node.lineno - 1
            number = blank_at(fn, line)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            for name in names if number else ():  # the last line that assigns it
                lines_of = found.setdefault(number, {})
                lines_of[name] = max(line, lines_of.get(name, line))
    return dict(sorted(found.items()))


def blank_calls(fn: FunctionType) -> dict[int, int]:
    """Blank number -> the line of each ``blank(n)`` call left in ``fn``: the blanks still to
    fill, whether or not a run reaches them (an earlier blank's placeholder raises first)."""
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return {}
    found: dict[int, int] = {}
    for node in ast.walk(ast.parse("".join(lines))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "blank"
            and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, int)
        ):
            found.setdefault(node.args[0].value, first + node.lineno - 1)
    return dict(sorted(found.items()))


def kind(value: Any) -> str:
    """What sort of value: ``an integer`` (int or a NumPy integer), ``a float``, ``an array``,
    or the type's name."""
    if isinstance(value, bool | np.bool_):
        return "a bool"
    if isinstance(value, int | np.integer):
        return "an integer"
    if isinstance(value, float | np.floating):
        return "a float"
    if isinstance(value, np.ndarray):
        return "an array"
    return f"a {type(value).__name__}"


def show(value: Any) -> str:
    """A value in one line: an array's values, dtype and length, or the value itself."""
    if isinstance(value, tuple):
        return f"({', '.join(map(show, value))})"
    if isinstance(value, np.ndarray) and value.ndim > 1:  # its entries: "first difference"
        return f"{value.dtype} array of shape {value.shape}"
    if isinstance(value, np.ndarray):
        text = np.array2string(value, threshold=12, edgeitems=4, max_line_width=10**6)
        return f"{' '.join(text.split())} ({value.dtype}, {value.size} entries)"
    if isinstance(value, np.floating):  # a float32 entry: its digits, not float64's repr
        return f"{float(value):.7g}"
    text = " ".join(repr(value.item() if isinstance(value, np.generic) else value).split())
    return text if len(text) <= 120 else f"{text[:100]} ... ({len(text)} characters)"


#: floats match to float32 rounding: a correct line may sum or multiply in another order
FLOAT_RTOL, FLOAT_ATOL = 1e-5, 1e-6
#: ... and within FLOAT_SCALE of the reference's largest finite entry (at least
#: FLOAT_FLOOR): lab 16's correct lines land within 3e-7 of it, and a line off by a factor
#: of 1 + 1e-5 (84 float32 steps) is a mistake, not rounding
FLOAT_SCALE, FLOAT_FLOOR = 1e-6, 1e-9


def close(a: Any, b: Any) -> Any:
    """Entrywise: equal, or both floats within float32 rounding (nan matches nothing) and
    within FLOAT_SCALE of ``b``'s largest finite entry."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        finite = np.abs(b[np.isfinite(b)])  # a 0-d b too: one entry or none
        bound = max(FLOAT_SCALE * float(finite.max()) if finite.size else 0.0, FLOAT_FLOOR)
        with np.errstate(invalid="ignore", over="ignore"):
            # complex values are compared as complex: a cast to float64 would warn and drop them
            wide = np.complex128 if "c" in (a.dtype.kind, b.dtype.kind) else np.float64
            near = np.abs(a.astype(wide) - b.astype(wide)) <= bound
        return np.isclose(a, b, rtol=FLOAT_RTOL, atol=FLOAT_ATOL) & (near | (a == b))
    return a == b


def equal(a: Any, b: Any) -> bool:
    """Same kind, and for arrays the same dtype (int32 is not int64), shape and values
    (floats to float32 rounding: :func:`close`)."""
    if kind(a) != kind(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.all(close(a, b)))
    if isinstance(a, tuple):
        return len(a) == len(b) and all(map(equal, a, b))
    return bool(np.all(close(a, b))) if kind(a) == "a float" else bool(a == b)


#: how_it_differs' advice for integer entries 1 off, by the way they are off: all of yours
#: below the solution's, all above, or both ways; check_function drops it when the blank's
#: lines already round (round, .round, np.rint, np.around)
ROUNDING_HINTS = {
    "below": ": yours rounds down where the solution rounds (int() and .astype cut toward 0: np.round first, then cast)",
    "above": ": yours rounds up where the solution does not (np.ceil or + 0.5, where it has int(), .astype or np.round)",
    "both": ": rounding (round before .astype; int() floors)",
}  # fmt: skip
ROUNDING_HINT = ROUNDING_HINTS["both"]


def _rounds(fn: FunctionType, number: int) -> bool:
    """Whether a line of blank ``number`` in ``fn`` calls a rounding function (its code, not
    the blank's comment)."""
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return False
    text = "".join(x.split("#")[0] for k, x in enumerate(lines) if blank_at(fn, first + k) == number)  # fmt: skip
    return any(word in text for word in ("round(", "rint(", "around("))


def how_it_differs(yours: Any, theirs: Any) -> str:
    """A hint at how two values of the same kind differ: a dtype (the values the same, or
    once rounded, or once cut toward 0), a length (one entry more or fewer, at which end),
    the order, a constant offset (its sign), a constant ratio, or entries off by one
    (rounding: yours below the solution's, above, or both ways)."""
    if not isinstance(theirs, np.ndarray):
        gap = yours - theirs
        return f"yours is {'+' if gap > 0 else ''}{show(gap)} off" if kind(gap) == "an integer" else ""  # fmt: skip
    if yours.dtype != theirs.dtype:
        said = f"the dtype: yours is {yours.dtype}, the solution's {theirs.dtype}"
        if theirs.dtype.kind not in "iu":
            return said
        cast = f".astype(np.{theirs.dtype})"  # which: int32 for int64, a float left unrounded
        if yours.shape == theirs.shape and yours.dtype.kind in "iuf":
            with np.errstate(invalid="ignore"):
                rounded = yours.dtype.kind == "f" and np.array_equal(np.round(yours), theirs)
                cut = yours.dtype.kind == "f" and np.array_equal(np.trunc(yours), theirs)
                if np.array_equal(yours, theirs) and yours.dtype.kind in "iu":
                    return f"{said}, the values the same: cast with {cast}"
                if rounded and cut:  # whole numbers here: a case with fractions tells which
                    return f"{said}, the values the same here: {cast} casts them, cutting toward 0 (round first where the solution rounds)"  # fmt: skip
                if rounded:
                    return f"{said}, the values the solution's once rounded: np.round, then {cast}"  # fmt: skip
                if cut:
                    return f"{said}, the values the solution's once cut toward 0: {cast} alone, without rounding"  # fmt: skip
        return f"{said} (cast with .astype, after rounding)"
    if yours.shape != theirs.shape and max(yours.ndim, theirs.ndim) > 1:
        return f"the shape: yours is {yours.shape}, the solution's {theirs.shape}"
    if yours.shape != theirs.shape:
        said = f"the length: yours has {yours.size} entries, the solution's {theirs.size}"
        if yours.size == theirs.size + 1:  # which end: a slice or a range off by one
            if np.array_equal(yours[1:], theirs):
                return f"{said}: one more, at the start (a slice or range off by one)"
            if np.array_equal(yours[:-1], theirs):
                return f"{said}: one more, at the end (a slice or range off by one)"
        if yours.size + 1 == theirs.size:
            if np.array_equal(yours, theirs[1:]):
                return f"{said}: the solution's first entry missing (a slice or range off by one)"  # fmt: skip
            if np.array_equal(yours, theirs[:-1]):
                return f"{said}: the solution's last entry missing (a slice or range off by one)"  # fmt: skip
        return said
    if yours.dtype.kind != "i":  # the hints below are for integer grids (timesteps)
        return ""
    if np.array_equal(yours[::-1], theirs):
        return "the order: yours runs the other way (timesteps run high to low)"
    gap = yours.astype(np.float64) - theirs
    if gap.size == 1:  # one entry: an offset, a rounding or another grid look alike
        return ""
    if np.all(gap == gap.flat[0]):
        return f"every entry is {gap.flat[0]:+g} off: a missing or extra term (an offset, or an off-by-one)"  # fmt: skip
    if np.abs(gap).max() <= 1:  # which way: below, above, or both
        count = f"{np.count_nonzero(gap)} of {gap.size} entries are 1"
        if np.all(gap <= 0):
            return f"{count} below the solution's{ROUNDING_HINTS['below']}"
        if np.all(gap >= 0):
            return f"{count} above the solution's{ROUNDING_HINTS['above']}"
        return f"{count} off{ROUNDING_HINT}"
    nonzero = theirs != 0
    if nonzero.any() and np.all(yours[~nonzero] == 0):
        ratio = yours[nonzero] / theirs[nonzero]
        if np.allclose(ratio, ratio[0]):
            return f"yours is {ratio[0]:.4g} x the solution's everywhere: a ratio"
    return ""


def exercise(doc: str, prog: str, folder: str, checker: str | None, blanks_file: str,
             solution_file: str) -> tuple[Any, Path, Path]:  # fmt: skip
    """A checker script's start (labs 03, 13, 16, 19, 20): its command line, ``--solution``
    included, read with labkit.cli's one-line errors, and the files beside it. ``checker`` is
    the script's ``__file__`` (None in a notebook: the folder is then code/``folder``, found
    from labkit). Returns (parser, the file to check: the reader's, or the solution under
    ``--solution``, the solution)."""
    from labkit.cli import LabArgumentParser, parse_args

    parser = LabArgumentParser(prog=prog, description=doc.splitlines()[0])
    parser.add_argument(
        "--solution", action="store_true", help="check the solution's lines in place of yours"
    )
    args = parse_args(parser)
    here = (
        Path(checker).resolve().parent if checker else Path(__file__).resolve().parents[1] / folder
    )
    solution = here / solution_file
    return parser, (solution if args.solution else here / blanks_file), solution


def with_warnings(fn: Callable, *args: Any) -> tuple[Any, list[str]]:
    """(``fn(*args)``, the messages of the warnings it raised, each once, in order): a checker
    says them in its own words (lab 17: labkit's Euler warns when a planted mistake or yours
    calls step before any scale_model_input)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args)
    return result, list(dict.fromkeys(str(w.message) for w in caught))


def warnings_of_runs(fn: Callable, cases: list[tuple]) -> list[str]:
    """The warnings ``fn`` raised on each case's arguments (deep copies: a scheduler or a
    generator changes as it runs), each once, in order, its prints silenced (they were shown
    once); the runs stop at the first exception, as a check's do (lab 17: the warnings of
    the reader's own runs, not of the planted mistakes the check also runs)."""
    said: list[str] = []
    for args in cases:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                said += with_warnings(fn, *copy.deepcopy(args))[1]
        except Exception:  # a blank still to fill: the runs stop there
            break
    return list(dict.fromkeys(said))


def finish(parser: Any, verdict: Any) -> None:
    """Print a checker's verdict and exit with its code: 2 as one line through the parser's
    ``error`` (``prog: error: ...``), 1 after the report, 0 (no exit) when all matches."""
    if verdict.code == 2:
        parser.error(verdict.report)  # one line, exit 2
    print(verdict.report)
    if verdict.code:
        sys.exit(verdict.code)


def _planted(solution: str | Path, name: str, edit: tuple[str, str]) -> FunctionType | None:
    """The solution's function with ``edit`` planted, or None if its text is not there once."""
    try:
        return load_function(solution, name, edit)
    except ValueError:
        return None


def _top_level_names(path: Path) -> set[str]:
    """The names the file ``path`` defines at its top level (def, class, assignment)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _alike(a: Any, b: Any) -> bool:
    """:func:`equal`, and True where the two cannot be compared (objects without ==)."""
    try:
        return equal(a, b)
    except Exception:
        return True


def _small_difference(a: Any, b: Any, scale: float = 1e-4) -> bool:
    """Whether ``a`` and ``b`` have one shape and differ by at most ``scale`` of ``b``'s
    largest finite entry everywhere (a nan differs by more)."""
    try:
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    finite = np.abs(b[np.isfinite(b)])
    if a.shape != b.shape or not finite.size:
        return False
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.abs(a - b) <= scale * finite.max()))


def _rebinding_line(
    fn: FunctionType, run: Traced, variable: str, number: int, k: int
) -> int | None:
    """The last line of ``fn`` that assigned ``variable`` before ``run`` entered blank
    ``number``'s lines the (k + 1)-th time (None if no assignment of it ran before)."""
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    assigns = set()
    for node in ast.walk(ast.parse("".join(lines))):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == variable for t in targets for n in ast.walk(t)):  # fmt: skip
                assigns.add(first + node.lineno - 1)
    found, entered, inside = None, 0, False
    for line in run.lines:
        now = blank_at(fn, line) == number
        if now and not inside:
            entered += 1
            if entered > k:
                break
        inside = now
        if line in assigns:
            found = line
    return found


def _changed_in_place(fn: FunctionType, mine: Traced, theirs: Traced, variable: str, p: int) -> int | None:  # fmt: skip
    """The blank whose lines changed ``variable`` in place in ``mine`` by pass ``p``: it matched
    the solution's at an earlier pass, then differed when that blank's lines ended, yours having
    changed (not only the solution's: a given line of yours deleted), and no line of ``fn``
    that assigns ``variable`` ran in between. None otherwise."""
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    assigns = set()
    for node in ast.walk(ast.parse("".join(lines))):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == variable for t in targets for n in ast.walk(t)):  # fmt: skip
                assigns.add(first + node.lineno - 1)
    counts: dict[int, int] = {}
    matched = None  # the last pass so far at which variable matched the solution's
    for i, (number, values) in enumerate(mine.passes[: p + 1]):
        k = counts[number] = counts.get(number, -1) + 1
        ref = [v for n, v in theirs.passes if n == number]
        if k >= len(ref) or variable not in values or variable not in ref[k]:
            continue
        if _alike(values[variable], ref[k][variable]):
            matched = i
        elif matched is not None:
            if _alike(values[variable], mine.passes[matched][1][variable]):  # yours unchanged
                return None
            ran = mine.lines[mine.marks[matched] : mine.marks[i]]
            return None if assigns & set(ran) else number
        else:
            return None
    return None


def _last_blank_line(fn: FunctionType, run: Traced, number: int, end: int) -> int | None:
    """The last line of blank ``number`` that ``run`` ran before ``lines[end]``: the line
    that changed a name in place, when the blank's lines end with it."""
    found = [line for line in run.lines[:end] if blank_at(fn, line) == number]
    return found[-1] if found else None


def _blank_after(fn: FunctionType, run: Traced, line: int, end: int) -> int | None:
    """The first blank whose lines ``run`` ran after its last run of ``line`` before
    ``lines[end]``: where a name that ``line`` set (to the solution's value) changed in place."""
    ran = run.lines[:end]
    if line not in ran:
        return None
    last = len(ran) - 1 - ran[::-1].index(line)
    return next((n for x in ran[last + 1 :] if (n := blank_at(fn, x))), None)


def _pass_value(run: Traced, number: int, k: int, variable: str) -> Any:
    """The value of ``variable`` when ``run`` left blank ``number``'s lines the k-th time."""
    values = [v for n, v in run.passes if n == number]
    return values[k].get(variable) if k < len(values) else None


def _same_results(a: FunctionType, b: FunctionType, cases: list[tuple[str, tuple]]) -> bool:
    """Whether ``a`` returns what ``b`` does on every case ``b`` runs without an error."""
    for _, args in cases:  # each run on its own copy: a line that writes to an argument
        run_b = run_traced(b, *copy.deepcopy(args))  # changes no other run's
        if run_b.error is None and not equal(run_traced(a, *copy.deepcopy(args)).result, run_b.result):  # fmt: skip
            return False
    return True


@dataclass
class Verdict:
    """What a function check found: ``code`` 0 (every filled blank the runs reach matches), 1 (a blank
    differs: ``report`` says which, where and a hint) or 2 (the file or a blank cannot run:
    ``report`` is one line)."""

    code: int
    report: str


def check_function(
    path: str | Path,
    name: str,
    solution: str | Path,
    cases: list[tuple[str, tuple]],
    blanks: int,
    rounds: str = "pass",
    contract: bool = False,
) -> Verdict:
    """Check function ``name`` of the reader's file ``path`` against the one of the same name
    in ``solution`` on ``cases`` ((label, args), in order): for each case, each blank whose
    lines ran is compared by the variables it assigns, in blank order, then the return
    value. The first difference names the blank, its line and a hint: the hint of a mistake
    in the solution's ``MISTAKES`` table ({key: (blank, old, new, hint)}) that gives the
    same value there, else :func:`how_it_differs`. A syntax error, an exception raised in a
    line of the reader's (Ctrl-C on a loop that does not end and exit() too), or a blank's
    variable of another kind than the solution's (a list for an array) is one line, code 2.
    Only the variables the solution's blanks assign are compared: a helper of the reader's
    (``step_ratio``) or a given name it rebinds (``T = float(T)``) is not, unless a later blank
    or the return value then differs: then the line that rebinds it is named, as is a line outside the blanks (after an empty line) that rebinds a number or array a differing blank reads, or the blank whose lines change it in place (out=). A blank's line that assigns another blank's variable (lab 19: w_old in blank 5) is named with whose variable it is. A yield in the function is one line, code 2. Entries 1 off get the advice to round (which way they are off) only if the blank's lines do not round already. The blanks still to fill are read from the text.
    A blank is compared each time the run leaves its lines (:attr:`Traced.passes`): in a
    loop, its k-th pass against the solution's k-th, named "``rounds`` k of n" (lab 16:
    "key/value block 2 of 4"); floats match to float32 rounding (:func:`close`). With
    ``contract`` (lab 17, whose blanks hand arrays between parts), a blank's array of another
    shape or dtype than the solution's (B rows where 2B go) is one line, code 2, too, and
    none of :func:`how_it_differs`' hints is given (its integers are class labels and flags,
    not timesteps' grids); the typical mistakes' hints still are."""
    path = Path(path)
    try:
        yours = load_function(path, name)
    except SyntaxError as error:
        text = error.msg.split(" (")[0]
        return Verdict(2, f"{path.name} line {error.lineno}: syntax error: {text}")
    except UnicodeDecodeError as error:  # not UTF-8 text: name the file too
        return Verdict(2, f"{path.name}: {type(error).__name__}: {error}")
    except ValueError as error:  # no function of that name, or two
        return Verdict(2, str(error))
    except Exception as error:  # an import of the file's that fails, say
        return Verdict(2, f"{path.name}: {type(error).__name__}: {' '.join(str(error).split())}")
    reference = load_function(solution, name)
    mistakes = load_constant(solution, "MISTAKES")
    assigned = blank_assignments(yours)
    answers = {v for names in blank_assignments(reference).values() for v in names}
    where = lambda number, line: f"{path.name} line {line}" + (f" (blank {number})" if number else "")  # noqa: E731  # fmt: skip
    given = inspect.signature(yours).parameters  # a name set by the given lines is not "given"
    owner_of = lambda v: next((f"blank {m} assigns" for m, names in blank_assignments(reference).items() if v in names), f"{name}() is given" if v in given else "the given lines set")  # noqa: E731  # fmt: skip

    def elsewhere(number: int, variable: str) -> str:
        """The hint for blank ``number``'s lines assigning ``variable``, which only other
        blanks of the solution's assign (w_old in lab 19's blank 5): "" for its own."""
        theirs = blank_assignments(reference)
        owners = [m for m, names in theirs.items() if variable in names]
        if not owners or number in owners:
            return ""
        whose = f"blank {owners[0]}'s" if len(owners) == 1 else f"blanks {' and '.join(map(str, owners))}'"  # fmt: skip
        own = ", ".join(theirs.get(number, {})) or "none"
        return f"blank {number}'s lines assign {variable}, {whose} variable (blank {number}'s is {own}): the lines after them read yours, not {whose}"  # fmt: skip

    def _in_place(
        n: int, v: str, a: Any, b: Any, line: int | None, head: str, then: str
    ) -> Verdict:
        """Blank ``n``'s lines (``line``, the last of them that ran) changed ``v`` in place."""
        return Verdict(1, "\n".join([
            head,
            f"  {where(n, line)}: {source_line(yours, line)}",
            f"  yours:    {v} = {show(a)}",
            f"  solution: {v} = {show(b)}",
            f"hint: blank {n}'s lines change {v}, which {owner_of(v)}, in place, though none of them assigns it (out=, [...] = or a name that shares its array): the lines after them see yours, and {then} then differs; write a new array instead",
        ]))  # fmt: skip

    if inspect.isgeneratorfunction(yours):  # a yield in a blank: the call returns a generator
        source, first = inspect.getsourcelines(yours)
        at = min(first + n.lineno - 1 for n in ast.walk(ast.parse("".join(source))) if isinstance(n, ast.Yield | ast.YieldFrom))  # fmt: skip
        return Verdict(2, f"{where(blank_at(yours, at), at)}: yield makes {name}() a generator, which runs none of its lines when called: {name}() must return its value")  # fmt: skip
    unfilled: dict[int, int] = {}
    matched: set[int] = set()  # the blanks whose lines ran and matched on some case
    cut: dict[int, int] = {}  # blank -> the fewest passes a run stopped by a blank() made

    def _rebound(found: tuple, then: str) -> Verdict:
        """Blank ``number`` rebinds a name ``name`` is given, to another value than the
        solution's there, and ``then`` (a later blank's variable, the result) differs."""
        _, number, variable, line, a, b, at = found
        said = f"{name}() is given {variable} and your blank rebinds it" if variable in given else f"the given lines set {variable} and your blank changes it"  # fmt: skip
        return Verdict(1, "\n".join([
            f"blank {number} differs from the solution ({at}):",
            f"  {where(number, line)}: {source_line(yours, line)}",
            f"  yours:    {variable} = {show(a)}",
            f"  solution: {variable} = {show(b)}",
            f"hint: {said}: the lines after it see yours, and {then} then differs",
        ]))  # fmt: skip

    for label, args in cases:
        # each on its own copy of the case: a line of yours that writes to an argument
        # (scheduler.timesteps = ...) must not change what the solution's run sees
        mine, theirs = run_traced(yours, *copy.deepcopy(args)), run_traced(reference, *copy.deepcopy(args))  # fmt: skip
        rebound: list[tuple] = []  # (pass, blank, given name, line, yours, the solution's, at)
        for run in (mine, theirs):  # Ctrl-C (a loop that does not end?) or exit(): one line
            if isinstance(run.error, KeyboardInterrupt | SystemExit):
                found = innermost_line(run.error, yours.__code__.co_filename) if run is mine else None  # fmt: skip
                line = found[1] if found else None
                what = "interrupted (Ctrl-C) there: a loop of yours that does not end?" if isinstance(run.error, KeyboardInterrupt) else f"exit() ends the whole check: {name}() must return its value"  # fmt: skip
                if line is None:
                    return Verdict(2, f"{path.name}: interrupted (Ctrl-C) while the solution ran ({label})")  # fmt: skip
                return Verdict(2, f"{where(blank_at(yours, line), line)}: {type(run.error).__name__}: {what} ({label})")  # fmt: skip
        assert theirs.error is None, theirs.error  # the solution runs, or the lab is broken
        seen: dict[int, int] = {}  # blank -> its passes so far in your run
        rounded: set[int] = set()  # blanks that matched only to rounding so far in this case
        for p, (number, values) in enumerate(mine.passes):
            k = seen[number] = seen.get(number, -1) + 1
            ref = [v for n, v in theirs.passes if n == number]
            if number not in assigned or k >= len(ref):
                continue
            at = f"{label}, {rounds} {k + 1} of {len(ref)}" if len(ref) > 1 else label
            for variable, line in assigned[number].items():
                if variable not in values:
                    continue  # that blank's line did not run, or raised before assigning
                if variable not in ref[k] or variable not in answers:
                    if variable in ref[k] and not _alike(values[variable], ref[k][variable]):
                        rebound.append((p, number, variable, line, values[variable], ref[k][variable], at))  # fmt: skip
                    continue  # a helper of yours (step_ratio = T // n) or a given name you
                    # rebind (T = float(T)): named only if a later blank or the result differs
                a, b = values[variable], ref[k][variable]
                other = elsewhere(number, variable)  # another blank's variable, written here
                foreign = f": {other}" if other else ""
                if kind(a) != kind(b):
                    return Verdict(2, f"{where(number, line)}: {variable} is {kind(a)}, {show(a)}; the solution's is {kind(b)}, {show(b)} ({at}){foreign}")  # fmt: skip
                if contract and kind(a) == "an array" and (a.shape, a.dtype) != (b.shape, b.dtype):  # lab 17: the parts' contract  # fmt: skip
                    return Verdict(2, f"{where(number, line)}: {variable} is {a.dtype} of shape {a.shape}; the solution's is {b.dtype} of shape {b.shape} ({at}){foreign}")  # fmt: skip
                if equal(a, b):
                    matched.add(number)
                    if kind(a) in ("a float", "an array") and not np.array_equal(a, b):
                        rounded.add(number)
                    continue
                if earlier := [r for r in rebound if r[0] < p]:  # a given name rebound before
                    return _rebound(earlier[0], f"{variable} in blank {number}")
                hint = how_it_differs(a, b) if not contract else ""  # lab 17: labels, not timesteps
                if any(hint.endswith(said) for said in ROUNDING_HINTS.values()) and _rounds(yours, number):  # fmt: skip
                    hint = next(hint.removesuffix(said) for said in ROUNDING_HINTS.values() if hint.endswith(said))  # yours rounds already  # fmt: skip
                # the typical mistakes of this blank that give your value here (each run on a
                # copy of the case: lab 17's scheduler and generator change as they run)
                matches = [
                    (planted, said)
                    for blank_number, old, new, said in mistakes.values()
                    if blank_number == number
                    and (planted := _planted(solution, name, (old, new))) is not None
                    and equal(
                        _pass_value(run_traced(planted, *copy.deepcopy(args)), number, k, variable),
                        a,
                    )
                ]
                # of those, the first that also returns what yours does on every other case
                # (one case may not tell two apart: +1 from a missing "- 1" or an extra offset)
                alike = [said for planted, said in matches if _same_results(planted, yours, cases)]  # fmt: skip
                hint = (alike or [said for _, said in matches] or [hint])[0]
                if foreign and not matches:  # another blank's variable, written in this blank
                    hint = foreign.removeprefix(": ")
                # a small error an earlier blank let through, grown here: only for a small
                # difference (within 1e-4 of the largest entry), and blanks before this one
                before = sorted(n for n in rounded if n < number)
                if not hint and before and _small_difference(a, b):
                    hint = f"no typical mistake gives this value; blank{'s' if len(before) > 1 else ''} {', '.join(map(str, before))} matched the solution only to float rounding on this case, not exactly: if this line is right, a small factor or term there is the difference"  # fmt: skip
                ran = {n for n, _ in mine.passes}  # an earlier blank none of whose lines ran as its
                own = blank_assignments(reference)  # own (the reader's line sits after an empty
                off = {n for n, names in own.items() if any(v not in mine.variables or not _alike(mine.variables[v], theirs.variables.get(v)) for v in names)}  # fmt: skip
                skipped = [n for n, _ in theirs.passes if n < number and n not in ran and n in off]
                if skipped:  # line, outside it) and what it assigns ends the run off the solution's
                    hint = f"blank {skipped[0]}'s lines did not run as blank {skipped[0]}'s: a blank's lines run from its # BLANK comment to the first empty line, and a line of yours after an empty line is not checked as the blank's"  # fmt: skip
                # a number or array this blank reads that a line outside the blanks rebound (after
                # an empty line, say) to another value than the solution's there: name that line
                numeric = ("an integer", "a float", "an array", "a bool")  # not the parts (objects)
                drifted = [v for v in ref[k] if v in values and v not in assigned[number] and kind(ref[k][v]) in numeric and not _alike(values[v], ref[k][v])]  # fmt: skip
                # ... or that a blank's lines changed in place (out=lse, x[...] =) without assigning it
                in_place = next(((v, n) for v in drifted if (n := _changed_in_place(yours, mine, theirs, v, p)) is not None), None) if not skipped else None  # fmt: skip
                head, then = f"blank {number} differs from the solution ({at}):", f"{variable} in blank {number}"  # fmt: skip
                if in_place:
                    v, n = in_place
                    return _in_place(n, v, values[v], ref[k][v], _last_blank_line(yours, mine, n, mine.marks[p]), head, then)  # fmt: skip
                line_of = {v: _rebinding_line(yours, mine, v, number, k) for v in drifted} if not skipped else {}  # fmt: skip
                if drifted := [v for v in drifted if line_of.get(v) and not blank_at(yours, line_of[v])]:  # fmt: skip
                    v, line = drifted[0], line_of[drifted[0]]
                    # a given line as the solution has it sets v right: a blank that ran after it
                    # changed v in place (out=scores, or s = scores; s -= peak), not this line
                    kept = source_line(yours, line) in map(str.strip, inspect.getsourcelines(reference)[0])  # fmt: skip
                    if kept and (n := _blank_after(yours, mine, line, mine.marks[p])):
                        return _in_place(n, v, values[v], ref[k][v], _last_blank_line(yours, mine, n, mine.marks[p]), head, then)  # fmt: skip
                    return Verdict(1, "\n".join([
                        head,
                        f"  {where(None, line)}: {source_line(yours, line)}",
                        f"  yours:    {v} = {show(values[v])}",
                        f"  solution: {v} = {show(ref[k][v])}",
                        f"hint: this line, outside the blanks' lines, rebinds {v}, which {owner_of(v)}: the lines after it see yours, and {then} then differs",
                    ]))  # fmt: skip
                report = [
                    f"blank {number} differs from the solution ({at}):",
                    f"  {where(number, line)}: {source_line(yours, line)}",
                    f"  yours:    {variable} = {show(a)}",
                    f"  solution: {variable} = {show(b)}",
                ]
                if isinstance(a, np.ndarray) and a.shape == b.shape and (a.ndim > 1 or a.size > 12):
                    off = ~close(a, b)  # elided above: where, and how many
                    i = np.unravel_index(int(np.flatnonzero(off)[0]), a.shape) if off.any() else None  # fmt: skip
                    entry = i[0] if a.ndim == 1 else tuple(map(int, i)) if i else None
                    report += [f"  first difference: entry {entry}, yours {show(a[i])}, the solution's {show(b[i])}" + (f" ({np.count_nonzero(off)} of {off.size} entries differ)" if a.ndim > 1 else "")] if i is not None else []  # fmt: skip
                return Verdict(1, "\n".join(report + ([f"hint: {hint}"] if hint else [])))
        if isinstance(mine.error, UnfilledBlankError):
            unfilled.setdefault(mine.error.number, mine.error.line)
            for number, count in seen.items():  # a loop the placeholder cut short
                if count + 1 < sum(n == number for n, _ in theirs.passes):
                    cut[number] = min(cut.get(number, count + 1), count + 1)
            continue
        if mine.error is not None:
            found = innermost_line(mine.error, yours.__code__.co_filename)
            line = found[1] if found else None
            text = " ".join(str(mine.error).split())
            if isinstance(mine.error, NameError) and mine.error.name in _top_level_names(path):
                text += f": only your file's imports and its {name}() run in the check, so define it inside {name}()"  # fmt: skip
            return Verdict(2, f"{where(blank_at(yours, line), line)}: {type(mine.error).__name__}: {text} ({label})")  # fmt: skip
        if not equal(mine.result, theirs.result) and rebound:
            return _rebound(rebound[0], "the value it returns")
        if not equal(mine.result, theirs.result):
            head = f"your {name}() returns another value ({label}), the lines of its blanks matching:"  # fmt: skip
            last = len(mine.passes) - 1  # a blank's variable a later blank changed in place (out=)
            in_place = next(((v, n) for v in sorted(answers) if (n := _changed_in_place(yours, mine, theirs, v, last)) is not None), None) if mine.passes else None  # fmt: skip
            if in_place:
                v, n = in_place
                return _in_place(n, v, mine.variables.get(v), theirs.variables.get(v), _last_blank_line(yours, mine, n, len(mine.lines)), head, "the value it returns")  # fmt: skip
            line = mine.lines[-1] if mine.lines else None
            early = blank_at(yours, line) and source_line(yours, line).startswith("return")
            hint = f"this return in blank {blank_at(yours, line)} ends {name}() there, before the lines after the blank run: a blank gives its variable to the lines after it" if early else "a blank's lines run from its # BLANK comment to the first empty line: a line of yours after an empty line is not checked as the blank's, nor is a given line you changed"  # fmt: skip
            return Verdict(1, "\n".join([
                head,
                f"  {where(blank_at(yours, line), line)}: {source_line(yours, line)}",
                f"  yours:    {show(mine.result)}",
                f"  solution: {show(theirs.result)}",
                f"hint: {hint}",
            ]))  # fmt: skip
    unfilled = {**blank_calls(yours), **unfilled}  # also those no run reached
    if unfilled:
        todo = ", ".join(f"blank({k}) at line {line}" for k, line in sorted(unfilled.items()))
        done = sorted(matched - set(unfilled))
        matched = f"; blank{'s' if len(done) > 1 else ''} {', '.join(map(str, done))} match{'' if len(done) > 1 else 'es'} the solution on every case {'they' if len(done) > 1 else 'it'} ran" if done else ""  # fmt: skip
        if done and any(k in cut for k in done):  # in a loop: only as far as the runs got
            matched += f" (as far as each run got: it stops at the first blank left, in {rounds} {min(cut[k] for k in done if k in cut)})"  # fmt: skip
        return Verdict(0, f"{len(unfilled)} of {blanks} blanks not filled in yet in {path.name}: {todo}{matched}")  # fmt: skip
    return Verdict(0, f"all {blanks} blanks match the solution on {len(cases)} cases")
