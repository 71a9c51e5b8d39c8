"""`lmk-embed serve CHECKPOINT`: start the Ray Serve application and keep it up until interrupted."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from lmk_embed_tools.commandline import UsageError, check_source, one_line, positive_int


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
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
    parser.add_argument("--num-cpus", type=non_negative_float, default=1.0,
                        help="Ray CPUs each replica reserves; also its torch threads (at least 1)")
    parser.add_argument("--max-batch-size", type=positive_int, default=16,
                        help="requests one replica embeds in one batch")
    parser.add_argument("--batch-wait-ms", type=non_negative_float, default=5.0,
                        help="how long a batch waits for more requests once the first arrived")
    parser.add_argument("--max-input-tokens", type=positive_int, default=None,
                        help="answer 413 for a text over this many tokens (default: no limit)")
    parser.add_argument("--address", default=None, help="a running Ray cluster (e.g. auto or ray://HOST:10001); "
                        "default: a local Ray started for this command")
    parser.add_argument("--proxy-location", default="HeadOnly", choices=["HeadOnly", "EveryNode"],
                        help="where Serve's HTTP proxy runs on a cluster: the head node (the one address printed), "
                             "or every node (each answers on --port)")
    parser.add_argument("--backend", default="torch", choices=["torch", "onnx"],
                        help="onnx: the checkpoint's onnx/model.onnx on ONNX Runtime (lmk-embed export-onnx)")
    parser.set_defaults(handler=run_serve)


def settings_from(args: argparse.Namespace) -> dict:
    """`ServedModel`'s arguments; the index is checked against CHECKPOINT here, before Ray starts."""
    check_source(args.checkpoint, "CHECKPOINT")
    if args.index is not None:
        from lmk_embed_tools.corpus import verify

        folder = Path(args.index)
        try:
            verify.query_model(verify.read_index_manifest(folder), folder, args.checkpoint)
        except (verify.SearchError, OSError) as error:
            raise UsageError(f"--index: {one_line(error)}") from None
    return {"checkpoint": args.checkpoint, "name": args.name or args.checkpoint, "backend": args.backend,
            "index": args.index, "max_input_tokens": args.max_input_tokens,
            "num_threads": max(1, int(args.num_cpus))}


def run_serve(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    try:
        import ray
        from ray import serve

        from .app import build_application
    except ImportError as error:
        raise UsageError(f"serving needs the serve extra: pip install 'lmk-embed[serve]' ({error})") from None
    application = build_application(settings, args.replicas, args.num_cpus, args.max_batch_size, args.batch_wait_ms)
    ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    # SIGTERM stops the server as Ctrl-C does: Serve's actors go with it.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        serve.start(proxy_location=args.proxy_location, http_options={"host": args.host, "port": args.port})
        serve.run(application, name="lmk-embed", route_prefix="/")
        print(f"serving {settings['name']!r} at http://{args.host}:{args.port}/v1 "
              f"({args.replicas} replica(s)); Ctrl-C stops", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    except Exception as error:  # a replica that cannot load the model fails the deployment: say why in one line
        print(f"lmk-embed serve: error: {one_line(error)[:2000]}", file=sys.stderr)
        return 1
    finally:
        if args.address is not None:  # a cluster outlives the command: take the application off it
            serve.shutdown()
        ray.shutdown()  # a local Ray goes down with every actor it started
    return 0
