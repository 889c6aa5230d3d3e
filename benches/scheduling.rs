//! Scheduling throughput, after upstream Karpenter's `BenchmarkScheduling`.
//!
//! 400 instance types (type `i` has `i+1` vCPU, `2(i+1)` GiB and `10(i+1)` pods, amd64, spot in
//! two zones and on-demand in three, priced `0.1 × vCPU + 0.1 × GiB`), one NodePool without
//! requirements, and pods split in fifths: generic, zonal topology spread (maxSkew 1,
//! DoNotSchedule), hostname topology spread, zonal self-affinity, and hostname self
//! anti-affinity, with CPU and memory requests drawn from a seeded generator.
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

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{
    Affinity, Container, Pod, PodAffinity, PodAffinityTerm, PodAntiAffinity, PodSpec, ResourceRequirements,
    TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use karpenter::apis::labels::{ARCH_AMD64, LABEL_ARCH, LABEL_HOSTNAME, LABEL_OS, LABEL_TOPOLOGY_ZONE};
use karpenter::scheduling::resources::pod_requests;
use karpenter::scheduling::{
    InstanceType, NodePoolInput, Offering, Overhead, Requirements, Resources, SchedulingInput, schedule,
};

const GI: i64 = 1 << 30;

fn instance_types() -> Vec<Arc<InstanceType>> {
    (0..400i64)
        .map(|i| {
            let cpu = i + 1;
            let mem = 2 * (i + 1);
            let price = 0.1 * cpu as f64 + 0.1 * mem as f64;
            let mut offerings = Vec::new();
            for z in 1..=3 {
                let zone = format!("test-zone-{z}");
                if z <= 2 {
                    offerings.push(Offering {
                        zone: zone.clone(),
                        capacity_type: "spot".into(),
                        price,
                        available: true,
                    });
                }
                offerings.push(Offering { zone, capacity_type: "on-demand".into(), price, available: true });
            }
            let labels: BTreeMap<String, String> = [
                (LABEL_ARCH.to_string(), ARCH_AMD64.to_string()),
                (LABEL_OS.to_string(), "linux".to_string()),
            ]
            .into();
            Arc::new(InstanceType::new(
                format!("fake-it-{i}"),
                Requirements::from_labels(&labels),
                Resources::from_pairs([("cpu", cpu * 1000), ("memory", mem * GI), ("pods", 10 * cpu)]),
                Overhead::default(),
                offerings,
            ))
        })
        .collect()
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
}

fn selector(group: &str) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some([("group".to_string(), group.to_string())].into()),
        match_expressions: None,
    })
}

fn pods(n: usize) -> Vec<Pod> {
    pods_of_kinds(n, 5)
}

/// `n` pods, the first `kinds` of the five kinds in equal shares (1: generic only).
fn pods_of_kinds(n: usize, kinds: usize) -> Vec<Pod> {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let cpus = ["100m", "250m", "500m", "1", "1.5"];
    let mems = ["100Mi", "256Mi", "512Mi", "1Gi", "2Gi", "4Gi"];
    (0..n)
        .map(|i| {
            let kind = i * kinds / n.max(1);
            let group =
                ["generic", "zonal-spread", "host-spread", "zonal-affinity", "host-anti"][kind.min(4)];
            let mut spec = PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some(
                            [
                                ("cpu".to_string(), Quantity(rng.pick(&cpus).into())),
                                ("memory".to_string(), Quantity(rng.pick(&mems).into())),
                            ]
                            .into(),
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            };
            let spread = |key: &str| {
                Some(vec![TopologySpreadConstraint {
                    max_skew: 1,
                    topology_key: key.into(),
                    when_unsatisfiable: "DoNotSchedule".into(),
                    label_selector: selector(group),
                    ..Default::default()
                }])
            };
            let term = |key: &str| {
                vec![PodAffinityTerm {
                    topology_key: key.into(),
                    label_selector: selector(group),
                    ..Default::default()
                }]
            };
            match kind {
                1 => spec.topology_spread_constraints = spread(LABEL_TOPOLOGY_ZONE),
                2 => spec.topology_spread_constraints = spread(LABEL_HOSTNAME),
                3 => {
                    spec.affinity = Some(Affinity {
                        pod_affinity: Some(PodAffinity {
                            required_during_scheduling_ignored_during_execution: Some(term(
                                LABEL_TOPOLOGY_ZONE,
                            )),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                }
                4 => {
                    spec.affinity = Some(Affinity {
                        pod_anti_affinity: Some(PodAntiAffinity {
                            required_during_scheduling_ignored_during_execution: Some(term(LABEL_HOSTNAME)),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                }
                _ => {}
            }
            Pod {
                metadata: ObjectMeta {
                    name: Some(format!("pod-{i:05}")),
                    namespace: Some("default".into()),
                    labels: Some([("group".to_string(), group.to_string())].into()),
                    ..Default::default()
                },
                spec: Some(spec),
                ..Default::default()
            }
        })
        .collect()
}

fn input(n: usize) -> SchedulingInput {
    SchedulingInput {
        pods: pods(n).into_iter().map(Arc::new).collect(),
        nodepools: vec![NodePoolInput::new("default", instance_types())],
        ..Default::default()
    }
}

/// Prints the price of the plan for `n` generic pods against the lower bounds.
fn cost_quality(n: usize) {
    let types = instance_types();
    let pods: Vec<Arc<Pod>> = pods_of_kinds(n, 1).into_iter().map(Arc::new).collect();
    let inp = SchedulingInput {
        pods: pods.clone(),
        nodepools: vec![NodePoolInput::new("default", types.clone())],
        ..Default::default()
    };
    let r = schedule(&inp);
    let plan: f64 = r
        .new_node_claims
        .iter()
        .filter_map(|c| c.instance_type_options.first().and_then(|t| t.cheapest_price(&c.requirements)))
        .sum();
    let price = |t: &InstanceType| t.cheapest_price(&Requirements::default()).unwrap_or(f64::INFINITY);
    let requests: Vec<Resources> = pods.iter().map(|p| pod_requests(p)).collect();
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
    let mut group = c.benchmark_group("scheduling");
    group.sample_size(10);
    for n in [1usize, 100, 1000, 5000, 20000] {
        let inp = input(n);
        let start = Instant::now();
        let r = schedule(&inp);
        let placed: usize = r.new_node_claims.iter().map(|c| c.pods.len()).sum();
        eprintln!(
            "{n} pods: {} nodeclaims, {placed} placed, {} unschedulable, first run {:?}",
            r.new_node_claims.len(),
            r.errors.len(),
            start.elapsed()
        );
        group.bench_with_input(BenchmarkId::from_parameter(n), &inp, |b, inp| {
            b.iter(|| schedule(black_box(inp)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
