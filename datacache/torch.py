"""PyTorch glue: a sampler wrapper that tells the cache each epoch's read order.

``OrderedPrefetch(sampler, dataset="imagenet", paths=[...])`` draws the sampler's indices for an
epoch, publishes the files they name as this rank's plan (:mod:`datacache.plan.channel`), then
yields the indices unchanged. Readers of the dataset on this node (``datacache://`` clients in
the DataLoader's worker processes, the FUSE mount) prefetch in that order and evict by it. With a
``DistributedSampler`` the plan is this rank's share (its ``rank``/``num_replicas``). torch is
not imported here: any iterable of indices with ``__len__`` works as the sampler.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence


class OrderedPrefetch:
    """A sampler over ``sampler``'s indices that publishes each epoch's order of ``paths``.

    ``dataset``: the dataset's name; ``paths``: the dataset path of each index (a sequence, or a
    callable index -> path; a ``datacache://DATASET/...`` URL is taken as its path); ``home``,
    ``namespace``: where the dataset is (default ``$DATACACHE_HOME``, "default"); ``rank``,
    ``world``: default the sampler's ``rank``/``num_replicas`` (DistributedSampler), else 0 and 1.
    Each ``iter()`` publishes a plan (the first call checks the paths against the manifest and
    raises :class:`datacache.plan.plan.PlanError` for unknown, repeated or foreign ones). ``epoch``
    counts the iterations (``set_epoch`` sets it and is passed on to the sampler)."""

    def __init__(self, sampler, dataset: str, paths: Sequence[str] | Callable[[int], str], home: str | None = None,
                 namespace: str = "default", rank: int | None = None, world: int | None = None):
        self.sampler = sampler
        self.dataset = dataset
        self.paths = paths
        self.home = home
        self.namespace = namespace
        self.rank = rank if rank is not None else int(getattr(sampler, "rank", 0))
        self.world = world if world is not None else int(getattr(sampler, "num_replicas", 1))
        self.epoch = 0
        self.published: str | None = None  # the last plan's file

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[int]:
        indices = list(iter(self.sampler))
        path_of = self.paths if callable(self.paths) else self.paths.__getitem__
        self.publish(list(dict.fromkeys(path_of(i) for i in indices)))  # a repeat's next use is its first
        self.epoch += 1
        return iter(indices)

    def publish(self, order: list[str]) -> None:
        """Publish ``order`` (dataset paths) as this rank's plan for the current epoch."""
        from datacache.control.embedded import read_path
        from datacache.stack.plans import publish_plan

        paths = read_path(self.home)
        try:
            _, self.published = publish_plan(paths, self.dataset, order, self.namespace, self.epoch, self.rank,
                                             self.world)
        finally:
            paths.close()
