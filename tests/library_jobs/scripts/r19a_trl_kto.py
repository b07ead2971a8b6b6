# ruff: noqa
"""TRL's KTO example script, `trl/scripts/kto.py` (huggingface/trl, Apache-2.0; formerly
`examples/scripts/kto.py`), re-created in its trl 1.16.0 structure: `TrlParser` over
ScriptArguments / KTOConfig / ModelConfig / DatasetMixtureConfig, the model given to the trainer
as a path string (KTOTrainer loads the policy and, without an adapter, a frozen reference copy),
an unpaired preference data set (prompt, completion, boolean label) from `load_dataset`, optional
`--use_peft` LoRA from `get_peft_config`, `trainer.train()`, `save_model`, `trainer.end()`.

    python kto.py --dataset_name trl-lib/kto-mix-14k --model_name_or_path trl-lib/qwen1.5-1.8b-sft \
        --per_device_train_batch_size 16 --learning_rate 5e-7 --lr_scheduler_type cosine \
        --output_dir kto-aligned-model --logging_first_step
"""

import argparse


def main(script_args, training_args, model_args, dataset_args):
    import transformers
    from accelerate.logging import get_logger
    from datasets import load_dataset
    from packaging.version import Version

    from trl import KTOTrainer, get_dataset, get_peft_config, get_quantization_config

    logger = get_logger(__name__)

    # how the trainer will build the policy (and the reference) from the path it is given
    training_args.model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    )

    # the data: a mixture from --datasets, or one data set by name
    if dataset_args.datasets:
        if script_args.dataset_name:
            logger.warning("`datasets` and `dataset_name` both given: `dataset_name` is ignored.")
        dataset = get_dataset(dataset_args)
    elif script_args.dataset_name:
        dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config,
                               streaming=script_args.dataset_streaming)
    else:
        raise ValueError("Either `datasets` or `dataset_name` must be provided.")

    trainer = KTOTrainer(
        model=model_args.model_name_or_path,
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
    from trl import DatasetMixtureConfig, KTOConfig, ModelConfig, ScriptArguments, TrlParser

    dataclass_types = (ScriptArguments, KTOConfig, ModelConfig, DatasetMixtureConfig)
    if subparsers is not None:
        return subparsers.add_parser("kto", help="Run the KTO training script", dataclass_types=dataclass_types)
    return TrlParser(dataclass_types, prog=prog)


if __name__ == "__main__":
    parser = make_parser()
    script_args, training_args, model_args, dataset_args = parser.parse_args_and_config(fail_with_unknown_args=False)
    main(script_args, training_args, model_args, dataset_args)
