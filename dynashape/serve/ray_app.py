"""dynashape as Ray Serve replicas: one session per replica, HTTP (KServe v2 JSON) and handles.

Ray does what a cluster needs (replicas, placement one GPU each, restarts, queue limits answered
with 503 / BackPressureError, multi-node); the replica does what only dynashape knows: which
requests can share a run (``ModelReplica``). Conversations stick to the replica that holds their
KV cache: their key travels as Serve's multiplexed model id, and ``routing.ConversationRouter``
maps it to one replica.

Needs the extra ``dynashape[serve]`` (``ray[serve]``).
"""


import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.metrics import Counter, Gauge, Histogram

from ..errors import DynashapeError, InputError, OptionsError, ServerBusyError
from . import kserve
from .replica import ModelReplica
from .routing import ConversationRouter

_BUCKETS_MS = [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000]

http = FastAPI(title="dynashape")


def _status(e: Exception) -> int:
    if isinstance(e, ServerBusyError):
        return 503
    if isinstance(e, (InputError, OptionsError, KeyError)):
        return 400
    return 500


def _error(e: Exception) -> JSONResponse:
    return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=_status(e))


@serve.deployment
@serve.ingress(http)
class DynashapeDeployment:
    def __init__(self, model, name: str, max_batch: int, max_wait_ms: float, window: int | None,
                 batching: bool, options: dict) -> None:
        self.name = name
        self.core = ModelReplica(model, max_batch=max_batch, **options)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="dynashape-run")  # runs off the event loop
        self._batched.set_max_batch_size((window or 4 * max_batch) if batching else 1)
        self._batched.set_batch_wait_timeout_s(max_wait_ms / 1e3)
        ctx = serve.get_replica_context()
        self.replica_id = ctx.replica_id.unique_id if ctx is not None else "local"
        self.m_requests = Counter("dynashape_requests", "requests answered", tag_keys=("model", "outcome"))
        self.m_rows = Histogram("dynashape_batch_rows", "rows per merged run", boundaries=[1, 2, 4, 8, 16, 32, 64],
                                tag_keys=("model",))
        self.m_queue = Histogram("dynashape_queue_ms", "time from arrival to run", boundaries=_BUCKETS_MS,
                                 tag_keys=("model",))
        self.m_run = Histogram("dynashape_run_ms", "merged run time per shape", boundaries=_BUCKETS_MS,
                               tag_keys=("model", "shape"))
        self.m_memory = Gauge("dynashape_memory_bytes", "engine memory in use", tag_keys=("model", "kind"))
        self.m_conv = Gauge("dynashape_conversations", "conversations held", tag_keys=("model",))
        self.core.metrics.listeners.append(self._observe_run)

    # ---- batching ------------------------------------------------------------------------------
    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def _batched(self, requests: list) -> list:
        now = time.time()
        queued = [(now - t) * 1e3 for _, t in requests]
        tags = {"model": self.name}
        for ms in queued:
            self.m_queue.observe(ms, tags=tags)
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self.pool, self.core.infer_many, [f for f, _ in requests], queued)
        bad = sum(isinstance(r, Exception) for r in results)
        if len(results) - bad:
            self.m_requests.inc(len(results) - bad, tags={**tags, "outcome": "ok"})
        if bad:
            self.m_requests.inc(bad, tags={**tags, "outcome": "error"})
        mem = self.core.session.memory_stats()
        for kind in ("device_current_bytes", "host_current_bytes", "peak_bytes"):
            if kind in mem:
                self.m_memory.set(mem[kind], tags={**tags, "kind": kind})
        return [("err", r) if isinstance(r, Exception) else ("ok", r) for r in results]

    def _observe_run(self, shape: str, requests: int, rows: int, ms: float) -> None:
        self.m_rows.observe(rows, tags={"model": self.name})
        self.m_run.observe(ms, tags={"model": self.name, "shape": shape})

    async def infer(self, feeds: dict) -> dict:
        """Outputs of one request (dict name -> numpy), batched with its neighbours."""
        status, value = await self._batched((feeds, time.time()))
        if status == "err":
            raise value
        return value

    async def infer_tagged(self, feeds: dict, request_id: str) -> dict:
        """``infer`` with the request id echoed and the replica named (for clients that retry)."""
        return {"request_id": request_id, "replica": self.replica_id, "outputs": await self.infer(feeds)}

    # ---- conversations -------------------------------------------------------------------------
    async def step(self, feeds: dict, start: bool = False) -> dict:
        key = serve.get_multiplexed_model_id()
        if not key:
            raise OptionsError("step needs a conversation key: handle.options(multiplexed_model_id=KEY), or the "
                               "HTTP header serve_multiplexed_model_id")
        loop = asyncio.get_running_loop()
        out = await loop.run_in_executor(self.pool, self.core.step, key, feeds, start)
        self.m_conv.set(self.core.conversations.stats()["live"], tags={"model": self.name})
        return out

    async def end(self, key: str) -> bool:
        return self.core.end(key)

    # ---- health and stats ----------------------------------------------------------------------
    def check_health(self) -> None:
        # Serve calls this every few seconds: the idle timeout's sweep needs no traffic to run
        self.core.conversations.sweep()

    def stats(self) -> dict:
        s = self.core.stats()
        s["replica"] = self.replica_id
        return s

    # ---- HTTP: the KServe v2 protocol ----------------------------------------------------------
    @http.get("/v2/health/live")
    def live(self) -> dict:
        return {"live": True}

    @http.get("/v2/health/ready")
    def ready(self) -> dict:
        return {"ready": True}

    @http.get("/v2/models/{model}")
    def model_metadata(self, model: str):
        if model != self.name:
            return JSONResponse({"error": f"no model {model!r} (this server has {self.name!r})"}, status_code=404)
        return kserve.metadata(self.name, self.core.session.get_inputs(), self.core.session.get_outputs())

    @http.get("/v2/models/{model}/stats")
    def model_stats(self, model: str) -> dict:
        return self.stats()

    @http.post("/v2/models/{model}/infer")
    async def http_infer(self, model: str, request: Request):
        if model != self.name:
            return JSONResponse({"error": f"no model {model!r} (this server has {self.name!r})"}, status_code=404)
        body = await request.json()
        try:
            outputs = await self.infer(kserve.decode_inputs(body))
        except DynashapeError as e:
            return _error(e)
        return kserve.encode_outputs(self.name, outputs, body.get("id"))

    @http.post("/v2/models/{model}/step")
    async def http_step(self, model: str, request: Request, start: bool = False):
        body = await request.json()
        try:
            outputs = await self.step(kserve.decode_inputs(body), start)
        except DynashapeError as e:
            return _error(e)
        return kserve.encode_outputs(self.name, outputs, body.get("id"))


def build_app(model, *, name: str = "model", replicas: int = 1, max_batch: int = 8, max_wait_ms: float = 5.0,
              max_queue: int = 64, window: int | None = None, batching: bool = True, num_cpus: float = 1,
              num_gpus: float = 0, max_ongoing: int | None = None, **options):
    """A Ray Serve application of ``model``: ``replicas`` replicas, each with ``num_cpus`` CPUs and
    ``num_gpus`` GPUs (one session on ``cuda`` when it has a GPU). ``max_queue`` requests may
    wait per caller before the next is refused (503 / BackPressureError). ``options`` go to
    ``ModelReplica`` (pad=, mask=, pad_multiple=, state=, conversation_timeout_s=, and any
    InferenceSession option)."""
    if "device" not in options:
        options["device"] = "cuda" if num_gpus else "cpu"
    if options["device"] == "cpu" and "threads" not in options:
        options["threads"] = max(1, int(num_cpus))  # one replica per CPU share, not every core each
    # requests a replica accepts at once: they wait in its own queue (FIFO, the batcher's window)
    # rather than at the callers' routers, whose retry backoff was measured to triple latency
    in_flight = max_ongoing or max(32, 2 * (window or 4 * max_batch))
    dep = DynashapeDeployment.options(
        name=f"dynashape-{name}", num_replicas=replicas, max_ongoing_requests=in_flight,
        max_queued_requests=max_queue, ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus},
        health_check_period_s=5, request_router_config=RequestRouterConfig(request_router_class=ConversationRouter))
    return dep.bind(model, name, max_batch, max_wait_ms, window, batching, options)


def run(model, *, host: str = "127.0.0.1", port: int = 8000, name: str = "model", blocking: bool = False,
        **kwargs):
    """Start Serve (and a local Ray, unless one is running or ``RAY_ADDRESS`` names a cluster) and
    deploy ``model``; returns its handle."""
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    return serve.run(build_app(model, name=name, **kwargs), name=name, route_prefix="/", blocking=blocking)
