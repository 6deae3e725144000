"""The demo's multi-turn workload: conversations that share a system prompt,
and branches that copy part of a conversation's history and go on with their
own messages. Each turn's prompt is the history so far plus a new message;
``serve`` runs the turns through an engine's continuous batching."""

from __future__ import annotations

import random


class Conversation:
    def __init__(
        self, name: str, history: list[int], user_turns: list[list[int]], parent: str | None = None, first_turn: int = 1
    ):
        self.name = name
        self.history = list(history)
        self.user_turns = user_turns
        self.parent = parent
        self.first_turn = first_turn


def make_workload(seed: int, conversations: int, turns: int, vocab: int = 256):
    """Conversations sharing a system prompt, plus branches that copy a
    conversation's first half and continue with their own messages."""
    rng = random.Random(seed)

    def text(lo, hi):
        return [rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))]

    system = text(450, 500)
    convs = [Conversation(f"c{i}", system, [text(30, 60) for _ in range(turns)]) for i in range(conversations)]
    branch_at = max(1, turns // 2)
    branches = [
        Conversation(
            f"c{i}b", [], [text(30, 60) for _ in range(turns - branch_at)], parent=f"c{i}", first_turn=branch_at + 1
        )
        for i in range(0, conversations, 2)
    ]
    return convs, branches, branch_at


def serve(engine, convs, branches, branch_at: int, max_new_tokens: int, bar=None):
    """Runs every conversation turn by turn; returns one row per request."""
    from statecache.engine import Request

    rows = []
    by_name = {c.name: c for c in convs}
    active = list(convs)
    turn = 1
    while active:
        reqs = []
        for c in active:
            msg = c.user_turns[turn - c.first_turn]
            r = Request(c.history + msg, max_new_tokens, request_id=(c.name, turn))
            engine.add_request(r)
            reqs.append((c, r))
        engine.run_until_done()
        for c, r in reqs:
            c.history = list(r.token_ids)
            rows.append(r)
            if bar is not None:
                bar.update(1)
        if turn == branch_at:
            for b in branches:
                b.history = list(by_name[b.parent].history)
            active += branches
        turn += 1
        active = [c for c in active if turn - c.first_turn < len(c.user_turns)]
    return rows
