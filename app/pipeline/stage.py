"""The contract every pipeline stage keeps: one method over a batch, checked once at load time."""

from typing import Protocol, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


class Stage(Protocol[In, Out]):
    """A stage maps a batch of inputs to a batch of outputs of the same length and order."""

    name: str

    def process(self, batch: list[In]) -> list[Out]: ...
