"""The nav2 example launch file brings flashrt up under nav2's lifecycle manager with bonds off (flashrt makes
no bond: with nav2's default bond_timeout the manager aborts the bring-up after 4 s)."""
import ast

from conftest import ROOT

SOURCE = (ROOT / "launch" / "flashrt_nav2.launch.py").read_text()
TREE = ast.parse(SOURCE)


def _constant(name):
    return next(ast.literal_eval(n.value) for n in TREE.body
                if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == name for t in n.targets))


def _dict_with_key(key):
    return next(n for n in ast.walk(TREE) if isinstance(n, ast.Dict)
                and any(isinstance(k, ast.Constant) and k.value == key for k in n.keys))


def test_the_manager_has_bonds_off_and_brings_the_node_up():
    assert _constant("BOND_TIMEOUT_S") == 0.0
    params = _dict_with_key("bond_timeout")
    values = dict(zip([k.value for k in params.keys], params.values))
    assert isinstance(values["bond_timeout"], ast.Name) and values["bond_timeout"].id == "BOND_TIMEOUT_S"
    assert ast.literal_eval(values["autostart"]) is True


def test_flashrt_is_included_unconfigured_so_the_manager_drives_its_transitions():
    args = _dict_with_key("params_file")  # the include's launch arguments
    values = {k.value: v for k, v in zip(args.keys, args.values)}
    assert ast.literal_eval(values["autostart"]) == "false"
    assert '"flashrt.launch.py"' in SOURCE and "nav2_lifecycle_manager" in SOURCE
