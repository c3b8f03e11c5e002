"""Serving dynashape models: shape-aware batching in one process or as Ray Serve replicas.

``ModelReplica`` (no extra dependency) holds a session and serves lists of requests, batching
those whose merged run is one shape, and decode conversations by key. ``LocalServer`` runs it
in one process with a bounded queue. ``dynashape.serve.ray_app`` (extra ``dynashape[serve]``)
deploys it as Ray Serve replicas with an HTTP (KServe v2 JSON) and a Python handle interface.
"""

from .batching import bucket, merge, plan, signature, split
from .policy import ServePolicy, derive_policy, state_pairs
from .replica import ModelReplica

__all__ = ["ModelReplica", "ServePolicy", "bucket", "derive_policy", "merge", "plan", "signature", "split",
           "state_pairs"]
