"""flashrt-demo and the processes of its mission.

Re-exports nothing: import from the module itself."""
