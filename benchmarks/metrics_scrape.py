"""Serves three 3-turn conversations on the tiny Qwen3-Next model (PAGE), then
scrapes statecache's Prometheus exporter over loopback and prints the main
series (the README's example output):

    PYTHONPATH=python python benchmarks/metrics_scrape.py
"""

from __future__ import annotations

import random
import urllib.request

import torch

from statecache.engine import Request
from statecache.metrics import StateCacheMetrics
from statecache.models import build_engine

SERIES = (
    "admissions_total",
    "hit_rate",
    'fate="kept"',
    'fate="evicted"',
    "copy_bytes_total",
    "copy_batch_seconds",
    "copy_refused_total",
    'stage="resumed_tokens"',
    'stage="admitted_tokens"',
)


def main() -> None:
    torch.set_num_threads(1)
    rng = random.Random(0)
    eng = build_engine("qwen3next", "page")
    system = [rng.randrange(3, 256) for _ in range(200)]
    history: dict[int, list[int]] = {}
    for turn in range(3):
        reqs = []
        for c in range(3):
            msg = [rng.randrange(3, 256) for _ in range(30)]
            r = Request(history.get(c, system) + msg, 4, request_id=(c, turn))
            eng.add_request(r)
            reqs.append((c, r))
        eng.run_until_done()
        for c, r in reqs:
            history[c] = list(r.token_ids)
    server = StateCacheMetrics(eng).serve(0)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    finally:
        server.shutdown()
    for line in text.splitlines():
        if not line.startswith("#") and any(k in line for k in SERIES):
            print(line)


if __name__ == "__main__":
    main()
