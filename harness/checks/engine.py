"""Run a scenario's checks, judge the run's validity, and reduce to one verdict."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

from harness.analysis import validity as v
from harness.analysis.chaos_evidence import chaos_not_applied
from harness.analysis.percentiles import percentile_ms
from harness.catalog import CATALOG
from harness.checks import _data as d
from harness.checks import registry
from harness.checks.model import Check, ValidityParams
from harness.checks.registry import ALLOW_SKIP, resolve_params, run_check
from harness.checks.soak import needed_server_series
from harness.errors import ConfigError, ResultFormatError

# Declared ``always`` in the catalog: ``accounting.balanced``.
ALWAYS: tuple[str, ...] = CATALOG.always
# Added by judge_scenario when the server died or could not be reached (a failure).
RUN_COMPLETED = "run.completed"
# The latency bounds that dispatch lag is measured against, by check: each is timed from
# the request's intended send time, so a request sent late is judged late. For a token
# stream that is its TTFT (TPOT is measured within the stream: a late send does not move
# it); ``llm.overload`` bounds a spike's first tokens and its refusals, and the fail-fast
# checks the median time of an overload's 503/429s, each timed so. (A recovery band is
# relative to the same run's baseline, sent at a fraction of the overload's rate where
# the generator is least busy; a generator late for seconds is saturated, which validity
# judges apart.)
SLO_PARAMS: Mapping[str, tuple[str, ...]] = {
    "steady.p99_ms": ("threshold",),
    "priority.high_p99_ms": ("threshold",),
    "llm.ttft_p99": ("threshold",),
    "llm.priority_ttft_p99": ("threshold",),
    "llm.overload": ("ttft_ms", "reject_ms"),
    "spike.fail_fast": ("max_reject_p50_ms",),
    "contention.fail_fast": ("max_reject_p50_ms",),
}


def evaluate(
    scenario_result: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> list[Check]:
    """Run the checks in ``scenario_result["check_config"]`` plus ``accounting.balanced``.

    Parameters: each check's defaults ← the scenario's ``check_config`` entry ← the
    checklist ``overrides`` (``load_checklist``'s mapping). A checklist entry for a check
    the scenario does not list changes nothing here.
    """
    config = scenario_result.get("check_config") or {}
    if not isinstance(config, Mapping):
        raise ResultFormatError(
            f"scenario '{scenario_result.get('name')}': check_config has value {config!r}; "
            "expected a mapping of check id to parameters"
        )
    overrides = overrides or {}
    ids = list(config) + [c for c in ALWAYS if c not in config]
    checks: list[Check] = []
    for cid in ids:
        if cid not in registry.REGISTRY:
            raise ConfigError(
                f"scenario '{scenario_result.get('name')}' lists unknown check id '{cid}'. "
                f"Valid ids: {', '.join(sorted(registry.REGISTRY))}."
            )
        params = resolve_params(cid, config.get(cid), overrides.get(cid))
        try:
            checks.append(run_check(cid, scenario_result, params))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ResultFormatError(
                f"scenario '{scenario_result.get('name')}': check '{cid}' cannot read the "
                f"result ({type(e).__name__}: {e}); the results document does not match "
                "docs/architecture.md"
            ) from e
    return checks


def own_checks(checks: Sequence[Check]) -> list[Check]:
    """The checks that judge the server: not the harness's own bookkeeping
    (``accounting.balanced``) nor the run's completion (``run.completed``)."""
    return [c for c in checks if c.id not in ALWAYS and c.id != RUN_COMPLETED]


Verdict = Literal["pass", "fail", "invalid", "not_judged"]


def verdict(
    checks: Sequence[Check],
    validity: Sequence[str] | None = None,
    defined_by: Sequence[str] | None = None,
    accepted: Collection[str] = (),
) -> Verdict:
    """invalid if the measurement cannot be trusted; fail if any check failed;
    not_judged if a check that defines the scenario was not judged (and its skip was not
    accepted), or if none of the scenario's own checks was judged; else pass.

    A pass must be earned: skipped checks (passed None) neither pass nor fail. The checks in
    ``defined_by`` answer the scenario's question (a soak's leak trends, integrity's
    mismatches), so one of them skipped leaves the question open whatever the others say —
    a latency check alone does not make a soak pass. ``accepted``: check ids whose skip the
    user accepted (``--allow-skip``, the checklist's ``allow_skip`` or ``enabled = false``).
    ``accounting.balanced`` passing says the harness counted right, not that the server
    did anything right, so a scenario judged on it alone is "not_judged" (exit 4).
    """
    if validity:
        return "invalid"
    if any(c.passed is False for c in checks):
        return "fail"
    if unjudged_defining(checks, defined_by, accepted):
        return "not_judged"
    if not any(c.passed is True for c in own_checks(checks)):
        return "not_judged"
    return "pass"


def unjudged_defining(
    checks: Sequence[Check], defined_by: Sequence[str] | None, accepted: Collection[str] = ()
) -> list[Check]:
    """The defining checks that were skipped without the user accepting it."""
    ids = set(defined_by or ())
    return [c for c in checks if c.id in ids and c.passed is None and c.id not in accepted]


def accepted_skips(
    scenario_result: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> frozenset[str]:
    """Check ids of this scenario whose skip the user accepted: named in ``allow_skip`` (the
    checklist's, or ``--allow-skip`` recorded in the document), or disabled with
    ``enabled = false``."""
    overrides = overrides or {}
    allowed = set(overrides.get(ALLOW_SKIP) or ())
    config = scenario_result.get("check_config") or {}
    for cid in config:
        if cid in registry.REGISTRY and not resolve_params(
            cid, config.get(cid), overrides.get(cid)
        ).get("enabled", True):
            allowed.add(cid)
    return frozenset(allowed)


def _slo_ms(result: Mapping[str, Any], overrides: Mapping[str, Any], default: float) -> float:
    """The tightest latency bound the scenario judges (``SLO_PARAMS``; dispatch lag is
    relative to it)."""
    config = result.get("check_config") or {}
    slos = [
        float(resolve_params(cid, config.get(cid), overrides.get(cid))[name])
        for cid, names in SLO_PARAMS.items()
        if cid in config
        for name in names
    ]
    return min(slos) if slos else default


def foreign_shares(
    scenario_result: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> list[v.ForeignShare]:
    """The CPU not the run's on the server's cores (``system.series.foreign_cpu_pct`` over
    ``foreign_cores``), as a share of their capacity: over the whole run (first), over the
    judged part of each stage (after its ``warmup_s``), and over every
    ``foreign_window_s`` window. Empty when no sampler measured it, and for results
    recorded before that series (their ``other_cpu_pct`` mixes in the generator's cores:
    ``not_measured`` says so)."""
    p = ValidityParams.from_mapping((overrides or {}).get("validity"))
    system = scenario_result.get("system") or {}
    series = system.get("series") or {}
    t = series.get("t") or []
    pct, cores = series.get("foreign_cpu_pct"), series.get("foreign_cores")
    if not t or not pct or not cores:
        return []
    run_s = float(scenario_result.get("duration_s") or 0.0)
    started, run_start = system.get("started_unix"), scenario_result.get("started_unix")
    offset = float(started) - float(run_start) if started and run_start else 0.0
    windows: list[tuple[str, float, float]] = [("the run", 0.0, run_s)] if run_s > 0 else []
    for st in scenario_result.get("stages") or []:
        a = float(st.get("start_s") or 0.0) + float(st.get("warmup_s") or 0.0)
        b = float(st.get("end_s") or 0.0)
        if run_s > 0:
            b = min(b, run_s)
        if b > a:
            windows.append((f"stage '{st.get('name')}'", a, b))
    return v.foreign_shares(
        t,
        pct,
        cores,
        windows,
        offset_s=offset,
        window_s=p.foreign_window_s,
        run_s=run_s if run_s > 0 else None,
    )


def probe_reasons(scenario_result: Mapping[str, Any]) -> list[str]:
    """The judged scenario's validity reasons about its capacity probe (another tenant
    or a saturated generator while it measured): its capacity is not the server's, and
    is not to be reused (``harness.acceptance`` pins only an undisturbed probe's)."""
    return [r for r in scenario_result.get("validity") or [] if str(r).startswith(v.PROBE)]


def disturbance_reasons(
    scenario_result: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> list[str]:
    """The validity reasons a disturbance of the machine gives: another tenant's CPU on the
    server's cores beyond the budget (over the run, a stage, any ``foreign_window_s``, or
    the capacity probe), and requests that left late (dispatch lag). Unlike the
    generator's own saturation, a sampler gap or unbalanced accounting, they say the
    machine was not quiet for this run, not that the run cannot be measured here: the
    same run again may be valid (``harness.acceptance`` runs it once more;
    docs/checks.md, "Invalid runs")."""
    overrides = overrides or {}
    p = ValidityParams.from_mapping(overrides.get("validity"))
    system = scenario_result.get("system") or {}
    reasons: list[str | None] = []
    # another tenant on the server's cores (the sampler's CPU there that no process of
    # the run could have used), integrated: the server was not measured alone
    started, run_start = system.get("started_unix"), scenario_result.get("started_unix")
    # a span is over budget when its foreign CPU exceeds both its share of the span's
    # capacity and one unattributable event of the run (foreign_event_core_s)
    over = [
        w
        for w in foreign_shares(scenario_result, overrides)
        if w.core_s > max(p.foreign_budget * w.capacity_core_s, p.foreign_event_core_s)
    ]
    reasons.append(
        v.foreign_cpu_budget(
            over,
            system.get("foreign_processes") or [],
            budget=p.foreign_budget,
            offset_s=float(started) - float(run_start) if started and run_start else 0.0,
            interval_s=float((scenario_result.get("server") or {}).get("interval_s") or 1.0),
        )
    )
    # the capacity probe measured before the sampler started: its own accounting
    probe_tenant, _ = v.probe_problems(
        (scenario_result.get("calibration") or {}).get("cpu"),
        budget=p.foreign_budget,
        loadgen_max_pct=p.loadgen_max_pct,
    )
    reasons.append(probe_tenant)

    lag = d.optional_hist(scenario_result.get("dispatch_lag_hdr"))
    reasons.append(
        v.dispatch_lag_excessive(
            lag,
            _slo_ms(scenario_result, overrides, p.default_slo_ms),
            max_fraction=p.lag_max_fraction,
        )
    )
    return [r for r in reasons if r]


def validity(
    scenario_result: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> list[str]:
    """Reasons the run judges nothing (empty list = valid). See docs/checks.md."""
    overrides = overrides or {}
    p = ValidityParams.from_mapping(overrides.get("validity"))
    reasons: list[str | None] = []

    system = scenario_result.get("system") or {}
    sys_series = system.get("series") or {}
    cpu = sys_series.get("loadgen_cpu_pct")
    if system.get("loadgen_processes") and sys_series.get("t"):
        # per Locust process (one gevent loop on one core): one saturated worker is
        # saturation even when the summed series looks half used
        reasons.append(
            v.loadgen_process_saturated(
                sys_series["t"],
                system["loadgen_processes"],
                max_pct=p.loadgen_max_pct,
                sustain_s=p.loadgen_sustain_s,
            )
        )
    elif cpu and len(sys_series.get("t") or []) == len(cpu):
        # results recorded before per-process CPU: the series sums the generator's
        # processes (100 = one core); with N Locust workers, N x the per-process limit
        workers = max(1, int((scenario_result.get("load") or {}).get("workers") or 1))
        reasons.append(
            v.loadgen_saturated(
                sys_series["t"],
                cpu,
                max_pct=p.loadgen_max_pct * workers,
                sustain_s=p.loadgen_sustain_s,
            )
        )
    else:
        # no sampler ran: the workers' CPU time over the run — coarse, never silent
        reasons.append(
            v.loadgen_mean_saturated(
                (scenario_result.get("load") or {}).get("cpu_s_by_worker") or {},
                float(scenario_result.get("duration_s") or 0.0),
                max_pct=p.loadgen_max_pct,
            )
        )

    reasons += disturbance_reasons(scenario_result, overrides)
    # the capacity probe's generator (not a disturbance: the same probe saturates again)
    reasons.append(
        v.probe_problems(
            (scenario_result.get("calibration") or {}).get("cpu"),
            budget=p.foreign_budget,
            loadgen_max_pct=p.loadgen_max_pct,
        )[1]
    )

    server = scenario_result.get("server")
    if server:
        # a sampler ran: its samples must cover the run, or the checks that read them
        # and the saturation rule above would switch off without a word
        reasons.append(
            v.sampler_problems(
                server,
                scenario_result.get("system"),
                run_start_unix=scenario_result.get("started_unix"),
                run_s=float(scenario_result.get("duration_s") or 0.0),
                needed=needed_server_series(scenario_result.get("check_config") or {}, overrides),
                min_coverage=p.min_coverage,
                max_missed_frac=p.max_missed_frac,
                max_gap_intervals=p.max_gap_intervals,
            )
        )

    counters = scenario_result.get("counters")
    if counters:
        reasons.append(v.accounting_unbalanced(counters, "run"))
        for name, entry in (scenario_result.get("by_class") or {}).items():
            if entry.get("counters"):
                reasons.append(v.accounting_unbalanced(entry["counters"], f"class '{name}'"))

    # the chaos the scenario is about must have happened (docs/checks.md, "Invalid runs")
    reasons += chaos_not_applied(scenario_result)
    return [r for r in reasons if r]


def not_measured(scenario_result: Mapping[str, Any]) -> list[str]:
    """What validity could not judge for want of a measurement — said with the verdict
    (``not_measured`` in the result, shown by the reports), never a reason the run is
    invalid: another tenant's CPU on the server's cores when no sampler measured it (a
    target given by URL only, ``--no-sample``), and during the capacity probe when the
    server's process was not on this host."""
    out: list[str] = []
    series = (scenario_result.get("system") or {}).get("series") or {}
    if series.get("other_cpu_pct") and not series.get("foreign_cpu_pct"):
        out.append(
            "foreign CPU on the server's cores: not measured — these results were recorded "
            "before the sampler measured the server's cores on their own"
        )
    elif not series.get("foreign_cpu_pct"):
        out.append(
            "foreign CPU on the server's cores: not measured — no sampler ran (a target "
            "given without --sut-pid, or --no-sample), so another tenant taking the "
            "server's CPU could not make this run invalid; pass --sut-pid, --sut-cmd or "
            "--agent to measure it"
        )
    calibration = scenario_result.get("calibration") or {}
    probe = calibration.get("cpu") if isinstance(calibration, Mapping) else None
    if isinstance(probe, Mapping) and not probe.get("measured"):
        out.append(
            "foreign CPU during the capacity probe: not measured — "
            f"{probe.get('why') or 'the server was not on this host'}"
        )
    return out


def validity_margins(
    scenario_result: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> dict[str, tuple[float | None, float]]:
    """How close a run came to the validity limits: name → (measured, limit).

    ``dispatch_lag_p99_ms``: the open-loop lag p99 and 10 % (``lag_max_fraction``) of
    the SLO. ``loadgen_cpu_pct``: the highest level the busiest generator process held
    for ``loadgen_sustain_s`` (``sustained_level``) and its per-process limit (older
    results: the summed series and the limit × workers). ``foreign_cpu_share``: of the
    spans ``foreign_shares`` gives, the one nearest its allowance — its share of the
    server's cores used by work not the run's, and its limit (``foreign_budget``, or one
    ``foreign_event_core_s`` over a short span).
    For bench/flakiness.py: a ratio near 1 is a run about to be judged invalid.
    """
    overrides = overrides or {}
    p = ValidityParams.from_mapping(overrides.get("validity"))
    out: dict[str, tuple[float | None, float]] = {}
    lag = d.optional_hist(scenario_result.get("dispatch_lag_hdr"))
    if lag is not None and lag.get_total_count():
        slo = _slo_ms(scenario_result, overrides, p.default_slo_ms)
        out["dispatch_lag_p99_ms"] = (percentile_ms(lag, 99.0), p.lag_max_fraction * slo)
    sys_series = (scenario_result.get("system") or {}).get("series") or {}
    t, cpu = sys_series.get("t") or [], sys_series.get("loadgen_cpu_pct") or []
    procs = (scenario_result.get("system") or {}).get("loadgen_processes")
    if procs and t:
        # the busiest single process against the per-process limit, as validity judges it
        held = v.loadgen_process_held(t, procs, p.loadgen_sustain_s)
        out["loadgen_cpu_pct"] = (held, p.loadgen_max_pct)
    elif cpu and len(t) == len(cpu):
        workers = max(1, int((scenario_result.get("load") or {}).get("workers") or 1))
        held = v.sustained_level(t, cpu, p.loadgen_sustain_s)
        out["loadgen_cpu_pct"] = (held, p.loadgen_max_pct * workers)
    # the span nearest its allowance (the larger of the budget's share and one
    # unattributable event), as disturbance_reasons judges it: (its share, its limit)
    limits = [
        (w.share, max(p.foreign_budget, p.foreign_event_core_s / w.capacity_core_s))
        for w in foreign_shares(scenario_result, overrides)
    ]
    if limits:
        out["foreign_cpu_share"] = max(limits, key=lambda sl: sl[0] / sl[1])
    return out


def _run_problems(sc: Mapping[str, Any]) -> tuple[Check | None, list[str]]:
    """A failed ``run.completed`` check for a server that died or could not be reached
    (a crashed SUT is a failed check, with the cause: docs/checks.md), and validity reasons
    for a harness that failed itself."""
    sut_exit = sc.get("sut_exit")
    error = sc.get("error") or {}
    if sut_exit:
        detail = (
            f"{sut_exit.get('cause') or 'the server under test exited'} at "
            f"t={sut_exit.get('t_s')} s; the checks judged the partial results — see the "
            "server's log tail in results.json"
        )
        value = sut_exit.get("exit_code")
    elif error.get("type") == "TargetUnavailable":
        detail = f"the server under test was unavailable: {error.get('message')}"
        value = None
    elif error:
        return None, [
            f"the harness failed ({error.get('type')}: {error.get('message')}); the run "
            "judges nothing — fix the cause and rerun"
        ]
    else:
        return None, []
    check = Check(RUN_COMPLETED, False, value, 0, "==", "exit code", None, detail)
    return check, []


def judge_scenario(
    scenario_result: dict[str, Any], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Fill ``checks``, ``validity`` and ``verdict`` of one scenario result in place.

    A server that died during the run adds a failed ``run.completed`` check (not a
    checklist id: it reports the run, not a property of the server's answers).
    """
    checks = evaluate(scenario_result, overrides)
    reasons = validity(scenario_result, overrides)
    died, harness_failed = _run_problems(scenario_result)
    if died is not None:
        checks.append(died)
    reasons += harness_failed
    accepted = accepted_skips(scenario_result, overrides)
    scenario_result["checks"] = [
        {**c.to_dict(), "accepted": True} if c.passed is None and c.id in accepted else c.to_dict()
        for c in checks
    ]
    scenario_result["validity"] = reasons
    unmeasured = not_measured(scenario_result)
    if unmeasured:
        scenario_result["not_measured"] = unmeasured
    # A server that died is a failure of the server, whatever else went
    # wrong with the measurement after it was gone.
    scenario_result["verdict"] = (
        "fail"
        if died is not None
        else verdict(checks, reasons, scenario_result.get("defined_by"), accepted)
    )
    return scenario_result
