//! Scheduling throughput, after upstream Karpenter's `BenchmarkScheduling`
//! (`scheduling_benchmark_test.go`), pod for pod.
//!
//! The catalog is that of upstream's `fake.InstanceTypes(400)`: type `fake-it-i` has `i+1` vCPU,
//! `2(i+1)` GiB and `10(i+1)` pods, reserves 100m CPU and 10Mi memory for the kubelet, is amd64
//! for linux, windows and darwin, is offered as spot in test-zone-1 and 2 and on-demand in
//! test-zone-1 to 3, all at `0.1 × vCPU + 0.1 × memory in units of 1e9 bytes` an hour, and carries
//! upstream's `size`, `special` and `integer` test labels. One NodePool without requirements and
//! with upstream's (never reached) limits of 10,000,000 CPU and 10,000,000Gi memory.
//!
//! The pods are upstream's `makeDiversePods(n)`: `n/5` each of generic pods, zonal and hostname
//! topology spread (maxSkew 1, DoNotSchedule), zonal self-affinity and hostname anti-affinity, the
//! remainder generic. Generic and spreading pods carry `my-label` drawn from 7 values, and each
//! spread selects one of the 7 values again (so 7 zonal and 7 hostname spread groups, which count
//! the generic pods with that value too); affinity pods carry `my-affininity` (upstream's
//! spelling) drawn from the 7 values and select their own value (7 zonal self-affinity groups);
//! anti-affinity pods all carry `app: nginx` and are anti-affine to each other. CPU requests are
//! drawn from {100m, 250m, 500m, 1, 1.5} and memory from {100Mi, 256Mi, 512Mi, 1Gi, 2Gi, 4Gi},
//! in upstream's order of draws, by a seeded generator (not Go's, so not the same pods).
//!
//! As upstream times `Solve` alone, `scheduling/solve/<n>` times the placement alone: the input
//! and the run's setup ([`prepare`]: pods parsed, topology groups and domains, instance types
//! ordered) are built outside the timed section. `scheduling/schedule/<n>` times the whole
//! [`schedule`] call, setup included, as the provisioner pays it.
//!
//! Before the timings, it prints a cost table (markdown): for upstream's 400 types (NodePool as
//! above) and for the EC2 catalog built into the binary (a NodePool without requirements), generic
//! pods and the diverse mix at 100, 1,000 and 5,000 pods, the hourly price of the plan (each
//! NodeClaim at its cheapest launch) of today's rule ([`Packing::LargestFit`]) and of the
//! cost-aware one, each over the per-resource and the fractional lower bounds ([`cost`]), and
//! over a per-pod yardstick; then the same for 1,000 pods of 250m / 256Mi on the EC2 catalog's
//! on-demand amd64 types under 32 vCPUs, with and without the burstable (`t`) types. Last, the
//! cost-aware rule's plans on the EC2 catalog at fewer-nodes margins of 0, 1, 3 and 5%
//! (`FEWER_NODES_MARGIN`).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{
    Affinity, PodAffinity, PodAffinityTerm, PodAntiAffinity, ResourceRequirements, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use karpenter::apis::labels::{
    ARCH_AMD64, CAPACITY_TYPE_ON_DEMAND, LABEL_ARCH, LABEL_CAPACITY_TYPE, LABEL_HOSTNAME,
    LABEL_INSTANCE_CATEGORY, LABEL_INSTANCE_CPU, LABEL_OS, LABEL_TOPOLOGY_ZONE,
};
use karpenter::apis::pod::{Container, Pod, PodSpec};
use karpenter::apis::{NodeSelectorRequirementWithMinValues, Operator};
use karpenter::scheduling::resources::pod_requests;
use karpenter::scheduling::{
    InstanceType, NodePoolInput, Offering, Overhead, Packing, Requirement, Requirements, Resources,
    SchedulingInput, cost, prepare, schedule,
};

const GI: i64 = 1 << 30;
const MI: i64 = 1 << 20;

/// Upstream's `fake.InstanceTypes(400)`.
fn instance_types() -> Vec<Arc<InstanceType>> {
    (0..400i64)
        .map(|i| {
            let cpu = i + 1;
            let mem = 2 * (i + 1) * GI;
            let price = 0.1 * cpu as f64 + 0.1 * mem as f64 / 1e9;
            let offering = |zone: &str, capacity_type: &str| Offering::new(zone, capacity_type, price, true);
            let offerings = vec![
                offering("test-zone-1", "spot"),
                offering("test-zone-2", "spot"),
                offering("test-zone-1", "on-demand"),
                offering("test-zone-2", "on-demand"),
                offering("test-zone-3", "on-demand"),
            ];
            let mut reqs = Requirements::new();
            reqs.add(LABEL_ARCH, Requirement::in_values([ARCH_AMD64]));
            reqs.add(LABEL_OS, Requirement::in_values(["darwin", "linux", "windows"]));
            // Upstream's test labels: "large" types (more than 4 vCPU and 8Gi) may be selected
            // with `special: optional`.
            let large = cpu > 4 && mem > 8 * GI;
            reqs.add("size", Requirement::in_values([if large { "large" } else { "small" }]));
            reqs.add(
                "special",
                if large { Requirement::in_values(["optional"]) } else { Requirement::does_not_exist() },
            );
            reqs.add("integer", Requirement::in_values([cpu.to_string()]));
            Arc::new(InstanceType::new(
                format!("fake-it-{i}"),
                reqs,
                Resources::from_pairs([("cpu", cpu * 1000), ("memory", mem), ("pods", 10 * cpu)]),
                Overhead {
                    kube_reserved: Resources::from_pairs([("cpu", 100), ("memory", 10 * MI)]),
                    ..Default::default()
                },
                offerings,
            ))
        })
        .collect()
}

/// Upstream's NodePool: no requirements, limits far above any run.
fn nodepool(types: Vec<Arc<InstanceType>>) -> NodePoolInput {
    let mut np = NodePoolInput::new("default", types);
    np.remaining_limits = Some(BTreeMap::from([
        ("cpu".to_string(), 10_000_000 * 1000),
        ("memory".to_string(), 10_000_000 * GI),
    ]));
    np
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        from[(v >> 33) as usize % from.len()]
    }

    fn label_value(&mut self) -> String {
        self.pick(&["a", "b", "c", "d", "e", "f", "g"]).to_string()
    }
}

/// The five kinds of upstream's `makeDiversePods`.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Generic,
    Spread(&'static str),
    SelfAffinity(&'static str),
    AntiAffinity(&'static str),
}

fn match_labels(key: &str, value: &str) -> BTreeMap<String, String> {
    [(key.to_string(), value.to_string())].into()
}

fn selector(labels: &BTreeMap<String, String>) -> Option<LabelSelector> {
    Some(LabelSelector { match_labels: Some(labels.clone()), match_expressions: None })
}

fn make_pod(i: usize, kind: Kind, rng: &mut Rng) -> Pod {
    // Draws in upstream's order: the pod's labels, the selector's, then CPU and memory.
    let labels = match kind {
        Kind::Generic | Kind::Spread(_) => match_labels("my-label", &rng.label_value()),
        Kind::SelfAffinity(_) => match_labels("my-affininity", &rng.label_value()),
        Kind::AntiAffinity(_) => match_labels("app", "nginx"),
    };
    let mut spec = PodSpec::default();
    match kind {
        Kind::Generic => {}
        Kind::Spread(key) => {
            let selected = match_labels("my-label", &rng.label_value());
            spec.topology_spread_constraints = Some(vec![TopologySpreadConstraint {
                max_skew: 1,
                topology_key: key.into(),
                when_unsatisfiable: "DoNotSchedule".into(),
                label_selector: selector(&selected),
                ..Default::default()
            }]);
        }
        Kind::SelfAffinity(key) | Kind::AntiAffinity(key) => {
            let terms = Some(vec![PodAffinityTerm {
                topology_key: key.into(),
                label_selector: selector(&labels),
                ..Default::default()
            }]);
            spec.affinity = Some(if matches!(kind, Kind::SelfAffinity(_)) {
                Affinity {
                    pod_affinity: Some(PodAffinity {
                        required_during_scheduling_ignored_during_execution: terms,
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            } else {
                Affinity {
                    pod_anti_affinity: Some(PodAntiAffinity {
                        required_during_scheduling_ignored_during_execution: terms,
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            });
        }
    }
    let cpu = rng.pick(&["100m", "250m", "500m", "1000m", "1500m"]);
    let memory = rng.pick(&["100Mi", "256Mi", "512Mi", "1024Mi", "2048Mi", "4096Mi"]);
    let mut pod = sized_pod(i, cpu, memory);
    pod.metadata.labels = Some(labels);
    if let Some(s) = pod.spec.as_mut() {
        s.topology_spread_constraints = spec.topology_spread_constraints;
        s.affinity = spec.affinity;
    }
    pod
}

/// Pod `i` in namespace `default` requesting `cpu` and `memory`.
fn sized_pod(i: usize, cpu: &str, memory: &str) -> Pod {
    let requests =
        [("cpu".to_string(), Quantity(cpu.into())), ("memory".to_string(), Quantity(memory.into()))];
    let container = Container {
        name: "app".into(),
        resources: Some(ResourceRequirements { requests: Some(requests.into()), ..Default::default() }),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("pod-{i:05}")),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(PodSpec { containers: vec![container], ..Default::default() }),
        ..Default::default()
    }
}

fn make_pods(kinds: &[(Kind, usize)]) -> Vec<Pod> {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut pods = Vec::new();
    for &(kind, count) in kinds {
        for _ in 0..count {
            pods.push(make_pod(pods.len(), kind, &mut rng));
        }
    }
    pods
}

/// Upstream's `makeDiversePods(n)`.
fn diverse_pods(n: usize) -> Vec<Pod> {
    let fifth = n / 5;
    make_pods(&[
        (Kind::Generic, fifth),
        (Kind::Spread(LABEL_TOPOLOGY_ZONE), fifth),
        (Kind::Spread(LABEL_HOSTNAME), fifth),
        (Kind::SelfAffinity(LABEL_TOPOLOGY_ZONE), fifth),
        (Kind::AntiAffinity(LABEL_HOSTNAME), fifth),
        (Kind::Generic, n - 5 * fifth),
    ])
}

fn input(pods: Vec<Pod>, types: &[Arc<InstanceType>]) -> SchedulingInput {
    SchedulingInput {
        pods: pods.into_iter().map(Arc::new).collect(),
        nodepools: vec![nodepool(types.to_vec())],
        ..Default::default()
    }
}

/// Each pod's cheapest share of a whole instance (its largest fraction of any allocatable
/// resource, times the price), summed: what whole pods cost packed alike on the best type for
/// each. Not a lower bound (pods whose shares complement each other can share an instance for
/// less), but the yardstick for uniform pods, which no plan beats when they are all alike.
fn per_pod_yardstick(inp: &SchedulingInput) -> f64 {
    let np = &inp.nodepools[0];
    let types: Vec<(f64, &InstanceType)> = np
        .instance_types
        .iter()
        .filter(|t| t.is_compatible(&np.requirements))
        .filter_map(|t| t.cheapest_price(&np.requirements).map(|p| (p, t.as_ref())))
        .collect();
    inp.pods
        .iter()
        .map(|p| {
            let q = pod_requests(p);
            types
                .iter()
                .filter(|(_, t)| t.fits(&q))
                .map(|(price, t)| {
                    let a = t.allocatable();
                    let share = [(q.cpu, a.cpu), (q.memory, a.memory), (q.pods, a.pods)]
                        .into_iter()
                        .map(|(x, y)| x as f64 / y as f64)
                        .fold(0.0, f64::max);
                    share * price
                })
                .fold(f64::INFINITY, f64::min)
        })
        .sum()
}

/// Plans `pods` on `np` with each packing rule; one row of the cost table.
fn cost_row(catalog: &str, workload: &str, pods: Vec<Pod>, np: &NodePoolInput) {
    let n = pods.len();
    let mut inp = SchedulingInput {
        pods: pods.into_iter().map(Arc::new).collect(),
        nodepools: vec![np.clone()],
        ..Default::default()
    };
    let mut cells = Vec::new();
    let mut bounds = (0.0, 0.0);
    let mut prices = Vec::new();
    for packing in [Packing::LargestFit, Packing::CostAware] {
        inp.options.packing = packing;
        let r = schedule(&inp);
        let price = cost::plan_price(&r);
        bounds = (cost::per_resource_lower_bound(&inp, &r), cost::fractional_lower_bound(&inp, &r));
        let exotic = r.new_node_claims.iter().filter(|c| cost::uses_exotic(c)).count();
        cells.push(format!(
            "{price:.2} | {:.3} | {:.3} | {} | {exotic} | {}",
            price / bounds.0,
            price / bounds.1,
            r.new_node_claims.len(),
            r.errors.len()
        ));
        prices.push(price);
    }
    let yardstick = per_pod_yardstick(&inp);
    eprintln!(
        "| {catalog} | {workload} | {n} | {:.2} | {:.2} | {} | {} | {:.3} | {yardstick:.2} | {:.3} |",
        bounds.0,
        bounds.1,
        cells[0],
        cells[1],
        prices[1] / prices[0],
        prices[1] / yardstick
    );
}

/// The EC2 catalog built into the binary, in a NodePool without requirements.
fn ec2_types() -> Vec<Arc<InstanceType>> {
    match karpenter::cloudprovider::aws::embedded::instance_types() {
        Ok(types) => types,
        Err(e) => panic!("the embedded EC2 catalog: {e}"),
    }
}

/// Prints the cost table: today's rule (`LargestFit`) against the cost-aware one, per catalog,
/// workload and size, with the per-resource lower bound; then the workload.
fn cost_table() {
    eprintln!(
        "| catalog | pods | n | per-resource bound $/h | fractional bound $/h | today $/h | today / per-resource | today / fractional | today NodeClaims | today exotic | today unschedulable | new $/h | new / per-resource | new / fractional | new NodeClaims | new exotic | new unschedulable | new / today | per-pod yardstick $/h | new / yardstick |"
    );
    eprintln!("|{}", " ---: |".repeat(20));
    let catalogs =
        [("upstream 400", nodepool(instance_types())), ("EC2", NodePoolInput::new("default", ec2_types()))];
    for (catalog, np) in &catalogs {
        for n in [100, 1000, 5000] {
            cost_row(catalog, "generic", make_pods(&[(Kind::Generic, n)]), np);
            cost_row(catalog, "diverse", diverse_pods(n), np);
        }
    }
    // The workload: 1000 pods of 250m / 256Mi, on-demand amd64 types under 32 vCPUs.
    let req = |key: &str, operator: Operator, values: &[&str]| NodeSelectorRequirementWithMinValues {
        key: key.into(),
        operator,
        values: values.iter().map(|v| v.to_string()).collect(),
        min_values: None,
    };
    let mut reqs = vec![
        req(LABEL_CAPACITY_TYPE, Operator::In, &[CAPACITY_TYPE_ON_DEMAND]),
        req(LABEL_ARCH, Operator::In, &[ARCH_AMD64]),
        req(LABEL_INSTANCE_CPU, Operator::Lt, &["32"]),
    ];
    let pods = || (0..1000).map(|i| sized_pod(i, "250m", "256Mi")).collect();
    for catalog in ["EC2 on-demand amd64 < 32 vCPU", "the same without burstable (category t)"] {
        let np = match NodePoolInput::new("default", ec2_types()).with_requirements(&reqs) {
            Ok(np) => np,
            Err(e) => panic!("nodepool requirements: {e}"),
        };
        cost_row(catalog, "250m / 256Mi", pods(), &np);
        reqs.push(req(LABEL_INSTANCE_CATEGORY, Operator::NotIn, &["t"]));
    }
}

/// Prints the fewer-nodes margin table: the cost-aware rule's plans on the EC2 catalog at
/// margins of 0, 1, 3 (the default) and 5%, price and NodeClaims of each.
fn margin_table() {
    let margins = [0.0, 0.01, 0.03, 0.05];
    let head: Vec<String> =
        margins.iter().map(|m| format!("{:.0}% $/h | {:.0}% NodeClaims", m * 100.0, m * 100.0)).collect();
    eprintln!("| catalog | pods | n | {} |", head.join(" | "));
    eprintln!("|{}", " ---: |".repeat(3 + 2 * margins.len()));
    let np = NodePoolInput::new("default", ec2_types());
    for n in [1000, 5000] {
        for (workload, pods) in [("generic", make_pods(&[(Kind::Generic, n)])), ("diverse", diverse_pods(n))]
        {
            let mut inp = SchedulingInput {
                pods: pods.into_iter().map(Arc::new).collect(),
                nodepools: vec![np.clone()],
                ..Default::default()
            };
            let cells: Vec<String> = margins
                .iter()
                .map(|m| {
                    inp.options.fewer_nodes_margin = *m;
                    let r = schedule(&inp);
                    format!("{:.2} | {}", cost::plan_price(&r), r.new_node_claims.len())
                })
                .collect();
            eprintln!("| EC2 | {workload} | {n} | {} |", cells.join(" | "));
        }
    }
}

fn bench(c: &mut Criterion) {
    cost_table();
    margin_table();
    let types = instance_types();
    let mut group = c.benchmark_group("scheduling");
    group.sample_size(10);
    for n in [1usize, 100, 1000, 5000, 20000] {
        let inp = input(diverse_pods(n), &types);
        let start = Instant::now();
        let prepared = prepare(&inp);
        let setup = start.elapsed();
        let r = prepared.run();
        let placed: usize = r.new_node_claims.iter().map(|c| c.pods.len()).sum();
        eprintln!(
            "{n} pods: {} nodeclaims, {placed} placed, {} unschedulable; first run: setup {setup:?}, placement {:?}",
            r.new_node_claims.len(),
            r.errors.len(),
            start.elapsed() - setup
        );
        // Upstream's benchmark fails when a pod does not schedule.
        assert!(r.errors.is_empty(), "{n} pods: {} unschedulable", r.errors.len());
        group.bench_with_input(BenchmarkId::new("solve", n), &inp, |b, inp| {
            b.iter_batched(|| prepare(inp), |p| black_box(p.run()), BatchSize::PerIteration)
        });
        group.bench_with_input(BenchmarkId::new("schedule", n), &inp, |b, inp| {
            b.iter(|| schedule(black_box(inp)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
