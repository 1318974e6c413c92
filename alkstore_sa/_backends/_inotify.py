"""Linux inotify through ctypes: the SQLite watcher sleeps until a file of the database
changes (a commit appends to the -wal file) instead of polling. Absent elsewhere."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
_HEADER = struct.Struct("iIII")


class DirectoryWatch:
    """Readable file descriptor that fires when a file named in ``names`` changes."""

    def __init__(self, directory: str, names: set[str]) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        mask = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
        if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
            os.close(fd)
            raise OSError(ctypes.get_errno(), f"inotify_add_watch failed for {directory}")
        self.fd = fd
        self._names = {os.fsencode(n) for n in names}

    def relevant(self) -> bool:
        """Drain pending events; True if any concerned one of our files."""
        hit = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return hit
            offset = 0
            while offset + _HEADER.size <= len(data):
                _wd, _mask, _cookie, length = _HEADER.unpack_from(data, offset)
                start = offset + _HEADER.size
                name = data[start : start + length].rstrip(b"\0")
                hit = hit or name in self._names
                offset = start + length

    def close(self) -> None:
        os.close(self.fd)


def directory_watch(db_path: str) -> DirectoryWatch | None:
    """A watch on the database's directory, or None where inotify is unavailable."""
    if not hasattr(os, "O_CLOEXEC") or not os.path.exists("/proc/sys/fs/inotify"):
        return None
    base = os.path.basename(db_path)
    try:
        return DirectoryWatch(os.path.dirname(db_path) or ".", {base, base + "-wal"})
    except OSError:
        return None
