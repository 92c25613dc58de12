"""The results document (``results.json``): the one owner of its format.

Like pyperf's ``_bench.py``, everything about the document lives here and every other
part of the harness asks this package:

- ``harness.results.document`` — the envelope, the schema version and its history, the
  upgrades, atomic writing, loading (refusing unknown versions), merging, verdict order;
- ``harness.results.records`` — the typed records (scenario, stage, class, counters,
  window, check, series …) the load side builds and the readers the checks and reports
  use;
- ``hdr`` — the one histogram codec and percentile rule (``harness.analysis.hdr``);
- ``harness.results.schema`` — ``schemas/results.v<N>.json``, derived from the records.

Field by field: docs/outputs.md.
"""

from __future__ import annotations

from harness.analysis import hdr
from harness.results.document import (
    READABLE_VERSIONS,
    SCHEMA,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    VERDICTS,
    combine_verdicts,
    dumps,
    load_document,
    machine_metadata,
    merge_documents,
    metadata_mismatch,
    new_document,
    parse_schema,
    validate_document,
    write_document,
)
from harness.results.records import Document, ScenarioResult

__all__ = [
    "READABLE_VERSIONS",
    "SCHEMA",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "VERDICTS",
    "Document",
    "ScenarioResult",
    "combine_verdicts",
    "dumps",
    "hdr",
    "load_document",
    "machine_metadata",
    "merge_documents",
    "metadata_mismatch",
    "new_document",
    "parse_schema",
    "validate_document",
    "write_document",
]
