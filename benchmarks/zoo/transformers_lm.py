"""Hugging Face transformers (BERT, GPT-2, T5, OPT, a Llama-style ~1.2B) built from configs,
random weights (no downloads), trained on synthetic token ids."""

from __future__ import annotations

import argparse

import torch
from _common import base_parser, build_on, report, setup, train
from torch import nn

# name -> (model class, config class, config kwargs)
MODELS: dict[str, tuple[str, str, dict]] = {
    "bert-base": (
        "BertForMaskedLM",
        "BertConfig",
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    ),
    "bert-large": (
        "BertForMaskedLM",
        "BertConfig",
        dict(
            hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
        ),
    ),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=768, n_layer=12, n_head=12)),
    "gpt2-medium": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=1024, n_layer=24, n_head=16)),
    "gpt2-large": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=1280, n_layer=36, n_head=20)),
    "t5-small": (
        "T5ForConditionalGeneration",
        "T5Config",
        dict(
            d_model=512,
            d_ff=2048,
            d_kv=64,
            num_layers=6,
            num_heads=8,
            decoder_start_token_id=0,
            pad_token_id=0,
        ),
    ),
    "t5-base": (
        "T5ForConditionalGeneration",
        "T5Config",
        dict(
            d_model=768,
            d_ff=3072,
            d_kv=64,
            num_layers=12,
            num_heads=12,
            decoder_start_token_id=0,
            pad_token_id=0,
        ),
    ),
    "opt-125m": (
        "OPTForCausalLM",
        "OPTConfig",
        dict(
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            ffn_dim=3072,
            vocab_size=50272,
            max_position_embeddings=2048,
            word_embed_proj_dim=768,
        ),
    ),
    "opt-350m": (
        "OPTForCausalLM",
        "OPTConfig",
        dict(
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            ffn_dim=4096,
            vocab_size=50272,
            max_position_embeddings=2048,
            word_embed_proj_dim=512,
            do_layer_norm_before=False,
        ),
    ),
    # Llama-3.2-1B's shape (1.24B parameters, GQA 32/8, tied embeddings)
    "llama-1b": (
        "LlamaForCausalLM",
        "LlamaConfig",
        dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            rope_theta=500000.0,
        ),
    ),
    # Llama-3-8B's shape (8.03B parameters, GQA 32/8, untied embeddings)
    "llama-8b": (
        "LlamaForCausalLM",
        "LlamaConfig",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            max_position_embeddings=8192,
            tie_word_embeddings=False,
            rope_theta=500000.0,
        ),
    ),
    # Qwen2-0.5B's shape (0.49B parameters, GQA 14/2, tied embeddings)
    "qwen2-0.5b": (
        "Qwen2ForCausalLM",
        "Qwen2Config",
        dict(
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
        ),
    ),
}

# override knob -> the config key per config class
_OVERRIDE_KEYS = {
    "num_layers": {"GPT2Config": "n_layer", "T5Config": "num_layers"},
    "hidden_size": {"GPT2Config": "n_embd", "T5Config": "d_model"},
    "num_heads": {"GPT2Config": "n_head", "T5Config": "num_heads"},
    "intermediate_size": {"GPT2Config": "n_inner", "T5Config": "d_ff", "OPTConfig": "ffn_dim"},
}
_DEFAULT_KEYS = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
}


def make_config(args: argparse.Namespace):
    import transformers

    _, config_name, kwargs = MODELS[args.model]
    kwargs = dict(kwargs)
    for knob, default_key in _DEFAULT_KEYS.items():
        value = getattr(args, knob)
        if value is not None:
            kwargs[_OVERRIDE_KEYS[knob].get(config_name, default_key)] = value
    if args.num_heads is not None and "num_key_value_heads" in kwargs:
        kwargs["num_key_value_heads"] = args.num_heads
    if args.hidden_size is not None and config_name == "OPTConfig":
        kwargs["word_embed_proj_dim"] = args.hidden_size
    if args.hidden_size is not None and config_name == "T5Config":
        kwargs["d_kv"] = args.hidden_size // kwargs.get("num_heads", 8)
    if args.vocab_size is not None:
        kwargs["vocab_size"] = args.vocab_size
    config = getattr(transformers, config_name)(**kwargs)
    config.use_cache = False
    config._attn_implementation = args.attn
    return config


def build(args: argparse.Namespace) -> nn.Module:
    import transformers

    model_name = MODELS[args.model][0]
    return getattr(transformers, model_name)(make_config(args))


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--target-len", type=int, default=None, help="T5 decoder length")
    parser.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    parser.add_argument("--num-layers", type=int, default=None, help="override the config")
    parser.add_argument("--hidden-size", type=int, default=None, help="override the config")
    parser.add_argument("--num-heads", type=int, default=None, help="override the config")
    parser.add_argument("--intermediate-size", type=int, default=None, help="override")
    parser.add_argument("--vocab-size", type=int, default=None, help="override the config")
    parser.add_argument("--weights-dtype", choices=["fp32", "bf16"], default="fp32",
                        help="dtype the weights are created in (bf16: pure-bf16 training)")
    args = parser.parse_args()
    device = setup(args)
    weights_dtype = torch.bfloat16 if args.weights_dtype == "bf16" else torch.float32
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(weights_dtype)
    try:
        model = build_on(device, lambda: build(args))
    finally:
        torch.set_default_dtype(previous_dtype)
    if args.grad_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable({"use_reentrant": False})
    vocab = model.config.vocab_size
    is_t5 = MODELS[args.model][0].startswith("T5")
    target_len = args.target_len or args.seq_len

    def make_batch():
        ids = torch.randint(0, vocab, (args.batch_size, args.seq_len), device=device)
        if is_t5:
            labels = torch.randint(0, vocab, (args.batch_size, target_len), device=device)
            return {"input_ids": ids, "labels": labels}
        return {"input_ids": ids, "labels": ids}

    def loss_fn(m, batch):
        return m(**batch).loss

    report(args.model, train(model, make_batch, loss_fn, args))


if __name__ == "__main__":
    main()
