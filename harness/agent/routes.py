"""The agent's HTTP routes, declared once: the agent answers them (``server.py``) and the
master calls them (``client.py``).

A route is a method and a path under ``API`` whose ``{name}`` segments are parameters
(a sampler's or an action's id, a file name); ``query`` names the parameters that travel
in the query string instead. ``raw`` routes answer bytes, the others JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

API = "/v1"


@dataclass(frozen=True)
class Route:
    method: str  # GET or POST
    pattern: str  # path under API, "{name}" segments are parameters
    query: tuple[str, ...] = ()  # parameters sent in the query string
    raw: bool = False  # answers bytes (application/octet-stream), not JSON

    def path(self, **params: Any) -> str:
        """The path under ``API`` with ``params`` filled in (segments, then the query)."""
        segments = [
            str(params[s[1:-1]]) if s.startswith("{") else s for s in self.pattern.split("/")
        ]
        query = "&".join(f"{k}={params[k]}" for k in self.query if k in params)
        return "/".join(segments) + (f"?{query}" if query else "")

    def match(self, method: str, parts: list[str]) -> dict[str, str] | None:
        """The path parameters when ``method`` and the path's ``parts`` are this route."""
        segments = self.pattern.split("/")
        if method != self.method or len(parts) != len(segments):
            return None
        params: dict[str, str] = {}
        for seg, part in zip(segments, parts, strict=True):
            if seg.startswith("{"):
                params[seg[1:-1]] = part
            elif seg != part:
                return None
        return params


INFO = Route("GET", "info")  # host facts, the agent's clock, the server it owns
HEARTBEAT = Route("POST", "heartbeat")  # renews the lease
ALIVE = Route("GET", "alive", query=("pid",))  # /proc/<pid>/stat only: the watchdog's
PROCESS = Route("GET", "process", query=("pid",))  # the server's process tree and cores
ACTION_CHECK = Route("POST", "actions/check")  # build a chaos action, do not apply it
ACTION_APPLY = Route("POST", "actions")
ACTION_REVERT = Route("POST", "actions/{aid}/revert")
SAMPLER_START = Route("POST", "samplers")
SAMPLER_PULL = Route("POST", "samplers/{sid}/pull")  # everything new, in one answer
SAMPLER_STOP = Route("POST", "samplers/{sid}/stop")
SAMPLER_REMOVE = Route("POST", "samplers/{sid}/remove")
SAMPLER_FILES = Route("GET", "samplers/{sid}/files")  # file name → size
SAMPLER_FILE = Route("GET", "samplers/{sid}/files/{name}", query=("offset",), raw=True)

ROUTES: tuple[Route, ...] = (
    INFO,
    HEARTBEAT,
    ALIVE,
    PROCESS,
    ACTION_CHECK,
    ACTION_APPLY,
    ACTION_REVERT,
    SAMPLER_START,
    SAMPLER_PULL,
    SAMPLER_STOP,
    SAMPLER_REMOVE,
    SAMPLER_FILES,
    SAMPLER_FILE,
)


def resolve(method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    """The route ``method path`` (the URL's path, without its query) asks for, with its
    path parameters; None when there is none."""
    parts = path.removeprefix(API).strip("/").split("/")
    for route in ROUTES:
        params = route.match(method, parts)
        if params is not None:
            return route, params
    return None
