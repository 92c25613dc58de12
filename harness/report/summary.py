"""summary.md: the verdict in GitHub-flavoured Markdown, sized for a CI job summary.

``cat summary.md >> "$GITHUB_STEP_SUMMARY"`` shows it on the job page. GitHub renders
inline HTML in job summaries, so every value from the document is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from harness.report.common import (
    FAIL,
    PASS,
    SKIP,
    check_state,
    count_checks,
    document_counts,
    fmt_num,
    fmt_threshold,
    fmt_value,
    invalid_reasons,
    overall_verdict,
    run_problems,
    scenario_verdict,
    skip_reason,
)

ICONS = {"pass": "✅", "fail": "❌", "invalid": "⚠️", "skipped": "⏭️", None: "⏳"}
WORDS = {"pass": "PASS", "fail": "FAIL", "invalid": "INVALID", None: "NOT JUDGED"}


def md(text: Any) -> str:
    """Escape a value for a Markdown table cell (HTML, pipes, newlines)."""
    out = html.escape(str(text), quote=False)
    return out.replace("|", "\\|").replace("\r", " ").replace("\n", "<br>")


def verdict_line(doc: Mapping[str, Any]) -> str:
    verdict = overall_verdict(doc)
    counts = document_counts(doc)
    scs = doc.get("scenarios") or []
    invalid = [sc["name"] for sc in scs if scenario_verdict(sc) == "invalid"]
    line = f"{ICONS[verdict]} **{WORDS[verdict]}** — {counts.text()} across {len(scs)} scenario{'s' if len(scs) != 1 else ''}"
    if invalid:
        line += f"; invalid: {', '.join(md(n) for n in invalid)}"
    return line


def _scenario_table(sc: Mapping[str, Any]) -> list[str]:
    verdict = scenario_verdict(sc)
    checks = sc.get("checks") or []
    head = f"### {ICONS[verdict]} {md(sc['name'])} — {WORDS[verdict].lower()} ({count_checks(checks).text()})"
    lines = [head, ""]
    if sc.get("partial"):
        lines += ["_Partial run: interrupted before the scenario finished._", ""]
    if verdict == "invalid":
        lines += [f"> ⚠️ Run invalid, judges nothing: {md(r)}" for r in invalid_reasons(sc)] + [""]
    problems = run_problems(sc)
    if problems:
        lines += [f"> ❌ {md(p)}" for p in problems] + [""]
    if not checks:
        return [*lines, "_No checks were evaluated._", ""]
    lines += ["| check | verdict | value | threshold | n | detail |", "|---|---|---|---|---|---|"]
    for c in checks:
        state = check_state(c)
        word = {PASS: "pass", FAIL: "fail", SKIP: "skipped"}[state]
        detail = skip_reason(c) if state == SKIP else (c.get("detail") or "")
        lines.append(
            f"| `{md(c['id'])}` | {ICONS[state if state != SKIP else 'skipped']} {word} | {md(fmt_value(c))} | "
            f"{md(fmt_threshold(c))} | {md(fmt_num(c.get('n')))} | {md(detail)} |"
        )
    return [*lines, ""]


def render_summary(doc: Mapping[str, Any]) -> str:
    """The summary.md text for a results document."""
    machine = doc.get("machine") or {}
    sut = doc.get("sut") or {}
    lines = ["## Inference harness verdict", "", verdict_line(doc), ""]
    if doc.get("partial"):
        lines += ["**Partial run** — interrupted or the server died; results cover what ran.", ""]
    meta = [
        f"host `{md(machine.get('host', '?'))}`",
        f"{md(machine.get('cpu_count', '?'))} CPUs",
        f"Python {md(machine.get('python', '?'))}",
        f"harness {md(doc.get('harness_version', '?'))}",
    ]
    if sut.get("target"):
        meta.append(f"target `{md(sut['target'])}`")
    lines += [" · ".join(meta), ""]
    for sc in doc.get("scenarios") or []:
        lines += _scenario_table(sc)
    lines.append("Full report with plots: `report.html` (re-render with `harness report DIR`).")
    return "\n".join(lines) + "\n"
