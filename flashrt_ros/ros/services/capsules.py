"""Service handlers of the flashrt node.

Every handler runs on a worker thread, never on the executor thread: a call that waits for a
running replan (reset, pin, import, export: Session._beside_no_replan) or writes a file leaves the
executor free to step observations and to take goals and cancels. The ROS callback is a coroutine that
awaits the worker's result; the worker completing the future wakes the executor (a done callback is
scheduled as a task).

Every error, of any type, becomes success=false with a one-line message; nothing raises into the
executor, and a failed request leaves the live state as it was.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from builtin_interfaces.msg import Time
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.task import Future
from std_srvs.srv import Trigger

from flashrt_interfaces.msg import CapsuleInfo
from flashrt_interfaces.srv import (
    DropCapsule,
    ExportCapsule,
    ImportCapsule,
    ListCapsules,
    Rollback,
    SetPin,
    Snapshot,
)

from ...runtime.errors import CapsuleError
from ..io.convert import capsule_info_to_msg, request_refusal
from ..io.qos import SERVICE_QOS
from .capsule_dir import CapsuleDir


class NotServing(Exception):
    """A call the node will not run because its services are stopping (deactivate)."""


EXPECTED = (CapsuleError, ValueError, OSError, NotServing)
WORKERS = 1  # calls run in the order they arrived, as they would on the executor thread


def info_msg(info) -> CapsuleInfo:
    return capsule_info_to_msg(info, CapsuleInfo, Time)


def describe_error(err: BaseException) -> str:
    """One line a robot engineer can act on; the type is named only when it is not a domain error."""
    if isinstance(err, ModuleNotFoundError) and err.name:
        package = err.name.split(".")[0]
        return f"Python module '{package}' is not installed (pip install {package})"
    text = " ".join(str(err).split()) or type(err).__name__
    return text if isinstance(err, EXPECTED) else f"{type(err).__name__}: {text}"


class _Parked:
    """Awaited by a handler whose service was destroyed before it could answer (a request taken just as
    the node shut down): rclpy cannot send a response on a destroyed service (it would raise into the
    executor), so the task stays pending instead."""

    def __await__(self):
        while True:
            yield


class CapsuleServices:
    """Creates and owns the node's services (created on activate, destroyed on deactivate).

    On deactivate every call in flight still gets its answer: the one running finishes, the ones queued
    behind it are refused naming the state, and the services go away once the last answer is out."""

    def __init__(self, node, capsule_dir: CapsuleDir):
        self.node = node
        self.capsule_dir = capsule_dir
        self._lock = threading.Lock()  # guards the three below: callbacks (executor) vs workers vs destroy
        self._closing = ""  # why the services stop; "" while they serve
        self._in_flight = 0  # calls taken and not answered yet
        self._destroyed = False
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="flashrt_srv")
        table = [
            (Snapshot, "snapshot", self.snapshot),
            (Rollback, "rollback", self.rollback),
            (ListCapsules, "list_capsules", self.list_capsules),
            (DropCapsule, "drop_capsule", self.drop_capsule),
            (SetPin, "set_pin", self.set_pin),
            (ExportCapsule, "export_capsule", self.export_capsule),
            (ImportCapsule, "import_capsule", self.import_capsule),
            (Trigger, "reset", self.reset),
        ]
        # Their own reentrant group: a handler awaiting its worker must not hold the node's default
        # (mutually exclusive) group, or observations, timers and goal/cancel handling would wait for it.
        group = ReentrantCallbackGroup()
        self.handles = [node.create_service(t, name, self._off_executor(name, fn), qos_profile=SERVICE_QOS,
                                            callback_group=group) for t, name, fn in table]

    def destroy(self, reason: str = "the node is deactivating") -> None:
        """Stop taking calls. Runs on the executor thread (a lifecycle transition), so the answers of the
        calls in flight go out after it returns; the services are destroyed after the last of them."""
        with self._lock:
            self._closing = reason
            idle = self._in_flight == 0
        self._pool.shutdown(wait=False)  # the one running finishes; the queued ones are refused (_run)
        executor = self.node.executor
        if idle or executor is None:
            self._destroy_handles()

    def _destroy_handles(self) -> None:
        with self._lock:
            if self._destroyed:
                return
            self._destroyed = True
        for h in self.handles:
            self.node.destroy_service(h)
        self.handles = []

    def _refusal(self) -> Exception | None:
        return NotServing(f"{self._closing}; services stop while the node is inactive, call again once it is "
                          "active") if self._closing else None

    @property
    def session(self):
        session = self.node.session
        if session is None:
            raise RuntimeError("the node is not configured")
        return session

    # ---- the bridge: executor coroutine <-> worker thread ---------------------------------
    def _off_executor(self, name: str, work):
        async def callback(request, response):
            with self._lock:
                destroyed, err = self._destroyed, self._refusal()
                self._in_flight += int(not destroyed)
            if destroyed:
                await _Parked()
            if err is None and (refusal := request_refusal(request)):  # a huge label or file name: never queued
                err = ValueError(refusal)
            try:
                if err is None:
                    done = Future(executor=self.node.executor)
                    done.add_done_callback(lambda _: None)  # scheduling it wakes the executor
                    self._pool.submit(self._run, done, work, request, response)
                    err = await done
            except Exception as e:  # noqa: BLE001 - e.g. the pool was shut down meanwhile
                err = self._refusal() or e
            finally:
                with self._lock:
                    self._in_flight -= 1
                    last = bool(self._closing) and self._in_flight == 0
            if err is not None:
                self._fail(response, name, err)
            if last:  # a task of its own: it runs after this callback's response has been sent
                self.node.executor.create_task(self._destroy_handles)
            return response

        return callback

    def _run(self, done: Future, work, request, response) -> None:
        try:
            refusal = self._refusal()  # queued behind a call that ran while the node started deactivating
            if refusal is not None:
                raise refusal
            work(request, response)
            done.set_result(None)
        except BaseException as e:  # noqa: BLE001 - every error is answered, none escapes
            done.set_result(e.with_traceback(None))  # its frames would keep the request alive (a cycle)

    def _fail(self, response, what: str, err: BaseException) -> None:
        text = f"{what} {'refused' if isinstance(err, NotServing) else 'failed'}: {describe_error(err)}"
        if hasattr(response, "success"):
            response.success = False
            response.message = text
        log = self.node.get_logger()
        (log.warning if isinstance(err, EXPECTED) else log.error)(text)

    # ---- handlers (worker thread) ---------------------------------------------------------
    def snapshot(self, request, response):
        info = self.session.snapshot(request.label, request.pin, stamp_ns=self.node.last_stamp_ns)
        response.success, response.message, response.capsule = True, f"capsule {info.id}", info_msg(info)

    def rollback(self, request, response):
        if not request.capsule_id and not request.steps_back:
            # the all-defaults request ({}): with capsule_every_n_steps > 1 it would move the robot back
            raise ValueError("name a target: steps_back >= 1 (from the live state) or a capsule_id; a request "
                             "with neither (capsule_id 0, steps_back 0) changes nothing")
        t0 = time.perf_counter()
        info = self.session.rollback(request.capsule_id or None, int(request.steps_back))
        response.elapsed_ms = (time.perf_counter() - t0) * 1e3
        self.node.live_state_replaced()  # policy_step's history is of the timeline left behind
        response.success, response.message = True, f"capsule {info.id} (step {info.step}) is live"
        response.capsule = info_msg(info)

    def list_capsules(self, request, response):
        session = self.session
        with session.lock:  # one consistent view while the replan worker changes the store
            capsules = session.list_capsules(pinned_only=request.pinned_only)
            usage = session.store_usage()
            response.live_capsule_id = session.live_capsule_id
        response.capsules = [info_msg(i) for i in capsules]
        response.bytes_used = usage.bytes_used
        response.bytes_budget = usage.budget_bytes
        response.resumed_from = self.node.resume_summary
        response.success, response.message = True, f"{len(capsules)} capsules"

    def drop_capsule(self, request, response):
        session = self.session
        if request.capsule_id and session.capsule_info(request.capsule_id).pinned:  # services run one at a time
            raise ValueError(f"capsule {request.capsule_id} is pinned: unpin it first (set_pin with pin: false), "
                             "then drop it")
        session.drop(request.capsule_id)
        response.success, response.message = True, f"capsule {request.capsule_id} dropped"

    def set_pin(self, request, response):
        session = self.session
        info = session.pin(request.capsule_id) if request.pin else session.unpin(request.capsule_id)
        response.success, response.capsule = True, info_msg(info)
        response.message = f"capsule {info.id} {'pinned' if info.pinned else 'unpinned'}"

    def export_capsule(self, request, response):
        path = self.capsule_dir.path_for(request.file_name, create=True)
        # 0 = the live capsule; the file is written after the runtime lock is released
        response.sha256 = self.session.export_capsule(request.capsule_id, path)
        response.success, response.message = True, f"wrote {path}"

    def import_capsule(self, request, response):
        info = self.session.import_capsule(self.capsule_dir.path_for(request.file_name), restore=request.restore)
        if request.restore:
            self.node.live_state_replaced()
        response.success = True
        response.message = f"imported as capsule {info.id}" + (" (live)" if request.restore else "")
        response.capsule = info_msg(info)

    def reset(self, request, response):
        self.session.reset()
        self.node.live_state_replaced()
        response.success, response.message = True, "policy state reset to zeros; capsules kept"
