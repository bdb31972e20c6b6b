"""The connect group coordinator: a KIP-848-style coordinator for Connect worker groups.

`coordinator_svc.core` is the pure protocol (no I/O, no clock); everything else here is an adapter
around it: the SQLAlchemy store, the gRPC servicers, the group runtime with its timers, the CLI.
"""
