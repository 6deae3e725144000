"""The colliding block pair of issue 18 (block size 16, seed 0: one 64-bit
scheduler hash, different tokens), shared by the collision tests."""

from statecache.engine import Request

A = [14, 24, 35, 54, 70, 82, 111, 116, 134, 159, 171, 191, 197, 208, 235, 250]
B = [13, 24, 33, 50, 70, 83, 104, 114, 128, 158, 169, 186, 192, 215, 225, 244]


def greedy(eng, prompt, new=6):
    """Serves ``prompt`` to completion on ``eng``; returns its Request."""
    r = Request(prompt, new)
    eng.add_request(r)
    eng.run_until_done()
    return r
