"""Sticky load balancing: keyed events over a changing set of consumers, in order, nothing lost."""
