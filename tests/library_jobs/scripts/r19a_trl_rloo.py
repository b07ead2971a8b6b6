# ruff: noqa
"""TRL's RLOO example script, `trl/scripts/rloo.py` (huggingface/trl, Apache-2.0; formerly
`examples/scripts/rloo.py`), re-created in its trl 1.16.0 structure: RLOOScriptArguments (a
reward model path and named reward functions, or dotted import paths put on `sys.path` from the
working directory), `TrlParser` over it / RLOOConfig / ModelConfig / DatasetMixtureConfig, the
policy given as a path string, a prompt-only data set, `RLOOTrainer(reward_funcs=[...])`:
`num_generations` completions a prompt sampled with `generate`, each scored, the leave-one-out
baseline, `trainer.train()`, `save_model`, `trainer.end()`.

    python rloo.py --model_name_or_path Qwen/Qwen2-0.5B-Instruct --dataset_name trl-lib/DeepMath-103K \
        --reward_funcs accuracy_reward --num_generations 8 --output_dir Qwen2-0.5B-RLOO
"""

import argparse
import importlib
import os
import sys
from dataclasses import dataclass, field

from trl import ScriptArguments


@dataclass
class RLOOScriptArguments(ScriptArguments):
    """Adds the reward model path and the reward function names to the common script arguments."""

    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Reward model id on the Hub or local path of a `save_pretrained` folder."},
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": "Reward functions: `accuracy_reward`, `reasoning_accuracy_reward`, `think_format_reward`, "
                          "`get_soft_overlong_punishment`, or a dotted import path."},
    )


def main(script_args, training_args, model_args, dataset_args):
    import transformers
    from accelerate.logging import get_logger
    from datasets import load_dataset
    from packaging.version import Version

    from trl import RLOOTrainer, get_dataset, get_peft_config, get_quantization_config
    from trl.rewards import (
        accuracy_reward,
        get_soft_overlong_punishment,
        reasoning_accuracy_reward,
        think_format_reward,
    )

    logger = get_logger(__name__)

    known_rewards = {
        "accuracy_reward": accuracy_reward,
        "reasoning_accuracy_reward": reasoning_accuracy_reward,
        "think_format_reward": think_format_reward,
        "get_soft_overlong_punishment": get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256),
    }

    reward_funcs = [script_args.reward_model_name_or_path] if script_args.reward_model_name_or_path else []
    for name in script_args.reward_funcs or []:
        if name in known_rewards:
            reward_funcs.append(known_rewards[name])
        elif "." in name:
            module_path, attr = name.rsplit(".", 1)
            sys.path.insert(0, os.getcwd())
            reward_funcs.append(getattr(importlib.import_module(module_path), attr))
        else:
            raise ValueError(f"Could not load reward function '{name}'. Expected one of "
                             f"{list(known_rewards)} or a valid import path.")

    training_args.model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    )

    if dataset_args.datasets:
        if script_args.dataset_name:
            logger.warning("`datasets` and `dataset_name` both given: `dataset_name` is ignored.")
        dataset = get_dataset(dataset_args)
    elif script_args.dataset_name:
        dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config,
                               streaming=script_args.dataset_streaming)
    else:
        raise ValueError("Either `datasets` or `dataset_name` must be provided.")

    trainer = RLOOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        eval_dataset=dataset[script_args.dataset_test_split] if training_args.eval_strategy != "no" else None,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )

    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.accelerator.print("✅ Training completed.")

    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"💾 Model saved to {training_args.output_dir}.")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)

    if Version(transformers.__version__) >= Version("5.18.0"):
        trainer.end()


def make_parser(subparsers: argparse._SubParsersAction | None = None, prog: str | None = None):
    from trl import DatasetMixtureConfig, ModelConfig, RLOOConfig, TrlParser

    dataclass_types = (RLOOScriptArguments, RLOOConfig, ModelConfig, DatasetMixtureConfig)
    if subparsers is not None:
        return subparsers.add_parser("rloo", help="Run the RLOO training script", dataclass_types=dataclass_types)
    return TrlParser(dataclass_types, prog=prog)


if __name__ == "__main__":
    parser = make_parser()
    script_args, training_args, model_args, dataset_args = parser.parse_args_and_config(fail_with_unknown_args=False)
    main(script_args, training_args, model_args, dataset_args)
