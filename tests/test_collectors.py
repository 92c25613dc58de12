"""ProcessSampler against real processes the test starts: per-thread CPU and names,
agreement with pidstat, growth of a leaking child, process trees."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from harness.collectors.loop import TickLoop
from harness.collectors.process import ProcessSampler
from harness.collectors.procfs import parse_stat

# Named threads: "busy" spins, "idle" sleeps, "waker" sleeps 1 ms in a loop (context
# switches, little CPU). Prints "ready" once every thread has its name.
NAMED_THREADS = textwrap.dedent(
    """
    import sys, threading, time
    named = threading.Barrier(4)
    def name(n):
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(n)
        named.wait()
    def busy():
        name("busy")
        while True:
            pass
    def idle():
        name("idle")
        while True:
            time.sleep(0.5)
    def waker():
        name("waker")
        while True:
            time.sleep(0.001)
    for f in (busy, idle, waker):
        threading.Thread(target=f, daemon=True).start()
    named.wait()
    print("ready", flush=True)
    time.sleep(float(sys.argv[1]))
    """
)

# Grows memory, threads, open files and sockets steadily, then holds.
LEAKER = textwrap.dedent(
    """
    import os, socket, threading, time
    hold, files = [], []
    print("ready", flush=True)
    for i in range(40):
        hold.append(bytearray(1_000_000))  # touched: it shows in RSS
        files.append(open(os.devnull))
        if i % 8 == 0:
            files.extend(socket.socketpair())  # two socket fds
        if i % 4 == 0:
            threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
        time.sleep(0.05)
    time.sleep(3600)
    """
)


def _start(code: str, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.strip() == "ready", line
    return p


def _stop(p: subprocess.Popen) -> None:
    p.kill()
    p.wait()


def _run_sampler(sampler: ProcessSampler, interval: float, duration: float) -> list:
    ticks = []
    loop = TickLoop(interval)
    t0 = loop.start()
    sampler.baseline(time.monotonic() - t0)

    def on_tick(t: float, late: float) -> None:
        tick = sampler.sample(t, time.time(), late)
        ticks.append((tick, list(sampler.last_threads)))

    loop.run(on_tick, duration)
    return ticks


def test_parse_stat_with_spaces_and_parens_in_name():
    line = (
        b"42 (a (b) c) S 1 42 42 0 -1 4194560 1 0 0 0 11 7 0 0 20 0 3 0 12345 100 25 "
        + b" ".join([b"0"] * 14)
        + b" 1 0 0 0 5 0\n"
    )
    st = parse_stat(line)
    assert st.name == "a (b) c"
    assert (st.utime, st.stime, st.starttime) == (11, 7, 12345)
    assert st.processor == 1
    assert st.guest == 5


@pytest.mark.slow
def test_named_threads_cpu_names_and_cswch(tmp_path):
    p = _start(NAMED_THREADS, "30")
    try:
        proc = psutil.Process(p.pid)
        before = {t.id: t.user_time + t.system_time for t in proc.threads()}
        # switch counts read on the first 0.25 s tick at least 1 s after the last read,
        # beside a sampler that reads them every tick (in step: same tick times)
        sampler = ProcessSampler(p.pid, tmp_path, switches_every_s=1.0)
        dense = ProcessSampler(p.pid, None, switches_every_s=0.0)
        dense_ticks = []
        loop = TickLoop(0.25)
        t0 = loop.start()
        base_t = time.monotonic() - t0
        sampler.baseline(base_t)
        dense.baseline(base_t)
        ticks = []

        def on_tick(t: float, late: float) -> None:
            ticks.append((sampler.sample(t, time.time(), late), list(sampler.last_threads)))
            dense_ticks.append((dense.sample(t, time.time(), late), list(dense.last_threads)))

        loop.run(on_tick, 2.0)
        after = {t.id: t.user_time + t.system_time for t in proc.threads()}
        sampler.close()
        dense.close()
    finally:
        _stop(p)
    assert len(ticks) >= 6
    rows = [r for _, rs in ticks for r in rs]
    by_name: dict[str, list] = {}
    for r in rows:
        by_name.setdefault(r.name, []).append(r)
    assert {"busy", "idle", "waker"} <= set(by_name)
    busy = by_name["busy"]
    mean = {n: sum(r.cpu_pct for r in rs) / len(rs) for n, rs in by_name.items()}
    # the busy thread dominates; the idle one is at ~0 (shared box: no absolute figure)
    assert mean["busy"] > 10 * max(mean["idle"], 0.5)
    assert mean["idle"] < 5
    # switch counts on the switch ticks only (every row of them), none carried between
    switch_ticks = [(tick, rs) for tick, rs in ticks if tick.cswch_s is not None]
    assert 1 <= len(switch_ticks) <= 3
    for tick, rs in ticks:
        fresh = tick.cswch_s is not None
        assert all((r.cswch_s is not None) == fresh and (r.nvcswch_s is not None) == fresh
                   for r in rs)  # fmt: skip
    # the waker switches context voluntarily hundreds of times a second
    waker = [r.cswch_s for _, rs in switch_ticks for r in rs if r.name == "waker"]
    assert sum(waker) / len(waker) > 50
    # a rate over the window since the last switch tick: the same count as the per-tick
    # rates of the dense sampler over the ticks of that window
    tid = by_name["waker"][0].tid
    starts = [base_t] + [tick.t for tick, _ in switch_ticks]
    last_t, (tick, rs) = starts[-2], switch_ticks[-1]
    sparse_count = next(r.cswch_s for r in rs if r.tid == tid) * (tick.t - last_t)
    dense_count, prev_t = 0.0, base_t
    for (d, drs), (s, _) in zip(dense_ticks, ticks, strict=True):
        if last_t < d.t <= tick.t:
            dense_count += next(r.cswch_s for r in drs if r.tid == tid) * (d.t - prev_t)
        prev_t = d.t
        assert d.t == s.t
    assert sparse_count == pytest.approx(dense_count, rel=0.05)
    # CPU-seconds from the sampler's per-tick %CPU match psutil's thread times over the run
    tid = busy[0].tid
    dts = [ticks[0][0].t - 0.0] + [b[0].t - a[0].t for a, b in zip(ticks, ticks[1:], strict=False)]
    sampled_s = sum(
        r.cpu_pct / 100 * dt
        for (_, rs), dt in zip(ticks, dts, strict=True)
        for r in rs
        if r.tid == tid
    )
    truth_s = after[tid] - before[tid]
    assert sampled_s == pytest.approx(truth_s, rel=0.15, abs=0.05)
    # process-level context switches are the sum over threads (psutil's counts the main
    # one only), on a switch tick
    tick, rs = switch_ticks[-1]
    assert tick.cswch_s == pytest.approx(sum(r.cswch_s for r in rs), abs=0.1)
    assert tick.nvcswch_s == pytest.approx(sum(r.nvcswch_s for r in rs), abs=0.1)
    assert tick.threads == 4 and tick.pid_count == 1 and tick.fds >= 3
    assert (tmp_path / "threads.csv").read_text().count("\n") == len(rows) + 1


def _pidstat_averages(text: str) -> dict[int, dict[str, float]]:
    """Per-TID Average lines of `pidstat -t` (thread rows have TGID '-')."""
    out = {}
    header = None
    for line in text.splitlines():
        parts = line.split()
        if "TID" in parts and "%CPU" in parts:
            header = parts
        if header and parts and parts[0] == "Average:" and parts[2] == "-":
            # Average lines have the same columns as the header (its first is a time)
            col = {name: i for i, name in enumerate(header)}
            out[int(parts[col["TID"]])] = {
                k: float(parts[col[k]]) for k in ("%usr", "%system", "%wait", "%CPU")
            }
    return out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("pidstat") is None, reason="pidstat (sysstat) not installed")
def test_agrees_with_pidstat_per_thread(tmp_path):
    p = _start(NAMED_THREADS, "30")
    n = 5
    try:
        sampler = ProcessSampler(p.pid, tmp_path)
        ps = subprocess.Popen(
            ["pidstat", "-t", "-p", str(p.pid), "1", str(n)],
            stdout=subprocess.PIPE,
            text=True,
            env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"},
        )
        try:
            ticks = _run_sampler(sampler, 1.0, float(n))
            out, _ = ps.communicate(timeout=30)
        finally:
            if ps.poll() is None:
                ps.kill()
                ps.wait()
        sampler.close()
    finally:
        _stop(p)
    ref = _pidstat_averages(out)
    assert len(ref) == 4, out
    ours: dict[int, dict[str, list[float]]] = {}
    for _, rows in ticks:
        for r in rows:
            d = ours.setdefault(r.tid, {"%usr": [], "%system": [], "%wait": [], "%CPU": []})
            d["%usr"].append(r.usr_pct)
            d["%system"].append(r.system_pct)
            d["%wait"].append(r.wait_pct or 0.0)
            d["%CPU"].append(r.cpu_pct)
    for tid, theirs in ref.items():
        mine = {k: sum(v) / len(v) for k, v in ours[tid].items()}
        for k in ("%usr", "%system", "%wait", "%CPU"):
            assert abs(mine[k] - theirs[k]) <= 5.0, (tid, k, mine, theirs, out)


@pytest.mark.slow
def test_leaking_child_shows_growth(tmp_path):
    p = _start(LEAKER)
    try:
        sampler = ProcessSampler(p.pid, tmp_path, uss_every_s=0.5)
        ticks = [t for t, _ in _run_sampler(sampler, 0.2, 3.0)]
        sampler.close()
    finally:
        _stop(p)
    first, last = ticks[0], ticks[-1]
    assert last.rss_bytes - first.rss_bytes > 20_000_000
    assert last.threads - first.threads >= 5
    assert last.fds - first.fds >= 20
    # sockets are counted apart (they churn with connections; files do not)
    assert last.socket_fds - first.socket_fds >= 6
    assert (last.fds - last.socket_fds) - (first.fds - first.socket_fds) >= 20
    uss = [t.uss_bytes for t in ticks if t.uss_bytes is not None]
    assert 2 <= len(uss) < len(ticks)  # taken every ~0.5 s, not every tick
    assert uss[-1] > uss[0]


@pytest.mark.slow
def test_child_processes_are_summed(tmp_path):
    code = textwrap.dedent(
        """
        import subprocess, sys, time
        kids = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        print("ready", flush=True)
        try:
            time.sleep(30)
        finally:
            for k in kids:
                k.kill()
        """
    )
    p = _start(code)
    try:
        deadline = time.monotonic() + 10
        while len(psutil.Process(p.pid).children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        with_kids = ProcessSampler(p.pid, None)
        alone = ProcessSampler(p.pid, None, include_children=False)
        stop = threading.Event()
        ticks: list = []
        loop = TickLoop(0.25, stop=stop)
        t0 = loop.start()
        with_kids.baseline(time.monotonic() - t0)
        alone.baseline(time.monotonic() - t0)
        loop.run(lambda t, late: ticks.append((with_kids.sample(t, 0), alone.sample(t, 0))), 1.5)
    finally:
        children = psutil.Process(p.pid).children()
        for c in children:
            c.kill()
        _stop(p)  # the orphans are then reaped by init
        psutil.wait_procs(children, timeout=5)
    assert all(a.pid_count == 3 and b.pid_count == 1 for a, b in ticks)
    cpu_kids = sum(a.cpu_pct for a, _ in ticks) / len(ticks)
    cpu_alone = sum(b.cpu_pct for _, b in ticks) / len(ticks)
    assert cpu_kids > 30 and cpu_alone < 5
    assert {r.pid for r in with_kids.last_threads} == {p.pid, *(c.pid for c in children)}
    assert re.fullmatch(r"python[\d.]*", next(r.name for r in alone.last_threads))


def test_thread_csv_line_quotes_odd_names():
    import csv
    import io

    from harness.collectors.process import THREAD_COLUMNS, ThreadRow

    row = ThreadRow(1.5, 9, 10, 77, 'we,ird "name"', 1.234, 0.0, 0.0, None, 1.234, 1, 3.0, 0.5)
    parsed = next(csv.DictReader(io.StringIO(",".join(THREAD_COLUMNS) + "\n" + row.csv_line())))
    assert parsed["name"] == 'we,ird "name"'
    assert parsed["wait_pct"] == "" and parsed["cpu_pct"] == "1.23" and parsed["tid"] == "10"


@pytest.mark.slow
def test_system_sampler_sees_the_load_generator_cpu(tmp_path):
    from harness.collectors.run_processes import loadgen_pids
    from harness.collectors.system import SystemSampler

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        hot = SystemSampler(tmp_path, loadgen_pids=loadgen_pids([busy.pid]))
        cold = SystemSampler(None, loadgen_pids=loadgen_pids([idle.pid]))
        loop = TickLoop(0.25)
        t0 = loop.start()
        hot.baseline(time.monotonic() - t0)
        cold.baseline(time.monotonic() - t0)
        ticks: list = []
        loop.run(lambda t, late: ticks.append((hot.sample(t, 0.0), cold.sample(t, 0.0))), 1.5)
        hot.close()
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
    hot_mean = sum(h.loadgen_cpu_pct for h, _ in ticks) / len(ticks)
    cold_mean = sum(c.loadgen_cpu_pct for _, c in ticks) / len(ticks)
    assert hot_mean > 30 and cold_mean < 5
    assert all(len(h.per_core) == len(hot.cores) for h, _ in ticks)
    assert all(0 <= v <= 100 for h, _ in ticks for v in h.per_core if v is not None)
    assert max(h.cpu_pct for h, _ in ticks) > 20  # the busy process shows system-wide
    header = (tmp_path / "system.csv").read_text().splitlines()[0]
    assert header == ",".join(
        [
            "t",
            "ts",
            "late_s",
            "cpu_pct",
            *[f"cpu{c}_pct" for c in hot.cores],
            "loadgen_cpu_pct",
            "other_cpu_pct",
            "foreign_cpu_pct",
            "foreign_cores",
        ]
    )


def test_an_fd_closed_during_the_scan_counts_nowhere(monkeypatch):
    """A socket closed between the /proc/PID/fd listing and its readlink (clients reconnect
    all the time) is neither a socket nor a file the server holds: counting it in the total
    read as a non-socket fd left behind (freeze.resource_step failed a healthy recovery)."""
    import os
    import socket

    from harness.collectors import procfs

    s = socket.socket()
    try:
        total, socks = procfs.scan_fds(os.getpid()) or (0, [])
        fd = str(s.fileno())
        real = os.readlink

        def racing(path, *a, **k):
            if path.endswith(f"/fd/{fd}"):
                raise FileNotFoundError(path)  # closed as the scan ran
            return real(path, *a, **k)

        monkeypatch.setattr(procfs.os, "readlink", racing)
        total2, socks2 = procfs.scan_fds(os.getpid()) or (0, [])
    finally:
        s.close()
    assert len(socks2) == len(socks) - 1
    # the non-socket count is unchanged: the vanished socket is not mistaken for a file
    assert total2 - len(socks2) == total - len(socks)


def test_a_tick_that_raises_is_recorded_and_the_sampler_goes_on(tmp_path, monkeypatch):
    """A tick that raises must not end the sampling (the rest of the run would go unsampled
    with no cause given): it is counted, its traceback logged, its cause in sampler.json,
    and — when the gaps it leaves make the run invalid — named in the validity reason."""
    from harness.analysis.validity import sampler_problems
    from harness.collectors import read_samples
    from harness.collectors.runner import SamplerConfig, SamplingSession

    sut = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        session = SamplingSession(
            SamplerConfig(pid=sut.pid, out_dir=str(tmp_path), interval_s=0.1, duration_s=2.0)
        )
        real = session.process.sample
        calls = {"n": 0}

        def flaky(t, ts, late=0.0):
            calls["n"] += 1
            if 5 <= calls["n"] < 15:  # one second of ticks raise
                raise ValueError("unparsable /proc line")
            return real(t, ts, late)

        monkeypatch.setattr(session.process, "sample", flaky)
        meta = session.run()
    finally:
        sut.kill()
        sut.wait()
    assert meta["tick_errors"] == 10 and calls["n"] >= 19  # it went on after them
    assert "ValueError: unparsable /proc line" in meta["last_error"]
    assert "test_collectors.py" in meta["last_error"]  # where it was raised
    server = read_samples(tmp_path)["server"]
    assert server["tick_errors"] == 10
    t = server["series"]["t"]
    assert (
        t[-1] > 1.7 and max(b - a for a, b in zip(t, t[1:], strict=False)) > 0.9
    )  # the gap is there
    reason = sampler_problems(
        server, None, run_start_unix=server["started_unix"], run_s=2.0, needed={}
    )
    assert reason and "10 sampler tick(s) raised" in reason and "ValueError" in reason


def test_threads_top_switch_means_are_over_the_ticks_that_read_them(tmp_path):
    from harness.collectors.process import THREAD_COLUMNS
    from harness.collectors.samples import _threads_top

    # t,pid,tid,start_ticks,name,usr,system,guest,wait,cpu,cpu#,cswch_s,nvcswch_s
    lines = [
        "1.0,7,8,100,a,10.00,0.00,0.00,0.00,10.00,0,,",
        "2.0,7,8,100,a,20.00,0.00,0.00,0.00,20.00,0,150.00,6.00",
        "3.0,7,8,100,a,30.00,0.00,0.00,0.00,30.00,0,,",
        "4.0,7,8,100,a,40.00,0.00,0.00,0.00,40.00,0,50.00,2.00",
        "1.0,7,9,100,b,1.00,0.00,0.00,0.00,1.00,1,,",
    ]
    path = tmp_path / "threads.csv"
    path.write_text(",".join(THREAD_COLUMNS) + "\n" + "\n".join(lines) + "\n")
    a, b = _threads_top(path, 5)
    assert (a["tid"], a["cpu_pct_mean"]) == (8, 25.0)  # CPU over every row
    assert (a["cswch_s_mean"], a["nvcswch_s_mean"]) == (100.0, 4.0)  # over the 2 read
    assert (b["tid"], b["cswch_s_mean"], b["nvcswch_s_mean"]) == (9, None, None)
