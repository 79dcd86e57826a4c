"""Service handlers of the flashrt node. Every error becomes success=false with a message; nothing
raises into the executor, and a failed request leaves the live state as it was."""
from __future__ import annotations

import time
from pathlib import Path

from builtin_interfaces.msg import Time
from std_srvs.srv import Trigger

from flashrt_interfaces.msg import CapsuleInfo
from flashrt_interfaces.srv import DropCapsule, ExportCapsule, ImportCapsule, ListCapsules, Rollback, Snapshot

from ..runtime.errors import CapsuleError
from .convert import capsule_info_to_msg, safe_relative_path

EXPECTED = (CapsuleError, ValueError, OSError)


def info_msg(info) -> CapsuleInfo:
    return capsule_info_to_msg(info, CapsuleInfo, Time)


class CapsuleServices:
    """Creates and owns the node's services (created on activate, destroyed on deactivate)."""

    def __init__(self, node):
        self.node = node
        self.handles = [
            node.create_service(Snapshot, "snapshot", self.snapshot),
            node.create_service(Rollback, "rollback", self.rollback),
            node.create_service(ListCapsules, "list_capsules", self.list_capsules),
            node.create_service(DropCapsule, "drop_capsule", self.drop_capsule),
            node.create_service(ExportCapsule, "export_capsule", self.export_capsule),
            node.create_service(ImportCapsule, "import_capsule", self.import_capsule),
            node.create_service(Trigger, "reset", self.reset),
        ]

    def destroy(self) -> None:
        for h in self.handles:
            self.node.destroy_service(h)
        self.handles = []

    @property
    def session(self):
        return self.node.session

    def _fail(self, response, what: str, err: Exception):
        response.success = False
        response.message = f"{what} failed: {err}"
        self.node.get_logger().warning(response.message)
        return response

    def _path(self, file_name: str) -> Path:
        root = Path(self.node.get_parameter("capsule_dir").value).expanduser()
        return root / safe_relative_path(file_name)

    def snapshot(self, request, response):
        try:
            info = self.session.snapshot(request.label, request.pin, stamp_ns=self.node.last_stamp_ns)
        except EXPECTED as e:
            return self._fail(response, "snapshot", e)
        response.success, response.message, response.capsule = True, f"capsule {info.id}", info_msg(info)
        return response

    def rollback(self, request, response):
        t0 = time.perf_counter()
        try:
            info = self.session.rollback(request.capsule_id or None, int(request.steps_back))
        except EXPECTED as e:
            return self._fail(response, "rollback", e)
        response.elapsed_ms = (time.perf_counter() - t0) * 1e3
        response.success, response.message = True, f"capsule {info.id} (step {info.step}) is live"
        response.capsule = info_msg(info)
        return response

    def list_capsules(self, request, response):
        with self.session.lock:  # one consistent view while the replan worker changes the store
            capsules = self.session.list_capsules(pinned_only=request.pinned_only)
            usage = self.session.store_usage()
            response.live_capsule_id = self.session.live_capsule_id
        response.capsules = [info_msg(i) for i in capsules]
        response.bytes_used = usage.bytes_used
        response.bytes_budget = usage.budget_bytes
        return response

    def drop_capsule(self, request, response):
        try:
            self.session.drop(request.capsule_id)
        except EXPECTED as e:
            return self._fail(response, "drop_capsule", e)
        response.success, response.message = True, f"capsule {request.capsule_id} dropped"
        return response

    def export_capsule(self, request, response):
        try:
            path = self._path(request.file_name)
            path.parent.mkdir(parents=True, exist_ok=True)
            response.sha256 = self.session.export_capsule(request.capsule_id or self.session.live_capsule_id, path)
        except EXPECTED as e:
            return self._fail(response, "export_capsule", e)
        response.success, response.message = True, f"wrote {path}"
        return response

    def import_capsule(self, request, response):
        try:
            info = self.session.import_capsule(self._path(request.file_name), restore=request.restore)
        except EXPECTED as e:
            return self._fail(response, "import_capsule", e)
        response.success = True
        response.message = f"imported as capsule {info.id}" + (" (live)" if request.restore else "")
        response.capsule = info_msg(info)
        return response

    def reset(self, request, response):
        self.session.reset()
        response.success, response.message = True, "policy state reset to zeros; capsules kept"
        return response
