"""FlashRTClient: what a planner uses to talk to a flashrt node (its services and the Replan action).

In the manner of nav2_simple_commander, on top of an rclpy Node the caller owns:

    client = FlashRTClient(node, "/robot1")
    client.wait_until_ready()
    task = client.send_replan(obs)            # non-blocking: a ReplanTask
    while not task.is_task_complete(): ...    # or task.cancel()
    out = task.get_result()                   # ReplanOutcome; out.actions() -> [branches, steps, action_dim]
    client.rollback(steps_back=20)            # one named method per service

Failures, one style:
- no answer (server not there, or no reply within timeout_s) raises FlashRTTimeout, and the request
  is cancelled: nothing stays pending in the client or its node;
- every answer is returned, failures included: a service response with success=false and a message,
  a ReplanOutcome with accepted=False and a reason, or with the result's success=false. Nothing else raises.

"None" arguments (capsule_id, commit_branch, deadline_ms) are sent in the wire spelling documented in
the .srv / .action comments (0, -1, 0).

Spinning: if no executor holds the node, a blocking call spins it here; if an executor holds it
(spinning in another thread), calls wait on the futures and never spin it. Do not
make blocking calls from a callback of a single-threaded executor that owns the node: they would wait
on the thread that must deliver the answer. Use send_replan + is_task_complete there.
"""
from __future__ import annotations

import importlib
import threading
import time

import numpy as np
import rclpy
from rclpy.action import ActionClient
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_srvs.srv import Trigger

from flashrt_interfaces.action import Replan
from flashrt_interfaces.srv import DropCapsule, ExportCapsule, ImportCapsule, ListCapsules, Rollback, Snapshot

from ..io.convert import check_file_name
from ..io.qos import SERVICE_QOS
from .action_client import ThreadSafeActionClient
from .task import FlashRTTimeout, ReplanOutcome, ReplanTask

SERVICES = {"snapshot": Snapshot, "rollback": Rollback, "list_capsules": ListCapsules,
            "drop_capsule": DropCapsule, "export_capsule": ExportCapsule, "import_capsule": ImportCapsule,
            "reset": Trigger}
# Newer nodes only: their types are read from the graph when first used.
OPTIONAL_SERVICES = ("set_pin", "unpin")
# Calls that change nothing when the node gets them twice (a read; the same file written again). A server
# whose response writer has not matched this client yet drops the response (rmw: "failed to send response");
# one of these with no answer after RESEND_AFTER_S is forgotten and sent once more.
REPEATABLE_SERVICES = ("list_capsules", "export_capsule")
RESEND_AFTER_S = 2.0
# A burst of goals or answers must not overflow the rclpy default depth of 10.
ACTION_QOS = QoSProfile(depth=256, reliability=ReliabilityPolicy.RELIABLE)


def _none_id(capsule_id: int | None) -> int:
    return 0 if capsule_id is None else int(capsule_id)


class FlashRTClient:
    def __init__(self, node, namespace: str = "", thread_safe_actions: bool = True):
        """``thread_safe_actions`` False: rclpy's own ActionClient (client/action_client.py says what it risks)."""
        self.node = node
        self.namespace = namespace.rstrip("/")
        self.clients = {name: node.create_client(t, self._name(name), qos_profile=SERVICE_QOS)
                        for name, t in SERVICES.items()}
        action_client = ThreadSafeActionClient if thread_safe_actions else ActionClient
        self.replan_client = action_client(node, Replan, self._name("replan"), goal_service_qos_profile=ACTION_QOS,
                                           result_service_qos_profile=ACTION_QOS,
                                           cancel_service_qos_profile=ACTION_QOS)
        self._optional: dict = {}

    def _name(self, name: str) -> str:
        return f"{self.namespace}/{name}" if self.namespace else name

    def destroy(self) -> None:
        """Remove this client's service and action clients from the node (the node stays)."""
        for c in [*self.clients.values(), *(pair[0] for pair in self._optional.values())]:
            self.node.destroy_client(c)
        self.replan_client.destroy()
        self.clients, self._optional = {}, {}

    def wait_until_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        for c in self.clients.values():
            if not c.wait_for_service(timeout_sec=max(0.0, deadline - time.monotonic())):
                raise FlashRTTimeout(f"service '{c.srv_name}' not available after {timeout_s} s")
        if not self.replan_client.wait_for_server(timeout_sec=max(0.1, deadline - time.monotonic())):
            raise FlashRTTimeout(f"action 'replan' not available after {timeout_s} s")
        # A server that was just discovered can get a request before its response writer has matched this
        # client, and then drops the response (rmw: "failed to send response"). A read-only call answered
        # end to end shows both directions matched; until then, ask again.
        while True:
            try:
                self.call("list_capsules", timeout_s=min(1.0, max(0.1, deadline - time.monotonic())))
                return
            except FlashRTTimeout:
                if time.monotonic() >= deadline:
                    raise FlashRTTimeout(f"no answer from '{self._name('list_capsules')}' within {timeout_s} s "
                                         "(the server is discovered but does not answer)") from None

    # ---- waiting --------------------------------------------------------------------------
    def spun_elsewhere(self) -> bool:
        """The node belongs to an executor now (rclpy.spin_once adds it only for the call, and leaves
        node.executor set afterwards: membership is what counts)."""
        executor = self.node.executor
        return executor is not None and self.node in executor.get_nodes()

    def wait_for(self, future, timeout_s: float, what: str = "an answer", give_up: bool = True):
        """future's result (an rclpy Future or a threading.Event); FlashRTTimeout after timeout_s. give_up: on a
        timeout, cancel the future (the client forgets the request); False leaves it to complete later."""
        end = time.monotonic() + timeout_s
        done = future.is_set if isinstance(future, threading.Event) else future.done
        if not self.spun_elsewhere():  # nobody spins this node: spin it here
            while not done() and time.monotonic() < end:
                rclpy.spin_once(self.node, timeout_sec=min(0.05, max(0.0, end - time.monotonic())))
        elif isinstance(future, threading.Event):
            future.wait(max(0.0, end - time.monotonic()))
        else:  # its executor delivers the answer on another thread
            arrived = threading.Event()
            future.add_done_callback(lambda _: arrived.set())
            arrived.wait(max(0.0, end - time.monotonic()))
        if not done():
            if give_up and not isinstance(future, threading.Event):
                future.cancel()  # no answer will be awaited: the client forgets the request
            raise FlashRTTimeout(f"no answer ({what}) within {timeout_s} s")
        return None if isinstance(future, threading.Event) else future.result()

    _spin_until = wait_for  # the name older callers use

    # ---- services: one named method each; the response comes back whatever it says --------
    def call(self, name: str, timeout_s: float = 5.0, **fields):
        """The service's response; FlashRTTimeout when none came within timeout_s, discovery included (one
        deadline for every wait here)."""
        deadline = time.monotonic() + timeout_s

        def left() -> float:
            return max(0.0, deadline - time.monotonic())
        if name in OPTIONAL_SERVICES:
            cli, srv_type = self._optional_client(name, left())
        else:
            cli, srv_type = self.clients[name], SERVICES[name]
        if not cli.service_is_ready() and not cli.wait_for_service(timeout_sec=left()):
            raise FlashRTTimeout(f"service '{cli.srv_name}' not available after {timeout_s} s")
        request, what = srv_type.Request(**fields), f"service '{cli.srv_name}'"
        if name in REPEATABLE_SERVICES and left() > RESEND_AFTER_S:
            try:
                return self._ask(cli, request, RESEND_AFTER_S, what)
            except FlashRTTimeout:
                pass  # perhaps a response dropped in discovery: ask again with the time left
        try:
            return self._ask(cli, request, left(), what)
        except FlashRTTimeout:
            raise FlashRTTimeout(f"no answer ({what}) within {timeout_s} s") from None

    def _ask(self, cli, request, timeout_s: float, what: str):
        future = cli.call_async(request)
        try:
            return self.wait_for(future, timeout_s, what)
        except FlashRTTimeout:
            cli.remove_pending_request(future)  # cancel() does it through a done callback; be sure
            raise

    def snapshot(self, label: str = "", pin: bool = False, timeout_s: float = 5.0) -> Snapshot.Response:
        return self.call("snapshot", timeout_s, label=label, pin=pin)

    def rollback(self, capsule_id: int | None = None, steps_back: int = 0, timeout_s: float = 5.0) -> Rollback.Response:
        """capsule_id None: from the live state; steps_back along that capsule's lineage."""
        return self.call("rollback", timeout_s, capsule_id=_none_id(capsule_id), steps_back=steps_back)

    def list_capsules(self, pinned_only: bool = False, timeout_s: float = 5.0) -> ListCapsules.Response:
        return self.call("list_capsules", timeout_s, pinned_only=pinned_only)

    def drop_capsule(self, capsule_id: int, timeout_s: float = 5.0) -> DropCapsule.Response:
        return self.call("drop_capsule", timeout_s, capsule_id=int(capsule_id))

    def export_capsule(self, file_name: str, capsule_id: int | None = None,
                       timeout_s: float = 10.0) -> ExportCapsule.Response:
        """capsule_id None: the live capsule. file_name is relative to the node's capsule_dir. ValueError for
        a name the node would refuse, and for a NUL, which the wire would silently cut the name at."""
        check_file_name(file_name)
        return self.call("export_capsule", timeout_s, capsule_id=_none_id(capsule_id), file_name=file_name)

    def import_capsule(self, file_name: str, restore: bool = False, timeout_s: float = 10.0) -> ImportCapsule.Response:
        check_file_name(file_name)  # as export_capsule
        return self.call("import_capsule", timeout_s, file_name=file_name, restore=restore)

    def reset(self, timeout_s: float = 5.0) -> Trigger.Response:
        return self.call("reset", timeout_s)

    def set_pin(self, capsule_id: int, pin: bool = True, timeout_s: float = 5.0):
        """The 'set_pin' service (newer nodes): pin or unpin a capsule; FlashRTTimeout if the node has none."""
        return self.call("set_pin", timeout_s, capsule_id=int(capsule_id), pin=bool(pin))

    def pin(self, capsule_id: int, timeout_s: float = 5.0):
        return self.set_pin(capsule_id, True, timeout_s)

    def unpin(self, capsule_id: int, timeout_s: float = 5.0):
        """Over the node's 'unpin' service, or 'set_pin' with pin=false; FlashRTTimeout if it has neither."""
        end = time.monotonic() + timeout_s  # one deadline for finding the service and its answer
        name = self._first_service(("unpin", "set_pin"), timeout_s)
        fields = {"capsule_id": int(capsule_id)} if name == "unpin" else {"capsule_id": int(capsule_id), "pin": False}
        return self.call(name, max(0.0, end - time.monotonic()), **fields)

    def _first_service(self, names: tuple[str, ...], timeout_s: float) -> str:
        end = time.monotonic() + timeout_s
        while True:
            present = dict(self.node.get_service_names_and_types())
            for name in names:
                if self.node.resolve_service_name(self._name(name)) in present:
                    return name
            if time.monotonic() > end:
                raise FlashRTTimeout(f"none of the services {names} available after {timeout_s} s")
            time.sleep(0.05)

    def _optional_client(self, name: str, timeout_s: float):
        if name not in self._optional:
            self._first_service((name,), timeout_s)
            full = self.node.resolve_service_name(self._name(name))
            pkg, _, type_name = dict(self.node.get_service_names_and_types())[full][0].split("/")
            srv_type = getattr(importlib.import_module(f"{pkg}.srv"), type_name)
            self._optional[name] = (self.node.create_client(srv_type, self._name(name)), srv_type)
        return self._optional[name]

    # ---- the Replan action ----------------------------------------------------------------
    def send_replan(self, observations, capsule_id: int | None = None, commit_branch: int | None = None,
                    deadline_ms: float | None = None, feedback_callback=None) -> ReplanTask:
        """Send a Replan goal and return at once. observations: [branches, horizon, obs_dim].
        capsule_id None: the live state; commit_branch None: what-if; deadline_ms None: the node's default."""
        obs = np.asarray(observations, np.float32)
        branches, horizon = (obs.shape[0], obs.shape[1]) if obs.ndim == 3 else (0, 0)
        goal = Replan.Goal(capsule_id=_none_id(capsule_id), branches=branches, horizon=horizon,
                           observations=obs.ravel().tolist(),
                           commit_branch=-1 if commit_branch is None else int(commit_branch),
                           deadline_ms=0.0 if deadline_ms is None else float(deadline_ms))
        return self.send_goal_async(goal, feedback_callback)

    def send_goal_async(self, goal: Replan.Goal, feedback_callback=None) -> ReplanTask:
        """A raw goal, as it goes on the wire."""
        return ReplanTask(self, goal, feedback_callback)

    def replan(self, observations, capsule_id: int | None = None, commit_branch: int | None = None,
               deadline_ms: float | None = None, timeout_s: float = 10.0) -> ReplanOutcome:
        """send_replan, then wait for the outcome (FlashRTTimeout if none within timeout_s)."""
        return self.send_replan(observations, capsule_id, commit_branch, deadline_ms).get_result(timeout_s)

    def send_goal(self, goal: Replan.Goal, timeout_s: float = 10.0) -> ReplanOutcome:
        """A raw goal, blocking."""
        return self.send_goal_async(goal).get_result(timeout_s)
