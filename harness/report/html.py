"""report.html: one self-contained page (inline CSS, plots as base64 PNG, no scripts).

Layout: overall verdict, the verdict table of every check, run metadata, then one section
per scenario with its numbers and the plots its data supports. Every value taken from the
document is escaped; a plot the data cannot support is replaced by a one-line note.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from harness.analysis.resilience import event_bands
from harness.report import plots
from harness.report.common import (
    SKIP,
    VERDICT_WORDS,
    check_state,
    count_checks,
    document_counts,
    earlier_attempts,
    error_total,
    excluded_scenarios,
    fmt_num,
    fmt_threshold,
    fmt_value,
    hdr_summary,
    invalid_reasons,
    not_judged_reason,
    overall_verdict,
    run_problems,
    scenario_verdict,
    skip_reason,
    verdict_sentence,
)
from harness.report.summary import SERVER_SPLIT_COLUMNS, SERVER_SPLIT_TITLE, server_split_rows
from harness.report.tokens import tokens_html
from harness.results import readers

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0 1em}th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.pass{color:#1b7f3b;font-weight:600}.fail{color:#c62828;font-weight:600}.skipped{color:#777;font-weight:600}
.invalid{color:#b26a00;font-weight:600}.none{color:#555}
.banner{font-size:1.3em;padding:.5em .8em;border-radius:6px;background:#f6f6f6}
.note{color:#666;font-size:.9em;margin:.2em 0}figure{margin:1em 0}img{max-width:100%;height:auto}
figcaption{color:#444;font-size:.9em}section{border-top:2px solid #ddd;margin-top:2em}code{font-size:.95em}
"""
_WORD = VERDICT_WORDS


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _cls(verdict: str | None) -> str:
    if verdict == "not_judged":
        return "skipped"
    return verdict if verdict in ("pass", "fail", "skipped", "invalid") else "none"


def _verdict_table(doc: Mapping[str, Any]) -> str:
    out = [
        "<table><tr><th>scenario</th><th>check</th><th>verdict</th><th>value</th><th>threshold</th><th>n</th><th>detail</th></tr>"
    ]
    for sc in doc.get("scenarios") or []:
        if scenario_verdict(sc) == "invalid":
            reasons = "; ".join(invalid_reasons(sc))
            out.append(
                f'<tr><td><a href="#scenario-{esc(sc["name"])}">{esc(sc["name"])}</a></td><td><em>run validity</em></td>'
                f'<td class="invalid">invalid</td><td></td><td></td><td></td><td>{esc(reasons)}</td></tr>'
            )
        for c in sc.get("checks") or []:
            state = check_state(c)
            detail = skip_reason(c) if state == SKIP else c.get("detail") or ""
            out.append(
                f'<tr><td><a href="#scenario-{esc(sc["name"])}">{esc(sc["name"])}</a></td><td><code>{esc(c["id"])}</code></td>'
                f'<td class="{state}">{state}</td><td class="num">{esc(fmt_value(c))}</td>'
                f'<td class="num">{esc(fmt_threshold(c))}</td><td class="num">{esc(fmt_num(c.get("n")))}</td>'
                f"<td>{esc(detail)}</td></tr>"
            )
    out.append("</table>")
    return "\n".join(out)


def _kv_table(title: str, data: Mapping[str, Any] | None) -> str:
    if not data:
        return f'<p class="note">{esc(title)}: not recorded.</p>'
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(_plain(v))}</td></tr>" for k, v in data.items())
    return f"<h3>{esc(title)}</h3><table>{rows}</table>"


def _plain(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_plain(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_plain(v) for v in value)
    return "—" if value is None else str(value)


def _latency_table(sc: Mapping[str, Any]) -> str:
    rows = []
    for cls, data in (sc.get("by_class") or {}).items():
        if not isinstance(data, Mapping):
            continue
        s = hdr_summary(data.get("latency_hdr"))
        counters = data.get("counters") or {}
        errs = error_total(counters)
        if s is None:
            rows.append(
                f"<tr><td>{esc(cls)}</td><td colspan=6>no successful responses</td><td class='num'>{errs:,}</td></tr>"
            )
            continue
        nums = "".join(
            f'<td class="num">{fmt_num(round(s[k], 3))}</td>'
            for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms")
        )
        low = " (low confidence: n &lt; 1,000)" if s["n"] < 1000 else ""
        rows.append(
            f'<tr><td>{esc(cls)}</td><td class="num">{s["n"]:,}{low}</td>{nums}<td class="num">{errs:,}</td></tr>'
        )
    if not rows:
        return '<p class="note">No per-class latency histograms (by_class) recorded.</p>'
    head = "<tr><th>class</th><th>n ok</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>p99.9 ms</th><th>max ms</th><th>failed</th></tr>"
    return f"<h3>Latency by class (HDR, ok responses)</h3><table>{head}{''.join(rows)}</table>"


def _counters_table(sc: Mapping[str, Any]) -> str:
    c = sc.get("counters") or {}
    if not c:
        return ""
    failed = c.get("failed") or {}
    cells = [
        ("scheduled", c.get("scheduled")),
        ("ok", c.get("ok")),
        ("dropped", c.get("dropped")),
        ("in flight", c.get("in_flight")),
    ]
    if c.get("aborted"):  # streams the load's client aborts hung up on
        cells.append(("aborted by the client", c["aborted"]))
    cells += [(f"failed: {k}", v) for k, v in failed.items() if v]
    head = "".join(f"<th>{esc(k)}</th>" for k, _ in cells)
    body = "".join(f'<td class="num">{esc(fmt_num(v))}</td>' for _, v in cells)
    return f"<h3>Request accounting</h3><table><tr>{head}</tr><tr>{body}</tr></table>"


def _other_measures(sc: Mapping[str, Any]) -> str:
    """Cold start, dispatch lag and fail-fast figures, when the scenario recorded them."""
    cells: list[tuple[str, str]] = []
    if isinstance(sc.get("time_to_ready_s"), int | float):
        cells.append(("time to ready", f"{fmt_num(sc['time_to_ready_s'])} s"))
    first = hdr_summary((sc.get("first_requests") or {}).get("latency_hdr"))
    if first:
        cells.append(
            (f"first {first['n']:,} requests p99", f"{fmt_num(round(first['p99_ms'], 3))} ms")
        )
    for key, label in (
        ("dispatch_lag_hdr", "dispatch lag"),
        ("error_latency_hdr", "failed-request latency"),
    ):
        s = hdr_summary(sc.get(key))
        if s:
            cells.append(
                (
                    f"{label} p50 / p99",
                    f"{fmt_num(round(s['p50_ms'], 3))} / {fmt_num(round(s['p99_ms'], 3))} ms (n={s['n']:,})",
                )
            )
    integ = sc.get("integrity") or {}
    if integ.get("checked"):
        bad = ", ".join(f"{k} {integ.get(k, 0):,}" for k in ("cross_wired", "drift", "id_mismatch"))
        cells.append(("integrity", f"{integ['checked']:,} checked: {bad}"))
    if sc.get("sut"):
        cells.append(("server (this scenario)", _plain(sc["sut"])))
    if not cells:
        return ""
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in cells)
    return f"<h3>Other measurements</h3><table>{rows}</table>"


def _server_split(sc: Mapping[str, Any]) -> str:
    """The server's queue vs compute time per stage (``server_stats``), when it has one."""
    split = server_split_rows(sc)
    if split is None:
        return ""
    rows, missing, note = split
    head = "".join(f"<th>{esc(c)}</th>" for c in SERVER_SPLIT_COLUMNS)
    body = "".join(
        f"<tr><td>{esc(row[0])}</td>"
        + "".join(f'<td class="num">{esc(c)}</td>' for c in row[1:])
        + "</tr>"
        for row in rows
    )
    table = f"<table><tr>{head}</tr>{body}</table>" if rows else ""
    gaps = "".join(f'<p class="note">Not split: {esc(m)}</p>' for m in missing)
    return f'<h3>{esc(SERVER_SPLIT_TITLE.capitalize())}</h3><p class="note">{esc(note)}</p>{table}{gaps}'


def _chaos_list(sc: Mapping[str, Any]) -> str:
    events = sc.get("chaos") or []
    if not events:
        return ""
    items = []
    for ev in events:
        status = "ok" if ev.get("ok") else f"failed: {ev.get('error')}"
        items.append(
            f"<li>{esc(ev.get('action'))} {esc(_plain(ev.get('params') or {}))} "
            f"from {esc(fmt_num(ev.get('start_s')))} s to {esc(fmt_num(ev.get('end_s')))} s — {esc(status)}</li>"
        )
    return f"<h3>Chaos timeline</h3><ul>{''.join(items)}</ul>"


def _merged_windows(sc: Mapping[str, Any]) -> tuple[dict[str, list[Any]] | None, float]:
    """Window rows merged over classes: requests sent, ok, the worst class's p99."""
    rows, width = readers.window_rows(sc)
    if not rows:
        return None, width
    by_t: dict[float, list[Any]] = {}
    for r in rows:
        cell = by_t.setdefault(float(r["t"]), [0, 0, None])
        cell[0] += int(r.get("n") or 0)
        cell[1] += int(r.get("ok") or 0)
        p = r.get("p99_ms")
        if isinstance(p, int | float) and int(r.get("ok") or 0) > 0:
            cell[2] = p if cell[2] is None else max(cell[2], p)
    ts = sorted(by_t)
    return {
        "t": ts,
        "n": [by_t[t][0] for t in ts],
        "ok": [by_t[t][1] for t in ts],
        "p99_ms": [by_t[t][2] for t in ts],
    }, width


_BAND_COLUMNS = (
    ("span (s)", None),
    ("sent", "sent"),
    ("ok/s", "ok_rps"),
    ("error rate", "error_rate"),
    ("p99 ms (median window)", "p99_ms"),
    ("p99 ms (worst window)", "p99_max_ms"),
    ("RSS MiB", "rss_mib"),
    ("threads", "threads"),
    ("non-socket fds", "fds"),
)


def _band_cell(key: str, value: Any) -> str:
    if value is None:
        return "—"
    if key == "error_rate":
        return f"{float(value):.2%}"
    return fmt_num(value)


def _chaos_bands(sc: Mapping[str, Any]) -> str:
    """Before / during / after each chaos event (any action): the steady state around it."""
    events = [
        ev
        for ev in sc.get("chaos") or []
        if isinstance(ev.get("start_s"), int | float) and isinstance(ev.get("end_s"), int | float)
    ]
    if not events:
        return ""
    windows, width = _merged_windows(sc)
    server = (sc.get("server") or {}).get("series") or None
    run_end = sc.get("duration_s")
    run_end = (
        float(run_end)
        if isinstance(run_end, int | float)
        else max(float(ev["end_s"]) for ev in events)
    )
    order = sorted(events, key=lambda e: float(e["start_s"]))
    head = "".join(f"<th>{esc(c)}</th>" for c, _ in _BAND_COLUMNS)
    tables = []
    for ev in order:
        i = (sc.get("chaos") or []).index(ev) + 1
        k = order.index(ev)
        bands = event_bands(
            float(ev["start_s"]),
            float(ev["end_s"]),
            run_end,
            windows,
            width,
            server,
            prev_end_s=float(order[k - 1]["end_s"]) if k > 0 else None,
            next_start_s=float(order[k + 1]["start_s"]) if k + 1 < len(order) else None,
        )
        body = "".join(
            f"<tr><th>{esc(b.label)}</th>"
            f'<td class="num">{esc(fmt_num(b.start_s))}–{esc(fmt_num(b.end_s))}</td>'
            + "".join(
                f'<td class="num">{esc(_band_cell(key, getattr(b, key)))}</td>'
                for _, key in _BAND_COLUMNS[1:]
            )
            + "</tr>"
            for b in bands
        )
        tables.append(
            f'<h4 id="chaos-{i}">#{i} {esc(ev.get("action"))} '
            f"{esc(_plain(ev.get('params') or {}))}</h4>"
            f"<table><tr><th></th>{head}</tr>{body}</table>"
        )
    note = (
        "Each event's steady state: up to 10 s before it, the event itself (a kill or "
        "terminate ends when the restarted server is ready), up to 10 s after it. Requests "
        "count in the span they were sent in; resources are the sampler's medians."
    )
    return (
        f'<h3>Before / during / after each chaos event</h3><p class="note">{esc(note)}</p>'
        + "".join(tables)
    )


def _plots(sc: Mapping[str, Any], slug: str, drawn: Sequence[str | plots.Missing]) -> str:
    figures, notes = [], []
    for (key, caption, _), result in zip(plots.PLOTS, drawn, strict=True):
        if isinstance(result, plots.Missing):
            notes.append(
                f'<li class="note" data-plot="{key}">{esc(caption)} omitted: {esc(result.reason)}.</li>'
            )
            continue
        figures.append(
            f'<figure id="plot-{slug}-{key}"><img alt="{esc(caption)} — {esc(sc["name"])}" src="{result}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>"
        )
    omitted = f'<ul class="omitted">{"".join(notes)}</ul>' if notes else ""
    return "\n".join(figures) + omitted


def _scenario(sc: Mapping[str, Any], index: int, drawn: Sequence[str | plots.Missing]) -> str:
    verdict = scenario_verdict(sc)
    slug = f"{index}-{sc['name']}"
    counts = count_checks(sc.get("checks") or [])
    parts = [
        f'<section id="scenario-{esc(sc["name"])}"><h2>{esc(sc["name"])} — <span class="{_cls(verdict)}">{_WORD.get(verdict, esc(verdict))}</span></h2>',
        f"<p>{esc(counts.text())}; duration {esc(fmt_num(sc.get('duration_s')))} s; mode {esc(sc.get('mode') or '—')}; "
        f"capacity {esc(fmt_num(sc.get('capacity_rps')))} req/s; file <code>{esc(sc.get('file') or '—')}</code></p>",
    ]
    if sc.get("partial"):
        parts.append(
            '<p class="fail">Partial: the scenario was interrupted before it finished.</p>'
        )
    parts += [f'<p class="invalid">{esc(a)}</p>' for a in earlier_attempts(sc)]
    if verdict == "invalid":
        parts += [
            f'<p class="invalid">Run invalid, judges nothing: {esc(r)}</p>'
            for r in invalid_reasons(sc)
        ]
    if verdict == "not_judged":
        parts.append(
            f'<p class="skipped">Nothing was judged (not a pass): {esc(not_judged_reason(sc))}</p>'
        )
    parts += [f'<p class="fail">{esc(p)}</p>' for p in run_problems(sc)]
    parts += [
        f'<p class="skipped">Not measured: {esc(n)}</p>' for n in sc.get("not_measured") or []
    ]
    sut_exit = sc.get("sut_exit")
    tail = sut_exit.get("log_tail") if isinstance(sut_exit, Mapping) else None
    if tail:
        text = "\n".join(map(str, tail)) if isinstance(tail, list) else str(tail)
        parts.append(
            f"<details><summary>server output before it exited</summary><pre>{esc(text)}</pre></details>"
        )
    parts += [
        _counters_table(sc),
        _latency_table(sc),
        _other_measures(sc),
        _server_split(sc),
        tokens_html(sc),
        _chaos_list(sc),
        _chaos_bands(sc),
        _plots(sc, slug, drawn),
        "</section>",
    ]
    return "\n".join(p for p in parts if p)


def render_html(doc: Mapping[str, Any]) -> str:
    """The report.html text for a results document."""
    verdict = overall_verdict(doc)
    counts = document_counts(doc)
    scs = doc.get("scenarios") or []
    partial = (
        '<p class="fail">Partial run: interrupted or the server died; this covers what ran.</p>'
        if doc.get("partial")
        else ""
    )
    body = [
        "<h1>Inference harness report</h1>",
        f'<p class="banner"><span class="{_cls(verdict)}">{_WORD.get(verdict, esc(verdict))}</span> — {esc(counts.text())} '
        f"across {len(scs)} scenario(s). Created {esc(doc.get('created', '?'))}, harness {esc(doc.get('harness_version', '?'))}.</p>",
        f"<p>{esc(verdict_sentence(doc))}</p>",
        partial,
        "<h2>Verdicts</h2>",
        _verdict_table(doc),
        "<h2>Run</h2>",
        _kv_table("Machine", doc.get("machine")),
        _kv_table("Server under test", doc.get("sut")),
        _kv_table("Load generator", doc.get("loadgen")),
    ]
    figures = plots.drawn_all(scs)
    body += [_scenario(sc, i, figures[i]) for i, sc in enumerate(scs)]
    excluded = excluded_scenarios(doc)
    if excluded:
        items = "".join(f"<li><code>{esc(n)}</code>: {esc(why)}</li>" for n, why in excluded)
        body.append(
            f"<h2>Not run</h2><p>Left out of the plan before load started:</p><ul>{items}</ul>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>Harness report — {_WORD.get(verdict, esc(verdict))}</title><style>{_CSS}</style></head>\n<body>\n"
        + "\n".join(b for b in body if b)
        + "\n</body></html>\n"
    )
