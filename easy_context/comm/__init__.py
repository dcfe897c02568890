"""Communication primitives: the ring exchange and the sequence<->heads all-to-all."""

from .all_to_all import SeqAllToAll, all_to_all_4d
from .ring import RingExchange

__all__ = ["RingExchange", "SeqAllToAll", "all_to_all_4d"]
