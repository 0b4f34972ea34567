"""`pingo simulate`: retention policies replayed on workflow traces, on a virtual clock.

Not part of the retention plug-in API (`pingo.retention.policy`): the simulator runs
the real planner and outcome service over an in-memory store, so it sits above the
engine, beside the node that composes the same parts for a server.
"""
