"""RE-Bench "Optimize a kernel": the registry finds the class this package names `ENVIRONMENT`."""

from .env import OptimizeKernel

ENVIRONMENT = OptimizeKernel

__all__ = ["ENVIRONMENT", "OptimizeKernel"]
