# One image for the operator, the cache workers, the FUSE sidecars and the DataLoad Jobs.
#   docker build -t datacache:0.1.0 .
FROM python:3.11-slim-bookworm AS build
# gcc: the FUSE request loop's C fast path (datacache_fuse/kernel/_pump.c, called through ctypes)
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY datacache datacache
COPY fuse fuse
COPY runtimes runtimes
COPY operator operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[sftp,operator,juicefs]'

FROM python:3.11-slim-bookworm
# fuse3: fusermount3 and /etc/fuse.conf for the sidecar's allow_other mount (the mount itself is
# pure Python: no libfuse)
RUN apt-get update && apt-get install -y --no-install-recommends fuse3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --create-home --home-dir /home/datacache datacache \
    && mkdir -p /var/lib/datacache && chown 10001:10001 /var/lib/datacache && chmod 0700 /var/lib/datacache
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels 'datacache[sftp,operator,juicefs]' && rm -rf /wheels
ENV DATACACHE_HOME=/var/lib/datacache PYTHONUNBUFFERED=1
USER 10001
ENTRYPOINT []
CMD ["datacache", "--help"]
