"""The tooling around the shipped models: conversion, training, evaluation, corpus encoding, cards
and publishing (`lmk-embed`). Nothing here ships inside a checkpoint."""

from contextlib import contextmanager


@contextmanager
def quiet_model_loading():
    """transformers' loading progress bar and load report off for the block (its public logging
    API): loads whose dropped keys are deliberate (an LM head) or that only check a setting must
    not print before the line that reports the outcome."""
    from transformers.utils import logging as transformers_logging

    shown, verbosity = transformers_logging.is_progress_bar_enabled(), transformers_logging.get_verbosity()
    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(verbosity)
        if shown:
            transformers_logging.enable_progress_bar()
