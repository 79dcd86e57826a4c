"""The node's messages: observations in (convert.py), actions and trajectories out (outputs.py), the policy_step
link (step_link.py: its QoS and a client's handshake; policy_step.py: the writer and its history), QoS profiles
(qos.py), /diagnostics (diagnostics.py) and the counters behind it (stats.py)."""
