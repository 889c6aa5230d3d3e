//! Pod topology: spread constraints, required pod affinity and anti-affinity.
//!
//! Every distinct constraint becomes a [`Group`] (kind, topology key, namespaces, selector) that
//! counts, per domain (value of the key), the pods its selector matches; anti-affinity groups also
//! count where the pods owning the term are, so that a pod matched by someone else's
//! anti-affinity avoids that pod's domains (the inverse direction). Domains are interned to
//! integers so that the hot checks are array lookups.
//!
//! A spread group also has a [`NodeFilter`] (`nodeAffinityPolicy`, `nodeTaintsPolicy`): pods on
//! nodes it leaves out are not counted, and domains reachable only through such nodes do not take
//! part in the global minimum.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::apis::pod::Pod;
use k8s_openapi::api::core::v1::{PodAffinityTerm, Toleration, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::apis::Taint;
use crate::apis::labels::{LABEL_HOSTNAME, LABEL_TOPOLOGY_ZONE};

use super::requirements::pod_node_requirements;
use super::requirements::{Requirement, Requirements};
use super::taints::tolerates_all;

/// A label selector over pod labels.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector {
    /// A missing selector matches nothing.
    nothing: bool,
    match_labels: BTreeMap<String, String>,
    /// `(key, operator, values)` with operator `In`, `NotIn`, `Exists` or `DoesNotExist`.
    expressions: Vec<(String, String, BTreeSet<String>)>,
}

impl Selector {
    /// From a Kubernetes selector; `None` matches nothing, an empty selector everything.
    /// `match_label_keys` copies the owner pod's values of those keys into the selector and
    /// `mismatch_label_keys` excludes them.
    pub fn new(
        selector: Option<&LabelSelector>,
        owner_labels: &BTreeMap<String, String>,
        match_label_keys: &[String],
        mismatch_label_keys: &[String],
    ) -> Self {
        let Some(sel) = selector else {
            return Selector { nothing: true, match_labels: BTreeMap::new(), expressions: vec![] };
        };
        let mut s = Selector {
            nothing: false,
            match_labels: sel.match_labels.clone().unwrap_or_default(),
            expressions: sel
                .match_expressions
                .iter()
                .flatten()
                .map(|e| (e.key.clone(), e.operator.clone(), e.values.iter().flatten().cloned().collect()))
                .collect(),
        };
        for k in match_label_keys {
            if let Some(v) = owner_labels.get(k) {
                s.expressions.push((k.clone(), "In".into(), [v.clone()].into()));
            }
        }
        for k in mismatch_label_keys {
            if let Some(v) = owner_labels.get(k) {
                s.expressions.push((k.clone(), "NotIn".into(), [v.clone()].into()));
            }
        }
        s.expressions.sort();
        s
    }

    /// The selector as `kubectl get -l` writes one (`app=web,tier in (a,b)`).
    pub fn describe(&self) -> String {
        if self.nothing {
            return "<none>".to_string();
        }
        let mut parts: Vec<String> = self.match_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for (k, op, vals) in &self.expressions {
            let vals = vals.iter().cloned().collect::<Vec<_>>().join(",");
            parts.push(match op.as_str() {
                "In" => format!("{k} in ({vals})"),
                "NotIn" => format!("{k} notin ({vals})"),
                "Exists" => k.clone(),
                _ => format!("!{k}"),
            });
        }
        if parts.is_empty() { "<all pods>".to_string() } else { parts.join(",") }
    }

    /// Whether the selector matches `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        if self.nothing {
            return false;
        }
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.expressions.iter().all(|(k, op, vals)| match op.as_str() {
                "In" => labels.get(k).is_some_and(|v| vals.contains(v)),
                "NotIn" => labels.get(k).is_none_or(|v| !vals.contains(v)),
                "Exists" => labels.contains_key(k),
                "DoesNotExist" => !labels.contains_key(k),
                _ => false,
            })
    }
}

/// What a topology group constrains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKind {
    /// A topology spread constraint.
    Spread {
        /// Largest allowed difference between a domain's count and the smallest.
        max_skew: i32,
        /// Below this many eligible domains the global minimum is taken as zero.
        min_domains: i32,
        /// `DoNotSchedule` (true) or `ScheduleAnyway` (false: a preference).
        hard: bool,
    },
    /// Required pod affinity.
    Affinity,
    /// Required pod anti-affinity.
    AntiAffinity,
    /// Preferred pod affinity: enforced like a required one until relaxed.
    PreferredAffinity,
    /// Preferred pod anti-affinity: enforced like a required one until relaxed (it does not
    /// constrain other pods in the inverse direction).
    PreferredAntiAffinity,
}

impl GroupKind {
    /// The required kind a preference is enforced as.
    fn enforced(self) -> GroupKind {
        match self {
            GroupKind::PreferredAffinity => GroupKind::Affinity,
            GroupKind::PreferredAntiAffinity => GroupKind::AntiAffinity,
            k => k,
        }
    }

    fn is_preferred(self) -> bool {
        matches!(self, GroupKind::PreferredAffinity | GroupKind::PreferredAntiAffinity)
    }
}

/// The nodes a spread constraint counts, after its owner's `nodeAffinityPolicy` (default
/// `Honor`) and `nodeTaintsPolicy` (default `Ignore`). Other groups count every node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFilter {
    /// `nodeAffinityPolicy: Honor`.
    honor_affinity: bool,
    /// With `Honor`, the owner's node selector merged with each required node-affinity term
    /// (ORed); empty when they allow every node.
    terms: Vec<Requirements>,
    /// With `nodeTaintsPolicy: Honor`, the owner's tolerations.
    tolerations: Option<Vec<Toleration>>,
}

impl NodeFilter {
    /// The filter of a spread constraint of `pod`.
    fn new(pod: &Pod, affinity_policy: Option<&str>, taints_policy: Option<&str>) -> Self {
        let honor_affinity = affinity_policy != Some("Ignore");
        let mut terms = Vec::new();
        if honor_affinity && let Ok((base, required, _)) = pod_node_requirements(pod) {
            terms = if required.is_empty() {
                vec![base]
            } else {
                required
                    .iter()
                    .map(|t| {
                        let mut r = base.clone();
                        r.add_all(t);
                        r
                    })
                    .collect()
            };
            if terms.iter().any(Requirements::is_empty) {
                terms.clear();
            }
        }
        let tolerations = (taints_policy == Some("Honor"))
            .then(|| pod.spec.as_ref().and_then(|s| s.tolerations.clone()).unwrap_or_default());
        NodeFilter { honor_affinity, terms, tolerations }
    }

    /// Whether the filter counts every node.
    fn is_trivial(&self) -> bool {
        self.terms.is_empty() && self.tolerations.is_none()
    }

    /// Whether a node (`existing`) or claim with these requirements and taints is counted (in
    /// `domain`, a key and a value, when given).
    fn admits(
        &self,
        reqs: &Requirements,
        taints: &[Taint],
        existing: bool,
        domain: Option<(&str, &str)>,
    ) -> bool {
        let in_domain = |t: &Requirements| domain.is_none_or(|(k, v)| t.get(k).is_none_or(|r| r.has(v)));
        (self.terms.is_empty() || self.terms.iter().any(|t| in_domain(t) && reqs.is_compatible(t, !existing)))
            && self.tolerations.as_ref().is_none_or(|t| tolerates_all(taints, t))
    }
}

/// A node or NodePool offering domains, as node filters see it.
pub struct DomainSource<'a> {
    /// The node's labels or the NodePool's requirements.
    pub reqs: &'a Requirements,
    /// Its taints.
    pub taints: &'a [Taint],
    /// Whether it is a node (labels must match) rather than a NodePool.
    pub existing: bool,
}

/// One topology constraint shared by every pod that has it.
#[derive(Clone, Debug)]
pub struct Group {
    /// The constraint.
    pub kind: GroupKind,
    /// The topology key (`topology.kubernetes.io/zone`, `kubernetes.io/hostname`).
    pub key: String,
    /// Namespaces of the pods counted; `None` for all.
    namespaces: Option<BTreeSet<String>>,
    selector: Selector,
    /// Index of its node filter in `Topology::filters`.
    filter: u32,
    /// With a filter that leaves nodes out, the domains of its key on nodes it counts.
    eligible: Option<Vec<u32>>,
    /// Matching pods per domain id.
    counts: Vec<i32>,
    /// Owners (pods with this term) per domain id, for anti-affinity.
    owners: Vec<i32>,
    /// Matching pods in all domains.
    total: i32,
    /// Owners in all domains.
    owner_total: i32,
}

impl Group {
    /// Whether the group counts a pod with these namespace and labels.
    pub fn selects(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.namespaces.as_ref().is_none_or(|n| n.contains(namespace)) && self.selector.matches(labels)
    }

    fn count(&self, d: u32) -> i32 {
        self.counts.get(d as usize).copied().unwrap_or(0)
    }

    fn owners(&self, d: u32) -> i32 {
        self.owners.get(d as usize).copied().unwrap_or(0)
    }
}

fn bump(v: &mut Vec<i32>, d: u32) {
    let i = d as usize;
    if v.len() <= i {
        v.resize(i + 1, 0);
    }
    v[i] += 1;
}

/// What makes two constraints the same group.
type GroupSignature = (GroupKind, String, Option<BTreeSet<String>>, Selector, u32);

/// A pod's topology constraints and the groups that count it.
#[derive(Clone, Debug, Default)]
pub struct PodTopology {
    /// Groups whose constraint the pod has.
    pub owned: Vec<u32>,
    /// Groups whose selector matches the pod.
    pub selected_by: Vec<u32>,
    /// Anti-affinity groups owned by other pods that match this pod.
    pub inverse: Vec<u32>,
    /// The preferred pod (anti-)affinity groups among `owned`, in the order they are relaxed:
    /// affinity before anti-affinity, heaviest first.
    pub preferred: Vec<u32>,
}

impl PodTopology {
    /// Whether the pod takes part in any topology constraint.
    pub fn is_empty(&self) -> bool {
        self.owned.is_empty() && self.inverse.is_empty()
    }
}

/// A topology constraint a slot would violate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopologyReject {
    /// The group.
    pub group: u32,
    /// Whether it is another pod's anti-affinity that rejects.
    pub inverse: bool,
    /// Whether the rejection can never be lifted (counts only grow, claims only narrow), so
    /// that pods with the same constraints need not try the slot again.
    pub permanent: bool,
}

/// What [`Topology::host_allows`] says of a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostCheck {
    /// The pod's host-keyed affinities pass there.
    Passes,
    /// A required pod affinity finds no pod there yet (one placed later may satisfy it).
    NotYet,
    /// Anti-affinity, its own or another pod's, keeps the pod away for the rest of the
    /// simulation (counts only grow).
    Never,
}

/// Where a slot (existing node or new claim) is, as far as topology goes.
pub struct SlotView<'a> {
    /// Interned host name of the slot.
    pub hostname: u32,
    /// Labels of an existing node; `None` for a new claim.
    pub labels: Option<&'a BTreeMap<String, String>>,
    /// The claim's requirements (or the node's labels as requirements).
    pub reqs: &'a Requirements,
    /// Taints of the node or of the claim's NodePool.
    pub taints: &'a [Taint],
    /// For a claim, the zones its instance types can still be launched in (when known).
    pub zones: Option<&'a dyn Fn(&str) -> bool>,
}

/// All topology groups and their counts.
#[derive(Debug, Default)]
pub struct Topology {
    /// The groups, by id.
    pub groups: Vec<Group>,
    index: HashMap<GroupSignature, u32>,
    ids: HashMap<String, u32>,
    names: Vec<String>,
    /// Distinct node filters; the first counts every node.
    filters: Vec<NodeFilter>,
    /// Groups whose filter leaves nodes out.
    filtered: Vec<u32>,
    /// Known domains per key (not host names), sorted by name.
    universe: BTreeMap<String, Vec<u32>>,
    /// Whether new nodes (each a new host name with no pod) can be created.
    pub new_nodes_possible: bool,
}

impl Topology {
    /// The id of a domain value, interning it.
    pub fn intern(&mut self, value: &str) -> u32 {
        if let Some(id) = self.ids.get(value) {
            return *id;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.names.push(value.to_string());
        self.ids.insert(value.to_string(), id);
        id
    }

    /// The value of a domain id.
    pub fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", String::as_str)
    }

    /// Adds a known domain of `key` offered by `source` (for host names, only existing nodes are
    /// listed).
    pub fn add_domain(&mut self, key: &str, value: &str, source: &DomainSource<'_>) {
        let id = self.intern(value);
        push_unique(self.universe.entry(key.to_string()).or_default(), id);
        for &gid in &self.filtered {
            let Some(g) = self.groups.get_mut(gid as usize) else { continue };
            let Some(filter) = self.filters.get(g.filter as usize) else { continue };
            if g.key == key && filter.admits(source.reqs, source.taints, source.existing, Some((key, value)))
            {
                push_unique(g.eligible.get_or_insert_with(Vec::new), id);
            }
        }
    }

    /// Sorts the domain lists by name; call after the last `add_domain`.
    pub fn finish_domains(&mut self) {
        let names = &self.names;
        let by_name = |a: &u32, b: &u32| names[*a as usize].cmp(&names[*b as usize]);
        for list in self.universe.values_mut() {
            list.sort_by(by_name);
        }
        for g in &mut self.groups {
            if let Some(list) = g.eligible.as_mut() {
                list.sort_by(by_name);
            }
        }
    }

    fn filter_id(&mut self, filter: NodeFilter) -> u32 {
        if self.filters.is_empty() {
            self.filters.push(NodeFilter::default());
        }
        let pos = self.filters.iter().position(|f| *f == filter).unwrap_or_else(|| {
            self.filters.push(filter);
            self.filters.len() - 1
        });
        u32::try_from(pos).unwrap_or(u32::MAX)
    }

    /// The keys of all groups.
    pub fn keys(&self) -> BTreeSet<String> {
        self.groups.iter().map(|g| g.key.clone()).collect()
    }

    fn group_id(
        &mut self,
        kind: GroupKind,
        key: &str,
        namespaces: Option<BTreeSet<String>>,
        selector: Selector,
        filter: NodeFilter,
    ) -> u32 {
        let trivial = filter.is_trivial();
        let filter = self.filter_id(filter);
        let sig = (kind, key.to_string(), namespaces, selector, filter);
        if let Some(id) = self.index.get(&sig) {
            return *id;
        }
        let id = u32::try_from(self.groups.len()).unwrap_or(u32::MAX);
        if !trivial {
            self.filtered.push(id);
        }
        self.groups.push(Group {
            kind,
            key: sig.1.clone(),
            namespaces: sig.2.clone(),
            selector: sig.3.clone(),
            filter,
            // Nodes are left out: no domain until a counted node or NodePool offers one.
            eligible: (!trivial).then(Vec::new),
            counts: vec![],
            owners: vec![],
            total: 0,
            owner_total: 0,
        });
        self.index.insert(sig, id);
        id
    }

    /// Registers the constraints `pod` has, with the `defaults` it is given (kube-scheduler's
    /// default spreads, see [`super::defaultspread`]), and returns their group ids, and the
    /// preferred ones in relaxation order. `namespace_labels` maps namespaces to their labels,
    /// for affinity terms with a namespace selector.
    pub fn register_pod(
        &mut self,
        pod: &Pod,
        defaults: &[TopologySpreadConstraint],
        namespace_labels: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> (Vec<u32>, Vec<u32>) {
        // Most pods have no constraint on other pods: nothing to register.
        let Some(spec) = pod.spec.as_ref().filter(|_| !defaults.is_empty() || constrains_others(pod)) else {
            return (vec![], vec![]);
        };
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".to_string());
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let mut owned = Vec::new();
        for c in spec.topology_spread_constraints.iter().flatten().chain(defaults) {
            let kind = GroupKind::Spread {
                max_skew: c.max_skew.max(1),
                min_domains: c.min_domains.unwrap_or(1),
                hard: c.when_unsatisfiable != "ScheduleAnyway",
            };
            let selector = Selector::new(
                c.label_selector.as_ref(),
                &labels,
                c.match_label_keys.as_deref().unwrap_or(&[]),
                &[],
            );
            let filter =
                NodeFilter::new(pod, c.node_affinity_policy.as_deref(), c.node_taints_policy.as_deref());
            owned.push(self.group_id(kind, &c.topology_key, Some([ns.clone()].into()), selector, filter));
        }
        let affinity = spec.affinity.as_ref();
        let terms = |required: Option<&Vec<PodAffinityTerm>>| required.cloned().unwrap_or_default();
        let aff = terms(
            affinity
                .and_then(|a| a.pod_affinity.as_ref())
                .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
        );
        let anti = terms(
            affinity
                .and_then(|a| a.pod_anti_affinity.as_ref())
                .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
        );
        let weighted = |list: Option<&Vec<k8s_openapi::api::core::v1::WeightedPodAffinityTerm>>| {
            let mut v: Vec<(i32, PodAffinityTerm)> =
                list.into_iter().flatten().map(|w| (w.weight, w.pod_affinity_term.clone())).collect();
            v.sort_by_key(|(w, _)| std::cmp::Reverse(*w));
            v.into_iter().map(|(_, t)| t).collect::<Vec<_>>()
        };
        let pref_aff = weighted(
            affinity
                .and_then(|a| a.pod_affinity.as_ref())
                .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref()),
        );
        let pref_anti = weighted(
            affinity
                .and_then(|a| a.pod_anti_affinity.as_ref())
                .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref()),
        );
        let mut preferred = Vec::new();
        for (kind, list) in [
            (GroupKind::Affinity, aff),
            (GroupKind::AntiAffinity, anti),
            (GroupKind::PreferredAffinity, pref_aff),
            (GroupKind::PreferredAntiAffinity, pref_anti),
        ] {
            for t in list {
                let namespaces = term_namespaces(&t, &ns, namespace_labels);
                let selector = Selector::new(
                    t.label_selector.as_ref(),
                    &labels,
                    t.match_label_keys.as_deref().unwrap_or(&[]),
                    t.mismatch_label_keys.as_deref().unwrap_or(&[]),
                );
                let id = self.group_id(kind, &t.topology_key, namespaces, selector, NodeFilter::default());
                if kind.is_preferred() && !preferred.contains(&id) {
                    preferred.push(id);
                }
                owned.push(id);
            }
        }
        owned.sort_unstable();
        owned.dedup();
        (owned, preferred)
    }

    /// Computes the groups that select a pod and the anti-affinity groups constraining it.
    pub fn pod_topology(
        &self,
        (owned, preferred): (Vec<u32>, Vec<u32>),
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> PodTopology {
        let mut selected_by = Vec::new();
        let mut inverse = Vec::new();
        for (i, g) in self.groups.iter().enumerate() {
            if g.selects(namespace, labels) {
                let id = u32::try_from(i).unwrap_or(u32::MAX);
                selected_by.push(id);
                if g.kind == GroupKind::AntiAffinity {
                    inverse.push(id);
                }
            }
        }
        PodTopology { owned, selected_by, inverse, preferred }
    }

    /// The domains a slot offers for `key`, in name order.
    fn node_domains(&mut self, key: &str, slot: &SlotView<'_>, pod_reqs: &Requirements) -> Vec<u32> {
        if key == LABEL_HOSTNAME {
            return vec![slot.hostname];
        }
        if let Some(labels) = slot.labels {
            return labels.get(key).map(|v| vec![self.intern(v)]).unwrap_or_default();
        }
        let node = slot.reqs.get(key);
        let pod = pod_reqs.get(key);
        let offered = |v: &str| key != LABEL_TOPOLOGY_ZONE || slot.zones.is_none_or(|f| f(v));
        let allowed = |v: &str| node.is_none_or(|r| r.has(v)) && pod.is_none_or(|r| r.has(v)) && offered(v);
        match node.filter(|r| !r.is_complement()).or(pod.filter(|r| !r.is_complement())) {
            Some(finite) => {
                let vals: Vec<String> =
                    finite.values().iter().filter(|v| allowed(v)).map(str::to_string).collect();
                vals.iter().map(|v| self.intern(v)).collect()
            }
            None => self
                .universe
                .get(key)
                .map(|u| u.iter().copied().filter(|d| allowed(&self.names[*d as usize])).collect())
                .unwrap_or_default(),
        }
    }

    /// The smallest count of a spread group over the domains the pod could go to.
    fn global_min(&self, g: &Group, min_domains: i32, pod_reqs: &Requirements) -> i32 {
        if g.key == LABEL_HOSTNAME && self.new_nodes_possible {
            return 0;
        }
        // With `nodeAffinityPolicy: Ignore` the domains the pod cannot go to count as well.
        let honor = self.filters.get(g.filter as usize).is_none_or(|f| f.honor_affinity);
        let pod = pod_reqs.get(&g.key).filter(|_| honor);
        let domains = g.eligible.as_ref().or_else(|| self.universe.get(&g.key));
        let mut min = i32::MAX;
        let mut eligible = 0;
        for d in domains.into_iter().flatten() {
            if pod.is_none_or(|r| r.has(&self.names[*d as usize])) {
                eligible += 1;
                min = min.min(g.count(*d));
            }
        }
        if eligible < min_domains || min == i32::MAX { 0 } else { min }
    }

    /// The group `gid` of the pod's own and the kind it is enforced as, unless `requirements_for`
    /// with `soft` and `relaxed_prefs` leaves it out (a `ScheduleAnyway` spread when not `soft`,
    /// a preference relaxed).
    fn enforced(
        &self,
        pod: &PodTopology,
        gid: u32,
        soft: bool,
        relaxed_prefs: usize,
    ) -> Option<(&Group, GroupKind)> {
        let g = self.groups.get(gid as usize)?;
        if let GroupKind::Spread { hard: false, .. } = g.kind
            && !soft
        {
            return None;
        }
        if g.kind.is_preferred() && pod.preferred.get(..relaxed_prefs).is_some_and(|r| r.contains(&gid)) {
            return None;
        }
        Some((g, g.kind.enforced()))
    }

    /// Whether the host name `host` passes `g` (keyed by host name), enforced as `kind`, for a
    /// pod that the group counts (`self_sel`) or not.
    fn host_ok(
        &self,
        g: &Group,
        kind: GroupKind,
        self_sel: bool,
        pod_reqs: &Requirements,
        host: u32,
    ) -> bool {
        match kind {
            GroupKind::Spread { max_skew, min_domains, .. } => {
                g.count(host) + i32::from(self_sel) - self.global_min(g, min_domains, pod_reqs) <= max_skew
            }
            GroupKind::Affinity => g.count(host) > 0 || (self_sel && g.total == 0),
            _ => g.count(host) == 0,
        }
    }

    /// Whether the host name `host` passes the pod's own pod (anti-)affinity and other pods'
    /// anti-affinity keyed by host name, as [`Topology::requirements_for`] checks them with the
    /// same arguments: anything but [`HostCheck::Passes`] means that call rejects any slot of that
    /// host. A check of a few counts, made before the costlier ones when a pod is tried on an
    /// existing node (in a cluster whose pods keep apart by host, most nodes are ruled out by it).
    /// Spreads are left to that call: they need the smallest count over every host.
    pub fn host_allows(
        &self,
        pod: &PodTopology,
        pod_reqs: &Requirements,
        host: u32,
        soft: bool,
        relaxed_prefs: usize,
    ) -> HostCheck {
        let mut check = HostCheck::Passes;
        for &gid in &pod.owned {
            let Some((g, kind)) = self.enforced(pod, gid, soft, relaxed_prefs) else { continue };
            if g.key != LABEL_HOSTNAME || matches!(kind, GroupKind::Spread { .. }) {
                continue;
            }
            if !self.host_ok(g, kind, pod.selected_by.binary_search(&gid).is_ok(), pod_reqs, host) {
                // Counts only grow: a pod kept away stays kept away; one waiting for company may
                // get it.
                match kind {
                    GroupKind::Affinity => check = HostCheck::NotYet,
                    _ => return HostCheck::Never,
                }
            }
        }
        let kept_away = pod.inverse.iter().any(|&gid| {
            self.groups
                .get(gid as usize)
                .is_some_and(|g| g.owner_total > 0 && g.key == LABEL_HOSTNAME && g.owners(host) > 0)
        });
        if kept_away { HostCheck::Never } else { check }
    }

    /// Checks the pod's topology constraints on a slot and returns the requirements they add
    /// (the chosen domains), or which constraint the slot would violate. `soft` enforces
    /// `ScheduleAnyway` spreads as well; the first `relaxed_prefs` of the pod's preferred pod
    /// (anti-)affinity terms are no longer enforced.
    pub fn requirements_for(
        &mut self,
        pod: &PodTopology,
        pod_reqs: &Requirements,
        slot: &SlotView<'_>,
        soft: bool,
        relaxed_prefs: usize,
    ) -> Result<Vec<(String, Requirement)>, TopologyReject> {
        let mut out = Vec::new();
        for &gid in &pod.owned {
            let Some((g, kind)) = self.enforced(pod, gid, soft, relaxed_prefs) else { continue };
            let self_sel = pod.selected_by.binary_search(&gid).is_ok();
            let add = i32::from(self_sel);
            // Zones filtered by what fits depend on the pod's size: not a lasting verdict.
            let size_dependent = g.key == LABEL_TOPOLOGY_ZONE && slot.zones.is_some();
            let permanent = match kind {
                GroupKind::AntiAffinity => !size_dependent,
                GroupKind::Spread { .. } => g.key == LABEL_HOSTNAME && self.new_nodes_possible,
                _ => false,
            };
            let reject = TopologyReject { group: gid, inverse: false, permanent };
            if g.key == LABEL_HOSTNAME {
                // The slot is one host name: a plain check, nothing to narrow.
                if !self.host_ok(g, kind, self_sel, pod_reqs, slot.hostname) {
                    return Err(reject);
                }
                continue;
            }
            let key = g.key.clone();
            let nd = self.node_domains(&key, slot, pod_reqs);
            let g = &self.groups[gid as usize];
            let chosen: Vec<u32> = match kind {
                GroupKind::Spread { max_skew, min_domains, .. } => {
                    let min = self.global_min(g, min_domains, pod_reqs);
                    let best = nd
                        .iter()
                        .copied()
                        .filter(|d| g.count(*d) + add - min <= max_skew)
                        .min_by_key(|d| g.count(*d));
                    match best {
                        Some(d) => vec![d],
                        None => return Err(reject),
                    }
                }
                GroupKind::Affinity => {
                    let mut allowed: Vec<u32> = nd.iter().copied().filter(|d| g.count(*d) > 0).collect();
                    if allowed.is_empty() && self_sel && g.total == 0 {
                        allowed.extend(nd.first());
                    }
                    if allowed.is_empty() {
                        return Err(reject);
                    }
                    allowed
                }
                _ => {
                    if nd.is_empty() {
                        continue;
                    }
                    let allowed: Vec<u32> = nd.iter().copied().filter(|d| g.count(*d) == 0).collect();
                    if allowed.is_empty() {
                        return Err(reject);
                    }
                    if allowed.len() == nd.len() {
                        continue;
                    }
                    allowed
                }
            };
            push_choice(&mut out, &key, slot, chosen.iter().map(|d| self.name(*d).to_string()).collect());
        }
        for &gid in &pod.inverse {
            let Some(g) = self.groups.get(gid as usize) else { continue };
            if g.owner_total == 0 {
                continue;
            }
            let size_dependent = g.key == LABEL_TOPOLOGY_ZONE && slot.zones.is_some();
            let reject = TopologyReject { group: gid, inverse: true, permanent: !size_dependent };
            if g.key == LABEL_HOSTNAME {
                if g.owners(slot.hostname) > 0 {
                    return Err(reject);
                }
                continue;
            }
            let key = g.key.clone();
            let nd = self.node_domains(&key, slot, pod_reqs);
            let g = &self.groups[gid as usize];
            let allowed: Vec<u32> = nd.iter().copied().filter(|d| g.owners(*d) == 0).collect();
            if allowed.is_empty() && !nd.is_empty() {
                return Err(reject);
            }
            if allowed.len() < nd.len() {
                push_choice(
                    &mut out,
                    &key,
                    slot,
                    allowed.iter().map(|d| self.name(*d).to_string()).collect(),
                );
            }
        }
        Ok(out)
    }

    /// Describes a rejection: `would violate topology spread constraint on topology.kubernetes.io/zone`.
    pub fn describe(&self, reject: TopologyReject) -> String {
        let Some(g) = self.groups.get(reject.group as usize) else { return "topology".to_string() };
        let what = match (g.kind, reject.inverse) {
            (_, true) => "the pod anti-affinity of another pod",
            (GroupKind::Spread { .. }, _) => "topology spread constraint",
            (GroupKind::Affinity, _) => "pod affinity",
            (GroupKind::AntiAffinity, _) => "pod anti-affinity",
            (GroupKind::PreferredAffinity, _) => "preferred pod affinity",
            (GroupKind::PreferredAntiAffinity, _) => "preferred pod anti-affinity",
        };
        let detail = match g.kind {
            GroupKind::Spread { max_skew, .. } => format!("maxSkew {max_skew}, "),
            _ => String::new(),
        };
        format!("would violate {what} on {} ({detail}counting pods {})", g.key, g.selector.describe())
    }

    /// Domains of `key` to record a pod under on the final slot: the single value, or for
    /// anti-affinity every value still possible.
    fn record_domains(&mut self, key: &str, slot: &SlotView<'_>, all: bool) -> Vec<u32> {
        if key == LABEL_HOSTNAME {
            return vec![slot.hostname];
        }
        if let Some(labels) = slot.labels {
            return labels.get(key).map(|v| vec![self.intern(v)]).unwrap_or_default();
        }
        match slot.reqs.get(key) {
            Some(r) if !r.is_complement() && (all || r.len() == 1) => {
                let vals: Vec<String> = r.values().iter().map(str::to_string).collect();
                vals.iter().map(|v| self.intern(v)).collect()
            }
            _ => vec![],
        }
    }

    /// Counts a pod placed on `slot` (whose requirements already include the pod's).
    pub fn record(&mut self, pod: &PodTopology, slot: &SlotView<'_>) {
        for &gid in &pod.selected_by {
            let Some(g) = self.groups.get(gid as usize) else { continue };
            if g.eligible.is_some()
                && self
                    .filters
                    .get(g.filter as usize)
                    .is_some_and(|f| !f.admits(slot.reqs, slot.taints, slot.labels.is_some(), None))
            {
                continue;
            }
            let all = g.kind.enforced() == GroupKind::AntiAffinity;
            let key = g.key.clone();
            let domains = self.record_domains(&key, slot, all);
            let g = &mut self.groups[gid as usize];
            g.total += 1;
            for d in domains {
                bump(&mut g.counts, d);
            }
        }
        for &gid in &pod.owned {
            let Some(g) = self.groups.get(gid as usize) else { continue };
            if g.kind != GroupKind::AntiAffinity {
                continue;
            }
            let key = g.key.clone();
            let domains = self.record_domains(&key, slot, true);
            let g = &mut self.groups[gid as usize];
            g.owner_total += 1;
            for d in domains {
                bump(&mut g.owners, d);
            }
        }
    }
}

fn push_unique(list: &mut Vec<u32>, id: u32) {
    if !list.contains(&id) {
        list.push(id);
    }
}

fn push_choice(out: &mut Vec<(String, Requirement)>, key: &str, slot: &SlotView<'_>, values: Vec<String>) {
    if key == LABEL_HOSTNAME || slot.labels.is_some() {
        return;
    }
    if let Some(cur) = slot.reqs.get(key)
        && !cur.is_complement()
        && cur.len() == values.len()
    {
        return;
    }
    out.push((key.to_string(), Requirement::in_values(values)));
}

fn term_namespaces(
    t: &PodAffinityTerm,
    own: &str,
    namespace_labels: &BTreeMap<String, BTreeMap<String, String>>,
) -> Option<BTreeSet<String>> {
    let mut set: BTreeSet<String> = t.namespaces.iter().flatten().cloned().collect();
    match &t.namespace_selector {
        Some(sel)
            if sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty()) =>
        {
            return None;
        }
        Some(sel) => {
            let s = Selector::new(Some(sel), &BTreeMap::new(), &[], &[]);
            set.extend(namespace_labels.iter().filter(|(_, l)| s.matches(l)).map(|(n, _)| n.clone()));
        }
        None => {
            if set.is_empty() {
                set.insert(own.to_string());
            }
        }
    }
    Some(set)
}

/// Whether `pod` has a topology spread constraint or a pod (anti-)affinity: a constraint whose
/// groups count other pods.
pub fn constrains_others(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|spec| {
        spec.topology_spread_constraints.as_ref().is_some_and(|c| !c.is_empty())
            || spec
                .affinity
                .as_ref()
                .is_some_and(|a| a.pod_affinity.is_some() || a.pod_anti_affinity.is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use rstest::rstest;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[rstest]
    #[case(None, &[("a", "1")], false)]
    #[case(Some(LabelSelector::default()), &[("a", "1")], true)]
    #[case(Some(LabelSelector { match_labels: Some(labels(&[("a", "1")])), match_expressions: None }), &[("a", "1")], true)]
    #[case(Some(LabelSelector { match_labels: Some(labels(&[("a", "2")])), match_expressions: None }), &[("a", "1")], false)]
    #[case(
        Some(LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "a".into(),
                operator: "NotIn".into(),
                values: Some(vec!["2".into()]),
            }]),
        }),
        &[],
        true
    )]
    #[case(
        Some(LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "a".into(),
                operator: "Exists".into(),
                values: None,
            }]),
        }),
        &[("b", "1")],
        false
    )]
    fn selector_table(#[case] sel: Option<LabelSelector>, #[case] l: &[(&str, &str)], #[case] want: bool) {
        assert_eq!(Selector::new(sel.as_ref(), &BTreeMap::new(), &[], &[]).matches(&labels(l)), want);
    }

    #[test]
    fn match_label_keys_use_owner_values() {
        let s =
            Selector::new(Some(&LabelSelector::default()), &labels(&[("rev", "1")]), &["rev".into()], &[]);
        assert!(s.matches(&labels(&[("rev", "1")])));
        assert!(!s.matches(&labels(&[("rev", "2")])));
    }
}
