//! What a plan costs, and the least any plan could cost.
//!
//! A NodeClaim costs the price of its cheapest launch: the cheapest offering its requirements
//! allow of its first (cheapest) instance type option.
//!
//! Two lower bounds price the pods a plan places on new NodeClaims against the instance types the
//! run's NodePools allow (each at the cheapest offering its NodePool allows). The per-resource
//! bound takes, for each of CPU, memory and pods, the requests times the lowest price of a unit of
//! that resource (hourly price over allocatable amount) on any type; the largest of the three. The
//! fractional bound ([`fractional_lower_bound`]) is the least cost of any fractional mix of types
//! that covers all three at once; it is never below the per-resource bound. Neither counts
//! DaemonSet overhead, whole nodes or the pods' own node requirements, so no plan can cost less
//! than either, and a plan within a few percent of the fractional bound is close to the best.

use super::instancetypes::InstanceType;
use super::resources::Resources;
use super::scheduler::{NewNodeClaim, SchedulingInput, SchedulingResults};

/// Hourly price of a NodeClaim's cheapest launch, if it has one.
pub fn claim_price(claim: &NewNodeClaim) -> Option<f64> {
    claim
        .instance_type_options
        .first()
        .and_then(|it| it.compatible_offerings(&claim.requirements).map(|o| o.price).min_by(f64::total_cmp))
}

/// Hourly price of every new NodeClaim of `results`.
pub fn plan_price(results: &SchedulingResults) -> f64 {
    results.new_node_claims.iter().filter_map(claim_price).sum()
}

/// CPU, memory and pods requested by the pods `results` places on new NodeClaims.
fn placed_requests(results: &SchedulingResults) -> [f64; 3] {
    let mut requests = Resources::default();
    for c in &results.new_node_claims {
        requests.add_assign(&c.requests.sub(&c.daemonset_requests));
    }
    amounts(&requests).map(|v| v.max(0) as f64)
}

/// Price and allocatable CPU, memory and pods of every type a NodePool of `input` allows, at the
/// cheapest offering that NodePool allows.
fn priced_types(input: &SchedulingInput) -> Vec<(f64, [f64; 3])> {
    let mut out = Vec::new();
    for np in &input.nodepools {
        for it in np.instance_types.iter().filter(|it| it.is_compatible(&np.requirements)) {
            if let Some(price) = it.cheapest_price(&np.requirements) {
                out.push((price, amounts(it.allocatable()).map(|v| v.max(0) as f64)));
            }
        }
    }
    out
}

/// The per-resource lower bound (see the module) of the pods `results` places on new NodeClaims,
/// over the instance types of `input`'s NodePools.
pub fn per_resource_lower_bound(input: &SchedulingInput, results: &SchedulingResults) -> f64 {
    let requests = placed_requests(results);
    let types = priced_types(input);
    (0..3)
        .filter(|k| requests[*k] > 0.0)
        .map(|k| {
            let unit =
                types.iter().filter(|(_, a)| a[k] > 0.0).map(|(p, a)| p / a[k]).fold(f64::INFINITY, f64::min);
            unit * requests[k]
        })
        .fold(0.0, f64::max)
}

/// The fractional lower bound of the pods `results` places on new NodeClaims: the least cost of
/// instances, in any fractional numbers and any mix of the types of `input`'s NodePools, whose
/// allocatable CPU, memory and pods add up to the pods' requests. No packing costs less. It is at
/// least the per-resource bound, and tighter where the type cheapest per vCPU is not the one
/// cheapest per GiB (as in the EC2 catalog, whose smallest burstable types are the cheapest per
/// vCPU and hold little memory and few pods).
///
/// Worked out through its dual: every weighting `λ` of the three resources (each amount taken as
/// a fraction of the requests) prices the requests at the cheapest type per weighted unit, which
/// bounds every plan; the largest such price over a grid of weightings, refined by a local search,
/// is the bound (to within the search's precision, never above the true one).
pub fn fractional_lower_bound(input: &SchedulingInput, results: &SchedulingResults) -> f64 {
    let requests = placed_requests(results);
    let types: Vec<(f64, [f64; 3])> = priced_types(input)
        .into_iter()
        .map(|(p, a)| (p, [0, 1, 2].map(|k| if requests[k] > 0.0 { a[k] / requests[k] } else { 0.0 })))
        .collect();
    // A weighting is worth the weight it puts on the resources the pods request: weight on one
    // they do not request bounds nothing (without this, weight moved there made the "bound" grow
    // without limit).
    let requested: [f64; 3] = requests.map(|r| if r > 0.0 { 1.0 } else { 0.0 });
    let value = |l: [f64; 3]| {
        let v = types
            .iter()
            .map(|(p, a)| {
                let d = l[0] * a[0] + l[1] * a[1] + l[2] * a[2];
                if d > 0.0 { p / d } else { f64::INFINITY }
            })
            .fold(f64::INFINITY, f64::min);
        let worth = l[0] * requested[0] + l[1] * requested[1] + l[2] * requested[2];
        if v.is_finite() { v * worth } else { 0.0 }
    };
    const GRID: usize = 24;
    let mut best = ([1.0, 0.0, 0.0], 0.0f64);
    for i in 0..=GRID {
        for j in 0..=GRID - i {
            let l = [i as f64, j as f64, (GRID - i - j) as f64].map(|x| x / GRID as f64);
            let v = value(l);
            if v > best.1 {
                best = (l, v);
            }
        }
    }
    // Move weight between two resources while that raises the bound, in ever smaller steps.
    let mut step = 1.0 / GRID as f64;
    while step > 1e-4 {
        let mut moved = false;
        for (from, to) in [(0, 1), (1, 0), (0, 2), (2, 0), (1, 2), (2, 1)] {
            let mut l = best.0;
            if l[from] < step {
                continue;
            }
            l[from] -= step;
            l[to] += step;
            let v = value(l);
            if v > best.1 {
                best = (l, v);
                moved = true;
            }
        }
        if !moved {
            step /= 2.0;
        }
    }
    best.1.max(per_resource_lower_bound(input, results))
}

fn amounts(r: &Resources) -> [i64; 3] {
    [r.cpu, r.memory, r.pods]
}

/// Whether a NodeClaim of `results` may launch an exotic instance type.
pub fn uses_exotic(claim: &NewNodeClaim) -> bool {
    claim.instance_type_options.iter().any(|it| InstanceType::is_exotic(it))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::instancetypes::{Offering, Overhead};
    use crate::scheduling::requirements::Requirements;
    use crate::scheduling::resources::{CPU, MEMORY, PODS};
    use crate::scheduling::scheduler::{NodePoolInput, schedule};
    use crate::scheduling::tests::{GI, pod, shared};
    use std::sync::Arc;

    fn it(name: &str, cpu: i64, mem_gi: i64, price: f64) -> Arc<InstanceType> {
        Arc::new(InstanceType::new(
            name,
            Requirements::new(),
            Resources::from_pairs([(CPU, cpu * 1000), (MEMORY, mem_gi * GI), (PODS, 100)]),
            Overhead::default(),
            vec![Offering::new("z1", "on-demand", price, true)],
        ))
    }

    #[test]
    fn the_fractional_bound_mixes_types_the_per_resource_bound_prices_apart() {
        // "cpu" is the cheapest per vCPU, "mem" per GiB. 4 vCPU and 8 GiB of pods: 1.6 "cpu" and
        // 0.8 "mem" cover both exactly, for $2.40; per resource, 4 vCPU at $0.50 and 8 GiB at
        // $0.125 bound at $2.00 only.
        let types = vec![it("cpu", 2, 1, 1.0), it("mem", 1, 8, 1.0)];
        let input = SchedulingInput {
            pods: shared((0..4).map(|i| pod(&format!("p{i}"), "1", "2Gi")).collect()),
            nodepools: vec![NodePoolInput::new("default", types)],
            ..Default::default()
        };
        let results = schedule(&input);
        assert!(results.errors.is_empty());
        assert!((per_resource_lower_bound(&input, &results) - 2.0).abs() < 1e-9);
        let fractional = fractional_lower_bound(&input, &results);
        assert!((fractional - 2.4).abs() < 1e-3, "{fractional}");
        // A pod needs 2 GiB: each goes on its own "mem" ($4 in all), above both bounds.
        assert!((plan_price(&results) - 4.0).abs() < 1e-9);
    }

    #[test]
    fn a_resource_no_pod_requests_adds_nothing_to_the_bound() {
        // Two pods of 1 vCPU and no memory: two vCPU at $0.50 each is the bound, whatever weight
        // the search tries on memory.
        let types = vec![it("cpu", 2, 1, 1.0), it("mem", 1, 8, 1.0)];
        let input = SchedulingInput {
            pods: shared((0..2).map(|i| pod(&format!("p{i}"), "1", "0")).collect()),
            nodepools: vec![NodePoolInput::new("default", types)],
            ..Default::default()
        };
        let results = schedule(&input);
        assert!(results.errors.is_empty());
        let fractional = fractional_lower_bound(&input, &results);
        assert!(fractional <= plan_price(&results) + 1e-9, "{fractional} > {}", plan_price(&results));
        assert!((fractional - 1.0).abs() < 1e-3, "{fractional}");
    }

    #[test]
    fn no_pods_on_new_claims_bound_nothing() {
        let input = SchedulingInput {
            nodepools: vec![NodePoolInput::new("default", vec![it("a", 2, 4, 1.0)])],
            ..Default::default()
        };
        let results = schedule(&input);
        assert_eq!(per_resource_lower_bound(&input, &results), 0.0);
        assert_eq!(fractional_lower_bound(&input, &results), 0.0);
        assert_eq!(plan_price(&results), 0.0);
    }
}
