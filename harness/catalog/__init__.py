"""The check catalog: every check is declared here, once.

A declaration says what a check is — id, group, the scenarios that evaluate it, unit,
comparison, default parameters, a one-line summary and the README's "passes when" text —
and nothing about how it is computed. ``harness.checks`` attaches one function to each
declaration (``@implements("steady.p99_ms")``) and refuses, at import, a declaration
without a function or a function without a declaration. The load side (which may not
import the checks, docs/architecture.md) takes the valid ids for scenario files from here.

README.md's check table and docs/checks.md's index are generated from the declarations
by ``python -m harness.catalog --write`` (``harness.catalog.docs``); a test fails while
they are stale. Stdlib only, so every layer may import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.catalog.model import OPS, Catalog, CheckDecl, Op, Shown, _defaults

# Parameters shared by several checks (each check's own table in docs/checks.md).
RECOVERY_DEFAULTS: Mapping[str, Any] = _defaults(
    threshold=10.0,  # seconds
    factor=2.0,  # band = baseline p99 x factor ...
    margin_ms=10.0,  # ... but never tighter than baseline + margin
    hold_s=5.0,  # must stay in band this long
    error_factor=2.0,  # error-rate band = baseline error rate x factor ...
    error_margin=0.01,  # ... but never tighter than baseline + margin
    smooth_windows=3,  # rolling median over windows before judging
    discard_s=2.0,  # skip the start of the baseline
    class_name="",  # "" = worst class per window
)
FAIL_FAST_DEFAULTS: Mapping[str, Any] = _defaults(
    threshold=0.9,  # share of failures that are quick 503/429
    max_reject_p50_ms=1000.0,  # and the failures themselves must be quick
    min_failures=10,
    count_dropped_as_slow=True,
    # requests sent up to this long after the overload still meet its backlog
    tail_s=5.0,
)
TREND_DEFAULTS: Mapping[str, Any] = _defaults(
    warmup_frac=0.25,
    warmup_min_s=0.0,
    bucket_s=0.0,  # 0 = automatic (span / 20, between one sample and 60 s)
    min_buckets=8,
    alpha=0.01,
    ci=0.90,
    second_half_ratio=0.5,
    # An inconclusive trend (significant growth above the threshold that the other
    # conditions could not confirm) is a skip in a quick run — the soak was too short to
    # tell — and a failure in a full run, whose job is to tell. ``inconclusive_fails``
    # makes it fail in every mode; ``inconclusive_fails_full = false`` lets a full run
    # skip it again. (Two booleans, because a parameter's type is its default's.)
    inconclusive_fails=False,
    inconclusive_fails_full=True,
)

_P99_SLO = "≤ your SLO (packaged: 500 ms)"

CATALOG = Catalog(
    ("cold_start", "steady", "spike", "priority", "soak", "linearity", "integrity")
    + ("contention", "network", "freeze", "crash", "shutdown", "llm", "accounting"),
    [
        CheckDecl(
            "cold_start.time_to_ready_s",
            unit="s",
            op="<=",
            defaults=_defaults(threshold=30.0),
            summary="process start → readiness endpoint 200",
            passes_when="process start → readiness endpoint 200 within {threshold} s",
            scenarios=("cold_start",),
        ),
        CheckDecl(
            "cold_start.first_p99_ratio",
            unit="x",
            op="<=",
            defaults=_defaults(
                threshold=5.0, min_excess_ms=20.0, min_first=20, min_tail=5, steady_stage=""
            ),
            summary="p99 of the first requests (at least the 5th slowest) vs steady p99 "
            "(warmup works)",
            passes_when="p99 of the first requests *sent* — with fewer than 500, their "
            "{min_tail}th slowest; a failure counts as slowest — ≤ {threshold}× the warm p99 "
            "(warmup works)",
            scenarios=("cold_start",),
        ),
        CheckDecl(
            "cold_start.first_error_rate",
            unit="ratio",
            op="<=",
            defaults=_defaults(threshold=0.01, min_first=20),
            summary="failed (and dropped) share of the first requests sent after readiness",
            passes_when="≤ {threshold:%} of the first 100 requests sent failed or dropped "
            "(ready means ready)",
            scenarios=("cold_start",),
        ),
        CheckDecl(
            "steady.p99_ms",
            unit="ms",
            op="<=",
            defaults=_defaults(threshold=200.0, stage="", confidence=0.99),
            summary="p99 latency in steady state, failed and dropped requests counted as over "
            "the SLO (early-stopping sample size)",
            passes_when=f"p99 over *every* request {_P99_SLO} at 0.6× capacity — a failed, "
            "timed-out or dropped request counts as over it; enough samples (MLPerf early "
            "stopping)",
            scenarios=("steady_state",),
        ),
        CheckDecl(
            "steady.error_rate",
            unit="ratio",
            op="<=",
            defaults=_defaults(threshold=0.01, stage="", include_dropped=True, min_requests=100),
            summary="failed (and dropped) share of finished requests in steady state",
            passes_when="≤ {threshold:%} failed",
            scenarios=("steady_state",),
        ),
        CheckDecl(
            "steady.throughput",
            unit="req/s",
            op=">=",
            defaults=_defaults(threshold=0.0, min_ratio=0.95, stage=""),
            summary="ok responses per second vs the requests offered (or an absolute floor)",
            passes_when="≥ {min_ratio:%} of the offered rate served, counted on the "
            "requests the arrivals drew (not the nominal rate), or an absolute floor you set",
            scenarios=("steady_state",),
        ),
        CheckDecl(
            "spike.recovery_s",
            unit="s",
            op="<=",
            defaults=_defaults(**RECOVERY_DEFAULTS, baseline_stage="", event_stage=""),
            summary="time after the spike until windowed p99 is back within the baseline band",
            passes_when="windowed p99 *and* error rate back within their baseline bands "
            "≤ {threshold} s after a 2× spike (not judged if the spike disturbed neither)",
            scenarios=("spike", "llm_spike"),
        ),
        CheckDecl(
            "spike.fail_fast",
            unit="ratio",
            op=">=",
            defaults=_defaults(**FAIL_FAST_DEFAULTS, event_stage=""),
            summary="overload answered by quick 503/429, not timeouts/resets",
            passes_when="≥ {threshold:%} of overload failures are quick 503/429, not timeouts",
            scenarios=("spike",),
        ),
        CheckDecl(
            "priority.high_p99_ms",
            unit="ms",
            op="<=",
            defaults=_defaults(
                threshold=200.0,
                class_name="",
                stage="",
                confidence=0.99,
                min_other_reject_rate=0.01,
            ),
            summary="p99 of the high-priority class above capacity",
            passes_when="high-priority p99 over every request (failures count as over) "
            f"{_P99_SLO} while the server is at 1.5× capacity",
            scenarios=("mixed_priority",),
        ),
        CheckDecl(
            "priority.high_reject_rate",
            unit="ratio",
            op="<=",
            defaults=_defaults(
                threshold=0.05,
                class_name="",
                stage="",
                min_requests=100,
                min_other_reject_rate=0.01,
                slo_ms=200.0,
            ),
            summary="failed share of high-priority requests above capacity",
            passes_when="≤ {threshold:%} of high-priority requests rejected above capacity",
            scenarios=("mixed_priority",),
        ),
        CheckDecl(
            "soak.rss_trend",
            reads_server_samples=True,
            unit="MiB/min",
            op="<=",
            defaults=_defaults(threshold=2.5, series="rss_bytes", **TREND_DEFAULTS),
            summary="memory leak detector (Theil–Sen slope + Mann–Kendall, warm-up excluded)",
            passes_when="no sustained RSS growth > {threshold} MiB/min (Theil–Sen + Hamed–Rao "
            "Mann–Kendall, random-walk guard, warm-up excluded; inconclusive fails `--full`)",
            scenarios=("soak", "llm_soak"),
        ),
        CheckDecl(
            "soak.threads_trend",
            reads_server_samples=True,
            unit="threads/min",
            op="<=",
            defaults=_defaults(threshold=0.5, **TREND_DEFAULTS),
            summary="thread leak detector (trend test + last third above middle third)",
            passes_when="no thread-count growth > {threshold}/min",
            scenarios=("soak", "llm_soak"),
        ),
        CheckDecl(
            "soak.fds_trend",
            reads_server_samples=True,
            unit="fds/min",
            op="<=",
            defaults=_defaults(threshold=0.5, **TREND_DEFAULTS),
            summary="file-descriptor leak detector (trend test + last third above middle third)",
            passes_when="no open-fd growth > {threshold}/min, sockets net of the harness's own "
            "connections",
            scenarios=("soak", "llm_soak"),
        ),
        CheckDecl(
            "soak.latency_drift",
            unit="x",
            op="<=",
            defaults=_defaults(
                threshold=2.0,
                warmup_frac=0.25,
                min_excess_ms=5.0,
                min_windows=3,
                alpha=0.01,
                buckets=20,
            ),
            summary="windowed p99 over every request (failures slowest) after the warm-up: "
            "fitted end vs start (a slope) and last third vs first third (a step)",
            passes_when="windowed p99 over every request (failures count as slowest): fitted "
            "end vs start *and* last third vs first third ≤ {threshold}×, or not significant",
            scenarios=("soak", "llm_soak"),
        ),
        CheckDecl(
            "soak.error_rate",
            unit="ratio",
            op="<=",
            # threshold, include_dropped, min_requests: as steady.error_rate (a healthy
            # server at 0.6x fails nothing; 1 % is a systematic failure). Per window:
            # window_s = 10 holds thousands of requests at a soak's rate, and a stretch of
            # total failure 0.5 s long is 5 % of it; window_threshold = 5 % bounds such a
            # burst; alpha = 0.01 sets the binomial margin (a window's count must also be
            # over the 1 − alpha/K quantile of Binomial(n, threshold), K windows), so a
            # server failing independently at 1 % trips no window in 99 % of runs.
            defaults=_defaults(
                threshold=0.01,
                stage="",
                include_dropped=True,
                min_requests=100,
                window_s=10.0,
                window_threshold=0.05,
                alpha=0.01,
            ),
            summary="failed (and dropped) share over the whole soak, and in every sliding "
            "window of a few seconds (binomial margin)",
            passes_when="≤ {threshold:%} failed over the soak, and no {window_s} s window "
            "over {window_threshold:%} (beyond binomial noise)",
            scenarios=("soak", "llm_soak"),
        ),
        CheckDecl(
            "linearity.efficiency",
            unit="ratio",
            op=">=",
            defaults=_defaults(threshold=0.75, max_n=0, min_replicates=1),
            summary="X(N)/(N·X(1)) for N up to the cores available to the server, with a USL fit",
            passes_when="X(N)/(N·X(1)) ≥ {threshold} for N up to the server's cores (USL fit "
            "reported)",
            scenarios=("linearity",),
        ),
        CheckDecl(
            "integrity.mismatches",
            unit="responses",
            op="<=",
            defaults=_defaults(threshold=0, nondeterministic=False, min_checked=300),
            summary="responses that do not belong to their request, or drifted from it (must be 0)",
            passes_when="{threshold} responses that belong to another request or drift beyond "
            "tolerance (every response verified; `nondeterministic = true` reports drift "
            "without failing)",
            scenarios=("integrity",),
        ),
        CheckDecl(
            "integrity.failures",
            unit="ratio",
            op="<=",
            # 1 %: answers gone wrong (errors, timeouts, resets, drops) — none of ~17,000 on
            # the healthy reference server. Quick 503/429 refusals are load declined, not
            # answers gone wrong: the high stage's 0.9x of a 5 s probe's capacity sheds some
            # on a healthy server (1.6 % and 3.3 % measured), so they have their own bound,
            # max_shed = 25 % (a probe's spread of ~27 % puts 0.9x at most ~1.2x the real
            # capacity). min_requests as steady.error_rate.
            defaults=_defaults(threshold=0.01, max_shed=0.25, min_requests=100),
            summary="share of the requests meant to be verified that got no answer to verify "
            "(failed, timed out, dropped, non-200)",
            passes_when="≤ {threshold:%} of the requests meant to be verified got no "
            "verifiable answer, and ≤ {max_shed:%} were refused as overload (a server cannot "
            "pass integrity by failing its batches)",
            scenarios=("integrity",),
        ),
        CheckDecl(
            "contention.throughput_ratio",
            unit="x",
            op=">=",
            defaults=_defaults(threshold=0.4, discard_s=3.0, min_windows=3),
            summary="median ok throughput with CPU hogs vs without",
            passes_when="≥ {threshold}× throughput while CPU hogs take the server's cores",
            scenarios=("contention",),
        ),
        CheckDecl(
            "contention.fail_fast",
            unit="ratio",
            op=">=",
            defaults=FAIL_FAST_DEFAULTS,
            summary="failures while CPU is taken away are quick 503/429",
            passes_when="≥ {threshold:%} of failures under contention are quick 503/429",
            scenarios=("contention",),
        ),
        CheckDecl(
            "contention.recovery_s",
            unit="s",
            op="<=",
            defaults=RECOVERY_DEFAULTS,
            summary="time after the CPU hogs stop until p99 is back within the baseline band",
            passes_when="p99 and error rate back within their baseline bands ≤ {threshold} s "
            "after the hogs stop (hogs that did not apply make the run invalid)",
            scenarios=("contention",),
        ),
        CheckDecl(
            "network.latency_amplification",
            unit="x",
            op="<=",
            defaults=_defaults(
                threshold=1.5, discard_s=1.0, settle_s=3.0, min_windows=3, min_injected_ms=5.0
            ),
            summary="latency the server adds under a slow network vs the delay the fault "
            "proxy injected (its queueing must not amplify it)",
            passes_when="median p50 added under latency/slicer toxics ≤ {threshold}× the "
            "delay the proxy injected per request (a slow client stalls nobody else)",
            scenarios=("network",),
        ),
        CheckDecl(
            "network.recovery_s",
            unit="s",
            op="<=",
            # quick mode leaves ~11 s after the blackhole: 5 s + 3 s held fits in it
            defaults={**RECOVERY_DEFAULTS, "threshold": 5.0, "hold_s": 3.0, "settle_s": 3.0},
            summary="time after the last blackhole or reset until p99 and error rate are "
            "back within the bands of the clean stretches before the faults",
            passes_when="p99 and error rate back within their baseline bands ≤ {threshold} s "
            "after the last connection-breaking fault ends",
            scenarios=("network",),
        ),
        CheckDecl(
            "network.leaks",
            reads_server_samples=True,
            unit="count",
            op="<=",
            defaults=_defaults(threshold=4.0, discard_s=2.0, settle_s=5.0, min_samples=3),
            summary="server sockets (net of the harness's connections) and threads left "
            "over after connection resets and blackholes",
            passes_when="≤ {threshold} more sockets or threads {settle_s} s after the "
            "resets and blackholes end than before them",
            scenarios=("network",),
        ),
        CheckDecl(
            "freeze.recovery_s",
            unit="s",
            op="<=",
            defaults=RECOVERY_DEFAULTS,
            summary="time after the server is resumed (SIGCONT) until p99 and error rate "
            "are back within their baseline bands",
            passes_when="p99 and error rate back within their baseline bands ≤ {threshold} s "
            "after a SIGSTOP freeze ends",
            scenarios=("freeze",),
        ),
        CheckDecl(
            "freeze.unanswered",
            unit="requests",
            op="<=",
            defaults=_defaults(threshold=0),
            summary="requests sent during the freeze that the server never answered (client "
            "timeout, connection dropped) or answered with another's output",
            passes_when="≤ {threshold} requests sent during the freeze lost or misanswered "
            "(each completes or gets an error status)",
            scenarios=("freeze",),
        ),
        CheckDecl(
            "freeze.resource_step",
            reads_server_samples=True,
            unit="count",
            op="<=",
            defaults=_defaults(
                threshold=1.0,
                rel_margin=0.05,
                rss_max_mib=32.0,
                span_s=8.0,
                settle_s=3.0,
                discard_s=2.0,
            ),
            summary="threads and non-socket fds left behind by a freeze (median before vs "
            "settled after and at the end), RSS step bounded",
            passes_when="≤ max({threshold}, {rel_margin:%} of the count before) threads + "
            "non-socket fds more after the freeze than before, still there at the end — "
            "none when a thread that worked before sits idle after; RSS step ≤ "
            "{rss_max_mib} MiB",
            scenarios=("freeze",),
        ),
        CheckDecl(
            "crash.recovery_s",
            unit="s",
            op="<=",
            defaults=RECOVERY_DEFAULTS,
            summary="time from SIGKILL until the restarted server serves at baseline p99 "
            "and error rate again (outage + restart + warm-up)",
            passes_when="p99 and error rate back within their baseline bands ≤ {threshold} s "
            "after a SIGKILL (restart included)",
            scenarios=("crash_restart",),
        ),
        CheckDecl(
            "crash.errors_after_ready",
            unit="ratio",
            op="<=",
            defaults=_defaults(threshold=0.01, span_s=5.0, min_requests=100),
            summary="failed share of the requests sent after the restarted server said "
            "ready (the error burst confined to the outage)",
            passes_when="≤ {threshold:%} of requests sent in the {span_s} s after the "
            "restart is ready fail",
            scenarios=("crash_restart",),
        ),
        CheckDecl(
            "crash.cold_penalty",
            unit="x",
            op="<=",
            defaults=_defaults(
                threshold=5.0, min_excess_ms=50.0, span_s=3.0, discard_s=2.0, min_tail=5
            ),
            summary="the 5th slowest request right after the restart vs the warm p99 before "
            "the kill (the restart warmed up)",
            passes_when="the {min_tail}th slowest request in the {span_s} s after the restart "
            "is ready ≤ {threshold}× the warm p99 (or ≤ {min_excess_ms} ms above it)",
            scenarios=("crash_restart",),
        ),
        CheckDecl(
            "shutdown.lost",
            unit="requests",
            op="<=",
            defaults=_defaults(threshold=0, before_stage="", min_in_flight=5.0),
            summary="requests sent before SIGTERM that were never answered (the drain "
            "answers everything accepted)",
            passes_when="≤ {threshold} requests sent before SIGTERM lost (connection "
            "dropped, timeout); not judged unless ≥ {min_in_flight} were expected in "
            "flight at the signal",
            scenarios=("rolling_shutdown",),
        ),
        CheckDecl(
            "shutdown.exit_s",
            unit="s",
            op="<=",
            defaults=_defaults(threshold=30.0),
            summary="SIGTERM → process exit, with exit code 0 (within the drain timeout)",
            passes_when="exits with code 0 ≤ {threshold} s after SIGTERM (not SIGKILLed "
            "at the drain timeout; an exit code nobody could read is not judged)",
            scenarios=("rolling_shutdown",),
        ),
        CheckDecl(
            "llm.ttft_p99",
            unit="ms",
            op="<=",
            # MLPerf Inference's Server-scenario bound for Llama-3.1-8B (2000 ms TTFT); an
            # interactive service sets 500 ms (MLPerf's interactive profile)
            defaults=_defaults(threshold=2000.0, stage="", min_requests=100),
            summary="p99 time to first token of the streams at the rated load (failed "
            "requests counted as over it)",
            passes_when="p99 time to first token ≤ {threshold} ms (MLPerf's Server bound "
            "for an 8B model; > 1 % failed streams is a failure)",
            scenarios=("llm_steady", "llm_shared_prefix", "llm_multi_turn"),
        ),
        CheckDecl(
            "llm.tpot_p99",
            unit="ms",
            op="<=",
            # MLPerf's Server bound for Llama-3.1-8B (100 ms TPOT); interactive: 30 ms
            defaults=_defaults(threshold=100.0, stage="", min_requests=100),
            summary="p99 over requests of time per output token, (last − first token) / "
            "(tokens − 1)",
            passes_when="p99 time per output token ≤ {threshold} ms (MLPerf's Server bound "
            "for an 8B model)",
            scenarios=("llm_steady", "llm_shared_prefix", "llm_multi_turn"),
        ),
        CheckDecl(
            "llm.stall",
            unit="ms",
            op="<=",
            # 5 x the TPOT bound (MLPerf's 100 ms): Sarathi-Serve's strict P99 time-between-
            # tokens SLO is 5 x a decode iteration, and at the TPOT bound an iteration takes
            # 100 ms; half of the 1 s a user's flow of thought tolerates (Nielsen)
            defaults=_defaults(threshold=500.0, stage="", min_requests=100),
            summary="p99 over streams of each stream's longest gap between consecutive "
            "tokens (failed requests counted as over it)",
            passes_when="p99 of the longest pause in a stream ≤ {threshold} ms (5 x the TPOT "
            "bound; > 1 % failed streams is a failure)",
            scenarios=("llm_shared_prefix",),
        ),
        CheckDecl(
            "llm.abort_recovery",
            unit="ratio",
            op="<=",
            # threshold: 0.05 of the KV cache — the healthy reference server's recovery
            # medians sit within ±0.01 of its baseline's, one leaked 64-token request holds
            # ~0.002 of its 2048 blocks, so a leak of ≥ 25 of the storm's ~90 hang-ups
            # fails; rss_threshold: 10 % above the baseline's RSS; discard_s, tail_s: the
            # baseline's first seconds are the server's warm-up, the recovery's last
            # seconds are after in-flight aborts have drained (docs/checks.md)
            defaults=_defaults(
                threshold=0.05,
                baseline_stage="baseline",
                storm_stage="storm",
                recovery_stage="recovery",
                discard_s=2.0,
                tail_s=5.0,
                min_samples=3,
                rss_threshold=0.10,
            ),
            summary="KV-cache usage (else RSS) at the end of the recovery after a storm of "
            "client aborts, minus its baseline under the same load",
            passes_when="the server's KV-cache usage at the end of the recovery is ≤ "
            "{threshold} of the cache above its baseline (no KV gauge: RSS ≤ 10 % above; "
            "not judged without either or without aborts)",
            scenarios=("llm_abort_storm",),
        ),
        CheckDecl(
            "llm.stream_integrity",
            unit="streams",
            op="<=",
            defaults=_defaults(threshold=0, stage="", min_requests=20),
            summary="streams with a problem of form or content: usage ≠ tokens sent, no "
            "finish reason or [DONE], an error under a 200, another request's tokens",
            passes_when="≤ {threshold} streams with a wrong usage, a missing finish reason "
            "or [DONE], an error under a 200, or (reference server) tokens not its own",
            scenarios=(
                "llm_steady",
                "llm_abort_storm",
                "llm_mixed_priority",
                "llm_spike",
                "llm_shared_prefix",
                "llm_multi_turn",
                "llm_soak",
            ),
        ),
        CheckDecl(
            "llm.goodput",
            unit="ratio",
            op=">=",
            defaults=_defaults(threshold=0.99, stage="", min_requests=100),
            summary="share of the requests sent (and dropped) that got a whole answer",
            passes_when="≥ {threshold:%} of the requests get a whole answer (an error, a "
            "timeout, a stall, a truncated stream or one without tokens is not)",
            scenarios=(
                "llm_steady",
                "llm_abort_storm",
                "llm_shared_prefix",
                "llm_multi_turn",
                "llm_soak",
            ),
        ),
        CheckDecl(
            "llm.priority_ttft_p99",
            unit="ms",
            op="<=",
            # threshold: MLPerf's Server TTFT bound for an 8B model, as llm.ttft_p99 (an
            # interactive service sets 500 ms); min_requests: the high class is a minority
            # (20 % of a 45 s CI run: ~80 streams), and a starved class shows in all of them
            defaults=_defaults(
                threshold=2000.0,
                class_name="",
                stage="",
                min_requests=50,
                min_other_reject_rate=0.01,
            ),
            summary="p99 time to first token of the high-priority class above capacity "
            "(failed requests counted as over it)",
            passes_when="high-priority TTFT p99 ≤ {threshold} ms while another class absorbs "
            "the overload (its TTFT p99 over the bound or ≥ 1 % of it shed; not judged "
            "otherwise unless the high class fails)",
            scenarios=("llm_mixed_priority",),
        ),
        CheckDecl(
            "llm.overload",
            unit="ratio",
            op=">=",
            # ttft_ms: MLPerf's Server TTFT bound for an 8B model, as llm.ttft_p99;
            # reject_ms: a shed is quick when it comes within a second, as spike.fail_fast's
            # median bound
            defaults=_defaults(
                threshold=0.95, stage="spike", ttft_ms=2000.0, reject_ms=1000.0, min_requests=100
            ),
            summary="share of a spike's requests handled well: a whole answer with its first "
            "token within the TTFT bound, or a 429/503 answered quickly",
            passes_when="≥ {threshold:%} of the requests sent above capacity get their first "
            "token ≤ ttft_ms (2000 ms) or a 429/503 ≤ reject_ms (1000 ms); a timeout, a "
            "reset, a late first token is not (not judged if nothing was refused or late)",
            scenarios=("llm_spike",),
        ),
        CheckDecl(
            "accounting.balanced",
            unit="requests",
            op="==",
            defaults=_defaults(threshold=0),
            summary="every scheduled request accounted for (ok + failed + dropped + in flight)",
            passes_when="scheduled = ok + failed + dropped + in flight",
            always=True,
        ),
    ],
)

# Stable: results, checklists and scenario files refer to these ids.
CHECK_IDS: tuple[str, ...] = CATALOG.ids

__all__ = ["CATALOG", "CHECK_IDS", "OPS", "Catalog", "CheckDecl", "Op", "Shown"]
