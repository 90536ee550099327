"""compose.yaml as Debian's Compose v1 (1.29) accepts it, for test-compose.sh only: Compose v2
is not packaged here. Drops what v1 rejects (the top-level `name`, `create_host_path`) and
the dependencies on the brokers of other profiles (`required: false`, which v1 lacks); and
the ports published on the host, which other work on a shared machine may hold (the test
talks to the containers only)."""

import sys
from pathlib import Path

import yaml


def for_compose_v1(document: dict, profile: str) -> dict:
    """The compose document with only what v1 understands, for one broker profile."""
    document.pop("name", None)
    for service in document["services"].values():
        service.pop("ports", None)
        for volume in service.get("volumes", []):
            if isinstance(volume, dict):
                volume.get("bind", {}).pop("create_host_path", None)
        depends = service.get("depends_on")
        if isinstance(depends, dict):
            for name, condition in list(depends.items()):
                if condition.pop("required", True) is False and profile not in document["services"][
                    name
                ].get("profiles", [profile]):
                    del depends[name]
    return document


if __name__ == "__main__":
    source, target, profile = sys.argv[1:]
    document = yaml.safe_load(Path(source).read_text())
    Path(target).write_text(yaml.safe_dump(for_compose_v1(document, profile), sort_keys=False))
