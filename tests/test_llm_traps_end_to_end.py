"""The measurement traps, end to end: a server that sends its chat role chunk at accept,
coalesces four tokens per event and frames its events with ``\\r\\n\\r\\n`` (the reference
LLM server's ``role-prelude-early``, ``coalesce:4`` and ``crlf-framing``, all at once) is
judged exactly as the healthy server is, and the time to first token the harness reports
is the server's own first token-bearing write.

One real ``harness run llm_steady --quick`` against the trapped server (started here with
``--record-timings``), then the server's per-request timestamps (``GET /debug/timings``)
held against the run's results:

- the verdict: every check passes, the run is valid (the healthy control's verdict in the
  detection matrix, ``healthy-llm-steady``, same scenario and duration);
- every stream was counted whole, its tokens from its events' contents (four a piece),
  and its text checked against the server's oracle;
- TTFT: the client's p50 and p99 against the server's (first token-bearing write −
  arrival). A client fooled by the role chunk would read TTFT ≈ the accept (~1 ms, a
  whole event's time too early); one fooled by the framing would see no event at all. The
  client's figure counts from the intended send, the server's from its arrival: the client
  may only be later, by its dispatch and the trip in, never by an event's time;
- TPOT: the client's p50 against the server's (last − first token write) / (tokens − 1).

The record-level proofs of each trap alone are in tests/test_stream_http.py and
tests/test_sse.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from harness.analysis import hdr
from harness.testing.server import http_status, start_server, wait_until

REPO = Path(__file__).resolve().parent.parent
TRAPS = ("role-prelude-early", "coalesce:4", "crlf-framing")
TOKENS_PER_EVENT = 4


def _server_figures(records: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per streamed request, from the server's own timestamps (ms): TTFT (first event
    carrying tokens − arrival), TPOT ((last − first token write) / (tokens − 1)) and the
    gap between consecutive token events."""
    ttft, tpot, gaps = [], [], []
    for r in records:
        if not r["stream"]:
            continue
        events = [(t, n) for t, n in r["events"] if n > 0]
        tokens = sum(n for _, n in events)
        ttft.append((events[0][0] - r["arrival_ns"]) / 1e6)
        if tokens > 1:
            tpot.append((events[-1][0] - events[0][0]) / 1e6 / (tokens - 1))
        gaps += [(b[0] - a[0]) / 1e6 for a, b in zip(events, events[1:], strict=False)]
    return {"ttft": sorted(ttft), "tpot": sorted(tpot), "gaps": sorted(gaps)}


def _quantile(values: list[float], q: float) -> float:
    return values[hdr.nearest_rank(len(values), q) - 1]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_traps_change_no_verdict_and_ttft_is_the_first_token_write(tmp_path: Path) -> None:
    faults = [a for t in TRAPS for a in ("--fault", t)]
    with start_server("--api", "openai", "--record-timings", *faults, wait_for_ready=False) as srv:
        wait_until(lambda: http_status(srv.url, "/health", timeout=1.0) == 200, timeout=30)
        out = tmp_path / "run"
        proc = subprocess.run(
            [
                sys.executable, "-m", "harness", "run", "llm_steady", "--quick",
                "--duration", "20", "--target", srv.url, "--out", str(out),
                "--retry-invalid", "2",
            ],
            cwd=REPO, capture_output=True, text=True, timeout=200,
        )  # fmt: skip
        with urllib.request.urlopen(f"{srv.url}/debug/timings", timeout=10) as answer:
            records = json.loads(answer.read())

    doc = json.loads((out / "results.json").read_text())
    (sc,) = doc["scenarios"]
    verdicts = {c["id"]: (c["passed"], c.get("detail")) for c in sc["checks"]}
    assert proc.returncode == 0 and doc["verdict"] == "pass", (
        verdicts,
        sc.get("validity"),
        proc.stdout[-1500:] + proc.stderr[-1500:],
    )
    assert all(passed for passed, _ in verdicts.values()), verdicts
    assert not sc.get("validity"), sc["validity"]

    total = sc["tokens"]["by_class"]["total"]
    assert total["failed"] == total["dropped"] == 0, total
    assert total["requests"] >= 100 and total["verified"] == total["requests"], total
    assert total["goodput"]["by_problem"] == {}, total

    server = _server_figures(records)
    # the server keeps its last 2,000 records: this run's streams, every one of them
    assert len(server["ttft"]) >= total["requests"]
    # coalesced: four tokens an event, each event's gap about four decode steps
    event_ms = _quantile(server["gaps"], 0.5)
    figures = {
        "event_ms_p50": round(event_ms, 2),
        "client_ttft": {q: total["ttft_ms"][f"p{q}_ms"] for q in (50, 99)},
        "server_ttft": {q: round(_quantile(server["ttft"], q / 100), 2) for q in (50, 99)},
        "client_tpot_p50": total["tpot_ms"]["p50_ms"],
        "server_tpot_p50": round(_quantile(server["tpot"], 0.5), 2),
    }
    print("traps end to end:", json.dumps(figures))
    for q in (50, 99):
        client, srv_q = figures["client_ttft"][q], figures["server_ttft"][q]
        # never earlier than the server's first token write (the role chunk at accept
        # would make it ~an event earlier), later only by the trip in: a tenth of an
        # event's time is ~20 ms, ten times the timing error measured at low load
        assert srv_q - 1.0 <= client <= srv_q + event_ms / 10, (q, figures)
    assert abs(figures["client_tpot_p50"] - figures["server_tpot_p50"]) <= event_ms / 40, figures
