"""Two hosts without a second machine: two Linux network namespaces joined by a
veth pair. The "server host" runs the reference server and ``harness agent``; the "load
host" runs a Locust master and one worker that reach the server only across the link,
with ``--agent`` (HTTPS: the agent refuses a non-loopback address without TLS). A short
soak and a contention scenario (at the soak's rate: see ``CONTENTION_RATE``) run across
the link; each must pass as the healthy server passes them on one host (the quick
acceptance run and the detection matrix's controls judge them there), with every check
measured: the agent's samples must be in the results, and the hogs must have run on the
server's side.

The namespaces share the kernel's pid namespace, so the load host could see the server's
pid; what proves the work went through the agent is recorded in the results: ``sut.agent``
names the agent's network namespace (the server's, not the master's), every chaos record
carries the agent's host and its own evidence, and samples/sampler.json carries the
clock offset the master applied.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.testing.locust_runs import (
    MECHANICS_CHECKLIST,
    REPO,
    locust_cmd,
    scenario_result,
    shipped_scenario_with,
    stop,
)
from harness.testing.tls import make_certs

pytestmark = pytest.mark.slow

TOKEN = "netns-agent-token"
SUBNET = "10.213.77"
SERVER_IP, LOAD_IP = f"{SUBNET}.1", f"{SUBNET}.2"
SERVER_PORT, AGENT_PORT, MASTER_PORT = 8000, 8765, 5557
# short, but long enough for what each proves: the soak's trends need 8 buckets after
# the warm-up to be judged, and a healthy server's must come out a pass, not inconclusive:
# the first 30 s of ten healthy quick soaks judge as their whole minute does (rss slope
# 0.05-0.76 MiB/min against 1.0, threads and fds flat; 15 s left 4 of 10 inconclusive);
# the contention run proves the hogs go through the agent and must pass as on one host:
# at half its quick length (30 s) the 6 s after the last hog left contention.recovery_s
# one second more than its 5 s hold, and a CI run failed it ("never stayed back"); at
# 45 s the after-period was 9 s, and a fresh-clone run on a jittery box failed it so too:
# it runs its whole quick length (36 s: one hog block, 12 s after it). It failed so at its
# earlier 60 s (two hog blocks) too: offered 0.7x of the soak's probe (609.5 req/s), the server's core was 96-98 % busy
# in the baselines, and after the second hog it stayed at 100 % with p99 oscillating
# 100-412 ms against a 270 ms band — the server's edge, not the agent's doing (the
# one-host acceptance run offered 358 req/s that session). What this test proves is the
# agent's part (hogs on the server's side, its samples, the link), so the contention run
# offers the rate the soak before it sustained on the same server across the same link,
# 0.6x of the same probe (``CONTENTION_RATE``); overload and recovery at the scenario's
# 0.7x are judged on one host by the acceptance run and the detection matrix.
DURATION_S = {"soak": 30, "contention": 36}
CONTENTION_RATE = "0.6x"
SHIPPED_CONTENTION_RATE = 'rate = "0.7x"'


def _scenario_file(scenario: str, out: Path) -> str:
    """The scenario as run here: the shipped one, or for contention a copy offering
    ``CONTENTION_RATE`` (everything else as shipped)."""
    if scenario != "contention":
        return scenario
    instead = f'rate = "{CONTENTION_RATE}"'
    return str(shipped_scenario_with("contention", SHIPPED_CONTENTION_RATE, instead, out))


SOAK_CHECKS = ("soak.rss_trend", "soak.threads_trend", "soak.fds_trend")


def _why_not() -> str | None:
    """Why this machine cannot build network namespaces (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux-only"
    if os.geteuid() != 0:
        return "building network namespaces needs root (CI runs as root)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` to build network namespaces"
    if shutil.which("openssl") is None:
        return "needs the openssl CLI for the agent's throwaway certificate"
    probe = f"h13probe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if r.returncode != 0:
        return f"`ip netns add` failed here ({r.stderr.strip()}): no namespaces in this container"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Hosts:
    server_ns: str
    load_ns: str
    procs: list[subprocess.Popen]
    server: subprocess.Popen | None = None
    agent_ca: Path | None = None  # the CA that signed the agent's certificate

    def popen(self, ns: str, cmd: list[str], core: int | None = None, **kw) -> subprocess.Popen:
        """``cmd`` inside namespace ``ns`` (``ip netns exec`` and ``taskset`` exec into
        it: the pid is the command's own), stopped in the fixture's ``finally``.

        Each in its own session, as SutProcess starts a server and as a host runs a
        service: with autogroup scheduling a session is a CPU group, and a server left in
        pytest's session (with every other process of the test) kept 85-95 % of its core
        against the contention scenario's hog in some seconds — the hog got 20-24 % of
        the core in two fresh-clone CIs and the run was (rightly) invalid: "the hogs took
        little CPU from the server"."""
        pin = ["taskset", "-c", str(core)] if core is not None else []
        p = subprocess.Popen(
            ["ip", "netns", "exec", ns, *pin, *cmd], cwd=REPO, start_new_session=True, **kw
        )
        self.procs.append(p)
        return p

    def run(self, ns: str, code: str, timeout: float = 30) -> str:
        r = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", code],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout


def _cores() -> tuple[int, int]:
    """(load generator core, server core): the last core for the server, like --sut-cmd."""
    cores = sorted(os.sched_getaffinity(0))
    return cores[0], cores[-1]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory) -> Iterator[Hosts]:
    why = _why_not()
    if why is not None:
        pytest.skip(why)
    tag = str(os.getpid())[-6:]
    h = Hosts(f"h13srv{tag}", f"h13lg{tag}", [])
    veth_s, veth_l = f"h13s{tag}", f"h13l{tag}"
    logs = tmp_path_factory.mktemp("netns-logs")
    certs = make_certs(logs / "pki", ips=(SERVER_IP,))
    h.agent_ca = certs["ca"]
    try:
        _ip("netns", "add", h.server_ns)
        _ip("netns", "add", h.load_ns)
        _ip("link", "add", veth_s, "type", "veth", "peer", "name", veth_l)
        _ip("link", "set", veth_s, "netns", h.server_ns)
        _ip("link", "set", veth_l, "netns", h.load_ns)
        for ns, dev, addr in ((h.server_ns, veth_s, SERVER_IP), (h.load_ns, veth_l, LOAD_IP)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        _, server_core = _cores()
        h.server = h.popen(
            h.server_ns,
            [
                sys.executable,
                "-m",
                "harness_reference_server",
                "--host",
                SERVER_IP,
                "--port",
                str(SERVER_PORT),
            ],
            core=server_core,
            stdout=open(logs / "server.log", "wb"),  # noqa: SIM115 (the child holds it)
            stderr=subprocess.STDOUT,
        )
        h.popen(
            h.server_ns,
            [
                sys.executable,
                "-m",
                "harness",
                "agent",
                "--bind",
                SERVER_IP,
                "--port",
                str(AGENT_PORT),
                "--dir",
                str(logs / "agent"),
                # the agent listens where the other host reaches it: over TLS, as it must
                "--tls-cert",
                str(certs["cert"]),
                "--tls-key",
                str(certs["key"]),
            ],
            env={**os.environ, "HARNESS_AGENT_TOKEN": TOKEN},
            stdout=open(logs / "agent.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        # ready, seen from the load host: across the link
        h.run(
            h.load_ns,
            "import time, urllib.request\n"
            "for i in range(300):\n"
            "    try:\n"
            f"        urllib.request.urlopen('http://{SERVER_IP}:{SERVER_PORT}/v2/health/ready',"
            " timeout=2); break\n"
            "    except Exception: time.sleep(0.2)\n"
            "else: raise SystemExit('server not ready')\n",
            timeout=90,
        )
        yield h
    finally:
        for p in reversed(h.procs):
            stop(p)
        for ns in (h.server_ns, h.load_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", veth_s], capture_output=True)  # if left in root
        leftovers = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        assert h.server_ns not in leftovers.stdout and h.load_ns not in leftovers.stdout


# the capacity the first run calibrated (across the link), pinned for the run after it:
# one calibration fewer
_PINNED: dict[str, float] = {}


def _run(hosts: Hosts, ns: str, scenario: str, out: Path, agent: bool) -> dict:
    """A master and one worker in ``ns`` against the server; the scenario's results."""
    assert hosts.server is not None
    load_core, _ = _cores()
    args = [
        "--master",
        "--headless",
        "--only-summary",
        "--expect-workers",
        "1",
        "--master-bind-host",
        "127.0.0.1",
        "--master-bind-port",
        str(MASTER_PORT),
        "--host",
        f"http://{SERVER_IP}:{SERVER_PORT}",
        "--sut-pid",
        str(hosts.server.pid),
        "--scenario",
        _scenario_file(scenario, out.parent / "scenario"),
        "--quick",
        "--duration",
        str(DURATION_S[scenario]),
        "--out",
        str(out),
        "--checklist",
        MECHANICS_CHECKLIST,
    ]
    if "capacity" in _PINNED:
        args += ["--capacity-rps", f"{_PINNED['capacity']:.1f}"]
    env = dict(os.environ)
    if agent:
        args += ["--agent", f"https://{SERVER_IP}:{AGENT_PORT}"]
        env["HARNESS_AGENT_TOKEN"] = TOKEN
        env["HARNESS_AGENT_CA_CERT"] = str(hosts.agent_ca)
    master = hosts.popen(
        ns,
        locust_cmd(*args),
        core=load_core,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    worker = hosts.popen(
        ns,
        locust_cmd("--worker", "--master-host", "127.0.0.1", "--master-port", str(MASTER_PORT)),
        core=load_core,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        output, _ = master.communicate(timeout=240)
        worker.wait(30)
    finally:
        stop(master)
        stop(worker)
    assert (out / "results.json").exists(), output[-4000:]
    sc = scenario_result(out)
    if sc.get("calibration") and sc.get("capacity_rps"):
        _PINNED.setdefault("capacity", float(sc["capacity_rps"]))
    return {
        "rc": master.returncode,
        "output": output,
        "doc": json.loads((out / "results.json").read_text()),
        "sc": sc,
    }


def _unmeasured(check: dict) -> bool:
    """Skipped for want of data (no samples, no pid, no hog that ran), not on statistics."""
    why = (check.get("skipped") or "") if check["passed"] is None else ""
    return any(k in why for k in ("no server-side samples", "no pid", "no CPU hog ran"))


def _failed(sc: dict) -> list[str]:
    """Each failed or unjudged check with its value, limit and why: what an assertion
    must show (a scenario comes out not judged when a check defining it was skipped)."""
    return (
        [
            f"{c['id']}={c.get('value')} (limit {c.get('threshold')}): {c.get('detail', '')[:300]}"
            for c in sc["checks"]
            if c["passed"] is False
        ]
        + [
            f"{c['id']} not judged: {(c.get('skipped') or '')[:300]}"
            for c in sc["checks"]
            if c["passed"] is None
        ]
        + [f"invalid: {sc.get('validity')}"] * (sc["verdict"] == "invalid")
    )


def _netns_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


@pytest.mark.parametrize("scenario", ["soak", "contention"])
def test_agent_two_namespaces(hosts: Hosts, scenario: str, tmp_path: Path) -> None:
    two = _run(hosts, hosts.load_ns, scenario, tmp_path / "two-hosts", agent=True)
    sc2 = two["sc"]
    tail = two["output"][-3000:]

    # the agent did the server-side work, on the server's side of the link
    agent = two["doc"]["sut"]["agent"]
    assert hosts.server is not None
    assert agent["netns"] == _netns_of(hosts.server.pid), agent
    load_netns = hosts.run(hosts.load_ns, "import os; print(os.readlink('/proc/self/ns/net'))")
    assert agent["netns"] != load_netns.strip(), agent
    assert abs(agent["clock_offset_s"]) <= 0.5 and agent["rtt_s"] < 1.0, agent
    assert TOKEN not in json.dumps(two["doc"])
    meta = json.loads((tmp_path / "two-hosts" / "samples" / "sampler.json").read_text())
    assert meta["agent"]["url"].endswith(f":{AGENT_PORT}") and "clock_offset_s" in meta

    # the agent's samples are the run's server series
    server = sc2["server"]
    assert server is not None and server["pid"] == hosts.server.pid, tail
    assert len(server["series"]["rss_bytes"]) >= 20, tail
    # the harness's own connections to the server, in both runs: the worker is in no
    # sampled process tree (and across the link the agent sees no process of ours), so
    # they are the worker's own counts — never left in the server's socket count, where
    # the soak's socket-leak test would judge a growing keep-alive pool as the server's
    for sc in (sc2,):
        ser = sc["server"]["series"]
        mid = slice(len(ser["t"]) // 4, 3 * len(ser["t"]) // 4)  # under load
        conns, socks = ser["client_conns"][mid], ser["socket_fds"][mid]
        # a count read late leaves its tick unknown (1 of 61 in a contention run, at a
        # stage's spawn); the leak checks judge the net series on the known ticks when
        # they are 90 % or more (harness/checks/soak.py)
        known = [c for c in conns if c is not None]
        assert len(known) >= 0.9 * len(conns), ser["client_conns"]
        conns = known
        assert sorted(conns)[len(conns) // 2] >= 0.5 * sorted(socks)[len(socks) // 2], (
            conns,
            socks,
        )
    # the generator's CPU, measured on the load host (the master's tree), on the agent's
    # ticks: generator saturation is judged as on one host
    assert any(v is not None for v in sc2["system"]["series"]["loadgen_cpu_pct"]), tail
    assert sc2["system"]["loadgen_processes"], tail
    # the worker runs in no sampled process tree (started on its own): its CPU comes from
    # its heartbeats, on the same ticks, so a saturated worker would be judged too
    beats = [p for p in sc2["system"]["loadgen_processes"] if p.get("worker")]
    assert len(beats) == 1, sc2["system"]["loadgen_processes"]
    judged = [v for v in beats[0]["cpu_pct"] if v is not None]
    assert len(judged) >= 0.8 * len(sc2["system"]["series"]["t"]), beats[0]
    assert 0 < max(judged) <= 100, beats[0]

    if scenario == "soak":
        checks = {c["id"]: c for c in sc2["checks"]}
        for cid in SOAK_CHECKS:
            assert not _unmeasured(checks[cid]), (cid, checks[cid]["skipped"])
    else:
        hogs = [r for r in sc2["chaos"] if r["action"] == "cpu_hog"]
        assert hogs, sc2["chaos"]
        for r in hogs:
            assert r["ok"] and r["end_s"] is not None, r
            assert r["detail"]["agent_host"] and r["detail"]["hog_cpu_s"], r
            assert all(c is not None and c > 0 for c in r["detail"]["hog_cpu_s"]), r
        # the evidence rules accepted the agent's hog records: the run is judged
        assert sc2["verdict"] != "invalid", sc2["checks"]

    # the verdict a healthy server earns on one host (the quick acceptance run judges
    # these scenarios on one host, and the detection matrix's controls): a pass, every
    # check judged or inconclusive on statistics — never unmeasured for want of the
    # agent's samples or hogs
    assert sc2["verdict"] == "pass" and two["rc"] == 0, (
        f"two hosts {sc2['verdict']} (not passed: {_failed(sc2)})",
        tail,
    )
    for c in sc2["checks"]:
        assert not _unmeasured(c), c
