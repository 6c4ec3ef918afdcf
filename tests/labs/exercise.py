"""The harness the exercise tests of labs 03, 13, 16, 19 and 20 share.

Each of those labs ships a function with blanks (``X_blanks.py``, the file the reader
edits), its solution (``X_solution.txt``) and a checker script (``check_X.py``) built on
``labkit.blanks``. :class:`Exercise` writes a reader's file with some blanks filled as the
solution fills them (or with one of the solution's typical mistakes planted), and runs the
checker on it as the reader would, in this process.
"""

from __future__ import annotations

import ast
import re
import runpy
import shutil
import sys
from pathlib import Path


def function_lines(path: Path, name: str) -> tuple[int, list[str]]:
    """(first line, the lines) of top-level function ``name`` in ``path``."""
    source = path.read_text(encoding="utf-8")
    node = next(n for n in ast.parse(source).body if getattr(n, "name", None) == name)
    return node.lineno, source.splitlines()[node.lineno - 1 : node.end_lineno]


class Exercise:
    """One lab's exercise: its folder, checker, blanks file, solution and function."""

    def __init__(self, folder: Path, checker: str, blanks: str, solution: str, name: str):
        self.folder, self.checker, self.blanks, self.solution = folder, checker, blanks, solution
        self.name = name

    def mistakes(self) -> dict:
        """The solution's MISTAKES table: name -> (blank, old text, new text, hint)."""
        from labkit.blanks import load_constant

        return load_constant(self.folder / self.solution, "MISTAKES")

    def reader_file(self, fill=(), mistake=None) -> str:
        """The blanks file with the blanks in ``fill`` written as the solution writes them
        (``mistake``: a key of MISTAKES planted in its blank), the others left as they are."""
        first, mine = function_lines(self.folder / self.blanks, self.name)
        _, theirs = function_lines(self.folder / self.solution, self.name)
        lines = (self.folder / self.blanks).read_text(encoding="utf-8").splitlines()
        number, old, new, _ = self.mistakes()[mistake] if mistake else (None, "", "", "")
        planted = 0
        for k, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            blank = re.search(r"blank\((\d)\)", a)
            if blank and int(blank.group(1)) in fill:
                if int(blank.group(1)) == number and old in b:  # a blank may span lines (lab 17)
                    assert b.count(old) == 1, (old, b)
                    b, planted = b.replace(old, new), planted + 1
                lines[first - 1 + k] = b
        assert planted == (number is not None and number in fill), (mistake, planted)
        return "\n".join(lines) + "\n"

    def fill_but(self, number: int, line: str, blanks) -> str:
        """The solution's fill of ``blanks`` but blank ``number``, whose line (one assignment
        ``name = blank(number)``) becomes ``line``, one or more lines, its indent kept."""
        source = self.reader_file(fill=tuple(k for k in blanks if k != number))
        old = next(x for x in source.splitlines() if f"= blank({number})" in x)
        indent = old[: len(old) - len(old.lstrip())]
        return source.replace(old, "\n".join(indent + x for x in line.splitlines()))

    def blank_line(self, number: int) -> int:
        """The line of blank(number) in the shipped blanks file."""
        text = (self.folder / self.blanks).read_text(encoding="utf-8").splitlines()
        return next(i for i, line in enumerate(text, 1) if f"= blank({number})" in line)

    def run(self, tmp_path, monkeypatch, capsys, source: str, *argv: str):
        """Run a copy of the checker beside a reader's file ``source`` (in this process):
        (exit code, stdout, stderr)."""
        shutil.copy(self.folder / self.checker, tmp_path / self.checker)
        shutil.copy(self.folder / self.solution, tmp_path / self.solution)
        (tmp_path / self.blanks).write_text(source, encoding="utf-8")
        monkeypatch.setattr(sys, "argv", [str(tmp_path / self.checker), *argv])
        monkeypatch.setattr(sys, "path", list(sys.path))
        capsys.readouterr()
        code = 0
        try:
            runpy.run_path(str(tmp_path / self.checker), run_name="__main__")
        except SystemExit as stop:
            code = stop.code
        out = capsys.readouterr()
        return code, out.out, out.err

    def run_in_place(self, *argv: str) -> dict:
        """The shipped checker's globals after a run with ``argv``."""
        saved, sys.argv = sys.argv, [str(self.folder / self.checker), *argv]
        try:
            return runpy.run_path(str(self.folder / self.checker), run_name="__main__")
        finally:
            sys.argv = saved
