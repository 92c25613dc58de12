"""``fetch_json`` / ``model_metadata`` against a real loopback HTTP server: a 404 on the
model's URL is a configuration error naming --model; other failures are the target's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.errors import ConfigError, TargetUnavailable
from harness.load.payloads import fetch_json, model_metadata

ROUTES = {
    "/v2/models/m": (200, b'{"name": "m", "inputs": []}'),
    "/v2/models/broken": (500, b"boom"),
    "/v2/models/html": (200, b"<html>"),
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, body = ROUTES.get(self.path, (404, b"not found"))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def base_url() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(5)


def test_model_metadata_reads_the_model_and_names_a_wrong_model(base_url: str) -> None:
    assert model_metadata(base_url, "m")["name"] == "m"
    with pytest.raises(ConfigError, match=r"--model has value 'nope'.*→ 404"):
        model_metadata(base_url, "nope")
    with pytest.raises(TargetUnavailable, match="answered HTTP 500"):
        model_metadata(base_url, "broken")
    with pytest.raises(TargetUnavailable, match="did not answer JSON"):
        model_metadata(base_url, "html")


def test_fetch_json_404_is_the_targets_problem_without_a_status_hook(base_url: str) -> None:
    with pytest.raises(TargetUnavailable, match="answered HTTP 404"):
        fetch_json(base_url + "/v2/models/nope")
