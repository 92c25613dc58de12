"""Patch with gevent before anything starts a thread (Locust does it on import; done late,
after anyio/starlette made their threads, a TestClient call waits forever)."""

import locust  # noqa: F401
