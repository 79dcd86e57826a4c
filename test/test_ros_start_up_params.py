"""The parameters read before rclpy.init (the Fast DDS workarounds run before the node exists): -p, else the last
params file that sets one, else its default, as rcl resolves them later."""
from __future__ import annotations

import yaml

from flashrt_ros.ros.declare import params_files, start_up_value


def _params_file(path, **values):
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": values}}))
    return str(path)


def test_a_start_up_parameter_is_its_default_when_nothing_sets_it():
    assert start_up_value(["flashrt_node", "--ros-args"], "flashrt", "hold_dead_participant_ids") is True


def test_the_last_params_file_that_sets_it_wins_over_earlier_ones(tmp_path):
    first = _params_file(tmp_path / "a.yaml", use_shipped_dds_profile=False)
    second = _params_file(tmp_path / "b.yaml", kv_window=64)
    third = _params_file(tmp_path / "c.yaml", use_shipped_dds_profile=True)
    argv = ["n", "--ros-args", "--params-file", first, "--params-file", second]
    assert params_files(argv) == [first, second]
    assert start_up_value(argv, "flashrt", "use_shipped_dds_profile") is False
    assert start_up_value([*argv, "--params-file", third], "flashrt", "use_shipped_dds_profile") is True


def test_a_command_line_value_wins_over_the_params_file(tmp_path):
    path = _params_file(tmp_path / "a.yaml", hold_dead_participant_ids=True)
    argv = ["n", "--ros-args", "--params-file", path, "-p", "hold_dead_participant_ids:=false"]
    assert start_up_value(argv, "flashrt", "hold_dead_participant_ids") is False
    other_node = ["n", "--ros-args", "-p", "other:hold_dead_participant_ids:=false"]
    assert start_up_value(other_node, "flashrt", "hold_dead_participant_ids") is True


def test_an_unreadable_file_or_a_wrong_value_leaves_the_default_for_rclpy_and_configure_to_report(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("{not: yaml: at all")
    argv = ["n", "--ros-args", "--params-file", str(broken), "--params-file", str(tmp_path / "missing.yaml")]
    assert start_up_value(argv, "flashrt", "use_shipped_dds_profile") is True
    wrong = ["n", "--ros-args", "-p", "use_shipped_dds_profile:=maybe"]
    assert start_up_value(wrong, "flashrt", "use_shipped_dds_profile") is True
