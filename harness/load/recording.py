"""Latency and outcome recording: exact, mergeable, nothing lost.

Every request ends in exactly one *outcome*: ``ok``, ``http_<status>``, ``timeout``,
``connection``, ``bad_response`` (a 2xx whose body is not a V2 answer), ``cross_wired``,
``drift``, ``id_mismatch``, ``cancelled``, ``dropped`` (never sent: the in-flight cap was reached)
or ``aborted`` (a stream the load's client aborts hung up on: neither served nor failed).
A ``Recording`` counts outcomes and keeps HDR histograms (the one shape and codec of
``harness.results.hdr``) per traffic class, per (stage, class) and per (window, class),
windows keyed by the *intended* send time. Latencies of ``ok`` requests go to the latency histograms; every
other sent request's time to its answer (an aborted one's excepted) goes to ``error_latency``.

The first ``first_n`` requests *scheduled* by a process (in intended send order, not the
first to complete) are followed apart for the cold-start checks: each is recorded when it
ends, whatever its outcome — an ``ok`` latency into ``first``, any other outcome (or a
drop) counted in ``first_counts`` — so a server that fails or stalls only some early
requests cannot hide them behind the ones that came back quickly.

Workers ``drain()`` what they recorded since the last drain into a JSON-able delta and the
master ``merge()``s the deltas — histograms are added, percentiles are never averaged. A
local run drains into its own aggregate every few seconds, on the event loop that sends the
requests: it hands over the cells and histograms themselves, not encoded, so that pause is
short (figures in docs/checks.md, "Invalid runs").
A window is shipped once, when it is complete on that worker (nothing with an intended
time inside it is still in flight); the master summarises a window into rows once every
worker has shipped past it, so a long soak keeps only a few live histograms in memory.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from hdrh.histogram import HdrHistogram

from harness.load.stream_recording import StreamStats, WindowTokens
from harness.protocols.openai_stream import StreamRecord
from harness.results import hdr
from harness.results.readers import window_percentiles
from harness.results.records import (
    ClassLatency,
    Counters,
    FirstRequests,
    WindowRow,
)

# Outcomes that are not a served answer; "dropped" is kept apart (never sent).
FIXED_FAILURES = (
    "timeout",
    "connection",
    "bad_response",
    "cross_wired",
    "drift",
    "id_mismatch",
    "cancelled",  # closed loop: Locust stopped the user while its request was out
)
# how a streamed answer (harness.load.stream_exchange) can fail besides the above; counted
# only when seen, so a run of another protocol lists none of them
STREAM_FAILURES = ("stall", "truncated", "error_in_stream", "no_tokens")
INTEGRITY_KINDS = ("cross_wired", "drift", "id_mismatch")
MAX_EXAMPLES_PER_KIND = 5


class Cell:
    """Outcome counters plus the latency histogram of ``ok`` answers, for one bucket; a
    window's cell of a streaming run also holds its token figures (``tokens``)."""

    __slots__ = ("counts", "hdr", "tokens")

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.hdr: HdrHistogram | None = None
        self.tokens: WindowTokens | None = None

    def record_ok(self, latency_us: int) -> None:
        if self.hdr is None:
            self.hdr = hdr.new_histogram()
        self.hdr.record_value(latency_us)

    def encode(self) -> dict[str, Any]:
        out = {"c": dict(self.counts), "h": hdr.encode(self.hdr)}
        if self.tokens is not None:
            out["s"] = self.tokens.encode()
        return out

    def add(self, data: Mapping[str, Any] | Cell) -> None:
        """Add an encoded cell (``encode``) or a cell itself."""
        if isinstance(data, Cell):
            self.add_cell(data)
            return
        self.counts.update(data.get("c") or {})
        if data.get("h"):
            if self.hdr is None:
                self.hdr = hdr.new_histogram()
            self.hdr.add(hdr.decode(data["h"]))
        if data.get("s"):
            if self.tokens is None:
                self.tokens = WindowTokens()
            self.tokens.add(data["s"])

    def add_cell(self, other: Cell) -> None:
        self.counts.update(other.counts)
        if other.hdr is not None and other.hdr.get_total_count():
            if self.hdr is None:
                self.hdr = hdr.new_histogram()
            self.hdr.add(other.hdr)
        if other.tokens is not None:
            if self.tokens is None:
                self.tokens = WindowTokens()
            self.tokens.add_other(other.tokens)


def _same(x: Any) -> Any:
    return x


def _add_cells(into: dict[str, Cell], cells: Mapping[str, Any]) -> None:
    """Add a delta's cells per class: a cell handed over (not encoded) where ``into`` has
    none yet is adopted as it is."""
    for c, data in cells.items():
        if isinstance(data, Cell) and c not in into:
            into[c] = data
        else:
            into.setdefault(c, Cell()).add(data)


def _add_histogram(into: HdrHistogram, data: HdrHistogram | str | None) -> None:
    if isinstance(data, HdrHistogram):
        if data.get_total_count():
            into.add(data)
    elif data:
        into.add(hdr.decode(data))


def counters_view(counts: Mapping[str, int], in_flight: int = 0) -> Counters:
    """The results-document record of outcome counters (``failed`` broken down by kind)."""
    failed = {k: 0 for k in ("http_503", "http_500", *FIXED_FAILURES)}
    for key, value in counts.items():
        if key.startswith("http_") or key in FIXED_FAILURES or key in STREAM_FAILURES:
            failed[key] = failed.get(key, 0) + int(value)
    out = Counters(
        scheduled=int(counts.get("scheduled", 0)),
        ok=int(counts.get("ok", 0)),
        dropped=int(counts.get("dropped", 0)),
        in_flight=int(in_flight),
        failed=dict(sorted(failed.items())),
        failed_total=sum(failed.values()),
    )
    if counts.get("aborted"):
        out["aborted"] = int(counts["aborted"])
    return out


class Recording:
    """Counters and histograms of one process (a worker), or the merge of many (master).

    ``origin`` is the run's shared start time (unix seconds); every ``t`` given to the
    record methods is seconds since ``origin`` of the request's intended send time.
    """

    def __init__(self, window_s: float = 1.0, first_n: int = 100) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s has value {window_s!r}; expected a positive number")
        self.window_s = float(window_s)
        self.first_n = int(first_n)
        # per (stage, class) and per (window, class); the per-class cells are the sum of
        # the stage cells (``classes``), added up when read rather than on every request
        self.stages: dict[str, dict[str, Cell]] = {}
        self.windows: dict[int, dict[str, Cell]] = {}
        self.dispatch_lag = hdr.new_histogram()
        self.error_latency = hdr.new_histogram()
        self.first = hdr.new_histogram()
        # the first requests: outcomes as counters (like a Cell's), and which are still out
        self.first_counts: Counter[str] = Counter()
        self._first_marked = 0  # first requests marked so far; first_n caps it for good
        self._first_pending: Counter[tuple[str, str, float]] = Counter()
        self.first_in_flight_final = 0  # master: first requests still out at the end
        self.integrity: Counter[str] = Counter()
        self.examples: list[dict[str, Any]] = []
        self.in_flight_by_window: Counter[int] = Counter()
        self.in_flight_by_cell: Counter[tuple[str, str]] = Counter()  # (class, stage)
        self.in_flight_final = 0
        self.in_flight_final_by: Counter[tuple[str, str]] = Counter()
        # master side: summarised window rows and each source's completeness watermark
        self.rows: list[WindowRow] = []
        self._watermarks: dict[str, int] = {}
        self._summarised_through = 0
        self.by_source: Counter[str] = Counter()  # master: requests scheduled per worker
        # a streaming protocol's token statistics (harness.load.stream_exchange), by traffic
        # class, by stage and by (stage, class) (keyed by stream_recording.stage_class_key);
        # empty for any other protocol
        self.tokens: dict[str, StreamStats] = {
            "class": StreamStats(),
            "stage": StreamStats(),
            "stage_class": StreamStats(),
        }
        self.closed = False

    # -- recording (worker side) ------------------------------------------------------

    @property
    def classes(self) -> dict[str, Cell]:
        """Per traffic class: its cells of every stage added up (every request recorded
        is in exactly one stage)."""
        out: dict[str, Cell] = {}
        for cells in self.stages.values():
            for cls, cell in cells.items():
                total = out.get(cls)
                if total is None:
                    total = out[cls] = Cell()
                total.add_cell(cell)
        return out

    def _cells(self, cls: str, stage: str, t: float) -> tuple[Cell, Cell]:
        st = self.stages.get(stage)
        if st is None:
            st = self.stages[stage] = {}
        s = st.get(cls)
        if s is None:
            s = st[cls] = Cell()
        w = int(t // self.window_s) if t > 0 else 0
        wd = self.windows.get(w)
        if wd is None:
            wd = self.windows[w] = {}
        wc = wd.get(cls)
        if wc is None:
            wc = wd[cls] = Cell()
        return s, wc

    def scheduled(self, cls: str, stage: str, t: float) -> None:
        """One request's intended send time has come (sent or about to be dropped)."""
        if self.closed:
            return
        for cell in self._cells(cls, stage, t):
            cell.counts["scheduled"] += 1
        if self._first_marked < self.first_n:
            self._first_marked += 1
            self._first_pending[(cls, stage, t)] += 1
            self.first_counts["scheduled"] += 1

    def _first_ended(self, cls: str, stage: str, t: float) -> bool:
        """Whether the request that ended is one of the first ones (and stop waiting for it).

        Requests are known by (class, stage, intended time); two with the same key are
        interchangeable here, so the count of first requests stays exact.
        """
        if not self._first_pending:
            return False
        key = (cls, stage, t)
        left = self._first_pending.get(key, 0)
        if not left:
            return False
        if left > 1:
            self._first_pending[key] = left - 1
        else:
            del self._first_pending[key]
        return True

    def sent(self, cls: str, stage: str, t: float, lag_us: float | None) -> None:
        """The request left for the server; ``lag_us`` is actual − intended send time."""
        if self.closed:
            return
        self.in_flight_by_window[int(t // self.window_s) if t > 0 else 0] += 1
        self.in_flight_by_cell[(cls, stage)] += 1
        if lag_us is not None:
            self.dispatch_lag.record_value(hdr.clamp_us(lag_us))

    def dropped(self, cls: str, stage: str, t: float) -> None:
        if self.closed:
            return
        for cell in self._cells(cls, stage, t):
            cell.counts["dropped"] += 1
        if self._first_ended(cls, stage, t):
            self.first_counts["dropped"] += 1

    def done(self, cls: str, stage: str, t: float, outcome: str, latency_us: float) -> None:
        """A sent request ended with ``outcome`` after ``latency_us`` from its intended time."""
        if self.closed:
            return
        w = int(t // self.window_s) if t > 0 else 0
        left = self.in_flight_by_window[w] - 1
        if left > 0:
            self.in_flight_by_window[w] = left
        else:
            self.in_flight_by_window.pop(w, None)
        key = (cls, stage)
        left = self.in_flight_by_cell[key] - 1
        if left > 0:
            self.in_flight_by_cell[key] = left
        else:
            self.in_flight_by_cell.pop(key, None)
        value = hdr.clamp_us(latency_us)
        cells = self._cells(cls, stage, t)
        for cell in cells:
            cell.counts[outcome] += 1
        if outcome == "ok":
            for cell in cells:
                cell.record_ok(value)
        elif outcome != "aborted":
            self.error_latency.record_value(value)
        if self._first_ended(cls, stage, t):
            self.first_counts[outcome] += 1
            if outcome == "ok":
                self.first.record_value(value)

    def stream_ended(self, cls: str, t: float, rec: StreamRecord) -> None:
        """A stream's token figures into its window (call before ``done``: the window
        ships only once nothing sent in it is in flight)."""
        if self.closed:
            return
        w = int(t // self.window_s) if t > 0 else 0
        cells = self.windows.setdefault(w, {})
        cell = cells.get(cls)
        if cell is None:  # not built per call: this runs once per stream
            cell = cells[cls] = Cell()
        if cell.tokens is None:
            cell.tokens = WindowTokens()
        cell.tokens.record(rec)

    def integrity_result(self, kind: str, example: Mapping[str, Any] | None = None) -> None:
        """Count one verified answer (``ok``/``drift``/``cross_wired``/``id_mismatch``)."""
        if self.closed:
            return
        self.integrity["checked"] += 1
        self.integrity[kind] += 1
        if example is not None and kind != "ok":
            same = sum(1 for e in self.examples if e.get("kind") == kind)
            if same < MAX_EXAMPLES_PER_KIND:
                self.examples.append({"kind": kind, **example})

    @property
    def in_flight(self) -> int:
        return sum(self.in_flight_by_window.values())

    # -- shipping (worker → master) ------------------------------------------------

    def drain(self, now_t: float, final: bool = False, *, encoded: bool = True) -> dict[str, Any]:
        """Everything recorded since the last drain; resets what it ships.

        Windows ship only when complete here: before ``now_t`` and before the oldest
        window that still has a request in flight (all of them when ``final``).
        ``encoded``: JSON-able, for a worker's message to its master. False hands the
        cells and histograms themselves to this process's own ``merge`` (the local
        runner), which adopts them: no compressing and decompressing on the event loop
        that sends the requests.
        """
        cell_out = Cell.encode if encoded else _same
        hist_out = hdr.encode if encoded else _same
        if final:
            complete = math.inf
        else:
            complete = int(now_t // self.window_s)
            if self.in_flight_by_window:
                complete = min(complete, min(self.in_flight_by_window))
        windows = {}
        for w in sorted(self.windows):
            if w < complete:
                windows[str(w)] = {c: cell_out(cell) for c, cell in self.windows.pop(w).items()}
        delta = {
            "scheduled": sum(
                int(cell.counts.get("scheduled", 0))
                for d in self.stages.values()
                for cell in d.values()
            ),
            "stages": {
                s: {c: cell_out(cell) for c, cell in d.items()} for s, d in self.stages.items()
            },
            "windows": windows,
            "complete_through": None if final else complete,
            "lag": hist_out(self.dispatch_lag),
            "err": hist_out(self.error_latency),
            "first": hist_out(self.first),
            "first_c": dict(self.first_counts),
            "first_in_flight": sum(self._first_pending.values()) if final else 0,
            "integrity": dict(self.integrity),
            "examples": self.examples,
            "in_flight": self.in_flight if final else 0,
            "in_flight_by": (
                [[c, s, n] for (c, s), n in self.in_flight_by_cell.items()] if final else []
            ),
        }
        if any(t.cells for t in self.tokens.values()):
            delta["tokens"] = {k: t.drain(encoded=encoded) for k, t in self.tokens.items()}
        self.stages = {}
        self.dispatch_lag = hdr.new_histogram()
        self.error_latency = hdr.new_histogram()
        # which requests are first is decided when they are scheduled (never reset), so
        # a worker ships at most first_n of them over all its drains
        self.first = hdr.new_histogram()
        self.first_counts = Counter()
        self.integrity = Counter()
        self.examples = []
        if final:
            self.closed = True
        return delta

    # -- merging (master) ----------------------------------------------------------

    def expect(self, sources: Iterable[str]) -> None:
        """Hold windows until these sources (workers) have shipped past them."""
        for source in sources:
            self._watermarks.setdefault(source, 0)

    def merge(self, delta: Mapping[str, Any], source: str = "local") -> None:
        """Add a ``drain()`` delta, encoded (a worker's) or not (this process's own, whose
        cells and histograms it adopts); summarise windows every source has completed."""
        self.by_source[source] += int(delta.get("scheduled") or 0)
        for s, d in (delta.get("stages") or {}).items():
            _add_cells(self.stages.setdefault(s, {}), d)
        for w_text, d in (delta.get("windows") or {}).items():
            w = int(w_text)
            if w < self._summarised_through:
                # A straggler for an already summarised window: keep its counts honest.
                self._late_into_rows(w, d)
                continue
            _add_cells(self.windows.setdefault(w, {}), d)
        for key, hist in (
            ("lag", self.dispatch_lag),
            ("err", self.error_latency),
            ("first", self.first),
        ):
            _add_histogram(hist, delta.get(key))
        self.first_counts.update(delta.get("first_c") or {})
        self.first_in_flight_final += int(delta.get("first_in_flight") or 0)
        self.integrity.update(delta.get("integrity") or {})
        for ex in delta.get("examples") or []:
            same = sum(1 for e in self.examples if e.get("kind") == ex.get("kind"))
            if same < MAX_EXAMPLES_PER_KIND:
                self.examples.append(ex)
        for key, data in (delta.get("tokens") or {}).items():
            if key in self.tokens:
                self.tokens[key].merge(data)
        self.in_flight_final += int(delta.get("in_flight") or 0)
        for cls, stage, n in delta.get("in_flight_by") or []:
            self.in_flight_final_by[(cls, stage)] += int(n)
        through = delta.get("complete_through")
        self._watermarks[source] = math.inf if through is None else int(through)
        self._summarise(min(self._watermarks.values()))

    def _summarise(self, through: float) -> None:
        for w in sorted(self.windows):
            if w >= through:
                break
            self.rows.extend(self._rows_for(w, self.windows.pop(w)))
            self._summarised_through = max(self._summarised_through, w + 1)

    def _rows_for(self, w: int, cells: Mapping[str, Cell]) -> list[WindowRow]:
        rows = []
        for cls in sorted(cells):
            cell = cells[cls]
            errors = {
                k: v
                for k, v in cell.counts.items()
                if k not in ("ok", "scheduled", "aborted") and v
            }
            ok = int(cell.counts.get("ok", 0))
            pct = window_percentiles(cell.hdr or hdr.new_histogram())
            row: WindowRow = {
                "t": round(w * self.window_s, 6),
                "class": cls,
                "scheduled": int(cell.counts.get("scheduled", 0)),
                "n": ok + sum(errors.values()),
                "ok": ok,
                "errors": dict(sorted(errors.items())),
                "p50_ms": pct["p50_ms"],
                "p90_ms": pct["p90_ms"],
                "p99_ms": pct["p99_ms"],
                "max_ms": pct["max_ms"],
            }
            if cell.counts.get("aborted"):
                row["aborted"] = int(cell.counts["aborted"])
            if cell.tokens is not None:
                row.update(cell.tokens.row(self.window_s))  # type: ignore[typeddict-item]
            rows.append(row)
        return rows

    def _late_into_rows(self, w: int, data: Mapping[str, Any]) -> None:
        for cls, cell_data in data.items():
            cell = Cell()
            cell.add(cell_data)
            self.rows.extend(self._rows_for(w, {cls: cell}))
            self.rows[-1]["late"] = True

    def finish(self) -> None:
        """Summarise every remaining window (call once all sources sent their final delta)."""
        self._summarise(math.inf)
        self.rows.sort(key=lambda r: (r["t"], r["class"]))

    # -- the results-document view -----------------------------------------------

    def totals(self) -> Cell:
        total = Cell()
        for cell in self.classes.values():
            total.add_cell(cell)
        return total

    def by_class(self) -> dict[str, ClassLatency]:
        out = {}
        for cls, cell in sorted(self.classes.items()):
            in_flight = sum(n for (c, _), n in self.in_flight_final_by.items() if c == cls)
            out[cls] = ClassLatency(
                counters=counters_view(cell.counts, in_flight), latency_hdr=hdr.encode(cell.hdr)
            )
        return out

    def first_requests(self) -> FirstRequests:
        """The results-document view of the first requests: ``n`` and ``latency_hdr`` of
        the ok ones, plus their counters (``scheduled``, ``ok``, ``failed`` by kind,
        ``dropped``, ``in_flight``) in the shape of ``counters_view``."""
        return FirstRequests(
            n=self.first.get_total_count(),
            latency_hdr=hdr.encode(self.first),
            **counters_view(self.first_counts, self.first_in_flight_final),
        )

    def by_stage(self) -> dict[str, dict[str, ClassLatency]]:
        return {
            stage: {
                cls: ClassLatency(
                    counters=counters_view(cell.counts, self.in_flight_final_by[(cls, stage)]),
                    latency_hdr=hdr.encode(cell.hdr),
                )
                for cls, cell in sorted(d.items())
            }
            for stage, d in self.stages.items()
        }


def merged(deltas: Iterable[Mapping[str, Any]], window_s: float = 1.0) -> Recording:
    """A master-side Recording from a sequence of final deltas (one per source)."""
    rec = Recording(window_s=window_s)
    for i, d in enumerate(deltas):
        rec.merge(d, source=str(i))
    rec.finish()
    return rec
