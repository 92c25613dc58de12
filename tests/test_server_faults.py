"""Every ``--fault`` visibly changes the real server's behaviour (real sockets)."""

from __future__ import annotations

import http.client
import json
import statistics
import time

import numpy as np
import psutil
import pytest

from harness.testing.server import (
    SIM_ROW,
    Answer,
    ServerHandle,
    backlog_order,
    http_status,
    infer_body,
    metric_sum,
    run_clients,
    scrape,
    send,
    start_server,
    wait_until,
)
from harness_reference_server.errors import ConfigError
from harness_reference_server.fault_catalog import parse_faults
from harness_reference_server.faults import FaultRuntime, ModelFault
from harness_reference_server.models import SimModel

pytestmark = pytest.mark.slow

SIM_FAST = ("--model", "sim", "--sim-base-ms", "0", "--sim-item-ms", "0")


def listed_faults(srv: ServerHandle) -> list[str]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("GET", "/v2")
        return json.loads(conn.getresponse().read())["faults"]
    finally:
        conn.close()


def sequential(srv: ServerHandle, n: int) -> None:
    for a in run_clients(srv, 1, n, infer_body([SIM_ROW])):
        assert a.status == 200


def test_leak_memory_grows_rss_by_the_configured_bytes() -> None:
    with start_server(*SIM_FAST, "--fault", "leak-memory:1000000") as srv:
        assert listed_faults(srv) == ["leak-memory:1000000"]
        before = metric_sum(scrape(srv.url), "process_resident_memory_bytes")
        sequential(srv, 60)
        after = metric_sum(scrape(srv.url), "process_resident_memory_bytes")
        assert after - before > 0.6 * 60 * 1_000_000


def test_leak_threads_and_fds_grow_with_traffic() -> None:
    args = (*SIM_FAST, "--fault", "leak-threads:2", "--fault", "leak-fds:2")
    with start_server(*args) as srv:
        assert listed_faults(srv) == ["leak-threads:2", "leak-fds:2"]
        proc = psutil.Process(srv.pid)
        threads0, fds0 = proc.num_threads(), proc.num_fds()
        sequential(srv, 50)
        # 25 of each leaked; the margin absorbs the warmup thread ending, the lazily
        # started model worker and connection sockets still closing.
        assert proc.num_threads() - threads0 >= 20
        assert proc.num_fds() - fds0 >= 20


def average_batch(srv: ServerHandle) -> float:
    m = scrape(srv.url)
    return metric_sum(m, "refserver_inference_count_total") / metric_sum(
        m, "refserver_execution_count_total"
    )


def test_no_batching_runs_one_request_per_batch() -> None:
    with start_server("--model", "sim", "--fault", "no-batching") as srv:
        assert listed_faults(srv) == ["no-batching"]
        answers = run_clients(srv, 8, 4, infer_body([SIM_ROW]))
        assert all(a.status == 200 for a in answers)
        assert average_batch(srv) == 1.0  # the same load batches > 2 without the fault


def test_unbounded_queue_never_sheds() -> None:
    args = ("--model", "sim", "--sim-base-ms", "50", "--max-batch-size", "1")
    with start_server(
        *args, "--queue-size", "2", "--priority-levels", "1", "--fault", "unbounded-queue"
    ) as srv:
        answers = run_clients(srv, 8, 3, infer_body([SIM_ROW]))
        # Without the fault this load gets 503s (test_full_queue_answers_503_fast_while_serving).
        assert [a.status for a in answers] == [200] * 24
        assert metric_sum(scrape(srv.url), "refserver_requests_total", reason="queue_full") == 0


def test_ignore_priority_serves_fifo() -> None:
    args = ("--model", "sim", "--sim-base-ms", "100", "--max-batch-size", "1")
    with start_server(*args, "--queue-size", "16", "--fault", "ignore-priority") as srv:
        high, defaults = backlog_order(srv, n_default=4)
        assert high.status == 200
        # Without the fault it finishes first; with it, last.
        assert high.end > max(a.end for a in defaults)


def test_fifo_dispatch_admits_per_level_but_serves_in_arrival_order() -> None:
    args = ("--model", "sim", "--sim-base-ms", "100", "--max-batch-size", "1")
    with start_server(*args, "--queue-size", "16", "--fault", "fifo-dispatch") as srv:
        assert listed_faults(srv) == ["fifo-dispatch"]
        high, defaults = backlog_order(srv, n_default=4)
        assert high.status == 200
        # Without the fault it finishes first; with it, after every earlier default one.
        assert high.end > max(a.end for a in defaults)


def test_backoff_batching_collapses_the_batch_size_after_an_overflow() -> None:
    # 16 clients against a queue of 4 overflow it; the cap is cut at most once per 100 ms,
    # so three bursts 150 ms apart take it from 4 to 2 to 1 (and hold it at 1). One long
    # burst is not enough: its 503s come back so fast that a whole burst can fit inside
    # one cool-down (a fresh-clone CI run saw a single cut, cap 2).
    args = ("--model", "sim", "--sim-base-ms", "20", "--queue-size", "4", "--max-batch-size", "4")
    with start_server(*args, "--fault", "backoff-batching:60") as srv:
        assert listed_faults(srv) == ["backoff-batching:60"]
        for _ in range(3):
            answers = run_clients(srv, 16, 10, infer_body([SIM_ROW]))
            assert any(a.status == 503 for a in answers)  # the overflow that cuts the cap
            time.sleep(0.15)
        before = scrape(srv.url)
        answers = run_clients(srv, 4, 5, infer_body([SIM_ROW]))  # fits the queue: no 503
        assert all(a.status == 200 for a in answers)
        after = scrape(srv.url)
        rows, batches = (
            metric_sum(after, name) - metric_sum(before, name)
            for name in ("refserver_inference_count_total", "refserver_execution_count_total")
        )
        # 4 concurrent clients batch ~4 per 20 ms batch on a healthy server; the cap, cut
        # to 1 by the overflow burst and regaining a slot per minute, runs them one by one
        assert rows == 20 and batches == 20


def test_cross_wire_swaps_outputs_between_requests() -> None:
    sim = SimModel("sim", (16, 4), 0.0, 0.0, seed=0)

    def body(client: int, i: int) -> bytes:
        return infer_body([[float(client * 10 + i)] * 16])

    def mismatches(srv: ServerHandle) -> int:
        answers = run_clients(srv, 8, 6, body)
        bad = 0
        for a in answers:
            assert a.status == 200
            x = np.asarray(json.loads(a.sent)["inputs"][0]["data"], np.float32).reshape(1, 16)
            got = np.asarray(a.doc["outputs"][0]["data"], np.float32)
            bad += not np.allclose(got, sim.predict(x)[0], rtol=1e-4, atol=1e-4)
        return bad

    args = ("--model", "sim", "--sim-base-ms", "20", "--max-delay-ms", "10")
    with start_server(*args, "--fault", "cross-wire:1") as srv:
        assert listed_faults(srv) == ["cross-wire:1"]
        assert mismatches(srv) >= 2
    with start_server(*args) as srv:
        assert mismatches(srv) == 0


def test_slow_start_is_ready_at_once_and_pays_on_the_first_request() -> None:
    with start_server(*SIM_FAST, "--fault", "slow-start:2") as srv:
        assert listed_faults(srv) == ["slow-start:2"]
        first = send(srv, infer_body([SIM_ROW]))
        second = send(srv, infer_body([SIM_ROW]))
        assert first.status == second.status == 200
        assert first.seconds > 10 * second.seconds


def test_stall_holds_the_gil_periodically() -> None:
    with start_server(*SIM_FAST, "--fault", "stall:1,0.5") as srv:
        assert listed_faults(srv) == ["stall:1,0.5"]
        # ~2.5 periods of back-to-back tiny requests: at least two land in a stall.
        answers = []
        while not answers or answers[-1].end - answers[0].start < 2.5:
            answers.extend(run_clients(srv, 1, 20, infer_body([SIM_ROW])))
        latencies = sorted(a.seconds for a in answers)
        worst, median = latencies[-1], statistics.median(latencies)
        # A slower box only makes requests slower, so a lower bound of half the hold
        # cannot fail spuriously; the ratio keeps it from passing on a box that is slow
        # for every request.
        assert worst > 0.25 and worst > 10 * median, (worst, median)


# -- defects of another shape (the checks must generalise) ---------------------------


def test_new_fault_params_defaults_and_errors() -> None:
    assert parse_faults(["late-leak", "stale-output"]).names() == [
        "late-leak:4096,30",
        "stale-output:0.02",
    ]
    assert parse_faults(["late-leak:100"]).late_leak == (100, 30.0)
    assert parse_faults(["late-leak:100,2.5"]).late_leak == (100, 2.5)
    assert parse_faults(["stale-output:0"]).stale_output_p == 0.0
    late = "Expected late-leak:BYTES_PER_REQUEST[,AFTER_S] with BYTES >= 1 and AFTER_S >= 0."
    stale = "Expected stale-output:P with 0 <= P <= 1."
    for spec, expected in [
        ("late-leak:0", late),
        ("late-leak:x", late),
        ("late-leak:10,-1", late),
        ("late-leak:10,inf", late),
        ("late-leak:1,2,3", late),
        ("stale-output:1.5", stale),
        ("stale-output:nan", stale),
    ]:
        with pytest.raises(ConfigError) as exc:
            parse_faults([spec])
        assert str(exc.value) == f"--fault has value {spec!r}. {expected}"


def test_late_leak_counts_from_the_first_ready_on_the_injected_clock() -> None:
    now = [100.0]
    rt = FaultRuntime(parse_faults(["late-leak:10,5"]), now=lambda: now[0])
    rt.on_request()  # not ready yet: nothing
    rt.mark_ready()
    now[0] = 104.9
    rt.on_request()
    assert rt.retained_bytes == 0
    rt.mark_ready()  # ready again (e.g. after a readiness flap) does not restart the count
    now[0] = 105.0
    rt.on_request()
    rt.on_request()
    assert rt.retained_bytes == 20


def test_stale_output_answers_with_the_last_request_of_the_previous_batch() -> None:
    rt = FaultRuntime(parse_faults(["stale-output:1"]))
    a, b, c, d = (np.full((1, 4), v, np.float32) for v in (1, 2, 3, 4))
    two_rows = np.full((2, 4), 5, np.float32)
    first = [a, b]
    rt.after_batch(first)
    assert first == [a, b]  # empty slot: answered normally, never from its own batch
    second = [c, d, two_rows]
    rt.after_batch(second)
    assert second[0] is not c and np.array_equal(second[0], b)
    assert np.array_equal(second[1], b)
    assert second[2] is two_rows  # a different shape is answered normally
    third = [c]
    rt.after_batch(third)
    assert third == [c]  # the slot holds the (2, 4) output now
    fourth = [d]
    rt.after_batch(fourth)
    assert np.array_equal(fourth[0], c)  # the slot kept c's own output, not what it was sent
    assert rt.stale_answers == 3


def rss(srv: ServerHandle) -> float:
    return metric_sum(scrape(srv.url), "process_resident_memory_bytes")


def ready_window(srv: ServerHandle, not_before: float) -> tuple[float, float]:
    """Poll readiness; the server became ready within the returned (after, by) times."""
    after = not_before  # before the process was started: always a valid lower bound
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        sent = time.monotonic()
        status = http_status(srv.url, "/v2/health/ready", timeout=1.0)
        if status == 200:
            return after, time.monotonic()
        if status == 503:  # the server said "not ready" after this moment
            after = sent
        time.sleep(0.02)
    raise AssertionError(f"not ready in 30 s:\n{srv.log()}")


def test_late_leak_retains_nothing_before_after_s_then_grows() -> None:
    after_s, block = 2.0, 1_000_000
    # The warmup delay makes readiness observable (503 then 200), which bounds the
    # moment the server became ready from both sides.
    args = (*SIM_FAST, "--warmup-delay-s", "1", "--fault", f"late-leak:{block},{after_s:g}")
    started = time.monotonic()
    with start_server(*args, wait_for_ready=False) as srv:
        ready_after, ready_by = ready_window(srv, started)
        assert listed_faults(srv) == ["late-leak:1000000,2"]
        sequential(srv, 5)  # allocator and lazily started worker settle
        quiet0 = rss(srv)
        sequential(srv, 20)
        answered_by = time.monotonic()
        quiet1 = rss(srv)
        # Precondition: every quiet request reached the server before the leak could start.
        assert answered_by < ready_after + after_s, (answered_by - ready_after, after_s)
        assert "retaining memory" not in srv.log()
        wait_until(lambda: time.monotonic() > ready_by + after_s, timeout=after_s + 5)
        sequential(srv, 40)
        leaky = rss(srv)
        assert "FAULT INJECTED: late-leak:1000000,2" in srv.log()
        assert "FAULT late-leak: retaining memory from now on" in srv.log()
    assert quiet1 - quiet0 < 0.25 * 20 * block, quiet1 - quiet0
    assert leaky - quiet1 > 0.6 * 40 * block, leaky - quiet1


def stale_answers(srv: ServerHandle, n: int = 40) -> list[int]:
    """Send n distinct requests one after another; the indexes answered with the
    previous request's output. Fails on any other wrong output or a wrong id."""
    sim = SimModel("sim", (16, 4), 0.0, 0.0, seed=0)
    rows = [[float(i + 1)] * 16 for i in range(n)]
    expected = [sim.predict(np.asarray([row], np.float32))[0] for row in rows]
    stale = []
    for i, row in enumerate(rows):
        a = send(srv, infer_body([row], request_id=f"req-{i}"))
        assert a.status == 200
        assert a.doc["id"] == f"req-{i}"
        got = np.asarray(a.doc["outputs"][0]["data"], np.float32)
        if not np.allclose(got, expected[i], rtol=1e-4, atol=1e-4):
            # One request per batch here, so "the previous batch" is the previous request.
            assert i > 0 and np.allclose(got, expected[i - 1], rtol=1e-4, atol=1e-4), i
            stale.append(i)
    return stale


def test_stale_output_answers_another_requests_output_reproducibly() -> None:
    with start_server(*SIM_FAST, "--fault", "stale-output:0.5") as srv:
        assert listed_faults(srv) == ["stale-output:0.5"]
        first = stale_answers(srv)
    assert 5 <= len(first) <= 35, first
    with start_server(*SIM_FAST, "--fault", "stale-output:0.5") as srv:
        assert stale_answers(srv) == first  # same --seed, same requests: same defect
    with start_server(*SIM_FAST, "--fault", "stale-output:0") as srv:
        assert stale_answers(srv) == []


# -- faults for steady.error_rate, linearity.efficiency, soak.latency_drift ----------


def test_error_serialize_slowdown_params_defaults_and_errors() -> None:
    assert parse_faults(["error-rate", "serialize", "slowdown"]).names() == [
        "error-rate:0.05",
        "serialize",
        "slowdown:20",
    ]
    assert parse_faults(["error-rate:0"]).error_rate_p == 0.0
    assert parse_faults(["slowdown:6000"]).slowdown_ms_per_min == 6000.0
    err = "Expected error-rate:P with 0 <= P <= 1."
    slow = "Expected slowdown:MS_PER_MIN with MS_PER_MIN >= 0."
    for spec, expected in [
        ("error-rate:1.5", err),
        ("error-rate:-0.1", err),
        ("error-rate:nan", err),
        ("error-rate:x", err),
        ("serialize:1", "Expected serialize without a parameter."),
        ("slowdown:-1", slow),
        ("slowdown:inf", slow),
        ("slowdown:fast", slow),
    ]:
        with pytest.raises(ConfigError) as exc:
            parse_faults([spec])
        assert str(exc.value) == f"--fault has value {spec!r}. {expected}"


def test_error_rate_fails_single_requests_of_a_batch_reproducibly() -> None:
    def pattern(seed: int) -> list[bool]:
        rt = FaultRuntime(parse_faults(["error-rate:0.5"]), seed=seed)
        failed = []
        for _ in range(10):
            outputs = [np.full((1, 4), i, np.float32) for i in range(8)]
            kept = list(outputs)
            rt.after_batch(outputs)
            for out, original in zip(outputs, kept, strict=True):
                assert out is original or isinstance(out, ModelFault)
            failed += [isinstance(out, ModelFault) for out in outputs]
        assert rt.failed_answers == sum(failed)
        return failed

    first = pattern(seed=0)
    assert 15 <= sum(first) <= 65  # 80 draws at P = 0.5
    assert pattern(seed=0) == first
    assert pattern(seed=1) != first
    rt = FaultRuntime(parse_faults(["error-rate:0"]))
    outputs = [np.zeros((1, 4), np.float32)] * 50
    rt.after_batch(outputs)
    assert rt.failed_answers == 0
    assert not FaultRuntime(parse_faults(["serialize"])).rewrites_outputs


def test_slowdown_grows_with_minutes_since_ready_on_the_injected_clock() -> None:
    now = [100.0]
    slept: list[float] = []
    rt = FaultRuntime(parse_faults(["slowdown:20"]), now=lambda: now[0], sleep=slept.append)
    run = rt.wrap_run(lambda x: x + 1)
    x = np.zeros((1, 4), np.float32)
    assert np.array_equal(run(x), x + 1)
    assert slept == []  # not ready yet: no uptime
    rt.mark_ready()
    now[0] = 130.0  # half a minute: 10 ms
    run(x)
    now[0] = 400.0  # five minutes: 100 ms
    run(x)
    assert slept == pytest.approx([0.010, 0.100])
    plain = lambda x: x  # noqa: E731
    assert FaultRuntime(parse_faults([])).wrap_run(plain) is plain


def test_error_rate_answers_500_for_some_requests_and_metrics_balance() -> None:
    def load(srv: ServerHandle) -> list[Answer]:
        # 4 concurrent clients: batches hold several requests, most of them answered 200.
        answers = run_clients(srv, 4, 20, infer_body([SIM_ROW]))
        assert len(answers) == 80
        return answers

    args = ("--model", "sim", "--sim-base-ms", "5", "--sim-item-ms", "0")
    with start_server(*args, "--fault", "error-rate:0.5") as srv:
        assert listed_faults(srv) == ["error-rate:0.5"]
        answers = load(srv)
        m = scrape(srv.url)
        assert "FAULT INJECTED: error-rate:0.5" in srv.log()
    failed = [a for a in answers if a.status == 500]
    assert {a.status for a in answers} == {200, 500}
    assert 15 <= len(failed) <= 65, len(failed)  # 80 draws at P = 0.5
    for a in failed:
        assert a.doc["error"].startswith("model execution failed: ModelFault: injected fault ")
    for a in answers:
        if a.status == 200:
            assert len(a.doc["outputs"][0]["data"]) == 4
    received = metric_sum(m, "refserver_requests_received_total")
    assert received == 80
    assert metric_sum(m, "refserver_requests_total", outcome="failed") == len(failed)
    assert metric_sum(m, "refserver_requests_total", outcome="success") == 80 - len(failed)
    assert metric_sum(m, "refserver_requests_total") == received
    # Some batch had both answers: failures are per request, not per batch.
    assert metric_sum(m, "refserver_inference_count_total") > metric_sum(
        m, "refserver_execution_count_total"
    )
    with start_server(*args, "--fault", "error-rate:0") as srv:
        assert {a.status for a in load(srv)} == {200}


def test_serialize_makes_two_workers_as_fast_as_one() -> None:
    # --queue-size: the default (4 x max batch) would shed the 8 clients' backlog.
    args = ("--model", "sim", "--workers", "2", "--max-batch-size", "1", "--queue-size", "16")
    args = (*args, "--sim-base-ms", "50", "--sim-item-ms", "0")

    def seconds_for_load(srv: ServerHandle) -> float:
        # 8 closed-loop clients keep both workers busy; 40 batches of 50 ms each.
        answers = run_clients(srv, 8, 5, infer_body([SIM_ROW]))
        assert [a.status for a in answers] == [200] * 40
        return max(a.end for a in answers) - min(a.start for a in answers)

    with start_server(*args) as healthy, start_server(*args, "--fault", "serialize") as locked:
        assert listed_faults(locked) == ["serialize"]
        parallel = seconds_for_load(healthy)
        serial = seconds_for_load(locked)
    # Ideal: 1.0 s vs 2.0 s. Each 50 ms batch is a sleep, so a busy box adds about the
    # same HTTP overhead to both and the ratio stays near 2.
    assert serial > 1.5 * parallel, (serial, parallel)


def test_slowdown_makes_later_requests_slower() -> None:
    per_min = 6000.0  # 100 ms more per second since ready
    with start_server(*SIM_FAST, "--fault", f"slowdown:{per_min:g}") as srv:
        assert listed_faults(srv) == ["slowdown:6000"]
        answers = [send(srv, infer_body([SIM_ROW]))]
        # Back-to-back requests until 3 s after the first one (each one is slower).
        while answers[-1].start - answers[0].start < 3.0:
            answers.append(send(srv, infer_body([SIM_ROW])))
    assert all(a.status == 200 for a in answers)
    early = statistics.median(a.seconds for a in answers[:3])
    late = statistics.median(a.seconds for a in answers[-3:])
    # The server was ready before the first request was sent, so the last request's
    # uptime is at least its distance from the first: a floor that a slow box cannot
    # break. The ratio (ideal (u0 + 3) / u0 for a first request u0 s after ready)
    # keeps it from passing on a box that is slow for every request.
    last = answers[-1]
    assert last.seconds > 0.9 * (last.start - answers[0].start) * per_min / 60_000
    assert late > 3 * early, (early, late, len(answers))


def test_reset_breaker_opens_on_a_burst_of_resets_and_stays_open_its_time():
    """reset-breaker: 20 client resets within 5 s open the breaker (every inference 503)
    for OPEN_S after the last trip; resets spread thinner never trip it."""
    from harness_reference_server.errors import ConfigError
    from harness_reference_server.fault_catalog import parse_faults
    from harness_reference_server.faults import BREAKER_RESETS, FaultRuntime

    assert parse_faults(["reset-breaker"]).reset_breaker_open_s == 15.0
    assert parse_faults(["reset-breaker:2.5"]).names() == ["reset-breaker:2.5"]
    with pytest.raises(ConfigError, match="OPEN_S"):
        parse_faults(["reset-breaker:0"])
    now = [0.0]
    rt = FaultRuntime(parse_faults(["reset-breaker:15"]), now=lambda: now[0])
    for _ in range(BREAKER_RESETS):  # one every 0.3 s: 20 span 5.7 s, never 20 within 5
        rt.on_reset()
        now[0] += 0.3
    assert not rt.breaker_open() and rt.breaker_trips == 0
    for _ in range(BREAKER_RESETS):  # a burst
        rt.on_reset()
    assert rt.breaker_open() and rt.breaker_trips == 1
    now[0] += 14.9
    assert rt.breaker_open()
    now[0] += 0.2
    assert not rt.breaker_open()
    assert not FaultRuntime(parse_faults([])).breaker_open()  # healthy: never
