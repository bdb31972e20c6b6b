"""Message size limits of the wire, and the gRPC options that set them on a server or a channel."""

from __future__ import annotations

#: The largest gRPC message a server or client sends or accepts, by default: five times a Prepare
#: answer of 10,000 members x 100,000 tasks with 40-character connector names (about 11 MB).
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

#: gRPC keeps message lengths in a signed 32-bit int.
MAX_GRPC_MESSAGE_BYTES = 2**31 - 1


def channel_options(
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> list[tuple[str, int]]:
    """gRPC options that set both the send and the receive limit to `max_message_bytes`, for a
    server or a channel (gRPC's own defaults are 4 MiB received, unlimited sent)."""
    if not 0 < max_message_bytes <= MAX_GRPC_MESSAGE_BYTES:
        raise ValueError(
            f"max_message_bytes must be between 1 and {MAX_GRPC_MESSAGE_BYTES}, "
            f"not {max_message_bytes}"
        )
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
