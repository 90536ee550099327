"""The local test bench: embedded and private brokers, local deployments, chaos, soak, demo,
scaling. May import anything; nothing in the product imports it."""
