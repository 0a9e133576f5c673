"""free_port (worker/web.py) keeps out of the range outgoing connections take their ports from."""

from __future__ import annotations

import socket

import pytest

from mnemoflow.devstack.processes import free_port
from mnemoflow.worker.web import FREE_PORT_RANGE


def test_ports_are_bindable_distinct_and_below_the_ephemeral_range() -> None:
    low, high = FREE_PORT_RANGE
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports), "a port was handed out twice"
    assert all(low <= p <= high for p in ports)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        first_ephemeral = int(f.read().split()[0])
    assert high < first_ephemeral
    for port in ports[:20]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five ports to choose from, four of them listening: the fifth, then the OS's pick."""
    from collections import deque

    from mnemoflow.worker import web

    base = free_port()
    while not all(web.bindable(p) for p in range(base, base + 5)):
        base = free_port()
    monkeypatch.setattr(web, "FREE_PORT_RANGE", (base, base + 4))
    monkeypatch.setattr(web, "_handed_out", deque(maxlen=512))
    taken = []
    try:
        for port in range(base, base + 4):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", port))
            sock.listen()
            taken.append(sock)
        assert free_port() == base + 4
        other = free_port()  # the range is used up: the OS picks one
        assert not base <= other <= base + 4
    finally:
        for sock in taken:
            sock.close()
