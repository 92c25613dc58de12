"""The server ``harness peak`` and ``harness tune`` start for their points, kept running
between them (``SutProcess`` starts the guard, ``harness.sut.guard``, that stops its
process group when this process dies, SIGKILL included)."""

from __future__ import annotations

from pathlib import Path

from harness.peak.point import exit_text


class ManagedServer:
    """A ``--sut-cmd`` server started once for a whole search (``SutProcess`` starts the
    guard that stops its process group when this process dies: ``harness.sut.guard``)."""

    def __init__(
        self,
        cmd: str,
        *,
        cores: str | None,
        log_path: Path,
        ready_timeout_s: float = 60.0,
        ready_path: str | None = None,
    ) -> None:
        from harness import sut

        split = sut.split_cores(cores).sut
        self.proc = sut.SutProcess(cmd, cores=split, log_path=log_path, ready_path=ready_path)
        self.ready_timeout_s = ready_timeout_s
        self.time_to_ready_s: float | None = None

    def __enter__(self) -> ManagedServer:
        self.proc.start()
        try:
            self.time_to_ready_s = self.proc.wait_ready(timeout=self.ready_timeout_s)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.stop()

    @property
    def url(self) -> str:
        return self.proc.url

    @property
    def pid(self) -> int:
        return self.proc.pid

    def gone(self) -> str | None:
        """None while the server runs; once it has exited, how (``exit_text``)."""
        return None if self.proc.alive() else exit_text(self.proc.returncode)
