"""RE-Bench "Fix embedding": the registry finds the class this package names `ENVIRONMENT`."""

from .env import FixEmbedding

ENVIRONMENT = FixEmbedding

__all__ = ["ENVIRONMENT", "FixEmbedding"]
