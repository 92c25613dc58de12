"""GuideLLM beside the harness: the same offered load on the same reference LLM server,
measured by each, with the server's own per-request timestamps as the referee.

    flock /tmp/harness-cpu.lock python bench/guidellm_compare.py [--rate 8] [--seconds 30]
        [--arrival constant|poisson] [--guidellm-venv /tmp/harness-guidellm-venv]

GuideLLM (PyPI ``guidellm``) lives in a venv of its own (``--guidellm-venv``), never in
the harness's. It needs a Hugging Face tokenizer for its synthetic prompts; none can be
downloaded here, so the byte-level BPE tokenizer of ``tests/servers/build_tiny_llama.py``
(trained on this repository's docs) is built into ``--tokenizer-dir`` by the GuideLLM
venv's python when that directory has no ``tokenizer.json``.

One reference LLM server (``python -m harness_reference_server --api openai
--record-timings``, defaults otherwise) is started and stopped by its pid. Against it,
one after the other (never together: 2 cores):

  1. ``guidellm run`` at ``--rate`` req/s (``--arrival``: GuideLLM's ``constant`` or
     ``poisson`` profile) for ``--seconds``, chat streams of 32-96 prompt tokens (its
     tokenizer's) and 16-48 output tokens, uniform, ``ignore_eos``; its JSON report is
     kept under ``--out``;
  2. ``harness run`` of a scenario written under ``--out``: ``llm_steady``'s workload
     (the same lengths, the reference server's tokenizer for the prompts) in one stage
     of ``--seconds`` at ``--rate`` req/s with the same ``--arrival``.

Between and after the runs the server's ``GET /debug/timings`` is read, so every
request the server saw is attributed to the run that sent it; the last reading is kept
as ``server_timings.json`` under ``--out``.

Prints one table: requests, TTFT, inter-token latency and TPOT p50/p99, output tokens/s,
each as GuideLLM reports it, as GuideLLM's own per-request records give it under the
harness's definitions (TTFT from the intended send time, per-request inter-token
latency unweighted), as the harness reports it, and as the server's timestamps give it
for each run's requests (TTFT = first token event written - request arrival; TPOT =
(last token event - first) / (tokens - 1); gaps between token events).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.testing.server import http_status, start_server, wait_until  # noqa: E402

PROMPT = (32, 96)  # tokens, uniform: llm_steady's [llm] input
OUTPUT = (16, 48)  # tokens, uniform: llm_steady's [llm] output

SCENARIO = """\
name = "guidellm_beside"
description = "llm_steady's workload in one stage, for bench/guidellm_compare.py"
defined_by = ["llm.ttft_p99", "llm.tpot_p99", "llm.stream_integrity", "llm.goodput"]

[load]
protocol = "openai"
mode = "open"
arrival = "{arrival}"
request_timeout_s = 60
calibrate = false

[llm]
workload = "synthetic"
input = "uniform:min={p0},max={p1}"
output = "uniform:min={o0},max={o1}"

[[stages]]
name = "steady"
duration_s = {seconds}
rate = {rate}

[checks]
"llm.ttft_p99" = {{ stage = "steady" }}
"llm.tpot_p99" = {{ stage = "steady" }}
"llm.stream_integrity" = {{}}
"llm.goodput" = {{ stage = "steady" }}
"""


def pct(values: list[float], q: float) -> float | None:
    """The q-th percentile, nearest rank (the smallest value with >= q % at or below it)."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q, method="inverted_cdf"))


def run_group(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float) -> int:
    """Run ``cmd`` in a process group of its own, its output to ``log``; the group is
    killed if it outlives ``timeout_s`` (GuideLLM starts worker processes)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError(f"{cmd[0]} ran over {timeout_s:.0f} s; log: {log}") from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def ensure_tokenizer(python: Path, out: Path) -> None:
    """Build the tiny BPE tokenizer into ``out`` with GuideLLM's python, unless present."""
    if (out / "tokenizer.json").exists():
        return
    out.mkdir(parents=True, exist_ok=True)
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "import build_tiny_llama as b; b.build_tokenizer(Path(sys.argv[2]))"
    )
    subprocess.run(
        [str(python), "-c", code, str(REPO / "tests" / "servers"), str(out)],
        check=True,
        timeout=300,
    )


def server_records(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/debug/timings", timeout=10) as r:
        return json.loads(r.read())


def referee(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The server's view of a run's streams: TTFT from arrival, TPOT, token-event gaps
    (over the streams given), and every token it wrote for the run over the span from the
    run's first arrival to its last token event (``all_records``: cut streams included)."""
    ttft, tpot, gaps, prompt = [], [], [], []
    for rec in records:
        events = [(t, n) for t, n in rec["events"] if n > 0]
        if not rec.get("stream") or not events:
            continue
        n = sum(k for _, k in events)
        prompt.append(rec["prompt_tokens"])
        ttft.append((events[0][0] - rec["arrival_ns"]) / 1e6)
        if n >= 2:
            tpot.append((events[-1][0] - events[0][0]) / 1e6 / (n - 1))
        gaps += [(b[0] - a[0]) / 1e6 for a, b in zip(events, events[1:], strict=False)]
    return {"requests": len(ttft), "ttft": ttft, "tpot": tpot, "itl": gaps, "prompt": prompt}


def arrivals(all_records: list[dict[str, Any]]) -> str:
    """The offered load as the server saw it: rate, coefficient of variation of the gaps
    (Poisson 1, constant 0) and the most arrivals in one second."""
    t = np.sort(np.asarray([r["arrival_ns"] for r in all_records], dtype=float)) / 1e9
    if len(t) < 3:
        return "-"
    gaps = np.diff(t)
    peak = int(np.max(np.searchsorted(t, t + 1.0) - np.arange(len(t))))
    rate = (len(t) - 1) / (t[-1] - t[0])
    return f"{rate:.2f} req/s, gap CV {gaps.std() / gaps.mean():.2f}, at most {peak} in 1 s"


def server_tokens_per_s(all_records: list[dict[str, Any]]) -> float | None:
    """Every token the server wrote for a run / (its last token event - first arrival)."""
    events = [t for r in all_records for t, n in r["events"] if n > 0]
    tokens = sum(n for r in all_records for _, n in r["events"])
    if not events:
        return None
    span_ns = max(events) - min(r["arrival_ns"] for r in all_records)
    return tokens / (span_ns / 1e9)


def ttft_split(report: Path, records: list[dict[str, Any]]) -> str:
    """Where GuideLLM's TTFT exceeds the server's, per request matched by response id:
    the two clocks aligned on the request whose send-to-arrival was shortest, the excess
    split into send -> server arrival and first write -> GuideLLM's read."""
    srv = {r["id"]: r for r in records}
    rows = []
    for r in json.loads(report.read_text())["benchmarks"][0]["requests"]["successful"]:
        t, s = r["info"]["timings"], srv.get(r["response_id"])
        events = [e for e in s["events"] if e[1] > 0] if s else []
        if events and t["request_start"] and t["first_token_iteration"]:
            rows.append(
                (t["request_start"], t["first_token_iteration"], s["arrival_ns"] / 1e9,
                 events[0][0] / 1e9)
            )  # fmt: skip
    if not rows:
        return "no GuideLLM request matched a server record"
    a = np.asarray(rows)
    excess = (a[:, 1] - a[:, 0]) - (a[:, 3] - a[:, 2])
    ingress = (a[:, 2] - a[:, 0]) - np.min(a[:, 2] - a[:, 0])
    egress = excess - ingress

    def q(x: np.ndarray) -> str:
        return f"{1e3 * pct(list(x), 50):.1f} / {1e3 * pct(list(x), 99):.1f}"

    return (
        f"GuideLLM's TTFT - the server's, p50 / p99 ms: {q(excess)} over {len(a)} requests; "
        f"of it send -> server arrival {q(ingress)}, first write -> read {q(egress)}"
    )


def guidellm_cmd(args: argparse.Namespace, url: str, report: Path) -> list[str]:
    data = (
        f"kind=synthetic_text,prompt_tokens={sum(PROMPT) // 2},prompt_tokens_min={PROMPT[0]},"
        f"prompt_tokens_max={PROMPT[1]},output_tokens={sum(OUTPUT) // 2},"
        f"output_tokens_min={OUTPUT[0]},output_tokens_max={OUTPUT[1]}"
    )
    return [
        str(args.guidellm_venv / "bin" / "guidellm"),
        "run",
        "--backend",
        f"kind=openai_http,target={url}",
        "--profile",
        f"kind={args.arrival},rate={args.rate}",
        "--constraint",
        f"kind=max_duration,seconds={args.seconds}",
        "--data",
        data,
        "--tokenizer",
        f"kind=huggingface_auto,model={args.tokenizer_dir}",
        "--output",
        f"kind=json,path={report}",
        "--disable-console-interactive",
    ]


def read_guidellm(report: Path) -> dict[str, Any]:
    """GuideLLM's own figures, and its per-request records re-read with our definitions."""
    bench = json.loads(report.read_text())["benchmarks"][0]
    m = bench["metrics"]

    def p(name: str, q: str) -> float:
        return m[name]["successful"]["percentiles"][q]

    done = bench["requests"]["successful"]
    timings = [r["info"]["timings"] for r in done]
    ttft_intended = [
        1e3 * (t["first_token_iteration"] - t["targeted_start"])
        for t in timings
        if t["first_token_iteration"] and t["targeted_start"]
    ]
    itl_unweighted = [
        r["inter_token_latency_ms"] for r in done if r.get("inter_token_latency_ms") is not None
    ]
    lateness = [1e3 * (t["request_start"] - t["targeted_start"]) for t in timings]
    sent = done + (bench["requests"]["incomplete"] or [])
    starts = sorted(
        r["info"]["timings"]["targeted_start"]
        for r in sent
        if r["info"]["timings"]["request_start"] is not None
    )
    return {
        "completed": m["request_totals"]["successful"],
        "incomplete": m["request_totals"]["incomplete"],
        "errored": m["request_totals"]["errored"],
        "ttft": (p("time_to_first_token_ms", "p50"), p("time_to_first_token_ms", "p99")),
        "itl": (p("inter_token_latency_ms", "p50"), p("inter_token_latency_ms", "p99")),
        "tpot": (p("time_per_output_token_ms", "p50"), p("time_per_output_token_ms", "p99")),
        "out_tps": m["output_tokens_per_second"]["total"]["mean"],
        "ttft_intended": (pct(ttft_intended, 50), pct(ttft_intended, 99)),
        "itl_unweighted": (pct(itl_unweighted, 50), pct(itl_unweighted, 99)),
        "lateness_ms": (pct(lateness, 50), pct(lateness, 99)),
        "window_s": bench["duration"],
        "sent_rate": (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else None,
        "ids": {r["response_id"] for r in done},
    }


def read_harness(results: Path, seconds: float) -> dict[str, Any]:
    scenario = json.loads(results.read_text())["scenarios"][0]
    steady = scenario["tokens"]["by_stage"]["classes"]["steady"]

    def p(name: str) -> tuple[float, float]:
        return steady[name]["p50_ms"], steady[name]["p99_ms"]

    return {
        "requests": steady["requests"],
        "ok": steady["ok"],
        "failed": steady["failed"],
        "ttft": p("ttft_ms"),
        "itl": p("itl_ms"),
        "tpot": p("tpot_ms"),
        "out_tps": steady["tokens_out"] / seconds,
        "verdict": scenario.get("verdict"),
    }


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def pair(v: tuple[float | None, float | None]) -> str:
    return f"{fmt(v[0])} / {fmt(v[1])}"


def table(g: dict[str, Any], h: dict[str, Any], sg: dict[str, Any], sh: dict[str, Any]) -> str:
    def s2(s: dict[str, Any], k: str) -> str:
        return pair((pct(s[k], 50), pct(s[k], 99)))

    def mean(xs: list[float]) -> str:
        return fmt(float(np.mean(xs))) if xs else "-"

    rows = [
        (
            "| figure | GuideLLM reports | GuideLLM's records, the harness's definition "
            "| server, GuideLLM's requests | harness reports | server, harness's requests |"
        ),
        "|---|---|---|---|---|---|",
        (
            f"| requests | {g['completed']} completed, {g['incomplete']} cut at the end, "
            f"{g['errored']} errored | | {sg['requests']} completed | {h['requests']} "
            f"({h['ok']} ok, {h['failed']} failed) | {sh['requests']} |"
        ),
        f"| arrivals at the server | | | {sg['arrivals']} | | {sh['arrivals']} |",
        (
            f"| prompt tokens, the server's count, mean | | | {mean(sg['prompt'])} | "
            f"| {mean(sh['prompt'])} |"
        ),
        (
            f"| TTFT p50 / p99 ms | {pair(g['ttft'])} (from its send) | {pair(g['ttft_intended'])}"
            f" (from the intended send) | {s2(sg, 'ttft')} (from arrival) | {pair(h['ttft'])} "
            f"(from the intended send) | {s2(sh, 'ttft')} (from arrival) |"
        ),
        (
            f"| ITL p50 / p99 ms | {pair(g['itl'])} ((last - first) / (n - 1) per request, "
            "token-weighted) | not kept (only the first and last token times are) "
            f"| {s2(sg, 'itl')} (event gaps) | {pair(h['itl'])} (event gaps, pooled) "
            f"| {s2(sh, 'itl')} (event gaps) |"
        ),
        (
            f"| TPOT p50 / p99 ms | {pair(g['tpot'])} ((last - send) / n, TTFT included, "
            f"token-weighted) | {pair(g['itl_unweighted'])} (its ITL per request, unweighted) "
            f"| {s2(sg, 'tpot')} | {pair(h['tpot'])} ((last - first) / (n - 1) per request) "
            f"| {s2(sh, 'tpot')} |"
        ),
        (
            f"| output tokens/s | {fmt(g['out_tps'])} (tokens in its window / window) | "
            f"| {fmt(sg['tps'])} | {fmt(h['out_tps'])} (tokens of the streams sent / stage) "
            f"| {fmt(sh['tps'])} |"
        ),
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=8.0, help="requests/s offered by both")
    ap.add_argument("--seconds", type=int, default=30, help="length of each run")
    ap.add_argument("--arrival", choices=("constant", "poisson"), default="constant")
    ap.add_argument("--guidellm-venv", type=Path, default=Path("/tmp/harness-guidellm-venv"))
    ap.add_argument("--tokenizer-dir", type=Path, default=Path("/tmp/harness-guidellm-tok"))
    ap.add_argument("--out", type=Path, default=Path("/tmp/harness-guidellm-compare"))
    args = ap.parse_args(argv)

    if not (args.guidellm_venv / "bin" / "guidellm").exists():
        print(f"no guidellm in {args.guidellm_venv}: python -m venv it, pip install guidellm")
        return 2
    ensure_tokenizer(args.guidellm_venv / "bin" / "python", args.tokenizer_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    report = args.out / "guidellm.json"
    report.unlink(missing_ok=True)
    scenario = args.out / "guidellm_beside.toml"
    scenario.write_text(
        SCENARIO.format(arrival=args.arrival, p0=PROMPT[0], p1=PROMPT[1], o0=OUTPUT[0],
                        o1=OUTPUT[1], seconds=args.seconds, rate=args.rate)
    )  # fmt: skip
    server_args = ("--api", "openai", "--record-timings", "--timings-keep", "100000")
    with start_server(*server_args, wait_for_ready=False) as srv:
        wait_until(lambda: http_status(srv.url, "/health", timeout=1.0) == 200, timeout=30)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        g_cmd = guidellm_cmd(args, srv.url, report)
        rc = run_group(g_cmd, env, args.out / "guidellm.log", args.seconds + 300)
        if rc != 0 or not report.exists():
            print(f"guidellm exited {rc}; log: {args.out / 'guidellm.log'}")
            return 1
        after_g = server_records(srv.url)
        h_cmd = [sys.executable, "-m", "harness", "run", str(scenario), "--target", srv.url,
                 "--duration", str(args.seconds), "--out", str(args.out / "harness")]  # fmt: skip
        run_group(h_cmd, dict(os.environ), args.out / "harness.log", args.seconds + 300)
        results = args.out / "harness" / "guidellm_beside" / "results.json"
        if not results.exists():
            print(f"harness run wrote no results; log: {args.out / 'harness.log'}")
            return 1
        after_h = server_records(srv.url)
    (args.out / "server_timings.json").write_text(json.dumps(after_h))

    g = read_guidellm(report)
    h = read_harness(results, args.seconds)
    h["seconds"] = args.seconds
    seen = {r["id"] for r in after_g}
    sg = referee([r for r in after_g if r["id"] in g["ids"]])
    sg["tps"] = server_tokens_per_s(after_g)
    sg["arrivals"] = arrivals(after_g)
    mine = [r for r in after_h if r["id"] not in seen]
    sh = referee(mine)
    sh["tps"] = server_tokens_per_s(mine)
    sh["arrivals"] = arrivals(mine)
    print(f"conditions: {platform.node()}, {os.cpu_count()} cores; reference LLM server "
          f"at its defaults (+ --record-timings); {args.arrival} arrivals at {args.rate:g} "
          f"req/s for {args.seconds} s each, one run after the other; prompts "
          f"{PROMPT[0]}-{PROMPT[1]} tokens, outputs {OUTPUT[0]}-{OUTPUT[1]}, uniform, "
          "ignore_eos")  # fmt: skip
    print(f"guidellm: {' '.join(g_cmd)}")
    print(f"harness:  {' '.join(h_cmd)}")
    print(f"GuideLLM's measured window {g['window_s']:.1f} s; its completed requests were "
          f"sent at {fmt(g['sent_rate'])} req/s; its lateness (send - intended) p50 / p99 "
          f"{pair(g['lateness_ms'])} ms; harness verdict {h['verdict']}")  # fmt: skip
    print(ttft_split(report, after_g))
    print("the server's latency figures cover GuideLLM's completed requests and all of the "
          "harness's; its tokens/s every token it wrote for the run")  # fmt: skip
    print()
    print(table(g, h, sg, sh))
    return 0


if __name__ == "__main__":
    sys.exit(main())
