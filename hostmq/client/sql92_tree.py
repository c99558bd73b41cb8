"""The SQL92 filter's expression tree and Java's conversion rules, pure (parsed by ``sql92``).

Each node evaluates to TRUE, FALSE or None (unknown) against a message's properties; a failed
conversion raises ``TypeMismatch``, which ``SQL.matches`` turns into "no match". ``depth`` is the
height of a node's tree, which the parser bounds (``sql92.MAX_DEPTH``) because ``eval`` recurses
once per level; ``And`` / ``Or`` hold a flat list of operands evaluated in a loop.
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
DOUBLE_MIN_POSITIVE = 5e-324
MAX_LONG_DIGITS = 19   # digits of LONG_MAX: longer runs are out of range (and int() of > 4300 raises)
_JAVA_INT = re.compile(r"[+-]?[0-9]+")
_JAVA_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?")


class Int(int):
    """A Java Integer literal (32-bit)."""


class Long(int):
    """A Java Long literal."""


class TypeMismatch(Exception):
    """Evaluation failed (a conversion or a Java ClassCastException): the message does not match."""


# -- Java conversions and comparison ------------------------------------------------------------------
def _java_int(s: str, lo: int, hi: int) -> int:
    if not _JAVA_INT.fullmatch(s):
        raise TypeMismatch(f"{s!r} is not an integer")
    digits = s.lstrip("+-").lstrip("0") or "0"
    if len(digits) > MAX_LONG_DIGITS:     # Java: NumberFormatException (and int() refuses > 4300 digits)
        raise TypeMismatch(f"{s[:40]!r} is out of range")
    v = -int(digits) if s[0] == "-" else int(digits)
    if not lo <= v <= hi:
        raise TypeMismatch(f"{s!r} is out of range")
    return v


def _java_double(s: str) -> float:
    t = s.strip(" \t\n\r\f\v\0")         # Java's Double.valueOf trims characters <= ' '
    if not _JAVA_DOUBLE.fullmatch(t):
        raise TypeMismatch(f"{s!r} is not a number")
    t = t.rstrip("fFdD")
    return float(t.replace("Infinity", "inf"))


def _convert(s: str, like: Any) -> Any:
    """A property string converted to the type of ``like`` (RocketMQ convertStringExpressions)."""
    if isinstance(like, bool):
        return s.lower() == "true"
    if isinstance(like, Int):
        return _java_int(s, INT_MIN, INT_MAX)
    if isinstance(like, Long):
        return _java_int(s, LONG_MIN, LONG_MAX)
    return _java_double(s)


def _cmp_values(a, b) -> int:
    if isinstance(a, float) or isinstance(b, float):       # Double.compareTo: NaN is largest, -0.0 < 0.0
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return (1 if math.isnan(a) else 0) - (1 if math.isnan(b) else 0)
        if a == b == 0.0:
            return (math.copysign(1, a) > 0) - (math.copysign(1, b) > 0)
    return (a > b) - (a < b)


def compare(lv, rv) -> int:
    """RocketMQ ``ComparisonExpression.__compare`` with string conversion on."""
    lnum = not isinstance(lv, (bool, str))
    rnum = not isinstance(rv, (bool, str))
    if type(lv) is type(rv) or (lnum and rnum):
        return _cmp_values(lv, rv)
    if isinstance(lv, bool):
        if isinstance(rv, str):
            raise TypeMismatch("a boolean compared with a string")     # Java: ClassCastException
        return -1
    if lnum:
        if isinstance(rv, str):
            return _cmp_values(lv, _convert(rv, lv))
        return -1
    return _cmp_values(_convert(lv, rv), rv)                          # lv is a string


# -- the expression tree ------------------------------------------------------------------------------
class Node:
    boolean = False         # a BooleanExpression in RocketMQ's grammar
    depth = 1               # height of the tree below and including this node (bounded by MAX_DEPTH)

    def eval(self, props: Mapping[str, str]):
        raise NotImplementedError

    def key(self) -> tuple:
        """The parsed form as nested tuples: what ``SQL`` compares and hashes (RocketMQ compares
        parsed expressions, ParserTest.testEquals), so spacing, comments, keyword case and
        redundant parentheses do not matter."""
        return (type(self).__name__,)


class Const(Node):
    def __init__(self, value) -> None:
        self.value = value
        self.boolean = value is None or isinstance(value, bool)

    def eval(self, props):
        return self.value

    def key(self):
        return ("Const", type(self.value).__name__, self.value)     # Int 1, Long 1 and TRUE differ


class Prop(Node):
    def __init__(self, name: str) -> None:
        self.name = name

    def eval(self, props):
        return props.get(self.name)

    def key(self):
        return ("Prop", self.name)


class Unary(Node):
    def __init__(self, inner: Node) -> None:
        self.inner = inner
        self.depth = inner.depth + 1

    def key(self):
        return (type(self).__name__, self.inner.key())


class BoolCast(Unary):
    boolean = True

    def eval(self, props):
        v = self.inner.eval(props)
        return None if v is None else (v is True)


class Negate(Unary):
    def eval(self, props):
        v = self.inner.eval(props)
        return negate(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def negate(v):
    if isinstance(v, Int):
        return Int(v if v == INT_MIN else -v)
    if isinstance(v, Long):
        return Long(v if v == LONG_MIN else -v)
    return -v


class Not(Unary):
    boolean = True

    def eval(self, props):
        v = self.inner.eval(props)
        return None if v is None else not v


class Binary(Node):
    boolean = True

    def __init__(self, left: Node, right: Node) -> None:
        self.left, self.right = left, right
        self.depth = max(left.depth, right.depth) + 1

    def key(self):
        return (type(self).__name__, self.left.key(), self.right.key())


class Chain(Node):
    """``a AND b AND c …`` (or OR) kept flat: evaluated left to right in a loop, stopping at the
    first operand that decides (the same order, result and type errors as RocketMQ's nested binary
    nodes, since both operators are associative), so a long chain costs no recursion."""
    boolean = True

    def __init__(self, operands: list[Node]) -> None:
        self.operands = operands
        self.depth = max(o.depth for o in operands) + 1

    def key(self):
        """Nested chains of one operator flattened: ``(a AND b) AND c`` is ``a AND b AND c``."""
        name, flat = type(self).__name__, []
        for o in self.operands:
            k = o.key()
            if k[0] == name:
                flat.extend(k[1])
            else:
                flat.append(k)
        return (name, tuple(flat))


class And(Chain):
    def eval(self, props):
        unknown = False
        for o in self.operands:
            v = o.eval(props)
            if v is False:
                return False
            if v is None:
                unknown = True
        return None if unknown else True


class Or(Chain):
    def eval(self, props):
        unknown = False
        for o in self.operands:
            v = o.eval(props)
            if v is True:
                return True
            if v is None:
                unknown = True
        return None if unknown else False


class Equal(Binary):
    def eval(self, props):
        lv, rv = self.left.eval(props), self.right.eval(props)
        if lv is None and rv is None:
            return True
        if lv is None:
            return None
        if rv is None:
            return False
        return compare(lv, rv) == 0


class Order(Binary):
    """``> >= < <=``."""
    TESTS = {">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0}

    def __init__(self, op: str, left: Node, right: Node) -> None:
        super().__init__(left, right)
        self.op, self.test = op, self.TESTS[op]

    def key(self):
        return ("Order", self.op, self.left.key(), self.right.key())

    def eval(self, props):
        lv = self.left.eval(props)
        if lv is None:
            return None
        rv = self.right.eval(props)
        if rv is None:
            return None
        if isinstance(lv, str) and isinstance(rv, str):
            return self.test(_cmp_values(_java_double(lv), _java_double(rv)))
        return self.test(compare(lv, rv))


class In(Node):
    boolean = True
    depth = 2

    def __init__(self, prop: Prop, values: list[str], negated: bool) -> None:
        self.prop, self.values, self.negated = prop, frozenset(values), negated
        self.listed = tuple(values)         # as written: RocketMQ's IN list keeps its order

    def key(self):
        return ("In", self.prop.key(), self.listed, self.negated)

    def eval(self, props):
        v = self.prop.eval(props)
        if not isinstance(v, str):
            return None
        return (v in self.values) != self.negated


class StringTest(Unary):
    """``[NOT] CONTAINS / STARTSWITH / ENDSWITH``: a missing property or empty search never matches."""
    boolean = True
    TESTS = {"CONTAINS": lambda v, s: s in v, "STARTSWITH": str.startswith, "ENDSWITH": str.endswith}

    def __init__(self, op: str, inner: Node, search: str, negated: bool) -> None:
        super().__init__(inner)
        self.op, self.test, self.search, self.negated = op, self.TESTS[op], search, negated

    def key(self):
        return ("StringTest", self.op, self.search, self.negated, self.inner.key())

    def eval(self, props):
        if not self.search:
            return False
        v = self.inner.eval(props)
        if not isinstance(v, str):
            return False
        return self.test(v, self.search) != self.negated
