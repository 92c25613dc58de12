"""The end of every run: judge the results document, write the reports, pick the exit code.

Used by the Locust plugin at the end of a plain ``locust -f`` run and by ``harness
acceptance`` / ``harness run`` on the merged document, so both give the same verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.errors import ExitCode
from harness.results import combine_verdicts, load_document, write_document


def judge(doc: dict[str, Any], checklist: str | Path | None = None) -> dict[str, Any]:
    """(Re)evaluate every scenario's checks, with the checklist's overrides, in place.

    Every planned scenario counts: one that did not run (``excluded``: left out before
    load, or stopped by a configuration error) makes the run's verdict at best
    "not_judged", unless it is ``optional`` (this machine cannot host its question) or the
    user accepted it (``allow_skip``: the checklist's, or ``--allow-skip`` recorded in the
    document)."""
    from harness.checks import judge_scenario, load_checklist

    overrides = dict(load_checklist(checklist)) if checklist is not None else {}
    allowed = [*(overrides.get("allow_skip") or ()), *(doc.get("allow_skip") or ())]
    if allowed:
        overrides["allow_skip"] = list(dict.fromkeys(allowed))
    for sc in doc["scenarios"]:
        if sc.get("no_results"):  # a scenario whose run wrote nothing: its failure stands
            continue
        judge_scenario(sc, overrides)
    verdicts = [sc.get("verdict") for sc in doc["scenarios"]]
    for e in doc.get("excluded") or []:
        if e.get("name") in allowed:
            e["optional"] = True
        if not e.get("optional"):
            verdicts.append("not_judged")
    doc["verdict"] = combine_verdicts(verdicts)
    return doc


def judge_live(
    scenario_result: Mapping[str, Any], checklist: str | Path | None = None
) -> dict[str, Any]:
    """A judged copy of one scenario result of a run still going (the web UI's live
    Checklist tab): the same checks and validity rules as the end of the run."""
    import copy

    from harness.checks import judge_scenario, load_checklist

    sc = copy.deepcopy(dict(scenario_result))
    judge_scenario(sc, load_checklist(checklist) if checklist is not None else None)
    return sc


def load_judging() -> None:
    """Import the checks now (numpy, scipy: about a second), not on the first live
    snapshot a web UI asks for while the load runs."""
    import harness.checks  # noqa: F401


def exit_code_for(doc: Mapping[str, Any]) -> ExitCode:
    """0 pass · 1 a check failed · 3 invalid, or interrupted before anything failed ·
    4 nothing was judged. A failure anywhere wins: it is a finding about the server,
    whatever else went wrong with the measurement of another scenario."""
    verdict = doc.get("verdict")
    if verdict == "fail":
        return ExitCode.FAIL
    if doc.get("partial"):
        return ExitCode.INVALID
    return ExitCode.for_verdict(verdict)


# Set by `harness run`/`acceptance` for the Locust process it starts: the parent judges the
# merged document again and renders the reports once, at the top of --out, so the child
# renders none (matplotlib's import and the plots: ~2 s a scenario).
PARENT_RENDERS_ENV = "HARNESS_PARENT_RENDERS"


# What finish() imports on its first call (the checks: scipy; the reports: matplotlib;
# ~0.8 s together), for a caller that loads them ahead (harness.locust_run.ImportWhenWritten).
FINISH_IMPORTS = (
    "harness.checks",
    "harness.report.html",
    "harness.report.junit",
    "harness.report.summary",
)


def finish(
    out_dir: str | Path,
    checklist: str | Path | None = None,
    doc: dict[str, Any] | None = None,
    render: bool = True,
    html: bool = True,
) -> tuple[dict[str, Any], ExitCode]:
    """Judge ``out_dir/results.json`` (or ``doc``), rewrite it, render the reports
    (unless ``render`` is false; report.html only when ``html``)."""
    out = Path(out_dir)
    if doc is None:
        doc = load_document(out / "results.json")
    judge(doc, checklist)
    write_document(out / "results.json", doc)
    if render:
        from harness.report import render_all

        render_all(doc, out, html=html)
    return doc, exit_code_for(doc)


def verdict_line(doc: Mapping[str, Any]) -> str:
    """The one-line verdict (every skip and exclusion named) for the Locust plugin, which
    reaches the judging side only through this module."""
    from harness.report.common import verdict_sentence

    return verdict_sentence(doc)
