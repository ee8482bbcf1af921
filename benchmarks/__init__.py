"""Side-by-side benchmarks of datacache against its peers (not run by the test suite).

``python -m benchmarks [--quick]`` (``__main__``) runs every system (a local copy, datacache
through FUSE and ``datacache://``, fsspec's caches, rclone, s3fs-fuse) through the same workloads
in one run and writes ``RESULTS.md`` and a chart: ``loader`` (DataLoader-shaped reader processes),
``systems`` (how each system is set up), ``peers`` (the workloads), ``report`` (tables, chart).
The focused benchmarks are runnable with ``python -m benchmarks.<name>`` (``read_path``,
``fuse_read``, ``worker_get``) and print ratios measured in one run; nothing is hard-coded.
``benchmarks.common`` holds the shared setup (moto S3 on loopback behind ``proxy.DelayProxy``, the
demo dataset, temporary ``DATACACHE_HOME``\\ s, timing and table helpers, peers' config files).
"""
