"""``harness agent``: the server-side half of a run whose server is on another host.

The agent runs beside the server (same host, or a sidecar sharing its process namespace)
and offers over HTTP what the master would otherwise do locally: the ``harness sample``
subprocess (its files fetched back into the run's ``samples/``) and the chaos actions of
an allow-list, applied and reverted by id. Every request carries a bearer token; every
applied action is leased — the agent reverts it itself when the master's heartbeat stops
(``harness.agent.state``, served by ``harness.agent.server`` on the routes of
``harness.agent.routes``). The master's side (``harness.agent.client``) measures the
clock offset between the hosts at connect and hands the timeline proxies that call the
agent, so the timeline and its records are the same as on one host.
"""

from harness.agent.client import AgentClient, RemoteSut, clock_offset
from harness.agent.server import serve
from harness.agent.state import Agent, AgentConfig

__all__ = ["Agent", "AgentClient", "AgentConfig", "RemoteSut", "clock_offset", "serve"]
