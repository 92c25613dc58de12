"""Peak throughput under a latency SLO (``harness peak``) and the configuration search
built on it (``harness tune``). See docs/peak.md.

``search``: the pure search (bracketing, bisection, edge repeats, the interval and the
knee); ``runner``: one point = one headless Locust run of a one-stage open-loop scenario
against a server kept running between points; ``tune``: the configuration space, quick
(prune + hill-climb) or brute search, ranking, resumable state; ``report``: summary.md
and report.html; ``guard``: stops a started server when the harness dies.
"""
