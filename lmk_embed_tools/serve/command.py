"""`lmk-embed serve CHECKPOINT`: start the Ray Serve application and keep it up until interrupted."""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import signal
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
        "serve", help="Serve a checkpoint over HTTP on Ray Serve: OpenAI-compatible /v1/embeddings, /v1/landmarks, "
                      "/v1/search (with --index), /v1/models, /health.")
    parser.add_argument("checkpoint", help="checkpoint folder or Hub id")
    parser.add_argument("--name", default=None, help="the model name clients send as `model` (default: CHECKPOINT "
                        "as given)")
    parser.add_argument("--index", default=None, help="an encode-corpus --output-value landmarks folder encoded by "
                        "CHECKPOINT, for /v1/search")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=port_number, default=8000)
    parser.add_argument("--replicas", type=positive_int, default=1, help="copies of the model (Ray actors)")
    parser.add_argument("--num-cpus", type=positive_float, default=1.0,
                        help="Ray CPUs each replica reserves (> 0); also its torch threads (at least 1)")
    parser.add_argument("--max-batch-size", type=positive_int, default=16,
                        help="requests one replica embeds in one batch")
    parser.add_argument("--batch-wait-ms", type=non_negative_float, default=5.0,
                        help="how long a batch waits for more requests once the first arrived")
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
                        help="embedding requests one replica holds at once, waiting or computing; past it 429 with "
                             "retry-after (default: 4 x --max-batch-size)")
    parser.add_argument("--address", default=None, help="a running Ray cluster (e.g. auto or ray://HOST:10001); "
                        "default: a local Ray started for this command")
    parser.add_argument("--proxy-location", default="HeadOnly", choices=["HeadOnly", "EveryNode"],
                        help="where Serve's HTTP proxy runs on a cluster: the head node (the one address printed), "
                             "or every node (each answers on --port)")
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
    queued = args.max_queued_requests if args.max_queued_requests is not None else 4 * args.max_batch_size
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


def error_line(message: str) -> None:
    print(f"lmk-embed serve: error: {message[:2000]}", file=sys.stderr, flush=True)


def metrics_address() -> str | None:
    """Where this node's Ray metrics agent serves Prometheus metrics (None: unknown)."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id and node.get("MetricsExportPort"):
            return f"http://{node.get('NodeManagerAddress')}:{node['MetricsExportPort']}/metrics"
    return None


def run_serve(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    limits, api_key = limits_from(args), api_key_from(args)
    local_loopback = args.address is None and is_loopback(args.host)
    if local_loopback:  # before Ray is imported: its processes then listen on loopback only
        os.environ.setdefault(RAY_LOOPBACK_ENV, "0")
    try:
        import ray
        from ray import serve

        from .app import build_application
    except ImportError as error:
        raise UsageError(f"serving needs the serve extra: pip install 'lmk-embed[serve]' ({error})") from None
    if api_key is None and not is_loopback(args.host):
        print(f"lmk-embed serve: warning: listening on {args.host} without an API key: anyone who reaches port "
              f"{args.port} can use this server (set {API_KEY_ENV} or --api-key)", file=sys.stderr, flush=True)
    application = build_application(settings, limits, api_key, args.replicas, args.num_cpus, args.max_batch_size,
                                    args.batch_wait_ms)
    try:
        ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    except Exception as error:  # a cluster that is not there, a local start that timed out
        error_line(f"Ray did not start: {one_line(error)}")
        return 1
    # SIGTERM stops the server as Ctrl-C does: Serve's actors go with it.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        serve.start(proxy_location=args.proxy_location, http_options={"host": args.host, "port": args.port})
        serve.run(application, name="lmk-embed", route_prefix="/")
        metrics = metrics_address()
        print(f"serving {settings['name']!r} at http://{args.host}:{args.port}/v1 "
              f"({args.replicas} replica(s){', API key required' if api_key else ''}); "
              f"{f'metrics at {metrics}; ' if metrics else ''}Ctrl-C stops", flush=True)
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
