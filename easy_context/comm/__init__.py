"""Communication primitives: the ring exchange, exchanges at fixed ring offsets and the sequence<->heads all-to-all."""

from easy_context.comm.all_to_all import SeqAllToAll, all_to_all_4d
from easy_context.comm.exchange import exchange, start_exchange
from easy_context.comm.ring import PendingExchange, RingExchange

__all__ = ["PendingExchange", "RingExchange", "SeqAllToAll", "all_to_all_4d", "exchange", "start_exchange"]
