"""The drift watch: the verify suite against whatever library versions are installed,
reported page by page.

Every page states the diffusers (and torch) it was checked against
(``tests/verify/verified_versions.json``). diffusers ships every few weeks. ``make
verify-latest`` (and the weekly Drift workflow) installs the newest diffusers,
transformers and peft into a separate venv, runs ``tests/verify`` there with this module,
and prints, by page, which claims' tests fail and which deprecation warnings are new (the
verify suite turns a ``FutureWarning``/``DeprecationWarning`` into a failure, so a new one
shows up as a failing claim whose error is the warning). The pinned environment and the
pages are not touched: the report is what a maintainer reads before upgrading the pins.

    python -m infralens_docs.drift [--output report.md] [--junit results.xml]

Exit status: 0 when every verify test passes, 1 when any fails (the report says which), 2
when pytest could not run the suite at all.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from infralens_docs import claims
from infralens_docs.registry import ROOT

#: the libraries whose drift the watch reports, in the order the report lists them
LIBRARIES = ("diffusers", "transformers", "peft", "torch", "accelerate", "gguf")
DEPRECATIONS = ("FutureWarning", "DeprecationWarning", "PendingDeprecationWarning")


@dataclass(frozen=True)
class Outcome:
    module: str  # e.g. "test_page_cfg"
    test: str  # the function name, without parameters
    case: str  # the test id as pytest names it, parameters included
    kind: str  # "deprecation" or "failure"
    message: str  # the first line of the error


def installed_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def pinned_versions() -> dict[str, str]:
    """``name -> version`` for the ``name==version`` pins of pyproject's verify extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pins = {}
    for requirement in project["project"]["optional-dependencies"]["verify"]:
        name, sep, version = requirement.partition("==")
        if sep:
            pins[name.strip().lower()] = version.strip()
    return pins


def page_of_module() -> dict[str, str]:
    """Verify module name -> the docs page it holds claims for (``docs/``-relative)."""
    docs = ROOT / "docs"
    owners = {}
    for page in sorted(docs.rglob("*.md")):
        rel = page.relative_to(docs).as_posix()
        owners.setdefault(claims.module_for_page(rel).stem, rel)
    return owners


def run_suite(junit: Path) -> int:
    """Run tests/verify with a JUnit report; pytest's exit code."""
    # test_versions compares the installed versions with the ones the pages state: under the
    # newest libraries it fails by design, and the report's table already shows both.
    command = [sys.executable, "-m", "pytest", "tests/verify", "-q", "-p", "no:cacheprovider"]
    command += ["--deselect", "tests/verify/test_versions.py"]
    command += [f"--junitxml={junit}", "-o", "junit_family=xunit2"]
    return subprocess.run(command, cwd=ROOT, check=False).returncode


def read_outcomes(junit: Path) -> tuple[int, list[Outcome]]:
    """(tests run, the failed or errored ones) from a pytest JUnit XML file."""
    root = ET.parse(junit).getroot()
    total, outcomes = 0, []
    for case in root.iter("testcase"):
        total += 1
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is None:
            continue
        module = case.get("classname", "").rsplit(".", 1)[-1]
        name = case.get("name", "")
        message = (problem.get("message") or problem.text or "").strip().splitlines()
        first = message[0] if message else "(no message)"
        kind = "deprecation" if first.startswith(DEPRECATIONS) else "failure"
        outcomes.append(Outcome(module, name.split("[", 1)[0], name, kind, first[:300]))
    return total, outcomes


def report(total: int, outcomes: list[Outcome], versions: dict[str, str]) -> str:
    """The Markdown report: versions, then by page the failing claims and deprecations."""
    stated = json.loads((claims.VERSIONS_FILE).read_text(encoding="utf-8"))
    pins = pinned_versions()
    lines = ["# Drift watch: the verify suite against the newest libraries", ""]
    lines += ["| library | installed | pinned (verify extra) | pages state |", "|---|---|---|---|"]
    lines += [
        f"| {name} | {versions[name]} | {pins.get(name, '')} | {stated.get(name, '')} |"
        for name in LIBRARIES
    ]
    failed = {o.case for o in outcomes}
    lines += ["", f"{total} verify tests ran; {total - len(failed)} passed, {len(failed)} failed."]
    if not outcomes:
        lines += ["", "No drift: every claim still holds, and no new deprecation warning."]
        return "\n".join(lines) + "\n"
    owners = page_of_module()
    by_page: dict[str, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        by_page[owners.get(outcome.module, f"(no page) {outcome.module}")].append(outcome)
    for page in sorted(by_page):
        found = by_page[page]
        module = claims.VERIFY_DIR / f"{found[0].module}.py"
        texts = {c.test: c.text for c in claims.read_claims(module)} if module.is_file() and page[0] != "(" else {}  # fmt: skip
        lines += ["", f"## {page}", ""]
        for kind, title in (("failure", "Claims whose test fails"), ("deprecation", "New deprecation warnings")):  # fmt: skip
            rows = [o for o in found if o.kind == kind]
            if not rows:
                continue
            lines += [f"**{title}** ({len(rows)})", ""]
            for o in rows:
                claim = texts.get(o.test, "")
                lines.append(f"- `{o.case}`" + (f": {claim}" if claim else ""))
                lines.append(f"    - {o.message}")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infralens_docs.drift", description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--output", type=Path, help="also write the report to this file")
    parser.add_argument("--junit", type=Path, help="read this JUnit XML instead of running pytest")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        junit = args.junit or Path(tmp) / "verify.xml"
        if args.junit is None:
            code = run_suite(junit)
            if code not in (0, 1) or not junit.is_file():
                print(f"drift: pytest could not run the verify suite (exit {code})", file=sys.stderr)  # fmt: skip
                return 2
        total, outcomes = read_outcomes(junit)
    text = report(total, outcomes, installed_versions())
    print("\n" + text)
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    return 1 if outcomes else 0


if __name__ == "__main__":
    sys.exit(main())
