"""OpenVINO's request API over a request's state: inputs set one by one (``set_tensor``), ``infer``,
runs on a worker thread (``start_async`` / ``wait`` / ``set_callback``) and outputs by name
(``get_tensor``); ``run`` (onnxruntime's) comes with the state (request_state.py)."""

from __future__ import annotations

import threading

from .errors import RequestBusyError, UnknownInputError, UnknownOutputError
from .request_state import RequestState


class InferRequest(RequestState):
    """A request with its own buffers and shape state (``session.create_infer_request()``); use
    one per thread."""

    def __init__(self, session) -> None:
        super().__init__(session)
        # what the caller set kept when the state is made again after a re-parse
        self._tensors: dict = getattr(self, "_tensors", {})
        self._results: dict = {}
        self._job: threading.Thread | None = None
        self._error: BaseException | None = None
        self._callback = getattr(self, "_callback", None)

    def set_tensor(self, name: str, value) -> None:
        """Set an input for the next ``infer()`` / ``start_async()`` without feeds."""
        if name not in self._input_names and name not in self.session._overridable:
            raise UnknownInputError(name, list(self._input_names))
        self._tensors[name] = value

    def get_tensor(self, name: str):
        """An input set with ``set_tensor``, or an output of the last ``infer``."""
        if name in self._tensors:
            return self._tensors[name]
        if name in self._results:
            return self._results[name]
        raise UnknownOutputError(name, list(self._input_names) + list(self._out_index))

    def infer(self, feeds=None) -> dict:
        """Run with ``feeds`` (or the tensors set with ``set_tensor``); outputs by name."""
        names = [a.name for a in self.session._outputs]
        self._results = dict(zip(names, self.run(names, self._tensors if feeds is None else feeds)))
        return self._results

    def start_async(self, feeds=None, userdata=None) -> None:
        """Run on a worker thread; ``wait()`` for it. The request is busy until it finishes."""
        if self._job is not None and self._job.is_alive():
            raise RequestBusyError("this request is still running its last start_async(); wait() for it first")
        self._error = None
        feeds = dict(self._tensors) if feeds is None else feeds

        def work():
            try:
                self.infer(feeds)
            except BaseException as e:  # noqa: BLE001  re-raised by wait()
                self._error = e
            if self._callback is not None:
                self._callback(self, userdata)
        self._job = threading.Thread(target=work, daemon=True)
        self._job.start()

    def wait(self) -> None:
        """Block until the last ``start_async`` finished; raise its error, if any."""
        if self._job is not None:
            self._job.join()
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def wait_for(self, timeout_ms: int) -> bool:
        """True when the last ``start_async`` finished within ``timeout_ms``."""
        if self._job is None:
            return True
        self._job.join(timeout_ms / 1000)
        return not self._job.is_alive()

    def set_callback(self, callback) -> None:
        """``callback(request, userdata)`` after each ``start_async`` (its worker thread)."""
        self._callback = callback

    @property
    def results(self) -> dict:
        return dict(self._results)
