"""Administration (layer L5, above ``broker/`` and ``client/``): :class:`Admin` — topics, routes,
offsets, messages by id or key, broker status — and promotion and demotion of a broker group's
instances (``promotion``), the operator's side of ``hostmq ha``. Only the root's owner administers
(``protocol/permissions.py``)."""
from .admin import Admin

__all__ = ["Admin"]
