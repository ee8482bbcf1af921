"""An open file of a dataset mount, as the handlers (``kernel_ops``) keep it: a DatasetFile, its
inode, a lock serialising its reads, and the last read failure.

After a failed read-ahead the kernel reads the one page the caller needs at once (a smaller read
inside it): :meth:`Handle.repeat_failure` answers it from the failure just seen, instead of
waiting for the UFS client's retries again, for ``RETRY_WINDOW`` seconds and once only (in
no-open mode a handle outlives the open, and a new open's read is a new try).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

RETRY_WINDOW = 2.0  # seconds a failed read range answers its errno again without a new UFS try
INODE_READERS = 64  # no-open mode: per-inode Readers kept (their blocks count against the budget)


@dataclass
class Handle:
    """``file``: a ``datacache.reader.DatasetFile``; ``lock``: a ``threading.Lock`` serialising
    its reads; ``failed``: ``(monotonic time, offset, size, errno)``
    of the last failed read."""

    file: object
    inode: int
    lock: object
    failed: tuple = ()

    def repeat_failure(self, offset: int, size: int) -> int | None:
        """The errno to answer a read of ``size`` bytes at ``offset`` with at once (a smaller read
        inside a range that failed less than ``RETRY_WINDOW`` seconds ago), or None to read."""
        if not self.failed:
            return None
        when, f_off, f_size, code = self.failed
        if time.monotonic() - when < RETRY_WINDOW and f_off <= offset < f_off + f_size and size < f_size:
            self.failed = ()
            return code
        return None

    def record_failure(self, offset: int, size: int, code: int) -> int:
        """Remember that the read of ``size`` bytes at ``offset`` failed with errno ``code``."""
        self.failed = (time.monotonic(), offset, size, code)
        return code
