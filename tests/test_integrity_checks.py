"""Integrity judges the requests it meant to verify, not only the answers that came:
integrity.mismatches on the verified answers, integrity.failures on the ones that never
came to be verified (failed, timed out, dropped, non-200)."""

from __future__ import annotations

from typing import Any

from harness.checks import REGISTRY, Check, resolve_params
from harness.testing.results import counters, scenario


def integrity_doc(
    ok: int,
    failed: dict[str, int] | None = None,
    dropped: int = 0,
    verified: bool = True,
    **mismatches: int,
) -> dict[str, Any]:
    """An integrity run: ``ok`` answers verified as their own, ``mismatches`` verified as
    someone else's (also counted as failed outcomes, as the load side records them), and
    ``failed``/``dropped`` requests that got no answer to verify."""
    kinds = {k: int(mismatches.get(k, 0)) for k in ("cross_wired", "drift", "id_mismatch")}
    c = counters(ok, {**(failed or {}), **kinds}, dropped=dropped)
    integ = {
        "checked": ok + sum(kinds.values()),
        "ok": ok,
        **kinds,
        "verified": verified,
        "tolerance": 1e-4,
        "pool": 256,
        "examples": [],
    }
    return scenario("integrity", 30.0, counters=c, integrity=integ)


def run(check_id: str, doc: dict[str, Any], **params: Any) -> Check:
    c = REGISTRY[check_id].fn(doc, resolve_params(check_id, params))
    assert c.detail
    return c


def test_a_server_failing_its_batches_fails_integrity() -> None:
    """As measured on an independent server answering 500 to every batch of two or more:
    6,682 failed, 1,615 verified, and the mismatch check passed on those 1,615."""
    doc = integrity_doc(1615, {"http_500": 6682})
    assert run("integrity.mismatches", doc).passed is True  # it sees only what came
    c = run("integrity.failures", doc)
    assert c.passed is False, c.detail
    assert c.value == round(6682 / 8297, 6) and c.n == 8297 and c.threshold == 0.01
    assert "6682 of 8297" in c.detail and "1615 answers verified" in c.detail
    assert "http_500 6682" in c.detail


def test_a_healthy_integrity_run_passes() -> None:
    # the healthy reference server's quick run: 17,188 requests, all answered and verified
    c = run("integrity.failures", integrity_doc(17188))
    assert c.passed is True and c.value == 0 and c.n == 17188, c.detail
    # a stray reset or two in thousands is within the bound, and quick 503s a healthy
    # server shed at 0.9x (240 of 14,844 on a disturbed box; 479 of 14,342 on a fresh
    # clone's quick acceptance) are load declined, judged against max_shed
    assert run("integrity.failures", integrity_doc(5000, {"connection": 3})).passed is True
    assert run("integrity.failures", integrity_doc(14604, {"http_503": 240})).passed is True
    c = run("integrity.failures", integrity_doc(13863, {"http_503": 479}))
    assert c.passed is True and c.value == 0, c.detail


def test_a_server_refusing_most_of_what_it_was_meant_to_verify_fails() -> None:
    """Refusing its batches as 'overload' (503) is no way past integrity either."""
    c = run("integrity.failures", integrity_doc(1615, {"http_503": 6682}))
    assert c.passed is False and "refused at once as overload" in c.detail, c.detail


def test_timeouts_drops_and_bad_bodies_count_but_mismatches_do_not() -> None:
    for failed, dropped in (({"timeout": 60}, 0), ({}, 60), ({"bad_response": 60}, 0)):
        c = run("integrity.failures", integrity_doc(3000, failed, dropped=dropped))
        assert c.passed is False and c.value == round(60 / 3060, 6), c.detail
    # a cross-wired answer was verified (integrity.mismatches fails it), not unanswered
    doc = integrity_doc(3000, cross_wired=60)
    assert run("integrity.failures", doc).passed is True
    assert run("integrity.mismatches", doc).passed is False


def test_failures_skip_without_verification_or_enough_requests() -> None:
    c = run("integrity.failures", integrity_doc(3000, verified=False))
    assert c.passed is None and "--no-verify" in (c.skipped or "")
    c = run("integrity.failures", integrity_doc(40, {"http_500": 40}))
    assert c.passed is None and "insufficient samples" in (c.skipped or "")
    assert run("integrity.failures", scenario("integrity", 30.0)).passed is None


def test_the_packaged_integrity_scenario_judges_failures() -> None:
    from harness.checks import evaluate
    from harness.load.scenario import load_scenario

    doc = integrity_doc(1615, {"http_500": 6682})
    doc["check_config"] = load_scenario("integrity", "quick").check_config()
    checks = {c.id: c for c in evaluate(doc)}
    assert checks["integrity.mismatches"].passed is True
    assert checks["integrity.failures"].passed is False
