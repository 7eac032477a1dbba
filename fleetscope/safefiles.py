"""Files and directories Fleetscope creates, and paths it builds from input: one place for both rules.

Modes. Everything Fleetscope writes under its data directory (the SQLite database, reports, exports,
keys, the agent's spool, kept uploads, the Celery broker's files) is private to the account that runs
it: files ``0600``, directories ``0700``. The mode is set on the open descriptor (``fchmod``) or right
after ``mkdir``, so it does not depend on the process umask, which can only take bits away and which
a service manager may set to anything (POSIX.1-2017 ``umask()``, ``open()``: the mode given to
``open``/``mkdir`` is masked by it).

Containment. A path built from input (a model name, a format, a file name in a request) goes through
:func:`contained`, which refuses absolute parts, ``..`` and ``.``, empty parts, NUL, names over
``MAX_NAME_BYTES`` and paths over ``MAX_PATH_BYTES``, then resolves symbolic links and checks the
result is still inside the base directory (the traversal of CWE-22 and the link following of CWE-59).

Reading. :func:`open_regular` opens an input file without following a symbolic link in its last
component (``O_NOFOLLOW``) and without blocking on a FIFO (``O_NONBLOCK``), and refuses anything that
is not a regular file: a FIFO would hang the reader, a device would be read without end.

Pure apart from the file system calls it exists for: no database, network or clock.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from fleetscope.core.errors import FleetscopeError

FILE_MODE = 0o600
DIR_MODE = 0o700
# Linux's NAME_MAX and PATH_MAX (limits.h): longer names fail in open() anyway, with a less clear error.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096


class UnsafePathError(FleetscopeError, ValueError):
    """A path built from input would leave its base directory, or is not a name a file may have."""


class NotRegularFileError(FleetscopeError, ValueError):
    """An input path that is a symbolic link (not followed) or not a regular file (FIFO, device, socket)."""


def contained(base: Path | str, *parts: str, what: str = "path") -> Path:
    """``base`` joined with ``parts`` (each may hold ``/``-separated names), checked to stay inside ``base``.

    ``what`` names the input in the error (e.g. ``"model name"``). Raises :class:`UnsafePathError` for an
    absolute part, a ``..``, ``.`` or empty name, a NUL, a name over ``MAX_NAME_BYTES`` or a whole path
    over ``MAX_PATH_BYTES`` bytes, and for a path whose existing symbolic links lead outside ``base``.
    """
    root = Path(base).resolve()
    names: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise UnsafePathError(f"{what}: expected text, got {type(part).__name__}")
        if "\x00" in part:
            raise UnsafePathError(f"{what} {_show(part)} contains a NUL byte")
        if part.startswith("/"):
            raise UnsafePathError(f"{what} {_show(part)} is an absolute path; only names inside {root} are allowed")
        for name in part.split("/"):
            if name in ("", ".", ".."):
                why = "an empty name" if not name else f"a {name!r} component"
                raise UnsafePathError(f"{what} {_show(part)} has {why}; only plain names inside {root} are allowed")
            if len(os.fsencode(name)) > MAX_NAME_BYTES:
                raise UnsafePathError(f"{what} {_show(part)}: a name is longer than {MAX_NAME_BYTES} bytes")
            names.append(name)
    if not names:
        raise UnsafePathError(f"{what}: no name given")
    path = root.joinpath(*names)
    if len(os.fsencode(str(path))) > MAX_PATH_BYTES:
        raise UnsafePathError(f"{what} {_show('/'.join(names))}: the path would be longer than {MAX_PATH_BYTES} bytes")
    # Links already on disk are followed here, so one planted inside base cannot lead out of it.
    real = path.resolve()
    if real != root and root not in real.parents:
        raise UnsafePathError(f"{what} {_show('/'.join(names))} leads outside {root} (through a symbolic link, to {real})")
    return path


def _show(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def private_dir(path: Path | str) -> Path:
    """``mkdir -p path``: every directory this call creates gets ``DIR_MODE``; existing ones are left as they are."""
    path = Path(path)
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:
            if not d.is_dir():
                raise
            continue  # another process made it at the same moment: it set its own mode
        os.chmod(d, DIR_MODE)
    if not path.is_dir():
        raise NotADirectoryError(f"{path} exists and is not a directory")
    return path


def write_private(path: Path | str, data: bytes, *, exclusive: bool = False) -> Path:
    """Write ``data`` to ``path`` with ``FILE_MODE`` (parent directories created with ``DIR_MODE``).

    Replaces an existing file (its mode is reset to ``FILE_MODE``) unless ``exclusive``, which raises
    ``FileExistsError`` instead. A symbolic link at ``path`` is never written through (``O_NOFOLLOW``).
    """
    path = Path(path)
    private_dir(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    return path


def create_private(path: Path | str) -> bool:
    """Create ``path`` empty with ``FILE_MODE`` if it does not exist (for files another library then opens:
    SQLite copies its database file's mode to the ``-wal`` and ``-shm`` files it creates beside it).
    True when this call created it."""
    path = Path(path)
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return True


def open_private_append(path: Path | str) -> BinaryIO:
    """``open(path, "ab")`` for a log file, created with ``FILE_MODE``."""
    path = Path(path)
    private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def open_regular(path: Path | str, *, follow_symlinks: bool = False) -> BinaryIO:
    """Open an input file for reading, refusing a symbolic link (unless ``follow_symlinks``) and anything
    that is not a regular file, with :class:`NotRegularFileError` naming the path and what it is."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:  # O_NOFOLLOW met a link as the last component
            raise NotRegularFileError(f"{path}: a symbolic link, not followed (--follow-symlinks reads what it points to)") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(f"{path}: {kind_of(mode)}, not a regular file; not read")
        # Regular files never block; the flag only kept open() from waiting on a FIFO's writer.
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def kind_of(mode: int) -> str:
    """What a file is, from its ``st_mode``, in words for an error or a note."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"
