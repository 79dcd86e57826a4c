"""The Fast DDS profile the node starts with (ros/platform/dds_profile.py): set only when the user chose nothing, and a
valid profile that changes the shared-memory segment and nothing about where traffic may go."""
import xml.etree.ElementTree as ET

import pytest

from flashrt_ros.ros.platform.dds_profile import SOURCE_PROFILE, default_fast_dds_ports, use_shipped_profile

NS = {"d": "http://www.eprosima.com"}


def test_nothing_chosen_points_fast_dds_at_the_shipped_profile():
    env = {}
    line = use_shipped_profile(env)
    assert env == {"FASTDDS_DEFAULT_PROFILES_FILE": str(SOURCE_PROFILE)}, env  # no deprecated name off Humble
    assert str(SOURCE_PROFILE) in line


def test_humble_also_gets_the_name_fast_dds_2_6_reads():
    env = {"ROS_DISTRO": "humble", "RMW_IMPLEMENTATION": "rmw_fastrtps_cpp"}
    use_shipped_profile(env)
    assert env["FASTDDS_DEFAULT_PROFILES_FILE"] == env["FASTRTPS_DEFAULT_PROFILES_FILE"] == str(SOURCE_PROFILE)


@pytest.mark.parametrize("env, says", [
    ({"FASTDDS_DEFAULT_PROFILES_FILE": "/etc/mine.xml"}, "yours"),
    ({"FASTRTPS_DEFAULT_PROFILES_FILE": "/etc/mine.xml"}, "yours"),
    ({"RMW_IMPLEMENTATION": "rmw_cyclonedds_cpp"}, "not Fast DDS"),
    ({"ROS_LOCALHOST_ONLY": "1"}, "ROS_LOCALHOST_ONLY"),
])
def test_a_users_choice_is_left_alone_and_the_log_line_says_why(env, says):
    before = dict(env)
    line = use_shipped_profile(env)
    assert env == before and says in line, (env, line)


@pytest.mark.parametrize("env, default_ports", [
    ({}, True),
    ({"RMW_IMPLEMENTATION": "rmw_fastrtps_cpp", "ROS_LOCALHOST_ONLY": "1"}, True),
    ({"FASTDDS_DEFAULT_PROFILES_FILE": "/etc/mine.xml"}, False),  # it may move the ports or name an id
    ({"FASTRTPS_DEFAULT_PROFILES_FILE": "/etc/mine.xml"}, False),
    ({"RMW_IMPLEMENTATION": "rmw_cyclonedds_cpp"}, False),
])
def test_dead_participant_ids_are_held_only_under_fast_dds_default_ports(env, default_ports):
    assert default_fast_dds_ports(env) is default_ports


def test_the_profile_only_enlarges_shared_memory_shortens_its_health_check_and_keeps_the_default_transports():
    root = ET.parse(SOURCE_PROFILE).getroot()
    descriptors = {d.findtext("d:transport_id", namespaces=NS): d
                   for d in root.iter(f"{{{NS['d']}}}transport_descriptor")}
    assert sorted(d.findtext("d:type", namespaces=NS) for d in descriptors.values()) == ["SHM", "UDPv4"]
    shm = next(d for d in descriptors.values() if d.findtext("d:type", namespaces=NS) == "SHM")
    assert int(shm.findtext("d:segment_size", namespaces=NS)) >= 3 * 4204800  # three default keyframes, and more
    # a live process standing still this long is judged dead and loses its traffic for seconds (250 ms did
    # at a loaded machine's hiccups); a send to a dead process's port waits this long inside publish
    assert 1000 <= int(shm.findtext("d:healthy_check_timeout_ms", namespaces=NS)) <= 2000
    udp = next(d for d in descriptors.values() if d.findtext("d:type", namespaces=NS) == "UDPv4")
    assert len(list(udp)) == 2, "the UDP transport is Fast DDS's default one (no ports, buffers or interfaces)"
    participant = root.find(".//d:participant", NS)
    assert participant.get("is_default_profile") == "true"
    used = [t.text for t in participant.iter(f"{{{NS['d']}}}transport_id")]
    assert sorted(used) == sorted(descriptors)
