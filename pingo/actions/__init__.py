"""Scraper, submitters and executors: how READY actions get run."""
