#!/usr/bin/env bash
# Build flashrt_interfaces (ament_cmake) with plain cmake into the venv prefix, no colcon needed.
# See ../shared/notes/ros-on-pypi.md. Usage: scripts/build_interfaces.sh VENV_DIR BUILD_DIR
set -euo pipefail
V="$(cd "$1" && pwd)"
B="$2"
mkdir -p "$(dirname "$B")"  # its logs go beside it
PY="$V/bin/python"
py_inc="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
np_inc="$("$PY" -c 'import numpy; print(numpy.get_include())')"
# The ROS wheels' exported CMake files name the wheel builder's Python; point them at this venv's.
{ grep -rlE '/opt/python/cp[0-9]+-cp[0-9]+/' "$V/share" --include='*.cmake' 2>/dev/null || true; } | while read -r f; do
  sed -i -E "s#/opt/python/cp[0-9]+-cp[0-9]+/include/python[0-9.]+#${py_inc}#g; s#/opt/python/cp[0-9]+-cp[0-9]+/lib/python[0-9.]+/site-packages/numpy/_core/include#${np_inc}#g" "$f"
done
export PATH="$V/bin:$PATH"
cmake -S flashrt_interfaces -B "$B" -DCMAKE_PREFIX_PATH="$V" -DCMAKE_INSTALL_PREFIX="$V" \
  -DPython3_EXECUTABLE="$PY" -DBUILD_TESTING=OFF -DCMAKE_BUILD_TYPE=Release > "$B.configure.log" 2>&1 \
  || { cat "$B.configure.log"; exit 1; }
cmake --build "$B" -j2 > "$B.build.log" 2>&1 || { tail -50 "$B.build.log"; exit 1; }
cmake --install "$B" > /dev/null
"$PY" -c 'from flashrt_interfaces.msg import PolicyStep; from flashrt_interfaces.action import Replan; print("flashrt_interfaces: built and importable")'
