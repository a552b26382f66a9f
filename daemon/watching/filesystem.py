"""Which filesystem a run root lives on, to choose between inotify and polling.

inotify reports only what this host's kernel writes: a trainer on another node writing to NFS, Lustre or
GPFS produces no events here, so on those filesystems ``watch_mode = "auto"`` polls (the rescan alone).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Filesystem types whose writes by other hosts inotify never sees.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "glusterfs",
        "9p",
        "afs",
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.juicefs",
        "wekafs",
        "panfs",
    }
)
MOUNTS = Path("/proc/self/mounts")


def _unescape(field: str) -> str:
    # /proc/mounts escapes spaces, tabs, newlines and backslashes in octal.
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def fstype_of(path: Path, mounts_text: str) -> str | None:
    """The type of the filesystem holding ``path``, from the text of /proc/self/mounts (pure)."""
    target = str(path)
    best, best_type = "", None
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        mount_point = _unescape(fields[1])
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, fields[2]
    return best_type


def is_network(path: Path) -> bool:
    """Whether ``path`` is on a filesystem other hosts may write to unseen (I/O edge)."""
    try:
        text = MOUNTS.read_text(encoding="utf-8")
    except OSError:
        return False
    # realpath, not Path.resolve: a root that is a symlink loop raises RuntimeError there on 3.11, which
    # ended the start (or a reload) with a traceback.
    fstype = fstype_of(Path(os.path.realpath(path)), text)
    return fstype is not None and fstype in NETWORK_FILESYSTEMS
