"""The deployment key of the 128-bit prefix keys (docs/contract.md, "Tiers";
docs/operations.md, "The deployment key").

Every hash the engine computes is keyed by it: the 128-bit prefix keys that
name entries below GPU memory and, derived from them, the 64-bit scheduler
hashes of the GPU-side indexes. Whoever knows the key can search for two
prompts with one scheduler hash (about 2**32 tries); the indexes check the
full 128-bit key on every hit, so such a pair costs a cache miss, not a wrong
state, but the key is still a secret: it keeps prefixes unguessable.

Unconfigured, every process draws its own at random. Engines that share a
tier below GPU memory must agree on one and configure it (``hash_seed`` and
``hash_salt``), as a secret: from a secrets store or the environment, never on
a command line, never logged.
"""

from __future__ import annotations

import secrets
import threading
from typing import NamedTuple


class DeploymentKey(NamedTuple):
    """``seed`` and ``salt`` as ``statecache.chain_block_keys`` takes them;
    ``configured``: False for the per-process random key."""

    seed: int
    salt: bytes | str | None
    configured: bool

    def __repr__(self) -> str:  # never print the secret
        return f"DeploymentKey({'configured' if self.configured else 'random per process'})"


_lock = threading.Lock()
_process_key: DeploymentKey | None = None


def process_key() -> DeploymentKey:
    """This process's random key (drawn once; a forked child keeps it)."""
    global _process_key
    with _lock:
        if _process_key is None:
            _process_key = DeploymentKey(secrets.randbits(63), secrets.token_bytes(16), False)
        return _process_key


def deployment_key(seed: int | None = None, salt: bytes | str | None = None) -> DeploymentKey:
    """The key ``seed`` / ``salt`` configure; the process's random key when
    both are None. A configured key with no seed uses seed 0."""
    if seed is None and salt is None:
        return process_key()
    return DeploymentKey(0 if seed is None else seed, salt, True)
