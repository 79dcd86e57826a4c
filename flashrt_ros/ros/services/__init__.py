"""What planners call: the capsule services (capsules.py), the Replan action server (replan.py), the gate that
refuses both while the node is not active (state_gate.py), and the directory capsule files live in
(capsule_dir.py). A new service: its handler in capsules.py (state_gate.py refuses every handler while the node
is not active), and its client method in client/api.py."""
