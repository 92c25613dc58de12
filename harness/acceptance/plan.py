"""What ``harness acceptance`` / ``harness run`` will run, decided before any load starts.

``PlanRequest`` is what the user asked for (the command line's options, typed: the CLI
builds it and nothing below the CLI sees argparse); ``make_plan`` checks it the way the
Locust plugin would (one ``ConfigError`` naming the fix, exit 2, in seconds), leaves out
what the target cannot support (``preflight``) and returns the ``Plan``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, ExitCode, HarnessError
from harness.load.preflight import Exclusion
from harness.locust_run import (
    RunSettings,
    Target,
    attached_core_split,
    core_split,
    default_sut_cmd,
)

# The order of the delivery checklist: cheap, fresh-server scenarios first so a broken
# server fails fast; the soak last, where a partial report is still worth having.
CHECKLIST: tuple[str, ...] = (
    "cold_start",
    "steady_state",
    "spike",
    "mixed_priority",
    "integrity",
    "contention",
    "freeze",
    "crash_restart",
    "rolling_shutdown",
    "linearity",
    "soak",
)

# Scenarios only `--full` runs. `network` would add 52 s of load (~60 s wall) to a quick
# checklist CI runs whole, already near its budget; its quick-mode proof is the detection
# matrix (reset-leak, io-lock and their healthy twins) and tests/test_network_fault*.py.
FULL_ONLY: tuple[str, ...] = ("network",)


# The checklist of an OpenAI-compatible LLM server (``--protocol openai``), judged in tokens:
# steady streams, long shared prompts (stalls), priority classes above capacity, a storm of
# client aborts, and a spike past capacity last (what it leaves behind judges no other).
LLM_CHECKLIST: tuple[str, ...] = (
    "llm_steady",
    "llm_shared_prefix",
    "llm_mixed_priority",
    "llm_abort_storm",
    "llm_spike",
)


# LLM scenarios only `--full` runs (before the spike). `llm_multi_turn` would add ~30 s to
# the quick LLM checklist CI runs whole; its quick-mode proof is a real run of it in
# tests/test_llm_multi_turn.py. `llm_soak` lasts an hour in full; its quick minute would
# add ~65 s (`--scenarios llm_soak` runs it quick: docs/scenarios.md has a measured run).
LLM_FULL_ONLY: tuple[str, ...] = ("llm_multi_turn", "llm_soak")


def checklist(mode: str, protocol: str | None = None) -> tuple[str, ...]:
    """The scenarios ``harness acceptance`` runs in ``mode``: CHECKLIST, + FULL_ONLY in full;
    for ``--protocol openai`` LLM_CHECKLIST, + LLM_FULL_ONLY in full (the spike still last)."""
    if protocol == "openai":
        if mode != "full":
            return LLM_CHECKLIST
        return LLM_CHECKLIST[:-1] + LLM_FULL_ONLY + LLM_CHECKLIST[-1:]
    return CHECKLIST + FULL_ONLY if mode == "full" else CHECKLIST


def acceptance_scenarios(
    mode: str, subset: str | None, protocol: str | None = None
) -> tuple[str, ...]:
    """The checklist of ``mode`` (and protocol), or the comma-separated ``subset`` of it
    (``--scenarios``)."""
    names = checklist(mode, protocol)
    if subset:
        valid = checklist("full", protocol)
        names = tuple(n.strip() for n in subset.split(",") if n.strip())
        unknown = [n for n in names if n not in valid]
        if unknown:
            raise ConfigError(
                f"--scenarios has {', '.join(unknown)!s}, not in the checklist. "
                f"Valid: {', '.join(valid)} (use `harness run FILE` for your own)"
            )
    return names


def declared_protocol(scenarios: tuple[str, ...]) -> str | None:
    """The protocol the scenarios declare (``[load] protocol``) when they all declare the
    same one; else None (the run's default)."""
    from harness.load.options import scenario_protocol

    found = {scenario_protocol(name) for name in scenarios}
    return found.pop() if len(found) == 1 else None


@dataclass(frozen=True, kw_only=True)
class Plan(RunSettings):
    """The scenarios to run in order, into ``out_dir``, each with these run settings."""

    scenarios: tuple[str, ...]
    out_dir: Path
    # scenarios left out before load started (harness.load.preflight.Exclusion)
    excluded: tuple[Exclusion, ...] = ()
    # more attempts for a scenario invalid only because the machine was disturbed
    retry_invalid: int = 2
    html_report: bool = True  # False: report.html is not drawn (--no-html-report)


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What the user asked ``harness acceptance`` / ``harness run`` for."""

    scenarios: tuple[str, ...]
    out_dir: Path
    single: bool = False  # `harness run`: refuse (not leave out) what the target cannot run
    mode: str = "quick"
    duration_s: float | None = None
    # the target: none of sut_cmd / url = the bundled reference server
    sut_cmd: str | None = None
    url: str | None = None
    sut_pid: int | None = None
    model: str | None = None
    protocol: str | None = None
    sut_cores: str | None = None
    headers: tuple[str, ...] | None = None  # None: $HARNESS_HEADER
    ca_cert: str | None = None
    insecure: bool = False
    metrics_url: str | None = None
    agent_url: str | None = None
    agent_token: str | None = None  # None: $HARNESS_AGENT_TOKEN
    agent_ca_cert: str | None = None  # None: $HARNESS_AGENT_CA_CERT
    # the runs
    checklist: Path | None = None
    inputs: tuple[str, ...] = ()
    sample_request: str | None = None
    allow_skip: tuple[str, ...] = ()  # as given: comma-separated, repeatable
    locust_args: tuple[str, ...] = ()
    capacity: str = "probe"  # or "peak": `harness peak`'s rate under the SLO, first
    capacity_slo_p99_ms: float = 500.0
    retry_invalid: int = 2
    html_report: bool = True


def make_plan(request: PlanRequest, show: Callable[[str], None] = print) -> Plan:
    """The plan of ``request``, every option checked before any load runs; ``show`` gets
    the progress of a peak search (``capacity="peak"``)."""
    r = request
    if r.url is None and r.sut_pid is not None:
        raise ConfigError("--sut-pid needs --target URL (the server's address)")
    if r.retry_invalid < 0:
        raise ConfigError(f"--retry-invalid has value {r.retry_invalid}; expected 0 or more")
    sut_cmd = r.sut_cmd
    if sut_cmd is None and r.url is None:
        sut_cmd = default_sut_cmd(protocol=r.protocol or declared_protocol(r.scenarios))
    target = Target(
        sut_cmd=sut_cmd,
        url=r.url,
        sut_pid=r.sut_pid,
        model=r.model,
        protocol=r.protocol,
        **deployment_of(r.headers, r.ca_cert, r.insecure, r.metrics_url),
        **agent_of(r.agent_url, r.agent_token, r.url, r.sut_pid, r.agent_ca_cert),
    )
    if r.checklist is not None:
        from harness.checks import load_checklist

        load_checklist(r.checklist)  # a bad checklist fails before any load runs
    skip_names = [n.strip() for a in r.allow_skip for n in a.split(",") if n.strip()]
    allow_skip: list[str] = []
    if skip_names:  # the checks (scipy: ~0.4 s) are imported only when there is one to check
        from harness.checks.registry import validate_allow_skip

        allow_skip = validate_allow_skip(skip_names, "--allow-skip")
    extra = list(r.locust_args)
    for spec in r.inputs:
        extra += ["--input", spec]
    if r.sample_request:
        extra += ["--sample-request", str(Path(r.sample_request).resolve())]
    loadgen_cores = None
    if target.sut_cmd is not None and target.agent_url is None:
        split = core_split(r.sut_cores)
        if split is not None:
            # Locust runs on the generator's cores, so it is told the server's (it would
            # otherwise split its own, narrower affinity)
            loadgen_cores = split[1]
            if not r.sut_cores:
                extra += ["--sut-cores", ",".join(map(str, split[0]))]
    elif target.sut_pid is not None and target.agent_url is None:
        # a server attached on this host: the generator keeps to the cores its affinity
        # leaves free (one that may run on every core shares them: nothing pinned)
        split = attached_core_split(target.sut_pid)
        loadgen_cores = split[1] if split is not None else None
    if r.sut_cores:
        extra += ["--sut-cores", r.sut_cores]
    plan = Plan(
        scenarios=resolve_scenarios(r.scenarios),
        mode=r.mode,
        out_dir=r.out_dir,
        target=target,
        checklist=r.checklist,
        duration_s=r.duration_s,
        extra_args=tuple(extra),
        retry_invalid=r.retry_invalid,
        html_report=r.html_report,
        loadgen_cores=loadgen_cores,
        allow_skip=tuple(allow_skip),
    )
    plan = without_unsupported(plan, single=r.single)
    attached = target.sut_cmd is None and target.sut_pid is not None
    plan = replace(plan, scenarios=kills_last(plan.scenarios, attached))
    if r.capacity == "peak":
        plan = with_peak_capacity(plan, r.capacity_slo_p99_ms, r.sut_cores, show)
    return plan


def with_peak_capacity(
    plan: Plan, slo_p99_ms: float, sut_cores: str | None, show: Callable[[str], None]
) -> Plan:
    """--capacity=peak: find the peak under the SLO first (harness.peak, into OUT/peak)
    and pin it as every scenario's capacity (--capacity-rps), so "0.6x" is 60 % of what
    the server sustains within the SLO rather than of the raw closed-loop probe."""
    from harness.peak.config import PeakConfig
    from harness.peak.runner import run_peak

    if any(a.startswith("--capacity-rps") for a in plan.extra_args):
        raise ConfigError("--capacity=peak and --capacity-rps are both set; give one")
    t = plan.target
    doc, code = run_peak(
        PeakConfig(slo_p99_ms=slo_p99_ms, repeats=1).validate(),
        plan.out_dir / "peak",
        sut_cmd=t.sut_cmd,
        url=t.url,
        sut_pid=t.sut_pid,
        sut_cores=sut_cores,
        model=t.model,
        protocol=t.protocol,
        show=show,
    )
    peak = doc["peak"].get("peak_rps")
    if code != ExitCode.PASS or not peak:
        from harness.report.peak import peak_sentence

        raise HarnessError(
            f"--capacity=peak found no peak: {peak_sentence(doc['peak'])} "
            f"(see {plan.out_dir / 'peak' / 'summary.md'})"
        )
    show(f"capacity: peak {peak:.1f} req/s under p99 <= {slo_p99_ms:g} ms")
    return replace(plan, extra_args=(*plan.extra_args, "--capacity-rps", repr(float(peak))))


@dataclass(frozen=True)
class _DeploymentOptions:
    """The deployment options as ``harness.load.options.deployment_options`` reads them
    (the names of the Locust plugin's parsed options)."""

    harness_header: Sequence[str] | None
    ca_cert: str | None
    insecure: bool
    metrics_url: str | None


def deployment_of(
    headers: Sequence[str] | None, ca_cert: str | None, insecure: bool, metrics_url: str | None
) -> dict[str, Any]:
    """--header/--ca-cert/--insecure/--metrics-url as ``Target`` takes them, validated the
    way the Locust plugin validates them (one ConfigError naming the fix, before anything
    starts); ``headers`` None: $HARNESS_HEADER, one header or a JSON list."""
    from harness.load.options import deployment_options

    if headers is None and os.environ.get("HARNESS_HEADER"):
        raw = os.environ["HARNESS_HEADER"]
        try:
            headers = json.loads(raw) if raw.startswith("[") else [raw]
        except ValueError:
            raise ConfigError(
                "HARNESS_HEADER starts with '[' but is not a JSON list of strings; write "
                '\'["Authorization: Bearer TOKEN", "Host: model.example.com"]\''
            ) from None
    return deployment_options(
        _DeploymentOptions(
            harness_header=list(headers) if headers is not None else None,
            ca_cert=ca_cert,
            insecure=insecure,
            metrics_url=metrics_url,
        )
    )


def agent_of(
    agent_url: str | None,
    agent_token: str | None,
    url: str | None,
    sut_pid: int | None,
    ca_cert: str | None = None,
) -> dict[str, Any]:
    """--agent/--agent-token/--agent-ca-cert as ``Target`` takes them: the agent answers
    (its certificate verifies, for https), the token is right and the pid runs on its host,
    checked now (exit 2 naming the fix) rather than after the first server start.
    ``agent_token`` None: $HARNESS_AGENT_TOKEN; ``ca_cert`` None: $HARNESS_AGENT_CA_CERT."""
    if agent_url is None:
        return {}
    if url is None:
        raise ConfigError(
            "--agent needs --target URL (the server's address; its pid on the agent's host "
            "is --sut-pid, or none when the agent started it with --sut-cmd)"
        )
    from harness.agent.client import AgentClient, RemoteSut

    token = agent_token or os.environ.get("HARNESS_AGENT_TOKEN")
    ca_cert = ca_cert or os.environ.get("HARNESS_AGENT_CA_CERT") or None
    RemoteSut(AgentClient(agent_url, token, ca_cert=ca_cert), sut_pid)
    return {"agent_url": agent_url, "agent_token": token, "agent_ca_cert": ca_cert}


def resolve_scenarios(names: Sequence[str]) -> tuple[str, ...]:
    """Check every scenario name/path before any load runs (a typo fails in a second)."""
    from harness.load.scenario import load_scenario

    for n in names:
        load_scenario(n, mode="quick")
    return tuple(names)


def kills_last(scenarios: tuple[str, ...], attached: bool) -> tuple[str, ...]:
    """The scenarios in order, those with a kill event moved after every other one when the
    server is attached by pid (the harness did not start it).

    Killed, an attached server comes back only if its supervisor restarts it; a server
    started by hand stays dead, and every scenario after the kill would find no server.
    Moved last, the kill costs only its own scenario. A server the harness starts is
    restarted by the harness: its order is kept."""
    if not attached or len(scenarios) < 2:
        return scenarios
    from harness.load.scenario import load_scenario

    kills = {s for s in scenarios if any(e.action == "kill" for e in load_scenario(s).chaos)}
    return tuple(s for s in scenarios if s not in kills) + tuple(s for s in scenarios if s in kills)


def without_unsupported(plan: Plan, single: bool) -> Plan:
    """Leave out (acceptance) or refuse (run, exit 2) what the target cannot support."""
    excluded = preflight(plan)
    if not excluded:
        return plan
    if single:
        e = excluded[0]
        raise ConfigError(f"scenario {e.name!r} cannot run against this target: {e.reason}")
    names = {e.name for e in excluded}
    kept = tuple(s for s in plan.scenarios if Path(s).stem not in names)
    if not kept:
        raise ConfigError(
            "no scenario of the plan can run against this target: "
            + "; ".join(f"{e.name}: {e.reason}" for e in excluded)
        )
    return replace(plan, scenarios=kept, excluded=tuple(excluded))


def preflight(plan: Plan) -> list[Exclusion]:
    """Each planned scenario this target cannot support, with the reason, found before
    any load starts (harness.load.preflight)."""
    from harness.load.preflight import (
        TargetFacts,
        agent_facts,
        check_transport,
        exclusions,
        served_model_exclusions,
    )
    from harness.load.scenario import load_scenario

    check_transport(plan.target.url, plan.target.client())  # https: verifies, or exit 2

    cores = None
    args = list(plan.extra_args)
    for i, a in enumerate(args):
        if a == "--sut-cores" and i + 1 < len(args):
            cores = args[i + 1]
        elif a.startswith("--sut-cores="):
            cores = a.split("=", 1)[1]
    t = plan.target
    remote = agent_facts(t.agent_url, t.agent_token, t.sut_pid)
    checklist = None
    if plan.checklist is not None:
        from harness.checks import load_checklist

        checklist = load_checklist(plan.checklist)
    facts = TargetFacts(
        sut_cmd=plan.target.sut_cmd,
        attached=plan.target.url is not None,
        sut_cores=cores,
        samples_server="--no-sample" not in args
        and bool(t.sut_cmd or t.sut_pid is not None or t.agent_url),
        allow_skip=frozenset(plan.allow_skip)
        | frozenset((checklist or {}).get("allow_skip") or ()),
        **remote,
    )
    loaded = [(Path(n).stem, load_scenario(n, mode=plan.mode)) for n in plan.scenarios]
    found = exclusions(loaded, facts, checklist)
    if t.url is not None:
        left = {e.name for e in found}
        inputs = [a for k, a in zip(args, args[1:], strict=False) if k == "--input"]
        found += served_model_exclusions(
            [(n, sc) for n, sc in loaded if n not in left],
            t.url, t.client(), t.protocol, t.model, inputs,
        )  # fmt: skip
    return found
