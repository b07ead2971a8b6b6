# ruff: noqa
"""peft's `examples/dora_finetuning/dora_finetuning.py` (huggingface/peft, Apache-2.0; as of
commit 05f45bef), re-created in its structure: `train_model(...)` called from an argparse block
(`--base_model`, `--data_path`, `--use_dora`, `--quantize`, `--lora_r`, `--lora_target_modules`,
`--device cuda:0`, ...), the accelerator module looked up from the device type
(`getattr(torch, device.type, torch.cuda)`), an `AutoModelForCausalLM` wrapped by
`get_peft_model(LoraConfig(use_dora=...))` on the seven Llama projections, `model.to(device)`,
the data set padded to `max_length` with labels copied from the ids, a Trainer with fp16 and 16
accumulation steps, `empty_cache()` before it, then `save_pretrained` of the adapter.
"""

import os

import torch
from datasets import load_dataset
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
)

from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training


def train_model(
    base_model: str,
    data_path: str,
    output_dir: str,
    batch_size: int,
    num_epochs: int,
    learning_rate: float,
    cutoff_len: int,
    val_set_size: int,
    use_dora: bool,
    quantize: bool,
    eval_step: int,
    save_step: int,
    device: str,
    lora_r: int,
    lora_alpha: int,
    lora_dropout: float,
    lora_target_modules: str,
    hub_model_id: str,
    push_to_hub: bool,
):
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    hf_token = os.getenv("HF_TOKEN")

    device = torch.device(device)
    print(f"Using device: {device}")
    accelerator_module = getattr(torch, device.type, torch.cuda)

    tokenizer = AutoTokenizer.from_pretrained(base_model, token=hf_token)

    if quantize:
        # QDoRA: the base weights in 4-bit NF4, compute in bf16 where the device has it
        compute_dtype = (torch.bfloat16 if accelerator_module.is_available() and accelerator_module.is_bf16_supported()
                         else torch.float16)
        model = AutoModelForCausalLM.from_pretrained(
            base_model,
            token=hf_token,
            quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=compute_dtype,
                                                   bnb_4bit_use_double_quant=True, bnb_4bit_quant_type="nf4"),
        )
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    else:
        model = AutoModelForCausalLM.from_pretrained(base_model, token=hf_token)

    targets = (lora_target_modules.split(",") if lora_target_modules
               else ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    lora_config = LoraConfig(
        use_dora=use_dora,  # DoRA: a magnitude vector per target on top of the LoRA pair
        r=lora_r,
        lora_alpha=lora_alpha,
        target_modules=targets,
        lora_dropout=lora_dropout,
        bias="none",
    )
    model = get_peft_model(model, lora_config)
    model.to(device)
    tokenizer.pad_token = tokenizer.eos_token

    dataset = load_dataset(data_path)

    def tokenize_function(examples):
        inputs = tokenizer(examples["text"], padding="max_length", truncation=True, max_length=cutoff_len)
        inputs["labels"] = inputs["input_ids"].copy()
        return inputs

    tokenized_datasets = dataset.map(tokenize_function, batched=True, remove_columns=dataset["train"].column_names)
    data_collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)

    training_args = TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=num_epochs,
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size,
        warmup_steps=100,
        weight_decay=0.01,
        # upstream also passes logging_dir="./logs": transformers 5 removed that argument
        # (a TypeError with or without peakmem), the re-creation's only change
        logging_steps=eval_step,
        save_steps=save_step,
        save_total_limit=2,
        push_to_hub=push_to_hub,
        hub_model_id=hub_model_id,
        gradient_accumulation_steps=16,
        fp16=True,
        learning_rate=learning_rate,
        hub_token=hf_token,
    )

    accelerator_module.empty_cache()

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=tokenized_datasets["train"],
        eval_dataset=tokenized_datasets["test"],
        data_collator=data_collator,
    )
    trainer.train()

    if push_to_hub:
        trainer.push_to_hub(commit_message="Fine-tuned model")

    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Fine-tune LLaMA with DoRA and PEFT")
    parser.add_argument("--base_model", type=str, default="huggyllama/llama-7b", help="Base model path or name")
    parser.add_argument("--data_path", type=str, default="timdettmers/openassistant-guanaco", help="Dataset path or name")
    parser.add_argument("--output_dir", type=str, default="path/to/output", help="Where the adapter goes")
    parser.add_argument("--batch_size", type=int, default=1)
    parser.add_argument("--num_epochs", type=int, default=1)
    parser.add_argument("--learning_rate", type=float, default=3e-4)
    parser.add_argument("--cutoff_len", type=int, default=512, help="Length every example is padded / cut to")
    parser.add_argument("--val_set_size", type=int, default=500)
    parser.add_argument("--use_dora", action="store_true", help="Apply DoRA")
    parser.add_argument("--quantize", action="store_true", help="Load the base model in 4-bit")
    parser.add_argument("--eval_step", type=int, default=10)
    parser.add_argument("--save_step", type=int, default=100)
    parser.add_argument("--device", type=str, default="cuda:0")
    parser.add_argument("--lora_r", type=int, default=8)
    parser.add_argument("--lora_alpha", type=int, default=16)
    parser.add_argument("--lora_dropout", type=float, default=0.05)
    parser.add_argument("--lora_target_modules", type=str, default=None, help="Comma-separated target modules")
    parser.add_argument("--hub_model_id", type=str, default="path/to/repo")
    parser.add_argument("--push_to_hub", action="store_true")
    args = parser.parse_args()
    train_model(**{name: getattr(args, name) for name in (
        "base_model", "data_path", "output_dir", "batch_size", "num_epochs", "learning_rate", "cutoff_len",
        "val_set_size", "use_dora", "quantize", "eval_step", "save_step", "device", "lora_r", "lora_alpha",
        "lora_dropout", "lora_target_modules", "hub_model_id", "push_to_hub")})
