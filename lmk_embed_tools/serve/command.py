"""`lmk-embed serve CHECKPOINT`: serve the model over HTTP until interrupted: in this one process under
uvicorn (the default), or as a Ray Serve application with --replicas, --address or --proxy-location.

Every argument, the checkpoint, the index, the key, and the host and port (bound here, before a
model is loaded or Ray starts) are checked first; each refusal is one plain line."""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import json
import math
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

from lmk_embed_tools.commandline import UsageError, check_source, one_line, positive_int

from .protocol import Limits

# The environment variable that holds the API key (kept out of `ps` and shell history, unlike --api-key).
API_KEY_ENV = "LMK_EMBED_API_KEY"
# Ray's switch (documented for clusters on Windows and macOS) that makes a node take the loopback
# address: every process of a local Ray then listens on 127.0.0.1 only. Read when Ray is imported.
RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {value}")
    return value


def add_serve_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="Serve a checkpoint over HTTP (one process; Ray Serve with --replicas, --address or "
                      "--proxy-location): OpenAI-compatible /v1/embeddings, /v1/landmarks, /v1/search (with --index), "
                      "/v1/models, /health.")
    parser.add_argument("checkpoint", help="checkpoint folder or Hub id")
    parser.add_argument("--name", default=None, help="the model name clients send as `model` (default: CHECKPOINT "
                        "as given)")
    parser.add_argument("--index", default=None, help="an encode-corpus --output-value landmarks folder encoded by "
                        "CHECKPOINT, for /v1/search")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=port_number, default=8000)
    parser.add_argument("--replicas", type=positive_int, default=None,
                        help="serve on Ray Serve with this many copies of the model (Ray actors); without it, "
                             "--address or --proxy-location the server is this one process")
    parser.add_argument("--num-cpus", type=positive_float, default=1.0,
                        help="torch threads of the model (at least 1); on Ray, the CPUs each replica reserves (> 0)")
    parser.add_argument("--max-batch-size", type=positive_int, default=32,
                        help="requests the model embeds in one batch (the ones queued while it computed the last)")
    parser.add_argument("--batch-wait-ms", type=non_negative_float, default=0.0,
                        help="how long a batch of fewer than --max-batch-size waits for more (default 0: it takes "
                             "what is queued, so a lone request never waits)")
    parser.add_argument("--api-key", default=None,
                        help=f"require `Authorization: Bearer KEY` on every endpoint but /health (default: the "
                             f"{API_KEY_ENV} environment variable, which, unlike this flag, stays out of `ps`)")
    defaults = Limits()
    parser.add_argument("--max-body-bytes", type=positive_int, default=defaults.max_body_bytes,
                        help="413 for a request body over this many bytes (default: %(default)s, 2 MiB)")
    parser.add_argument("--max-inputs", type=positive_int, default=defaults.max_inputs,
                        help="413 for a request of more texts (default: %(default)s, as OpenAI)")
    parser.add_argument("--max-input-tokens", type=positive_int, default=defaults.max_input_tokens,
                        help="413 for a text over this many model tokens (default: %(default)s); a checkpoint that "
                             "would cut a text earlier refuses it at its own max_length")
    parser.add_argument("--max-request-tokens", type=positive_int, default=defaults.max_request_tokens,
                        help="413 for a request whose texts hold more model tokens in all (default: %(default)s)")
    parser.add_argument("--request-timeout-s", type=positive_float, default=defaults.request_timeout_s,
                        help="504 for a request not answered within this many seconds (default: %(default)s)")
    parser.add_argument("--read-timeout-s", type=positive_float, default=defaults.read_timeout_s,
                        help="408 for a request body not received within this many seconds (default: %(default)s)")
    parser.add_argument("--max-queued-requests", type=positive_int, default=None,
                        help="model requests (embeddings, landmarks, searches) the server (on Ray: each replica) "
                             "holds at once, waiting or computing; past it 429 with retry-after (default: 2 x "
                             "--max-batch-size)")
    parser.add_argument("--address", default=None, help="serve on a running Ray cluster (e.g. auto or "
                        "ray://HOST:10001); with --replicas alone, a local Ray started for this command")
    parser.add_argument("--proxy-location", default=None, choices=["HeadOnly", "EveryNode"],
                        help="serve on Ray Serve, its HTTP proxy on the head node (HeadOnly, the default there: the one "
                             "address printed) or on every node (EveryNode: each answers on --port)")
    parser.add_argument("--backend", default="torch", choices=["torch", "onnx"],
                        help="onnx: the checkpoint's onnx/model.onnx on ONNX Runtime (lmk-embed export-onnx)")
    parser.set_defaults(handler=run_serve)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def check_checkpoint(source: str, backend: str) -> None:
    """CHECKPOINT is a folder or a Hub id; a folder must hold an lmk-embed checkpoint (and, for
    `--backend onnx`, its exported graph). A Hub id is checked when a replica loads it."""
    from .model import FAMILIES

    check_source(source, "CHECKPOINT")
    folder = Path(source)
    if not folder.is_dir():
        return
    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as error:
        raise UsageError(f"CHECKPOINT {source!r} is not a checkpoint folder: no readable config.json "
                         f"({one_line(error)})") from None
    if model_type not in FAMILIES:
        raise UsageError(f"CHECKPOINT {source!r} is a {model_type!r} model, not an lmk-embed checkpoint "
                         f"({' or '.join(FAMILIES)})")
    if backend == "onnx" and not (folder / "onnx" / "model.onnx").is_file():
        raise UsageError(f"--backend onnx: {source!r} has no onnx/model.onnx; make it with `lmk-embed export-onnx`")


def api_key_from(args: argparse.Namespace) -> str | None:
    """--api-key, else the environment variable; an empty key is refused."""
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise UsageError(f"the API key (--api-key or {API_KEY_ENV}) is empty")
    return key


def limits_from(args: argparse.Namespace) -> Limits:
    queued = args.max_queued_requests if args.max_queued_requests is not None else 2 * args.max_batch_size
    return Limits(args.max_body_bytes, args.max_inputs, args.max_input_tokens, args.max_request_tokens,
                  args.request_timeout_s, args.read_timeout_s, queued)


def settings_from(args: argparse.Namespace) -> dict:
    """`ServedModel`'s arguments; CHECKPOINT (and the index against it) checked here, before Ray starts."""
    check_checkpoint(args.checkpoint, args.backend)
    if args.index is not None:
        from lmk_embed_tools.corpus import verify

        folder = Path(args.index)
        try:
            verify.query_model(verify.read_index_manifest(folder), folder, args.checkpoint)
        except (verify.SearchError, OSError) as error:
            raise UsageError(f"--index: {one_line(error)}") from None
    return {"checkpoint": args.checkpoint, "name": args.name or args.checkpoint, "backend": args.backend,
            "index": args.index, "max_input_tokens": args.max_input_tokens,
            "max_request_tokens": args.max_request_tokens, "num_threads": max(1, int(args.num_cpus))}


# Terminal colour and cursor codes (Ray's errors carry them): a refusal is plain text.
TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def error_line(message: str) -> None:
    plain = " ".join(TERMINAL_CODES.sub("", message).split())
    print(f"lmk-embed serve: error: {plain[:2000]}", file=sys.stderr, flush=True)


def metrics_address() -> str | None:
    """Where this node's Ray metrics agent serves Prometheus metrics (None: unknown)."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id and node.get("MetricsExportPort"):
            return f"http://{node.get('NodeManagerAddress')}:{node['MetricsExportPort']}/metrics"
    return None


def on_ray(args: argparse.Namespace) -> bool:
    """Ray Serve is asked for by --replicas, --address or --proxy-location; else one process."""
    return args.replicas is not None or args.address is not None or args.proxy_location is not None


def bind(host: str, port: int) -> socket.socket:
    """The listening socket of --host:--port, bound now: a port in use or an address not on this machine
    is one line (UsageError) before any model is loaded or Ray starts."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise UsageError(f"--host {host!r} is not an address of this machine ({error.strerror})") from None
    family, kind, protocol, _, address = infos[0]
    listener = socket.socket(family, kind, protocol)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port in TIME_WAIT is free
    try:
        listener.bind(address)
        listener.listen(2048)
    except OSError as error:
        listener.close()
        if error.errno == errno.EADDRINUSE:
            raise UsageError(f"--port {port}: the port is already in use on {host}; stop what listens there or "
                             "choose another --port") from None
        if error.errno == errno.EADDRNOTAVAIL:
            raise UsageError(f"--host {host!r} is not an address of this machine") from None
        if error.errno == errno.EACCES:
            raise UsageError(f"--port {port}: not allowed to listen there (ports below 1024 need privileges)") from None
        raise UsageError(f"--host {host!r} --port {port}: cannot listen there ({one_line(error)})") from None
    listener.set_inheritable(True)
    return listener


def run_serve(args: argparse.Namespace) -> int:
    listener = bind(args.host, args.port)  # first: a port in use is refused before anything else is read
    try:
        settings = settings_from(args)
        limits, api_key = limits_from(args), api_key_from(args)
        import fastapi  # noqa: F401
        import orjson  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        listener.close()
        raise UsageError(f"serving needs the serve extra: pip install 'lmk-embed[serve]' ({error})") from None
    except BaseException:
        listener.close()
        raise
    local_loopback = args.address is None and is_loopback(args.host)
    ray = on_ray(args)
    if api_key is None and not is_loopback(args.host):
        print(f"lmk-embed serve: warning: listening on {args.host} without an API key: anyone who reaches port "
              f"{args.port} can use this server (set {API_KEY_ENV} or --api-key)", file=sys.stderr, flush=True)
    if not ray:
        return serve_in_process(args, settings, limits, api_key, listener)
    listener.close()  # checked: Ray's proxy binds the port itself
    if local_loopback:  # before Ray is imported: its processes then listen on loopback only
        os.environ.setdefault(RAY_LOOPBACK_ENV, "0")
    return serve_on_ray(args, settings, limits, api_key)


def ready_line(args: argparse.Namespace, name: str, where: str, api_key: str | None, metrics: str | None = None) -> str:
    return (f"serving {name!r} at http://{args.host}:{args.port}/v1 ({where}{', API key required' if api_key else ''}); "
            f"{f'metrics at {metrics}; ' if metrics else ''}Ctrl-C stops")


def serve_in_process(args: argparse.Namespace, settings: dict, limits: Limits, api_key: str | None,
                     listener: socket.socket) -> int:
    """The app under uvicorn in this process, on `listener`; the model on its own thread."""
    import uvicorn

    from .app import build_local_api

    try:
        api = build_local_api(settings, limits, api_key, args.max_batch_size, args.batch_wait_ms)
    except Exception as error:  # a checkpoint that does not load: say why in one line
        listener.close()
        error_line(one_line(error))
        return 1
    config = uvicorn.Config(api, log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                            lifespan="off", server_header=False)
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[listener]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            print(ready_line(args, settings["name"], f"one process, {settings['num_threads']} torch thread(s)",
                             api_key), flush=True)
        await task

    try:
        asyncio.run(serve())  # uvicorn stops on Ctrl-C and SIGTERM
    except KeyboardInterrupt:
        pass
    finally:
        api.state.frontend.batcher.close()
        listener.close()
    return 0


def serve_on_ray(args: argparse.Namespace, settings: dict, limits: Limits, api_key: str | None) -> int:
    try:
        import ray
        from ray import serve

        from .app import build_application
    except ImportError as error:
        raise UsageError(f"serving on Ray needs the serve extra: pip install 'lmk-embed[serve]' ({error})") from None
    replicas = args.replicas or 1
    application = build_application(settings, limits, api_key, replicas, args.num_cpus, args.max_batch_size,
                                    args.batch_wait_ms)
    try:
        ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    except Exception as error:  # a cluster that is not there, a local start that timed out
        error_line(f"Ray did not start: {one_line(error)}")
        return 1
    # SIGTERM stops the server as Ctrl-C does: Serve's actors go with it.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        serve.start(proxy_location=args.proxy_location or "HeadOnly",
                    http_options={"host": args.host, "port": args.port})
        serve.run(application, name="lmk-embed", route_prefix="/")
        print(ready_line(args, settings["name"], f"Ray Serve, {replicas} replica(s)", api_key, metrics_address()),
              flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    except Exception as error:  # a replica that cannot load the model fails the deployment: say why in one line
        error_line(one_line(error))
        return 1
    finally:
        if args.address is not None:  # a cluster outlives the command: take the application off it
            serve.shutdown()
        ray.shutdown()  # a local Ray goes down with every actor it started
    return 0
