"""rclpy's ActionClient, made safe on a node that an executor spins on another thread (what FlashRTClient's
replan goals go through). Works around ros2/rclpy#1123 (https://github.com/ros2/rclpy/issues/1123: a goal, result
or cancel response taken before its future is registered; fixed upstream by ros2/rclpy#1308, backported in
#1517 / #1519) and the construction race below. FlashRTClient(thread_safe_actions=False), the node's
``thread_safe_action_client`` false, uses rclpy's own."""
from __future__ import annotations

import threading

from rclpy.action import ActionClient


class ThreadSafeActionClient(ActionClient):
    """rclpy's ActionClient, safe on a node that an executor spins on another thread.

    - Whole when an executor first looks at it. rclpy adds it to the node (which wakes that executor) before
      it makes its lock; the executor then raised AttributeError in get_num_entities and its spin thread
      died, so no answer reached the node again.
    - A response is never taken before its request's future is registered. rclpy sends a request, then
      registers the future its response completes: in some releases outside any lock (the Jazzy wheels
      here), in others once inside its lock and again after it (9.1). A response taken in that gap was
      dropped ("Ignoring unexpected goal response") or completed a future nobody held, and the replan ended
      in FlashRTTimeout. Sending and taking share one lock here, whatever the rclpy release does inside.
    - A goal leaves no future behind: the releases that register twice never complete the first future, so
      it stayed in the client's futures, which every wake of the client walks.
    """

    def __init__(self, *args, **kwargs):
        self._lock = threading.Lock()  # rclpy makes its own after joining the node; this one covers the gap
        self._exchange_lock = threading.Lock()  # a request's send and registration vs the executor's take
        super().__init__(*args, **kwargs)

    def take_data(self):
        with self._exchange_lock:
            return super().take_data()

    def send_goal_async(self, *args, **kwargs):
        with self._exchange_lock:
            futures = getattr(self, "_futures", [])  # rclpy's Waitable list (every release here and Humble's)
            before = list(futures)  # held, so no id below is reused while the call runs
            known = {id(f) for f in before}  # answered ones may leave the list meanwhile: compare by identity
            future = super().send_goal_async(*args, **kwargs)
            for orphan in [f for f in futures if id(f) not in known and f is not future]:
                self.remove_future(orphan)
            return future

    def _get_result_async(self, *args, **kwargs):
        with self._exchange_lock:
            return super()._get_result_async(*args, **kwargs)

    def _cancel_goal_async(self, *args, **kwargs):
        with self._exchange_lock:
            return super()._cancel_goal_async(*args, **kwargs)
