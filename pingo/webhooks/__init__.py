"""Webhooks: notifications of workflow ends, signed, retried, logged for their owner.

`hooks` reads webhook definitions, builds and signs deliveries, and decides which
addresses a delivery may reach; `sender` is the loop that sends them.
"""
