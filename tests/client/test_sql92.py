"""SQL92 filters: RocketMQ's grammar, three-valued logic and type rules, as expression tables.

Expected values are worked out from RocketMQ's filter module (ComparisonExpression with string
conversion on, ActiveMQ's logic and NULL rules), not produced by this code.
"""
from __future__ import annotations

import inspect
import sys

import pytest
from hypothesis import given, settings, strategies as st

import hostmq
from hostmq import FilterSyntaxError
from hostmq.client.sql92 import MAX_DEPTH

pytestmark = pytest.mark.timeout(60)

PROPS = {"region": "eu", "amount": "15", "price": "9.5", "flag": "TRUE", "name": "order-42", "neg": "-3",
         "big": "3000000000", "word": "abc", "empty": "", "quote": "it's", "zero": "0", "nan": "NaN"}

CASES = [
    # equality on strings
    ("region = 'eu'", True), ("region = 'us'", False), ("region <> 'us'", True), ("region <> 'eu'", False),
    ("'eu' = region", True), ("quote = 'it''s'", True), ("empty = ''", True),
    # numbers: the property is converted to the literal's type
    ("amount = 15", True), ("amount > 10", True), ("amount >= 15", True), ("amount < 15", False),
    ("amount <= 14", False), ("10 < amount", True), ("amount = 15.0", True), ("price > 9", False),
    ("price > 9.0", True), ("price = 9.5", True), ("neg < 0", True), ("neg = -3", True), ("amount > -1", True),
    ("big > 1", False),                   # Integer.valueOf("3000000000") fails: a type error, no match
    ("big > 2147483648", True),           # a Long literal: Long.valueOf works
    ("big = 3000000000", True), ("amount = 15L", True),
    # BETWEEN / NOT BETWEEN
    ("amount BETWEEN 10 AND 20", True), ("amount BETWEEN 15 AND 15", True), ("amount BETWEEN 16 AND 20", False),
    ("amount NOT BETWEEN 16 AND 20", True), ("amount NOT BETWEEN 10 AND 20", False),
    ("price BETWEEN 9.4 AND 9.6", True), ("missing BETWEEN 1 AND 2", False), ("missing NOT BETWEEN 1 AND 2", False),
    # IN / NOT IN (string lists)
    ("region IN ('eu', 'us')", True), ("region IN ('us', 'ap')", False), ("region NOT IN ('us', 'ap')", True),
    ("region NOT IN ('eu')", False), ("missing IN ('a')", False), ("missing NOT IN ('a')", False),
    # NULL handling: a missing property is NULL, comparisons with it are unknown
    ("missing IS NULL", True), ("region IS NULL", False), ("region IS NOT NULL", True),
    ("missing IS NOT NULL", False), ("missing = 'x'", False), ("missing <> 'x'", False), ("missing > 1", False),
    ("NOT (missing = 'x')", False), ("missing = 'x' OR region = 'eu'", True), ("missing = 'x' AND region = 'eu'", False),
    ("missing = 'x' OR region = 'us'", False), ("NOT (missing = 'x' OR region = 'us')", False),
    ("NOT (missing = 'x' AND region = 'us')", True),        # unknown AND false = false; NOT false = true
    # type mismatches: no match, never an error
    ("word > 1", False), ("word = 1", False), ("word <> 1", False), ("word BETWEEN 1 AND 2", False),
    ("amount > price", True),             # two strings under '>' are compared as doubles: 15 > 9.5
    ("word > amount", False),             # 'abc' is not a double: type error
    ("region = TRUE", False), ("flag = TRUE", True), ("flag = FALSE", False), ("zero = FALSE", True),
    ("TRUE = flag", False),               # Java: a Boolean compared with a String throws: no match
    ("1 = TRUE", False), ("nan = nan", True), ("nan > 1.0", True),   # Double.compareTo: NaN is largest
    # CONTAINS / STARTSWITH / ENDSWITH
    ("name CONTAINS 'der-4'", True), ("name CONTAINS 'x'", False), ("name NOT CONTAINS 'x'", True),
    ("name STARTSWITH 'order'", True), ("name NOT STARTSWITH 'order'", False), ("name ENDSWITH '42'", True),
    ("name NOT ENDSWITH '42'", False), ("missing CONTAINS 'a'", False), ("missing NOT CONTAINS 'a'", False),
    ("name CONTAINS ''", False), ("name NOT CONTAINS ''", False),
    # logic, precedence, case, comments
    ("region = 'eu' AND amount > 10", True), ("region = 'us' OR amount > 10", True),
    ("region = 'us' OR amount > 10 AND price < 1", False),       # AND binds tighter than OR
    ("(region = 'us' OR amount > 10) AND price < 10.0", True),
    ("(region = 'us' OR amount > 10) AND price < 10", False),   # Integer.valueOf("9.5") fails: no match ("NOT region = 'eu'", False),
    ("not (region = 'eu')", False), ("Region = 'eu'", False),    # property names are case-sensitive
    ("region = 'eu' and AMOUNT is null", True), ("region = 'eu' -- a comment\n AND amount = 15", True),
    ("/* block */ region = 'eu'", True), ("TRUE", True), ("FALSE", False), ("NULL", False), ("flag", False),
    ("+amount > 14", True), ("-amount < 0", False),   # negating a property string gives NULL: unknown
]


@pytest.mark.parametrize("expression,expected", CASES)
def test_expression_table(expression, expected):
    assert hostmq.SQL(expression).matches(PROPS) is expected


BAD = [
    "", "   ", "region =", "= 'eu'", "region = 'eu' AND", "(region = 'eu'", "region = 'eu')", "region == 'eu'",
    "region = 'eu", "region LIKE 'e%'", "region IN ()", "region IN ('a' 'b')", "region IN (1, 2)",
    "'a' IN ('a')", "amount > 'ten'", "amount > TRUE", "amount > NULL", "region = NULL", "NULL = region",
    "TRUE = 1", "amount BETWEEN 20 AND 10", "amount BETWEEN 1", "amount BETWEEN NULL AND 3",
    "(amount > 1) > 2", "1", "'text'", "amount + 1 > 2", "region = 'eu' ; DROP", "0.0 < amount",
    "99999999999999999999 > 1", "name CONTAINS 1", "a # b", "region IS 'eu'",
]


@pytest.mark.parametrize("expression", BAD)
def test_bad_expressions_raise_when_built(expression):
    with pytest.raises(FilterSyntaxError):
        hostmq.SQL(expression)


def test_not_binds_to_the_operand_as_in_rocketmq():
    # RocketMQ's grammar puts NOT in the unary rule: "NOT a = 'x'" is "(NOT a) = 'x'", a boolean
    # compared with a string (a type error), so it matches nothing; parenthesise to negate a test.
    assert not hostmq.SQL("NOT region = 'us'").matches(PROPS)
    assert hostmq.SQL("NOT (region = 'us')").matches(PROPS)


def test_sql_objects_are_values():
    a, b = hostmq.SQL("a = 1"), hostmq.SQL("a = 1")
    assert a == b and hash(a) == hash(b) and a != hostmq.SQL("a = 2") and "a = 1" in repr(a)
    with pytest.raises(FilterSyntaxError):
        hostmq.SQL(None)


@settings(max_examples=200, deadline=None)
@given(st.integers(-10 ** 6, 10 ** 6), st.integers(-10 ** 6, 10 ** 6), st.integers(-10 ** 6, 10 ** 6))
def test_numeric_comparisons_agree_with_python(x, lo, hi):
    props = {"x": str(x)}
    assert hostmq.SQL(f"x > {lo}" if lo >= 0 else f"x > -{-lo}").matches(props) is (x > lo)
    assert hostmq.SQL(f"x = {abs(lo)}").matches(props) is (x == abs(lo))
    lo, hi = min(lo, hi), max(lo, hi)
    expr = f"x BETWEEN {'-' if lo < 0 else ''}{abs(lo)} AND {'-' if hi < 0 else ''}{abs(hi)}"
    assert hostmq.SQL(expr).matches(props) is (lo <= x <= hi)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abc =<>()'0123456789.-ANDORNTISLUBEW", max_size=30))
def test_random_text_either_parses_or_raises_the_typed_error(text):
    try:
        f = hostmq.SQL(text)
    except FilterSyntaxError:
        return
    assert f.matches({"a": "1", "b": "x"}) in (True, False)


# -- limits: deep nesting is refused when built, long AND / OR chains work, nothing recurses unbounded --
def stack_depth() -> int:
    return len(inspect.stack(0))


STACK_BUDGET = 8 * MAX_DEPTH + 40      # frames parsing + matching may take (documented: ~6 per level)


def build_and_match(expression: str, props: dict):
    """``SQL(expression).matches(props)`` with the interpreter's recursion limit lowered to what the
    documented limits allow above this frame: a RecursionError here is a broken bound, not a slow test."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(stack_depth() + STACK_BUDGET)
    try:
        return hostmq.SQL(expression).matches(props)
    finally:
        sys.setrecursionlimit(old)


def test_parentheses_nest_up_to_the_limit_and_no_further():
    assert build_and_match("(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH, {"a": "1"}) is True
    for n in (MAX_DEPTH + 1, 200, 100_000):
        with pytest.raises(FilterSyntaxError, match="nest deeper than"):
            build_and_match("(" * n + "a = 1" + ")" * n, {"a": "1"})


def test_not_and_sign_chains_count_as_nesting():
    assert build_and_match("NOT " * (MAX_DEPTH - 2) + "(a = 1)", {"a": "1"}) is True     # an even number
    with pytest.raises(FilterSyntaxError):
        build_and_match("NOT " * 10_000 + "(a = 1)", {"a": "1"})
    assert build_and_match("a > " + "- " * (MAX_DEPTH - 1) + "1", {"a": "0"}) is True     # an odd number: -1
    assert build_and_match("a > " + "- " * (MAX_DEPTH - 2) + "1", {"a": "0"}) is False
    with pytest.raises(FilterSyntaxError):
        build_and_match("a > " + "- " * 10_000 + "1", {"a": "0"})


def test_chained_comparisons_are_bounded_by_the_tree_height():
    assert build_and_match("a" + " CONTAINS 'x'" * (MAX_DEPTH - 1), {"a": "x"}) is False
    for chain in (" = ".join(["a"] * 5000), "a" + " CONTAINS 'x'" * 5000, "a" + " IS NULL" * 5000):
        with pytest.raises(FilterSyntaxError, match="nests deeper than"):
            build_and_match(chain, {"a": "x"})


@pytest.mark.parametrize("n", [1, 2, MAX_DEPTH, 1000, 20_000])
def test_long_and_or_chains_parse_and_evaluate(n):
    props = {f"p{i}": str(i) for i in range(n)}
    conj = " AND ".join(f"p{i} = {i}" for i in range(n))
    assert build_and_match(conj, props) is True
    assert build_and_match(conj, {**props, f"p{n - 1}": "x"}) is False             # the last one fails
    assert build_and_match(conj, {k: v for k, v in props.items() if k != "p0"}) is False   # unknown → no
    disj = " OR ".join(f"p{i} = -1" for i in range(n))
    assert build_and_match(disj, props) is False
    assert build_and_match(disj, {**props, f"p{n - 1}": "-1"}) is True
    mixed = " OR ".join(f"(p{i} = {i} AND p{i} <> 'x')" for i in range(n))
    assert build_and_match(mixed, props) is True


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3 * MAX_DEPTH), st.booleans())
def test_the_nesting_limit_is_exact(n, negate):
    opener = "NOT (" if negate else "("
    expression = opener * n + "a = 1" + ")" * n
    # parentheses and NOT each nest once; NOT also adds a level to the tree above a = 1 (height 2)
    limit = MAX_DEPTH // 2 if negate else MAX_DEPTH
    if negate:
        limit = min(limit, MAX_DEPTH - 2)
    if n > limit:
        with pytest.raises(FilterSyntaxError):
            build_and_match(expression, {"a": "1"})
    else:
        assert build_and_match(expression, {"a": "1"}) is (not negate or n % 2 == 0)


TOKENS = ["(", ")", "(", ")", "NOT", "AND", "OR", "a", "b", "=", "<>", ">", "<=", "1", "2.5", "'x'", "-", "+",
          "IS", "NULL", "IN", "BETWEEN", "TRUE", ",", "CONTAINS", "9" * 30, "1" * 5000, "--", "/*", "*/", "'"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=400), st.integers(0, 30), st.integers(0, 2000))
def test_no_token_soup_raises_anything_but_the_typed_error(tokens, nest, chain):
    soup = " ".join(tokens)
    variants = [soup, "(" * nest * 3 + soup + ")" * nest * 3, " AND ".join([soup or "a"] * (chain // 50 + 1)),
                "NOT " * nest * 4 + soup]
    hostile = {"a": "9" * 5000, "b": "0" * 5000 + "1"}
    for text in variants:
        try:
            result = build_and_match(text, hostile)
        except FilterSyntaxError:
            continue
        assert result in (True, False)
        assert hostmq.SQL(text).matches({"a": "1", "b": "x"}) in (True, False)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.text(max_size=60))
def test_any_property_value_evaluates_to_a_boolean(a, b):
    for expression in ("a > 1", "a = 2147483648", "a < 1.5", "a = b", "a > b", "a IN ('x')", "a CONTAINS 'x'",
                       "a = TRUE", "-a > 1"):
        assert hostmq.SQL(expression).matches({"a": a, "b": b}) in (True, False)


def test_huge_numbers_are_refused_or_a_type_error_not_a_crash():
    for literal in ("1" * 5000, "1" * 20, "1" * 400 + ".5"):
        with pytest.raises(FilterSyntaxError):
            hostmq.SQL(f"a < {literal}")
    for value in ("9" * 5000, "-" + "9" * 5000, "0" * 5000 + "5"):
        assert hostmq.SQL("a > 1").matches({"a": value}) is (value == "0" * 5000 + "5")
        assert hostmq.SQL("a > 1.0").matches({"a": value}) is (not value.startswith("-"))
