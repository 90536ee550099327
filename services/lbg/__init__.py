"""Sticky load balancing: keyed events over a changing set of consumers, in order, nothing lost.

The in-process API (see lbg.api): `Publisher` publishes keyed events to a group, `Client` runs a
handler as a member of it; a handler gets an `Event` and a `Context`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Client", "Context", "Event", "Hooks", "MalformedMessage", "Publisher"]

_HOMES = {
    "Client": "lbg.api",
    "Publisher": "lbg.api",
    "Context": "lbg.handlers",
    "Hooks": "lbg.handlers",
    "Event": "lbg.model.messages",
    "MalformedMessage": "lbg.model.messages",
}


def __getattr__(name: str) -> Any:
    """Import the public names on first use, so `import lbg.<module>` stays light."""
    if name not in _HOMES:
        raise AttributeError(f"module 'lbg' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
