"""The bundled reference server, made to die under load: once more than
``--crash-above-rps`` inference requests arrive within one second, it SIGKILLs itself (as
an out-of-memory kill ends a server whose queue grew without bound).

    python tests/servers/crash_at_load.py --crash-above-rps 200 --port 8000 [reference flags]

Test-only (tests/test_peak_server_crash.py): a server that crashes at a known rate, for
`harness peak`'s answer to it. Every other flag is the reference server's own.
"""

from __future__ import annotations

import collections
import os
import signal
import sys
import time


def main(argv: list[str]) -> int:
    if "--crash-above-rps" not in argv:
        print("crash_at_load.py: --crash-above-rps N is required", file=sys.stderr)
        return 2
    i = argv.index("--crash-above-rps")
    limit = float(argv[i + 1])
    rest = argv[:i] + argv[i + 2 :]
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as harness_reference_server's main pins it

    from harness_reference_server import app as app_module

    served = app_module.ReferenceApp.__call__
    arrivals: collections.deque[float] = collections.deque()

    async def crashing(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "http" and str(scope.get("path", "")).endswith("/infer"):
            now = time.monotonic()
            arrivals.append(now)
            while arrivals and arrivals[0] < now - 1.0:
                arrivals.popleft()
            if len(arrivals) > limit:
                os.kill(os.getpid(), signal.SIGKILL)
        await served(self, scope, receive, send)

    app_module.ReferenceApp.__call__ = crashing  # type: ignore[method-assign]
    from harness_reference_server.__main__ import main as serve

    return serve(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
