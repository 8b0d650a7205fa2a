"""Every file read from a path a user gave, checked for what it is and how big before a byte is read.

    text = read_text(path, field="cluster.calibration", max_bytes=CONFIG_FILE_MAX_BYTES,
                     fix="write one with `trainlab calibrate -o calibration.json`")
    check_file(path, field="data.path", max_bytes=..., fix=...)   # then np.memmap it
    with open_file(path, field="import-spill PATH", max_bytes=..., fix=...) as f:   # a stream

A path may name anything: a FIFO (reading it waits forever for a writer), a character device
(/dev/zero never ends), a directory, a socket, or a regular file far bigger than the input can
be. Each of these is refused with one InputFileError (a ValueError) naming the field or flag,
the path, what the path is, and the fix, before anything reads it. The file is opened with
O_NONBLOCK and checked again on the open descriptor, so a FIFO put in its place between the
check and the open cannot block either, and a read never takes more than the bound.
"""

from __future__ import annotations

import errno
import os
import stat

CONFIG_FILE_MAX_BYTES = 16 << 20
"""A JSON or YAML file a person or trainlab writes (a calibration, a trial record, a config,
checkpoint metadata): 16 MiB is thousands of times the largest one trainlab writes."""

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe): reading it waits for a writer"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class InputFileError(ValueError):
    """A file input is missing, not a regular file, unreadable or too big; the message says which.
    `what` is the middle of it ('is a directory, not a regular file'), for a caller's own words."""

    def __init__(self, where: str, what: str, fix: str):
        self.what = what
        super().__init__(f"{where} {what}; {fix}")

    def __reduce__(self):  # as it was raised, also where it is unpickled (a Ray worker's error)
        where, _, fix = str(self).partition(f" {self.what}; ")
        return type(self), (where, self.what, fix)


def size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


def _what(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def _where(path, field: str) -> str:
    return f"{field}={str(path)!r}" if not field.startswith("-") and " " not in field else f"{field} {str(path)!r}"


def check_stat(st: os.stat_result, path, *, field: str, fix: str, max_bytes: int | None) -> None:
    """InputFileError unless `st` is a regular file of at most `max_bytes` (None: no bound)."""
    where = _where(path, field)
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(where, f"is {_what(st.st_mode)}, not a regular file", fix)
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputFileError(where, f"is {st.st_size:,} bytes, more than the {size_text(max_bytes)} "
                                    "such a file may be", fix)


def _refuse_os_error(e: OSError, path, *, field: str, fix: str) -> InputFileError:
    where = _where(path, field)
    if e.errno == errno.ENOENT:
        return InputFileError(where, "does not exist", fix)
    if e.errno == errno.ENXIO:  # opening a socket file
        return InputFileError(where, "is a socket, not a regular file", fix)
    return InputFileError(where, f"cannot be read ({e.strerror or e})", fix)


def check_file(path, *, field: str, fix: str, max_bytes: int | None) -> int:
    """Check without reading (for a file np.memmap maps next); returns its size in bytes."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise _refuse_os_error(e, path, field=field, fix=fix) from None
    check_stat(st, path, field=field, fix=fix, max_bytes=max_bytes)
    return st.st_size


def open_file(path, *, field: str, fix: str, max_bytes: int | None, text: bool = False):
    """The file opened for reading, after checking the open descriptor itself (no race with a
    FIFO swapped in): a binary file object, or a UTF-8 text one with `text`."""
    check_file(path, field=field, fix=fix, max_bytes=max_bytes)  # the common refusals, before any open
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise _refuse_os_error(e, path, field=field, fix=fix) from None
    try:
        check_stat(os.fstat(fd), path, field=field, fix=fix, max_bytes=max_bytes)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "r" if text else "rb", encoding="utf-8" if text else None, closefd=True)  # noqa: SIM115


def read_bytes(path, *, field: str, fix: str, max_bytes: int = CONFIG_FILE_MAX_BYTES) -> bytes:
    """The whole file, at most `max_bytes` even if it grows while read (or reports size 0, as
    /proc files do)."""
    with open_file(path, field=field, fix=fix, max_bytes=max_bytes) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputFileError(_where(path, field), f"grew past {size_text(max_bytes)} while it was read", fix)
    return data


def read_text(path, *, field: str, fix: str, max_bytes: int = CONFIG_FILE_MAX_BYTES) -> str:
    """read_bytes decoded as UTF-8; InputFileError if it is not text."""
    data = read_bytes(path, field=field, fix=fix, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(_where(path, field), f"is not UTF-8 text (byte {e.start})", fix) from None
