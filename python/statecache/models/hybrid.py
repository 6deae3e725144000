"""Tiny random hybrid models from transformers, and where their state lives.

Two architectures, both with recurrent layers interleaved with attention:

* ``qwen3next``: Qwen3-Next (Gated DeltaNet + gated attention, MoE MLP);
* ``granite``: GraniteMoeHybrid (Mamba2 mixers + attention), the Mamba2 family.

Both read and write their recurrent state through transformers' ``Cache``
API (``get_conv_state`` / ``update_recurrent_state``), which is what lets the
runner stage a request's state from a slot of statecache's tensors and put it
back after the forward. Weights are random from a fixed seed; the torch
fallback kernels run on CPU (no flash-linear-attention, no mamba_ssm).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MODELS = ("qwen3next", "granite")


def _qwen3next(vocab: int):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        full_attention_interval=2,
        max_position_embeddings=4096,
    )
    return Qwen3NextForCausalLM(cfg)


def _granite(vocab: int):
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    cfg = GraniteMoeHybridConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["mamba", "attention", "mamba", "attention"],
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_n_groups=1,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=1,
        num_local_experts=0,
        shared_intermediate_size=128,
        position_embedding_type="rope",
        max_position_embeddings=4096,
    )
    return GraniteMoeHybridForCausalLM(cfg)


@dataclass
class HybridGeometry:
    """Per-layer shapes, found by one probe forward through a DynamicCache."""

    recurrent_layers: list[int]  # model layer index of each recurrent layer
    attention_layers: list[int]  # model layer index of each attention layer
    conv_shape: tuple  # one slot's conv state, per recurrent layer
    ssm_shape: tuple  # one slot's recurrent state, per recurrent layer
    kv_heads: int
    head_dim: int
    conv_kernel: int
    dtype: torch.dtype


def build_model(name: str = "qwen3next", seed: int = 0, vocab_size: int = 256, device: str = "cpu"):
    """The model (eval mode, on ``device``) and its :class:`HybridGeometry`."""
    builders = {"qwen3next": _qwen3next, "granite": _granite}
    if name not in builders:
        raise ValueError(f"model={name!r}: choose one of {', '.join(MODELS)}")
    torch.manual_seed(seed)
    model = builders[name](vocab_size).eval().to(device)
    return model, probe_geometry(model)


@torch.no_grad()
def probe_geometry(model) -> HybridGeometry:
    from transformers import DynamicCache
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.zeros((1, 2), dtype=torch.long, device=device), cache=cache, use_cache=True)
    rec, att = [], []
    conv_shape = ssm_shape = None
    kv_heads = head_dim = 0
    kernel = 0
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            rec.append(i)
            conv_shape = tuple(layer.conv_states[0].shape[1:])
            ssm_shape = tuple(layer.recurrent_states[0].shape[1:])
            kernel = layer.conv_kernel_size[0]
        else:
            att.append(i)
            kv_heads, head_dim = layer.keys.shape[1], layer.keys.shape[3]
    if not rec or not att:
        raise ValueError(f"{type(model).__name__} is not a hybrid (recurrent {rec}, attention {att})")
    return HybridGeometry(rec, att, conv_shape, ssm_shape, kv_heads, head_dim, kernel, next(model.parameters()).dtype)
