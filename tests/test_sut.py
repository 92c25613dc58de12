"""harness.sut: start a real server process, wait for readiness, pin, stop, restart, attach."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import psutil
import pytest

from harness.errors import ConfigError, TargetUnavailable
from harness.sut import (
    CoreSplit,
    SutProcess,
    attach,
    check_command,
    choose_cores,
    free_port,
    parse_cores,
)

# A small real HTTP server: /v2/health/ready answers 503 until READY_AFTER seconds have
# passed, then 200; it runs two extra worker threads so pinning can be checked per thread.
READY_SERVER = textwrap.dedent(
    """
    import sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    port, ready_after = int(sys.argv[1]), float(sys.argv[2])
    t0 = time.monotonic()
    print("starting on", port, flush=True)
    print("a line on stderr", file=sys.stderr, flush=True)

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/v2/health/ready" and time.monotonic() - t0 >= ready_after
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    for _ in range(2):
        threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()
    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


@pytest.fixture
def server_script(tmp_path):
    p = tmp_path / "ready_server.py"
    p.write_text(READY_SERVER)
    return str(p)


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_choose_cores_splits_and_shares():
    assert choose_cores([0, 1]) == CoreSplit(sut=(1,), loadgen=(0,))
    assert choose_cores([0, 1, 2, 3]) == CoreSplit(sut=(2, 3), loadgen=(0, 1))
    assert choose_cores([0, 1, 2, 3], sut_count=1).sut == (3,)
    one = choose_cores([5])
    assert one.sut == one.loadgen == (5,) and one.shared
    assert not choose_cores([0, 1]).shared
    assert choose_cores([0, 1]).as_dict() == {"sut": [1], "loadgen": [0], "shared": False}
    with pytest.raises(ConfigError, match="sut_cores has value 3"):
        choose_cores([0, 1], sut_count=3)


def test_parse_cores():
    assert parse_cores("0,2-3") == (0, 2, 3)
    assert parse_cores("1") == (1,)
    with pytest.raises(ConfigError, match="'a-b'"):
        parse_cores("a-b")


def test_template_placeholders_and_bad_placeholder():
    s = SutProcess("srv --port {port} --workers {threads}", port=1234, threads=3)
    assert s.argv == ["srv", "--port", "1234", "--workers", "3"]
    assert s.url == "http://127.0.0.1:1234"
    with pytest.raises(ConfigError, match="bad placeholder"):
        SutProcess("srv --port {prot}")


@pytest.mark.parametrize(
    ("cmd", "extra", "message"),
    [
        ("srv", (), "no {port} placeholder"),
        ("srv --port {port} --x {prot}", (), "bad placeholder {prot}"),
        ("srv --port {port} {", (), "bad placeholder"),
        ("srv --port {port} --mb {mb}", (), "bad placeholder {mb}"),
    ],
)
def test_a_server_command_is_refused_before_anything_starts(cmd, extra, message):
    """One check for every command that takes --sut-cmd (run, acceptance, agent, peak,
    tune): {port} is required, other placeholders only those the command fills."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_command(cmd, extra)


def test_a_server_command_may_use_its_commands_own_placeholders():
    check_command("srv --port {port} --workers {threads} --literal {{x}}")
    check_command("srv --port {port} --mb {mb}", extra=("mb",))


@pytest.mark.slow
def test_start_ready_pinned_stop_restart(server_script):
    cores = (max(os.sched_getaffinity(0)),)
    sut = SutProcess([sys.executable, server_script, "{port}", "0.3"], cores=cores)
    with sut:
        ready_s = sut.wait_ready(timeout=30)
        assert ready_s >= 0.3  # the server says 503 for its first 0.3 s
        assert _get(sut.url + "/v2/health/ready") == 200
        # every thread, including those started after exec, inherited the pinning
        threads = psutil.Process(sut.pid).threads()
        assert len(threads) >= 3
        for t in threads:
            assert os.sched_getaffinity(t.id) == set(cores)
        assert sut.pids() == [sut.pid]
        # its own process group / session, so a Ctrl-C to us is not delivered to it
        assert os.getpgid(sut.pid) != os.getpgid(0)
        old = sut.pid
        again = sut.restart(ready_timeout=30)
        assert again is not None and again > 0
        assert sut.pid != old
        assert not psutil.pid_exists(old)  # stopped and reaped
        assert "starting on" in sut.tail()
        pid = sut.pid
    assert not sut.alive()
    assert not psutil.pid_exists(pid)


@pytest.mark.slow
def test_exit_before_ready_names_url_and_shows_output(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(
        "import sys\nprint('model file not found: /nope', file=sys.stderr)\nsys.exit(3)\n"
    )
    sut = SutProcess([sys.executable, str(script), "{port}"])
    try:
        with pytest.raises(TargetUnavailable) as err:
            sut.wait_ready(timeout=30)
        msg = str(err.value)
        assert "exited with code 3" in msg
        assert f"127.0.0.1:{sut.port}/v2/health/ready" in msg
        assert "model file not found: /nope" in msg
    finally:
        sut.stop()


@pytest.mark.slow
def test_never_ready_times_out(server_script):
    sut = SutProcess([sys.executable, server_script, "{port}", "3600"])
    try:
        with pytest.raises(TargetUnavailable, match="did not answer 200"):
            sut.wait_ready(timeout=0.8)
        assert sut.alive()  # a timeout does not kill it; stop() does
    finally:
        sut.stop()
    assert not sut.alive()


@pytest.mark.slow
def test_stop_escalates_to_sigkill_and_reaps_children(tmp_path):
    # Ignores SIGTERM and has a child: stop() must still end both, by pid.
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(3600)\n"
    )
    sut = SutProcess([sys.executable, str(script)], port=free_port())
    sut.start()
    deadline = time.monotonic() + 20
    while len(sut.pids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    family = sut.pids()
    assert len(family) == 2
    code = sut.stop(timeout=0.5)
    assert code == -9
    for p in family:
        assert not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE


def test_attach_existing_and_missing_pid():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        a = attach(p.pid, url="http://127.0.0.1:1")
        assert a.pids() == [p.pid]
        assert set(a.cores) == os.sched_getaffinity(p.pid)
        assert not a.can_restart and a.alive()
    finally:
        p.kill()
        p.wait()
    with pytest.raises(TargetUnavailable, match="no such process"):
        attach(p.pid)


# Starts a server (a sleeping process) through SutProcess, prints both pids, then waits to
# be SIGKILLed: no handler, atexit or finally of it runs.
_OWNER = textwrap.dedent(
    """
    import sys, time
    from harness.sut import SutProcess
    s = SutProcess([sys.executable, "-c", "import time; time.sleep(120)"]).start()
    print(s.pid, s._guard.pid, flush=True)
    time.sleep(120)
    """
)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_started_server_is_stopped_when_its_starter_is_sigkilled():
    """Every server the harness starts gets a guard process: when the process that started
    it dies (SIGKILL: nothing of it runs), the guard stops the server's process group; when
    the server is stopped normally, the guard goes with it."""
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True)
    server = guard = None
    try:
        assert owner.stdout is not None
        server, guard = map(int, owner.stdout.readline().split())
        time.sleep(1.0)
        assert not _gone(server)  # its starter lives: left alone
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (_gone(server) and _gone(guard)):
            time.sleep(0.1)
        assert _gone(server), "the server outlived the SIGKILLed process that started it"
        assert _gone(guard)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        for pid in (server, guard):
            if pid is not None and not _gone(pid):
                psutil.Process(pid).kill()
    # stopped normally: the guard exits with it (none left behind)
    s = SutProcess([sys.executable, "-c", "import time; time.sleep(120)"]).start()
    g = s._guard
    assert g is not None and g.poll() is None
    s.stop()
    assert g.poll() is not None and s._guard is None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_a_server_starts_leaves_no_server_without_its_guard(monkeypatch, sig):
    """A handler that raises (Ctrl-C's KeyboardInterrupt, `harness tune`'s SIGTERM) used to
    land between the server's spawn and its guard's when the signal came as a server
    started (a tune's next configuration): the exception left start() with the server
    running and nothing to stop it, not even after the harness exited (found by CI: a
    reference server alive 53 minutes after its tune). Now the signal is held until both
    run, then raised; start() stops the server on the way out. The signal is sent here at
    the worst moment: after the server's spawn, before its guard's."""
    spawned: list[int] = []
    start_guard = SutProcess._start_guard

    def signalled_then_guard(self, server_pid: int) -> None:
        spawned.append(server_pid)
        os.kill(os.getpid(), sig)  # its handler runs at the next bytecode: inside here
        start_guard(self, server_pid)

    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt

    monkeypatch.setattr(SutProcess, "_start_guard", signalled_then_guard)
    previous = signal.signal(sig, raise_interrupt)
    s = SutProcess([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with pytest.raises(KeyboardInterrupt):
            s.start()
        assert signal.getsignal(sig) is raise_interrupt  # the handler is given back
        assert spawned and _gone(spawned[0]), "the server outlived the interrupted start"
        assert s._guard is None and not s.alive()
    finally:
        signal.signal(sig, previous)
        for pid in spawned:
            if not _gone(pid):
                psutil.Process(pid).kill()
    # control: a handler that only records the signal (harness acceptance's) gets it once
    # the server and its guard run, and the server is left running
    got: list[int] = []
    previous = signal.signal(sig, lambda signum, frame: got.append(signum))
    s = SutProcess([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        s.start()
        assert got == [sig] and s.alive() and s._guard is not None and s._guard.poll() is None
    finally:
        signal.signal(sig, previous)
        s.stop()
