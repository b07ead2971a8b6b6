# ruff: noqa
"""TRL's CPO example, `examples/scripts/cpo.py` (huggingface/trl, Apache-2.0), re-created in its
2025 structure (trl 0.2x, the version whose docs the trl 1.16 `experimental.cpo` page still points
to): `HfArgumentParser` over ScriptArguments / CPOConfig / ModelConfig, the policy and tokenizer
loaded with `from_pretrained`, eos as the pad token when there is none, a chat template set when the
tokenizer has none, `load_dataset(--dataset_name)`, `CPOTrainer(model, args=..., processing_class=
tokenizer, peft_config=get_peft_config(model_args))`, `train()`, `save_model`. CPO is reference-free.
In trl 1.x CPO lives in `trl.experimental.cpo` and `trust_remote_code` moved from ModelConfig to the
trainer config (as trl 1.16's own scripts read it): the two changes; the template that
trl 0.2x imported as `trl.trainer.utils.SIMPLE_CHAT_TEMPLATE` (gone in 1.x) is spelled out.

# regular:
python examples/scripts/cpo.py \
    --dataset_name trl-lib/ultrafeedback_binarized \
    --model_name_or_path=gpt2 \
    --per_device_train_batch_size 4 \
    --max_steps 1000 \
    --learning_rate 8e-6 \
    --gradient_accumulation_steps 1 \
    --logging_steps 10 \
    --eval_steps 500 \
    --output_dir="gpt2-aligned-cpo" \
    --warmup_steps 150 \
    --report_to wandb \
    --bf16 \
    --logging_first_step \
    --no_remove_unused_columns
"""

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

from trl import ModelConfig, ScriptArguments, get_peft_config
from trl.experimental.cpo import CPOConfig, CPOTrainer

SIMPLE_CHAT_TEMPLATE = "{% for message in messages %}{{message['role'].capitalize() + ': ' + message['content'] + '\n\n'}}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"


if __name__ == "__main__":
    parser = HfArgumentParser((ScriptArguments, CPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_into_dataclasses()

    ################
    # Model & Tokenizer
    ################
    model = AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path, trust_remote_code=training_args.trust_remote_code
    )
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path, trust_remote_code=training_args.trust_remote_code
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    ################
    # Dataset
    ################
    dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config)
    if tokenizer.chat_template is None:
        tokenizer.chat_template = SIMPLE_CHAT_TEMPLATE

    ################
    # Training
    ################
    trainer = CPOTrainer(
        model,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        eval_dataset=dataset[script_args.dataset_test_split] if training_args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )

    # train and save the model
    trainer.train()

    # Save and push to hub
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
