"""Exceptions of datacache.

Lower layers raise ``OSError`` subclasses carrying an errno (as JuiceFS and s3fs do), so that the
FUSE boundary can re-raise ``err.errno`` unchanged and Python callers get the built-in exception
types they already catch (``FileNotFoundError`` for a missing path, never a bare ``OSError``).
User mistakes raise :class:`ConfigError` or :class:`ResourceError`: the CLI prints their message
and exits non-zero, without a traceback.
"""

from __future__ import annotations

import errno
import re


class DatacacheError(Exception):
    """Base class of datacache's own errors that are not ``OSError``."""


class ConfigError(DatacacheError, ValueError):
    """A resource document is wrong.

    ``str(err)`` is one line per problem: ``SOURCE: field.path: problem (fix)``.
    Attributes: ``source`` (file name or label), ``problems`` (list of ``(field_path, message)``).
    """

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = list(problems)
        lines = [f"{source}: {path}: {msg}" if path else f"{source}: {msg}" for path, msg in problems]
        super().__init__("\n".join(_printable(line) for line in lines))


def _printable(text: str) -> str:
    """``text`` with control characters escaped (``\\r``, ``\\x00``): a hostile document's
    field names and values can then neither split one problem over lines nor forge log lines."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # C0, DEL, C1, line/paragraph separators


class ResourceError(DatacacheError):
    """A named resource is missing or in a state that forbids the request (e.g. no runtime bound)."""


class SecretNotFound(ResourceError):
    """A secret reference has no value here (neither its environment variable nor its file): the
    request needs it; the resource itself may be fine (another shell or node has it)."""


class StaleFileError(OSError):
    """The file changed in the UFS since its manifest entry was taken (errno ESTALE).

    Raised instead of returning bytes of another version; a metadata sync (or re-opening the file
    after the automatic per-file refresh) reads the new version.
    """

    def __init__(self, path: str, detail: str):
        super().__init__(errno.ESTALE, f"{detail}; run 'datacache sync' or re-open the file", path)


class UFSUnavailableError(OSError):
    """The UFS could not serve a block that is not cached (errno EIO): outage, timeout, 5xx."""

    def __init__(self, path: str, detail: str):
        super().__init__(errno.EIO, f"UFS read failed and the block is not cached: {detail}", path)


def error_lines(text: str) -> str:
    """``text`` as the CLI prints a failure: ``error: `` before each of its lines (a resource file
    with three mistakes is three ``error:`` lines, not one and two bare ones)."""
    return "\n".join(f"error: {line}" for line in text.splitlines() or [""])


def describe_error(err: BaseException) -> str:
    """One line for an expected error: an ``OSError``'s file and reason, else its text."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.filename + ': ' if err.filename else ''}{err.strerror}"
    return str(err)
