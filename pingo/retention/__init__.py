"""Retention: the policy plugin API, built-in policies, the decision loop, the simulator."""
