"""RE-Bench "Restricted architecture MLM": the registry finds the class this package names `ENVIRONMENT`."""

from .env import RestrictedMLM

ENVIRONMENT = RestrictedMLM

__all__ = ["ENVIRONMENT", "RestrictedMLM"]
