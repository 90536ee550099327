"""The NATS JetStream adapter.

nats-py imports aiohttp as it loads, for websocket URLs only, which this adapter never takes
(nats:// and tls://): about 40 % of a client's imports, so of a join on a busy machine. The
first import of nats here hides aiohttp from it; aiohttp itself stays importable (the
metrics server and the live view use it).
"""

import sys

_HIDDEN = "aiohttp" not in sys.modules
if _HIDDEN:
    sys.modules["aiohttp"] = None  # type: ignore[assignment]
try:
    import nats.aio.client  # noqa: F401
finally:
    if _HIDDEN:
        del sys.modules["aiohttp"]
