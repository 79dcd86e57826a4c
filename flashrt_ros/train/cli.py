"""flashrt-train: behaviour cloning from rosbag2 bags into a policy file the flashrt node runs.

    flashrt-train BAG_OR_DIR... --obs-topic /joint_states --action-topic /joint_command --out DIR
    flashrt-train --make-expert-bags DIR --episodes N        (scripted-expert demonstrations, train/expert.py)

Each observation is paired with the first action message at or after it, within --max-delay and before the next
observation (train/data.py); the bags split into training and validation BY BAG (--val-bags). Observation mean/std
and the action scale/offset are fitted on the training bags and saved in the policy, so its actions come out in
the robot's units. DIR receives policy.safetensors (the best weights by validation loss: policy_path or
weights_path of the node), report.json, report.png and checkpoint.pt (model, optimizer, step, best loss: an
interrupted run continues with the same command plus --resume).

exit code: 0 trained (policy written); 1 training failed (a non-finite loss); 2 bad input (arguments, bags,
topics, an --out that holds another run, a checkpoint that does not match); 130 / 143 interrupted by
SIGINT / SIGTERM (the checkpoint and the best policy so far are written; --resume continues).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

POLICY_FILE = "policy.safetensors"
ARCH_FLAGS = (("d_model", int), ("n_layers", int), ("n_heads", int), ("conv_kernel", int), ("kv_window", int),
              ("mixer", str), ("chunk_len", int), ("chunk_blend", str), ("chunk_blend_decay", float))
CHECK_STEPS = 200  # steps of a held-out bag the written file runs through the runtime, against the torch model


def parser() -> argparse.ArgumentParser:
    from ..runtime.model.config import PolicyConfig

    ap = argparse.ArgumentParser(prog="flashrt-train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bags", nargs="*", metavar="BAG_OR_DIR",
                    help="rosbag2 bags (directories or .mcap/.db3 files), or directories of bags")
    d = ap.add_argument_group("data")
    d.add_argument("--obs-topic", help="observations: sensor_msgs/JointState (positions then velocities) or "
                   "std_msgs Float32MultiArray / Float64MultiArray")
    d.add_argument("--action-topic", help="actions: sensor_msgs/JointState (position), trajectory_msgs/"
                   "JointTrajectory (first point's positions) or std_msgs Float64MultiArray / Float32MultiArray")
    d.add_argument("--out", help="output directory (new or empty; with --resume the interrupted run's)")
    d.add_argument("--val-bags", type=float, default=0.2, metavar="N",
                   help="held-out bags: a count (N >= 1) or a fraction (0 < N < 1); at least one of 2+ bags "
                        "(default 0.2). A single bag validates on its last 20%%")
    d.add_argument("--stamp", choices=("bag", "header"), default="bag",
                   help="times for pairing: the bag's receive times (default) or the header stamps")
    d.add_argument("--max-delay", type=float, default=0.05, metavar="S",
                   help="an action answers an observation only if it comes within S seconds (default 0.05)")
    m = ap.add_argument_group("model (obs_dim and action_dim come from the bags)")
    m.add_argument("--config", help="a ROS params yaml (config/flashrt.yaml layout) for the architecture; the "
                   "flags below override it")
    meta = {f.name: f.metadata for f in dataclasses.fields(PolicyConfig)}
    for name, kind in ARCH_FLAGS:
        choices = meta[name].get("choices")
        m.add_argument("--" + name.replace("_", "-"), type=kind, choices=choices,
                       metavar=None if choices else kind.__name__.upper(),
                       help=f"{meta[name]['help']} (default: --config's, else the node's default)")
    t = ap.add_argument_group("training")
    # The defaults train the default model on 60,000 steps (10 min at 100 Hz) in under 10 CPU minutes on one
    # core (docs/training.md). Long sequences matter more than many: the node runs on for thousands of steps,
    # and a policy trained on 64-step windows drifts past a few hundred (full-history validation loss 0.037
    # after 1500 steps of 16 x 64; 0.018 after 600 of 8 x 256; 0.011 after 600 of 4 x 512, 0.0103 after 800).
    t.add_argument("--steps", type=int, default=600, help="optimizer steps in all (default 600)")
    t.add_argument("--window", type=int, default=512,
                   help="steps per training sequence, each from a zero state (default 512)")
    t.add_argument("--batch", type=int, default=4, help="sequences per optimizer step (default 4)")
    t.add_argument("--lr", type=float, default=1e-3, help="Adam's peak learning rate (default 1e-3; warm-up, "
                   "then cosine down to a tenth)")
    t.add_argument("--eval-every", type=int, default=200,
                   help="validate and checkpoint every N steps (default 200)")
    t.add_argument("--seed", type=int, default=0, help="seed of the split, the init and the batches")
    t.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: on 2 cores a second thread made a step ~10%% faster for "
                        "twice the CPU, the GRU's scan being sequential; 0 = every core)")
    t.add_argument("--time-limit", type=float, default=0.0, metavar="MIN",
                   help="stop after MIN minutes of training, as if finished (default 0: no limit)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    e = ap.add_argument_group("synthetic expert (instead of training)")
    e.add_argument("--make-expert-bags", metavar="DIR", help="write scripted-expert bags into DIR and exit")
    e.add_argument("--episodes", type=int, default=10, help="expert bags to write (default 10)")
    e.add_argument("--seconds", type=float, default=10.0, help="seconds per expert episode at 100 Hz (default 10)")
    return ap


class InputError(Exception):
    """Bad input: exit 2 with this message."""


def _fail(msg: str) -> int:
    print(f"flashrt-train: {msg}", file=sys.stderr)
    return 2


def main(argv=None, model_factory=None) -> int:
    """model_factory(cfg, obs_names=, action_names=) -> a FlashRTPolicy-like module (default: reference.py's)."""
    ap = parser()
    args = ap.parse_args(argv)
    if args.make_expert_bags:
        from .expert import make_expert_bags
        try:
            paths = make_expert_bags(args.make_expert_bags, args.episodes, args.seconds, args.seed)
        except (ValueError, FileExistsError) as ex:
            return _fail(str(ex))
        print(f"wrote {len(paths)} expert bags to {args.make_expert_bags} (topics /observation, /joint_command)")
        return 0
    for flag in ("bags", "obs_topic", "action_topic", "out"):
        if not getattr(args, flag):
            ap.error(f"{'BAG_OR_DIR' if flag == 'bags' else '--' + flag.replace('_', '-')} is required")
    for flag in ("steps", "window", "batch", "eval_every"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1")
    if not args.lr > 0 or not args.max_delay >= 0 or args.threads < 0 or not args.time_limit >= 0:
        ap.error("--lr must be > 0; --max-delay, --threads and --time-limit >= 0")
    try:
        return run(args, model_factory)
    except InputError as ex:
        return _fail(str(ex))
    except KeyboardInterrupt:  # a second Ctrl-C: no waiting for the step to end
        print("flashrt-train: interrupted twice; the checkpoint of the last evaluation remains (--resume)",
              file=sys.stderr)
        return 130


def _architecture(args, obs_dim: int, action_dim: int):
    from ..runtime.model.config import PolicyConfig

    dims = {"obs_dim": obs_dim, "action_dim": action_dim, "weights_path": "", "policy_path": ""}
    try:
        cfg = PolicyConfig.from_yaml(args.config, **dims) if args.config else PolicyConfig(**dims)
        flags = {n: getattr(args, n) for n, _ in ARCH_FLAGS if getattr(args, n) is not None}
        return cfg.replace(**flags)
    except (OSError, ValueError, TypeError) as ex:
        raise InputError(f"model: {ex}") from None


def _check_out_dir(args) -> Path:
    """Refused before the bags are read; created only once they are."""
    from .fit import CHECKPOINT

    out = Path(args.out)
    if args.resume:
        if not (out / CHECKPOINT).is_file():
            raise InputError(f"--resume: {out / CHECKPOINT} does not exist (nothing to resume)")
    elif out.exists() and (not out.is_dir() or any(out.iterdir())):
        hint = "; add --resume to continue its run" if (out / CHECKPOINT).is_file() else ""
        raise InputError(f"--out {out}: exists and is not an empty directory{hint}")
    return out


def run(args, model_factory=None) -> int:
    import numpy as np
    import torch

    from ..tools.replay.bags import BagError
    from . import data, fit, report

    out = _check_out_dir(args)
    t_read = time.monotonic()
    try:
        paths = data.find_bags(args.bags)
        episodes = data.read_episodes(paths, args.obs_topic, args.action_topic, stamp=args.stamp,
                                      max_delay_s=args.max_delay)
        train_eps, val_eps = data.split_by_bag(episodes, args.val_bags, args.seed)
        norm = data.fit_normalization(train_eps)
    except (BagError, ValueError) as ex:
        raise InputError(str(ex)) from None
    read_seconds = time.monotonic() - t_read
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as ex:
        raise InputError(f"--out {out}: cannot create ({ex.strerror})") from None
    first = episodes[0]
    cfg = _architecture(args, first.obs.shape[1], first.actions.shape[1])
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    if model_factory is None:
        from .reference import FlashRTPolicy as model_factory
    torch.manual_seed(args.seed)
    model = model_factory(cfg, obs_names=first.obs_names, action_names=first.action_names)
    model.set_normalization(norm.obs_mean, norm.obs_std, norm.action_scale, norm.action_offset)
    opts = fit.FitOptions(steps=args.steps, window=args.window, batch=args.batch, lr=args.lr,
                          warmup=min(100, max(1, args.steps // 10)), eval_every=args.eval_every, seed=args.seed,
                          eval_window=max(args.window, 2 * cfg.kv_window),
                          time_limit_s=args.time_limit * 60.0)
    from ..runtime.model.policy_file import architecture
    meta = {"architecture": architecture(cfg), "train_bags": [e.name for e in train_eps],
            "val_bags": [e.name for e in val_eps], "obs_topic": args.obs_topic, "action_topic": args.action_topic}
    n_train = sum(len(e) for e in train_eps)
    print(f"flashrt-train: {len(train_eps)} training bags ({n_train} steps), {len(val_eps)} validation bags "
          f"({sum(len(e) for e in val_eps)} steps); obs_dim {cfg.obs_dim}, action_dim {cfg.action_dim}, d_model "
          f"{cfg.d_model}, {cfg.n_layers} layers, {sum(p.numel() for p in model.parameters())} parameters, "
          f"{torch.get_num_threads()} threads", file=sys.stderr)
    train_a, val_a = fit.prepare(train_eps, norm, cfg.chunk_len), fit.prepare(val_eps, norm, cfg.chunk_len)
    try:
        result = fit.fit(model, train_a, val_a, opts, out, meta, resume=args.resume)
    except fit.ResumeMismatch as ex:
        raise InputError(str(ex)) from None
    except FloatingPointError as ex:
        print(f"flashrt-train: {ex}", file=sys.stderr)
        return 1
    policy_path = out / POLICY_FILE
    model.save_pretrained(str(policy_path))
    # the held-out bags as the node runs them: from their start, chunks blended, robot units (in sequences of
    # eval_window steps from a zero state: attention's memory grows with the square of the length)
    model.eval()
    run_seq = lambda o: model.blend(model.forward_sequence(torch.from_numpy(o[None])))[0].numpy()  # noqa: E731
    seg = opts.eval_window
    with torch.no_grad():
        predicted = [np.concatenate([run_seq(e.obs[s:s + seg]) for s in range(0, len(e), seg)]) for e in val_eps]
        first_steps = val_eps[0].obs[:CHECK_STEPS]
        expected = run_seq(first_steps)
    mean_action = np.concatenate([e.actions[e.valid] for e in train_eps]).mean(0)
    deployed = report.deployed_errors(predicted, val_eps, mean_action)
    deployed["runtime_check"] = _runtime_check(policy_path, first_steps, expected)
    rate = result.step / result.train_seconds if result.train_seconds else 0.0
    summary = {
        "status": result.status, "steps": result.step, "train_seconds": round(result.train_seconds, 2),
        "train_cpu_seconds": round(result.cpu_seconds, 2),
        "read_seconds": round(read_seconds, 2), "wall_seconds_this_run": round(time.monotonic() - t_read, 2),
        "steps_per_second": round(rate, 3),
        "history": result.history, "best_step": result.best_step, "best_val_loss": result.best_val,
        "baseline_val_loss": result.baseline_val,
        "val_over_baseline": result.best_val / result.baseline_val if result.baseline_val else None,
        "deployed": deployed,
        "data": {"bags": [str(p) for p in paths], "train_bags": meta["train_bags"], "val_bags": meta["val_bags"],
                 "train_steps": n_train, "obs_topic": args.obs_topic, "action_topic": args.action_topic,
                 "pairing": {"stamp": args.stamp, "max_delay_s": args.max_delay,
                             "per_bag": {e.name: e.counts for e in episodes}},
                 "obs_names": first.obs_names, "action_names": first.action_names,
                 "normalization": norm.to_dict()},
        "model": {**meta["architecture"], "parameters": sum(p.numel() for p in model.parameters())},
        "options": {**vars(opts), "threads": torch.get_num_threads()},
        "policy": str(policy_path),
    }
    report.write_json(out / "report.json", summary)
    e0 = val_eps[0]
    recorded = np.where(e0.valid[:, None], e0.actions, np.nan)  # unpaired steps have no recorded action
    report.plot(out / "report.png", result.history, result.baseline_val, e0.name, e0.period_s,
                recorded, predicted[0], first.action_names)
    print(f"flashrt-train: {result.status} at step {result.step} ({result.train_seconds:.0f} s of training, "
          f"{rate:.2f} steps/s); best validation loss {result.best_val:.5f} at step {result.best_step}, the mean "
          f"action's {result.baseline_val:.5f}; held-out RMSE {deployed['rmse']:.4f} (mean action "
          f"{deployed['mean_action_rmse']:.4f}) robot units; wrote {policy_path}", file=sys.stderr)
    if result.status == "interrupted":
        print(f"flashrt-train: interrupted; continue with the same command and --resume (checkpoint in {out})",
              file=sys.stderr)
        return 128 + result.signum
    return 0


def _runtime_check(policy_path: Path, obs, expected) -> dict:
    """The written file stepped by the runtime (numpy backend) on a held-out bag's first steps, against the
    torch model's blended actions: the exported policy is the trained one."""
    import numpy as np

    from ..runtime import PolicyConfig, Session

    try:
        sess = Session(PolicyConfig(policy_path=str(policy_path), capsule_budget_mb=64.0, max_branches=1))
        got = np.stack([sess.step(o).action for o in obs])
    except Exception as ex:  # noqa: BLE001 - reported, not fatal: the file is written either way
        return {"steps": 0, "error": f"{type(ex).__name__}: {ex}"}
    return {"steps": len(obs), "max_abs_diff": float(np.abs(got - expected).max())}


if __name__ == "__main__":
    sys.exit(main())
