"""Request traces: Mooncake-format JSONL in and out, tokens derived from block ids.

A trace line is ``{"timestamp": ms, "input_length": n, "output_length": m,
"hash_ids": [...]}`` where ``hash_ids[i]`` names the prefix ending with block
*i* (``block_size`` tokens a block, 512 in the Mooncake releases; the last
block may be partial). Equal ids mean equal prefixes, so the tokens a
simulator feeds the engine are derived from the ids alone: block id ``b``
always expands to the same ``block_size`` token ids, and a prompt is the
concatenation of its blocks cut to ``input_length``. The engine's chained
content hash then reproduces exactly the sharing the trace records.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

MOONCAKE_BLOCK_SIZE = 512
# Token ids stay below a realistic vocabulary; the engine only hashes them.
VOCAB_SIZE = 151_936

_U64 = np.uint64
_MASK = (1 << 64) - 1


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser over a uint64 array (wrapping arithmetic)."""
    x = x ^ (x >> _U64(30))
    x = x * _U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> _U64(27))
    x = x * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def _stream_base(keys: np.ndarray, stream: int) -> np.ndarray:
    keys = keys.astype(_U64, copy=False)
    with np.errstate(over="ignore"):
        return (keys * _U64(0x9E3779B97F4A7C15)) ^ _U64((stream & 0xFFFF) << 48)


def _tokens_from(bases: np.ndarray, count: int) -> np.ndarray:
    """Row i holds ``count`` token ids drawn from ``bases[i]``; flattened."""
    idx = np.arange(count, dtype=_U64)
    with np.errstate(over="ignore"):
        mixed = _mix64((bases[:, None] + idx[None, :]).ravel())
    return (mixed % _U64(VOCAB_SIZE)).astype(np.int64)


def derived_tokens(key: int, count: int, *, stream: int = 0) -> np.ndarray:
    """``count`` pseudo-random token ids determined by ``(stream, key)`` only.

    Stream 0 is used for trace blocks (key = block id); other streams give
    tokens that can never collide with a block's on purpose (generated text,
    tails not covered by ``hash_ids``).
    """
    return _tokens_from(_stream_base(np.array([key & _MASK], dtype=_U64), stream), count)


def block_tokens(block_ids, block_size: int = 512) -> np.ndarray:
    """The tokens of consecutive blocks ``block_ids``, ``block_size`` each."""
    ids = np.asarray(block_ids, dtype=np.int64).astype(_U64)
    return _tokens_from(_stream_base(ids, 0), block_size)


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: arrival time, lengths and prefix-block ids."""

    index: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def prompt_tokens(self, block_size: int = MOONCAKE_BLOCK_SIZE) -> np.ndarray:
        """The prompt as token ids: block ``hash_ids[i]`` gives tokens
        ``[i*block_size, (i+1)*block_size)``; anything past the last id comes
        from this request alone, so it can never fake a shared prefix."""
        n_blocks = min(len(self.hash_ids), -(-self.input_length // block_size))
        tokens = block_tokens(self.hash_ids[:n_blocks], block_size)[: self.input_length]
        short = self.input_length - len(tokens)
        if short > 0:
            tokens = np.concatenate([tokens, derived_tokens(self.index, short, stream=2)])
        return tokens

    def output_tokens(self) -> np.ndarray:
        """Generated tokens: unique to this request (the trace has no ids for them)."""
        return derived_tokens(self.index, self.output_length, stream=1)

    def to_json(self) -> dict:
        return {
            "timestamp": self.timestamp_ms,
            "input_length": self.input_length,
            "output_length": self.output_length,
            "hash_ids": list(self.hash_ids),
        }


def _int_field(obj: dict, name: str, where: str) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
        raise ValueError(f"{where}: {name} must be a non-negative integer, got {value!r}")
    return int(value)


def parse_request(obj: object, index: int, where: str = "trace") -> TraceRequest:
    """Validate one decoded JSON object of a Mooncake-format trace."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    ts = obj.get("timestamp", 0)
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
        raise ValueError(f"{where}: timestamp must be a non-negative number, got {ts!r}")
    ids = obj.get("hash_ids", [])
    if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in ids):
        raise ValueError(f"{where}: hash_ids must be a list of integers, got {ids!r:.80}")
    return TraceRequest(
        index=index,
        timestamp_ms=float(ts),
        input_length=_int_field(obj, "input_length", where),
        output_length=_int_field(obj, "output_length", where),
        hash_ids=tuple(ids),
    )


def iter_trace(path: str | os.PathLike) -> Iterator[TraceRequest]:
    """Requests of a Mooncake-format JSONL file, in file order (blank lines skipped)."""
    index = 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            yield parse_request(obj, index, f"{path}:{lineno}")
            index += 1


def load_trace(path: str | os.PathLike, limit: int | None = None) -> list[TraceRequest]:
    """The trace sorted by arrival (stable, so equal timestamps keep file order)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
    out = []
    for req in iter_trace(path):
        if limit is not None and len(out) >= limit:
            break
        out.append(req)
    out.sort(key=lambda r: r.timestamp_ms)
    return out


def write_trace(requests: Iterable[TraceRequest], path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for req in requests:
            f.write(json.dumps(req.to_json(), separators=(", ", ": ")) + "\n")


def ideal_block_hit_rate(requests: Iterable[TraceRequest]) -> float:
    """Fraction of prompt blocks that are a prefix hit with an unbounded cache.

    A block hits when its id was seen before and every block before it in
    the same prompt hit too (the figure the Mooncake trace README quotes).
    """
    seen: set[int] = set()
    hit = total = 0
    for req in requests:
        prefix = True
        for h in req.hash_ids:
            total += 1
            prefix = prefix and h in seen
            hit += prefix
        seen.update(req.hash_ids)
    return hit / total if total else 0.0
