"""Helpers shared by the report renderers: check states, verdict counts, number formatting.

Everything here reads the results document only (a report can be rendered on a
machine that never ran the test), through ``harness.results``: its histogram codec and
percentile rule — the checks' own, so a p99 in report.html is the p99 a check judged —
and its readers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from harness.analysis.trend import TrendParams, leak_test
from harness.results import combine_verdicts, hdr

PASS, FAIL, SKIP = "pass", "fail", "skipped"
_OP_TEXT = {"<=": "≤", ">=": "≥", "<": "<", ">": ">", "==": "=", "!=": "≠"}


def check_state(check: Mapping[str, Any]) -> str:
    """pass / fail / skipped. A check that was not evaluated is skipped, never a pass."""
    passed = check.get("passed")
    if passed is True:
        return PASS
    if passed is False:
        return FAIL
    return SKIP


def skip_reason(check: Mapping[str, Any]) -> str:
    return str(check.get("skipped") or check.get("detail") or "not evaluated")


@dataclass(frozen=True)
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.passed + other.passed, self.failed + other.failed, self.skipped + other.skipped
        )

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped

    def text(self) -> str:
        """``3 passed, 1 failed, 2 skipped`` — skipped is always said, never folded into passed."""
        return f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped"


def count_checks(checks: Iterable[Mapping[str, Any]]) -> Counts:
    states = [check_state(c) for c in checks]
    return Counts(states.count(PASS), states.count(FAIL), states.count(SKIP))


def document_counts(doc: Mapping[str, Any]) -> Counts:
    total = Counts()
    for sc in doc.get("scenarios", []):
        total = total + count_checks(sc.get("checks") or [])
    return total


def scenario_verdict(sc: Mapping[str, Any]) -> str | None:
    """The scenario's recorded verdict; if checks ran but none was recorded, derive it."""
    v = sc.get("verdict")
    if v is not None:
        return v
    counts = count_checks(sc.get("checks") or [])
    if counts.failed:
        return "fail"
    if counts.passed:
        return "pass"
    return None


def overall_verdict(doc: Mapping[str, Any]) -> str | None:
    if doc.get("verdict") is not None:
        return doc["verdict"]
    scs = doc.get("scenarios") or []
    return combine_verdicts(scenario_verdict(sc) for sc in scs) if scs else None


VERDICT_WORDS: Mapping[str | None, str] = {
    "pass": "PASS",
    "fail": "FAIL",
    "invalid": "INVALID",
    "not_judged": "NOT JUDGED",
    None: "NO VERDICT",
}


def excluded_scenarios(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Planned scenarios that did not run: (name, reason). The reason of one whose absence
    does not stop a pass says so: "optional here" (this machine cannot host its question)
    or "accepted" (``--allow-skip``)."""
    out = []
    allowed = set(doc.get("allow_skip") or ())
    for e in doc.get("excluded") or []:
        if isinstance(e, Mapping):
            why = str(e.get("reason") or "no reason recorded")
            if e.get("name") in allowed:
                why = f"accepted with --allow-skip: {why}"
            elif e.get("optional"):
                why = f"optional on this machine: {why}"
            out.append((str(e.get("name")), why))
    return out


def skipped_checks(doc: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Every check that was not judged: (scenario, check id, reason)."""
    return [
        (str(sc.get("name")), str(c["id"]), skip_reason(c))
        for sc in doc.get("scenarios") or []
        for c in sc.get("checks") or []
        if check_state(c) == SKIP
    ]


def not_judged_reason(sc: Mapping[str, Any]) -> str:
    """Why a scenario judged nothing: the reasons of its skipped checks."""
    reasons = [
        f"{c['id']}: {skip_reason(c)}"
        for c in sc.get("checks") or []
        if check_state(c) == SKIP and c.get("id") != "accounting.balanced"
    ]
    return "; ".join(reasons) or "the scenario lists no check that judges the server"


def verdict_sentence(doc: Mapping[str, Any]) -> str:
    """The one-line verdict: the word, the counts, and every skip and exclusion by name.

    ``PASS — 21 passed, 0 failed, 2 skipped across 7 scenarios; skipped:
    spike.recovery_s, …; not run: linearity (optional here: the server has 1 core …)``.
    A scenario not judged names the defining checks that were not judged; a skip or a
    scenario the user accepted (``--allow-skip``) is named as accepted.
    """
    verdict = overall_verdict(doc)
    scs = doc.get("scenarios") or []
    line = (
        f"{VERDICT_WORDS.get(verdict, str(verdict).upper())} — {document_counts(doc).text()} "
        f"across {len(scs)} scenario{'s' if len(scs) != 1 else ''}"
    )
    for word in ("fail", "invalid", "not_judged"):
        names = [
            str(sc.get("name")) + _unjudged_defining_text(sc)
            if word == "not_judged"
            else str(sc.get("name"))
            for sc in scs
            if scenario_verdict(sc) == word
        ]
        if names and (len(names) < len(scs) or verdict != word or word == "not_judged"):
            line += f"; {VERDICT_WORDS[word].lower()}: {', '.join(names)}"
    skipped = [(sc, cid) for sc, cid, _ in skipped_checks(doc)]
    accepted = accepted_skips(doc)
    plain = [cid for _, cid in skipped if cid not in accepted]
    if plain:
        line += f"; skipped: {', '.join(dict.fromkeys(plain))}"
    if accepted:
        line += f"; accepted unjudged (--allow-skip): {', '.join(accepted)}"
    excluded = excluded_scenarios(doc)
    if excluded:
        line += "; not run: " + "; ".join(f"{n} ({why})" for n, why in excluded)
    return line


def _unjudged_defining_text(sc: Mapping[str, Any]) -> str:
    """`` (its defining checks a, b not judged)`` for a scenario not judged because of them."""
    ids = unjudged_defining(sc)
    if not ids:
        return ""
    return f" (defining check{'s' if len(ids) > 1 else ''} {', '.join(ids)} not judged)"


def unjudged_defining(sc: Mapping[str, Any]) -> list[str]:
    """The ids of the scenario's defining checks (``defined_by``) that were skipped without
    the user accepting it: each one alone keeps the scenario from a pass."""
    defining = set(sc.get("defined_by") or ())
    return [
        str(c["id"])
        for c in sc.get("checks") or []
        if c.get("id") in defining and check_state(c) == SKIP and not c.get("accepted")
    ]


def accepted_skips(doc: Mapping[str, Any]) -> list[str]:
    """Check ids skipped with the user's acceptance, once each."""
    return list(
        dict.fromkeys(
            str(c["id"])
            for sc in doc.get("scenarios") or []
            for c in sc.get("checks") or []
            if check_state(c) == SKIP and c.get("accepted")
        )
    )


def earlier_attempts(sc: Mapping[str, Any]) -> list[str]:
    """One line per attempt of this scenario set aside as invalid because the machine was
    disturbed (``attempts``, harness.acceptance): these numbers come from the attempt
    after them, and the earlier ones are kept in their own directories."""
    lines = []
    for a in sc.get("attempts") or []:
        why = "; ".join(str(r) for r in a.get("validity") or []) or "no reason recorded"
        lines.append(
            f"attempt {a.get('attempt')} was invalid and was run again — {why} "
            f"(kept in {a.get('dir')}/)"
        )
    return lines


def invalid_reasons(sc: Mapping[str, Any]) -> list[str]:
    """Why a scenario run was invalid: its ``validity`` reasons, else its failed checks."""
    reasons = sc.get("validity")
    if isinstance(reasons, str):
        return [reasons]
    if reasons:
        return [str(r) for r in reasons]
    failed = [c for c in sc.get("checks") or [] if check_state(c) == FAIL]
    if failed:
        return [f"{c['id']}: {c.get('detail') or describe_measure(c)}" for c in failed]
    return ["the run was marked invalid (no reason recorded)"]


def fmt_num(value: Any) -> str:
    """Short human number: 3 significant digits for small values, thousands separators for big."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.1f}".removesuffix(".0")
        return f"{value:.3g}"
    return str(value)


def fmt_value(check: Mapping[str, Any]) -> str:
    text = fmt_num(check.get("value"))
    unit = check.get("unit") or ""
    return f"{text} {unit}".strip() if check.get("value") is not None else text


def fmt_threshold(check: Mapping[str, Any]) -> str:
    if check.get("threshold") is None:
        return "—"
    op = _OP_TEXT.get(str(check.get("op") or ""), str(check.get("op") or ""))
    unit = check.get("unit") or ""
    return f"{op} {fmt_num(check['threshold'])} {unit}".strip()


def describe_measure(check: Mapping[str, Any]) -> str:
    """``measured 0.42, threshold ≥ 0.5`` — the sentence a failure carries."""
    return f"measured {fmt_value(check)}, threshold {fmt_threshold(check)}"


# The percentiles of the report's latency tables.
SUMMARY_PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def decode_hdr(encoded: Any) -> HdrHistogram | None:
    """Decode a stored HDR string; None when absent, empty or unreadable (the plot/table
    is omitted — a damaged field must not cost the reader the rest of the report)."""
    try:
        h = hdr.decode(encoded)
    except hdr.HdrFormatError:
        return None
    return h if h.get_total_count() else None


def hdr_summary(encoded: Any) -> dict[str, Any] | None:
    """n, p50/p90/p99/p99.9/max in ms from an encoded µs histogram (the checks' nearest-
    rank rule, ``harness.results.hdr``); None if empty/absent."""
    h = decode_hdr(encoded)
    if h is None:
        return None
    return {"n": h.get_total_count(), **hdr.summary_ms(h, SUMMARY_PERCENTILES)}


def error_total(counters: Mapping[str, Any] | None) -> int:
    if not counters:
        return 0
    failed = counters.get("failed") or {}
    return int(sum(v for v in failed.values() if isinstance(v, int | float)))


@dataclass(frozen=True)
class TrendLine:
    """The leak detector's Theil–Sen fit of one series, for drawing and comparing."""

    slope_per_min: float  # y units per minute
    ci_low: float  # confidence interval of the slope (``ci``; the detector's default 90 %)
    ci_high: float
    start_s: float  # the fit covers [start_s, end_s]: the warm-up before it is excluded
    end_s: float
    intercept: float  # y at t = 0 on the fitted line

    def at(self, t: np.ndarray) -> np.ndarray:
        return self.intercept + self.slope_per_min / 60.0 * t


def trend_line(t: np.ndarray, y: np.ndarray, ci: float = 0.90) -> TrendLine | None:
    """Theil–Sen line of ``y`` over ``t`` (s) after the warm-up, as ``harness.analysis.trend``
    fits it (bucket medians, warm-up excluded); None when it has too few samples.

    Reports draw and compare this line; the leak *verdict* is the checks' job (with the
    scenario's own parameters), so the threshold here is irrelevant and set to 0.
    """
    res = leak_test(t, y, TrendParams(slope_threshold=0.0, ci=ci))
    if res.slope_per_min is None or res.ci_low is None or res.ci_high is None or not len(t):
        return None
    start = float(np.min(t)) + res.warmup_s
    keep = t >= start
    b = res.slope_per_min / 60.0
    intercept = float(np.median(y[keep] - b * t[keep]))
    return TrendLine(res.slope_per_min, res.ci_low, res.ci_high, start, float(np.max(t)), intercept)


def numeric_series(values: Iterable[Any], t: Iterable[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(t, y) arrays keeping only the ticks where both are numbers (gaps are None)."""
    pairs = [
        (float(a), float(b))
        for a, b in zip(t, values, strict=False)
        if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(b, bool)
    ]
    if not pairs:
        return np.empty(0), np.empty(0)
    arr = np.asarray(pairs)
    return arr[:, 0], arr[:, 1]


def run_problems(sc: Mapping[str, Any]) -> list[str]:
    """Why a scenario stopped early: the harness error and/or the server's exit."""
    out = []
    err = sc.get("error")
    if isinstance(err, Mapping):
        out.append(f"harness error {err.get('type', '?')}: {err.get('message', '')}")
    ex = sc.get("sut_exit")
    if isinstance(ex, Mapping):
        out.append(f"{ex.get('cause') or 'the server exited'} at t={fmt_num(ex.get('t_s'))} s")
    return out
