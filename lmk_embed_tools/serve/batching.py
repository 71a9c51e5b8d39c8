"""Dynamic batching on the model's own thread, the one batching of `lmk-embed serve` (one process
and each Ray Serve replica alike).

The event loop never waits for the model: a route hands its checked request to `Batcher` and
awaits an asyncio future. The model thread takes the first piece of work queued and, for an
embedding, every other embedding queued behind it (at most `max_batch_size` requests, waiting up to
`batch_wait_s` for more while fewer are queued), and makes one `ServedModel.embed` call of them;
landmarks and searches run alone, in their turn. While it computes, the next requests are parsed,
counted and queued, so the next batch is as large as the load makes it: at concurrency 1 a request
never waits for company (with the default `batch_wait_s` 0), at concurrency 32 the batches fill.

A request whose awaiting task is cancelled (its client hung up, its deadline passed) is dropped
from the queue where its work has not started, and a long piece of work (a request of many texts
or queries) stops between its slices once no request of it is waited for (`alive`).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time


class Work:
    """One request's model work: `function(*args, alive=alive)` (a landmarks or search call), or,
    with `function` None, `request` to embed in a batch. `future` is awaited on `loop`."""

    __slots__ = ("function", "args", "request", "loop", "future", "deadline")

    def __init__(self, loop, function, args, request, deadline: float):
        self.loop, self.function, self.args, self.request, self.deadline = loop, function, args, request, deadline
        self.future = loop.create_future()

    def alive(self) -> bool:
        """Still waited for: not cancelled (a client gone) and inside its deadline."""
        return not self.future.done() and time.monotonic() < self.deadline

    def answer(self, value=None, error: BaseException | None = None) -> None:
        self.loop.call_soon_threadsafe(_settle, self.future, value, error)


def _settle(future, value, error) -> None:
    if future.done():  # cancelled while the model computed: nobody waits for it
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class Batcher:
    """The model thread of one `ServedModel` (`served`) and its queue. `embed` and `call` are awaited
    on the event loop; `on_batch(size)` is told each embedding batch's number of requests."""

    def __init__(self, served, max_batch_size: int = 32, batch_wait_s: float = 0.0, on_batch=None):
        self.served, self.max_batch_size, self.batch_wait_s = served, max_batch_size, batch_wait_s
        self.on_batch = on_batch or (lambda size: None)
        self.queue: collections.deque = collections.deque()
        self.ready = threading.Condition()
        self.running = True
        self.thread = threading.Thread(target=self._run, name="model", daemon=True)
        self.thread.start()

    async def embed(self, request, deadline: float):
        """`request`'s vectors, computed in a batch with the embeddings queued beside it."""
        return await self._submit(Work(asyncio.get_running_loop(), None, (), request, deadline))

    async def call(self, function, *args, deadline: float = float("inf")):
        """`function(*args, alive=...)` alone on the model thread, in its turn in the queue."""
        return await self._submit(Work(asyncio.get_running_loop(), function, args, None, deadline))

    async def _submit(self, work: Work):
        with self.ready:
            self.queue.append(work)
            self.ready.notify()
        try:
            return await work.future
        finally:
            work.future.cancel()  # cancelled or answered: the model thread skips it either way

    def close(self) -> None:
        with self.ready:
            self.running = False
            self.ready.notify()
        self.thread.join(timeout=30)

    # ---- the model thread ---------------------------------------------------------------------

    def _next(self) -> list[Work] | None:
        """The next live work: one call, or a batch of embeddings (None: closed)."""
        with self.ready:
            while True:
                while self.running and not self.queue:
                    self.ready.wait()
                if not self.running:
                    return None
                first = self.queue.popleft()
                if not first.alive():
                    continue  # dropped before its work started
                if first.function is not None:
                    return [first]
                batch, waited_until = [first], time.monotonic() + self.batch_wait_s
                while len(batch) < self.max_batch_size:
                    taken = self._take_embedding()
                    if taken is not None:
                        if taken.alive():
                            batch.append(taken)
                        continue
                    left = waited_until - time.monotonic()
                    if left <= 0 or not self.running:
                        break
                    self.ready.wait(left)
                return batch

    def _take_embedding(self) -> Work | None:
        """The first embedding in the queue (calls keep their places); under `self.ready`."""
        for index, work in enumerate(self.queue):
            if work.function is None:
                del self.queue[index]
                return work
        return None

    def _run(self) -> None:
        # Torch's thread settings are partly per thread (MKL's count is thread-local): the model's own
        # thread takes the served model's, or a 1-thread model would run MKL on every core.
        getattr(self.served, "enter_model_thread", lambda: None)()
        while (batch := self._next()) is not None:
            try:
                if batch[0].function is not None:
                    work = batch[0]
                    work.answer(work.function(*work.args, alive=work.alive))
                    continue
                self.on_batch(len(batch))
                vectors = self.served.embed([work.request for work in batch],
                                            alive=lambda: any(work.alive() for work in batch))
                for work, value in zip(batch, vectors):
                    work.answer(value)
            except BaseException as error:  # the awaiting routes answer it (500 with the request id)
                for work in batch:
                    work.answer(error=error)
