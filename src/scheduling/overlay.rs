//! NodeOverlays resolved against the instance types of each NodePool (pure).
//!
//! [`evaluate`] takes every NodeOverlay and the instance types each NodePool resolves to, and
//! answers which overlays apply ([`Verdict`]) and what they change ([`OverlayStore`]); the store
//! then turns a NodePool's instance types into the overlaid ones ([`OverlayStore::apply`]).
//!
//! The rules are upstream's: overlays are taken by weight, highest first, and by name,
//! last in the alphabet first, among equal weights. An overlay applies to an instance type of a
//! NodePool when its requirements are compatible with the type's labels, the NodePool's name
//! (`karpenter.sh/nodepool`) and the labels of the NodePool's template; it then changes the
//! price of the type's offerings its requirements allow (zone, capacity type). The first overlay
//! to price an offering wins it; one of the same weight pricing the same offering is in
//! conflict. Capacity merges: each extended resource comes from the first overlay that adds it,
//! and an overlay is in conflict when one of the same weight added the same resource to the same
//! type. An overlay in conflict (or invalid) applies nowhere: it is all or nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::apis::labels::LABEL_NODEPOOL;
use crate::apis::nodeoverlay::RESTRICTED_CAPACITY;
use crate::apis::{NodeOverlay, NodePool};

use super::instancetypes::{InstanceType, Offering, OverlayMarks};
use super::requirements::{Requirement, Requirements};
use super::resources::parse_quantity_for;

/// A change of price, as `price` or `priceAdjustment` write it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PriceChange {
    /// `price: "0.25"`: this price.
    Set(f64),
    /// `priceAdjustment: "-0.05"`: this much more (or less), never below zero.
    Add(f64),
    /// `priceAdjustment: "+10%"`: this percentage more (or less), never below zero.
    Percent(f64),
}

impl PriceChange {
    /// Reads a `price` (no sign) or a `priceAdjustment` (signed, optionally a percentage).
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let signed = text.starts_with('+') || text.starts_with('-');
        let change = if let Some(percent) = text.strip_suffix('%') {
            if !signed {
                return None;
            }
            PriceChange::Percent(percent.parse().ok()?)
        } else if signed {
            PriceChange::Add(text.parse().ok()?)
        } else {
            PriceChange::Set(text.parse().ok()?)
        };
        let value = match change {
            PriceChange::Set(v) | PriceChange::Add(v) | PriceChange::Percent(v) => v,
        };
        value.is_finite().then_some(change)
    }

    /// `price` changed.
    pub fn apply(self, price: f64) -> f64 {
        match self {
            PriceChange::Set(v) => v,
            PriceChange::Add(v) => (price + v).max(0.0),
            PriceChange::Percent(v) => (price * (1.0 + v / 100.0)).max(0.0),
        }
    }
}

/// What became of one NodeOverlay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It applies, to this many instance types (over all NodePools; possibly none).
    Applied {
        /// (NodePool, instance type) pairs it changed.
        types: usize,
    },
    /// It cannot be applied as written (the checks the API server's schema cannot make).
    Invalid(String),
    /// Another overlay of the same weight changes the same thing.
    Conflict,
}

/// The condition reason upstream gives an invalid overlay.
pub const REASON_RUNTIME_VALIDATION: &str = "RuntimeValidation";
/// The condition reason upstream gives an overlay in conflict.
pub const REASON_CONFLICT: &str = "Conflict";
/// The condition message upstream gives an overlay in conflict.
pub const CONFLICT_MESSAGE: &str = "conflict with another overlay";

/// A NodePool as the overlays see it: its name, its template's labels and its instance types.
pub struct PoolTypes<'a> {
    /// The NodePool's name.
    pub name: &'a str,
    /// The labels of its template.
    pub labels: &'a BTreeMap<String, String>,
    /// The instance types the cloud provider resolves for it (without overlays).
    pub types: &'a [Arc<InstanceType>],
}

/// The result of [`evaluate`].
#[derive(Clone, Debug, Default)]
pub struct Evaluation {
    /// What the applied overlays change.
    pub store: OverlayStore,
    /// By overlay name.
    pub verdicts: BTreeMap<String, Verdict>,
}

/// What the overlays change, per NodePool and instance type.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OverlayStore {
    updates: BTreeMap<String, BTreeMap<String, TypeUpdate>>,
    evaluated: BTreeSet<String>,
}

/// The changes to one instance type of one NodePool.
#[derive(Clone, Debug, Default, PartialEq)]
struct TypeUpdate {
    /// By offering (zone, capacity type).
    prices: BTreeMap<(String, String), PriceUpdate>,
    /// Extended resource → (amount, the overlay that added it).
    capacity: BTreeMap<String, (i64, String)>,
    /// The weight of the last (lowest-weight) overlay that added capacity, and what it added.
    capacity_last: Option<(i32, BTreeSet<String>)>,
}

#[derive(Clone, Debug, PartialEq)]
struct PriceUpdate {
    change: PriceChange,
    overlay: String,
    /// The weight of the last (lowest-weight) overlay that selected this offering.
    last_weight: i32,
}

/// The error when a NodePool's instance types are asked for before the overlays were evaluated
/// against them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("nodepool {0:?} is awaiting evaluation")]
pub struct AwaitingEvaluation(pub String);

impl OverlayStore {
    /// A store that knows no NodePool yet: every NodePool awaits evaluation.
    pub fn new() -> Self {
        OverlayStore::default()
    }

    /// Whether the overlays were evaluated against `pool`'s instance types.
    pub fn is_evaluated(&self, pool: &str) -> bool {
        self.evaluated.contains(pool)
    }

    /// `pool`'s instance types with the overlays applied (those no overlay changes shared, not
    /// copied).
    pub fn apply(
        &self,
        pool: &str,
        types: Vec<Arc<InstanceType>>,
    ) -> Result<Vec<Arc<InstanceType>>, AwaitingEvaluation> {
        if !self.is_evaluated(pool) {
            return Err(AwaitingEvaluation(pool.to_string()));
        }
        let Some(updates) = self.updates.get(pool) else { return Ok(types) };
        Ok(types
            .into_iter()
            .map(|it| match updates.get(&it.name) {
                Some(update) => Arc::new(update.apply(&it)),
                None => it,
            })
            .collect())
    }
}

impl TypeUpdate {
    fn apply(&self, it: &InstanceType) -> InstanceType {
        let mut price_by = BTreeSet::new();
        let offerings: Vec<Offering> = it
            .offerings
            .iter()
            .map(|o| {
                let mut o = o.clone();
                if let Some(update) = self.prices.get(&(o.zone.clone(), o.capacity_type.clone())) {
                    o.reprice(|p| update.change.apply(p));
                    price_by.insert(update.overlay.clone());
                }
                o
            })
            .collect();
        let extra: BTreeMap<String, i64> = self.capacity.iter().map(|(k, (v, _))| (k.clone(), *v)).collect();
        let capacity_by: BTreeSet<String> = self.capacity.values().map(|(_, o)| o.clone()).collect();
        let marks = OverlayMarks {
            price: price_by.into_iter().collect(),
            capacity: capacity_by.into_iter().collect(),
        };
        it.overlaid(offerings, &extra, marks)
    }

    fn price_conflicts(&self, offerings: &[(String, String)], weight: i32) -> bool {
        offerings.iter().any(|key| self.prices.get(key).is_some_and(|u| u.last_weight == weight))
    }

    fn capacity_conflicts(&self, capacity: &BTreeMap<String, i64>, weight: i32) -> bool {
        self.capacity_last
            .as_ref()
            .is_some_and(|(w, added)| *w == weight && capacity.keys().any(|k| added.contains(k)))
    }
}

/// An overlay as [`evaluate`] reads it.
struct Parsed<'a> {
    name: &'a str,
    weight: i32,
    requirements: Requirements,
    price: Option<PriceChange>,
    capacity: BTreeMap<String, i64>,
}

/// Reads `overlay`, or says why it cannot be applied (every problem, `; `-separated).
fn parse(overlay: &NodeOverlay) -> Result<Parsed<'_>, String> {
    let spec = &overlay.spec;
    let mut problems = Vec::new();
    let mut requirements = Requirements::new();
    for r in &spec.requirements {
        match Requirement::new(&r.key, r.operator, &r.values) {
            Ok(req) => requirements.add(&r.key, req),
            Err(e) => problems.push(format!("invalid value: {e} in requirements, restricted")),
        }
        if r.operator == crate::apis::Operator::NotIn && r.values.is_empty() {
            problems.push(format!("key {} with operator NotIn must have a value defined", r.key));
        }
    }
    let mut capacity = BTreeMap::new();
    for (name, quantity) in spec.capacity.iter().flatten() {
        if RESTRICTED_CAPACITY.contains(&name.as_str()) {
            problems.push(format!("invalid capacity: {name} in resource, restricted"));
            continue;
        }
        match parse_quantity_for(name, quantity) {
            Ok(v) if v >= 0 => {
                capacity.insert(name.clone(), v);
            }
            _ => problems.push(format!("invalid capacity: {name}: {:?} is not a quantity", quantity.0)),
        }
    }
    if spec.price.is_some() && spec.price_adjustment.is_some() {
        problems.push("cannot set both 'price' and 'priceAdjustment'".to_string());
    }
    let price_text = spec.price.as_deref().or(spec.price_adjustment.as_deref());
    let price = price_text.and_then(PriceChange::parse);
    if let (Some(text), None) = (price_text, price) {
        problems.push(format!("invalid price {text:?}"));
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    Ok(Parsed {
        name: overlay.metadata.name.as_deref().unwrap_or_default(),
        weight: overlay.weight(),
        requirements,
        price,
        capacity,
    })
}

/// An instance type an overlay selects, with the offerings (zone, capacity type) it prices.
type Selected<'a> = (&'a str, Vec<(String, String)>);

/// A NodePool with, per instance type, the requirements an overlay is compared with: the type's
/// labels, the NodePool's name and its template's labels.
struct PoolView<'a> {
    name: &'a str,
    types: Vec<(&'a Arc<InstanceType>, Requirements)>,
}

impl<'a> PoolView<'a> {
    fn new(pool: &PoolTypes<'a>) -> Self {
        let mut base = Requirements::from_labels(pool.labels);
        base.add(LABEL_NODEPOOL, Requirement::in_values([pool.name]));
        let types = pool
            .types
            .iter()
            .map(|it| {
                let mut reqs = base.clone();
                reqs.add_all(&it.requirements);
                (it, reqs)
            })
            .collect();
        PoolView { name: pool.name, types }
    }

    /// Per instance type the overlay selects: its name and the offerings (zone, capacity type)
    /// whose price it changes.
    fn selected(&self, overlay: &Parsed<'_>) -> Vec<Selected<'a>> {
        self.types
            .iter()
            .filter(|(_, reqs)| reqs.is_compatible(&overlay.requirements, false))
            .filter_map(|(it, _)| {
                let offerings: Vec<(String, String)> = it
                    .offerings
                    .iter()
                    .filter(|o| o.is_compatible(&overlay.requirements))
                    .map(|o| (o.zone.clone(), o.capacity_type.clone()))
                    .collect();
                (!offerings.is_empty()).then_some((it.name.as_str(), offerings))
            })
            .collect()
    }
}

/// The overlays in the order they are applied: weight descending, then name descending.
pub fn order<'a>(overlays: impl IntoIterator<Item = &'a NodeOverlay>) -> Vec<&'a NodeOverlay> {
    let mut ordered: Vec<&NodeOverlay> = overlays.into_iter().collect();
    ordered.sort_by(|a, b| b.weight().cmp(&a.weight()).then_with(|| b.metadata.name.cmp(&a.metadata.name)));
    ordered
}

/// [`evaluate`] over NodePools and the instance types each resolves to.
pub fn evaluate_nodepools<'a, 'p>(
    overlays: impl IntoIterator<Item = &'a NodeOverlay>,
    pools: impl IntoIterator<Item = (&'p NodePool, &'p [Arc<InstanceType>])>,
) -> Evaluation {
    let no_labels = BTreeMap::new();
    let views: Vec<PoolTypes<'_>> = pools
        .into_iter()
        .map(|(np, types)| PoolTypes {
            name: np.metadata.name.as_deref().unwrap_or_default(),
            labels: np.spec.template.metadata.as_ref().map_or(&no_labels, |m| &m.labels),
            types,
        })
        .collect();
    evaluate(overlays, &views)
}

/// Evaluates every overlay (those being deleted left out) against every NodePool of `pools`.
pub fn evaluate<'a>(
    overlays: impl IntoIterator<Item = &'a NodeOverlay>,
    pools: &[PoolTypes<'_>],
) -> Evaluation {
    let views: Vec<PoolView<'_>> = pools.iter().map(PoolView::new).collect();
    let mut store = OverlayStore::new();
    let mut verdicts = BTreeMap::new();
    let live = overlays.into_iter().filter(|o| o.metadata.deletion_timestamp.is_none());
    for overlay in order(live) {
        let name = overlay.metadata.name.clone().unwrap_or_default();
        let parsed = match parse(overlay) {
            Ok(parsed) => parsed,
            Err(problem) => {
                verdicts.insert(name, Verdict::Invalid(problem));
                continue;
            }
        };
        let selections: Vec<(&str, Vec<Selected<'_>>)> =
            views.iter().map(|v| (v.name, v.selected(&parsed))).collect();
        let conflict = selections.iter().any(|(pool, selected)| {
            let updates = store.updates.get(*pool);
            selected.iter().any(|(it, offerings)| {
                let Some(update) = updates.and_then(|u| u.get(*it)) else { return false };
                (parsed.price.is_some() && update.price_conflicts(offerings, parsed.weight))
                    || (!parsed.capacity.is_empty()
                        && update.capacity_conflicts(&parsed.capacity, parsed.weight))
            })
        });
        if conflict {
            verdicts.insert(name, Verdict::Conflict);
            continue;
        }
        let mut types = 0;
        for (pool, selected) in selections {
            for (it, offerings) in selected {
                types += 1;
                if parsed.price.is_none() && parsed.capacity.is_empty() {
                    continue;
                }
                let update =
                    store.updates.entry(pool.to_string()).or_default().entry(it.to_string()).or_default();
                record(update, &parsed, offerings);
            }
        }
        verdicts.insert(name, Verdict::Applied { types });
    }
    store.evaluated = pools.iter().map(|p| p.name.to_string()).collect();
    Evaluation { store, verdicts }
}

/// Records what `overlay` changes in `update` (no conflict: checked before).
fn record(update: &mut TypeUpdate, overlay: &Parsed<'_>, offerings: Vec<(String, String)>) {
    if let Some(change) = overlay.price {
        for key in offerings {
            update.prices.entry(key).and_modify(|u| u.last_weight = overlay.weight).or_insert_with(|| {
                PriceUpdate { change, overlay: overlay.name.to_string(), last_weight: overlay.weight }
            });
        }
    }
    if !overlay.capacity.is_empty() {
        for (resource, amount) in &overlay.capacity {
            update.capacity.entry(resource.clone()).or_insert_with(|| (*amount, overlay.name.to_string()));
        }
        update.capacity_last = Some((overlay.weight, overlay.capacity.keys().cloned().collect()));
    }
}

#[cfg(test)]
mod tests;
