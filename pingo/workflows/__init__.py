"""The workflow language (parse, validate), provenance dataset ids, and planning."""
