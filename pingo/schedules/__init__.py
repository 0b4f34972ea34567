"""Schedules: recurring workflows, fired exactly once per tick across every node.

`rules` reads a schedule's definition and owns the cron, time zone, catch-up and
parameter rules; `service` creates, pauses, resumes and deletes schedules and
settles their ticks; `loop` is the scheduler loop every node runs.
"""
