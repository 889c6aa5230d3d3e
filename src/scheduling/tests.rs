//! Scenario tests of the scheduler.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::apis::pod::{Container, Pod, PodSpec};
use k8s_openapi::api::core::v1::{
    Affinity, ContainerPort, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PodAffinity, PodAffinityTerm, PodAntiAffinity, PreferredSchedulingTerm, ResourceRequirements, Toleration,
    TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use rstest::rstest;

use crate::apis::labels::*;
use crate::apis::{NodeSelectorRequirementWithMinValues, Operator, Taint, TaintEffect};

use super::resources::{CPU, MEMORY, PODS};
use super::*;

pub(crate) const GI: i64 = 1 << 30;

pub(crate) fn instance_type(
    name: &str,
    cpu: i64,
    mem_gi: i64,
    pods: i64,
    zones: &[&str],
    price: f64,
) -> Arc<InstanceType> {
    let mut offerings = Vec::new();
    for z in zones {
        offerings.push(Offering::new(z.to_string(), "on-demand", price, true));
        offerings.push(Offering::new(z.to_string(), "spot", price * 0.5, true));
    }
    let labels: BTreeMap<String, String> = [
        (LABEL_ARCH.to_string(), ARCH_AMD64.to_string()),
        (LABEL_OS.to_string(), "linux".to_string()),
        (LABEL_INSTANCE_CPU.to_string(), cpu.to_string()),
        (LABEL_INSTANCE_FAMILY.to_string(), name.split('.').next().unwrap_or(name).to_string()),
    ]
    .into();
    Arc::new(InstanceType::new(
        name,
        Requirements::from_labels(&labels),
        Resources::from_pairs([(CPU, cpu * 1000), (MEMORY, mem_gi * GI), (PODS, pods)]),
        Overhead::default(),
        offerings,
    ))
}

/// Sizes 1, 2, 4, 8, 16 vCPU in zones z1..z3, price proportional to size.
pub(crate) fn standard_types() -> Vec<Arc<InstanceType>> {
    [1, 2, 4, 8, 16]
        .iter()
        .map(|c| instance_type(&format!("m.{c}x"), *c, 2 * c, 10 * c, &["z1", "z2", "z3"], 0.1 * *c as f64))
        .collect()
}

pub(crate) fn pod(name: &str, cpu: &str, mem: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            labels: Some([("app".to_string(), name.to_string())].into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(
                        [
                            ("cpu".to_string(), Quantity(cpu.into())),
                            ("memory".to_string(), Quantity(mem.into())),
                        ]
                        .into(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn spec(p: &mut Pod) -> &mut PodSpec {
    p.spec.get_or_insert_with(Default::default)
}

pub(crate) fn with_label(mut p: Pod, k: &str, v: &str) -> Pod {
    p.metadata.labels.get_or_insert_with(Default::default).insert(k.into(), v.into());
    p
}

fn with_node_selector(mut p: Pod, k: &str, v: &str) -> Pod {
    spec(&mut p).node_selector.get_or_insert_with(Default::default).insert(k.into(), v.into());
    p
}

fn with_toleration(mut p: Pod, key: &str) -> Pod {
    spec(&mut p).tolerations.get_or_insert_with(Default::default).push(Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        ..Default::default()
    });
    p
}

fn selector(k: &str, v: &str) -> LabelSelector {
    LabelSelector { match_labels: Some([(k.to_string(), v.to_string())].into()), match_expressions: None }
}

pub(crate) fn with_spread(mut p: Pod, key: &str, group: &str, hard: bool) -> Pod {
    p = with_label(p, "group", group);
    spec(&mut p).topology_spread_constraints.get_or_insert_with(Default::default).push(
        TopologySpreadConstraint {
            max_skew: 1,
            topology_key: key.into(),
            when_unsatisfiable: if hard { "DoNotSchedule" } else { "ScheduleAnyway" }.into(),
            label_selector: Some(selector("group", group)),
            ..Default::default()
        },
    );
    p
}

fn term(key: &str, group: &str) -> PodAffinityTerm {
    PodAffinityTerm {
        topology_key: key.into(),
        label_selector: Some(selector("group", group)),
        ..Default::default()
    }
}

pub(crate) fn with_anti_affinity(mut p: Pod, key: &str, group: &str) -> Pod {
    p = with_label(p, "group", group);
    spec(&mut p).affinity.get_or_insert_with(Default::default).pod_anti_affinity = Some(PodAntiAffinity {
        required_during_scheduling_ignored_during_execution: Some(vec![term(key, group)]),
        ..Default::default()
    });
    p
}

pub(crate) fn with_affinity(mut p: Pod, key: &str, group: &str) -> Pod {
    p = with_label(p, "group", group);
    spec(&mut p).affinity.get_or_insert_with(Default::default).pod_affinity = Some(PodAffinity {
        required_during_scheduling_ignored_during_execution: Some(vec![term(key, group)]),
        ..Default::default()
    });
    p
}

fn nsr(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: Some(values.iter().map(|v| v.to_string()).collect()),
    }
}

fn with_node_affinity(
    mut p: Pod,
    required: Vec<Vec<NodeSelectorRequirement>>,
    preferred: Vec<(i32, Vec<NodeSelectorRequirement>)>,
) -> Pod {
    let na = NodeAffinity {
        required_during_scheduling_ignored_during_execution: (!required.is_empty()).then(|| NodeSelector {
            node_selector_terms: required
                .into_iter()
                .map(|e| NodeSelectorTerm { match_expressions: Some(e), match_fields: None })
                .collect(),
        }),
        preferred_during_scheduling_ignored_during_execution: (!preferred.is_empty()).then(|| {
            preferred
                .into_iter()
                .map(|(w, e)| PreferredSchedulingTerm {
                    weight: w,
                    preference: NodeSelectorTerm { match_expressions: Some(e), match_fields: None },
                })
                .collect()
        }),
    };
    spec(&mut p).affinity.get_or_insert_with(Affinity::default).node_affinity = Some(na);
    p
}

fn with_host_port(mut p: Pod, port: i32) -> Pod {
    spec(&mut p).containers[0].ports =
        Some(vec![ContainerPort { container_port: port, host_port: Some(port), ..Default::default() }]);
    p
}

fn pool(name: &str) -> NodePoolInput {
    NodePoolInput::new(name, standard_types())
}

fn pool_req(name: &str, key: &str, op: Operator, values: &[&str]) -> NodePoolInput {
    pool(name)
        .with_requirements(&[NodeSelectorRequirementWithMinValues {
            key: key.into(),
            operator: op,
            values: values.iter().map(|v| v.to_string()).collect(),
            min_values: None,
        }])
        .unwrap()
}

/// Shares each value, as the scheduler's input holds pods and nodes.
pub(super) fn shared<T>(values: Vec<T>) -> Vec<Arc<T>> {
    values.into_iter().map(Arc::new).collect()
}

fn input(pods: Vec<Pod>, pools: Vec<NodePoolInput>) -> SchedulingInput {
    SchedulingInput { pods: shared(pods), nodepools: pools, ..Default::default() }
}

fn pods_n(n: usize, f: impl Fn(Pod) -> Pod) -> Vec<Pod> {
    (0..n).map(|i| f(pod(&format!("p{i:03}"), "1", "1Gi"))).collect()
}

fn error_of(r: &SchedulingResults) -> String {
    r.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(" | ")
}

#[test]
fn packs_small_pods_onto_one_cheapest_node() {
    let r = schedule(&input(pods_n(3, |p| p), vec![pool("default")]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(r.new_node_claims.len(), 1);
    let c = &r.new_node_claims[0];
    assert_eq!(c.pods.len(), 3);
    assert_eq!(c.instance_type_names[0], "m.4x");
    assert_eq!(c.requests.cpu, 3000);
    assert_eq!(c.labels.get(LABEL_NODEPOOL).map(String::as_str), Some("default"));
    assert!(!c.requirements.has(LABEL_HOSTNAME));
    assert!(c.node_selector_requirements().iter().any(|r| r.key == LABEL_INSTANCE_TYPE));
}

#[test]
fn init_container_larger_than_containers_sizes_the_node() {
    let mut p = pod("init", "500m", "512Mi");
    spec(&mut p).init_containers = Some(vec![Container {
        name: "init".into(),
        resources: Some(ResourceRequirements {
            requests: Some([("cpu".to_string(), Quantity("3".into()))].into()),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    let r = schedule(&input(vec![p], vec![pool("default")]));
    assert_eq!(r.new_node_claims[0].requests.cpu, 3000);
    assert_eq!(r.new_node_claims[0].instance_type_names[0], "m.4x");
}

#[rstest]
#[case::capacity_type(
    pool_req("od", LABEL_CAPACITY_TYPE, Operator::In, &["on-demand"]),
    with_node_selector(pod("a", "1", "1Gi"), LABEL_CAPACITY_TYPE, "spot"),
    "nodepool \"od\": incompatible requirements, key karpenter.sh/capacity-type, spot not in [on-demand]"
)]
#[case::too_big(
    pool("default"),
    pod("a", "70", "2Gi"),
    "nodepool \"default\": no instance type fits cpu 70, memory 2Gi"
)]
#[case::taint(
    NodePoolInput { taints: vec![Taint { key: "dedicated".into(), value: Some("gpu".into()), effect: TaintEffect::NoSchedule, time_added: None }], ..pool("gpu") },
    pod("a", "1", "1Gi"),
    "nodepool \"gpu\": untolerated taint dedicated=gpu:NoSchedule"
)]
#[case::custom_label(
    pool("default"),
    with_node_selector(pod("a", "1", "1Gi"), "team", "a"),
    "nodepool \"default\": incompatible requirements, label team does not have known values"
)]
#[case::limits(
    NodePoolInput { remaining_limits: Some([("cpu".to_string(), 500)].into()), ..pool("small") },
    pod("a", "100m", "1Gi"),
    "nodepool \"small\": would exceed nodepool limits cpu (500m left, the smallest instance type needs 1)"
)]
#[case::limits_leave_only_smaller_types(
    NodePoolInput { remaining_limits: Some([("cpu".to_string(), 4000)].into()), ..pool("default") },
    pod("a", "8", "1Gi"),
    "nodepool \"default\": no instance type fits cpu 8, memory 1Gi (types that would exceed nodepool limits cpu left out)"
)]
#[case::does_not_exist(
    pool_req("np", "team", Operator::DoesNotExist, &[]),
    with_node_selector(pod("a", "1", "1Gi"), "team", "x"),
    "nodepool \"np\": incompatible requirements, key team, x not in no value"
)]
fn unschedulable_reasons(#[case] np: NodePoolInput, #[case] p: Pod, #[case] want: &str) {
    let r = schedule(&input(vec![p], vec![np]));
    assert!(r.new_node_claims.is_empty());
    assert_eq!(error_of(&r), want);
}

#[test]
fn tolerated_taint_schedules() {
    let np = NodePoolInput { taints: vec![Taint::new("dedicated", TaintEffect::NoSchedule)], ..pool("gpu") };
    let r = schedule(&input(vec![with_toleration(pod("a", "1", "1Gi"), "dedicated")], vec![np]));
    assert!(r.errors.is_empty());
    assert_eq!(r.new_node_claims[0].taints.len(), 1);
}

#[test]
fn heavier_nodepool_first_until_its_limit() {
    let heavy = NodePoolInput {
        weight: 10,
        remaining_limits: Some([("cpu".to_string(), 4000)].into()),
        ..pool("heavy")
    };
    let light = pool("light");
    let pods: Vec<Pod> =
        (0..6).map(|i| with_anti_affinity(pod(&format!("p{i}"), "1", "1Gi"), LABEL_HOSTNAME, "x")).collect();
    let r = schedule(&input(pods, vec![light, heavy]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    let heavy_claims: Vec<&NewNodeClaim> =
        r.new_node_claims.iter().filter(|c| c.nodepool == "heavy").collect();
    // One pod per node; the heavy pool may only hold 4 vCPU of capacity in total.
    let heavy_cpu: i64 = heavy_claims
        .iter()
        .map(|c| c.instance_type_options.iter().map(|it| it.capacity.cpu).max().unwrap())
        .sum();
    assert!(heavy_cpu <= 4000, "heavy pool over its limit: {heavy_cpu}");
    assert!(!heavy_claims.is_empty());
    assert_eq!(r.new_node_claims.len(), 6);
    assert_eq!(r.new_node_claims[0].nodepool, "heavy");
    assert!(r.new_node_claims.iter().any(|c| c.nodepool == "light"));
}

#[test]
fn daemonset_overhead_only_where_tolerated() {
    let tainted = NodePoolInput {
        weight: 1,
        taints: vec![Taint::new("dedicated", TaintEffect::NoSchedule)],
        ..pool("tainted")
    };
    let plain = pool("plain");
    let ds = with_toleration(pod("ds", "500m", "256Mi"), "other");
    let pods = vec![
        with_toleration(pod("t", "1", "1Gi"), "dedicated"),
        with_node_selector(pod("p", "1", "1Gi"), LABEL_NODEPOOL, "plain"),
    ];
    let r = schedule(&SchedulingInput { daemonsets: vec![ds], ..input(pods, vec![tainted, plain]) });
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    let by_pool: BTreeMap<&str, &NewNodeClaim> =
        r.new_node_claims.iter().map(|c| (c.nodepool.as_str(), c)).collect();
    assert_eq!(by_pool["tainted"].daemonset_requests.cpu, 0);
    assert_eq!(by_pool["tainted"].requests.cpu, 1000);
    assert_eq!(by_pool["plain"].daemonset_requests.cpu, 500);
    assert_eq!(by_pool["plain"].requests.cpu, 1500);
    // The daemonset overhead pushes the plain claim past the 1 vCPU type.
    assert_eq!(by_pool["plain"].instance_type_names[0], "m.2x");
}

#[test]
fn self_anti_affinity_forces_one_pod_per_node() {
    let r =
        schedule(&input(pods_n(5, |p| with_anti_affinity(p, LABEL_HOSTNAME, "web")), vec![pool("default")]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(r.new_node_claims.len(), 5);
    assert!(r.new_node_claims.iter().all(|c| c.pods.len() == 1));
    // The claims may launch as the same types: they share one list of them.
    let first = &r.new_node_claims[0];
    assert!(!first.instance_type_options.is_empty());
    for c in &r.new_node_claims[1..] {
        assert!(Arc::ptr_eq(&c.instance_type_options, &first.instance_type_options));
        assert_eq!(c.instance_type_names, first.instance_type_names);
    }
}

#[test]
fn hostname_spread_puts_max_skew_pods_per_node() {
    let r =
        schedule(&input(pods_n(4, |p| with_spread(p, LABEL_HOSTNAME, "web", true)), vec![pool("default")]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(r.new_node_claims.len(), 4);
}

fn zone_of(c: &NewNodeClaim) -> String {
    c.requirements.get(LABEL_TOPOLOGY_ZONE).and_then(|r| r.single()).unwrap_or("?").to_string()
}

#[test]
fn zonal_spread_balances_zones() {
    let pods = (0..9)
        .map(|i| with_spread(pod(&format!("p{i}"), "4", "1Gi"), LABEL_TOPOLOGY_ZONE, "web", true))
        .collect();
    let r = schedule(&input(pods, vec![pool("default")]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
    for c in &r.new_node_claims {
        *per_zone.entry(zone_of(c)).or_default() += c.pods.len();
    }
    assert_eq!(per_zone, [("z1".to_string(), 3), ("z2".to_string(), 3), ("z3".to_string(), 3)].into());
}

#[test]
fn zonal_spread_counts_existing_pods() {
    let existing = ExistingNode {
        name: "n1".into(),
        labels: [
            (LABEL_TOPOLOGY_ZONE.to_string(), "z1".to_string()),
            (LABEL_HOSTNAME.to_string(), "n1".to_string()),
        ]
        .into(),
        initialized: true,
        allocatable: Resources::from_pairs([(CPU, 0), (MEMORY, 0), (PODS, 0)]),
        pods: shared(vec![with_label(pod("old", "1", "1Gi"), "group", "web")]),
        ..Default::default()
    };
    let pods = (0..2)
        .map(|i| with_spread(pod(&format!("p{i}"), "1", "1Gi"), LABEL_TOPOLOGY_ZONE, "web", true))
        .collect();
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![existing]),
        ..input(pods, vec![pool("default")])
    });
    let zones: Vec<String> = r.new_node_claims.iter().map(zone_of).collect();
    assert!(!zones.contains(&"z1".to_string()), "{zones:?}");
}

#[test]
fn zonal_self_affinity_keeps_one_zone() {
    let pods =
        (0..6).map(|i| with_affinity(pod(&format!("p{i}"), "6", "1Gi"), LABEL_TOPOLOGY_ZONE, "db")).collect();
    let r = schedule(&input(pods, vec![pool("default")]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert!(r.new_node_claims.len() >= 3);
    let zones: std::collections::BTreeSet<String> = r.new_node_claims.iter().map(zone_of).collect();
    assert_eq!(zones.len(), 1, "{zones:?}");
}

#[test]
fn affinity_to_missing_pods_fails() {
    let p = with_affinity(with_label(pod("a", "1", "1Gi"), "group", "me"), LABEL_TOPOLOGY_ZONE, "db");
    // The selector is group=db but the pod is labelled group=db by the helper: rewrite to another group.
    let mut p = p;
    p.metadata.labels.get_or_insert_with(Default::default).insert("group".into(), "other".into());
    let r = schedule(&input(vec![p], vec![pool("default")]));
    assert!(error_of(&r).contains("pod affinity"), "{}", error_of(&r));
}

fn existing_node(name: &str, cpu: i64) -> ExistingNode {
    ExistingNode {
        name: name.into(),
        labels: [
            (LABEL_HOSTNAME.to_string(), name.to_string()),
            (LABEL_TOPOLOGY_ZONE.to_string(), "z1".to_string()),
            (LABEL_NODEPOOL.to_string(), "default".to_string()),
        ]
        .into(),
        initialized: true,
        allocatable: Resources::from_pairs([(CPU, cpu * 1000), (MEMORY, 8 * GI), (PODS, 20)]),
        ..Default::default()
    }
}

#[test]
fn a_copy_of_a_scheduled_node_is_seen_as_edited() {
    // What the scheduler derives from a node is kept with it; a clone starts afresh.
    let pods = vec![with_node_selector(pod("p", "1", "1Gi"), "tier", "web")];
    let n = Arc::new(existing_node("n1", 4));
    let r =
        schedule(&SchedulingInput { existing_nodes: vec![Arc::clone(&n)], ..input(pods.clone(), vec![]) });
    assert_eq!(r.errors.len(), 1, "n1 has no tier label");
    let mut web = (*n).clone();
    web.labels.to_mut().insert("tier".into(), "web".into());
    let r = schedule(&SchedulingInput { existing_nodes: shared(vec![web]), ..input(pods, vec![]) });
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(r.existing_placements.len(), 1);
}

#[test]
fn existing_nodes_are_used_first() {
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![existing_node("n1", 2)]),
        ..input(pods_n(3, |p| p), vec![pool("default")])
    });
    assert_eq!(r.existing_placements.len(), 1);
    assert_eq!(r.existing_placements[0].pods.len(), 2);
    assert_eq!(r.new_node_claims.len(), 1);
    assert_eq!(r.new_node_claims[0].pods.len(), 1);
}

#[rstest]
#[case::ephemeral_on_new_node(false, "node.kubernetes.io/not-ready", TaintEffect::NoSchedule, true)]
#[case::ephemeral_on_ready_node(true, "node.kubernetes.io/not-ready", TaintEffect::NoSchedule, false)]
#[case::startup_on_new_node(false, "example.com/startup", TaintEffect::NoSchedule, true)]
#[case::real_taint(false, "dedicated", TaintEffect::NoSchedule, false)]
#[case::prefer(true, "soft", TaintEffect::PreferNoSchedule, true)]
fn existing_node_taints(
    #[case] initialized: bool,
    #[case] key: &str,
    #[case] effect: TaintEffect,
    #[case] lands: bool,
) {
    let mut n = existing_node("n1", 4);
    n.initialized = initialized;
    n.taints = vec![Taint::new(key, effect)];
    n.startup_taints = vec![Taint::new("example.com/startup", TaintEffect::NoSchedule)];
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![n]),
        ..input(pods_n(1, |p| p), vec![pool("default")])
    });
    assert_eq!(r.existing_placements.len() == 1, lands);
}

#[test]
fn existing_node_labels_are_strict() {
    // A custom label the node lacks denies the pod; NotIn on it is fine.
    let n = existing_node("n1", 4);
    let pods = vec![with_node_selector(pod("a", "1", "1Gi"), "team", "x")];
    let r = schedule(&SchedulingInput { existing_nodes: shared(vec![n.clone()]), ..input(pods, vec![]) });
    assert_eq!(r.errors.len(), 1);
    let pods =
        vec![with_node_affinity(pod("a", "1", "1Gi"), vec![vec![nsr("team", "NotIn", &["x"])]], vec![])];
    let r = schedule(&SchedulingInput { existing_nodes: shared(vec![n]), ..input(pods, vec![]) });
    assert_eq!(r.existing_placements.len(), 1);
}

#[test]
fn inverse_anti_affinity_of_existing_pods() {
    let mut n = existing_node("n1", 8);
    n.pods = shared(vec![with_anti_affinity(pod("guard", "1", "1Gi"), LABEL_HOSTNAME, "web")]);
    // The new pod is selected by the guard's anti-affinity (group=web) but has none itself.
    let p = with_label(pod("w", "1", "1Gi"), "group", "web");
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![n.clone()]),
        ..input(vec![p], vec![pool("default")])
    });
    assert!(r.existing_placements.is_empty());
    assert_eq!(r.new_node_claims.len(), 1);
    // An unrelated pod may land there.
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![n]),
        ..input(vec![pod("x", "1", "1Gi")], vec![pool("default")])
    });
    assert_eq!(r.existing_placements.len(), 1);
}

#[test]
fn host_keyed_affinities_on_existing_nodes() {
    // n1 and n2 hold a web pod (web pods keep apart by host), n3 a db pod, n4 nothing.
    let holding = |name: &str, p: Pod| {
        let mut n = existing_node(name, 8);
        n.pods = shared(vec![p]);
        n
    };
    let web = |name: &str| with_anti_affinity(pod(name, "1", "1Gi"), LABEL_HOSTNAME, "web");
    let nodes = vec![
        holding("n1", web("w1")),
        holding("n2", web("w2")),
        holding("n3", with_label(pod("db", "1", "1Gi"), "group", "db")),
        existing_node("n4", 8),
    ];
    let mut near_db = with_affinity(pod("near-db", "1", "1Gi"), LABEL_HOSTNAME, "db");
    near_db.metadata.labels.get_or_insert_with(Default::default).insert("group".into(), "near".into());
    let pods = vec![web("w3"), web("w4"), near_db];
    let r =
        schedule(&SchedulingInput { existing_nodes: shared(nodes), ..input(pods, vec![pool("default")]) });
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert!(r.new_node_claims.is_empty());
    let on = |index: usize| {
        r.existing_placements
            .iter()
            .find(|pl| pl.pods.iter().any(|p| p.index == index))
            .map(|pl| pl.node.as_str())
    };
    let (w3, w4) = (on(0), on(1));
    assert!(matches!(w3, Some("n3" | "n4")) && matches!(w4, Some("n3" | "n4")) && w3 != w4, "{w3:?} {w4:?}");
    assert_eq!(on(2), Some("n3"), "next to the db pod");
}

#[rstest]
#[case::followed_first(true)]
#[case::follower_first(false)]
fn a_pod_placed_on_an_existing_node_counts_for_the_affinity_of_others_in_the_batch(#[case] db_first: bool) {
    // The db pod has no constraint of its own; the near pod must share its host. With an empty
    // existing node, both land there, in either order of the input.
    let mut near = with_affinity(pod("near", "1", "1Gi"), LABEL_HOSTNAME, "db");
    near.metadata.labels.get_or_insert_with(Default::default).insert("group".into(), "near".into());
    let db = with_label(pod("db", "2", "1Gi"), "group", "db");
    let pods = if db_first { vec![db, near] } else { vec![near, db] };
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![existing_node("n1", 8)]),
        ..input(pods, vec![pool("default")])
    });
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert!(r.new_node_claims.is_empty());
    assert_eq!(r.existing_placements.len(), 1);
    assert_eq!(r.existing_placements[0].pods.len(), 2, "both on n1");
}

#[test]
fn a_node_too_full_for_one_pod_of_a_class_is_tried_for_the_next() {
    // Both pods have the same constraints; the larger one, placed first, does not fit n1 and gets a
    // claim; the smaller one still goes to n1.
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![existing_node("n1", 2)]),
        ..input(vec![pod("big", "3", "1Gi"), pod("small", "1", "1Gi")], vec![pool("default")])
    });
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(r.new_node_claims.len(), 1);
    assert_eq!(r.existing_placements.len(), 1);
    assert_eq!(r.existing_placements[0].pods.len(), 1);
    assert_eq!(r.existing_placements[0].pods[0].index, 1, "the small pod on n1");
}

#[test]
fn a_node_waiting_for_the_pod_an_affinity_needs_is_tried_again() {
    // Two pods that must share a host with a db pod are tried before it (they are larger): n1 has
    // none yet, so neither can go anywhere. Once the db pod lands on n1, the retry puts both there.
    let near = |name: &str| {
        let mut p = with_affinity(pod(name, "2", "1Gi"), LABEL_HOSTNAME, "db");
        p.metadata.labels.get_or_insert_with(Default::default).insert("group".into(), "near".into());
        p
    };
    let db = with_label(pod("db", "1", "1Gi"), "group", "db");
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![existing_node("n1", 8)]),
        ..input(vec![near("near-1"), near("near-2"), db], vec![pool("default")])
    });
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert!(r.new_node_claims.is_empty());
    assert_eq!(r.existing_placements.len(), 1);
    assert_eq!(r.existing_placements[0].pods.len(), 3, "all on n1");
}

#[test]
fn nodes_that_keep_a_class_away_are_skipped_and_the_rest_still_taken() {
    // 130 nodes (more than two words of the bit set): every other one holds a web pod, web pods
    // keep apart by host. The pending web pods take the empty nodes, one each, then new claims.
    let nodes: Vec<ExistingNode> = (0..130)
        .map(|i| {
            let mut n = existing_node(&format!("n{i:03}"), 4);
            if i % 2 == 0 {
                n.pods = shared(vec![with_anti_affinity(
                    pod(&format!("old{i}"), "1", "1Gi"),
                    LABEL_HOSTNAME,
                    "web",
                )]);
            }
            n
        })
        .collect();
    let pods = (0..70)
        .map(|i| with_anti_affinity(pod(&format!("w{i}"), "1", "1Gi"), LABEL_HOSTNAME, "web"))
        .collect();
    let r =
        schedule(&SchedulingInput { existing_nodes: shared(nodes), ..input(pods, vec![pool("default")]) });
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    let used: Vec<&str> = r.existing_placements.iter().map(|pl| pl.node.as_str()).collect();
    assert_eq!(used.len(), 65, "every empty node once");
    assert!(r.existing_placements.iter().all(|pl| pl.pods.len() == 1));
    assert!(used.iter().all(|n| n[1..].parse::<usize>().is_ok_and(|i| i % 2 == 1)), "{used:?}");
    assert_eq!(r.new_node_claims.len(), 5);
}

#[test]
fn inverse_anti_affinity_within_the_batch() {
    let guard = with_anti_affinity(pod("guard", "2", "1Gi"), LABEL_HOSTNAME, "web");
    let mut guard = guard;
    guard.metadata.labels.get_or_insert_with(Default::default).insert("group".into(), "guard".into());
    let web = with_label(pod("web", "1", "1Gi"), "group", "web");
    let r = schedule(&input(vec![guard, web], vec![pool("default")]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(r.new_node_claims.len(), 2);
}

#[test]
fn host_ports_conflict() {
    let pods = vec![
        with_host_port(pod("a", "1", "1Gi"), 80),
        with_host_port(pod("b", "1", "1Gi"), 80),
        with_host_port(pod("c", "1", "1Gi"), 81),
    ];
    let r = schedule(&input(pods, vec![pool("default")]));
    assert_eq!(r.new_node_claims.len(), 2);
    let mut n = existing_node("n1", 8);
    n.pods = shared(vec![with_host_port(pod("old", "1", "1Gi"), 80)]);
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![n]),
        ..input(vec![with_host_port(pod("a", "1", "1Gi"), 80)], vec![pool("default")])
    });
    assert!(r.existing_placements.is_empty());
}

#[test]
fn preferences_are_relaxed() {
    // Preferred zone that does not exist, and a ScheduleAnyway spread on a key nobody has.
    let p = with_node_affinity(
        pod("a", "1", "1Gi"),
        vec![],
        vec![(10, vec![nsr(LABEL_TOPOLOGY_ZONE, "In", &["nowhere"])])],
    );
    let p = with_spread(p, "example.com/rack", "g", false);
    let r = schedule(&input(vec![p], vec![pool("default")]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    // A satisfiable preference is honoured.
    let p = with_node_affinity(
        pod("b", "1", "1Gi"),
        vec![],
        vec![(1, vec![nsr(LABEL_TOPOLOGY_ZONE, "In", &["z2"])])],
    );
    let r = schedule(&input(vec![p], vec![pool("default")]));
    assert_eq!(zone_of(&r.new_node_claims[0]), "z2");
}

#[test]
fn required_terms_are_ored() {
    let p = with_node_affinity(
        pod("a", "1", "1Gi"),
        vec![
            vec![nsr(LABEL_TOPOLOGY_ZONE, "In", &["nowhere"])],
            vec![nsr(LABEL_TOPOLOGY_ZONE, "In", &["z3"])],
        ],
        vec![],
    );
    let r = schedule(&input(vec![p], vec![pool("default")]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(zone_of(&r.new_node_claims[0]), "z3");
}

#[test]
fn numeric_requirements() {
    let p =
        with_node_affinity(pod("a", "1", "1Gi"), vec![vec![nsr(LABEL_INSTANCE_CPU, "Gt", &["4"])]], vec![]);
    let r = schedule(&input(vec![p], vec![pool("default")]));
    assert_eq!(r.new_node_claims[0].instance_type_names, vec!["m.8x".to_string(), "m.16x".to_string()]);
}

#[rstest]
#[case(MinValuesPolicy::Strict, 3, false)]
#[case(MinValuesPolicy::BestEffort, 3, true)]
#[case(MinValuesPolicy::Strict, 2, true)]
fn min_values(#[case] policy: MinValuesPolicy, #[case] min: i32, #[case] schedules: bool) {
    let np = pool("default")
        .with_requirements(&[NodeSelectorRequirementWithMinValues {
            key: LABEL_INSTANCE_CPU.into(),
            operator: Operator::Exists,
            values: Default::default(),
            min_values: Some(min),
        }])
        .unwrap();
    // 12 vCPU fits only the 16 and... nothing else: 1 type; 7 vCPU fits 8 and 16: 2 types.
    let mut inp = input(vec![pod("a", "7", "1Gi")], vec![np]);
    inp.options.min_values_policy = policy;
    let r = schedule(&inp);
    assert_eq!(r.errors.is_empty(), schedules, "{}", error_of(&r));
    if schedules {
        assert_eq!(r.new_node_claims[0].min_values_relaxed, min == 3);
    }
}

#[test]
fn instance_type_list_is_truncated_cheapest_first() {
    let np = NodePoolInput::new(
        "default",
        (1..=100).map(|i| instance_type(&format!("t.{i:03}"), i, 2 * i, 100, &["z1"], i as f64)).collect(),
    );
    let mut inp = input(vec![pod("a", "1", "1Gi")], vec![np]);
    inp.options.max_instance_types = 10;
    let r = schedule(&inp);
    let c = &r.new_node_claims[0];
    assert_eq!(c.instance_type_names.len(), 10);
    assert_eq!(c.instance_type_names[0], "t.001");
    assert_eq!(c.instance_type_options.len(), 100);
}

#[test]
fn deterministic() {
    let pods: Vec<Pod> = (0..40)
        .map(|i| {
            let p = pod(&format!("p{i}"), ["100m", "1", "2"][i % 3], "512Mi");
            match i % 4 {
                0 => with_spread(p, LABEL_TOPOLOGY_ZONE, "a", true),
                1 => with_anti_affinity(p, LABEL_HOSTNAME, "b"),
                2 => with_affinity(p, LABEL_TOPOLOGY_ZONE, "c"),
                _ => p,
            }
        })
        .collect();
    let inp =
        input(pods, vec![pool("default"), pool_req("spot", LABEL_CAPACITY_TYPE, Operator::In, &["spot"])]);
    let a = schedule(&inp);
    let b = schedule(&inp);
    let summary = |r: &SchedulingResults| {
        r.new_node_claims
            .iter()
            .map(|c| (c.nodepool.clone(), c.instance_type_names.clone(), c.pods.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(summary(&a), summary(&b));
    assert!(a.errors.is_empty(), "{}", error_of(&a));
}

fn with_preferred(mut p: Pod, anti: bool, key: &str, group: &str) -> Pod {
    use k8s_openapi::api::core::v1::WeightedPodAffinityTerm;
    let terms = Some(vec![WeightedPodAffinityTerm { weight: 50, pod_affinity_term: term(key, group) }]);
    let aff = spec(&mut p).affinity.get_or_insert_with(Default::default);
    if anti {
        aff.pod_anti_affinity = Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: terms,
            ..Default::default()
        });
    } else {
        aff.pod_affinity = Some(PodAffinity {
            preferred_during_scheduling_ignored_during_execution: terms,
            ..Default::default()
        });
    }
    p
}

#[test]
fn preferred_anti_affinity_spreads_while_it_can() {
    let pods = pods_n(3, |p| with_preferred(with_label(p, "group", "web"), true, LABEL_HOSTNAME, "web"));
    let r = schedule(&input(pods.clone(), vec![pool("default")]));
    assert_eq!(r.new_node_claims.len(), 3);
    // Without NodePools, both land on the one existing node once the preference is relaxed.
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![existing_node("n1", 8)]),
        ..input(pods, vec![])
    });
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(r.existing_placements[0].pods.len(), 3);
}

#[test]
fn a_pod_with_dra_claims_gets_no_capacity_and_says_why() {
    let mut p = pod("gpu", "1", "1Gi");
    spec(&mut p).resource_claims = Some(vec![
        serde_json::from_value(serde_json::json!({"name": "gpu", "resourceClaimTemplateName": "gpu"}))
            .unwrap(),
    ]);
    let r = schedule(&input(vec![p, pod("plain", "1", "1Gi")], vec![pool("default")]));
    assert_eq!(r.new_node_claims.len(), 1);
    assert_eq!(r.new_node_claims[0].pods.len(), 1, "only the plain pod");
    assert!(error_of(&r).contains(crate::scheduling::scheduler::DRA_UNSUPPORTED), "{}", error_of(&r));
}

#[test]
fn pods_upstream_would_not_validate_are_reported_as_ignored() {
    let mut missing_claim = pod("missing-claim", "1", "1Gi");
    spec(&mut missing_claim).volumes = Some(vec![
        serde_json::from_value(
            serde_json::json!({"name": "data", "persistentVolumeClaim": {"claimName": "gone"}}),
        )
        .unwrap(),
    ]);
    let mut dra = pod("dra", "1", "1Gi");
    spec(&mut dra).resource_claims = Some(vec![
        serde_json::from_value(serde_json::json!({"name": "gpu", "resourceClaimTemplateName": "gpu"}))
            .unwrap(),
    ]);
    let r = schedule(&input(vec![missing_claim, dra, pod("plain", "1", "1Gi")], vec![pool("default")]));
    assert_eq!(r.errors.len(), 2, "{}", error_of(&r));
    let ignored: Vec<&str> = r.ignored.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(ignored, ["missing-claim"], "a DRA pod is a scheduling error upstream, not ignored");
    assert_eq!(r.ignored[0].index, 0);
}

#[test]
fn preference_policy_ignore_leaves_every_preference_out() {
    use crate::scheduling::{PreferencePolicy, SchedulerOptions};
    let ignore =
        SchedulerOptions { preference_policy: PreferencePolicy::Ignore, ..SchedulerOptions::default() };
    // Preferred anti-affinity on hostname: three nodes when respected, one when ignored.
    let pods = pods_n(3, |p| with_preferred(with_label(p, "group", "web"), true, LABEL_HOSTNAME, "web"));
    let r = schedule(&SchedulingInput { options: ignore.clone(), ..input(pods, vec![pool("default")]) });
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(r.new_node_claims.len(), 1, "the preferred anti-affinity is ignored");
    // A satisfiable preferred zone is not honoured either: the claim may go to any zone.
    let p = with_node_affinity(
        pod("b", "1", "1Gi"),
        vec![],
        vec![(1, vec![nsr(LABEL_TOPOLOGY_ZONE, "In", &["z2"])])],
    );
    let r = schedule(&SchedulingInput { options: ignore.clone(), ..input(vec![p], vec![pool("default")]) });
    let plain = schedule(&input(vec![pod("b", "1", "1Gi")], vec![pool("default")]));
    assert_eq!(
        zone_of(&r.new_node_claims[0]),
        zone_of(&plain.new_node_claims[0]),
        "as without the preference"
    );
    assert_ne!(zone_of(&r.new_node_claims[0]), "z2");
    // A ScheduleAnyway hostname spread of three pods: one node.
    let pods = pods_n(3, |p| with_spread(with_label(p, "group", "g"), LABEL_HOSTNAME, "g", false));
    let respected = schedule(&input(pods.clone(), vec![pool("default")]));
    let ignored = schedule(&SchedulingInput { options: ignore, ..input(pods, vec![pool("default")]) });
    assert_eq!((respected.new_node_claims.len(), ignored.new_node_claims.len()), (3, 1));
}

#[test]
fn unsatisfiable_preferred_affinity_is_relaxed() {
    let p = with_preferred(with_label(pod("a", "1", "1Gi"), "group", "me"), false, LABEL_TOPOLOGY_ZONE, "db");
    let r = schedule(&input(vec![p], vec![pool("default")]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
}

fn gpu_type(name: &str, gpus: i64, category: &str) -> Arc<InstanceType> {
    let labels: BTreeMap<String, String> = [
        (LABEL_ARCH.to_string(), ARCH_AMD64.to_string()),
        (LABEL_INSTANCE_CATEGORY.to_string(), category.to_string()),
        (LABEL_INSTANCE_GPU_MANUFACTURER.to_string(), "nvidia".to_string()),
    ]
    .into();
    let mut capacity = Resources::from_pairs([(CPU, 8000), (MEMORY, 32 * GI), (PODS, 50)]);
    capacity.set(RESOURCE_NVIDIA_GPU, gpus);
    Arc::new(InstanceType::new(
        name,
        Requirements::from_labels(&labels),
        capacity,
        Overhead::default(),
        vec![Offering::new("z1", "on-demand", gpus as f64, true)],
    ))
}

#[test]
fn nodepool_from_the_api_object_with_extended_resource_limits() {
    let np: crate::apis::NodePool =
        serde_saphyr::from_str(include_str!("../../examples/nodepool-gpu.yaml")).expect("example parses");
    let mut usage = Resources::default();
    usage.set(RESOURCE_NVIDIA_GPU, 6);
    let types = vec![gpu_type("g.1", 1, "g"), gpu_type("g.4", 4, "g"), gpu_type("m.0", 0, "m")];
    let input_pool = NodePoolInput::from_nodepool(&np, types, &usage).expect("valid nodepool");
    assert_eq!(input_pool.remaining_limits, Some([(RESOURCE_NVIDIA_GPU.to_string(), 2)].into()));
    assert!(input_pool.requirements.allows("workload", "gpu"));
    // The node class's label, as upstream: claims carry it and pods may select it.
    let class = &np.spec.template.spec.node_class_ref.name;
    assert!(input_pool.requirements.allows("karpenter.k8s.aws/ec2nodeclass", class));
    assert!(!input_pool.requirements.allows("karpenter.k8s.aws/ec2nodeclass", "another"));
    // And the pool's own name.
    let name = np.metadata.name.clone().unwrap_or_default();
    assert_eq!(input_pool.requirements.get(LABEL_NODEPOOL).and_then(|r| r.single()), Some(name.as_str()));

    let gpu_pod = |name: &str| {
        let mut p = with_toleration(pod(name, "1", "1Gi"), RESOURCE_NVIDIA_GPU);
        let res = spec(&mut p).containers[0].resources.get_or_insert_with(Default::default);
        res.limits = Some([(RESOURCE_NVIDIA_GPU.to_string(), Quantity("1".into()))].into());
        with_anti_affinity(p, LABEL_HOSTNAME, "train")
    };
    let r = schedule(&input(vec![gpu_pod("a"), gpu_pod("b"), gpu_pod("c")], vec![input_pool]));
    // Two GPUs of headroom: two single-GPU nodes, then the limit.
    assert_eq!(r.new_node_claims.len(), 2, "{}", error_of(&r));
    for c in &r.new_node_claims {
        assert_eq!(c.instance_type_names, vec!["g.1".to_string()]);
        assert_eq!(c.labels.get("workload").map(String::as_str), Some("gpu"));
        assert_eq!(c.labels.get("karpenter.k8s.aws/ec2nodeclass"), Some(class));
    }
    assert_eq!(
        error_of(&r),
        "nodepool \"gpu\": would exceed nodepool limits nvidia.com/gpu (0 left, the smallest instance type needs 1)"
    );
}

#[test]
fn nodes_limit_counts_nodeclaims() {
    let np = NodePoolInput {
        remaining_limits: Some([(super::resources::NODES.to_string(), 2)].into()),
        ..pool("two")
    };
    let r = schedule(&input(pods_n(3, |p| with_anti_affinity(p, LABEL_HOSTNAME, "x")), vec![np]));
    assert_eq!(r.new_node_claims.len(), 2);
    assert_eq!(
        error_of(&r),
        "nodepool \"two\": would exceed nodepool limits nodes (0 left, the smallest instance type needs 1)"
    );
}

#[test]
fn min_domains_caps_pods_per_zone() {
    let pods = (0..4)
        .map(|i| {
            let mut p = with_spread(pod(&format!("p{i}"), "4", "1Gi"), LABEL_TOPOLOGY_ZONE, "web", true);
            if let Some(c) = spec(&mut p).topology_spread_constraints.as_mut() {
                c[0].min_domains = Some(5);
            }
            p
        })
        .collect();
    let r = schedule(&input(pods, vec![pool("default")]));
    assert_eq!(r.new_node_claims.len(), 3);
    assert_eq!(
        error_of(&r),
        "nodepool \"default\": would violate topology spread constraint on topology.kubernetes.io/zone (maxSkew 1, counting pods group=web)"
    );
}

#[test]
fn schedule_anyway_spread_relaxes_on_existing_nodes() {
    let pods = pods_n(2, |p| with_spread(p, LABEL_HOSTNAME, "web", false));
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![existing_node("n1", 8)]),
        ..input(pods.clone(), vec![])
    });
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(r.existing_placements[0].pods.len(), 2);
    // With DoNotSchedule and nowhere else to go, the second pod stays pending.
    let hard = pods_n(2, |p| with_spread(p, LABEL_HOSTNAME, "web", true));
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![existing_node("n1", 8), existing_node("n2", 8)]),
        ..input(hard, vec![])
    });
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(r.existing_placements.len(), 2);
    // Once both nodes hold one, the minimum is one and a third fits with skew 1.
    let three = pods_n(3, |p| with_spread(p, LABEL_HOSTNAME, "web", true));
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![existing_node("n1", 8), existing_node("n2", 8)]),
        ..input(three.clone(), vec![])
    });
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    // A third, empty node keeps the minimum at zero: the third pod goes there.
    let r = schedule(&SchedulingInput {
        existing_nodes: shared(vec![existing_node("n1", 8), existing_node("n2", 8), existing_node("n3", 8)]),
        ..input(three, vec![])
    });
    assert_eq!(r.existing_placements.len(), 3);
}

#[test]
fn zonal_spread_picks_a_zone_the_pod_can_launch_in() {
    // Small types everywhere; the only type big enough is offered in z2 and z3 only.
    let types = vec![
        instance_type("s.2x", 2, 4, 20, &["z1", "z2", "z3"], 0.2),
        instance_type("b.16x", 16, 32, 50, &["z2", "z3"], 1.6),
    ];
    let pods = vec![with_spread(pod("big", "12", "1Gi"), LABEL_TOPOLOGY_ZONE, "web", true)];
    let r = schedule(&input(pods, vec![NodePoolInput::new("default", types)]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(zone_of(&r.new_node_claims[0]), "z2");
}

/// What leaves a node out of a spread's counting.
#[derive(Clone, Copy)]
enum LeftOut {
    /// A label the pods' node selector excludes (`nodeAffinityPolicy`).
    Selector,
    /// A taint the pods do not tolerate (`nodeTaintsPolicy`).
    Taint,
}

/// A node that `how` concerns: labelled `team=other`, or tainted.
fn left_out_node(name: &str, cpu: i64, how: LeftOut) -> ExistingNode {
    let mut n = existing_node(name, cpu);
    match how {
        LeftOut::Selector => {
            n.labels.to_mut().insert("team".into(), "other".into());
        }
        LeftOut::Taint => n.taints = vec![Taint::new("dedicated", TaintEffect::NoSchedule)],
    }
    n
}

/// A pod of spread group `web` on `key` with the given policies; for `Selector` it also selects
/// `team=mine`.
fn policy_spread_pod(p: Pod, key: &str, how: LeftOut, affinity: Option<&str>, taints: Option<&str>) -> Pod {
    let mut p = with_spread(p, key, "web", true);
    for c in spec(&mut p).topology_spread_constraints.iter_mut().flatten() {
        c.node_affinity_policy = affinity.map(Into::into);
        c.node_taints_policy = taints.map(Into::into);
    }
    match how {
        LeftOut::Selector => with_node_selector(p, "team", "mine"),
        LeftOut::Taint => p,
    }
}

#[rstest]
#[case::selector_default(LeftOut::Selector, None, None, false)]
#[case::selector_honor(LeftOut::Selector, Some("Honor"), None, false)]
#[case::selector_ignore(LeftOut::Selector, Some("Ignore"), None, true)]
#[case::taint_default(LeftOut::Taint, None, None, true)]
#[case::taint_ignore(LeftOut::Taint, None, Some("Ignore"), true)]
#[case::taint_honor(LeftOut::Taint, None, Some("Honor"), false)]
fn spread_counts_existing_pods_by_node_policy(
    #[case] how: LeftOut,
    #[case] affinity: Option<&str>,
    #[case] taints: Option<&str>,
    #[case] counted: bool,
) {
    // n1 in z1 is full and holds two pods of the group.
    let mut n1 = left_out_node("n1", 0, how);
    n1.pods = shared(vec![
        with_label(pod("old1", "1", "1Gi"), "group", "web"),
        with_label(pod("old2", "1", "1Gi"), "group", "web"),
    ]);
    let np = match how {
        LeftOut::Selector => pool_req("default", "team", Operator::In, &["mine"]),
        LeftOut::Taint => pool("default"),
    };
    let pods = pods_n(3, |p| policy_spread_pod(p, LABEL_TOPOLOGY_ZONE, how, affinity, taints));
    let r = schedule(&SchedulingInput { existing_nodes: shared(vec![n1]), ..input(pods, vec![np]) });
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
    for c in &r.new_node_claims {
        *per_zone.entry(zone_of(c)).or_default() += c.pods.len();
    }
    // Counted, z1 is two ahead and gets none of the three pods; left out, each zone gets one.
    let want: &[(&str, usize)] =
        if counted { &[("z2", 2), ("z3", 1)] } else { &[("z1", 1), ("z2", 1), ("z3", 1)] };
    assert_eq!(per_zone, want.iter().map(|(z, n)| (z.to_string(), *n)).collect());
}

#[rstest]
#[case::selector_default(LeftOut::Selector, None, None, true)]
#[case::selector_honor(LeftOut::Selector, Some("Honor"), None, true)]
#[case::selector_ignore(LeftOut::Selector, Some("Ignore"), None, false)]
#[case::taint_default(LeftOut::Taint, None, None, false)]
#[case::taint_honor(LeftOut::Taint, None, Some("Honor"), true)]
fn spread_minimum_skips_domains_of_left_out_nodes(
    #[case] how: LeftOut,
    #[case] affinity: Option<&str>,
    #[case] taints: Option<&str>,
    #[case] third_fits: bool,
) {
    // No NodePool: n1 is an empty host name the pods cannot use. Counted, it keeps the minimum
    // at zero and the third pod has nowhere to go; left out, the minimum is one after two pods.
    let mut nodes = vec![left_out_node("n1", 8, how), existing_node("n2", 8), existing_node("n3", 8)];
    if let LeftOut::Selector = how {
        for n in &mut nodes[1..] {
            n.labels.to_mut().insert("team".into(), "mine".into());
        }
    }
    let pods = pods_n(3, |p| policy_spread_pod(p, LABEL_HOSTNAME, how, affinity, taints));
    let r = schedule(&SchedulingInput { existing_nodes: shared(nodes), ..input(pods, vec![]) });
    assert_eq!(r.errors.is_empty(), third_fits, "{}", error_of(&r));
    assert_eq!(
        r.existing_placements.iter().map(|p| p.pods.len()).sum::<usize>(),
        2 + usize::from(third_fits)
    );
}

#[rstest]
#[case::default(None, true)]
#[case::ignore(Some("Ignore"), true)]
#[case::honor(Some("Honor"), false)]
fn spread_counts_pods_on_new_claims_by_taints_policy(#[case] taints: Option<&str>, #[case] counted: bool) {
    // Two larger pods of the group, placed first, go to a tainted NodePool in z1.
    let gpu = NodePoolInput {
        weight: 10,
        taints: vec![Taint::new("dedicated", TaintEffect::NoSchedule)],
        ..pool_req("gpu", LABEL_TOPOLOGY_ZONE, Operator::In, &["z1"])
    };
    let mut pods: Vec<Pod> = (0..2)
        .map(|i| {
            with_toleration(with_label(pod(&format!("big{i}"), "2", "1Gi"), "group", "web"), "dedicated")
        })
        .collect();
    pods.extend(pods_n(3, |p| policy_spread_pod(p, LABEL_TOPOLOGY_ZONE, LeftOut::Taint, None, taints)));
    let r = schedule(&input(pods, vec![gpu, pool("default")]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    let spread_zones: Vec<String> =
        r.new_node_claims.iter().filter(|c| c.nodepool == "default").map(zone_of).collect();
    assert_eq!(!spread_zones.contains(&"z1".to_string()), counted, "{spread_zones:?}");
}

/// Claims `data-<i>` of namespace `default`: 0 and 1 bound to volumes in z2, 2 unbound with class
/// `zonal` (z3 only); and a CSI limit of 2 volumes on node `n1`.
fn volume_input() -> VolumeInput {
    fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }
    let mut v = VolumeInput::default();
    for (claim, volume) in [("data-0", Some("pv-0")), ("data-1", Some("pv-1")), ("data-2", None)] {
        v.add_claim(&obj(serde_json::json!({"metadata": {"name": claim, "namespace": "default"},
            "spec": {"volumeName": volume, "storageClassName": "zonal"}})));
    }
    for pv in ["pv-0", "pv-1"] {
        v.add_volume(&obj(serde_json::json!({"metadata": {"name": pv}, "spec": {
            "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": pv},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": LABEL_TOPOLOGY_ZONE, "operator": "In", "values": ["z2"]}]}]}}}})));
    }
    v.add_class(&obj(serde_json::json!({"metadata": {"name": "zonal"}, "provisioner": "ebs.csi.aws.com",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowedTopologies": [{"matchLabelExpressions": [{"key": LABEL_TOPOLOGY_ZONE, "values": ["z3"]}]}]})));
    v.add_csi_node(&obj(serde_json::json!({"metadata": {"name": "n1"}, "spec": {"drivers": [
        {"name": "ebs.csi.aws.com", "nodeID": "i-1", "allocatable": {"count": 2}}]}})));
    v
}

fn with_claim(mut p: Pod, claim: &str) -> Pod {
    spec(&mut p).volumes.get_or_insert_with(Default::default).push(crate::apis::pod::Volume {
        name: claim.into(),
        persistent_volume_claim: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
            claim_name: claim.into(),
            read_only: None,
        }),
        ..Default::default()
    });
    p
}

fn existing_in_zone(name: &str, zone: &str) -> ExistingNode {
    let mut n = existing_node(name, 8);
    n.labels.to_mut().insert(LABEL_TOPOLOGY_ZONE.into(), zone.into());
    n
}

#[rstest]
#[case::bound_volume("data-0", "z2")]
#[case::unbound_claim_in_allowed_topologies("data-2", "z3")]
fn volume_zone_goes_on_the_new_nodeclaim(#[case] claim: &str, #[case] zone: &str) {
    let pods = vec![with_claim(pod("db", "1", "1Gi"), claim)];
    let r = schedule(&SchedulingInput { volumes: volume_input(), ..input(pods, vec![pool("default")]) });
    assert_eq!(error_of(&r), "");
    assert_eq!(r.new_node_claims.len(), 1);
    assert_eq!(zone_of(&r.new_node_claims[0]), zone);
}

#[test]
fn volume_zone_holds_with_every_node_affinity_term() {
    // Terms z1 or z2: only z2 is left with the volume, and relaxing cannot drop it.
    let p = with_node_affinity(
        with_claim(pod("db", "1", "1Gi"), "data-0"),
        vec![vec![nsr(LABEL_TOPOLOGY_ZONE, "In", &["z1"])], vec![nsr(LABEL_TOPOLOGY_ZONE, "In", &["z2"])]],
        vec![],
    );
    let r = schedule(&SchedulingInput { volumes: volume_input(), ..input(vec![p], vec![pool("default")]) });
    assert_eq!(r.new_node_claims.len(), 1);
    assert_eq!(zone_of(&r.new_node_claims[0]), "z2");

    let p = with_node_affinity(
        with_claim(pod("db", "1", "1Gi"), "data-0"),
        vec![vec![nsr(LABEL_TOPOLOGY_ZONE, "In", &["z1"])]],
        vec![],
    );
    let r = schedule(&SchedulingInput { volumes: volume_input(), ..input(vec![p], vec![pool("default")]) });
    assert!(r.new_node_claims.is_empty());
    assert_eq!(error_of(&r), "node affinity conflicts with the pod's volumes");
}

#[test]
fn existing_nodes_outside_the_volume_zone_are_skipped() {
    let pods = vec![with_claim(pod("db", "1", "1Gi"), "data-0")];
    let r = schedule(&SchedulingInput {
        volumes: volume_input(),
        existing_nodes: shared(vec![existing_in_zone("n0", "z1"), existing_in_zone("n2", "z2")]),
        ..input(pods, vec![pool("default")])
    });
    assert!(r.new_node_claims.is_empty());
    assert_eq!(r.existing_placements.len(), 1);
    assert_eq!(r.existing_placements[0].node, "n2");
}

#[test]
fn missing_claim_makes_the_pod_unschedulable() {
    let pods = vec![with_claim(pod("db", "1", "1Gi"), "nope"), pod("web", "1", "1Gi")];
    let r = schedule(&SchedulingInput { volumes: volume_input(), ..input(pods, vec![pool("default")]) });
    assert_eq!(error_of(&r), "persistentvolumeclaim default/nope not found");
    assert_eq!(r.errors[0].pod.name, "db");
    assert_eq!(r.new_node_claims.len(), 1);
}

#[rstest]
// n1 allows 2 volumes and has data-0 attached: one more fits, a second goes to a new node.
#[case::limit_reached_makes_a_new_node(&["data-1", "data-2"], 1)]
// A claim already attached to n1 counts once.
#[case::shared_claim_counts_once(&["data-0", "data-1", "data-0"], 0)]
fn attach_limits_of_existing_nodes(#[case] claims: &[&str], #[case] new_nodes: usize) {
    let mut n1 = existing_in_zone("n1", "z2");
    n1.pods = shared(vec![with_claim(pod("bound", "100m", "128Mi"), "data-0")]);
    let pods: Vec<Pod> =
        claims.iter().enumerate().map(|(i, c)| with_claim(pod(&format!("p{i}"), "1", "1Gi"), c)).collect();
    let mut volumes = volume_input();
    // data-2 on the same node as z2 volumes: its class allows z2 here.
    volumes.classes.values_mut().for_each(|c| c.terms.clear());
    let r = schedule(&SchedulingInput {
        volumes,
        existing_nodes: shared(vec![n1]),
        ..input(pods, vec![pool("default")])
    });
    assert_eq!(error_of(&r), "");
    assert_eq!(r.new_node_claims.len(), new_nodes);
    let on_n1: usize = r.existing_placements.iter().map(|p| p.pods.len()).sum();
    assert_eq!(on_n1, claims.len() - new_nodes);
}

/// A type of `cpu` vCPU, 2 GiB per vCPU and `pods` pods in z1 at `price`, with `extra` capacity
/// (accelerators) and `labels` besides arch, family and size.
fn priced_type(
    name: &str,
    cpu: i64,
    pods: i64,
    price: f64,
    extra: &[(&str, i64)],
    labels: &[(&str, &str)],
) -> Arc<InstanceType> {
    let (family, size) = name.split_once('.').unwrap_or((name, ""));
    let mut all: BTreeMap<String, String> = [
        (LABEL_ARCH.to_string(), ARCH_AMD64.to_string()),
        (LABEL_INSTANCE_FAMILY.to_string(), family.to_string()),
        (LABEL_INSTANCE_SIZE.to_string(), size.to_string()),
    ]
    .into();
    all.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut capacity = Resources::from_pairs([(CPU, cpu * 1000), (MEMORY, 2 * cpu * GI), (PODS, pods)]);
    for (k, v) in extra {
        capacity.set(k, *v);
    }
    let offering = Offering::new("z1", "on-demand", price, true);
    Arc::new(InstanceType::new(
        name,
        Requirements::from_labels(&all),
        capacity,
        Overhead::default(),
        vec![offering],
    ))
}

fn with_packing(mut inp: SchedulingInput, packing: Packing) -> SchedulingInput {
    inp.options.packing = packing;
    inp
}

/// The plans of the cost-aware rule and of the largest-fit rule, every pod placed by both.
fn plans(inp: SchedulingInput) -> (SchedulingResults, SchedulingResults) {
    let new = schedule(&with_packing(inp.clone(), Packing::CostAware));
    let old = schedule(&with_packing(inp, Packing::LargestFit));
    assert!(new.errors.is_empty(), "{}", error_of(&new));
    assert!(old.errors.is_empty(), "{}", error_of(&old));
    (new, old)
}

fn assert_cheaper(new: &SchedulingResults, old: &SchedulingResults) {
    let (a, b) = (cost::plan_price(new), cost::plan_price(old));
    assert!(a < b, "{a} vs {b}");
}

fn with_requests(mut p: Pod, name: &str, amount: &str) -> Pod {
    let c = &mut spec(&mut p).containers[0];
    let res = c.resources.get_or_insert_with(Default::default);
    res.requests.get_or_insert_with(Default::default).insert(name.into(), Quantity(amount.into()));
    res.limits.get_or_insert_with(Default::default).insert(name.into(), Quantity(amount.into()));
    p
}

/// An Inferentia-like type cheaper than the ordinary one, a GPU type, and a bare-metal type.
fn exotic_catalog() -> Vec<Arc<InstanceType>> {
    vec![
        priced_type(
            "inf.4x",
            4,
            50,
            0.10,
            &[(RESOURCE_AWS_NEURON, 1)],
            &[(LABEL_INSTANCE_ACCELERATOR_COUNT, "1")],
        ),
        priced_type("m.4x", 4, 50, 0.20, &[], &[]),
        priced_type("m.metal", 8, 50, 0.30, &[], &[]),
        priced_type("g.16x", 16, 50, 1.00, &[(RESOURCE_NVIDIA_GPU, 1)], &[(LABEL_INSTANCE_GPU_COUNT, "1")]),
    ]
}

#[rstest]
#[case::ordinary_pods_get_ordinary_types(pod("a", "1", "1Gi"), Packing::CostAware, &["m.4x"])]
#[case::accelerator_requests_get_accelerators(with_requests(pod("a", "1", "1Gi"), RESOURCE_AWS_NEURON, "1"), Packing::CostAware, &["inf.4x"])]
#[case::selected_family_is_kept(with_node_selector(pod("a", "1", "1Gi"), LABEL_INSTANCE_FAMILY, "inf"), Packing::CostAware, &["inf.4x"])]
#[case::selected_metal_is_kept(with_node_selector(pod("a", "1", "1Gi"), LABEL_INSTANCE_SIZE, "metal"), Packing::CostAware, &["m.metal"])]
#[case::exotic_when_nothing_else_holds(pod("a", "12", "1Gi"), Packing::CostAware, &["g.16x"])]
#[case::largest_fit_keeps_exotic(pod("a", "1", "1Gi"), Packing::LargestFit, &["inf.4x", "m.4x", "m.metal", "g.16x"])]
fn exotic_types_only_when_needed(#[case] p: Pod, #[case] packing: Packing, #[case] want: &[&str]) {
    let r = schedule(&with_packing(
        input(vec![p], vec![NodePoolInput::new("default", exotic_catalog())]),
        packing,
    ));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(*r.new_node_claims[0].instance_type_names, *want);
}

/// Upstream's expiration regression: five pods that request nothing on a catalog whose cheapest
/// type holds four. Pod slots are not priced, so one NodeClaim takes them all on the cheapest type
/// that holds five, not two of the 4-pod type.
#[test]
fn pods_that_request_nothing_share_one_claim() {
    let catalog =
        vec![priced_type("t.nano", 2, 4, 0.0042, &[], &[]), priced_type("t.small", 2, 11, 0.0168, &[], &[])];
    let empty = |mut p: Pod| {
        spec(&mut p).containers[0].resources = None;
        p
    };
    let r = schedule(&input(pods_n(5, empty), vec![NodePoolInput::new("default", catalog.clone())]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(r.new_node_claims.len(), 1);
    assert_eq!(r.new_node_claims[0].instance_type_names, ["t.small"]);
    // Pods that do request CPU are still packed by it: four 100m pods per nano, then another.
    let small = (0..5).map(|i| pod(&format!("q{i}"), "100m", "64Mi")).collect();
    let r = schedule(&input(small, vec![NodePoolInput::new("default", catalog)]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!(r.new_node_claims.iter().map(|c| c.pods.len()).collect::<Vec<_>>(), [4, 1]);
}

#[test]
fn ordinary_claims_do_not_grow_into_exotic_types() {
    // 20 one-vCPU pods: 4 fit an m.4x; growing past 8 vCPU would need the GPU type.
    let r = schedule(&input(pods_n(20, |p| p), vec![NodePoolInput::new("default", exotic_catalog())]));
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    for c in &r.new_node_claims {
        assert!(!cost::uses_exotic(c), "{:?}", c.instance_type_names);
    }
}

/// The shape of the issue's EC2 case: the 16-vCPU type is the cheapest per vCPU, the 24-vCPU one
/// (the largest allowed) is not.
fn sizing_catalog() -> Vec<Arc<InstanceType>> {
    vec![
        priced_type("c.2x", 2, 29, 0.0765, &[], &[]),
        priced_type("c.16x", 16, 234, 0.612, &[], &[]),
        priced_type("x.24x", 24, 234, 1.18, &[], &[]),
    ]
}

#[test]
fn claims_close_where_the_price_per_unit_is_lowest() {
    let pods = (0..100).map(|i| pod(&format!("p{i:03}"), "250m", "256Mi")).collect::<Vec<_>>();
    let (new, old) = plans(input(pods, vec![NodePoolInput::new("default", sizing_catalog())]));
    // 64 pods fill a c.16x; the rest go on a second one.
    let cheapest: Vec<&str> = new.new_node_claims.iter().map(|c| c.instance_type_names[0].as_str()).collect();
    assert_eq!(cheapest, ["c.16x", "c.16x"]);
    assert_eq!(new.new_node_claims[0].pods.len(), 64);
    // Growing while any type holds the pods puts 96 on the 24-vCPU type.
    let old_cheapest: Vec<&str> =
        old.new_node_claims.iter().map(|c| c.instance_type_names[0].as_str()).collect();
    assert_eq!(old_cheapest, ["x.24x", "c.2x"]);
    assert_cheaper(&new, &old);
}

#[test]
fn a_pod_that_rides_free_joins_a_claim_on_a_dear_type() {
    // The first pod needs the 24-vCPU type; a small one fits beside it at no extra cost.
    let pods = vec![pod("big", "20", "1Gi"), pod("small", "250m", "256Mi")];
    let r = schedule(&input(pods, vec![NodePoolInput::new("default", sizing_catalog())]));
    assert_eq!(
        r.new_node_claims.len(),
        1,
        "{:?}",
        r.new_node_claims.iter().map(|c| &c.pods).collect::<Vec<_>>()
    );
    assert_eq!(r.new_node_claims[0].instance_type_names, ["x.24x"]);
}

#[test]
fn cpu_heavy_and_memory_heavy_pods_share_nodes() {
    let mut pods: Vec<Pod> = (0..16).map(|i| pod(&format!("cpu{i:02}"), "2", "512Mi")).collect();
    pods.extend((0..16).map(|i| pod(&format!("mem{i:02}"), "250m", "3584Mi")));
    let (new, old) = plans(input(pods, vec![pool("default")]));
    // Taking the CPU-heavy pods first fills the first nodes' CPU and strands their memory.
    let kinds = |c: &NewNodeClaim| c.pods.iter().map(|p| p.name[..3].to_string()).collect::<BTreeSet<_>>();
    assert_eq!(kinds(&new.new_node_claims[0]).len(), 2, "{:?}", new.new_node_claims[0].pods);
    assert_eq!(kinds(&old.new_node_claims[0]).len(), 1, "{:?}", old.new_node_claims[0].pods);
    assert_cheaper(&new, &old);
}

#[test]
fn the_issue_workload_on_the_ec2_catalog_costs_at_most_10_30() {
    // 1000 pods of 250m / 256Mi; on-demand amd64 types under 32 vCPUs.
    let types = crate::cloudprovider::aws::embedded::instance_types().expect("the embedded catalog loads");
    let req = |key: &str, op: Operator, values: &[&str]| NodeSelectorRequirementWithMinValues {
        key: key.into(),
        operator: op,
        values: values.iter().map(|v| v.to_string()).collect(),
        min_values: None,
    };
    let np = NodePoolInput::new("default", types)
        .with_requirements(&[
            req(LABEL_CAPACITY_TYPE, Operator::In, &[CAPACITY_TYPE_ON_DEMAND]),
            req(LABEL_ARCH, Operator::In, &[ARCH_AMD64]),
            req(LABEL_INSTANCE_CPU, Operator::Lt, &["32"]),
        ])
        .unwrap();
    let pods = (0..1000).map(|i| pod(&format!("small-{i}"), "250m", "256Mi")).collect::<Vec<_>>();
    let (new, old) = plans(input(pods, vec![np]));
    let price = cost::plan_price(&new);
    assert!(
        price <= 10.30,
        "${price:.2}/h on {:?}",
        new.new_node_claims.iter().map(|c| &c.instance_type_names[0]).collect::<Vec<_>>()
    );
    assert!(new.new_node_claims.iter().all(|c| !cost::uses_exotic(c)));
    // Before: Inferentia nodes, $12.41/h.
    assert!(old.new_node_claims.iter().any(cost::uses_exotic));
    assert!(cost::plan_price(&old) > 12.0, "{}", cost::plan_price(&old));
    assert_cheaper(&new, &old);
}

/// The standard types, `m.2x` also with a reserved offering in z1 of reservation `cr-1` with
/// `left` instances.
fn types_with_reservation(left: i64) -> Vec<Arc<InstanceType>> {
    standard_types()
        .into_iter()
        .map(|it| {
            if it.name != "m.2x" {
                return it;
            }
            let mut offerings = it.offerings.clone();
            offerings.push(Offering {
                reservation: Some(Arc::new(Reservation {
                    id: "cr-1".into(),
                    reservation_type: "default".into(),
                    interruptible: false,
                    capacity: left,
                })),
                ..Offering::new("z1", CAPACITY_TYPE_RESERVED, 0.2 / 10_000_000.0, left > 0)
            });
            Arc::new(InstanceType::new(
                it.name.clone(),
                it.requirements.clone(),
                it.capacity.clone(),
                it.overhead.clone(),
                offerings,
            ))
        })
        .collect()
}

fn reserved_run(left: i64, held: usize, fallback: bool) -> SchedulingResults {
    let pods = pods_n(4, |p| with_anti_affinity(p, LABEL_HOSTNAME, "web"));
    let mut inp = input(pods, vec![NodePoolInput::new("default", types_with_reservation(left))]);
    inp.reservations_held = vec!["cr-1".to_string(); held];
    inp.options.reserved_fallback = fallback;
    schedule(&inp)
}

fn reserved_claims(r: &SchedulingResults) -> Vec<&NewNodeClaim> {
    r.new_node_claims
        .iter()
        .filter(|c| c.requirements.get(LABEL_CAPACITY_TYPE).is_some_and(|ct| ct.single() == Some("reserved")))
        .collect()
}

#[test]
fn reservations_are_used_first_and_never_overbooked() {
    // Two instances left: two reserved claims; the other pods wait for the next run (the
    // reservation is then used up and they fall back), without a scheduling error to report.
    let r = reserved_run(2, 0, false);
    let reserved = reserved_claims(&r);
    assert_eq!((reserved.len(), r.new_node_claims.len()), (2, 2), "{:?}", r.new_node_claims);
    for c in &reserved {
        assert_eq!(c.instance_type_names, vec!["m.2x".to_string()]);
        assert_eq!(c.requirements.get(LABEL_CAPACITY_RESERVATION_ID).and_then(|r| r.single()), Some("cr-1"));
    }
    assert_eq!(r.errors.len(), 2);
    assert!(r.errors.iter().all(|e| e.reserved), "{}", error_of(&r));
    // NodeClaims not launched yet hold their instance: one left for this run.
    let r = reserved_run(2, 1, false);
    assert_eq!((reserved_claims(&r).len(), r.errors.len()), (1, 3));
    // Used up: every pod falls back to other capacity.
    let r = reserved_run(0, 0, false);
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!((reserved_claims(&r).len(), r.new_node_claims.len()), (0, 4));
    // The disruption simulations fall back at once.
    let r = reserved_run(2, 0, true);
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    assert_eq!((reserved_claims(&r).len(), r.new_node_claims.len()), (2, 4));
}

#[test]
fn a_pod_that_selects_a_reservation_gets_only_its_types() {
    // The reservation's label is an offering's, not a type's: a pod that selects it is planned
    // only on the types with an offering of it, and not at all once it is used up.
    let selecting = |p| with_node_selector(p, LABEL_CAPACITY_RESERVATION_ID, "cr-1");
    for fallback in [false, true] {
        let mut inp =
            input(pods_n(1, selecting), vec![NodePoolInput::new("default", types_with_reservation(1))]);
        inp.options.reserved_fallback = fallback;
        let r = schedule(&inp);
        assert!(r.errors.is_empty(), "{}", error_of(&r));
        let names: Vec<&str> =
            r.new_node_claims.iter().flat_map(|c| c.instance_type_names.iter().map(String::as_str)).collect();
        assert_eq!(names, ["m.2x"], "{:?}", r.new_node_claims);
    }
    let mut inp = input(pods_n(1, selecting), vec![NodePoolInput::new("default", types_with_reservation(0))]);
    inp.options.reserved_fallback = true;
    let r = schedule(&inp);
    assert!(r.new_node_claims.is_empty(), "{:?}", r.new_node_claims);
    assert_eq!(r.errors.len(), 1);
}

#[test]
fn a_reserved_claim_does_not_outgrow_its_reservation() {
    // One instance left of a 2-CPU type: the first pod's claim holds it; pods that fit with it
    // join it, and the claim stays on the reserved type (strict) instead of growing.
    let pods = pods_n(3, |p| p);
    let r = schedule(&input(pods, vec![NodePoolInput::new("default", types_with_reservation(1))]));
    let reserved = reserved_claims(&r);
    assert_eq!(reserved.len(), 1, "{:?}", r.new_node_claims);
    assert_eq!(reserved[0].instance_type_names, vec!["m.2x".to_string()]);
    assert!(reserved[0].pods.len() <= 2);
}

/// Types of 2, 4 and 8 vCPU, the larger 0.5% and 2% dearer per vCPU than the smallest.
fn near_tie_catalog() -> Vec<Arc<InstanceType>> {
    vec![
        priced_type("m.2x", 2, 50, 0.20, &[], &[]),
        priced_type("m.4x", 4, 50, 0.402, &[], &[]),
        priced_type("m.8x", 8, 50, 0.816, &[], &[]),
    ]
}

/// Within the fewer-nodes margin a claim grows into the larger type: a near tie goes to the plan
/// with fewer nodes; outside it, to the cheapest per unit.
#[rstest]
#[case::none(0.0, &[("m.2x", 4)], 0.80)]
#[case::one_per_cent(0.01, &[("m.4x", 2)], 0.804)]
#[case::the_default(FEWER_NODES_MARGIN, &[("m.8x", 1)], 0.816)]
#[case::five_per_cent(0.05, &[("m.8x", 1)], 0.816)]
fn near_ties_go_to_fewer_nodes(#[case] margin: f64, #[case] want: &[(&str, usize)], #[case] price: f64) {
    let mut inp = input(pods_n(8, |p| p), vec![NodePoolInput::new("default", near_tie_catalog())]);
    inp.options.fewer_nodes_margin = margin;
    let r = schedule(&inp);
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    let mut got: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &r.new_node_claims {
        *got.entry(c.instance_type_names[0].as_str()).or_default() += 1;
    }
    assert_eq!(got, want.iter().copied().collect::<BTreeMap<_, _>>(), "margin {margin}");
    assert!((cost::plan_price(&r) - price).abs() < 1e-9, "{}", cost::plan_price(&r));
}

/// The share of every node that its DaemonSets take is paid for: a 4-vCPU type 5% dearer per
/// vCPU than the 2-vCPU one leaves its pods 3 vCPU beside a 1-vCPU DaemonSet where the small one
/// leaves 1, so it is the cheaper per vCPU the pods get, and the plan takes it.
#[test]
fn the_daemonsets_share_of_a_node_is_priced() {
    let catalog =
        vec![priced_type("m.2x", 2, 50, 0.20, &[], &[]), priced_type("m.4x", 4, 50, 0.42, &[], &[])];
    let ds = pod("ds", "1", "256Mi");
    let inp = SchedulingInput {
        daemonsets: vec![ds],
        ..input(pods_n(8, |p| p), vec![NodePoolInput::new("default", catalog)])
    };
    let r = schedule(&inp);
    assert!(r.errors.is_empty(), "{}", error_of(&r));
    let names: Vec<&str> = r.new_node_claims.iter().map(|c| c.instance_type_names[0].as_str()).collect();
    assert_eq!(names, ["m.4x"; 3], "three pods beside the DaemonSet on each");
    // Eight 2-vCPU nodes, one pod each, would cost $1.60/h.
    assert!((cost::plan_price(&r) - 1.26).abs() < 1e-9, "{}", cost::plan_price(&r));
}
/// A Deployment's pods with no spread of their own get kube-scheduler's default ones: new
/// capacity in every zone, the pods balanced within one; a bare pod, a pod with its own spread,
/// or no defaults at all: one zone.
#[test]
fn a_workloads_pods_get_kube_schedulers_default_spread() {
    use crate::scheduling::defaultspread::DefaultSpread;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let owned = |mut p: Pod| {
        p.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        p.metadata.owner_references = Some(vec![OwnerReference {
            kind: "ReplicaSet".into(),
            name: "web".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        p
    };
    let zones = |pods: Vec<Pod>, spread: DefaultSpread| {
        let mut inp = input(pods, vec![pool("default")]);
        inp.options.default_spread = Arc::new(spread);
        let r = schedule(&inp);
        assert!(r.errors.is_empty(), "{}", error_of(&r));
        let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
        for c in &r.new_node_claims {
            *per_zone.entry(zone_of(c)).or_default() += c.pods.len();
        }
        per_zone.into_values().collect::<Vec<_>>()
    };
    let small = |p: Pod| {
        let mut p = owned(p);
        spec(&mut p).containers[0].resources =
            pod("x", "250m", "256Mi").spec.and_then(|s| s.containers[0].resources.clone());
        p
    };
    assert_eq!(zones(pods_n(30, small), DefaultSpread::builtin()), [10, 10, 10]);
    assert_eq!(zones(pods_n(30, small), DefaultSpread::none()), [30]);
    let bare = |p: Pod| {
        let mut p = small(p);
        p.metadata.owner_references = None;
        p
    };
    assert_eq!(zones(pods_n(30, bare), DefaultSpread::builtin()), [30]);
    // Its own (hostname) spread replaces the defaults.
    let own = |p: Pod| with_spread(small(p), LABEL_HOSTNAME, "web", false);
    let own_zones = zones(pods_n(30, own), DefaultSpread::builtin());
    assert_eq!(own_zones.iter().sum::<usize>(), 30);
    assert!(own_zones.len() < 3 || own_zones.iter().max() != own_zones.iter().min(), "{own_zones:?}");
}

/// With preferences yielding to existing nodes (the disruption simulations' `Soft` policy), a
/// pod whose preferred zone has no room goes to an existing node elsewhere, as kube-scheduler
/// would place it, and is reported; otherwise new capacity in its preferred zone is planned.
#[test]
fn preferences_yield_to_existing_nodes_when_asked() {
    let p = with_node_affinity(
        pod("a", "1", "1Gi"),
        vec![],
        vec![(1, vec![nsr(LABEL_TOPOLOGY_ZONE, "In", &["z2"])])],
    );
    let run = |yield_: bool| {
        let mut inp = SchedulingInput {
            existing_nodes: shared(vec![existing_node("n1", 8)]),
            ..input(vec![p.clone()], vec![pool("default")])
        };
        inp.options.preferences_yield_to_existing = yield_;
        schedule(&inp)
    };
    let kept = run(false);
    assert_eq!(kept.new_node_claims.len(), 1);
    assert_eq!(zone_of(&kept.new_node_claims[0]), "z2");
    assert!(kept.preferences_broken.is_empty());
    let yielded = run(true);
    assert!(yielded.new_node_claims.is_empty());
    assert_eq!(yielded.existing_placements[0].node, "n1");
    assert_eq!(yielded.preferences_broken.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["a"]);
}
