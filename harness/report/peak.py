"""summary.md and report.html of ``harness peak`` (``doc["peak"]``).

Written to be read without the docs: every table says what its columns measure and the
peak says what its interval means. The tables' and pages' pieces here are shared with
the tune's report (``harness.report.tune``).
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


def _slo(peak: Mapping[str, Any]) -> str:
    from harness.results.peak_records import slo_text

    return slo_text(float(peak.get("slo_p99_ms") or 0), peak.get("slo_tpot_ms"))


def peak_sentence(peak: Mapping[str, Any]) -> str:
    est = peak.get("estimate") or {}
    lo, hi = est.get("low_rps"), est.get("high_rps")
    pk = peak.get("peak_rps", est.get("peak_rps"))
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
        return f"No measured rate met the SLO ({_slo(peak)}): {est.get('note')}"
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
        f"Peak {pk:.1f} req/s under {_slo(peak)} (errors <= "
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
    what = "time to first token" if peak.get("slo_tpot_ms") is not None else "latency"
    ax.set_ylabel(f"{what} (ms); dots: p99 (green met, red missed)")
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
    tokens = peak.get("slo_tpot_ms") is not None
    rows = []
    for c in peak.get("curve") or []:
        mark = " ← knee" if knee is not None and abs(c["rate_rps"] - knee) < 0.01 else ""
        rows.append(
            [
                f"{c['rate_rps']:.1f}{mark}",
                c["outcome"],
                _n(c.get("p50_ms")),
                _p99(c),
                *([_n(c.get("tpot_p99_ms"))] if tokens else []),
                _pct(c.get("error_rate")),
                _n(c.get("achieved_rps")),
                _n(c.get("goodput_rps")),
                str(c.get("n")),
            ]
        )
    return rows


def _curve_head(peak: Mapping[str, Any]) -> list[str]:
    if peak.get("slo_tpot_ms") is None:
        return _CURVE_HEAD
    return [
        "offered req/s",
        "outcome",
        "TTFT p50 ms",
        "TTFT p99 ms (all requests)",
        "TPOT p99 ms",
        "not whole",
        "ok req/s",
        "whole answers/s",
        "n",
    ]


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


def _points_paragraph(peak: Mapping[str, Any]) -> str:
    if peak.get("slo_tpot_ms") is not None:
        return (
            "Each point is one open-loop Poisson run of token streams at the offered rate, "
            "after a warmup, judged in tokens: the p99 time to first token and the p99 time "
            "per output token at their SLOs, each over at least 100 streams, and the share "
            f"of whole answers at {1 - float(peak.get('max_error_rate') or 0):.0%} or more "
            "(an error, a timeout, a truncated stream or one without a token is not one; "
            "more than 1 % of them makes the TTFT p99 a failure). *Invalid* points (the "
            "load generator, not the server, was the limit) are left out of the curve."
        )
    return (
        f"Each point is one open-loop Poisson run at the offered rate, {peak['samples_per_point']} "
        f"requests or more after a warmup (enough for MLPerf's early-stopping rule at "
        f"{peak['confidence']:.0%} when 0.5 % of requests are over the SLO). p99 counts every "
        "request: a failed, timed-out or dropped one is over the SLO. A point *met* the SLO "
        "when that p99 and the error rate held with enough samples; *invalid* points (the "
        "load generator, not the server, was the limit) are left out of the curve."
    )


def peak_markdown(doc: Mapping[str, Any]) -> str:
    peak = doc["peak"]
    lines = [
        "# harness peak",
        "",
        f"**{peak_sentence(peak)}**",
        "",
        _points_paragraph(peak),
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
        _md_table(_curve_head(peak), _curve_rows(peak)),
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
