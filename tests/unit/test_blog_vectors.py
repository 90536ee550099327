"""The original blog's validator output shows hashed topics `__hash1__/<bucket>/<topic>`; the
java hash with HC=100 must put every one of those topics in the bucket the blog printed."""

import pytest

from lbg.model.hashing import java_bucket

BLOG_TOPICS = [
    (96, "b8c1ccb2-c67f-446f-8111-9eec8b264782/25c151d2-76c3-41aa-98c4-508542cd80b9"),
    (84, "8024b039-92dd-42de-9d16-8656d70f733f/f911ffac-c737-4fed-aed2-7e68a4ae7d15"),
    (72, "7b8be135-ac05-44bf-b5ed-d544400a211d/f0ead9f2-bf5b-4432-a79e-13d6e8ccc617"),
    (84, "4d92a5e9-7788-4ed3-bd09-bc47850b25a0/545ea629-b35e-4a94-8a80-8ef982ef02c1"),
    (24, "92af4374-a230-43d5-a6ae-440ffee9891d/3f7cc992-30c4-4c22-9df9-2df9de726573"),
    (24, "e8011270-42d6-4724-b3c8-23350f42cbf7/7ead4b11-b87e-4296-b951-d0ec604475d4"),
    (83, "aad03408-3404-4fcc-ae83-1eb2c6739596/7a3ca558-8176-420a-ac8d-322f249caa33"),
    (86, "1bb13765-cfa4-40da-9fc3-548bb5d6f4b0/9a1ec910-ec85-4e80-936c-893b0b78501a"),
    (77, "e06158ad-1009-4c76-9a17-f51f4b090ee0/6950910b-e930-4e2b-94f8-0b248b77eedd"),
    (11, "a7927956-6806-409e-8b63-3c815618a448/151ba948-7bd9-4347-9165-ea3b8dd9755d"),
    (44, "453c1d21-a8a2-484c-9e3f-0f6f2909dd64/e46b477e-a60e-4b36-a8fb-a57a333d3e18"),
]


@pytest.mark.parametrize(("bucket", "topic"), BLOG_TOPICS)
def test_java_hash_matches_the_original_publisher(bucket: int, topic: str) -> None:
    assert java_bucket(topic, 100) == bucket
