"""The harness's own connections, counted by the load processes that hold them
(harness.load.own_conns): a worker the sampler cannot see — another host, or started by
hand — must not leave its keep-alive pool in the server's socket count, where the soak's
socket-leak test would judge it as the server's."""

from __future__ import annotations

import os
import socket

from harness.load.own_conns import ConnCounter, OwnConns, host_id


def test_the_counter_sees_this_process_established_connections_to_the_server_only():
    server, other = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    clients = []
    try:
        for _ in range(3):
            clients.append(socket.create_connection(("127.0.0.1", port)))
        clients.append(socket.create_connection(other.getsockname()))  # not the server
        accepted = [server.accept()[0] for _ in range(3)]
        counter = ConnCounter(f"http://127.0.0.1:{port}", clock=lambda: 50.0)
        counter.poll()
        clients.pop(0).close()
        counter.poll()
        wire = counter.drain()
        assert wire["pid"] == os.getpid() and wire["host"] == host_id()
        # the server's accepted ends are this process's too, but their remote end is a
        # client port, not the server's: only the three client ends count, then two
        assert [n for _, n in wire["readings"]] == [3, 2]
        assert counter.drain()["readings"] == []  # drained
    finally:
        for s in [*clients, *accepted, server, other]:
            s.close()


def _samples(conns, pids=(111,)):
    return {
        "server": {
            "started_unix": 1000.0,
            "series": {"t": [float(i) for i in range(len(conns))], "client_conns": list(conns)},
        },
        "system": {"loadgen_processes": [{"pid": p} for p in pids]},
    }


def _wire(host, pid, sent, readings):
    return {"host": host, "pid": pid, "sent": sent, "readings": readings}


def test_a_worker_the_sampler_did_not_see_is_added_on_its_ticks():
    own = OwnConns(clock=lambda: 1010.0)
    # another host whose clock runs 100 s ahead: its readings land on ours by the shift
    own.add("w1", _wire("other/net", 5, 1110.0, [[1103.0, 4], [1104.0, 6], [1105.0, 6]]))
    own.add("w1", _wire("other/net", 5, 1110.0, [[1106.0, 5]]), final=True)
    samples = _samples([2] * 10)
    own.add_to(samples, sampler_local=True)
    # a reading stands for the ticks within 1.5 s of it; before its first reading it held
    # none (no plan yet), after the last (it finished: its load closed them) none
    assert samples["server"]["series"]["client_conns"] == [2, 2, 6, 6, 8, 8, 7, 7, 2, 2]


def test_a_process_the_sampler_measured_is_not_counted_twice():
    own = OwnConns(clock=lambda: 1010.0)
    own.add("local", _wire(host_id(), 111, 1010.0, [[1003.0, 9], [1004.0, 9]]), final=True)
    samples = _samples([9] * 8, pids=(111,))
    own.add_to(samples, sampler_local=True)
    assert samples["server"]["series"]["client_conns"] == [9] * 8
    # the same process, but the server sampled by an agent on its own host: added
    samples = _samples([0] * 8, pids=(111,))
    own.add_to(samples, sampler_local=False)
    assert samples["server"]["series"]["client_conns"] == [0, 0, 9, 9, 9, 9, 0, 0]


def test_a_worker_that_never_finished_leaves_its_later_ticks_unknown():
    own = OwnConns(clock=lambda: 1003.0)
    own.add("w1", _wire("other/net", 5, 1003.0, [[1003.0, 4], [1004.0, 4]]))  # no final
    samples = _samples([1] * 8)
    own.add_to(samples, sampler_local=True)
    # unknown, not zero: the soak then judges the gross socket series, with the reason
    assert samples["server"]["series"]["client_conns"] == [1, 1, 5, 5, 5, 5, None, None]
