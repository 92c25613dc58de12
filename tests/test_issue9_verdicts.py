"""Issue 9, item 1 (and the exit-code mapping of item 12): a PASS must be earned.

Each test reproduces a false PASS (or a hidden failure) of the old verdict rules on a
hand-built scenario result and asserts the new behaviour.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from harness.errors import ExitCode
from harness.finish import exit_code_for, judge
from harness.report.common import verdict_sentence
from harness.report.junit import render_junit
from harness.report.summary import render_summary
from harness.results import new_document
from tests.test_checks import counters, result


def _soak_attached_without_pid() -> dict[str, Any]:
    """``soak`` attached by --target without --sut-pid: no server samples, so every leak
    check skips; only the harness's own bookkeeping (accounting.balanced) passes."""
    return result(
        name="soak",
        check_config={
            "soak.rss_trend": {},
            "soak.threads_trend": {},
            "soak.fds_trend": {},
            "accounting.balanced": {},
        },
        counters=counters(5000),
        windows=None,
    )


def _doc(*scenarios: dict[str, Any]) -> dict[str, Any]:
    doc = new_document(machine={"host": "h"})
    doc["scenarios"] = list(scenarios)
    return doc


def test_issue9_a_scenario_that_judged_nothing_is_not_a_pass() -> None:
    doc = judge(_doc(_soak_attached_without_pid()))
    sc = doc["scenarios"][0]
    states = {c["id"]: c["passed"] for c in sc["checks"]}
    assert states["accounting.balanced"] is True  # the harness counted right…
    assert {states[k] for k in states if k.startswith("soak.")} == {None}  # …nothing else
    # old rule: "pass" unless some check failed → exit 0
    assert sc["verdict"] == "not_judged"
    assert doc["verdict"] == "not_judged"
    assert exit_code_for(doc) == ExitCode.NOT_JUDGED == 4


def test_issue9_skips_are_named_in_the_verdict_line_summary_and_junit() -> None:
    doc = judge(_doc(_soak_attached_without_pid()))
    line = verdict_sentence(doc)
    assert line.startswith("NOT JUDGED")
    assert "soak.rss_trend" in line and "soak.fds_trend" in line
    md = render_summary(doc)
    assert "Nothing was judged (not a pass)" in md
    root = ET.fromstring(render_junit(doc))
    judged = root.find(".//testcase[@name='soak.judged']")
    assert judged is not None
    skipped = judged.find("skipped")
    assert skipped is not None and "no server-side samples" in skipped.get("message", "")


def test_issue9_a_real_failure_is_never_hidden_behind_another_invalid_scenario() -> None:
    """Old rule: invalid > fail overall, so one invalid scenario (say linearity finding a
    config problem at the end) turned 24 judged checks with real failures into exit 3."""
    failing = result(
        name="steady_state",
        check_config={"steady.error_rate": {}},
        counters=counters(900, {"http_500": 100}),
    )
    invalid = result(
        name="spike",
        check_config={"steady.error_rate": {}},
        counters={**counters(1000), "scheduled": 1200},  # accounting off by 200: invalid
    )
    doc = judge(_doc(failing, invalid))
    assert [sc["verdict"] for sc in doc["scenarios"]] == ["fail", "invalid"]
    assert doc["verdict"] == "fail"
    assert exit_code_for(doc) == ExitCode.FAIL
    line = verdict_sentence(doc)
    assert "fail: steady_state" in line and "invalid: spike" in line


def test_issue9_pass_needs_every_scenario_judged() -> None:
    ok = result(
        name="steady_state", check_config={"steady.error_rate": {}}, counters=counters(1000)
    )
    doc = judge(_doc(ok))
    assert doc["verdict"] == "pass" and exit_code_for(doc) == ExitCode.PASS
    doc = judge(_doc(ok, _soak_attached_without_pid()))
    assert doc["verdict"] == "not_judged" and exit_code_for(doc) == ExitCode.NOT_JUDGED


def test_issue9_excluded_scenarios_are_named_and_reported_as_skipped() -> None:
    ok = result(
        name="steady_state", check_config={"steady.error_rate": {}}, counters=counters(1000)
    )
    doc = _doc(ok)
    doc["excluded"] = [{"name": "linearity", "reason": "the server has 1 core here"}]
    doc = judge(doc)
    assert doc["verdict"] == "pass"  # a scenario left out up front does not block a pass
    assert "not run: linearity (the server has 1 core here)" in verdict_sentence(doc)
    assert "`linearity`: the server has 1 core here" in render_summary(doc)
    root = ET.fromstring(render_junit(doc))
    case = root.find(".//testcase[@name='linearity.run']")
    assert case is not None and case.find("skipped") is not None
