use k8s_openapi::api::core::v1::NodeSelectorRequirement;

use super::*;
use crate::apis::labels::{LABEL_ARCH, LABEL_INSTANCE_FAMILY};
use crate::scheduling::instancetypes::{Offering, Overhead};
use crate::scheduling::resources::Resources;

fn api_error(code: &str, message: &str) -> CloudProviderError {
    CloudProviderError::Api {
        operation: "CreateFleet",
        code: code.into(),
        message: message.into(),
        source: "injected".into(),
    }
}

#[test]
fn dry_run_answers_are_judged_as_upstream() {
    let judged = |call, code: &str, message: &str| judge(call, Err(&api_error(code, message)));
    assert_eq!(judged(Call::CreateFleet, "DryRunOperation", "Request would have succeeded"), Judgement::Pass);
    assert_eq!(judge(Call::CreateLaunchTemplate, Ok(())), Judgement::Pass);

    let Judgement::Fail(Verdict::Failed { reason, message }) = judged(
        Call::CreateFleet,
        "UnauthorizedOperation",
        "You are not authorized to perform this operation.",
    ) else {
        panic!("an authorization failure fails the validation")
    };
    assert_eq!(reason, "CreateFleetAuthCheckFailed");
    assert_eq!(
        message,
        "Controller isn't authorized to call ec2:CreateFleet: User is not authorized to perform this operation because no identity-based policy allows it"
    );
    let Judgement::Fail(Verdict::Failed { reason, message }) = judged(
        Call::RunInstances,
        "UnauthorizedOperation",
        "... with an explicit deny in a service control policy",
    ) else {
        panic!("an authorization failure fails the validation")
    };
    assert_eq!(reason, "RunInstancesAuthCheckFailed");
    assert!(message.ends_with("due to a service control policy"), "{message}");
    assert!(matches!(
        judged(Call::CreateLaunchTemplate, "UnauthorizedOperation", ""),
        Judgement::Fail(Verdict::Failed { reason: "CreateLaunchTemplateAuthCheckFailed", .. })
    ));

    let too_large = judged(
        Call::CreateLaunchTemplate,
        "InvalidUserData.Malformed",
        "User data is limited to 16384 bytes",
    );
    assert!(matches!(
        too_large,
        Judgement::Fail(Verdict::Failed { reason: "UserDataSizeLimitExceeded", .. })
    ));
    // Only CreateLaunchTemplate renders user data.
    assert_eq!(
        judged(Call::CreateFleet, "InvalidUserData.Malformed", "User data is limited to 16384 bytes"),
        Judgement::Unexpected
    );

    for code in ["RequestLimitExceeded", "InternalError", "ServiceUnavailable", "Unavailable", ""] {
        assert_eq!(judged(Call::CreateFleet, code, "busy"), Judgement::Retry, "{code}");
    }
    assert_eq!(
        judged(
            Call::RunInstances,
            "InvalidParameterValue",
            "Value (p) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name"
        ),
        Judgement::Retry
    );
    assert_eq!(
        judged(Call::CreateFleet, "InvalidParameterValue", "Invalid IAM Instance Profile name"),
        Judgement::Unexpected
    );
    assert_eq!(judged(Call::CreateFleet, "InvalidSubnetID.NotFound", "gone"), Judgement::Unexpected);
    assert_eq!(judge(Call::CreateFleet, Err(&CloudProviderError::Config("x".into()))), Judgement::Unexpected);
}

fn class(spec: serde_json::Value) -> EC2NodeClass {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
        "metadata": {"name": "default"},
        "spec": spec,
    }))
    .unwrap()
}

fn resolved(subnets: &[&str], amis: &[&str]) -> EC2NodeClassStatus {
    serde_json::from_value(serde_json::json!({
        "subnets": subnets.iter().map(|s| serde_json::json!({"id": s, "zone": "z"})).collect::<Vec<_>>(),
        "securityGroups": [{"id": "sg-1"}],
        "amis": amis.iter().map(|a| serde_json::json!({"id": a, "requirements": []})).collect::<Vec<_>>(),
        "instanceProfile": "profile",
    }))
    .unwrap()
}

#[test]
fn a_verdict_is_kept_while_what_it_was_made_from_stays_the_same() {
    let spec = serde_json::json!({
        "subnetSelectorTerms": [{"id": "subnet-1"}],
        "securityGroupSelectorTerms": [{"id": "sg-1"}],
        "amiSelectorTerms": [{"alias": "al2023@latest"}],
        "role": "r",
    });
    let base = class(spec.clone());
    let tags = BTreeMap::from([("k".to_string(), "v".to_string())]);
    let key = cache_key(&base, &resolved(&["subnet-1", "subnet-2"], &["ami-1"]), &tags);
    assert_eq!(key.len(), 16);
    // The order resources are resolved in does not matter.
    assert_eq!(key, cache_key(&base, &resolved(&["subnet-2", "subnet-1"], &["ami-1"]), &tags));
    // Anything else does.
    assert_ne!(key, cache_key(&base, &resolved(&["subnet-1"], &["ami-1"]), &tags));
    assert_ne!(key, cache_key(&base, &resolved(&["subnet-1", "subnet-2"], &["ami-2"]), &tags));
    assert_ne!(key, cache_key(&base, &resolved(&["subnet-1", "subnet-2"], &["ami-1"]), &BTreeMap::new()));
    let mut annotated = base.clone();
    annotated.metadata.annotations = Some(BTreeMap::from([("a".to_string(), "b".to_string())]));
    assert_ne!(key, cache_key(&annotated, &resolved(&["subnet-1", "subnet-2"], &["ami-1"]), &tags));
    let mut other_spec = spec;
    other_spec["role"] = "other".into();
    assert_ne!(key, cache_key(&class(other_spec), &resolved(&["subnet-1", "subnet-2"], &["ami-1"]), &tags));
}

fn it(name: &str, arch: &str, gpus: Option<&str>, price: f64) -> InstanceType {
    let mut reqs = Requirements::new();
    reqs.add(LABEL_ARCH, Requirement::in_values([arch]));
    reqs.add(LABEL_INSTANCE_FAMILY, Requirement::in_values([name.split('.').next().unwrap_or_default()]));
    match gpus {
        Some(n) => reqs.add(LABEL_INSTANCE_GPU_COUNT, Requirement::in_values([n])),
        None => reqs.add(LABEL_INSTANCE_GPU_COUNT, Requirement::does_not_exist()),
    }
    let offering = Offering::new("z", "on-demand", price, true);
    InstanceType::new(name, reqs, Resources::default(), Overhead::default(), vec![offering])
}

fn ami(id: &str, arch: &str, gpu: bool) -> AmiStatus {
    let req = |key: &str, op: &str, values: &[&str]| NodeSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    };
    let mut requirements = vec![req(LABEL_ARCH, "In", &[arch])];
    requirements.push(req(LABEL_INSTANCE_GPU_COUNT, if gpu { "Exists" } else { "DoesNotExist" }, &[]));
    AmiStatus { id: id.into(), requirements, ..Default::default() }
}

fn pool(requirements: serde_json::Value) -> NodePool {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": "p"},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": requirements,
        }}},
    }))
    .unwrap()
}

#[test]
fn the_type_validated_is_one_the_pools_could_launch_on_a_standard_ami() {
    let types = vec![
        it("g5.xlarge", "amd64", Some("1"), 0.05),
        it("m5.large", "amd64", None, 0.096),
        it("m6g.large", "arm64", None, 0.077),
        it("c6g.large", "arm64", None, 0.068),
        it("c5.large", "amd64", None, 0.085),
    ];
    let amis =
        vec![ami("ami-gpu", "amd64", true), ami("ami-x86", "amd64", false), ami("ami-arm", "arm64", false)];
    let pick = |pools: &[&NodePool], amis: &[AmiStatus]| {
        pick_instance_type(&types, pools, amis).map(|(it, ami)| (it.name.clone(), ami.id.clone()))
    };
    let name = |n: &str, a: &str| Some((n.to_string(), a.to_string()));

    // With no NodePool: m5.large or m6g.large, the cheaper.
    assert_eq!(pick(&[], &amis), name("m6g.large", "ami-arm"));
    // A pool's requirements choose among the types; the cheapest standard one wins over a GPU
    // type on a GPU AMI, however cheap.
    let amd = pool(serde_json::json!([{"key": LABEL_ARCH, "operator": "In", "values": ["amd64"]}]));
    assert_eq!(pick(&[&amd], &amis), name("c5.large", "ami-x86"));
    let gpu = pool(serde_json::json!([{"key": LABEL_INSTANCE_FAMILY, "operator": "In", "values": ["g5"]}]));
    assert_eq!(pick(&[&gpu], &amis), name("g5.xlarge", "ami-gpu"));
    // A type no AMI boots is never picked.
    assert_eq!(pick(&[&amd], &amis[2..]), None);
    assert_eq!(pick(&[], &amis[2..]), name("m6g.large", "ami-arm"));
    // A pool that matches none of the class's types: the fallbacks.
    let none = pool(serde_json::json!([{"key": LABEL_INSTANCE_FAMILY, "operator": "In", "values": ["x9"]}]));
    assert_eq!(pick(&[&none], &amis[1..2]), name("m5.large", "ami-x86"));
}

#[test]
fn the_condition_follows_the_state() {
    let previous = ValidationState::Decided(Verdict::failed(reasons::RUN_INSTANCES_AUTH_FAILED, "denied"))
        .condition(None, Some(1));
    assert_eq!(
        (previous.status, previous.reason.as_str()),
        (ConditionStatus::False, "RunInstancesAuthCheckFailed")
    );
    assert_eq!(previous.message, "Controller isn't authorized to call ec2:RunInstances: denied");
    let kept = ValidationState::Undecided.condition(Some(&previous), Some(2));
    assert_eq!((kept.reason.as_str(), kept.observed_generation), ("RunInstancesAuthCheckFailed", Some(2)));
    let ok = ValidationState::Decided(Verdict::Succeeded).condition(Some(&previous), Some(2));
    assert_eq!(
        (ok.status, ok.reason.as_str(), ok.message.as_str()),
        (ConditionStatus::True, "ValidationSucceeded", "")
    );
}

#[test]
fn a_class_whose_pools_may_launch_dedicated_instances_is_validated_dedicated() {
    let tenancy = |op: &str, values: &[&str]| {
        pool(serde_json::json!([{"key": LABEL_INSTANCE_TENANCY, "operator": op, "values": values}]))
    };
    assert!(!may_be_dedicated(&pool(serde_json::json!([]))));
    assert!(!may_be_dedicated(&tenancy("In", &["default"])));
    assert!(may_be_dedicated(&tenancy("In", &["default", "dedicated"])));
    assert!(may_be_dedicated(&tenancy("NotIn", &["default"])));
}
