"""The contract every model stage of the pipeline keeps: one method over a batch, and `close`.

Stages that run inline (detector, swap engines, enhancer) ignore `session`; a stage shared by several
streams through a batcher (`app.pipeline.batching.BatchedStage`) uses it to serve them fairly.
"""

from typing import Protocol, TypeVar

from app.runtime.model import Model

In = TypeVar("In")
Out = TypeVar("Out")

DEFAULT_SESSION = "default"


class Stage(Protocol[In, Out]):
    """A stage maps a batch of inputs to a batch of outputs of the same length and order."""

    @property
    def name(self) -> str: ...

    def process(self, batch: list[In], *, session: str = DEFAULT_SESSION) -> list[Out]: ...

    def close(self) -> None:
        """Release what the stage holds (models, batchers). Idempotent."""
        ...


class ModelStage:
    """A stage that owns the one model it runs: closing the stage closes the model."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def close(self) -> None:
        self.model.close()
