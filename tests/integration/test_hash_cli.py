"""`lbg hash`: one "bucket<TAB>key" line per key, in order, for every hash function."""

import subprocess

from lbg.devstack.deployment import script
from lbg.model.hashing import java_bucket, murmur2

BLOG_KEY = "b8c1ccb2-c67f-446f-8111-9eec8b264782/25c151d2-76c3-41aa-98c4-508542cd80b9"


def lbg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [script("lbg"), *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_java_prints_bucket_tab_key_per_key_in_order() -> None:
    keys = ["zeta", BLOG_KEY, "a.b *>", "alpha", "zeta"]
    result = lbg("hash", "--function", "java", "--buckets", "100", *keys)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [f"{java_bucket(key, 100)}\t{key}" for key in keys]
    assert lines[1] == f"96\t{BLOG_KEY}"


def test_java_is_the_default_function() -> None:
    result = lbg("hash", "--buckets", "100", BLOG_KEY)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"96\t{BLOG_KEY}\n"


def test_murmur2_matches_kafkas_partitioner() -> None:
    expected = (murmur2(b"foobar") & 0x7FFFFFFF) % 100
    # Kafka's UtilsTest: murmur2("foobar") == -790332482.
    assert expected == (-790332482 & 0x7FFFFFFF) % 100

    result = lbg("hash", "--function", "murmur2", "--buckets", "100", "foobar")

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{expected}\tfoobar\n"


def test_messagedb_uses_the_stream_id() -> None:
    result = lbg("hash", "--function", "messagedb", "--buckets", "7", "order-1", "invoice-1+x")
    assert result.returncode == 0, result.stderr
    first, second = (line.split("\t") for line in result.stdout.splitlines())
    assert first[1] == "order-1" and second[1] == "invoice-1+x"
    assert first[0] == second[0], "the same cardinal id must land in the same bucket"


def test_messagedb_stream_name_without_id_is_one_line_exit_2() -> None:
    result = lbg("hash", "--function", "messagedb", "--buckets", "4", "categoryonly")

    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "categoryonly" in lines[0] and "no id" in lines[0]
    assert "Traceback" not in result.stderr


def test_zero_buckets_is_a_usage_error() -> None:
    result = lbg("hash", "--buckets", "0", "a")
    assert result.returncode == 2
    assert "--buckets" in result.stderr
    assert result.stdout == ""
