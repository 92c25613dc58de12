"""Client aborts: a stream that hangs up after N token events closes its socket (the server
reads the end of its input), is recorded ``aborted`` — neither failed nor a request of
goodput — and keeps the figures it measured (TTFT, inter-token gaps), not the per-answer
ones; the scenario's [llm] abort keys are validated and drawn reproducibly per stage."""

from __future__ import annotations

import random
import time

import gevent
import gevent.event
import pytest
from gevent.server import StreamServer

from harness.analysis.validity import accounting_imbalance
from harness.errors import ConfigError
from harness.load import http
from harness.load.llm_workload import config_from_table
from harness.load.llm_workload_lengths import parse_length
from harness.load.recording import Recording, counters_view
from harness.load.stream_aborts import ClientAborts
from harness.load.stream_exchange import outcome_of
from harness.load.stream_http import StreamLimits, exchange_stream
from harness.load.stream_recording import StreamStats
from harness.protocols.openai_stream import Expectation, ProblemCode
from harness.testing.llm_streams import DONE_EVENT, chunk_event
from harness.testing.raw_http import requests_on
from tests.test_stream_http import SSE_HEAD, chunked, request_bytes

GAP_S = 0.02
LIMITS = StreamLimits(deadline_s=5.0, stall_s=2.0)
TOKENS = [f" t{i}" for i in range(12)]


def _events() -> list[bytes]:
    out = [chunk_event(role="assistant", content="")]
    out += [chunk_event(t) for t in TOKENS]
    out += [chunk_event(finish_reason="length"), chunk_event(usage=(5, len(TOKENS))), DONE_EVENT]
    return out


class _Server:
    """Streams ``_events()`` one every GAP_S; notes when it read its client's close."""

    def __init__(self) -> None:
        self.closed_at: float | None = None
        self.written = 0
        self.done = gevent.event.Event()
        self.server = StreamServer(("127.0.0.1", 0), self.handle)

    def handle(self, sock, _addr) -> None:
        try:
            next(requests_on(sock), None)
            sock.sendall(SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
            sock.setblocking(False)
            for event in _events():
                gevent.sleep(GAP_S)
                try:
                    if sock.recv(1) == b"":  # the client hung up
                        self.closed_at = time.perf_counter()
                        return
                except BlockingIOError:
                    pass
                sock.sendall(chunked(event))
                self.written += 1
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            self.closed_at = time.perf_counter()
        finally:
            sock.close()
            self.done.set()


def _stream(abort_after: int | None, expected: Expectation | None = None):
    srv = _Server()
    srv.server.start()
    conn = http.Connection("127.0.0.1", srv.server.server_port)
    try:
        rec = exchange_stream(
            conn,
            request_bytes(conn.port),
            LIMITS,
            count_tokens=None,
            abort_after=abort_after,
            expected=expected,
        )
        sock_after = conn.sock
        srv.done.wait(3.0)
    finally:
        conn.close()
        srv.server.stop(timeout=1)
    return rec, srv, sock_after


def test_an_abort_closes_the_socket_after_n_token_events_and_the_server_sees_it() -> None:
    rec, srv, sock_after = _stream(3)
    assert rec.aborted and not rec.failed
    assert rec.text == "".join(TOKENS[:3]) and len(rec.token_times_s) == 3
    assert sock_after is None  # never reused
    assert srv.closed_at is not None, "the server did not read its client's close"
    assert srv.written < len(_events())  # it stopped writing well before the end
    # neither a missing finish reason, [DONE] nor usage is a problem of an aborted stream
    assert not rec.codes() & {ProblemCode.NO_FINISH_REASON, ProblemCode.NO_DONE}
    assert not rec.codes() & {ProblemCode.NO_USAGE, ProblemCode.TRANSPORT_ERROR}
    assert outcome_of(rec) == "aborted"


def test_a_stream_shorter_than_its_abort_point_ends_normally() -> None:
    rec, _, sock_after = _stream(len(TOKENS) + 5)
    assert not rec.aborted and not rec.problems and rec.done
    assert outcome_of(rec) == "ok" and sock_after is not None


def test_an_aborted_stream_is_checked_as_a_prefix_of_its_expected_answer() -> None:
    right = Expectation("".join(TOKENS), "length", len(TOKENS))
    rec, _, _ = _stream(4, right)
    assert rec.aborted and not rec.problems
    wrong = Expectation(" t0 t1 XX" + "".join(TOKENS[3:]), "length", len(TOKENS))
    rec, _, _ = _stream(4, wrong)
    assert ProblemCode.WRONG_TEXT in rec.codes() and outcome_of(rec) == "cross_wired"


def test_aborted_streams_are_their_own_count_with_ttft_and_gaps_but_no_per_answer_figures() -> None:
    aborted, _, _ = _stream(3)
    whole, _, _ = _stream(None)
    stats = StreamStats()
    stats.record("c", aborted)
    stats.record("c", whole)
    s = stats.summary()["classes"]["c"]
    assert (s["requests"], s["ok"], s["failed"], s["aborted"]) == (1, 1, 0, 1)
    assert s["goodput"]["conforming"] == 1 and s["goodput"]["not_conforming"] == 0
    assert s["ttft_ms"]["count"] == 2  # both got a first token
    assert s["itl_ms"]["count"] == 2 + (len(TOKENS) - 1)  # each gap either read
    assert s["tpot_ms"]["count"] == s["e2e_ms"]["count"] == s["max_gap_ms"]["count"] == 1
    assert s["tokens_out"] == 3 + len(TOKENS)


def test_the_run_counters_balance_with_aborted_streams_apart_from_failures() -> None:
    rec = Recording()
    for outcome in ("ok", "aborted", "aborted", "timeout"):
        rec.scheduled("c", "s", 0.5)
        rec.sent("c", "s", 0.5, 0.0)
        rec.done("c", "s", 0.5, outcome, 1000.0)
    c = counters_view(rec.totals().counts)
    assert c["aborted"] == 2 and c["ok"] == 1 and c["failed_total"] == 1
    assert accounting_imbalance(c) == 0
    assert rec.error_latency.get_total_count() == 1  # the timeout only
    rec.finish()
    (row,) = rec.rows
    assert row["aborted"] == 2 and "aborted" not in row["errors"] and row["n"] == 2
    assert "aborted" not in counters_view({"scheduled": 1, "ok": 1})


def test_the_abort_keys_are_validated_with_the_fix_named() -> None:
    cfg = config_from_table(
        {"abort_share": 0.8, "abort_after": "uniform:min=2,max=6", "abort_stages": ["storm"]},
        "s.toml",
    )
    assert (cfg.abort_share, cfg.abort_after.low, cfg.abort_stages) == (0.8, 2, ("storm",))
    with pytest.raises(ConfigError, match=r"llm.abort_share = 1.5 must be ≤ 1"):
        config_from_table({"abort_share": 1.5}, "s.toml")
    with pytest.raises(ConfigError, match=r"llm.abort_stages .* write e.g. \[\"storm\"\]"):
        config_from_table({"abort_stages": "storm"}, "s.toml")
    with pytest.raises(ConfigError, match=r"abort_after"):
        config_from_table({"abort_after": "uniform:min=0,max=3"}, "s.toml")


def test_the_scenario_rejects_an_abort_stage_it_does_not_have() -> None:
    from harness.load.scenario import parse_scenario

    doc = {
        "load": {"protocol": "openai", "mode": "open", "calibrate": False},
        "llm": {"abort_share": 0.5, "abort_stages": ["strom"]},
        "stages": [{"name": "storm", "duration_s": 5, "rate": 2}],
    }
    with pytest.raises(ConfigError, match=r"abort_stages names 'strom'.*stages are: storm"):
        parse_scenario(doc, "s.toml")


def test_the_picker_aborts_its_share_in_its_stages_only_reproducibly() -> None:
    plan = ClientAborts(0.75, parse_length("uniform:min=2,max=8"), ("storm",))
    pick = plan.picker(seed=1, slot=0)
    storm = [pick("storm") for _ in range(4000)]
    assert all(pick("baseline") is None for _ in range(100))
    share = sum(n is not None for n in storm) / len(storm)
    assert 0.72 < share < 0.78  # 4000 Bernoulli(0.75) draws: 3 σ is ±0.021
    assert {n for n in storm if n is not None} == set(range(2, 9))
    again = plan.picker(seed=1, slot=0)
    assert [again("storm") for _ in range(4000)] == storm
    other = plan.picker(seed=1, slot=1)
    assert [other("storm") for _ in range(4000)] != storm
    random.seed(7)  # the module's generator is not the picker's
    assert [plan.picker(seed=1, slot=0)("storm") for _ in range(1)] == storm[:1]


def test_the_packaged_abort_storm_aborts_in_its_storm_stage_only() -> None:
    from harness.load.scenario import load_scenario
    from harness.load.stream_exchange import client_aborts_of

    for mode in ("quick", "full"):
        plan = client_aborts_of(load_scenario("llm_abort_storm", mode))
        assert plan is not None and plan.stages == ("storm",) and plan.share == 0.9
    assert client_aborts_of(load_scenario("llm_steady")) is None
