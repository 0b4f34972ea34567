"""Callback logic: running, success, failed, killed (routes live in pingo.api)."""
