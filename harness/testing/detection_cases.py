"""The detection matrix as data: each planted defect, the scenario that must catch it, and why.

Read by ``tests/test_detection.py`` (one slow test per case) and by
``bench/detection_table.py`` (which renders ``docs/detection.md`` from the same runs).

A case plants one reference-server ``--fault`` (or flag) that is sized like a real defect,
not a caricature: a leak of a few MiB/min, a mix-up in a few % of batches, a 1 s pause.
Rates that depend on traffic (leaks are per request in the reference server) are given
per minute and turned into per-request parameters from the *healthy* server's capacity,
measured in the same session by the ``healthy-steady`` case; those runs pin that capacity
(``--capacity-rps``) so the offered rate — and so the leak per minute — is the one we
sized for, the way a user pins last release's capacity.

Every case whose scenario offers rates relative to capacity pins it the same way: that is
how ``harness acceptance`` runs these scenarios (it calibrates once, in steady_state, and
pins the result for the scenarios after it), so the quick acceptance's own scenarios in
the same session are each pinned case's healthy twin, and no case spends ~7 s calibrating
the faulty server (which a defect such as backoff-batching could also trip before its
scenario starts). cold_start (a fresh server, no rate), linearity (closed-loop users per
thread, a different model) and network (fixed rates) do not calibrate; fifo-dispatch
calibrates on purpose (its why says so).

``allowed`` lists the checks that may fail alongside the intended one, each with the
reason: a check listed there describes the *same* defect from another side. Any other
failed check fails the case ("caught for the wrong reason").
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.testing.detection_case import MIB, SIM_LINEARITY_ARGS, DetectionCase
from harness.testing.detection_chaos_cases import CHAOS_CASES
from harness.testing.detection_llm_cases import LLM_CASES

_BACKLOG = "the same unbounded backlog seen from the latency side"

CASES: tuple[DetectionCase, ...] = (
    # --- healthy controls -------------------------------------------------------------
    DetectionCase(
        name="healthy-steady",
        defect="none (healthy reference server)",
        scenario="steady_state",
        check="steady.p99_ms",
        expect_pass=True,
        duration_s=12,
        why="control: the healthy server passes steady state; its calibrated capacity "
        "sizes the leaks and is pinned for every case whose scenario offers rates relative to "
        "capacity (as harness acceptance pins it), fifo-dispatch excepted",
    ),
    DetectionCase(
        name="healthy-linearity-sim",
        defect="none (healthy reference server, sim model)",
        scenario="linearity",
        check="linearity.efficiency",
        model="sim",
        server_args=SIM_LINEARITY_ARGS,
        sut_cores="0-1",
        expect_pass=True,
        timeout_s=400,
        why="control: with two cores the sim model (sleep-based, so threads overlap) "
        "scales ~linearly; the serialize case differs from it by one flag. Both cap "
        "batches at 8, half of one thread's users, so bigger batches cannot pass for "
        "parallelism (E(2) = 0.749 uncapped with the lock, 0.67–0.76 capped at 16)",
    ),
    # --- cold start ---------------------------------------------------------------------
    DetectionCase(
        name="slow-start",
        defect="lazy model init: the first request pays 3 s",
        scenario="cold_start",
        check="cold_start.first_p99_ratio",
        fault="slow-start:3",
        allowed={
            "cold_start.first_error_rate": "requests arriving during the 3 s init overflow "
            "the 128-request queue (503): the same missing warmup seen as failed requests. "
            "Measured in the quick run: 0 of the first 100 sent failed (they fit in the "
            "queue), 103 later ones did; the full run's first 200 would include some",
        },
        why="a server that reports ready before it warmed up: the first requests queue "
        "behind a 3 s lazy init (a CUDA context or JIT on first use), the warm p99 does not",
    ),
    DetectionCase(
        name="cold-errors",
        defect="ready before the model is loaded: the first 10 requests answered 503",
        scenario="cold_start",
        check="cold_start.first_error_rate",
        fault="cold-errors:10",
        locust_args=("--no-verify",),
        allowed={
            "cold_start.first_p99_ratio": "a failed first request counts as slower than "
            "every success: 10 of the first 100 failed leaves their p99 a failure (the same "
            "503s seen from the latency side)",
        },
        why="readiness wired to the process rather than the model (loaded in the "
        "background ~0.2 s later at 60 req/s): the first 10 requests are refused while every "
        "answered one is as fast as the warm ones, so a p99 of the first ok answers passed. "
        "--no-verify: the golden fetch would meet the same 503s on the first start",
    ),
    DetectionCase(
        name="slow-model-load",
        defect="model load takes 9 s before readiness, against a 6 s budget",
        scenario="cold_start",
        check="cold_start.time_to_ready_s",
        server_args=("--warmup-delay-s", "9"),
        locust_args=("--ready-timeout=60", "--no-verify"),
        checklist={"cold_start.time_to_ready_s": {"threshold": 6.0}},
        allowed={
            "cold_start.first_p99_ratio": "the model ran its warm-up batches seconds before "
            "the server said ready, so the first requests meet cold caches: with a 36 s load "
            "the first-100 p99 ratio measured 1.35-5.65 in the defect runs (1 of 3 over 5x) "
            "against 0.73-0.89 in their healthy twins — the same slow load seen from the "
            "latency side",
        },
        why="readiness gated on a 9 s load, judged against a readiness budget of 6 s set "
        "the way a user sets theirs (a checklist): the check compares the timed start with "
        "whatever budget it is given, and the shipped 30 s would need a load over 30 s "
        "(36 s before, half of the row's minute of CI). The healthy twin, judged with the "
        "same budget, is ready in 0.4-1.6 s. --no-verify: with the golden fetch the "
        "scenario starts the server twice (fetch, then fresh) and pays the delay twice; "
        "without it, the one start is the cold one",
    ),
    # --- steady state -------------------------------------------------------------------
    DetectionCase(
        name="stall",
        defect="1 s GIL-holding pause every 10 s",
        scenario="steady_state",
        check="steady.p99_ms",
        pin_capacity=True,
        fault="stall:10,1",
        duration_s=12,
        allowed={
            "steady.throughput": "requests caught by the last pause near the end of the "
            "stage complete after it, so the ok rate over the stage can dip under 95 %",
            "steady.error_rate": "a pause longer than the queue holds (128 requests, ~0.4 s "
            "at 0.6x) overflows it: 503s and a full client in-flight cap are the same "
            "pause seen as shed load (measured 9.7 % with a 1.5 s pause)",
        },
        why="a periodic stop-the-world pause (a blocking flush, a full GC of a big heap) "
        "delays the requests that arrive during it by up to 1 s: p99 past the 500 ms SLO "
        "(a 1.5 s pause measured 1.6 s) while p50 stays fine. 12 s, healthy-steady's length, "
        "holds the pause 9 s after the server starts: at 0.6x it overflows the queue, and "
        "5.8-6.2 % of the requests failed or were dropped (each over the SLO), 6x the 1 % a "
        "p99 allows",
    ),
    DetectionCase(
        name="error-rate",
        defect="3 % of requests answered 500",
        scenario="steady_state",
        check="steady.error_rate",
        pin_capacity=True,
        fault="error-rate:0.03",
        duration_s=12,
        locust_args=("--no-verify",),
        allowed={
            "steady.throughput": "a 500 is not an ok response: 3 % errors take 3 % of the "
            "5 % shortfall budget (measured 319.5 ok req/s against a 315.6 floor)",
            "steady.p99_ms": "a failed request counts as over the SLO: 3 % failures leave "
            "no p99 within it (the same 500s seen from the latency side)",
        },
        why="a systematic 3 % failure (a bad replica, a flaky dependency) against a 1 % "
        "budget; 12 s at 0.6x is thousands of requests, so 3 % vs 1 % is unambiguous. "
        "--no-verify: the golden fetch before the load needs every single request to "
        "succeed, and 1 in 33 does not",
    ),
    DetectionCase(
        name="no-batching",
        defect="dynamic batching disabled (one request per batch)",
        scenario="steady_state",
        check="steady.throughput",
        fault="no-batching",
        pin_capacity=True,
        duration_s=12,
        allowed={
            "steady.p99_ms": "the queue of a server below the offered rate grows: p99 "
            "rises with it",
            "steady.error_rate": "the full queue answers 503 and the client's in-flight "
            "cap fills; both count as errors",
        },
        why="without batching the server's own calibration would just measure the lower "
        "capacity and offer 0.6x of it; pinning last release's (the healthy run's) "
        "capacity, as a user does, shows the regression as missing throughput",
    ),
    # --- overload -----------------------------------------------------------------------
    DetectionCase(
        name="unbounded-queue-spike",
        defect="no admission control: the queue never sheds",
        scenario="spike",
        check="spike.fail_fast",
        pin_capacity=True,
        fault="unbounded-queue",
        allowed={"spike.recovery_s": _BACKLOG + ": it drains long after the spike"},
        why="at 2x the excess must be rejected quickly with 503; an unbounded queue turns it "
        "into timeouts and drops at the client's in-flight cap instead (0 % quick): the "
        "quick spike's 7.5 s at 2x queue more than the 5 s request timeout",
    ),
    DetectionCase(
        name="unbounded-queue-contention",
        defect="no admission control, under CPU contention",
        scenario="contention",
        check="contention.fail_fast",
        pin_capacity=True,
        fault="unbounded-queue",
        allowed={
            "contention.recovery_s": _BACKLOG + ": it drains after the hogs stop",
            "contention.throughput_ratio": "requests stuck behind the backlog time out "
            "instead of completing, so ok throughput in hog blocks drops with it",
        },
        timeout_s=400,
        why="with half its CPU taken, 0.7x is above what the server can do: the excess must "
        "be shed, not queued until it times out. The quick run's one 12 s hog block: an "
        "unbounded backlog's wait passes the 5 s request timeout within it (two blocks, 60 s, "
        "measured the same: no quick 503 at all)",
    ),
    DetectionCase(
        name="backoff-spike",
        defect="batch cap halved on every queue overflow (metastable collapse)",
        scenario="spike",
        check="spike.recovery_s",
        pin_capacity=True,
        fault="backoff-batching:1",
        why="a controller that shrinks batches under overload, where smaller batches cost "
        "more per request: the spike overflows the queue, the cap falls to 1 and the "
        "batch-1 capacity (~100 req/s) stays below the 0.5x recovery load, so the queue "
        "keeps overflowing and the cap never regrows (1 slot/s): p99 never returns to the "
        "baseline band. Fail-fast still passes — every rejection is a quick 503",
    ),
    DetectionCase(
        name="backoff-contention",
        defect="batch cap halved on every queue overflow, under CPU contention",
        scenario="contention",
        check="contention.throughput_ratio",
        pin_capacity=True,
        also_checks=("contention.recovery_s",),
        fault="backoff-batching:1",
        timeout_s=400,
        why="the hog halves the CPU, 0.7x overflows the queue and the cap collapses: "
        "throughput in the hog blocks falls to the batch-1 rate, far below the ~0.8x a "
        "shedding server keeps, and the collapse outlives the last hog, so recovery fails "
        "too. A shedding server loses capacity in proportion to its CPU; this one falls "
        "off a cliff",
    ),
    DetectionCase(
        name="fifo-dispatch",
        defect="priority honoured at admission only: batches in arrival order",
        scenario="mixed_priority",
        check="priority.high_p99_ms",
        fault="fifo-dispatch",
        server_args=("--queue-size", "512"),
        locust_args=("--max-in-flight=1024",),
        why="per-level queue bounds admit the high class while the low one is shed, so its "
        "reject rate passes, but a high request waits behind every queued low one: with a "
        "deep queue (Triton's default is unbounded) that measured 1.3-1.4 s at 1.5x against "
        "the 500 ms SLO. The client's in-flight cap is raised so that the server's queue, not "
        "the harness's pool, is what fills. It calibrates its own server rather than pin the "
        "session's capacity: pinned at 622 req/s, 1.5x with 1024 requests in flight was more "
        "than the load generator could send on time — both the defect and its twin were "
        "invalid (dispatch lag p99 136 and 307 ms) and ran again",
    ),
    DetectionCase(
        name="ignore-priority",
        defect="priority ignored: one FIFO for all classes",
        scenario="mixed_priority",
        check="priority.high_reject_rate",
        pin_capacity=True,
        fault="ignore-priority",
        allowed={
            "priority.high_p99_ms": "the high class waits in the same full queue as the "
            "low one: its latency suffers with its rejections",
        },
        why="at 1.5x a priority scheduler sheds the low class; a single FIFO rejects the "
        "high class as often as the low one (measured ~50 % each)",
    ),
    # --- integrity ----------------------------------------------------------------------
    DetectionCase(
        name="cross-wire",
        defect="outputs swapped within 3 % of batches",
        scenario="integrity",
        check="integrity.mismatches",
        pin_capacity=True,
        fault="cross-wire:0.03",
        why="a scatter bug hitting 3 % of multi-request batches: a few hundred batches in "
        "the quick run make a miss improbable, and latency checks cannot see it",
    ),
    DetectionCase(
        name="stale-output",
        defect="2 % of requests answered with the previous batch's output",
        scenario="integrity",
        check="integrity.mismatches",
        pin_capacity=True,
        fault="stale-output:0.02",
        generalisation=True,
        why="generalisation: a mix-up *across* batches (a wrongly keyed response cache), "
        "not the within-batch swap the check was written against",
    ),
    DetectionCase(
        name="batch-errors",
        defect="every batch of 16 or more requests answered 500 (the batched path raises on "
        "large batches)",
        scenario="integrity",
        check="integrity.failures",
        pin_capacity=True,
        fault="batch-errors:16",
        why="a batched code path that raises on large batches while small ones work: the "
        "golden outputs (fetched one request at a time) come back, the low stage's small "
        "batches are answered and verified (all correct: integrity.mismatches passes on "
        "them), the high stage's full batches fail — the shape of an independent server "
        "answering 500 to every batch of 2 or more (6,682 failed, 1,615 verified, mismatches "
        "PASS, exit 0). At 2 or more the reference server, whose batches hold ~5-10 requests "
        "even at 0.3x, answered 4 of 16,388: mismatches was skipped (too few to judge), "
        "not passed. The share of the requests meant to be verified that got no answer is "
        "what fails it",
    ),
    DetectionCase(
        name="late-errors",
        defect="every request answered 500 from about half-time (a server that stops serving)",
        scenario="soak",
        check="soak.error_rate",
        also_checks=("soak.latency_drift",),
        fault="late-errors:24",
        pin_capacity=True,
        duration_s=40,
        allowed={
            "soak.rss_trend": "the error path allocating as it first runs (each 500 is "
            "logged with its traceback): RSS rose in steps while the errors lasted, 189.5 → "
            "192.7 MiB over 19 s (189.7 → 194.7 in another run), read as +9.2 and +11.8 "
            "MiB/min over a 40 s soak; the healthy twin +0.55 (not significant). Whether it "
            "levels off is a longer soak's question, not this case's",
        },
        why="a server that serves well, then fails everything (a credential that expires, "
        "a pool to a dependency that runs dry): from 24 s after ready, ~21 s into a 40 s "
        "soak (the load starts ~3 s after ready), every model call fails, answered 500 as "
        "fast as a success. "
        "No latency of a success moves and nothing leaks; an independent server answering "
        "503 from 35 s passed the soak with 43,879 of 82,830 requests failed. The error "
        "rate fails over the whole soak and per window, and the drift, reading every "
        "request, sees the last third's windows fail (a p99 that is a failure) against a "
        "clean first third (10-20 s after the warm-up quarter): errors from 17 s, as "
        "20 s after ready gave, left the step's Mann–Whitney p at 0.015; its twin is judged on "
        "the three trends too",
    ),
    DetectionCase(
        name="leak-memory",
        defect="memory leak of 5 MiB/min",
        scenario="soak",
        check="soak.rss_trend",
        fault="leak-memory:{per_request}",
        per_min=5 * MIB,
        per_min_kind="bytes",
        pin_capacity=True,
        duration_s=30,
        why="a per-request leak sized to 5 MiB/min at 0.6x of the healthy capacity "
        "(threshold 2.5 MiB/min; measured 6.2 with a 75 s soak, CI ±0.1); 30 s keeps 22 s "
        "after the warm-up quarter, 21 medians of 1.05 s for the slope CI: measured +6.41 "
        "to +6.96 in three runs, its healthy twin +0.08 to +0.75 (90 % CI upper bounds "
        "0.23-0.90); at 40 s +6.11 to +6.70, twins +0.08 to +0.10; an earlier three read +6.03 to "
        "+6.18, their twins up to +1.13 — the allocator settling after start-up, inside "
        "the judged span, which kept this row at 60 s while the threshold was 1 MiB/min",
    ),
    DetectionCase(
        name="late-leak",
        defect="memory leak of 5 MiB/min that starts 20 s after ready",
        scenario="soak",
        check="soak.rss_trend",
        fault="late-leak:{per_request},20",
        per_min=5 * MIB,
        per_min_kind="bytes",
        pin_capacity=True,
        duration_s=60,
        generalisation=True,
        why="generalisation: flat for the first third (a cache that fills first), then "
        "leaking — a hockey stick rather than a line; the warm-up quarter must not hide it",
    ),
    DetectionCase(
        name="leak-threads",
        defect="thread leak of 16 threads/min",
        scenario="soak",
        check="soak.threads_trend",
        fault="leak-threads:{per_request}",
        per_min=16,
        per_min_kind="every",
        pin_capacity=True,
        duration_s=30,
        why="one parked thread every N requests, N sized to 16/min (threshold 0.5/min): "
        "a pool that is created per call and never joined. The 30 s quick soak judges "
        "~20 s after its warm-up, ~5 threads of this leak: a count's second-half rule "
        "needs that many (at 8/min its staircase of 2-3 steps read inconclusive at 44 % "
        "of the phases a step can fall on, at 16/min at none: docs/checks.md)",
    ),
    DetectionCase(
        name="leak-fds",
        defect="fd leak of 20 fds/min",
        scenario="soak",
        check="soak.fds_trend",
        fault="leak-fds:{per_request}",
        per_min=20,
        per_min_kind="every",
        pin_capacity=True,
        duration_s=30,
        why="one unclosed file every N requests, N sized to 20/min (threshold 0.5/min; "
        "a server that exhausts a 1024-fd limit in under an hour). At 10/min the quick "
        "soak's judged ~20 s held ~3 fds, a staircase the second-half rule read as "
        "slowing or flat at 4.3 % of the phases a step can fall on (one fresh-clone CI "
        "run met it: inconclusive, exit 4); at 20/min at none (docs/checks.md). Sockets are judged apart "
        "from the other fds: the keep-alive connection count wanders by ±15, which hid "
        "this leak in the total (slope CI −6.4…+12 fds/min, p=0.28, when fds were one "
        "series); the file series is flat on a healthy server",
    ),
    DetectionCase(
        name="slowdown",
        defect="batch latency grows 320 ms per minute of uptime",
        scenario="soak",
        check="soak.latency_drift",
        fault="slowdown:320",
        pin_rps=110,
        duration_s=60,
        allowed={
            "soak.rss_trend": "the same in-flight requests hold their buffers: measured "
            "+0.91 to +1.92 MiB/min in four runs at 52-107 req/s (inconclusive or a leak "
            "against the 1 MiB/min of the time), +1.40 to +1.47 in three at 66 req/s",
        },
        why="per-batch work that grows with uptime (an ever-growing list scanned per "
        "call). Drift that is linear from start-up gives at most ~(end/start of the "
        "judged span) = 3.4x in any soak length, less the latency floor, so the quick soak "
        "needs a steep one: 40 ms/min at 0.3x measured 2.06x, 40 ms/min at 0.6x saturated "
        "the server (a bounded queue caps p99; 1.38x). 0.15x of the healthy capacity "
        "(pinned at a quarter) keeps it below saturation to the end: measured 2.43x (fitted "
        "p99 189 → 458 ms) with 120 ms/min over 90 s. The ratio depends on the slope times "
        "the length, not on either, plus the few seconds between ready and the load: "
        "240 ms/min over 45 s measured only 2.11–2.40x in 3 runs (2.0x is the threshold), "
        "320 ms/min over 45 s 2.44–2.53x, as 90 s did, the healthy twin 0.88–1.30x (wider "
        "than at 90 s, 1.00–1.05x; a fail also needs the Mann–Kendall trend). On a slower "
        "box (healthy capacity 345-456 req/s against ~540) the latency floor was higher "
        "and 45 s measured exactly 2.0x, a miss in a fresh-clone CI run; 60 s measured "
        "2.00, 2.52 and 2.61x, the twin 1.13, 1.06 and 1.03x. The rate is absolute, 0.6 of a "
        "pinned 110 req/s: the defect's own limit does not move with the machine (a batch "
        "of 32 takes the base time plus ~360 ms by the soak's end: ~77 req/s at most), "
        "while a quarter of the calibrated capacity (485-711 req/s across runs here) "
        "offered 52-107 req/s, and at 107 a fresh-clone CI run saturated it from ~45 s "
        "(2.5 % answered 503, soak.error_rate failed). The 1 h soak catches the default "
        "20 ms/min (+1.2 s by the end)",
    ),
    # --- scaling ------------------------------------------------------------------------
    DetectionCase(
        name="serialize",
        defect="global lock around model execution",
        scenario="linearity",
        check="linearity.efficiency",
        fault="serialize",
        model="sim",
        server_args=SIM_LINEARITY_ARGS,
        sut_cores="0-1",
        timeout_s=400,
        why="workers that cannot run concurrently: X(2) barely above X(1); E(2) measured "
        "0.526–0.542 (a little over 0.5: one worker collects its next batch while the "
        "other holds the lock) against 0.75, the healthy twin 0.97–1.01. On the sim model "
        "with two cores, because linearity is skipped for the default 1-core SUT",
    ),
    *CHAOS_CASES,
    *LLM_CASES,
)

# Checks no server defect can fail, and where they are proven instead. Every other check
# must be an intended check of some defect case (tests/test_detection.py enforces it).
NOT_PLANTABLE: Mapping[str, str] = {
    "accounting.balanced": "an invariant of the harness's own bookkeeping (scheduled = ok + "
    "failed + dropped + in flight), not a property of the server: no server can unbalance "
    "it. Proven on unbalanced synthetic counters (tests/test_checks.py::"
    "test_accounting_balanced) and, as a validity rule, in tests/test_checks_engine.py",
}

BY_NAME: Mapping[str, DetectionCase] = {c.name: c for c in CASES}
CAPACITY_CASE = "healthy-steady"
