"""datacache: dataset caching and data orchestration for machine-learning training.

Layers (each knows only the one below): ``api`` (resource models) -> ``control`` (embedded control
plane) -> ``client``/``reader`` (read path) -> ``cache`` (block store) -> ``ufs`` (fsspec sources).
"""
