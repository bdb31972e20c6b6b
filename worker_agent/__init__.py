"""The worker agent: the sidecar beside every worker (membership loop, assignors, listener).

Not built yet: it is the next issue. `worker-agent` says so instead of pretending.
"""
