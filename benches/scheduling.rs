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
//! Before the timings, it prints the cost quality of plans for generic pods only: the hourly price
//! of the NodeClaims (each at its cheapest type and offering) against two lower bounds. The
//! per-resource bound (for each of CPU, memory and pods, the requests times the lowest price of a
//! unit of it on any type; the largest of the three) no packing can beat. The per-pod bound sums
//! each pod's cheapest share of a whole instance (its largest fraction of any resource, times the
//! price); it is the tighter yardstick when pods are alike, but pods whose shares complement each
//! other can share an instance for less.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{
    Affinity, Container, Pod, PodAffinity, PodAffinityTerm, PodAntiAffinity, PodSpec, ResourceRequirements,
    TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use karpenter::apis::labels::{ARCH_AMD64, LABEL_ARCH, LABEL_HOSTNAME, LABEL_OS, LABEL_TOPOLOGY_ZONE};
use karpenter::scheduling::resources::pod_requests;
use karpenter::scheduling::{
    InstanceType, NodePoolInput, Offering, Overhead, Requirement, Requirements, Resources, SchedulingInput,
    prepare, schedule,
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
            let offering = |zone: &str, capacity_type: &str| Offering {
                zone: zone.into(),
                capacity_type: capacity_type.into(),
                price,
                available: true,
            };
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
    spec.containers = vec![Container {
        name: "app".into(),
        resources: Some(ResourceRequirements {
            requests: Some(
                [("cpu".to_string(), Quantity(cpu.into())), ("memory".to_string(), Quantity(memory.into()))]
                    .into(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }];
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("pod-{i:05}")),
            namespace: Some("default".into()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(spec),
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

/// Prints the price of the plan for `n` generic pods against the lower bounds.
fn cost_quality(n: usize) {
    let types = instance_types();
    let inp = input(make_pods(&[(Kind::Generic, n)]), &types);
    let r = schedule(&inp);
    let plan: f64 = r
        .new_node_claims
        .iter()
        .filter_map(|c| c.instance_type_options.first().and_then(|t| t.cheapest_price(&c.requirements)))
        .sum();
    let price = |t: &InstanceType| t.cheapest_price(&Requirements::default()).unwrap_or(f64::INFINITY);
    let requests: Vec<Resources> = inp.pods.iter().map(|p| pod_requests(p)).collect();
    let unit = |get: fn(&Resources) -> i64| {
        types
            .iter()
            .filter(|t| get(t.allocatable()) > 0)
            .map(|t| price(t) / get(t.allocatable()) as f64)
            .fold(f64::INFINITY, f64::min)
    };
    let per_resource =
        [(|r: &Resources| r.cpu) as fn(&Resources) -> i64, |r: &Resources| r.memory, |r: &Resources| r.pods]
            .into_iter()
            .map(|get| requests.iter().map(|q| get(q) as f64).sum::<f64>() * unit(get))
            .fold(0.0, f64::max);
    let per_pod: f64 = requests
        .iter()
        .map(|q| {
            types
                .iter()
                .filter(|t| t.fits(q))
                .map(|t| {
                    let a = t.allocatable();
                    let share = [(q.cpu, a.cpu), (q.memory, a.memory), (q.pods, a.pods)]
                        .into_iter()
                        .map(|(x, y)| x as f64 / y as f64)
                        .fold(0.0, f64::max);
                    share * price(t)
                })
                .fold(f64::INFINITY, f64::min)
        })
        .sum();
    eprintln!(
        "cost quality, {n} generic pods: plan ${plan:.2}/h on {} nodeclaims; per-resource bound ${per_resource:.2}/h ({:.3}x); per-pod bound ${per_pod:.2}/h ({:.3}x)",
        r.new_node_claims.len(),
        plan / per_resource,
        plan / per_pod
    );
}

fn bench(c: &mut Criterion) {
    for n in [100, 1000, 5000] {
        cost_quality(n);
    }
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
