"""A master and two workers on loopback: the master merges both workers' recordings."""

from __future__ import annotations

import subprocess

import pytest

from harness.errors import ExitCode
from harness.testing.locust_runs import (
    MECHANICS_CHECKLIST,
    REPO,
    SCENARIOS,
    balanced,
    hist,
    locust_cmd,
    scenario_result,
    stop,
)
from harness.testing.server import free_port, start_server

# These load-mechanics scenarios list no check of their own (only the harness's
# bookkeeping, accounting.balanced): they judge nothing about the server, which is exit 4,
# never a pass (docs/checks.md, "Verdict").
NOT_JUDGED = ExitCode.NOT_JUDGED

pytestmark = pytest.mark.slow


def test_master_merges_two_workers(tmp_path) -> None:
    port = free_port()
    procs: list[subprocess.Popen] = []
    with start_server("--model", "sim", "--sim-base-ms", "2", "--sim-item-ms", "0.1") as srv:
        try:
            master = subprocess.Popen(
                locust_cmd(
                    "--master",
                    "--headless",
                    "--only-summary",
                    "--expect-workers",
                    "2",
                    "--master-bind-host",
                    "127.0.0.1",
                    "--master-bind-port",
                    str(port),
                    "--host",
                    srv.url,
                    "--scenario",
                    str(SCENARIOS / "short_constant.toml"),
                    "--out",
                    str(tmp_path),
                    "--no-sample",
                    "--checklist",
                    MECHANICS_CHECKLIST,
                ),
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            procs.append(master)
            for _ in range(2):
                # workers get the harness options from the master with the plan
                procs.append(
                    subprocess.Popen(
                        locust_cmd(
                            "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)
                        ),
                        cwd=REPO,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            out, _ = master.communicate(timeout=120)
            for w in procs[1:]:
                w.wait(30)
        finally:
            for p in reversed(procs):
                stop(p)
    assert master.returncode == NOT_JUDGED, out[-3000:]
    sc = scenario_result(tmp_path)
    c = sc["counters"]
    assert sc["load"]["workers"] == 2
    per_worker = sc["load"]["scheduled_by_worker"]
    assert len(per_worker) == 2
    # the constant schedule is dealt round-robin: the workers' shares differ by ≤ 1 per stage
    a, b = per_worker.values()
    assert abs(a - b) <= 2 and a + b == 540
    assert c["scheduled"] == 540 and balanced(c) and c["in_flight"] == 0
    ok = c["ok"]
    assert ok >= 0.5 * 540, c  # most of it, even on a starved shared box
    # merged histograms hold both workers' answers; windows summarised across both
    assert hist(sc["latency_hdr"]).get_total_count() == ok
    assert sum(hist(v["latency_hdr"]).get_total_count() for v in sc["by_class"].values()) == ok
    assert sum(r["ok"] for r in sc["windows"]["rows"]) == ok
    assert sum(r["scheduled"] for r in sc["windows"]["rows"]) == 540
    assert sc["integrity"]["checked"] == ok and sc["integrity"]["cross_wired"] == 0
    assert not sc["partial"]
