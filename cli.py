"""`lmk-embed`: convert backbones into checkpoints, train, write model cards and publish.

    lmk-embed convert-lmk SOURCE OUTPUT [--pooling lmk] [--granularity 128] ...
    lmk-embed convert-recurrent SOURCE OUTPUT [--schedule auto] [--block-size 4096] ...
    lmk-embed train --config run.yaml [--key value ...]
    lmk-embed card CHECKPOINT
    lmk-embed push CHECKPOINT REPO_ID [--dry-run] ...
"""

from __future__ import annotations

import argparse
import sys


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _add_convert_lmk(subparsers) -> None:
    from lmk_embed.configuration_lmk import POOLINGS, SPLITTERS

    parser = subparsers.add_parser("convert-lmk", help="Turn an encoder (folder or Hub id) into an LMK checkpoint.")
    parser.add_argument("source", help="encoder checkpoint: a local folder, or a Hub id where the Hub is reachable")
    parser.add_argument("output", help="folder to write the LMK checkpoint to")
    parser.add_argument("--pooling", default="lmk", choices=POOLINGS)
    parser.add_argument("--granularity", type=_positive_int, default=128)
    parser.add_argument("--splitter", default="fixed", choices=SPLITTERS)
    parser.add_argument("--granularities", type=_positive_int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--landmark-token", default="sep", help="sep, eos, or a literal token")
    parser.add_argument("--max-length", type=_positive_int, default=None)
    parser.add_argument("--no-normalize", action="store_true", help="do not L2-normalise embeddings by default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-model", default=None, help="Hub id to record as the base model (for cards)")
    parser.set_defaults(handler=_run_convert_lmk)


def _run_convert_lmk(args) -> int:
    from training.convert import convert_to_lmk

    path = convert_to_lmk(
        args.source,
        args.output,
        pooling=args.pooling,
        granularity=args.granularity,
        splitter=args.splitter,
        granularities=args.granularities,
        normalize=not args.no_normalize,
        landmark_token=args.landmark_token,
        max_length=args.max_length,
        seed=args.seed,
        base_model=args.base_model,
    )
    print(f"LMK checkpoint written to {path}")
    return 0


def _run_train(argv: list[str]) -> int:
    """`lmk-embed train --config run.yaml [--field value ...]`: flags override the YAML file."""
    import logging

    import yaml
    from transformers import HfArgumentParser

    from training import TrainConfig, train

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = HfArgumentParser(TrainConfig, prog="lmk-embed train")
    parser.add_argument("--config", default=None, help="YAML file with the run's fields")
    known, _ = parser.parse_known_args(argv)
    if known.config:
        data = yaml.safe_load(open(known.config)) or {}
        TrainConfig.from_yaml(known.config)  # validates names and values of the file alone
        parser.set_defaults(**data)
    namespace = parser.parse_args(argv)
    fields = {k: v for k, v in vars(namespace).items() if k != "config"}
    result = train(TrainConfig(**fields))
    print(f"Final model: {result['final_dir']}")
    if result["metrics"]:
        print("Held-out metrics:", {k: round(v, 4) for k, v in result["metrics"].items() if k.endswith("ndcg@10")})
    return 0


def _add_convert_recurrent(subparsers) -> None:
    from lmk_embed.configuration_recurrent import SCHEDULES

    parser = subparsers.add_parser("convert-recurrent", help="Turn a recurrent causal LM into an embedder checkpoint.")
    parser.add_argument("source", help="a Mamba2 / xLSTM / RWKV causal-LM checkpoint: a local folder, or a Hub id")
    parser.add_argument("output", help="folder to write the embedder checkpoint to")
    parser.add_argument("--schedule", default="auto", choices=SCHEDULES)
    parser.add_argument("--block-size", type=_positive_int, default=4096, help="V: tokens per vertical block")
    parser.add_argument("--add-bos-token", action="store_true")
    parser.add_argument("--max-length", type=_positive_int, default=None)
    parser.add_argument("--default-task", default=None, help="the instruction for queries without a task")
    parser.add_argument("--no-normalize", action="store_true")
    parser.add_argument("--base-model", default=None, help="Hub id to record as the base model (for cards)")
    parser.set_defaults(handler=_run_convert_recurrent)


def _run_convert_recurrent(args) -> int:
    from training.convert import convert_to_recurrent

    path = convert_to_recurrent(
        args.source, args.output, schedule=args.schedule, block_size=args.block_size, add_bos_token=args.add_bos_token,
        max_length=args.max_length, default_task=args.default_task, normalize=not args.no_normalize,
        base_model=args.base_model,
    )
    print(f"Recurrent embedder checkpoint written to {path}")
    return 0


def _run_card(args) -> int:
    from model_cards import check_card, write_card

    path = write_card(args.checkpoint, model_id=args.model_id, license=args.license)
    check_card(path)
    print(f"Model card written to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmk-embed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_convert_lmk(subparsers)
    _add_convert_recurrent(subparsers)
    subparsers.add_parser("train", help="Fine-tune a checkpoint: lmk-embed train --config run.yaml [--field value ...]")
    subparsers.add_parser("push", help="Stage, validate and upload a checkpoint: lmk-embed push CHECKPOINT REPO_ID ...")
    card = subparsers.add_parser("card", help="Write (or refresh) a checkpoint's model card README.md.")
    card.add_argument("checkpoint")
    card.add_argument("--model-id", default=None, help="org/name used in the card's snippets")
    card.add_argument("--license", default="apache-2.0")
    card.set_defaults(handler=_run_card)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:  # dataclass-driven parser of its own
        return _run_train(argv[1:])
    if argv[:1] == ["push"]:  # push.py's own parser
        import push

        return push.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
