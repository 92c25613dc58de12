"""The messages between the master and its workers, declared once, used by both sides.

Locust carries them as msgpack-able dicts; each message here is a dataclass with its
fields and ``to_wire`` / ``from_wire``. ``from_wire`` refuses a payload with a missing
or an unknown field (``WireFormatError``, naming the message and the fields): master and
workers must run the same harness, and a mismatch is said in one line instead of
surfacing as a ``KeyError`` inside a message handler.

=====================  ==================  ==================================================
message                direction           payload
=====================  ==================  ==================================================
``harness_plan``       master → worker     ``PlanMessage``: the worker's ``Plan``, the
                                           master's options, the SUT's core count
``harness_finish``     master → worker     ``FinishMessage`` (no fields): send your final
``harness_final``      worker → master     ``FinalMessage``: the last recording delta and
                                           CPU seconds, or the error that stopped the worker
``report_to_master``   worker → master     ``ReportMessage`` under the ``harness`` key of
(Locust's own report)                      Locust's periodic report: a recording delta
=====================  ==================  ==================================================

Errors cross as ``ErrorInfo``: the error's exit code (``harness.errors.ExitCode``, the
one the error's class declares), its class name (for the record) and its message. The
master dispatches on the code, never on the class name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from harness.errors import ConfigError, ExitCode, HarnessError
from harness.load.options import Options
from harness.load.users import Plan

REPORT_KEY = "harness"  # the key of our delta in Locust's report_to_master data


class WireFormatError(ConfigError):
    """A master/worker message with missing or unknown fields: the processes run
    different harness versions (exit 2)."""


def _check_fields(message: str, data: Any, expected: frozenset[str]) -> Mapping[str, Any]:
    """``data`` as a mapping with every expected field and nothing else."""
    if not isinstance(data, Mapping):
        raise WireFormatError(
            f"{message} message has a {type(data).__name__} payload; expected an object "
            f"with fields {sorted(expected)}. Run the same harness version on "
            f"the master and every worker"
        )
    missing = sorted(expected - data.keys())
    unknown = sorted(set(data) - expected)
    if missing or unknown:
        parts = [f"missing {missing}"] if missing else []
        parts += [f"unknown {unknown}"] if unknown else []
        raise WireFormatError(
            f"{message} message has fields {' and '.join(parts)}; expected "
            f"{sorted(expected)}. Run the same harness version on the master and "
            f"every worker"
        )
    return data


def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


@dataclass(frozen=True)
class ErrorInfo:
    """An error on its way between processes: the exit code decides what it does."""

    code: ExitCode
    kind: str  # the error's class name, kept for the results' ``error.type``
    message: str

    @classmethod
    def from_exception(cls, exc: HarnessError, prefix: str = "") -> ErrorInfo:
        return cls(ExitCode(exc.exit_code), type(exc).__name__, f"{prefix}{exc}")

    def as_result(self) -> dict[str, Any]:
        """The results document's ``error`` object (docs/outputs.md)."""
        return {"type": self.kind, "message": self.message}

    def to_wire(self) -> dict[str, Any]:
        return {"code": int(self.code), "kind": self.kind, "message": self.message}

    @classmethod
    def from_wire(cls, data: Any) -> ErrorInfo:
        d = _check_fields("error", data, _names(cls))
        try:
            code = ExitCode(d["code"])
        except ValueError:
            raise WireFormatError(
                f"error message has code {d['code']!r}; expected one of "
                f"{[int(c) for c in ExitCode]} (harness.errors.ExitCode)"
            ) from None
        return cls(code, str(d["kind"]), str(d["message"]))


@dataclass(frozen=True)
class PlanMessage:
    """``harness_plan``: what one worker generates, with the options it runs under."""

    NAME: ClassVar[str] = "harness_plan"

    plan: Plan
    options: Options
    sut_cores_n: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_wire(),
            "options": self.options.to_wire(),
            "sut_cores_n": self.sut_cores_n,
        }

    @classmethod
    def from_wire(cls, data: Any) -> PlanMessage:
        d = _check_fields(cls.NAME, data, _names(cls))
        plan = _check_fields(f"{cls.NAME} plan", d["plan"], _names(Plan))
        opts = _check_fields(f"{cls.NAME} options", d["options"], _names(Options))
        return cls(
            plan=Plan.from_wire(plan),
            options=Options.from_wire(opts),
            sut_cores_n=int(d["sut_cores_n"] or 1),
        )


@dataclass(frozen=True)
class FinishMessage:
    """``harness_finish``: the test is over; stop, wait for requests out, send the final."""

    NAME: ClassVar[str] = "harness_finish"

    def to_wire(self) -> None:
        return None

    @classmethod
    def from_wire(cls, data: Any) -> FinishMessage:
        if data not in (None, {}):
            raise WireFormatError(
                f"{cls.NAME} message carries {data!r}; it has no fields. Run the same "
                f"harness version on the master and every worker"
            )
        return cls()


@dataclass(frozen=True)
class ReportMessage:
    """A worker's recording since its last report (``Recording.drain``) and its CPU
    seconds since the plan, carried in Locust's ``report_to_master`` data."""

    recording: Mapping[str, Any]
    cpu_s: float
    # its own connections to the server since the last report (harness.load.own_conns)
    conns: Mapping[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"recording": dict(self.recording), "cpu_s": self.cpu_s, "conns": self.conns}

    @classmethod
    def from_wire(cls, data: Any) -> ReportMessage:
        d = _check_fields("report_to_master harness", data, _names(cls))
        return cls(
            _recording(d["recording"], "report_to_master"),
            float(d["cpu_s"]),
            _conns(d["conns"], "report_to_master"),
        )


@dataclass(frozen=True)
class FinalMessage:
    """``harness_final``: a worker's last recording delta, or the error that stopped it
    (both ``None``: the worker had no plan, so nothing to report)."""

    NAME: ClassVar[str] = "harness_final"

    recording: Mapping[str, Any] | None = None
    cpu_s: float | None = None
    error: ErrorInfo | None = None
    conns: Mapping[str, Any] | None = None  # the last of its own connection counts

    def to_wire(self) -> dict[str, Any]:
        return {
            "recording": dict(self.recording) if self.recording is not None else None,
            "cpu_s": self.cpu_s,
            "error": self.error.to_wire() if self.error is not None else None,
            "conns": self.conns,
        }

    @classmethod
    def from_wire(cls, data: Any) -> FinalMessage:
        d = _check_fields(cls.NAME, data, _names(cls))
        rec = d["recording"]
        return cls(
            recording=_recording(rec, cls.NAME) if rec is not None else None,
            cpu_s=float(d["cpu_s"]) if d["cpu_s"] is not None else None,
            error=ErrorInfo.from_wire(d["error"]) if d["error"] is not None else None,
            conns=_conns(d["conns"], cls.NAME),
        )


def _conns(data: Any, message: str) -> Mapping[str, Any] | None:
    """``ConnCounter.drain``'s form: who counted, its clock, [unix time, count] pairs."""
    if data is None:
        return None
    ok = (
        isinstance(data, Mapping)
        and {"host", "pid", "sent", "readings"} <= data.keys()
        and isinstance(data["readings"], list)
        and all(isinstance(r, list | tuple) and len(r) == 2 for r in data["readings"])
    )
    if not ok:
        raise WireFormatError(
            f"{message} message has conns {str(data)[:80]!r}; expected host, pid, sent and "
            f"[time, count] readings. Run the same harness version on the master and every worker"
        )
    return data


def _recording(data: Any, message: str) -> Mapping[str, Any]:
    """A recording delta is ``harness.load.recording``'s format; here only its type."""
    if not isinstance(data, Mapping):
        raise WireFormatError(
            f"{message} message has a {type(data).__name__} recording; expected an object "
            f"(Recording.drain). Run the same harness version on the master and every worker"
        )
    return data
