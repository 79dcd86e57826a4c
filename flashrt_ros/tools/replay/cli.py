"""flashrt-replay: run a recorded bag through the policy and record what it did; diff two such runs.

    flashrt-replay BAG [--topics T] [--mode offline|live] [-o OUT_BAG] [--storage mcap|sqlite3]
                   [--rollback-every N --rollback-depth D] [-r RATE] [--start-offset S] [--max-gap S]
                   [--from SECONDS [--stream STREAM_BAG]]
                   [--config PARAMS] [--max-decompressed-mb MB] [--json PATH] [--plot FILE.png [--joints 0,3]]
    flashrt-replay DIR_OR_GLOB --jobs N [-o OUT_DIR] [--reference REF_DIR] [...]   (a corpus: `--jobs` or see below)
    flashrt-replay diff A B [--plot FILE.png [--joints 0,3]]

Flags as `ros2 bag` spells them: -o/--output (alias --out), --topics (alias --topic; one observation
topic), -r/--rate (alias --rate), --start-offset (seconds after the bag's first message).

Offline and live runs convert messages with the node's own converter and the config's joint_names, so
both see the same arrays. Without --config, the installed config (ament share of flashrt_ros) is used,
else the source tree's config/flashrt.yaml.

A directory that holds bags (not itself a bag), a glob, or --jobs/--ray/--reference replays a corpus:
every bag offline in its own worker process (or Ray task), one summary (a table on stdout, --json). Its
exit code: 0 when every bag's is 0, 1 when any bag's is not, 2 when the corpus is bad input.

exit codes:
  0    ok: every rollback check passed / the two bags are identical
  1    rollback checks failed / the bags differ
  2    bad input: unreadable, empty or foreign bag, MCAP chunks over --max-decompressed-mb, bad config or
       arguments, --out exists (one line says why)
  3    no step: every observation message was rejected (the summary lists the reasons)
  4    internal error: a bug in flashrt-replay (one line on stderr; please report it)
  5    live mode: the node could not be started, died, or stopped answering
  130  interrupted by SIGINT, 143 by SIGTERM (a live node is stopped too)
  141  stdout or stderr was closed by its reader (`| head -1`): stops quietly, as a process killed by
       SIGPIPE would; an unfinished --out bag is removed
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np

from ..common import add_backend_argument, progress
from .bags import (
    STORAGES,
    BagError,
    OutputBag,
    StepRecord,
    check_json_output,
    check_new_output,
    iter_policy_steps,
    open_observations,
    typestore,
)
from .mcap_limits import DEFAULT_MAX_DECOMPRESSED_MB
from .stream import (
    STOP,
    Interrupted,
    NodeFailed,
    ObservationStream,
    ReplayConfig,
    RollbackChecks,
    StepSink,
)

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NO_STEPS, EXIT_INTERNAL, EXIT_NODE_FAILED = 0, 1, 2, 3, 4, 5
EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE  # what the shell shows for `cmd | head -1` when cmd dies of SIGPIPE
PROGRESS_EVERY = 2000
STREAM_BACKLOG = 256  # --out offline: steps between waits for the capsule stream to catch up


def run_offline(args, src, ts, cfg: ReplayConfig, sink: StepSink) -> dict:
    from ...runtime import Session

    session = Session(cfg.policy, args.backend)
    restored = seek(args, src, ts, cfg, session) if args.from_s is not None else None
    stream = ObservationStream(src, ts, cfg, args.start_offset, *(restored[1:] if restored else ()))
    checks = RollbackChecks(args.rollback_every, args.rollback_depth)
    if sink.out is not None:  # the --out stream's keyframes go by bag time: the records' own stamps
        out = sink.out
        session.enable_stream(lambda rec: out.write_capsule_record(rec, session.fingerprint), cfg.keyframe_s,
                              clock=lambda info: info.stamp_ns / 1e9)
    t0 = time.perf_counter()
    with STOP.deferred():  # a signal stops the run between two messages, never inside a bag write
        for _, stamp_ns, frame_id, _, obs in stream:
            STOP.check()
            res = session.step(obs, stamp_ns)
            sink.add(StepRecord(stamp_ns, res.step, res.capsule_id, res.action, res.chunk.ravel(),
                                cfg.policy.chunk_len, res.latency_ms, frame_id))
            checks.push(obs, res.action.copy())
            if checks.due(sink.steps):
                session.rollback(steps_back=checks.depth)
                checks.record([session.step(o).action.copy() for o in checks.recent_inputs])
            if session.stream is not None and sink.steps % STREAM_BACKLOG == 0:
                session.stream.flush()  # offline there is time to wait: the stream keeps up, drops nothing
            if stream.messages % PROGRESS_EVERY == 0:
                progress(f"offline: {stream.messages} messages, {sink.steps} steps")
    recorded = None
    if session.stream is not None:
        session.stream.flush()  # every record in the bag before it is closed
        recorded = session.stream.stats()
        session.disable_stream()
    summary = sink.summary(stream, checks, time.perf_counter() - t0)
    if recorded is not None:
        summary["capsule_stream"] = {"records": recorded.records_published, "keyframes": recorded.keyframes_published,
                                     "dropped": recorded.records_dropped}
    if restored is not None:
        summary["from"] = {**restored[0].summary(), "skipped_stepped_already": stream.skipped_before_from}
    return summary


def seek(args, src, ts, cfg: ReplayConfig, session):
    """--from: the session restored from the capsule stream (seek.py) to right before the first observation at
    or after the --from time. Returns (Restored, after_stamp_ns, read_from_ns) for the ObservationStream."""
    from .bags import iter_messages
    from .seek import restore
    from .stream import bag_start_ns

    start = bag_start_ns(src.files)
    at = start + round(args.from_s * 1e9)
    first = next(((stamp, msg) for stamp, msg, err in iter_messages(src, ts, at) if err is None), None)
    if first is None:
        raise BagError(f"{args.bag}: --from {args.from_s:g} s is past the last message of {src.topic}")
    from .bags import header_stamp_ns
    restored = restore(session, args.stream or args.bag, ts, header_stamp_ns(first[1], first[0]), start,
                       cfg.keyframe_s)
    progress(f"--from {args.from_s:g} s: restored step {restored.step} from the keyframe at step "
             f"{restored.keyframe_step} ({restored.records_applied} records) in {restored.elapsed_s * 1e3:.0f} ms")
    # observations stamped after the restored state; read from a second before it (bag and header times differ)
    return restored, restored.stamp_ns, max(start, min(at, restored.stamp_ns) - 1_000_000_000)


def add_bag_options(ap: argparse.ArgumentParser) -> None:
    """The options a bag's replay takes, single or in a corpus; spelled as `ros2 bag` spells them, with
    the earlier spellings kept as aliases (same destination, same checks)."""
    ap.add_argument("--topics", "--topic", dest="topics", nargs="+", metavar="TOPIC",
                    help="observation topic (default: the only observation-typed topic); one topic. "
                    "Give BAG before --topics, as with ros2 bag play")
    ap.add_argument("--mode", choices=["offline", "live"], default="offline")
    ap.add_argument("-o", "--output", "--out", dest="out", metavar="OUT",
                    help="write /action, /policy_step and /capsule_stream (the run's capsule records, a keyframe "
                    "every stream_keyframe_s of bag time) to this new bag (refused if it exists)")
    ap.add_argument("--storage", choices=STORAGES, default="mcap", help="storage of --output")
    ap.add_argument("--rollback-every", type=int, default=0, metavar="N")
    ap.add_argument("--rollback-depth", type=int, default=20, metavar="D")
    ap.add_argument("-r", "--rate", type=float, default=None,
                    help="live only: playback speed (default 1; 0 = as fast as flow control). Refused offline, "
                    "which steps every message as fast as the policy runs")
    ap.add_argument("--start-offset", type=float, default=0.0, metavar="S",
                    help="start this many seconds after the bag's first message (as ros2 bag play)")
    ap.add_argument("--from", dest="from_s", type=float, metavar="SECONDS",
                    help="offline: enter the bag this many seconds after its first message with the policy's state "
                    "there, restored from the capsule stream (the last keyframe before it, then the records up to "
                    "it), instead of replaying everything before it")
    ap.add_argument("--stream", metavar="STREAM_BAG",
                    help="--from: the bag that holds the capsule stream (a previous --output, or a recording of "
                    "~/capsule_stream); default BAG itself")
    ap.add_argument("--max-gap", type=float, default=1.0, metavar="S",
                    help="live: longest wait between two messages, in seconds of bag time (default 1.0)")
    ap.add_argument("--config", help="params file (default: the installed or source config/flashrt.yaml)")
    add_backend_argument(ap, "numpy")
    ap.add_argument("--max-decompressed-mb", type=float, default=DEFAULT_MAX_DECOMPRESSED_MB, metavar="MB",
                    help="most MCAP chunk data decompressed at once (default %(default)g); MB x 8192 is the most "
                    "message records in one chunk; a file that needs more is refused as bad input")



def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="flashrt-replay", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bag", help="rosbag2 directory, or one .mcap / .db3 file")
    add_bag_options(ap)
    ap.add_argument("--json", help="write the summary here too")
    ap.add_argument("--plot", metavar="FILE.png", help="also draw the actions and step latency over bag time "
                    "(needs matplotlib)")
    ap.add_argument("--joints", type=joint_list, metavar="I,J,...",
                    help="--plot: these action dimensions only (default: all)")
    corpus = ap.add_argument_group("a corpus of bags (BAG is a directory of bags or a glob; offline only)")
    corpus.add_argument("-j", "--jobs", type=int, metavar="N",
                        help="replay N bags at once, each in its own process (default 1); with --ray auto and no "
                        "cluster running, the CPUs of the local Ray")
    corpus.add_argument("--ray", metavar="auto|ADDRESS",
                        help="run each bag as a Ray task instead: auto = the running cluster, else a local Ray; "
                        "or a cluster address (pip install 'flashrt_ros[ray]')")
    corpus.add_argument("--reference", metavar="REF_DIR",
                        help="diff each output against REF_DIR/<bag name> (a previous corpus --output)")
    return ap


def joint_list(text: str) -> list[int]:
    """--joints 0,3,5: action dimensions, each once, in the order given."""
    try:
        dims = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected action dimensions as 0,3,5") from None
    if not dims or min(dims) < 0 or len(set(dims)) != len(dims):
        raise argparse.ArgumentTypeError(f"{text!r}: dimensions must be >= 0, each given once")
    return dims


def check_bag_options(ap: argparse.ArgumentParser, args) -> None:
    """Argument errors (exit 2, argparse's usage line) before any work."""
    if args.rollback_every < 0 or args.rollback_depth < 1 or (args.rollback_every
                                                              and args.rollback_depth > args.rollback_every):
        ap.error("--rollback-every must be >= 0 and 1 <= --rollback-depth <= --rollback-every")
    if args.rate is not None and args.mode != "live":  # was ignored without a word
        ap.error("--rate (-r) paces --mode live only: offline replay steps every message as fast as the policy "
                 "runs; drop -r, or add --mode live")
    args.rate = 1.0 if args.rate is None else args.rate
    if not (args.rate >= 0 and args.max_gap >= 0) or not np.isfinite([args.rate, args.max_gap]).all():
        ap.error("--rate and --max-gap must be finite and >= 0")
    if not (0 <= args.start_offset < 1e9):  # also refuses NaN
        ap.error("--start-offset must be a finite number of seconds >= 0")
    if args.from_s is not None and (not 0 <= args.from_s < 1e9 or args.mode != "offline" or args.start_offset):
        ap.error("--from must be a finite number of seconds >= 0, offline, without --start-offset")
    if args.stream and args.from_s is None:
        ap.error("--stream goes with --from")
    if not (0 < args.max_decompressed_mb < 2**20):
        ap.error("--max-decompressed-mb must be > 0 and below 1 TiB")
    if args.topics and len(args.topics) > 1:
        ap.error(f"--topics: flashrt-replay steps the policy on one observation topic, got {len(args.topics)} "
                 f"({' '.join(args.topics)}); name one")
    args.topic = args.topics[0] if args.topics else None


def _check_plot(path: str | None) -> None:
    """--plot without matplotlib is refused up front, one line, as bad input (exit 2)."""
    if path:
        from ..plots.figures import PlotUnavailable, require_matplotlib
        try:
            require_matplotlib()
        except PlotUnavailable as e:
            raise BagError(str(e)) from None


class RecordingSink(StepSink):
    """StepSink that also keeps a bounded per-step trace for --plot."""

    def __init__(self, out):
        super().__init__(out)
        from ..plots.runs import TraceRecorder
        self.trace = TraceRecorder()

    def add(self, r: StepRecord) -> None:
        super().add(r)
        self.trace.add(r.step, r.stamp_ns, r.latency_ms, r.action)


def _replay(argv) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    check_bag_options(ap, args)
    from .corpus import corpus_main, is_corpus

    if args.jobs is not None or args.ray or args.reference or is_corpus(args.bag):
        if args.jobs is not None and not 1 <= args.jobs <= 1024:
            ap.error("--jobs must be between 1 and 1024")
        if args.mode != "offline" or args.plot or args.joints or args.from_s is not None:
            ap.error("a corpus replays offline, without --plot, --joints or --from; replay one bag for those")
        return corpus_main(args)
    out_path = check_new_output(args.out) if args.out else None  # before any work: never after a long replay
    _check_plot(args.plot)
    if args.json:
        check_json_output(args.json)
    ts = typestore()
    cfg = ReplayConfig(args.config)
    args.config = str(cfg.path)  # live mode starts the node with this same file
    if args.joints and max(args.joints) >= cfg.policy.action_dim:
        raise BagError(f"--joints {max(args.joints)}: the policy has action_dim {cfg.policy.action_dim} "
                       f"(dimensions 0..{cfg.policy.action_dim - 1})")
    if args.rollback_every:  # a depth past what the store keeps fails at the first check, as an internal error
        from ...runtime.state.sizing import StoreSizes

        keeps = StoreSizes.plan(cfg.policy).rollback_depth_steps
        if args.rollback_depth > keeps:
            raise BagError(f"--rollback-depth {args.rollback_depth}: config {cfg.path} keeps {keeps} steps restorable "
                           "(capsule_capacity, capsule_budget_mb); lower --rollback-depth or raise those")
    src = open_observations(args.bag, args.topic, args.max_decompressed_mb)
    for note in src.notes:
        progress(f"warning: {note}")
    progress(f"{args.mode}: {src.msgtype} on {src.topic}, config {cfg.path}")
    out, finished = None, False
    try:
        with STOP.deferred():  # a signal here must not leave a created bag behind
            out = OutputBag(out_path, args.storage, ts) if out_path else None
        sink = RecordingSink(out) if args.plot else StepSink(out)
        if args.mode == "offline":
            summary = run_offline(args, src, ts, cfg, sink)
        else:
            from .live import run_live
            summary = run_live(args, src, ts, cfg, sink)
        if summary["messages"] == 0 and summary.get("skipped_before_start_offset"):
            raise BagError(f"{args.bag}: --start-offset {args.start_offset:g} s skips every message of {src.topic} "
                           f"({summary['skipped_before_start_offset']}); give a smaller offset")
        if summary["messages"] == 0:
            raise BagError(f"{args.bag}: topic {src.topic} holds no messages")
        finished = summary["steps"] > 0
    finally:
        if out is not None:
            with STOP.deferred():  # a signal during close must not leave half a bag that looks finished
                try:
                    out.close()
                finally:
                    if not finished:  # a bag without a result must not look like one
                        shutil.rmtree(out_path, ignore_errors=True)
    summary.update(mode=args.mode, topic=src.topic, bag=str(args.bag), config=str(cfg.path))
    if out_path:
        summary["out"] = str(out_path)
    if src.notes:
        summary["metadata_mismatch"] = src.notes
    text = json.dumps(summary, indent=2)
    if args.json:  # files first: a reader that closes stdout early does not cost them
        Path(args.json).write_text(text + "\n")
    if args.plot and summary["steps"]:
        from ..plots.runs import replay_run
        # the trace stays out of the JSON
        replay_run({**summary, "trace": sink.trace.to_dict()}, args.plot, args.joints)
    print(text)
    if summary["steps"] == 0:
        reasons = summary["rejected"]["reasons"]
        top = next(iter(reasons), "none")
        print(f"flashrt-replay: no step: all {summary['messages']} messages were rejected (most often: {top})",
              file=sys.stderr)
        return EXIT_NO_STEPS
    checks = summary["rollback_checks"]
    return EXIT_OK if checks["run"] == checks["passed"] else EXIT_FAILED


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _silence_closed_pipes() -> None:
    """The reader of stdout or stderr is gone: point both at /dev/null, so neither what is still buffered
    nor a last message fails again at exit (Python's documented answer to EPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):  # not a real file (a test's capture): nothing will reach a pipe
            pass
    os.close(devnull)


def _say(line: str) -> None:
    """The outcome's one line on stderr; a closed stderr keeps the outcome's exit code."""
    try:
        print(line, file=sys.stderr, flush=True)
    except BrokenPipeError:
        _silence_closed_pipes()


def main(argv=None) -> int:
    """Every outcome has its own exit code; a crash never exits with a code that means a result."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "flashrt-replay diff" if argv[:1] == ["diff"] else "flashrt-replay"
    STOP.reset()
    old = {s: signal.signal(s, STOP.handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = diff_main(argv[1:]) if argv[:1] == ["diff"] else _replay(argv)
        sys.stdout.flush()  # a closed stdout shows up here, not as a traceback at interpreter exit
        return rc
    except BrokenPipeError:  # `flashrt-replay BAG | head -1`: normal Unix use, not a bug
        _silence_closed_pipes()
        return EXIT_CLOSED_PIPE
    except BagError as e:
        _say(f"{prog}: {_one_line(e)}")
        return EXIT_BAD_INPUT
    except NodeFailed as e:
        _say(f"{prog}: {_one_line(e)}")
        return EXIT_NODE_FAILED
    except (Interrupted, KeyboardInterrupt) as e:
        signum = getattr(e, "signum", signal.SIGINT)
        _say(f"{prog}: interrupted by {signal.Signals(signum).name}")
        return 128 + signum
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, a code that means "bug"
        _say(f"{prog}: internal error: {type(e).__name__}: {_one_line(e)} (a bug; please report it with the "
             "command line)")
        return EXIT_INTERNAL
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def diff_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="flashrt-replay diff", description="compare two output bags step by step; "
                                 "exit 0 only when identical, 1 when they differ, 2 when one cannot be read")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--plot", metavar="FILE.png", help="also draw both action traces with the first divergence "
                    "marked, over bag time (needs matplotlib)")
    ap.add_argument("--joints", type=joint_list, metavar="I,J,...",
                    help="--plot: these action dimensions only (default: all)")
    args = ap.parse_args(argv)
    _check_plot(args.plot)
    ts = typestore()
    it_a, it_b = iter_policy_steps(args.a, ts), iter_policy_steps(args.b, ts)
    traces = None
    if args.plot:
        from ..plots.runs import TraceRecorder
        traces = (TraceRecorder(), TraceRecorder())

    def keep(i: int, m) -> None:
        if traces is not None and m is not None:
            traces[i].add(m.step, m.header.stamp.sec * 10**9 + m.header.stamp.nanosec, m.step_latency_ms, m.action)
    n_a = n_b = compared = differing = step_mismatches = 0
    first = first_step = None
    max_abs = 0.0
    while True:  # streams both bags: memory does not grow with their length
        a, b = next(it_a, None), next(it_b, None)
        n_a, n_b = n_a + (a is not None), n_b + (b is not None)
        keep(0, a)
        keep(1, b)
        if a is None or b is None:
            for rest in it_a if a is not None else it_b:  # count what is left of the longer one
                n_a, n_b = n_a + (a is not None), n_b + (b is not None)
                keep(0 if a is not None else 1, rest)
            break
        xa, xb = np.asarray(a.action, np.float32), np.asarray(b.action, np.float32)
        same_step = a.step == b.step  # equal actions at shifted steps are a different run
        if xa.tobytes() != xb.tobytes() or not same_step:
            differing += 1
            step_mismatches += not same_step
            if first is None:
                first, first_step = compared, int(a.step)
            max_abs = max(max_abs, float(np.abs(xa.astype(np.float64) - xb).max())) if xa.shape == xb.shape \
                else float("inf")
        compared += 1
    identical = first is None and n_a == n_b
    report = {"identical": identical, "a_steps": n_a, "b_steps": n_b, "compared": compared,
              "differing_steps": differing, "step_number_mismatches": step_mismatches, "max_abs_action_diff": max_abs,
              "first_diverging_index": compared if first is None and n_a != n_b else first,
              "first_diverging_step": first_step}
    print(json.dumps(report, indent=2))
    print("identical" if identical else
          f"DIFFERENT: first divergence at index {report['first_diverging_index']}"
          f"{'' if first is None else f' (step {first_step})'}, max |action diff| {max_abs:.6g}, "
          f"{differing} of {compared} compared steps differ ({step_mismatches} in step number), {n_a} vs {n_b} steps",
          file=sys.stderr)
    if traces is not None:
        from ..plots.runs import replay_diff
        try:
            replay_diff(report, traces[0].to_dict(), traces[1].to_dict(), args.plot, args.joints)
        except ValueError as e:  # a --joints dimension the bags do not have: bad arguments
            raise BagError(str(e)) from None
    return EXIT_OK if identical else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
