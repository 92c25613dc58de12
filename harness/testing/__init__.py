"""Public builders and helpers for the test suite and the benchmarks (as numpy.testing is
for numpy's): imported by tests/ and bench/, never by the harness itself
(tests/test_layers.py holds that).

- ``results``: the records of a results document, piece by piece (``scenario``, ``stage``,
  ``counters``, ``hdr``, ``check``); ``reference_document``: a complete synthetic document
  (``build_document``), with ``traffic`` simulating its windows and series;
- ``checks``: scenario results sized for one check, and assertions on a check's verdict;
- ``server``: the reference server as a subprocess on a free port, and clients for it;
  ``server_app``: its app in this process (Starlette's TestClient);
- ``locust_runs``: ``locust -f locustfiles/inference.py`` as a subprocess, and its results;
- ``detection``: running and judging the detection matrix, whose cases are
  ``detection_cases`` (``detection_case``: one case; ``detection_chaos_cases``: the chaos
  scenarios' cases);
- ``tls``: a throwaway CA made with the openssl CLI; ``peak``: a peak search driven by a
  synthetic judge;
- ``llm_streams``: the reference LLM server's streams recorded in-process byte for byte
  with their write times, and synthetic chunks and stream records with exact times.

Several of them run things from the source checkout (the locustfile, tests/data): they are
meant to be used from a clone.
"""
