"""Entry point of the scorer process: read the config from stdin, score, print one tagged result line."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from ._environment import ScoreResult
from ._scoring import RESULT_TAG


def main() -> None:
    config = json.loads(sys.stdin.read())
    from openrebench.environments import get_environment

    try:
        env = get_environment(config["env_id"])
        result = env.score(config["tier"], Path(config["solution"]), Path(config["protected"]))
    except Exception as e:  # a scorer bug must still give a row, with the traceback in the details
        result = ScoreResult.invalid(f"Invalid: internal scorer error ({type(e).__name__}: {e}).",
                                     traceback=traceback.format_exc())
    sys.stdout.write(f"\n{RESULT_TAG} {config['nonce']} {result.model_dump_json()}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
