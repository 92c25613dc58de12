"""Multi-turn conversations, end to end: ``harness run llm_multi_turn --quick`` against the
reference LLM server (started here with ``--record-timings``), every turn built from the
answer the server streamed for the turn before.

- the verdict: every check passes, the run is valid;
- every turn's stream was held to the server's oracle for exactly the prompt sent (the
  answer carried over included) and none was wrong: a turn built from anything but the
  text the server sent would be answered with other tokens;
- the server saw what the harness counted: as many streamed requests, the same prompt
  tokens in all (the harness counts each prompt exactly with the server's tokenizer);
- the later turns carried the history: prompts well past what one turn adds alone, and
  the server's prefix cache served much of every prompt from the turns before.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.load.llm_workload import config_from_table
from harness.load.scenario import load_scenario
from harness.testing.server import http_status, start_server, wait_until

REPO = Path(__file__).resolve().parent.parent


def _counter(url: str, name: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_multi_turn_run_carries_each_answer_into_the_next_turn(tmp_path: Path) -> None:
    cfg = config_from_table(dict(load_scenario("llm_multi_turn", "quick").llm or {}), "t")
    assert cfg.input.high is not None
    with start_server("--api", "openai", "--record-timings", wait_for_ready=False) as srv:
        wait_until(lambda: http_status(srv.url, "/health", timeout=1.0) == 200, timeout=30)
        out = tmp_path / "run"
        proc = subprocess.run(
            [
                sys.executable, "-m", "harness", "run", "llm_multi_turn", "--quick",
                "--target", srv.url, "--out", str(out), "--retry-invalid", "2",
            ],
            cwd=REPO, capture_output=True, text=True, timeout=200,
        )  # fmt: skip
        with urllib.request.urlopen(f"{srv.url}/debug/timings", timeout=10) as answer:
            records = json.loads(answer.read())
        hits = _counter(srv.url, "vllm:prefix_cache_hits_total")
        queries = _counter(srv.url, "vllm:prefix_cache_queries_total")
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    doc = json.loads((out / "results.json").read_text())
    (sc,) = doc["scenarios"]
    assert doc["verdict"] == "pass", tail
    total = sc["tokens"]["by_stage"]["total"]
    # every turn whole and true to the oracle
    assert total["requests"] == total["ok"] == total["verified"] > 100, total
    assert total["wrong"] == 0 and total["conforming"] == total["ok"], total
    # the server saw each of them, with the prompt the harness counted
    streamed = [r for r in records if r["stream"]]
    assert len(streamed) == total["requests"], (len(streamed), total["requests"])
    assert sum(r["prompt_tokens"] for r in streamed) == total["tokens_in"]
    # later turns carry the conversation: longer prompts than one turn adds alone, most of
    # each prompt already in the server's prefix cache
    prompts = sorted(r["prompt_tokens"] for r in streamed)
    assert prompts[len(prompts) // 2] > cfg.input.high, prompts
    assert prompts[-1] > 3 * cfg.input.high, prompts
    assert queries > 0 and hits / queries > 0.4, (hits, queries)
