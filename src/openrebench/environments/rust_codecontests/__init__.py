"""RE-Bench "Scaffolding for Rust Codecontests": the registry finds the class named `ENVIRONMENT`."""

from .env import RustCodecontests

ENVIRONMENT = RustCodecontests

__all__ = ["ENVIRONMENT", "RustCodecontests"]
