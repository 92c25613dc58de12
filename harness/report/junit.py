"""junit.xml: one <testsuite> per scenario, one <testcase> per check.

The dialect is the common one CI tools read (Jenkins, GitLab, GitHub test reporters):
a failed check is a <failure> whose message carries measured vs threshold and whose text
is the check's detail; a skipped check is <skipped message="reason"/>; an invalid run adds
an <error> testcase ``<scenario>.valid`` so CI shows "the run judged nothing", not a pass.
"""

from __future__ import annotations

import datetime as _dt
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from harness.report.common import (
    FAIL,
    SKIP,
    check_state,
    count_checks,
    describe_measure,
    excluded_scenarios,
    invalid_reasons,
    not_judged_reason,
    scenario_verdict,
    skip_reason,
)


def _timestamp(unix: Any) -> str | None:
    if not isinstance(unix, int | float):
        return None
    return _dt.datetime.fromtimestamp(unix, tz=_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _testcase(parent: ET.Element, sc_name: str, check: Mapping[str, Any]) -> str:
    case = ET.SubElement(
        parent, "testcase", classname=f"harness.{sc_name}", name=str(check["id"]), time="0"
    )
    state = check_state(check)
    if state == FAIL:
        failure = ET.SubElement(
            case, "failure", message=f"{check['id']}: {describe_measure(check)}", type="threshold"
        )
        n = check.get("n")
        lines = [describe_measure(check) + (f" (n={n})" if n is not None else "")]
        if check.get("detail"):
            lines.append(str(check["detail"]))
        failure.text = "\n".join(lines)
    elif state == SKIP:
        ET.SubElement(case, "skipped", message=skip_reason(check))
    else:
        props = ET.SubElement(case, "properties")
        ET.SubElement(props, "property", name="measured", value=describe_measure(check))
    return state


def _suite(parent: ET.Element, sc: Mapping[str, Any]) -> tuple[int, int, int, int]:
    name = str(sc["name"])
    checks = sc.get("checks") or []
    counts = count_checks(checks)
    invalid = scenario_verdict(sc) == "invalid"
    not_judged = scenario_verdict(sc) == "not_judged"
    extra = 1 if invalid or not_judged else 0
    attrs = {
        "name": name,
        "tests": str(counts.total + extra),
        "failures": str(counts.failed),
        "errors": "1" if invalid else "0",
        "skipped": str(counts.skipped + (1 if not_judged else 0)),
        "time": f"{float(sc.get('duration_s') or 0):.3f}",
    }
    stamp = _timestamp(sc.get("started_unix"))
    if stamp:
        attrs["timestamp"] = stamp
    suite = ET.SubElement(parent, "testsuite", attrs)
    props = ET.SubElement(suite, "properties")
    for key in ("file", "mode", "verdict", "partial", "capacity_rps"):
        value = scenario_verdict(sc) if key == "verdict" else sc.get(key)
        if value is not None:
            ET.SubElement(
                props,
                "property",
                name=key,
                value=str(value).lower() if isinstance(value, bool) else str(value),
            )
    if invalid:
        case = ET.SubElement(
            suite, "testcase", classname=f"harness.{name}", name=f"{name}.valid", time="0"
        )
        reasons = invalid_reasons(sc)
        err = ET.SubElement(case, "error", message=f"run invalid: {reasons[0]}", type="invalid_run")
        err.text = "\n".join(reasons)
    if not_judged:
        # "not judged" is not a pass: a skipped testcase of its own carries the reason
        case = ET.SubElement(
            suite, "testcase", classname=f"harness.{name}", name=f"{name}.judged", time="0"
        )
        ET.SubElement(case, "skipped", message=f"nothing was judged: {not_judged_reason(sc)}")
    for check in checks:
        _testcase(suite, name, check)
    return (
        counts.total + extra,
        counts.failed,
        1 if invalid else 0,
        counts.skipped + (1 if not_judged else 0),
    )


def _excluded_suite(parent: ET.Element, name: str, reason: str) -> tuple[int, int, int, int]:
    """A scenario left out of the plan before load: one skipped testcase with the reason."""
    suite = ET.SubElement(
        parent,
        "testsuite",
        {"name": name, "tests": "1", "failures": "0", "errors": "0", "skipped": "1", "time": "0"},
    )
    case = ET.SubElement(
        suite, "testcase", classname=f"harness.{name}", name=f"{name}.run", time="0"
    )
    ET.SubElement(case, "skipped", message=f"not run: {reason}")
    return 1, 0, 0, 1


def render_junit(doc: Mapping[str, Any]) -> str:
    """The junit.xml text for a results document."""
    root = ET.Element("testsuites", name="harness")
    totals = [0, 0, 0, 0]
    for sc in doc.get("scenarios") or []:
        for i, v in enumerate(_suite(root, sc)):
            totals[i] += v
    for name, reason in excluded_scenarios(doc):
        for i, v in enumerate(_excluded_suite(root, name, reason)):
            totals[i] += v
    root.set("tests", str(totals[0]))
    root.set("failures", str(totals[1]))
    root.set("errors", str(totals[2]))
    root.set("skipped", str(totals[3]))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
