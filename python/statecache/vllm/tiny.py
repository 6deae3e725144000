"""A tiny Qwen3-Next (Gated DeltaNet + attention) with real random weights,
written to a folder vLLM loads with no hub access: for the connector's tests,
the benchmark and trying the connector on a laptop.

Random weights from a fixed seed, saved as safetensors (not vLLM's
``load_format="dummy"``, which seeds every tensor alike so the model only
echoes its input). The GDN heads decay slowly (``A_log`` small), so the
recurrent state carries context a long way and a wrong state changes greedy
tokens.
"""

from __future__ import annotations

import json
import os

TINY_CONFIG = dict(
    vocab_size=1024,
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    # every expert on every token: a router flip would turn BF16 rounding
    # into another expert's output
    num_experts=2,
    num_experts_per_tok=2,
    full_attention_interval=4,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
)


def write_tiny_qwen3next(folder: str, seed: int = 0, **overrides) -> str:
    """Writes ``config.json`` and ``model.safetensors`` of a tiny random
    Qwen3-Next into ``folder`` (created if needed); returns ``folder``.
    ``overrides`` replace entries of ``TINY_CONFIG``. Raises ImportError
    without torch, transformers and safetensors."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    os.makedirs(folder, exist_ok=True)
    cfg = Qwen3NextConfig(**{**TINY_CONFIG, **overrides})
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(cfg).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(seed + 1)
    state = {}
    for name, t in model.state_dict().items():
        t = t.detach().clone()
        if name.endswith("A_log"):
            # decay exp(-A * softplus(.)) close to 1: the state remembers far back
            t = torch.empty(t.shape).uniform_(1e-4, 2e-3, generator=gen).log().to(t.dtype)
        elif t.dim() >= 2 and "norm" not in name:
            # larger than the default init, so tokens and context matter
            t = (torch.randn(t.shape, generator=gen) * 0.06).to(t.dtype)
        state[name] = t.contiguous()
    save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    conf = cfg.to_dict()
    conf["architectures"] = ["Qwen3NextForCausalLM"]
    conf["torch_dtype"] = "bfloat16"
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(conf, f, indent=1)
    return folder
