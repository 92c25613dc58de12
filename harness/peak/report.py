"""summary.md and report.html for ``harness peak`` and ``harness tune``.

Written to be read without the docs: every table says what its columns measure, the
peak says what its interval means, the tune says what it ranked on and why the winner won.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from harness.report.plots import to_data_uri


def _n(v: Any, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and math.isinf(v):
        return "fail"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _p99(d: Mapping[str, Any]) -> str:
    return "failure" if d.get("p99_is_failure") else _n(d.get("p99_ms"))


def _pct(v: Any) -> str:
    return "n/a" if v is None else f"{float(v):.2%}"


def peak_sentence(peak: Mapping[str, Any]) -> str:
    est = peak.get("estimate") or {}
    lo, hi = est.get("low_rps"), est.get("high_rps")
    pk = peak.get("peak_rps", est.get("peak_rps"))
    slo = peak.get("slo_p99_ms")
    limit = est.get("limit")
    if limit == "server_exit":
        held = f"; it had met the SLO in every repeat up to {lo:.1f} req/s" if lo else ""
        n = len(peak.get("points") or [])
        return (
            f"FAILED: {est.get('note')}{held}. A server that dies under load has no peak, "
            f"whatever it held below; the {n} point{'s' if n != 1 else ''} measured are in "
            "the report."
        )
    if limit == "none_met":
        return (
            f"No measured rate met the SLO (p99 <= {slo:g} ms over all requests): {est.get('note')}"
        )
    if pk is None:
        return f"No peak: {est.get('note')}"
    if hi is None:
        why = {
            "generator": "the load generator could not offer more (points invalid above it)",
            "max_rps": "the search's ceiling",
            "budget": f"the search stopped early ({est.get('note')})",
        }.get(str(limit), str(limit))
        return f"Peak >= {lo:.1f} req/s (SLO held there); no upper bound: {why}."
    source = peak.get("peak_from")
    reps = peak.get("repeats")
    head = (
        f"Peak {pk:.1f} req/s under p99 <= {slo:g} ms (errors <= "
        f"{float(peak.get('max_error_rate') or 0):.1%}"
        + (f"; the {source}" if source == "logistic edge" else "")
        + ")"
    )
    if peak.get("interval_from") == "searches":
        ilo, ihi = peak["interval_rps"]
        runs = peak.get("searches") or []
        minutes = sum(float(r.get("elapsed_s") or 0) for r in runs) / 60
        sd = float(peak.get("spread_rps") or 0)
        return (
            head + f": 95 % interval [{ilo:.1f}, {ihi:.1f}] req/s "
            f"({(ihi - ilo) / pk:.0%} of the peak), the mean of {len(runs)} searches"
            + (", each on a freshly started server" if _fresh(runs) else " on one server")
            + f", over {minutes:.0f} min; their peaks moved by sd {sd:.1f} req/s "
            f"({sd / pk:.1%}) and the interval is Student's t over them, so it holds that move"
            " — a slower drift than those minutes show is not in it."
        )
    if peak.get("interval_from") == "edge_ci":
        ilo, ihi = peak["interval_rps"]
        n = (peak.get("edge_fit") or {}).get("n")
        return (
            head + f": 95 % interval [{ilo:.1f}, {ihi:.1f}] req/s "
            f"({(ihi - ilo) / pk:.0%} of the peak; a logistic fit of met/missed over all "
            f"{n} judged points). The SLO held at {lo:.1f} in all {reps} repeats and was "
            f"missed at {hi:.1f} in all {reps}. The interval is this run's: a change of the "
            "server's or the machine's speed between runs is not in it — run again to see "
            "how far the peak moves."
        )
    base = head + f": interval [{lo:.1f}, {hi:.1f}] req/s"
    if est.get("confidence"):
        return (
            base + f" — the SLO held at {lo:.1f} in all {reps} repeats and was missed at "
            f"{hi:.1f} in all {reps}; the edge (the rate met half the time) lies between."
        )
    if limit == "budget":
        return base + f" — the search stopped before its repeats ({est.get('note')})."
    return base + " — one point per rate (no repeats): a bracket, not a confidence interval."


def _fresh(runs: Sequence[Mapping[str, Any]]) -> bool:
    pids = [(r.get("server") or {}).get("pid") for r in runs]
    return len(runs) > 1 and None not in pids and len(set(pids)) == len(pids)


_SEARCH_HEAD = ("search", "peak req/s", "from", "[L, U] req/s", "points", "s", "server pid")


def _search_rows(peak: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for r in peak.get("searches") or []:
        lo, hi = r.get("band_rps") or [None, None]
        rows.append(
            [
                str(r.get("search")),
                _n(r.get("peak_rps")),
                str(r.get("peak_from") or (r.get("estimate") or {}).get("limit")),
                f"[{_n(lo)}, {_n(hi)}]",
                str(r.get("n_points")),
                _n(r.get("elapsed_s"), 0),
                str((r.get("server") or {}).get("pid")),
            ]
        )
    return rows


def fit_sentence(peak: Mapping[str, Any]) -> str:
    f = peak.get("edge_fit")
    if not f:
        return "Logistic edge fit: not enough mixed outcomes to fit."
    lo, hi = f["ci_rps"]
    ci = f"[{_n(lo)}, {_n(hi)}]" if lo is not None and hi is not None else "(open-ended)"
    return (
        f"Logistic edge fit over all {f['n']} judged points: a point meets the SLO half the "
        f"time at {f['edge_rps']:.1f} req/s, {f['confidence']:.0%} interval {ci}; 95 % of "
        f"the time at {f['sustained_rps']:.1f} req/s (scale {f['scale_rps']:.1f} req/s: how "
        "gradually the outcomes turn from met to missed — wide on a noisy box or when the "
        "SLO sits on the latency plateau)."
    )


def curve_figure(peak: Mapping[str, Any]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    curve = peak.get("curve") or []
    fig = Figure(figsize=(9.0, 3.8), dpi=80)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2, 1)
    ax2 = fig.add_subplot(1, 2, 2)
    slo = float(peak.get("slo_p99_ms") or 0)
    rates = [c["rate_rps"] for c in curve]
    ceiling = max([slo * 3] + [c["p99_ms"] or 0 for c in curve if c.get("p99_ms")])
    p99 = [ceiling if c.get("p99_is_failure") else c.get("p99_ms") for c in curve]
    p50 = [c.get("p50_ms") for c in curve]
    colours = {"met": "#2a9d8f", "missed": "#e63946", "insufficient": "#999999"}
    for c, y in zip(curve, p99, strict=True):
        if y is not None:
            ax.scatter([c["rate_rps"]], [y], color=colours.get(c["outcome"], "#999"), zorder=3)
    ax.plot(
        rates, [y if y is not None else math.nan for y in p50], ".-", color="#457b9d", label="p50"
    )
    ax.axhline(slo, color="#e63946", ls="--", lw=1, label=f"SLO {slo:g} ms")
    ilo, ihi = peak.get("interval_rps") or [None, None]
    if ilo and ihi:
        what = "95 % interval" if peak.get("interval_from") in ("edge_ci", "searches") else "[L, U]"
        ax.axvspan(ilo, ihi, color="#f4a261", alpha=0.3, label=f"peak {what}")
    if peak.get("peak_rps"):
        ax.axvline(peak["peak_rps"], color="#f4a261", lw=1.5)
    if peak.get("knee_rps"):
        ax.axvline(peak["knee_rps"], color="#6a4c93", ls=":", lw=1.5, label="knee")
    ax.set_yscale("log")
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("latency (ms); dots: p99 (green met, red missed)")
    ax.legend(fontsize=7)
    ax2.plot(rates, rates, ":", color="#999", label="offered")
    ax2.plot(rates, [c.get("achieved_rps") for c in curve], ".-", label="ok answers/s")
    ax2.plot(rates, [c.get("goodput_rps") for c in curve], ".-", label="goodput (ok within SLO)/s")
    ax2b = ax2.twinx()
    ax2b.plot(
        rates,
        [100 * (c.get("error_rate") or 0) for c in curve],
        "x",
        color="#e63946",
        label="errors %",
    )
    ax2b.set_ylabel("errors (%)")
    ax2.set_xlabel("offered rate (req/s)")
    ax2.set_ylabel("req/s")
    ax2.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def _curve_rows(peak: Mapping[str, Any]) -> list[list[str]]:
    knee = peak.get("knee_rps")
    rows = []
    for c in peak.get("curve") or []:
        mark = " ← knee" if knee is not None and abs(c["rate_rps"] - knee) < 0.01 else ""
        rows.append(
            [
                f"{c['rate_rps']:.1f}{mark}",
                c["outcome"],
                _n(c.get("p50_ms")),
                _p99(c),
                _pct(c.get("error_rate")),
                _n(c.get("achieved_rps")),
                _n(c.get("goodput_rps")),
                str(c.get("n")),
            ]
        )
    return rows


_CURVE_HEAD = [
    "offered req/s",
    "outcome",
    "p50 ms",
    "p99 ms (all requests)",
    "errors",
    "ok req/s",
    "goodput req/s",
    "n",
]


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _invalid(peak: Mapping[str, Any]) -> list[str]:
    return [
        f"- {p['rate_rps']:.1f} req/s: {(p.get('reasons') or ['?'])[0]}"
        for p in peak.get("points") or []
        if p.get("outcome") == "invalid"
    ]


def peak_markdown(doc: Mapping[str, Any]) -> str:
    peak = doc["peak"]
    lines = [
        "# harness peak",
        "",
        f"**{peak_sentence(peak)}**",
        "",
        f"Each point is one open-loop Poisson run at the offered rate, {peak['samples_per_point']} "
        f"requests or more after a warmup (enough for MLPerf's early-stopping rule at "
        f"{peak['confidence']:.0%} when 0.5 % of requests are over the SLO). p99 counts every "
        "request: a failed, timed-out or dropped one is over the SLO. A point *met* the SLO "
        "when that p99 and the error rate held with enough samples; *invalid* points (the "
        "load generator, not the server, was the limit) are left out of the curve.",
        "",
        fit_sentence(peak),
        "",
        f"Knee of the p99 curve: {_n(peak.get('knee_rps'))} req/s. Capacity probe "
        f"(closed loop, no SLO): {_n(peak.get('calibration_rps'))} req/s. "
        f"{len(peak.get('points') or [])} points in {peak.get('elapsed_s')} s; stopped: "
        f"{peak.get('stopped')}.",
        "",
    ]
    if peak.get("searches"):
        lines += [
            "## Searches",
            "",
            "Each search is a whole `harness peak` search (bracketing, bisection, the edge "
            "repeats) on its own server lifetime; its peak is its logistic edge when that "
            "lies in its [L, U], else the midpoint.",
            "",
            _md_table(_SEARCH_HEAD, _search_rows(peak)),
            "",
        ]
    lines += [
        "## Curve (rate → latency, errors, goodput)",
        "",
        _md_table(_CURVE_HEAD, _curve_rows(peak)),
    ]
    bad = _invalid(peak)
    if bad:
        lines += ["", "## Invalid points", "", *bad]
    lines += [
        "",
        (
            "Every point's own results: `search_K/points/point_NN/results.json` "
            "(`harness report search_K/points/point_NN` renders its report)."
            if peak.get("searches")
            else "Every point's own results: `points/point_NN/results.json` "
            "(`harness report points/point_NN` renders its report)."
        ),
        "",
    ]
    return "\n".join(lines)


def _html_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{th}</tr>{trs}</table>"


_CSS = (
    "body{font-family:sans-serif;max-width:1000px;margin:2em auto}table{border-collapse:"
    "collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "th{background:#eee}.lead{font-size:1.1em;font-weight:bold}"
)


def peak_html(doc: Mapping[str, Any]) -> str:
    peak = doc["peak"]
    try:
        img = f'<img alt="latency and goodput vs offered rate" src="{to_data_uri(curve_figure(peak))}">'
    except (ValueError, TypeError) as e:  # too few points to draw
        img = f"<p>(no plot: {html.escape(str(e))})</p>"
    bad = _invalid(peak)
    md = peak_markdown(doc).split("## Searches")[0].split("## Curve")[0]
    searches = (
        "<h2>Searches</h2>" + _html_table(_SEARCH_HEAD, _search_rows(peak))
        if peak.get("searches")
        else ""
    )
    intro = "".join(f"<p>{html.escape(line)}</p>" for line in md.splitlines()[2:] if line.strip())
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>harness peak</title>"
        f"<style>{_CSS}</style></head><body><h1>harness peak</h1>"
        f"<p class='lead'>{html.escape(peak_sentence(peak))}</p>{intro}{img}{searches}"
        f"<h2>Curve (rate → latency, errors, goodput)</h2>"
        f"{_html_table(_CURVE_HEAD, _curve_rows(peak))}"
        + (
            "<h2>Invalid points</h2><ul>"
            + "".join(f"<li>{html.escape(b[2:])}</li>" for b in bad)
            + "</ul>"
            if bad
            else ""
        )
        + "</body></html>"
    )


# --- harness tune -------------------------------------------------------------------------


def _resolution(tune: Mapping[str, Any]) -> str:
    """ "10% " — the margin a separation needs (``tune.standing``), as the tune stored it."""
    tol = (tune.get("peak_config") or {}).get("tolerance")
    return f"{float(tol):.0%} " if tol else ""


def tune_sentence(tune: Mapping[str, Any]) -> str:
    """The tune's answer in one sentence: the recommendation (or why there is none), what
    the winner's quick checklist said, and every configuration that failed or was not
    measured."""
    from harness.peak.tune import FAILED, MEASURED, NOT_MEASURED, status, verdict_of

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
        from harness.peak.tune import met_once

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
    from harness.peak.tune import FAILED, NOT_MEASURED, status

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


def _tune_rows(tune: Mapping[str, Any]) -> list[list[str]]:
    from harness.peak.tune import MEASURED, evidence, status

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
        f"open-loop rate to {pc.get('tolerance', 0):.0%}, every point >= "
        f"{pc.get('samples_per_point')} requests judged by the harness (p99 over all "
        "requests with early stopping, error rate, validity)"
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
    from harness.peak.tune import FAILED, MEASURED, NOT_MEASURED, status

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
    lines += _tune_intro(tune) + ["", "## Ranking", "", _md_table(_TUNE_HEAD, _tune_rows(tune))]
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
    ax.set_ylabel("p99 at the peak (ms)")
    ax.set_title("throughput vs p99 per configuration (red: recommended)", fontsize=9)
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
        + f"{img}<h2>Ranking</h2>{_html_table(_TUNE_HEAD, _tune_rows(tune))}"
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
