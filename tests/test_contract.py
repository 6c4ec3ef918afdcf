"""Contract tests over the lab registry: pages, folders and starters agree both ways.

FastAPI-style: every example file is referenced by a page, every page's files
exist, and every runnable starter runs cleanly and deterministically.
"""

from __future__ import annotations

import ast
import re

import pytest

from infralens_docs.registry import PAGE_RE, ROOT, RegistryError, load_labs

LABS = load_labs()
RUNNABLE = [s.path for lab in LABS for s in lab.starters if s.runnable]
SNIPPET_RE = re.compile(r'--8<-- "([^":]+)(?::([\w-]+))?"')
RUN_RE = re.compile(r"<!-- infralens:run (\S+)")


def test_registry_is_not_empty_and_numbered_in_order():
    numbers = [lab.number for lab in LABS]
    assert numbers, "no labs registered"
    assert numbers == sorted(numbers)


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.id)
def test_page_name_folder_and_front_matter_agree(lab):
    page = ROOT / "docs" / lab.page
    match = PAGE_RE.match(page.name)
    assert match and int(match.group(1)) == lab.number and match.group(2) == lab.slug
    assert (ROOT / lab.folder).is_dir(), f"{lab.folder} is missing"


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.id)
def test_every_starter_listed_exists(lab):
    for starter in lab.starters:
        assert (ROOT / starter.path).is_file(), f"{lab.page} lists missing {starter.path}"


def test_every_file_under_code_labs_is_referenced_by_its_lab():
    listed = {s.path.as_posix() for lab in LABS for s in lab.starters}
    on_disk = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "code").glob("lab-*/**/*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert on_disk - listed == set(), "files under code/lab-* that no lab page lists"


def test_registry_rejects_starters_that_would_share_a_page(tmp_path):
    """``notes.md`` beside ``notes.py`` would both render at ``code/<lab>/notes/``."""
    (tmp_path / "docs" / "labs").mkdir(parents=True)
    (tmp_path / "docs" / "labs" / "lab-01-x.md").write_text(
        "---\nlab:\n  number: 1\n  slug: x\n  title: X\n  question: Q?\n"
        "  starters:\n    - file: notes.md\n    - file: notes.py\n  sections: []\n---\n"
    )
    with pytest.raises(RegistryError, match="stem"):
        load_labs(tmp_path)


def test_registry_reads_which_starters_are_pages(tmp_path):
    """A .py or .md starter is a page unless it says ``page: false`` (then the site serves
    the file alone); a file of another kind is never one, and a Markdown starter always is."""
    (tmp_path / "docs" / "labs").mkdir(parents=True)
    page = tmp_path / "docs" / "labs" / "lab-01-x.md"

    def load(entries: str):
        page.write_text(
            '---\ntitle: "Lab 01: X"\nlab:\n  number: 1\n  slug: x\n  title: X\n'
            f"  question: Q?\n  starters:\n{entries}  sections: []\n---\n"
        )
        return load_labs(tmp_path)[0].starters

    starters = load(
        "    - file: x.py\n      runnable: true\n    - file: notes.md\n"
        "    - file: check_x.py\n      runnable: true\n      page: false\n"
        "    - file: x_solution.txt\n"
    )
    assert [(s.path.name, s.page, s.notebook) for s in starters] == [
        ("x.py", True, True), ("notes.md", True, False),
        ("check_x.py", False, False), ("x_solution.txt", False, False),
    ]  # fmt: skip
    for entries, message in [
        ("    - file: x.txt\n      page: true\n", "cannot be a page"),
        ("    - file: x.py\n      page: no page\n", "true or false"),
        ("    - file: notes.md\n      page: false\n", "Markdown starter is a page"),
    ]:
        with pytest.raises(RegistryError, match=message):
            load(entries)


CHECKER_RE = re.compile(r"^from labkit\.blanks import \(?[^)]*?\bcheck_function\b", re.M)
BLANKS_RE = re.compile(r"^from labkit\.blanks import blank$", re.M)


def test_exercise_files_and_only_they_are_files_not_pages():
    """The starters that are no page (``page: false``) are exactly the exercises' checkers
    (a starter calling labkit's ``check_function``) and blanks files (a starter that is not
    run, importing ``blank``), as their roles in the sources show."""
    exercises, no_page = set(), set()
    for lab in LABS:
        for starter in lab.starters:
            if starter.path.suffix != ".py":
                continue
            source = (ROOT / starter.path).read_text(encoding="utf-8")
            checker = CHECKER_RE.search(source) is not None
            if checker or (not starter.runnable and BLANKS_RE.search(source)):
                exercises.add(starter.path.name)
            if not starter.page:
                no_page.add(starter.path.name)
    assert len(exercises) >= 10, exercises
    assert no_page == exercises


def test_registry_rejects_a_page_titled_other_than_the_labs_name(tmp_path):
    """The page's title is the lab's one name ("Lab 01: X"), as the nav, the footer and
    the home page's map show it."""
    (tmp_path / "docs" / "labs").mkdir(parents=True)
    (tmp_path / "code" / "lab-01-x").mkdir(parents=True)
    for title in ("Lab 01 guide", "Lab 01: X"):
        (tmp_path / "docs" / "labs" / "lab-01-x.md").write_text(
            f'---\ntitle: "{title}"\nlab:\n  number: 1\n  slug: x\n  title: X\n  question: Q?\n'
            "  starters:\n    - file: x.py\n  sections: []\n---\n"
        )
        if title == "Lab 01: X":
            assert load_labs(tmp_path)[0].name == title
        else:
            with pytest.raises(RegistryError, match="lab's name"):
                load_labs(tmp_path)


def test_every_lab_folder_has_a_page():
    folders = {p.name for p in (ROOT / "code").glob("lab-*") if p.is_dir()}
    assert folders == {lab.id for lab in LABS}


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.id)
def test_lab_page_pulls_code_from_its_own_starters(lab):
    """Code on the page is included from the starter (never pasted), and every
    snippet section it names exists in that file."""
    text = (ROOT / "docs" / lab.page).read_text(encoding="utf-8")
    snippets = SNIPPET_RE.findall(text)
    assert snippets, f"{lab.page} includes no code from its starter"
    for path, section in snippets:
        # A lab shows its own starters, or the shared labkit code it teaches (lab 03 teaches
        # the schedulers that live in labkit); never a file of another lab.
        own = {s.path.as_posix() for s in lab.starters}
        assert path in own or path.startswith("code/labkit/"), f"{path} is not this lab's"
        source = (ROOT / path).read_text(encoding="utf-8")
        if section:
            assert f"--8<-- [start:{section}]" in source and f"--8<-- [end:{section}]" in source
    runs = RUN_RE.findall(text)
    assert runs, f"{lab.page} shows no executed output"
    assert set(runs) <= {s.path.as_posix() for s in lab.starters if s.runnable}


@pytest.mark.parametrize("starter", RUNNABLE, ids=lambda p: p.name)
def test_runnable_starter_runs_cleanly_and_deterministically(run_cli, starter):
    first, second = run_cli(starter), run_cli(starter)
    assert first.returncode == 0, first.stderr
    assert first.stderr == "", f"stderr noise: {first.stderr!r}"
    assert first.stdout.strip(), "a runnable starter must print its result"
    assert first.stdout == second.stdout, "two runs with the same seed differ"


@pytest.mark.parametrize("starter", RUNNABLE, ids=lambda p: p.name)
@pytest.mark.parametrize(
    "argv", [["--seed", "x"], ["--no-such-flag"], ["--num-samples", "0"]], ids=" ".join
)
def test_bad_input_is_one_line_and_exit_2(run_cli, starter, argv):
    run = run_cli(starter, *argv)
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("starter", RUNNABLE, ids=lambda p: p.name)
def test_starter_needs_numpy_alone(starter):
    """Starters import numpy and labkit only, plus sys and pathlib to put code/ on the path
    (IPython only inside the notebook branch). test_run_commands.py runs them with NumPy
    alone; this keeps the imports a reader meets first to those."""
    tree = ast.parse((ROOT / starter).read_text(encoding="utf-8"))
    top_level = [
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]  # fmt: skip
    assert set(top_level) <= {"numpy", "labkit", "__future__", "sys", "pathlib"}, top_level


@pytest.mark.parametrize("starter", RUNNABLE, ids=lambda p: p.name)
def test_starter_opens_with_its_question(starter):
    source = (ROOT / starter).read_text(encoding="utf-8")
    assert re.match(r'"""Lab \d{2}: .+\?', source), "docstring must open with 'Lab NN: <question>?'"
