"""Caps on what group members' requests make a broker create (issue 27), pure.

A client id, a group name or a topic in a request is only a claim — a hostile member makes a new one
per request — so the caps count by the one thing a member cannot choose: its uid, as the kernel
reports it for the control connection (``transport.ReplyToken.peer``). Each :class:`Quota` counts
per uid and over all uids together; requests from an owner of the root (its owner, the servers' uid,
root) are not counted, since the owner may create anything anyway (``hostmq topic create``).

    what                          keys (broker.*)                                counted
    consumer groups (+ retry)     max_groups_per_uid / max_groups                per broker run
    auto-created topics           max_auto_topics_per_uid / max_auto_topics      per broker run
    client ids (heartbeats)       max_clients_per_uid / max_clients              while known (≤ 120 s silent)

Past a cap the request gets PermissionDeniedError (PERMISSION_DENIED on the wire) naming the uid, the
key and who may go further; nothing it asked for is created. Counts of groups and topics are kept per
run: a restart forgets them (what was created stays, and is bounded by the overall caps of each run).
"""
from __future__ import annotations

from ..errors import PermissionDeniedError


class Quota:
    """How many of ``what`` each uid (and all uids together) has made, against two caps."""

    def __init__(self, what: str, key: str, per_uid: int, total: int, owners: str = "the root's owner") -> None:
        self.what = what                # "consumer groups"
        self.key = key                  # "max_groups" (per uid: key + "_per_uid" in the messages)
        self.per_uid = per_uid
        self.total = total
        self.owners = owners            # who may create more, for the messages
        self.by_uid: dict[int, int] = {}
        self.count = 0

    def charge(self, uid: int, n: int = 1, where: str = "this broker") -> None:
        """Count ``n`` more for ``uid``; PermissionDeniedError (nothing counted) past a cap."""
        self.check(uid, n, where)
        self.by_uid[uid] = self.by_uid.get(uid, 0) + n
        self.count += n

    def check(self, uid: int, n: int = 1, where: str = "this broker") -> None:
        """PermissionDeniedError if ``n`` more for ``uid`` would pass a cap."""
        mine = self.by_uid.get(uid, 0)
        if mine + n > self.per_uid:
            raise PermissionDeniedError(
                f"{where}: uid {uid} has made {mine} {self.what}, the most one uid other than the owner "
                f"may (broker.{self.key}_per_uid = {self.per_uid}); {self.owners} may create more, or "
                f"raise the cap in hostmq.toml")
        if self.count + n > self.total:
            raise PermissionDeniedError(
                f"{where}: group members have made {self.count} {self.what}, the most all uids other "
                f"than the owner may (broker.{self.key} = {self.total}); {self.owners} may create "
                f"more, or raise the cap in hostmq.toml")

    def release(self, uid: int, n: int = 1) -> None:
        """Give back ``n`` of ``uid``'s (what it made went away)."""
        mine = self.by_uid.get(uid, 0)
        n = min(n, mine)
        if mine - n:
            self.by_uid[uid] = mine - n
        else:
            self.by_uid.pop(uid, None)
        self.count -= n

    def of(self, uid: int) -> int:
        return self.by_uid.get(uid, 0)


class MemberLedger:
    """What each non-owner uid has made a broker create or hold, and which uid each client id is.

    A client id belongs to the uid whose heartbeat first named it (the owner's too): another member
    may not heartbeat, unregister or lock queues under it (it would take that client's place in its
    groups). The service asks with ``uid=None`` for an owner's request: never counted, never refused.
    """

    def __init__(self, config, where: str, owners: str) -> None:
        c = config          # BrokerConfig
        self.where = where
        self.groups = Quota("consumer groups", "max_groups", c.max_groups_per_uid, c.max_groups, owners)
        self.auto_topics = Quota("auto-created topics", "max_auto_topics", c.max_auto_topics_per_uid,
                                 c.max_auto_topics, owners)
        self.clients = Quota("client ids", "max_clients", c.max_clients_per_uid, c.max_clients, owners)
        self.max_heartbeat_groups = c.max_heartbeat_groups
        self.client_uid: dict[str, int | None] = {}     # client id → its uid (None: an owner's)
        self.member_groups: set[str] = set()            # groups a member introduced this run

    def check_client(self, uid: int | None, client_id: str) -> None:
        """PermissionDeniedError if ``client_id`` is another uid's (owners may act for anyone)."""
        if uid is None or client_id not in self.client_uid:
            return
        holder = self.client_uid[client_id]
        if holder != uid:
            who = "an owner of the root" if holder is None else f"uid {holder}"
            raise PermissionDeniedError(f"{self.where}: client id {client_id!r} is {who}'s; uid {uid} may "
                                        f"not act for it (only that uid or the root's owner may)")

    def admit_heartbeat(self, uid: int | None, client_id: str, groups: int, new_groups: list[str]) -> None:
        """A heartbeat of ``client_id`` naming ``groups`` groups, ``new_groups`` of them unknown to the
        broker: refused (nothing counted) past a cap or for a client id that is another uid's; else a
        new client id and the new groups are counted."""
        if groups > self.max_heartbeat_groups:
            raise PermissionDeniedError(f"{self.where}: a heartbeat names at most "
                                        f"{self.max_heartbeat_groups} groups (broker.max_heartbeat_groups), "
                                        f"got {groups}")
        self.check_client(uid, client_id)
        new_client = client_id not in self.client_uid
        if uid is not None:
            if new_client:
                self.clients.check(uid, 1, self.where)
            self.admit_groups(uid, new_groups)
            if new_client:
                self.clients.charge(uid, 1, self.where)
        if new_client:
            self.client_uid[client_id] = uid

    def forget_clients(self, client_ids) -> None:
        """Clients the broker dropped (unregistered, silent, dead): their counts come back."""
        for cid in client_ids:
            if cid in self.client_uid:
                uid = self.client_uid.pop(cid)
                if uid is not None:
                    self.clients.release(uid)

    def admit_groups(self, uid: int | None, new_groups: list[str]) -> None:
        """Groups the broker does not know yet, introduced by ``uid``: counted all or none."""
        if uid is None or not new_groups:
            return
        self.groups.charge(uid, len(new_groups), self.where)
        self.member_groups.update(new_groups)

    def admit_auto_topic(self, uid: int | None) -> None:
        if uid is not None:
            self.auto_topics.charge(uid, 1, self.where)
