"""A small evaluator of AWS IAM identity policies, and the controller policy of docs/install.md.

It decides, for one request (action, resource ARN, request context), what one identity-based
policy document says, as AWS documents policy evaluation for a single policy:

* an applicable Deny statement wins; otherwise an applicable Allow allows; otherwise the
  request is implicitly denied;
* a statement applies when its Action (or NotAction) covers the action, its Resource (or
  NotResource) covers the resource, and every condition holds;
* Action names are case-insensitive; `*` and `?` are wildcards in actions and resources; an
  ARN pattern is matched segment by segment (partition, service, region, account), the
  wildcards of the last segment (the resource) also spanning `/` and `:`;
* within Condition: all operators must hold, all keys of an operator must hold, and a key
  holds when the request's value matches any of the policy's values. Condition key names
  are case-insensitive, their values case-sensitive (except the *IgnoreCase operators);
* a key missing from the request fails a positive operator (StringEquals, StringLike, ...),
  satisfies a negated one (StringNotEquals, ...) and any operator with the IfExists suffix;
  Null checks presence (`"true"`: the key is absent);
* ForAllValues: every value of the request's (multivalued) key matches one of the policy's;
  true when the key is missing or empty. ForAnyValue: at least one value matches; false when
  the key is missing or empty. A multivalued key (a list in the request context, such as
  aws:TagKeys) needs one of them: under an operator without a set qualifier it matches
  nothing, negated operators included (as @cloud-copilot/iam-simulate evaluates it).

Supported operators: String*, Numeric*, Date*, Bool, BinaryEquals, IpAddress, NotIpAddress,
Arn*, Null, with IfExists or one of the ForAllValues:/ForAnyValue: qualifiers. An unknown
operator, IfExists together with a set qualifier, or a policy variable (`${aws:...}`) raises
PolicyError rather than guessing.

Checked against @cloud-copilot/iam-simulate (a maintained evaluator, not used here: it is
AGPL-licensed and needs Node) on the emulator's recorded calls, mutated variants of them and
random conditions: the same decisions.

Not modelled (not needed for one identity policy): resource-based policies, permission
boundaries, session policies, SCPs/RCPs, Principal/NotPrincipal.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
INSTALL_DOC = REPO / "docs" / "install.md"


class PolicyError(ValueError):
    """A policy this evaluator cannot evaluate faithfully."""


# -- wildcards -----------------------------------------------------------------


@lru_cache(maxsize=4096)
def _glob(pattern: str, ignore_case: bool = False) -> re.Pattern:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(regex, re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def glob_match(pattern: str, value: str, ignore_case: bool = False) -> bool:
    """`*` matches any run of characters (also none), `?` any one character."""
    return _glob(pattern, ignore_case).fullmatch(value) is not None


def arn_match(pattern: str, arn: str) -> bool:
    """ARN matching of Resource and ArnLike: segment by segment; the resource segment's
    wildcards may span `/` and `:`."""
    if pattern == "*":
        return True
    p, a = pattern.split(":", 5), arn.split(":", 5)
    if len(p) != 6 or len(a) != 6:
        return glob_match(pattern, arn)
    return all(glob_match(ps, as_) for ps, as_ in zip(p, a))


def _arn_condition(request: str, policy: str) -> bool:
    """ArnEquals/ArnLike: both must be ARNs (a value that is not one matches nothing)."""
    if not (request.startswith("arn:") and len(request.split(":", 5)) == 6):
        return False
    if not (policy.startswith("arn:") and len(policy.split(":", 5)) == 6):
        return False
    return arn_match(policy, request)


def action_match(pattern: str, action: str) -> bool:
    return glob_match(pattern, action, ignore_case=True)


# -- conditions ----------------------------------------------------------------


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _number(value: str) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _date(value: str) -> datetime.datetime | None:
    text = str(value).strip()
    try:
        if re.fullmatch(r"-?\d+(\.\d+)?", text):
            return datetime.datetime.fromtimestamp(float(text), datetime.timezone.utc)
        parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.timezone.utc)
    except (ValueError, OverflowError):
        return None


def _compare(kind: str, test):
    def op(request: str, policy: str) -> bool:
        if kind == "numeric":
            a, b = _number(request), _number(policy)
        else:
            a, b = _date(request), _date(policy)
        return a is not None and b is not None and test(a, b)

    return op


def _ip(request: str, policy: str) -> bool:
    try:
        return ipaddress.ip_address(request) in ipaddress.ip_network(policy, strict=False)
    except ValueError:
        return False


def _binary(request: str, policy: str) -> bool:
    try:
        return base64.b64decode(request, validate=True) == base64.b64decode(policy, validate=True)
    except ValueError:
        return False


# operator -> (matches(request value, policy value), negated)
_OPERATORS: dict[str, tuple[Any, bool]] = {
    "StringEquals": (lambda r, p: r == p, False),
    "StringNotEquals": (lambda r, p: r == p, True),
    "StringEqualsIgnoreCase": (lambda r, p: r.casefold() == p.casefold(), False),
    "StringNotEqualsIgnoreCase": (lambda r, p: r.casefold() == p.casefold(), True),
    "StringLike": (lambda r, p: glob_match(p, r), False),
    "StringNotLike": (lambda r, p: glob_match(p, r), True),
    "NumericEquals": (_compare("numeric", lambda a, b: a == b), False),
    "NumericNotEquals": (_compare("numeric", lambda a, b: a == b), True),
    "NumericLessThan": (_compare("numeric", lambda a, b: a < b), False),
    "NumericLessThanEquals": (_compare("numeric", lambda a, b: a <= b), False),
    "NumericGreaterThan": (_compare("numeric", lambda a, b: a > b), False),
    "NumericGreaterThanEquals": (_compare("numeric", lambda a, b: a >= b), False),
    "DateEquals": (_compare("date", lambda a, b: a == b), False),
    "DateNotEquals": (_compare("date", lambda a, b: a == b), True),
    "DateLessThan": (_compare("date", lambda a, b: a < b), False),
    "DateLessThanEquals": (_compare("date", lambda a, b: a <= b), False),
    "DateGreaterThan": (_compare("date", lambda a, b: a > b), False),
    "DateGreaterThanEquals": (_compare("date", lambda a, b: a >= b), False),
    "Bool": (lambda r, p: r.lower() == p.lower(), False),
    "BinaryEquals": (_binary, False),
    "IpAddress": (_ip, False),
    "NotIpAddress": (_ip, True),
    "ArnEquals": (_arn_condition, False),
    "ArnLike": (_arn_condition, False),
    "ArnNotEquals": (_arn_condition, True),
    "ArnNotLike": (_arn_condition, True),
}


@dataclass(frozen=True)
class Operator:
    name: str  # as written, e.g. "ForAllValues:StringEqualsIfExists"
    base: str  # "StringEquals"
    qualifier: str | None  # "ForAllValues" | "ForAnyValue" | None
    if_exists: bool

    @classmethod
    def parse(cls, name: str) -> "Operator":
        qualifier = None
        rest = name
        for q in ("ForAllValues", "ForAnyValue"):
            if name.lower().startswith(q.lower() + ":"):
                qualifier, rest = q, name[len(q) + 1:]
        if_exists = rest.endswith("IfExists")
        base = rest[: -len("IfExists")] if if_exists else rest
        if base != "Null" and base not in _OPERATORS:
            raise PolicyError(f"unknown condition operator {name!r}")
        if base == "Null" and (if_exists or qualifier):
            raise PolicyError(f"{name!r}: Null takes neither IfExists nor a set qualifier")
        if if_exists and qualifier:
            raise PolicyError(f"{name!r}: IfExists with a set qualifier is not evaluated here")
        return cls(name, base, qualifier, if_exists)

    def holds(self, present: bool, values: list[str], policy_values: list[str], multivalued: bool = False) -> bool:
        """Whether the condition holds for the request's `values` of the key (`present`:
        whether the request has the key; `multivalued`: whether it is a list)."""
        if self.base == "Null":
            return any((p.lower() == "true") == (not present) for p in policy_values)
        match, negated = _OPERATORS[self.base]

        def one(value: str) -> bool:
            hit = any(match(value, p) for p in policy_values)
            return not hit if negated else hit

        if not present:
            if self.if_exists:
                return True
            if self.qualifier == "ForAllValues":
                return True
            if self.qualifier == "ForAnyValue":
                return False
            return negated
        if self.qualifier == "ForAllValues":
            return all(one(v) for v in values)
        if self.qualifier == "ForAnyValue":
            return any(one(v) for v in values)
        if multivalued or len(values) != 1:
            return False
        return one(values[0])


@dataclass(frozen=True)
class Condition:
    operator: Operator
    key: str
    values: tuple[str, ...]

    def describe(self, context: "Context") -> str:
        present, actual = context.get(self.key)
        got = (actual if len(actual) != 1 else actual[0]) if present else "(missing)"
        wanted = list(self.values) if len(self.values) != 1 else self.values[0]
        return f"{self.operator.name} {self.key} {json.dumps(wanted)}: request has {json.dumps(got)}"

    def holds(self, context: "Context") -> bool:
        present, actual = context.get(self.key)
        return self.operator.holds(present, actual, list(self.values), context.multivalued(self.key))


class Context:
    """The request context: condition keys (case-insensitive names) and their values."""

    def __init__(self, values: dict[str, Any] | None = None):
        self._values: dict[str, tuple[str, list[str], bool]] = {}
        for key, value in (values or {}).items():
            multivalued = isinstance(value, (list, tuple, set))
            as_list = [_text(v) for v in value] if multivalued else [_text(value)]
            self._values[key.lower()] = (key, as_list, multivalued)

    def get(self, key: str) -> tuple[bool, list[str]]:
        found = self._values.get(key.lower())
        return (True, found[1]) if found else (False, [])

    def multivalued(self, key: str) -> bool:
        found = self._values.get(key.lower())
        return bool(found and found[2])


# -- statements and policies ---------------------------------------------------


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


_POLICY_VARIABLE = re.compile(r"\$\{[^}]*\}")


def _no_variables(where: str, values: list[str]) -> None:
    for value in values:
        if _POLICY_VARIABLE.search(str(value)):
            raise PolicyError(f"{where}: policy variables are not supported: {value!r}")


@dataclass
class Statement:
    index: int
    sid: str
    effect: str
    actions: list[str]
    not_action: bool
    resources: list[str]
    not_resource: bool
    conditions: list[Condition]
    raw: dict = field(repr=False)

    @classmethod
    def parse(cls, index: int, raw: dict) -> "Statement":
        sid = raw.get("Sid") or f"#{index}"
        effect = raw.get("Effect")
        if effect not in ("Allow", "Deny"):
            raise PolicyError(f"statement {sid}: Effect {effect!r}")
        if ("Action" in raw) == ("NotAction" in raw):
            raise PolicyError(f"statement {sid}: exactly one of Action and NotAction")
        if ("Resource" in raw) == ("NotResource" in raw):
            raise PolicyError(f"statement {sid}: exactly one of Resource and NotResource")
        if "Principal" in raw or "NotPrincipal" in raw:
            raise PolicyError(f"statement {sid}: a Principal belongs in resource-based policies")
        actions = _as_list(raw.get("Action", raw.get("NotAction")))
        resources = _as_list(raw.get("Resource", raw.get("NotResource")))
        _no_variables(f"statement {sid} Resource", resources)
        conditions = []
        for op_name, entries in (raw.get("Condition") or {}).items():
            operator = Operator.parse(op_name)
            if not isinstance(entries, dict):
                raise PolicyError(f"statement {sid}: {op_name} is not a key -> values map")
            for key, values in entries.items():
                texts = [_text(v) for v in _as_list(values)]
                _no_variables(f"statement {sid} {op_name} {key}", texts)
                conditions.append(Condition(operator, key, tuple(texts)))
        return cls(index, sid, effect, actions, "NotAction" in raw, resources, "NotResource" in raw,
                   conditions, raw)

    def matching_actions(self, action: str) -> list[str]:
        """The Action patterns that cover `action` ([] when none; for NotAction, ['NotAction']
        when the statement covers it)."""
        hits = [p for p in self.actions if action_match(p, action)]
        if self.not_action:
            return [] if hits else ["NotAction"]
        return hits

    def matching_resources(self, resource: str) -> list[str]:
        hits = [p for p in self.resources if arn_match(p, resource)]
        if self.not_resource:
            return [] if hits else ["NotResource"]
        return hits

    def failing_conditions(self, context: Context) -> list[Condition]:
        return [c for c in self.conditions if not c.holds(context)]


@dataclass
class Match:
    """A statement that applies to a request, with what of it matched."""

    statement: Statement
    actions: list[str]
    resources: list[str]


@dataclass
class Miss:
    """A statement whose Action and Resource cover a request but whose conditions fail."""

    statement: Statement
    failing: list[Condition]


@dataclass
class Decision:
    allowed: bool
    allowed_by: list[Match]
    denied_by: list[Match]
    misses: list[Miss]

    @property
    def explicitly_denied(self) -> bool:
        return bool(self.denied_by)

    def explain(self, context: Context) -> str:
        if self.allowed:
            return "allowed by " + ", ".join(m.statement.sid for m in self.allowed_by)
        if self.denied_by:
            return "explicitly denied by " + ", ".join(m.statement.sid for m in self.denied_by)
        if not self.misses:
            return "no statement covers this action and resource"
        parts = []
        for miss in self.misses:
            failing = "; ".join(c.describe(context) for c in miss.failing)
            parts.append(f"{miss.statement.sid} ({miss.statement.effect}) fails {failing}")
        return "implicitly denied: " + " | ".join(parts)


class Policy:
    def __init__(self, document: dict):
        if not isinstance(document, dict) or "Statement" not in document:
            raise PolicyError("a policy document has a Statement")
        if document.get("Version") not in (None, "2012-10-17"):
            raise PolicyError(f"unsupported policy Version {document.get('Version')!r}")
        self.document = document
        self.statements = [Statement.parse(i, s) for i, s in enumerate(_as_list(document["Statement"]))]

    def evaluate(self, action: str, resource: str, context: dict[str, Any] | Context | None = None) -> Decision:
        ctx = context if isinstance(context, Context) else Context(context)
        allowed_by: list[Match] = []
        denied_by: list[Match] = []
        misses: list[Miss] = []
        for statement in self.statements:
            actions = statement.matching_actions(action)
            if not actions:
                continue
            resources = statement.matching_resources(resource)
            if not resources:
                continue
            failing = statement.failing_conditions(ctx)
            if failing:
                misses.append(Miss(statement, failing))
                continue
            (denied_by if statement.effect == "Deny" else allowed_by).append(Match(statement, actions, resources))
        return Decision(not denied_by and bool(allowed_by), allowed_by, denied_by, misses)


# -- the controller policy of docs/install.md ----------------------------------

_SECTION = "### 1.3 Controller role and policy"
_JSON_BLOCK = re.compile(r"```json\n(.*?)```", re.DOTALL)
_SHELL_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def controller_policy_template(doc: Path = INSTALL_DOC) -> str:
    """The permissions policy of section 1.3 of docs/install.md, as written (with ${VARS}):
    the section's JSON block whose statements name no Principal (the other is the trust
    policy)."""
    text = doc.read_text()
    start = text.index(_SECTION)
    end = text.find("\n### ", start + len(_SECTION))
    section = text[start:end if end != -1 else len(text)]
    found = []
    for block in _JSON_BLOCK.findall(section):
        if '"Principal"' not in block and '"Statement"' in block:
            found.append(block)
    if len(found) != 1:
        raise PolicyError(f"expected one permissions policy in {doc.name} section 1.3, found {len(found)}")
    return found[0]


def substitute(template: str, variables: dict[str, str]) -> str:
    """envsubst, as the install guide runs it: every ${VAR} replaced; an unknown one is an error."""
    missing = sorted({m for m in _SHELL_VARIABLE.findall(template) if m not in variables})
    if missing:
        raise PolicyError(f"no value for {', '.join(missing)}")
    return _SHELL_VARIABLE.sub(lambda m: variables[m.group(1)], template)


def controller_policy(variables: dict[str, str], doc: Path = INSTALL_DOC) -> Policy:
    return Policy(json.loads(substitute(controller_policy_template(doc), variables)))
