"""The worker agent: the sidecar beside every worker. It keeps the worker in its group
(`membership`, `runtime`), computes assignments when the coordinator asks (`assignors`), and tells
the worker what to stop and start (`listener`, `hooks`, `status`). `worker-agent run --help`.
"""
