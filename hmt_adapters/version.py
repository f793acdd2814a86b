"""The package version (one place, read by pyproject and written into every saved adapter)."""

__version__ = "0.1.0"
