"""The protocol both sides share: resources, messages, error codes, group configurations, message
size limits, the protobuf conversion of what both sides exchange, and the JSON log lines both
write. Imports only the standard library (and, in `wire`, the generated protobuf code); the
coordinator (`coordinator_svc`) and the agent (`worker_agent`) import it, never each other."""
