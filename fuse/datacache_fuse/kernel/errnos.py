"""Errors at the kernel boundary: Python exceptions to errno values, in one table.

The core raises ``OSError`` subclasses that carry an errno, so the boundary passes ``err.errno``
through (ENOENT stays ENOENT, ESTALE stays ESTALE, EIO is a real read failure). Exceptions built
without an errno (``FileNotFoundError("...")``) are mapped by type, so a missing path never turns
into EIO. Anything else is a bug: the caller logs it and answers EIO.
"""

from __future__ import annotations

import errno

#: errno for OSError subclasses raised without one (checked in order: subclasses first).
BY_TYPE: tuple[tuple[type[BaseException], int], ...] = (
    (FileNotFoundError, errno.ENOENT),
    (NotADirectoryError, errno.ENOTDIR),
    (IsADirectoryError, errno.EISDIR),
    (PermissionError, errno.EACCES),
    (TimeoutError, errno.ETIMEDOUT),
)


def errno_of(err: BaseException) -> int:
    """The errno to answer the kernel with for ``err`` (EIO when nothing better is known)."""
    if isinstance(err, OSError) and err.errno:
        return err.errno
    for kind, code in BY_TYPE:
        if isinstance(err, kind):
            return code
    return errno.EIO
