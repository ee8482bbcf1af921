"""Errors at the FUSE boundary: Python exceptions to errno values, in one table.

The core raises ``OSError`` subclasses that carry an errno (JuiceFS/s3fs style), so the boundary
only passes ``err.errno`` through: ENOENT stays ENOENT (case C8, C4), ESTALE stays ESTALE (case C5),
and EIO means a real read failure (the UFS cannot serve a block that is not cached). Exceptions
built without an errno (``FileNotFoundError("...")``) are mapped by type, so a missing path never
turns into EIO. Anything else is a bug: it is logged with its traceback and answered with EIO, so
a request never hangs and the daemon keeps serving.
"""

from __future__ import annotations

import errno
import functools
import logging

import pyfuse3

from datacache_fuse.kernel.errors import errno_of as kernel_errno_of

log = logging.getLogger("datacache_fuse")


def errno_of(err: BaseException) -> int:
    """The errno to answer the kernel with for ``err`` (EIO when nothing better is known)."""
    if isinstance(err, pyfuse3.FUSEError):
        return err.errno
    return kernel_errno_of(err)


def translated(fn):
    """Decorate an ``async`` FUSE handler so that it raises only ``pyfuse3.FUSEError``.

    pyfuse3 accepts no other exception from a handler (another one would end the main loop).
    """

    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except OSError as err:
            code = errno_of(err)
            if code == errno.EIO:
                log.warning("%s: EIO: %s", fn.__name__, err)
            else:
                log.debug("%s: %s: %s", fn.__name__, errno.errorcode.get(code, code), err)
            raise pyfuse3.FUSEError(code) from None
        except Exception:
            log.exception("%s failed unexpectedly; answering EIO", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper
