"""The detection matrix's cases for chaos scenarios: freeze, crash-restart, rolling shutdown
and network faults through the fault proxy (listed in harness.testing.detection_cases)."""

from __future__ import annotations

from harness.testing.detection_case import DetectionCase

# One phase of the quick `network` scenario each (its toxic, rate and length), for the
# network rows: paths from the repository's root, where the matrix runs.
NETWORK_SLOW_UPLINK = "tests/data/network_phases/slow_uplink.toml"
NETWORK_RESETS = "tests/data/network_phases/resets.toml"

CHAOS_CASES: tuple[DetectionCase, ...] = (
    # --- freeze, crash-restart, rolling shutdown----------------------------------------
    DetectionCase(
        name="stall-trip",
        defect="a stall watchdog that trips one request per batch for good",
        scenario="freeze",
        check="freeze.recovery_s",
        fault="stall-trip:1",
        pin_capacity=True,
        why="a 3 s SIGSTOP trips the breaker; one request per batch cannot carry 0.5x of "
        "the batching server's capacity (no-batching fails steady.throughput at 0.6x), so "
        "p99 and 503s never return to their bands after the resume",
    ),
    DetectionCase(
        name="stall-abandon",
        defect="a stall watchdog that restarts the batch queue, orphaning what was queued",
        scenario="freeze",
        check="freeze.unanswered",
        fault="stall-abandon:1",
        pin_capacity=True,
        why="the backlog the freeze built (up to the 128-request queue) is forgotten once the "
        "batch that was running returns: those clients wait for their own 10 s timeout; the "
        "healthy server answers every one (ok, or 503 on a full queue)",
    ),
    DetectionCase(
        name="stall-respawn",
        defect="a stall watchdog that starts a new worker pool, the old one never shut down",
        scenario="freeze",
        check="freeze.resource_step",
        fault="stall-respawn:1",
        pin_capacity=True,
        why="one stall leaves one idle model-worker thread behind (--workers 1): the "
        "healthy server's threads and non-socket fds are the same number before and after "
        "a freeze, so a step of one is a leak, not noise",
    ),
    DetectionCase(
        name="restart-slow-load",
        defect="the model is reloaded from slow storage on every start: ready after ~13 s",
        scenario="crash_restart",
        check="crash.recovery_s",
        server_args=("--warmup-delay-s", "12"),
        pin_capacity=True,
        timeout_s=360,
        why="the restarted server is gone for 12 s of warm-up delay plus its start, past "
        "the 10 s budget from kill to baseline; the healthy twin (the same command without "
        "the delay) was back in 0.75–1.5 s (K=3: 12.7–13.0 s, once never, against it)",
    ),
    DetectionCase(
        name="restart-cold-errors",
        defect="ready before the model is loaded: the first 200 requests after a (re)start "
        "answered 503",
        scenario="crash_restart",
        check="crash.errors_after_ready",
        fault="cold-errors:200",
        pin_capacity=True,
        locust_args=("--no-verify",),
        why="readiness wired to the process, the model loaded in the background (~0.75 s "
        "of requests at 0.5x): up to 200 503s among the ~1,300 requests of the 5 s after "
        "ready (the 0.25 s window straddling ready is left out), well over 1 %; "
        "--no-verify: the golden fetch would meet the same 503s on the first start",
    ),
    DetectionCase(
        name="restart-slow-start",
        defect="the restart skips warm-up: the first request after it pays a 3 s lazy init",
        scenario="crash_restart",
        check="crash.cold_penalty",
        fault="slow-start:3",
        pin_capacity=True,
        allowed={
            "crash.errors_after_ready": "requests arriving during the 3 s init overflow the "
            "128-request queue (503): the same missing warm-up seen as failed requests",
        },
        why="ready at once after the restart, the model initialised on the first request: "
        "the first windows after ready wait ~3 s: 51–66x the warm p99 (healthy 1.05–1.61x)",
    ),
    DetectionCase(
        name="no-drain",
        defect="SIGTERM exits at once: accepted and in-flight requests dropped",
        scenario="rolling_shutdown",
        check="shutdown.lost",
        fault="no-drain",
        pin_capacity=True,
        why="at 0.5x with ~60 ms batches a batch is in flight at any moment: its requests "
        "(sent before the signal) lose their connections; the healthy server answers them "
        "and refuses new ones 503 while it drains",
    ),
    DetectionCase(
        name="exit-hang",
        defect="a non-daemon thread keeps the process alive after the drain",
        scenario="rolling_shutdown",
        check="shutdown.exit_s",
        fault="exit-hang",
        pin_capacity=True,
        why="the drain completes and uvicorn returns, but the interpreter waits for the "
        "thread: still running at the 5 s drain timeout (quick), SIGKILLed; the healthy "
        "server exits 0 within a second",
    ),
    # --- network faults through the fault proxy----------------------------------------
    # Each row runs the one phase of the quick `network` scenario its fault acts in, with
    # that phase's toxic, rate and length and the checks that judge it (tests/data/
    # network_phases/): the shipped run's other phases only waited (52 s a row; a row now
    # ~20 s). Its healthy twin (bench/detection_repeat.py) runs the same file.
    DetectionCase(
        name="reset-leak",
        defect="a socket leaked per client connection reset (cleanup on a clean close only)",
        scenario=NETWORK_RESETS,
        check="network.leaks",
        fault="reset-leak",
        why="the resets phase resets every connection when its answer comes (~240 resets "
        "at 80 req/s for 3 s, quick): the server's per-connection dup()ed socket is closed "
        "on a FIN only, so each reset leaves one open — measured +328 sockets net of the "
        "harness's connections for 328 resets; the healthy twin +0 (its sockets return "
        "with the client's pool)",
    ),
    DetectionCase(
        name="io-lock",
        defect="one process-wide lock held across reading the request body",
        scenario=NETWORK_SLOW_UPLINK,
        check="network.latency_amplification",
        fault="io-lock",
        why="the slow-uplink phase trickles one request in five (drawn per request) in "
        "64-byte slices 20 ms apart: ~0.65 s from its headers to its last body byte. A "
        "server that takes its decoder's lock before reading the body holds it for that "
        "whole wait, so the requests that were not slowed queue behind the slow one; the "
        "healthy twin serves them as if nothing happened. Slicing every request alike "
        "does not show it (a FIFO lock then costs nothing: each request waits for its own "
        "body anyway) — measured 1.08x and 1.15x against the twin's 1.05x and 1.07x",
    ),
    DetectionCase(
        name="reset-breaker",
        defect="a circuit breaker that counts client connection resets as backend "
        "failures: open 15 s, every request answered 503",
        scenario=NETWORK_RESETS,
        check="network.recovery_s",
        fault="reset-breaker",
        why="the resets phase's ~240 resets trip it (20 within 5 s) and keep tripping it; "
        "it stays open 15 s after the last, through the 10 s after the resets, so p99 and "
        "the error rate are not back in their bands within 5 s of the resets' end (the "
        "healthy server: 0.98–0.99 s in 12 runs of the whole network scenario, healthy "
        "twins and the other network faults alike)",
    ),
)
