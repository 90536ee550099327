"""The iptables partition of tests/support/blackhole.py on a plain TCP connection: it cuts
both ways and new connections too, heals with nothing lost, and leaves no rule behind."""

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.blackhole import CHAIN_PREFIX, Blackhole, Unavailable, check_usable

QUIET = 1.0


@pytest.fixture
def server() -> Iterator[socket.socket]:
    """A listening socket on loopback standing in for the broker."""
    try:
        check_usable()
    except Unavailable as exc:
        pytest.skip(f"iptables partition not possible here: {exc}")
    listener = socket.create_server(("127.0.0.1", 0))
    yield listener
    listener.close()


def rules() -> str:
    """Every rule and chain of both tables, as iptables lists them."""
    return "".join(
        subprocess.run(
            ["iptables", "-w", "5", "-t", table, "-S"], capture_output=True, text=True
        ).stdout
        for table in ("filter", "nat")
    )


def received(sock: socket.socket) -> bytes | None:
    """What arrives within QUIET seconds; None if nothing does."""
    sock.settimeout(QUIET)
    try:
        return sock.recv(100)
    except TimeoutError:
        return None


def test_a_cut_drops_both_ways_and_the_heal_delivers_what_was_held(server: socket.socket) -> None:
    port = server.getsockname()[1]
    hole = Blackhole(f"amqp://u:p@127.0.0.1:{port}/%2F")
    try:
        assert hole.url == f"amqp://u:p@127.0.0.1:{hole.port}/%2F"
        client = socket.create_connection(("127.0.0.1", hole.port), timeout=5)
        peer, _ = server.accept()
        client.sendall(b"before")
        assert received(peer) == b"before"

        hole.cut()
        client.sendall(b"up")
        peer.sendall(b"down")
        assert received(peer) is None
        assert received(client) is None
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", hole.port), timeout=QUIET)

        hole.heal()
        peer.settimeout(10)
        client.settimeout(10)
        assert peer.recv(100) == b"up"
        assert client.recv(100) == b"down"
        client.close()
        peer.close()
    finally:
        hole.close()
    assert hole.chain not in rules()


def test_chains_of_a_dead_process_are_removed_by_the_next_blackhole(
    server: socket.socket,
) -> None:
    no_such_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    stale = f"{CHAIN_PREFIX}{no_such_pid}-1"
    subprocess.run(["iptables", "-w", "5", "-N", stale], check=True)
    subprocess.run(["iptables", "-w", "5", "-I", "OUTPUT", "-j", stale], check=True)
    hole = Blackhole(f"postgresql://u@127.0.0.1:{server.getsockname()[1]}/db")
    hole.close()
    assert stale not in rules()
