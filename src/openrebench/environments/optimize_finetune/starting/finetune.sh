#!/usr/bin/env bash
# Finetune the model named in finetune.yaml on finetune_data.jsonl and write it, in Hugging Face
# format, to trained_model/. Three stages, each its own process: tokenise, train, convert.
set -euo pipefail
cd "$(dirname "$0")"

NGPUS=$(python -c "import torch; print(torch.cuda.device_count())")

rm -rf finetuning_tokens ftout trained_model
python convert_finetuning_dataset.py --config finetune.yaml --data finetune_data.jsonl \
    --out finetuning_tokens/train
cp -r finetuning_tokens/train finetuning_tokens/valid

if [ "$NGPUS" -gt 1 ]; then
    torchrun --standalone --nproc_per_node="$NGPUS" train.py finetune.yaml --data finetuning_tokens \
        --save-folder ftout
else
    python train.py finetune.yaml --data finetuning_tokens --save-folder ftout
fi

python convert_checkpoint_to_hf.py --config finetune.yaml --checkpoint ftout/latest-rank0.pt \
    --out trained_model
rm -rf finetuning_tokens ftout
