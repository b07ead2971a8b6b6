"""Public `config.json` values of the Hugging Face models in xMem's evaluation, hard-coded so the
models build from their configs without any download (random weights, as xMem built them with
`AutoConfig.from_pretrained(name)` + `AutoModelFor*.from_config(config)`).

Only what shapes the model and its training memory is kept (sizes, activation, dropout, tying);
tokenizer ids are left at the config class defaults. `torch_dtype` is left out on purpose: the
models are built and trained in float32 (see `benchmarks/zoo/xmem_hf.py`).

`attn` is the attention implementation transformers 4.51.3 (xMem's pin) picks by default for a
model built with `from_config`: "sdpa" where the model class supported it, else "eager"
(GPT-Neo and T5 had no SDPA path in 4.51). Checked by building each config with 4.51.3's
`AutoModelFor*.from_config`: every entry matches except Gemma-2, which 4.51.3 builds with "sdpa"
too (it only warns that eager is recommended for training) but the installed transformers
refuses SDPA for Gemma-2, so it stays "eager" here: at xMem's batch 1 x 128 tokens eager's
extra score tensors are (1, 8, 128, 128) float32 per layer, well under 0.1% of its ~20 GB.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class HFModel:
    name: str
    """The Hugging Face Hub id as xMem's runs record it."""
    model_type: str
    """transformers' model_type (AutoConfig.for_model)."""
    model_class: str
    """The AutoModel class xMem's `from_config` resolved to."""
    values: dict
    attn: str
    parameters: int
    """Public parameter count of the model as built here (tests check it)."""
    source: str
    aliases: tuple[str, ...] = field(default_factory=tuple)


_GPT2_BASE = dict(
    vocab_size=50257, n_positions=1024, n_embd=768, n_head=12, activation_function="gelu_new",
    resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, layer_norm_epsilon=1e-5,
)
_T5_BASE = dict(
    vocab_size=32128, d_kv=64, relative_attention_num_buckets=32, dropout_rate=0.1,
    layer_norm_epsilon=1e-6, feed_forward_proj="relu", tie_word_embeddings=True,
    decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, n_positions=512,
)

MODELS: dict[str, HFModel] = {
    m.name: m
    for m in (
        HFModel(
            "openai-community/gpt2", "gpt2", "AutoModelForCausalLM",
            dict(_GPT2_BASE, n_layer=12), "sdpa", 124_439_808,
            "https://huggingface.co/openai-community/gpt2/blob/main/config.json",
            aliases=("gpt2",),
        ),
        HFModel(
            "distilbert/distilgpt2", "gpt2", "AutoModelForCausalLM",
            dict(_GPT2_BASE, n_layer=6), "sdpa", 81_912_576,
            "https://huggingface.co/distilbert/distilgpt2/blob/main/config.json",
            aliases=("distilgpt2",),
        ),
        HFModel(
            "cerebras/Cerebras-GPT-111M", "gpt2", "AutoModelForCausalLM",
            dict(
                vocab_size=50257, n_positions=2048, n_embd=768, n_layer=10, n_head=12,
                n_inner=3072, activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
                attn_pdrop=0.0, layer_norm_epsilon=1e-5,
            ),
            "sdpa", 111_050_496,
            "https://huggingface.co/cerebras/Cerebras-GPT-111M/blob/main/config.json",
        ),
        HFModel(
            "EleutherAI/gpt-neo-125M", "gpt_neo", "AutoModelForCausalLM",
            dict(
                vocab_size=50257, max_position_embeddings=2048, hidden_size=768, num_layers=12,
                num_heads=12, attention_types=[[["global", "local"], 6]], window_size=256,
                intermediate_size=None, activation_function="gelu_new", embed_dropout=0.0,
                attention_dropout=0.0, resid_dropout=0.0, layer_norm_epsilon=1e-5,
            ),
            "eager", 125_198_592,
            "https://huggingface.co/EleutherAI/gpt-neo-125m/blob/main/config.json",
        ),
        HFModel(
            "facebook/opt-125m", "opt", "AutoModelForCausalLM",
            dict(
                vocab_size=50272, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                ffn_dim=3072, max_position_embeddings=2048, word_embed_proj_dim=768,
                do_layer_norm_before=True, dropout=0.1, attention_dropout=0.0,
                activation_dropout=0.0, activation_function="relu", pad_token_id=1,
                bos_token_id=2, eos_token_id=2,
            ),
            "sdpa", 125_239_296,
            "https://huggingface.co/facebook/opt-125m/blob/main/config.json",
        ),
        HFModel(
            "facebook/opt-350m", "opt", "AutoModelForCausalLM",
            dict(
                vocab_size=50272, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                ffn_dim=4096, max_position_embeddings=2048, word_embed_proj_dim=512,
                do_layer_norm_before=False, dropout=0.1, attention_dropout=0.0,
                activation_dropout=0.0, activation_function="relu", pad_token_id=1,
                bos_token_id=2, eos_token_id=2,
            ),
            "sdpa", 331_196_416,
            "https://huggingface.co/facebook/opt-350m/blob/main/config.json",
        ),
        HFModel(
            "T5-small", "t5", "AutoModelForSeq2SeqLM",
            dict(_T5_BASE, d_model=512, d_ff=2048, num_layers=6, num_heads=8),
            "eager", 60_506_624,
            "https://huggingface.co/google-t5/t5-small/blob/main/config.json",
            aliases=("t5-small", "google-t5/t5-small"),
        ),
        HFModel(
            "t5-base", "t5", "AutoModelForSeq2SeqLM",
            dict(_T5_BASE, d_model=768, d_ff=3072, num_layers=12, num_heads=12),
            "eager", 222_903_552,
            "https://huggingface.co/google-t5/t5-base/blob/main/config.json",
            aliases=("T5-base", "google-t5/t5-base"),
        ),
        # The Colab A100 runs (batch 1).
        HFModel(
            "Qwen/Qwen3-4B", "qwen3", "AutoModelForCausalLM",
            dict(
                vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, hidden_act="silu", max_position_embeddings=40960,
                rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False,
                attention_dropout=0.0, tie_word_embeddings=True, use_sliding_window=False,
            ),
            "sdpa", 4_022_468_096,
            "https://huggingface.co/Qwen/Qwen3-4B/blob/main/config.json",
        ),
        HFModel(
            "meta-llama/Llama-3.2-3B-Instruct", "llama", "AutoModelForCausalLM",
            dict(
                vocab_size=128256, hidden_size=3072, intermediate_size=8192,
                num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                head_dim=128, hidden_act="silu", max_position_embeddings=131072,
                rms_norm_eps=1e-5, rope_theta=500000.0,
                rope_scaling={
                    "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                    "original_max_position_embeddings": 8192, "rope_type": "llama3",
                },
                attention_bias=False, mlp_bias=False, tie_word_embeddings=True,
            ),
            "sdpa", 3_212_749_824,
            "https://huggingface.co/meta-llama/Llama-3.2-3B-Instruct/blob/main/config.json",
        ),
        HFModel(
            "google/gemma-2-2b-it", "gemma2", "AutoModelForCausalLM",
            dict(
                vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                head_dim=256, hidden_activation="gelu_pytorch_tanh",
                max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0,
                query_pre_attn_scalar=256, sliding_window=4096,
                final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                attention_bias=False, attention_dropout=0.0, tie_word_embeddings=True,
            ),
            "eager", 2_614_341_888,
            "https://huggingface.co/google/gemma-2-2b-it/blob/main/config.json",
        ),
        HFModel(
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "qwen2", "AutoModelForCausalLM",
            dict(
                vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-6,
                rope_theta=10000.0, sliding_window=4096, max_window_layers=21,
                use_sliding_window=False, attention_dropout=0.0, tie_word_embeddings=False,
            ),
            "sdpa", 1_777_088_000,
            "https://huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B/blob/main/config.json",
        ),
    )
}

_BY_ALIAS = {alias.lower(): m for m in MODELS.values() for alias in (m.name, *m.aliases)}


def lookup(name: str) -> HFModel | None:
    """The model for an xMem model name (Hub ids are case-insensitive), or None."""
    return _BY_ALIAS.get(name.lower())
