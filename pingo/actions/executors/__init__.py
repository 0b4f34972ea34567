"""Executors: one per action type, knowing their cluster and nothing of the store."""
