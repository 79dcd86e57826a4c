"""Runs a plan: the numpy and cuda backends, the CUDA launch table, NVRTC, the capture check.

Re-exports nothing: import from the module itself."""
