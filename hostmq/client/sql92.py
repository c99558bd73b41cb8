"""SQL92 message filters with RocketMQ's semantics (``MessageSelector.bySql``), pure.

``SQL(expression)`` parses once (a bad expression raises :class:`FilterSyntaxError` right there) and
``matches(properties)`` evaluates against a message's properties, which are strings. The grammar
and the evaluation rules are RocketMQ's ``filter`` module (an ActiveMQ selector derivative):

* ``AND OR NOT``, ``= <> > >= < <=``, ``[NOT] BETWEEN x AND y``, ``[NOT] IN ('a', …)``,
  ``IS [NOT] NULL``, ``[NOT] CONTAINS|STARTSWITH|ENDSWITH 'text'``, string (``'it''s'``), integer,
  float and ``TRUE FALSE NULL`` literals, ``--`` and ``/* */`` comments; keywords are case-insensitive.
* Three-valued logic: a missing property is NULL; a comparison with NULL is unknown, and only TRUE
  matches (``a <> 'x'`` does not match a message without ``a``).
* Types: a property (a string) compared with a number is converted to the number's type first —
  Java's ``Integer.valueOf`` for integer literals within 32 bits, ``Long.valueOf`` beyond, and
  ``Double.valueOf`` for float literals; with a boolean, ``"true"`` (any case) is TRUE. Two strings
  under ``> >= < <=`` are compared as doubles. A conversion that fails is a type error, and a type
  error means no match (never an exception from ``matches``).
* Checked when parsing, as RocketMQ does: ``> >= < <= BETWEEN`` take numbers (not string, boolean or
  NULL literals), ``= NULL`` must be written ``IS NULL``, ``IN`` needs a property on its left,
  ``BETWEEN`` bounds must be ascending, float literals must be positive (RocketMQ refuses ``0.0``).
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

from ..errors import FilterSyntaxError

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
DOUBLE_MIN_POSITIVE = 5e-324
KEYWORDS = {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS", "STARTSWITH",
            "ENDSWITH"}
_TOKEN = re.compile(r"""
    (?P<ws>\s+|--[^\n\r]*(?:\r\n|\n|\r|$)|/\*.*?\*/)
  | (?P<float>\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
  | (?P<int>(?:0|[1-9]\d*)[lL]?)
  | (?P<str>'(?:''|[^'])*')
  | (?P<id>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<op><>|>=|<=|[=><(),+-])
""", re.VERBOSE | re.DOTALL)
_JAVA_INT = re.compile(r"[+-]?[0-9]+")
_JAVA_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?")


class Int(int):
    """A Java Integer literal (32-bit)."""


class Long(int):
    """A Java Long literal."""


class _TypeError(Exception):
    """Evaluation failed (a conversion or a Java ClassCastException): the message does not match."""


# -- Java conversions and comparison ------------------------------------------------------------------
def _java_int(s: str, lo: int, hi: int) -> int:
    if not _JAVA_INT.fullmatch(s):
        raise _TypeError(f"{s!r} is not an integer")
    v = int(s)
    if not lo <= v <= hi:
        raise _TypeError(f"{s!r} is out of range")
    return v


def _java_double(s: str) -> float:
    t = s.strip(" \t\n\r\f\v\0")         # Java's Double.valueOf trims characters <= ' '
    if not _JAVA_DOUBLE.fullmatch(t):
        raise _TypeError(f"{s!r} is not a number")
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
            raise _TypeError("a boolean compared with a string")     # Java: ClassCastException
        return -1
    if lnum:
        if isinstance(rv, str):
            return _cmp_values(lv, _convert(rv, lv))
        return -1
    return _cmp_values(_convert(lv, rv), rv)                          # lv is a string


# -- the expression tree ------------------------------------------------------------------------------
class Node:
    boolean = False         # a BooleanExpression in RocketMQ's grammar

    def eval(self, props: Mapping[str, str]):
        raise NotImplementedError


class Const(Node):
    def __init__(self, value) -> None:
        self.value = value
        self.boolean = value is None or isinstance(value, bool)

    def eval(self, props):
        return self.value


class Prop(Node):
    def __init__(self, name: str) -> None:
        self.name = name

    def eval(self, props):
        return props.get(self.name)


class BoolCast(Node):
    boolean = True

    def __init__(self, inner: Node) -> None:
        self.inner = inner

    def eval(self, props):
        v = self.inner.eval(props)
        return None if v is None else (v is True)


class Negate(Node):
    def __init__(self, inner: Node) -> None:
        self.inner = inner

    def eval(self, props):
        v = self.inner.eval(props)
        return _negate(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _negate(v):
    if isinstance(v, Int):
        return Int(v if v == INT_MIN else -v)
    if isinstance(v, Long):
        return Long(v if v == LONG_MIN else -v)
    return -v


class Not(Node):
    boolean = True

    def __init__(self, inner: Node) -> None:
        self.inner = inner

    def eval(self, props):
        v = self.inner.eval(props)
        return None if v is None else not v


class Binary(Node):
    boolean = True

    def __init__(self, left: Node, right: Node) -> None:
        self.left, self.right = left, right


class And(Binary):
    def eval(self, props):
        lv = self.left.eval(props)
        if lv is False:
            return False
        rv = self.right.eval(props)
        if rv is False:
            return False
        return None if lv is None or rv is None else True


class Or(Binary):
    def eval(self, props):
        lv = self.left.eval(props)
        if lv is True:
            return True
        rv = self.right.eval(props)
        if rv is True:
            return True
        return None if lv is None or rv is None else False


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
        self.test = self.TESTS[op]

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

    def __init__(self, prop: Prop, values: list[str], negated: bool) -> None:
        self.prop, self.values, self.negated = prop, frozenset(values), negated

    def eval(self, props):
        v = self.prop.eval(props)
        if not isinstance(v, str):
            return None
        return (v in self.values) != self.negated


class StringTest(Node):
    """``[NOT] CONTAINS / STARTSWITH / ENDSWITH``: a missing property or empty search never matches."""
    boolean = True
    TESTS = {"CONTAINS": lambda v, s: s in v, "STARTSWITH": str.startswith, "ENDSWITH": str.endswith}

    def __init__(self, op: str, inner: Node, search: str, negated: bool) -> None:
        self.test, self.inner, self.search, self.negated = self.TESTS[op], inner, search, negated

    def eval(self, props):
        if not self.search:
            return False
        v = self.inner.eval(props)
        if not isinstance(v, str):
            return False
        return self.test(v, self.search) != self.negated


# -- parsing ------------------------------------------------------------------------------------------
class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise self.error(f"unexpected character {text[pos]!r} at {pos}")
            pos = m.end()
            kind = m.lastgroup
            if kind == "ws":
                continue
            value = m.group()
            if kind == "id" and value.upper() in KEYWORDS:
                kind, value = "kw", value.upper()
            self.tokens.append((kind, value))
        self.i = 0

    def error(self, why: str) -> FilterSyntaxError:
        return FilterSyntaxError(f"invalid SQL92 filter {self.text!r}: {why}")

    # token helpers
    def peek(self, k: int = 0) -> tuple[str, str]:
        j = self.i + k
        return self.tokens[j] if j < len(self.tokens) else ("end", "")

    def accept(self, *values: str) -> bool:
        if self.peek()[1] in values and self.peek()[0] in ("kw", "op"):
            self.i += 1
            return True
        return False

    def expect(self, value: str) -> None:
        if not self.accept(value):
            raise self.error(f"expected {value!r}, found {self.peek()[1] or 'the end'!r}")

    def string(self) -> str:
        kind, value = self.peek()
        if kind != "str":
            raise self.error(f"expected a string literal, found {value or 'the end'!r}")
        self.i += 1
        return value[1:-1].replace("''", "'")

    # grammar (RocketMQ SelectorParser.jj)
    def parse(self) -> Node:
        node = self.boolean(self.or_expr())
        if self.peek()[0] != "end":
            raise self.error(f"unexpected {self.peek()[1]!r}")
        return node

    def boolean(self, node: Node) -> Node:
        if node.boolean:
            return node
        if isinstance(node, Prop):
            return BoolCast(node)
        raise self.error("expression will not result in a boolean value")

    def or_expr(self) -> Node:
        left = self.and_expr()
        while self.accept("OR"):
            left = Or(self.boolean(left), self.boolean(self.and_expr()))
        return left

    def and_expr(self) -> Node:
        left = self.equality()
        while self.accept("AND"):
            left = And(self.boolean(left), self.boolean(self.equality()))
        return left

    def equality(self) -> Node:
        left = self.comparison()
        while True:
            if self.accept("="):
                left = self.equal(left, self.comparison())
            elif self.accept("<>"):
                left = Not(self.equal(left, self.comparison()))
            elif self.peek()[1] == "IS" and self.peek()[0] == "kw":
                self.i += 1
                negated = self.accept("NOT")
                self.expect("NULL")
                left = Not(Equal(left, Const(None))) if negated else Equal(left, Const(None))
            else:
                return left

    def equal(self, left: Node, right: Node) -> Node:
        for side in (left, right):
            if isinstance(side, Const) and side.value is None:
                raise self.error("NULL cannot be compared with '='; use IS NULL")
        if isinstance(left, Const) and isinstance(right, Const) and left.boolean and not right.boolean:
            raise self.error(f"{left.value!r} cannot be compared with {right.value!r}")
        return Equal(left, right)

    def numeric(self, node: Node) -> Node:
        if isinstance(node, Const):
            if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
                return node
            raise self.error(f"value {node.value!r} cannot be compared with > >= < <= or BETWEEN")
        if node.boolean:
            raise self.error("a boolean expression cannot be compared with > >= < <= or BETWEEN")
        return node

    def order(self, op: str, left: Node, right: Node) -> Node:
        return Order(op, self.numeric(left), self.numeric(right))

    def comparison(self) -> Node:
        left = self.unary()
        while True:
            kind, value = self.peek()
            if kind == "op" and value in (">", ">=", "<", "<="):
                self.i += 1
                left = self.order(value, left, self.unary())
            elif self.accept("BETWEEN"):
                left = self.between(left, negated=False)
            elif value == "NOT" and self.peek(1)[1] in ("BETWEEN", "IN", "CONTAINS", "STARTSWITH", "ENDSWITH"):
                self.i += 1
                left = self.negatable(left, negated=True)
            elif kind == "kw" and value in ("IN", "CONTAINS", "STARTSWITH", "ENDSWITH"):
                left = self.negatable(left, negated=False)
            else:
                return left

    def negatable(self, left: Node, negated: bool) -> Node:
        _, word = self.peek()
        self.i += 1
        if word == "BETWEEN":
            return self.between(left, negated)
        if word == "IN":
            if not isinstance(left, Prop):
                raise self.error("IN needs a property on its left")
            self.expect("(")
            values = [self.string()]
            while self.accept(","):
                values.append(self.string())
            self.expect(")")
            return In(left, values, negated)
        return StringTest(word, left, self.string(), negated)

    def between(self, value: Node, negated: bool) -> Node:
        low = self.unary()
        self.expect("AND")
        high = self.unary()
        if isinstance(low, Const) and isinstance(high, Const):
            if low.value is None or high.value is None:
                raise self.error("BETWEEN bounds cannot be NULL")
            try:
                if compare(high.value, low.value) < 0:
                    raise self.error(f"BETWEEN {low.value} AND {high.value}: the lower bound is above the upper")
            except _TypeError as e:
                raise self.error(f"BETWEEN bounds: {e}") from None
        if negated:
            return Or(self.order("<", value, low), self.order(">", value, high))
        return And(self.order(">=", value, low), self.order("<=", value, high))

    def unary(self) -> Node:
        if self.accept("+"):
            return self.unary()
        if self.accept("-"):
            inner = self.unary()
            if isinstance(inner, Const) and isinstance(inner.value, (int, float)) and not isinstance(inner.value, bool):
                return Const(_negate(inner.value))
            return Negate(inner)
        if self.accept("NOT"):
            return Not(self.boolean(self.unary()))
        return self.primary()

    def primary(self) -> Node:
        kind, value = self.peek()
        if kind == "end":
            raise self.error("unexpected end of expression")
        self.i += 1
        if kind == "str":
            return Const(value[1:-1].replace("''", "'"))
        if kind == "int":
            n = int(value.rstrip("lL"))
            if n > LONG_MAX:
                raise self.error(f"{value} is out of the 64-bit range")
            return Const(Int(n) if n <= INT_MAX else Long(n))
        if kind == "float":
            f = float(value)
            if math.isinf(f) or f < DOUBLE_MIN_POSITIVE:
                raise self.error(f"float literal {value} is out of range (RocketMQ takes positive doubles)")
            return Const(f)
        if kind == "id":
            return Prop(value)
        if kind == "kw" and value in ("TRUE", "FALSE", "NULL"):
            return Const({"TRUE": True, "FALSE": False, "NULL": None}[value])
        if value == "(":
            node = self.or_expr()
            self.expect(")")
            return node
        raise self.error(f"unexpected {value!r}")


class SQL:
    """A compiled SQL92 filter: ``SQL("region = 'eu' AND amount > 10").matches({"region": "eu", ...})``."""

    __slots__ = ("expression", "_root")

    def __init__(self, expression: str) -> None:
        if not isinstance(expression, str) or not expression.strip():
            raise FilterSyntaxError(f"an SQL92 filter needs an expression, got {expression!r}")
        self.expression = expression
        self._root = _Parser(expression).parse()

    def matches(self, properties: Mapping[str, str]) -> bool:
        """True only if the expression is TRUE for these properties (unknown or a type error: False)."""
        try:
            return self._root.eval(properties) is True
        except _TypeError:
            return False

    def __repr__(self) -> str:
        return f"SQL({self.expression!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, SQL) and other.expression == self.expression

    def __hash__(self) -> int:
        return hash(("SQL", self.expression))
