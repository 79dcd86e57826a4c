"""A node's part in a group of flashrt nodes (issue 18): its role (roles.py, the standby takeover included), the
primary's capsule stream (stream.py), the replica (replica.py) and the standby (standby.py, with the observations
it holds, held_observations.py, and its own stalls, stall_clock.py), and who leads the robot (leader.py)."""
