"""attnrepro: a reproducibility and benchmark harness for attention."""

__version__ = "0.1.0"
