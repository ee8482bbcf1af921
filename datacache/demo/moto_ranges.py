"""Ranged GETs that read only their range, installed into moto's S3 server (its child process).

Stock moto (5.x) answers ``GET`` with ``Range: bytes=A-B`` by reading the whole object
(``FakeKey.value``: the key's whole ``SpooledTemporaryFile``, a temporary file on disk past 5 MiB)
and then slicing the response (``S3Response._handle_range_header``). Every ranged reader then pays
for the whole object on every request: a 256 MiB shard read in 8 MiB ranges is read 32 times over
by the server. Amazon S3 (and nginx for an HTTP source) cost the range only.

``install()`` changes one thing: while ``S3Response.get_object`` runs for a request that has a
``Range`` header, the key's ``value`` is a ``_StoredValue`` - its length is the object's size and
slicing it reads only that slice from the key's buffer (under the key's lock, as moto's own
``value`` does). moto's own ``_handle_range_header`` still parses the header, answers 206 with
``Content-Range``, 416 past the end, and 200 with the whole object for what it does not serve as
a range (several ranges, a malformed header): those paths take the whole object, as before. Every
other use of ``value`` (a GET without a Range, copies, multipart) is unchanged.

Imported by file path in the server's child (``datacache.demo.s3server``), so it imports nothing
from datacache; moto's internals it relies on: ``FakeKey.value``/``lock``/``_value_buffer``/``size``,
``S3Response.get_object``/``key_response``/``headers`` (moto 5.x).
"""

from __future__ import annotations

import threading

_ranged = threading.local()  # .active: the running get_object serves a Range (one request per thread)


class _StoredValue:
    """A key's bytes read on demand: ``len()`` is the object's size in bytes; ``v[a:b]`` reads only
    bytes ``a`` to ``b`` of the key's buffer; ``bytes(v)`` reads the whole object."""

    def __init__(self, key) -> None:
        self.key = key

    def __len__(self) -> int:
        return self.key.size

    def __bool__(self) -> bool:
        return self.key.size > 0

    def __getitem__(self, item: slice) -> bytes:
        start, stop, step = item.indices(self.key.size)
        if step != 1:
            raise ValueError("only contiguous slices of a stored object are served")
        with self.key.lock:
            buf = self.key._value_buffer
            buf.seek(start)
            return buf.read(max(0, stop - start))

    def __bytes__(self) -> bytes:
        return self[:]


def install() -> None:
    """Patch moto's S3 classes in this process (idempotent; see the module doc)."""
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    if getattr(S3Response, "_datacache_ranges", False):
        return
    stock_value = FakeKey.value  # a property: the whole object

    def value(key) -> bytes | _StoredValue:
        return _StoredValue(key) if getattr(_ranged, "active", False) else stock_value.fget(key)

    stock_get_object = S3Response.get_object

    def get_object(self):
        _ranged.active = bool(self.headers.get("range"))
        try:
            return stock_get_object(self)
        finally:
            _ranged.active = False

    stock_key_response = S3Response.key_response

    def key_response(self, request, full_url, headers):
        status, response_headers, body = stock_key_response(self, request, full_url, headers)
        # a Range moto answers with the whole object (several ranges, malformed): read it all
        return status, response_headers, bytes(body) if isinstance(body, _StoredValue) else body

    FakeKey.value = property(value, stock_value.fset)
    S3Response.get_object = get_object
    S3Response.key_response = key_response
    S3Response._datacache_ranges = True
