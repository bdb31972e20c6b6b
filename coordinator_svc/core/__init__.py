"""The pure, deterministic protocol core: state, records, validation, handlers.

Nothing in this package does I/O or reads a clock: time comes in as `now_ms` arguments. Handlers
read a `GroupState` and return a `Result` (records to persist and replay, a response, timer
changes); only `replay.apply` changes state.
"""
