"""RE-Bench "Optimize a finetuning script": the registry finds the class this package names `ENVIRONMENT`."""

from .env import OptimizeFinetune

ENVIRONMENT = OptimizeFinetune

__all__ = ["ENVIRONMENT", "OptimizeFinetune"]
