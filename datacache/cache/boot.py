"""``boot_mark()``: a number naming this boot of the machine, for checks done once per boot.

A cache file handed out whole is checked once, then trusted: the disk tier
(:mod:`datacache.cache.disk`) and the file tier (:mod:`datacache.cache.filetier`) record in their
index the mark of the boot in which a file was checked, so that the other processes of that boot
(DataLoader workers, later runs) do not read it again, while after a power loss (a new boot) a
file the kernel had not finished writing is found.
"""

from __future__ import annotations

import functools
import uuid

BOOT_ID = "/proc/sys/kernel/random/boot_id"  # a random UUID the kernel draws at each boot


@functools.cache
def boot_mark() -> int:
    """This boot's mark: 62 bits of the kernel's ``boot_id``, never 0 or 1 (the marks of files
    never checked and of files checked in an earlier layout); a process-unique number where
    ``boot_id`` cannot be read, so that every process checks for itself there."""
    try:
        with open(BOOT_ID) as f:
            mark = int(f.read().strip().replace("-", ""), 16) >> 66
    except (OSError, ValueError):
        mark = uuid.uuid4().int >> 66
    return mark | 2
