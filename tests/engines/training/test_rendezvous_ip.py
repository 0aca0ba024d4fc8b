"""The learner's rendezvous address (engines/training/dist.py) is the one other nodes reach, never the
127.0.1.1 that gethostbyname(gethostname()) gives on stock Debian/Ubuntu."""

from __future__ import annotations

import socket

from compassplay.engines.training import dist


def _debian(monkeypatch, route: str) -> None:
    monkeypatch.setattr(socket, "gethostbyname", lambda host: "127.0.1.1")
    monkeypatch.setattr(dist, "route_ip", lambda: route, raising=False)
    for var in ("COMPASSPLAY_NODE_IP", "VLLM_HOST_IP"):
        monkeypatch.delenv(var, raising=False)


def test_rendezvous_takes_the_routable_address_over_a_loopback_host_name(monkeypatch):
    _debian(monkeypatch, "10.1.2.3")
    addr, port = dist.rendezvous()
    assert addr == "10.1.2.3" and 0 < port < 65536


def test_loopback_detection():
    assert dist.is_loopback("127.0.1.1") and dist.is_loopback("127.0.0.1")
    assert dist.is_loopback("::1") and dist.is_loopback("not-an-ip")
    assert not dist.is_loopback("10.0.0.7") and not dist.is_loopback("192.0.2.2")


def test_an_explicit_address_wins_and_no_network_falls_back_to_loopback(monkeypatch, caplog):
    _debian(monkeypatch, "")
    assert dist.node_ip() == "127.0.0.1"  # one node only: logged
    assert "no non-loopback address" in caplog.text
    monkeypatch.setenv("VLLM_HOST_IP", "10.9.9.9")
    assert dist.node_ip() == "10.9.9.9"
    monkeypatch.setenv("COMPASSPLAY_NODE_IP", "10.8.8.8")
    assert dist.rendezvous()[0] == "10.8.8.8"
