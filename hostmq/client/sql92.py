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
* Limits (hostmq's, RocketMQ has none): parentheses, ``NOT`` and signs nest at most
  :data:`MAX_DEPTH` (50) deep, and so does the expression tree (a chained comparison such as
  ``a = b = c`` or ``x CONTAINS 'a' CONTAINS 'b'`` adds a level per link); deeper raises
  :class:`FilterSyntaxError` when parsed. ``AND`` / ``OR`` chains of any length are fine: they are
  kept flat and evaluated in a loop, so neither parsing nor ``matches`` ever recurses per operand.
  Together the limits bound the stack both take (about six parser frames per level), so no
  expression raises ``RecursionError``.
"""
from __future__ import annotations

import math
import re
from typing import Mapping

from ..errors import FilterSyntaxError
from .sql92_tree import (DOUBLE_MIN_POSITIVE, INT_MAX, LONG_MAX, MAX_LONG_DIGITS, And, BoolCast, Const,
                         Equal, In, Int, Long, Negate, Node, Not, Or, Order, Prop, StringTest, negate,
                         TypeMismatch, compare)

MAX_DEPTH = 50          # nesting of ( NOT - + and height of the expression tree; see the docstring
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
        self.nesting = 0            # ( NOT - + the parser is inside: its recursion, bounded by MAX_DEPTH

    def error(self, why: str) -> FilterSyntaxError:
        shown = self.text if len(self.text) <= 200 else self.text[:200] + "…"
        return FilterSyntaxError(f"invalid SQL92 filter {shown!r}: {why}")

    def checked(self, node: Node) -> Node:
        """``node`` unless it makes the tree deeper than MAX_DEPTH (``matches`` recurses per level)."""
        if node.depth > MAX_DEPTH:
            raise self.error(f"the expression nests deeper than {MAX_DEPTH} levels")
        return node

    def enter(self) -> None:
        """One level deeper into ( NOT - + (the parser recurses per level)."""
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            raise self.error(f"parentheses, NOT and signs nest deeper than {MAX_DEPTH} levels")

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
            return self.checked(BoolCast(node))
        raise self.error("expression will not result in a boolean value")

    def or_expr(self) -> Node:
        left = self.and_expr()
        if not self.accept("OR"):
            return left
        operands = [self.boolean(left)]
        while True:
            operands.append(self.boolean(self.and_expr()))
            if not self.accept("OR"):
                return self.checked(Or(operands))

    def and_expr(self) -> Node:
        left = self.equality()
        if not self.accept("AND"):
            return left
        operands = [self.boolean(left)]
        while True:
            operands.append(self.boolean(self.equality()))
            if not self.accept("AND"):
                return self.checked(And(operands))

    def equality(self) -> Node:
        left = self.comparison()
        while True:
            if self.accept("="):
                left = self.equal(left, self.comparison())
            elif self.accept("<>"):
                left = self.checked(Not(self.equal(left, self.comparison())))
            elif self.peek()[1] == "IS" and self.peek()[0] == "kw":
                self.i += 1
                negated = self.accept("NOT")
                self.expect("NULL")
                left = self.checked(Equal(left, Const(None)))
                left = self.checked(Not(left)) if negated else left
            else:
                return left

    def equal(self, left: Node, right: Node) -> Node:
        for side in (left, right):
            if isinstance(side, Const) and side.value is None:
                raise self.error("NULL cannot be compared with '='; use IS NULL")
        if isinstance(left, Const) and isinstance(right, Const) and left.boolean and not right.boolean:
            raise self.error(f"{left.value!r} cannot be compared with {right.value!r}")
        return self.checked(Equal(left, right))

    def numeric(self, node: Node) -> Node:
        if isinstance(node, Const):
            if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
                return node
            raise self.error(f"value {node.value!r} cannot be compared with > >= < <= or BETWEEN")
        if node.boolean:
            raise self.error("a boolean expression cannot be compared with > >= < <= or BETWEEN")
        return node

    def order(self, op: str, left: Node, right: Node) -> Node:
        return self.checked(Order(op, self.numeric(left), self.numeric(right)))

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
        return self.checked(StringTest(word, left, self.string(), negated))

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
            except TypeMismatch as e:
                raise self.error(f"BETWEEN bounds: {e}") from None
        if negated:
            return self.checked(Or([self.order("<", value, low), self.order(">", value, high)]))
        return self.checked(And([self.order(">=", value, low), self.order("<=", value, high)]))

    def unary(self) -> Node:
        kind, word = self.peek()
        if word not in ("+", "-", "NOT") or kind not in ("op", "kw"):
            return self.primary()
        self.i += 1
        self.enter()
        inner = self.unary()
        self.nesting -= 1
        if word == "+":
            return inner
        if word == "-":
            if isinstance(inner, Const) and isinstance(inner.value, (int, float)) and not isinstance(inner.value, bool):
                return Const(negate(inner.value))
            return self.checked(Negate(inner))
        return self.checked(Not(self.boolean(inner)))

    def primary(self) -> Node:
        kind, value = self.peek()
        if kind == "end":
            raise self.error("unexpected end of expression")
        self.i += 1
        if kind == "str":
            return Const(value[1:-1].replace("''", "'"))
        if kind == "int":
            digits = value.rstrip("lL")
            if len(digits) > MAX_LONG_DIGITS or int(digits) > LONG_MAX:
                raise self.error(f"{value[:40]} is out of the 64-bit range")
            n = int(digits)
            return Const(Int(n) if n <= INT_MAX else Long(n))
        if kind == "float":
            f = float(value)
            if math.isinf(f) or f < DOUBLE_MIN_POSITIVE:
                raise self.error(f"float literal {value[:40]} is out of range (RocketMQ takes positive doubles)")
            return Const(f)
        if kind == "id":
            return Prop(value)
        if kind == "kw" and value in ("TRUE", "FALSE", "NULL"):
            return Const({"TRUE": True, "FALSE": False, "NULL": None}[value])
        if value == "(":
            self.enter()
            node = self.or_expr()
            self.expect(")")
            self.nesting -= 1
            return node
        raise self.error(f"unexpected {value!r}")


class SQL:
    """A compiled SQL92 filter: ``SQL("region = 'eu' AND amount > 10").matches({"region": "eu", ...})``."""

    __slots__ = ("expression", "_root", "_key")

    def __init__(self, expression: str) -> None:
        if not isinstance(expression, str) or not expression.strip():
            raise FilterSyntaxError(f"an SQL92 filter needs an expression, got {expression!r}")
        self.expression = expression
        self._root = _Parser(expression).parse()
        self._key = None

    def matches(self, properties: Mapping[str, str]) -> bool:
        """True only if the expression is TRUE for these properties (unknown or a type error: False)."""
        try:
            return self._root.eval(properties) is True
        except TypeMismatch:
            return False

    def __repr__(self) -> str:
        return f"SQL({self.expression!r})"

    def parsed_form(self) -> tuple:
        """The parsed expression as nested tuples; two SQL objects are equal (and hash alike) when
        their parsed forms are, as RocketMQ compares parsed expressions (ParserTest.testEquals)."""
        if self._key is None:
            self._key = self._root.key()
        return self._key

    def __eq__(self, other) -> bool:
        return isinstance(other, SQL) and (other.expression == self.expression
                                           or other.parsed_form() == self.parsed_form())

    def __hash__(self) -> int:
        return hash(("SQL", self.parsed_form()))
