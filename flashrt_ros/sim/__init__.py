"""flashrt-sim: a simulated 7-joint arm (MuJoCo) with a scripted expert, as a ROS node and a bag recorder."""
