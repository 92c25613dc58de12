"""The results document (``results.json``): its versions, build, write atomically, load, merge.

The records inside it are ``harness.results.records``; this module knows the envelope
(schema, run metadata, the list of scenario results), the version history and the
upgrades. It never judges anything. Field by field: ``docs/outputs.md``.

Schema history (bump ``SCHEMA_VERSION`` whenever a reader of the old shape would
misread the new one; keep a golden file of every version in ``tests/data/``):

- ``harness.results/1`` (harness 0.1.0): first version. Top level ``schema``,
  ``harness_version``, ``created``, ``verdict``, ``partial``, ``machine``, ``sut``,
  ``loadgen``, ``scenarios``; latency histograms are base64 HDR (µs). Additive since:
  ``linearity.usl`` (the fitted USL parameters; filled on load when absent);
  ``machine.cpu_model`` and ``machine.governor`` (what ``compare`` matches machines on:
  ephemeral CI runners differ in hostname, not in CPU); ``sut.headers`` (names only),
  ``sut.tls`` and ``sut.metrics_url``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from harness import __version__
from harness.errors import ResultFormatError
from harness.primitives import atomic_write, cpu_model
from harness.results.readers import with_usl
from harness.results.records import Document

SCHEMA_NAME = "harness.results"
SCHEMA_VERSION = 1
SCHEMA = f"{SCHEMA_NAME}/{SCHEMA_VERSION}"
# Versions this harness can read. A new version that old readers would misread gets a
# new number here together with an upgrade step in ``_UPGRADES``.
READABLE_VERSIONS: tuple[int, ...] = (1,)
_UPGRADES: dict[int, Callable[[dict], dict]] = {}

# Worst first: a merged or overall verdict is the worst of its parts. A real failure
# outranks an invalid run elsewhere in the plan (the failure is a finding; hiding it behind
# another scenario's bad measurement would lose it), an invalid run outranks one that
# judged nothing, and "pass" needs every part to have passed. See docs/checks.md.
VERDICTS: tuple[str, ...] = ("fail", "invalid", "not_judged", "pass")
_VERDICT_RANK = {v: len(VERDICTS) - i for i, v in enumerate(VERDICTS)}


def cpu_governor(
    path: str = "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
) -> str | None:
    """The CPU frequency governor (``performance``, ``powersave``, …); None where the
    kernel exposes none (most VMs and containers: the host decides)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def machine_metadata() -> dict[str, Any]:
    """Describe the machine this process runs on (what ``compare``/``merge`` check)."""
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: no affinity API
        affinity = None
    return {
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "governor": cpu_governor(),
        "cpu_count": os.cpu_count(),
        "affinity": affinity,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "harness_version": __version__,
    }


def _iso_utc(unix: float) -> str:
    stamp = _dt.datetime.fromtimestamp(unix, tz=_dt.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def new_document(
    *,
    machine: Mapping[str, Any] | None = None,
    sut: Mapping[str, Any] | None = None,
    loadgen: Mapping[str, Any] | None = None,
    clock: Callable[[], float] = time.time,
) -> Document:
    """An empty results document stamped with run metadata; scenarios are appended later."""
    return {
        "schema": SCHEMA,
        "harness_version": __version__,
        "created": _iso_utc(clock()),
        "verdict": None,
        "partial": False,
        "machine": dict(machine) if machine is not None else machine_metadata(),
        "sut": dict(sut) if sut is not None else None,
        "loadgen": dict(loadgen) if loadgen is not None else None,
        "scenarios": [],
    }


def _json_default(obj: Any) -> Any:
    # numpy scalars/arrays (and anything array-like) serialise through tolist(); the
    # results module must not import numpy just to recognise them.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"results document holds a {type(obj).__name__}, which is not JSON: {obj!r}")


def _finite(obj: Any) -> Any:
    """Replace NaN/inf by None: JSON has no NaN, and other tools reject the extension."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    if isinstance(obj, set | frozenset):
        return [_finite(v) for v in sorted(obj)]
    if hasattr(obj, "tolist") and not isinstance(obj, str | bytes):
        return _finite(obj.tolist())
    return obj


def _serialise(finite: Any) -> str:
    return json.dumps(finite, indent=1, default=_json_default, allow_nan=False) + "\n"


def dumps(doc: Mapping[str, Any]) -> str:
    """Serialise a document exactly as ``write_document`` does (stable, NaN-free)."""
    return _serialise(_finite(doc))


def write_document(
    path: str | os.PathLike[str],
    doc: Mapping[str, Any],
    off_loop: Callable[[Callable[[], None]], Any] | None = None,
) -> Path:
    """Write ``doc`` to ``path`` atomically (temp file in the same directory + replace).

    Safe to call repeatedly during a run: readers see either the previous complete file
    or the new one, never a torn write, so a killed run leaves a usable partial file.
    ``off_loop(fn)`` runs the serialising and the fsync'd write, e.g. on a native thread
    for a write from the event loop that sends the load (an fsync can wait on the disk
    for as long as it likes); the document is copied here first, so what it was built
    from may change meanwhile.
    """
    target = Path(path)
    finite = _finite(doc)

    def write() -> None:
        # mode 0644: results are shared artefacts (CI uploads, other users); fsync: they
        # must survive a power cut
        atomic_write(target, _serialise(finite), mode=0o644, fsync=True)

    if off_loop is None:
        write()
    else:
        off_loop(write)
    return target


def _readable() -> str:
    return ", ".join(f"{SCHEMA_NAME}/{v}" for v in READABLE_VERSIONS)


def parse_schema(value: Any, where: str = "document") -> int:
    """Return the version number of a ``schema`` value, or raise ResultFormatError."""
    if not isinstance(value, str) or "/" not in value:
        raise ResultFormatError(
            f"{where}: 'schema' has value {value!r}; expected '{SCHEMA_NAME}/<version>' "
            f"(this harness reads {_readable()})"
        )
    name, _, version_text = value.rpartition("/")
    if name != SCHEMA_NAME or not version_text.isdigit():
        raise ResultFormatError(
            f"{where}: 'schema' has value {value!r}, which is not a harness results "
            f"document (this harness reads {_readable()})"
        )
    version = int(version_text)
    if version not in READABLE_VERSIONS:
        newer = (
            " — it was written by a newer harness; upgrade to read it"
            if version > SCHEMA_VERSION
            else ""
        )
        raise ResultFormatError(
            f"{where}: 'schema' has value {value!r}; this harness ({__version__}) reads "
            f"{_readable()}{newer}"
        )
    return version


def validate_document(doc: Any, where: str = "document") -> Document:
    """Check the envelope of a results document; return it upgraded to SCHEMA_VERSION.

    Fields added to the current version since a document was written are filled in
    (``linearity.usl``), so every reader sees one shape.
    """
    if not isinstance(doc, dict):
        raise ResultFormatError(
            f"{where}: top level is a {type(doc).__name__}; expected a JSON object with "
            f"'schema': '{SCHEMA}'"
        )
    if "schema" not in doc:
        raise ResultFormatError(
            f"{where}: no 'schema' key; expected 'schema': '{SCHEMA}' "
            f"(this harness reads {_readable()})"
        )
    version = parse_schema(doc["schema"], where)
    while version < SCHEMA_VERSION:
        doc = _UPGRADES[version](doc)
        version += 1
    scenarios = doc.get("scenarios")
    if not isinstance(scenarios, list):
        raise ResultFormatError(
            f"{where}: 'scenarios' has value {_short(scenarios)}; expected a list of scenario results"
        )
    for i, sc in enumerate(scenarios):
        if not isinstance(sc, dict) or not isinstance(sc.get("name"), str):
            raise ResultFormatError(
                f"{where}: scenarios[{i}] has value {_short(sc)}; expected an object with a 'name'"
            )
        checks = sc.get("checks", [])
        if not isinstance(checks, list) or not all(
            isinstance(c, dict) and isinstance(c.get("id"), str) for c in checks
        ):
            raise ResultFormatError(
                f"{where}: scenarios[{i}] ('{sc['name']}') 'checks' has value {_short(checks)}; "
                f"expected a list of check objects with an 'id'"
            )
    if doc.get("verdict") not in (None, *_VERDICT_RANK):
        raise ResultFormatError(
            f"{where}: 'verdict' has value {doc.get('verdict')!r}; expected one of "
            f"{', '.join(repr(x) for x in VERDICTS)} or null"
        )
    return with_usl(doc)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_document(path: str | os.PathLike[str]) -> Document:
    """Read and validate a results document; ResultFormatError if it cannot be used."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultFormatError(
            f"results file '{p}' does not exist; point at a directory written by "
            f"`harness run` or `harness acceptance`"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultFormatError(f"results file '{p}' cannot be read: {exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultFormatError(
            f"results file '{p}' is not valid JSON ({exc.msg} at line {exc.lineno} "
            f"column {exc.colno}); it may be truncated — re-run or restore it"
        ) from None
    return validate_document(doc, where=f"results file '{p}'")


def combine_verdicts(verdicts: Iterable[str | None]) -> str | None:
    """Worst of several verdicts: fail > invalid > not_judged > pass; None if any is
    still unjudged (null)."""
    worst: str | None = None
    seen = False
    for v in verdicts:
        seen = True
        if v is None:
            return None
        if v not in _VERDICT_RANK:
            raise ResultFormatError(
                f"verdict has value {v!r}; expected one of "
                f"{', '.join(repr(x) for x in VERDICTS)} or null"
            )
        if worst is None or _VERDICT_RANK[v] > _VERDICT_RANK[worst]:
            worst = v
    return worst if seen else None


def metadata_mismatch(
    a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, fields: Iterable[str] | None = None
) -> tuple[str, Any, Any] | None:
    """First machine-metadata field whose values differ, as (field, a value, b value)."""
    a = a or {}
    b = b or {}
    names = list(fields) if fields is not None else sorted(set(a) | set(b))
    for name in names:
        if a.get(name) != b.get(name):
            return name, a.get(name), b.get(name)
    return None


def merge_documents(docs: Iterable[Mapping[str, Any]]) -> Document:
    """Combine several runs (one per ``locust`` subprocess) into one document.

    Refuses (ResultFormatError naming the field) when the machine metadata differ: numbers
    measured on different machines, CPUs or Pythons do not belong in one verdict. The first
    document's ``sut``/``loadgen`` become the top level; a scenario whose run had a
    different one keeps its own copy under ``scenario["sut"]`` / ``scenario["loadgen"]``
    (e.g. the SUT was restarted with a new pid).
    """
    docs = [validate_document(dict(d), where=f"merge input {i}") for i, d in enumerate(docs)]
    if not docs:
        raise ResultFormatError("merge_documents got no documents; expected at least one")
    first = docs[0]
    merged = {k: v for k, v in first.items() if k != "scenarios"}
    merged["scenarios"] = []
    for i, doc in enumerate(docs):
        diff = metadata_mismatch(first.get("machine"), doc.get("machine"))
        if diff is not None:
            field, a, b = diff
            raise ResultFormatError(
                f"cannot merge runs from different machines: machine.{field} is {a!r} in "
                f"merge input 0 but {b!r} in merge input {i}; run every scenario on one machine"
            )
        for sc in doc["scenarios"]:
            sc = dict(sc)
            for section in ("sut", "loadgen"):
                if doc.get(section) != first.get(section) and section not in sc:
                    sc[section] = doc.get(section)
            merged["scenarios"].append(sc)
    merged["partial"] = any(bool(d.get("partial")) for d in docs) or any(
        bool(sc.get("partial")) for sc in merged["scenarios"]
    )
    merged["verdict"] = combine_verdicts(sc.get("verdict") for sc in merged["scenarios"])
    return merged
