"""Worker tests: the multi-process helpers live in ``rankproc.py`` (imported by name)."""
