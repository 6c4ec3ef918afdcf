"""The drift watch's report (``infralens_docs.drift``), from a JUnit file like pytest's.

Runs without torch: it feeds the report a made-up result of the verify suite with a failing
claim, a new deprecation and a failing module that holds no page's claims.
"""

from __future__ import annotations

from infralens_docs import claims, drift

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.verify.test_page_cfg" name="{cfg_test}" />
<testcase classname="tests.verify.test_page_cfg" name="{cfg_test}[x]">
  <failure message="AssertionError: assert 2 == 1">long traceback</failure></testcase>
<testcase classname="tests.verify.test_page_memory" name="{memory_test}">
  <failure message="FutureWarning: `foo` is deprecated and will be removed">tb</failure></testcase>
<testcase classname="tests.verify.test_versions" name="test_recorded_versions_match_installed">
  <error message="AssertionError: pages say 0.42.1">tb</error></testcase>
</testsuite></testsuites>
"""


def first_test(module: str) -> claims.Claim:
    return claims.read_claims(claims.page_modules()[module])[0]


def test_report_names_pages_claims_and_new_deprecations(tmp_path):
    cfg, memory = first_test("test_page_cfg"), first_test("test_page_memory")
    junit = tmp_path / "verify.xml"
    junit.write_text(JUNIT.format(cfg_test=cfg.test, memory_test=memory.test), encoding="utf-8")
    total, outcomes = drift.read_outcomes(junit)
    assert total == 4 and len(outcomes) == 3
    assert [o.kind for o in outcomes] == ["failure", "deprecation", "failure"]
    text = drift.report(total, outcomes, {name: "9.9.9" for name in drift.LIBRARIES})
    assert "4 verify tests ran; 1 passed, 3 failed." in text
    pins = drift.pinned_versions()  # from pyproject's verify extra
    assert pins["diffusers"] and f"| transformers | 9.9.9 | {pins['transformers']} |" in text
    cfg_part = text.split("## handbook/cfg.md")[1].split("## ")[0]
    assert "Claims whose test fails" in cfg_part and cfg.text in cfg_part
    memory_part = text.split("## handbook/memory.md")[1].split("## ")[0]
    assert "New deprecation warnings" in memory_part and "`foo` is deprecated" in memory_part
    assert "## (no page) test_versions" in text
    assert "| diffusers | 9.9.9 | 0.42.1 |" in text


def test_exit_status_says_whether_anything_drifted(tmp_path, capsys):
    junit = tmp_path / "clean.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase classname="tests.verify.test_page_cfg" name="t" />'
        "</testsuite></testsuites>",
        encoding="utf-8",
    )
    assert drift.main(["--junit", str(junit), "--output", str(tmp_path / "r.md")]) == 0
    assert "No drift" in (tmp_path / "r.md").read_text(encoding="utf-8")
    bad = tmp_path / "bad.xml"
    bad.write_text(JUNIT.format(cfg_test="t", memory_test="u"), encoding="utf-8")
    assert drift.main(["--junit", str(bad)]) == 1
    assert "3 failed" in capsys.readouterr().out
