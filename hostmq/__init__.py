"""hostmq: Apache RocketMQ's design on one host.

The public names of docs/api.md are importable from here; the embedded store is ``hostmq.store``.
``__version__`` below is the one version source (pyproject.toml reads it, `hostmq --version` prints it).
"""
import sys as _sys
from typing import TYPE_CHECKING

if not _sys.platform.startswith("linux"):
    # futexes, memfds, /dev/shm, SO_PEERCRED and /proc are the data path; nothing would work half-way.
    raise ImportError(f"hostmq runs on Linux only (it needs futexes, memfds and /dev/shm); this is {_sys.platform}")

from .config import BrokerConfig, Config, NamesrvConfig, StoreConfig
from .errors import (BrokerBusyError, ConfigError, ConnectError, CorruptRecordError, FilterSyntaxError,
                     DataLossError, HostMQError, MessageNotFoundError, NoRouteError, NotMasterError,
                     PermissionDeniedError, PromotionRefusedError, RoleLockTimeoutError, SendTimeout, StoreFullError,
                     StoreLockedError, ValidationError)
from .errors import ReservedPropertyError
from .message import (ConsumeFrom, ConsumeResult, Message, MessageExt, MessageModel, MessageQueue,
                      SendResult, SendStatus, TransactionState)
from .records import tag_hash
from .client.rebalance import allocate
from .client.sql92 import SQL
from .store.reader import MessageBatch

if TYPE_CHECKING:               # what the lazily loaded names are, for type checkers (py.typed)
    from .client.accumulator import BatchConfig
    from .client.consume_service import ConsumeConcurrentlyContext, ConsumeOrderlyContext
    from .admin.admin import Admin
    from .client.producer import Producer
    from .client.pull_consumer import PullConsumer
    from .client.push_consumer import PushConsumer
    from .client.transaction_producer import TransactionProducer, TransactionSendResult
    from .cluster import LocalCluster
    from . import aio

# The clients and LocalCluster pull in pyzmq; load them on first use so that ``import hostmq`` (and the
# pure modules under it: protocol, store, records) stays free of zmq and threads.
_LAZY = {"Producer": ".client.producer", "PullConsumer": ".client.pull_consumer", "Admin": ".admin.admin",
         "PushConsumer": ".client.push_consumer", "TransactionProducer": ".client.transaction_producer",
         "TransactionSendResult": ".client.transaction_producer", "BatchConfig": ".client.accumulator",
         "LocalCluster": ".cluster", "ConsumeConcurrentlyContext": ".client.consume_service",
         "ConsumeOrderlyContext": ".client.consume_service"}


def __getattr__(name: str):
    if name in ("spark", "aio"):    # imported on demand (Spark needs the spark extra)
        import importlib
        return importlib.import_module("." + name, __name__)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hostmq' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value

__version__ = "0.1.0"

__all__ = [
    "Config", "NamesrvConfig", "BrokerConfig", "StoreConfig",
    "HostMQError", "ValidationError", "NoRouteError", "BrokerBusyError", "SendTimeout", "ConnectError",
    "ConfigError", "FilterSyntaxError", "StoreLockedError", "StoreFullError", "CorruptRecordError",
    "MessageNotFoundError", "DataLossError", "NotMasterError", "PromotionRefusedError", "PermissionDeniedError",
    "RoleLockTimeoutError", "ReservedPropertyError",
    "Message", "MessageExt", "MessageQueue", "SendResult", "SendStatus", "TransactionState",
    "ConsumeResult", "MessageModel", "ConsumeFrom", "MessageBatch", "tag_hash", "allocate", "SQL",
    "Producer", "TransactionProducer", "TransactionSendResult", "PullConsumer", "PushConsumer", "Admin",
    "LocalCluster", "BatchConfig", "ConsumeConcurrentlyContext", "ConsumeOrderlyContext",
]
