"""The engine's tiers are one named protocol (``TierHooks``): the engine calls
nothing else on them, both implementations (the engine's ``Tiering`` and the
simulator's ``SimTiers``) implement all of it, and one that leaves a hook out
cannot be built."""

from __future__ import annotations

import ast
import pathlib

import pytest

from statecache.engine.tiering import HOOKS, TierHooks, Tiering
from statecache.sim.tiers import SimTiers

ENGINE = pathlib.Path(__file__).resolve().parents[3] / "python" / "statecache" / "engine"


def _calls_on_tiering(path: pathlib.Path) -> set[str]:
    """Methods called on anything named ``tiering`` / ``self.tiering``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            obj = node.func.value
            name = obj.attr if isinstance(obj, ast.Attribute) else getattr(obj, "id", None)
            if name == "tiering":
                out.add(node.func.attr)
    return out


def test_the_engine_calls_only_the_protocols_hooks():
    called = _calls_on_tiering(ENGINE / "block_manager.py") | _calls_on_tiering(ENGINE / "scheduler.py")
    assert called, "the engine calls its tiers somewhere"
    assert called <= set(HOOKS), f"hooks outside TierHooks: {sorted(called - set(HOOKS))}"


def test_both_implementations_implement_every_hook():
    assert len(HOOKS) == 11
    for cls in (Tiering, SimTiers):
        assert issubclass(cls, TierHooks)
        assert not getattr(cls, "__abstractmethods__", None), cls
        for name in HOOKS:
            assert getattr(cls, name) is not getattr(TierHooks, name), f"{cls.__name__}.{name}"


def test_a_hook_left_out_cannot_be_built():
    class Partial(TierHooks):
        def note_keys(self, hashes, keys, first_block):
            pass

    with pytest.raises(TypeError, match="abstract"):
        Partial()


def test_a_structural_match_is_recognised():
    class Duck:
        pass

    for name in HOOKS:
        setattr(Duck, name, lambda self, *a: None)
    assert isinstance(Duck(), TierHooks)
    assert not isinstance(object(), TierHooks)
