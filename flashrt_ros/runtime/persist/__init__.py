"""Crash-resume: the record format, the writer thread, resume, the Session glue (attach).

Re-exports nothing: import from the module itself."""
