"""Token-stream statistics of a load run: HDR histograms per traffic class, exactly merged.

``StreamStats.record(cls, record)`` takes one ``StreamRecord`` (one request) and keeps,
per class, in the project's one histogram shape (``harness.results.hdr``, microseconds):

- ``ttft``, ``tpot``, ``itl`` (inter-token latency **per event**: one value per gap
  between consecutive token-bearing events), ``e2e`` and ``max_gap`` — of the requests
  that did not fail (``StreamRecord.failed``), by the definitions of
  ``harness.analysis.token_metrics`` (docs/llm-metrics.md); a request of one token has no
  TPOT, gap or inter-token value;
- ``e2e_failed``: the end-to-end time of every failed request;
- ``e2e_rejected``: the end-to-end time of every request answered 429 or 503 (a shed:
  ``llm.overload`` counts the quick ones);

and counts requests, ``ok`` (not failed), ``failed``, ``aborted`` (the client hung up
on purpose mid-stream: ``StreamRecord.aborted``; not a request, as defined below),
``cancelled`` (the user was
stopped while its stream was out: no record), ``dropped`` (never sent: the in-flight cap
was reached), prompt and output tokens (``tokens_in``, ``tokens_out``: of every recorded
request, failed ones included — what the server read and delivered), streams
``verified`` against an expected answer and how many of them were ``wrong``
(``wrong_text``, ``wrong_finish_reason`` or ``usage_mismatch``), and goodput: the
requests that conform to the SLO (``harness.analysis.token_metrics.conforms``; with no bound given,
every request that did not fail) and every problem code seen, one count per request.

An aborted stream was never meant to get a whole answer, so it is not one of the
``requests`` (``requests`` = ``ok`` + ``failed``: goodput's denominator) and has no
TPOT, end-to-end time or longest gap (per-answer figures); what it did measure is kept:
its TTFT and inter-token gaps, its tokens in and out, its problem codes (a wrong prefix
of text is ``wrong_text``) and whether it was verified.

Workers ``drain()`` a JSON-able delta; the master ``merge()``s them: histograms are
added, never their percentiles averaged, so the merged percentiles are those of all the
values together. ``summary()`` is the JSON-able view (counts, p50/p90/p99/max in ms).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from hdrh.histogram import HdrHistogram

from harness.analysis.token_metrics import SLO, conforms, tpot_s
from harness.protocols.openai_stream import ProblemCode, StreamRecord
from harness.results import hdr

HISTOGRAMS = ("ttft", "tpot", "itl", "e2e", "max_gap", "e2e_failed", "e2e_rejected")
# the statuses of a shed request (too many requests; unavailable)
SHED_STATUSES = frozenset({429, 503})
# the histograms a summary also keeps whole (encoded), so a check counts the values within
# any bound it is given: TTFT within the SLO, sheds answered quickly
KEPT_WHOLE = ("ttft", "e2e_rejected")
# what a problem said (an error body, the event that broke the stream), kept for the
# first few streams per problem code so a failed check can quote the server's own words
EXAMPLES_PER_PROBLEM = 2
EXAMPLE_CHARS = 240
COUNTERS = (
    "requests",
    "ok",
    "failed",
    "aborted",
    "cancelled",
    "dropped",
    "tokens_in",
    "tokens_out",
    "verified",
    "wrong",
    "conforming",
)
WRONG_ANSWER = frozenset(
    {ProblemCode.WRONG_TEXT, ProblemCode.WRONG_FINISH_REASON, ProblemCode.USAGE_MISMATCH}
)


def _us(seconds: float) -> int:
    return hdr.clamp_us(seconds * 1e6)


class StreamCell:
    """One class's counters, problem counts and histograms."""

    __slots__ = ("counts", "problems", "examples", "hists")

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.problems: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}  # problem code → its first details
        self.hists: dict[str, HdrHistogram] = {}

    def _keep_examples(self, code: str, details: Iterable[str]) -> None:
        kept = self.examples.setdefault(code, [])
        for detail in details:
            if len(kept) >= EXAMPLES_PER_PROBLEM:
                return
            kept.append(detail[:EXAMPLE_CHARS])

    def hist(self, name: str) -> HdrHistogram:
        h = self.hists.get(name)
        if h is None:
            h = self.hists[name] = hdr.new_histogram()
        return h

    def record(self, rec: StreamRecord, slo: SLO, verified: bool) -> None:
        counts = self.counts
        aborted = rec.aborted and not rec.failed
        counts["aborted" if aborted else "requests"] += 1
        counts["tokens_out"] += rec.output_tokens
        counts["tokens_in"] += rec.prompt_tokens or 0
        codes = rec.codes()
        for code in codes:
            self.problems[str(code)] += 1
        for p in rec.problems:
            self._keep_examples(str(p.code), (p.detail,))
        if verified:
            counts["verified"] += 1
            if codes & WRONG_ANSWER:
                counts["wrong"] += 1
        if rec.failed:
            counts["failed"] += 1
            self.hist("e2e_failed").record_value(_us(rec.end_s))
            if rec.status in SHED_STATUSES:
                self.hist("e2e_rejected").record_value(_us(rec.end_s))
            return
        if aborted:
            self._record_partial(rec)
            return
        counts["ok"] += 1
        if conforms(rec, slo):
            counts["conforming"] += 1
        self.hist("e2e").record_value(_us(rec.end_s))
        if rec.ttft_s is not None:
            self.hist("ttft").record_value(_us(rec.ttft_s))
        tpot = tpot_s(rec)
        if tpot is not None:
            self.hist("tpot").record_value(_us(tpot))
        times = rec.token_times_s
        if len(times) > 1:
            itl = self.hist("itl")
            longest = 0.0
            for a, b in zip(times, times[1:], strict=False):
                gap = b - a
                itl.record_value(_us(gap))
                if gap > longest:
                    longest = gap
            self.hist("max_gap").record_value(_us(longest))

    def _record_partial(self, rec: StreamRecord) -> None:
        """An aborted stream's TTFT and inter-token gaps (no per-answer figure)."""
        if rec.ttft_s is not None:
            self.hist("ttft").record_value(_us(rec.ttft_s))
        times = rec.token_times_s
        if len(times) > 1:
            itl = self.hist("itl")
            for a, b in zip(times, times[1:], strict=False):
                itl.record_value(_us(b - a))

    def encode(self) -> dict[str, Any]:
        return {
            "c": dict(self.counts),
            "p": dict(self.problems),
            "x": self.examples,
            "h": {k: hdr.encode(h) for k, h in self.hists.items() if h.get_total_count()},
        }

    def add(self, data: Mapping[str, Any]) -> None:
        self.counts.update(data.get("c") or {})
        self.problems.update(data.get("p") or {})
        for code, details in (data.get("x") or {}).items():
            self._keep_examples(code, details)
        for name, text in (data.get("h") or {}).items():
            if text:
                self.hist(name).add(hdr.decode(text))

    def add_cell(self, other: StreamCell) -> None:
        self.counts.update(other.counts)
        self.problems.update(other.problems)
        for code, details in other.examples.items():
            self._keep_examples(code, details)
        for name, h in other.hists.items():
            if h.get_total_count():
                self.hist(name).add(h)

    def summary(self) -> dict[str, Any]:
        counts = {k: int(self.counts.get(k, 0)) for k in COUNTERS}
        out: dict[str, Any] = dict(counts)
        out["goodput"] = {
            "conforming": counts["conforming"],
            "not_conforming": counts["requests"] - counts["conforming"],
            "by_problem": dict(sorted(self.problems.items())),
            "examples": {k: list(v) for k, v in sorted(self.examples.items())},
        }
        for name in HISTOGRAMS:
            h = self.hists.get(name) or hdr.new_histogram()
            out[f"{name}_ms"] = {"count": int(h.get_total_count()), **hdr.summary_ms(h)}
        out["hdr"] = {name: hdr.encode(self.hists.get(name)) for name in KEPT_WHOLE}
        return out


class StreamStats:
    """The stream statistics of one process (a worker), or the merge of many (master).

    ``slo``: the bounds a request must meet to count as conforming (default: none)."""

    def __init__(self, slo: SLO | None = None) -> None:
        self.slo = slo or SLO()
        self.cells: dict[str, StreamCell] = {}

    def cell(self, cls: str) -> StreamCell:
        cell = self.cells.get(cls)
        if cell is None:
            cell = self.cells[cls] = StreamCell()
        return cell

    def record(self, cls: str, rec: StreamRecord, verified: bool = False) -> None:
        """One stream of class ``cls``; ``verified``: it was checked against an expected
        answer (its recorder had one)."""
        self.cell(cls).record(rec, self.slo, verified)

    def cancelled(self, cls: str) -> None:
        self.cell(cls).counts["cancelled"] += 1

    def dropped(self, cls: str) -> None:
        self.cell(cls).counts["dropped"] += 1

    def drain(self, *, encoded: bool = True) -> dict[str, Any]:
        """Everything recorded since the last drain, JSON-able (``encoded``: for a
        worker's message) or the cells themselves (for this process's own ``merge``, as
        ``Recording.drain``); resets it."""
        delta = {cls: cell.encode() if encoded else cell for cls, cell in self.cells.items()}
        self.cells = {}
        return delta

    def merge(self, delta: Mapping[str, Any]) -> None:
        """Add a ``drain()`` delta (from this process or a worker); a cell handed over
        where this has none yet is adopted as it is."""
        for cls, data in delta.items():
            if isinstance(data, StreamCell):
                if cls in self.cells:
                    self.cells[cls].add_cell(data)
                else:
                    self.cells[cls] = data
            else:
                self.cell(cls).add(data)

    def summary(self) -> dict[str, Any]:
        """Per class and ``total`` (every class added): counts, tokens, goodput and each
        histogram's count, p50/p90/p99 and max in ms (nearest rank, ``hdr.summary_ms``)."""
        total = StreamCell()
        for cell in self.cells.values():
            total.add_cell(cell)
        return {
            "classes": {cls: cell.summary() for cls, cell in sorted(self.cells.items())},
            "total": total.summary(),
        }


# a (stage, class) cell's key in ``Recording.tokens["stage_class"]``: a separator no TOML
# stage or class name holds
STAGE_CLASS_SEP = "\x1f"


def stage_class_key(stage: str, cls: str) -> str:
    """The key of ``stage``'s cell of traffic class ``cls``."""
    return f"{stage}{STAGE_CLASS_SEP}{cls}"


def by_stage_class(stats: StreamStats) -> dict[str, dict[str, Any]]:
    """``stats`` keyed by ``stage_class_key`` as {stage: {class: cell summary}}."""
    out: dict[str, dict[str, Any]] = {}
    for key, cell in sorted(stats.cells.items()):
        stage, _, cls = key.partition(STAGE_CLASS_SEP)
        out.setdefault(stage, {})[cls] = cell.summary()
    return out


class WindowTokens:
    """A time window's token figures for one class, kept beside its request counters
    (``harness.load.recording.Cell``, windows keyed by the intended send time): output
    tokens of every stream sent in the window (failed ones included), and the TTFT and TPOT
    of the ones that did not fail (an aborted one: its TTFT only). Shipped, merged and
    summarised with the window."""

    __slots__ = ("tokens_out", "ttft", "tpot")

    def __init__(self) -> None:
        self.tokens_out = 0
        self.ttft: HdrHistogram | None = None
        self.tpot: HdrHistogram | None = None

    def record(self, rec: StreamRecord) -> None:
        self.tokens_out += rec.output_tokens
        if rec.failed:
            return
        if rec.ttft_s is not None:
            if self.ttft is None:
                self.ttft = hdr.new_histogram()
            self.ttft.record_value(_us(rec.ttft_s))
        if rec.aborted:
            return  # no TPOT for an answer the client cut short
        tpot = tpot_s(rec)
        if tpot is not None:
            if self.tpot is None:
                self.tpot = hdr.new_histogram()
            self.tpot.record_value(_us(tpot))

    def encode(self) -> dict[str, Any]:
        return {"n": self.tokens_out, "ttft": hdr.encode(self.ttft), "tpot": hdr.encode(self.tpot)}

    def add(self, data: Mapping[str, Any]) -> None:
        self.tokens_out += int(data.get("n") or 0)
        for name in ("ttft", "tpot"):
            if data.get(name):
                self._into(name, hdr.decode(data[name]))

    def add_other(self, other: WindowTokens) -> None:
        self.tokens_out += other.tokens_out
        for name in ("ttft", "tpot"):
            h = getattr(other, name)
            if h is not None and h.get_total_count():
                self._into(name, h)

    def _into(self, name: str, h: HdrHistogram) -> None:
        mine = getattr(self, name)
        if mine is None:
            mine = hdr.new_histogram()
            setattr(self, name, mine)
        mine.add(h)

    def row(self, width_s: float) -> dict[str, Any]:
        """The window row's token columns: output tokens per second of the window's
        width, and TTFT / TPOT p50 and p99 in ms (None with no value)."""
        out: dict[str, Any] = {"tokens_out_per_s": round(self.tokens_out / width_s, 3)}
        for name, h in (("ttft", self.ttft), ("tpot", self.tpot)):
            pct = hdr.summary_ms(h) if h is not None else {}
            out[f"{name}_p50_ms"] = pct.get("p50_ms")
            out[f"{name}_p99_ms"] = pct.get("p99_ms")
        return out
