"""The two engines. Each takes the pending shards and calls `on_done(record)` as each completes,
so `encode_corpus` keeps the manifest current whichever engine runs.

- `local`: N worker processes on this machine, each with its own model copy, pulling shards from
  one queue. One device per worker where GPUs exist; otherwise the CPU threads are split among
  the workers (N processes each using every core would oversubscribe). One worker runs here, in
  this process.
- `ray`: Ray Data `map_batches` with `ShardEncoder` as a callable class on an actor pool of N
  (one actor, one model copy, per worker), on an existing cluster (`address`) or a local one.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import traceback

from .worker import ShardEncoder


def _threads_per_worker(num_workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // num_workers)


def _device(index: int):
    import torch

    return f"cuda:{index % torch.cuda.device_count()}" if torch.cuda.is_available() else None


def _exit_with_parent(parent: int) -> None:
    """Stop this worker when the driver dies (e.g. SIGKILL), instead of living on as an orphan."""

    def watch():
        while True:
            if os.getppid() != parent:
                os._exit(1)
            threading.Event().wait(1.0)

    threading.Thread(target=watch, daemon=True).start()


def _worker_main(job, index, num_threads, tasks, results, parent) -> None:
    _exit_with_parent(parent)
    try:
        encoder = ShardEncoder(job, device=_device(index), num_threads=num_threads)
        while (shard := tasks.get()) is not None:
            record = encoder.encode_shard(shard, progress=lambda rows, tokens: results.put(("progress", rows, tokens)))
            results.put(("done", record))
    except BaseException as error:  # reported to the driver, which raises it
        results.put(("error", f"{type(error).__name__}: {error}", traceback.format_exc()))


class WorkerError(RuntimeError):
    """A worker failed; the message carries its error, and the traceback follows it."""


def run_local(job: dict, pending: list[dict], num_workers: int, on_done, on_progress) -> None:
    if num_workers == 1 or len(pending) <= 1:
        encoder = ShardEncoder(job, device=_device(0))
        for shard in pending:
            on_done(encoder.encode_shard(shard, progress=on_progress))
        return

    import torch.multiprocessing as mp

    context = mp.get_context("spawn")  # fork would copy this process's torch threads and locks
    tasks, results = context.Queue(), context.Queue()
    workers = min(num_workers, len(pending))
    for shard in pending:
        tasks.put(shard)
    for _ in range(workers):
        tasks.put(None)
    threads = _threads_per_worker(workers)
    processes = [
        context.Process(target=_worker_main, args=(job, i, threads, tasks, results, os.getpid()), daemon=True)
        for i in range(workers)
    ]
    for process in processes:
        process.start()
    remaining = len(pending)
    try:
        while remaining:
            try:
                message = results.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in processes if p.exitcode not in (None, 0)]
                if dead:
                    raise WorkerError(f"a worker process died (exit code {dead[0].exitcode})") from None
                continue
            if message[0] == "progress":
                on_progress(message[1], message[2])
            elif message[0] == "done":
                on_done(message[1])
                remaining -= 1
            else:
                raise WorkerError(f"{message[1]}\n--- worker traceback ---\n{message[2]}")
    finally:
        for process in processes:
            if process.is_alive() and remaining:
                process.terminate()
            process.join(timeout=10)


def run_ray(job: dict, pending: list[dict], num_workers: int, on_done, on_progress, address: str | None = None,
            gpus_per_worker: float = 0) -> None:
    try:
        import ray
    except ImportError:
        raise ImportError("--engine ray needs Ray: pip install 'lmk-embed[scale]'") from None

    started_here = not ray.is_initialized()
    if started_here:
        if address:
            ray.init(address=address)  # an existing cluster: lmk-embed must be installed on its nodes
        else:
            # A local cluster; its workers import this package from where this process does.
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
            ray.init(include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        threads = max(1, cpus // num_workers) if not gpus_per_worker else None
        dataset = ray.data.from_items([{"shard": json.dumps(shard)} for shard in pending])
        encoded = dataset.map_batches(
            ShardEncoder,
            fn_constructor_kwargs={"job": job, "device": "cuda" if gpus_per_worker else None, "num_threads": threads},
            batch_size=1,  # one shard per call: a shard is written, and reported, as soon as it is done
            compute=ray.data.ActorPoolStrategy(size=num_workers),
            num_gpus=gpus_per_worker,
            num_cpus=threads or 1,
        )
        for row in encoded.iter_rows():
            record = json.loads(row["record"])
            on_progress(record["rows"], record["tokens"])
            on_done(record)
    finally:
        if started_here:  # a cluster we attached to, or one the caller started, stays up
            ray.shutdown()
