"""``harness compare BASE NEW``: a regression verdict per metric between two runs.

Metrics, per scenario present in both runs: p50 and p99 latency per priority class (from
the HDR histograms, ok responses), throughput (ok / duration), error rate (failed /
(ok + failed)), the RSS slope after warm-up (the leak detector's Theil–Sen fit, MiB/min), and every numeric check
value. A metric *regressed* when it moved the wrong way by more than its noise margin,

    allowed = max(abs_floor, rel × |base|)

(relative margin with an absolute floor, so tiny bases such as a 0.3 ms p50 or a 0 error
rate do not turn jitter into regressions). A check whose verdict went pass → fail regressed
whatever its margin. p99 is compared only when both runs have ≥ 1,000 samples (a p99
from fewer has a confidence interval too wide to compare: docs/checks.md): below that the row says "insufficient samples", never "unchanged".

Numbers from different machines are not comparable: runs whose ``machine`` metadata differ
in CPU model, governor, cpu_count, affinity or Python's minor version are refused
(ResultFormatError naming the field) unless ``force=True`` (``--force``), and then the
difference is printed as a warning; another patch release of the same Python (CI images
float it) is compared, with a warning. ``--margin METRIC=REL[:FLOOR]`` replaces a margin. The hostname is not compared: every ephemeral CI runner has its own, on the
same hardware class. Documents written before the CPU model was recorded fall back to the
hostname (nothing else says the CPU is the same).
"""

from __future__ import annotations

import dataclasses
import html
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, ResultFormatError
from harness.report.common import (
    TrendLine,
    check_state,
    error_total,
    fmt_num,
    hdr_summary,
    numeric_series,
    scenario_verdict,
    trend_line,
)
from harness.results import load_document, metadata_mismatch

# Fields whose difference makes two runs incomparable (pyperf refuses the same way).
COMPARED_MACHINE_FIELDS = ("cpu_model", "governor", "cpu_count", "affinity", "python")


def compared_machine_fields(
    a: Mapping[str, Any] | None, b: Mapping[str, Any] | None
) -> tuple[str, ...]:
    """The ``machine`` fields two runs must share: the CPU's identity when both documents
    record it, else (older documents) the hostname in its place."""
    a, b = a or {}, b or {}
    if "cpu_model" in a and "cpu_model" in b:
        return COMPARED_MACHINE_FIELDS
    return ("host", *(f for f in COMPARED_MACHINE_FIELDS if f not in ("cpu_model", "governor")))


REGRESSED, IMPROVED, UNCHANGED = "regressed", "improved", "unchanged"
INSUFFICIENT, MISSING, NEW, NOT_JUDGED = (
    "insufficient samples",
    "missing in new",
    "new",
    "not judged",
)
MIN_P99_SAMPLES = 1000
MIN_P50_SAMPLES = 100
# Two runs' RSS slopes differ only when their 99 % intervals are disjoint: on 30 s of a flat
# series, 90 % intervals were disjoint for one pair of synthetic runs in fifteen.
RSS_SLOPE_CI = 0.99


@dataclass(frozen=True)
class Margin:
    """Noise margin: a change is real only beyond ``max(abs_floor, rel × |base|)``."""

    rel: float
    abs_floor: float

    def allowed(self, base: float) -> float:
        return max(self.abs_floor, self.rel * abs(base))


@dataclass(frozen=True)
class Margins:
    """Default noise margins. Why these numbers:

    - p50: ±10 % or 0.25 ms — medians of thousands of samples are stable run to run.
    - p99: ±20 % or 1 ms — tails move with scheduling noise on a shared 2-core box.
    - throughput: ±5 % or 1 req/s — open-loop throughput tracks the offered rate closely.
    - error rate: ±50 % or 0.2 percentage points — a handful of extra errors is noise.
    - RSS slope: ±50 % or 0.5 MiB/min, and the runs' 99 % confidence intervals (the
      leak detector's fit) must not overlap — short runs give noisy slopes.
    - check values: ±10 % (no floor); a pass → fail flip always counts.
    """

    p50_ms: Margin = Margin(0.10, 0.25)
    p99_ms: Margin = Margin(0.20, 1.0)
    throughput_rps: Margin = Margin(0.05, 1.0)
    error_rate: Margin = Margin(0.50, 0.002)
    rss_slope_mib_min: Margin = Margin(0.50, 0.5)
    check: Margin = Margin(0.10, 0.0)


@dataclass(frozen=True)
class MetricDelta:
    scenario: str
    metric: str
    base: float | None
    new: float | None
    unit: str
    better: str  # "lower" | "higher" | "closer" (to the check's threshold)
    status: str
    note: str = ""

    @property
    def change_pct(self) -> float | None:
        if self.base is None or self.new is None or self.base == 0:
            return None
        return (self.new - self.base) / abs(self.base) * 100


@dataclass(frozen=True)
class Comparison:
    base_label: str
    new_label: str
    deltas: tuple[MetricDelta, ...]
    warnings: tuple[str, ...] = ()
    invalid_scenarios: tuple[str, ...] = ()
    margins: Margins = field(default_factory=Margins)

    @property
    def regressions(self) -> list[MetricDelta]:
        return [d for d in self.deltas if d.status == REGRESSED]

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)

    @property
    def verdict(self) -> str:
        """``regressed`` (CLI exit 1), ``invalid`` (a run judges nothing: exit 3) or ``ok``."""
        if self.regressed:
            return "regressed"
        return "invalid" if self.invalid_scenarios else "ok"

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.deltas:
            out[d.status] = out.get(d.status, 0) + 1
        return out

    def headline(self) -> str:
        c = self.counts()
        word = {"regressed": "REGRESSED", "invalid": "INVALID", "ok": "NO REGRESSION"}[self.verdict]
        parts = [
            f"{c.get(REGRESSED, 0)} regressed",
            f"{c.get(IMPROVED, 0)} improved",
            f"{c.get(UNCHANGED, 0)} within noise",
        ]
        parts += [
            f"{n} {s}" for s, n in sorted(c.items()) if s not in (REGRESSED, IMPROVED, UNCHANGED)
        ]
        return f"{word}: {', '.join(parts)} ({self.base_label} → {self.new_label})"

    def to_text(self) -> str:
        lines = [self.headline()]
        lines += [f"warning: {w}" for w in self.warnings]
        for d in self.regressions:
            lines.append(
                f"  {d.scenario} {d.metric}: {_num(d.base, d.unit)} → {_num(d.new, d.unit)} ({_pct(d)}) {d.note}".rstrip()
            )
        return "\n".join(lines) + "\n"

    def to_markdown(self) -> str:
        icon = {REGRESSED: "❌", IMPROVED: "✅", UNCHANGED: "➖"}
        lines = [
            f"## Comparison: {_md(self.base_label)} → {_md(self.new_label)}",
            "",
            f"**{_md(self.headline())}**",
            "",
        ]
        lines += [f"> ⚠️ {_md(w)}" for w in self.warnings]
        if self.warnings:
            lines.append("")
        lines += [
            "| scenario | metric | base | new | change | verdict | note |",
            "|---|---|---|---|---|---|---|",
        ]
        for d in self.deltas:
            lines.append(
                f"| {_md(d.scenario)} | `{_md(d.metric)}` | {_md(_num(d.base, d.unit))} | {_md(_num(d.new, d.unit))} | "
                f"{_md(_pct(d))} | {icon.get(d.status, '⏭️')} {_md(d.status)} | {_md(d.note)} |"
            )
        return "\n".join(lines) + "\n"


def _md(text: Any) -> str:
    return html.escape(str(text), quote=False).replace("|", "\\|").replace("\n", " ")


def _num(value: float | None, unit: str) -> str:
    return "—" if value is None else f"{fmt_num(value)} {unit}".strip()


def _pct(d: MetricDelta) -> str:
    pct = d.change_pct
    return "—" if pct is None else f"{pct:+.1f}%"


def judge(
    base: float | None, new: float | None, better: str, margin: Margin, target: float | None = None
) -> tuple[str, str]:
    """(status, note) for one metric. ``better='closer'`` means closer to ``target``."""
    if base is None and new is None:
        return NOT_JUDGED, "no value in either run"
    if new is None:
        return MISSING, "no value in the new run"
    if base is None:
        return NEW, "no value in the base run"
    if better == "closer":
        ref = 0.0 if target is None else target
        worse = abs(new - ref) - abs(base - ref)
        allowed = margin.allowed(abs(base - ref))
    else:
        worse = (new - base) if better == "lower" else (base - new)
        allowed = margin.allowed(base)
    note = f"margin ±{fmt_num(allowed)}"
    if worse > allowed:
        return REGRESSED, note
    if -worse > allowed:
        return IMPROVED, note
    return UNCHANGED, note


def _throughput(sc: Mapping[str, Any]) -> float | None:
    ok = (sc.get("counters") or {}).get("ok")
    dur = sc.get("duration_s")
    if not isinstance(ok, int | float) or not isinstance(dur, int | float) or dur <= 0:
        return None
    return ok / dur


def _error_rate(sc: Mapping[str, Any]) -> float | None:
    counters = sc.get("counters") or {}
    ok = counters.get("ok")
    if not isinstance(ok, int | float):
        return None
    failed = error_total(counters)
    return failed / (ok + failed) if ok + failed else None


def rss_slope_mib_min(sc: Mapping[str, Any]) -> TrendLine | None:
    """The leak detector's Theil–Sen RSS trend after warm-up (MiB/min, 99 % CI)."""
    series = ((sc.get("server") or {}).get("series")) or {}
    t, y = numeric_series(series.get("rss_bytes") or [], series.get("t") or [])
    return trend_line(t, y / 2**20, ci=RSS_SLOPE_CI) if len(t) else None


def _rss_delta(
    name: str, base: Mapping[str, Any], new: Mapping[str, Any], margin: Margin
) -> MetricDelta | None:
    # A slope change counts only when the runs' confidence intervals do not overlap: on a
    # short run a flat series gives slopes of ±1 MiB/min from noise alone.
    b, n = rss_slope_mib_min(base), rss_slope_mib_min(new)
    if b is None and n is None:
        return None
    bv = b.slope_per_min if b else None
    nv = n.slope_per_min if n else None
    status, note = judge(bv, nv, "lower", margin)
    if b and n and status in (REGRESSED, IMPROVED):
        lo, hi = (b, n) if status == REGRESSED else (n, b)
        if hi.ci_low <= lo.ci_high:
            status = UNCHANGED
            note = f"{note}; CIs overlap ({fmt_num(b.ci_low)}..{fmt_num(b.ci_high)} vs {fmt_num(n.ci_low)}..{fmt_num(n.ci_high)})"
    return MetricDelta(name, "rss_slope", bv, nv, "MiB/min", "lower", status, note)


def _scenario_deltas(
    name: str, base: Mapping[str, Any], new: Mapping[str, Any], m: Margins
) -> list[MetricDelta]:
    out: list[MetricDelta] = []
    for cls in sorted(set(base.get("by_class") or {}) | set(new.get("by_class") or {})):
        b = hdr_summary(((base.get("by_class") or {}).get(cls) or {}).get("latency_hdr"))
        n = hdr_summary(((new.get("by_class") or {}).get(cls) or {}).get("latency_hdr"))
        for key, margin, min_n in (
            ("p50_ms", m.p50_ms, MIN_P50_SAMPLES),
            ("p99_ms", m.p99_ms, MIN_P99_SAMPLES),
        ):
            bv, nv = (b or {}).get(key), (n or {}).get(key)
            status, note = judge(bv, nv, "lower", margin)
            if b and n and min(b["n"], n["n"]) < min_n:
                status, note = INSUFFICIENT, f"n = {min(b['n'], n['n']):,} < {min_n:,}"
            out.append(MetricDelta(name, f"{key}[{cls}]", bv, nv, "ms", "lower", status, note))
    for metric, fn, better, margin, unit in (
        ("throughput_rps", _throughput, "higher", m.throughput_rps, "req/s"),
        ("error_rate", _error_rate, "lower", m.error_rate, ""),
    ):
        bv, nv = fn(base), fn(new)
        if bv is None and nv is None:
            continue
        status, note = judge(bv, nv, better, margin)
        out.append(MetricDelta(name, metric, bv, nv, unit, better, status, note))
    rss = _rss_delta(name, base, new, m.rss_slope_mib_min)
    if rss is not None:
        out.append(rss)
    out += _check_deltas(name, base, new, m.check)
    return out


def _check_deltas(
    name: str, base: Mapping[str, Any], new: Mapping[str, Any], margin: Margin
) -> list[MetricDelta]:
    out = []
    base_checks = {c["id"]: c for c in base.get("checks") or []}
    for cid, nc in ((c["id"], c) for c in new.get("checks") or []):
        bc = base_checks.pop(cid, None)
        if bc is None:
            out.append(
                MetricDelta(
                    name,
                    f"check {cid}",
                    None,
                    _f(nc.get("value")),
                    nc.get("unit") or "",
                    "",
                    NEW,
                    "check not in the base run",
                )
            )
            continue
        op = str(nc.get("op") or bc.get("op") or "")
        better = "lower" if op.startswith("<") else "higher" if op.startswith(">") else "closer"
        bv, nv = _f(bc.get("value")), _f(nc.get("value"))
        bs, ns = check_state(bc), check_state(nc)
        if bs == "pass" and ns == "fail":
            status, note = REGRESSED, "verdict pass → fail"
        elif bs == "fail" and ns == "pass":
            status, note = IMPROVED, "verdict fail → pass"
        else:
            status, note = judge(bv, nv, better, margin, _f(nc.get("threshold")))
            if "skipped" in (bs, ns):
                where = "both runs" if bs == ns else "base" if bs == "skipped" else "new"
                note = (
                    f"skipped in {where}" if status == NOT_JUDGED else f"{note}; skipped in {where}"
                )
        out.append(
            MetricDelta(name, f"check {cid}", bv, nv, nc.get("unit") or "", better, status, note)
        )
    for cid, bc in base_checks.items():
        out.append(
            MetricDelta(
                name,
                f"check {cid}",
                _f(bc.get("value")),
                None,
                bc.get("unit") or "",
                "",
                MISSING,
                "check not in the new run",
            )
        )
    return out


def _f(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def compare(
    base_doc: Mapping[str, Any],
    new_doc: Mapping[str, Any],
    force: bool = False,
    margins: Margins | None = None,
    labels: tuple[str, str] = ("base", "new"),
) -> Comparison:
    """Compare two results documents metric by metric (see the module docstring)."""
    m = margins or Margins()
    warnings: list[str] = []
    machines = (base_doc.get("machine"), new_doc.get("machine"))
    for fld in compared_machine_fields(*machines):
        diff = metadata_mismatch(*machines, [fld])
        if diff is None:
            continue
        _, a, b = diff
        msg = f"machine.{fld} is {a!r} in {labels[0]} but {b!r} in {labels[1]}"
        if fld == "python" and _minor_version(a) == _minor_version(b) is not None:
            # CI images float the patch release (setup-python's "3.11"); a patch release
            # changes no interpreter performance a margin would not absorb.
            warnings.append(f"{msg} (same minor version: compared)")
            continue
        if not force:
            raise ResultFormatError(
                f"cannot compare runs from different machines: {msg}; numbers are not comparable — pass --force to compare anyway"
            )
        warnings.append(f"{msg} (compared anyway: --force)")
    for section, fld in (
        ("machine", "host"),
        ("machine", "platform"),
        ("machine", "harness_version"),
        ("sut", "cmd"),
    ):
        a = (base_doc.get(section) or {}).get(fld)
        b = (new_doc.get(section) or {}).get(fld)
        if a != b:
            warnings.append(f"{section}.{fld} differs: {a!r} → {b!r}")
    base_by = _by_name(base_doc)
    new_by = _by_name(new_doc)
    deltas: list[MetricDelta] = []
    invalid: list[str] = []
    for key, new_sc in new_by.items():
        base_sc = base_by.get(key)
        if base_sc is None:
            warnings.append(f"scenario {key} is only in {labels[1]}: nothing to compare it with")
            continue
        rows = _scenario_deltas(key, base_sc, new_sc, m)
        bad = [
            lbl
            for lbl, sc in ((labels[0], base_sc), (labels[1], new_sc))
            if scenario_verdict(sc) == "invalid"
        ]
        if bad:
            invalid.append(key)
            note = f"run invalid in {' and '.join(bad)}: judges nothing"
            rows = [
                MetricDelta(d.scenario, d.metric, d.base, d.new, d.unit, d.better, NOT_JUDGED, note)
                for d in rows
            ]
        deltas += rows
    for key in base_by.keys() - new_by.keys():
        warnings.append(f"scenario {key} is only in {labels[0]}: it did not run in {labels[1]}")
    return Comparison(labels[0], labels[1], tuple(deltas), tuple(warnings), tuple(invalid), m)


def _minor_version(version: Any) -> str | None:
    """ "3.11" for "3.11.7" (a version string's first two parts); None when it has fewer."""
    parts = str(version or "").split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and all(parts[:2]) else None


def parse_margin(text: str, margins: Margins | None = None) -> Margins:
    """``METRIC=REL[:FLOOR]`` (``--margin p99_ms=0.3:2``) applied to ``margins``: REL a
    fraction of the base value, FLOOR the absolute floor in the metric's unit (kept from
    the default when omitted). A ConfigError naming the metrics when it does not parse."""
    m = margins or Margins()
    names = [f.name for f in dataclasses.fields(Margins)]
    metric, sep, value = text.partition("=")
    rel_text, _, floor_text = value.partition(":")
    try:
        if not sep or metric not in names:
            raise ValueError
        current: Margin = getattr(m, metric)
        rel = float(rel_text)
        floor = float(floor_text) if floor_text else current.abs_floor
        if not (rel >= 0 and floor >= 0):
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"--margin has value {text!r}; use METRIC=REL[:FLOOR] with REL and FLOOR ≥ 0, "
            f"METRIC one of {', '.join(names)} (e.g. --margin p99_ms=0.3:2)"
        ) from None
    return dataclasses.replace(m, **{metric: Margin(rel, floor)})


def _by_name(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    # A scenario run twice in one document is told apart by its occurrence: name#2.
    out: dict[str, Mapping[str, Any]] = {}
    for sc in doc.get("scenarios") or []:
        key, i = sc["name"], 1
        while key in out:
            i += 1
            key = f"{sc['name']}#{i}"
        out[key] = sc
    return out


def compare_dirs(
    base_dir: str | os.PathLike[str],
    new_dir: str | os.PathLike[str],
    force: bool = False,
    margins: Margins | None = None,
) -> Comparison:
    """``harness compare BASE_DIR NEW_DIR``: load both results.json and compare them."""
    base, new = Path(base_dir), Path(new_dir)
    return compare(
        load_document(base / "results.json"),
        load_document(new / "results.json"),
        force=force,
        margins=margins,
        labels=(str(base), str(new)),
    )
