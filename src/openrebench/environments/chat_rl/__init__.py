"""RE-Bench "Finetune GPT-2 for QA with RL": the registry finds the class named `ENVIRONMENT`."""

from .env import ChatRL

ENVIRONMENT = ChatRL

__all__ = ["ENVIRONMENT", "ChatRL"]
