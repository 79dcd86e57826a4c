"""Session = policy + arena + bound plans + capsule store: step, rollback, replan, cold baselines.

Row 0 of the state slab is the live policy; rows 1..max_branches are replan branches, so a what-if
never touches the live row.

Two locks, always taken in this order: ``branch_lock`` (a replan holds it throughout: it owns the branch
rows) and ``lock`` (every change to the live row, the store, the KV log's bookkeeping and the history).
A replan takes ``lock`` only for its bookkeeping and computes its batched steps outside it where the
backend allows (replan.py), so a live step runs beside a replan instead of behind it. Operations on
row 0 and the store take ``lock`` only; operations on the branch rows or the whole store (reset, resume,
a branch row's state), and those that take pages a running replan was promised by its room check (pin,
import, export, the cold baselines), take ``branch_lock`` first (``_beside_no_replan``) and so wait for a
running replan. Called from a thread that holds ``lock`` but not ``branch_lock`` (a callback inside a
step), they raise instead of deadlocking against the replan, which waits for ``lock``.
"""
from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .engine.backend import NumpyBackend, select
from .errors import FingerprintMismatch, NonFiniteAction
from .inputs import as_observations, check_int, check_label, check_stamp_ns
from .model.buffers import Arena
from .model.config import PolicyConfig
from .model.policy import HybridPolicy
from .model.policy_file import load_policy_weights, resolve_policy_config, save_policy
from .model.weights import check_weights, fingerprint, seeded_weights
from .replan import ReplanResult
from .state.bounds import RecordBounds, StateBounds
from .state.capsule_file import read_capsule_file
from .state.capsule_store import CapsuleInfo, CapsuleInUse, CapsuleStore, StoreUsage, UnknownCapsule, write_capsule_file
from .state.history import ObsHistory
from .state.kv_log import KvLog
from .state.sizing import StoreSizes
from .state.step_undo import StepUndo


@dataclass
class StepResult:
    action: np.ndarray  # [action_dim] float32
    chunk: np.ndarray  # [chunk_len, action_dim] float32
    capsule_id: int  # capsule taken after this step; 0 when none was taken
    step: int  # steps taken, this one included
    latency_ms: float


def _as_bytes(tensors: dict[str, np.ndarray]) -> np.ndarray:
    return np.frombuffer(b"".join(np.ascontiguousarray(t).tobytes() for t in tensors.values()), np.uint8)


class Session:
    def __init__(self, cfg: PolicyConfig | None = None, backend="numpy", weights: dict | None = None):
        self.cfg = cfg = resolve_policy_config(cfg or PolicyConfig())  # policy_path: the file's architecture
        self.backend = select(backend) if isinstance(backend, str) else backend
        self.rows = 1 + cfg.max_branches
        self.sizes = sizes = StoreSizes.plan(cfg)
        self.policy = HybridPolicy(cfg, sizes.log_pages)
        self.arena = Arena(self.policy.buffer_specs(), self.rows, self.backend)
        wspecs = self.policy.weight_specs()
        if weights is None:
            key, path = ("policy_path", cfg.policy_path) if cfg.policy_path else ("weights_path", cfg.weights_path)
            weights = load_policy_weights(path, cfg, wspecs, f"{key} {path}") if path else \
                seeded_weights(wspecs, cfg.seed)
        else:  # from the caller: the checks a weights file gets
            weights = check_weights(weights, wspecs, "weights")
        self.weights = weights
        for name, w in weights.items():
            self.backend.from_host(self.arena[name], w)
        self.plan = self.policy.build_plan()
        self.plan.validate(self.arena.views)
        layout_text = ";".join(f"{n}@{p.offset}:{p.spec.shape}:{p.spec.dtype}"
                               for n, p in self.arena.placements.items() if p.spec.is_state)
        self.fingerprint = fingerprint(cfg, weights, self.plan.describe(), layout_text)
        self.kv = KvLog(self.backend, self.arena, cfg.n_layers, sizes.log_pages)
        self.kv.prefault()  # with the records (CapsuleStore): the whole budget is resident from here on
        self.store = CapsuleStore(self.backend, self.arena, self.kv, sizes.records, sizes.budget_bytes,
                                  self.fingerprint, cfg.kv_window, self.policy.window_specs(),
                                  reserve_records=sizes.reserve_records, reserve_pages=sizes.reserve_pages,
                                  entry_nbytes=sizes.entry_nbytes)
        self.lock = threading.RLock()
        self.branch_lock = threading.RLock()  # before self.lock, never after it (see the module docstring)
        self._replan_thread: int | None = None  # the thread a replan runs on, while it runs (its callbacks' too)
        self._live = self.backend.bind(self.plan, self.arena, 0, 1)
        self._branch_runners: dict[tuple[int, int], object] = {}
        self._replan_threads = cfg.replan_threads
        self.history = ObsHistory(cfg.history_limit)
        self.store.on_release = self.history.forget  # an evicted capsule's observations go with it, O(1)
        self.persistence = None  # a persistence.Persistence once enable_persistence ran
        self.stream = None  # a stream.CapsuleStream once enable_stream ran
        # which run these capsule ids belong to: a restart without persist_dir numbers from 1 again, and a
        # capsule stream replica must not take that run's capsule 35 for the one it holds (persist/replica.py)
        self.timeline = secrets.randbits(64) or 1
        self.state_bounds = StateBounds.of_policy(cfg, weights, self.arena.state_specs())  # for outside states
        self.record_bounds = RecordBounds(self.state_bounds, self.arena)
        self.capsule_hmac_key: bytes | None = None  # set: exports carry an HMAC, imports must (capsule_file.py)
        self._undo_row = self.backend.zeros((self.arena.row_nbytes,), np.uint8)  # the live row before a step
        self.reset()

    # ---- state ----------------------------------------------------------------------------
    @property
    def step_count(self) -> int:
        return self._step

    @property
    def live_capsule_id(self) -> int:
        return self._live_id

    @property
    def replan_threads(self) -> int:
        """Threads the next replan's rows are split over (cpu backend; starts as cfg.replan_threads). Settable,
        so a bench compares values in one session."""
        return self._replan_threads

    @replan_threads.setter
    def replan_threads(self, threads: int) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"replan_threads: must be an int >= 1, got {threads!r}")
        self._replan_threads = threads

    def live_row(self):
        """The live row's small state (device memory)."""
        return self.arena.state_bytes(0)

    def state_tensors(self, row: int = 0) -> dict[str, np.ndarray]:
        """The full state of a row as host arrays: small state plus the KV window gathered from the
        log (DESIGN.md contract 4). For checks and files; not on the hot path. A branch row waits for a
        running replan (its compute runs outside ``lock``)."""
        with self._beside_no_replan() if row else self.lock:
            self.backend.sync()
            return self.store.materialize_row(self.backend.to_host(self.arena.state_bytes(row)),
                                              self.kv.tables[row])

    def state_host(self, row: int = 0) -> np.ndarray:
        """The full state of a row as one byte string (``state_tensors`` in table order)."""
        return _as_bytes(self.state_tensors(row))

    def materialize(self, capsule_id: int) -> dict[str, np.ndarray]:
        """A capsule as the full state row it stands for (the full-copy oracle's view)."""
        capsule_id = check_int("capsule_id", capsule_id)
        with self.lock:
            return self.store.materialize(capsule_id)

    def capsule_host(self, capsule_id: int) -> np.ndarray:
        return _as_bytes(self.materialize(capsule_id))

    @contextlib.contextmanager
    def _beside_no_replan(self, take_lock: bool = True):
        """``branch_lock`` then (``take_lock``) ``lock``: waits for a running replan (module docstring)."""
        if self.lock._is_owned() and not self.branch_lock._is_owned():  # noqa: SLF001 - CPython's RLock
            raise RuntimeError("this call waits for a running replan, and this thread holds the runtime lock "
                               "(a callback inside a step?): the replan would wait for it in turn; call it "
                               "outside the step")
        if self._replan_thread == threading.get_ident():  # branch_lock is re-entrant: it would let this in
            raise RuntimeError("this call waits for the running replan, and was made from inside it (its on_step "
                               "or cancel callback): it would change the rows the replan computes; call it after "
                               "the replan returns")
        with self.branch_lock, self.lock if take_lock else contextlib.nullcontext():
            yield

    @contextlib.contextmanager
    def _replanning_here(self):
        """Under branch_lock: marks this thread as the running replan's until it returns."""
        self._replan_thread = threading.get_ident()
        try:
            yield
        finally:
            self._replan_thread = None

    def reset(self) -> None:
        """Every row and the history back to the start (capsules stay); waits for a running replan."""
        with self._beside_no_replan(), self.backend.activate():
            self.arena.state[...] = 0
            for row in range(self.rows):
                self.kv.clear_row(row)
            self._step = 0
            self._live_id = 0
            self.history.reset()
            for tap in self.record_taps():  # a crash before the next capsule resumes reset, not before it
                tap.on_reset()

    # ---- step -----------------------------------------------------------------------------
    def step(self, obs, stamp_ns: int = 0, on_action: Callable[[np.ndarray], None] | None = None) -> StepResult:
        """One policy step. ``on_action`` gets the action as soon as it exists, before the capsule copy,
        so a robot can actuate first. A step whose action (or chunk) comes out non-finite is refused:
        NonFiniteAction, nothing published, the live state as before the step."""
        o = as_observations(obs, (self.cfg.obs_dim,))
        stamp_ns = check_stamp_ns(stamp_ns)
        with self.lock:
            t0 = time.perf_counter()
            undo = StepUndo.before_step(self)
            self.kv.prepare_append(0, self._step)  # position == steps taken (meta invariant)
            self.backend.from_host(self.arena["obs"][0], o)
            self._live.replay()
            action = self.backend.to_host(self.arena["action"][0])
            chunk = self.backend.to_host(self.arena["chunk"][0]).reshape(self.cfg.chunk_len, self.cfg.action_dim)
            if not (np.isfinite(action).all() and np.isfinite(chunk).all()):
                undo.apply(self)
                raise NonFiniteAction(
                    f"step {self._step + 1} refused: the policy produced a non-finite action "
                    f"({action.tolist()}); nothing was published and the state is as before this step. The "
                    "live state cannot come from a run of this policy (a forged or damaged capsule?): roll "
                    "back to a capsule you trust, or reset")
            self._step += 1  # the step ran: its bookkeeping and capsule follow whatever on_action does
            self.history.push(o, self._step)
            cid = 0
            try:
                if on_action is not None:
                    on_action(action)
            finally:
                if self._step % self.cfg.capsule_every_n_steps == 0:
                    cid = self._snapshot_live(stamp_ns, "", False).id
            return StepResult(action, chunk, cid, self._step, (time.perf_counter() - t0) * 1e3)

    def _snapshot_live(self, stamp_ns: int, label: str, pin: bool) -> CapsuleInfo:
        info = self.store.snapshot(0, step=self._step, parent_id=self._live_id, stamp_ns=stamp_ns,
                                   label=label, pin=pin)
        self._live_id = info.id
        self.history.mark(info.id, self.history.head)
        if self.persistence is not None or self.stream is not None:  # the check alone: this runs after every step
            for tap in self.record_taps():
                tap.on_capsule(info)
        return info

    def snapshot(self, label: str = "", pin: bool = False, stamp_ns: int = 0) -> CapsuleInfo:
        check_label(label)
        stamp_ns = check_stamp_ns(stamp_ns)
        with self._beside_no_replan() if pin else self.lock:  # a pin takes pages a replan may need
            if pin and self.persistence is not None:
                self.persistence.check_pin_room(0)  # before anything changes
            info = self._snapshot_live(stamp_ns, label, pin)
            job = self.persistence.pin_job(info) if pin and self.persistence is not None else None
        if job is not None:
            job()  # the pin file is written outside the lock
        return info

    # ---- the store, under the session lock (the store itself is not thread-safe) ----------
    def capsule_info(self, capsule_id: int) -> CapsuleInfo:
        capsule_id = check_int("capsule_id", capsule_id)
        with self.lock:
            return self.store.get(capsule_id)

    def list_capsules(self, pinned_only: bool = False) -> list[CapsuleInfo]:
        """A consistent copy of the capsule list, oldest first."""
        with self.lock:
            return list(self.store.list(pinned_only))

    def pin(self, capsule_id: int) -> CapsuleInfo:
        """Keep a capsule until unpinned; refused (StoreFullOfPins) before pins could starve the live step.
        Waits for a running replan: its room check counted this capsule's pages as evictable."""
        capsule_id = check_int("capsule_id", capsule_id)
        with self._beside_no_replan():
            if self.persistence is not None:
                self.persistence.check_pin_room(capsule_id)  # before anything changes
            info = self.store.pin(capsule_id)
            job = self.persistence.pin_job(info) if self.persistence is not None else None
        if job is not None:
            job()  # the pin file is written outside the lock
        return info

    def unpin(self, capsule_id: int) -> CapsuleInfo:
        capsule_id = check_int("capsule_id", capsule_id)
        with self.lock:
            info = self.store.unpin(capsule_id)
        if self.persistence is not None:
            self.persistence.on_unpinned(capsule_id)
        return info

    def drop(self, capsule_id: int) -> None:
        """Forget a capsule. The live capsule cannot be dropped: it anchors rollback(steps_back=...)."""
        capsule_id = check_int("capsule_id", capsule_id)
        with self.lock:
            if capsule_id and capsule_id == self._live_id:
                raise CapsuleInUse(f"capsule {capsule_id} is the live capsule: take a newer one (step or "
                                   "snapshot) or roll back elsewhere before dropping it")
            self.store.drop(capsule_id)
        if self.persistence is not None:
            self.persistence.on_unpinned(capsule_id)

    def store_usage(self) -> StoreUsage:
        with self.lock:
            return self.store.usage()

    # ---- rollback -------------------------------------------------------------------------
    def rollback(self, capsule_id: int | None = None, steps_back: int = 0) -> CapsuleInfo:
        """Make a capsule live: ``steps_back`` steps back along the lineage of ``capsule_id`` (None or 0:
        the live capsule). The newest capsule at or before that step is restored."""
        capsule_id = check_int("capsule_id", capsule_id, none_ok=True)
        steps_back = check_int("steps_back", steps_back)
        with self.lock:
            if capsule_id:  # n steps back along that capsule's lineage
                start = self.store.get(capsule_id)
                info = self.store.ancestor(start.id, start.step - steps_back) if steps_back else start
            elif self._live_id == 0:
                raise UnknownCapsule("no live capsule to roll back from (nothing stepped since reset)")
            else:  # from the live step, which may be past the live capsule (capsule_every_n_steps > 1)
                info = self.store.ancestor(self._live_id, self._step - steps_back)
            self.store.restore(info.id, 0)
            self._step = info.step
            self._live_id = info.id
            self.history.head = self.history.node_of(info.id)
            for tap in self.record_taps():  # a crash before the next capsule resumes here, not past it
                tap.on_live(info)
            return info

    def restore_roles(self, capsule_id: int, roles: tuple[str, ...]) -> CapsuleInfo:
        """Ablation only: restore just the buffers of ``roles`` (e.g. ("kv", "meta"), what a KV-cache
        server would keep), leaving the rest of the live state as it is. "kv" means the KV window
        (the page table into the log)."""
        with self.lock:
            names = {s.name for s in self.arena.state_specs() if s.role in roles}
            if "kv" in roles or "meta" in roles:  # the window and the position that reads it move together
                names |= {"kv_pages", "meta"}
            info = self.store.restore_buffers(capsule_id, 0, names)
            if "meta" in names:
                self._step = info.step
            self._live_id = 0
            return info

    # ---- replan ---------------------------------------------------------------------------
    def _branch_runner(self, branches: int):
        """Replay rows 1..branches. A backend with fixed graphs (CUDA) pads to max_branches; one that splits
        rows over threads (cpu) gets replan_threads."""
        rows = self.cfg.max_branches if getattr(self.backend, "fixed_batch", False) else branches
        split = {"threads": self.replan_threads} if getattr(self.backend, "splits_rows", False) else {}
        key = (rows, split.get("threads", 1))
        runner = self._branch_runners.get(key)
        if runner is None:
            runner = self._branch_runners[key] = self.backend.bind(self.plan, self.arena, 1, rows, **split)
        return runner

    def prepare_replans(self) -> None:
        """Pay now what a process's first replan would pay inside its deadline (the node calls this at
        configure): the branch runners of every batch size (17 ms each on the NumPy backend), and numpy's lazy
        import under the room check (np.unique imported numpy.ma: 28 ms). A first 1 x 8 replan in a fresh
        node took 35-43 ms to its first step, and a 50 ms deadline cut it short."""
        for branches in range(1, self.cfg.max_branches + 1):
            self._branch_runner(branches)
        self.kv.pages_obtainable([])

    def replan(self, capsule_id: int | None, observations, commit_branch: int | None = None,
               deadline_ms: float | None = None, cancel: Callable[[], bool] | None = None,
               on_step: Callable[[int], None] | None = None, copy_fork: bool = False) -> ReplanResult:
        """Fork ``capsule_id`` (None or 0 = the live state) into B branches and step them as one batch
        over observations[B, horizon, obs_dim]. Without commit_branch the live state is untouched.

        ``deadline_ms`` None runs every step; otherwise the steps left when it passes are abandoned
        (partial result, deadline_met False). A replan stopped by ``cancel`` never commits.
        ``on_step(done)`` runs after each batched step on the calling thread, outside ``lock``: live
        steps go on meanwhile (beside the batched steps on a backend with ``concurrent_replay``, between
        them otherwise), and a commit leaves them behind, as a rollback would.

        Branches read the source capsule's KV window in place from the log and append their own
        entries to private pages (a partial page is copied first when it is shared). ``copy_fork``
        copies each branch's whole window instead: the old design, kept as the benchmark baseline."""
        from .replan import run_replan

        return run_replan(self, capsule_id, observations, commit_branch, deadline_ms, cancel, on_step, copy_fork)

    # ---- cold baselines -------------------------------------------------------------------
    # (row 0, its pages and the history; they wait for a running replan: a window of fresh pages each)
    def cold_replay(self, n: int | None = None) -> None:
        """Recompute the live state from reset by stepping the first n observations of the live
        branch one by one (byte-identical to the original run). No capsules are taken."""
        with self._beside_no_replan(), self.backend.activate():
            obs = self._rewind_history(n)
            self.arena.state[0] = 0
            self.kv.clear_row(0)
            for i, o in enumerate(obs):
                self.kv.prepare_append(0, i)
                self.backend.from_host(self.arena["obs"][0], o)
                self._live.replay()
            self.backend.sync()

    def cold_prefill(self, n: int | None = None) -> None:
        """Recompute the live state layer by layer over the whole history (batched attention, GRU scan).
        Matches cold_replay within float tolerance; meta matches exactly."""
        from .model.prefill import prefill

        with self._beside_no_replan():
            prefill(self, self._rewind_history(n))
            self.backend.sync()

    def prefill_from(self, observations) -> None:
        """Start from a recorded history: reset, then recompute the state after observations[n, obs_dim]
        with cold_prefill (no capsules are taken). A history longer than the session keeps is refused before
        anything changes; one that drives the state non-finite raises NonFiniteAction and leaves the session
        reset (step 0), never non-finite."""
        obs = as_observations(observations, (len(observations), self.cfg.obs_dim), "observations")
        if len(obs) >= 2 * self.cfg.history_limit:  # the history would drop its oldest before the prefill read them
            raise ValueError(f"observations: {len(obs)} steps, but this session keeps at most "
                             f"{2 * self.cfg.history_limit - 1} (history_limit {self.cfg.history_limit}); raise "
                             "history_limit or prefill from a shorter history")
        with self._beside_no_replan():  # reset takes branch_lock: in the order, never after lock
            self.reset()
            for i, o in enumerate(obs):
                self.history.push(o, i + 1)
            self._step = len(obs)
            self.cold_prefill()
            if not all(np.isfinite(t).all() for t in self.state_tensors(0).values() if t.dtype.kind == "f"):
                written = self.kv.tables[0][self.kv.tables[0] >= 0]  # the prefill's own pages, no capsule's
                for log in (*self.kv.k, *self.kv.v):  # recycled, their garbage would reach a masked slot's 0 * nan
                    log[written] = 0
                self.reset()
                raise NonFiniteAction(f"prefill_from: the {len(obs)} observations drive the state non-finite "
                                      "(values past what the policy was trained on?); the session is reset")

    def _rewind_history(self, n: int | None) -> np.ndarray:
        """The first n observations of the live branch; the live step becomes n (no capsule is live)."""
        obs = self.history.observations(self._step, n)
        self.history.truncate(len(obs))
        self._step, self._live_id = len(obs), 0
        return obs

    # ---- files ----------------------------------------------------------------------------
    def export_capsule(self, capsule_id: int, path: str | Path) -> str:
        """Write a self-contained capsule file; returns its sha256. Under the lock only its small state is
        copied and its KV pages held; the window is gathered and the file written after the lock is
        released (steps go on meanwhile). Waits for a running replan: held pages count like a pin's."""
        capsule_id = check_int("capsule_id", capsule_id, none_ok=True)
        with self._beside_no_replan():
            cid = capsule_id or self._live_id
            info = self.store.get(cid)
            pages = self.store.hold_pages(cid)  # the window is gathered after the lock is released
            if pages is None:  # a device backend, or holding them could starve the live step: copy now
                payload = self.store.export_payload(cid)
            else:
                small = self.backend.to_host(self.store.record(cid))
        if pages is not None:
            try:
                payload = self.store.payload_of(info, small, pages)
            finally:
                with self.lock:
                    self.store.release_pages(pages)
        return write_capsule_file(payload, path, self.capsule_hmac_key)

    def import_capsule(self, path: str | Path, restore: bool = False) -> CapsuleInfo:
        """Validate a capsule file completely (without the lock): checksum, HMAC when a key is set, meta
        invariants and the state bounds of this policy (state/bounds.py); then add it; optionally make it live."""
        checked = read_capsule_file(path, self.store.window_specs, self.fingerprint, self.cfg.kv_window,
                                    self.state_bounds, self.capsule_hmac_key)
        with self._beside_no_replan():  # its window takes fresh pages, which a running replan may need
            info = self.store.add_imported(checked)
            self.history.mark(info.id, None)  # its observations are not known here
            if restore:
                info = self.rollback(info.id)
            return info

    # ---- persistence ----------------------------------------------------------------------
    def enable_persistence(self, settings, resume: bool = False, fresh_on_mismatch: bool = False):
        """Append every timeline capsule to the log in ``settings.directory`` (persist/attach.py). ``resume``:
        first rebuild the store from the log there and make its newest capsule live; returns the
        ResumeReport (None without resume). Raises FingerprintMismatch / LogCorrupt, touching nothing,
        when the log cannot be resumed; ResumeDoesNotFit, the session left reset, when a sound log needs a
        bigger capsule store than this one. ``fresh_on_mismatch``: a log of another fingerprint is moved
        aside instead (``persistence.mismatch_moved`` says where), while the directory's lock is held, and
        the session starts fresh."""
        with self._beside_no_replan(take_lock=False):  # a resume resets every row and rebuilds the store
            return self._enable_persistence(settings, resume, fresh_on_mismatch)

    def _enable_persistence(self, settings, resume: bool, fresh_on_mismatch: bool = False):
        from .persist.attach import DirLock, Persistence, layout_of, move_aside, start_fresh
        from .persist.attach import resume as resume_from

        if self.persistence is not None:
            raise RuntimeError("persistence is already enabled")
        settings = settings.sized_for(layout_of(self))  # a budget too small for this window fails here
        directory = Path(settings.directory)
        # made (0700) or checked before a resume resets anything: state untouched when it fails
        lock = DirLock(directory)  # before the log is read: a resume cuts tails, another writer's too
        try:
            report = moved = mismatch_moved = None
            if resume:
                try:
                    report = resume_from(self, settings.directory)
                except FingerprintMismatch:
                    if not fresh_on_mismatch:
                        raise
                    mismatch_moved = move_aside(directory)  # under the lock: no other node takes the log meanwhile
            if report is None:
                moved = start_fresh(self, settings.directory)
            persistence = Persistence(self, settings, lock, moved)
            persistence.mismatch_moved = mismatch_moved
        except BaseException:
            lock.release()
            raise
        self.persistence = persistence
        return report

    def adopt_timeline(self, timeline: int) -> None:
        """A replica's store now follows the capsule stream of ``timeline`` (kept for a resume, if persisting).
        Raises OSError when the persist_dir refuses it."""
        self.timeline = timeline
        if self.persistence is not None:
            self.persistence.keep_timeline(timeline)

    def disable_persistence(self) -> None:
        """Write what is queued, fsync, and stop the writer."""
        # never between a step's (or a replan commit's) check of self.persistence and its use
        with self._beside_no_replan():
            p, self.persistence = self.persistence, None
        if p is not None:  # closed outside the lock: the writer waits for an idle runtime, briefly
            p.close()

    def record_taps(self) -> list:
        """Under the lock: every consumer of the timeline's capsule records (the disk log, the stream)."""
        return [tap for tap in (self.persistence, self.stream) if tap is not None]

    # ---- the capsule stream ---------------------------------------------------------------
    def enable_stream(self, publish, keyframe_s: float = 10.0, queue_mb: float | None = None, clock=None):
        """Hand every timeline capsule record to ``publish(StreamRecord)`` on a thread of its own
        (persist/stream.py), a whole-window record at least every ``keyframe_s`` by ``clock(info)`` (seconds;
        default time.monotonic(); a replay passes the record's stamp: bag time). ``queue_mb`` None: sized from
        the window (stream.queue_mb_for). Returns the stream."""
        from .persist.stream import CapsuleStream

        with self.lock:  # the taps are only ever used under it (a step's capsule, a commit's bookkeeping)
            if self.stream is not None:
                raise RuntimeError("the capsule stream is already enabled")
            self.stream = CapsuleStream(self, publish, keyframe_s, queue_mb, clock)
            return self.stream

    def disable_stream(self) -> None:
        """Stop the stream; never waits for a running replan (a deactivating node stops one meanwhile)."""
        with self.lock:
            stream, self.stream = self.stream, None
        if stream is not None:
            stream.close()

    def save_policy(self, path: str | Path, obs_names=(), action_names=()) -> None:
        """This session's weights as a policy file (policy_file.py): loads with policy_path or weights_path."""
        save_policy(path, self.cfg, self.weights, obs_names, action_names)


__all__ = ["Session", "StepResult", "ReplanResult", "as_observations", "NumpyBackend"]
