"""openrebench: RE-Bench's ML research-engineering environments, runnable on a laptop and a GPU node."""

__version__ = "0.1.0"
