"""flashrt-bench.

Re-exports nothing: import from the module itself."""
