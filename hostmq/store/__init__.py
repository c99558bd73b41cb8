"""The store: commitlog, consume queues, index, checkpoint and recovery — no sockets, no processes."""
from .message_store import MessageStore, PutBatchResult, PutResult, PutStatus
from .reader import GetResult, GetStatus, MessageBatch

__all__ = ["MessageStore", "PutResult", "PutBatchResult", "PutStatus", "GetResult", "GetStatus",
           "MessageBatch"]
