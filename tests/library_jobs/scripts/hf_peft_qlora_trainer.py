# ruff: noqa: UP045  (kept as the original script writes it)
"""QLoRA fine-tuning with the Trainer, as Hugging Face's QLoRA notebook and blog post run it
(huggingface/peft examples, "Fine-tune a LLM with QLoRA"; blog "Making LLMs even more accessible
with bitsandbytes, 4-bit quantization and QLoRA"), with the HfArgumentParser structure of
transformers' examples/pytorch scripts.

`BitsAndBytesConfig(load_in_4bit=True, nf4, double quant, bf16 compute)`, `from_pretrained(...,
quantization_config=..., device_map={"": 0})`, `gradient_checkpointing_enable()`,
`prepare_model_for_kbit_training`, `LoraConfig` + `get_peft_model`, `Trainer` with
`DataCollatorForLanguageModeling(mlm=False)` and a paged 8-bit AdamW. `--method` picks the PEFT
method instead of QLoRA for the same loop: `lora` (no quantization), `prompt_tuning`, `ia3`.
"""

import logging
import sys
from dataclasses import dataclass, field
from typing import Optional

import torch
import transformers
from peft import (
    IA3Config,
    LoraConfig,
    PromptTuningConfig,
    PromptTuningInit,
    TaskType,
    get_peft_model,
    prepare_model_for_kbit_training,
)
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)

from datasets import load_dataset

logger = logging.getLogger(__name__)


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(metadata={"help": "base model (a local directory here)"})
    train_file: str = field(metadata={"help": "a text file, one example a line"})
    method: str = field(default="qlora", metadata={"choices": ["qlora", "lora", "prompt_tuning", "ia3"]})
    lora_r: int = field(default=8)
    lora_alpha: int = field(default=32)
    num_virtual_tokens: int = field(default=8)
    max_length: int = field(default=32)
    max_train_samples: Optional[int] = field(default=None)


def peft_config(args: ScriptArguments):
    if args.method in ("qlora", "lora"):
        return LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, target_modules=["q_proj", "v_proj"],
                          lora_dropout=0.05, bias="none", task_type="CAUSAL_LM")
    if args.method == "prompt_tuning":
        return PromptTuningConfig(task_type=TaskType.CAUSAL_LM, prompt_tuning_init=PromptTuningInit.RANDOM,
                                  num_virtual_tokens=args.num_virtual_tokens)
    return IA3Config(task_type=TaskType.CAUSAL_LM, target_modules=["k_proj", "v_proj", "down_proj"],
                     feedforward_modules=["down_proj"])


def main():
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    args, training_args = parser.parse_args_into_dataclasses()

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
    transformers.utils.logging.set_verbosity_info()
    set_seed(training_args.seed)

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    if args.method == "qlora":
        bnb_config = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_use_double_quant=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, quantization_config=bnb_config,
                                                     device_map={"": 0})
        model.gradient_checkpointing_enable()
        model = prepare_model_for_kbit_training(model)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    model = get_peft_model(model, peft_config(args))
    model.print_trainable_parameters()

    data = load_dataset("text", data_files={"train": args.train_file})["train"]
    if args.max_train_samples is not None:
        data = data.select(range(args.max_train_samples))
    data = data.map(lambda samples: tokenizer(samples["text"], truncation=True, max_length=args.max_length,
                                              padding="max_length"),
                    batched=True, remove_columns=["text"])

    model.config.use_cache = False  # silence the warnings. Please re-enable for inference!
    trainer = Trainer(
        model=model,
        train_dataset=data,
        args=training_args,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )
    trainer.train()


if __name__ == "__main__":
    main()
