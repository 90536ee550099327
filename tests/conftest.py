"""Session-wide broker fixtures: one behaviour suite, run against every broker.

`broker` is parametrized over the brokers under test (LBG_TEST_BROKERS, default
"nats,rabbitmq"); every test that uses it, or a fixture built on it (make_group, deployment),
runs once per broker. Each broker is started once per session on free ports, never on the
machine's own 4222 / 5672:
- nats: an embedded nats-server (JetStream, file storage under pytest's temp directory).
  `nats_server` is that EmbeddedNats itself, for tests that stop, kill or restart it.
- rabbitmq: a private RabbitMQ node (Debian's rabbitmq-server package, management plugin).
- messagedb: a private PostgreSQL (Debian's postgresql package) with Message DB installed from
  npm (@eventide/message-db); not in the default list: LBG_TEST_BROKERS=messagedb.

Existing brokers instead: LBG_TEST_NATS_URL; LBG_TEST_RABBITMQ_URL with
LBG_TEST_RABBITMQ_ADMIN_URL (the management API); LBG_TEST_MESSAGEDB_URL (a postgresql://
URL of a database where Message DB is, or may be, installed). Tests that control the broker
process are skipped then.
"""

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings
from tests.support.solace_env import missing, solace_settings, write_config

from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.embedded import EmbeddedNats
from lbg.devstack.postgres import LocalPostgres, install_message_db, message_db_installed
from lbg.devstack.rabbitmq import LocalRabbitMQ

# Property tests check what a function returns, not how fast: a busy machine (two xdist
# workers beside the brokers they start) must not fail one on Hypothesis' 200 ms deadline.
settings.register_profile("lbg", deadline=None)
settings.load_profile("lbg")

EXTERNAL_URL_ENV = "LBG_TEST_NATS_URL"
RABBITMQ_URL_ENV = "LBG_TEST_RABBITMQ_URL"
RABBITMQ_ADMIN_ENV = "LBG_TEST_RABBITMQ_ADMIN_URL"
MESSAGEDB_URL_ENV = "LBG_TEST_MESSAGEDB_URL"
BROKERS_ENV = "LBG_TEST_BROKERS"
BROKERS = [b.strip() for b in os.environ.get(BROKERS_ENV, "nats,rabbitmq").split(",") if b.strip()]


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
    """URL of the NATS broker: $LBG_TEST_NATS_URL, else the embedded one's."""
    return os.environ.get(EXTERNAL_URL_ENV) or request.getfixturevalue("nats_server").url


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerEndpoint]:
    """The session's RabbitMQ: $LBG_TEST_RABBITMQ_URL, else a private node on free ports."""
    if os.environ.get(RABBITMQ_URL_ENV):
        yield BrokerEndpoint(
            "rabbitmq", os.environ[RABBITMQ_URL_ENV], os.environ.get(RABBITMQ_ADMIN_ENV)
        )
        return
    node = LocalRabbitMQ(tmp_path_factory.mktemp("rabbitmq"))
    node.start()
    yield BrokerEndpoint("rabbitmq", node.url, node.admin_url)
    node.stop()


@pytest.fixture(scope="session")
def messagedb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerEndpoint]:
    """The session's Message DB: $LBG_TEST_MESSAGEDB_URL (installed there if missing), else a
    private PostgreSQL on a free port with Message DB installed from npm."""
    if os.environ.get(MESSAGEDB_URL_ENV):
        url = os.environ[MESSAGEDB_URL_ENV]
        if not message_db_installed(url):
            install_message_db(url, create_database=False)
        yield BrokerEndpoint("messagedb", url)
        return
    server = LocalPostgres(tmp_path_factory.mktemp("postgres"))
    server.start()
    yield BrokerEndpoint("messagedb", server.url, restart=server.restart)
    server.stop()


@pytest.fixture(scope="session")
def solace(tmp_path_factory: pytest.TempPathFactory) -> BrokerEndpoint:
    """A real Solace broker given by LBG_TEST_SOLACE_* (make test-solace); none runs here."""
    if missing():
        pytest.skip(f"no Solace broker: set {', '.join(missing())}")
    config = write_config(tmp_path_factory.mktemp("solace"))
    settings = solace_settings()
    return BrokerEndpoint("solace", settings.url, settings.admin_url, config_file=config)


@pytest.fixture(scope="session", params=BROKERS)
def broker(request: pytest.FixtureRequest) -> BrokerEndpoint:
    """The broker this run of a behaviour test talks to."""
    if request.param == "nats":
        return BrokerEndpoint("nats", request.getfixturevalue("nats_url"))
    if request.param == "rabbitmq":
        return request.getfixturevalue("rabbitmq")
    if request.param == "messagedb":
        return request.getfixturevalue("messagedb")
    if request.param == "solace":
        return request.getfixturevalue("solace")
    raise pytest.UsageError(f"{BROKERS_ENV}: unknown broker '{request.param}'")


@pytest.fixture(scope="session")
def broker_url(broker: BrokerEndpoint) -> str:
    return broker.url


# In `make test-slow` only, to keep the default run short. The same code runs on every
# broker, so these run on NATS only by default; RabbitMQ keeps its own kinds of failure in the
# default run (kill -9 and SIGSTOP takeover, SIGTERM handover, reconnect, one active consumer
# per queue). The broker restart is in the default run's 60 s soak; the node-loss test needs
# a 3-node cluster.
SLOW_TESTS = {
    "test_short_demo_ends_with_nothing_lost_or_reordered[rabbitmq-static]",
    "test_short_demo_ends_with_nothing_lost_or_reordered[rabbitmq-dynamic]",
    "test_autoscale_adds_clients_for_a_backlog_and_removes_them_after[rabbitmq]",
    "test_scale_up_and_down_under_load_moves_queues_without_loss[rabbitmq]",
    "test_status_lists_the_members_and_every_queues_owner[rabbitmq]",
    "test_status_of_a_static_group_shows_the_brokers_active_client[rabbitmq]",
    "test_route_agrees_with_what_the_clients_processed[rabbitmq]",
    "test_move_hands_a_queue_to_the_chosen_member_with_nothing_lost_or_duplicated[rabbitmq]",
    "test_sigterm_hands_over_without_duplicates[rabbitmq]",
    "test_kill_9_of_the_active_client_loses_and_reorders_nothing[rabbitmq]",
    "test_hooks_tell_a_handover_in_order[rabbitmq]",
    "test_client_publisher_and_validator_metrics_count_the_same_events[rabbitmq]",
    "test_a_broker_restart_under_load_loses_and_reorders_nothing[nats]",
    "test_a_broker_restart_under_load_loses_and_reorders_nothing[rabbitmq]",
    "test_killing_the_leader_of_a_queue_loses_and_reorders_nothing",
    # The longest of the rest (30-200 s each on 2 cores), each with a shorter sibling in the
    # default run: the Spark replay at local[2] and a retried task's rows dropped; the
    # partition cut by the proxy; the NATS resize at rest and on Message DB; the peak
    # report's unit tests; one `lbg local up`; the dynamic demo.
    "test_an_executor_killed_mid_job_loses_nothing_and_duplicates_nothing",
    "test_a_partitioned_member_stops_before_its_successor_starts[rabbitmq-iptables]",
    "test_a_partitioned_member_stops_before_its_successor_starts[nats-iptables]",
    "test_a_partitioned_static_client_stops_before_the_broker_moves_its_queues[nats-iptables]",
    "test_clients_follow_a_grow_and_a_shrink_under_load_through_a_kill_and_a_join",
    "test_peak_scales_up_and_down_and_the_verdict_says_how_it_went",
    "test_a_second_up_starts_afresh",
    "test_short_demo_ends_with_nothing_lost_or_reordered[nats-static]",
}


# Tests whose premise does not hold on a broker, with the reason.
NOT_APPLICABLE = {
    "test_a_handler_hung_past_the_stall_timeout_gives_the_queues_up[messagedb]": (
        "assumes client-a still serves the 'hang' key's queue 1 s after client-b joined; on "
        "Message DB that planned handover completes in ~0.2 s, so client-b (which never hangs) "
        "serves it"
    ),
}


# `make test` runs on two xdist workers (-n 2 --dist loadgroup). The integration tests whose
# outcome depends on timing (failover, handover, load, soak, demo) share one group, so one
# worker runs them one after another and they never compete with each other for the two
# cores; the other worker takes the unit and deploy tests and these integration files, which
# check functions (create, permissions, TLS, start-up, hashing) with generous time bounds.
# Every other file is a group of its own, so its module fixtures (the Ansible runs) run once.
BESIDE_THE_TIMED_TESTS = {
    "test_admin.py",
    "test_diagnostics.py",
    "test_embedded.py",
    "test_fencing_token.py",
    "test_hash_cli.py",
    "test_messagedb_hash.py",
    "test_publisher_identity.py",
    "test_rabbitmq_identity.py",
    "test_security_nats.py",
    "test_security_rabbitmq.py",
    "test_startup.py",
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker and xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.name in NOT_APPLICABLE:
            item.add_marker(pytest.mark.skip(reason=NOT_APPLICABLE[item.name]))
        if item.name in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
        timed = item.path.parent.name == "integration" and (
            item.path.name not in BESIDE_THE_TIMED_TESTS
        )
        item.add_marker(pytest.mark.xdist_group("timed" if timed else item.path.name))
