"""The reference server's app in this process, through Starlette's TestClient (needs httpx,
a test extra): ``with client() as c: c.post(...)``, warmed up before the block runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from starlette.testclient import TestClient

from harness_reference_server.app import create_app, server_state
from harness_reference_server.config import ServerConfig

# the sim model with no modelled compute time and a 1 ms batching delay: fast and exact
SIM = ServerConfig(model="sim", sim_base_ms=0.0, sim_item_ms=0.0, max_delay_ms=1.0)


@contextlib.contextmanager
def client(config: ServerConfig = SIM, wait_ready: bool = True) -> Iterator[TestClient]:
    app = create_app(config)
    with TestClient(app) as c:
        if wait_ready:
            assert server_state(app).warmed_up.wait(30), "warmup did not finish"
        yield c
