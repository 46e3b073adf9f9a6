"""Stage 3 of finetune.sh: turn the trainer's checkpoint into a Hugging Face model folder.

    python convert_checkpoint_to_hf.py --config finetune.yaml --checkpoint ftout/latest-rank0.pt \
        --out trained_model
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cfg = yaml.safe_load(Path(args.config).read_text())

    checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
    config = AutoConfig.from_pretrained(cfg["model"]["pretrained_model_name_or_path"])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(checkpoint["state"]["model"])
    model.to(DTYPES[cfg.get("output_precision", "fp32")])
    model.save_pretrained(args.out)
    AutoTokenizer.from_pretrained(cfg["tokenizer"]["name"]).save_pretrained(args.out)
    step = checkpoint["state"]["timestamp"]["batch"]
    print(f"wrote {args.out} ({cfg.get('output_precision', 'fp32')}) from the checkpoint after {step} steps")


if __name__ == "__main__":
    main()
