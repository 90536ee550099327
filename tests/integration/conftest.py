"""Fixtures for end-to-end tests: a fresh group per test and its daemons as real processes."""

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.processes import cli, run_validator

from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import LocalDeployment


@pytest.fixture
def group_name() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def make_group(broker: BrokerEndpoint, group_name: str) -> Iterator[Callable[..., str]]:
    """Create the test's group with cg-admin (HC 32, QC 4 unless overridden); delete it after."""
    created: list[str] = []

    def create(*flags: str) -> str:
        cli(
            "cg-admin",
            "--broker-url",
            broker.url,
            *broker.admin_args(),
            "create",
            "--group",
            group_name,
            "--hash-prefix",
            group_name,
            "--hash-count",
            "32",
            "--queue-count",
            "4",
            *flags,
        )
        created.append(group_name)
        return group_name

    yield create
    for name in created:
        cli(
            "cg-admin",
            "--broker-url",
            broker.url,
            *broker.admin_args(),
            "delete",
            name,
            check=False,
        )


@pytest.fixture
def deployment(
    broker: BrokerEndpoint, group_name: str, tmp_path: Path
) -> Iterator[LocalDeployment]:
    """The test's daemons; whatever is still running is stopped at the end."""
    local = LocalDeployment(
        broker.url,
        group_name,
        tmp_path / "daemons",
        admin_url=broker.admin_url,
        extra_args=tuple(broker.config_args()),
    )
    yield local
    local.stop_all()


@pytest.fixture
def validate(deployment: LocalDeployment) -> Callable[[], dict]:
    """Call to run the validation client to completion and get its JSON report."""
    return lambda: run_validator(deployment)
