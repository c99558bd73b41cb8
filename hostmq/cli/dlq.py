"""``hostmq dlq resend [ROOT] --group G [--id MSGID]``: send dead letters back to their original topic.

Without ``--id`` every message of ``%DLQ%G`` not resent yet is resent (progress is kept as the
offsets of the group ``DLQ_RESEND_G``, so running it again resends only new dead letters); with
``--id`` just that message. A resent message is a new message: same body, tags, keys and user
properties, a fresh unique id, reconsume count 0.
"""
from __future__ import annotations

import argparse

from .. import records as R
from ..semantics.retry import dlq_topic
from ..admin.admin import Admin
from ..client.producer import Producer
from ..client.pull_consumer import PullConsumer
from ..errors import NoRouteError, ValidationError
from ..message import ConsumeFrom, Message, MessageExt

SYSTEM_PROPS = {R.PROP_TAGS, R.PROP_KEYS, R.PROP_UNIQ_KEY, R.PROP_DELAY, R.PROP_REAL_TOPIC, R.PROP_REAL_QUEUE_ID,
                R.PROP_RETRY_TOPIC, R.PROP_ORIGIN_MSG_ID, R.PROP_TRANSACTION_PREPARED, R.PROP_PRODUCER_GROUP}


def add_parser(sub) -> None:
    p = sub.add_parser("dlq", help="dead-letter queues")
    verbs = p.add_subparsers(dest="dlq_command", metavar="ACTION")
    verbs.required = True
    r = verbs.add_parser("resend", help="send a group's dead letters back to their original topics")
    r.add_argument("root", nargs="?", default=None)
    r.add_argument("--group", required=True)
    r.add_argument("--id", default=None, help="only this message id")
    r.set_defaults(func=resend)


def as_new_message(m: MessageExt) -> Message:
    topic = m.properties.get(R.PROP_RETRY_TOPIC)
    if not topic:
        raise ValidationError(f"{m.msg_id} does not record its original topic")
    user = {k: v for k, v in m.properties.items() if k not in SYSTEM_PROPS}
    return Message(topic, m.body, tags=m.tags, keys=list(m.keys), properties=user or None)


def resend(args: argparse.Namespace) -> int:
    topic = dlq_topic(args.group)
    with Admin(args.root) as a, Producer(args.root, group=f"DLQ_RESEND_{args.group}") as p:
        if args.id:
            m = a.view_message(args.id)
            if m.topic != topic:
                raise ValidationError(f"{args.id} is in {m.topic}, not in {topic}")
            r = p.send(as_new_message(m))
            print(f"resent {args.id} to {r.queue} as {r.msg_id}")
            return 0
        try:
            queues = a.route(topic)
        except NoRouteError:
            print(f"{topic}: no dead letters")
            return 0
        sent = 0
        with PullConsumer(args.root, group=f"DLQ_RESEND_{args.group}", consume_from=ConsumeFrom.FIRST_OFFSET,
                          auto_commit=False) as c:
            c.assign(queues)
            while True:
                msgs = c.poll(0.5)
                if not msgs:
                    break
                for m in msgs:
                    r = p.send(as_new_message(m))
                    print(f"resent {m.msg_id} to {r.queue} as {r.msg_id}")
                    sent += 1
                c.commit()
        print(f"{sent} dead letters resent")
    return 0
