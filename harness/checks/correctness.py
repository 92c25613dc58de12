"""Correctness checks: response integrity, thread-scaling linearity, request accounting."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.analysis.contention import QUICK_KINDS
from harness.analysis.linearity import efficiency, medians
from harness.analysis.validity import accounting_imbalance
from harness.checks import _data as d
from harness.checks._data import fmt
from harness.checks.latency import failure_kinds, unanswered
from harness.checks.model import Check, Result
from harness.checks.registry import implements
from harness.results.readers import usl_params


@implements("integrity.mismatches")
def mismatches(result: Mapping[str, Any], r: Result) -> Check:
    integ = result.get("integrity")
    if not integ:
        return r.skipped("no response integrity data was recorded in this scenario")
    checked = int(integ.get("checked") or 0)
    cross = int(integ.get("cross_wired") or 0)
    ids = int(integ.get("id_mismatch") or 0)
    drift = int(integ.get("drift") or 0)
    tolerance = integ.get("tolerance")
    # Drift is a wrong answer (its own output beyond the tolerance, or no input's output
    # at all) unless the checklist says the model is not deterministic under batching.
    counts_drift = not r.params["nondeterministic"]
    bad = cross + ids + (drift if counts_drift else 0)
    examples = integ.get("examples") or []
    if bad > int(r.threshold):
        shown = [e for e in examples if counts_drift or e.get("kind") != "drift"][:3]
        ex = "; ".join(_example(e) for e in shown)
        if cross + ids:
            step = "the batcher mixes up outputs: check how batch rows are scattered back"
        else:
            step = (
                "answers differ from the batch-1 golden outputs: check batching numerics "
                "(padding, dtype, kernel choice); if the model is non-deterministic by "
                "design, declare it with nondeterministic = true"
            )
        return r.judged(
            bad,
            False,
            f"{bad} of {checked} responses did not match their request "
            f"({cross} cross-wired, {ids} wrong id, {drift} drifted beyond "
            f"tolerance {tolerance}"
            + ("" if counts_drift else ", not counted: nondeterministic = true")
            + ")"
            + (f"; e.g. {ex}" if ex else "")
            + f" — {step}",
            n=checked,
        )
    if checked < int(r.params["min_checked"]):
        return r.skipped(
            f"insufficient samples: {checked} responses checked (need >= "
            f"{r.params['min_checked']}) — a mix-up rate r needs about 3/r requests",
            value=bad,
            n=checked,
        )
    # with zero seen in n, the 95 % upper bound on the mix-up rate is about 3/n
    detail = (
        f"{bad} of {checked} responses mismatched (rule of three: a mix-up rate above "
        f"{3 / checked:.3%} would have shown with 95 % confidence)"
    )
    if drift:
        detail += (
            f"; {drift} drifted beyond tolerance {tolerance} (not counted: the checklist "
            "declares the model nondeterministic)"
        )
    return r.judged(bad, True, detail, n=checked)


# the outcomes of a verified answer: counted in ``integrity.checked`` (and judged by
# integrity.mismatches), not among the requests that got no verifiable answer
VERIFIED_FAILURES = ("cross_wired", "drift", "id_mismatch")


@implements("integrity.failures")
def integrity_failures(result: Mapping[str, Any], r: Result) -> Check:
    """The share of the requests the scenario meant to verify that got no answer to
    verify: failed (any HTTP error, a body that is no V2 answer), timed out, reset or
    dropped at the client's cap — ``unanswered`` as ``steady.p99_ms`` counts it, less the
    verified answers that were wrong (integrity.mismatches judges those). A server that
    fails the requests it would mix up (every batch of two or more) leaves mismatches
    nothing to see; this is what fails it."""
    integ = result.get("integrity")
    if not integ:
        return r.skipped("no response integrity data was recorded in this scenario")
    if integ.get("verified") is False:
        return r.skipped(
            "no golden outputs were fetched (--no-verify), so no answer was meant to be verified"
        )
    c = d.counters(result)
    if c is None:
        return r.skipped("no request counters were recorded")
    failed = c.get("failed") or {}
    # refused at once as overload (503/429): not answers gone wrong but load the server
    # declined, as the high stage near capacity may; judged apart, against their own bound
    shed = sum(int(failed.get(k) or 0) for k in QUICK_KINDS)
    unverified = unanswered(c) - shed - sum(int(failed.get(k) or 0) for k in VERIFIED_FAILURES)
    checked = int(integ.get("checked") or 0)
    n = checked + unverified
    if n < int(r.params["min_requests"]):
        return r.skipped(
            f"insufficient samples: {n} finished requests (need >= "
            f"{r.params['min_requests']}) — run longer",
            n=n,
        )
    share = unverified / n
    shed_share = shed / (n + shed)
    ok = r.compare(share) and shed_share <= float(r.params["max_shed"])
    kinds = {k: v for k, v in failed.items() if k not in VERIFIED_FAILURES}
    detail = (
        f"{unverified} of {n} requests meant to be verified got no answer to verify "
        f"({share:.2%}) {'<=' if r.compare(share) else '>'} {float(r.threshold):.2%}; "
        f"{checked} answers verified; {shed} more refused at once as overload "
        f"({shed_share:.2%} of all, {'<=' if shed_share <= r.params['max_shed'] else '>'} "
        f"{float(r.params['max_shed']):.0%}); by kind: {failure_kinds({**c, 'failed': kinds})}"
    )
    if not ok:
        detail += (
            " — answers that never come cannot be checked: a server that fails (or refuses) "
            "its batched requests passes integrity.mismatches on the few it answers; see "
            "errors by kind (and by stage: batches fill in the high stage)"
        )
    return r.judged(round(share, 6), ok, detail, n=n)


def _example(e: Mapping[str, Any]) -> str:
    """One recorded mismatch in words."""
    if e.get("kind") == "drift":
        dist = e.get("distance")
        what = "no input's output" if dist is None else f"its own output off by {fmt(dist)}"
        return f"drift: sent input {e.get('sent_input')} got {what} (request {e.get('request_id')})"
    return (
        f"{e.get('kind')}: sent input {e.get('sent_input')} got the output of "
        f"{e.get('matched_input')} (request {e.get('request_id')})"
    )


@implements("linearity.efficiency")
def linearity_efficiency(result: Mapping[str, Any], r: Result) -> Check:
    lin = result.get("linearity")
    if not lin or not lin.get("points"):
        return r.skipped("no concurrency sweep was recorded in this scenario")
    need = int(r.params["min_replicates"])
    points = {int(p["n"]): [float(x) for x in p.get("throughput_rps") or []] for p in lin["points"]}
    thin = sorted(n for n, xs in points.items() if len(xs) < need)
    x1 = medians(points).get(1)
    if x1 is None or x1 <= 0:
        return r.skipped("no positive throughput measured at N = 1; efficiency needs X(1)")
    max_n = int(r.params["max_n"]) or int(lin.get("cores_available") or 0)
    if max_n <= 1:
        return r.skipped(
            "cores available to the server unknown or 1: nothing to scale over — set max_n"
        )
    judged_ns = [n for n in points if 1 < n <= max_n and len(points[n]) >= need]
    if not judged_ns or 1 in thin:
        return r.skipped(
            f"insufficient samples: concurrency levels {thin} have fewer than {need} "
            f"replicates and no level 2..{max_n} remains",
            n=sum(len(x) for x in points.values()),
        )
    eff = efficiency({n: xs for n, xs in points.items() if len(xs) >= need})
    worst_n = min(judged_ns, key=lambda n: eff[n])
    worst = eff[worst_n]
    ok = r.compare(worst)
    curve = ", ".join(f"E({n})={eff[n]:.2f}" for n in sorted(eff) if n > 1)
    # the document's one USL fit (linearity.usl); a hand-built result without it gets
    # the same fit computed the same way
    fit = lin["usl"] if "usl" in lin else usl_params(lin["points"])
    usl = ""
    if fit is not None:
        n_peak = fit.get("n_peak")
        peak = "none in range (κ=0)" if n_peak is None else f"N*={n_peak:.1f}"
        usl = f"; USL σ={fit['sigma']:.3f} κ={fit['kappa']:.4f}, {peak}"
    reps = min(len(points[n]) for n in [1, *judged_ns])
    detail = (
        f"worst efficiency E({worst_n})={worst:.2f} {'>=' if ok else '<'} "
        f"{fmt(r.threshold)} for N <= {max_n} (X(1)={fmt(x1)} req/s; "
        f"{curve}{usl}; {reps} replicate(s) per level"
        + (", fewer than 3: low confidence)" if reps < 3 else ")")
    )
    if not ok:
        detail += (
            " — a serialized stage (the GIL, a lock, one batcher thread): the per-thread "
            "CPU shows which thread sits near 100 %"
        )
    return r.judged(round(worst, 4), ok, detail, n=sum(len(points[n]) for n in [1, *judged_ns]))


@implements("accounting.balanced")
def balanced(result: Mapping[str, Any], r: Result) -> Check:
    c = result.get("counters")
    if not c:
        return r.skipped("no request counters were recorded")
    diff = accounting_imbalance(c)
    per_class = {
        name: accounting_imbalance(entry["counters"])
        for name, entry in (result.get("by_class") or {}).items()
        if entry.get("counters")
    }
    bad_classes = {k: v for k, v in per_class.items() if v}
    ok = diff == int(r.threshold) and not bad_classes
    failed = d.failed_total(c)
    detail = (
        f"scheduled {c.get('scheduled')} = ok {c.get('ok')} + failed {failed} + dropped "
        f"{c.get('dropped', 0)} + in flight {c.get('in_flight', 0)}"
        + (f" + aborted {c['aborted']}" if c.get("aborted") else "")
    )
    if diff:
        detail = detail.replace(" = ", " != ", 1) + f" (off by {diff:+d})"
    if bad_classes:
        detail += "; per class off by " + ", ".join(f"{k} {v:+d}" for k, v in bad_classes.items())
    if not ok:
        detail += " — a harness defect, the run is invalid; report it with results.json"
    return r.judged(diff, ok, detail, n=int(c.get("scheduled") or 0))
