"""The token figures of a streaming protocol's run (the results' ``tokens`` section), as
rows the HTML report and summary.md both show: per stage, then per traffic class when
there is more than one — streams, failed, TTFT / TPOT / inter-token p50 and p99, the
longest gap, output tokens per second over the row's span, and the stream problems."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from harness.report.common import fmt_num

TITLE = "Token streams"
COLUMNS = (
    "stage / class",
    "streams",
    "failed",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "TPOT p50 ms",
    "TPOT p99 ms",
    "ITL p99 ms",
    "longest gap ms",
    "tokens out/s",
    "problems",
)
NOTE = (
    "TTFT from each request's intended send time to its first token-bearing event; TPOT "
    "per request = (last − first token) / (tokens − 1); ITL per event; over the requests "
    "that got a whole answer (docs/llm-metrics.md). Tokens out/s: output tokens of the row's "
    "streams over the row's span."
)


def _row(label: str, cell: Mapping[str, Any], span_s: float | None) -> list[str]:
    def pct(hist: str, p: str) -> str:
        return fmt_num((cell.get(f"{hist}_ms") or {}).get(f"{p}_ms"))

    problems = (cell.get("goodput") or {}).get("by_problem") or {}
    out = int(cell.get("tokens_out") or 0)
    rate = fmt_num(out / span_s) if span_s else "—"
    return [
        label,
        str(int(cell.get("requests") or 0)),
        str(int(cell.get("failed") or 0)),
        pct("ttft", "p50"),
        pct("ttft", "p99"),
        pct("tpot", "p50"),
        pct("tpot", "p99"),
        pct("itl", "p99"),
        pct("max_gap", "max"),
        rate,
        ", ".join(f"{k} {v}" for k, v in sorted(problems.items()) if v) or "none",
    ]


def token_rows(sc: Mapping[str, Any]) -> list[list[str]] | None:
    """The table's rows (``COLUMNS``), or None when the run recorded no streams."""
    tokens = sc.get("tokens")
    if not tokens:
        return None
    spans = {
        str(s.get("name")): float(s["end_s"]) - float(s["start_s"])
        for s in sc.get("stages") or []
        if isinstance(s.get("start_s"), int | float) and isinstance(s.get("end_s"), int | float)
    }
    by_stage = (tokens.get("by_stage") or {}).get("classes") or {}
    order = [n for n in spans if n in by_stage] + [n for n in by_stage if n not in spans]
    rows = [_row(stage, by_stage[stage], spans.get(stage)) for stage in order]
    classes = (tokens.get("by_class") or {}).get("classes") or {}
    if len(classes) > 1:
        whole = float(sc.get("duration_s") or 0.0) or None
        rows += [_row(f"class {c}", cell, whole) for c, cell in classes.items()]
    return rows


def tokens_html(sc: Mapping[str, Any]) -> str:
    rows = token_rows(sc)
    if rows is None:
        return ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join(
        "<tr><td>"
        + html.escape(r[0])
        + "</td>"
        + "".join(f'<td class="num">{html.escape(c)}</td>' for c in r[1:-1])
        + f"<td>{html.escape(r[-1])}</td></tr>"
        for r in rows
    )
    return (
        f'<h3>{TITLE}</h3><p class="note">{html.escape(NOTE)}</p>'
        f"<table><tr>{head}</tr>{body}</table>"
    )


def tokens_markdown(sc: Mapping[str, Any]) -> Sequence[str]:
    """The same table as Markdown lines (empty without streams)."""
    rows = token_rows(sc)
    if rows is None:
        return []
    lines = [f"{TITLE}:", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return [*lines, ""]
