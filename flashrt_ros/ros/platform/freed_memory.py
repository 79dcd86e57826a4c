"""Works around glibc malloc's dynamic mmap threshold and heap trimming (glibc 2.35 / 2.39): every large block
goes back to the kernel and is faulted in afresh; off: the node's ``keep_freed_memory`` false.

Keep freed heap memory mapped in the node's process (glibc's mallopt), so that the capsule stream's
keyframes (a few 4 MiB buffers each: the record's bytes, the message, the RMW's copy, and on a replica the
same on the way in) reuse pages instead of faulting in fresh ones every time.

Why: glibc serves large blocks with mmap (or trims the heap top back to the kernel) and every new block then
faults its pages in one by one; this VM does that at ~120-190 MB/s, so encoding one keyframe took 12-14 ms
with fresh pages against ~2.5-3 ms with reused ones (in-process, 4 MiB), and the records queued behind each
keyframe arrived late. Cost: up to TRIM_THRESHOLD of freed memory per arena stays resident.
"""
from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # malloc.h
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest on 64-bit: blocks below it come from the heap
TRIM_THRESHOLD = 64 * 2**20  # freed memory at a heap's top kept up to this much (a keyframe's buffers: ~20 MiB)


def keep_freed_memory() -> str:
    """Set the two thresholds where the C library is glibc (the node's ``keep_freed_memory``); one line for the
    log either way."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "freed memory: C library defaults (no mallopt: not glibc)"
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "freed memory: glibc defaults (mallopt refused the thresholds)"
    return (f"freed memory: blocks under {MMAP_THRESHOLD >> 20} MiB from the heap, up to {TRIM_THRESHOLD >> 20} MiB "
            "of it kept mapped (keyframes reuse pages instead of faulting in new ones)")
