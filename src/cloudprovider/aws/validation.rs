//! Dry-run validation of an EC2NodeClass: upstream's `ValidationSucceeded` condition.
//!
//! Once a class's subnets, security groups, AMIs and instance profile are resolved, the
//! controller checks that it may launch from the class before any NodeClaim needs it, with the
//! three calls a launch makes, as upstream:
//!
//! 1. `CreateLaunchTemplate` (a real one, reused by later launches or deleted when unused) for
//!    one on-demand instance type the class's NodePools could launch;
//! 2. `CreateFleet` with `DryRun` for that type in every subnet of the class;
//! 3. `RunInstances` with `DryRun` from the template, one subnet after another until one passes.
//!
//! EC2 answers a dry run that would have been allowed with `DryRunOperation`.
//! `UnauthorizedOperation` makes the condition False (`CreateLaunchTemplateAuthCheckFailed`,
//! `CreateFleetAuthCheckFailed`, `RunInstancesAuthCheckFailed`), as does user data over EC2's
//! size limit (`UserDataSizeLimitExceeded`); the class is then not Ready and its NodePools
//! launch nothing. Throttling, server errors and a not-yet-visible instance profile are asked
//! again shortly; other errors keep the last condition and are reported. A verdict is kept for
//! [`VALIDATION_TTL`] unless what it was made from changes (the class's resolved resources,
//! spec, annotations and tags); with `DISABLE_DRY_RUN=true` no call is made and the condition is
//! True.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_ec2::types as ec2;
use sha2::{Digest, Sha256};

use super::fleet::select_ami;
use super::launch::NodeOfClaim;
use super::launchtemplate::ec2_tags;
use super::provider::AwsCloudProvider;
use super::sdk_error;
use crate::apis::ec2nodeclass::{
    AmiStatus, EC2NodeClass, EC2NodeClassStatus, InterfaceType, NetworkInterface,
};
use crate::apis::labels::{
    CAPACITY_TYPE_ON_DEMAND, LABEL_INSTANCE_ACCELERATOR_COUNT, LABEL_INSTANCE_GPU_COUNT,
    LABEL_INSTANCE_TENANCY, TENANCY_DEDICATED,
};
use crate::apis::{Condition, ConditionStatus, NodePool};
use crate::cloudprovider::CloudProviderError;
use crate::scheduling::instancetypes::{InstanceType, compare_price};
use crate::scheduling::requirements::{Requirement, Requirements};
use crate::scheduling::template_requirements;

/// How long a verdict is kept while what it was made from stays the same (upstream's).
pub const VALIDATION_TTL: Duration = Duration::from_secs(30 * 60);
/// When a validation that met throttling or a server error is tried again.
pub const RETRY_AFTER: Duration = Duration::from_secs(10);

/// Reasons of the `ValidationSucceeded` condition, as upstream's.
pub mod reasons {
    /// `ec2:CreateFleet` was refused.
    pub const CREATE_FLEET_AUTH_FAILED: &str = "CreateFleetAuthCheckFailed";
    /// `ec2:CreateLaunchTemplate` was refused.
    pub const CREATE_LAUNCH_TEMPLATE_AUTH_FAILED: &str = "CreateLaunchTemplateAuthCheckFailed";
    /// `ec2:RunInstances` was refused.
    pub const RUN_INSTANCES_AUTH_FAILED: &str = "RunInstancesAuthCheckFailed";
    /// The class's subnets, security groups, AMIs or instance profile are not resolved.
    pub const DEPENDENCIES_NOT_READY: &str = "DependenciesNotReady";
    /// EC2 refused the rendered user data as too large.
    pub const USER_DATA_TOO_LARGE: &str = "UserDataSizeLimitExceeded";
    /// No validation has decided yet.
    pub const AWAITING_RECONCILIATION: &str = "AwaitingReconciliation";
}

/// Message of [`reasons::DEPENDENCIES_NOT_READY`].
pub const DEPENDENCIES_MESSAGE: &str =
    "Awaiting AMI, Instance Profile, Security Group, and Subnet resolution";

/// What a validation decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The class can launch.
    Succeeded,
    /// It cannot, and why.
    Failed {
        /// The condition's reason.
        reason: &'static str,
        /// The condition's message.
        message: String,
    },
}

impl Verdict {
    fn failed(reason: &'static str, detail: &str) -> Self {
        let what = match reason {
            reasons::CREATE_FLEET_AUTH_FAILED => "Controller isn't authorized to call ec2:CreateFleet",
            reasons::CREATE_LAUNCH_TEMPLATE_AUTH_FAILED => {
                "Controller isn't authorized to call ec2:CreateLaunchTemplate"
            }
            reasons::RUN_INSTANCES_AUTH_FAILED => "Controller isn't authorized to call ec2:RunInstances",
            reasons::USER_DATA_TOO_LARGE => {
                "ec2:CreateLaunchTemplate rejected the rendered user data as too large"
            }
            _ => reason,
        };
        Verdict::Failed { reason, message: format!("{what}: {detail}") }
    }
}

/// What the `ValidationSucceeded` condition of a class is set from.
#[derive(Clone, Debug, PartialEq)]
pub enum ValidationState {
    /// The class's resources are not all resolved: False, [`reasons::DEPENDENCIES_NOT_READY`].
    DependenciesNotReady,
    /// A validation's verdict.
    Decided(Verdict),
    /// Nothing decided this time: the condition keeps its last value (Unknown at first).
    Undecided,
}

impl ValidationState {
    /// The condition (without transition time), given the class's previous one.
    pub fn condition(&self, previous: Option<&Condition>, generation: Option<i64>) -> Condition {
        let make = |status, reason: &str, message: &str| Condition {
            type_: super::nodeclass::conditions::VALIDATION_SUCCEEDED.to_string(),
            status,
            observed_generation: generation,
            last_transition_time: String::new(),
            reason: reason.to_string(),
            message: message.to_string(),
        };
        match self {
            ValidationState::DependenciesNotReady => {
                make(ConditionStatus::False, reasons::DEPENDENCIES_NOT_READY, DEPENDENCIES_MESSAGE)
            }
            ValidationState::Decided(Verdict::Succeeded) => {
                make(ConditionStatus::True, super::nodeclass::conditions::VALIDATION_SUCCEEDED, "")
            }
            ValidationState::Decided(Verdict::Failed { reason, message }) => {
                make(ConditionStatus::False, reason, message)
            }
            ValidationState::Undecided => match previous {
                Some(c) => Condition { observed_generation: generation, ..c.clone() },
                None => make(
                    ConditionStatus::Unknown,
                    reasons::AWAITING_RECONCILIATION,
                    "object is awaiting reconciliation",
                ),
            },
        }
    }
}

/// What one validation came to.
#[derive(Debug)]
pub enum Outcome {
    /// A verdict.
    Decided(Verdict),
    /// No verdict: a call failed in a way that says nothing about the class.
    Undecided {
        /// The failure.
        error: CloudProviderError,
        /// Whether it is throttling, a server error or eventual consistency (asked again after
        /// [`RETRY_AFTER`]) rather than something unexpected (retried with backoff, and reported).
        transient: bool,
    },
}

/// The calls a validation makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `ec2:CreateLaunchTemplate` (a real call).
    CreateLaunchTemplate,
    /// `ec2:CreateFleet` with `DryRun`.
    CreateFleet,
    /// `ec2:RunInstances` with `DryRun`.
    RunInstances,
}

impl Call {
    fn auth_reason(self) -> &'static str {
        match self {
            Call::CreateLaunchTemplate => reasons::CREATE_LAUNCH_TEMPLATE_AUTH_FAILED,
            Call::CreateFleet => reasons::CREATE_FLEET_AUTH_FAILED,
            Call::RunInstances => reasons::RUN_INSTANCES_AUTH_FAILED,
        }
    }
}

/// How the answer to one call counts.
#[derive(Clone, Debug, PartialEq)]
pub enum Judgement {
    /// Allowed: go on.
    Pass,
    /// The class cannot launch.
    Fail(Verdict),
    /// Throttled, a server error, or an instance profile EC2 does not see yet: ask again soon.
    Retry,
    /// An answer a validation does not expect.
    Unexpected,
}

/// Error codes of throttling and of EC2's server faults; an empty code is a call that got no
/// answer (a timeout, a dropped connection).
fn is_transient(code: &str) -> bool {
    matches!(
        code,
        "" | "RequestLimitExceeded"
            | "Throttling"
            | "ThrottlingException"
            | "InternalError"
            | "InternalFailure"
            | "ServiceUnavailable"
            | "Unavailable"
    )
}

/// The part of an authorization failure's message a condition shows, as upstream words it.
pub fn unauthorized_detail(message: &str) -> &'static str {
    if message.contains("with an explicit deny in a permissions boundary") {
        "User is not authorized to perform this operation due to a permission boundary"
    } else if message.contains("with an explicit deny in a service control policy") {
        "User is not authorized to perform this operation due to a service control policy"
    } else if message.contains("Not authorized for images") {
        "User is not authorized for AMI used in instance launch"
    } else {
        "User is not authorized to perform this operation because no identity-based policy allows it"
    }
}

/// How the answer of `call` counts.
pub fn judge(call: Call, answer: Result<(), &CloudProviderError>) -> Judgement {
    let Err(error) = answer else { return Judgement::Pass };
    let CloudProviderError::Api { code, message, .. } = error else { return Judgement::Unexpected };
    match code.as_str() {
        "DryRunOperation" => Judgement::Pass,
        "UnauthorizedOperation" => {
            Judgement::Fail(Verdict::failed(call.auth_reason(), unauthorized_detail(message)))
        }
        "InvalidUserData.Malformed"
            if call == Call::CreateLaunchTemplate && message.contains("User data is limited to") =>
        {
            Judgement::Fail(Verdict::failed(
                reasons::USER_DATA_TOO_LARGE,
                "Rendered user data exceeds the EC2 user data size limit",
            ))
        }
        // The profile in the status exists (it was resolved): EC2 does not see it yet.
        "InvalidParameterValue"
            if call == Call::RunInstances && message.contains("Invalid IAM Instance Profile name") =>
        {
            Judgement::Retry
        }
        code if is_transient(code) => Judgement::Retry,
        _ => Judgement::Unexpected,
    }
}

/// The key a verdict is kept under: a digest of what it was made from.
pub fn cache_key(
    class: &EC2NodeClass,
    status: &EC2NodeClassStatus,
    tags: &BTreeMap<String, String>,
) -> String {
    let mut subnets: Vec<&str> = status.subnets.iter().map(|s| s.id.as_str()).collect();
    let mut groups: Vec<&str> = status.security_groups.iter().map(|g| g.id.as_str()).collect();
    let mut amis: Vec<&str> = status.amis.iter().map(|a| a.id.as_str()).collect();
    subnets.sort_unstable();
    groups.sort_unstable();
    amis.sort_unstable();
    let input = serde_json::json!([
        subnets,
        groups,
        amis,
        status.instance_profile,
        class.spec,
        class.metadata.annotations,
        tags,
    ]);
    let digest = Sha256::digest(input.to_string().as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Whether an AMI is of the standard variant (no GPU, no accelerator), whose snapshot the
/// class's block devices are sized for.
fn is_standard(ami: &AmiStatus) -> bool {
    let Ok(reqs) = Requirements::from_node_selector(&ami.requirements) else { return false };
    let mut standard = Requirements::new();
    standard.add(LABEL_INSTANCE_GPU_COUNT, Requirement::does_not_exist());
    standard.add(LABEL_INSTANCE_ACCELERATOR_COUNT, Requirement::does_not_exist());
    reqs.intersects(&standard).is_ok()
}

/// The instance type a validation launches (and its AMI): one the class's `pools` could launch
/// (or, with none, `m5.large` or `m6g.large` when the class serves them), with an AMI of the
/// class, a standard AMI's first, cheapest on-demand first.
pub fn pick_instance_type<'a>(
    types: &'a [InstanceType],
    pools: &[&NodePool],
    amis: &'a [AmiStatus],
) -> Option<(&'a InstanceType, &'a AmiStatus)> {
    let wanted: Vec<Requirements> = pools.iter().filter_map(|np| template_requirements(np).ok()).collect();
    let mut candidates: Vec<&InstanceType> =
        types.iter().filter(|it| wanted.iter().any(|r| it.requirements.intersects(r).is_ok())).collect();
    if candidates.is_empty() {
        candidates = types.iter().filter(|it| matches!(it.name.as_str(), "m5.large" | "m6g.large")).collect();
    }
    if candidates.is_empty() {
        candidates = types.iter().collect();
    }
    let mut on_demand = Requirements::new();
    on_demand
        .add(crate::apis::labels::LABEL_CAPACITY_TYPE, Requirement::in_values([CAPACITY_TYPE_ON_DEMAND]));
    let mut usable: Vec<(&InstanceType, &AmiStatus)> =
        candidates.into_iter().filter_map(|it| select_ami(amis, it).map(|ami| (it, ami))).collect();
    usable.sort_by(|(a, a_ami), (b, b_ami)| {
        is_standard(b_ami)
            .cmp(&is_standard(a_ami))
            .then_with(|| compare_price(a.cheapest_price(&on_demand), b.cheapest_price(&on_demand)))
            .then_with(|| a.name.cmp(&b.name))
    });
    usable.into_iter().next()
}

/// Whether the NodePool `np` asks for dedicated instances among others (upstream validates such a
/// class's launches as dedicated).
pub fn may_be_dedicated(np: &NodePool) -> bool {
    template_requirements(np)
        .is_ok_and(|reqs| reqs.get(LABEL_INSTANCE_TENANCY).is_some_and(|r| r.has(TENANCY_DEDICATED)))
}

/// Upstream's log line when a validation fails for `reason`.
fn log_message(reason: &str) -> &'static str {
    match reason {
        reasons::CREATE_FLEET_AUTH_FAILED => "unauthorized to call ec2:CreateFleet",
        reasons::CREATE_LAUNCH_TEMPLATE_AUTH_FAILED => "unauthorized to call ec2:CreateLaunchTemplate",
        reasons::RUN_INSTANCES_AUTH_FAILED => "unauthorized to call ec2:RunInstances",
        _ => "ec2:CreateLaunchTemplate rejected the rendered user data as exceeding the size limit",
    }
}

/// Maps the answer of a call to the outcome that ends a validation, or `None` to go on.
fn settle(call: Call, answer: Result<(), CloudProviderError>) -> Option<Outcome> {
    let error = answer.err()?;
    match judge(call, Err(&error)) {
        Judgement::Pass => None,
        Judgement::Fail(verdict) => Some(Outcome::Decided(verdict)),
        Judgement::Retry => Some(Outcome::Undecided { error, transient: true }),
        Judgement::Unexpected => Some(Outcome::Undecided { error, transient: false }),
    }
}

impl AwsCloudProvider {
    /// Validates that the controller may launch from `class`, whose resolved resources are in
    /// `status` (all of them present), for the NodePools `pools` that use it. A verdict is kept
    /// (see the module's documentation).
    pub async fn validate_node_class(
        &self,
        class: &EC2NodeClass,
        status: &EC2NodeClassStatus,
        pools: &[&NodePool],
    ) -> Outcome {
        let name = class.metadata.name.clone().unwrap_or_default();
        let tags = self.launch_tags(class, "");
        let key = cache_key(class, status, &tags);
        if let Some((kept, verdict)) = self.validations.get(&name)
            && kept == key
        {
            return Outcome::Decided(verdict);
        }
        let outcome = if self.options.disable_dry_run {
            Outcome::Decided(Verdict::Succeeded)
        } else {
            self.dry_run(class, status, pools, &tags).await
        };
        if let Outcome::Decided(Verdict::Failed { reason, message }) = &outcome {
            tracing::error!(ec2nodeclass = %name, reason, message, "{}", log_message(reason));
        }
        if let Outcome::Decided(verdict) = &outcome {
            self.validations.insert(name, (key, verdict.clone()));
        }
        outcome
    }

    /// Forgets the verdicts about the class `name` (deleted).
    pub fn forget_validation(&self, name: &str) {
        self.validations.remove(&name.to_string());
    }

    async fn dry_run(
        &self,
        class: &EC2NodeClass,
        status: &EC2NodeClassStatus,
        pools: &[&NodePool],
        tags: &BTreeMap<String, String>,
    ) -> Outcome {
        let unexpected = |error| Outcome::Undecided { error, transient: false };
        let group = self.placement_group_of(class).ok().flatten();
        let types = match self.instance_types_for_status(&class.spec, status, group.as_ref()).await {
            Ok(types) => types,
            Err(error) => return Outcome::Undecided { error, transient: true },
        };
        let Some((it, ami)) = pick_instance_type(&types, pools, &status.amis) else {
            return unexpected(CloudProviderError::Config(
                "no instance type of the class can boot one of its AMIs".to_string(),
            ));
        };
        let node = NodeOfClaim::validation(pools.iter().any(|np| may_be_dedicated(np)));
        let template = match self.launch_template(
            &node,
            class,
            status,
            &ami.id,
            CAPACITY_TYPE_ON_DEMAND,
            it.capacity.pods,
            0,
        ) {
            Ok(template) => template.in_reservation(self.options.reserved_capacity, None),
            Err(error) => return unexpected(error),
        };
        let created = self.launch_templates.ensure(&template).await;
        let template_name = template.name();
        if let Some(outcome) = settle(Call::CreateLaunchTemplate, created.map(|_| ())) {
            return outcome;
        }
        if let Some(outcome) = settle(
            Call::CreateFleet,
            self.dry_run_fleet(class.spec.context.as_deref(), status, it, &template_name, tags).await,
        ) {
            return outcome;
        }
        // One subnet that passes is enough; otherwise the first subnet's answer decides.
        let mut first_error = None;
        for subnet in &status.subnets {
            match self
                .dry_run_instance(&subnet.id, it, &template_name, &class.spec.network_interfaces, tags)
                .await
            {
                Ok(()) => return Outcome::Decided(Verdict::Succeeded),
                Err(e) if judge(Call::RunInstances, Err(&e)) == Judgement::Pass => {
                    return Outcome::Decided(Verdict::Succeeded);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error
            .and_then(|e| settle(Call::RunInstances, Err(e)))
            .unwrap_or(Outcome::Decided(Verdict::Succeeded))
    }

    /// CreateFleet with `DryRun` for `it` in every subnet of the class, from the template.
    async fn dry_run_fleet(
        &self,
        context: Option<&str>,
        status: &EC2NodeClassStatus,
        it: &InstanceType,
        template: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<(), CloudProviderError> {
        let mut config = ec2::FleetLaunchTemplateConfigRequest::builder().launch_template_specification(
            ec2::FleetLaunchTemplateSpecificationRequest::builder()
                .launch_template_name(template)
                .version("$Latest")
                .build(),
        );
        for subnet in &status.subnets {
            config = config.overrides(
                ec2::FleetLaunchTemplateOverridesRequest::builder()
                    .instance_type(ec2::InstanceType::from(it.name.as_str()))
                    .subnet_id(&subnet.id)
                    .build(),
            );
        }
        self.fleet_request(tags, CAPACITY_TYPE_ON_DEMAND, vec![config.build()])
            .set_context(context.map(str::to_string))
            .dry_run(true)
            .customize()
            .config_override(super::no_retries())
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sdk_error("CreateFleet", e))
    }

    /// RunInstances with `DryRun` of one `it` in `subnet` from the template, with the class's
    /// network interfaces (else the primary one) in that subnet, as upstream's validation.
    async fn dry_run_instance(
        &self,
        subnet: &str,
        it: &InstanceType,
        template: &str,
        interfaces: &[NetworkInterface],
        tags: &BTreeMap<String, String>,
    ) -> Result<(), CloudProviderError> {
        let primary = [NetworkInterface {
            network_card_index: 0,
            device_index: 0,
            interface_type: InterfaceType::Interface,
        }];
        let configured = !interfaces.is_empty();
        let interfaces = if configured { interfaces } else { &primary[..] };
        let interfaces: Vec<ec2::InstanceNetworkInterfaceSpecification> = interfaces
            .iter()
            .map(|n| {
                let spec = ec2::InstanceNetworkInterfaceSpecification::builder()
                    .device_index(n.device_index)
                    .subnet_id(subnet);
                if configured {
                    spec.network_card_index(n.network_card_index)
                        .interface_type(n.interface_type.as_str())
                        .build()
                } else {
                    spec.build()
                }
            })
            .collect();
        let mut request = self
            .clients
            .ec2
            .run_instances()
            .dry_run(true)
            .min_count(1)
            .max_count(1)
            .launch_template(
                ec2::LaunchTemplateSpecification::builder()
                    .launch_template_name(template)
                    .version("$Latest")
                    .build(),
            )
            .instance_type(ec2::InstanceType::from(it.name.as_str()))
            .set_network_interfaces(Some(interfaces));
        for resource in
            [ec2::ResourceType::Instance, ec2::ResourceType::Volume, ec2::ResourceType::NetworkInterface]
        {
            request = request.tag_specifications(
                ec2::TagSpecification::builder()
                    .resource_type(resource)
                    .set_tags(Some(ec2_tags(tags)))
                    .build(),
            );
        }
        request
            .customize()
            .config_override(super::no_retries())
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sdk_error("RunInstances", e))
    }
}

#[cfg(test)]
mod tests;
