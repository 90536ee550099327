"""Replaying a dataset into a group with Spark, and the synthetic dataset (an optional extra)."""
