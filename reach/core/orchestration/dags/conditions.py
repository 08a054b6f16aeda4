"""The condition language, and `decide`: whether a node runs given its upstream results.

Conditions are a small expression language, parsed (never ``eval``-ed) into an AST::

    condition  := or
    or         := and ("or" and)*
    and        := not ("and" not)*
    not        := "not" not | "(" or ")" | comparison
    comparison := NODE "." "status" ("==" | "!=") STATUS
                | NODE "." "data" ("." SEGMENT)* ("==" | "!=") LITERAL
    STATUS     := "success" | "failed" | "skipped" | "timeout"   (quoted)
    LITERAL    := "string" | 'string' | number | true | false | null

``not`` binds tighter than ``and``, which binds tighter than ``or``. A ``data`` comparison
uses JSON equality (``1`` equals ``1.0``; ``true`` never equals ``1``; ``"3"`` never equals
``3``); a path that does not exist equals nothing, so ``==`` is false and ``!=`` is true.
Every node a condition names must be upstream (a transitive ancestor) of its node.

Without a condition a node runs only when every dependency has status ``success``; a
failed, timed-out or skipped dependency makes it ``skipped``, so skips propagate down a
chain. With a condition, the condition alone decides (``review_b.status == "failed"``
is a failure branch). Note ``"timeout"`` is its own status: a failure branch that should
also catch timeouts says ``c.status == "failed" or c.status == "timeout"``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, TypeAlias

from reach.core.orchestration.dags.model import Decision, NodeResult, NodeSpec, NodeStatus, lookup
from reach.errors import DagError

__all__ = [
    "RESERVED_WORDS",
    "And",
    "Compare",
    "Condition",
    "DataRef",
    "JsonScalar",
    "Not",
    "Or",
    "StatusRef",
    "decide",
    "evaluate",
    "parse_condition",
    "referenced",
]

_MAX_CONDITION_CHARS = 2_000
_MAX_CONDITION_DEPTH = 32
# Words of the language; `validate` refuses them as node ids.
RESERVED_WORDS = frozenset({"and", "or", "not", "true", "false", "null"})

JsonScalar: TypeAlias = str | int | float | bool | None
_STATUSES = tuple(status.value for status in NodeStatus)


@dataclass(frozen=True, slots=True)
class StatusRef:
    """``<node>.status``."""

    node: str

    def __str__(self) -> str:
        return f"{self.node}.status"


@dataclass(frozen=True, slots=True)
class DataRef:
    """``<node>.data.<path>`` (an empty path is the whole data)."""

    node: str
    path: tuple[str, ...] = ()

    def __str__(self) -> str:
        return ".".join((self.node, "data", *self.path))


@dataclass(frozen=True, slots=True)
class Compare:
    """A reference compared with a JSON scalar."""

    ref: StatusRef | DataRef
    op: Literal["==", "!="]
    value: JsonScalar

    def __str__(self) -> str:
        return f"{self.ref} {self.op} {json.dumps(self.value)}"


@dataclass(frozen=True, slots=True)
class Not:
    operand: Condition

    def __str__(self) -> str:
        return f"not {self.operand}"


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Condition, ...]

    def __str__(self) -> str:
        return "(" + " and ".join(str(op) for op in self.operands) + ")"


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Condition, ...]

    def __str__(self) -> str:
        return "(" + " or ".join(str(op) for op in self.operands) + ")"


Condition: TypeAlias = Compare | Not | And | Or


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # op, lparen, rparen, dot, string, number, name, segment, end
    text: str
    pos: int


_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<op>==|!=)
  | (?P<lparen>\()
  | (?P<rparen>\))
  | (?P<dot>\.)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<number>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_-]*)
    """,
    re.VERBOSE,
)
# Right after a dot comes a path segment, which may be all digits (a list index).
_SEGMENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")


def _syntax(text: str, message: str, pos: int) -> DagError:
    return DagError(
        f"invalid condition {text!r}: {message} at position {pos}", condition=text, position=pos
    )


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        if tokens and tokens[-1].kind == "dot":
            seg = _SEGMENT_RE.match(text, pos)
            if seg is None:
                raise _syntax(text, "expected a name after '.'", pos)
            tokens.append(_Token("segment", seg.group(), pos))
            pos = seg.end()
            continue
        match = _TOKEN_RE.match(text, pos)
        if match is None:
            raise _syntax(text, f"unexpected character {text[pos]!r}", pos)
        kind = match.lastgroup or ""
        if kind != "ws":
            tokens.append(_Token(kind, match.group(), pos))
        pos = match.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.index = 0
        self.depth = 0

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def advance(self) -> _Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def error(self, message: str, token: _Token | None = None) -> DagError:
        token = token or self.peek()
        found = "end of input" if token.kind == "end" else repr(token.text)
        return _syntax(self.text, f"{message}, found {found}", token.pos)

    def is_word(self, word: str) -> bool:
        token = self.peek()
        return token.kind == "name" and token.text == word

    def parse(self) -> Condition:
        cond = self.parse_or()
        if self.peek().kind != "end":
            raise self.error("expected 'and', 'or' or the end")
        return cond

    def parse_or(self) -> Condition:
        terms = [self.parse_and()]
        while self.is_word("or"):
            self.advance()
            terms.append(self.parse_and())
        return terms[0] if len(terms) == 1 else Or(tuple(terms))

    def parse_and(self) -> Condition:
        terms = [self.parse_not()]
        while self.is_word("and"):
            self.advance()
            terms.append(self.parse_not())
        return terms[0] if len(terms) == 1 else And(tuple(terms))

    def parse_not(self) -> Condition:
        self.depth += 1
        if self.depth > _MAX_CONDITION_DEPTH:
            raise self.error("condition is nested too deeply")
        try:
            if self.is_word("not"):
                self.advance()
                return Not(self.parse_not())
            if self.peek().kind == "lparen":
                self.advance()
                inner = self.parse_or()
                if self.peek().kind != "rparen":
                    raise self.error("expected ')'")
                self.advance()
                return inner
            return self.parse_compare()
        finally:
            self.depth -= 1

    def parse_compare(self) -> Condition:
        token = self.advance()
        if token.kind != "name" or token.text in RESERVED_WORDS:
            raise self.error("expected a node id", token)
        node = token.text
        if self.peek().kind != "dot":
            raise self.error(f"expected '.status' or '.data' after {node!r}")
        self.advance()
        field = self.advance()
        ref: StatusRef | DataRef
        if field.text == "status":
            ref = StatusRef(node)
        elif field.text == "data":
            path: list[str] = []
            while self.peek().kind == "dot":
                self.advance()
                path.append(self.advance().text)
            ref = DataRef(node, tuple(path))
        else:
            raise self.error("expected 'status' or 'data'", field)
        op_token = self.peek()
        if op_token.kind != "op":
            if isinstance(ref, StatusRef) and op_token.kind == "dot":
                raise self.error("'status' has no fields")
            raise self.error("expected '==' or '!='")
        self.advance()
        value_token = self.peek()
        value = self.parse_literal()
        if isinstance(ref, StatusRef) and value not in _STATUSES:
            raise _syntax(
                self.text,
                f"{ref} is compared with {json.dumps(value)}; expected one of "
                + ", ".join(json.dumps(s) for s in _STATUSES),
                value_token.pos,
            )
        return Compare(ref, "==" if op_token.text == "==" else "!=", value)

    def parse_literal(self) -> JsonScalar:
        token = self.advance()
        if token.kind == "string":
            return _decode_string(self.text, token)
        if token.kind == "number":
            number = json.loads(token.text)
            assert isinstance(number, int | float)
            return number
        if token.kind == "name" and token.text in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[token.text]
        raise self.error("expected a literal (a quoted string, number, true, false or null)", token)


def _decode_string(text: str, token: _Token) -> str:
    if token.text.startswith('"'):
        try:
            decoded = json.loads(token.text)
        except json.JSONDecodeError:
            raise _syntax(text, "invalid escape in string", token.pos) from None
        assert isinstance(decoded, str)
        return decoded
    # Single-quoted: only \' and \\ (and any other \x as x) are escapes.
    return re.sub(r"\\(.)", r"\1", token.text[1:-1])


@lru_cache(maxsize=1024)
def _parse_cached(text: str) -> Condition:
    if len(text) > _MAX_CONDITION_CHARS:
        raise DagError(f"condition is longer than {_MAX_CONDITION_CHARS} characters")
    if not text.strip():
        raise _syntax(text, "empty condition", 0)
    return _Parser(text).parse()


def parse_condition(text: str) -> Condition:
    """Parse a condition into its AST; a `DagError` (with ``position``) if it is invalid.

    Node names are not checked here: `validate` checks them against the DAG.
    """
    return _parse_cached(text)


def referenced(cond: Condition) -> set[str]:
    if isinstance(cond, Compare):
        return {cond.ref.node}
    if isinstance(cond, Not):
        return referenced(cond.operand)
    found: set[str] = set()
    for operand in cond.operands:
        found |= referenced(operand)
    return found


def _json_equal(left: Any, right: JsonScalar) -> bool:
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    if left is None or right is None:
        return left is None and right is None
    if isinstance(left, str) and isinstance(right, str):
        return left == right
    return False


def _result_of(results: Mapping[str, NodeResult], node_id: str) -> NodeResult:
    result = results.get(node_id)
    if result is None:
        raise DagError(f"node {node_id!r} has no result yet", node=node_id)
    return result


def evaluate(cond: Condition, results: Mapping[str, NodeResult]) -> bool:
    """Evaluate a condition against finished nodes' results.

    A node the condition names must have a result (a `DagError` otherwise: the plan runs
    every ancestor first, so a missing one is a bug in the caller).
    """
    if isinstance(cond, Compare):
        result = _result_of(results, cond.ref.node)
        if isinstance(cond.ref, StatusRef):
            equal = result.status.value == cond.value
        else:
            found, value = lookup(result.data, cond.ref.path)
            if not found:
                return cond.op == "!="
            equal = _json_equal(value, cond.value)
        return equal if cond.op == "==" else not equal
    if isinstance(cond, Not):
        return not evaluate(cond.operand, results)
    if isinstance(cond, And):
        return all(evaluate(op, results) for op in cond.operands)
    return any(evaluate(op, results) for op in cond.operands)


# --- node decisions -------------------------------------------------------------------------

_SKIP_WORDS = {
    NodeStatus.FAILED: "failed",
    NodeStatus.SKIPPED: "was skipped",
    NodeStatus.TIMEOUT: "timed out",
}


def decide(node: NodeSpec, results: Mapping[str, NodeResult]) -> Decision:
    """Whether ``node`` runs, given the results of (at least) its dependencies.

    Every dependency must have a result (a `DagError` otherwise). Without a condition the
    node runs when all dependencies succeeded; with one, the condition decides.
    """
    deps = [(dep, _result_of(results, dep)) for dep in node.dependencies]
    if node.condition is None:
        not_ok = [
            f"dependency {dep!r} {_SKIP_WORDS[result.status]}"
            for dep, result in deps
            if result.status != NodeStatus.SUCCESS
        ]
        if not_ok:
            return Decision(False, "; ".join(not_ok))
        return Decision(True, "all dependencies succeeded" if deps else "no dependencies")
    if evaluate(parse_condition(node.condition), results):
        return Decision(True, f"condition met: {node.condition}")
    return Decision(False, f"condition not met: {node.condition}")
