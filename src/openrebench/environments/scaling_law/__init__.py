"""RE-Bench "Scaling law": the registry finds the class this package names `ENVIRONMENT`."""

from .env import ScalingLaw

ENVIRONMENT = ScalingLaw

__all__ = ["ENVIRONMENT", "ScalingLaw"]
