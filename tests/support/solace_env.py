"""The Solace broker the tests may be given (LBG_TEST_SOLACE_*): none runs on these machines."""

import os
from pathlib import Path

from lbg.settings import BrokerSettings

ENV = {
    "url": "LBG_TEST_SOLACE_URL",
    "vpn": "LBG_TEST_SOLACE_VPN",
    "admin_url": "LBG_TEST_SOLACE_SEMP_URL",
    "user": "LBG_TEST_SOLACE_USER",
    "password": "LBG_TEST_SOLACE_PASSWORD",
    "admin_user": "LBG_TEST_SOLACE_ADMIN_USER",
    "admin_password": "LBG_TEST_SOLACE_ADMIN_PASSWORD",
}


def missing() -> list[str]:
    """The variables still to set for a live Solace run (none: ready)."""
    return [name for name in ENV.values() if not os.environ.get(name)]


def solace_settings() -> BrokerSettings:
    """The broker settings the variables describe (check `missing()` first)."""
    return BrokerSettings(**{key: os.environ[name] for key, name in ENV.items()})


def write_config(folder: Path) -> Path:
    """A config file with the [broker] keys every daemon needs beyond the URL; the passwords
    go to files of their own, as an operator would keep them."""
    settings = solace_settings()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "password").write_text(settings.password or "", encoding="utf-8")
    (folder / "admin-password").write_text(settings.admin_password or "", encoding="utf-8")
    path = folder / "solace.toml"
    path.write_text(
        "[broker]\n"
        f'url = "{settings.url}"\n'
        f'vpn = "{settings.vpn}"\n'
        f'user = "{settings.user}"\n'
        f'password_file = "{folder / "password"}"\n'
        f'admin_url = "{settings.admin_url}"\n'
        f'admin_user = "{settings.admin_user}"\n'
        f'admin_password_file = "{folder / "admin-password"}"\n',
        encoding="utf-8",
    )
    return path
