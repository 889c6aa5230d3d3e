//! The bin-packing simulation: places pending pods on existing nodes and on new NodeClaims.
//!
//! Pods are taken largest first (CPU, then memory, then age and name), CPU-heavy and
//! memory-heavy pods alternating (see [`Packing`]). Each pod tries, in order, the existing and
//! in-flight nodes, the NodeClaims already opened in this run, and finally a new NodeClaim from
//! each NodePool by weight. A NodeClaim keeps every instance type that can still hold all its pods
//! plus the DaemonSet overhead; adding a pod narrows its requirements and its instance types, and
//! fails when none is left, or when every type left would cost clearly more per unit of the
//! claim's binding resource than the cheapest type its requirements allow (the claim is then
//! closed at the size where it is cheapest per unit). Exotic types (bare metal, GPUs,
//! accelerators) are dropped from a NodeClaim whenever other types can hold it, so the
//! provisioner, `simulate` and every cloud provider, which launch only from a NodeClaim's list,
//! agree. When a pod fits nowhere its preferences are
//! relaxed one at a time (other required node-affinity terms, preferred node affinity, then
//! `ScheduleAnyway` spreads) before it is reported unschedulable with a reason per NodePool.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Toleration, TopologySpreadConstraint};

use crate::apis::Taint;
use crate::apis::labels::{
    CAPACITY_TYPE_RESERVED, LABEL_CAPACITY_RESERVATION_ID, LABEL_CAPACITY_TYPE, LABEL_HOSTNAME,
    LABEL_TOPOLOGY_ZONE,
};
use crate::apis::values::Values;

pub use super::input::{
    ExistingNode, ExistingPlacement, FEWER_NODES_MARGIN, MinValuesPolicy, NewNodeClaim, NodePoolInput,
    Packing, PodError, PodRef, PreferencePolicy, SchedulerOptions, SchedulingError, SchedulingInput,
    SchedulingResults,
};

use super::hostports::{HostPort, first_conflict, pod_host_ports};
use super::instancetypes::{InstanceType, compare_price};
use super::pools::{OfferingIndex, Pool, PoolCosts, is_offering_label, limited_amount, max_alloc};
use super::requirements::{Requirement, Requirements, keys_compatible, pod_node_requirements};
use super::reservations::Book;
use super::resources::{Resources, format_quantity, pod_requests};
use super::taints::{check_tolerated, is_ephemeral, tolerates_all};
use super::topology::{DomainSource, HostCheck, PodTopology, SlotView, Topology};
use super::volumes::{Attachments, and_terms, exceeded_limit};

/// Why a pod with Dynamic Resource Allocation claims gets no capacity (upstream's words).
pub const DRA_UNSUPPORTED: &str =
    "pod has Dynamic Resource Allocation requirements that are not yet supported by Karpenter";

/// Runs the scheduling simulation over `input`.
pub fn schedule(input: &SchedulingInput) -> SchedulingResults {
    Scheduler::new(input).run()
}

/// A scheduling run set up but not started: pods parsed, topology groups registered and their
/// domains counted, NodePools' instance types ordered. [`PreparedRun::run`] places the pods;
/// `prepare(input).run()` is [`schedule`]. Lets a benchmark time the placement alone.
pub struct PreparedRun<'a>(Scheduler<'a>);

/// Sets up a scheduling run over `input` without placing any pod.
pub fn prepare(input: &SchedulingInput) -> PreparedRun<'_> {
    PreparedRun(Scheduler::new(input))
}

impl PreparedRun<'_> {
    /// Places the pods and returns the outcome.
    pub fn run(self) -> SchedulingResults {
        self.0.run()
    }
}

struct PodInfo<'a> {
    r: PodRef,
    requests: Resources,
    tolerations: &'a [Toleration],
    ports: Vec<HostPort>,
    base: Requirements,
    required_terms: Vec<Requirements>,
    preferred_terms: Vec<Requirements>,
    topo: PodTopology,
    has_soft_spread: bool,
    /// Whether its soft spreads are kube-scheduler's defaults (it sets none of its own).
    default_spread: bool,
    invalid: Option<String>,
    /// Whether `invalid` is a reason upstream's provisioner ignores the pod for (see
    /// [`SchedulingResults::ignored`]).
    ignored: bool,
    /// Volumes per CSI driver, for attach limits of existing nodes.
    volumes: Attachments,
    /// Pods with equal constraints share a class (and a claim cursor).
    class: usize,
    /// Whether a topology constraint of the pod (or constraining it) is on the zone.
    zonal: bool,
}

/// Everything that decides whether a claim rejects a pod for good.
#[derive(PartialEq, Eq, Hash)]
struct ClassKey {
    reqs: (Requirements, Vec<Requirements>, Vec<Requirements>),
    /// Key, operator, value and effect of each toleration.
    tolerations: Vec<[Option<String>; 4]>,
    topo: (Vec<u32>, Vec<u32>, Vec<u32>),
    ports: Vec<HostPort>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Relax {
    /// Index of the required node-affinity term in use.
    term: usize,
    /// Preferred pod (anti-)affinity terms dropped.
    pod_pref: usize,
    /// Index of the preferred node-affinity term in use (heaviest first; past the end: none).
    pref: usize,
    /// Whether `ScheduleAnyway` spreads are enforced.
    soft: bool,
}

impl Relax {
    const INITIAL: Relax = Relax { term: 0, pod_pref: 0, pref: 0, soft: true };
}

impl PodInfo<'_> {
    /// Where a pod's relaxation starts: with every preference in place, or, under
    /// [`PreferencePolicy::Ignore`], with all of them already dropped.
    fn first_state(&self, policy: PreferencePolicy) -> Relax {
        match policy {
            PreferencePolicy::Respect => Relax::INITIAL,
            PreferencePolicy::Ignore => Relax {
                term: 0,
                pod_pref: self.topo.preferred.len(),
                pref: self.preferred_terms.len(),
                soft: false,
            },
        }
    }
}

impl PodInfo<'_> {
    fn requirements(&self, s: Relax) -> Cow<'_, Requirements> {
        let term = self.required_terms.get(s.term);
        let pref = self.preferred_terms.get(s.pref);
        if term.is_none() && pref.is_none() {
            return Cow::Borrowed(&self.base);
        }
        let mut r = self.base.clone();
        if let Some(t) = term {
            r.add_all(t);
        }
        if let Some(p) = pref {
            r.add_all(p);
        }
        Cow::Owned(r)
    }

    fn relax(&self, s: &mut Relax) -> bool {
        if s.term + 1 < self.required_terms.len() {
            s.term += 1;
        } else if s.pod_pref < self.topo.preferred.len() {
            s.pod_pref += 1;
        } else if s.pref < self.preferred_terms.len() {
            s.pref += 1;
        } else if s.soft && self.has_soft_spread {
            s.soft = false;
        } else {
            return false;
        }
        true
    }
}

struct Claim {
    pool: usize,
    host_id: u32,
    reqs: Requirements,
    requests: Resources,
    pods: Vec<usize>,
    its: Vec<u32>,
    /// With [`Packing::CostAware`]: the types its requirements allow that are too small to hold
    /// it (with `its`, the types whose price per unit sets how far it may grow).
    small: Vec<u32>,
    ports: Vec<HostPort>,
    /// Per CPU, memory and pods: the most any type it may still grow into allocates.
    max_alloc: [i64; 3],
    reserved: BTreeMap<String, i64>,
    min_values_relaxed: bool,
    /// The capacity reservations it holds an instance of (see [`super::reservations`]).
    holds: Vec<String>,
}

struct NodeSlot<'a> {
    node: &'a ExistingNode,
    reqs: &'a Requirements,
    taints: Vec<Taint>,
    used: Resources,
    pods: Vec<usize>,
    ports: Vec<HostPort>,
    host_id: u32,
    /// Most volumes per CSI driver, if the node reports limits.
    attach_limits: Option<&'a BTreeMap<String, i64>>,
    /// Volumes per CSI driver of its pods (tracked only with limits).
    attached: Attachments,
}

struct Scheduler<'a> {
    input: &'a SchedulingInput,
    pods: Vec<PodInfo<'a>>,
    pools: Vec<Pool<'a>>,
    nodes: Vec<NodeSlot<'a>>,
    claims: Vec<Claim>,
    topo: Topology,
    offer_idx: OfferingIndex,
    /// Per pod class: the existing nodes that reject the class for good.
    nodes_rejected: Rejections,
    /// Per pod class: the claims that reject the class for good.
    rejected: Rejections,
    /// Per pool (in `pools` order): prices and exotic flags of its instance types.
    costs: Vec<PoolCosts>,
    /// Instances left in the capacity reservations.
    book: Book,
    /// Set when the last claim refused a pod because the reservations it could use are held.
    refused_for_reservation: bool,
    /// Pods placed on an existing node with a preference given up (see
    /// [`SchedulerOptions::preferences_yield_to_existing`]).
    preferences_broken: Vec<usize>,
}

/// Why a claim rejected a pod: the reason (empty unless asked for) and whether it is for good.
type Reject = (String, bool);

/// Per pod class, a bit set of the slots (existing nodes, or claims) that reject the class for
/// good: the pods of a class share everything such a verdict rests on, so the next pod of the
/// class skips those slots, a word of the set at a time.
struct Rejections(Vec<Vec<u64>>);

impl Rejections {
    fn new(classes: usize) -> Self {
        Rejections(vec![Vec::new(); classes])
    }

    /// `None` when slot `i` may still take a pod of `class`; otherwise the next slot to try (past
    /// the whole word when every slot of it rejects the class).
    fn skip(&self, class: usize, i: usize) -> Option<usize> {
        let word = self.0.get(class)?.get(i / 64).copied().unwrap_or(0);
        if word == u64::MAX {
            return Some((i / 64 + 1) * 64);
        }
        ((word >> (i % 64)) & 1 == 1).then_some(i + 1)
    }

    /// Records that slot `i` rejects `class` for good.
    fn set(&mut self, class: usize, i: usize) {
        let Some(set) = self.0.get_mut(class) else { return };
        if set.len() <= i / 64 {
            set.resize(i / 64 + 1, 0);
        }
        set[i / 64] |= 1 << (i % 64);
    }
}

impl<'a> Scheduler<'a> {
    fn new(input: &'a SchedulingInput) -> Self {
        let mut topo = Topology::default();
        // Constraints of pending pods (with kube-scheduler's default spreads), then of bound pods
        // (for the inverse anti-affinity).
        let defaults: Vec<Vec<TopologySpreadConstraint>> =
            input.pods.iter().map(|p| input.options.default_spread.for_pod(p)).collect();
        let owned: Vec<(Vec<u32>, Vec<u32>)> = input
            .pods
            .iter()
            .zip(&defaults)
            .map(|(p, d)| topo.register_pod(p, d, &input.namespace_labels))
            .collect();
        let existing_owned: Vec<Vec<(Vec<u32>, Vec<u32>)>> = input
            .existing_nodes
            .iter()
            .map(|n| match n.derived().constrains {
                true => n.pods.iter().map(|p| topo.register_pod(p, &[], &input.namespace_labels)).collect(),
                false => Vec::new(),
            })
            .collect();

        let no_labels = BTreeMap::new();
        let mut pods = Vec::with_capacity(input.pods.len());
        let mut classes: HashMap<ClassKey, usize> = HashMap::new();
        for (index, ((pod, owned), defaults)) in input.pods.iter().zip(owned).zip(&defaults).enumerate() {
            let meta = &pod.metadata;
            let namespace = meta.namespace.clone().unwrap_or_else(|| "default".to_string());
            let topo_info = topo.pod_topology(owned, &namespace, meta.labels.as_ref().unwrap_or(&no_labels));
            let (base, mut required_terms, preferred_terms, mut invalid) = match pod_node_requirements(pod) {
                Ok((b, r, p)) => (b, r, p, None),
                Err(e) => (Requirements::new(), vec![], vec![], Some(format!("invalid pod: {e}"))),
            };
            // Invalid requirements and unresolvable volumes are what upstream's `Validate` leaves
            // out of scheduling; the other reasons are scheduling errors there.
            let mut ignored = invalid.is_some();
            // As upstream (with IGNORE_DRA_REQUESTS, its default): no capacity for DRA claims.
            if super::resources::has_dra_requirements(pod) {
                invalid = invalid.or(Some(DRA_UNSUPPORTED.into()));
            }
            // Volume requirements hold with every required term, so relaxing cannot drop them.
            match input.volumes.pod_terms(pod).map(|t| and_terms(&required_terms, &t)) {
                Ok(Some(terms)) => required_terms = terms,
                Ok(None) => {
                    invalid = invalid.or(Some("node affinity conflicts with the pod's volumes".into()))
                }
                Err(e) => {
                    ignored = true;
                    invalid = invalid.or(Some(e));
                }
            }
            let spec = pod.spec.as_ref();
            let tolerations: &[Toleration] = spec.and_then(|s| s.tolerations.as_deref()).unwrap_or(&[]);
            let ports = pod_host_ports(pod);
            let key = ClassKey {
                reqs: (base.clone(), required_terms.clone(), preferred_terms.clone()),
                tolerations: tolerations
                    .iter()
                    .map(|t| [t.key.clone(), t.operator.clone(), t.value.clone(), t.effect.clone()])
                    .collect(),
                topo: (topo_info.owned.clone(), topo_info.selected_by.clone(), topo_info.inverse.clone()),
                ports: ports.clone(),
            };
            let next = classes.len();
            let class = *classes.entry(key).or_insert(next);
            let zonal = topo_info
                .owned
                .iter()
                .chain(&topo_info.inverse)
                .any(|g| topo.groups.get(*g as usize).is_some_and(|g| g.key == LABEL_TOPOLOGY_ZONE));
            pods.push(PodInfo {
                zonal,
                class,
                r: PodRef { index, namespace, name: meta.name.clone().unwrap_or_default() },
                requests: pod_requests(pod),
                tolerations,
                ports,
                base,
                required_terms,
                preferred_terms,
                has_soft_spread: spec
                    .and_then(|s| s.topology_spread_constraints.as_ref())
                    .into_iter()
                    .flatten()
                    .chain(defaults)
                    .any(|c| c.when_unsatisfiable == "ScheduleAnyway"),
                default_spread: !defaults.is_empty(),
                topo: topo_info,
                invalid,
                ignored,
                volumes: input.volumes.pod_attachments(pod),
            });
        }

        // Offering index over every zone and capacity type.
        let offer_idx = OfferingIndex::new(&input.nodepools);

        // NodePools by weight, then name.
        let mut order: Vec<&NodePoolInput> = input.nodepools.iter().collect();
        order.sort_by(|a, b| b.weight.cmp(&a.weight).then(a.name.cmp(&b.name)));
        let pools: Vec<Pool<'a>> = order.into_iter().map(|np| Pool::new(np, input, &offer_idx)).collect();

        // Existing nodes.
        let mut nodes = Vec::with_capacity(input.existing_nodes.len());
        for n in &input.existing_nodes {
            let taints = n
                .taints
                .iter()
                .filter(|t| n.initialized || !(is_ephemeral(t) || n.startup_taints.contains(t)))
                .cloned()
                .collect();
            let hostname = n.labels.get(LABEL_HOSTNAME).unwrap_or(&n.name);
            let host_id = topo.intern(hostname);
            let attach_limits = input.volumes.attach_limits.get(&n.name);
            let mut attached = Attachments::new();
            if attach_limits.is_some() {
                for p in &n.pods {
                    input.volumes.add_attachments(p, &mut attached);
                }
            }
            let derived = n.derived();
            nodes.push(NodeSlot {
                node: n,
                reqs: &derived.reqs,
                taints,
                used: n.requested.clone(),
                pods: vec![],
                ports: derived.ports.clone(),
                host_id,
                attach_limits,
                attached,
            });
        }

        // Domains of every topology key.
        let keys = topo.keys();
        for n in &nodes {
            let source = DomainSource { reqs: n.reqs, taints: &n.taints, existing: true };
            for k in &keys {
                match n.node.labels.get(k) {
                    Some(v) => topo.add_domain(k, v, &source),
                    None if k == LABEL_HOSTNAME => topo.add_domain(k, &n.node.name, &source),
                    None => {}
                }
            }
        }
        for pool in &pools {
            let source =
                DomainSource { reqs: &pool.input.requirements, taints: &pool.input.taints, existing: false };
            for k in &keys {
                let values: BTreeSet<String> = match pool.input.requirements.get(k) {
                    Some(r) if !r.is_complement() => r.values().iter().map(str::to_string).collect(),
                    template => pool
                        .its
                        .iter()
                        .filter_map(|i| pool.input.instance_types.get(*i as usize))
                        .filter_map(|it| it.requirements.get(k))
                        .filter(|r| !r.is_complement())
                        .flat_map(|r| r.values().iter())
                        .filter(|v| template.is_none_or(|t| t.has(v)))
                        .map(str::to_string)
                        .collect(),
                };
                for v in values {
                    topo.add_domain(k, &v, &source);
                }
            }
        }
        topo.finish_domains();
        topo.new_nodes_possible = pools.iter().any(|p| !p.its.is_empty());

        // Count the pods already bound (only groups count them).
        let counted = if topo.groups.is_empty() { 0 } else { nodes.len() };
        for (n, owned) in nodes.iter().zip(existing_owned).take(counted) {
            let owned = owned.into_iter().chain(std::iter::repeat_with(Default::default));
            for (pod, owned) in n.node.pods.iter().zip(owned) {
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                let pt = topo.pod_topology(owned, ns, pod.metadata.labels.as_ref().unwrap_or(&no_labels));
                let view = SlotView {
                    hostname: n.host_id,
                    labels: Some(&n.node.labels),
                    reqs: n.reqs,
                    taints: &n.taints,
                    zones: None,
                };
                topo.record(&pt, &view);
            }
        }

        let (nodes_rejected, rejected) = (Rejections::new(classes.len()), Rejections::new(classes.len()));
        let costs = pools.iter().map(|p| PoolCosts::new(p.input, &p.ds_overhead)).collect();
        let book = Book::new(&input.nodepools, &input.reservations_held, !input.options.reserved_fallback);
        Scheduler {
            input,
            pods,
            pools,
            nodes,
            claims: vec![],
            topo,
            offer_idx,
            nodes_rejected,
            rejected,
            costs,
            book,
            refused_for_reservation: false,
            preferences_broken: Vec::new(),
        }
    }

    fn run(mut self) -> SchedulingResults {
        let mut queue: Vec<usize> = (0..self.pods.len()).collect();
        let input = self.input;
        let largest_first = |a: &usize, b: &usize| {
            let (pa, pb) = (&self.pods[*a], &self.pods[*b]);
            pb.requests
                .cpu
                .cmp(&pa.requests.cpu)
                .then(pb.requests.memory.cmp(&pa.requests.memory))
                .then_with(|| {
                    input.pods[*a]
                        .metadata
                        .creation_timestamp
                        .cmp(&input.pods[*b].metadata.creation_timestamp)
                })
                .then_with(|| pa.r.cmp(&pb.r))
        };
        queue.sort_by(largest_first);
        if input.options.packing == Packing::CostAware {
            queue = balanced_order(&queue, &self.pods);
        }
        let mut errors: BTreeMap<usize, PodError> = BTreeMap::new();
        loop {
            let mut failed = Vec::new();
            for &p in &queue {
                match self.schedule_pod(p) {
                    Ok(()) => {
                        errors.remove(&p);
                    }
                    Err(e) => {
                        errors.insert(p, e);
                        failed.push(p);
                    }
                }
            }
            // Retry the failures while the previous pass placed something (pod affinity may need
            // pods that came later in the queue).
            if failed.is_empty() || failed.len() == queue.len() {
                break;
            }
            queue = failed;
        }
        self.results(errors)
    }

    fn schedule_pod(&mut self, p: usize) -> Result<(), PodError> {
        let info = &self.pods[p];
        if let Some(reason) = &info.invalid {
            return Err(PodError {
                pod: info.r.clone(),
                nodepools: vec![],
                reason: Some(reason.clone()),
                reserved: false,
            });
        }
        let mut state = self.pods[p].first_state(self.input.options.preference_policy);
        loop {
            let reqs = self.pods[p].requirements(state).into_owned();
            match self.try_place(p, &reqs, state) {
                Ok(()) => return Ok(()),
                // Waiting for a reservation is no reason to give up a preference.
                Err(e) => {
                    if e.reserved || !self.pods[p].relax(&mut state) {
                        return Err(e);
                    }
                }
            }
        }
    }

    fn try_place(&mut self, p: usize, reqs: &Requirements, state: Relax) -> Result<(), PodError> {
        // The start of the relaxation: what the pods of one class share.
        let initial = state == self.pods[p].first_state(self.input.options.preference_policy);
        // Pods of one class remember the nodes and claims that reject the class for good, and
        // skip them.
        let class = self.pods[p].class;
        let mut n = 0;
        while n < self.nodes.len() {
            if initial && let Some(next) = self.nodes_rejected.skip(class, n) {
                n = next;
                continue;
            }
            match self.try_node(n, p, reqs, state) {
                Ok(()) => return Ok(()),
                Err(true) if initial => self.nodes_rejected.set(class, n),
                Err(_) => {}
            }
            n += 1;
        }
        if self.input.options.preferences_yield_to_existing {
            let pod = &self.pods[p];
            let without = Relax {
                pod_pref: pod.topo.preferred.len(),
                pref: pod.preferred_terms.len(),
                soft: state.soft && pod.default_spread,
                ..state
            };
            if without != state {
                let reqs = pod.requirements(without).into_owned();
                for n in 0..self.nodes.len() {
                    if self.try_node(n, p, &reqs, without).is_ok() {
                        self.preferences_broken.push(p);
                        return Ok(());
                    }
                }
            }
        }
        let mut c = 0;
        while c < self.claims.len() {
            if initial && let Some(next) = self.rejected.skip(class, c) {
                c = next;
                continue;
            }
            match self.try_claim(c, p, reqs, state, false) {
                Ok(()) => return Ok(()),
                Err((_, true)) if initial => self.rejected.set(class, c),
                Err(_) => {}
            }
            c += 1;
        }
        let mut reasons = Vec::new();
        for pool in 0..self.pools.len() {
            self.refused_for_reservation = false;
            match self.try_new_claim(pool, p, reqs, state) {
                Ok(()) => return Ok(()),
                Err(e) => reasons.push((self.pools[pool].input.name.clone(), e)),
            }
            // A pod a reservation could take does not fall back to a NodePool of lower weight.
            if self.refused_for_reservation {
                return Err(PodError {
                    pod: self.pods[p].r.clone(),
                    nodepools: reasons,
                    reason: None,
                    reserved: true,
                });
            }
        }
        let reason =
            if self.pools.is_empty() { Some("no nodepool can launch nodes".to_string()) } else { None };
        Err(PodError { pod: self.pods[p].r.clone(), nodepools: reasons, reason, reserved: false })
    }

    /// Places pod `p` on existing node `n`, or says whether the node rejects the pod's class for
    /// good (`Err(true)`: its taints, host ports, labels or the pods there keep the class away
    /// whatever is placed meanwhile) or only for now (`Err(false)`: room, volume attachments, a
    /// pod affinity not met yet).
    fn try_node(&mut self, n: usize, p: usize, reqs: &Requirements, state: Relax) -> Result<(), bool> {
        let pod = &self.pods[p];
        let slot = &self.nodes[n];
        // Reasons for existing nodes are not reported: fail fast without building them, with the
        // cheap checks first (the labels last: room rules out a full node before them).
        if !tolerates_all(&slot.taints, pod.tolerations) || first_conflict(&slot.ports, &pod.ports).is_some()
        {
            return Err(true);
        }
        match self.topo.host_allows(&pod.topo, reqs, slot.host_id, state.soft, state.pod_pref) {
            HostCheck::Passes => {}
            HostCheck::NotYet => return Err(false),
            HostCheck::Never => return Err(true),
        }
        if !slot.used.fits_with(&pod.requests, &slot.node.allocatable) {
            return Err(false);
        }
        if !slot.reqs.is_compatible(reqs, false) {
            return Err(true);
        }
        if slot.attach_limits.is_some_and(|l| exceeded_limit(l, &slot.attached, &pod.volumes).is_some()) {
            return Err(false);
        }
        // A pod other pods' constraints count (selected by them) is counted where it lands, as on
        // a new claim, even when it has no constraint of its own.
        if !pod.topo.is_empty() || !pod.topo.selected_by.is_empty() {
            let view = SlotView {
                hostname: slot.host_id,
                labels: Some(&slot.node.labels),
                reqs: slot.reqs,
                taints: &slot.taints,
                zones: None,
            };
            if !pod.topo.is_empty() {
                self.topo
                    .requirements_for(&pod.topo, reqs, &view, state.soft, state.pod_pref)
                    .map_err(|reject| reject.permanent)?;
            }
            self.topo.record(&pod.topo, &view);
        }
        let slot = &mut self.nodes[n];
        slot.used.add_assign(&pod.requests);
        slot.pods.push(p);
        slot.ports.extend(pod.ports.iter().cloned());
        if slot.attach_limits.is_some() {
            for (driver, ids) in &pod.volumes {
                slot.attached.entry(driver.clone()).or_default().extend(ids.iter().cloned());
            }
        }
        Ok(())
    }

    fn try_new_claim(
        &mut self,
        pool_i: usize,
        p: usize,
        reqs: &Requirements,
        state: Relax,
    ) -> Result<(), String> {
        let pool = &self.pools[pool_i];
        let pod = &self.pods[p];
        if pool.its.is_empty() {
            return Err("no instance type is compatible with the nodepool's requirements".into());
        }
        check_tolerated(&pool.input.taints, pod.tolerations)?;
        pool.input
            .requirements
            .compatible(reqs, true)
            .map_err(|e| format!("incompatible requirements, {}", e.0))?;
        // Resources whose limits left some types out, for the reason when nothing else fits.
        let mut limited_by: Vec<&str> = Vec::new();
        let its: Vec<u32> = match &pool.remaining {
            None => pool.its.clone(),
            Some(rem) => {
                let types = &pool.input.instance_types;
                let limits = &self.costs[pool_i].limits;
                let kept: Vec<u32> = pool
                    .its
                    .iter()
                    .copied()
                    .filter(|i| rem.values().zip(limits).all(|(left, caps)| caps.amount(*i) <= *left))
                    .collect();
                // The limits every type (`all`) or some type (`!all`) would exceed.
                let exceeded = |all: bool| -> Vec<&str> {
                    rem.iter()
                        .filter(|(k, v)| {
                            let mut over = pool
                                .its
                                .iter()
                                .filter_map(|i| types.get(*i as usize))
                                .map(|it| limited_amount(it, k) > **v);
                            if all { over.all(|o| o) } else { over.any(|o| o) }
                        })
                        .map(|(k, _)| k.as_str())
                        .collect()
                };
                if kept.is_empty() {
                    // Each limit with what is left of it and what the smallest type would take.
                    let detail: Vec<String> = exceeded(true)
                        .into_iter()
                        .map(|k| {
                            let left = rem.get(k).copied().unwrap_or_default().max(0);
                            let smallest = pool
                                .its
                                .iter()
                                .filter_map(|i| types.get(*i as usize))
                                .map(|it| limited_amount(it, k))
                                .min()
                                .unwrap_or_default();
                            format!(
                                "{k} ({} left, the smallest instance type needs {})",
                                format_quantity(k, left),
                                format_quantity(k, smallest)
                            )
                        })
                        .collect();
                    return Err(format!("would exceed nodepool limits {}", detail.join(", ")));
                }
                if kept.len() < pool.its.len() {
                    limited_by = exceeded(false);
                }
                kept
            }
        };
        let limited_by = if limited_by.is_empty() {
            String::new()
        } else {
            format!(" (types that would exceed nodepool limits {} left out)", limited_by.join(", "))
        };
        let hostname = format!("hostname-placeholder-{:05}", self.claims.len());
        let host_id = self.topo.intern(&hostname);
        let mut creqs = pool.input.requirements.clone();
        creqs.add(LABEL_HOSTNAME, Requirement::in_values([hostname]));
        let max = max_alloc(&its, &pool.input.instance_types);
        self.claims.push(Claim {
            pool: pool_i,
            host_id,
            reqs: creqs,
            requests: pool.ds_overhead.clone(),
            pods: vec![],
            its,
            small: vec![],
            ports: vec![],
            max_alloc: max,
            reserved: BTreeMap::new(),
            min_values_relaxed: false,
            holds: Vec::new(),
        });
        let c = self.claims.len() - 1;
        match self.try_claim(c, p, reqs, state, true) {
            Ok(()) => Ok(()),
            Err((e, _)) => {
                self.claims.pop();
                Err(e + &limited_by)
            }
        }
    }

    /// Tries to add pod `p` to claim `c`. Reasons are only built when `reason` (for new claims,
    /// whose failures are reported); otherwise errors are empty.
    fn try_claim(
        &mut self,
        c: usize,
        p: usize,
        reqs: &Requirements,
        state: Relax,
        reason: bool,
    ) -> Result<(), Reject> {
        let Scheduler {
            claims,
            pools,
            pods,
            topo,
            offer_idx,
            input,
            costs,
            book,
            refused_for_reservation,
            ..
        } = self;
        let claim = &mut claims[c];
        let pod = &pods[p];
        let ask = Ask { pod, reqs, state, reason };
        claim.check_size(&ask)?;
        let pool = &pools[claim.pool];
        check_taints(&pool.input.taints, &ask)?;
        claim.check_host_ports(&ask)?;
        claim.check_requirements(&ask)?;
        let topo_reqs = claim.topology_requirements(pool, topo, offer_idx, &ask)?;

        // The narrowed requirements, and the keys that changed.
        let (new_reqs, changed) = narrow(&claim.reqs, reqs, &topo_reqs);
        let eff_reqs = new_reqs.as_ref().unwrap_or(&claim.reqs);
        let cost = &costs[claim.pool];
        let narrowing = Narrowing::new(pool, cost, eff_reqs, &changed, offer_idx, &input.options);
        let new_requests = claim.requests.add(&pod.requests);
        let (mut kept, outgrown) = narrowing.instance_types(&claim.its, &new_requests, reason)?;
        narrowing.drop_exotic(&mut kept);
        let relaxed =
            narrowing.min_values(&kept, input.options.min_values_policy, claim.min_values_relaxed)?;
        let growth_alloc = narrowing.growth_alloc(claim, &kept, &outgrown, &new_requests, reason)?;
        let holds = match book.is_empty() {
            true => Vec::new(),
            false => {
                let types = &pool.input.instance_types;
                let offerings = kept
                    .iter()
                    .filter_map(|i| types.get(*i as usize))
                    .flat_map(|it| it.offerings.iter())
                    .filter(|o| o.reservation.is_some() && o.is_compatible(eff_reqs));
                book.to_hold(&claim.holds, offerings).map_err(|why| {
                    *refused_for_reservation = true;
                    (if reason { why.to_string() } else { String::new() }, false)
                })?
            }
        };
        narrowing.update_small(&mut claim.small, outgrown);

        // Commit.
        book.hold(&claim.holds, &holds);
        claim.holds = holds;
        let reserved = claim.reservation(pool, cost, &kept);
        let pool_mut = &mut pools[claim.pool];
        pool_mut.move_reservation(&claim.reserved, &reserved);
        claim.reserved = reserved;
        if let Some(nr) = new_reqs {
            claim.reqs = nr;
        }
        if let Some(m) = growth_alloc {
            claim.max_alloc = m;
        } else if kept.len() != claim.its.len() {
            claim.max_alloc = max_alloc(&kept, &pool_mut.input.instance_types);
        }
        claim.its = kept;
        claim.requests = new_requests;
        claim.pods.push(p);
        claim.ports.extend(pod.ports.iter().cloned());
        claim.min_values_relaxed = relaxed;
        if !pod.topo.selected_by.is_empty() || !pod.topo.owned.is_empty() {
            let view = SlotView {
                hostname: claim.host_id,
                labels: None,
                reqs: &claim.reqs,
                taints: &pools[claim.pool].input.taints,
                zones: None,
            };
            topo.record(&pod.topo, &view);
        }
        Ok(())
    }

    fn results(self, errors: BTreeMap<usize, PodError>) -> SchedulingResults {
        let mut out = SchedulingResults::default();
        for slot in &self.nodes {
            if !slot.pods.is_empty() {
                out.existing_placements.push(ExistingPlacement {
                    node: slot.node.name.clone(),
                    pods: slot.pods.iter().map(|p| self.pods[*p].r.clone()).collect(),
                });
            }
        }
        // Claims that may launch as the same types share one list of them, one of their names
        // and one requirement: keyed by the types' addresses, then how many the names take.
        let mut type_lists: HashMap<Vec<usize>, TypeList> = HashMap::new();
        for claim in &self.claims {
            let pool = &self.pools[claim.pool];
            let mut reqs = claim.reqs.clone();
            reqs.remove(LABEL_HOSTNAME);
            // A claim holding reservations launches into one of them, on a type they are for.
            if !claim.holds.is_empty() {
                reqs.add(LABEL_CAPACITY_TYPE, Requirement::in_values([CAPACITY_TYPE_RESERVED]));
                reqs.add(LABEL_CAPACITY_RESERVATION_ID, Requirement::in_values(claim.holds.iter().cloned()));
            }
            let masks = self.offer_idx.masks_for(&reqs);
            let mut options: Vec<(Option<f64>, &Arc<InstanceType>)> = claim
                .its
                .iter()
                .filter_map(|i| {
                    let it = pool.input.instance_types.get(*i as usize)?;
                    if !claim.holds.is_empty() && it.compatible_offerings(&reqs).next().is_none() {
                        return None;
                    }
                    let price = match (masks, pool.offers.get(*i as usize)) {
                        (Some((zm, cm)), Some(offers)) => offers
                            .iter()
                            .filter(|(z, ct, _)| z & zm != 0 && ct & cm != 0)
                            .map(|(_, _, p)| *p)
                            .min_by(f64::total_cmp),
                        _ => it.cheapest_price(&reqs),
                    };
                    Some((price, it))
                })
                .collect();
            let order = |a: &(Option<f64>, &Arc<InstanceType>), b: &(Option<f64>, &Arc<InstanceType>)| {
                compare_price(a.0, b.0).then(a.1.name.cmp(&b.1.name))
            };
            // Usually already in order: the pool's types are sorted by price.
            if !options.is_sorted_by(|a, b| order(a, b).is_le()) {
                options.sort_unstable_by(order);
            }
            let options: Vec<Arc<InstanceType>> = options.into_iter().map(|(_, it)| Arc::clone(it)).collect();
            let mut n = self.input.options.max_instance_types.max(1).min(options.len());
            if pool.has_min_values {
                while n < options.len()
                    && check_min_values(&reqs, &(0..n).map(|i| i as u32).collect::<Vec<_>>(), &options)
                        .is_err()
                {
                    n += 1;
                }
            }
            let mut key: Vec<usize> = options.iter().map(|it| Arc::as_ptr(it) as usize).collect();
            key.push(n);
            let TypeList { options, names, requirement: type_req } = type_lists
                .entry(key)
                .or_insert_with(|| {
                    let names: Values = options.iter().take(n).map(|it| it.name.clone()).collect();
                    let requirement = Requirement::in_values(names.iter().cloned());
                    TypeList { options: Arc::from(options.as_slice()), names, requirement }
                })
                .clone();
            reqs.add(crate::apis::labels::LABEL_INSTANCE_TYPE, type_req);
            let mut labels = pool.input.labels.clone();
            labels.extend(reqs.single_valued_labels());
            out.new_node_claims.push(NewNodeClaim {
                nodepool: pool.input.name.clone(),
                requirements: reqs,
                instance_type_names: names,
                labels,
                taints: pool.input.taints.clone(),
                startup_taints: pool.input.startup_taints.clone(),
                requests: claim.requests.clone(),
                daemonset_requests: pool.ds_overhead.clone(),
                pods: claim.pods.iter().map(|p| self.pods[*p].r.clone()).collect(),
                instance_type_options: options,
                min_values_relaxed: claim.min_values_relaxed,
            });
        }
        out.ignored = errors
            .keys()
            .filter_map(|p| self.pods.get(*p))
            .filter(|info| info.ignored)
            .map(|info| info.r.clone())
            .collect();
        out.errors = errors.into_values().collect();
        out.preferences_broken = self.preferences_broken.iter().map(|p| self.pods[*p].r.clone()).collect();
        out
    }
}

/// The instance types a run's NewNodeClaims may launch as, shared by the claims that list the same.
#[derive(Clone)]
struct TypeList {
    options: Arc<[Arc<InstanceType>]>,
    names: Values,
    requirement: Requirement,
}

/// A pod offered to a claim: its requirements at this step of its relaxation, and whether a
/// refusal must say why (see [`Scheduler::try_claim`]).
struct Ask<'x, 'a> {
    pod: &'x PodInfo<'a>,
    reqs: &'x Requirements,
    state: Relax,
    reason: bool,
}

/// What [`Scheduler::try_claim`] asks of a claim as it is, before the pod joins it.
impl Claim {
    /// The pod's CPU, memory and pods must fit in the most any type the claim may still grow
    /// into allocates.
    fn check_size(&self, ask: &Ask<'_, '_>) -> Result<(), Reject> {
        let r = &ask.pod.requests;
        let m = self.max_alloc;
        if self.requests.cpu + r.cpu > m[0]
            || self.requests.memory + r.memory > m[1]
            || self.requests.pods + r.pods > m[2]
        {
            let msg = if ask.reason {
                format!("no instance type fits {}", describe_requests(&self.requests.add(r)))
            } else {
                String::new()
            };
            return Err((msg, false));
        }
        Ok(())
    }

    /// The pod's host ports must be free on the claim.
    fn check_host_ports(&self, ask: &Ask<'_, '_>) -> Result<(), Reject> {
        if let Some(conflict) = first_conflict(&self.ports, &ask.pod.ports) {
            return Err((
                if ask.reason { format!("host port conflict {conflict}") } else { String::new() },
                true,
            ));
        }
        Ok(())
    }

    /// The pod's requirements must be compatible with the claim's.
    fn check_requirements(&self, ask: &Ask<'_, '_>) -> Result<(), Reject> {
        let reqs = ask.reqs;
        if !reqs.is_empty() && !self.reqs.is_compatible(reqs, true) {
            // A conflict on a key both define lasts (claims only narrow); an undefined key may
            // become defined.
            let permanent = self.reqs.intersects(reqs).is_err();
            let msg = match self.reqs.compatible(reqs, true) {
                Err(e) if ask.reason => format!("incompatible requirements, {}", e.0),
                _ => String::new(),
            };
            return Err((msg, permanent));
        }
        Ok(())
    }

    /// The requirements the pod's topology constraints add on the claim (the domains they
    /// choose), or the constraint the claim would violate.
    fn topology_requirements(
        &self,
        pool: &Pool<'_>,
        topo: &mut Topology,
        offer_idx: &OfferingIndex,
        ask: &Ask<'_, '_>,
    ) -> Result<Vec<(String, Requirement)>, Reject> {
        let pod = ask.pod;
        if pod.topo.is_empty() {
            return Ok(vec![]);
        }
        // Zonal constraints choose among the zones the claim could still launch in with
        // this pod added (largest types first: they fit most often). A claim already in one
        // zone has nothing to choose.
        let pinned = self.reqs.get(LABEL_TOPOLOGY_ZONE).is_some_and(|z| z.single().is_some());
        let zone_mask = (pod.zonal && !pinned && offer_idx.usable())
            .then(|| self.zone_mask(pool, &pod.requests, offer_idx));
        let zone_filter = |z: &str| zone_mask.is_none_or(|m| offer_idx.zone_bit(z) & m != 0);
        let view = SlotView {
            hostname: self.host_id,
            labels: None,
            reqs: &self.reqs,
            taints: &pool.input.taints,
            zones: Some(&zone_filter),
        };
        match topo.requirements_for(&pod.topo, ask.reqs, &view, ask.state.soft, ask.state.pod_pref) {
            Ok(r) => Ok(r),
            Err(rej) => Err((if ask.reason { topo.describe(rej) } else { String::new() }, rej.permanent)),
        }
    }

    /// The zones the claim could launch in with `requests` added: those of the offerings, in
    /// the capacity types its requirements allow, of the types that would hold it.
    fn zone_mask(&self, pool: &Pool<'_>, requests: &Resources, offer_idx: &OfferingIndex) -> u64 {
        let cm = offer_idx.masks(&self.reqs).1;
        let full = offer_idx.full_zone_mask();
        let mut mask = 0u64;
        for &i in self.its.iter().rev() {
            let Some(it) = pool.input.instance_types.get(i as usize) else { continue };
            if !self.requests.fits_with(requests, it.allocatable()) {
                continue;
            }
            for (z, ct, _) in pool.offers.get(i as usize).into_iter().flatten() {
                if ct & cm != 0 {
                    mask |= z;
                }
            }
            if mask == full {
                break;
            }
        }
        mask
    }

    /// What the claim takes of its NodePool's limits with the types `kept`: limits count the
    /// largest type the claim may launch as.
    fn reservation(&self, pool: &Pool<'_>, cost: &PoolCosts, kept: &[u32]) -> BTreeMap<String, i64> {
        match &pool.remaining {
            Some(_) if kept.len() == self.its.len() && !self.pods.is_empty() => self.reserved.clone(),
            Some(rem) => rem
                .keys()
                .zip(&cost.limits)
                .map(|(k, caps)| (k.clone(), kept.iter().map(|i| caps.amount(*i)).max().unwrap_or(0)))
                .collect(),
            None => BTreeMap::new(),
        }
    }
}

/// The pod must tolerate the taints of the claim's NodePool.
fn check_taints(taints: &[Taint], ask: &Ask<'_, '_>) -> Result<(), Reject> {
    if !tolerates_all(taints, ask.pod.tolerations) {
        let msg = if ask.reason {
            check_tolerated(taints, ask.pod.tolerations).err().unwrap_or_default()
        } else {
            String::new()
        };
        return Err((msg, true));
    }
    Ok(())
}

/// A claim's requirements `claim` with a pod's and its topology's added (`None` when they add
/// none), and the keys that changed.
fn narrow<'x>(
    claim: &Requirements,
    reqs: &'x Requirements,
    topo_reqs: &'x [(String, Requirement)],
) -> (Option<Requirements>, BTreeSet<&'x str>) {
    let mut changed: BTreeSet<&str> = BTreeSet::new();
    let new_reqs = if reqs.is_empty() && topo_reqs.is_empty() {
        None
    } else {
        let mut nr = claim.clone();
        nr.add_all(reqs);
        for (k, r) in topo_reqs {
            nr.add(k, r.clone());
        }
        for k in reqs.keys().chain(topo_reqs.iter().map(|(k, _)| k.as_str())) {
            if nr.get(k) != claim.get(k) {
                changed.insert(k);
            }
        }
        Some(nr)
    };
    (new_reqs, changed)
}

/// A claim's requirements narrowed by a pod's, to test the claim's instance types against: which
/// ones they still allow, which hold the claim with the pod added, and how far it may grow.
struct Narrowing<'x, 'a> {
    pool: &'x Pool<'a>,
    cost: &'x PoolCosts,
    /// The claim's requirements with the pod's added.
    reqs: &'x Requirements,
    /// The keys that changed, other than zone and capacity type.
    label_keys: Vec<&'x str>,
    /// Whether the zone or capacity type changed.
    offers_changed: bool,
    /// Zone and capacity type masks of `reqs`, when they changed and the index is usable.
    masks: Option<(u64, u64)>,
    /// Whether the run packs [`Packing::CostAware`].
    cost_aware: bool,
    /// The run's fewer-nodes margin.
    margin: f64,
}

impl<'x, 'a> Narrowing<'x, 'a> {
    fn new(
        pool: &'x Pool<'a>,
        cost: &'x PoolCosts,
        reqs: &'x Requirements,
        changed: &BTreeSet<&'x str>,
        offer_idx: &OfferingIndex,
        options: &SchedulerOptions,
    ) -> Self {
        let (cost_aware, margin) = (options.packing == Packing::CostAware, options.fewer_nodes_margin);
        let offers_changed = changed.iter().any(|k| is_offering_label(k));
        let label_keys: Vec<&str> = changed.iter().copied().filter(|k| !is_offering_label(k)).collect();
        let masks = offers_changed.then(|| offer_idx.masks_for(reqs)).flatten();
        Narrowing { pool, cost, reqs, label_keys, offers_changed, masks, cost_aware, margin }
    }

    /// Whether any key changed.
    fn reqs_changed(&self) -> bool {
        self.offers_changed || !self.label_keys.is_empty()
    }

    /// Whether the narrowed requirements still allow type `i`.
    fn allows(&self, i: u32, it: &InstanceType) -> bool {
        let labels_ok = self.label_keys.iter().all(|k| match (it.requirements.get(k), self.reqs.get(k)) {
            (Some(ir), Some(nr)) => keys_compatible(ir, nr),
            _ => true,
        });
        labels_ok
            && (!self.offers_changed
                || match self.masks {
                    Some((zm, cm)) => self
                        .pool
                        .offers
                        .get(i as usize)
                        .is_some_and(|o| o.iter().any(|(z, ct, _)| z & zm != 0 && ct & cm != 0)),
                    None => it.compatible_offerings(self.reqs).next().is_some(),
                })
    }

    /// The types of `its` that hold `requests` and that the requirements allow, and (when cost
    /// aware) those they allow that no longer hold `requests`; an error when none is left.
    fn instance_types(
        &self,
        its: &[u32],
        requests: &Resources,
        reason: bool,
    ) -> Result<(Vec<u32>, Vec<u32>), Reject> {
        let types = &self.pool.input.instance_types;
        let mut kept = Vec::with_capacity(its.len());
        // Allowed types that no longer hold the claim (tracked for the cost-aware rule only).
        let mut outgrown = Vec::new();
        let (mut fit_fail, mut req_fail) = (0usize, 0usize);
        for &i in its {
            let Some(it) = types.get(i as usize) else { continue };
            if !requests.fits(it.allocatable()) {
                fit_fail += 1;
                if self.cost_aware && self.allows(i, it) {
                    outgrown.push(i);
                }
                continue;
            }
            if !self.allows(i, it) {
                req_fail += 1;
                continue;
            }
            kept.push(i);
        }
        if kept.is_empty() {
            if !reason {
                return Err((String::new(), false));
            }
            let msg = if req_fail == 0 {
                format!("no instance type fits {}", describe_requests(requests))
            } else if fit_fail == 0 {
                format!("no instance type satisfies requirements {}", describe_reqs(self.reqs))
            } else {
                format!(
                    "no instance type satisfies requirements {} and fits {}",
                    describe_reqs(self.reqs),
                    describe_requests(requests)
                )
            };
            return Err((msg, false));
        }
        Ok((kept, outgrown))
    }

    /// When cost aware, drops exotic types from `kept` if other types can hold the claim (and
    /// minValues still hold without them).
    fn drop_exotic(&self, kept: &mut Vec<u32>) {
        let cost = self.cost;
        if self.cost_aware && kept.iter().any(|i| cost.is_exotic(*i)) {
            let plain: Vec<u32> = kept.iter().copied().filter(|i| !cost.is_exotic(*i)).collect();
            if !plain.is_empty()
                && (!self.pool.has_min_values
                    || check_min_values(self.reqs, &plain, &self.pool.input.instance_types).is_ok())
            {
                *kept = plain;
            }
        }
    }

    /// Whether the claim is launched with `minValues` relaxed once its types are `kept`
    /// (`relaxed` is whether it was before); an error when they do not hold under
    /// [`MinValuesPolicy::Strict`].
    fn min_values(&self, kept: &[u32], policy: MinValuesPolicy, mut relaxed: bool) -> Result<bool, Reject> {
        if self.pool.has_min_values
            && let Err(e) = check_min_values(self.reqs, kept, &self.pool.input.instance_types)
        {
            match policy {
                MinValuesPolicy::Strict => return Err((e, false)),
                MinValuesPolicy::BestEffort => relaxed = true,
            }
        }
        Ok(relaxed)
    }

    /// How far the claim may grow: into the types that hold it at near the lowest price per
    /// unit of what it holds, or at no more than it costs now. Worked out again when the types
    /// that hold it change (the only time its cheapest type, and so its price, can rise); `None`
    /// when not cost aware or nothing changed. An error when the claim, grown to `requests`,
    /// would cost clearly more per unit than its cheapest allowed type.
    fn growth_alloc(
        &self,
        claim: &Claim,
        kept: &[u32],
        outgrown: &[u32],
        requests: &Resources,
        reason: bool,
    ) -> Result<Option<[i64; 3]>, Reject> {
        let reqs_changed = self.reqs_changed();
        let recompute =
            self.cost_aware && (claim.pods.is_empty() || reqs_changed || kept.len() != claim.its.len());
        if !recompute {
            return Ok(None);
        }
        let (cost, types) = (self.cost, &self.pool.input.instance_types);
        let pods = requests.sub(&self.pool.ds_overhead);
        let unit = |i: u32| cost.unit_price(i, &pods, types);
        let ordinary = !kept.iter().any(|i| cost.is_exotic(*i));
        let too_small = claim
            .small
            .iter()
            .copied()
            .filter(|i| !reqs_changed || types.get(*i as usize).is_some_and(|it| self.allows(*i, it)))
            .chain(outgrown.iter().copied());
        let floor = too_small
            .chain(kept.iter().copied())
            .filter(|i| !(ordinary && cost.is_exotic(*i)))
            .map(unit)
            .fold(f64::INFINITY, f64::min);
        let limit = floor * (1.0 + self.margin);
        let now = claim.its.first().map_or(f64::INFINITY, |i| cost.price(*i));
        let cheapest = kept.first().map_or(f64::INFINITY, |i| cost.price(*i));
        let mut m = [i64::MIN; 3];
        let mut efficient = false;
        for &i in kept {
            let fits_cheaply = unit(i) <= limit;
            efficient |= fits_cheaply;
            if (fits_cheaply || cost.price(i) <= cheapest)
                && let Some(it) = types.get(i as usize)
            {
                let a = it.allocatable();
                m = [m[0].max(a.cpu), m[1].max(a.memory), m[2].max(a.pods)];
            }
        }
        if !claim.pods.is_empty() && !efficient && cheapest > now {
            let msg = if reason {
                format!(
                    "no instance type holding {} is among the cheapest per unit of it",
                    describe_requests(requests)
                )
            } else {
                String::new()
            };
            return Err((msg, false));
        }
        Ok(Some(m))
    }

    /// When cost aware, keeps the claim's types too small to hold it (`small`) up to date: those
    /// the narrowed requirements no longer allow go, those of `outgrown` join.
    fn update_small(&self, small: &mut Vec<u32>, outgrown: Vec<u32>) {
        if self.cost_aware {
            if self.reqs_changed() {
                let types = &self.pool.input.instance_types;
                small.retain(|i| types.get(*i as usize).is_some_and(|it| self.allows(*i, it)));
            }
            small.extend(outgrown);
        }
    }
}

/// Reorders pods given largest first so that CPU and memory are taken up evenly: pods whose
/// share of all pending CPU is at least their share of all pending memory are "CPU-heavy", the
/// others "memory-heavy"; each kind is taken by its larger share first (ties keep the given
/// order), and the next pod comes from the kind whose resource has been taken up less so far.
/// Open NodeClaims then receive a mix close to the whole batch's and fill both resources, where
/// taking all CPU-heavy pods first fills their CPU and strands their memory.
fn balanced_order(queue: &[usize], pods: &[PodInfo<'_>]) -> Vec<usize> {
    let (total_cpu, total_mem) = queue.iter().fold((0.0f64, 0.0f64), |(c, m), p| {
        let r = &pods[*p].requests;
        (c + r.cpu.max(0) as f64, m + r.memory.max(0) as f64)
    });
    let share = |p: usize| {
        let r = &pods[p].requests;
        let of = |v: i64, total: f64| if total > 0.0 { v.max(0) as f64 / total } else { 0.0 };
        (of(r.cpu, total_cpu), of(r.memory, total_mem))
    };
    // (share of the dominant resource, pod) per kind.
    let mut cpu_heavy: Vec<(f64, usize)> = vec![];
    let mut mem_heavy: Vec<(f64, usize)> = vec![];
    for &p in queue {
        let (c, m) = share(p);
        if c >= m {
            cpu_heavy.push((c, p));
        } else {
            mem_heavy.push((m, p));
        }
    }
    cpu_heavy.sort_by(|a, b| b.0.total_cmp(&a.0));
    mem_heavy.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut out = Vec::with_capacity(queue.len());
    let (mut i, mut j) = (0, 0);
    let (mut taken_cpu, mut taken_mem) = (0.0f64, 0.0f64);
    while i < cpu_heavy.len() || j < mem_heavy.len() {
        let p = if j >= mem_heavy.len() || (i < cpu_heavy.len() && taken_cpu <= taken_mem) {
            i += 1;
            cpu_heavy[i - 1].1
        } else {
            j += 1;
            mem_heavy[j - 1].1
        };
        let (c, m) = share(p);
        taken_cpu += c;
        taken_mem += m;
        out.push(p);
    }
    out
}

/// Checks that the instance types keep at least `minValues` distinct values of each key that
/// asks for them.
fn check_min_values(reqs: &Requirements, its: &[u32], types: &[Arc<InstanceType>]) -> Result<(), String> {
    for (key, r) in reqs.iter() {
        let Some(min) = r.min_values() else { continue };
        let mut values: BTreeSet<&str> = BTreeSet::new();
        for &i in its {
            if let Some(ir) = types.get(i as usize).and_then(|it| it.requirements.get(key))
                && !ir.is_complement()
            {
                values.extend(ir.values().iter().filter(|v| r.has(v)));
            }
        }
        if values.len() < min {
            return Err(format!("minValues requirement not met for {key}: {} of {min} values", values.len()));
        }
    }
    Ok(())
}

fn describe_requests(r: &Resources) -> String {
    let mut shown = r.clone();
    shown.pods = 0;
    shown.to_string()
}

fn describe_reqs(r: &Requirements) -> String {
    let parts: Vec<String> = r
        .iter()
        .filter(|(k, _)| *k != LABEL_HOSTNAME)
        .map(|(k, v)| format!("{k} {}", v.describe()))
        .collect();
    parts.join(", ")
}
