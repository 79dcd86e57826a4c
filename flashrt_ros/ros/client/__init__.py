"""What a planner uses to talk to a flashrt node: FlashRTClient (api.py), the replan task and its outcome
(task.py); action_client.py holds the rclpy action client made thread-safe, apart from the task API."""
from .api import RESEND_AFTER_S, FlashRTClient
from .task import FlashRTTimeout, ReplanOutcome, ReplanTask

__all__ = ["RESEND_AFTER_S", "FlashRTClient", "FlashRTTimeout", "ReplanOutcome", "ReplanTask"]
