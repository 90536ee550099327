"""Pure rules and wire formats: group config, hashing, destinations, messages, control messages,
sequence checking, assignment, leases. Imports only the standard library, orjson and model/."""
