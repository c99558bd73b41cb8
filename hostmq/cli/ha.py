"""``hostmq ha promote [ROOT] --name NAME --id ID [--role SYNC_MASTER] [--force]``: make a slave the
master of its group; ``hostmq ha demote [ROOT] --name NAME [--id 0] --epoch E``: record that a stopped
master of this root is a slave now (docs/replication.md: promote and rejoin; ``admin/promotion.py``)."""
from __future__ import annotations

import argparse

from ..admin import promotion
from ..broker.promotion import MASTER_ROLES
from .common import print_json


def add_parser(sub) -> None:
    p = sub.add_parser("ha", help="replication: promote a slave, demote a stopped master")
    verbs = p.add_subparsers(dest="ha_command", metavar="ACTION")
    verbs.required = True
    pr = verbs.add_parser("promote", help="make a caught-up slave the master of its group (its master must be down)")
    pr.add_argument("root", nargs="?", default=None)
    pr.add_argument("--name", required=True, help="broker name")
    pr.add_argument("--id", type=int, required=True, help="the slave's id (its directory NAME.ID)")
    pr.add_argument("--role", choices=MASTER_ROLES, default="ASYNC_MASTER", help="the role it takes (ASYNC_MASTER)")
    pr.add_argument("--force", action="store_true",
                    help="promote a slave that has less than its master said it held (that tail is lost)")
    pr.add_argument("--timeout", type=float, default=promotion.PROMOTE_TIMEOUT_S,
                    help="seconds to wait for it to run as the master")
    pr.add_argument("--lock-timeout", type=float, default=promotion.PROMOTE_LOCK_TIMEOUT_S,
                    help="seconds to wait for the name's role lock (docs/trust-roles.md)")
    pr.set_defaults(func=promote)
    de = verbs.add_parser("demote", help="a stopped master of this root joins the group's new master as a "
                                         "slave when it starts (after a promotion on another host)")
    de.add_argument("root", nargs="?", default=None)
    de.add_argument("--name", required=True, help="broker name")
    de.add_argument("--id", type=int, default=0, help="the stopped master's instance id (0)")
    de.add_argument("--slave-id", type=int, default=1, help="for instance 0: the id it registers under (1)")
    de.add_argument("--epoch", type=int, required=True, help="the new master's epoch (hostmq status shows it)")
    de.add_argument("--lock-timeout", type=float, default=promotion.PROMOTE_LOCK_TIMEOUT_S,
                    help="seconds to wait for the name's role lock (docs/trust-roles.md)")
    de.set_defaults(func=demote)


def promote(args: argparse.Namespace) -> int:
    print_json(promotion.promote(args.root, args.name, args.id, args.role, args.force, args.timeout,
                                 lock_timeout_s=args.lock_timeout))
    return 0


def demote(args: argparse.Namespace) -> int:
    print_json(promotion.demote(args.root, args.name, args.id, args.epoch, args.slave_id, args.lock_timeout))
    return 0
