"""The capsule directory: where export_capsule writes and import_capsule reads, and nowhere else.

A client names a file, never a path: one component of a conservative character set (convert.
check_file_name). The directory follows runtime/state/private_dir.py's rules (created with mode 0700; one
owned by another user, or writable by group or others, is refused), a name whose final path leaves the
directory (a symbolic link planted inside it) is refused on export and import alike, and the directory
may not overlap persist_dir (an export could overwrite the open log segment).
"""
from __future__ import annotations

import os
from pathlib import Path

from ...runtime.state.capsule_file import sweep_stale_temporaries
from ...runtime.state.private_dir import check_private_dir, overlapping
from ..io.convert import check_file_name


class CapsuleDirError(ValueError):
    pass


class CapsuleDir:
    def __init__(self, directory: str):
        if not directory or not directory.strip():
            raise CapsuleDirError("capsule_dir must not be empty")
        # Resolved once, at configure: later changes of the working directory or of links above it
        # do not move where capsules go.
        self.root = Path(os.path.realpath(Path(directory).expanduser()))

    def _checked_root(self, create: bool) -> Path:
        if not create and not os.path.lexists(self.root):
            raise CapsuleDirError(f"capsule_dir {self.root} does not exist (nothing exported yet)")
        return check_private_dir(self.root, "capsule_dir", create, CapsuleDirError)

    def refuse_overlap(self, persist_dir: str) -> None:
        """At configure: the capsule files and the capsule log in one tree would let an export overwrite
        a log segment or a pin file, and a resume read an exported file as part of the log."""
        if persist_dir and overlapping(self.root, Path(persist_dir).expanduser()):
            raise CapsuleDirError(f"capsule_dir {self.root} and persist_dir {persist_dir} overlap (one is, or is "
                                  "inside, the other): give each its own directory")

    def sweep_stale_temporaries(self) -> list[Path]:
        """Remove what exports killed mid-write left (``.<name>.<pid>.tmp`` of dead processes)."""
        try:
            return sweep_stale_temporaries(self._checked_root(create=False))
        except CapsuleDirError:
            return []  # none yet, or not ours: nothing of ours to sweep

    def path_for(self, file_name: str, create: bool = False) -> Path:
        """The file's path inside the directory; CapsuleDirError (a ValueError) if it would be anywhere
        else. ``create``: make the directory (0700) if it is missing (exports)."""
        check_file_name(file_name)
        root = self._checked_root(create)
        path = root / file_name
        if path.is_symlink():
            raise CapsuleDirError(f"{file_name} in capsule_dir is a symbolic link: refused (capsule files are "
                                  "regular files inside capsule_dir)")
        if Path(os.path.realpath(path)).parent != root:
            raise CapsuleDirError(f"{file_name} resolves outside capsule_dir {root}: refused")
        return path
