"""``harness agent``: a real agent in this process on a loopback port, real
processes paused and hogged through it. Token, allow-list, the lease that undoes chaos
when the master goes quiet, clock-offset math, and samples copied back unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from harness.agent.client import (
    AgentClient,
    AgentRefused,
    RemoteSut,
    clock_offset,
    connect_sut,
    shift_meta,
)
from harness.agent.server import Agent, AgentConfig, make_server
from harness.chaos.base import proc_state
from harness.chaos.timeline import Timeline
from harness.errors import ConfigError
from harness.testing.tls import make_certs, needs_openssl

TOKEN = "s3cret-token"


class Running:
    def __init__(self, agent: Agent, url: str) -> None:
        self.agent, self.url = agent, url


def _start(tmp_path: Path, **kw) -> tuple[Running, callable]:
    agent = Agent(AgentConfig(token=TOKEN, port=0, root=str(tmp_path / "agent"), **kw))
    httpd = make_server(agent)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    agent.start_lease()

    def stop() -> None:
        agent.shutdown("test end")
        httpd.shutdown()
        httpd.server_close()

    return Running(agent, f"http://127.0.0.1:{httpd.server_address[1]}"), stop


@pytest.fixture
def agent(tmp_path) -> Iterator[Running]:
    running, stop = _start(tmp_path)
    yield running
    stop()


@pytest.fixture
def server_proc() -> Iterator[subprocess.Popen]:
    """A stand-in server: an idle python process (paused and hogged, never killed)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    p.kill()
    p.wait(5)


def _event(action: str, duration_s: float, **params) -> SimpleNamespace:
    return SimpleNamespace(at_s=0.0, action=action, params=params, duration_s=duration_s)


def _until(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# -- access ----------------------------------------------------------------------------


def test_agent_token_refused(agent, server_proc) -> None:
    with pytest.raises(AgentRefused, match="refused the token"):
        AgentClient(agent.url, "wrong").call("GET", "info")
    with pytest.raises(ConfigError, match="--agent-token"):
        AgentClient(agent.url, None)
    # no Authorization header at all: 401 as well, and nothing leaks the real token
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{agent.url}/v1/info", timeout=5)
    assert e.value.code == 401
    assert TOKEN not in e.value.read().decode()
    assert AgentClient(agent.url, TOKEN).call("GET", "info")["host"]


def test_agent_refuses_to_start_without_token(tmp_path) -> None:
    with pytest.raises(ConfigError, match="HARNESS_AGENT_TOKEN"):
        AgentConfig(token="").validate()
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_AGENT_TOKEN"}
    r = subprocess.run(
        [sys.executable, "-m", "harness", "agent", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "--token" in r.stderr


def test_agent_unreachable_or_wrong_pid_is_exit_2(agent) -> None:
    with pytest.raises(ConfigError, match="unreachable") as e:
        connect_sut("http://127.0.0.1:9", TOKEN, 123)
    assert e.value.exit_code == 2
    with pytest.raises(ConfigError, match="no process 999999999 on the agent's host"):
        connect_sut(agent.url, TOKEN, 999999999)
    with pytest.raises(ConfigError, match="--sut-pid"):
        connect_sut(agent.url, TOKEN, None)


def test_agent_allow_list(tmp_path, server_proc) -> None:
    running, stop = _start(tmp_path, allow=("pause",))
    try:
        events = [_event("cpu_hog", 5.0, cores=1)]
        with pytest.raises(ConfigError, match=r"chaos\[0\] \(cpu_hog\).*--allow pause,cpu_hog"):
            connect_sut(running.url, TOKEN, server_proc.pid, events)
        # refused at apply too (a master that skipped the check): 403, nothing spawned
        client = AgentClient(running.url, TOKEN)
        with pytest.raises(AgentRefused, match="not allowed"):
            client.call(
                "POST",
                "actions",
                {
                    "action": "cpu_hog",
                    "params": {"cores": 1, "duration_s": 5},
                    "pid": server_proc.pid,
                },
            )
        assert not running.agent.active
        # a bad parameter of an allowed action is exit 2 as well, with the action's message
        with pytest.raises(ConfigError, match="pause.duration_s"):
            connect_sut(running.url, TOKEN, server_proc.pid, [_event("pause", 0.0)])
    finally:
        stop()


# -- chaos through the agent ---------------------------------------------------------


def test_agent_timeline_pause_records_evidence(agent, server_proc) -> None:
    """The timeline runs the agent's pause like a local one: the record carries what the
    agent's kernel showed (pids stopped, then continued)."""
    sut = connect_sut(agent.url, TOKEN, server_proc.pid, [_event("pause", 0.3)])
    try:
        tl = Timeline([_event("pause", 0.3)], sut, actions=sut.chaos_actions, handle_signals=False)
        records = tl.run()
    finally:
        sut.close()
    (rec,) = records
    assert rec["ok"] and rec["end_s"] is not None, rec
    assert rec["detail"]["stopped"] == [server_proc.pid]
    assert rec["detail"]["still_stopped"] == [server_proc.pid]
    assert rec["detail"]["agent_host"]
    assert proc_state(server_proc.pid) not in ("T", "t")


def test_agent_lease_expiry_reverts_pause_and_hog(tmp_path, server_proc) -> None:
    """The master goes quiet (no heartbeat, no request): after the lease the agent itself
    continues the paused server and kills the hog — and not before."""
    running, stop = _start(tmp_path, lease_s=0.6)
    try:
        client = AgentClient(running.url, TOKEN)
        pause = client.call(
            "POST",
            "actions",
            {"action": "pause", "params": {"duration_s": 60}, "pid": server_proc.pid},
        )
        hog = client.call(
            "POST",
            "actions",
            {
                "action": "cpu_hog",
                "params": {"cores": 1, "duration_s": 60, "pin": "none"},
                "pid": server_proc.pid,
            },
        )
        (hog_pid,) = hog["detail"]["pids"]
        assert proc_state(server_proc.pid) in ("T", "t")
        assert psutil.pid_exists(hog_pid)
        # heartbeats keep the lease: 1.2 s of them (2 × the lease) and both still hold
        for _ in range(6):
            client.call("POST", "heartbeat")
            time.sleep(0.2)
        assert proc_state(server_proc.pid) in ("T", "t")
        assert psutil.Process(hog_pid).status() != psutil.STATUS_ZOMBIE
        # silence: reverted by the agent
        assert _until(lambda: proc_state(server_proc.pid) not in ("T", "t"), 5.0)
        assert _until(lambda: not psutil.pid_exists(hog_pid), 5.0)
        assert running.agent.expired and not running.agent.active
        # the master, back, reads why (revert by id answers the detail)
        detail = client.call("POST", f"actions/{pause['id']}/revert")["detail"]
        assert "lease expired" in detail["interrupted"]
    finally:
        stop()


def test_agent_exit_reverts(tmp_path, server_proc) -> None:
    running, stop = _start(tmp_path)
    client = AgentClient(running.url, TOKEN)
    client.call(
        "POST", "actions", {"action": "pause", "params": {"duration_s": 60}, "pid": server_proc.pid}
    )
    assert proc_state(server_proc.pid) in ("T", "t")
    stop()  # what SIGTERM/SIGINT/atexit call
    assert proc_state(server_proc.pid) not in ("T", "t")


def test_agent_sigterm_reverts(tmp_path, server_proc) -> None:
    """The real `harness agent` process: SIGTERM while a pause is applied continues it."""
    port = _free_port()
    env = {**os.environ, "HARNESS_AGENT_TOKEN": TOKEN}
    p = subprocess.Popen(
        [sys.executable, "-m", "harness", "agent", "--port", str(port), "--dir", str(tmp_path)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "listening on" in p.stderr.readline()
        client = AgentClient(f"http://127.0.0.1:{port}", TOKEN)
        client.call(
            "POST",
            "actions",
            {"action": "pause", "params": {"duration_s": 60}, "pid": server_proc.pid},
        )
        assert proc_state(server_proc.pid) in ("T", "t")
        p.terminate()
        p.wait(15)
        assert proc_state(server_proc.pid) not in ("T", "t")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)


def _free_port() -> int:
    from harness.sut import free_port

    return free_port()


# -- clocks and samples --------------------------------------------------------------


def test_agent_clock_offset_math() -> None:
    # agent 2.5 s ahead; the reply left the agent halfway through a 40 ms round trip
    probes = [(100.0, 102.52, 100.04), (200.0, 202.51, 200.02), (300.0, 302.6, 300.2)]
    offset, rtt = clock_offset(probes)
    assert rtt == pytest.approx(0.02)  # the shortest round trip wins
    assert offset == pytest.approx(2.5)
    # sample times move onto the master's clock
    meta = shift_meta({"started_unix": 1000.0, "stopped_unix": 1060.0, "x": 1}, offset)
    assert meta["started_unix"] == pytest.approx(997.5)
    assert meta["stopped_unix"] == pytest.approx(1057.5)
    assert meta["clock_offset_s"] == offset and meta["x"] == 1


def test_agent_live_clock(agent) -> None:
    """Against a live agent on this host the offset is within half a round trip of 0."""
    _, offset, rtt = AgentClient(agent.url, TOKEN).measure_clock()
    assert abs(offset) <= rtt / 2 + 1e-3


def test_agent_samples_copied_back(agent, server_proc, tmp_path) -> None:
    """The agent's sampler files land in the run's samples/ (incrementally, then in
    full) and read_samples reads them like a local sampler's; the generator's column is
    blank (the generator is not on the agent's host)."""
    sut = RemoteSut(AgentClient(agent.url, TOKEN), server_proc.pid)
    sut.clock_offset_s = 100.0  # pretend the agent's clock runs 100 s ahead
    out = tmp_path / "samples"
    sampler = sut.start_sampler(out, None)
    assert _until(
        lambda: (
            (sampler.fetch(), (out / "process.csv").exists())[1]
            and len((out / "process.csv").read_text().splitlines()) >= 3
        ),
        15.0,
    )
    rows_mid = len((out / "process.csv").read_text().splitlines())
    samples = sampler.finish()
    assert samples is not None
    server = samples["server"]
    assert server["pid"] == server_proc.pid and server["finished"]
    assert len(server["series"]["rss_bytes"]) >= rows_mid - 1 >= 2
    meta = json.loads((out / "sampler.json").read_text())
    assert meta["clock_offset_s"] == 100.0
    assert abs(meta["started_unix"] - (time.time() - 100.0)) < 60
    assert server["started_unix"] == meta["started_unix"]
    # the agent's own CPU is never the generator's; the master's measurement 100 s away
    # (the pretended offset) matches no agent tick, so nothing is misattributed either
    assert all(v is None for v in samples["system"]["series"]["loadgen_cpu_pct"])
    assert samples["system"]["loadgen_processes"] == []
    assert not agent.agent.samplers  # removed on the agent once copied


# -- the master's wiring ---------------------------------------------------------------


def test_agent_options_and_token_stay_home(tmp_path) -> None:
    """--agent takes --sut-pid (its pid there) and refuses --sut-cmd; the token never
    travels to workers nor onto a command line."""
    import argparse

    from harness.load.options import Options, options_from
    from harness.locust_run import Target

    def parsed(**kw) -> argparse.Namespace:
        base = dict(
            scenario="steady_state",
            mode="quick",
            model=None,
            sut_pid=None,
            sut_cmd=None,
            sut_cores=None,
            out=str(tmp_path),
            harness_input=None,
            sample_request=None,
            closed_loop=None,
            seed=None,
            max_in_flight=None,
            calibrate_s=None,
            capacity_rps=None,
            request_timeout=None,
            ready_timeout=60.0,
            no_sample=False,
            no_verify=False,
            duration=None,
            checklist=None,
            run_time=None,
            num_users=None,
            spawn_rate=None,
            agent_url=None,
            agent_token=None,
        )
        return argparse.Namespace(**{**base, **kw})

    # no --sut-pid: the agent's own server (harness agent --sut-cmd), asked at preflight
    assert options_from(parsed(agent_url="http://10.0.0.5:8765")).sut_pid is None
    with pytest.raises(ConfigError, match="--agent and --sut-cmd"):
        options_from(parsed(agent_url="http://h:1", sut_cmd="x --port {port}"))
    opts = options_from(parsed(agent_url="http://h:1", sut_pid=42, agent_token=TOKEN))
    assert (opts.agent_url, opts.agent_token) == ("http://h:1", TOKEN)
    wire = opts.to_wire()
    assert wire["agent_token"] is None and TOKEN not in json.dumps(wire)
    assert Options.from_wire(wire).agent_url == "http://h:1"
    t = Target(url="http://h:8000", sut_pid=42, agent_url="http://h:1", agent_token=TOKEN)
    assert "--agent" in t.locust_args() and TOKEN not in " ".join(t.locust_args())
    assert t.locust_env()["HARNESS_AGENT_TOKEN"] == TOKEN
    assert TOKEN not in json.dumps(t.describe()) and TOKEN not in repr(t)


def test_agent_cli_checks_before_load(agent, server_proc, tmp_path) -> None:
    """`harness run --agent`: a wrong token or a pid not on the agent's host is exit 2 in
    seconds, one line naming the fix, before any server or Locust starts."""
    base = [
        sys.executable,
        "-m",
        "harness",
        "run",
        "steady_state",
        "--target",
        "http://127.0.0.1:9",
        "--agent",
        agent.url,
        "--out",
        str(tmp_path),
    ]
    env = {**os.environ, "HARNESS_AGENT_TOKEN": "wrong"}
    r = subprocess.run(
        [*base, "--sut-pid", str(server_proc.pid)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 2, r.stderr
    assert "refused the token" in r.stderr and r.stderr.count("\n") == 1
    env["HARNESS_AGENT_TOKEN"] = TOKEN
    r = subprocess.run(
        [*base, "--sut-pid", "999999999"], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 2 and "no process 999999999 on the agent's host" in r.stderr
    r = subprocess.run(base, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "--sut-pid" in r.stderr


def test_agent_side_tasks(agent, server_proc, tmp_path) -> None:
    """The master's side tasks with the server on an agent's host: the timeline's pause
    went through the agent (ok, with its evidence) and the agent's samples come back as
    the run's server series — nothing skipped for lack of a local pid."""
    import gevent

    from harness.load.side_tasks import SideTasks

    events = [_event("pause", 0.4)]
    sut = connect_sut(agent.url, TOKEN, server_proc.pid, events)
    control = SimpleNamespace(handle=sut, pid=lambda: sut.pid)
    tasks = SideTasks()
    samples_dir = tmp_path / "samples"
    try:
        tasks.start_sampler(control, samples_dir, "http://127.0.0.1:9/metrics")
        tasks.start_chaos(SimpleNamespace(chaos=events), control, time.time() + 0.5)
        assert tasks.timeline is not None and tasks.timeline.join(10)
        gevent.sleep(2.5)  # the follow greenlet copies while the run goes
        assert (samples_dir / "process.csv").exists()
        samples = tasks.stop(samples_dir)
    finally:
        sut.close()
    (rec,) = tasks.chaos_records()
    assert rec["ok"] and rec["detail"]["stopped"] == [server_proc.pid], rec
    assert rec["detail"]["agent_host"] == sut.host
    assert samples is not None and samples["server"]["pid"] == server_proc.pid
    assert len(samples["server"]["series"]["t"]) >= 2
    # the generator's CPU measured here (this process's tree), on the agent's tick grid:
    # what the validity rule needs to judge saturation
    system = samples["system"]
    assert any(v is not None for v in system["series"]["loadgen_cpu_pct"]), system["series"]
    assert os.getpid() in [p["pid"] for p in system["loadgen_processes"]]
    assert sut.agent_doc["clock_offset_s"] is not None


def test_agent_kill_needs_restart_false(agent, server_proc) -> None:
    """The agent runs no server of its own: kill with restart is refused before load
    (exit 2, naming restart = false); without restart the kill lands, with its evidence."""
    with pytest.raises(ConfigError, match="restart = false"):
        connect_sut(agent.url, TOKEN, server_proc.pid, [_event("kill", 0.0)])
    events = [_event("kill", 0.0, restart=False)]
    sut = connect_sut(agent.url, TOKEN, server_proc.pid, events)
    try:
        records = Timeline(events, sut, actions=sut.chaos_actions, handle_signals=False).run()
    finally:
        sut.close()
    (rec,) = records
    assert rec["ok"], rec
    assert rec["detail"]["found"] is True and rec["detail"]["gone"] is True
    assert server_proc.wait(5) is not None


def test_agent_loadgen_merge_aligns_by_wall_clock(tmp_path) -> None:
    """The master's generator CPU lands on the agent's ticks by wall-clock time, the
    agent's times moved by the offset; a tick with no local figure near it stays empty."""
    from harness.agent.loadgen import merge

    samples, local = tmp_path / "samples", tmp_path / "local"
    samples.mkdir()
    local.mkdir()
    offset = 50.0  # the agent's clock is 50 s ahead
    (samples / "system.csv").write_text(
        "t,ts,late_s,cpu_pct,cpu0_pct,loadgen_cpu_pct\n"
        + "".join(f"{t},{1050.0 + t},0,10,10,\n" for t in (1.0, 2.0, 3.0, 9.0))
    )
    # local ticks 0.3 s off the agent's, at master times 1001.3…1004.3
    (local / "system.csv").write_text(
        "t,ts,late_s,cpu_pct,cpu0_pct,loadgen_cpu_pct\n"
        + "".join(f"{t},{1000.3 + t},0,5,5,{10 * t}\n" for t in (1.0, 2.0, 3.0, 4.0))
    )
    (local / "loadgen.csv").write_text(
        "t,pid,name,cpu_pct,rss_bytes\n"
        + "".join(f"{t},7,locust,{10 * t},1\n" for t in (1, 2, 3, 4))
    )
    assert merge(samples, local, offset) == 3
    from harness.collectors import read_samples

    system = read_samples(samples)["system"]
    # agent t=1 (master 1001.0) ↔ local t=1 (1001.3): 10 %; agent t=9 has no neighbour
    assert system["series"]["loadgen_cpu_pct"] == [10.0, 20.0, 30.0, None]
    (proc,) = system["loadgen_processes"]
    assert proc["pid"] == 7 and proc["cpu_pct"] == [10.0, 20.0, 30.0, None]


# -- a server the agent started -----------------------------------------------------------


def test_agent_without_a_server_of_its_own_needs_a_pid(agent) -> None:
    from harness.agent.client import agent_facts

    with pytest.raises(ConfigError, match="no server of its own"):
        agent_facts(agent.url, TOKEN, None)


@pytest.mark.slow
def test_agent_restarts_the_server_it_started(tmp_path) -> None:
    """harness agent --sut-cmd: the master finds the server without a pid, kill chaos
    restarts it on the agent's host, the agent's sampler follows the new pid, the
    master's handle follows it too, and the agent stops the server when it exits."""
    from harness.agent.client import agent_facts
    from harness.load.preflight import TargetFacts, server_cores, unsupported_reason

    cmd = f"{sys.executable} -m harness_reference_server --port {{port}} --model sim"
    running, stop = _start(tmp_path, sut_cmd=cmd)
    try:
        running.agent.start_sut()
        first = running.agent.sut.pid
        facts = agent_facts(running.url, TOKEN, None)
        assert facts["sut_pid"] == first and facts["agent_restarts"] is True
        assert facts["remote_cores"] == tuple(sorted(os.sched_getaffinity(first)))
        # preflight: a kill + restart scenario is refused for a server an agent attached by
        # pid (the agent waits for no supervisor), not for one it started
        events = [SimpleNamespace(action="kill", params={"restart": True}, duration_s=1.0)]
        scenario = SimpleNamespace(
            load=SimpleNamespace(fresh_sut=False), chaos=events, linearity=None
        )
        attached_by_agent = TargetFacts(None, True, sut_pid=first, remote_cores=(0,))
        assert unsupported_reason(scenario, attached_by_agent) is not None
        ok = TargetFacts(None, True, **facts)
        assert unsupported_reason(scenario, ok) is None
        assert server_cores(ok) == facts["remote_cores"]

        sut = connect_sut(running.url, TOKEN, None, [_event("kill", 0.5, restart=True)])
        try:
            assert sut.can_restart and sut.pid == first
            sampler = sut.start_sampler(tmp_path / "samples", None)
            time.sleep(2.5)
            records = Timeline(
                [_event("kill", 0.5, restart=True)],
                sut,
                actions=sut.chaos_actions,
                handle_signals=False,
            ).run()
            record = records[0]
            assert record.get("error") is None, record
            detail = record["detail"]
            assert detail["old_pid"] == first and detail["gone"] is True
            second = detail["new_pid"]
            assert second != first and psutil.pid_exists(second)
            assert proc_state(first) is None
            assert sut.alive() and sut.pid == second  # the handle followed the new pid
            time.sleep(2.5)
            samples = sampler.finish()
            meta = json.loads((tmp_path / "samples" / "sampler.json").read_text())
            assert [r["pid"] for r in meta["retargets"]] == [second]
            assert samples is not None
        finally:
            sut.close()
    finally:
        stop()
    assert not psutil.pid_exists(second) or proc_state(second) in ("Z", None)


def test_agent_a_revert_under_way_is_waited_for_not_missed(tmp_path, server_proc) -> None:
    """The lease reverts an action while the master asks for the same revert: the master
    gets the detail once the revert is done (it used to get 404 in between)."""
    from harness.chaos.base import Action

    entered, release = threading.Event(), threading.Event()

    class Slow(Action):
        name = "slow"

        def _apply(self) -> None:
            self.detail["applied"] = True

        def _revert(self) -> None:
            entered.set()
            release.wait(5)
            self.detail["reverted"] = True

    actions = {"slow": lambda _t, p: Slow(p.get("duration_s"))}
    running, stop = _start(tmp_path, allow=("slow",), actions=actions)
    try:
        doc = running.agent.apply("slow", {"duration_s": 1.0}, server_proc.pid)
        first = threading.Thread(
            target=running.agent.revert, args=(doc["id"], "lease"), name="agent-test"
        )
        first.start()
        assert entered.wait(5)
        got: dict = {}
        second = threading.Thread(
            target=lambda: got.update(running.agent.revert(doc["id"])), name="agent-test2"
        )
        second.start()
        time.sleep(0.2)
        assert not got  # waiting for the first revert, not answered 404
        release.set()
        first.join(5)
        second.join(5)
        assert got["detail"] == {"applied": True, "reverted": True, "interrupted": "lease"}
    finally:
        release.set()
        stop()


# -- beyond loopback: HTTPS, or plain HTTP only when asked -------------------------------------


def test_an_agent_other_hosts_reach_needs_tls_or_says_plain_http(tmp_path):
    with pytest.raises(ConfigError, match="--tls-cert FILE --tls-key FILE.*--plain-http"):
        AgentConfig(token=TOKEN, bind="0.0.0.0").validate()
    AgentConfig(token=TOKEN, bind="0.0.0.0", plain_http=True).validate()
    AgentConfig(token=TOKEN, bind="::1").validate()  # loopback: no one else reaches it
    with pytest.raises(ConfigError, match="go together"):
        AgentConfig(token=TOKEN, bind="0.0.0.0", tls_cert="c.pem").validate()
    with pytest.raises(ConfigError, match="no such file"):
        AgentConfig(
            token=TOKEN, tls_cert=str(tmp_path / "c"), tls_key=str(tmp_path / "k")
        ).validate()


@needs_openssl
def test_an_https_agent_answers_a_master_that_trusts_its_ca_only(tmp_path, monkeypatch):
    certs = make_certs(tmp_path / "pki")
    running, stop = _start(tmp_path, tls_cert=str(certs["cert"]), tls_key=str(certs["key"]))
    url = running.url.replace("http://", "https://")
    try:
        monkeypatch.delenv("HARNESS_AGENT_CA_CERT", raising=False)
        with pytest.raises(ConfigError, match="TLS handshake with agent .*--agent-ca-cert"):
            AgentClient(url, TOKEN).call("GET", "info")
        assert AgentClient(url, TOKEN, ca_cert=str(certs["ca"])).call("GET", "info")["netns"]
        monkeypatch.setenv("HARNESS_AGENT_CA_CERT", str(certs["ca"]))  # as Locust gets it
        assert AgentClient(url, TOKEN).call("GET", "info")["allow"] == list(
            running.agent.config.allow
        )
        # a plain-HTTP client on the HTTPS port is dropped, and the agent serves on
        with pytest.raises(ConfigError, match="unreachable"):
            AgentClient(running.url, TOKEN, timeout_s=5).call("GET", "info")
        assert AgentClient(url, TOKEN).call("GET", "info")["allow"] == list(
            running.agent.config.allow
        )
    finally:
        stop()
