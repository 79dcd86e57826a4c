"""`make mutate CHANGED=1` / `MODULES=...`: which mutations a change runs, from each mutation's own file and tests
(no second table), checked without running any."""
from __future__ import annotations

import importlib.util
import subprocess

import pytest
from mutations import MUTATIONS, Mutation

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("mutate_script", ROOT / "scripts" / "mutate.py")
mutate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutate)

A = Mutation("a_flipped", "pkg/ros/leader.py", "x < y", "x > y", ["test/test_leader.py"], "")
B = Mutation("b_removed", "pkg/ros/diagnostics.py", "warn()", "pass", ["test/test_diag.py::test_warns"], "")
C = Mutation("c_window", "pkg/persist/queue.py", "<=", "<", ["test/test_queue.py"], "")
ALL = [A, B, C]


def names(chosen) -> list[str]:
    return [m.name for m in chosen]


def test_nothing_selected_runs_every_mutation():
    assert names(mutate.select(ALL, [], [], None)) == ["a_flipped", "b_removed", "c_window"]


def test_a_change_runs_the_mutations_of_the_files_it_touched_and_only_those():
    assert names(mutate.select(ALL, [], [], {"pkg/ros/diagnostics.py", "README.md"})) == ["b_removed"]
    assert names(mutate.select(ALL, [], [], {"README.md"})) == []  # not every mutation: nothing


def test_a_changed_test_file_runs_the_mutations_it_must_catch():
    assert names(mutate.select(ALL, [], [], {"test/test_diag.py"})) == ["b_removed"]


def test_a_mutation_new_or_edited_in_the_list_runs_when_the_list_changed():
    edited = Mutation("c_window", C.file, C.old, "<= 1 +", C.tests, "")
    before = [A, B, C]
    chosen = mutate.select([A, B, edited], [], [], {mutate.LIST}, before)
    assert names(chosen) == ["c_window"]
    assert names(mutate.select(ALL, [], [], {mutate.LIST}, [A])) == ["b_removed", "c_window"]


def test_a_module_is_a_file_or_every_file_under_a_folder():
    assert names(mutate.select(ALL, [], ["pkg/persist/queue.py"], None)) == ["c_window"]
    assert names(mutate.select(ALL, [], ["pkg/ros"], None)) == ["a_flipped", "b_removed"]
    assert names(mutate.select(ALL, [], ["pkg/ros/"], None)) == ["a_flipped", "b_removed"]
    assert names(mutate.select(ALL, [], ["pkg/r"], None)) == []  # a folder is matched whole, not as a prefix


def test_selections_add_up_in_list_order():
    assert names(mutate.select(ALL, ["c_window"], ["pkg/ros/leader.py"], set())) == ["a_flipped", "c_window"]


def test_the_map_covers_every_mutation_of_the_real_list_by_its_file():
    for m in MUTATIONS:
        assert m in mutate.select(MUTATIONS, [], [], {m.file})


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path):
    """main with three files, then a branch `work` from it; main moves on after the branch point."""
    _git(tmp_path, "init", "-q", "-b", "main")
    for f in ("kept.py", "edited.py", "staged.py"):
        (tmp_path / f).write_text(f"# {f}\n")
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "mutations.py").write_text(
        "from dataclasses import dataclass\n\n\n@dataclass(frozen=True)\nclass Mutation:\n    name: str\n"
        "    file: str\n    old: str\n    new: str\n    tests: list\n    why: str\n\n\n"
        "MUTATIONS = [Mutation('kept', 'kept.py', 'a', 'b', ['test/t.py'], '')]\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "base")
    _git(tmp_path, "checkout", "-q", "-b", "work")
    (tmp_path / "edited.py").write_text("# edited and committed\n")
    _git(tmp_path, "commit", "-q", "-am", "on the branch")
    _git(tmp_path, "checkout", "-q", "main")
    (tmp_path / "kept.py").write_text("# changed on main after the branch point\n")
    _git(tmp_path, "commit", "-q", "-am", "main moves on")
    _git(tmp_path, "checkout", "-q", "work")
    (tmp_path / "staged.py").write_text("# staged\n")
    _git(tmp_path, "add", "staged.py")
    (tmp_path / "new.py").write_text("# untracked, not ignored\n")
    (tmp_path / ".gitignore").write_text("ignored.py\n")
    (tmp_path / "ignored.py").write_text("# ignored\n")
    return tmp_path


def test_changed_files_are_the_branchs_own_changes_since_the_merge_base_committed_or_not(repo):
    # kept.py changed on main only: not this branch's change
    assert mutate.changed_files("main", cwd=repo) == {"edited.py", "staged.py", "new.py", ".gitignore"}


def test_the_list_before_a_change_is_read_from_the_merge_base(repo):
    (before,) = mutate.mutations_at("main", cwd=repo)
    assert mutate.entry(before) == ("kept", "kept.py", "a", "b", ("test/t.py",))
