"""Recordings of episodes, one bag folder each (flashrt-sim --record, flashrt_ros.train.expert). No rclpy, no
torch: both importers must stay free of them."""
from __future__ import annotations

from pathlib import Path


def new_episode_dirs(out_dir: str | Path, episodes: int, seconds: float) -> list[Path]:
    """out_dir/episode_000 ... for a recording of ``episodes`` bags (out_dir created); refused before any work
    when the counts are wrong or one of them exists (a second recording never mixes into the first)."""
    if episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {episodes}")
    if not seconds > 0:
        raise ValueError(f"--seconds must be > 0, got {seconds}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"episode_{i:03d}" for i in range(episodes)]
    taken = [p for p in paths if p.exists()]
    if taken:
        raise FileExistsError(f"{taken[0]} exists; choose a new directory")
    return paths
