"""The rolling-shutdown checks judge only what the run observed: an exit code nobody read
is not a pass, a drain with nothing to drain is not a pass, and a loss is a failure
whatever else the run says."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from harness.checks import REGISTRY, Check, resolve_params
from harness.testing.results import counters, hdr, scenario, stage


def _run(check_id: str, sc: dict[str, Any], **params: Any) -> Check:
    return REGISTRY[check_id].fn(sc, resolve_params(check_id, params))


def _terminate(**detail: Any) -> list[dict[str, Any]]:
    d = {
        "old_pid": 10,
        "found": True,
        "ignored": False,
        "unready_s": 0.004,
        "exit_s": 0.3,
        "exit_code": 0,
        "killed": False,
        "gone": True,
        "new_pid": 11,
        "time_to_ready_s": 0.8,
    } | detail
    return [
        {
            "action": "terminate",
            "params": {"restart": True, "drain_timeout_s": 5.0, "duration_s": 0.0},
            "at_s": 8.0,
            "start_s": 8.0004,
            "end_s": 9.2,
            "ok": True,
            "error": None,
            "detail": d,
        }
    ]


def _shutdown(
    rate_rps: float, latency_ms: float, failed: dict[str, int] | None = None, **detail: Any
) -> dict[str, Any]:
    """rolling_shutdown's shape: stage "serving" (8 s) ends at the SIGTERM, "replaced"
    after it; every request of "serving" answered in ``latency_ms`` (lognormal around it)
    unless ``failed`` says otherwise."""
    rng = np.random.default_rng(7)
    sent = int(rate_rps * 8)
    bad = sum((failed or {}).values())
    lat_us = rng.lognormal(np.log(latency_ms * 1000), 0.3, size=sent - bad)
    cell = {"counters": counters(sent - bad, failed), "latency_hdr": hdr(lat_us)}
    return scenario(
        "rolling_shutdown",
        18.0,
        stages=[
            stage("serving", 0.0, 8.0, rate_rps, warmup_s=2.0),
            stage("replaced", 8.0, 18.0, rate_rps),
        ],
        by_stage={"serving": {"default": cell}},
        chaos=_terminate(**detail),
        check_config={"shutdown.lost": {}, "shutdown.exit_s": {"threshold": 5}},
    )


# -- shutdown.exit_s -------------------------------------------------------------------


def test_an_exit_code_nobody_read_is_not_judged() -> None:
    """An attached server (its code is not the harness's to read) exiting in time used to
    pass: ``code is None`` counted as ok."""
    c = _run("shutdown.exit_s", _shutdown(400, 50, exit_code=None), threshold=5)
    assert c.passed is None and c.skipped
    assert "exit code is unknown" in c.skipped and "--sut-cmd" in c.skipped
    assert c.value == pytest.approx(0.3)  # the time it did measure is kept


def test_an_exit_code_read_as_zero_passes_and_non_zero_fails() -> None:
    assert _run("shutdown.exit_s", _shutdown(400, 50), threshold=5).passed is True
    c = _run("shutdown.exit_s", _shutdown(400, 50, exit_code=1), threshold=5)
    assert c.passed is False and "exit code 1" in c.detail
    killed_by_signal = _run("shutdown.exit_s", _shutdown(400, 50, exit_code=-15), threshold=5)
    assert killed_by_signal.passed is False


def test_a_slow_exit_fails_whatever_its_code() -> None:
    c = _run("shutdown.exit_s", _shutdown(400, 50, exit_s=7.5, exit_code=None), threshold=5)
    assert c.passed is False and c.value == pytest.approx(7.5)


def test_a_process_that_never_exited_fails_and_an_unobserved_exit_is_not_judged() -> None:
    hung = _run("shutdown.exit_s", _shutdown(400, 50, exit_s=None, exit_code=None, killed=True))
    assert hung.passed is False and "SIGKILLed" in hung.detail
    cut = _run("shutdown.exit_s", _shutdown(400, 50, exit_s=None, exit_code=None, cut_short=True))
    assert cut.passed is None and "not observed" in (cut.skipped or "")
    # a record without an exit time at all says nothing about the exit
    old = _shutdown(400, 50)
    for key in ("exit_s", "exit_code", "killed"):
        old["chaos"][0]["detail"].pop(key)
    assert _run("shutdown.exit_s", old).passed is None


# -- shutdown.lost ---------------------------------------------------------------------


def test_a_drain_with_nothing_in_flight_is_not_a_pass() -> None:
    """2 req/s with 5 ms answers: ~0.01 requests open at any moment, so the SIGTERM met
    an idle server and the drain was never exercised. It used to pass (0 lost)."""
    c = _run("shutdown.lost", _shutdown(2, 5))
    assert c.passed is None and c.skipped
    assert c.skipped.startswith("drain not tested: no request was in flight at SIGTERM")
    assert "raise the rate" in c.skipped and c.value == 0


def test_a_drain_with_requests_in_flight_is_judged() -> None:
    # rolling_shutdown --quick on the healthy reference server: ~400 req/s, ~50 ms
    # (measured: ~20.5 expected in flight at the signal in two runs)
    c = _run("shutdown.lost", _shutdown(400, 50))
    assert c.passed is True and c.value == 0
    assert "expected in flight at the signal" in c.detail
    expected = float(c.detail.split("~", 1)[1].split(" ", 1)[0])
    assert 15 < expected < 25  # 400 req/s x ~52 ms (the lognormal's mean)


def test_the_expected_count_follows_rate_and_latency() -> None:
    """Little's law for the stage's tail: just under min_in_flight is not judged, just
    over it is."""
    under = _run("shutdown.lost", _shutdown(80, 50))  # ~4.2 expected
    over = _run("shutdown.lost", _shutdown(120, 50))  # ~6.3 expected
    assert under.passed is None and over.passed is True
    assert _run("shutdown.lost", _shutdown(80, 50), min_in_flight=3).passed is True


def test_a_loss_fails_even_when_little_was_in_flight() -> None:
    """A request sent before the signal and never answered is a failure on its own."""
    c = _run("shutdown.lost", _shutdown(2, 5, failed={"connection": 1}))
    assert c.passed is False and c.value == 1
    c = _run("shutdown.lost", _shutdown(400, 50, failed={"connection": 9}))
    assert c.passed is False and c.value == 9
