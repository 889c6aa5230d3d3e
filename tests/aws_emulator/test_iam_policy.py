"""The IAM policy evaluator (iam_policy.py) against the evaluation rules AWS documents
(IAM User Guide: policy evaluation logic, the Condition element, condition operators,
multivalued context keys, tag-on-create for EC2), and the controller policy of
docs/install.md parsed from the guide. Needs neither the emulator nor a call log."""

from __future__ import annotations

import json

import pytest

from iam_policy import (
    Context,
    Operator,
    Policy,
    PolicyError,
    arn_match,
    controller_policy,
    controller_policy_template,
    substitute,
)

ACCOUNT = "111122223333"


def policy(*statements: dict) -> Policy:
    return Policy({"Version": "2012-10-17", "Statement": list(statements)})


def allow(action, resource="*", **condition) -> dict:
    statement = {"Effect": "Allow", "Action": action, "Resource": resource}
    if condition:
        statement["Condition"] = condition["Condition"]
    return statement


# -- the decision ----------------------------------------------------------------


def test_implicit_deny_when_no_statement_applies() -> None:
    p = policy(allow("s3:GetObject", "arn:aws:s3:::reports/*"))
    assert not p.evaluate("s3:PutObject", "arn:aws:s3:::reports/a.csv").allowed
    assert not p.evaluate("s3:GetObject", "arn:aws:s3:::other/a.csv").allowed
    d = p.evaluate("s3:GetObject", "arn:aws:s3:::reports/a.csv")
    assert d.allowed and not d.explicitly_denied


def test_an_explicit_deny_overrides_any_allow() -> None:
    p = policy(
        allow("ec2:*"),
        {"Effect": "Deny", "Action": "ec2:TerminateInstances", "Resource": "*"},
    )
    assert p.evaluate("ec2:RunInstances", "*").allowed
    d = p.evaluate("ec2:TerminateInstances", f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/i-1")
    assert not d.allowed and d.explicitly_denied
    assert "explicitly denied" in d.explain(Context())


def test_a_deny_whose_condition_fails_does_not_deny() -> None:
    # The documented "deny unless over TLS" pattern.
    p = policy(
        allow("sqs:*"),
        {"Effect": "Deny", "Action": "sqs:*", "Resource": "*",
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
    )
    assert p.evaluate("sqs:ReceiveMessage", "q", {"aws:SecureTransport": True}).allowed
    assert not p.evaluate("sqs:ReceiveMessage", "q", {"aws:SecureTransport": False}).allowed
    # Key missing: Bool is a positive operator, so the Deny does not apply.
    assert p.evaluate("sqs:ReceiveMessage", "q", {}).allowed


def test_not_action_allows_everything_else() -> None:
    p = policy({"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"})
    assert p.evaluate("s3:ListBucket", "*").allowed
    assert not p.evaluate("iam:CreateUser", "*").allowed


def test_not_resource() -> None:
    p = policy({"Effect": "Allow", "Action": "s3:*", "NotResource": "arn:aws:s3:::private/*"})
    assert p.evaluate("s3:GetObject", "arn:aws:s3:::public/x").allowed
    assert not p.evaluate("s3:GetObject", "arn:aws:s3:::private/x").allowed


def test_action_names_are_case_insensitive_and_take_wildcards() -> None:
    p = policy(allow("EC2:describe*"), allow("iam:?etRole"))
    assert p.evaluate("ec2:DescribeInstances", "*").allowed
    assert p.evaluate("iam:GetRole", "*").allowed
    assert not p.evaluate("iam:PassRole", "*").allowed
    assert not p.evaluate("ec2:RunInstances", "*").allowed


# -- resources ---------------------------------------------------------------------


def test_resource_wildcards() -> None:
    assert arn_match("*", "arn:aws:ec2:us-west-2:1:instance/i-1")
    assert arn_match("arn:aws:ec2:us-west-2:*:instance/*", "arn:aws:ec2:us-west-2:1:instance/i-1")
    assert not arn_match("arn:aws:ec2:us-west-2:*:instance/*", "arn:aws:ec2:us-east-1:1:instance/i-1")
    assert not arn_match("arn:aws:ec2:us-west-2:*:instance/*", "arn:aws:ec2:us-west-2:1:volume/vol-1")
    # Public images and snapshots have no account.
    assert arn_match("arn:aws:ec2:us-west-2::image/*", "arn:aws:ec2:us-west-2::image/ami-1")
    assert not arn_match("arn:aws:ec2:us-west-2::image/*", "arn:aws:ec2:us-west-2:1:image/ami-1")
    # A wildcard in one segment stays in it; in the resource it spans / and :.
    assert not arn_match("arn:aws:*:us-west-2:1:x", "arn:aws:ec2:x:us-west-2:1:x")
    assert arn_match("arn:aws:ssm:us-west-2::parameter/aws/service/*",
                     "arn:aws:ssm:us-west-2::parameter/aws/service/eks/optimized-ami/1.34/x:y")
    assert arn_match("arn:aws:iam::1:instance-profile/?ed*", "arn:aws:iam::1:instance-profile/red/blue")
    # Resource ARNs are case-sensitive.
    assert not arn_match("arn:aws:s3:::Reports/*", "arn:aws:s3:::reports/a")


# -- conditions ----------------------------------------------------------------------


def test_values_of_one_key_are_ored_keys_and_operators_anded() -> None:
    p = policy(allow("ec2:RunInstances", Condition={
        "StringEquals": {"aws:RequestTag/env": ["dev", "test"], "aws:RequestTag/team": "a"},
        "StringLike": {"aws:RequestTag/owner": "*@example.com"},
    }))
    ok = {"aws:RequestTag/env": "test", "aws:RequestTag/team": "a", "aws:RequestTag/owner": "x@example.com"}
    assert p.evaluate("ec2:RunInstances", "*", ok).allowed
    assert not p.evaluate("ec2:RunInstances", "*", {**ok, "aws:RequestTag/env": "prod"}).allowed
    assert not p.evaluate("ec2:RunInstances", "*", {**ok, "aws:RequestTag/team": "b"}).allowed
    assert not p.evaluate("ec2:RunInstances", "*", {**ok, "aws:RequestTag/owner": "x@other.org"}).allowed


def test_condition_key_names_are_case_insensitive_values_are_not() -> None:
    p = policy(allow("s3:GetObject", Condition={"StringEquals": {"AWS:RequestedRegion": "us-west-2"}}))
    assert p.evaluate("s3:GetObject", "*", {"aws:requestedregion": "us-west-2"}).allowed
    assert not p.evaluate("s3:GetObject", "*", {"aws:RequestedRegion": "US-WEST-2"}).allowed
    q = policy(allow("s3:GetObject", Condition={"StringEqualsIgnoreCase": {"aws:RequestedRegion": "US-West-2"}}))
    assert q.evaluate("s3:GetObject", "*", {"aws:RequestedRegion": "us-west-2"}).allowed


def test_string_like_star_matches_any_value_even_empty_but_not_a_missing_key() -> None:
    p = policy(allow("ec2:TerminateInstances", Condition={"StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}}))
    assert p.evaluate("ec2:TerminateInstances", "*", {"aws:ResourceTag/karpenter.sh/nodepool": "default"}).allowed
    assert p.evaluate("ec2:TerminateInstances", "*", {"aws:ResourceTag/karpenter.sh/nodepool": ""}).allowed
    d = p.evaluate("ec2:TerminateInstances", "*", {})
    assert not d.allowed
    assert "aws:ResourceTag/karpenter.sh/nodepool" in d.explain(Context({})) and "(missing)" in d.explain(Context({}))


def test_a_missing_key_fails_positive_operators_and_satisfies_negated_ones() -> None:
    for op, expected in [
        ("StringEquals", False), ("StringLike", False), ("NumericEquals", False), ("ArnLike", False),
        ("StringNotEquals", True), ("StringNotLike", True), ("ArnNotLike", True), ("NotIpAddress", True),
        ("StringEqualsIfExists", True), ("StringLikeIfExists", True),
    ]:
        p = policy(allow("s3:GetObject", Condition={op: {"aws:RequestTag/x": "1"}}))
        assert p.evaluate("s3:GetObject", "*", {}).allowed is expected, op


def test_if_exists_checks_a_present_key() -> None:
    p = policy(allow("ec2:CreateTags", Condition={"StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": "demo"}}))
    assert p.evaluate("ec2:CreateTags", "*", {"aws:RequestTag/eks:eks-cluster-name": "demo"}).allowed
    assert not p.evaluate("ec2:CreateTags", "*", {"aws:RequestTag/eks:eks-cluster-name": "other"}).allowed
    assert p.evaluate("ec2:CreateTags", "*", {}).allowed


def test_null() -> None:
    absent = policy(allow("ec2:RunInstances", Condition={"Null": {"aws:RequestTag/team": "true"}}))
    present = policy(allow("ec2:RunInstances", Condition={"Null": {"aws:RequestTag/team": "false"}}))
    assert absent.evaluate("ec2:RunInstances", "*", {}).allowed
    assert not absent.evaluate("ec2:RunInstances", "*", {"aws:RequestTag/team": "a"}).allowed
    assert present.evaluate("ec2:RunInstances", "*", {"aws:RequestTag/team": ""}).allowed
    assert not present.evaluate("ec2:RunInstances", "*", {}).allowed


def test_for_all_values_on_tag_keys() -> None:
    # Only the listed tag keys may be set; AWS warns that a request with no tags passes too.
    p = policy(allow("ec2:CreateTags", Condition={
        "ForAllValues:StringEquals": {"aws:TagKeys": ["Name", "karpenter.sh/nodeclaim"]}}))
    assert p.evaluate("ec2:CreateTags", "*", {"aws:TagKeys": ["Name"]}).allowed
    assert p.evaluate("ec2:CreateTags", "*", {"aws:TagKeys": ["Name", "karpenter.sh/nodeclaim"]}).allowed
    assert not p.evaluate("ec2:CreateTags", "*", {"aws:TagKeys": ["Name", "team"]}).allowed
    assert p.evaluate("ec2:CreateTags", "*", {}).allowed
    assert p.evaluate("ec2:CreateTags", "*", {"aws:TagKeys": []}).allowed


def test_for_any_value_on_tag_keys() -> None:
    p = policy(allow("ec2:CreateTags", Condition={"ForAnyValue:StringEquals": {"aws:TagKeys": ["team", "env"]}}))
    assert p.evaluate("ec2:CreateTags", "*", {"aws:TagKeys": ["Name", "env"]}).allowed
    assert not p.evaluate("ec2:CreateTags", "*", {"aws:TagKeys": ["Name"]}).allowed
    assert not p.evaluate("ec2:CreateTags", "*", {}).allowed
    # A negated operator: no tag key may be one of them.
    q = policy(allow("ec2:CreateTags", Condition={"ForAllValues:StringNotEquals": {"aws:TagKeys": ["owner"]}}))
    assert q.evaluate("ec2:CreateTags", "*", {"aws:TagKeys": ["Name"]}).allowed
    assert not q.evaluate("ec2:CreateTags", "*", {"aws:TagKeys": ["Name", "owner"]}).allowed


def test_a_multivalued_key_needs_a_set_operator() -> None:
    for op in ("StringEquals", "StringNotEquals", "StringLike", "StringNotEqualsIfExists"):
        p = policy(allow("ec2:CreateTags", Condition={op: {"aws:TagKeys": ["Name"]}}))
        assert not p.evaluate("ec2:CreateTags", "*", {"aws:TagKeys": ["Name"]}).allowed, op
        assert not p.evaluate("ec2:CreateTags", "*", {"aws:TagKeys": ["team"]}).allowed, op
        assert not p.evaluate("ec2:CreateTags", "*", {"aws:TagKeys": []}).allowed, op
    # Missing, a negated or IfExists operator still holds.
    q = policy(allow("ec2:CreateTags", Condition={"StringNotEquals": {"aws:TagKeys": ["Name"]}}))
    assert q.evaluate("ec2:CreateTags", "*", {}).allowed


def test_numeric_date_ip_and_arn_operators() -> None:
    p = policy(
        allow("s3:ListBucket", "arn:aws:s3:::b", Condition={"NumericLessThanEquals": {"s3:max-keys": "10"}}),
        allow("s3:GetObject", "*", Condition={"DateLessThan": {"aws:CurrentTime": "2030-01-01T00:00:00Z"},
                                               "IpAddress": {"aws:SourceIp": ["203.0.113.0/24", "2001:db8::/32"]}}),
        allow("sqs:SendMessage", "*", Condition={"ArnLike": {"aws:SourceArn": "arn:aws:events:*:*:rule/karpenter-*"}}),
    )
    assert p.evaluate("s3:ListBucket", "arn:aws:s3:::b", {"s3:max-keys": "10"}).allowed
    assert not p.evaluate("s3:ListBucket", "arn:aws:s3:::b", {"s3:max-keys": "11"}).allowed
    assert not p.evaluate("s3:ListBucket", "arn:aws:s3:::b", {"s3:max-keys": "many"}).allowed
    ctx = {"aws:CurrentTime": "2026-05-01T12:00:00Z", "aws:SourceIp": "203.0.113.9"}
    assert p.evaluate("s3:GetObject", "*", ctx).allowed
    assert p.evaluate("s3:GetObject", "*", {**ctx, "aws:SourceIp": "2001:db8::1"}).allowed
    assert not p.evaluate("s3:GetObject", "*", {**ctx, "aws:SourceIp": "198.51.100.1"}).allowed
    assert not p.evaluate("s3:GetObject", "*", {**ctx, "aws:CurrentTime": "2031-01-01T00:00:00Z"}).allowed
    rule = "arn:aws:events:us-west-2:1:rule/karpenter-spot"
    assert p.evaluate("sqs:SendMessage", "*", {"aws:SourceArn": rule}).allowed
    assert not p.evaluate("sqs:SendMessage", "*", {"aws:SourceArn": rule.replace("karpenter-", "x-")}).allowed
    # An ARN operator matches ARNs only: a value that is not one is matched by nothing.
    q = policy(allow("sqs:SendMessage", "*", Condition={"ArnNotLike": {"aws:SourceArn": "arn:*:*:*:*:*"}}))
    assert q.evaluate("sqs:SendMessage", "*", {"aws:SourceArn": "not-an-arn"}).allowed
    assert not q.evaluate("sqs:SendMessage", "*", {"aws:SourceArn": rule}).allowed


def test_ec2_tag_on_create() -> None:
    """The EC2 guide's pattern: CreateTags is allowed only as part of RunInstances, with the
    required tag; tagging an existing instance is not."""
    p = policy(
        allow("ec2:RunInstances", f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/*",
              Condition={"StringEquals": {"aws:RequestTag/environment": "production"}}),
        allow("ec2:CreateTags", f"arn:aws:ec2:us-east-1:{ACCOUNT}:*/*",
              Condition={"StringEquals": {"ec2:CreateAction": "RunInstances"}}),
    )
    new = f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/*"
    tags = {"aws:RequestTag/environment": "production", "aws:TagKeys": ["environment"]}
    assert p.evaluate("ec2:RunInstances", new, tags).allowed
    assert not p.evaluate("ec2:RunInstances", new, {"aws:RequestTag/environment": "dev"}).allowed
    assert p.evaluate("ec2:CreateTags", new, {**tags, "ec2:CreateAction": "RunInstances"}).allowed
    assert not p.evaluate("ec2:CreateTags", f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/i-1", tags).allowed


def test_pass_role_to_one_service() -> None:
    p = policy(allow("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/KarpenterNodeRole-demo",
                     Condition={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}))
    role = f"arn:aws:iam::{ACCOUNT}:role/KarpenterNodeRole-demo"
    assert p.evaluate("iam:PassRole", role, {"iam:PassedToService": "ec2.amazonaws.com"}).allowed
    assert not p.evaluate("iam:PassRole", role, {"iam:PassedToService": "lambda.amazonaws.com"}).allowed
    assert not p.evaluate("iam:PassRole", role + "2", {"iam:PassedToService": "ec2.amazonaws.com"}).allowed


def test_the_explanation_names_the_statement_and_the_failing_condition() -> None:
    p = policy({"Sid": "Tagged", **allow("ec2:CreateFleet", "*", Condition={
        "StringEquals": {"aws:RequestTag/kubernetes.io/cluster/demo": "owned"}})})
    ctx = Context({"aws:RequestTag/kubernetes.io/cluster/demo": "shared"})
    text = p.evaluate("ec2:CreateFleet", "*", ctx).explain(ctx)
    assert "Tagged" in text and '"owned"' in text and '"shared"' in text


def test_what_it_refuses_to_guess() -> None:
    with pytest.raises(PolicyError):
        Operator.parse("StringSortOf")
    with pytest.raises(PolicyError):
        Operator.parse("ForAnyValue:StringLikeIfExists")
    with pytest.raises(PolicyError):
        policy(allow("s3:GetObject", "arn:aws:s3:::home/${aws:username}/*"))
    with pytest.raises(PolicyError):
        policy({"Effect": "Allow", "Action": "s3:*", "NotAction": "iam:*", "Resource": "*"})
    with pytest.raises(PolicyError):
        policy({"Effect": "Allow", "Principal": "*", "Action": "s3:*", "Resource": "*"})
    with pytest.raises(PolicyError):
        Policy({"Version": "2008-10-17", "Statement": []})


# -- the install guide's policy ----------------------------------------------------


VARIABLES = {"AWS_PARTITION": "aws", "AWS_REGION": "us-west-2", "AWS_ACCOUNT_ID": ACCOUNT, "CLUSTER_NAME": "demo"}


def test_the_install_guide_has_one_controller_policy_with_known_variables() -> None:
    template = controller_policy_template()
    assert "sts:AssumeRoleWithWebIdentity" not in template
    p = controller_policy(VARIABLES)
    sids = [s.sid for s in p.statements]
    assert len(sids) == len(set(sids)) and not any(s.startswith("#") for s in sids), sids
    assert all(s.effect == "Allow" for s in p.statements)
    with pytest.raises(PolicyError, match="CLUSTER_NAME"):
        substitute(template, {k: v for k, v in VARIABLES.items() if k != "CLUSTER_NAME"})


def test_the_install_guide_policy_scopes_writes_to_the_cluster() -> None:
    p = controller_policy(VARIABLES)
    mine = {
        "aws:RequestedRegion": "us-west-2",
        "aws:ResourceTag/kubernetes.io/cluster/demo": "owned",
        "aws:ResourceTag/karpenter.sh/nodepool": "default",
    }
    instance = f"arn:aws:ec2:us-west-2:{ACCOUNT}:instance/i-0123"
    assert p.evaluate("ec2:TerminateInstances", instance, mine).allowed
    theirs = {**mine, "aws:ResourceTag/kubernetes.io/cluster/demo": "shared"}
    assert not p.evaluate("ec2:TerminateInstances", instance, theirs).allowed
    other = {k.replace("/demo", "/other"): v for k, v in mine.items()}
    assert not p.evaluate("ec2:TerminateInstances", instance, other).allowed
    assert not p.evaluate("ec2:DescribeInstances", "*", {"aws:RequestedRegion": "eu-west-1"}).allowed
    assert p.evaluate("ec2:DescribeInstances", "*", {"aws:RequestedRegion": "us-west-2"}).allowed
    assert not p.evaluate("iam:CreateRole", f"arn:aws:iam::{ACCOUNT}:role/x", {}).allowed
    json.dumps(p.document)  # plain JSON after substitution
