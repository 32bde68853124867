"""The package version, importable by every layer without importing the package itself."""

__version__ = "0.1.0"
