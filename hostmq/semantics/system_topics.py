"""Which topics are the system's (RocketMQ ``TopicValidator``): users may not send to them or
auto-create them; producers, the broker and ``hostmq status`` ask the same question here."""
from __future__ import annotations

# RocketMQ TopicValidator (5.3.3): its SYSTEM_TOPIC_SET, SYSTEM_TOPIC_PREFIX and NOT_ALLOWED_SEND_TOPIC_SET.
ROCKETMQ_SYSTEM_TOPICS = frozenset({
    "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT",
    "CHECKPOINT_TOPIC"})
ROCKETMQ_SYSTEM_TOPIC_PREFIX = "rmq_sys_"
NOT_ALLOWED_SEND_TOPICS = frozenset({
    "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
    "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"})
# hostmq also keeps users off the upper-case "RMQ_SYS_" names (its own topics use them, and it refused
# the prefix before it took RocketMQ's) and the retry and dead-letter topics (written by the broker's
# retry path only; RocketMQ lets a client send to them).
SYSTEM_TOPIC_PREFIXES = (ROCKETMQ_SYSTEM_TOPIC_PREFIX, "RMQ_SYS_", "%DLQ%", "%RETRY%")
SYSTEM_TOPICS = ROCKETMQ_SYSTEM_TOPICS


def is_system_topic(topic: str) -> bool:
    """Topics users may not send to or auto-create: RocketMQ ``TopicValidator.isSystemTopic`` (its
    set and its ``rmq_sys_`` prefix), plus ``RMQ_SYS_``, ``%RETRY%`` and ``%DLQ%`` names."""
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIXES)


def is_not_allowed_send_topic(topic: str) -> bool:
    """RocketMQ ``TopicValidator.isNotAllowedSendTopic``: the narrower set its producers refuse
    (hostmq's producer refuses every :func:`is_system_topic`)."""
    return topic in NOT_ALLOWED_SEND_TOPICS
