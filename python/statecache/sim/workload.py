"""Synthetic workloads in the Mooncake trace format: multi-turn chat, agents,
tool-calling assistants and retrieval-augmented generation (RAG).

Each session keeps its real token context; every request sends the whole
context as its prompt, and the prompt's blocks are named the way the
Mooncake release names them (a chained hash of the block's tokens and the
previous block's id, renumbered from 0 in order of first appearance). So the
output is an ordinary trace that :func:`statecache.sim.trace.load_trace`
reads back, and its sharing is exactly the sharing of the generated contexts.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from statecache.sim.trace import MOONCAKE_BLOCK_SIZE, VOCAB_SIZE, TraceRequest

KINDS = ("multi_turn", "agentic", "tool_calling", "rag")


@dataclass(frozen=True)
class WorkloadSpec:
    """Parameters of a synthetic workload (all lengths in tokens, times in ms).

    kind: ``"multi_turn"`` (chat sessions: system prompt, then user turns
        and answers), ``"agentic"`` (tool loops: system prompt with tool
        schemas, a task, then model call -> tool call -> tool result, with
        optional branching into parallel sub-agents), ``"tool_calling"``
        (the same loop without branching: many short steps over a long
        shared system prompt) or ``"rag"`` (a short shared system prompt,
        then ``documents_per_request`` documents drawn from a shared corpus
        by Zipf popularity, in random order, then the question; follow-up
        questions extend the session). In RAG a document is reusable as a
        prefix only where it sits right after the same predecessors, so
        the same document recurs at varying positions with varying reuse.
    sessions: number of sessions (conversations or agent tasks).
    session_rate_per_s: Poisson arrival rate of new sessions.
    system_prompts / system_prompt_tokens: how many distinct shared system
        prompts exist and how long each is; a session picks one uniformly.
    turns: mean number of user turns (multi_turn) or tool steps (agentic)
        per session, geometric with that mean, at least 1.
    user_tokens: mean length of a user message or agent task (exponential,
        at least 1).
    output_tokens: mean length of an answer (multi_turn) or tool call
        (agentic), exponential, at least 1.
    tool_result_tokens: mean length of a tool result appended after each
        agent step (exponential, at least 1).
    think_time_ms: mean pause before the next request of a session
        (exponential): user think time, or tool latency for agents.
    ms_per_output_token: decode time added to the pause so the next turn
        never arrives before its answer could have been generated.
    documents / document_tokens / documents_per_request / document_zipf:
        rag only; corpus size, each document's length (fixed per document,
        exponential around the mean), documents per request and the Zipf
        exponent of their popularity.
    branch_prob: agentic only; chance that a step fans out into
        ``branch_factor`` sub-agents, each continuing from the current
        context with its own instruction for ``branch_steps`` steps (their
        shared prefix ends at the branch point). The parent continues too.
    seed: everything above is drawn from this seed; same spec, same trace.
    """

    kind: str = "multi_turn"
    sessions: int = 200
    session_rate_per_s: float = 2.0
    system_prompts: int = 4
    system_prompt_tokens: int = 2048
    turns: float = 4.0
    user_tokens: int = 400
    output_tokens: int = 300
    tool_result_tokens: int = 1200
    think_time_ms: float = 8000.0
    ms_per_output_token: float = 20.0
    branch_prob: float = 0.15
    branch_factor: int = 3
    branch_steps: int = 3
    documents: int = 200
    document_tokens: int = 2000
    documents_per_request: int = 4
    document_zipf: float = 1.1
    block_size: int = MOONCAKE_BLOCK_SIZE
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {self.kind!r}")
        for name in (
            "sessions",
            "system_prompts",
            "system_prompt_tokens",
            "user_tokens",
            "output_tokens",
            "tool_result_tokens",
            "branch_factor",
            "branch_steps",
            "documents",
            "document_tokens",
            "documents_per_request",
            "block_size",
        ):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < (0 if name == "system_prompt_tokens" else 1)
            ):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("session_rate_per_s", "turns"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.turns < 1:
            raise ValueError(f"turns must be >= 1, got {self.turns!r}")
        for name in ("think_time_ms", "ms_per_output_token"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.documents_per_request > self.documents:
            raise ValueError(
                f"documents_per_request must be <= documents, got {self.documents_per_request!r} > {self.documents!r}"
            )
        if not self.document_zipf > 0:
            raise ValueError(f"document_zipf must be > 0, got {self.document_zipf!r}")
        if not 0.0 <= self.branch_prob <= 1.0:
            raise ValueError(f"branch_prob must be in [0, 1], got {self.branch_prob!r}")


class _BlockNamer:
    """Names prefix blocks like the Mooncake release: equal prefix, equal id."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ids: dict[tuple[int, bytes], int] = {}

    def _name(self, prev: int, block: np.ndarray) -> int:
        key = (prev, block.tobytes())
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = len(self._ids)
        return got

    def hash_ids(self, ctx: _Context) -> tuple[int, ...]:
        bs = self.block_size
        n = len(ctx.tokens)
        while (len(ctx.full_ids) + 1) * bs <= n:  # full blocks never change: name once
            i = len(ctx.full_ids)
            prev = ctx.full_ids[-1] if ctx.full_ids else -1
            ctx.full_ids.append(self._name(prev, ctx.tokens[i * bs : (i + 1) * bs]))
        ids = list(ctx.full_ids)
        tail = n - len(ids) * bs
        if tail:
            ids.append(self._name(ids[-1] if ids else -1, ctx.tokens[n - tail :]))
        return tuple(ids)


@dataclass
class _Context:
    tokens: np.ndarray
    full_ids: list[int] = field(default_factory=list)

    def extend(self, more: np.ndarray) -> None:
        self.tokens = np.concatenate([self.tokens, more])

    def branch(self) -> _Context:
        return _Context(self.tokens.copy(), list(self.full_ids))


@dataclass(order=True)
class _Pending:
    """A session's next request, ordered by arrival time (then creation)."""

    at_ms: float
    order: int
    ctx: _Context = field(compare=False)
    steps_left: int = field(compare=False)
    branchable: bool = field(compare=False)


def generate(spec: WorkloadSpec) -> list[TraceRequest]:
    """A synthetic trace for ``spec``, sorted by arrival, indices 0..n-1."""
    rng = np.random.default_rng(spec.seed)
    namer = _BlockNamer(spec.block_size)

    def text(mean: int) -> np.ndarray:
        n = max(1, int(round(rng.exponential(mean))))
        return rng.integers(0, VOCAB_SIZE, n, dtype=np.int64)

    def steps() -> int:
        return int(rng.geometric(1.0 / spec.turns))

    system = [
        rng.integers(0, VOCAB_SIZE, spec.system_prompt_tokens, dtype=np.int64) for _ in range(spec.system_prompts)
    ]
    agentic = spec.kind == "agentic"
    tools = agentic or spec.kind == "tool_calling"  # tool results follow each step
    docs, popularity = [], None
    if spec.kind == "rag":
        docs = [text(spec.document_tokens) for _ in range(spec.documents)]
        w = 1.0 / np.arange(1, spec.documents + 1) ** spec.document_zipf
        popularity = w / w.sum()
    queue: list[_Pending] = []
    order = 0
    t = 0.0
    for _ in range(spec.sessions):
        t += rng.exponential(1000.0 / spec.session_rate_per_s)
        parts = [system[rng.integers(spec.system_prompts)]]
        if docs:
            picked = rng.choice(spec.documents, size=spec.documents_per_request, replace=False, p=popularity)
            parts += [docs[i] for i in picked]  # drawn order: positions vary
        parts.append(text(spec.user_tokens))
        ctx = _Context(np.concatenate(parts))
        heapq.heappush(queue, _Pending(t, order, ctx, steps(), agentic))
        order += 1

    out: list[tuple[float, int, int, int, tuple[int, ...]]] = []
    while queue:
        p = heapq.heappop(queue)
        ctx = p.ctx
        answer = text(spec.output_tokens)
        out.append((p.at_ms, p.order, len(ctx.tokens), len(answer), namer.hash_ids(ctx)))
        if p.steps_left <= 1:
            continue
        ctx.extend(answer)
        gap = rng.exponential(spec.think_time_ms) + spec.ms_per_output_token * len(answer)
        if agentic and p.branchable and rng.random() < spec.branch_prob:
            for _ in range(spec.branch_factor):
                child = ctx.branch()
                child.extend(text(spec.user_tokens))  # the sub-agent's own instruction
                heapq.heappush(queue, _Pending(p.at_ms + gap, order, child, spec.branch_steps, False))
                order += 1
        ctx.extend(text(spec.tool_result_tokens if tools else spec.user_tokens))
        heapq.heappush(queue, _Pending(p.at_ms + gap, order, ctx, p.steps_left - 1, p.branchable))
        order += 1

    out.sort(key=lambda r: (r[0], r[1]))
    return [TraceRequest(i, round(at, 3), n_in, n_out, ids) for i, (at, _, n_in, n_out, ids) in enumerate(out)]


# Workloads the hit-rate benchmark ships (about 1,000-1,500 requests each).
PRESETS: dict[str, WorkloadSpec] = {
    # Chat: a few system prompts, multi-turn conversations.
    "chat": WorkloadSpec(kind="multi_turn", sessions=300, session_rate_per_s=1.0, seed=11),
    # Agents: tool loops with branching sub-agents.
    "agentic": WorkloadSpec(kind="agentic", sessions=150, session_rate_per_s=0.5, seed=1),
    # Tool-calling assistants: long shared system prompts (tool schemas),
    # short model / tool turns.
    "tool-calling": WorkloadSpec(
        kind="tool_calling",
        sessions=160,
        session_rate_per_s=0.8,
        system_prompts=6,
        system_prompt_tokens=8192,
        turns=8.0,
        user_tokens=150,
        output_tokens=80,
        tool_result_tokens=400,
        think_time_ms=2000.0,
        seed=5,
    ),
    # RAG: shared documents at varying positions, a few follow-up questions.
    "rag": WorkloadSpec(
        kind="rag",
        sessions=500,
        session_rate_per_s=2.0,
        system_prompts=2,
        system_prompt_tokens=1024,
        turns=2.0,
        user_tokens=120,
        output_tokens=250,
        documents=120,
        document_tokens=2500,
        documents_per_request=4,
        think_time_ms=6000.0,
        seed=7,
    ),
}


def main(argv=None) -> int:
    """``python -m statecache.sim.workload OUT.jsonl [--kind agentic] [--sessions N] ...``:
    every ``WorkloadSpec`` field is an option."""
    import argparse
    import dataclasses

    from statecache.sim.trace import write_trace

    p = argparse.ArgumentParser(description=WorkloadSpec.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="JSONL file to write")
    for f in dataclasses.fields(WorkloadSpec):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    args = vars(p.parse_args(argv))
    out = args.pop("out")
    try:
        reqs = generate(WorkloadSpec(**args))
    except ValueError as e:
        p.error(str(e))
    write_trace(reqs, out)
    print(f"{out}: {len(reqs)} requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
