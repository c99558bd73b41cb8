"""Message filters, pure: tag expressions (RocketMQ ``FilterAPI`` / ``SubscriptionData``).

A tag expression is ``*`` (everything) or tags joined by ``||``. Matching is two-step as in
RocketMQ: the consume queue's tag hash is checked first (vectorised over a batch of entries), then
the tag string of each candidate record, because different tags can share a hash.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import FilterSyntaxError
from ..records import tag_hash

SUB_ALL = "*"


@dataclass(frozen=True)
class TagFilter:
    expression: str
    match_all: bool
    tags: frozenset[str]
    codes: np.ndarray   # int64 tag hashes of ``tags``

    def match_codes(self, codes: np.ndarray) -> np.ndarray:
        """Boolean mask over consume-queue tag codes: which entries may match."""
        if self.match_all:
            return np.ones(len(codes), dtype=bool)
        return np.isin(codes, self.codes)

    def match_tag(self, tag: str | None) -> bool:
        return self.match_all or (tag is not None and tag in self.tags)


def parse_tag_expression(expression: str | None) -> TagFilter:
    """``None``, ``""`` or ``"*"`` match everything; ``"A || B"`` matches tag A or B."""
    if expression is None or expression.strip() in ("", SUB_ALL):
        return TagFilter(SUB_ALL, True, frozenset(), np.empty(0, np.int64))
    if not isinstance(expression, str):
        raise FilterSyntaxError(f"tag expression must be a string, got {expression!r}")
    tags = [t.strip() for t in expression.split("||")]
    if any(not t for t in tags):
        raise FilterSyntaxError(f"empty tag in expression {expression!r} (use 'A || B')")
    if any(t == SUB_ALL for t in tags):
        return TagFilter(SUB_ALL, True, frozenset(), np.empty(0, np.int64))
    return TagFilter(expression, False, frozenset(tags),
                     np.array(sorted({tag_hash(t) for t in tags}), dtype=np.int64))
