"""Communication primitives: the ring exchange and the sequence<->heads all-to-all."""

from .all_to_all import SeqAllToAll, all_to_all_4d
from .ring import PendingExchange, RingExchange

__all__ = ["PendingExchange", "RingExchange", "SeqAllToAll", "all_to_all_4d"]
