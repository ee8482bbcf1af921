"""``datacache mount`` and ``datacache unmount``: plain click commands.

The ``datacache`` group adds them with ``main.add_command(datacache_fuse.cli.mount)`` and
``main.add_command(datacache_fuse.cli.unmount)``; ``python -m datacache_fuse`` runs them alone.
User mistakes (no such dataset, a live mount in the way, no FUSE) print one message and exit 1,
without a traceback.
"""

from __future__ import annotations

import contextlib
import os

import click

from datacache import mountinfo
from datacache_fuse.daemon import MountError, check_empty, log_path, make_mountpoint, read_state, serve
from datacache_fuse.launcher import daemon_argv, start_background, supervise
from datacache_fuse.launcher import unmount as _unmount
from datacache.mountinfo import MountState


_NO_OPEN = {"auto": None, "passthrough": False, "no-open": True}  # --read-mode -> serve(no_open=)


def _home(home: str | None) -> str:
    from datacache.state import default_home

    return os.path.abspath(home or default_home())


def _user_errors():
    from datacache.errors import DatacacheError

    return (MountError, DatacacheError, mountinfo.UnmountError)


class _UserError(click.ClickException):
    """A user mistake: ``error: ...`` on stderr, exit 1, as every other ``datacache`` command."""

    def show(self, file=None) -> None:
        from datacache.errors import error_lines

        click.echo(error_lines(self.format_message()), err=True)


def _check_dataset(home: str, dataset: str, namespace: str, mountpoint: str, options=()) -> list[str] | None:
    """Raise ``ResourceError`` (one line, with the fix) unless ``dataset`` exists with a runtime,
    and what its first sync raises when it was never synced (it is synced here, before anything
    is started or created). Returns the command of the runtime's own mount client (a
    JuiceFSRuntime's ``juicefs mount``), or None when datacache's FUSE daemon serves it."""
    from datacache.control.embedded import read_path
    from datacache.errors import ResourceError

    paths = read_path(home)
    try:
        ds = paths.get("Dataset", dataset, namespace)
        runtime = paths.runtime_for(ds)
        if runtime is None:
            raise ResourceError(f"dataset {namespace}/{dataset} has no CacheRuntime: apply a CacheRuntime "
                                f"(or ThinRuntime, JuiceFSRuntime) named {dataset!r} in namespace {namespace!r} to "
                                f"mount it")
        engine = paths.engine(runtime)
        if engine.reads_through_datacache:
            paths.synced_manifest(ds)
            _warn_missing_secrets(ds, home)
        return engine.mount_argv(ds, mountpoint, options)
    finally:
        paths.close()


def _warn_missing_secrets(ds, home: str) -> None:
    """A warning on stderr for each secret of ``ds``'s mounts that cannot be resolved: the mount
    still serves what is cached (the daemon opens the UFS on its first miss), but every read of
    the rest fails with EIO until the secret is given."""
    from datacache.ufs.credentials import unresolved_secrets

    for i, m in enumerate(ds.spec.mounts):
        for missing in unresolved_secrets(m, home, f"dataset {ds.metadata.name!r}: spec.mounts[{i}]"):
            click.echo(f"warning: {missing}; until then only cached blocks can be read, other reads fail with EIO",
                       err=True)


@click.command()
@click.argument("dataset")
@click.argument("mountpoint")  # not click.Path: it would stat the path, which hangs on a hung mount
@click.option("-n", "--namespace", default="default", show_default=True, help="Namespace of the dataset.")
@click.option("--background", is_flag=True,
              help="Run the daemon detached; return once the mount answers.")
@click.option("--restart", is_flag=True,
              help="Supervise the daemon and re-mount by itself when it dies.")
@click.option("--home", type=click.Path(file_okay=False), default=None,
              help="DATACACHE_HOME (default: $DATACACHE_HOME or ~/.local/share/datacache).")
@click.option("-o", "--option", "options", multiple=True, metavar="OPT[,OPT...]",
              help="FUSE mount option (e.g. allow_other); repeatable.")
@click.option("--debug", is_flag=True, help="Log every FUSE request (to the log file and stderr).")
@click.option("--allow-nonempty", is_flag=True,
              help="Mount over a directory that has entries (they are hidden while mounted).")
@click.option("--read-mode", type=click.Choice(["auto", "passthrough", "no-open"]), default="auto", show_default=True,
              help="passthrough: a file handle per open, complete files passed through to the kernel (reads "
                   "never reach the daemon); no-open: the kernel opens files without asking the daemon (a warm "
                   "small-file epoch costs it nothing); auto: passthrough when files over 4 MiB (and one "
                   "block) hold at least half of the dataset's bytes.")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="With --background: seconds to wait for the mount to answer.")
@click.option("--record", is_flag=False, flag_value="", default=None, metavar="[RUN]",
              help="Write the access trace of this run (files in first-read order, with their sizes) under the "
                   "dataset, for 'datacache warmup DATASET --from-trace RUN'; RUN defaults to the time.")
def mount(dataset, mountpoint, namespace, background, restart, home, options, debug, allow_nonempty, read_mode,
          timeout, record):
    """Mount DATASET read-only at MOUNTPOINT through FUSE.

    Runs in the foreground until unmounted (Ctrl-C or 'datacache unmount MOUNTPOINT'), unless
    --background is given. A dataset of a JuiceFSRuntime is mounted by 'juicefs mount' (its
    client, supervised as with --restart). A missing MOUNTPOINT is created (mode 0700, with its parents). A dead
    mount left by a killed daemon is detected and replaced. Logs go to $DATACACHE_HOME/logs/.
    """
    home = _home(home)
    mountpoint = mountinfo.canonical(mountpoint)
    logfile = log_path(home, dataset, namespace, mountpoint)
    try:
        if record is not None:  # named once: a restarted daemon goes on with the same trace
            from datacache.plan.trace import run_name

            record = run_name(record)
        # a daemon's own refusal would only reach its log
        client = _check_dataset(home, dataset, namespace, mountpoint, options)
        if client is not None and not background:  # the engine's own client, always supervised
            if mountinfo.probe(mountpoint) is MountState.LIVE:
                raise MountError(f"{mountpoint} is already mounted: run 'datacache unmount {mountpoint}' first")
            from datacache_fuse.daemon import setup_logging

            setup_logging(logfile, debug=debug)
            raise SystemExit(supervise(client, mountpoint))
        if background:
            state = mountinfo.probe(mountpoint)
            if state is MountState.LIVE:
                raise MountError(f"{mountpoint} is already mounted: run 'datacache unmount {mountpoint}' first")
            created = False
            if state is MountState.NONE:  # here too: the daemon's refusals would only reach its log
                created = make_mountpoint(mountpoint)
                if not allow_nonempty:
                    check_empty(mountpoint)
            argv = daemon_argv(dataset, mountpoint, namespace=namespace, home=home, options=options,
                               debug=debug, restart=restart, allow_nonempty=allow_nonempty,
                               read_mode=read_mode, record=record)
            try:
                pid = start_background(argv, mountpoint, logfile, timeout)
            except MountError:
                if created:  # nothing left behind by a mount that did not happen
                    with contextlib.suppress(OSError):
                        os.rmdir(mountpoint)
                raise
            what = "supervisor" if restart else "daemon"
            click.echo(f"mounted {namespace}/{dataset} at {mountpoint} ({what} pid {pid}, log {logfile})")
            state = read_state(home, mountpoint)
            if state and state.get("readMode"):
                click.echo(f"read mode: {state['readMode']}")
        elif restart:
            from datacache_fuse.daemon import setup_logging

            setup_logging(logfile, debug=debug)
            argv = daemon_argv(dataset, mountpoint, namespace=namespace, home=home, options=options, debug=debug,
                               allow_nonempty=allow_nonempty, read_mode=read_mode, record=record)
            raise SystemExit(supervise(argv, mountpoint))
        else:
            serve(dataset, mountpoint, namespace=namespace, home=home, options=options, debug=debug,
                  allow_nonempty=allow_nonempty, no_open=_NO_OPEN[read_mode], announce=click.echo, record=record)
    except _user_errors() as err:
        raise _UserError(str(err)) from None


@click.command()
@click.argument("mountpoint")  # not click.Path: it would stat the path, which hangs on a hung mount
@click.option("--home", type=click.Path(file_okay=False), default=None,
              help="DATACACHE_HOME (to find the daemon and wait for it).")
@click.option("--wait", "wait_s", type=float, default=5.0, show_default=True,
              help="Seconds to wait for the daemon to exit (it stays while files are open elsewhere).")
def unmount(mountpoint, home, wait_s):
    """Unmount the datacache FUSE mount at MOUNTPOINT, lazily.

    The path is free at once even while files on it are open elsewhere; those keep reading until
    closed, then the daemon exits. A dead mount (ENOTCONN) is removed too.
    """
    try:
        click.echo(_unmount(mountpoint, _home(home), wait_s))
    except _user_errors() as err:
        raise _UserError(str(err)) from None
