"""A network partition for one client made by the kernel: iptables DROP on loopback.

The client connects to `Blackhole.url`, a loopback port nobody listens on (this object keeps
it bound, so no one else takes it) that a NAT rule sends on to the broker's own port: the
broker sees an ordinary connection with nothing in between, unlike behind the proxy of
partition.py. `cut()` drops every packet of every connection made to that port, both ways
(conntrack remembers the port each connection was made to), and the SYN of any new one:
both ends keep their sockets open and their kernels retransmit into the void, as behind a
dead switch port. `heal()` lifts the drop. Only this client's connections are touched:
others to the broker (its handler's own, its peers') use the broker's port itself.

The rules live in two chains of this object's own (`LBG-BH-<pid>-<n>`, nat and filter),
which `close()` removes; chains left by a process that died before it could are removed by
the next Blackhole made on this machine, so no rule outlives a failed test for long.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import socket
import subprocess
from urllib.parse import urlsplit, urlunsplit

CHAIN_PREFIX = "LBG-BH-"
_CHAIN = re.compile(rf"^-N ({CHAIN_PREFIX}(\d+)-\d+)$", re.M)
_numbers = itertools.count(1)


class Unavailable(RuntimeError):
    """iptables cannot be used here (not root, not installed, or the kernel refuses)."""


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run iptables (waiting for the xtables lock); Unavailable with its message on failure."""
    done = subprocess.run(
        ["iptables", "-w", "5", *args], capture_output=True, text=True, timeout=30
    )
    if check and done.returncode != 0:
        raise Unavailable(f"iptables {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def _remove_chain(table: str, chain: str) -> None:
    """Unhook `chain` from OUTPUT and delete it; whatever of it is already gone is skipped."""
    while _iptables("-t", table, "-D", "OUTPUT", "-j", chain, check=False).returncode == 0:
        pass
    _iptables("-t", table, "-F", chain, check=False)
    _iptables("-t", table, "-X", chain, check=False)


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def remove_stale_chains() -> None:
    """Remove the chains of Blackholes whose process is gone (a test killed mid-cut)."""
    for table in ("filter", "nat"):
        for chain, pid in _CHAIN.findall(_iptables("-t", table, "-S", check=False).stdout):
            if not _alive(int(pid)):
                _remove_chain(table, chain)


def check_usable() -> None:
    """Unavailable, with the reason, unless this process can manage iptables rules."""
    if shutil.which("iptables") is None:
        raise Unavailable("iptables is not installed (make test installs Debian's package)")
    if os.geteuid() != 0:
        raise Unavailable("iptables rules need root")
    _iptables("-t", "nat", "-S", "OUTPUT")


class Blackhole:
    """A loopback port in front of one broker URL whose connections the test can black-hole."""

    def __init__(self, broker_url: str) -> None:
        parts = urlsplit(broker_url)
        if parts.hostname not in ("127.0.0.1", "localhost"):
            raise Unavailable(f"partitions are made on IPv4 loopback only, not {parts.hostname}")
        check_usable()
        remove_stale_chains()
        self._parts = parts
        self.chain = f"{CHAIN_PREFIX}{os.getpid()}-{next(_numbers)}"
        self._reserved = socket.socket()
        self._reserved.bind(("127.0.0.1", 0))
        self.port = self._reserved.getsockname()[1]
        self._match = ["-p", "tcp", "-m", "conntrack", "--ctorigdst", "127.0.0.1"]
        self._match += ["--ctorigdstport", str(self.port)]
        try:
            for table in ("nat", "filter"):
                _iptables("-t", table, "-N", self.chain)
                _iptables("-t", table, "-I", "OUTPUT", "-j", self.chain)
            _iptables(
                "-t", "nat", "-A", self.chain, "-p", "tcp", "-d", "127.0.0.1",
                "--dport", str(self.port), "-j", "DNAT",
                "--to-destination", f"127.0.0.1:{parts.port}",
            )  # fmt: skip
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        """The broker URL with the black-holable port: give it to the client to partition."""
        netloc = self._parts.netloc.rsplit("@", 1)
        netloc[-1] = f"127.0.0.1:{self.port}"
        return urlunsplit(self._parts._replace(netloc="@".join(netloc)))

    def cut(self) -> None:
        """Drop every packet of this port's connections, both ways; sockets stay open."""
        _iptables("-A", self.chain, *self._match, "-j", "DROP")

    def heal(self) -> None:
        """Let the packets through again: TCP retransmits what both ends held."""
        _iptables("-F", self.chain)

    def close(self) -> None:
        """Remove both chains and free the port."""
        for table in ("filter", "nat"):
            _remove_chain(table, self.chain)
        self._reserved.close()
