"""datacache's Kubernetes operator (kopf): CacheRuntime → worker StatefulSet/DaemonSet, DataLoad →
Job, status written back, and a mutating webhook that gives training pods a FUSE mount.

Modules: :mod:`.manifests` (pure builders of the child objects), :mod:`.api_objects` (API objects →
models), :mod:`.kube` (create-or-update through lightkube), :mod:`.webhook` (the pod mutation),
:mod:`.handlers` (the kopf handlers, thin). Run with ``kopf run -m datacache_operator.handlers``.
"""
