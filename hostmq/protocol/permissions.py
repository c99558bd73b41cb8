"""Who may make which control request (issue 27), pure: no sockets, no files.

The control sockets are ``ipc://`` files under the root, and the root's modes already decide who can
connect at all: its owner and the members of its group (``hostmq.access``). Among those, this module
decides per request, on the peer's uid as the **kernel** reports it for the connection
(``SO_PEERCRED``; libzmq puts ``…:uid:gid:pid`` in every message's ``Peer-Address`` property, see
``hostmq.transport``) — never on anything the request says about itself:

* **administration** (:data:`ADMIN_CODES`: broker registration, topic create/delete, offset reset,
  promotion, the NameServer's KV config) — only the root's owner, the uid the servers run as, and
  uid 0 (:class:`ControlPolicy`'s ``owner_uids``);
* everything else — producing, pulling, heartbeats, committing offsets, reading routes and stats — any
  peer that could connect (the group's members).

A peer whose uid is unknown (a transport without credentials) is not an owner.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import PermissionDeniedError
from .codes import RequestCode, code_name

ADMIN_CODES: frozenset[int] = frozenset({
    RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER,            # routes (and a slave's master address)
    RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.DELETE_TOPIC_IN_BROKER,
    RequestCode.DELETE_TOPIC_IN_NAMESRV, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
    RequestCode.PROMOTE_BROKER, RequestCode.PUT_KV_CONFIG, RequestCode.DELETE_KV_CONFIG,
})
"""Request codes only an owner may send. Every other code a server serves is a member's."""


@dataclass(frozen=True)
class PeerCred:
    """A control connection's peer as the kernel saw it when it connected (SO_PEERCRED)."""

    uid: int
    gid: int
    pid: int

    @classmethod
    def parse(cls, peer_address: str | None) -> "PeerCred | None":
        """From libzmq's ``Peer-Address`` of an ipc connection (``"<addr>:uid:gid:pid"``); None when
        the property carries no credentials (tcp, inproc, or a libzmq built without SO_PEERCRED)."""
        if not peer_address:
            return None
        parts = peer_address.rsplit(":", 3)
        if len(parts) != 4 or not all(p.isdigit() for p in parts[1:]):
            return None
        return cls(int(parts[1]), int(parts[2]), int(parts[3]))


@dataclass(frozen=True)
class ControlPolicy:
    """The owners of one root's control sockets, and the codes only they may send."""

    owner_uids: frozenset[int]
    where: str = "this root"                    # named in refusals: "the owner of /srv/mq (uid 1000)"
    admin_codes: frozenset[int] = ADMIN_CODES

    def is_owner(self, peer: PeerCred | None) -> bool:
        return peer is not None and peer.uid in self.owner_uids

    def check(self, code: int, peer: PeerCred | None, server: str = "this server") -> None:
        """PermissionDeniedError if ``peer`` may not send ``code``; nothing otherwise."""
        if code in self.admin_codes and not self.is_owner(peer):
            raise PermissionDeniedError(
                f"{server}: {code_name(code)} is administration: only {self.owners_text()} may send it; "
                f"this connection is {describe(peer)} (members of the root's group produce, consume, "
                f"heartbeat and commit offsets)")

    def owners_text(self) -> str:
        """``"the owner of /srv/mq (uids 0, 1000)"``: root is always one of them."""
        uids = sorted(self.owner_uids)
        return f"the owner of {self.where} (uid{'s' if len(uids) > 1 else ''} {', '.join(map(str, uids))})"


def describe(peer: PeerCred | None) -> str:
    """``"uid 1001 (pid 4242)"`` for refusals and logs."""
    return "of unknown uid" if peer is None else f"uid {peer.uid} (pid {peer.pid})"
