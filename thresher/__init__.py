"""thresher, a data engine for self-improving language models: the modules every stage shares."""

__version__ = "0.1.0"
