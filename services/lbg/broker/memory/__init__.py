"""An in-process broker (`memory://<name>`) that keeps the rules the daemons rely on, for tests
and examples that need no broker process: see store.py for what it keeps and what it does not."""

from lbg.broker.memory.store import MemoryStore, memory_store, reset_memory_brokers

__all__ = ["MemoryStore", "memory_store", "reset_memory_brokers"]
