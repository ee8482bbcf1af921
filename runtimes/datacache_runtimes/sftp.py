"""SFTP as a runtime plugin (profile ``plugin: sftp``): fsspec's sftp filesystem over paramiko.

fsspec reads SFTP already; this plugin adds what a long-running cache needs:

- secrets as files: ``key_filename`` is passed as the path it is; ``password`` and ``passphrase``
  are read from their files;
- host keys pinned by option ``known_hosts`` (a file in OpenSSH format; unknown keys are refused).
  Without it the first key a process sees is trusted, as fsspec and paramiko's AutoAddPolicy do;
- bounded calls: connecting waits at most ``timeout`` seconds (default 10), an SFTP request 60 s;
- one SSH connection per thread: paramiko's ``SFTPClient`` is not safe for concurrent requests
  from several threads (a thread waiting for its answer may consume another's), and warmup reads in
  parallel. Connections of threads that have ended are closed when a new one is opened;
- the URL's path taken literally (see :mod:`.sshurl`); no keys from ``~/.ssh`` or an agent.

Options: ``username``, ``port``, ``known_hosts``, ``timeout``. SFTP has no ETag: a file's version
is its size and mtime (whole seconds), so a rewrite of the same size within one second is not
seen by a sync.
"""

from __future__ import annotations

import threading

import paramiko
from fsspec.implementations.sftp import SFTPFileSystem

from datacache_runtimes.sshurl import parse

OPTIONS = frozenset({"username", "port", "known_hosts", "timeout"})
SECRETS = frozenset({"key_filename", "password", "passphrase"})
REQUEST_TIMEOUT = 60.0  # seconds an SFTP request may wait for its answer


def open_sftp(url: str, options: dict, secret_files: dict[str, str]) -> "ThreadedSFTPFileSystem":
    """The plugin: a filesystem for ``sftp://[user@]host[:port]/path``.

    Raises ``ValueError`` for a bad URL or an option it does not know, and paramiko's or the
    socket's errors when the server cannot be reached or refuses the credentials.
    """
    loc = parse(url)
    unknown = sorted(set(options) - OPTIONS) + sorted(set(secret_files) - SECRETS)
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} (options: {', '.join(sorted(OPTIONS))}; "
                         f"secrets in encryptOptions: {', '.join(sorted(SECRETS))})")
    kwargs = {"port": loc.port or 22, "username": loc.username, "timeout": 10.0, **options}
    for name, path in secret_files.items():
        kwargs[name] = path if name == "key_filename" else _read(path)
    return ThreadedSFTPFileSystem(loc.host.strip("[]"), **kwargs)


class ThreadedSFTPFileSystem(SFTPFileSystem):
    """fsspec's SFTPFileSystem with one SSH connection per thread (see the module docstring)."""

    def __init__(self, host: str, known_hosts: str | None = None, **ssh_kwargs):
        self.known_hosts = known_hosts
        timeout = ssh_kwargs.get("timeout", 10.0)
        ssh_kwargs = {"banner_timeout": timeout, "auth_timeout": timeout, "look_for_keys": False,
                      "allow_agent": False, **ssh_kwargs}
        super().__init__(host, **ssh_kwargs)

    @classmethod
    def _strip_protocol(cls, path):
        return parse(path).path if "://" in path else path

    def _connect(self) -> None:
        self._conns: dict[int, tuple[paramiko.SSHClient, paramiko.SFTPClient]] = {}
        self._conns_lock = threading.Lock()
        self._connection()  # fail now on a wrong host, key or password

    @property
    def client(self) -> paramiko.SSHClient:
        return self._connection()[0]

    @property
    def ftp(self) -> paramiko.SFTPClient:
        return self._connection()[1]

    def _connection(self) -> tuple[paramiko.SSHClient, paramiko.SFTPClient]:
        me = threading.get_ident()
        with self._conns_lock:
            conn = self._conns.get(me)
            transport = conn[0].get_transport() if conn else None
            if transport is not None and transport.is_active():
                return conn
            live = {t.ident for t in threading.enumerate()}
            self._close(lambda ident: ident == me or ident not in live)
        client = paramiko.SSHClient()
        if self.known_hosts:
            client.load_host_keys(self.known_hosts)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        try:
            client.connect(self.host, **self.ssh_kwargs)
            ftp = client.open_sftp()
        except BaseException:
            client.close()
            raise
        ftp.get_channel().settimeout(REQUEST_TIMEOUT)
        with self._conns_lock:
            self._conns[me] = (client, ftp)
        return client, ftp

    def _close(self, which) -> None:
        for ident in [i for i in self._conns if which(i)]:
            self._conns.pop(ident)[0].close()

    def close(self) -> None:
        """Close every connection (a later call reconnects)."""
        with self._conns_lock:
            self._close(lambda ident: True)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().rstrip("\n")
