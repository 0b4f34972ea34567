"""Dataset lifecycle: storage through fsspec, the deletor, accounting."""
