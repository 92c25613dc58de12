"""``harness tune``: which server configuration sustains the most traffic under the SLO.

A configuration is one value per ``--space`` dimension, filled into the ``--sut-cmd``
template (``{port}`` is the harness's). For each configuration measured: start the
server, find its peak under the SLO (``harness.peak.runner.search``: bisection to
``--tolerance``, then the edge repeats, each repeat on a fresh server), record the
server's CPU per request and its RSS at the peak, stop the server.

Objective (stated in every report): the highest peak under the SLO wins; peaks within
one search tolerance of each other are a tie, broken by the lower CPU per request (the
cheaper configuration to run at the same traffic). Only a configuration whose search
ended at the server's edge has a peak to rank (measured); one stopped by the load
generator, its point budget or the search's ceiling is not measured, one whose server
died or would not start failed — neither is ever recommended. The tune's verdict and
exit code are the fastest configuration's quick-checklist verdict; a fastest
configuration whose checklist fails is not recommended.

Search, after Triton model_analyzer's two modes:

* ``brute`` — every configuration of the cross product;
* ``quick`` — start at the default configuration, measure its neighbours (one
  dimension one step away, in the order the values were given), then the neighbours of
  every configuration no other one was measured better than (rank 1: with one best,
  hill climbing; with ties, the climb goes on from each); a neighbour whose peak fell
  more than ``prune_margin`` below the configuration it was reached from prunes the rest
  of that direction (values further along it are not measured: a dominated region).

Rooms: ``space`` (the configurations and what the tune was asked), ``ranking`` (a
configuration's result, status and rank), ``state`` (the resumable state file),
``head_to_head`` (contested separations measured again in alternating rounds),
``verdict`` (the checklist and the exit code), ``run`` (``Tuner`` and ``run_tune``).
"""

from harness.peak.tune.ranking import (
    DID_NOT_START,
    FAILED,
    MEASURED,
    NOT_MEASURED,
    config_result,
    config_status,
    contested,
    evidence,
    met_once,
    pareto,
    rank,
    standing,
    status,
    tied_with,
)
from harness.peak.tune.run import Tuner, run_tune, write_outputs
from harness.peak.tune.space import Config, Space, TuneConfig, command, key
from harness.peak.tune.state import STATE, State
from harness.peak.tune.verdict import checklist_result, conclude, exit_code, run_checklist
from harness.results.peak_records import failed, measured_worse, unmeasured, verdict_of

__all__ = [
    "DID_NOT_START",
    "FAILED",
    "MEASURED",
    "NOT_MEASURED",
    "STATE",
    "Config",
    "Space",
    "State",
    "TuneConfig",
    "Tuner",
    "checklist_result",
    "command",
    "conclude",
    "config_result",
    "config_status",
    "contested",
    "evidence",
    "exit_code",
    "key",
    "failed",
    "measured_worse",
    "met_once",
    "pareto",
    "rank",
    "run_checklist",
    "run_tune",
    "standing",
    "status",
    "tied_with",
    "unmeasured",
    "verdict_of",
    "write_outputs",
]
