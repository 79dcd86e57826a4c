"""What the node does about its platform: the Fast DDS, CPython and glibc workarounds, each naming the upstream
behaviour it works around and the node parameter that turns it off, and the Linux scheduling of the node's
threads. The rclpy action-client workaround lives with the client (client/action_client.py)."""
