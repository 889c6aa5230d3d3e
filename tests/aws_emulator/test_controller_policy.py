"""The controller's IAM policy (docs/install.md, section 1.3) against what the controller does.

The AWS emulator records, for every request of the controller, the IAM authorisations AWS
would make (hack/moto/call_log.py) into $KARPENTER_RS_MOTO_CALL_LOG. `make test`
(hack/test.sh) switches that log on before the Rust tests, whose end-to-end journeys run
the `karpenter controller` binary against the emulator, and runs this file afterwards.
Every recorded authorisation is evaluated against the policy, with the emulator's account,
region and the cluster substituted for the guide's variables (iam_policy.py):

* a call the policy denies fails the test, naming the call, the resource and, for each
  statement that nearly applied, the conditions that failed;
* so does a statement, or an action or resource of a statement, that no recorded call
  needed, unless UNEXERCISED below says why only real AWS needs it;
* and so does a call the recorder could not model (it would be judged on `*`).

Without a call log (pytest run alone, without KARPENTER_RS_MOTO_CALL_LOG) the tests skip.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path

import pytest

from iam_policy import Context, Policy, controller_policy

LOG_VAR = "KARPENTER_RS_MOTO_CALL_LOG"
CLUSTER = os.environ.get("CLUSTER_NAME") or "karpenter-demo"
REGION = os.environ.get("AWS_REGION") or "us-west-2"
ACCOUNT = os.environ.get("MOTO_ACCOUNT_ID") or "123456789012"  # moto's default account


def partition(region: str) -> str:
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


VARIABLES = {
    "AWS_PARTITION": partition(REGION),
    "AWS_REGION": REGION,
    "AWS_ACCOUNT_ID": ACCOUNT,
    "CLUSTER_NAME": CLUSTER,
}

# Parts of the policy the emulator journeys cannot exercise, and why real AWS needs them.
# Keys: a Sid, (Sid, action) or (Sid, resource pattern as substituted).
UNEXERCISED: dict[object, str] = {
    ("LaunchFromSharedResources",
     f"arn:{partition(REGION)}:ec2:{REGION}:*:capacity-reservation/*"):
        "a launch without a capacity reservation preference may run in an open On-Demand "
        "Capacity Reservation of the account that matches it; the controller launches into none "
        "yet, so no journey does",
}

# Calls that IAM identity policies do not govern.
NOT_AUTHORISED_BY_IDENTITY_POLICIES = {
    "sts:GetCallerIdentity": "needs no permission",
    "sts:AssumeRoleWithWebIdentity": "authorised by the role's trust policy (IRSA)",
}

# The crash journey of the end-to-end tests points the controller at an interruption queue of
# its own (settings.interruptionQueue) instead of the guide's `$CLUSTER_NAME` queue: its calls
# are judged as calls on the cluster's queue, as a user with that queue name would write the
# InterruptionQueue statement.
QUEUE_ALIASES = [re.compile(r"^e2e-missing-\d+$")]


def load_log() -> list[dict]:
    path = os.environ.get(LOG_VAR)
    if not path or not Path(path).is_file():
        pytest.skip(
            f"no call log of the controller (${LOG_VAR} {'is unset' if not path else f'= {path} does not exist'}): "
            "`make test` records one while the Rust end-to-end tests run (hack/test.sh)"
        )
    records = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                pytest.fail(f"{path}:{number}: not JSON ({exc}): {line[:200]}", pytrace=False)
    return records


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return load_log()


@pytest.fixture(scope="module")
def policy() -> Policy:
    return controller_policy(VARIABLES)


def judged_resource(record: dict) -> str:
    resource = record["resource"]
    if record["action"].startswith("sqs:"):
        prefix, _, queue = resource.rpartition(":")
        if any(alias.match(queue) for alias in QUEUE_ALIASES):
            return f"{prefix}:{CLUSTER}"
    return resource


def key(record: dict) -> str:
    return json.dumps([record["action"], judged_resource(record), record.get("context", {})], sort_keys=True)


def unique(records: list[dict]) -> list[dict]:
    """One record per distinct (action, resource, context), with how many calls made it."""
    seen: dict[str, dict] = {}
    for record in records:
        if record.get("action") in NOT_AUTHORISED_BY_IDENTITY_POLICIES:
            continue
        k = key(record)
        if k in seen:
            seen[k]["calls"] += 1
        else:
            seen[k] = {**record, "calls": 1}
    return list(seen.values())


def describe(record: dict) -> str:
    found = record.get("resource_found")
    missing = " (the resource did not exist)" if found is False else ""
    return (f"{record.get('operation')} -> {record['action']} on {judged_resource(record)}{missing}, "
            f"{record['calls']} call(s), status {record.get('status')}")


def test_the_log_has_the_controllers_calls(records) -> None:
    assert records, (
        f"the call log ${LOG_VAR} is empty: no request of the controller reached the emulator "
        "(did the end-to-end tests run? does the controller still put app/karpenter-rs in its user agent?)"
    )


def test_every_call_is_modelled(records) -> None:
    bad = [r for r in records if r.get("error") or not r.get("modelled", True)]
    lines = sorted({f"{r.get('operation')}: {r.get('error') or 'resources not modelled'}" for r in bad})
    assert not lines, (
        "the call log has requests hack/moto/call_log.py does not know the IAM resources of; "
        "teach it what they authorise:\n  " + "\n  ".join(lines)
    )


def test_the_policy_allows_every_call(records, policy) -> None:
    denied = []
    for record in unique(r for r in records if r.get("action")):
        context = Context(record.get("context", {}))
        decision = policy.evaluate(record["action"], judged_resource(record), context)
        if not decision.allowed:
            denied.append(f"{describe(record)}\n      {decision.explain(context)}\n"
                          f"      context: {json.dumps(record.get('context', {}), sort_keys=True)}")
    assert not denied, (
        f"docs/install.md's controller policy denies {len(denied)} authorisation(s) the controller needs:\n  "
        + "\n  ".join(denied)
    )


def test_every_statement_is_needed(records, policy) -> None:
    used_statements: set[str] = set()
    used_actions: dict[str, set[str]] = defaultdict(set)
    used_resources: dict[str, set[str]] = defaultdict(set)
    for record in unique(r for r in records if r.get("action")):
        decision = policy.evaluate(record["action"], judged_resource(record), record.get("context", {}))
        for match in decision.allowed_by:
            sid = match.statement.sid
            used_statements.add(sid)
            used_actions[sid].update(match.actions)
            used_resources[sid].update(match.resources)

    unneeded = []
    for statement in policy.statements:
        sid = statement.sid
        if sid not in used_statements:
            if sid not in UNEXERCISED:
                unneeded.append(f"statement {sid}: no recorded call needs it")
            continue
        if not statement.not_action:
            for action in statement.actions:
                if action not in used_actions[sid] and (sid, action) not in UNEXERCISED:
                    unneeded.append(f"statement {sid}: no recorded call needs action {action}")
        if not statement.not_resource:
            for resource in statement.resources:
                if resource not in used_resources[sid] and (sid, resource) not in UNEXERCISED:
                    unneeded.append(f"statement {sid}: no recorded call needs resource {resource}")
    assert not unneeded, (
        "docs/install.md's controller policy grants more than the controller uses (remove it, or "
        "list it in UNEXERCISED with the reason only real AWS needs it):\n  " + "\n  ".join(unneeded)
    )


def test_unexercised_entries_are_still_in_the_policy(policy) -> None:
    sids = {s.sid: s for s in policy.statements}
    for entry in UNEXERCISED:
        sid, part = (entry, None) if isinstance(entry, str) else entry
        assert sid in sids, f"UNEXERCISED names {sid}, which docs/install.md no longer has"
        if part is not None:
            statement = sids[sid]
            assert part in statement.actions + statement.resources, (
                f"UNEXERCISED names {part} of {sid}, which that statement no longer has")
