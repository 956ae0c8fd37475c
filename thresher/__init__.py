"""thresher: a data engine for self-improving language models."""

__version__ = "0.1.0"
