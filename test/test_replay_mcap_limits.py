"""flashrt-replay bounds what an MCAP file can make it decompress: a few KiB of zstd that declare (or
really hold) gigabytes, or millions of message records, are refused as bad input, before the memory is
taken."""
import subprocess
import sys

import pytest
from fixtures.mcap_craft import Chunk, MiB, write_crafted_mcap
from fixtures.replay_cli import ROOT, TINY_CONFIG, config_with

# the replay as a child of a small wrapper, which reports the child's exit code and peak RSS (KiB)
PEAK = ("import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
        "sys.stderr.write(r.stderr)\n"
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
NORMAL_PEAK_MB = 600  # a replay of a small bag stays well under this; each bomb below holds far more


def replay_with_peak(bag, *args, config):
    res = subprocess.run([sys.executable, "-c", PEAK, sys.executable, "-m", "flashrt_ros.tools.replay", str(bag),
                          "--config", str(config), *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    rc, peak_kib = map(int, res.stdout.split())
    return rc, res.stderr, peak_kib / 1024


@pytest.fixture
def cfg(tmp_path):
    return config_with(tmp_path, base=TINY_CONFIG)


def test_a_small_file_whose_chunk_holds_gigabytes_is_refused_before_decompressing(tmp_path, cfg):
    bomb = write_crafted_mcap(tmp_path / "bomb.mcap", [Chunk(0, 10, padding=2400 * MiB)])
    assert bomb.stat().st_size < 200_000
    rc, stderr, peak_mb = replay_with_peak(bomb, config=cfg)
    assert rc == 2, stderr
    assert "declares 2400.0 MiB uncompressed" in stderr and "--max-decompressed-mb" in stderr, stderr
    assert "Traceback" not in stderr and stderr.count("flashrt-replay:") == 1
    assert peak_mb < NORMAL_PEAK_MB, f"peak RSS {peak_mb:.0f} MiB"


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_a_chunk_that_decompresses_to_more_than_it_declares_is_stopped_at_its_declared_size(tmp_path, cfg,
                                                                                           compression):
    liar = write_crafted_mcap(tmp_path / "liar.mcap",
                              [Chunk(0, 10, padding=1024 * MiB, declared=MiB, compression=compression)])
    rc, stderr, peak_mb = replay_with_peak(liar, config=cfg)
    assert rc == 2, stderr
    assert f"decompresses to more than the {MiB} bytes it declares" in stderr, stderr
    assert "Traceback" not in stderr
    assert peak_mb < NORMAL_PEAK_MB, f"peak RSS {peak_mb:.0f} MiB"


def test_chunks_overlapping_in_time_count_together_and_the_limit_can_be_raised(tmp_path, cfg):
    """The reader holds every chunk whose time range overlaps the one it reads: four 40 MiB chunks over
    the same 10 messages are 160 MiB at once."""
    stacked = write_crafted_mcap(tmp_path / "stacked.mcap", [Chunk(0, 10, padding=40 * MiB) for _ in range(4)])
    rc, stderr, _ = replay_with_peak(stacked, "--max-decompressed-mb", 100, config=cfg)
    assert rc == 2, stderr
    assert "4 chunks overlapping in time" in stderr and "160.0 MiB" in stderr, stderr
    rc, stderr, _ = replay_with_peak(stacked, "--max-decompressed-mb", 200, config=cfg)
    assert rc == 0, stderr


def test_a_chunk_of_millions_of_empty_messages_is_refused_before_rosbags_reads_them(tmp_path, cfg):
    """120 MiB of 31-byte records, honestly declared and under the byte limit: 4 M messages, which rosbags
    would hold as Python objects all at once (1.5 GB and more). Counted before it makes one."""
    bomb = write_crafted_mcap(tmp_path / "messages.mcap", [Chunk(0, 10, empty_messages=120 * MiB // 31)])
    assert bomb.stat().st_size < 200_000
    rc, stderr, peak_mb = replay_with_peak(bomb, config=cfg)
    assert rc == 2, stderr
    assert "an MCAP chunk holds more than 2097152 message records" in stderr, stderr
    assert "--max-decompressed-mb 256" in stderr, stderr
    assert "Traceback" not in stderr and stderr.count("flashrt-replay:") == 1
    assert peak_mb < NORMAL_PEAK_MB, f"peak RSS {peak_mb:.0f} MiB"


@pytest.mark.parametrize("compression", ["zstd", "lz4", ""])  # "": stored uncompressed, counted all the same
def test_the_message_count_limit_follows_the_decompression_limit(tmp_path, cfg, compression):
    many = write_crafted_mcap(tmp_path / "many.mcap", [Chunk(0, 10, empty_messages=50_000, compression=compression)])
    rc, stderr, _ = replay_with_peak(many, "--max-decompressed-mb", 4, config=cfg)
    assert rc == 2, stderr
    assert "holds more than 32768 message records" in stderr and "--max-decompressed-mb 4 " in stderr, stderr
    rc, stderr, _ = replay_with_peak(many, "--max-decompressed-mb", 8, config=cfg)
    assert rc == 0, stderr


def test_message_records_of_chunks_overlapping_in_time_count_together(tmp_path, cfg):
    """rosbags holds the messages of every chunk it has opened and not finished: four chunks of 2,500 over
    the same time range are 10,000 at once, though each is under the limit (8,192 at 1 MB: the count, not
    the size, is the subject, so the smallest limit keeps rosbags' reading short)."""
    stacked = write_crafted_mcap(tmp_path / "stacked.mcap", [Chunk(0, 10, empty_messages=2_500) for _ in range(4)])
    rc, stderr, _ = replay_with_peak(stacked, "--max-decompressed-mb", 1, config=cfg)
    assert rc == 2, stderr
    assert "MCAP chunks overlapping in time hold together more than 8192 message records" in stderr, stderr
    rc, stderr, _ = replay_with_peak(stacked, "--max-decompressed-mb", 2, config=cfg)
    assert rc == 0, stderr
    one_after_another = write_crafted_mcap(tmp_path / "sequential.mcap",
                                           [Chunk(10 * i, 10, empty_messages=2_500) for i in range(4)])
    rc, stderr, _ = replay_with_peak(one_after_another, "--max-decompressed-mb", 1, config=cfg)
    assert rc == 0, stderr  # a chunk that is done no longer counts


def test_an_honest_crafted_file_replays(tmp_path, cfg):
    ok = write_crafted_mcap(tmp_path / "ok.mcap", [Chunk(0, 10), Chunk(10, 10, padding=5 * MiB)])
    rc, stderr, _ = replay_with_peak(ok, config=cfg)
    assert rc == 0, stderr


@pytest.mark.parametrize("missing", ["zstd", "lz4"])
def test_a_compression_whose_module_is_missing_keeps_rosbags_own_decompressor(monkeypatch, missing):
    """A rosbags that reads with other libraries (no backports.zstd, or no lz4) still reads its bags: only
    the decompressors whose module imports are replaced by the bounded ones."""
    from rosbags.rosbag2 import storage_mcap

    from flashrt_ros.tools.replay import mcap_limits

    def rosbags_own(data, size):  # stands for the entry rosbags put in its table
        return data

    blocked = {"zstd": ["compression", "backports"], "lz4": ["lz4", "lz4.frame"]}[missing]
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    for name in ("zstd", "lz4"):
        monkeypatch.setitem(storage_mcap.DECOMPRESSORS, name, rosbags_own)
    mcap_limits.set_limit(64 * MiB)
    assert storage_mcap.DECOMPRESSORS[missing] is rosbags_own
    other = {"zstd": "lz4", "lz4": "zstd"}[missing]
    assert storage_mcap.DECOMPRESSORS[other] is not rosbags_own  # the bounded one, where its module imports
