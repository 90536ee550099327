"""Session-wide broker fixtures.

`nats_url` is the broker every integration test talks to: by default an embedded nats-server
(JetStream, file storage under pytest's temporary directory, a free port, never 4222) started
once per session. `nats_server` is that EmbeddedNats itself, for tests that stop, kill or
restart the broker; such tests must leave it running (restart() keeps its URL).

Set LBG_TEST_NATS_URL to test against an existing broker instead: `nats_url` returns it and
tests that need `nats_server` are skipped, since they cannot control that broker's process.
"""

import os
from collections.abc import Iterator

import pytest

from lbg.embedded import EmbeddedNats

EXTERNAL_URL_ENV = "LBG_TEST_NATS_URL"


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """The session's embedded broker, started once and stopped at the end."""
    if os.environ.get(EXTERNAL_URL_ENV):
        pytest.skip(f"{EXTERNAL_URL_ENV} is set: this test controls the broker process")
    server = EmbeddedNats(tmp_path_factory.mktemp("nats") / "data")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(request: pytest.FixtureRequest) -> str:
    """URL of the broker under test: $LBG_TEST_NATS_URL, else the embedded one's."""
    return os.environ.get(EXTERNAL_URL_ENV) or request.getfixturevalue("nats_server").url
