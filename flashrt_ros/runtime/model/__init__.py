"""The network as data: config, buffer table, op list, kernel specs and NumPy twins, the plan.

Re-exports nothing: import from the module itself."""
