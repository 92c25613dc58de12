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
    VERDICT_WORDS,
    check_state,
    count_checks,
    earlier_attempts,
    excluded_scenarios,
    fmt_num,
    fmt_threshold,
    fmt_value,
    invalid_reasons,
    not_judged_reason,
    overall_verdict,
    run_problems,
    scenario_verdict,
    skip_reason,
    verdict_sentence,
)
from harness.report.tokens import tokens_markdown

ICONS = {
    "pass": "✅",
    "fail": "❌",
    "invalid": "⚠️",
    "not_judged": "⏭️",
    "skipped": "⏭️",
    None: "⏳",
}
WORDS = VERDICT_WORDS


def md(text: Any) -> str:
    """Escape a value for a Markdown table cell (HTML, pipes, newlines)."""
    out = html.escape(str(text), quote=False)
    return out.replace("|", "\\|").replace("\r", " ").replace("\n", "<br>")


def verdict_line(doc: Mapping[str, Any]) -> str:
    """The CLI's verdict sentence (every skip and exclusion named), with an icon."""
    verdict = overall_verdict(doc)
    word = WORDS.get(verdict, str(verdict).upper())
    text = verdict_sentence(doc).removeprefix(word)
    return f"{ICONS.get(verdict, '⏳')} **{word}**{md(text)}"


def _excluded_section(doc: Mapping[str, Any]) -> list[str]:
    excluded = excluded_scenarios(doc)
    if not excluded:
        return []
    lines = ["### ⏭️ Not run (left out of the plan before load started)", ""]
    lines += [f"- `{md(name)}`: {md(why)}" for name, why in excluded]
    return [*lines, ""]


SERVER_SPLIT_TITLE = "server time split (from the server's statistics)"
SERVER_SPLIT_NOTE = (
    "Read from the server's own statistics ({url}) at each stage's start and end: requests "
    "it finished in between, inferences per model execution, and per request the mean wait "
    "for its batch to start (queue) and its batch's input + model + output time (compute, "
    "counted per request as Triton and perf_analyzer do)."
)
SERVER_SPLIT_COLUMNS = ("stage", "requests", "avg batch", "queue ms", "compute ms")


def server_split_rows(sc: Mapping[str, Any]) -> tuple[list[list[str]], list[str], str] | None:
    """The per-stage split of ``server_stats`` as text cells (stage order), the stages left
    out with why, and the explanation line; None when the run has no server statistics."""
    stats = sc.get("server_stats")
    if not isinstance(stats, Mapping):
        return None
    got = stats.get("stages") or {}
    order = [st.get("name") for st in sc.get("stages") or []]
    order += [name for name in got if name not in order]
    rows = []
    for name in order:
        st = got.get(name)
        if not isinstance(st, Mapping):
            continue
        rows.append(
            [
                str(name),
                fmt_num(st.get("requests")),
                fmt_num(st.get("avg_batch")),
                fmt_num(st.get("queue_ms")),
                fmt_num(st.get("compute_ms")),
            ]
        )
    missing = [f"{name}: {why}" for name, why in (stats.get("missing") or {}).items()]
    return (
        rows,
        missing,
        SERVER_SPLIT_NOTE.format(url=stats.get("url") or "the statistics endpoint"),
    )


def _server_split(sc: Mapping[str, Any]) -> list[str]:
    split = server_split_rows(sc)
    if split is None:
        return []
    rows, missing, note = split
    lines = [f"**{md(SERVER_SPLIT_TITLE)}** — {md(note)}", ""]
    if rows:
        lines += ["| " + " | ".join(SERVER_SPLIT_COLUMNS) + " |", "|---" * 5 + "|"]
        lines += ["| " + " | ".join(md(c) for c in row) + " |" for row in rows]
        lines.append("")
    lines += [f"- not split: {md(m)}" for m in missing]
    return [*lines, ""] if missing else lines


def _scenario_table(sc: Mapping[str, Any]) -> list[str]:
    verdict = scenario_verdict(sc)
    checks = sc.get("checks") or []
    head = f"### {ICONS[verdict]} {md(sc['name'])} — {WORDS[verdict].lower()} ({count_checks(checks).text()})"
    lines = [head, ""]
    if sc.get("partial"):
        lines += ["_Partial run: interrupted before the scenario finished._", ""]
    if sc.get("attempts"):
        lines += [f"> 🔁 {md(a)}" for a in earlier_attempts(sc)] + [""]
    if verdict == "invalid":
        lines += [f"> ⚠️ Run invalid, judges nothing: {md(r)}" for r in invalid_reasons(sc)] + [""]
    if verdict == "not_judged":
        lines += [f"> ⏭️ Nothing was judged (not a pass): {md(not_judged_reason(sc))}", ""]
    problems = run_problems(sc)
    if problems:
        lines += [f"> ❌ {md(p)}" for p in problems] + [""]
    if sc.get("not_measured"):
        lines += [f"> 📏 Not measured: {md(n)}" for n in sc["not_measured"]] + [""]
    if not checks:
        return [*lines, "_No checks were evaluated._", "", *_server_split(sc), *tokens_markdown(sc)]
    lines += ["| check | verdict | value | threshold | n | detail |", "|---|---|---|---|---|---|"]
    for c in checks:
        state = check_state(c)
        word = {PASS: "pass", FAIL: "fail", SKIP: "skipped"}[state]
        detail = skip_reason(c) if state == SKIP else (c.get("detail") or "")
        lines.append(
            f"| `{md(c['id'])}` | {ICONS[state if state != SKIP else 'skipped']} {word} | {md(fmt_value(c))} | "
            f"{md(fmt_threshold(c))} | {md(fmt_num(c.get('n')))} | {md(detail)} |"
        )
    return [*lines, "", *_server_split(sc), *tokens_markdown(sc)]


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
    lines += _excluded_section(doc)
    lines.append("Full report with plots: `report.html` (re-render with `harness report DIR`).")
    return "\n".join(lines) + "\n"
