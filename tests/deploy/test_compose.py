"""compose/: every file valid against the Compose Specification, the stack's wiring (brokers,
the one-shot cg-admin, a scalable lbg-client), its configs and secrets, and the NATS profile's
broker config and daemon configs run for real against a local nats-server."""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from lbg.devstack.embedded import find_nats_server, free_port
from lbg.settings import AdminConfig, ClientConfig, PublisherConfig, ValidatorConfig, load_config

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
SCHEMA = Path(__file__).parent / "schemas" / "compose-spec.json"
BIN = Path(sys.executable).parent

BROKERS = {"nats", "rabbitmq", "solace"}
INIT = "cg-admin"
DAEMONS = {
    INIT: AdminConfig,
    "hashed-publisher": PublisherConfig,
    "lbg-client": ClientConfig,
    "validation-client": ValidatorConfig,
}
CONFIG_TARGET = "/etc/lbg"
SECRETS_TARGET = "/run/secrets"
PROFILE_VARIABLE = re.compile(r"\$\{COMPOSE_PROFILES:-(\w+)\}")
SECRET_NAME = re.compile(r"pass|secret|token|key", re.IGNORECASE)


def compose_files() -> list[Path]:
    return sorted(p for p in COMPOSE_DIR.rglob("*") if p.suffix in {".yaml", ".yml"})


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))


def config_dir(service: dict[str, Any], profile: str) -> Path:
    """The host folder mounted at /etc/lbg, as Compose resolves it for `profile`."""
    (mount,) = [v for v in service["volumes"] if v["target"] == CONFIG_TARGET]
    return (COMPOSE_DIR / PROFILE_VARIABLE.sub(profile, mount["source"])).resolve()


def config_file(service: dict[str, Any], profile: str) -> Path:
    """The TOML the service's command names with --config, on the host."""
    command = service["command"]
    target = command[command.index("--config") + 1]
    assert target.startswith(CONFIG_TARGET + "/"), target
    return config_dir(service, profile) / target.removeprefix(CONFIG_TARGET + "/")


def test_there_is_a_compose_file_to_check() -> None:
    assert COMPOSE_FILE in compose_files()


@pytest.mark.parametrize("path", compose_files(), ids=lambda p: p.name)
def test_compose_file_matches_the_compose_specification(path: Path) -> None:
    errors = [
        f"{error.json_path}: {error.message}"
        for error in validator().iter_errors(yaml.safe_load(path.read_text(encoding="utf-8")))
    ]
    assert not errors, "\n".join(errors)


def test_the_schema_rejects_an_unknown_service_key() -> None:
    assert not validator().is_valid({"services": {"x": {"image": "a", "imagee": "b"}}})


def test_every_service_has_an_image_and_every_build_uses_the_repo_dockerfile(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        assert service.get("image"), f"{name}: no image"
        if "build" in service:
            context = (COMPOSE_DIR / service["build"]["context"]).resolve()
            assert (context / service["build"].get("dockerfile", "Dockerfile")).is_file(), name


def test_each_profile_has_one_healthchecked_broker_and_every_daemon(
    services: dict[str, dict[str, Any]],
) -> None:
    for profile in BROKERS:
        enabled = {name for name, s in services.items() if profile in s.get("profiles", [])}
        assert enabled == {profile, *DAEMONS}, profile
        assert services[profile]["healthcheck"]["test"][0] in {"CMD", "CMD-SHELL"}


def test_cg_admin_is_a_one_shot_init_that_waits_for_the_broker(
    services: dict[str, dict[str, Any]],
) -> None:
    init = services[INIT]
    assert init["command"][:1] == ["cg-admin"]
    assert {"create", "--if-not-exists"} <= set(init["command"])
    assert init["restart"] == "no"
    for broker in BROKERS:
        dependency = init["depends_on"][broker]
        assert dependency["condition"] == "service_healthy", broker
        # Only the active profile's broker exists; the others must not block the init.
        assert dependency["required"] is False, broker


def test_every_other_daemon_waits_for_cg_admin_to_succeed(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in set(DAEMONS) - {INIT}:
        depends_on = services[name]["depends_on"]
        assert depends_on == {INIT: {"condition": "service_completed_successfully"}}, name


def test_daemons_run_in_exec_form_so_they_get_sigterm(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in DAEMONS:
        command = services[name]["command"]
        assert isinstance(command, list) and command[0] == name, name
        assert "entrypoint" not in services[name], name


def test_lbg_client_scales(services: dict[str, dict[str, Any]]) -> None:
    client = services["lbg-client"]
    assert "container_name" not in client
    assert "ports" not in client, "published ports clash as soon as there are two clients"
    for profile in BROKERS:
        settings = load_config(config_file(client, profile), ClientConfig)
        assert settings.client.index is None and settings.client.count is None, profile


@pytest.mark.parametrize("profile", sorted(BROKERS))
def test_config_mounts_exist_and_load_with_each_daemons_schema(
    services: dict[str, dict[str, Any]], profile: str
) -> None:
    for name, schema in DAEMONS.items():
        mount = next(v for v in services[name]["volumes"] if v["target"] == CONFIG_TARGET)
        assert mount["read_only"] is True and mount["bind"]["create_host_path"] is False, name
        path = config_file(services[name], profile)
        assert path.is_file(), f"{name}: {path} does not exist"
        settings = load_config(path, schema)
        assert settings.broker.url.split("://")[1].startswith(profile + ":"), path
        if profile != "nats":
            assert settings.broker.user, path


def test_default_profile_in_env_file_is_a_broker() -> None:
    values = dict(
        line.split("=", 1)
        for line in (COMPOSE_DIR / ".env").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    )
    assert values["COMPOSE_PROFILES"] in BROKERS
    assert f"${{COMPOSE_PROFILES:-{values['COMPOSE_PROFILES']}}}" in COMPOSE_FILE.read_text(
        encoding="utf-8"
    )


def test_no_secret_is_written_into_environment_or_configs(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    for name, service in services.items():
        environment = service.get("environment", {})
        assert isinstance(environment, dict), f"{name}: use the mapping form"
        for key, value in environment.items():
            if SECRET_NAME.search(key):
                assert str(value).startswith(SECRETS_TARGET + "/"), f"{name}: {key} is a literal"
        script = " ".join(service.get("entrypoint", []))
        for key, value in re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", script):
            if SECRET_NAME.search(key):
                assert re.fullmatch(rf'"\$\$\(cat {SECRETS_TARGET}/\w+\)"', value), f"{name}: {key}"
    for path in (REPO / "config" / "compose").rglob("*.toml"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(password|admin_password|token)\s*=", text, re.M), path
    for secret in compose["secrets"].values():
        source = (COMPOSE_DIR / secret["file"]).relative_to(REPO)
        ignored = subprocess.run(["git", "check-ignore", "-q", str(source)], cwd=REPO, check=False)
        assert ignored.returncode == 0, f"{source} is not git-ignored"


def test_every_password_file_is_a_secret_mounted_on_that_service(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    declared = set(compose["secrets"])
    for name, service in services.items():
        mounted = set(service.get("secrets", []))
        assert mounted <= declared, name
        if name not in DAEMONS:
            continue
        for profile in BROKERS:
            broker = load_config(config_file(service, profile), DAEMONS[name]).broker
            for path in (broker.password_file, broker.admin_password_file):
                if path is not None:
                    assert path.startswith(SECRETS_TARGET + "/"), path
                    assert path.removeprefix(SECRETS_TARGET + "/") in mounted, (name, path)


# --- the NATS profile for real, without a container engine ----------------------------------


@pytest.fixture
def compose_nats(
    tmp_path_factory: pytest.TempPathFactory, services: dict[str, dict[str, Any]]
) -> Iterator[tuple[str, Path]]:
    """A fresh nats-server started as the `nats` service's entrypoint starts it (its config, the
    passwords from the secrets in its environment) on free local ports; yields its URL and the
    folder standing in for /run/secrets."""
    tmp = tmp_path_factory.mktemp("compose-nats")
    secrets = tmp / "secrets"
    secrets.mkdir()
    script = services["nats"]["entrypoint"][-1]
    env = dict(os.environ)
    for variable, secret in re.findall(r'(\w+)="\$\$\(cat /run/secrets/(\w+)\)"', script):
        env[variable] = f"{secret}-value"
        (secrets / secret).write_text(env[variable] + "\n", encoding="utf-8")
    assert {"LBG_BROKER_PASSWORD", "LBG_CLIENT_PASSWORD"} <= set(env)
    server_args = shlex.split(script.split("exec ", 1)[1])
    assert server_args[0] == "nats-server"
    (conf,) = [v.split(":")[0] for v in services["nats"]["volumes"] if "lbg.conf" in v]
    local = {"/data": str(tmp / "data"), "/etc/nats/lbg.conf": str(COMPOSE_DIR / conf)}
    port = free_port()
    server = subprocess.Popen(
        [
            find_nats_server(),
            *(local.get(arg, arg) for arg in server_args[1:]),
            *("-a", "127.0.0.1", "-p", str(port), "-m", str(free_port())),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield f"nats://127.0.0.1:{port}", secrets
    finally:
        server.terminate()
        server.wait(timeout=10)


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port}")


def local_config(
    service: dict[str, Any], tmp: Path, secrets: Path, password_file: str | None = None
) -> Path:
    """The service's NATS-profile TOML with /run/secrets pointing at `secrets`."""
    text = config_file(service, "nats").read_text(encoding="utf-8")
    text = text.replace(SECRETS_TARGET + "/", f"{secrets}/")
    if password_file is not None:
        line = f'password_file = "{password_file}"'
        text = re.sub(r'^password_file = ".*"$', line, text, flags=re.MULTILINE)
        # A refused login is retried until connect_timeout: fail fast.
        text = re.sub(r"^connect_timeout = .*$", "connect_timeout = 1.0", text, flags=re.MULTILINE)
    path = tmp / config_file(service, "nats").name
    path.write_text(text, encoding="utf-8")
    return path


def run_command(service: dict[str, Any], config: Path, secrets: Path) -> list[str]:
    """The service's compose command, run from this venv with local config and secrets."""
    command = [arg.replace(SECRETS_TARGET + "/", f"{secrets}/") for arg in service["command"]]
    command[command.index("--config") + 1] = str(config)
    command[0] = str(BIN / command[0])
    return command


def test_nats_profile_cg_admin_creates_then_tolerates_the_group(
    compose_nats, services: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, secrets = compose_nats
    init = services[INIT]
    program, *args = run_command(init, local_config(init, tmp_path, secrets), secrets)
    command = [program, "--broker-url", url, *args]
    first = subprocess.run(command, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "created group 'orders'" in first.stdout
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "already exists" in again.stdout


def test_nats_profile_refuses_a_wrong_password(
    compose_nats, services: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, secrets = compose_nats
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password", encoding="utf-8")
    init = services[INIT]
    program, *args = run_command(init, local_config(init, tmp_path, secrets, str(wrong)), secrets)
    result = subprocess.run([program, "--broker-url", url, *args], capture_output=True, text=True)
    assert result.returncode != 0
    assert "cannot connect" in result.stderr


def test_nats_profile_client_passes_its_healthcheck_and_stops_on_sigterm(
    compose_nats, services: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, secrets = compose_nats
    init = services[INIT]
    created = subprocess.run(
        [
            *(str(BIN / "cg-admin"), "--broker-url", url),
            *("--config", str(local_config(init, tmp_path, secrets)), "create", "--if-not-exists"),
        ],
        capture_output=True,
        text=True,
    )
    assert created.returncode == 0, created.stderr
    client = services["lbg-client"]
    port = free_port()
    probe = [
        str(BIN / part) if part in ("python", "lbg") else part.replace("9464", str(port))
        for part in client["healthcheck"]["test"][1:]
    ]
    process = subprocess.Popen(
        [
            *run_command(client, local_config(client, tmp_path, secrets), secrets),
            *("--broker-url", url, "--metrics-port", str(port)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while subprocess.run(probe, capture_output=True).returncode != 0:
            assert process.poll() is None, process.stderr.read()
            assert time.monotonic() < deadline, "the healthcheck never passed"
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
