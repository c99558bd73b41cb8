"""A small asyncio service on hostmq (docs/aio.md): it consumes ``orders``, prices each one with an
``async def`` listener, and publishes the result to ``orders-priced``.

    python tools/examples/aio_service.py [--root ROOT] [--demo N]

The root is ``--root``, else ``$HOSTMQ_ROOT``, else ``~/.hostmq``; a cluster must serve it (start one
with ``hostmq up``). The service joins the consumer group ``pricing``: start it several times and
the members share the queues. Ctrl-C (or SIGTERM) stops it cleanly — running listeners finish,
offsets are committed, the group is left, and nothing stays behind.

``--demo N`` sends N orders itself, and stops once it has priced N and read back every priced
order with a pull consumer — a self-contained run that shows all three clients.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal

import hostmq
from hostmq import ConsumeFrom, ConsumeResult, Message, MessageExt
from hostmq import aio

IN_TOPIC, OUT_TOPIC, GROUP = "orders", "orders-priced", "pricing"
TAX = 0.2


class Pricing:
    """The listener: one order in, one priced order out (through the service's producer)."""

    def __init__(self, producer: aio.Producer) -> None:
        self.producer = producer
        self.priced = 0
        self.changed = asyncio.Event()

    async def __call__(self, msgs: list[MessageExt]) -> ConsumeResult:
        for m in msgs:
            order = json.loads(m.body)
            order["total"] = round(order["amount"] * (1 + TAX), 2)
            # a failed send raises: the batch counts as RECONSUME_LATER and comes back via %RETRY%pricing
            await self.producer.send(Message(OUT_TOPIC, json.dumps(order).encode(), keys=[order["id"]]))
        self.priced += len(msgs)
        self.changed.set()
        return ConsumeResult.SUCCESS


async def ensure_topics(root: str | None) -> None:
    async with aio.Admin(root) as admin:
        known = set(await admin.topics())
        for topic in (IN_TOPIC, OUT_TOPIC):
            if topic not in known:
                await admin.create_topic(topic, queues=4)


async def send_demo_orders(root: str | None, n: int) -> None:
    async with aio.Producer(root, group="demo-shop") as p:
        await asyncio.gather(*[p.send(Message(IN_TOPIC, json.dumps({"id": f"o-{i}", "amount": 10.0 + i}).encode()))
                               for i in range(n)])
    print(f"sent {n} orders", flush=True)


async def read_back(root: str | None, n: int) -> None:
    """Read the ``n`` priced orders with a pull consumer of a group of its own."""
    async with aio.PullConsumer(root, group="demo-audit", consume_from=ConsumeFrom.FIRST_OFFSET) as audit:
        audit.subscribe(OUT_TOPIC)
        seen: set[str] = set()
        async for m in audit:
            seen.add(json.loads(m.body)["id"])
            if len(seen) == n:
                break
        await audit.commit()
    print(f"read back {len(seen)} priced orders", flush=True)


async def serve(root: str | None, demo: int) -> None:
    await ensure_topics(root)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with aio.Producer(root, group="pricing-out") as producer:
        pricing = Pricing(producer)
        consumer = aio.PushConsumer(root, group=GROUP, consume_from=ConsumeFrom.FIRST_OFFSET)
        consumer.subscribe(IN_TOPIC)
        consumer.register(pricing)
        async with consumer:
            print(f"pricing {IN_TOPIC} -> {OUT_TOPIC} as group {GROUP!r}; Ctrl-C stops", flush=True)
            if demo:
                await send_demo_orders(root, demo)
            while not stop.is_set() and not (demo and pricing.priced >= demo):
                pricing.changed.clear()
                waits = [asyncio.ensure_future(e.wait()) for e in (stop, pricing.changed)]
                _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for w in pending:
                    w.cancel()
        print(f"priced {pricing.priced} orders", flush=True)
    if demo:
        await read_back(root, demo)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=None, help="the hostmq root (default: $HOSTMQ_ROOT or ~/.hostmq)")
    ap.add_argument("--demo", type=int, default=0, metavar="N", help="send N orders, price them, then stop")
    args = ap.parse_args(argv)
    try:
        asyncio.run(serve(args.root, args.demo))
    except hostmq.HostMQError as e:
        print(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
