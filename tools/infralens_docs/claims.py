"""What the verify tests check, page by page, read from the test files themselves.

Every page that says how diffusers behaves has one verify module, named after it:

- ``docs/index.md``                   -> ``tests/verify/test_page_index.py``
- ``docs/handbook/forward-reverse.md`` -> ``tests/verify/test_page_forward_reverse.py``
- ``docs/labs/lab-04-cfg-code-reading.md`` -> ``tests/verify/test_page_lab_04.py``

Each test in such a module opens its docstring with the claim it checks, one
Markdown sentence written for the reader. The ``verified-claims`` directive
lists those sentences on the page, so what a page says is tested is generated
from the tests and cannot drift from them. The files are read with ``ast``,
so the site builds without torch or diffusers installed.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from infralens_docs.registry import ROOT
from infralens_docs.runner import CACHE_ROOT

VERIFY_DIR = ROOT / "tests" / "verify"
#: parsed claims, one JSON file per version of a module and of this parser
CACHE = CACHE_ROOT / "claims"
_PARSER = Path(__file__).read_bytes()
VERSIONS_FILE = VERIFY_DIR / "verified_versions.json"
LAB_PAGE_RE = re.compile(r"^labs/lab-(\d{2})-[a-z0-9-]+\.md$")


class ClaimsError(ValueError):
    """A page's verify module is missing or breaks the docstring contract."""


@dataclass(frozen=True)
class Claim:
    test: str  # the test function's name
    text: str  # the first paragraph of its docstring, Markdown, one line


def module_for_page(src_uri: str) -> Path:
    """The verify module of a docs page, given its path relative to ``docs/``."""
    lab = LAB_PAGE_RE.match(src_uri)
    if lab:
        name = f"lab_{lab.group(1)}"
    else:
        name = Path(src_uri).with_suffix("").name.replace("-", "_")
    return VERIFY_DIR / f"test_page_{name}.py"


def read_claims(module: Path) -> list[Claim]:
    """Every ``test_*`` function of ``module`` with its claim, in file order."""
    if not module.is_file():
        raise ClaimsError(f"{module.relative_to(ROOT)} does not exist")
    # The home page, the references and the module's own page all read it, on every
    # build: parse each version of a module once, and keep the result on disk.
    source = module.read_text(encoding="utf-8")
    digest = hashlib.sha256(_PARSER + source.encode("utf-8")).hexdigest()[:32]
    cached = CACHE / f"{digest}.json"
    try:
        return [Claim(*pair) for pair in json.loads(cached.read_text(encoding="utf-8"))]
    except (OSError, ValueError, TypeError):
        pass
    found = _claims(module, source)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps([[c.test, c.text] for c in found]), encoding="utf-8")
    tmp.replace(cached)
    return found


def _claims(module: Path, source: str) -> list[Claim]:
    tree = ast.parse(source, filename=str(module))
    claims = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
            continue
        doc = ast.get_docstring(node)
        if not doc:
            raise ClaimsError(f"{module.relative_to(ROOT)}::{node.name} has no docstring claim")
        first = " ".join(doc.split("\n\n")[0].split())
        claims.append(Claim(node.name, first))
    if not claims:
        raise ClaimsError(f"{module.relative_to(ROOT)} holds no test")
    return claims


def verified_versions() -> dict[str, str]:
    if not VERSIONS_FILE.is_file():
        raise ClaimsError(f"{VERSIONS_FILE.relative_to(ROOT)} is missing; run `make verify`")
    return json.loads(VERSIONS_FILE.read_text(encoding="utf-8"))


def page_modules() -> dict[str, Path]:
    """Every ``test_page_*.py`` under tests/verify, by module name."""
    return {p.stem: p for p in sorted(VERIFY_DIR.glob("test_page_*.py"))}
