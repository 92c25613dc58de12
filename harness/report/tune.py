"""summary.md and report.html of ``harness tune`` (``doc["tune"]``).

Written to be read without the docs: the tune says what it ranked on and why the winner
won, and names every configuration that failed or was not measured.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from harness.report.peak import _CSS, _html_table, _md_table, _n
from harness.report.plots import to_data_uri
from harness.results.peak_records import (
    FAILED,
    MEASURED,
    NOT_MEASURED,
    evidence,
    met_once,
    status,
    verdict_of,
)


def _resolution(tune: Mapping[str, Any]) -> str:
    """ "10% " — the margin a separation needs (``tune.standing``), as the tune stored it."""
    tol = (tune.get("peak_config") or {}).get("tolerance")
    return f"{float(tol):.0%} " if tol else ""


def tune_sentence(tune: Mapping[str, Any]) -> str:
    """The tune's answer in one sentence: the recommendation (or why there is none), what
    the winner's quick checklist said, and every configuration that failed or was not
    measured."""
    if tune.get("interrupted"):
        return (
            f"Interrupted after {tune.get('measured', 0)} of {tune.get('space_size', '?')} "
            "configurations: no recommendation (the search did not finish); the same command "
            "resumes from tune_state.json."
        )
    ranked = tune.get("ranked") or []
    verdict, left_open = verdict_of(tune)
    tail = _unranked_tail(ranked, left_open)
    if not any(status(r) == MEASURED for r in ranked):
        word = "FAILED" if verdict == "fail" else "INVALID"
        return f"{word}: no configuration was measured, nothing to recommend{tail}."
    fastest = tune.get("fastest", tune.get("recommended"))
    if not fastest:
        return f"No configuration met the SLO at any rate measured: nothing to recommend{tail}."
    top = next(r for r in ranked if r["key"] == fastest)
    chk = tune.get("checklist") or {}
    if chk.get("verdict") == "fail":
        checks = ", ".join(chk.get("failed_checks") or [])
        nxt = next(
            (
                r
                for r in ranked
                if r["key"] != fastest and status(r) == MEASURED and r.get("peak_rps")
            ),
            None,
        )
        return (
            f"FAILED: {fastest}, the fastest configuration measured (peak "
            f"{top['peak_rps']:.1f} req/s under the SLO), failed its quick checklist"
            + (f" ({checks})" if checks else "")
            + ": not recommended. Nothing is recommended"
            + (
                f": the next one, {nxt['key']} (peak {float(nxt['peak_rps']):.1f} req/s), was "
                "not checked"
                if nxt
                else ""
            )
            + f"{tail}."
        )
    rec = tune.get("recommended")
    text = f"Recommended: {rec} — peak {top['peak_rps']:.1f} req/s under the SLO"
    tied = tune.get("tied_with_recommended") or []
    dflt = tune.get("default")
    if tune.get("default_is_best"):
        text += "; the default configuration is already the best measured"
    elif tune.get("margin_over_default") is not None and dflt in tied:
        # a peak the search did not separate from the default's is not a win over it
        text += (
            f"; not measurably better than the default ({dflt}): its peak is "
            f"{tune['margin_over_default']:+.0%} against the default's, but the two share "
            "rank 1"
        )
    elif tune.get("margin_over_default") is not None:
        text += (
            f", {tune['margin_over_default']:+.0%} over the default ({dflt}, which missed the "
            f"SLO from a rate {_resolution(tune)}below one a better-ranked configuration held)"
        )
    elif any(r["key"] == dflt and status(r) == MEASURED for r in ranked):
        text += f"; the default ({dflt}) met the SLO at no rate measured"
    if tune.get("margin_over_worst") is not None:
        zero = [r for r in ranked if r.get("peak_rps") == 0.0]
        # met nowhere, or met somewhere but missed at least once at every rate it measured
        # (its repeats disagreed): not the same statement
        none_met = [r["key"] for r in zero if not met_once(r)]
        mixed = [r["key"] for r in zero if met_once(r)]
        text += (
            f"; {tune['margin_over_worst']:+.0%} over the lowest peak measured ({tune['worst']})"
            + (f" — {', '.join(none_met)} met the SLO at no rate" if none_met else "")
            + (
                f"; {', '.join(mixed)} met the SLO in every repeat at no rate (each rate "
                "measured missed at least once)"
                if mixed
                else ""
            )
        )
    if tied:
        text += (
            f". Tied at rank 1 with {', '.join(tied)}: the search did not separate them "
            f"(neither held the SLO {_resolution(tune)}above a rate where the other missed "
            "it); the recommendation is the higher peak, or within the tolerance the lower "
            "CPU ms/request"
        )
    text += _checklist_clause(tune)
    if left_open:
        text += (
            f". NOT a full answer: {', '.join(left_open)} could not be measured and "
            f"{'was' if len(left_open) == 1 else 'were'} not measured worse than the "
            "recommendation, which is only the best of the rest"
        )
    lost = [r for r in ranked if status(r) in (FAILED, NOT_MEASURED)]
    return text + (tail if lost else "") + "."


def _checklist_clause(tune: Mapping[str, Any]) -> str:
    chk = tune.get("checklist")
    if not chk:
        if tune.get("checklist_skipped"):
            return (
                f". Its quick checklist was not run ({tune['checklist_skipped']}): the "
                "recommendation is the fastest measured, not checked for leaks or failures"
            )
        return ""
    verdict = chk.get("verdict")
    if verdict == "pass":
        return ". Its quick checklist passed"
    what = {"invalid": "INVALID", "not_judged": "NOT JUDGED (it judged nothing)"}
    return (
        f". Its quick checklist was {what.get(str(verdict), str(verdict))}: the "
        "recommendation is unconfirmed"
    )


def _unranked_tail(ranked: Sequence[Mapping[str, Any]], left_open: Sequence[str]) -> str:
    """ ". Failed (never recommended): k — crashed at …; not measured: k — its budget …" """
    bad = [f"{r['key']} ({r.get('status_reason')})" for r in ranked if status(r) == FAILED]
    lost = [
        f"{r['key']} ({r.get('status_reason') or 'every point invalid'})"
        for r in ranked
        if status(r) == NOT_MEASURED
    ]
    out = ""
    if bad:
        out += f". Failed, never recommended: {'; '.join(bad)}"
    if lost:
        out += f". Not measured, never ranked: {'; '.join(lost)}"
    return out


_TUNE_HEAD = [
    "rank",
    "configuration",
    "peak req/s under SLO",
    "missed at req/s",
    "p50 / p99 at peak (ms)",
    "CPU ms / request",
    "RSS MiB",
    "points",
    "note",
]
# a tune judged in tokens (--protocol openai): the latency is the time to first token, and
# the time per output token at the peak has its column
_TUNE_HEAD_TOKENS = [
    *_TUNE_HEAD[:4],
    "TTFT p50 / p99 at peak (ms)",
    "TPOT p99 at peak (ms)",
    *_TUNE_HEAD[5:],
]


def in_tokens(tune: Mapping[str, Any]) -> bool:
    """The tune was judged in tokens (its section has a TPOT bound)."""
    return tune.get("slo_tpot_ms") is not None


def tune_head(tune: Mapping[str, Any]) -> list[str]:
    return _TUNE_HEAD_TOKENS if in_tokens(tune) else _TUNE_HEAD


def _tune_rows(tune: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    front = set(tune.get("pareto") or [])
    ranked = tune.get("ranked") or []
    shared = [r.get("rank") for r in ranked]
    for i, r in enumerate(ranked, start=1):
        level = r.get("rank", i)  # results written before ranks were stored: their position
        label = "–" if level is None else ("=" if shared.count(level) > 1 else "") + str(level)
        note = []
        if r["key"] == tune.get("recommended"):
            note.append("recommended")
        elif r["key"] == tune.get("fastest"):
            note.append("fastest; NOT recommended: its quick checklist failed")
        if r["key"] == tune.get("default"):
            note.append("default")
        if r["key"] in front:
            note.append("Pareto")
        st = status(r)
        held, missed_from = evidence(r)
        if st != MEASURED:
            seen = (
                f"; met up to {_n(held)}, missed from {_n(missed_from)}" if r.get("points") else ""
            )
            note.append(
                f"{st.replace('_', ' ')}: {r.get('status_reason') or 'every point invalid'}{seen}"
            )
        elif r.get("limit") not in ("slo", None):
            note.append(f"limit: {r.get('limit')} ({r.get('stopped')})")
        if r.get("peak_rps") is not None and (
            _n(held or 0.0) != _n(r.get("peak_rps")) or _n(missed_from) != _n(r.get("upper_rps"))
        ):
            # the rank is judged where every outcome agrees, wider than [L, U] here
            note.append(
                f"ranked on every outcome: met up to {_n(held)}, missed from {_n(missed_from)}"
            )
        rows.append(
            [
                label,
                r["key"],
                st.replace("_", " ") if st != MEASURED else _n(r.get("peak_rps")),
                _n(r.get("upper_rps")),
                f"{_n(r.get('p50_at_peak_ms'))} / {_n(r.get('p99_at_peak_ms'))}",
                *([_n(r.get("tpot_p99_at_peak_ms"))] if in_tokens(tune) else []),
                _n(r.get("cpu_ms_per_request"), 2),
                _n(r.get("rss_mib")),
                str(r.get("n_points")),
                "; ".join(note),
            ]
        )
    return rows


def _tune_intro(tune: Mapping[str, Any]) -> list[str]:
    pc = tune.get("peak_config") or {}
    space = ", ".join(k + "=" + ",".join(v) for k, v in tune["space"].items())
    ranked = tune.get("ranked") or []
    lifetimes = sum(int(r.get("lifetimes") or 1) for r in ranked)
    return [
        f"Objective: {tune['objective']}.",
        f"Search: {tune['mode']} over {tune['space_size']} configurations of "
        f"`{tune['template']}` ({space}); "
        f"{_searched(ranked)}, {len(tune.get('pruned') or [])} not searched (below), "
        f"in {tune['elapsed_s']:.0f} s"
        + (" (resumed from its state file)" if tune.get("resumed") else "")
        + ".",
        "Each configuration: its own server started, then bracketing and bisection of the "
        f"open-loop rate to {pc.get('tolerance', 0):.0%}, "
        + (
            "every point's streams judged by the harness (TTFT and TPOT p99, whole answers, "
            "stream integrity, validity; each token check needs 100 streams)"
            if in_tokens(tune)
            else f"every point >= {pc.get('samples_per_point')} requests judged by the harness "
            "(p99 over all requests with early stopping, error rate, validity)"
        )
        + (
            f"; each repeat at a rate on a fresh server ({lifetimes} server lifetimes in all)"
            if lifetimes > len(ranked)
            else ""
        )
        + ". *Peak* is the highest rate that met the SLO below every rate that missed it; "
        "CPU and RSS are the server's at that rate.",
    ]


def _searched(ranked: Sequence[Mapping[str, Any]]) -> str:
    """ "5 searched (3 measured, 1 failed, 1 not measured)" """
    n = {s: sum(1 for r in ranked if status(r) == s) for s in (MEASURED, FAILED, NOT_MEASURED)}
    parts = [f"{n[MEASURED]} measured"]
    parts += [f"{n[FAILED]} failed"] if n[FAILED] else []
    parts += [f"{n[NOT_MEASURED]} not measured"] if n[NOT_MEASURED] else []
    return f"{len(ranked)} searched ({', '.join(parts)})"


_H2H_INTRO = (
    "Separations that alone kept a configuration out of rank 1, measured again "
    "alternately (the worse one at the rate it missed from, the better one at the rate it "
    "held, each point on a fresh server), so that a drift over minutes falls on both sides:"
)


def head_to_head_lines(tune: Mapping[str, Any]) -> list[str]:
    return [
        f"{c['better']} (held {c['held_rps']:.1f} req/s) over {c['worse']} (missed from "
        f"{c['missed_rps']:.1f}): "
        + (
            f"{', '.join(c['failed'])} failed — its server died during the rounds"
            if c.get("failed")
            else f"stands — reproduced in {c['rounds_reproduced']} alternating rounds"
            if c["stands"]
            else "not reproduced — not separated, they share a rank"
        )
        for c in tune.get("head_to_head") or []
    ]


def tune_markdown(doc: Mapping[str, Any]) -> str:
    tune = doc["tune"]
    lines = ["# harness tune", "", f"**{tune_sentence(tune)}**", ""]
    if tune.get("recommended_cmd"):
        lines += ["```", tune["recommended_cmd"], "```", ""]
    lines += _tune_intro(tune) + [
        "",
        "## Ranking",
        "",
        _md_table(tune_head(tune), _tune_rows(tune)),
    ]
    if tune.get("pruned"):
        lines += ["", "## Not searched", ""]
        lines += [f"- {p['key']}: {p['reason']}" for p in tune["pruned"]]
    if tune.get("head_to_head"):
        lines += ["", "## Head to head", "", _H2H_INTRO, ""]
        lines += [f"- {x}" for x in head_to_head_lines(tune)]
    chk = tune.get("checklist")
    if chk:
        lines += ["", "## Quick checklist on the fastest configuration", "", chk["line"]]
    lines += ["", "Each configuration's points: `configs/<configuration>/points/`.", ""]
    return "\n".join(lines)


def pareto_figure(tune: Mapping[str, Any]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.2), dpi=80)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    front = set(tune.get("pareto") or [])
    pts = [r for r in tune.get("ranked") or [] if r.get("peak_rps") and r.get("p99_at_peak_ms")]
    for r in pts:
        on = r["key"] in front
        colour = (
            "#e63946" if r["key"] == tune.get("recommended") else ("#2a9d8f" if on else "#999999")
        )
        ax.scatter([r["peak_rps"]], [r["p99_at_peak_ms"]], color=colour, zorder=3)
        ax.annotate(r["key"], (r["peak_rps"], r["p99_at_peak_ms"]), fontsize=6)
    fr = sorted((r for r in pts if r["key"] in front), key=lambda r: r["peak_rps"])
    if len(fr) > 1:
        ax.plot(
            [r["peak_rps"] for r in fr],
            [r["p99_at_peak_ms"] for r in fr],
            "--",
            color="#2a9d8f",
            label="Pareto front",
        )
    ax.axhline(float(tune.get("slo_p99_ms") or 0), color="#e63946", ls=":", lw=1, label="SLO")
    ax.set_xlabel("peak req/s under the SLO")
    what = "TTFT p99" if in_tokens(tune) else "p99"
    ax.set_ylabel(f"{what} at the peak (ms)")
    ax.set_title(f"throughput vs {what} per configuration (red: recommended)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def tune_html(doc: Mapping[str, Any]) -> str:
    tune = doc["tune"]
    try:
        img = f'<img alt="throughput vs p99 per configuration" src="{to_data_uri(pareto_figure(tune))}">'
    except (ValueError, TypeError) as e:
        img = f"<p>(no plot: {html.escape(str(e))})</p>"
    cmd = (
        f"<pre>{html.escape(tune['recommended_cmd'])}</pre>" if tune.get("recommended_cmd") else ""
    )
    pruned = "".join(
        f"<li>{html.escape(p['key'])}: {html.escape(p['reason'])}</li>"
        for p in tune.get("pruned") or []
    )
    chk = tune.get("checklist")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>harness tune</title>"
        f"<style>{_CSS}</style></head><body><h1>harness tune</h1>"
        f"<p class='lead'>{html.escape(tune_sentence(tune))}</p>{cmd}"
        + "".join(f"<p>{html.escape(x)}</p>" for x in _tune_intro(tune))
        + f"{img}<h2>Ranking</h2>{_html_table(tune_head(tune), _tune_rows(tune))}"
        + (f"<h2>Not searched</h2><ul>{pruned}</ul>" if pruned else "")
        + (
            f"<h2>Head to head</h2><p>{html.escape(_H2H_INTRO)}</p><ul>"
            + "".join(f"<li>{html.escape(x)}</li>" for x in head_to_head_lines(tune))
            + "</ul>"
            if tune.get("head_to_head")
            else ""
        )
        + (
            "<h2>Quick checklist on the fastest configuration</h2>"
            f"<p>{html.escape(chk['line'])}</p>"
            if chk
            else ""
        )
        + "</body></html>"
    )
