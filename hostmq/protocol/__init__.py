"""The control-path protocol: codes, pure frame encode/decode, typed messages (no I/O, no zmq).

Only :mod:`hostmq.transport` (server) and :mod:`hostmq.remoting` (client) put these frames on
a socket.
"""
from .codes import RequestCode, ResponseCode, code_name, error_for_response, response_code_for
from .frames import (MAX_HEADER_BYTES, MAX_REQUEST_FRAME_BYTES, MAX_REQUEST_FRAMES, PROTOCOL_VERSION, Frame,
                     decode, encode_request, encode_response, peek_request_id)
from .messages import (ControlMessage, DeleteTopicInNamesrvRequest, GetRouteInfoRequest, KvConfigRequest,
                       RegisterBrokerPage, RegisterBrokerRequest, TopicConfigData, TopicsByClusterRequest,
                       UnregisterBrokerRequest, handles)
from .route_data import TopicRouteData      # the one route record (GET_ROUTEINFO_BY_TOPIC's answer)

__all__ = [
    "RequestCode", "ResponseCode", "code_name", "error_for_response", "response_code_for",
    "MAX_HEADER_BYTES", "MAX_REQUEST_FRAME_BYTES", "MAX_REQUEST_FRAMES", "PROTOCOL_VERSION", "Frame", "decode", "encode_request", "encode_response",
    "peek_request_id",
    "ControlMessage", "DeleteTopicInNamesrvRequest", "GetRouteInfoRequest", "KvConfigRequest", "RegisterBrokerPage",
    "RegisterBrokerRequest", "TopicConfigData", "TopicRouteData", "TopicsByClusterRequest", "UnregisterBrokerRequest",
    "handles",
]
