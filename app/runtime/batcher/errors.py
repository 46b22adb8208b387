"""The errors a batcher itself puts on an item's future."""


class BatcherError(Exception):
    """Base class of the errors a batcher itself puts on an item's future."""


class QueueFullError(BatcherError):
    """The queue was full and the policy is ``reject_newest``: the new item was not admitted."""


class DroppedError(BatcherError):
    """The queue was full and the policy is ``drop_stalest``: this (oldest) item made room for a newer one."""


class ExpiredError(BatcherError):
    """The item's deadline passed before it was put in a batch; it was never computed."""


class BatcherClosedError(BatcherError):
    """The batcher is shut down: the item was submitted after `close`, or was still queued at `close`."""


class BatchResultError(BatcherError):
    """`run_batch` returned a result list whose length differs from the batch it was given."""
