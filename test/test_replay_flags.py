"""flashrt-replay takes the flags as `ros2 bag` spells them (-o/--output, --topics, -r/--rate, --start-offset),
and the earlier spellings still mean the same thing: same parse, same run, same refusals and exit codes."""
import pytest
from fixtures.make_bags import PERIOD_NS, T0_NS, trace, write_joint_bag
from fixtures.replay_cli import config_with, replay

from flashrt_ros.tools.replay.bags import read_policy_steps, typestore, write_joint_trace
from flashrt_ros.tools.replay.cli import _parser, check_bag_options

STEPS = 120


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    d = tmp_path_factory.mktemp("flags")
    return {"one": write_joint_trace(d / "one.mcap", "mcap", trace(STEPS), T0_NS, PERIOD_NS),
            "two_topics": write_joint_bag(d / "two_topics", "mcap", 40, extra_topics={"/other_joints":
                                                                                       "sensor_msgs/msg/JointState"})}


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    """The shipped config with a 32 MB store: the flags are the subject, and each replay faulted in its 512 MB."""
    return config_with(tmp_path_factory.mktemp("config"), capsule_budget_mb=32.0)


def parsed(*argv) -> dict:
    ap = _parser()
    args = ap.parse_args(["bag.mcap", *argv])
    check_bag_options(ap, args)
    return vars(args)


@pytest.mark.parametrize("new, old", [
    (["-o", "x"], ["--out", "x"]), (["--output", "x"], ["--out", "x"]),
    (["--topics", "/j"], ["--topic", "/j"]),
    (["--mode", "live", "-r", "2.5"], ["--mode", "live", "--rate", "2.5"]),
])
def test_each_ros2_bag_spelling_parses_exactly_as_the_old_one(new, old):
    assert parsed(*new) == parsed(*old)


def test_start_offset_defaults_to_the_whole_bag():
    assert parsed()["start_offset"] == 0.0 and parsed("--start-offset", "1.5")["start_offset"] == 1.5


def test_output_in_every_spelling_writes_the_same_bag(bags, cfg, tmp_path):
    runs = {}
    for flag in ("-o", "--output", "--out"):
        out = tmp_path / flag.strip("-")
        summary, _ = replay(bags["one"], flag, out, "--config", cfg, "--rollback-every", 40, "--rollback-depth", 10)
        assert summary["out"] == str(out) and summary["steps"] == STEPS
        steps = read_policy_steps(out, typestore())
        runs[flag] = ([(m.step, bytes(m.action.tobytes())) for m in steps],
                      {k: summary[k] for k in ("steps", "messages", "actions_sha256", "rollback_checks")})
    assert runs["-o"] == runs["--output"] == runs["--out"]


@pytest.mark.parametrize("flag", ["-o", "--output", "--out"])
def test_an_existing_output_is_refused_with_exit_2_in_every_spelling(bags, tmp_path, flag):
    out = tmp_path / "exists"
    out.mkdir()
    (out / "keep").write_bytes(b"mine")
    _, res = replay(bags["one"], flag, out, expect=2)
    assert "exists" in res.stderr and [p.name for p in out.iterdir()] == ["keep"]
    assert (out / "keep").read_bytes() == b"mine"


@pytest.mark.parametrize("flag", ["--topics", "--topic"])
def test_topics_and_topic_pick_the_same_observation_topic(bags, cfg, flag):
    summary, _ = replay(bags["two_topics"], flag, "/other_joints", "--config", cfg)
    assert summary["topic"] == "/other_joints" and summary["steps"] == 40


def test_more_than_one_topic_is_refused_naming_them(bags):
    _, res = replay(bags["two_topics"], "--topics", "/joint_states", "/other_joints", expect=2)
    assert "one observation topic" in res.stderr and "/joint_states /other_joints" in res.stderr


@pytest.mark.parametrize("flag", ["-r", "--rate"])
def test_a_negative_rate_is_refused_in_both_spellings(bags, flag):
    _, res = replay(bags["one"], flag, "-1", expect=2)
    assert "--rate" in res.stderr


def test_start_offset_starts_that_many_seconds_into_the_bag(bags, cfg, tmp_path):
    out = tmp_path / "late"
    summary, _ = replay(bags["one"], "--start-offset", "0.5", "-o", out, "--config", cfg)
    skipped = round(0.5e9 / PERIOD_NS)
    assert summary["skipped_before_start_offset"] == skipped and summary["steps"] == STEPS - skipped
    steps = read_policy_steps(out, typestore())
    first = steps[0].header.stamp
    assert first.sec * 10**9 + first.nanosec == T0_NS + skipped * PERIOD_NS


@pytest.mark.parametrize("offset, says", [("-1", "--start-offset"), ("nan", "--start-offset"),
                                          ("5", "skips every message")])
def test_a_start_offset_outside_the_bag_is_bad_input(bags, tmp_path, offset, says):
    out = tmp_path / "o"
    _, res = replay(bags["one"], "--start-offset", offset, "-o", out, expect=2)
    assert says in res.stderr and not out.exists()


def test_help_lists_the_ros2_bag_spellings_and_the_exit_codes():
    _, res = replay("--help")
    for flag in ("-o OUT", "--output", "--topics", "-r RATE", "--start-offset", "--jobs", "--ray", "exit codes:"):
        assert flag in res.stdout, flag


@pytest.mark.parametrize("flag", ["-r", "--rate"])
def test_a_rate_is_refused_offline_where_it_would_do_nothing(bags, tmp_path, flag):
    # offline replay steps every message as fast as the policy runs: -r was ignored without a word (issue 44.10)
    _, res = replay(bags["one"], flag, "2", "-o", tmp_path / "out", expect=2)
    assert "--rate (-r) paces --mode live only" in res.stderr and not (tmp_path / "out").exists()
    assert parsed("--mode", "live", flag, "2")["rate"] == 2.0 and parsed()["rate"] == 1.0
