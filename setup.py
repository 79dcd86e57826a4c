from glob import glob

from setuptools import find_packages, setup

package_name = "flashrt_ros"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + package_name]),
        ("share/" + package_name, ["package.xml"]),
        ("share/" + package_name + "/launch", glob("launch/*.launch.py")),
        ("share/" + package_name + "/config", glob("config/*.yaml") + glob("config/*.xml")),
        ("share/" + package_name + "/config/policies", glob("config/policies/*.safetensors")),
        ("share/" + package_name + "/kernels", glob("kernels/*.cu") + glob("kernels/*.cuh")),
    ],
    # Supported ranges (JetPack 6 / Humble: Python 3.10 with numpy 1.x, up to Python 3.13 with numpy 2);
    # the dev venvs' exact versions are in constraints*.txt. cupy-cuda12x is optional (backend: cuda), matplotlib
    # too (--plot).
    python_requires=">=3.10",
    install_requires=["setuptools", "numpy>=1.21,<3", "pyyaml>=5.4", "safetensors>=0.4"],
    extras_require={"cuda": ["cupy-cuda12x"], "replay": ["rosbags>=0.11"], "plot": ["matplotlib>=3.5"],
                    "ray": ["ray>=2.9"],
                    # flashrt-sim: the MuJoCo arm (Gymnasium's Pusher model file); the runtime never imports it
                    "sim": ["mujoco>=3.3,<4", "gymnasium>=1.0", "rosbags>=0.11"],
                    # flashrt-train and the PyTorch reference module (flashrt_ros.train); the runtime never imports it
                    "train": ["torch>=2.1", "rosbags>=0.11", "matplotlib>=3.5"]},
    classifiers=[f"Programming Language :: Python :: 3.{minor}" for minor in range(10, 14)],
    zip_safe=True,
    maintainer="flashrt maintainers",
    maintainer_email="flashrt@example.com",
    description="ROS 2 host for a CUDA-graph policy runtime with execution-state capsules",
    license="Apache-2.0",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "flashrt_node = flashrt_ros.ros.main:main",
            "flashrt_command_gate = flashrt_ros.ros.command_gate:main",
            "flashrt-bench = flashrt_ros.tools.bench.cli:main",
            "flashrt-demo = flashrt_ros.tools.demo.cli:main",
            "flashrt-replay = flashrt_ros.tools.replay.cli:main",
            "flashrt-train = flashrt_ros.train.cli:main",
            "flashrt-sim = flashrt_ros.sim.cli:main",
        ],
    },
)
