"""The sampler's own cost on a large idle pool: what it stopped doing each tick, and that
the shortcuts record exactly what the long way did.

The cost itself (CPU per tick, % of a core) is a benchmark figure (bench/collectors.py,
bench/agent_cost.py); these tests pin the behaviour that makes it cheap: per-thread /proc
files are opened once and re-read, the TCP table is read only when a socket it has not
seen turns up, and an idle thread's row is the row the full read would have given.
"""

from __future__ import annotations

import csv
import os
import resource
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.collectors import procfs
from harness.collectors.process import THREAD_COLUMNS, ProcessSampler
from harness.collectors.system import SystemSampler

# N threads blocked on an Event, one spinning, one that exits when told (stdin line).
POOL = textwrap.dedent(
    """
    import sys, threading
    stop = threading.Event()
    for _ in range(int(sys.argv[1])):
        threading.Thread(target=stop.wait, daemon=True).start()
    def spin():
        while not stop.is_set():
            pass
    threading.Thread(target=spin, daemon=True).start()
    quit_one = threading.Event()
    t = threading.Thread(target=quit_one.wait)
    t.start()
    print(t.native_id, flush=True)
    sys.stdin.readline()
    quit_one.set()
    t.join()
    print("joined", flush=True)
    stop.wait()
    """
)


def _tick(sampler: ProcessSampler, t0: float):
    """One tick 0.1 s after the last, on the real clock (rates need real time)."""
    time.sleep(0.1)
    return sampler.sample(time.monotonic() - t0, time.time())


@pytest.fixture
def pool():
    p = subprocess.Popen(
        [sys.executable, "-c", POOL, "60"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        tid = int(p.stdout.readline())
        yield p, tid
    finally:
        p.kill()
        p.wait()


def test_sampler_rereads_open_thread_files_instead_of_reopening(pool, tmp_path) -> None:
    p, _ = pool
    sampler = ProcessSampler(p.pid, tmp_path)
    t0 = time.monotonic()
    try:
        sampler.baseline(0.0)
        # two ticks to settle: a thread still running its start-up (the main thread printing
        # the tid) in the first interval has its stat/status read once, then closed by the
        # sweep when it idles — only the spinning thread runs from the second tick on
        _tick(sampler, t0)
        _tick(sampler, t0)
        opened = sampler._files.opens
        held = len(sampler._files)
        assert held >= 62  # one schedstat per thread at least
        for _ in range(4):
            tick = _tick(sampler, t0)
            assert tick is not None and tick.threads >= 63
        # the spinning thread's stat/status are opened once, then re-read like the rest
        assert sampler._files.opens == opened
        assert len(sampler._files) == held
    finally:
        sampler.close()
    assert len(sampler._files) == 0


def _soft_open_file_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no open-file limit in /proc/{pid}/limits")


def test_harness_sample_under_a_low_open_file_limit_still_holds_every_threads_files(
    tmp_path: Path,
) -> None:
    """Started with a soft limit of 256 open files (room for 64 held files), ``harness
    sample`` raises it toward the hard limit and holds every thread's schedstat, instead
    of opening and closing the files of the threads past the 64th on every tick."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"the hard open-file limit is {hard}: no room to raise the soft one")
    threads = 150
    server = subprocess.Popen(
        [sys.executable, "-c", POOL, str(threads)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    sampler = None
    try:
        server.stdout.readline()
        sampler = subprocess.Popen(
            [sys.executable, "-m", "harness", "sample", "--pid", str(server.pid),
             "--out", str(tmp_path), "--interval", "0.2", "--duration", "20"],
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        task_dir = f"/proc/{server.pid}/task/"
        held: list[str] = []
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline and sampler.poll() is None:
            held = []
            for fd in os.listdir(f"/proc/{sampler.pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{sampler.pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith(task_dir) and link.endswith("/schedstat"):
                    held.append(link)
            if len(held) > threads:
                break
            time.sleep(0.1)
        assert len(held) > threads, f"{len(held)} schedstat files held for {threads + 3} threads"
        assert _soft_open_file_limit(sampler.pid) > 256
    finally:
        for p in (sampler, server):
            if p is not None:
                p.kill()
                p.wait()


def test_a_threads_status_file_is_held_from_one_switch_tick_to_the_next(pool, tmp_path) -> None:
    """Switch counts are read on switch ticks only; the spinning thread's status file,
    read on each of them, is re-read rather than opened again on the next."""
    p, _ = pool
    sampler = ProcessSampler(p.pid, tmp_path, switches_every_s=0.25)
    t0 = time.monotonic()
    try:
        sampler.baseline(0.0)
        ticks = [_tick(sampler, t0) for _ in range(4)]
        opened = sampler._files.opens
        switch_ticks = 0
        for _ in range(8):
            tick = _tick(sampler, t0)
            assert tick is not None
            switch_ticks += tick.cswch_s is not None
            ticks.append(tick)
        assert switch_ticks >= 2
        spinner = max(sampler.last_threads, key=lambda r: r.cpu_pct)
        assert spinner.cpu_pct > 50
        assert f"/proc/{p.pid}/task/{spinner.tid}/status" in sampler._files._fds
        assert sampler._files.opens == opened
    finally:
        sampler.close()


def test_sampler_closes_the_files_of_a_thread_that_exited(pool, tmp_path) -> None:
    p, tid = pool
    sampler = ProcessSampler(p.pid, tmp_path)
    t0 = time.monotonic()
    try:
        sampler.baseline(0.0)
        _tick(sampler, t0)
        path = f"/proc/{p.pid}/task/{tid}/schedstat"
        assert path in sampler._files._fds
        before = _tick(sampler, t0)
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "joined"
        _gone(f"/proc/{p.pid}/task/{tid}")
        after = _tick(sampler, t0)
        assert before is not None and after is not None
        assert after.threads == before.threads - 1
        assert path not in sampler._files._fds
        assert f"/proc/{p.pid}/task/{tid}/status" not in sampler._files._fds
        assert tid not in {r.tid for r in sampler.last_threads}
    finally:
        sampler.close()


# 20 blocked threads; each stdin line names what to do: "start" a thread, "end" the oldest
# started one, "swap" (start one, then end one: the count stays). Prints the new tid (or
# 0) and the ended tid (or 0) once the ended thread has been joined.
SWAP = textwrap.dedent(
    """
    import sys, threading
    stop = threading.Event()
    for _ in range(20):
        threading.Thread(target=stop.wait, daemon=True).start()
    started = []
    def run(ev):
        ev.wait()
    print("ready", flush=True)
    for line in sys.stdin:
        new = ended = 0
        if line.strip() in ("start", "swap"):
            ev = threading.Event()
            t = threading.Thread(target=run, args=(ev,))
            t.start()
            started.append((t, ev))
            new = t.native_id
        if line.strip() in ("end", "swap"):
            t, ev = started.pop(0)
            ended = t.native_id
            ev.set()
            t.join()
        print(new, ended, flush=True)
    """
)


@pytest.fixture
def swapper():
    p = subprocess.Popen(
        [sys.executable, "-c", SWAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        yield p
    finally:
        p.kill()
        p.wait()


def _tell(p: subprocess.Popen, what: str) -> tuple[int, int]:
    # a thread's start time is in clock ticks (10 ms): one started within the tick of the
    # sampler's last tick reads as older than it and gets a baseline only, no row
    time.sleep(0.03)
    p.stdin.write(what + "\n")
    p.stdin.flush()
    new, ended = (int(x) for x in p.stdout.readline().split())
    if ended:
        _gone(f"/proc/{p.pid}/task/{ended}")
    return new, ended


def test_threads_are_listed_only_when_a_thread_may_have_started_or_ended(
    swapper, tmp_path, monkeypatch
) -> None:
    """/proc/PID/task is listed when the process's thread count moved or one of the last
    tick's threads ended, never on a tick where neither happened; every thread is in the
    tick after it started, and none after it ended."""
    listings: list[int] = []
    real = procfs.list_task_names

    def counted(pid: int) -> list[str]:
        listings.append(pid)
        return real(pid)

    monkeypatch.setattr(procfs, "list_task_names", counted)
    p = swapper
    sampler = ProcessSampler(p.pid, tmp_path)
    t0 = time.monotonic()

    def tids() -> set[int]:
        return {r.tid for r in sampler.last_threads}

    try:
        sampler.baseline(0.0)
        _tick(sampler, t0)
        first = len(listings)
        for _ in range(3):
            tick = _tick(sampler, t0)
            assert tick is not None and tick.threads == 21
        assert len(listings) == first  # nothing started or ended: no listing

        new, _ = _tell(p, "start")  # the count moves
        tick = _tick(sampler, t0)
        assert tick is not None and tick.threads == 22 and new in tids()
        assert len(listings) == first + 1

        newer, ended = _tell(p, "swap")  # the count stays: the ended thread's read fails
        assert ended == new
        tick = _tick(sampler, t0)
        assert tick is not None and tick.threads == 22
        assert newer in tids() and new not in tids()
        assert len(listings) == first + 2

        _, ended = _tell(p, "end")
        assert ended == newer
        tick = _tick(sampler, t0)
        assert tick is not None and tick.threads == 21 and newer not in tids()
        assert len(listings) == first + 3
    finally:
        sampler.close()


def test_open_file_of_an_exited_task_reads_none_not_stale_data(pool) -> None:
    p, tid = pool
    files = procfs.OpenFiles()
    path = f"/proc/{p.pid}/task/{tid}/stat"
    first = files.read(path)
    assert first is not None and first.startswith(f"{tid} (".encode())
    p.stdin.write("go\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "joined"
    _gone(f"/proc/{p.pid}/task/{tid}")
    assert files.read(path) is None  # ESRCH on the held fd, then no such path
    files.sweep()
    files.sweep()
    assert len(files) == 0


def test_idle_thread_rows_match_the_full_read(pool, tmp_path) -> None:
    """threads.csv written with the idle shortcut equals every row formatted in full, on
    the ticks that read the switch counts and on those between (switch columns empty)."""
    p, _ = pool
    sampler = ProcessSampler(p.pid, tmp_path, switches_every_s=0.25)
    t0 = time.monotonic()
    expected: list[str] = []
    switch_ticks = 0
    try:
        sampler.baseline(0.0)
        for _ in range(6):
            tick = _tick(sampler, t0)
            assert tick is not None
            rows = sampler.last_threads
            expected += [r.csv_line() for r in rows]
            if tick.cswch_s is None:
                assert tick.nvcswch_s is None
                assert all(r.cswch_s is None and r.nvcswch_s is None for r in rows)
                continue
            switch_ticks += 1
            assert all(r.cswch_s is not None and r.nvcswch_s is not None for r in rows)
            idle = [r for r in rows if r.cpu_pct == 0 and r.cswch_s == 0]
            assert len(idle) >= 55
        # the spinning thread's rows were read in full (it got some of a core: on a box
        # busy with other tests' work, under half of one in 2 of 6 runs)
        busy = [r for r in sampler.last_threads if r.cpu_pct > 0]
        assert len(busy) >= 1
    finally:
        sampler.close()
    assert 1 <= switch_ticks <= 3  # every ~0.25 s of six 0.1 s ticks
    with open(tmp_path / "threads.csv", newline="") as f:
        header, *written = f.readlines()
    assert header.strip() == ",".join(THREAD_COLUMNS)
    assert written == expected
    assert list(csv.reader(written))[0][-2:] in (["", ""], ["0.00", "0.00"])


# 6 worker threads that run only when told: each stdin line "MS" makes every worker, one
# after the other, burn MS ms of its own CPU and block again; "done" when all of them have.
ROUNDS = textwrap.dedent(
    """
    import sys, threading, time
    go = [threading.Event() for _ in range(6)]
    done = threading.Semaphore(0)
    burn = [0.0]
    def work(ev):
        while True:
            ev.wait()
            ev.clear()
            end = time.thread_time() + burn[0]
            while time.thread_time() < end:
                pass
            done.release()
    workers = [threading.Thread(target=work, args=(ev,), daemon=True) for ev in go]
    for w in workers:
        w.start()
    print(*[w.native_id for w in workers], flush=True)
    for line in sys.stdin:
        burn[0] = float(line) / 1000
        for ev in go:
            ev.set()
            done.acquire()
        print("done", flush=True)
    """
)


@pytest.fixture
def rounds():
    """The ROUNDS process and its workers' tids."""
    p = subprocess.Popen(
        [sys.executable, "-c", ROUNDS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield p, [int(x) for x in p.stdout.readline().split()]
    finally:
        p.kill()
        p.wait()


def _round(p: subprocess.Popen, ms: float) -> None:
    p.stdin.write(f"{ms}\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "done"


def _utime_stime(pid: int, tid: int) -> tuple[int, int]:
    f = Path(f"/proc/{pid}/task/{tid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    return int(f[11]), int(f[12])


def test_rows_of_threads_that_ran_under_a_clock_tick_say_what_their_stat_says(
    rounds, tmp_path
) -> None:
    """Between switch ticks a thread that ran, but not past the next clock tick of its last
    stat read, is not read again: its row's usr and system are still exact (every tick's
    figures, summed, are what /proc says the thread used, read while it is blocked) and
    its CPU number is left empty; the tick it crosses a clock tick reads stat again."""
    from harness.collectors.threads import EXACT_TICKS, HZ

    if not EXACT_TICKS:
        pytest.skip("this kernel splits on-CPU time from a fresher clock (nohz_full CPUs)")
    p, tids = rounds
    sampler = ProcessSampler(p.pid, tmp_path, switches_every_s=3600.0)
    try:
        t0 = time.monotonic()
        sampler.baseline(0.0)
        at_start = {tid: _utime_stime(p.pid, tid) for tid in tids}
        summed = {tid: [0, 0] for tid in tids}
        skipped = read = 0
        t_prev = 0.0
        for _ in range(24):
            _round(p, 1.5)
            tick = _tick(sampler, t0)
            assert tick is not None and tick.cswch_s is None  # not a switch tick
            rows = {r.tid: r for r in sampler.last_threads}
            t = rows[tids[0]].t
            for tid in tids:
                r = rows[tid]
                d_u = round(r.usr_pct * HZ * (t - t_prev) / 100)
                d_s = round(r.system_pct * HZ * (t - t_prev) / 100)
                summed[tid][0] += d_u
                summed[tid][1] += d_s
                now = _utime_stime(p.pid, tid)  # the worker is blocked: this is still true
                assert now[0] - at_start[tid][0] == summed[tid][0], (tid, r)
                assert now[1] - at_start[tid][1] == summed[tid][1], (tid, r)
                if r.cpu is None:
                    skipped += 1
                    assert d_u == d_s == 0
                else:
                    read += 1
            t_prev = t
        # 36 ms of CPU each over 24 rounds: 3-4 clock ticks crossed. Stat is skipped only
        # while the tick fractions of utime and stime sum to under a tick (see
        # threads._exact_ticks), about half the time for a thread that uses both
        assert skipped >= 24, (skipped, read)
        assert read >= 6 * 2, (skipped, read)
        assert all(sum(v) >= 2 for v in summed.values()), summed
    finally:
        sampler.close()


def test_a_switch_tick_reads_every_cpu_number_a_skipped_read_left_unknown(rounds, tmp_path) -> None:
    """The workers run briefly before every third tick: between switch ticks their CPU
    number is left empty once a stat read is skipped; each switch tick fills it for every
    worker, whether it ran in that interval or has been idle since the skip."""
    p, tids = rounds
    sampler = ProcessSampler(p.pid, tmp_path, switches_every_s=0.35)
    try:
        t0 = time.monotonic()
        sampler.baseline(0.0)
        switch_ticks = unknown = 0
        for i in range(16):
            if i % 3 == 0:
                _round(p, 0.5)
            tick = _tick(sampler, t0)
            assert tick is not None
            rows = {r.tid: r for r in sampler.last_threads}
            if tick.cswch_s is None:
                unknown += sum(rows[tid].cpu is None for tid in tids)
                continue
            switch_ticks += 1
            assert all(rows[tid].cpu is not None for tid in tids), [rows[t] for t in tids]
        assert switch_ticks >= 3
        assert unknown >= 6  # the case arose between switch ticks
    finally:
        sampler.close()
    with open(tmp_path / "threads.csv", newline="") as f:
        written = list(csv.DictReader(f))
    assert {r["cpu"] for r in written if int(r["tid"]) in tids} - {""}  # numbers where read
    assert all(r["cpu"] == "" or r["cpu"].isdigit() for r in written)


def test_tcp_table_is_read_only_when_a_new_socket_turns_up(tmp_path: Path) -> None:
    """The harness-own connection count stays right while the table is read only on change."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    clients, accepted = [], []
    try:
        for _ in range(3):
            c = socket.create_connection(("127.0.0.1", port))
            clients.append(c)
            accepted.append(srv.accept()[0])
        ends = procfs.SocketEndpoints(refresh_s=60.0)
        server_inodes = _inodes(accepted)
        peer_inodes = _inodes(clients)
        assert ends.connections_between(_self(), server_inodes, peer_inodes, 0.0) == 3
        assert ends.reads == 1
        for k in range(1, 4):
            assert ends.connections_between(_self(), server_inodes, peer_inodes, float(k)) == 3
        assert ends.reads == 1  # nothing new: the table was not read again
        c = socket.create_connection(("127.0.0.1", port))
        clients.append(c)
        accepted.append(srv.accept()[0])
        assert (
            ends.connections_between(_self(), _inodes(accepted), _inodes(clients), 5.0)
            == procfs.connections_between(_self(), _inodes(accepted), _inodes(clients))
            == 4
        )
        assert ends.reads == 2
        clients.pop().close()
        accepted.pop().close()
        assert ends.connections_between(_self(), _inodes(accepted), _inodes(clients), 6.0) == 3
        assert ends.reads == 2  # a socket gone needs no read
        other = socket.create_connection(("127.0.0.1", port))  # the harness's, not to the SUT
        try:
            peers = [*_inodes(clients), *_inodes([other])]
            assert ends.connections_between(_self(), _inodes(accepted), peers, 7.0) == 3
            assert ends.reads == 2  # a new socket of the harness alone needs no read
        finally:
            other.close()
            srv.accept()[0].close()
        assert ends.connections_between(_self(), [], [], 70.0) == 0
        assert ends.reads == 3  # the periodic refresh
    finally:
        for s in [*clients, *accepted, srv]:
            s.close()


def _gone(path: str) -> None:
    """Wait until the kernel has reaped a thread (join() returns while it is still exiting)."""
    deadline = time.monotonic() + 5.0
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not os.path.exists(path)


def _self() -> int:
    return os.getpid()


def _inodes(socks: list[socket.socket]) -> list[int]:
    return [os.fstat(s.fileno()).st_ino for s in socks]


SPIN = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end:\n    pass\n"


def test_busy_cores_rescan_the_run_only_after_a_process_started(monkeypatch) -> None:
    """CPU on the run's cores that the run's processes do not explain (another tenant, the
    kernel's own work) rescans the run at once only when a process was started on the host
    since the run's list was made (the host's last pid moved): otherwise a pass over /proc
    would find nothing new. The tenant is still measured and named every tick."""
    host_last_pid = [1000]  # this shared host's real one moves with everyone's processes
    monkeypatch.setattr(procfs, "last_pid", lambda: host_last_pid[0])
    listed = []

    def run_pids() -> list[int]:
        listed.append(time.monotonic())
        return [os.getpid()]

    sampler = SystemSampler(None, run_pids=run_pids, sut_pid=os.getpid, loadgen_every_s=60.0)
    tenant = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        t0 = time.monotonic()
        sampler.baseline(0.0)
        time.sleep(0.5)

        def tick():
            time.sleep(0.3)
            return sampler.sample(time.monotonic() - t0, time.time())

        tick()  # (the baseline may have listed the run from a pass made before the patch)
        before = len(listed)
        quiet = [tick() for _ in range(3)]
        assert len(listed) == before  # no process started: no rescan
        host_last_pid[0] += 1  # a process started somewhere on the host
        started = [tick() for _ in range(3)]
        assert len(listed) == before + 1  # one rescan, then the new list is current again
    finally:
        tenant.kill()
        tenant.wait()
    # one spinning tenant on the run's cores: each tick measures it, and names it once
    # there is a pass half a second old to compare with
    for t in quiet + started:
        assert t is not None and t.foreign_cpu_pct is not None and t.foreign_cpu_pct > 15
    assert any(tenant.pid in {p for p, _, _ in t.foreign_procs} for t in quiet + started)


def test_a_pass_over_proc_is_reused_for_trees_only_while_no_process_started(monkeypatch) -> None:
    """Who is whose child is read again only once a process has started on the host (its
    last pid moved) or the pass is ``REUSE_S`` old; CPU figures are always read afresh."""
    host_last_pid = [1000]
    monkeypatch.setattr(procfs, "last_pid", lambda: host_last_pid[0])
    procfs.process_table(max_age_s=0.0, cpu=True)  # a pass made under the patched clock
    first, _ = procfs.process_table()
    time.sleep(0.01)
    assert procfs.descendants(os.getppid(), max_age_s=0.0) is not None
    assert procfs.process_table(max_age_s=0.0)[0] == first  # nothing started: reused
    assert procfs.process_table(max_age_s=0.0, cpu=True)[0] > first  # CPU: always afresh
    second, _ = procfs.process_table()
    host_last_pid[0] += 1  # a process started somewhere on the host
    time.sleep(0.01)
    third, _ = procfs.process_table(max_age_s=0.0)
    assert third > second
    monkeypatch.setattr(procfs, "REUSE_S", 0.005)
    time.sleep(0.01)
    assert procfs.process_table(max_age_s=0.0)[0] > third  # too old to reuse
    # a child started since the last pass is found: its start moved the last pid
    monkeypatch.undo()
    procfs.process_table(max_age_s=0.0, cpu=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in (procfs.descendants(os.getpid(), max_age_s=0.0) or [])
    finally:
        child.kill()
        child.wait()
