"""The capsule directory: where export_capsule writes and import_capsule reads, and nowhere else.

A client names a file, never a path: one component of a conservative character set (convert.
check_file_name). The directory is created with mode 0700, a directory owned by another user is
refused, and a name whose final path leaves the directory (a symbolic link planted inside it) is
refused on export and import alike.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from ..runtime.capsule_file import sweep_stale_temporaries
from .convert import check_file_name


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
        if create and not self.root.exists():
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            st = os.lstat(self.root)
        except FileNotFoundError:
            raise CapsuleDirError(f"capsule_dir {self.root} does not exist (nothing exported yet)") from None
        if not stat.S_ISDIR(st.st_mode):
            raise CapsuleDirError(f"capsule_dir {self.root} is not a directory")
        if st.st_uid != os.geteuid():
            raise CapsuleDirError(f"capsule_dir {self.root} is owned by uid {st.st_uid}, not by this node's "
                                  f"user ({os.geteuid()}): refused")
        return self.root

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
