"""cg-admin says when a password was given where other users can read it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from lbg.devstack.deployment import script
from lbg.devstack.embedded import free_port


def test_a_password_in_from_json_is_dropped_with_a_warning(tmp_path: Path) -> None:
    config = tmp_path / "admin.toml"
    config.write_text(
        f'[broker]\nurl = "nats://127.0.0.1:{free_port()}"\n'
        "connect_timeout = 0.5\nconnect_retry_for = 0\n",
        encoding="utf-8",
    )
    original = '{"HP":"hp","HC":4,"QC":2,"CU":"cu","CP":"pw12345"}'
    result = subprocess.run(
        [script("cg-admin"), "--config", str(config), "create", "--group", "g",
         "--from-json", original],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "CP (the client password) is dropped, never stored" in result.stderr
    assert "--client-password-file" in result.stderr
    assert "pw12345" not in result.stderr + result.stdout
