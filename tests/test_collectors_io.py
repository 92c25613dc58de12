"""Tick schedule on a fake clock, files → read_samples, `harness sample` end to end,
and the /metrics scraper against a real Prometheus endpoint."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from harness.cli import main
from harness.collectors import read_samples
from harness.collectors.loop import TickLoop
from harness.collectors.metrics import MetricsScraper, ScrapeConfig, parse_metrics, series_key
from harness.errors import ResultFormatError
from harness.sut import free_port

REPO = Path(__file__).resolve().parents[1]


class FakeClock:
    """Monotonic time that only moves when waited on (plus injected work time)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def wait(self, stop: threading.Event, seconds: float) -> None:
        self.now += seconds


def test_tick_loop_schedule_lateness_and_missed_ticks():
    clock = FakeClock()
    loop = TickLoop(1.0, clock=clock, wall=lambda: 0.0, wait=clock.wait)
    seen = []

    def on_tick(t: float, late: float) -> None:
        seen.append((round(t, 3), round(late, 3)))
        if len(seen) == 2:
            clock.now += 0.3  # slow work after tick 2: tick 3 (due at 3.0) is still on time
        if len(seen) == 3:
            clock.now += 2.5  # a stall to 5.5: tick 4 is missed, tick 5 is taken 0.5 s late

    stats = loop.run(on_tick, duration_s=8.0)
    assert seen[:3] == [(1.0, 0.0), (2.0, 0.0), (3.0, 0.0)]
    assert stats.missed == 1 and seen[3] == (5.5, 0.5)
    assert seen[4:] == [(6.0, 0.0), (7.0, 0.0), (8.0, 0.0)]
    assert stats.ticks == 7 and stats.max_late_s == pytest.approx(0.5)


def test_tick_loop_stops_on_event():
    clock = FakeClock()
    stop = threading.Event()
    loop = TickLoop(0.5, clock=clock, wait=clock.wait, stop=stop)
    ticks = []
    loop.run(lambda t, late: (ticks.append(t), len(ticks) == 3 and stop.set()))
    assert len(ticks) == 3


def test_parse_metrics_selects_series():
    text = textwrap.dedent(
        """
        # HELP queue_depth Requests waiting
        # TYPE queue_depth gauge
        queue_depth{model="mlp"} 7
        # TYPE batch_size histogram
        batch_size_bucket{le="1.0"} 2
        batch_size_bucket{le="+Inf"} 5
        batch_size_count 5
        batch_size_sum 12
        # TYPE requests_total counter
        requests_total{code="200",model="mlp"} 41
        # TYPE other_thing gauge
        other_thing 1
        """
    )
    got = parse_metrics(text, re.compile("queue|batch|request"), re.compile("_bucket$"))
    assert ("queue_depth", 'model="mlp"', 7.0) in got
    assert ("requests_total", 'code="200",model="mlp"', 41.0) in got
    assert ("batch_size_count", "", 5.0) in got
    assert not any(n.endswith("_bucket") or n == "other_thing" for n, _, _ in got)
    assert series_key("queue_depth", 'model="mlp"') == 'queue_depth{model="mlp"}'


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def test_read_samples_builds_sections(tmp_path):
    from harness.collectors.process import PROCESS_COLUMNS, THREAD_COLUMNS

    (tmp_path / "sampler.json").write_text(
        json.dumps({"pid": 9, "interval_s": 1.0, "ticks": 3, "missed_ticks": 1})
    )
    _write_csv(
        tmp_path / "process.csv",
        PROCESS_COLUMNS,
        [
            [t, 1e9 + t, 0.001, 1, 1000 * t, "" if t != 1 else 500, "", 4, 6, 50, 40, 10, 3, 1]
            for t in (1, 2, 3)
        ],  # fmt: skip
    )
    rows = []
    for t in (1, 2, 3):
        rows.append([t, 9, 10, 111, "main", 1, 0, 0, 0.5, 1, 0, 2, 0])
        rows.append([t, 9, 11, 222, "worker", 80, 10, 0, 5, 90 + t, 1, 100, 4])
        for k in range(8):  # eight quiet threads: the top-8 cut must drop one
            rows.append([t, 9, 20 + k, 300, f"q{k}", 0, 0, 0, "", 0.1 * k, 0, 0, 0])
    _write_csv(tmp_path / "threads.csv", THREAD_COLUMNS, rows)
    _write_csv(
        tmp_path / "system.csv",
        ["t", "ts", "late_s", "cpu_pct", "cpu0_pct", "cpu1_pct", "loadgen_cpu_pct"],
        [[t, 1e9 + t, 0, 60, 30, 90, 25] for t in (1, 2, 3)],
    )
    _write_csv(
        tmp_path / "metrics.csv",
        ["t", "ts", "name", "labels", "value"],
        [[1, 1e9, "queue_depth", 'model="mlp"', 3], [2, 1e9, "queue_depth", 'model="mlp"', 5]],
    )
    out = read_samples(tmp_path)
    server = out["server"]
    assert server["pid"] == 9 and server["ticks"] == 3 and server["missed_ticks"] == 1
    assert server["series"]["t"] == [1, 2, 3]
    assert server["series"]["uss_bytes"] == [500, None, None]
    assert server["series"]["rss_bytes"] == [1000, 2000, 3000]
    top = server["threads_top"]
    assert len(top) == 8
    assert top[0]["name"] == "worker" and top[0]["tid"] == 11
    assert top[0]["cpu_pct_mean"] == 92.0 and top[0]["cpu_pct_max"] == 93.0
    assert top[0]["wait_pct_mean"] == 5.0 and top[0]["cswch_s_mean"] == 100.0
    assert top[0]["series"] == {"t": [1.0, 2.0, 3.0], "cpu_pct": [91.0, 92.0, 93.0]}
    assert "q0" not in {t["name"] for t in top}  # the quietest thread was cut
    assert next(t for t in top if t["name"] == "q7")["wait_pct_mean"] is None
    sys_series = out["system"]["series"]
    assert sys_series["per_core"] == [[30, 30, 30], [90, 90, 90]]
    assert sys_series["loadgen_cpu_pct"] == [25, 25, 25]
    assert out["metrics"]["series"] == {
        'queue_depth{model="mlp"}': {"t": [1.0, 2.0], "v": [3.0, 5.0]}
    }


def test_read_samples_missing_dir_and_empty_dir(tmp_path):
    with pytest.raises(ResultFormatError, match="does not exist"):
        read_samples(tmp_path / "nope")
    assert read_samples(tmp_path) == {"server": None, "system": None, "metrics": None}


def test_cli_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["sample", "--pid", "1", "--out", "x", "--interval", "0"])
    assert e.value.code == 2
    assert "--interval" in capsys.readouterr().err
    assert main(["sample", "--pid", "999999999", "--out", "/tmp/x"]) == 1


@pytest.mark.slow
def test_harness_sample_until_sigint_leaves_complete_files(tmp_path):
    target = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    out = tmp_path / "samples"
    sampler = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "sample",
            "--pid",
            str(target.pid),
            "--out",
            str(out),
            "--interval",
            "0.2",
            "--live",
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 30
        proc_csv = out / "process.csv"
        while time.monotonic() < deadline:
            if proc_csv.exists() and proc_csv.read_text().count("\n") >= 4:
                break
            assert sampler.poll() is None, sampler.communicate()
            time.sleep(0.05)
        sampler.send_signal(signal.SIGINT)
        stdout, stderr = sampler.communicate(timeout=30)
    finally:
        for p in (sampler, target):
            if p.poll() is None:
                p.kill()
            p.wait()
    assert sampler.returncode == 0, stderr
    meta = json.loads((out / "sampler.json").read_text())
    assert meta["running"] is False and meta["pid"] == target.pid
    rows = proc_csv.read_text().splitlines()
    assert len(rows) - 1 == meta["ticks"] >= 3
    assert proc_csv.read_text().endswith("\n")
    assert "%CPU" in stdout and "Command" in stdout  # the live table
    data = read_samples(out)
    assert data["server"]["ticks"] == meta["ticks"]
    assert max(data["server"]["series"]["cpu_pct"]) > 20  # the spinning target
    per_core = data["system"]["series"]["per_core"]
    assert len(per_core) == len(meta["cores"]["system"]) >= 1
    assert all(len(c) == meta["ticks"] for c in per_core)


PROM_CHILD = textwrap.dedent(
    """
    import sys, time
    from prometheus_client import Counter, Gauge, start_http_server
    q = Gauge("queue_depth", "Requests waiting", ["model"])
    r = Counter("requests", "Requests served", ["model"])
    start_http_server(int(sys.argv[1]), addr="127.0.0.1")
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        q.labels("mlp").set(i)
        r.labels("mlp").inc()
        time.sleep(0.02)
    """
)


@pytest.mark.slow
def test_scraper_reads_a_prometheus_endpoint(tmp_path):
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, "-c", PROM_CHILD, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        scraper = MetricsScraper(
            ScrapeConfig(url=f"http://127.0.0.1:{port}/metrics", interval_s=0.2), tmp_path
        )
        stop = threading.Event()
        scraper.start(time.monotonic(), stop)
        deadline = time.monotonic() + 20
        while scraper.scrapes < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        scraper.join(5)
        scraper.close()
    finally:
        child.kill()
        child.wait()
    assert scraper.scrapes >= 4 and scraper.errors == 0
    series = read_samples(tmp_path)["metrics"]["series"]
    q = series['queue_depth{model="mlp"}']
    assert len(q["v"]) >= 4 and q["v"] == sorted(q["v"]) and q["v"][-1] > q["v"][0]
    assert 'requests_total{model="mlp"}' in series
    assert "process_resident_memory_bytes" in series  # prometheus_client's process collector
    assert not any(k.startswith("requests_created") for k in series)


def test_scraper_records_errors_without_raising(tmp_path):
    scraper = MetricsScraper(
        ScrapeConfig(url=f"http://127.0.0.1:{free_port()}/metrics", timeout_s=0.5), tmp_path
    )
    assert scraper.scrape(0.0, 0.0) is None
    assert scraper.errors == 1 and "URLError" in (scraper.last_error or "")
    scraper.close()


def _reference_server_available() -> bool:
    try:
        import harness_reference_server  # noqa: F401
    except ImportError:
        return False
    return (REPO / "harness_reference_server" / "__main__.py").exists()


@pytest.mark.slow
@pytest.mark.skipif(
    not _reference_server_available(), reason="harness_reference_server not present"
)
def test_harness_sample_watches_the_reference_server(tmp_path):
    """`harness sample` with --metrics-url on the real reference server, under a little load."""
    import urllib.request

    from harness.sut import SutProcess

    out = tmp_path / "samples"
    cmd = [sys.executable, "-m", "harness_reference_server", "--port", "{port}", "--model", "sim"]
    with SutProcess(cmd, log_path=tmp_path / "server.log") as sut:
        sut.wait_ready(timeout=60)
        pid = sut.pid
        sampler = subprocess.Popen(
            [sys.executable, "-m", "harness", "sample", "--pid", str(pid), "--out", str(out),
             "--interval", "0.25", "--duration", "2.5", "--metrics-url", sut.url + "/metrics"],
            cwd=REPO, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            body = json.dumps(
                {
                    "inputs": [
                        {"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}
                    ]
                }  # fmt: skip
            ).encode()
            sent = 0
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                req = urllib.request.Request(
                    sut.url + "/v2/models/sim/infer", data=body,
                    headers={"Content-Type": "application/json"},
                )  # fmt: skip
                with urllib.request.urlopen(req, timeout=10) as r:
                    assert r.status == 200
                sent += 1
            _, err = sampler.communicate(timeout=60)
        finally:
            if sampler.poll() is None:
                sampler.kill()
                sampler.wait()
        assert sampler.returncode == 0, err
    data = read_samples(out)
    server = data["server"]
    assert server["pid"] == pid
    assert server["ticks"] >= 8 and max(server["series"]["threads"]) >= 2
    assert server["threads_top"] and server["threads_top"][0]["cpu_pct_mean"] > 0
    series = data["metrics"]["series"]
    ok = [k for k in series if k.startswith("refserver_requests_total") and "success" in k]
    assert ok, sorted(series)
    done = series[ok[0]]["v"]
    assert done[-1] - done[0] >= 1 and done[-1] <= sent
    assert any(k.startswith("refserver_queue_depth") for k in series)
    assert any(k.startswith("refserver_batch_size_count") for k in series)
    assert "process_resident_memory_bytes" in series


@pytest.mark.slow
def test_harness_sample_stops_when_the_target_exits(tmp_path):
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    out = tmp_path / "s"
    try:
        rc = subprocess.run(
            [sys.executable, "-m", "harness", "sample", "--pid", str(target.pid), "--out",
             str(out), "--interval", "0.2", "--duration", "60"],  # fmt: skip
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        target.kill()
        target.wait()
    assert rc.returncode == 0, rc.stderr
    meta = json.loads((out / "sampler.json").read_text())
    assert meta["target_exited"] is True and meta["duration_s"] < 30
    rss = read_samples(out)["server"]["series"]["rss_bytes"]
    assert rss and min(rss) > 0  # no zero rows once it is gone


HTTP_OK = textwrap.dedent(
    """
    import sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        def log_message(self, *a):
            pass
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


@pytest.mark.slow
def test_sampler_follows_a_restarted_server_through_its_pid_file(tmp_path):
    from harness.sut import SutProcess

    script = tmp_path / "srv.py"
    script.write_text(HTTP_OK)
    pid_file = tmp_path / "sut.pid"
    out = tmp_path / "s"
    with SutProcess([sys.executable, str(script), "{port}"], pid_file=pid_file) as sut:
        sut.wait_ready(timeout=30)
        first = sut.pid
        assert pid_file.read_text().strip() == str(first)
        sampler = subprocess.Popen(
            [sys.executable, "-m", "harness", "sample", "--pid-file", str(pid_file), "--out",
             str(out), "--interval", "0.2", "--duration", "60"],  # fmt: skip
            cwd=REPO, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (
                not (out / "process.csv").exists()
                or (out / "process.csv").read_text().count("\n") < 3
            ):
                time.sleep(0.05)
            sut.kill()
            sut.restart(ready_timeout=30)
            second = sut.pid
            rows_at_restart = (out / "process.csv").read_text().count("\n")
            # wait for ticks of the restarted server (the sampler finds it via the file)
            while (
                time.monotonic() < deadline
                and (out / "process.csv").read_text().count("\n") < rows_at_restart + 4
            ):
                time.sleep(0.05)
            sampler.send_signal(signal.SIGTERM)
            _, err = sampler.communicate(timeout=30)
        finally:
            if sampler.poll() is None:
                sampler.kill()
                sampler.wait()
    assert sampler.returncode == 0, err
    meta = json.loads((out / "sampler.json").read_text())
    assert meta["target_exited"] is False
    assert [(r["old_pid"], r["pid"]) for r in meta["retargets"]] == [(first, second)]
    assert meta["pid"] == first and meta["pid_now"] == second
    t_switch = meta["retargets"][0]["t"]
    series = read_samples(out)["server"]["series"]
    assert any(t > t_switch for t in series["t"])  # samples of the restarted server
    assert min(series["rss_bytes"]) > 0


def test_loadgen_pids_exclude_the_sut_tree():
    from harness.collectors import procfs
    from harness.collectors.run_processes import loadgen_pids

    code = textwrap.dedent(
        """
        import subprocess, sys, time
        kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
                for _ in range(2)]
        print(kids[0].pid, kids[1].pid, flush=True)
        time.sleep(30)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        sut_pid, worker_pid = map(int, parent.stdout.readline().split())
        # a pass over /proc younger than 0.5 s is shared (procfs.children_map): one an
        # earlier test made before these processes existed would not know them
        procfs.process_table(max_age_s=0.0)
        pids = loadgen_pids([parent.pid], exclude=lambda: [sut_pid])()
        assert parent.pid in pids and worker_pid in pids and sut_pid not in pids
        assert os.getpid() not in loadgen_pids([os.getpid()])()  # never the sampler itself
    finally:
        for c in psutil.Process(parent.pid).children():
            c.kill()
        parent.kill()
        parent.wait()


# Starts `harness sample --stop-with-parent` on a pid, prints the sampler's pid, then waits
# to be SIGKILLed (the harness's Locust process, as far as the sampler can tell).
_SAMPLER_PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    p = subprocess.Popen([sys.executable, "-m", "harness", "sample", "--pid", sys.argv[1],
                          "--pid-file", sys.argv[3], "--out", sys.argv[2], "--interval", "0.2",
                          "--stop-with-parent"])
    print(p.pid, flush=True)
    time.sleep(120)
    """
)


def test_harness_sample_stops_with_the_process_that_started_it(tmp_path):
    """The harness starts its sampler with --stop-with-parent: when the harness is SIGKILLed,
    the sampler (which would otherwise follow the pid file forever, waiting for a restart)
    stops within a tick or two, closes its files and says why."""
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    pid_file = tmp_path / "sut.pid"
    pid_file.write_text(str(target.pid))
    out = tmp_path / "s"
    parent = subprocess.Popen(
        [sys.executable, "-c", _SAMPLER_PARENT, str(target.pid), str(out), str(pid_file)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    sampler = None
    try:
        assert parent.stdout is not None
        sampler = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (out / "sampler.json").exists():
            time.sleep(0.1)
        time.sleep(1.0)
        assert sampler.is_running()
        parent.kill()
        parent.wait()
        sampler.wait(timeout=15)
    finally:
        for p in (parent, target):
            if p.poll() is None:
                p.kill()
                p.wait()
        if sampler is not None and sampler.is_running():
            sampler.kill()
    meta = json.loads((out / "sampler.json").read_text())
    assert meta["running"] is False and meta["parent_exited"] is True and meta["ticks"] >= 3
