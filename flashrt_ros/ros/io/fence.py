"""Fencing tokens (issue 44, point 2; docs/leadership.md): the leader's epoch travels with every command, so a
consumer that has seen epoch e drops anything from an older one, whatever a stalled old leader still sends.

- ``policy_step`` (flashrt_interfaces/PolicyStep): its ``epoch`` field.
- ``action`` (std_msgs/Float64MultiArray): a second layout dimension after the joints one, label
  ``flashrt_epoch=<e>``, size 1, stride 1 (the layout then reads as an action_dim x 1 array: the same values,
  and forward_command_controller reads only ``data``).
- ``action_trajectory`` (trajectory_msgs/JointTrajectory): ``header.frame_id`` is ``flashrt_epoch=<e>``
  (joint_trajectory_controller does not read it; a joint trajectory has no frame).

A command without a fence (0) comes from no flashrt leader: the gate (command_gate.py) drops it.
"""
from __future__ import annotations

FENCE_PREFIX = "flashrt_epoch="


def fence_label(epoch: int) -> str:
    return f"{FENCE_PREFIX}{int(epoch)}"


def parse_fence(label: str) -> int:
    """The epoch of a fence label; 0 when ``label`` is none."""
    if not label.startswith(FENCE_PREFIX):
        return 0
    digits = label[len(FENCE_PREFIX):]
    return int(digits) if digits.isdigit() and len(digits) <= 20 else 0


def action_epoch(msg) -> int:
    """The epoch a Float64MultiArray action carries (0: none)."""
    dims = msg.layout.dim
    return parse_fence(dims[1].label) if len(dims) == 2 else 0


def trajectory_epoch(msg) -> int:
    return parse_fence(msg.header.frame_id)


class EpochFence:
    """Admits a command of the newest epoch seen or a newer one (which then becomes the newest)."""

    def __init__(self):
        self.newest = 0
        self.dropped = 0

    def admit(self, epoch: int) -> bool:
        if epoch <= 0 or epoch < self.newest:
            self.dropped += 1
            return False
        self.newest = epoch
        return True
