"""The agent's HTTP server: token-checked, every route of ``routes.py`` answered from the
agent's state (``state.py``: samplers, leased chaos actions, the server it owns).

Every authenticated request renews the lease; a request thread never dies of an error,
it answers it (403 not allowed, 404 no such thing, 400 a bad request, 500 otherwise).
"""

from __future__ import annotations

import atexit
import hmac
import json
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from harness.agent import routes
from harness.agent.state import Agent, AgentConfig, Forbidden, NotFound
from harness.errors import ConfigError, HarnessError
from harness.primitives import trapped_signals

__all__ = ["Agent", "AgentConfig", "make_server", "serve"]


def _status(exc: Exception) -> int:
    if isinstance(exc, Forbidden):
        return 403
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, (ConfigError, ValueError, KeyError, TypeError)):
        return 400
    return 500


@dataclass(frozen=True)
class Call:
    """One request's arguments: its path parameters, its query and its JSON body."""

    params: dict[str, str]
    query: dict[str, str]
    body: dict[str, Any] = field(default_factory=dict)


def _remove(a: Agent, c: Call) -> dict[str, Any]:
    a.remove_sampler(c.params["sid"])
    return {"id": c.params["sid"]}


# Each route's answer from the agent's state (JSON, or bytes for a raw route).
ANSWERS: dict[routes.Route, Callable[[Agent, Call], Any]] = {
    routes.INFO: lambda a, c: a.info(),
    routes.HEARTBEAT: lambda a, c: {"time": time.time()},
    routes.ALIVE: lambda a, c: a.alive(int(c.query["pid"])),
    routes.PROCESS: lambda a, c: a.process(int(c.query["pid"])),
    routes.ACTION_CHECK: lambda a, c: a.check(
        c.body["action"], c.body.get("params") or {}, int(c.body["pid"])
    ),
    routes.ACTION_APPLY: lambda a, c: a.apply(
        c.body["action"], c.body.get("params") or {}, int(c.body["pid"])
    ),
    routes.ACTION_REVERT: lambda a, c: a.revert(c.params["aid"]),
    routes.SAMPLER_START: lambda a, c: a.start_sampler(
        int(c.body["pid"]), c.body.get("metrics_url")
    ),
    routes.SAMPLER_PULL: lambda a, c: a.pull(
        c.params["sid"], c.body.get("have") or {}, c.body.get("meta_mtime")
    ),
    routes.SAMPLER_STOP: lambda a, c: a.stop_sampler(c.params["sid"]),
    routes.SAMPLER_REMOVE: _remove,
    routes.SAMPLER_FILES: lambda a, c: a.files(c.params["sid"]),
    routes.SAMPLER_FILE: lambda a, c: a.read(
        c.params["sid"], c.params["name"], int(c.query.get("offset", 0))
    ),
}
assert set(ANSWERS) == set(routes.ROUTES), "every route answered, no answer without a route"


class Handler(BaseHTTPRequestHandler):
    server_version = "harness-agent/1"
    agent: Agent  # set on the class by make_server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would be the agent's main output; errors are answered

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: Any) -> None:
        self._send(status, json.dumps(doc).encode())

    def _authorised(self) -> bool:
        given = self.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self.agent.config.token.encode()
        )
        if not ok:
            self._json(
                401,
                {
                    "error": "missing or wrong bearer token: the master's "
                    "--agent-token (or HARNESS_AGENT_TOKEN) must equal the agent's "
                    "--token",
                    "kind": "auth",
                },
            )
        return ok

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        if not n:
            return {}
        doc = json.loads(self.rfile.read(n))
        if not isinstance(doc, dict):
            raise ValueError("the request body is not a JSON object")
        return doc

    def _dispatch(self, method: str) -> None:
        if not self._authorised():
            return
        self.agent.beat()
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            body = self._body() if method == "POST" else {}
            found = routes.resolve(method, url.path)
            if found is None:
                self._json(404, {"error": f"no route {method} {url.path}", "kind": "route"})
                return
            route, params = found
            doc = ANSWERS[route](self.agent, Call(params, q, body))
        except Exception as exc:  # answered, never a dead request thread
            kind = type(exc).__name__
            self._json(_status(exc), {"error": f"{exc}" or kind, "kind": kind})
            return
        if route.raw:
            self._send(200, doc, "application/octet-stream")
        else:
            self._json(200, doc)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")


class _TLSServer(ThreadingHTTPServer):
    """HTTPS: each accepted connection does its TLS handshake in its own request thread
    (bounded by ``HANDSHAKE_TIMEOUT_S``), so a client that stalls mid-handshake holds up
    no one else."""

    context: ssl.SSLContext

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return  # not TLS, a bad certificate on the other side, or too slow: dropped
        tls.settimeout(None)
        super().finish_request(tls, client_address)


HANDSHAKE_TIMEOUT_S = 10.0


def make_server(agent: Agent) -> ThreadingHTTPServer:
    """The agent's HTTP server, HTTPS when the config has a certificate."""
    handler = type("AgentHandler", (Handler,), {"agent": agent})
    c = agent.config
    if c.tls_cert is None:
        httpd = ThreadingHTTPServer((c.bind, c.port), handler)
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(c.tls_cert, c.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"--tls-cert {c.tls_cert} / --tls-key {c.tls_key}: not a certificate chain "
                f"and its key in PEM ({exc})"
            ) from None
        httpd = _TLSServer((c.bind, c.port), handler)
        httpd.context = context
    httpd.daemon_threads = True
    return httpd


def serve(config: AgentConfig, ready: Callable[[str], None] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; every applied action is reverted on the way out."""
    agent = Agent(config)
    try:
        httpd = make_server(agent)
    except ConfigError:
        raise
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {config.bind}:{config.port} ({exc.strerror}); pick another "
            "--port or --bind"
        ) from None
    atexit.register(agent.shutdown, "exit")
    try:
        took = agent.start_sut()
        if took is not None:
            print(
                f"harness agent: started the server (pid {agent.sut.pid}, {agent.sut.url}, "
                f"ready in {took:.1f} s): {agent.sut.cmd}",
                file=sys.stderr,
                flush=True,
            )
    except HarnessError:
        httpd.server_close()
        atexit.unregister(agent.shutdown)
        raise

    def on_signal(signum: int) -> None:
        agent.shutdown(signal.Signals(signum).name)
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    try:
        with trapped_signals(on_signal):
            agent.start_lease()
            host, port = httpd.server_address[:2]
            if ready is not None:
                ready(f"{'https' if config.tls_cert else 'http'}://{host}:{port}")
            try:
                httpd.serve_forever(poll_interval=0.5)
            finally:
                agent.shutdown("exit")
                httpd.server_close()
    finally:
        atexit.unregister(agent.shutdown)
    return 0
