"""Stand-ins used only while BlockPool has not landed: a KV + unit pool with
the calls the engine makes. Replaced by statecache.BlockPool when present."""

from collections import OrderedDict


class DoubleBlockPool:
    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._hash = [-1] * num_blocks
        self._index = {}
        self._free = OrderedDict((b, None) for b in range(num_blocks))
        self._owner = {}
        self.on_evict = None

    @property
    def num_free(self):
        return len(self._free)

    def _take(self):
        b, _ = self._free.popitem(last=False)
        h = self._hash[b]
        if h != -1:
            self._hash[b] = -1
            if self._index.get(h) == b:
                del self._index[h]
                if self.on_evict:
                    self.on_evict(h)
        return b

    def allocate(self, count):
        if count > len(self._free):
            raise ValueError("short")
        out = []
        for _ in range(count):
            b = self._take()
            self._ref[b] = 1
            out.append(b)
        return out

    def touch(self, ids):
        for b in ids:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def free(self, ids):
        for b in ids:
            self._ref[b] -= 1
            assert self._ref[b] >= 0
            if self._ref[b] == 0:
                self._free[b] = None

    def ref_count(self, b):
        return self._ref[b]

    def publish(self, b, h):
        if h in self._index:
            return
        self._hash[b] = h
        self._index[h] = b

    def lookup(self, h):
        return self._index.get(h, -1)

    def reserve_units(self, count, owner):
        if count > len(self._free):
            return None
        out = [self._take() for _ in range(count)]
        for u in out:
            self._owner[u] = owner
        return out

    def release_units(self, ids, owner):
        for u in ids:
            assert self._owner.pop(u) == owner
            self._free[u] = None

    def rekey_units(self, ids, old, new):
        for u in ids:
            assert self._owner[u] == old
            self._owner[u] = new

    def owner_of(self, u):
        return self._owner.get(u)
