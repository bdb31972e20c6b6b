"""Tests of the worker agent's listener side: events, retries, exec hook, webhook, status server."""
