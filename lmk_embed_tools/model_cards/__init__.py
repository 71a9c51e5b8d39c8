"""Model cards for our checkpoints (template + generator)."""

from .generator import build_card, check_card, record_results, write_card

__all__ = ["build_card", "check_card", "record_results", "write_card"]
