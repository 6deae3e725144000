"""Runs the engine's batches on a real hybrid model.

Where the bytes live:

* recurrent state: two slot-indexed tensors, ``conv [R, num_slots, ...]`` and
  ``ssm [R, num_slots, ...]`` (R recurrent layers, slot axis 1) -- one slot is
  one request's complete state, and a PAGE image is all of it;
* attention K/V: ``kv [A, num_blocks, 2, block_size, kv_heads, head_dim]``
  (block axis 1), addressed by the engine's block tables. A page unit is one
  block index across all A layers, so PAGE images live in KV blocks.

A batch runs in two steps: the state maintenance ops through the copy executor
(relocations, copies, PAGE stores, PAGE restores), then one forward per
sequence that stages its state from ``read_slot`` and its KV prefix from its
blocks into a transformers ``DynamicCache``, feeds only the new tokens, and
writes state to ``write_slot`` and the new K/V to its blocks. A resumed prefix
is therefore never recomputed, for either half.
"""

from __future__ import annotations

import torch

from .hybrid import HybridGeometry


class HybridModelRunner:
    def __init__(
        self,
        model,
        geom: HybridGeometry,
        num_slots: int,
        num_blocks: int,
        block_size: int,
        device: str = "cpu",
        max_num_seqs: int = 8,
    ):
        self.model = model
        self.geom = geom
        self.block_size = block_size
        self.device = torch.device(device)
        dt = geom.dtype
        R, A = len(geom.recurrent_layers), len(geom.attention_layers)
        self.conv = torch.zeros((R, num_slots) + geom.conv_shape, dtype=dt, device=self.device)
        self.ssm = torch.zeros((R, num_slots) + geom.ssm_shape, dtype=dt, device=self.device)
        self.kv = torch.zeros(
            (A, num_blocks, 2, block_size, geom.kv_heads, geom.head_dim), dtype=dt, device=self.device
        )
        self.executor = make_executor(self, max_num_seqs)
        self.layout_id = self.executor.layout_id
        self.num_forwards = 0
        self.tokens_computed = 0

    # ------------------------------ geometry ------------------------------- #

    def checkpoint_spec(self):
        """The PAGE geometry the coordinator needs, derived from the layouts."""
        return self.executor.spec

    # ------------------------------ execution ------------------------------ #

    @torch.no_grad()
    def execute(self, batch) -> dict:
        ops = batch.ops
        if ops:
            self.executor.run(ops.relocations, ops.copies, ops.stores, ops.restores)
        out = {}
        for item in batch.items:
            out[item.seq.seq_id] = self._forward(item)
        return out

    def _forward(self, item):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        start, toks = item.start, item.token_ids
        if start > 0:
            self._stage_state(cache, item.read_slot)
            self._stage_kv(cache, item.block_table, start)
        cuts = sorted(p for _s, p in item.midstep) + [start + len(toks)]
        slot_at = {p: s for s, p in item.midstep}
        pos, logits = start, None
        for cut in cuts:
            ids = torch.tensor([toks[pos - start : cut - start]], dtype=torch.long, device=self.device)
            positions = torch.arange(pos, cut, device=self.device).unsqueeze(0)
            res = self.model(input_ids=ids, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
            logits = res.logits[0, -1]
            if cut in slot_at:  # an interior state a readable_midstep backend keeps
                self._save_state(cache, slot_at[cut])
            pos = cut
        self._save_state(cache, item.write_slot)
        self._save_kv(cache, item.block_table, start, len(toks))
        self.num_forwards += 1
        self.tokens_computed += len(toks)
        if not item.sample:
            return None
        logits = logits.float().cpu()
        return int(torch.argmax(logits)), logits

    def _stage_state(self, cache, slot: int) -> None:
        for j, li in enumerate(self.geom.recurrent_layers):
            layer = cache.layers[li]
            conv = self.conv[j, slot].unsqueeze(0)
            ssm = self.ssm[j, slot].unsqueeze(0)
            layer.lazy_initialization(conv_states=conv, recurrent_states=ssm, conv_kernel_size=self.geom.conv_kernel)
            layer.conv_states[0].copy_(conv)
            layer.recurrent_states[0].copy_(ssm)
            layer.has_previous_state[0] = True

    def _save_state(self, cache, slot: int) -> None:
        for j, li in enumerate(self.geom.recurrent_layers):
            layer = cache.layers[li]
            self.conv[j, slot].copy_(layer.conv_states[0][0])
            self.ssm[j, slot].copy_(layer.recurrent_states[0][0])

    def _token_rows(self, block_table, start: int, end: int) -> torch.Tensor:
        """Row index into ``kv[a, :, kind].view(-1, kvh, hd)`` per position."""
        pos = torch.arange(start, end)
        table = torch.tensor(block_table, dtype=torch.long)
        return (table[pos // self.block_size] * self.block_size + pos % self.block_size).to(self.device)

    def _stage_kv(self, cache, block_table, length: int) -> None:
        g, bs = self.geom, self.block_size
        nb = -(-length // bs)
        blocks = torch.tensor(block_table[:nb], dtype=torch.long, device=self.device)
        for j, li in enumerate(g.attention_layers):
            kv = self.kv[j, blocks]  # [nb, 2, bs, kvh, hd], only this sequence's blocks
            kv = kv.transpose(0, 1).reshape(2, nb * bs, g.kv_heads, g.head_dim)[:, :length]
            k = kv[0].transpose(0, 1).unsqueeze(0)  # [1, kvh, length, hd]
            v = kv[1].transpose(0, 1).unsqueeze(0)
            cache.layers[li].update(k, v)

    def _save_kv(self, cache, block_table, start: int, n: int) -> None:
        rows = self._token_rows(block_table, start, start + n)
        g = self.geom
        for j, li in enumerate(g.attention_layers):
            layer = cache.layers[li]
            view = self.kv[j].view(-1, 2, self.block_size, g.kv_heads, g.head_dim)
            blocks, offs = rows // self.block_size, rows % self.block_size
            view[blocks, 0, offs] = layer.keys[0, :, start : start + n].transpose(0, 1)
            view[blocks, 1, offs] = layer.values[0, :, start : start + n].transpose(0, 1)


def make_executor(runner: HybridModelRunner, max_num_seqs: int):
    """statecache's copy executor over the runner's tensors: a slot is its
    rows of ``conv`` and ``ssm`` (slot axis 1), a unit is one block index of
    ``kv`` across the attention layers (block axis 1)."""
    from statecache.executor import StateCopyExecutor
    from statecache.layout import PageLayout, StateLayout

    return StateCopyExecutor(
        StateLayout([runner.conv, runner.ssm], slot_dim=1),
        PageLayout([runner.kv], unit_dim=1),
        max_num_seqs,
        runner.device,
    )
