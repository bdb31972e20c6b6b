"""The gRPC edge of the coordinator: servicers, the proto <-> core conversion, the server."""
