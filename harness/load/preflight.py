"""What a scenario needs from its target, checked before any load starts.

A scenario the target cannot support would run for minutes and then judge nothing (or,
worse, pass something it did not measure: a "cold start" against a server that has been
warm for an hour). ``unsupported_reason`` says why, in one sentence naming the fix;
``harness run`` and a plain ``locust -f`` turn it into a usage error (exit 2) within
seconds, and ``harness acceptance`` leaves the scenario out of its plan, names it with the
reason in the verdict line, and runs the rest. ``check_transport`` does the same for the
connection itself: an https:// target whose certificate does not verify is refused (exit 2)
before any scenario starts.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from harness.catalog import CATALOG
from harness.errors import ConfigError
from harness.load.scenario_model import Scenario

_SUT_CMD_EXAMPLE = (
    "--sut-cmd 'python -m harness_reference_server --port {port} --workers {threads}'"
)


@dataclass(frozen=True)
class TargetFacts:
    """What is known about the target before anything is started."""

    sut_cmd: str | None  # the harness starts the server from this template
    attached: bool  # --target / --host: a server someone else started
    sut_pid: int | None = None
    sut_cores: str | None = None  # --sut-cores as given
    linearity_max_n: int = 0  # the checklist's linearity.efficiency max_n (0 = the cores)
    # with --agent: the server's cores on the agent's host (not this one's), and whether
    # the agent started it (harness agent --sut-cmd) and so may restart it
    remote_cores: tuple[int, ...] | None = None
    agent_restarts: bool = False
    # a sampler will record the server's process (a pid here or through --agent, and no
    # --no-sample); None = unknown, judged as sampled
    samples_server: bool | None = None
    # check ids the user accepts unjudged (--allow-skip, the checklist's allow_skip)
    allow_skip: frozenset[str] = frozenset()


def agent_facts(url: str | None, token: str | None, pid: int | None) -> dict:
    """``TargetFacts`` fields the agent knows (exit 2 when it does not answer): the
    server's pid and cores on its host, and whether the agent may restart it."""
    if not url:
        return {"sut_pid": pid}
    from harness.agent.client import agent_facts as ask

    return ask(url, token, pid)


def server_cores(facts: TargetFacts) -> tuple[int, ...] | None:
    """The cores the server will run on, when knowable before it starts."""
    from harness import sut

    if facts.sut_cmd:
        return sut.split_cores(facts.sut_cores).sut
    if facts.remote_cores is not None:
        return facts.remote_cores
    if facts.sut_pid is not None:
        try:
            return tuple(sorted(os.sched_getaffinity(facts.sut_pid)))
        except OSError:
            return None
    return None


def check_transport(url: str | None, client: Any, timeout_s: float = 5.0) -> None:
    """An ``https://`` target: one TLS handshake before anything starts, so a certificate
    that does not verify (or a port that does not speak TLS) is a usage error in seconds
    naming --ca-cert/--insecure, not minutes of connection errors under load. A server
    that does not answer at all is left to the readiness wait, which says so."""
    from harness.load import http

    if url is None or not client.tls:
        return
    try:
        http.handshake(url, client, timeout_s)
    except http.TLSFailed as exc:
        raise ConfigError(str(exc)) from None
    except http.ConnectionFailed:
        return


def unsupported_reason(scenario: Scenario, facts: TargetFacts) -> str | None:
    """Why this target cannot run ``scenario`` so that its checks judge something; None
    when it can. Only what is knowable before load starts is judged here."""
    if scenario.load.fresh_sut and not facts.sut_cmd:
        return (
            "it times a cold start, and the harness did not start the server (--target): "
            "there is no cold start to measure — use --sut-cmd so the harness starts it"
        )
    restarts = [
        e.action
        for e in scenario.chaos
        if e.action in ("kill", "terminate") and e.params.get("restart", True)
    ]
    # a killed server attached by pid on this host comes back through its supervisor, which
    # the harness waits for; a terminated one is judged on its exit code, which only its
    # parent (the harness, with --sut-cmd) can read
    supervised = facts.sut_pid is not None and facts.remote_cores is None  # no --agent
    unsupported = [a for a in restarts if a == "terminate" or not supervised]
    if unsupported and not facts.sut_cmd and not facts.agent_restarts:
        if unsupported[0] == "terminate":
            return (
                "its terminate event judges the server's exit code and restarts it, which "
                "needs a server the harness starts (--sut-cmd): only a process's parent reads "
                "its exit code"
            )
        return (
            f"its {unsupported[0]} event restarts the server, which needs a server the harness "
            "starts (--sut-cmd), or one attached by --sut-pid on this host whose supervisor "
            "restarts it"
        )
    signalled = [e.action for e in scenario.chaos if e.action in ("pause", "kill", "terminate")]
    if signalled and not facts.sut_cmd and facts.sut_pid is None:
        return (
            f"its {signalled[0]} event signals the server's process, and no process was "
            "given: pass --sut-pid (or --sut-cmd)"
        )
    if facts.samples_server is False:
        unsampled = [
            cid
            for cid in scenario.defining_checks()
            if cid in CATALOG.server_sampled and cid not in facts.allow_skip
        ]
        if unsampled:
            return (
                f"{'its defining checks' if len(unsampled) > 1 else 'its defining check'} "
                f"{', '.join(unsampled)} read the server process's samples, and nothing will "
                "sample it: pass --sut-pid PID with --target (or let the harness start it with "
                "--sut-cmd, or sample it through --agent; and no --no-sample), or accept "
                f"{'them' if len(unsampled) > 1 else 'it'} unjudged with --allow-skip "
                f"{','.join(unsampled)}"
            )
    lin = scenario.linearity
    if lin is not None and lin.vary == "threads":
        if not facts.sut_cmd:
            return (
                "it restarts the server with 1, 2, … threads, which needs a server the "
                f'harness starts: use {_SUT_CMD_EXAMPLE}, or vary = "users" in the scenario'
            )
        if "{threads}" not in facts.sut_cmd:
            return (
                "it restarts the server with 1, 2, … threads, and --sut-cmd has no "
                f"{{threads}} placeholder: use {_SUT_CMD_EXAMPLE}"
            )
    return machine_limit(scenario, facts)


def machine_limit(scenario: Scenario, facts: TargetFacts) -> str | None:
    """Why this machine cannot host the scenario's question at all (linearity with one
    server core: nothing to scale over), whatever the target; None when it can. A
    scenario left out for this reason is optional here: its absence does not stop a pass,
    and the verdict line says why it was not judged."""
    lin = scenario.linearity
    if lin is not None:
        cores = server_cores(facts)
        if cores is not None and len(cores) < 2 and facts.linearity_max_n < 2:
            return (
                f"the server gets {len(cores)} core here (cores {list(cores)}; the load "
                "generator has the rest), so there is nothing to scale over — run on a "
                "machine with >= 4 cores, or give the server more with --sut-cores (or set "
                "max_n for linearity.efficiency in a checklist)"
            )
    return None


def checklist_max_n(path: str | None) -> Mapping[str, Any] | None:
    """The checklist's ``linearity.efficiency`` table, read raw (the load side does not
    import the checks; the checklist is validated where it is judged, and by the CLI before
    any load). Either top-level tables by check id or the same under ``[checks]``."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return None  # the judging side reports it with the fix
    table = doc.get("checks") if isinstance(doc.get("checks"), Mapping) else doc
    entry = table.get("linearity.efficiency")
    return {"linearity.efficiency": entry} if isinstance(entry, Mapping) else None


def checklist_allow_skip(path: str | None) -> frozenset[str]:
    """The checklist's ``allow_skip`` names, read raw like ``checklist_max_n`` (validated
    where the checklist is judged, and by the CLI before any load)."""
    if not path:
        return frozenset()
    try:
        with open(path, "rb") as f:
            names = tomllib.load(f).get("allow_skip")
    except (OSError, tomllib.TOMLDecodeError):
        return frozenset()
    if isinstance(names, str):
        names = [names]
    return frozenset(n for n in names or () if isinstance(n, str))


def linearity_max_n(scenario: Scenario, checklist: Mapping[str, Any] | None) -> int:
    """max_n of linearity.efficiency: the checklist's, else the scenario's, else 0."""
    for layer in (
        (checklist or {}).get("linearity.efficiency"),
        scenario.checks.get("linearity.efficiency"),
    ):
        if layer and layer.get("max_n"):
            return int(layer["max_n"])
    return 0


class Exclusion(NamedTuple):
    """A planned scenario left out before load: its name, why, and whether it is optional
    here (``machine_limit``: its absence does not stop the run's pass)."""

    name: str
    reason: str
    optional: bool = False


def exclusions(
    scenarios: Sequence[tuple[str, Scenario]],
    facts: TargetFacts,
    checklist: Mapping[str, Any] | None = None,
) -> list[Exclusion]:
    """Each scenario this target cannot support, with the reason."""
    out = []
    for name, sc in scenarios:
        f = replace(facts, linearity_max_n=linearity_max_n(sc, checklist))
        why = unsupported_reason(sc, f)
        if why is not None:
            out.append(Exclusion(name, why, optional=why == machine_limit(sc, f)))
    return out


def served_model_exclusions(
    scenarios: Sequence[tuple[str, Scenario]],
    url: str,
    client: Any,
    protocol: str | None,
    model: str | None,
    inputs: Sequence[str] = (),
) -> list[Exclusion]:
    """Against a server already running (``--target``): each scenario with an ``[llm]``
    table whose requests that server refuses by what its model list says (a request longer
    than the served context), with the preparation's own reason. The scenario's preparation
    makes the same check (``resolve_inputs``) but only when its turn comes, after the
    scenarios before it ran their load; here it is made for all of them before any load.
    A server that does not answer, or lists nothing, is left to the preparation."""
    import json

    from harness import protocols
    from harness.load import http

    out = []
    meta_by_proto: dict[str, Any] = {}
    for name, sc in scenarios:
        if sc.llm is None:
            continue
        proto = protocols.get(sc.load.protocol or protocol or protocols.DEFAULT)
        path = proto.server_metadata_path()
        if path is None or not getattr(proto, "streaming", False):
            continue
        if proto.name not in meta_by_proto:
            try:
                status, body = http.request(url.rstrip("/") + path, "GET", client=client)
                meta_by_proto[proto.name] = json.loads(body) if status == 200 else None
            except (http.RequestTimeout, http.ConnectionFailed, http.TLSFailed, ValueError):
                meta_by_proto[proto.name] = None
        meta = meta_by_proto[proto.name]
        served = model or proto.default_model(meta)
        if not isinstance(meta, dict) or not served:
            continue
        try:
            proto.resolve_inputs(meta, served, tuple(inputs), None, workload=sc.llm)
        except ConfigError as exc:
            out.append(Exclusion(name, f"configuration error: {exc}"))
    return out
