"""What transformers 4.51.3 (xMem's pin) allocated that the installed transformers (5.x) does
not, put back into the installed modules so that xMem's Hugging Face job allocates as it did.

Each behaviour is one entry of `BEHAVIOURS`: a name, the 4.51.3 source it reproduces, and an
`apply(model)` that patches the installed transformers (or the built model) in place. Found by
capturing the same xMem jobs with transformers 4.51.3 and with 5.x and diffing what is live at
the allocated peak (docs/BENCHMARKS.md, "xMem's Hugging Face runs: transformers 4.51.3"):

- `cache_keeps_first_states`: 4.51.3 `cache_utils.DynamicCache.update` appends the first
  key/value states of a layer as they are (`self.key_cache.append(key_states)`); 5.x
  `DynamicLayer.update` starts from an empty tensor and `torch.cat`s, a copy of every layer's
  keys and values that the returned cache (`outputs.past_key_values`) then holds. In 4.51 the
  cache holds the projections themselves (no bytes of its own), and the attention reads them in
  their strided (B, T, H, D)-transposed layout.
- `sdpa_contiguous_inputs`: 4.51.3 `integrations/sdpa_attention.py` `sdpa_attention_forward`
  repeats grouped key/value heads with `repeat_kv` (a copy) and then calls `.contiguous()` on
  query, key and value before `scaled_dot_product_attention` (a copy of each strided input,
  which SDPA saves for backward); 5.x passes the strided views (and `enable_gqa`). Only the
  model types whose 4.51.3 attention went through that function (`SDPA_VIA_INTEGRATION`):
  4.51.3's OPT had its own `OPTSdpaAttention`, which called SDPA on the strided views.
- `gpt2_causal_bias_buffers`: 4.51.3 `GPT2Attention.__init__` registers a non-persistent
  `bias` buffer (a `max_positions` x `max_positions` bool lower triangle) and `masked_bias` in
  every layer; they move to the GPU with the model. 5.x dropped them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

XMEM_TRANSFORMERS = "4.51.3"


@dataclass(frozen=True)
class Behaviour:
    name: str
    source: str
    """The transformers 4.51.3 code it reproduces."""
    apply: Callable[[torch.nn.Module], Callable[[], None]]
    """Patch for `model`; returns what undoes the patch (jobs run in-process one after another,
    so no patch may outlive its job)."""


def _nothing_to_undo() -> None:
    return None


def _keep_first_states(layer, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
    """4.51.3 DynamicCache.update: the first states of a layer are stored as they are; later
    ones are concatenated."""
    if not layer.is_initialized:
        layer.lazy_initialization(key_states, value_states)
        layer.keys, layer.values = key_states, value_states
        return layer.keys, layer.values
    layer.keys = torch.cat([layer.keys, key_states], dim=-2)
    layer.values = torch.cat([layer.values, value_states], dim=-2)
    return layer.keys, layer.values


def cache_keeps_first_states(model: torch.nn.Module) -> Callable[[], None]:
    from transformers import cache_utils

    layer_class = getattr(cache_utils, "DynamicLayer", None)
    if layer_class is None or "update" not in vars(layer_class):
        return _nothing_to_undo
    installed = vars(layer_class)["update"]
    layer_class.update = _keep_first_states

    def undo() -> None:
        layer_class.update = installed

    return undo


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """4.51.3 `repeat_kv`: (B, kv_heads, T, D) -> (B, kv_heads * n_rep, T, D), a copy."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def sdpa_attention_forward_451(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """4.51.3 `sdpa_attention_forward`; a 5.x module that does not pass `is_causal` (an
    encoder's `module.is_causal` False) is honoured as 5.x would."""
    if hasattr(module, "num_key_value_groups"):
        key = repeat_kv(key, module.num_key_value_groups)
        value = repeat_kv(value, module.num_key_value_groups)
    causal_mask = attention_mask
    if attention_mask is not None and causal_mask.ndim == 4:
        causal_mask = causal_mask[:, :, :, : key.shape[-2]]
    query = query.contiguous()
    key = key.contiguous()
    value = value.contiguous()
    if is_causal is None:
        is_causal = query.shape[2] > 1 and causal_mask is None and getattr(module, "is_causal", True)
    attn_output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=causal_mask, dropout_p=dropout, scale=scaling,
        is_causal=bool(is_causal),
    )
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, None


SDPA_VIA_INTEGRATION = frozenset({"gpt2", "llama", "qwen2", "qwen3", "gemma2"})
"""Model types of xMem's set whose 4.51.3 modeling file dispatched attention through
`ALL_ATTENTION_FUNCTIONS` (GPT-Neo, OPT and T5 had their own attention code)."""


def sdpa_contiguous_inputs(model: torch.nn.Module) -> Callable[[], None]:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if getattr(model.config, "model_type", None) not in SDPA_VIA_INTEGRATION:
        return _nothing_to_undo
    had_local = "sdpa" in ALL_ATTENTION_FUNCTIONS._local_mapping
    installed = ALL_ATTENTION_FUNCTIONS._local_mapping.get("sdpa")
    ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa_attention_forward_451

    def undo() -> None:
        if had_local:
            ALL_ATTENTION_FUNCTIONS["sdpa"] = installed
        else:
            del ALL_ATTENTION_FUNCTIONS["sdpa"]

    return undo


def gpt2_causal_bias_buffers(model: torch.nn.Module) -> Callable[[], None]:
    """Register 4.51.3's per-layer `bias` / `masked_bias` buffers on GPT-2 attention modules
    that lack them (on the module's device, as `model.to` would have moved them)."""
    if getattr(model.config, "model_type", None) != "gpt2":
        return _nothing_to_undo
    positions = model.config.max_position_embeddings
    for module in model.modules():
        if type(module).__name__ != "GPT2Attention" or hasattr(module, "bias"):
            continue
        device = module.c_attn.weight.device
        bias = torch.tril(torch.ones((positions, positions), dtype=torch.bool, device=device))
        module.register_buffer("bias", bias.view(1, 1, positions, positions), persistent=False)
        module.register_buffer("masked_bias", torch.tensor(-1e4, device=device), persistent=False)
    return _nothing_to_undo  # the buffers belong to this model only


BEHAVIOURS: tuple[Behaviour, ...] = (
    Behaviour("cache_keeps_first_states", "cache_utils.py DynamicCache.update", cache_keeps_first_states),
    Behaviour("sdpa_contiguous_inputs", "integrations/sdpa_attention.py sdpa_attention_forward",
              sdpa_contiguous_inputs),
    Behaviour("gpt2_causal_bias_buffers", "models/gpt2/modeling_gpt2.py GPT2Attention.__init__",
              gpt2_causal_bias_buffers),
)


def installed_is_xmem_transformers() -> bool:
    import transformers

    return transformers.__version__ == XMEM_TRANSFORMERS


@contextmanager
def transformers_451(model: torch.nn.Module) -> Iterator[list[str]]:
    """Within the block the installed transformers allocates for `model` as 4.51.3 did (nothing
    changes when 4.51.3 itself is installed); yields the names of the behaviours applied, and
    undoes every patch on the way out."""
    undos: list[Callable[[], None]] = []
    applied: list[str] = []
    try:
        if not installed_is_xmem_transformers():
            for behaviour in BEHAVIOURS:
                undos.append(behaviour.apply(model))
                applied.append(behaviour.name)
        yield applied
    finally:
        for undo in reversed(undos):
            undo()
