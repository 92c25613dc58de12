"""``python -m harness_reference_server``: parse flags, pin BLAS threads, serve with a drain window.

uvicorn closes its listening socket as soon as it sees SIGTERM, which leaves no window
for readiness to drop while accepted requests finish. We take SIGTERM/SIGINT ourselves:
ready -> 503, new inference -> 503 "server exiting", wait (at most --drain-timeout-s)
until every accepted request is answered, and only then let uvicorn shut down.
"""

from __future__ import annotations

import os
import sys

from harness_reference_server.config import (  # no numpy: see main
    ConfigError,
    parse_config,
    selected_api,
)


def _pin_blas_threads(argv: list[str]) -> list[str]:
    # Must run before numpy is imported anywhere: OpenBLAS reads these at load time.
    # An explicit --blas-threads wins; otherwise keep a value the user exported.
    explicit = None
    for i, arg in enumerate(argv):
        if arg == "--blas-threads" and i + 1 < len(argv):
            explicit = argv[i + 1]
        elif arg.startswith("--blas-threads="):
            explicit = arg.split("=", 1)[1]
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if explicit is not None:
            os.environ[var] = explicit
        else:
            os.environ.setdefault(var, "1")
    if explicit is None and os.environ["OPENBLAS_NUM_THREADS"].isdigit():
        # Report what numpy will really use (GET /v2 config) when the user exported it.
        return [*argv, "--blas-threads", os.environ["OPENBLAS_NUM_THREADS"]]
    return argv


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if selected_api(argv) == "openai":
            return _main_llm(argv)
    except ConfigError as exc:
        print(f"python -m harness_reference_server: error: {exc}", file=sys.stderr)
        return 2
    argv = _pin_blas_threads(argv)

    try:
        config = parse_config(argv)
    except ConfigError as exc:
        print(f"python -m harness_reference_server: error: {exc}", file=sys.stderr)
        return 2

    # imported only now: it imports numpy, which reads the BLAS thread counts just pinned
    from harness_reference_server.serve import serve

    return serve(config)


def _main_llm(argv: list[str]) -> int:
    """``--api openai``: the LLM server (harness_reference_server/llm/, docs/llm-server.md)."""
    from harness_reference_server.llm.config import parse_llm_config

    config = parse_llm_config(argv)
    from harness_reference_server.serve import serve_llm

    return serve_llm(config)


if __name__ == "__main__":
    sys.exit(main())
