//! Property tests: whatever the pods, pools and instance types, every placement is valid.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::apis::pod::Pod;
use k8s_openapi::api::core::v1::Toleration;
use proptest::prelude::*;

use crate::apis::labels::*;
use crate::apis::{NodeSelectorRequirementWithMinValues, Operator, Taint, TaintEffect};

use super::resources::{CPU, MEMORY, PODS};
use super::taints::check_tolerated;
use super::tests::{GI, pod, shared, with_anti_affinity, with_label, with_spread};
use super::*;

const ZONES: [&str; 3] = ["za", "zb", "zc"];

#[derive(Debug, Clone)]
struct ItSpec {
    cpu: i64,
    mem: i64,
    pods: i64,
    arm: bool,
    zones: Vec<bool>,
    spot: bool,
    price: u32,
    /// With a GPU (an exotic type).
    gpu: bool,
}

fn it_spec() -> impl Strategy<Value = ItSpec> {
    (
        1i64..=16,
        1i64..=64,
        2i64..=40,
        any::<bool>(),
        prop::collection::vec(any::<bool>(), 3),
        any::<bool>(),
        1u32..1000,
        prop::bool::weighted(0.2),
    )
        .prop_map(|(cpu, mem, pods, arm, zones, spot, price, gpu)| ItSpec {
            cpu,
            mem,
            pods,
            arm,
            zones,
            spot,
            price,
            gpu,
        })
}

fn build_it(i: usize, s: &ItSpec) -> Arc<InstanceType> {
    let mut offerings = Vec::new();
    for (z, on) in ZONES.iter().zip(&s.zones) {
        if *on {
            let price = f64::from(s.price) / 100.0;
            offerings.push(Offering::new(z.to_string(), "on-demand", price, true));
            if s.spot {
                offerings.push(Offering::new(z.to_string(), "spot", price / 2.0, !i.is_multiple_of(5)));
            }
        }
    }
    let arch = if s.arm { ARCH_ARM64 } else { ARCH_AMD64 };
    let labels: BTreeMap<String, String> = [(LABEL_ARCH.to_string(), arch.to_string())].into();
    let mut capacity = Resources::from_pairs([(CPU, s.cpu * 1000), (MEMORY, s.mem * GI), (PODS, s.pods)]);
    if s.gpu {
        capacity.set(RESOURCE_NVIDIA_GPU, 1);
    }
    Arc::new(InstanceType::new(
        format!("it-{i}"),
        Requirements::from_labels(&labels),
        capacity,
        Overhead {
            kube_reserved: Resources::from_pairs([(CPU, 100), (MEMORY, 1 << 28)]),
            ..Default::default()
        },
        offerings,
    ))
}

#[derive(Debug, Clone)]
struct PoolSpec {
    weight: i32,
    arch: Option<bool>,
    spot_only: bool,
    tainted: bool,
    cpu_limit: Option<i64>,
}

fn pool_spec() -> impl Strategy<Value = PoolSpec> {
    (0i32..3, prop::option::of(any::<bool>()), any::<bool>(), any::<bool>(), prop::option::of(1i64..40))
        .prop_map(|(weight, arch, spot_only, tainted, cpu_limit)| PoolSpec {
            weight,
            arch,
            spot_only,
            tainted,
            cpu_limit,
        })
}

fn build_pool(i: usize, s: &PoolSpec, types: &[Arc<InstanceType>]) -> NodePoolInput {
    let mut reqs = Vec::new();
    if let Some(arm) = s.arch {
        reqs.push(NodeSelectorRequirementWithMinValues {
            key: LABEL_ARCH.into(),
            operator: Operator::In,
            values: [if arm { ARCH_ARM64 } else { ARCH_AMD64 }].into(),
            min_values: None,
        });
    }
    if s.spot_only {
        reqs.push(NodeSelectorRequirementWithMinValues {
            key: LABEL_CAPACITY_TYPE.into(),
            operator: Operator::In,
            values: ["spot"].into(),
            min_values: None,
        });
    }
    let mut np = NodePoolInput::new(format!("pool-{i}"), types.to_vec()).with_requirements(&reqs).unwrap();
    np.weight = s.weight;
    if s.tainted {
        np.taints = vec![Taint {
            key: "dedicated".into(),
            value: Some("x".into()),
            effect: TaintEffect::NoSchedule,
            time_added: None,
        }];
    }
    np.remaining_limits = s.cpu_limit.map(|c| [("cpu".to_string(), c * 1000)].into());
    np
}

#[derive(Debug, Clone)]
struct PodSpecGen {
    cpu_m: i64,
    mem_mi: i64,
    arch: Option<bool>,
    zone: Option<usize>,
    tolerates: bool,
    anti: bool,
    spread: bool,
}

fn pod_spec() -> impl Strategy<Value = PodSpecGen> {
    (
        50i64..6000,
        64i64..16384,
        prop::option::weighted(0.3, any::<bool>()),
        prop::option::weighted(0.2, 0usize..3),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(cpu_m, mem_mi, arch, zone, tolerates, anti, spread)| PodSpecGen {
            cpu_m,
            mem_mi,
            arch,
            zone,
            tolerates,
            anti,
            spread,
        })
}

fn build_pod(i: usize, s: &PodSpecGen) -> Pod {
    let mut p = pod(&format!("p{i:03}"), &format!("{}m", s.cpu_m), &format!("{}Mi", s.mem_mi));
    if s.anti {
        p = with_anti_affinity(p, LABEL_HOSTNAME, "anti");
    } else if s.spread {
        p = with_spread(p, LABEL_TOPOLOGY_ZONE, "spread", true);
    } else {
        p = with_label(p, "group", "none");
    }
    let spec = p.spec.get_or_insert_with(Default::default);
    if let Some(arm) = s.arch {
        spec.node_selector
            .get_or_insert_with(Default::default)
            .insert(LABEL_ARCH.into(), if arm { ARCH_ARM64 } else { ARCH_AMD64 }.into());
    }
    if let Some(z) = s.zone {
        spec.node_selector
            .get_or_insert_with(Default::default)
            .insert(LABEL_TOPOLOGY_ZONE.into(), ZONES[z].into());
    }
    if s.tolerates {
        spec.tolerations = Some(vec![Toleration {
            key: Some("dedicated".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }]);
    }
    p
}

/// Whether a node with `labels` satisfies the pod's node selector.
fn selector_ok(p: &Pod, labels: &BTreeMap<String, String>) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .is_none_or(|ns| ns.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

fn tolerations(p: &Pod) -> &[Toleration] {
    p.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or(&[])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn placements_are_valid(
        its in prop::collection::vec(it_spec(), 1..12),
        pools in prop::collection::vec(pool_spec(), 1..4),
        pods in prop::collection::vec(pod_spec(), 1..40),
        with_node in any::<bool>(),
        cost_aware in any::<bool>(),
    ) {
        let types: Vec<Arc<InstanceType>> = its.iter().enumerate().map(|(i, s)| build_it(i, s)).collect();
        let pools: Vec<NodePoolInput> = pools.iter().enumerate().map(|(i, s)| build_pool(i, s, &types)).collect();
        let pods = shared(pods.iter().enumerate().map(|(i, s)| build_pod(i, s)).collect());
        let existing = with_node.then(|| ExistingNode {
            name: "node-0".into(),
            labels: [
                (LABEL_HOSTNAME.to_string(), "node-0".to_string()),
                (LABEL_ARCH.to_string(), ARCH_AMD64.to_string()),
                (LABEL_TOPOLOGY_ZONE.to_string(), "za".to_string()),
            ]
            .into(),
            taints: vec![Taint::new("dedicated", TaintEffect::NoSchedule)],
            initialized: true,
            allocatable: Resources::from_pairs([(CPU, 4000), (MEMORY, 8 * GI), (PODS, 10)]),
            requested: Resources::from_pairs([(CPU, 500), (MEMORY, GI), (PODS, 1)]),
            ..Default::default()
        });
        let ds = pod("ds", "100m", "128Mi");
        let input = SchedulingInput {
            pods: pods.clone(),
            nodepools: pools.clone(),
            existing_nodes: existing.clone().into_iter().map(Arc::new).collect(),
            daemonsets: vec![ds],
            options: SchedulerOptions {
                packing: if cost_aware { Packing::CostAware } else { Packing::LargestFit },
                ..Default::default()
            },
            ..Default::default()
        };
        let r = schedule(&input);

        // Every pod is either placed once or reported.
        let mut seen = BTreeSet::new();
        for c in &r.new_node_claims {
            for p in &c.pods {
                prop_assert!(seen.insert(p.index));
            }
        }
        for e in &r.existing_placements {
            for p in &e.pods {
                prop_assert!(seen.insert(p.index));
            }
        }
        for e in &r.errors {
            prop_assert!(seen.insert(e.pod.index));
        }
        prop_assert_eq!(seen.len(), pods.len());

        let by_name: BTreeMap<&str, &NodePoolInput> = pools.iter().map(|p| (p.name.as_str(), p)).collect();
        let mut reserved: BTreeMap<&str, i64> = BTreeMap::new();
        for c in &r.new_node_claims {
            let np = by_name[c.nodepool.as_str()];
            prop_assert!(!c.instance_type_options.is_empty());
            // No pod asks for a GPU: exotic types only when no other type holds the claim.
            if cost_aware {
                let exotic = c.instance_type_options.iter().filter(|it| it.is_exotic()).count();
                prop_assert!(exotic == 0 || exotic == c.instance_type_options.len(), "{:?}", c.instance_type_names);
            }
            // Requests (pods plus DaemonSet overhead) fit every option, the cheapest included.
            for it in c.instance_type_options.iter() {
                prop_assert!(c.requests.fits(it.allocatable()), "{} does not fit {}", c.requests, it.name);
            }
            let summed = c.pods.iter().fold(c.daemonset_requests.clone(), |acc, p| acc.add(&pod_requests_of(&pods[p.index])));
            prop_assert_eq!(&summed, &c.requests);
            // Every possible launch (option x compatible offering) satisfies every pod.
            for it in c.instance_type_options.iter() {
                let offerings: Vec<&Offering> = it.compatible_offerings(&c.requirements).collect();
                prop_assert!(!offerings.is_empty());
                for o in offerings {
                    let mut labels = it.requirements.single_valued_labels();
                    labels.insert(LABEL_TOPOLOGY_ZONE.into(), o.zone.clone());
                    labels.insert(LABEL_CAPACITY_TYPE.into(), o.capacity_type.clone());
                    labels.extend(c.labels.clone());
                    prop_assert!(np.requirements.iter().all(|(k, req)| labels.get(k).is_some_and(|v| req.has(v))));
                    for p in &c.pods {
                        prop_assert!(selector_ok(&pods[p.index], &labels), "{} on {} in {}", p, it.name, o.zone);
                    }
                }
            }
            for p in &c.pods {
                prop_assert!(check_tolerated(&np.taints, tolerations(&pods[p.index])).is_ok());
            }
            // Hostname anti-affinity: at most one pod of the group per node.
            let anti = c.pods.iter().filter(|p| pods[p.index].metadata.labels.as_ref().and_then(|l| l.get("group")).is_some_and(|g| g == "anti")).count();
            prop_assert!(anti <= 1);
            if let Some(lim) = &np.remaining_limits {
                let max_cpu = c.instance_type_options.iter().map(|it| it.capacity.cpu).max().unwrap_or(0);
                *reserved.entry(np.name.as_str()).or_default() += max_cpu;
                prop_assert!(reserved[np.name.as_str()] <= lim["cpu"], "limit of {} exceeded", np.name);
            }
        }
        if let Some(n) = &existing {
            for e in &r.existing_placements {
                let mut used = n.requested.clone();
                let mut anti = 0;
                for p in &e.pods {
                    let pod = &pods[p.index];
                    prop_assert!(selector_ok(pod, &n.labels));
                    prop_assert!(check_tolerated(&n.taints, tolerations(pod)).is_ok());
                    used.add_assign(&pod_requests_of(pod));
                    if pod.metadata.labels.as_ref().and_then(|l| l.get("group")).is_some_and(|g| g == "anti") {
                        anti += 1;
                    }
                }
                prop_assert!(used.fits(&n.allocatable));
                prop_assert!(anti <= 1);
            }
        }
        // Deterministic.
        let again = schedule(&input);
        let key = |r: &SchedulingResults| r.new_node_claims.iter().map(|c| (c.nodepool.clone(), c.pods.clone(), c.instance_type_names.clone())).collect::<Vec<_>>();
        prop_assert_eq!(key(&r), key(&again));
    }
}

fn pod_requests_of(p: &Pod) -> Resources {
    super::resources::pod_requests(p)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// With every zone offered by every instance type, zonal spread (maxSkew 1) holds exactly,
    /// and hostname spread puts one pod of the group per node.
    #[test]
    fn spreads_hold(
        sizes in prop::collection::vec((100i64..4000, 128i64..8192), 1..40),
        host in any::<bool>(),
    ) {
        let types: Vec<Arc<InstanceType>> = [2i64, 4, 8, 16]
            .iter()
            .enumerate()
            .map(|(i, c)| build_it(i, &ItSpec { cpu: *c, mem: 4 * c, pods: 30, arm: false, zones: vec![true; 3], spot: false, price: 10 * (i as u32 + 1), gpu: false }))
            .collect();
        let key = if host { LABEL_HOSTNAME } else { LABEL_TOPOLOGY_ZONE };
        let pods = shared(sizes
            .iter()
            .enumerate()
            .map(|(i, (c, m))| with_spread(pod(&format!("p{i}"), &format!("{c}m"), &format!("{m}Mi")), key, "s", true))
            .collect());
        let r = schedule(&SchedulingInput { pods: pods.clone(), nodepools: vec![NodePoolInput::new("default", types)], ..Default::default() });
        prop_assert!(r.errors.is_empty());
        if host {
            prop_assert!(r.new_node_claims.iter().all(|c| c.pods.len() == 1));
        } else {
            let mut per_zone: BTreeMap<String, usize> = ZONES.iter().map(|z| (z.to_string(), 0)).collect();
            for c in &r.new_node_claims {
                let zone = c.requirements.get(LABEL_TOPOLOGY_ZONE).and_then(|r| r.single()).map(str::to_string);
                prop_assert!(zone.is_some());
                *per_zone.entry(zone.unwrap_or_default()).or_default() += c.pods.len();
            }
            let max = per_zone.values().max().copied().unwrap_or(0);
            let min = per_zone.values().min().copied().unwrap_or(0);
            prop_assert!(max - min <= 1, "{per_zone:?}");
        }
    }
}
