"""Training side (optional: ``pip install .[train]``): the PyTorch reference module of the network
(reference.py) and behaviour cloning from rosbag2 bags (flashrt-train). Nothing outside this package imports it,
and only the modules that say so import torch."""
