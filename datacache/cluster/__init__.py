"""The distributed cache tier: cache workers, placement, membership and the cluster block source.

A CacheRuntime with N replicas runs N cache workers; each owns a share of the dataset's blocks, so
a dataset larger than one node's cache is cached across the cluster and any node reads any block
from its owner. One module per job:

| module          | job                                                                          |
|-----------------|------------------------------------------------------------------------------|
| ``placement``   | rendezvous (HRW) hashing: the owners and failover order of a block key        |
| ``membership``  | which workers are alive (embedded: SQLite rows with a heartbeat and a TTL)    |
| ``discovery``   | which workers are alive on Kubernetes: SRV records of the headless Service    |
| ``auth``        | the bearer token of a runtime's data endpoints                                |
| ``wire``        | request fields and errors on the wire, validated                              |
| ``store``       | a worker's disk tier, handing out block files + checksums for sendfile        |
| ``metrics``     | a worker's Prometheus metrics, and parsing them back                          |
| ``worker``      | the aiohttp worker process                                                    |
| ``peers``       | a worker's peers: read-repair of blocks away from home, hand-off to owners    |
| ``client``      | the client of the worker API (aiohttp on a background loop; block GETs below) |
| ``transport``   | blocking block GETs (urllib3), TCP or a same-node worker's local socket       |
| ``routing``     | per block: which workers to ask in which order, and short-circuit readers     |
| ``readahead``   | background fetches of the next remote blocks, within the memory budget        |
| ``source``      | ``ClusterBlockSource``: the block-source interface over the workers           |
| ``status``      | what ``datacache get runtimes`` shows per worker                              |

Process supervision in embedded mode lives in :mod:`datacache.control.supervisor`; on Kubernetes
the same workers run as a StatefulSet (``datacache worker serve``) and Kubernetes supervises them.

How it scales: every client computes placement itself from the live worker ids, so there is no
metadata server on the read path; a read costs one request to one owner (or none, short-circuited
on the owner's node); adding a worker adds its disk, cores and NIC and takes about 1/N of the
blocks, from every old worker evenly.
"""
