"""UFS layer: each Dataset mount is an fsspec filesystem; together they form one namespace.

``mounts.UnionNamespace`` maps dataset paths to (mount, UFS path), lists every mount for the
manifest and reads byte ranges of an exact file version through ``versions``.
"""
