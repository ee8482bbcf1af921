"""Python runtime plugins: an entry point in group ``datacache.runtimes`` that opens a mount.

The whole API is one function, registered under a name::

    [project.entry-points."datacache.runtimes"]
    myfs = "mypackage.myfs:open_myfs"

    def open_myfs(url: str, options: dict, secret_files: dict[str, str]) -> fsspec.AbstractFileSystem

``url`` is the mount's ``mountPoint``; ``options`` are the profile's, the ThinRuntime's and the
mount's options, later ones winning (strings, numbers, booleans); ``secret_files`` maps each
``encryptOptions`` name to the path of a file holding the secret (see :mod:`.secretfiles`). The
mount's root inside the returned filesystem is ``fs._strip_protocol(url)``. Anything fsspec can
read works: an existing implementation, or a small ``AbstractFileSystem`` with ``ls``, ``info`` and
``cat_file`` (``runtimes/README.md`` has one). Put a version in ``info`` (``ETag`` or
``version_id``) if the store has one; otherwise files are versioned by size and mtime.

A plugin is used by a ThinRuntimeProfile (``plugin: myfs``) or, for a scheme fsspec does not know,
by any mount whose URL starts with ``myfs://``. Errors: a missing or broken plugin, or options it
rejects (``ValueError``/``TypeError``), raise ``ResourceError``; a store it cannot reach raises
``UFSUnavailableError`` (EIO), as any other UFS would.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Callable

import fsspec

from datacache.ufs.schemes import RUNTIME_PLUGIN_GROUP
from datacache.errors import ResourceError, UFSUnavailableError
from datacache.ufs.secretfiles import secret_files

Plugin = Callable[[str, dict, dict], fsspec.AbstractFileSystem]


def load_plugin(name: str, who: str) -> Plugin:
    """The callable registered as ``name`` in group ``datacache.runtimes``; ``who`` starts messages.

    Raises ``ResourceError`` naming the installed plugins when there is none of that name, or with
    the import error (e.g. a missing extra) when it cannot be loaded.
    """
    found = [ep for ep in entry_points(group=RUNTIME_PLUGIN_GROUP) if ep.name == name]
    if not found:
        names = sorted(entry_points(group=RUNTIME_PLUGIN_GROUP).names)
        raise ResourceError(f"{who}: no runtime plugin named {name!r} is installed (installed: "
                            f"{', '.join(names) or 'none'}); install the package that provides it")
    try:
        return found[0].load()
    except (ImportError, AttributeError) as err:
        raise ResourceError(f"{who}: runtime plugin {name!r} ({found[0].value}) cannot be loaded: "
                            f"{err} (for the sftp plugin: pip install 'datacache[sftp]')") from None


def open_plugin_mount(name: str, mount, home: str, where: str, base_options: dict[str, Any] | None = None,
                      who: str | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """Open ``mount`` (a ``datacache.api`` Mount) with plugin ``name``: returns ``(fs, root)``.

    ``base_options`` (profile and runtime options) are overridden by the mount's own; ``where``
    locates the mount and ``who`` (default: the plugin) the caller in messages. Raises as the
    module docstring says.
    """
    who = who or f"runtime plugin {name!r}"
    plugin = load_plugin(name, who)
    options = {**(base_options or {}), **mount.options}
    files = secret_files(mount, home, where)
    try:
        fs = plugin(mount.mount_point, options, files)
    except (ValueError, TypeError) as err:
        raise ResourceError(f"{where}: {who} refused the mount: {err}") from None
    except Exception as err:  # a network stack's own error types, OSError included
        raise UFSUnavailableError(mount.mount_point, f"{who}: {type(err).__name__}: {err}") from None
    if not isinstance(fs, fsspec.AbstractFileSystem):
        raise ResourceError(f"{where}: {who} returned {type(fs).__name__}, not an fsspec filesystem")
    return fs, fs._strip_protocol(mount.mount_point)
