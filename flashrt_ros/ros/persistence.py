"""The capsule log of a configure (persist_dir): started, and resumed when asked, before the node steps."""
from __future__ import annotations

from pathlib import Path

from ..runtime.errors import FingerprintMismatch
from ..runtime.persist.format import LogCorrupt
from ..runtime.persist.writer import PersistSettings
from ..runtime.session import Session


def start_persistence(session: Session, own: dict, logger) -> str:
    """The capsule log in persist_dir, resumed when asked. Returns what was resumed ("" = nothing);
    raises ValueError naming the parameter when it cannot start."""
    if not own["persist_dir"]:
        if own["resume"]:
            raise ValueError("resume: true needs persist_dir (the directory of the capsule log)")
        return ""
    directory = Path(own["persist_dir"]).expanduser()
    settings = PersistSettings(directory, own["persist_fsync_records"], own["persist_fsync_ms"],
                               own["persist_segment_mb"], own["persist_budget_mb"], own["persist_queue_mb"])
    try:
        report = session.enable_persistence(settings, resume=own["resume"],
                                            fresh_on_mismatch=own["resume_fresh_on_mismatch"])
    except FingerprintMismatch as e:
        raise ValueError(f"{e}. Point persist_dir elsewhere, or set resume_fresh_on_mismatch:=true to move "
                         "that log aside and start fresh") from None
    except LogCorrupt as e:
        raise ValueError(f"resume refused, no torn state is loaded: {e}") from None
    mismatch_moved = session.persistence.mismatch_moved
    if mismatch_moved is not None:
        logger.warning(f"persist_dir {directory}: the log was written by another config, weights or "
                                  f"plan; moved to {mismatch_moved}, starting fresh")
    moved = getattr(session.persistence, "moved_aside", None)
    if moved is not None:
        logger.warning(f"persist_dir {directory}: the old log (resume off, or one this runtime "
                                  f"cannot continue) was moved to {moved}, where no resume reads it")
    if report is None:
        logger.info(f"persisting capsules to {directory} (resume off: starting fresh)")
        return ""
    if not report.capsule_id and not report.capsules:  # (a reset before the crash: capsules, none live)
        logger.info(f"resume: no capsule log in {directory} yet, starting fresh")
        return ""
    logger.info(f"{report.summary()}; persisting to {directory}")
    return report.summary()
