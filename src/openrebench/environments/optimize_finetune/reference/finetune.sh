#!/usr/bin/env bash
# Finetune the model named in finetune.yaml on finetune_data.jsonl and write it to trained_model/, in
# one process (finetune.py): the same weights as the three-stage pipeline, in a fraction of the time.
set -euo pipefail
cd "$(dirname "$0")"
rm -rf trained_model
exec python finetune.py finetune.yaml
