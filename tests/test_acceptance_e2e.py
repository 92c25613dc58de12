"""`harness acceptance --quick` end to end on the bundled reference server: it passes.

The healthy half of "every check proves itself" (the faulty half is test_detection.py):
the whole quick checklist, run exactly as the README's first command runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.acceptance import CHECKLIST
from harness.acceptance.plan import LLM_CHECKLIST
from harness.testing.detection import share_from_acceptance

REPO = Path(__file__).resolve().parent.parent


def _server_cores() -> int:
    from harness.sut import choose_cores

    return len(choose_cores().sut)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_quick_acceptance_passes_on_the_reference_server(tmp_path):
    argv = [sys.executable, "-m", "harness", "acceptance", "--quick", "--out", str(tmp_path)]
    r = subprocess.run(
        argv,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1400,
    )
    summary = (tmp_path / "summary.md").read_text() if (tmp_path / "summary.md").exists() else ""
    assert r.returncode == 0, r.stdout + r.stderr[-4000:] + summary
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["verdict"] == "pass" and not doc["partial"]
    excluded = {e["name"]: e["reason"] for e in doc.get("excluded") or []}
    if _server_cores() < 2:
        # The server gets one core of two (Locust has the other): nothing to scale over.
        # It is left out before load starts, with the reason, instead of running 90 s to
        # judge nothing. The detection matrix proves linearity on the sim model with both.
        assert set(excluded) == {"linearity"}, excluded
        assert "nothing to scale over" in excluded["linearity"]
        assert "not run: linearity (" in r.stdout  # named on the verdict line
    ran = [n for n in CHECKLIST if n not in excluded]
    assert [sc["name"] for sc in doc["scenarios"]] == ran
    verdict_line = r.stdout.strip().splitlines()[-1]
    for sc in doc["scenarios"]:
        assert sc["verdict"] == "pass", sc["name"]
        for c in sc["checks"]:
            if c["passed"] is None:
                # a skip is never a pass: allowed only when named on the verdict line
                assert c["id"] in verdict_line, f"{c['id']} skipped: {c['skipped']}"
            else:
                assert c["passed"] is True, c
    # the server and the generator ran apart: the server on its cores, Locust and its
    # sampler on the rest (harness.locust_run.core_split)
    if len(os.sched_getaffinity(0)) > 1:
        assert doc["sut"]["cores"] and doc["loadgen"]["cores"], (doc["sut"], doc["loadgen"])
        assert set(doc["sut"]["cores"]).isdisjoint(doc["loadgen"]["cores"])
    # one calibration for the whole checklist, pinned for the scenarios after it
    assert sum(1 for sc in doc["scenarios"] if sc.get("calibration")) == 1
    assert len({sc["capacity_rps"] for sc in doc["scenarios"] if sc.get("capacity_rps")}) == 1
    assert "pinned for the scenarios after it" in r.stderr  # the live progress stream
    for name in ("report.html", "junit.xml", "summary.md"):
        assert (tmp_path / name).stat().st_size > 0
    # the detection matrix's healthy steady-state case, judged there (tests/test_detection.py)
    share_from_acceptance(doc, str(tmp_path), argv)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_llm_acceptance_passes_on_the_reference_llm_server(tmp_path):
    """`harness acceptance --protocol openai --quick` on the bundled reference LLM server:
    every scenario of the LLM checklist passes, each judged in tokens (every check it is
    defined by judged and passed, never skipped). Its scenarios are the detection matrix's
    healthy LLM cases (same scenario, quick length and server), judged there."""
    argv = [
        sys.executable, "-m", "harness", "acceptance", "--protocol", "openai", "--quick",
        "--out", str(tmp_path),
    ]  # fmt: skip
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=840)
    summary = (tmp_path / "summary.md").read_text() if (tmp_path / "summary.md").exists() else ""
    assert r.returncode == 0, r.stdout + r.stderr[-4000:] + summary
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["verdict"] == "pass" and not doc["partial"]
    assert [sc["name"] for sc in doc["scenarios"]] == list(LLM_CHECKLIST)
    for sc in doc["scenarios"]:
        assert sc["verdict"] == "pass" and not sc["validity"], (sc["name"], sc["validity"])
        verdicts = {c["id"]: c["passed"] for c in sc["checks"]}
        assert sc.get("defined_by"), sc["name"]
        for cid in sc["defined_by"]:
            assert verdicts.get(cid) is True, (sc["name"], cid, sc["checks"])
        assert sc["tokens"]["by_class"]["total"]["requests"] > 0, sc["name"]
    share_from_acceptance(doc, str(tmp_path), argv)
