//! The simulation's plan, as printed by `-o json` and `-o yaml` (a stable schema) and as a table.
//!
//! ```json
//! {
//!   "nodeClaims": [{
//!     "nodePool": "default",
//!     "instanceType": "c-1x-amd64",
//!     "instanceTypeOptions": ["c-1x-amd64", "m-1x-amd64"],
//!     "zone": "test-zone-a",
//!     "capacityType": "spot",
//!     "pricePerHour": 0.01560,
//!     "listPricePerHour": 0.01340,
//!     "pods": ["default/inflate-0"]
//!   }],
//!   "existingPlacements": [{"node": "node-1", "pods": ["default/web-0"]}],
//!   "unschedulable": [{"pod": "default/huge", "reasons": ["nodepool \"default\": ..."]}],
//!   "totalPricePerHour": 0.01560,
//!   "totalListPricePerHour": 0.01340,
//!   "lowerBoundPerHour": 0.01248,
//!   "priceToLowerBound": 1.25
//! }
//! ```
//!
//! `instanceType`, `zone`, `capacityType` and `pricePerHour` describe the cheapest launch: the
//! first instance type option (options are cheapest first) and its cheapest offering the claim's
//! requirements allow. `pricePerHour` is what the node costs in full (for a NodePool of an
//! EC2NodeClass: its list price, its volumes, a public IPv4 address when the class asks for one;
//! see [`nodecost`](crate::cloudprovider::aws::nodecost)) and `listPricePerHour` its list price
//! alone. Prices are rounded to six decimals. `lowerBoundPerHour` is a price no plan
//! for the pods placed on new NodeClaims can beat (the fractional bound of
//! [`cost`](crate::scheduling::cost), at least the per-resource one); `priceToLowerBound` is the
//! plan's total over it, to three decimals (absent when the bound is zero). The JSON and YAML list every pod; the table summarises long lists.

use serde::Serialize;

use crate::scheduling::cost::fractional_lower_bound;
use crate::scheduling::{NewNodeClaim, SchedulingInput, SchedulingResults};
use crate::util::summarise_pods;

/// The plan.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// NodeClaims to launch.
    pub node_claims: Vec<NodeClaimReport>,
    /// Pods that fit on existing nodes.
    pub existing_placements: Vec<PlacementReport>,
    /// Pods that fit nowhere.
    pub unschedulable: Vec<UnschedulableReport>,
    /// Sum of the NodeClaims' prices.
    pub total_price_per_hour: f64,
    /// Sum of the NodeClaims' list prices.
    pub total_list_price_per_hour: f64,
    /// The least any plan could cost for the pods placed on new NodeClaims.
    pub lower_bound_per_hour: f64,
    /// `total_price_per_hour` over `lower_bound_per_hour`, when the bound is not zero.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub price_to_lower_bound: Option<f64>,
}

/// A NodeClaim to launch.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimReport {
    /// Its NodePool.
    pub node_pool: String,
    /// The cheapest instance type.
    pub instance_type: String,
    /// Every instance type it may launch as, cheapest first.
    pub instance_type_options: Vec<String>,
    /// Zone of the cheapest offering.
    pub zone: String,
    /// Capacity type of the cheapest offering.
    pub capacity_type: String,
    /// Price of the cheapest offering, per hour: the node's full cost.
    pub price_per_hour: f64,
    /// List price of that offering, per hour.
    pub list_price_per_hour: f64,
    /// The NodeOverlays that set that price, if any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub price_overlays: Vec<String>,
    /// Its pods, as `namespace/name`.
    pub pods: Vec<String>,
}

/// Pods placed on an existing node.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PlacementReport {
    /// The node.
    pub node: String,
    /// The pods, as `namespace/name`.
    pub pods: Vec<String>,
}

/// A pod that fits nowhere.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UnschedulableReport {
    /// The pod, as `namespace/name`.
    pub pod: String,
    /// Why, one reason per NodePool tried (or a single reason not tied to one).
    pub reasons: Vec<String>,
}

/// `p` rounded to six decimals.
pub fn round_price(p: f64) -> f64 {
    // `+ 0.0` turns the -0.0 of an empty sum into 0.0 (printed "-0.0000" otherwise).
    (p * 1e6).round() / 1e6 + 0.0
}

/// A NodeClaim to launch, at its cheapest offering.
pub fn claim_report(claim: &NewNodeClaim) -> NodeClaimReport {
    let first = claim.instance_type_options.first();
    let cheapest = first.and_then(|it| {
        it.compatible_offerings(&claim.requirements)
            .min_by(|a, b| a.price.total_cmp(&b.price).then_with(|| a.zone.cmp(&b.zone)))
            .map(|o| (it.name.clone(), o.zone.clone(), o.capacity_type.clone(), o.price, o.list_price))
    });
    let (instance_type, zone, capacity_type, price, list_price) = cheapest.unwrap_or_default();
    NodeClaimReport {
        node_pool: claim.nodepool.clone(),
        instance_type,
        instance_type_options: claim.instance_type_names.to_vec(),
        zone,
        capacity_type,
        price_per_hour: round_price(price),
        list_price_per_hour: round_price(list_price),
        price_overlays: first
            .and_then(|it| it.overlays.as_ref())
            .map(|m| m.price.clone())
            .unwrap_or_default(),
        pods: claim.pods.iter().map(ToString::to_string).collect(),
    }
}

impl Report {
    /// Builds the report of a scheduling run over `input`.
    pub fn from_results(input: &SchedulingInput, results: &SchedulingResults) -> Self {
        let node_claims: Vec<NodeClaimReport> = results.new_node_claims.iter().map(claim_report).collect();
        let total = round_price(node_claims.iter().map(|c| c.price_per_hour).sum());
        let total_list = round_price(node_claims.iter().map(|c| c.list_price_per_hour).sum());
        let bound = round_price(fractional_lower_bound(input, results));
        Report {
            node_claims,
            existing_placements: results
                .existing_placements
                .iter()
                .map(|p| PlacementReport {
                    node: p.node.clone(),
                    pods: p.pods.iter().map(ToString::to_string).collect(),
                })
                .collect(),
            unschedulable: results
                .errors
                .iter()
                .map(|e| UnschedulableReport {
                    pod: e.pod.to_string(),
                    reasons: match &e.reason {
                        Some(r) => vec![r.clone()],
                        None => e.nodepools.iter().map(|(np, r)| format!("nodepool {np:?}: {r}")).collect(),
                    },
                })
                .collect(),
            total_price_per_hour: total,
            total_list_price_per_hour: total_list,
            lower_bound_per_hour: bound,
            price_to_lower_bound: (bound > 0.0).then(|| (total / bound * 1000.0).round() / 1000.0),
        }
    }

    /// The plan as aligned text tables.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        if self.node_claims.is_empty() {
            out.push_str("No new NodeClaims.\n");
        } else {
            let mut rows = vec![
                ["NODEPOOL", "INSTANCE-TYPE", "ZONE", "CAPACITY-TYPE", "LIST $/H", "$/H", "PODS"]
                    .map(String::from)
                    .to_vec(),
            ];
            for c in &self.node_claims {
                rows.push(vec![
                    c.node_pool.clone(),
                    c.instance_type.clone(),
                    c.zone.clone(),
                    c.capacity_type.clone(),
                    format!("{:.4}", c.list_price_per_hour),
                    format!("{:.4}", c.price_per_hour),
                    summarise_pods(&c.pods),
                ]);
            }
            push_table(&mut out, &rows);
        }
        if !self.existing_placements.is_empty() {
            out.push('\n');
            let mut rows = vec![vec!["EXISTING-NODE".to_string(), "PODS".to_string()]];
            for p in &self.existing_placements {
                rows.push(vec![p.node.clone(), summarise_pods(&p.pods)]);
            }
            push_table(&mut out, &rows);
        }
        if !self.unschedulable.is_empty() {
            out.push('\n');
            let mut rows = vec![vec!["UNSCHEDULABLE-POD".to_string(), "REASONS".to_string()]];
            for u in &self.unschedulable {
                rows.push(vec![u.pod.clone(), u.reasons.join("; ")]);
            }
            push_table(&mut out, &rows);
        }
        out.push_str(&format!(
            "\nTOTAL $/h: {:.4} (list prices {:.4})\n",
            self.total_price_per_hour, self.total_list_price_per_hour
        ));
        if let Some(ratio) = self.price_to_lower_bound {
            out.push_str(&format!(
                "LOWER BOUND $/h: {:.4} (the plan costs {ratio:.3}x that; no plan for these pods costs less)\n",
                self.lower_bound_per_hour
            ));
        }
        out
    }
}

/// Appends rows with columns padded to their widest cell (the last column is not padded).
pub fn push_table(out: &mut String, rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| rows.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}   ", width = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}
