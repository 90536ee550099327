"""kill -USR1 makes a daemon log what every task is waiting for: a hang diagnosed live."""

import signal
from pathlib import Path

from tests.support.processes import wait_for_log

from lbg.devstack.deployment import LocalDeployment


def test_sigusr1_logs_every_task_stack_and_the_daemon_keeps_running(
    nats_url: str, tmp_path: Path
) -> None:
    local = LocalDeployment(nats_url, "never-created", tmp_path)
    client = local.start("client", "lbg-client", "--id", "c1")
    try:
        wait_for_log(client, "waiting for group")
        client.send(signal.SIGUSR1)
        wait_for_log(client, "stacks of every task")
        assert client.running
        assert "Stack for <Task" in client.log_path.read_text()
    finally:
        local.stop_all()
