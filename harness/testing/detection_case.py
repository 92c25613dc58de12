"""One case of the detection matrix: a planted defect, the scenario and check that must
catch it, and the ``harness run`` command line that runs it (harness.testing.detection_cases)."""

from __future__ import annotations

import dataclasses
import math
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

# `harness run --retry-invalid` for every case (the harness's default is 1)
RETRY_INVALID = 2
# where run_case writes a case's checklist, in its output directory
CHECKLIST_FILE = "checklist.toml"
# Every run of a soak case offers this multiple of the pinned capacity (soak.toml: "0.6x").
SOAK_RATE_MULTIPLE = 0.6
MIB = 1 << 20
# Batches capped at half the scenario's users_per_thread (16): one thread's users then fill
# a batch while the other half's batch runs, so one thread already runs full batches back
# to back and a second thread can add only parallelism, not bigger batches. Capped at the
# default 32, two threads' users formed batches twice as large as one thread's, and the sim
# model's 15 ms per batch + 0.3 ms per item made that alone worth +50 % (a serialized
# server: E(2) = 0.749, at the threshold); capped at 16, one thread's batches were not yet
# full and the lock's cost hid behind the batch gaps it filled (E(2) 0.67–0.76 across seven
# runs, one a miss in CI). At 8: 0.526–0.542, the healthy twin 0.97–1.01.
SIM_LINEARITY_ARGS = ("--max-batch-size", "8")


@dataclasses.dataclass(frozen=True)
class DetectionCase:
    """One row of the matrix.

    ``fault`` is the ``--fault`` spec; ``{per_request}`` in it is filled from ``per_min``:
    bytes per request for a ``per_min`` in bytes/min (``per_min_kind = "bytes"``), or
    "one every N requests" for a count per minute (``per_min_kind = "every"``).
    """

    name: str
    defect: str  # what a human would call the bug
    scenario: str
    check: str  # the check that must fail (or pass, for a healthy control)
    why: str  # why this scenario/check pairing and these parameters
    fault: str | None = None
    server_args: tuple[str, ...] = ()  # further reference-server flags
    model: str = "mlp"
    sut_cores: str | None = None
    duration_s: float | None = None  # --duration: shortened where detection stays reliable
    pin_capacity: bool = False  # pass the healthy run's capacity as --capacity-rps
    # or this capacity, whatever the healthy run measured: for a defect whose own limit
    # does not move with the machine's speed (the scenario's "0.6x" is then 0.6 of it)
    pin_rps: float | None = None
    per_min: float | None = None
    per_min_kind: str = ""  # "bytes" | "every"
    locust_args: tuple[str, ...] = ()
    allowed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    also_checks: tuple[str, ...] = ()  # further checks this defect must fail as well
    expect_pass: bool = False  # a healthy control: every check must pass
    generalisation: bool = False  # a defect shape the checks were not tuned on
    timeout_s: float = 300.0  # hard bound on the harness subprocess
    api: str = "kserve-v2"  # the reference server's --api: "openai" is its LLM server
    # the healthy case whose run, when this session made one (CI: the quick checklist's),
    # calibrated the capacity this case then pins: the same offered rates as its twin and no
    # probe of its own; without that run, the case probes its own (a "1.8x" scenario)
    capacity_twin: str | None = None
    # check overrides the case is judged with (``harness run --checklist``, written by
    # run_case to OUT/checklist.toml), as a user sets their own budget: its healthy twin
    # is judged with the same
    checklist: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)

    @property
    def intended(self) -> tuple[str, ...]:
        """Every check the case must see fail (``check`` first)."""
        return (self.check, *self.also_checks)

    def fault_spec(self, capacity_rps: float | None) -> str | None:
        """The ``--fault`` value with traffic-dependent sizes filled in."""
        if self.fault is None or "{per_request}" not in self.fault:
            return self.fault
        if capacity_rps is None or self.per_min is None:
            raise ValueError(f"case {self.name!r} needs the healthy capacity to size its fault")
        per_min_requests = SOAK_RATE_MULTIPLE * capacity_rps * 60.0
        if self.per_min_kind == "bytes":
            value = max(1, math.ceil(self.per_min / per_min_requests))
        elif self.per_min_kind == "every":
            value = max(1, round(per_min_requests / self.per_min))
        else:
            raise ValueError(f"case {self.name!r}: per_min_kind {self.per_min_kind!r}")
        return self.fault.format(per_request=value)

    def sut_cmd(self, capacity_rps: float | None, python: str = sys.executable) -> str:
        if self.api == "openai":  # the LLM server: one engine, no model or threads to pick
            parts = [python, "-m", "harness_reference_server", "--api", "openai"]
            parts += ["--fault", self.fault] if self.fault else []
            parts += list(self.server_args)
            return " ".join(shlex.quote(p) for p in parts) + " --port {port}"
        parts = [python, "-m", "harness_reference_server", "--model", self.model]
        spec = self.fault_spec(capacity_rps)
        if spec is not None:
            parts += ["--fault", spec]
        parts += list(self.server_args)
        cmd = " ".join(shlex.quote(p) for p in parts)
        return cmd + " --port {port} --workers {threads}"

    def harness_argv(
        self, out_dir: str, capacity_rps: float | None, twin_capacity: float | None = None
    ) -> list[str]:
        """``python -m harness run ...`` for this case (the harness starts and stops the SUT);
        ``twin_capacity``: the capacity its ``capacity_twin``'s run calibrated, pinned."""
        argv = [sys.executable, "-m", "harness", "run", self.scenario, "--quick"]
        argv += ["--sut-cmd", self.sut_cmd(capacity_rps), "--out", out_dir]
        # up to two more attempts when a run is invalid only because the machine was
        # disturbed (harness.acceptance.retry_reasons): a case still counts only from a
        # valid run. One retry was not always enough on a shared 2-core box: a fresh-clone
        # CI saw no-batching invalid twice in a row (a ~2 s freeze of the server and the
        # load alike, then dispatch lag p99 153 ms), and four other cases' first attempts
        # invalid that day, each valid on its second
        argv += ["--retry-invalid", str(RETRY_INVALID)]
        # the matrix reads results.json; report.html's plots would cost ~1 s a row
        argv.append("--no-html-report")
        if self.sut_cores:
            argv += ["--sut-cores", self.sut_cores]
        if self.duration_s is not None:
            argv += ["--duration", f"{self.duration_s:g}"]
        if self.pin_rps is not None:
            argv.append(f"--locust-arg=--capacity-rps={self.pin_rps:g}")
        elif self.pin_capacity:
            if capacity_rps is None:
                raise ValueError(f"case {self.name!r} pins the healthy capacity; none measured")
            argv.append(f"--locust-arg=--capacity-rps={capacity_rps:.1f}")
        elif twin_capacity is not None:
            argv.append(f"--locust-arg=--capacity-rps={twin_capacity!r}")
        argv += [f"--locust-arg={a}" for a in self.locust_args]
        if self.checklist:
            argv += ["--checklist", str(Path(out_dir) / CHECKLIST_FILE)]
        return argv

    def checklist_toml(self) -> str:
        """The case's ``checklist`` as the TOML ``harness run --checklist`` reads."""
        lines = []
        for check_id, params in self.checklist.items():
            lines.append(f'["{check_id}"]')
            lines += [f"{k} = {v!r}" for k, v in params.items()]
        return "\n".join(lines) + "\n"
