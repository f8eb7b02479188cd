"""The JUnit suite, run through Gradle from pytest so that one runner reports everything."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gradbridge._runtime.gradle import run_task
from gradbridge._runtime.devtree import root

REPO_ROOT = root()
#: the subprojects with JUnit tests of their own
SUBPROJECTS = ("programs", "serve", "spark")

pytestmark = pytest.mark.gradle


def _problem(case):
    for tag in ("failure", "error"):
        element = case.find(tag)
        if element is not None:
            return f"{case.get('classname')}.{case.get('name')}: {element.get('message')}"
    return None


def test_junit_suite_passes():
    # cleanTest: run the suite even when Gradle thinks it is up to date.
    result = run_task(["cleanTest", "test"])
    # the library's tests, the programs' (programs/), gradbridge-serve's (serve/) and gradbridge-spark's (spark/)
    reports = sorted(report for project in (Path(REPO_ROOT), *(Path(REPO_ROOT, p) for p in SUBPROJECTS))
                     for report in (project / "build" / "test-results" / "test").glob("TEST-*.xml"))
    suites = [ET.parse(report).getroot() for report in reports]
    failures = [p for suite in suites for p in map(_problem, suite.iter("testcase")) if p]
    assert result.returncode == 0 and not failures, "\n".join(failures) or result.stdout + result.stderr
    ran = sum(int(suite.get("tests")) for suite in suites)
    skipped = sum(int(suite.get("skipped")) for suite in suites)
    # Every @Test in the sources ran: none silently dropped, none skipped.
    written = sum(len(re.findall(r"^\s*@Test\b", source.read_text(), re.MULTILINE))
                  for tests in (Path(REPO_ROOT, "java", "src", "test"), *(Path(REPO_ROOT, p, "src", "test") for p in SUBPROJECTS))
                  for source in tests.rglob("*.java"))
    assert ran == written and skipped == 0, f"{ran} JUnit tests ran of {written} written, {skipped} skipped"
