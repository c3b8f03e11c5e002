"""AsyncInferQueue: a pool of requests over one session, as OpenVINO's (jobs run on the requests'
worker threads; a job waits for a free request)."""

from __future__ import annotations

import queue


class AsyncInferQueue:
    def __init__(self, session, jobs: int = 2) -> None:
        self.requests = [session.create_infer_request() for _ in range(max(1, int(jobs)))]
        self._free: queue.Queue = queue.Queue()
        self._callback = None
        for i, r in enumerate(self.requests):
            r.set_callback(self._done(i))
            self._free.put(i)

    def _done(self, i: int):
        def callback(request, userdata) -> None:
            try:
                if self._callback is not None and request._error is None:
                    self._callback(request, userdata)
            finally:
                self._free.put(i)
        return callback

    def set_callback(self, callback) -> None:
        """``callback(request, userdata)`` after each job; ``request.results`` holds its outputs."""
        self._callback = callback

    def start_async(self, feeds=None, userdata=None) -> None:
        """Run ``feeds`` on the next free request (blocks while all are busy)."""
        i = self._free.get()
        r = self.requests[i]
        if r._job is not None:
            r._job.join()  # its callback released it: the thread is ending
        r.start_async(feeds, userdata)

    def wait_all(self) -> None:
        """Wait for every job; raise the first error one of them met."""
        for r in self.requests:
            r.wait()

    def __len__(self) -> int:
        return len(self.requests)
