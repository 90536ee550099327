"""`make replay ARGS=...` (the README's cluster run) passes ARGS to the replay only: the dataset
it generates first when missing takes none of them (lbg-dataset has no --master)."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_replay_args_do_not_reach_the_dataset_it_makes_first(tmp_path: Path) -> None:
    dataset = tmp_path / "missing.parquet"
    plan = subprocess.run(
        ["make", "-n", "replay", "ARGS=--master spark://127.0.0.1:7077", f"DATASET={dataset}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()

    [generate] = [line for line in plan if "lbg-dataset" in line]
    [replay] = [line for line in plan if "lbg.cli.replay_local" in line]
    assert "--master" not in generate
    assert replay.endswith("--master spark://127.0.0.1:7077")
