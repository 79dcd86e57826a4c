"""The --plot figures.

Re-exports nothing: import from the module itself."""
