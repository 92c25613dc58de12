"""Patch with gevent before anything starts a thread (Locust does it on import; done late,
after anyio/starlette made their threads, a TestClient call waits forever).

Under pytest-xdist (``-n``) a worker waits for its next test on an event that execnet's
reader thread sets; patched, that event is gevent's, and a hub with nothing else to wait
for ends the worker with ``LoopExit`` at once. Outside a test's body the worker's hub
keeps a timer that does nothing but keep it waiting; the body runs without it, so a test
that would block forever still fails with ``LoopExit`` as it does in a serial run. Tests
marked ``slow`` (real servers and Locust runs, timed and sampled) or ``serial`` (the
machine's CPU) run alone: in a worker they fail at set-up, naming the serial pass.

Every results document a test writes is validated against ``schemas/results.v1.json``:
in this process at the moment ``harness.results`` serialises it (``write_document``),
and, for documents written by subprocesses (``locust -f``, ``harness run``), every
``results.json`` left in the test's ``tmp_path``. A test that writes a deliberately
malformed document says so with ``@pytest.mark.malformed_results``.
"""

import json
import os
import time
from pathlib import Path
from typing import Any

import gevent
import jsonschema
import locust  # noqa: F401
import pytest

from harness.results import SCHEMA
from harness.results import document as _document
from harness.results.schema import SCHEMA_FILE

SETUP_WAIT_S = 1200.0
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")

# The reference servers the tests start keep their MLP weights in one directory of this
# session (harness_reference_server.models.weight_file), not in the user's ~/.cache: the
# first server generates them (~0.5 s), every later start reads them (~0.1 s). xdist's
# workers inherit it from the process that made it, which removes it (143 MB) at exit.
if "HARNESS_REFERENCE_WEIGHTS" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _weights = tempfile.mkdtemp(prefix="harness-weights-")
    os.environ["HARNESS_REFERENCE_WEIGHTS"] = _weights
    atexit.register(shutil.rmtree, _weights, True)
# the period is irrelevant: the timer only holds the hub; execnet's thread wakes it
_HUB_HOLD = gevent.get_hub().loop.timer(60.0, 60.0) if XDIST_WORKER else None
if _HUB_HOLD is not None:
    _HUB_HOLD.start(lambda: None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if _HUB_HOLD is None:
        return (yield)
    _HUB_HOLD.stop()
    try:
        return (yield)
    finally:
        _HUB_HOLD.start(lambda: None)


def pytest_runtest_setup(item) -> None:
    if not XDIST_WORKER:
        if item.get_closest_marker("slow") or item.get_closest_marker("serial"):
            _wait_for_machine_setup(item.session)
        return
    for name in ("slow", "serial"):
        if item.get_closest_marker(name):
            pytest.fail(
                f"{item.nodeid} is marked {name}: it measures CPU and time, and the test "
                "beside it under -n would disturb it; run it in the serial pass "
                '(python -m pytest -m "slow or serial")',
                pytrace=False,
            )


_SETUP_WAITED = False


def _wait_for_machine_setup(session) -> None:
    """Under .ci/run the machine's extras (apt's pidstat and chromium, kserve's venv) install
    in the background while the venv is made: the first slow or serial test waits for them
    (once a session), so none meets a half-installed package or shares the CPU with an
    install. The fast tier needs none of them and measures no CPU: it runs beside the
    install (under -n its workers never wait: a slow test there fails at set-up)."""
    global _SETUP_WAITED
    done = os.environ.get("HARNESS_CI_SETUP_DONE")
    if _SETUP_WAITED or not done:
        return
    _SETUP_WAITED = True
    start = time.monotonic()
    while not os.path.exists(done) and time.monotonic() - start < SETUP_WAIT_S:
        time.sleep(0.5)
    waited = time.monotonic() - start
    state = Path(done).read_text().strip() if os.path.exists(done) else "not done"
    line = f"machine set-up ({done}): {state}; the tests waited {waited:.0f} s for it"
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)
    else:
        print(line, flush=True)


def pytest_collection_modifyitems(session, config, items) -> None:
    """Under .ci/run vLLM's venv installs in the background until its own done-file
    (HARNESS_VLLM_SETUP_DONE, which tests/test_vllm_server.py waits for): that module's
    tests run first in their session, so no test that measures CPU runs beside the
    install. The order of every other test is kept."""
    if os.environ.get("HARNESS_VLLM_SETUP_DONE"):
        items.sort(key=lambda item: item.nodeid.split("::")[0] != "tests/test_vllm_server.py")


# seconds per test (set-up, call and tear-down summed), for the ledger at the end
_SPENT: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
    _SPENT[report.nodeid] = _SPENT.get(report.nodeid, 0.0) + float(report.duration or 0.0)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Where the session's time went, by test file, with the background installs' own
    figures: printed last, so the end of CI's log holds it (``--durations`` lists tests,
    longest first, above the summary)."""
    if XDIST_WORKER or not _SPENT:
        return
    by_file: dict[str, list[float]] = {}
    for nodeid, spent in _SPENT.items():
        by_file.setdefault(nodeid.split("::")[0], []).append(spent)
    total = sum(_SPENT.values())
    tr = terminalreporter
    tr.section("where the time went", sep="-")
    tr.write_line(f"{len(_SPENT)} tests, {total:.0f} s in all; by file, the longest first:")
    ranked = sorted(by_file.items(), key=lambda kv: -sum(kv[1]))
    for path, times in ranked[:12]:
        tr.write_line(f"  {sum(times):7.1f} s  {len(times):3d} tests  {path}")
    rest = ranked[12:]
    if rest:
        rest_s = sum(sum(t) for _, t in rest)
        tr.write_line(
            f"  {rest_s:7.1f} s  {sum(len(t) for _, t in rest):3d} tests  {len(rest)} other files"
        )
    from harness.testing.detection import RETRIED

    if RETRIED:
        lost = sum(r[2] for r in RETRIED)
        tr.write_line(f"  {len(RETRIED)} invalid attempts run again, {lost:.0f} s:")
        for where, scenario, spent, reason in RETRIED:
            tr.write_line(f"    {where} ({scenario}, {spent:.0f} s): {reason[:160]}")
    for var in ("HARNESS_CI_SETUP_DONE", "HARNESS_VLLM_SETUP_DONE"):
        done = os.environ.get(var)
        if done and os.path.exists(done):
            tr.write_line(f"  {var}: {Path(done).read_text().strip()}")


_VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))


def schema_errors(doc: Any) -> list[str]:
    """Where a results document breaks the published schema ([] when it is valid)."""
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message[:300]}"
        for e in sorted(_VALIDATOR.iter_errors(doc), key=lambda e: list(map(str, e.path)))
    ]


def assert_valid_results(doc: Any, where: str = "results document") -> None:
    errors = schema_errors(doc)
    assert not errors, f"{where} breaks schemas/results.v1.json:\n" + "\n".join(errors[:20])


@pytest.fixture(autouse=True)
def _results_documents_match_the_schema(request, monkeypatch):
    if request.node.get_closest_marker("malformed_results"):
        yield
        return
    real_serialise = _document._serialise  # what dumps and write_document both call

    def validating_serialise(doc):
        text = real_serialise(doc)
        parsed = json.loads(text)
        if isinstance(parsed, dict) and parsed.get("schema") == SCHEMA:
            assert_valid_results(parsed, "a results document written during this test")
        return text

    monkeypatch.setattr(_document, "_serialise", validating_serialise)
    # the test's own tmp_path (same instance), read now: its directory outlives the test
    tmp: Path | None = (
        request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    )
    yield
    if tmp is None:
        return
    for path in sorted(tmp.rglob("results.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # unreadable documents are the loader tests' business
        if isinstance(doc, dict) and doc.get("schema") == SCHEMA:
            assert_valid_results(doc, str(path))
