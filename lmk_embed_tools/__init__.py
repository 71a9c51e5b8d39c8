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


# glibc's mallopt parameters (malloc.h) and the size from which a block gets its own mapping.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MAPPED_FROM_BYTES = 1 << 20


def return_freed_memory() -> bool:
    """Make this process give large freed blocks back to the system (glibc only; False elsewhere).

    glibc raises its mmap threshold each time a large block is freed, so the windows of a long
    document (blocks of a few to a few hundred MB, one group after another) end up on the heap,
    which it keeps: RSS then grows with the document. Fixing the threshold at 1 MiB, as the
    environment variables MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ would, keeps it flat
    (measured in docs/long-inputs.md). Called by the long-running workers of `lmk-embed`
    (encode-corpus, serve); a user's own process chooses for itself.
    """
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MAPPED_FROM_BYTES)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, _MAPPED_FROM_BYTES))
