"""Works around Fast DDS's default 512 KiB shared-memory segment (Fast DDS 2.6 on Humble, 2.14 on Jazzy, 3.x),
which carries a 4 MiB keyframe in pieces; off: the node's ``use_shipped_dds_profile`` false.

The Fast DDS profile a flashrt node starts with: config/fastdds.xml, a 16 MiB shared-memory segment
(Fast DDS's default is 512 KiB) so that a capsule stream keyframe (4 MiB at the default model) reaches a
replica in ~9 ms instead of ~50 ms (measured on this machine; the XML says why). Its shared-memory health
check stays at Fast DDS's 1 s, on purpose (the XML says why: a shorter one cost live but stalled processes
their traffic).

Set before rclpy.init, only when the user chose nothing: neither profile variable is set, the RMW is Fast
DDS (the default), and ROS_LOCALHOST_ONLY is not 1. That last one is Humble's localhost switch, which adds
its own loopback-only UDP transport beside a profile's transports instead of replacing them: with this
profile the node would listen on every interface, so it is skipped there (keyframes are only slower).
ROS_AUTOMATIC_DISCOVERY_RANGE (Iron and later) sets discovery peers on top of any profile and still holds.
"""
from __future__ import annotations

import os
from pathlib import Path

PROFILE_VARS = ("FASTDDS_DEFAULT_PROFILES_FILE", "FASTRTPS_DEFAULT_PROFILES_FILE")  # Fast DDS 3 / 2.x (Humble)
FASTDDS_RMWS = ("", "rmw_fastrtps_cpp", "rmw_fastrtps_dynamic_cpp")
SOURCE_PROFILE = Path(__file__).resolve().parents[3] / "config" / "fastdds.xml"


def shipped_profile() -> Path | None:
    """config/fastdds.xml of the source tree, or share/flashrt_ros/config of an install."""
    if SOURCE_PROFILE.is_file():
        return SOURCE_PROFILE
    try:
        from ament_index_python.packages import get_package_share_directory
        share = Path(get_package_share_directory("flashrt_ros")) / "config" / "fastdds.xml"
        return share if share.is_file() else None
    except Exception:  # noqa: BLE001 - not installed through ament
        return None


def default_fast_dds_ports(environ=os.environ) -> bool:
    """Fast DDS with its default port formula: the RMW is Fast DDS and no profile of the user's could change
    the formula (or name a participant id). Read before use_shipped_profile sets the variable."""
    return environ.get("RMW_IMPLEMENTATION", "") in FASTDDS_RMWS and not any(environ.get(v) for v in PROFILE_VARS)


def use_shipped_profile(environ=os.environ) -> str:
    """Point Fast DDS at the shipped profile unless the user chose otherwise. Returns one line for the log."""
    chosen = next((v for v in PROFILE_VARS if environ.get(v)), None)
    if chosen:
        return f"DDS profile: {chosen}={environ[chosen]} (yours)"
    rmw = environ.get("RMW_IMPLEMENTATION", "")
    if rmw not in FASTDDS_RMWS:
        return f"DDS profile: none set ({rmw} is not Fast DDS)"
    if environ.get("ROS_LOCALHOST_ONLY") == "1":
        return ("DDS profile: none set (ROS_LOCALHOST_ONLY=1 would keep a profile's transports on every interface); "
                "capsule stream keyframes travel in 512 KiB shared-memory pieces, more slowly")
    path = shipped_profile()
    if path is None:
        return "DDS profile: none set (config/fastdds.xml not found)"
    environ["FASTDDS_DEFAULT_PROFILES_FILE"] = str(path)
    if environ.get("ROS_DISTRO") == "humble":  # Fast DDS 2.6 reads the old name; newer RMWs warn that it is deprecated
        environ["FASTRTPS_DEFAULT_PROFILES_FILE"] = str(path)
    return f"DDS profile: {path} (16 MiB shared-memory segment, for the capsule stream's keyframes)"


__all__ = ["PROFILE_VARS", "default_fast_dds_ports", "shipped_profile", "use_shipped_profile"]
