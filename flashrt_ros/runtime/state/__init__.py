"""The state store: KV log, capsule store, capsule files, sizing, bounds, history, step undo.

Re-exports nothing: import from the module itself."""
