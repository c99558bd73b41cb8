"""Request and response codes of the control path, and the one mapping between errors and codes.

Numbers are RocketMQ's (``RequestCode.java`` / ``ResponseCode.java``) wherever RocketMQ has the code,
so its documentation applies; codes hostmq adds sit in ranges RocketMQ leaves free (900+, and
``BAD_REQUEST`` = 400).

The server turns a handler's exception into a response code with :func:`response_code_for`; the client
turns a non-SUCCESS response back into an exception with :func:`error_for_response`. Keeping both
directions here keeps them inverse of each other.
"""
from __future__ import annotations

import enum

from ..errors import (BrokerBusyError, FencedError, HostMQError, MessageNotFoundError, NoRouteError,
                      NotMasterError, PermissionDeniedError, PromotionRefusedError, ProtocolError, RemoteError,
                      ValidationError)


class RequestCode(enum.IntEnum):
    """What a request asks for (frame 0 ``code`` of a request)."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    GET_CONSUME_STATS = 208
    INVOKE_BROKER_TO_RESET_OFFSET = 222     # backtrack a group's offsets of a topic to a timestamp
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_TOPICS_BY_CLUSTER = 224
    # hostmq only. 900, 901, 903 and 904 opened/closed producer rings and consumer wake-up words over
    # this socket; rings now go over session.sock (protocol.session) and consumers register nothing.
    PING = 902
    AUTO_CREATE_TOPIC = 905         # a producer's first send to a topic no broker serves yet
    PROMOTE_BROKER = 906            # hostmq only: a slave becomes its group's master (broker/promotion.py)


class ResponseCode(enum.IntEnum):
    """How a request went (frame 0 ``code`` of a response)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    BAD_REQUEST = 400          # hostmq only: malformed frame or bad request fields
    PROMOTION_REFUSED = 401    # hostmq only: the slave is not caught up, or its master still runs
    EPOCH_FENCED = 409         # hostmq only: an epoch older than the newest known for that broker name and id
    # hostmq only: the peer's uid (from the kernel) may not make this request — administration is the
    # root owner's, or a cap on what clients create was reached. Not RocketMQ's NO_PERMISSION (16),
    # which hostmq's clients read as "a slave: go to the master".
    PERMISSION_DENIED = 403


def code_name(code: int, kind: type[enum.IntEnum] = RequestCode) -> str:
    """``"PULL_MESSAGE(11)"`` for a known code, ``"777"`` for an unknown one (for messages and logs)."""
    try:
        return f"{kind(code).name}({int(code)})"
    except ValueError:
        return str(code)


# Most specific class first: the first isinstance match wins (StoreFullError is a BrokerBusyError).
_ERROR_CODES: tuple[tuple[type[HostMQError], ResponseCode], ...] = (
    (ProtocolError, ResponseCode.BAD_REQUEST),
    (PromotionRefusedError, ResponseCode.PROMOTION_REFUSED),
    (FencedError, ResponseCode.EPOCH_FENCED),
    (PermissionDeniedError, ResponseCode.PERMISSION_DENIED),
    (ValidationError, ResponseCode.MESSAGE_ILLEGAL),
    (NotMasterError, ResponseCode.NO_PERMISSION),
    (NoRouteError, ResponseCode.TOPIC_NOT_EXIST),
    (BrokerBusyError, ResponseCode.SYSTEM_BUSY),
    (MessageNotFoundError, ResponseCode.QUERY_NOT_FOUND),
)

_CODE_ERRORS: dict[int, type[HostMQError]] = {
    ResponseCode.MESSAGE_ILLEGAL: ValidationError,
    ResponseCode.TOPIC_NOT_EXIST: NoRouteError,
    ResponseCode.NO_PERMISSION: NotMasterError,
    ResponseCode.SYSTEM_BUSY: BrokerBusyError,
    ResponseCode.QUERY_NOT_FOUND: MessageNotFoundError,
    ResponseCode.PROMOTION_REFUSED: PromotionRefusedError,
    ResponseCode.EPOCH_FENCED: FencedError,
    ResponseCode.PERMISSION_DENIED: PermissionDeniedError,
}


def response_code_for(exc: BaseException) -> ResponseCode:
    """The response code a server answers with when a handler raises ``exc``."""
    for kind, code in _ERROR_CODES:
        if isinstance(exc, kind):
            return code
    return ResponseCode.SYSTEM_ERROR


def error_for_response(code: int, remark: str, address: str = "") -> HostMQError:
    """The exception a client raises for a non-SUCCESS response (``RemoteError`` when none is narrower)."""
    kind = _CODE_ERRORS.get(code)
    if kind is None:
        return RemoteError(code, remark, address)
    return kind(remark or f"{code_name(code, ResponseCode)} from {address}")
