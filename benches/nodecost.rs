//! The full cost of plans: what the nodes of a plan cost with what comes with every node (its
//! EBS root volume) and, on burstable (T) types, the surplus CPU credits their pods' requests
//! above the type's baseline would be charged in unlimited mode, against the list price alone.
//!
//! Prints a markdown table (docs/benchmarks.md, "Full cost of plans"): 1,000 pods of 250m / 256Mi
//! on the embedded EC2 catalog's on-demand amd64 types under 32 vCPUs, without and with a typical
//! EKS DaemonSet set, each planned three ways:
//!
//! - *list*: the types at their list price with their full CPU (upstream's rule, and
//!   `BURSTABLE_CPU=ignore` without node costs);
//! - *baseline*: full cost, burstable types planned at their baseline (`BURSTABLE_CPU=baseline`,
//!   the default);
//! - *unlimited*: full cost, burstable types at full CPU with their surplus priced
//!   (`BURSTABLE_CPU=unlimited`).
//!
//! Every plan is then costed the same way, in full: each NodeClaim's cheapest offering at list
//! price, its volumes, and the surplus credits of the CPU it requests (pods and DaemonSets) above
//! its type's baseline. The bound is the fractional lower bound (`scheduling::cost`) over the
//! types at full cost with burstable types at their baseline, the same for every rule. Prices do
//! not depend on the build: `cargo test --bench nodecost` prints the same table as
//! `cargo bench --bench nodecost`.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use karpenter::apis::ec2nodeclass::AmiFamily;
use karpenter::apis::labels::{
    ARCH_AMD64, CAPACITY_TYPE_ON_DEMAND, LABEL_ARCH, LABEL_CAPACITY_TYPE, LABEL_INSTANCE_CPU,
};
use karpenter::apis::pod::{Container, Pod, PodSpec};
use karpenter::apis::{NodeSelectorRequirementWithMinValues, Operator};
use karpenter::cloudprovider::aws::amifamily::default_block_device_mappings;
use karpenter::cloudprovider::aws::nodecost::{self, BurstableCpu, NodeCost};
use karpenter::scheduling::{
    InstanceType, NewNodeClaim, NodePoolInput, Requirements, SchedulingInput, SchedulingResults, cost,
    schedule,
};

fn pod(name: String, cpu: &str, memory: Option<&str>) -> Pod {
    let mut requests = vec![("cpu".to_string(), Quantity(cpu.into()))];
    if let Some(memory) = memory {
        requests.push(("memory".to_string(), Quantity(memory.into())));
    }
    let container = Container {
        name: "app".into(),
        resources: Some(ResourceRequirements {
            requests: Some(requests.into_iter().collect()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta { name: Some(name), namespace: Some("default".into()), ..Default::default() },
        spec: Some(PodSpec { containers: vec![container], ..Default::default() }),
        ..Default::default()
    }
}

/// A typical EKS node's DaemonSets, with their charts' usual requests: the VPC CNI (aws-node),
/// kube-proxy, the EBS CSI node plugin (three containers of 10m / 40Mi), a log agent (Fluent
/// Bit) and a metrics agent (the CloudWatch agent).
fn eks_daemonsets() -> Vec<Pod> {
    [
        ("aws-node", "25m", None),
        ("kube-proxy", "100m", None),
        ("ebs-csi-node", "30m", Some("120Mi")),
        ("fluent-bit", "100m", Some("128Mi")),
        ("cloudwatch-agent", "250m", Some("128Mi")),
    ]
    .into_iter()
    .map(|(name, cpu, memory)| pod(name.to_string(), cpu, memory))
    .collect()
}

fn requirement(key: &str, operator: Operator, values: &[&str]) -> NodeSelectorRequirementWithMinValues {
    NodeSelectorRequirementWithMinValues {
        key: key.into(),
        operator,
        values: values.iter().map(|v| v.to_string()).collect(),
        min_values: None,
    }
}

/// Each NodeClaim of `r` at its cheapest offering: (list price, full cost).
fn costed(claim: &NewNodeClaim, node: &NodeCost) -> Option<(f64, f64)> {
    let it = claim.instance_type_options.first()?;
    let o =
        it.compatible_offerings(&claim.requirements).min_by(|a, b| a.list_price.total_cmp(&b.list_price))?;
    let surplus = nodecost::surplus_per_hour(&it.name, claim.requests.cpu);
    Some((o.list_price, o.list_price + node.per_hour() + surplus))
}

fn main() {
    // The default EC2NodeClass's nodes (AL2023: a 20 GiB gp3 root volume), in subnets that give
    // no public IPv4 address.
    let node = NodeCost::of(&default_block_device_mappings(AmiFamily::AL2023), false);
    let catalog = match karpenter::cloudprovider::aws::embedded::instance_types() {
        Ok(types) => types,
        Err(e) => panic!("the embedded EC2 catalog: {e}"),
    };
    let reqs = vec![
        requirement(LABEL_CAPACITY_TYPE, Operator::In, &[CAPACITY_TYPE_ON_DEMAND]),
        requirement(LABEL_ARCH, Operator::In, &[ARCH_AMD64]),
        requirement(LABEL_INSTANCE_CPU, Operator::Lt, &["32"]),
    ];
    let pool_reqs = match Requirements::from_nodepool(&reqs) {
        Ok(r) => r,
        Err(e) => panic!("nodepool requirements: {e}"),
    };
    let planned = |mode: Option<BurstableCpu>| -> Vec<Arc<InstanceType>> {
        match mode {
            None => catalog.clone(),
            Some(mode) => {
                let priced: Vec<Arc<InstanceType>> =
                    catalog.iter().map(|t| Arc::new(nodecost::priced(t, &node, mode))).collect();
                nodecost::for_pool(&priced, &pool_reqs, mode)
            }
        }
    };
    let input = |types: Vec<Arc<InstanceType>>, daemonsets: &[Pod]| -> SchedulingInput {
        let np = match NodePoolInput::new("default", types).with_requirements(&reqs) {
            Ok(np) => np,
            Err(e) => panic!("nodepool requirements: {e}"),
        };
        SchedulingInput {
            pods: (0..1000).map(|i| Arc::new(pod(format!("pod-{i:05}"), "250m", Some("256Mi")))).collect(),
            nodepools: vec![np],
            daemonsets: daemonsets.to_vec(),
            ..Default::default()
        }
    };
    let rules = [
        ("list", None),
        ("baseline", Some(BurstableCpu::Baseline)),
        ("unlimited", Some(BurstableCpu::Unlimited)),
    ];
    eprintln!(
        "| pods | rule | nodes | types | list $/h | full $/h | bound $/h | full / bound | unschedulable |"
    );
    eprintln!("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |");
    for (workload, daemonsets) in
        [("1,000 × 250m / 256Mi", Vec::new()), ("the same, EKS DaemonSets", eks_daemonsets())]
    {
        let bound_input = input(planned(Some(BurstableCpu::Baseline)), &daemonsets);
        for (rule, mode) in rules {
            let inp = input(planned(mode), &daemonsets);
            let r: SchedulingResults = schedule(&inp);
            let (list, full) = r
                .new_node_claims
                .iter()
                .filter_map(|c| costed(c, &node))
                .fold((0.0, 0.0), |(l, f), (cl, cf)| (l + cl, f + cf));
            let bound = cost::fractional_lower_bound(&bound_input, &r);
            let mut types: Vec<&str> = r
                .new_node_claims
                .iter()
                .filter_map(|c| c.instance_type_names.first().map(String::as_str))
                .collect();
            types.sort_unstable();
            types.dedup();
            let shown = if types.len() > 3 {
                format!("{} and {} more", types[..3].join(", "), types.len() - 3)
            } else {
                types.join(", ")
            };
            eprintln!(
                "| {workload} | {rule} | {} | {shown} | {list:.2} | {full:.2} | {bound:.2} | {:.3} | {} |",
                r.new_node_claims.len(),
                full / bound,
                r.errors.len()
            );
        }
    }
}
