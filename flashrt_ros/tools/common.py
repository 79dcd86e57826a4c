"""Small helpers shared by the command-line tools: progress lines, percentiles, JSON output."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np


def progress(msg: str) -> None:
    """One status line on stderr, so stdout stays clean JSON / tables."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(samples, *qs) -> dict[str, float]:
    a = np.asarray(samples, dtype=np.float64)
    if a.size == 0:
        return {f"p{q}": None for q in qs}
    return {f"p{q}": round(float(np.percentile(a, q)), 4) for q in qs}


def p50_p99(samples) -> dict[str, float]:
    return pct(samples, 50, 99)


def timed_ms(fn, reps: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def stop_processes(procs, timeout_s: float = 10.0, sig: int = signal.SIGINT) -> None:
    """``sig`` (SIGINT: the nodes shut down in order) to every process still running, all at once so they stop
    side by side, then SIGKILL to any that did not exit within ``timeout_s``; returns when every one has exited."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the tool is, as SIGINT raises KeyboardInterrupt: it unwinds through every finally
    (child processes stopped, temporary files removed) to the tool's main, which says what was measured."""
    signum = signal.SIGTERM


def sigterm_as_interrupt() -> None:
    """SIGTERM (a `timeout`, systemd, a CI runner) ends the tool as Ctrl-C does, cleanly: no traceback."""
    def handler(signum, frame):
        if frame is not None and frame.f_code.co_name == "__del__":
            # raised in a finaliser (rclpy's Future.__del__ under a GC pass), the exception is printed and dropped
            # and the tool ran on to exit 0: deliver the signal again once that is over
            threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()
            return
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)


def init_rclpy(args=None) -> None:
    """rclpy without its own SIGINT/SIGTERM handlers: rclpy's shut the context down under the tool, whose next
    spin then died in a traceback ("RCLError: failed to initialize wait set: the given context is not valid")."""
    import rclpy

    try:
        from rclpy.signals import SignalHandlerOptions
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except (ImportError, TypeError):  # an rclpy without the option
        rclpy.init(args=args)


class BackgroundSpin:
    """A node's executor on a thread of its own, as a planner node takes its answers. stop() before the node is
    destroyed: on a loaded machine the join can give up while a last spin_once runs, and the node's handles then
    go under it (rclpy's InvalidHandle), which after stop() is the stop, not an error."""

    def __init__(self, node, name: str):
        from rclpy.executors import SingleThreadedExecutor
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(node)
        self._closing = threading.Event()
        self.thread = threading.Thread(target=self._spin, name=name, daemon=True)
        self.thread.start()

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException
        try:
            self.executor.spin()
        except ExternalShutdownException:  # a SIGTERM shut the context down under it: the tool still reports
            pass
        except Exception:  # noqa: BLE001 - see the class
            if not self._closing.is_set():
                raise

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._closing.set()
        self.executor.shutdown(timeout_sec=timeout_s)
        self.thread.join(timeout=timeout_s)  # its last callback ends before the node it runs on goes


def interrupted(tool: str, err: BaseException, json_path: str | None = None) -> int:
    """The end of a tool that SIGINT or SIGTERM stopped: what it measured so far (``err.partial``, a dict, set
    on the way out) as JSON on stdout (and in ``json_path``), one line on stderr; exit 128 + the signal."""
    signum = getattr(err, "signum", signal.SIGINT)
    name = signal.Signals(signum).name
    partial = getattr(err, "partial", None)
    if partial:
        write_json({"interrupted": name, **partial}, json_path)
    print(f"{tool}: interrupted by {name}; " + ("what it measured so far is above" if partial else
                                                "nothing was measured yet"), file=sys.stderr, flush=True)
    return 128 + signum


def write_json(obj, path: str | None) -> None:
    text = json.dumps(obj, indent=2)
    print(text)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")


def synthetic_trace(n: int, obs_dim: int, seed: int = 0, rate_hz: float = 100.0) -> np.ndarray:
    """A smooth joint trace (positions then velocities) with sensor noise: [n, obs_dim] float32."""
    half = max(1, obs_dim // 2)
    t = np.arange(n)[:, None] / rate_hz
    j = np.arange(half)[None, :]
    rng = np.random.default_rng(seed)
    pos = np.sin(2 * np.pi * (0.3 + 0.1 * j) * t + j) + 0.02 * rng.standard_normal((n, half))
    vel = np.diff(pos, axis=0, prepend=pos[:1]) * rate_hz
    out = np.concatenate([pos, vel], axis=1)[:, :obs_dim]
    if out.shape[1] < obs_dim:
        out = np.pad(out, ((0, 0), (0, obs_dim - out.shape[1])))
    return out.astype(np.float32)


def add_backend_argument(parser, default: str, what: str = "") -> None:
    """``--backend``, with the runtime's one list of backends."""
    from ..runtime.engine.backend import BACKENDS
    parser.add_argument("--backend", default=default, choices=BACKENDS,
                        help=f"{what}auto takes CUDA when CuPy has a device, else the compiled CPU backend, else "
                             f"NumPy (default {default})")


def print_table(title: str, rows, work, ok: bool, rule_pad: int = 30) -> None:
    """A mission's closing table: one (label, value) row a line, then where its logs are and the verdict."""
    w = max(len(k) for k, _ in rows)
    print(f"\n{title}")
    print("-" * (w + rule_pad))
    for k, v in rows:
        print(f"{k.ljust(w)}  {v}")
    print("-" * (w + rule_pad))
    print(f"logs: {work}  ->  {'OK' if ok else 'FAILED'}")

