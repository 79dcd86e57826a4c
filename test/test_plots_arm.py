"""The arm mission's figure (`flashrt-demo --plot`, tools/plots/arm.py) from a summary as the planner writes it."""
import pytest
from test_plots import assert_drawn

pytest.importorskip("matplotlib")
from flashrt_ros.tools.plots.arm import arm_trajectory  # noqa: E402


def _fault(start_s, end_s, committed):
    return {"kind": "noisy", "start_s": start_s, "end_s": end_s, "arrived_s": end_s + 0.1, "committed": committed,
            "hand_corrected": [[0.5 + 0.01 * k, -0.2 + 0.01 * k] for k in range(5)]}


def _summary(episodes: int) -> dict:
    hand = [[k / 100, 0.8 - 0.004 * k, -0.6 + 0.006 * k] for k in range(200)]
    return {"backend": "cpu", "successes": 1, "episodes": episodes, "replans_committed": 1, "corrections": 2,
            "per_episode": [{"episode": e, "success": e == 0, "success_s": 1.2 if e == 0 else None}
                            for e in range(episodes)],
            "trajectory": [{"episode": e, "goal": [0.45, -0.1], "object_start": [0.2, 0.05], "hand": hand,
                            "faults": [_fault(0.3, 0.4, True), _fault(1.0, 1.1, False)]} for e in range(episodes)]}


@pytest.mark.parametrize("episodes", [1, 3])
def test_arm_plot_draws_a_panel_per_episode_with_faults_corrections_and_commits(episodes, tmp_path):
    img = assert_drawn(arm_trajectory(_summary(episodes), tmp_path / "arm.png"))
    # one panel per episode, side by side: the figure widens with the episodes
    assert img.shape[1] > img.shape[0] * (1.5 if episodes == 3 else 0.6)


def test_arm_plot_of_a_summary_without_trajectory_says_so(tmp_path):
    with pytest.raises(ValueError, match="no trajectory"):
        arm_trajectory({"episodes": 0}, tmp_path / "arm.png")
    assert not (tmp_path / "arm.png").exists()
