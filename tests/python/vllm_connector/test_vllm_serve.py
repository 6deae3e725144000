"""The connector from ``vllm serve``, turned on by the README's one flag: vLLM's
OpenAI server on loopback, its engine core in a process of its own (the
in-process harness of test_vllm_engine.py does not take that path), the tiny
Qwen3-Next. A conversation's next turn resumes where the last one ended, past
every boundary vLLM resumes by itself, and the connector's counters reach the
server's /metrics.
(Answers against vLLM without caching: test_vllm_engine.py.)"""

from __future__ import annotations

import random
import re
import time

import pytest

import vllm_support as vs

ANSWER = 64


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from statecache.vllm.tiny import write_tiny_qwen3next

    model = write_tiny_qwen3next(str(tmp_path_factory.mktemp("tiny-qwen3next")))
    kw = vs.base_llm_kwargs(
        model, num_gpu_blocks_override=48, kv_transfer_config=vs.connector_config({"host_memory": "256MB"})
    )
    s = vs.Server(
        "statecache",
        kw,
        str(tmp_path_factory.mktemp("serve")),
        ["--enable-prompt-tokens-details", "--return-tokens-as-token-ids"],
    )
    yield s
    s.close()


def complete(server, prompt: list[int]) -> tuple[list[int], int]:
    """One greedy completion of token ids: (answer's token ids, prompt tokens vLLM counts as cached)."""
    out = server.post(
        "/v1/completions",
        {"model": server.model, "prompt": prompt, "max_tokens": ANSWER, "temperature": 0, "return_token_ids": True},
    )
    choice = out["choices"][0]
    assert out["usage"]["prompt_tokens"] == len(prompt)
    return choice["token_ids"], (out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def counter(metrics: str, name: str, **labels: str) -> float:
    """The value of Prometheus counter ``name`` whose labels include ``labels`` (summed over the rest)."""
    total, seen = 0.0, False
    for line in metrics.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:_total)?(\{{[^}}]*\}})? ([0-9.e+-]+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total, seen = total + float(m.group(2)), True
    assert seen, f"{name} {labels} not in /metrics"
    return total


def test_vllm_serve_resumes_the_next_turn_past_every_boundary(server):
    rng = random.Random(3)
    firsts = vs.first_prompts(3, 7)
    seconds = []
    for p in firsts:
        answer, _ = complete(server, p)
        assert len(answer) == ANSWER
        seconds.append(vs.next_turn(p, answer, rng))
    tails = 0
    for p1, p2 in zip(firsts, seconds):
        answer, cached = complete(server, p2)
        assert len(answer) == ANSWER
        # vLLM resumes at block boundaries only, the last one inside the
        # first turn at best; the connector holds the state that turn ended
        # with (its last token was sampled, never computed)
        boundary = (len(p1) + ANSWER) // vs.BLOCK * vs.BLOCK
        assert cached == len(p1) + ANSWER - 1 > boundary, (len(p1), cached)
        tails += cached - boundary
    deadline = time.monotonic() + 30
    while True:  # the server publishes the engine's counters a step or more late
        m = server.get("/metrics")
        if counter(m, "statecache:prompt_tokens_resumed", source="host") >= tails or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert counter(m, "statecache:prompt_tokens_resumed", source="host") >= tails
    assert counter(m, "statecache:prompt_tokens_resumed", source="local") > 0
    assert counter(m, "statecache:loads_failed", reason="any") == 0
    assert counter(m, "statecache:values_saved") > 0
