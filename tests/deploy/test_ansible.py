"""ansible/: lint, syntax, then real `connection: local` runs of site.yml into a temporary root
(no users, no systemd): cg-admin creates the group on a real NATS broker, every rendered TOML
loads with its daemon's schema, the units pass `systemd-analyze verify`, a second run changes
nothing, and changing lbg_client_instances adds or removes only the instances concerned."""

import configparser
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from lbg.settings import AdminConfig, ClientConfig, PublisherConfig, ValidatorConfig, load_config

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
BIN = Path(sys.executable).parent
CONFIG_DIR = "/etc/lbg"
SYSTEMD_DIR = "/etc/systemd/system"
PASSWORD = "deploy-test-password"
INSTANCES = 4
METRICS_BASE = 9500
UNITS = ("lbg-hashed-publisher.service", "lbg-client@.service", "lbg-validation-client.service")
SCHEMAS = {
    "cg-admin.toml": AdminConfig,
    "hashed-publisher.toml": PublisherConfig,
    "validation-client.toml": ValidatorConfig,
    **{f"lbg-client-{n}.toml": ClientConfig for n in range(1, INSTANCES + 1)},
}
RECAP = re.compile(r"^localhost\s*:\s*(.*)$", re.MULTILINE)


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is missing: pip install -e '.[test]'"
    return str(path)


def ansible_env(home: Path) -> dict[str, str]:
    return dict(
        os.environ,
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"),
        ANSIBLE_HOME=str(home),
        ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_PIPELINING="1",
    )


@dataclass
class Deployment:
    """Where the playbook rendered to, with what, and what its two runs reported."""

    tmp: Path
    root: Path
    group: str
    broker_url: str
    extra_vars: dict[str, object]
    first: subprocess.CompletedProcess[str]
    second: subprocess.CompletedProcess[str]

    def config(self, name: str) -> Path:
        return self.root / CONFIG_DIR.lstrip("/") / name

    def unit(self, name: str) -> Path:
        return self.root / SYSTEMD_DIR.lstrip("/") / name


def play(tmp: Path, extra_vars: dict[str, object], *options: str) -> subprocess.CompletedProcess:
    """One run of site.yml on inventory/local.yml with `extra_vars`; must succeed."""
    variables = tmp / f"vars-{uuid.uuid4().hex[:6]}.json"
    variables.write_text(json.dumps(extra_vars), encoding="utf-8")
    result = subprocess.run(
        [
            *(tool("ansible-playbook"), "-i", "inventory/local.yml", "-e", f"@{variables}"),
            *options,
            "site.yml",
        ],
        cwd=ANSIBLE_DIR,
        env=ansible_env(tmp / "ansible-home"),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result


def recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    (line,) = RECAP.findall(result.stdout)
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, nats_url: str) -> Deployment:
    tmp = tmp_path_factory.mktemp("ansible")
    root = tmp / "root"
    group = f"deploy{uuid.uuid4().hex[:8]}"
    extra_vars: dict[str, object] = {
        "lbg_prefix": str(root),
        "lbg_manage_services": False,
        "lbg_manage_users": False,
        "lbg_install": False,
        "lbg_venv": sys.prefix,
        "lbg_broker_url": nats_url,
        "lbg_broker_user": "lbg",
        "lbg_broker_password": PASSWORD,
        "lbg_group_name": group,
        "cg_admin_hash_prefix": group,
        "lbg_client_instances": INSTANCES,
        "lbg_client_metrics_port": METRICS_BASE,
    }
    first = play(tmp, extra_vars)
    second = play(tmp, extra_vars)
    return Deployment(tmp, root, group, nats_url, extra_vars, first, second)


def test_ansible_lint_passes(tmp_path: Path) -> None:
    result = subprocess.run(
        [tool("ansible-lint"), "--offline", "--nocolor"],
        cwd=ANSIBLE_DIR,
        env=ansible_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


def test_playbook_syntax_with_the_example_inventory(tmp_path: Path) -> None:
    result = subprocess.run(
        [tool("ansible-playbook"), "-i", "inventory/example.yml", "--syntax-check", "site.yml"],
        cwd=ANSIBLE_DIR,
        env=ansible_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_first_run_creates_the_group_on_the_broker(deployment: Deployment) -> None:
    assert re.search(
        r"TASK \[cg_admin : Create the group on the broker\].*?\nchanged: \[localhost\]",
        deployment.first.stdout,
        re.DOTALL,
    ), deployment.first.stdout[-3000:]
    listed = subprocess.run(
        [tool("cg-admin"), "--broker-url", deployment.broker_url, "list", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert json.loads(listed.stdout)[deployment.group]["HP"] == deployment.group


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_rendered_config_loads_with_its_daemons_schema(deployment: Deployment, name: str) -> None:
    settings = load_config(deployment.config(name), SCHEMAS[name])
    assert settings.broker.url == deployment.broker_url
    assert settings.broker.user == "lbg"
    assert settings.group.name == deployment.group
    if name == "cg-admin.toml":
        assert settings.broker.password_file is None, "cg-admin gets its passwords at run time"
    else:
        assert settings.broker.password_file.startswith(f"{CONFIG_DIR}/secrets/")
        assert (deployment.root / settings.broker.password_file.lstrip("/")).is_file()


def test_each_client_instance_is_dynamic_with_its_own_metrics_port(
    deployment: Deployment,
) -> None:
    ports = []
    for n in range(1, INSTANCES + 1):
        settings = load_config(deployment.config(f"lbg-client-{n}.toml"), ClientConfig)
        assert settings.client.index is None and settings.client.count is None
        assert settings.client.heartbeat_interval is None, "the broker's default timing"
        assert settings.client.lease is None
        ports.append(settings.metrics.port)
    assert ports == list(range(METRICS_BASE, METRICS_BASE + INSTANCES))


def test_passwords_live_only_in_their_own_files(deployment: Deployment) -> None:
    secrets = sorted((deployment.root / CONFIG_DIR.lstrip("/") / "secrets").iterdir())
    assert [p.name for p in secrets] == [
        "hashed-publisher.password",
        "lbg-client.password",
        "validation-client.password",
    ]
    for path in secrets:
        assert path.read_text(encoding="utf-8") == PASSWORD
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path
    rendered = [p for p in deployment.root.rglob("*") if p.is_file() and p not in secrets]
    assert rendered
    for path in rendered:
        assert PASSWORD not in path.read_text(encoding="utf-8"), path
        if path.suffix == ".toml":
            assert stat.S_IMODE(path.stat().st_mode) == 0o640, path


def service_section(path: Path) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    parser.read(path, encoding="utf-8")
    return dict(parser["Service"])


@pytest.mark.parametrize("name", UNITS)
def test_unit_is_hardened_and_points_at_a_rendered_config(
    deployment: Deployment, name: str
) -> None:
    service = service_section(deployment.unit(name))
    assert service["User"] and service["User"] != "root"
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "Restart": "on-failure",
        "KillSignal": "SIGTERM",
    }.items():
        assert service.get(key) == value, key
    timeout = re.fullmatch(r"(\d+)s", service["TimeoutStopSec"])
    assert timeout and int(timeout.group(1)) >= 30
    program, option, config = service["ExecStart"].split()
    assert program == f"{sys.prefix}/bin/{Path(program).name}" and Path(program).exists()
    assert option == "--config"
    assert config.startswith(CONFIG_DIR + "/")
    assert deployment.config(config.removeprefix(CONFIG_DIR + "/").replace("%i", "1")).is_file()


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze is not installed here")
    return path


def verify(systemd_analyze: str, unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [systemd_analyze, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("name", UNITS)
def test_unit_passes_systemd_analyze_verify(
    deployment: Deployment, systemd_analyze: str, name: str
) -> None:
    result = verify(systemd_analyze, deployment.unit(name))
    # Unknown keys are only warnings (exit 0): any output is a finding.
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_systemd_analyze_catches_a_broken_unit(
    deployment: Deployment, systemd_analyze: str, tmp_path: Path
) -> None:
    broken = tmp_path / UNITS[0]
    text = deployment.unit(UNITS[0]).read_text(encoding="utf-8")
    broken.write_text(text.replace(f"ExecStart={sys.prefix}/bin/", "ExecStart=bin/"), "utf-8")
    assert verify(systemd_analyze, broken).returncode != 0


def test_second_run_changes_nothing(deployment: Deployment) -> None:
    assert recap(deployment.first)["changed"] > 0
    assert recap(deployment.second)["changed"] == 0, deployment.second.stdout[-4000:]


def test_lowering_the_instance_count_removes_the_instances_above_it(
    deployment: Deployment, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    shutil.copytree(deployment.root, root)
    scaled = {
        **deployment.extra_vars,
        "lbg_prefix": str(root),
        "lbg_client_instances": 2,
        "lbg_client_mode": "static",
    }
    play(tmp_path, scaled, "--tags", "lbg_client")
    configs = root / CONFIG_DIR.lstrip("/")
    assert sorted(p.name for p in configs.glob("lbg-client-*.toml")) == [
        "lbg-client-1.toml",
        "lbg-client-2.toml",
    ]
    for index in (0, 1):
        client = load_config(configs / f"lbg-client-{index + 1}.toml", ClientConfig).client
        assert (client.index, client.count) == (index, 2)


def test_raising_the_instance_count_adds_instances_and_touches_no_other(
    deployment: Deployment, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    shutil.copytree(deployment.root, root)
    scaled = {**deployment.extra_vars, "lbg_prefix": str(root), "lbg_client_instances": 5}
    result = play(tmp_path, scaled, "--tags", "lbg_client")
    assert recap(result)["changed"] == 1, result.stdout[-4000:]
    configs = root / CONFIG_DIR.lstrip("/")
    assert load_config(configs / "lbg-client-5.toml", ClientConfig).metrics.port == METRICS_BASE + 4
