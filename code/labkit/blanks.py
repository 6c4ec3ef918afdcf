"""Blanks for the reader to fill in, and what a checker needs to compare two versions.

Lab 17 ships one function twice, differing only on the lines that call :func:`blank`: in
the reader's file, where each such line is a placeholder, and in ``solution.py``, where it
is filled in. A checker runs the reader's function and the solution's on the same inputs
and compares, call by call, what each hands to the pipeline's parts. Six pieces make that
work:

- :func:`blank` raises :class:`UnfilledBlankError`, which knows its number and the line that called
  it, so an unfilled file says which blank is next instead of failing with a traceback;
- :func:`load_function` reads one function from another file (that file's imports and the
  ``def``; nothing else in it runs), optionally with one piece of its text replaced, so the
  checker can run the solution beside the reader's version, or a copy with a known mistake;
- :func:`load_constant` reads one top-level constant (a literal: numbers, strings, tuples,
  dicts) from another file without running it, such as the solution's table of mistakes;
- :class:`Spy` stands in for a part (``unet``, ``scheduler``, ``vae``) and records a copy of
  the arguments of every call of the methods it is told to watch, by parameter name, and of
  the caller's array variables and line at that moment; it passes attribute writes on to
  the part and records them too;
- :func:`error_site` finds, for an exception raised inside a function, the line of that
  function that raised it, the blank whose comment heads that line's paragraph
  (:func:`blank_at`), and the function's variables there; :func:`innermost_line` finds the deepest line of the
  reader's file, so an error raised in a helper of theirs names the helper's line too;
- :func:`lines_run` records the lines a function runs (which line left its loop), passing
  every event on to a tracer already set, such as a debugger's (``whole`` says whether one
  set later, as pdb's ``breakpoint()`` can, cut the record short).

NumPy is the only dependency, as for the rest of labkit.
"""

from __future__ import annotations

import ast
import inspect
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FunctionType
from typing import Any, NoReturn

import numpy as np

_HERE = sys._getframe().f_code.co_filename  # this file, as its frames name it


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


@dataclass
class Call:
    """One recorded call: the part's method (``"__call__"`` for the part itself; an
    attribute written, ``"scheduler.sigmas ="``, with its ``value``), its arguments by
    parameter name (arrays copied), the calling function's array variables and NumPy
    scalars such as ``t`` at that moment (copied: which variable held what when the call
    was made) and, once it
    returned, its result and the warnings it raised (caught here, so that a checker can
    report them in its own words)."""

    method: str  # "scheduler.step", or "unet" for a call of the part itself
    arguments: dict[str, Any]
    caller_arrays: dict[str, Any] = field(default_factory=dict)  # arrays and NumPy scalars
    line: int | None = None  # the caller's line that made the call
    result: Any = None
    warnings: list[str] = field(default_factory=list)


class Spy:
    """Stands in for the part ``name``: every call of a method named in ``methods``
    (``"__call__"``: calling the part itself) is appended to ``calls`` as a :class:`Call`
    named ``"scheduler.step"`` (or just ``"unet"`` for ``__call__``) before it runs, so a
    call that raises is recorded too. Every other attribute passes through unchanged, for
    reading, writing (``scheduler._step_index += 1`` changes the scheduler) and deleting."""

    _OWN = frozenset({"_name", "_part", "_calls", "_methods"})  # the Spy's own fields

    def __init__(self, name: str, part: Any, calls: list[Call], methods: Iterable[str]) -> None:
        own = {"_name": name, "_part": part, "_calls": calls, "_methods": frozenset(methods)}
        for attr, value in own.items():  # past __setattr__, which forwards to the part
            object.__setattr__(self, attr, value)

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._part, attr)
        if attr not in self._methods:
            return value
        return lambda *args, **kwargs: self._record(f"{self._name}.{attr}", value, args, kwargs)

    def __setattr__(self, attr: str, value: Any) -> None:
        if attr in self._OWN:
            object.__setattr__(self, attr, value)
            return
        # a write meant for the part goes to the part, as without the Spy, and is recorded
        # as a Call named "scheduler._step_index =" (a change of state, not a method call)
        copied = np.array(value) if isinstance(value, np.ndarray) else value
        self._calls.append(Call(f"{self._name}.{attr} =", {"value": copied}, *self._caller()))
        setattr(self._part, attr, value)

    def __delattr__(self, attr: str) -> None:
        if attr in self._OWN:
            object.__delattr__(self, attr)
            return
        self._calls.append(Call(f"del {self._name}.{attr}", {}, *self._caller()))
        delattr(self._part, attr)

    @staticmethod
    def _caller() -> tuple[dict[str, Any], int | None]:
        """The first frame outside this file: its arrays and NumPy scalars (copied), its line."""
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename == _HERE:
            frame = frame.f_back  # out of this file: the line that called the part
        if frame is None:
            return {}, None
        found = {k: v for k, v in frame.f_locals.items() if isinstance(v, np.ndarray | np.generic)}
        copied = {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in found.items()}
        return copied, frame.f_lineno

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if "__call__" not in self._methods:
            raise TypeError(f"{self._name} is not watched as a callable")
        return self._record(self._name, self._part, args, kwargs)

    def _record(self, name: str, method: Callable, args: tuple, kwargs: dict) -> Any:
        bound = inspect.signature(method).bind(*args, **kwargs)  # a wrong call raises here
        copied = {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in bound.arguments.items()}  # fmt: skip
        call = Call(name, copied, *self._caller())
        self._calls.append(call)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call.result = method(*args, **kwargs)
        call.warnings = [str(w.message) for w in caught]
        return call.result


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


def loop_heads(fn: FunctionType, around: int | None = None) -> list[int]:
    """The first lines of ``fn``'s ``for`` and ``while`` statements outside the blanks, in
    order ([] when its source cannot be read); with ``around``, only the loops whose lines
    hold line ``around``, outermost first (the last one is the loop that runs that line)."""
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return []
    loops = [
        node
        for node in ast.walk(ast.parse("".join(lines)))
        if isinstance(node, ast.For | ast.AsyncFor | ast.While)
    ]
    return sorted(
        first + node.lineno - 1
        for node in loops
        if not blank_at(fn, first + node.lineno - 1)
        and (around is None or node.lineno <= around - first + 1 <= node.end_lineno)
    )


def is_generator(value: Any) -> bool:
    """Whether ``value`` is a generator: what a function with a ``yield`` returns, its lines
    unrun."""
    return inspect.isgenerator(value)


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


class Lines(list):
    """The lines :func:`lines_run` recorded; ``whole`` is False when another tracer took over
    before the block ended (pdb's ``breakpoint()`` can): the list then stops short."""

    whole = True


@contextmanager
def lines_run(fn: FunctionType) -> Iterator[Lines]:
    """Within the block, the lines that calls of ``fn`` run go to the list it yields, in
    order (each frame's last is where it returned). Every trace event still reaches a tracer
    set before (a debugger's breakpoints in ``fn`` still stop), and the tracer's own frames
    are in this file, not the reader's: an error or Ctrl-C names the reader's line only."""
    executed = Lines()
    previous = sys.gettrace()

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        local = previous(frame, event, arg) if previous is not None else None
        if frame.f_code is not fn.__code__:
            return local

        def on_line(frame: Any, event: str, arg: Any) -> Any:
            nonlocal local
            if event in ("line", "return"):
                executed.append(frame.f_lineno)
            if local is not None:
                local = local(frame, event, arg)
            return on_line

        return on_line

    sys.settrace(on_call)
    try:
        yield executed
    finally:
        executed.whole = sys.gettrace() is on_call  # not if a breakpoint() replaced it
        sys.settrace(previous)
