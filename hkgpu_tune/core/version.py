"""The package version, at the bottom of the layers (the report envelope and the exporter read it)."""
__version__ = "0.2.0"
