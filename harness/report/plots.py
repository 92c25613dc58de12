"""The report's plots, drawn with matplotlib's Agg canvas (no pyplot global state, no display).

Each plot function takes one scenario result and returns a ``Figure``, or a ``Missing``
with a one-line reason when the scenario's data does not support that plot — the report
then prints the reason instead of the image. Lines drawn here (trend, USL fit) are drawing
aids; verdicts come from ``harness.checks`` and are never recomputed here. The USL curve is
the fit stored in ``linearity.usl`` (``harness.results.readers.usl_params``), not refitted.
"""

from __future__ import annotations

import base64
import io
import math
import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.analysis.linearity import usl
from harness.report.common import numeric_series, trend_line
from harness.results import readers

DPI = 80
_WIDE = (9.0, 3.6)
_CHAOS_COLOURS = {"cpu_hog": "#f4a261", "pause": "#9d4edd", "kill": "#e63946"}
_CHAOS_COLOURS["terminate"] = "#457b9d"


@dataclass(frozen=True)
class Missing:
    """Why a plot was omitted (one line, shown in the report)."""

    reason: str


def to_data_uri(fig: Figure) -> str:
    """PNG bytes of a figure as a ``data:`` URI, so report.html needs no other file."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _margins(fig: Figure, width: float, height: float) -> None:
    # Fixed margins in inches: matplotlib's constrained/tight layout doubled render time.
    fig.subplots_adjust(
        left=0.75 / width,
        right=1 - 0.2 / width,
        top=1 - 0.4 / height,
        bottom=0.55 / height,
        hspace=0.45,
        wspace=0.25,
    )


def _figure(
    rows: int = 1, size: tuple[float, float] = _WIDE, sharex: bool = True
) -> tuple[Figure, Sequence[Any]]:
    width, height = size[0], size[1] * rows
    fig = Figure(figsize=(width, height))
    _margins(fig, width, height)
    axes = fig.subplots(rows, 1, sharex=sharex, squeeze=False)[:, 0]
    return fig, list(axes)


def _rows(sc: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], float]:
    rows, width = readers.window_rows(sc)
    return list(rows), width


def _shade_chaos(ax: Any, sc: Mapping[str, Any]) -> None:
    """Every chaos event (whatever its action) as a shaded band from its start to its end
    — a kill's and a terminate's end when the restarted server is ready — numbered #i as
    in the report's before / during / after table."""
    seen: set[str] = set()
    for i, ev in enumerate(sc.get("chaos") or []):
        start, end = ev.get("start_s"), ev.get("end_s")
        if not isinstance(start, int | float):
            continue
        action = str(ev.get("action", "chaos"))
        colour = _CHAOS_COLOURS.get(action, "#adb5bd")
        label = None if action in seen else action
        seen.add(action)
        if isinstance(end, int | float) and end > start:
            ax.axvspan(start, end, color=colour, alpha=0.25, label=label, lw=0)
        else:
            ax.axvline(start, color=colour, lw=2, label=label)
        ax.annotate(
            f"#{i + 1}",
            (start, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -10),
            textcoords="offset points",
            fontsize="x-small",
            color=colour,
        )


def latency(sc: Mapping[str, Any]) -> Figure | Missing:
    rows, _ = _rows(sc)
    classes = sorted(
        {str(r.get("class")) for r in rows if isinstance(r.get("p99_ms"), int | float)}
    )
    if not classes:
        return Missing("no latency windows (windows.rows) with percentiles were recorded")
    fig, (ax,) = _figure()
    for i, cls in enumerate(classes):
        mine = [r for r in rows if str(r.get("class")) == cls]
        colour = f"C{i}"
        for key, style, label in (("p99_ms", "-", "p99"), ("p50_ms", "--", "p50")):
            t, v = numeric_series([r.get(key) for r in mine], [r["t"] for r in mine])
            if len(t):
                ax.plot(t, v, style, color=colour, lw=1.2, label=f"{cls} {label}")
    _shade_chaos(ax, sc)
    ax.set_ylabel("latency (ms)")
    ax.set_xlabel("time since start (s)")
    ax.set_title("Latency percentiles per window, by priority class")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small", ncols=3)
    return fig


def throughput(sc: Mapping[str, Any]) -> Figure | Missing:
    rows, width = _rows(sc)
    if not rows:
        return Missing("no windows (windows.rows) were recorded")
    ts = sorted({float(r["t"]) for r in rows})
    index = {t: i for i, t in enumerate(ts)}
    ok = np.zeros(len(ts))
    errors: dict[str, np.ndarray] = {}
    for r in rows:
        i = index[float(r["t"])]
        ok[i] += float(r.get("ok") or 0)
        for kind, n in (r.get("errors") or {}).items():
            if isinstance(n, int | float) and n:
                errors.setdefault(str(kind), np.zeros(len(ts)))[i] += n
    fig, (ax1, ax2) = _figure(2, (9.0, 2.6))
    ax1.plot(ts, ok / width, color="C0", lw=1.2, label="ok")
    ax1.set_ylabel("ok (req/s)")
    ax1.set_title("Throughput and errors by kind")
    ax1.set_ylim(bottom=0)
    _shade_chaos(ax1, sc)
    for i, (kind, counts) in enumerate(sorted(errors.items())):
        ax2.plot(ts, counts / width, color=f"C{i + 1}", lw=1.2, label=kind)
    if not errors:
        ax2.text(0.5, 0.5, "no failed requests", ha="center", va="center", transform=ax2.transAxes)
    _shade_chaos(ax2, sc)
    ax2.set_ylabel("errors (/s)")
    ax2.set_xlabel("time since start (s)")
    ax2.set_ylim(bottom=0)
    ax1.legend(fontsize="small")
    if errors:
        ax2.legend(fontsize="small", ncols=4)
    return fig


def _server_metric(sc: Mapping[str, Any], needle: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The first scraped ``/metrics`` series whose name contains ``needle``, its labels'
    series added up (one value per scrape)."""
    found: dict[float, float] = {}
    for key, ser in ((sc.get("metrics") or {}).get("series") or {}).items():
        if needle in key.split("{")[0]:
            for t, v in zip(ser.get("t") or [], ser.get("v") or [], strict=False):
                found[t] = found.get(t, 0.0) + float(v)
    if not found:
        return None
    ts = sorted(found)
    return np.asarray(ts), np.asarray([found[t] for t in ts])


def tokens(sc: Mapping[str, Any]) -> Figure | Missing:
    """TTFT and TPOT p50 / p99 per window and class, output tokens per second, and the
    server's KV-cache usage and preemptions from its ``/metrics`` when it exposes them."""
    rows, _ = _rows(sc)
    rows = [r for r in rows if "tokens_out_per_s" in r]
    if not rows:
        return Missing("the run streamed no tokens (windows carry them for a streaming protocol)")
    classes = sorted({str(r.get("class")) for r in rows})
    fig, axes = _figure(3, (9.0, 2.4))
    for ax, name, title in (
        (axes[0], "ttft", "TTFT (ms)"),
        (axes[1], "tpot", "TPOT (ms)"),
    ):
        for i, cls in enumerate(classes):
            mine = [r for r in rows if str(r.get("class")) == cls]
            for q, style in (("p99", "-"), ("p50", "--")):
                t, v = numeric_series(
                    [r.get(f"{name}_{q}_ms") for r in mine], [r["t"] for r in mine]
                )
                if len(t):
                    ax.plot(t, v, style, color=f"C{i}", lw=1.2, label=f"{cls} {q}")
        ax.set_ylabel(title)
        ax.set_ylim(bottom=0)
        _shade_chaos(ax, sc)
        ax.legend(fontsize="small", ncols=4)
    axes[0].set_title("Tokens per window, by the streams sent in it (chaos shaded)")
    ax = axes[2]
    for i, cls in enumerate(classes):
        mine = [r for r in rows if str(r.get("class")) == cls]
        ax.plot([r["t"] for r in mine], [r["tokens_out_per_s"] for r in mine], color=f"C{i}",
                lw=1.2, label=f"{cls} output tokens/s")  # fmt: skip
    ax.set_ylabel("tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("time since start (s)")
    kv = _server_metric(sc, "kv_cache_usage") or _server_metric(sc, "token_usage")
    preempt = _server_metric(sc, "preemptions")
    if kv is not None or preempt is not None:
        right = ax.twinx()
        if kv is not None:
            right.plot(kv[0], kv[1] * 100, color="#6c757d", lw=1, label="server KV cache used (%)")
        if preempt is not None and len(preempt[0]) > 1:
            rate = np.diff(preempt[1]) / np.maximum(np.diff(preempt[0]), 1e-9)
            right.step(preempt[0][1:], rate, color="#e63946", lw=1, label="server preemptions/s")
        right.set_ylim(bottom=0)
        right.set_ylabel("server")
        right.legend(fontsize="small", loc="upper right")
    ax.legend(fontsize="small", loc="upper left")
    return fig


_RESOURCES = (
    ("rss_bytes", "RSS (MiB)", 2**20, "MiB/min"),
    ("threads", "threads", 1, "/min"),
    ("fds", "open fds", 1, "/min"),
)
# the check whose leak detector a panel's trend line draws: only a scenario that judges
# that trend gets the line (on a 20 s steady run it would be a slope nobody judged — and
# the fit's statistics cost every report a second of scipy.stats import)
_TREND_CHECK = {
    "rss_bytes": "soak.rss_trend",
    "threads": "soak.threads_trend",
    "fds": "soak.fds_trend",
}


def resources(sc: Mapping[str, Any]) -> Figure | Missing:
    server = sc.get("server") or {}
    series = server.get("series") or {}
    t_all = series.get("t") or []
    panels = []
    for key, label, scale, per in _RESOURCES:
        t, y = numeric_series(series.get(key) or [], t_all)
        if len(t):
            panels.append((key, label, t, y / scale, per))
    if not panels:
        return Missing("no server-side samples (server.series): no pid was watched")
    judged = {c.get("id") for c in sc.get("checks") or [] if isinstance(c, Mapping)}
    fig, axes = _figure(len(panels), (9.0, 2.2))
    drawn = False
    for ax, (key, label, t, y, per) in zip(axes, panels, strict=True):
        ax.plot(t, y, color="C0", lw=1.0, label=label)
        line = trend_line(t, y) if _TREND_CHECK[key] in judged else None
        if line is not None:
            drawn = True
            ax.axvspan(
                float(t.min()),
                line.start_s,
                color="#dee2e6",
                alpha=0.5,
                lw=0,
                label="warm-up (not fitted)",
            )
            xs = np.array([line.start_s, line.end_s])
            ax.plot(
                xs,
                line.at(xs),
                color="C3",
                lw=1.4,
                ls="--",
                label=f"Theil–Sen trend {line.slope_per_min:+.3g} {per}",
            )
        _shade_chaos(ax, sc)
        ax.set_ylabel(label)
        ax.legend(fontsize="small", ncols=3)
    axes[0].set_title(
        "Server resources with the leak detector's trend (a drawing aid; the verdict is the check's)"
        if drawn
        else "Server resources"
    )
    axes[-1].set_xlabel("time since start (s)")
    return fig


def threads(sc: Mapping[str, Any], top: int = 6) -> Figure | Missing:
    server = sc.get("server") or {}
    threads_top = [t for t in server.get("threads_top") or [] if isinstance(t, Mapping)]
    if not threads_top:
        return Missing("no per-thread CPU samples (server.threads_top)")
    threads_top = sorted(threads_top, key=lambda t: -(t.get("cpu_pct_mean") or 0))[:top]
    fig, (ax,) = _figure()
    drew = False
    for i, th in enumerate(threads_top):
        ser = th.get("series") or {}
        t, y = numeric_series(ser.get("cpu_pct") or [], ser.get("t") or [])
        if len(t):
            drew = True
            ax.plot(
                t,
                y,
                color=f"C{i}",
                lw=1.0,
                label=f"{th.get('name', '?')} ({th.get('tid', '?')}) mean {th.get('cpu_pct_mean', 0):.0f}%",
            )
    if drew:
        _shade_chaos(ax, sc)
        ax.set_xlabel("time since start (s)")
    else:
        names = [f"{th.get('name', '?')} ({th.get('tid', '?')})" for th in threads_top]
        ax.barh(
            names[::-1],
            [float(th.get("cpu_pct_mean") or 0) for th in threads_top][::-1],
            color="C0",
        )
    ax.set_ylabel("%CPU" if drew else "")
    ax.set_title(f"Per-thread CPU, top {len(threads_top)} threads (pidstat -t)")
    if drew:
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small", ncols=2)
    return fig


def linearity(sc: Mapping[str, Any]) -> Figure | Missing:
    lin = sc.get("linearity") or {}
    reps = readers.linearity_replicates(lin.get("points") or [])
    pts = [(float(n), x) for n, xs in reps.items() for x in xs]
    if not pts:
        return Missing("no linearity points (linearity.points)")
    arr = np.asarray(pts)
    ns, xs = arr[:, 0], arr[:, 1]
    levels = np.unique(ns)
    medians = np.array([np.median(xs[ns == n]) for n in levels])
    fig, (ax,) = _figure(size=(7.0, 4.0))
    ax.scatter(ns, xs, color="C0", s=18, alpha=0.6, label="replicates")
    ax.plot(levels, medians, "o-", color="C0", label="median X(N)")
    note = ""
    if 1.0 in levels:
        x1 = float(medians[levels == 1.0][0])
        ax.plot(levels, x1 * levels, ":", color="grey", label="ideal N·X(1)")
        fit = lin.get("usl")
        if isinstance(fit, Mapping) and all(
            isinstance(fit.get(k), int | float) for k in ("lam", "sigma", "kappa")
        ):
            grid = np.linspace(1, levels.max(), 100)
            ax.plot(
                grid,
                usl(grid, float(fit["lam"]), float(fit["sigma"]), float(fit["kappa"])),
                "--",
                color="C3",
                label=f"USL fit σ={fit['sigma']:.3f} κ={fit['kappa']:.4f}",
            )
        else:
            note = " (no USL fit: it needs N = 1 and another level)"
    else:
        note = " (no N=1 point: no ideal line or USL fit)"
    cores = lin.get("cores_available")
    if isinstance(cores, int | float):
        ax.axvline(cores, color="grey", lw=0.8, ls="-.", label=f"cores available = {cores:g}")
    ax.set_xlabel("concurrency N (threads / users)")
    ax.set_ylabel("throughput X(N) (req/s)")
    ax.set_title("Linearity: throughput vs concurrency" + note)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    return fig


def _block_stats(
    rows: Sequence[Mapping[str, Any]], width: float, start: float, end: float
) -> tuple[float | None, dict[str, float]]:
    # The first seconds of a block are a transition (hogs starting/stopping), not its level.
    skip = min(2.0, 0.1 * (end - start))
    inside = [r for r in rows if start + skip <= float(r["t"]) < end]
    per_t: dict[float, float] = {}
    p99: dict[str, list[float]] = {}
    for r in inside:
        per_t[float(r["t"])] = per_t.get(float(r["t"]), 0.0) + float(r.get("ok") or 0)
        if isinstance(r.get("p99_ms"), int | float):
            p99.setdefault(str(r.get("class")), []).append(float(r["p99_ms"]))
    tput = float(np.median(list(per_t.values()))) / width if per_t else None
    return tput, {c: float(np.median(v)) for c, v in p99.items()}


def contention(sc: Mapping[str, Any]) -> Figure | Missing:
    blocks = [b for b in (sc.get("contention") or {}).get("blocks") or [] if isinstance(b, Mapping)]
    rows, width = _rows(sc)
    if not blocks:
        return Missing("no contention blocks (contention.blocks)")
    if not rows:
        return Missing("contention blocks without windows (windows.rows): nothing to compare")
    labels, tputs, p99s = [], [], []
    for i, b in enumerate(blocks):
        if not isinstance(b.get("start_s"), int | float) or not isinstance(
            b.get("end_s"), int | float
        ):
            continue
        tput, p99 = _block_stats(rows, width, float(b["start_s"]), float(b["end_s"]))
        labels.append(f"{i + 1}. {b.get('kind', '?')}\n{b['start_s']:g}–{b['end_s']:g} s")
        tputs.append(tput if tput is not None else math.nan)
        p99s.append(p99)
    if not labels:
        return Missing("contention blocks have no start/end times")
    fig, (ax1, ax2) = _pair()
    colours = ["#e76f51" if "hog" in lbl else "#2a9d8f" for lbl in labels]
    x = np.arange(len(labels))
    ax1.bar(x, tputs, color=colours)
    ax1.set_xticks(x, labels, fontsize="small")
    ax1.set_ylabel("median ok req/s")
    ax1.set_title("Throughput per block")
    classes = sorted({c for p in p99s for c in p})
    bw = 0.8 / max(len(classes), 1)
    for j, cls in enumerate(classes):
        ax2.bar(
            x + (j - (len(classes) - 1) / 2) * bw,
            [p.get(cls, math.nan) for p in p99s],
            bw,
            color=f"C{j}",
            label=cls,
        )
    ax2.set_xticks(x, labels, fontsize="small")
    ax2.set_ylabel("median window p99 (ms)")
    ax2.set_title("p99 per block, by class")
    if classes:
        ax2.legend(fontsize="small")
    return fig


def _pair() -> tuple[Figure, Sequence[Any]]:
    fig = Figure(figsize=(10.0, 3.8))
    _margins(fig, 10.0, 3.8)
    fig.subplots_adjust(bottom=0.8 / 3.8)  # two-line tick labels
    return fig, list(fig.subplots(1, 2))


# Order and captions of the per-scenario plots in report.html.
PLOTS: tuple[tuple[str, str, Callable[[Mapping[str, Any]], Figure | Missing]], ...] = (
    ("latency", "Latency percentiles over time (chaos intervals shaded)", latency),
    ("throughput", "Throughput and errors by kind over time", throughput),
    ("tokens", "TTFT, TPOT and output tokens over time, KV cache beside them", tokens),
    ("resources", "Server RSS / threads / fds with fitted trend", resources),
    ("threads", "Per-thread CPU (top threads)", threads),
    ("linearity", "Linearity curve with USL fit", linearity),
    ("contention", "Contention: before / during / after", contention),
)


def drawn(sc: Mapping[str, Any], index: int) -> str | Missing:
    """Plot ``PLOTS[index]`` of scenario ``sc``: a PNG data URI, or why it is omitted (a
    malformed field is a reason too: it must not cost the reader the rest of the report)."""
    make = PLOTS[index][2]
    try:
        result = make(sc)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        return Missing(f"data malformed ({type(exc).__name__}: {exc})")
    return result if isinstance(result, Missing) else to_data_uri(result)


# The scenarios being drawn, inherited by the forked workers of drawn_all (not pickled).
_drawing: Sequence[Mapping[str, Any]] = ()


def _draw_job(job: tuple[int, int]) -> str | Missing:
    return drawn(_drawing[job[0]], job[1])


def drawn_all(scenarios: Sequence[Mapping[str, Any]]) -> list[list[str | Missing]]:
    """Every scenario's ``PLOTS`` drawn (``drawn``), in order: by one forked process per
    core this process may use when there are several (drawing is matplotlib's text layout
    and rasterising, ~0.15 s a figure, and each figure is drawn on its own: the same PNG
    bytes whichever process draws it), else here."""
    global _drawing
    jobs = [(i, k) for i in range(len(scenarios)) for k in range(len(PLOTS))]
    workers = min(len(os.sched_getaffinity(0)), len(jobs))
    flat: list[str | Missing] | None = None
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        _drawing = scenarios
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as ex:
                flat = list(ex.map(_draw_job, jobs))
        except OSError:  # no process could be forked: draw here
            flat = None
        finally:
            _drawing = ()
    if flat is None:
        flat = [drawn(scenarios[i], k) for i, k in jobs]
    return [flat[i * len(PLOTS) : (i + 1) * len(PLOTS)] for i in range(len(scenarios))]
