"""chat_rl's full tier on one GPU with what can be built offline: its models, data sizes and pipelines,
timed, where the tier's own inputs cannot be reached.

The full tier wants GPT-2 XL and Stanford Alpaca from the Hugging Face Hub and Llama-3-8B-Instruct as
the judge; a GPU node without the Hub or the judge can still build and run everything else at the
tier's sizes. This script does that, with three documented substitutions:

- base model: the builder's own fallback, a GPT of GPT-2's shape (12 layers, 768 wide, GPT-2's 50,257
  tokens, 512 positions) pretrained for the tier's 3,000 steps, on the offline dictionary corpus (the
  plays and GCIDE; the `full` corpus needs Debian's documentation packages);
- instructions: the mini tier's offline ones (GCIDE and chatterbot) in place of Alpaca: 10,000 training
  prompts and 512 held-out as in the tier, fewer demonstrations (`--n-sft`);
- judge: a stand-in that answers at once (the tests' echo judge: associated words score), so the
  pipelines' times are the GPU's share only; the judge comparisons each one asks for are counted, to
  price a real judge's share.

Steps, in order, each cached under `$OPENREBENCH_HOME` (a second call goes on where the first stopped):
the assets (tokenizer, base, instructions, SFT model, both reference models' answers), the starting
pipeline, the scorer's 512 answers from the starting model (the part of a scoring that runs on the
GPU), the reference pipeline (`--reference-rounds 1` times one of its three alike rounds). The JSON is
written after each step.

    python3 benchmarks/chat_rl_full_offline.py --stage all --reference-rounds 1 \\
        --out benchmarks/results/chat_rl_full_offline/$(date +%F)_h200.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from chat_rl_support import echo_judge_server
from openrebench.api import cache_dir
from openrebench.environments.chat_rl import _assets, _judged, chat_lm
from openrebench.environments.chat_rl.env import ChatRL
from openrebench.lm import assets_root, load_manifest
from openrebench.runs import ScoringAccess

JUDGE = "stand-in-echo"


def offline_spec(n_sft: int) -> Any:
    spec = ChatRL().tier("full")
    params = spec.params.model_copy(update={"data": "dictionary", "corpus": "dictionary", "base_hub": None,
                                            "n_sft": n_sft, "judge_method": "likelihood"})
    return spec.model_copy(update={"params": params})


def manifests(prefix: str) -> dict[str, Any]:
    out = {}
    for folder in sorted(assets_root(cache_dir()).glob("*")):
        manifest = load_manifest(folder) if folder.is_dir() else None
        if manifest is not None and (folder.name.startswith(prefix) or folder.name.startswith("corpus-full")
                                     or folder.name.startswith("model-chatrl-full")):
            out[folder.name] = {"build_seconds": round(manifest.build_seconds, 1), "stats": manifest.stats}
    return out


def comparisons(pipeline: Any) -> int:
    """Judge comparisons a pipeline asks for: a pair per prompt, or a knock-out of `samples` answers."""
    return pipeline.prompts * (pipeline.samples - 1) * pipeline.rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", default="all",
                        choices=("assets", "pipelines", "sampling", "scoring", "all"))
    parser.add_argument("--n-sft", type=int, default=8000, help="demonstrations for the SFT model")
    parser.add_argument("--reference-rounds", type=int, help="the reference pipeline's rounds (default: the "
                        "tier's; its rounds are alike, so one round times them all)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import torch

    spec = offline_spec(args.n_sft)
    p = spec.params
    record: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    record.update({"command": shlex.join(["python3", *sys.argv]),
                   "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                   "torch": torch.__version__, "python": platform.python_version(),
                   "params": p.model_dump()})
    timings = record.setdefault("timings_s", {})

    def timed(name: str, fn: Any) -> Any:
        started = time.monotonic()
        result = fn()
        timings[name] = round(time.monotonic() - started, 1)
        print(f"{name}: {timings[name]} s", flush=True)
        return result

    def save() -> None:
        record["assets"] = manifests("chatrl-full")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")

    built = timed("assets (this call)", lambda: _assets.build(spec, cache_dir()))
    save()
    pipelines = record.setdefault("pipelines", {})
    runs = assets_root(cache_dir()) / "chatrl-full-offline-pipelines"

    def sample() -> None:
        """The GPU's part of a scoring: one answer per held-out instruction from the starting model."""
        model = chat_lm.load_model(runs / "start", p.device)
        tokenizer = chat_lm.ChatTokenizer(built.tokenizer)
        prompts = [r["instruction"] for r in chat_lm.read_jsonl(built.answers / "heldout.jsonl")]
        settings = {"max_new_tokens": p.max_new_tokens, "temperature": p.temperature, "top_k": p.top_k}
        answers = timed("sampling the scorer's answers", lambda: chat_lm.generate(
            model, tokenizer, prompts, seed=7, **settings))
        record["sampling"] = {"prompts": len(prompts), "empty": sum(not a for a in answers),
                              "examples": [{"instruction": i, "answer": a} for i, a in
                                           zip(prompts[:5], answers[:5], strict=True)]}
        save()

    def scoring(url: str) -> None:
        """One whole scoring by the tier's scorer: the SFT model as the submission, the stand-in judge."""
        import os
        import tempfile

        from openrebench.environments.chat_rl.scorer import score

        with tempfile.TemporaryDirectory() as tmp:
            solution, protected = Path(tmp) / "solution", Path(tmp) / "protected"
            shutil.copytree(built.sft, solution / "model")
            protected.mkdir()
            shutil.copy(built.answers / "heldout.jsonl", protected / "heldout.jsonl")
            shutil.copytree(built.tokenizer, protected / "tokenizer")
            shutil.copy(built.base / "config.json", protected / "base_config.json")
            os.environ.update({"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "stand-in"})
            result = timed("one scoring (the SFT model, stand-in judge)",
                           lambda: score(spec, solution, protected))
        record["scoring"] = {"message": result.message, "raw": result.raw, "details": result.details}
        print(result.message, flush=True)
        save()

    reference = p.reference.model_copy(update={"rounds": args.reference_rounds or p.reference.rounds})
    with echo_judge_server() as url:
        access = ScoringAccess(env={"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "stand-in"},
                               models={"judge": JUDGE})
        if args.stage == "scoring":
            scoring(url)
        for which, pipeline in (("start", p.start), ("reference", reference)):
            if args.stage == "scoring":
                break
            if args.stage in ("pipelines", "all") and not (runs / which / chat_lm.WEIGHTS).is_file():
                script = _assets.HERE / ("starting" if which == "start" else which) / "rl_finetune.py"
                shutil.rmtree(runs / which, ignore_errors=True)
                started = time.monotonic()
                summary = _judged.run_pipeline(spec, built, script, pipeline, access, runs / which)
                pipelines[which] = {"seconds": round(time.monotonic() - started, 1), "summary": summary,
                                    "pipeline": pipeline.model_dump(),
                                    "judge_comparisons": comparisons(pipeline)}
                print(f"{which} pipeline: {pipelines[which]['seconds']} s", flush=True)
                save()
            if which == "start" and args.stage in ("sampling", "all"):
                sample()
    print(f"{'asset':<40} {'seconds':>9}")
    for name, info in record.get("assets", {}).items():
        print(f"{name:<40} {info['build_seconds']:>9.1f}")
    for name, seconds in timings.items():
        print(f"{name:<40} {seconds:>9.1f}")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
