"""Pingo: a workflow server that identifies datasets by provenance and decides which to keep."""

from __future__ import annotations

__version__ = "0.1.0"
