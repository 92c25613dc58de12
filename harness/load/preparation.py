"""Preparing one run on the master / local runner, before any load is sent.

In order: refuse a scenario the target cannot support (preflight), start or attach the
server (``SutControl``), read the server and model metadata, build the payload pool,
fetch the golden outputs, calibrate capacity when the scenario's rates are relative, and
start a fresh server when the scenario wants the load to meet a cold one. A failure
raises a ``HarnessError``; what was learned before it stays on the ``Preparation`` (the
results of a failed run still say how long the server took to start).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import protocols
from harness.errors import ConfigError, TargetUnavailable
from harness.load import calibrate, http, payloads, target
from harness.load.integrity import Golden
from harness.load.options import Options
from harness.load.scenario import Scenario
from harness.load.sut_control import SutControl

log = logging.getLogger("harness.load")


# the keyword-only arguments of WireProtocol.resolve_inputs, passed only when set
RESOLVE_KEYWORDS = (("batch_size", "--batch-size", 1), ("input_data", "--input-data", None))


def resolve_inputs(
    proto: protocols.WireProtocol,
    meta: Any,
    model: str,
    o: Options,
    workload: Mapping[str, Any] | None = None,
) -> Any:
    """``proto.resolve_inputs`` with the options it is given; ``--batch-size`` /
    ``--input-data`` only when set, and a ConfigError naming the option when the protocol
    does not take it (a protocol of one's own written before they existed). ``workload``
    (the scenario's ``[llm]`` table) goes to a protocol that takes it (a streaming one)."""
    params = inspect.signature(proto.resolve_inputs).parameters
    open_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    extra: dict[str, Any] = {}
    for name, flag, default in RESOLVE_KEYWORDS:
        value = getattr(o, name)
        if value == default:
            continue
        if name not in params and not open_kw:
            raise ConfigError(
                f"{flag} is set, but the {proto.name} protocol does not take it (its "
                f"resolve_inputs has no {name!r} argument); drop {flag}"
            )
        extra[name] = value
    if workload is not None and "workload" in params:
        extra["workload"] = workload
    return proto.resolve_inputs(meta, model, o.inputs, o.sample_request, **extra)


def inputs_doc(o: Options) -> dict[str, Any]:
    """``sut.inputs``: where the requests' inputs came from and how many inferences each
    request carries (the results count requests: multiply by ``batch_size``)."""
    source = (
        "input-data"
        if o.input_data
        else "sample-request"
        if o.sample_request
        else "input"
        if o.inputs
        else "metadata"
    )
    return {"source": source, "batch_size": o.batch_size, "input_data": o.input_data}


class Preparation:
    """One run's preparation and what it learned (read by the plan and the results)."""

    def __init__(
        self, opts: Options, scenario: Scenario, host: str | None, sut: SutControl
    ) -> None:
        self.opts = opts
        self.scenario = scenario  # with_cores() applied once the server's cores are known
        self.host = host
        self.sut = sut
        # what is said to the server (--protocol): endpoints, request bodies, answers
        self.protocol = protocols.get(opts.protocol)
        # learned on the way (None / defaults until then)
        self.time_to_ready_s: float | None = None
        self.sut_cores_n = 1
        self.base_url: str | None = None
        self.model: str | None = None
        self.inputs: list[Any] = []  # the pool's inputs, as the protocol builds them
        self.golden: Golden | None = None
        self.golden_summary: dict[str, Any] | None = None
        # how the golden outputs were had: "fetched", or kept and why (_golden)
        self.golden_source: str | None = None
        # a streaming protocol verified by the reference server's oracle instead of
        # fetched golden outputs: what the plan tells every process (None: not verifying)
        self.oracle: dict[str, Any] | None = None
        self.capacity_rps: float | None = None
        self.calibration: dict[str, Any] | None = None
        self.fresh_sut = False
        self.sut_doc: dict[str, Any] = {}
        # where the load is sent: the fault proxy when the scenario has network chaos
        # (harness.chaos.proxy), else None (base_url)
        self.load_url: str | None = None

    def base(self) -> str:
        if not self.host:
            raise ConfigError(
                "no target: pass --host http://HOST:PORT (or --sut-cmd to start the server)"
            )
        return self.host.rstrip("/")

    def run(self) -> None:
        """Every step above; raises ``HarnessError`` at the first that fails."""
        self.preflight()
        self.time_to_ready_s = self.sut.ensure(self.scenario, self.host, self.base)
        self.sut_cores_n = len(self.sut.cores() or os.sched_getaffinity(0))
        self.scenario = self.scenario.with_cores(self.sut_cores_n)
        self._check_threads_template()
        base = self.base_url = self.base()
        # headers and TLS for every request from here on (a TLS failure: exit 2)
        http.configure(http.client_for(base, self.opts))
        self._check_ready(base)
        meta_path = self.protocol.server_metadata_path()
        server_meta = target.json_or_none(base + meta_path) if meta_path is not None else None
        model = self.model = self._model(base, server_meta)
        meta = payloads.model_metadata(base, model, protocol=self.protocol)
        pool, max_batch = self._payloads(base, model, meta)
        load = self.scenario.load
        host, port, _ = http.split_url(base)
        if load.verify and getattr(self.protocol, "streaming", False):
            self._stream_oracle(server_meta)
        elif load.verify:
            self.golden = self._golden(pool, host, port, model, meta)
            self.golden_summary = {**self.golden.summary(), "golden": self.golden_source}
        self.capacity_rps = load.capacity_rps
        if self.scenario.needs_capacity and self.capacity_rps is None:
            self._calibrate(pool, max_batch)
        self._fresh_start()
        self._start_proxy(host, port)
        self.sut_doc = self.sut.describe(base, model, {"server": server_meta, "model": meta})
        self.sut_doc.update(http.current().describe(), metrics_url=self.opts.metrics_url)
        self.sut_doc["inputs"] = inputs_doc(self.opts)

    def _golden(
        self, pool: payloads.PayloadPool, host: str, port: int, model: str, model_meta: Any
    ) -> Golden:
        """The pool's golden outputs: fetched one at a time, or with ``--golden-cache``
        (``harness run`` / ``acceptance`` keep one per session) those an earlier run kept:

        - fetched from this same server process: reused (a peak search's points all run
          against one server: each would otherwise spend 1–4 s re-asking it the same 136
          questions, more the longer its batching delay);
        - fetched from another process of the same model and pool (the server the
          previous scenario started and stopped): reused once the first
          ``GOLDEN_RECHECK`` inputs, asked again alone, are each answered with their kept
          output; any other answer fetches them all. A kept output that no longer held
          for an input not asked again would show as a mismatch (a failed check), never
          as a pass.
        """
        timeout = self.scenario.load.request_timeout_s
        if not self.opts.golden_cache:
            self.golden_source = "fetched"
            return target.fetch_golden(pool, host, port, timeout)
        path = Path(self.opts.golden_cache)
        key = target.golden_key(pool, self.base(), model, self.sut.pid())
        kept = target.kept_golden(path, key)
        if kept is not None:
            log.info("harness: golden outputs reused from %s (the same server process)", path)
            self.golden_source = "kept: fetched from this server process before"
            return kept
        content = target.golden_content_key(pool, model, model_meta)
        earlier = target.kept_golden_of_model(path, content)
        if earlier is not None and target.golden_still_holds(earlier, pool, host, port, timeout):
            n = min(target.GOLDEN_RECHECK, len(pool))
            log.info(
                "harness: golden outputs reused from %s (an earlier process of this model: "
                "%d inputs asked again gave their kept outputs)",
                path,
                n,
            )
            self.golden_source = (
                f"kept: fetched from an earlier process of this model; {n} inputs asked "
                "again gave their kept outputs"
            )
            golden = earlier
        else:
            self.golden_source = "fetched"
            golden = target.fetch_golden(pool, host, port, timeout)
        target.keep_golden(path, key, golden, content)
        return golden

    def _stream_oracle(self, server_meta: Any) -> None:
        """Streams are checked against the reference server's own oracle when the target is
        the reference server; any other server's answers cannot be predicted, and are
        checked for their form (finish reason, usage, ``[DONE]``) only."""
        from harness.protocols.openai_wire import is_reference_server

        if not is_reference_server(server_meta):
            log.info(
                "harness: the target is not the reference LLM server: streams are checked "
                "for their form (finish reason, usage, [DONE]), not their text"
            )
            return
        self.oracle = {"oracle": "harness_reference_server"}
        self.golden_summary = {"pool": len(self.inputs), "distinct": len(self.inputs)}

    def _start_proxy(self, host: str, port: int) -> None:
        """A scenario with ``network`` chaos sends its load through the fault proxy; the
        golden fetch, calibration, statistics and scrapes above go straight to the server."""
        from harness.chaos import proxy

        proxy.stop_current()  # a previous run's (web UI), if it was not stopped
        if not any(e.action == "network" for e in self.scenario.chaos):
            return
        self.load_url = proxy.FaultProxy(host, port).start().url
        log.info("harness: load goes through the fault proxy %s → %s:%d", self.load_url, host, port)

    def preflight(self) -> None:
        """Refuse (exit 2) a scenario this target cannot support, before starting anything."""
        from harness.load.preflight import (
            TargetFacts,
            agent_facts,
            checklist_allow_skip,
            checklist_max_n,
            linearity_max_n,
            unsupported_reason,
        )

        o = self.opts
        checklist = checklist_max_n(o.checklist)
        remote = agent_facts(o.agent_url, o.agent_token, o.sut_pid)
        facts = TargetFacts(
            sut_cmd=o.sut_cmd,
            attached=not o.sut_cmd,
            sut_cores=o.sut_cores,
            linearity_max_n=linearity_max_n(self.scenario, checklist),
            samples_server=o.sample and bool(o.sut_cmd or o.sut_pid is not None or o.agent_url),
            allow_skip=frozenset(o.allow_skip) | checklist_allow_skip(o.checklist),
            **remote,
        )
        why = unsupported_reason(self.scenario, facts)
        if why is not None:
            raise ConfigError(
                f"scenario {self.scenario.name!r} cannot run against this target: {why}"
            )

    def _check_threads_template(self) -> None:
        if not any(st.threads for st in self.scenario.stages):
            return
        o = self.opts
        if "{threads}" not in (o.sut_cmd or ""):
            raise ConfigError(
                f"scenario {self.scenario.name!r} varies the server's threads per stage; "
                f"start the server with --sut-cmd containing {{threads}} (e.g. "
                f"--sut-cmd 'python -m harness_reference_server --port {{port}} --workers {{threads}}'), "
                f"got --sut-cmd {o.sut_cmd!r}"
            )

    def _check_ready(self, base: str) -> None:
        ready_url = base + self.protocol.ready_path
        status, _ = target.get(ready_url)
        if status != 200:
            raise TargetUnavailable(
                f"{ready_url} answered {status or 'nothing'}; start the server "
                f"or point --host at it"
            )

    def _model(self, base: str, server_meta: dict[str, Any] | None) -> str:
        model = self.opts.model or self.protocol.default_model(server_meta)
        if not model:
            meta_path = self.protocol.server_metadata_path()
            where = (
                f"GET {base}{meta_path} names no model"
                if meta_path is not None
                else f"the {self.protocol.name} protocol names no default model"
            )
            raise ConfigError(f"--model is not set and {where}; pass --model NAME")
        return str(model)

    def _payloads(
        self, base: str, model: str, meta: dict[str, Any]
    ) -> tuple[payloads.PayloadPool, int]:
        """The request inputs every process sends (kept for the plan) and a pool of them."""
        o = self.opts
        load = self.scenario.load
        proto = self.protocol
        template = resolve_inputs(proto, meta, model, o, workload=self.scenario.llm)
        max_batch = proto.max_batch(meta)
        pool_size = load.pool_size or max(64, 4 * max_batch)
        self.inputs = proto.generate_inputs(template, pool_size, load.seed)
        if o.input_data:
            log.info("harness: %d requests from %s, sent in order", len(self.inputs), o.input_data)
        host, port, prefix = http.split_url(base)
        classes = [
            payloads.ClassParams(c.name, c.priority, c.timeout_us) for c in self.scenario.classes
        ]
        pool = payloads.PayloadPool(
            host, port, prefix + proto.infer_path(model), self.inputs, classes, proto
        )
        return pool, max_batch

    def _calibrate(self, pool: payloads.PayloadPool, max_batch: int) -> None:
        load = self.scenario.load
        host, port, _ = http.split_url(self.base_url or self.base())
        users = load.calibration_users or max(8, 2 * max_batch)
        cal = calibrate.calibrate(
            pool,
            host,
            port,
            self.scenario.classes[-1].name,
            users=users,
            duration_s=load.calibration_s,
            timeout_s=load.request_timeout_s,
            # the probe accounts for the CPU on the server's cores: only where they are
            sut_pid=None if self.opts.agent_url else self.sut.pid(),
            streams=getattr(self.protocol, "streaming", False),
        )
        self.calibration = cal.as_dict()
        self.capacity_rps = cal.capacity_rps
        log.info("harness: calibrated capacity %.1f req/s (%d users)", cal.capacity_rps, users)

    def _fresh_start(self) -> None:
        self.fresh_sut = False
        if not self.scenario.load.fresh_sut:
            return
        if self.sut.owned:
            # The golden fetch and the calibration warmed the server up: start it again so
            # the load meets a cold server, and time that start (same command, port, cores).
            # Neither ran (--no-verify, absolute rates): the server was just started and has
            # answered no inference yet — it is cold, and the time to ready was that start's.
            if self.golden is not None or self.calibration is not None:
                self.time_to_ready_s = self.sut.restart_fresh()
            self.fresh_sut = True
        else:
            log.warning(
                "harness: scenario %r wants a freshly started server; without --sut-cmd the "
                "server is already warm (fresh_sut: false in the results)",
                self.scenario.name,
            )
