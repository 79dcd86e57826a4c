"""flashrt-replay and the bag readers/writers.

Re-exports nothing: import from the module itself."""
