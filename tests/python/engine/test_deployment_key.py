"""The deployment key of the prefix keys (issue 18, item 1; docs/operations.md,
"The deployment key"): random per process unless configured, the same for
every engine of a process, and never printed."""

import logging
import subprocess
import sys
from pathlib import Path

import statecache
from engine_support import ScriptRunner, caches_for, engine
from statecache.engine import Engine, EngineConfig, Request
from statecache.engine.deployment_key import deployment_key

PROMPT = list(range(40))

_OTHER_PROCESS = """
import sys
sys.path.insert(0, sys.argv[1])
from engine_support import engine
from statecache.engine import Request
r = Request(list(range(40)), 1)
print(engine("page", hbs=16).block_manager.update_hashes(r)[0])
"""


def _first_hash(eng):
    return eng.block_manager.update_hashes(Request(PROMPT, 1))[0]


def test_unconfigured_the_key_is_random_per_process():
    a, b = engine("page", hbs=16), engine("fork", hbs=16)
    assert not a.block_manager.deployment_key.configured
    assert _first_hash(a) == _first_hash(b)  # one key per process: engines of a process share prefixes
    public = statecache.chain_block_keys(PROMPT, 16, seed=0)[0][0]
    assert _first_hash(a) != public
    here = str(Path(__file__).resolve().parent.parent)
    other = subprocess.run([sys.executable, "-c", _OTHER_PROCESS, here], capture_output=True, text=True, check=True)
    assert int(other.stdout) != _first_hash(a)


def _configured(seed, salt):
    pool = statecache.BlockPool(64)
    cfg = EngineConfig(hash_block_size=16, hash_seed=seed, hash_salt=salt)
    return Engine(cfg, pool, caches_for("page", pool, 8, 16), ScriptRunner())


def test_a_configured_key_is_used_as_given():
    for seed, salt in ((0, None), (7, None), (None, b"fleet-a"), (3, "fleet-b")):
        eng = _configured(seed, salt)
        assert eng.block_manager.deployment_key.configured
        want = statecache.chain_block_keys(PROMPT, 16, seed=seed or 0, salt=salt)[0][0]
        assert _first_hash(eng) == want


def test_the_key_is_never_printed(caplog):
    caplog.set_level(logging.INFO, logger="statecache")
    eng = _configured(123456789, b"s3cret-salt")
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "hash_key='configured'" in text
    for shown in (text, repr(eng.config), repr(eng.block_manager.deployment_key), repr(deployment_key())):
        assert "s3cret" not in shown and "123456789" not in shown
    caplog.clear()
    engine("page", hbs=16)
    assert "hash_key='random per process'" in " ".join(r.getMessage() for r in caplog.records)
