"""The consumer runtime: the client, its coordinator and membership, per-key lanes."""
