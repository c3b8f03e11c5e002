"""LLM generation on Ray Serve: replicas that each own an LLMServer (a PagedEngine over one GPU's KV
pool, or a CPU's), streaming tokens over OpenAI-compatible HTTP and through the handle.

Routes (OpenAI's shapes; prompts as text through the model folder's tokenizer.json, or as token
ids, which the completions API also takes):
- ``POST /v1/completions``: ``prompt``, ``max_tokens`` (16), ``temperature`` (0: greedy), ``top_p``,
  ``top_k``, ``repetition_penalty``, ``seed``, ``stream``; with ``stream`` the answer is server-sent
  events, ``data: {...}`` a token, then ``data: [DONE]``.
- ``POST /v1/chat/completions``: ``messages`` joined by a plain template (``role: content`` lines,
  then ``assistant:``; the folder's chat template is not read), the same options.
- ``GET /v1/models``, ``GET /v1/stats``.
A request that could never fit in the KV pool gets a 400 (KVCapacityError), a bad one a 400 that
names the field. A client that disconnects mid-stream aborts its conversation: its blocks are
freed at once. A conversation of several turns names itself (the header
``serve_multiplexed_model_id``, the handle's ``multiplexed_model_id``, or the body's
``conversation``): it is routed to the replica that holds its blocks (``routing.ConversationRouter``,
rendezvous hashing), which keeps them after each turn, and a next turn whose prompt repeats the last
one and its answer computes only what is new. A replica that is lost loses the blocks only: the
next turn is computed whole.

Through the handle: ``tokens(handle, prompt_ids, max_new, ...)`` yields token ids as they come;
if the replica dies mid-stream the iteration ends with StreamEndedError, and only the streams of
that replica end.

Needs the extra ``dynashape[serve]`` (``ray[serve]``). No ``from __future__ import annotations``
here: FastAPI reads the routes' annotations (``Request``) as types, not strings.
"""


import asyncio
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.config import RequestRouterConfig

from ..errors import DynashapeError, InputError, KVCapacityError, OptionsError, StreamEndedError
from ..paged.engine import Sampling
from .routing import ConversationRouter

http = FastAPI(title="dynashape LLM")


def _bad(e: Exception, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": f"{type(e).__name__}: {e}", "type": type(e).__name__}},
                        status_code=status)


def sampling_of(body: dict) -> Sampling:
    """OpenAI's options as a Sampling (temperature 0 or absent: greedy, OpenAI's default is 1)."""
    try:
        t = float(body.get("temperature", 0.0) or 0.0)
        if t < 0:
            raise ValueError(f"temperature {t}: expected >= 0 (0: greedy)")
        s = Sampling(do_sample=t > 0, temperature=t if t > 0 else 1.0, top_k=int(body.get("top_k", 0) or 0),
                     top_p=float(body.get("top_p", 1.0) or 1.0),
                     repetition_penalty=float(body.get("repetition_penalty", 1.0) or 1.0),
                     seed=None if body.get("seed") is None else int(body["seed"]))
    except (TypeError, ValueError) as e:
        raise OptionsError(f"sampling options: {e}") from e
    s.check()
    return s


def _conversation(body: dict):
    """The conversation a request continues: Serve's multiplexed model id (the HTTP header
    ``serve_multiplexed_model_id``, or the handle's option), else the body's ``conversation``; None
    for a one-off generation."""
    return serve.get_multiplexed_model_id() or body.get("conversation") or None


def chat_prompt(messages) -> str:
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "content" in m for m in messages):
        raise InputError("messages: expected a list of {role, content}")
    return "".join(f"{m.get('role', 'user')}: {m['content']}\n" for m in messages) + "assistant:"


@serve.deployment
@serve.ingress(http)
class LLMDeployment:
    def __init__(self, model, name: str, options: dict) -> None:
        from ..generate.tokenizer import Tokenizer
        from .llm import LLMServer

        self.name = name
        self.server = LLMServer(model, **options)
        try:
            self.tokenizer = Tokenizer(self.server.engine.model)
        except DynashapeError:
            self.tokenizer = None  # token ids in, token ids out
        self.waiters = ThreadPoolExecutor(512, thread_name_prefix="dynashape-stream")
        ctx = serve.get_replica_context()
        self.replica_id = ctx.replica_id.unique_id if ctx is not None else "local"

    # ---- the handle -----------------------------------------------------------------------------
    async def generate(self, prompt, max_new: int, options: dict | None = None):
        """Token ids as the steps make them (call with ``handle.options(stream=True)``; with
        ``multiplexed_model_id=KEY`` too, the conversation KEY: routed to the replica that holds its
        blocks, which its next turn reuses)."""
        stream = self.server.submit(prompt, max_new, sampling_of(options or {}), key=_conversation({}))
        loop = asyncio.get_running_loop()
        try:
            while True:
                t = await loop.run_in_executor(self.waiters, stream.next_token)
                if t is None:
                    return
                yield t
        finally:
            stream.close()  # a caller gone mid-stream: its blocks are freed now

    def stats(self) -> dict:
        return {**self.server.stats(), "replica": self.replica_id, "memory": self.server.memory_stats()}

    def check_health(self) -> None:
        if not self.server._thread.is_alive():
            raise StreamEndedError("the engine's step thread is not running")

    # ---- HTTP: OpenAI-compatible ------------------------------------------------------------------
    def _ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InputError("prompt: this model folder has no tokenizer.json; give token ids")
            return [int(t) for t in self.tokenizer.encode(prompt)]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return prompt
        raise InputError("prompt: expected a string or a non-empty list of token ids")

    def _text(self, tokens) -> str:
        return self.tokenizer.decode(tokens) if self.tokenizer is not None else ""

    @http.get("/v1/models")
    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "dynashape"}]}

    @http.get("/v1/stats")
    def http_stats(self) -> dict:
        return self.stats()

    @http.post("/v1/completions")
    async def completions(self, request: Request):
        body = await request.json()
        try:
            ids = self._ids(body.get("prompt"))
        except DynashapeError as e:
            return _bad(e)
        return await self._answer(body, ids, chat=False)

    @http.post("/v1/chat/completions")
    async def chat(self, request: Request):
        body = await request.json()
        try:
            ids = self._ids(chat_prompt(body.get("messages")))
        except DynashapeError as e:
            return _bad(e)
        return await self._answer(body, ids, chat=True)

    async def _answer(self, body: dict, ids: list[int], chat: bool):
        try:
            max_new = int(body.get("max_tokens", 16))
            stream = self.server.submit(ids, max_new, sampling_of(body), key=_conversation(body))
        except KVCapacityError as e:
            return _bad(e)
        except (DynashapeError, TypeError, ValueError) as e:
            return _bad(e)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        loop = asyncio.get_running_loop()
        if not body.get("stream"):
            try:
                tokens = await loop.run_in_executor(self.waiters, lambda: list(stream))
            except StreamEndedError as e:
                return _bad(e, 500)
            finally:
                stream.close()
            text = self._text(tokens)
            choice = {"index": 0, "finish_reason": stream.finish_reason, "tokens": tokens}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            return {"id": rid, "object": kind, "created": created, "model": self.name, "choices": [choice],
                    "replica": self.replica_id,
                    "usage": {"prompt_tokens": len(ids), "completion_tokens": len(tokens),
                              "total_tokens": len(ids) + len(tokens)}}

        detok = self.tokenizer.create_stream() if self.tokenizer is not None else None

        def event(obj: str, choice: dict) -> str:
            body = {"id": rid, "object": obj, "created": created, "model": self.name, "choices": [choice]}
            return f"data: {json.dumps(body)}\n\n"

        async def events():
            try:
                while True:
                    t = await loop.run_in_executor(self.waiters, stream.next_token)
                    if t is None:
                        break
                    piece = detok.decode(t) if detok is not None else ""
                    choice = {"index": 0, "token": t, "finish_reason": None}
                    choice.update({"delta": {"content": piece}} if chat else {"text": piece})
                    yield event(kind + (".chunk" if chat else ""), choice)
                end = {"index": 0, "finish_reason": stream.finish_reason}
                end.update({"delta": {}} if chat else {"text": ""})
                yield event(kind, end)
                yield "data: [DONE]\n\n"
            except StreamEndedError as e:
                yield f"data: {json.dumps({'error': {'message': str(e), 'type': 'StreamEndedError'}})}\n\n"
            finally:
                stream.close()  # a client that disconnected: the generator is closed, its blocks freed
        return StreamingResponse(events(), media_type="text/event-stream")


def build_llm_app(model, *, name: str = "llm", replicas: int = 1, num_cpus: float = 1, num_gpus: float = 0,
                  max_ongoing: int = 256, **options):
    """A Ray Serve application generating with ``model`` (a decoder folder or .onnx file):
    ``replicas`` replicas of ``num_cpus`` CPUs and ``num_gpus`` GPUs, each with its own KV pool;
    ``options`` go to LLMServer / PagedEngine (block_size=, num_blocks=, max_rows=, ...)."""
    options.setdefault("device", "cuda" if num_gpus else "cpu")
    if options["device"] == "cpu":
        options.setdefault("threads", max(1, int(num_cpus)))
    dep = LLMDeployment.options(name=f"dynashape-llm-{name}", num_replicas=replicas,
                                max_ongoing_requests=max_ongoing, health_check_period_s=5,
                                ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus},
                                request_router_config=RequestRouterConfig(request_router_class=ConversationRouter))
    return dep.bind(model, name, options)


def tokens(handle, prompt, max_new: int, conversation: str | None = None, **options):
    """Token ids of one generation through a deployment handle, as they come; ``conversation``: its
    key (routed to the replica that holds its blocks; the next turn reuses them). A replica that dies
    mid-stream ends the iteration with StreamEndedError (Ray's own error is its cause)."""
    import ray

    h = handle.options(stream=True, multiplexed_model_id=conversation) if conversation else handle.options(stream=True)
    gen = h.generate.remote(list(prompt), max_new, options)
    try:
        yield from gen
    except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError,
            ray.exceptions.ActorUnavailableError) as e:
        raise StreamEndedError(f"the replica serving this stream died: {type(e).__name__}") from e
    except DynashapeError:
        raise
    except ray.exceptions.RayTaskError as e:  # the replica raised: its typed error, if it is ours
        cause = getattr(e, "cause", None)
        if isinstance(cause, DynashapeError):
            raise cause from e
        raise
