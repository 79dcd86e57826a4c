"""The behaviour-cloning loop of flashrt-train (imports torch): windows, the masked chunk loss, evaluation, the
checkpoint that makes a run resumable, and the progress bar.

Training sees windows of `window` steps, each from a zero state (truncated history, as forward_sequence runs
them). Step t's chunk is compared with the normalised actions of steps t .. t+chunk_len-1 of the same bag (labels
may come from past the window's end; past the bag's end, or unpaired, they are masked). Validation runs every
held-out bag from its start as the node runs it (in consecutive sequences of eval_window steps, each from a zero
state: by default 2 x kv_window, past what attention sees), in the same unit as the training loss and the
mean-action baseline.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .data import Episode, Normalization, chunk_targets

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_VERSION = 1


class ResumeMismatch(ValueError):
    """A checkpoint made for other data, another split or another model: not resumed."""


@dataclass(frozen=True)
class FitOptions:
    steps: int = 600  # optimizer steps in all (a resumed run continues up to it)
    window: int = 512
    batch: int = 4
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup: int = 100
    eval_every: int = 200
    eval_window: int = 0  # validation sequence length; 0 = the whole bag, up to 2 * kv_window steps
    seed: int = 0
    time_limit_s: float = 0.0  # 0 = none: otherwise stop (as finished) once training has run this long
    clip_norm: float = 1.0


@dataclass
class Arrays:
    """One bag ready for windows: raw obs [n, D] float32, targets [n, K, A] normalised, mask [n, K]."""
    name: str
    obs: np.ndarray
    targets: np.ndarray
    mask: np.ndarray


def prepare(episodes: Sequence[Episode], norm: Normalization, chunk_len: int) -> list[Arrays]:
    out = []
    for e in episodes:
        t, m = chunk_targets(norm.normalize_actions(e.actions), e.valid, chunk_len)
        out.append(Arrays(e.name, e.obs.astype(np.float32), t.astype(np.float32), m))
    return out


def _window(a: Arrays, start: int, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[start, start + window) of a bag, zero-padded (and masked) past its end."""
    o, t, m = a.obs[start:start + window], a.targets[start:start + window], a.mask[start:start + window]
    pad = window - len(o)
    if pad:
        o = np.concatenate([o, np.zeros((pad, *o.shape[1:]), o.dtype)])
        t = np.concatenate([t, np.zeros((pad, *t.shape[1:]), t.dtype)])
        m = np.concatenate([m, np.zeros((pad, *m.shape[1:]), bool)])
    return o, t, m


def sample_batch(rng: np.random.Generator, data: Sequence[Arrays], window: int, batch: int):
    """batch windows: a bag with probability in proportion to its window starts, then a start uniformly."""
    starts = np.array([max(1, len(a.obs) - window + 1) for a in data], np.float64)
    bags = rng.choice(len(data), size=batch, p=starts / starts.sum())
    rows = [_window(data[b], int(rng.integers(0, starts[b])), window) for b in bags]
    return tuple(torch.from_numpy(np.stack(x)) for x in zip(*rows))


def eval_windows(data: Sequence[Arrays], window: int):
    """Every bag cut into consecutive windows (the last one padded): (obs, targets, mask) stacked."""
    rows = [_window(a, s, window) for a in data for s in range(0, len(a.obs), window)]
    return tuple(torch.from_numpy(np.stack(x)) for x in zip(*rows))


def masked_sse(chunks: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(sum of squared errors over unmasked entries, how many values): chunks, targets [B, T, K, A]."""
    m = mask.to(chunks.dtype)[..., None]
    return (((chunks - targets) ** 2) * m).sum(), int(mask.sum()) * chunks.shape[-1]


def evaluate(model, windows, tokens: int = 16384) -> float:
    obs, targets, mask = windows
    batch = max(1, tokens // obs.shape[1])  # attention's scores grow with the square of the length
    sse, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(obs), batch):
            s, c = masked_sse(model.forward_sequence(obs[i:i + batch]), targets[i:i + batch], mask[i:i + batch])
            sse, count = sse + float(s), count + c
    model.train(was_training)
    return sse / max(count, 1)


def mean_action_loss(train: Sequence[Arrays], val_windows) -> float:
    """The validation loss of predicting the training bags' mean normalised action at every step."""
    acts = np.concatenate([a.targets[:, 0][a.mask[:, 0]] for a in train])
    mean = torch.from_numpy(acts.mean(0).astype(np.float32))
    _, targets, mask = val_windows
    sse, count = masked_sse(mean.expand_as(targets), targets, mask)
    return float(sse) / max(count, 1)


def lr_at(step: int, opts: FitOptions) -> float:
    """Linear warm-up, then cosine down to a tenth: the schedule depends on the step alone (resumable)."""
    if step < opts.warmup:
        return opts.lr * (step + 1) / opts.warmup
    p = min(1.0, (step - opts.warmup) / max(1, opts.steps - opts.warmup))
    return opts.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


# ---- progress ----------------------------------------------------------------------------------------------
class Progress:
    """A one-line bar on stderr (redrawn in place on a terminal; a line per evaluation otherwise)."""

    def __init__(self, total: int, stream=None, width: int = 24):
        self.total, self.width = total, width
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last = 0.0

    def update(self, step: int, loss: float, val: float | None, rate: float, force: bool = False) -> None:
        now = time.monotonic()
        if not (force or (self.tty and now - self._last > 0.2)):
            return
        self._last = now
        done = int(self.width * step / max(1, self.total))
        eta = (self.total - step) / rate if rate > 0 else float("nan")
        val_s = f" val {val:.4f}" if val is not None else ""
        line = (f"step {step}/{self.total} [{'=' * done}{' ' * (self.width - done)}] loss {loss:.4f}{val_s} "
                f"{rate:.2f} steps/s eta {_hms(eta)}")
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _hms(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


# ---- interrupts and checkpoints -------------------------------------------------------------------------------
class StopFlag:
    """SIGINT / SIGTERM set a flag the loop reads after each step (a step is never cut in half)."""

    def __init__(self):
        self.signum = 0
        self._old = {}

    def __enter__(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            self._old[s] = signal.signal(s, self._set)
        return self

    def _set(self, signum, frame):
        if self.signum:  # a second Ctrl-C: the user insists
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


def save_checkpoint(path: Path, state: dict) -> None:
    """Written beside and renamed over: a kill mid-write leaves the previous checkpoint whole."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path, meta: dict) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("version") != CHECKPOINT_VERSION:
        raise ResumeMismatch(f"{path}: checkpoint version {state.get('version')!r}, expected {CHECKPOINT_VERSION}")
    for key in ("architecture", "train_bags", "val_bags", "obs_topic", "action_topic"):
        if state["meta"].get(key) != meta.get(key):
            raise ResumeMismatch(f"{path}: {key} was {state['meta'].get(key)!r}, now {meta.get(key)!r}; resume with "
                                 "the same bags, topics and model flags, or choose a new --out")
    return state


# ---- the loop ------------------------------------------------------------------------------------------------
@dataclass
class FitResult:
    status: str  # "finished" | "time_limit" | "interrupted"
    signum: int
    step: int
    best_step: int
    best_val: float
    baseline_val: float
    history: list
    train_seconds: float  # in the optimizer steps (evaluations not counted), over every resumed part
    cpu_seconds: float  # process CPU time in those steps (all threads)


def fit(model, train: Sequence[Arrays], val: Sequence[Arrays], opts: FitOptions, out_dir: Path, meta: dict,
        resume: bool = False, progress: Progress | None = None) -> FitResult:
    """Train model in place; on return it holds the best weights by validation loss. The checkpoint in out_dir
    (model, optimizer, step, best loss and weights, history, RNG states) is rewritten at every evaluation and on
    an interrupt; resume=True continues from it."""
    ckpt_path = out_dir / CHECKPOINT
    opt = torch.optim.Adam(model.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
    rng = np.random.default_rng(opts.seed)
    torch.manual_seed(opts.seed)
    val_w = eval_windows(val, opts.eval_window or opts.window)
    baseline = mean_action_loss(train, val_w)
    step, best_val, best_step, history, seconds, cpu_seconds = 0, float("inf"), -1, [], 0.0, 0.0
    best_state = None
    if resume:
        st = load_checkpoint(ckpt_path, meta)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        step, best_val, best_step = st["step"], st["best_val"], st["best_step"]
        best_state, history, seconds = st["best_model"], st["history"], st["train_seconds"]
        cpu_seconds = st["cpu_seconds"]
        rng.bit_generator.state = st["numpy_rng"]
        torch.set_rng_state(st["torch_rng"])

    def judge(recent) -> float:
        """Validation loss now, into the history; the weights kept when they are the best so far."""
        nonlocal best_val, best_step, best_state
        val_loss = evaluate(model, val_w)
        history.append({"step": step, "train_loss": float(np.mean(recent)), "val_loss": val_loss,
                        "seconds": round(seconds, 3)})
        if val_loss < best_val:
            best_val, best_step = val_loss, step
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return val_loss

    def checkpoint():
        save_checkpoint(ckpt_path, {
            "version": CHECKPOINT_VERSION, "meta": meta, "options": asdict(opts), "model": model.state_dict(),
            "optimizer": opt.state_dict(), "step": step, "best_val": best_val, "best_step": best_step,
            "best_model": best_state, "history": history, "train_seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "numpy_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state()})

    progress = progress or Progress(opts.steps)
    status, recent = "finished", []
    model.train()
    with StopFlag() as stop:
        t_mark, step_mark = time.monotonic(), step
        while step < opts.steps:
            if stop.signum:
                status = "interrupted"
                break
            if opts.time_limit_s and seconds >= opts.time_limit_s:
                status = "time_limit"
                break
            t0, c0 = time.monotonic(), time.process_time()
            for g in opt.param_groups:
                g["lr"] = lr_at(step, opts)
            obs, targets, mask = sample_batch(rng, train, opts.window, opts.batch)
            sse, count = masked_sse(model.forward_sequence(obs), targets, mask)
            loss = sse / max(count, 1)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"step {step}: the training loss is {float(loss)} (try a lower --lr)")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if opts.clip_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), opts.clip_norm)
            opt.step()
            step += 1
            seconds += time.monotonic() - t0
            cpu_seconds += time.process_time() - c0
            recent = (recent + [loss.item()])[-50:]
            rate = (step - step_mark) / max(1e-9, time.monotonic() - t_mark)
            at_eval = step % opts.eval_every == 0 or step == opts.steps
            val_loss = None
            if at_eval:
                val_loss = judge(recent)
                checkpoint()
            progress.update(step, float(np.mean(recent)), val_loss if val_loss is not None else
                            (history[-1]["val_loss"] if history else None), rate, force=at_eval)
        if status == "time_limit" and (not history or history[-1]["step"] != step):  # its last steps judged too
            judge(recent)
        if not history or history[-1]["step"] != step or status != "finished":
            checkpoint()  # an interrupt is not evaluated (it should end fast): the steps since resume from here
        signum = stop.signum
    progress.close()
    if best_state is not None:
        model.load_state_dict(best_state)
    return FitResult(status, signum, step, best_step, best_val, baseline, history, seconds, cpu_seconds)
