"""``statecache demo --tiers``: the demo workload with a GPU budget too small
for it, served three times, each compared token by token with the run
without prefix caching:

(a) GPU only;
(b) the same GPU budget with a host tier, writing through to Mooncake Store;
(c) a second engine in a fresh process, empty GPU and empty host tier, that
    resumes from what (b) left in Mooncake Store.

It starts ``mooncake_master`` (with its HTTP metadata server) and a
``mooncake_client`` holding the store's memory on 127.0.0.1, and stops them.
(b) and (c) share a tier, so they share a deployment key: a random secret
drawn here and handed to (c) in its environment, never on its command line.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time

GPU_BLOCKS = 64  # KV blocks and PAGE images share these: too few for the workload
NEW_TOKENS = 6
_KEY_ENV = "STATECACHE_DEMO_HASH_SALT"  # the shared deployment key, hex, parent -> fresh process


def _engine(args, model_and_geom, tiers=None, caching=True, tier_options=None, hash_salt=None):
    from statecache.models import build_engine

    return build_engine(
        args.model,
        "page",
        seed=args.seed,
        device=args.device,
        enable_prefix_caching=caching,
        model_and_geom=model_and_geom,
        checkpoint_interval_tokens=args.interval,
        num_blocks=GPU_BLOCKS if caching else 256,
        tiers=tiers,
        tier_options=tier_options,
        hash_salt=hash_salt,
    )


def _host_tier(engine):
    from statecache.tiers import HostTier

    spec = engine.caches.coordinator.store.spec
    ub = spec.page_unit_bytes
    return HostTier((256 * spec.units_per_checkpoint + 1024) * ub, ub, kv_bytes=1024 * ub)


def _serve(args, engine):
    from statecache.engine.conversations import make_workload, serve

    convs, branches, at = make_workload(args.seed, args.conversations, args.turns)
    t0 = time.perf_counter()
    rows = serve(engine, convs, branches, at, NEW_TOKENS)
    f = engine.checkpoint_funnel()
    return {
        "tokens": [r.output_token_ids for r in rows],
        "resumed": sum(r.num_cached_tokens for r in rows),
        "computed": sum(r.prefill_computed for r in rows),
        "from": {k[len("resumed_tokens_") :]: v for k, v in f.items() if k.startswith("resumed_tokens_")},
        "seconds": time.perf_counter() - t0,
        "tier_stats": (
            {k: v for k, v in engine.tiering.stats().items() if not isinstance(v, dict)}
            if engine.tiering is not None
            else {}
        ),
    }


def _model(args):
    import torch

    from statecache.models import build_model

    torch.set_num_threads(1)
    return build_model(args.model, seed=args.seed, device=args.device)


def _resume(args) -> int:
    """The fresh process: empty GPU, empty host tier, Mooncake Store."""
    from statecache.tiers.mooncake_tier import MooncakeTier

    master, metadata = args.tiers_resume
    salt = os.environ.get(_KEY_ENV)
    if not salt:
        print(f"--tiers-resume needs the deployment key in ${_KEY_ENV}", file=sys.stderr)
        return 2
    mg = _model(args)
    probe = _engine(args, mg)
    shared = MooncakeTier(master, metadata, timeout_s=10.0)
    eng = _engine(args, mg, tiers=[_host_tier(probe), shared], hash_salt=bytes.fromhex(salt))
    out = _serve(args, eng)
    eng.close()
    shared.close()
    print(json.dumps(out))
    return 0


def run(args) -> int:
    try:
        import mooncake.store  # noqa: F401
    except ImportError:
        print(
            "statecache demo --tiers needs Mooncake Store: pip install 'statecache[mooncake]' "
            "(mooncake-transfer-engine-non-cuda on a machine without CUDA)",
            file=sys.stderr,
        )
        return 2
    if args.tiers_resume:
        return _resume(args)
    from statecache.tiers.mooncake_tier import MooncakeTier
    from statecache.tiers.servers import MooncakeServers

    mg = _model(args)
    runs = {}
    print("serving the workload without prefix caching (the reference tokens) ...", flush=True)
    runs["off"] = _serve(args, _engine(args, mg, caching=False))
    print(f"(a) GPU only, {GPU_BLOCKS} KV blocks for KV and checkpoints ...", flush=True)
    runs["a"] = _serve(args, _engine(args, mg))
    servers = MooncakeServers(segment_bytes=256 << 20)
    print(
        "starting mooncake_master (HTTP metadata server) and a mooncake_client holding 256 MB on 127.0.0.1 ...",
        flush=True,
    )
    servers.start(timeout_s=60)
    try:
        print(f"    master {servers.master_addr}, metadata {servers.metadata_url}", flush=True)
        print("(b) the same GPU budget + a host tier, writing through to Mooncake Store ...", flush=True)
        shared = MooncakeTier(servers.master_addr, servers.metadata_url, timeout_s=10.0)
        eng = _engine(args, mg)
        salt = secrets.token_bytes(16)
        eng_b = _engine(
            args, mg, tiers=[_host_tier(eng), shared], tier_options={"shared_writes": "through"}, hash_salt=salt
        )
        runs["b"] = _serve(args, eng_b)
        eng_b.close()
        shared.close()
        print("(c) a fresh process, empty GPU and host tier, resuming from Mooncake Store ...", flush=True)
        cmd = [
            sys.executable,
            "-m",
            "statecache.cli",
            "demo",
            "--model",
            args.model,
            "--device",
            args.device,
            "--turns",
            str(args.turns),
            "--conversations",
            str(args.conversations),
            "--seed",
            str(args.seed),
            "--interval",
            str(args.interval),
            "--tiers-resume",
            servers.master_addr,
            servers.metadata_url,
        ]
        log = os.path.join(servers.log_dir, "fresh-process.log")
        with open(log, "wb") as err:
            env = dict(os.environ, **{_KEY_ENV: salt.hex()})
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, timeout=900, env=env)
        if proc.returncode != 0:
            print(f"the fresh process failed ({proc.returncode}); see {log}", file=sys.stderr)
            return 1
        runs["c"] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    finally:
        servers.stop()
        print("stopped mooncake_master and mooncake_client", flush=True)
    print(report(args, runs))
    ref = runs["off"]["tokens"]
    return 0 if all(runs[k]["tokens"] == ref for k in "abc") else 1


def report(args, runs) -> str:
    ref = runs["off"]["tokens"]
    n = sum(len(t) for t in ref)
    names = {"a": "(a) GPU only", "b": "(b) GPU + host tier", "c": "(c) fresh process, Mooncake Store"}
    hdr = (
        f"{'run':<36} {'resumed':>8} {'from GPU':>9} {'from host':>10} {'from Mooncake':>14} "
        f"{'computed':>9} {'seconds':>8}"
    )
    lines = [
        f"model={args.model} device={args.device} seed={args.seed}; GPU budget {GPU_BLOCKS} "
        f"KV blocks (KV + PAGE images); prefill tokens without caching: "
        f"{runs['off']['computed']}",
        "",
        hdr,
        "-" * len(hdr),
    ]
    for k in "abc":
        r = runs[k]
        src = r["from"]
        gpu = src.get("gpu", r["resumed"] if k == "a" else 0)
        lines.append(
            f"{names[k]:<36} {r['resumed']:>8} {gpu:>9} {src.get('host', 0):>10} "
            f"{src.get('mooncake', 0):>14} {r['computed']:>9} {r['seconds']:>8.2f}"
        )
    lines.append("")
    for k in "abc":
        same = sum(x == y for a, b in zip(runs[k]["tokens"], ref) for x, y in zip(a, b))
        lines.append(f"{names[k]}: generated tokens identical: {same}/{n}{'' if same == n else '  MISMATCH'}")
    st = runs["c"]["tier_stats"]
    lines.append(
        f"(c) loads from Mooncake: {st.get('state_loaded_shared', 0)} state images, "
        f"{st.get('kv_loaded_shared', 0)} KV blocks; untrusted {st.get('loads_untrusted', 0)}"
    )
    return "\n".join(lines)
