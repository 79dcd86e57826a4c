"""NodeStats under the node's three threads: no increment lost, the latency window never trimmed under a
reader."""
import sys
import threading

from flashrt_ros.ros.io.stats import LATENCY_WINDOW, NodeStats


def test_counters_and_latencies_written_from_several_threads_are_exact():
    stats, rounds, writers = NodeStats(), 20_000, 4
    start = threading.Barrier(writers + 1)
    stop_reading = threading.Event()
    read_errors: list = []

    def write(k: int) -> None:
        start.wait()
        for i in range(rounds):
            stats.count("replans_rejected")
            stats.count("rejected", 2)
            stats.add_step(float(k), missed_deadline=i % 2 == 0)

    def read() -> None:
        start.wait()
        while not stop_reading.is_set():
            try:
                latencies, _ = stats.recent()
                if len(latencies) > LATENCY_WINDOW:
                    read_errors.append(len(latencies))
            except Exception as e:  # noqa: BLE001 - e.g. a list changed size during iteration
                read_errors.append(repr(e))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: an unlocked += loses counts
    try:
        threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
        reader = threading.Thread(target=read)
        for t in [*threads, reader]:
            t.start()
        for t in threads:
            t.join()
        stop_reading.set()
        reader.join()
    finally:
        sys.setswitchinterval(old)
    n = writers * rounds
    assert (stats.replans_rejected, stats.rejected, stats.steps) == (n, 2 * n, n)
    assert stats.step_deadline_misses == writers * rounds // 2
    assert read_errors == []
    latencies, _ = stats.recent()
    assert len(latencies) == LATENCY_WINDOW
