"""flashrt_ros: a ROS 2 host for a CUDA-graph policy runtime with execution-state capsules."""
__version__ = "0.1.0"
