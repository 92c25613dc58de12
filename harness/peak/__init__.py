"""Peak throughput under a latency SLO (``harness peak``) and the configuration search
built on it (``harness tune``). See docs/peak.md.

Rooms: ``search`` the pure search state machine (bracketing, bisection, edge repeats,
refine) over ``outcomes`` (a point, the outcomes per rate, the fitted edge; the edge
statistics themselves are ``harness.analysis.edge``); ``config`` what was asked and the
scenario of one point; ``point`` a point's judged run → its outcome; ``server`` the
server kept running between points; ``runner`` the run (points measured, searches,
``harness peak`` end to end); ``answer`` the ``peak`` section and its exit code;
``tune`` the configuration search (a package). The reports are ``harness.report.peak``
and ``harness.report.tune``; the sections' records ``harness.results.peak_records``.
"""
