"""Replay a token scenario's workload through the reference LLM engine on a virtual clock:
what its cost model predicts for the stream checks, over many seeded arrival schedules,
in seconds and without a server.

    python bench/llm_engine_replay.py [SCENARIO] [--fault NAME[:PARAM] ...] [--schedules 20]
        [--mode quick|full]

The scenario's ``[llm]`` plan (the same lengths and groups a run sends) arrives as open-
loop Poisson arrivals at each stage's rate (schedule *k* seeded with *k*); the engine
(``harness_reference_server.llm.engine.Engine``, the server's defaults plus ``--fault``'s
behaviours) schedules and commits each step at its modelled end, never sleeping. Per
schedule it prints, over the streams sent in the last stage: how many were answered, the
p99 of each stream's longest gap between tokens (``llm.stall``), TTFT p99 and TPOT p99
(nearest rank, over the answered streams), the preemptions in the run, and how many
of the stage's requests a full waiting queue refused (a 429; the harness's p99 checks
count those as over their bound).

What it leaves out: HTTP, the client, the step loop's timer error and another tenant's
CPU — a real run's figures are these plus a few milliseconds (docs/scenarios.md compares
them for llm_shared_prefix). Arrival order is Poisson like the scenario's, but not the
run's own schedule.
"""

from __future__ import annotations

import argparse
import math
import random

from harness.load.llm_workload import build_plan, config_from_table
from harness.load.scenario import load_scenario
from harness_reference_server.llm.config import LLMConfig
from harness_reference_server.llm.engine import Engine, QueueFull
from harness_reference_server.llm.faults import parse_llm_faults
from harness_reference_server.llm.sequence import Sequence


class _Tokens:
    """The engine observer: each sequence's token times and the preemptions."""

    def __init__(self) -> None:
        self.times: dict[int, list[float]] = {}
        self.preemptions = 0

    def on_step(self, *_: object) -> None: ...
    def on_prefix_lookup(self, *_: object) -> None: ...
    def on_finish(self, *_: object) -> None: ...

    def on_preemption(self) -> None:
        self.preemptions += 1

    def on_token(self, seq: Sequence, now: float, first: bool) -> None:
        self.times.setdefault(id(seq), []).append(now)


def _p99(values: list[float]) -> float:
    v = sorted(values)
    return v[max(0, math.ceil(0.99 * len(v)) - 1)] if v else float("nan")


def replay(scenario: str, mode: str, faults: list[str], seed: int) -> dict[str, float]:
    sc = load_scenario(scenario, mode)  # type: ignore[arg-type]
    rng = random.Random(seed)
    arrivals: list[float] = []
    judged_from = sc.stages[-1].start_s
    for st in sc.stages:
        rate = float(st.rate.value) if st.rate is not None else 0.0
        t = st.start_s
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= st.end_s:
                break
            arrivals.append(t)
    table = dict(sc.llm or {})
    table["requests"] = len(arrivals)
    table["seed"] = seed
    plan = build_plan(config_from_table(table, scenario))
    heads = {}
    if plan["workload"] == "shared_prefix":
        heads = {
            g: [rng.randrange(1, 1 << 30) for _ in range(plan["prefix_tokens"])]
            for g in range(plan["groups"])
        }
    engine_cfg = LLMConfig(faults=parse_llm_faults(faults)).engine_config()
    clock = [0.0]
    obs = _Tokens()
    engine = Engine(engine_cfg, clock=lambda: clock[0], observer=obs)
    seqs: list[tuple[float, Sequence]] = []
    for at, entry in zip(arrivals, plan["requests"], strict=False):
        if plan["workload"] == "shared_prefix":
            suffix, out, group = entry
            ids = heads[group] + [rng.randrange(1, 1 << 30) for _ in range(suffix)]
        else:
            prompt, out = entry[0], entry[1]
            ids = [rng.randrange(1, 1 << 30) for _ in range(prompt)]
        seqs.append((at, Sequence(ids, rng.randbytes(8), out, ignore_eos=True)))
    refused: set[int] = set()

    def submit(seq: Sequence) -> None:
        try:
            engine.submit(seq)
        except QueueFull:  # answered 429 by the server
            refused.add(id(seq))

    i = 0
    while i < len(seqs) or not engine.idle:
        if engine.idle:
            clock[0] = max(clock[0], seqs[i][0])
        step = None
        while True:
            while i < len(seqs) and seqs[i][0] <= clock[0]:
                now = clock[0]
                clock[0] = seqs[i][0]
                submit(seqs[i][1])
                clock[0] = now
                i += 1
            if step is not None:
                break
            step = engine.schedule()
            end = clock[0] + step.seconds
            while i < len(seqs) and seqs[i][0] <= end:  # arrivals during the step
                clock[0] = seqs[i][0]
                submit(seqs[i][1])
                i += 1
            clock[0] = end
        engine.commit(step, clock[0])
    gaps, ttft, tpot = [], [], []
    judged_refused = 0
    for at, seq in seqs:
        if at < judged_from:
            continue
        if id(seq) in refused:
            judged_refused += 1
            continue
        ts = obs.times.get(id(seq), [])
        if not ts:
            continue
        ttft.append(ts[0] - at)
        if len(ts) > 1:
            tpot.append((ts[-1] - ts[0]) / (len(ts) - 1))
            gaps.append(max(b - a for a, b in zip(ts, ts[1:], strict=False)))
    return {
        "streams": len(ttft),
        "stall_p99_ms": _p99(gaps) * 1e3,
        "ttft_p99_ms": _p99(ttft) * 1e3,
        "tpot_p99_ms": _p99(tpot) * 1e3,
        "preemptions": obs.preemptions,
        "refused": judged_refused,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", nargs="?", default="llm_shared_prefix")
    ap.add_argument("--fault", action="append", default=[], help="NAME[:PARAM], repeatable")
    ap.add_argument("--schedules", type=int, default=20)
    ap.add_argument("--mode", choices=("quick", "full"), default="quick")
    a = ap.parse_args()
    print(f"{a.scenario} --{a.mode}, faults: {', '.join(a.fault) or 'none'}")
    print("schedule  streams  stall p99 ms  TTFT p99 ms  TPOT p99 ms  preemptions  refused")
    rows = []
    for k in range(1, a.schedules + 1):
        r = replay(a.scenario, a.mode, a.fault, k)
        rows.append(r)
        print(
            f"{k:8d}  {r['streams']:7d}  {r['stall_p99_ms']:12.0f}  {r['ttft_p99_ms']:11.0f}"
            f"  {r['tpot_p99_ms']:11.1f}  {r['preemptions']:11d}  {r['refused']:7d}"
        )
    for key in ("stall_p99_ms", "ttft_p99_ms", "tpot_p99_ms"):
        v = sorted(r[key] for r in rows)
        print(f"{key}: min {v[0]:.0f}, median {v[len(v) // 2]:.0f}, max {v[-1]:.0f}")
    print(f"schedules with a preemption: {sum(r['preemptions'] > 0 for r in rows)} of {len(rows)}")


if __name__ == "__main__":
    main()
