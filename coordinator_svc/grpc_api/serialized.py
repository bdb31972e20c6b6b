"""An answer kept as its wire bytes (`SerializedAnswer`): a servicer builds a heartbeat's answer
without protobuf objects for its large parts (a 10,000-task assignment, issue 24; see
`connect_protocol.wire.heartbeat_response_bytes`), and the serving loop sends those bytes as
they are (`aio`'s handlers call `SerializeToString` on every answer). The servicer's own gRPC
method answers `message()`, for a server that serializes answers itself."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

M = TypeVar("M", bound=Message)


class SerializedAnswer(Generic[M]):
    """`data`, the serialized form of a `message_type`."""

    __slots__ = ("_message_type", "_parsed", "data")

    def __init__(self, data: bytes, message_type: type[M]) -> None:
        self.data = data
        self._message_type = message_type
        self._parsed: M | None = None

    def SerializeToString(self, **_options: Any) -> bytes:
        return self.data

    def message(self) -> M:
        """The message `data` holds, parsed once."""
        parsed = self._parsed
        if parsed is None:
            parsed = self._parsed = self._message_type.FromString(self.data)
        return parsed

    def __repr__(self) -> str:
        return f"SerializedAnswer({self.message()!r})"


def as_message(answer: M | SerializedAnswer[M]) -> M:
    """The answer as a message, for a server that serializes answers itself."""
    return answer.message() if isinstance(answer, SerializedAnswer) else answer
