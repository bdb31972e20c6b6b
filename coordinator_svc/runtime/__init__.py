"""The coordinator's runtime: which groups this process owns, their in-memory state, the lock
that serialises each group's requests, and the timers. Adapts the pure core to a live process."""
