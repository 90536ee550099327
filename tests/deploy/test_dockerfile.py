"""Dockerfile and .dockerignore, checked without a container engine: the instructions, the build
context they see, and the HEALTHCHECK command run against a real process."""

import json
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
SECRET_WORDS = re.compile(r"pass(word)?|secret|token|credential", re.IGNORECASE)


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    logical, pending = [], ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    parsed = []
    for text in logical:
        keyword, _, arguments = text.strip().partition(" ")
        parsed.append((keyword.upper(), arguments.strip()))
    return parsed


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore as (is_exception, pattern) in file order; the last matching rule wins."""
    rules = []
    for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        glob = line.lstrip("!").strip("/")
        regex = (
            re.escape(glob)
            .replace(r"\*\*/", "(?:.*/)?")
            .replace(r"\*\*", ".*")
            .replace(r"\*", "[^/]*")
            .replace(r"\?", "[^/]")
        )
        rules.append((exception, re.compile(regex)))
    return rules


def in_context(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the file at `path` (relative, with /) is sent to the builder."""
    parts = path.split("/")
    excluded = False
    for exception, pattern in rules:
        if any(pattern.fullmatch("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            excluded = not exception
    return not excluded


def repo_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in listed.stdout.splitlines() if (REPO / line).is_file()]


def test_final_stage_is_python_311_slim_and_runs_as_a_non_root_user() -> None:
    stage = final_stage()
    assert stage[0][1].split()[0] == "python:3.11-slim"
    users = [arguments for keyword, arguments in stage if keyword == "USER"]
    assert users, "no USER: the daemons would run as root"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    start = next(i for i, (keyword, _) in enumerate(stage) if keyword == "USER")
    assert not [keyword for keyword, _ in stage[start:] if keyword == "RUN"], "RUN after USER"


def test_healthcheck_is_an_exec_form_command() -> None:
    (healthcheck,) = [arguments for keyword, arguments in final_stage() if keyword == "HEALTHCHECK"]
    options, _, command = healthcheck.partition("CMD ")
    assert options.strip() and command, healthcheck
    assert isinstance(json.loads(command), list)
    for option in ("--interval=", "--timeout=", "--retries="):
        assert option in options


def healthcheck_command(pid: int) -> list[str]:
    """The HEALTHCHECK command, pointed at `pid` instead of the container's PID 1."""
    (healthcheck,) = [arguments for keyword, arguments in final_stage() if keyword == "HEALTHCHECK"]
    command = json.loads(healthcheck.partition("CMD ")[2])
    assert command[0] == "python"
    return [sys.executable, *(part.replace("/proc/1/", f"/proc/{pid}/") for part in command[1:])]


def test_healthcheck_passes_for_a_running_daemon_and_fails_for_a_stopped_one() -> None:
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert subprocess.run(healthcheck_command(daemon.pid), check=False).returncode == 0
        daemon.send_signal(signal.SIGSTOP)
        assert subprocess.run(healthcheck_command(daemon.pid), check=False).returncode != 0
        daemon.send_signal(signal.SIGCONT)
        assert subprocess.run(healthcheck_command(daemon.pid), check=False).returncode == 0
    finally:
        daemon.kill()
        daemon.wait()


def test_no_secret_is_baked_into_the_image() -> None:
    for keyword, arguments in instructions():
        if keyword in {"ENV", "ARG", "LABEL"}:
            names = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", arguments) or arguments.split()[:1]
            assert not [n for n in names if SECRET_WORDS.search(n)], f"{keyword} {arguments}"
        if keyword in {"COPY", "ADD"}:
            sources = arguments.split()[:-1]
            assert not [s for s in sources if s.startswith(("config", "compose", "ansible"))]
            assert not [s for s in sources if SECRET_WORDS.search(s)], arguments


def test_build_context_holds_the_package_and_nothing_secret() -> None:
    rules = ignore_rules()
    files = repo_files()
    sent = {path for path in files if in_context(path, rules)}
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    (source_root,) = project["tool"]["setuptools"]["packages"]["find"]["where"]
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {path for path in files if path.startswith(source_root + "/lbg/")}
    needed -= {path for path in needed if "__pycache__" in path}
    assert needed <= sent, sorted(needed - sent)[:10]
    for path in sent:
        assert not path.startswith(("config/", "compose/", "ansible/", "tests/", ".venv/")), path
        assert not SECRET_WORDS.search(Path(path).name), path
    for path in ("compose/secrets/broker_password", ".venv/bin/python", ".git/config"):
        assert not in_context(path, rules), path


@pytest.mark.parametrize(
    ("path", "sent"),
    [("services/lbg/cli/admin.py", True), ("config/lbg-client.toml", False)],
)
def test_the_context_matcher_tells_both_ways(path: str, sent: bool) -> None:
    assert in_context(path, ignore_rules()) is sent


def test_every_copied_source_is_in_the_build_context() -> None:
    rules = ignore_rules()
    files = repo_files()
    for keyword, arguments in instructions():
        if keyword != "COPY" or arguments.startswith("--from="):
            continue
        for source in arguments.split()[:-1]:
            source = source.rstrip("/")
            matching = [f for f in files if f == source or f.startswith(source + "/")]
            assert matching and all(in_context(f, rules) for f in matching), source
