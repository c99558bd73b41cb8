"""hostmq: Apache RocketMQ's design on one host.

The public names of API.md are importable from here; the embedded store is ``hostmq.store``.
"""
from .config import BrokerConfig, Config, NamesrvConfig, StoreConfig
from .errors import (BrokerBusyError, ConfigError, ConnectError, CorruptRecordError, FilterSyntaxError,
                     HostMQError, MessageNotFoundError, NoRouteError, SendTimeout, StoreFullError,
                     StoreLockedError, ValidationError)
from .message import (ConsumeFrom, ConsumeResult, Message, MessageExt, MessageModel, MessageQueue,
                      SendResult, SendStatus, TransactionState)
from .records import tag_hash
from .store.reader import MessageBatch

__version__ = "0.1.0"

__all__ = [
    "Config", "NamesrvConfig", "BrokerConfig", "StoreConfig",
    "HostMQError", "ValidationError", "NoRouteError", "BrokerBusyError", "SendTimeout", "ConnectError",
    "ConfigError", "FilterSyntaxError", "StoreLockedError", "StoreFullError", "CorruptRecordError",
    "MessageNotFoundError",
    "Message", "MessageExt", "MessageQueue", "SendResult", "SendStatus", "TransactionState",
    "ConsumeResult", "MessageModel", "ConsumeFrom", "MessageBatch", "tag_hash",
]
