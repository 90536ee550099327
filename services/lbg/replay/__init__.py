"""Replaying a dataset into a group with Spark, and the synthetic dataset (the `[replay]`
extra: pyspark, pyarrow, numpy). The names below need none of it, so the commands can show
their help and say which extra to install."""

KEY_COLUMN = "order_id"
ORDER_COLUMN = "event_seq"
FORMATS = ("auto", "parquet", "csv", "json")
DEFAULT_MASTER = "local[2]"
