"""A cache that knows the training order (issue 21): plans, prefetch and eviction by the plan,
and access traces recorded and replayed.

- :mod:`.plan`: a plan (dataset, ordered paths, epoch, rank) and its check against the manifest;
- :mod:`.channel`: how a plan reaches the reading processes of a node (plan files);
- :mod:`.prefetch`: files loaded in plan order a bounded distance ahead of the reader;
- :mod:`.cursor`: a plan resolved against the manifest, with the reader's position in it;
- :mod:`.nextuse`: the disk tier's eviction ranked by next use in the plan (Belady);
- :mod:`.follow`: ties them to a DatasetClient (prefetch and eviction of a reading process);
- :mod:`.ranking`: eviction by the plans for a cache worker, which reads no plan file itself;
- :mod:`.trace`: access traces of a run, for ``warmup --from-trace``.
"""
