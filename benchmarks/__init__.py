"""Side-by-side benchmarks of datacache against its peers (not run by the test suite).

Each module is runnable with ``python -m benchmarks.<name>`` from the repository root and prints
ratios measured in one run; nothing is hard-coded. ``benchmarks.common`` holds the shared setup
(moto S3 on loopback, the demo dataset, temporary ``DATACACHE_HOME``\\ s, timing and table helpers).
"""
