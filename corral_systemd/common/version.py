"""corral's version, one place for every face and the packaging to read."""

__version__ = "0.1.0"
