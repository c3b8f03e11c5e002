"""``dynashape serve MODEL``: the command's work (cli.py wires its options)."""

from __future__ import annotations

import time

from ..errors import OptionsError


def parse_pad(items) -> dict:
    """``NAME=VALUE`` or ``NAME=AXIS:VALUE`` -> the ``pad=`` option."""
    pad = {}
    for item in items:
        name, sep, rest = item.partition("=")
        if not sep or not name:
            raise OptionsError(f"--pad {item!r}: expected NAME=VALUE or NAME=AXIS:VALUE")
        axis, _, value = rest.rpartition(":")
        try:
            v = float(value)
            pad[name] = (int(axis), v) if axis else v
        except ValueError as e:
            raise OptionsError(f"--pad {item!r}: expected NAME=VALUE or NAME=AXIS:VALUE with numbers") from e
    return pad


def options(args) -> dict:
    opts = dict(replicas=args.replicas, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                max_queue=args.max_queue, batching=not args.no_batching, num_cpus=args.cpus_per_replica,
                num_gpus=args.gpus_per_replica, conversation_timeout_s=args.conversation_timeout,
                pad_multiple=args.pad_multiple)
    if args.pad:
        opts["pad"] = parse_pad(args.pad)
    if args.mask:
        opts["mask"] = args.mask
    if args.batch_symbol:
        opts["batch_symbol"] = args.batch_symbol
    if args.device:
        opts["device"] = args.device
    return opts


def main(args) -> int:
    from rich.console import Console

    from .replica import ModelReplica

    con = Console(soft_wrap=True)  # lines whole, also in logs and pipes
    if getattr(args, "llm", False):
        return main_llm(args, con)
    opts = options(args)
    replica_keys = ("pad", "mask", "batch_symbol", "pad_multiple", "max_batch")
    # load it here first: a bad option or model is said now, not in a replica's log
    probe = ModelReplica(args.model, device="cpu", **{k: opts[k] for k in replica_keys if k in opts})
    p = probe.policy
    said = [f"model {args.model}: batch dim {p.batch_symbol!r} "
            + ("batched" if p.batches else f"not batched ({p.why_not_batched})")]
    if p.pad_symbol:
        said.append(f"{p.pad_symbol!r} padded to multiples of {p.pad_multiple} (mask {p.mask!r})")
    if p.state:
        said.append(f"{len(p.state)} state pairs (conversations)")
    con.print(", ".join(said))
    del probe
    if args.dry_run:
        con.print(f"would serve: {opts}")
        return 0
    from .ray_app import run

    return serve_until_stopped(args, con, lambda: run(args.model, host=args.host, port=args.port, name=args.name,
                                                      **opts), f"/v2/models/{args.name}/infer")


def serve_until_stopped(args, con, deploy, route: str) -> int:
    """Join the cluster ``--address`` names (else ``deploy`` starts a local one), deploy, and serve
    until Ctrl-C."""
    import ray
    from ray import serve

    if args.address:
        ray.init(address=args.address, include_dashboard=False)
    deploy()
    con.print(f"serving {args.name!r} on http://{args.host}:{args.port}{route} ({args.replicas} replicas); "
              "Ctrl-C stops")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        con.print("stopping")
    finally:
        serve.shutdown()
    return 0


def llm_options(args) -> dict:
    opts = dict(replicas=args.replicas, num_cpus=args.cpus_per_replica, num_gpus=args.gpus_per_replica,
                block_size=args.block_size, max_rows=args.max_rows)
    if args.kv_blocks:
        opts["num_blocks"] = args.kv_blocks
    if args.device:
        opts["device"] = args.device
    for name in ("token_budget", "prefill_budget"):
        if getattr(args, name, None):
            opts[name] = getattr(args, name)
    if getattr(args, "chunk_graphs", None) is not None:
        opts["chunk_graphs"] = bool(args.chunk_graphs)
    return opts


def main_llm(args, con) -> int:
    """``dynashape serve MODEL_DIR --llm``: the decoder checked here (a model the paged engine
    cannot run is said now, not in a replica's log), then the OpenAI-compatible app."""
    from ..paged.engine import PagedEngine

    opts = llm_options(args)
    probe = PagedEngine(args.model, device="cpu", num_blocks=1, block_size=args.block_size)
    con.print(f"model {args.model}: {len(probe.layers)} layers, KV {probe.io.kv_heads}x{probe.io.head_dim}, "
              f"the {probe.convention} convention")
    del probe
    if args.dry_run:
        con.print(f"would serve: {opts}")
        return 0
    from .llm_app import build_llm_app

    def deploy():
        import ray
        from ray import serve

        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(build_llm_app(args.model, name=args.name, **opts), name=args.name, route_prefix="/")
    return serve_until_stopped(args, con, deploy, "/v1/completions")
