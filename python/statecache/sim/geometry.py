"""Model geometry presets: what a checkpoint costs and what a prefix hit saves.

Every figure is derived from a published model configuration; the arithmetic
is written out in each preset's docstring so it can be checked by hand.
Conventions:

* State bytes are one *checkpoint image*: the conv state plus the recurrent
  (SSM / delta-rule) state of every recurrent layer, in the serving dtype.
  Conv states hold ``conv_kernel - 1`` columns (as vLLM and SGLang keep
  them), except where a paper's own accounting is reproduced (hybrid 7B).
* KV bytes per token: ``attention layers x 2 (K and V) x kv heads x head dim x
  dtype bytes``.
* FLOPs count a multiply-add as 2. Per-token work that does not depend on the
  position (projections, MLP / active experts, the recurrent update) is
  ``flops_per_token``; attention's score and value products add
  ``attention_flops_per_context_token`` per earlier token, so prefilling
  tokens ``[a, b)`` costs ``(b - a) * flops_per_token + c * sum(p + 1 for p in
  range(a, b))``. Embedding lookups and the LM head (run once per prefill)
  are left out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelGeometry:
    """The numbers of a hybrid model the simulator needs (see module doc)."""

    name: str
    description: str
    recurrent_layers: int
    attention_layers: int
    state_bytes: int
    kv_bytes_per_token: int
    recurrent_flops_per_token: int
    attention_flops_per_token: int
    attention_flops_per_context_token: int
    other_flops_per_token: int

    @property
    def flops_per_token(self) -> int:
        """Position-independent FLOPs of one token through the whole stack."""
        return self.recurrent_flops_per_token + self.attention_flops_per_token + self.other_flops_per_token

    def prefill_flops(self, start: int, end: int) -> int:
        """FLOPs to prefill tokens ``[start, end)`` with ``[0, start)`` cached."""
        if start < 0 or end < start:
            raise ValueError(f"need 0 <= start <= end, got start={start!r} end={end!r}")
        n = end - start
        # each token at position p attends to p + 1 positions (itself included)
        context = (start + 1 + end) * n // 2
        return n * self.flops_per_token + self.attention_flops_per_context_token * context

    def kv_bytes(self, tokens: int) -> int:
        return self.kv_bytes_per_token * tokens


def _qwen3_next_80b_a3b() -> ModelGeometry:
    """Qwen3-Next-80B-A3B (Qwen/Qwen3-Next-80B-A3B-Instruct config.json), bf16.

    48 layers, ``full_attention_interval`` 4: 36 Gated DeltaNet + 12 gated
    attention layers; hidden 2048.

    State, per GDN layer (16 key heads, 32 value heads, head dims 128, conv 4):
      recurrent state 32 x 128 x 128              = 524,288 elements
      conv state (2*16*128 + 32*128) x (4 - 1)    =  24,576 elements
      (524,288 + 24,576) x 2 bytes                = 1,097,728 bytes
      x 36 layers                                 = 39,518,208 bytes
    KV per token: 12 layers x 2 x 2 kv heads x 256 x 2 bytes = 24,576 bytes.

    FLOPs per token:
      GDN projections 2048 x (2*2048 + 2*4096) + 2048 x 64 + 8192 x 4 + 4096 x 2048
        = 33,718,272 weights -> 67,436,544; delta-rule update ~7 x 128 x 128 per
        value head x 32 = 3,670,016; per layer 71,106,560, x 36 = 2,559,836,160.
      attention projections 2048 x (16*256*2) + 2 x 2048 x 512 + 4096 x 2048
        = 27,262,976 weights -> 54,525,952 per layer, x 12 = 654,311,424;
        per context token 2 x 2 x 16 x 256 = 16,384 per layer, x 12 = 196,608.
      MoE, every layer: router 2048 x 512 + 10 routed + 1 shared expert of
        3 x 2048 x 512 = 35,651,584 weights -> 71,303,168, x 48 = 3,422,552,064.
    """
    return ModelGeometry(
        name="qwen3-next-80b-a3b",
        description="Qwen3-Next-80B-A3B: 36 Gated DeltaNet + 12 attention layers, bf16",
        recurrent_layers=36,
        attention_layers=12,
        state_bytes=36 * 2 * (32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3),
        kv_bytes_per_token=12 * 2 * 2 * 256 * 2,
        recurrent_flops_per_token=36
        * (2 * (2048 * (2 * 2048 + 2 * 4096) + 2048 * 64 + 8192 * 4 + 4096 * 2048) + 7 * 128 * 128 * 32),
        attention_flops_per_token=12 * 2 * (2048 * 16 * 256 * 2 + 2 * 2048 * 512 + 4096 * 2048),
        attention_flops_per_context_token=12 * 2 * 2 * 16 * 256,
        other_flops_per_token=48 * 2 * (2048 * 512 + 11 * 3 * 2048 * 512),
    )


def _mamba_codestral_7b() -> ModelGeometry:
    """Mamba-Codestral-7B-v0.1 (mistralai; the transformers Mamba2Config
    defaults): 64 Mamba2 layers, hidden 4096, expand 2 (d_inner 8192),
    128 heads of dim 64, state 128, 8 groups, conv 4; bf16; no attention.

    State, per layer:
      SSM state 128 x 64 x 128                    = 1,048,576 elements
      conv state (8192 + 2*8*128) x (4 - 1)       =    30,720 elements
      (1,048,576 + 30,720) x 2 bytes              = 2,158,592 bytes
      x 64 layers                                 = 138,149,888 bytes
    KV per token: 0 (the hash index still names prefixes; nothing is stored).

    FLOPs per token, per layer: in_proj 4096 x (2*8192 + 2*8*128 + 128) +
      conv 10,240 x 4 + out_proj 8192 x 4096 = 109,617,152 weights ->
      219,234,304; SSD update ~5 x 1,048,576 = 5,242,880; x 64 layers.
    """
    return ModelGeometry(
        name="mamba-codestral-7b",
        description="Mamba-Codestral-7B: 64 Mamba2 layers, bf16, attention-free",
        recurrent_layers=64,
        attention_layers=0,
        state_bytes=64 * 2 * (128 * 64 * 128 + (8192 + 2 * 8 * 128) * 3),
        kv_bytes_per_token=0,
        recurrent_flops_per_token=64
        * (2 * (4096 * (2 * 8192 + 2 * 8 * 128 + 128) + 10240 * 4 + 8192 * 4096) + 5 * 128 * 64 * 128),
        attention_flops_per_token=0,
        attention_flops_per_context_token=0,
        other_flops_per_token=0,
    )


def _hybrid_7b() -> ModelGeometry:
    """The Attention-Mamba2 hybrid 7B that hybrid prefix-caching papers
    (Marconi, MLSys'25) evaluate on: 24 Mamba2 + 4 attention layers (+ 28
    MLP layers, the NVIDIA Mamba-2-Hybrid layout), d_model 4096, state 128,
    fp16.

    State, with the paper's accounting, per Mamba2 layer:
      SSM state d_model x d_state = 4096 x 128         = 524,288 elements
      conv state conv_kernel x (2*4096 + 2*128) = 4 x 8448 = 33,792 elements
      (524,288 + 33,792) x 2 bytes                     = 1,116,160 bytes
      x 24 layers                                      = 26,787,840 bytes
    KV per token: 4 layers x 2 x 4096 (32 heads x 128) x 2 bytes = 65,536.

    FLOPs per token:
      Mamba2 layer: in_proj 4096 x (2*8192 + 2*128 + 128 heads) + conv 8448 x 4
        + out_proj 8192 x 4096 = 102,269,952 weights -> 204,539,904; update
        ~5 x 524,288 = 2,621,440; x 24.
      attention layer: 4 x 4096 x 4096 weights -> 134,217,728, x 4; per
        context token 2 x 2 x 4096 = 16,384 per layer, x 4 = 65,536.
      MLP layer: 2 x 4096 x 16384 weights -> 268,435,456, x 28.
    """
    return ModelGeometry(
        name="hybrid-7b",
        description="Attention-Mamba2 hybrid 7B: 24 Mamba2 + 4 attention layers, fp16",
        recurrent_layers=24,
        attention_layers=4,
        state_bytes=24 * 2 * (4096 * 128 + 4 * (2 * 4096 + 2 * 128)),
        kv_bytes_per_token=4 * 2 * 4096 * 2,
        recurrent_flops_per_token=24
        * (2 * (4096 * (2 * 8192 + 2 * 128 + 128) + 8448 * 4 + 8192 * 4096) + 5 * 4096 * 128),
        attention_flops_per_token=4 * 2 * 4 * 4096 * 4096,
        attention_flops_per_context_token=4 * 2 * 2 * 4096,
        other_flops_per_token=28 * 2 * 2 * 4096 * 16384,
    )


PRESETS: dict[str, ModelGeometry] = {g.name: g for g in (_qwen3_next_80b_a3b(), _mamba_codestral_7b(), _hybrid_7b())}
DEFAULT_PRESET = "qwen3-next-80b-a3b"


def preset(name: str) -> ModelGeometry:
    """The geometry preset called ``name`` (see ``PRESETS``)."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"geometry must be one of {sorted(PRESETS)}, got {name!r}") from None
