"""Whether a file may decide what devplug runs or gives containers: only when nobody but
its owner and root can change it (the rule of sshd's StrictModes).

The file, and every folder on the way to it from `/` (of the path as given and of the
path its links lead to), must be owned by root or by devplug's own user, and writable
by neither its group nor others. A folder such as /tmp that others may write but whose
sticky bit stops them renaming or removing what they do not own is fine on the way to
the file (not as the folder whose files are read); so is anything on a read-only mount
(a ConfigMap volume: its folder is 0777, but nobody writes there).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def write_problem(path: str | os.PathLike[str], *, folder_read: bool = False) -> str | None:
    """Why others than root and its owner could change `path` (one line ending in the
    fix), or None. `folder_read`: `path` is a folder whose files are all read, so its
    sticky bit does not help (anyone could add a file to it). A path that does not
    exist is no problem here: reading it says so."""
    given = Path(os.path.abspath(path))
    resolved = Path(os.path.realpath(given))
    me = os.geteuid()
    seen: set[Path] = set()
    for chain in (given, resolved):
        for place in (chain, *chain.parents):
            if place in seen:
                continue
            seen.add(place)
            try:
                st = os.lstat(place)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue  # a link's own mode means nothing; its folder and target count
            if st.st_uid not in (0, me):
                return (
                    f"{place} is owned by uid {st.st_uid}, not by root or devplug's user, "
                    f"who alone may change what devplug runs: run `chown root {place}`"
                )
            if not st.st_mode & WRITABLE_BY_OTHERS:
                continue
            target = place == chain
            sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
            if sticky and not (target and folder_read):
                continue
            if _read_only_mount(place):
                continue
            who = " and ".join(
                w
                for w, bit in (("its group", stat.S_IWGRP), ("others", stat.S_IWOTH))
                if st.st_mode & bit
            )
            return (
                f"{place} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}), who "
                f"could change what devplug runs: run `chmod go-w {place}`"
            )
    return None


def program_problem(program: str) -> str | None:
    """`write_problem` of the program an exec of `program` runs (a name is looked up
    on PATH as the exec would); None when there is no such program here (running it
    says so)."""
    found = program if "/" in program else shutil.which(program)
    return write_problem(found) if found else None


def _read_only_mount(place: Path) -> bool:
    try:
        return bool(os.statvfs(place).f_flag & os.ST_RDONLY)
    except OSError:
        return False
