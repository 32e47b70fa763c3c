"""A stand-in for rknn-toolkit-lite2's `rknnlite` package (see api.py)."""
