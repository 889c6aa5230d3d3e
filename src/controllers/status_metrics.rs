//! Upstream's `operator_*` status-condition metrics: for NodeClaims, NodePools, Nodes and
//! EC2NodeClasses, which conditions each object has and for how long, how often conditions
//! change status and how long they kept the previous one, how long objects take to terminate; and
//! a `Status condition transitioned` event on the object at each change, and a `Finalized` event
//! for each finalizer removed from it (also once it is gone).
//!
//! As upstream, transitions are what this process observes: it remembers each object's conditions
//! from one look to the next (every [`PERIOD`]), a condition it never saw counts as `Unknown`
//! before (so after a restart every True or False condition counts once), and changes between two
//! looks are not seen. NodeClaims, NodePools and EC2NodeClasses also feed the deprecated
//! kind-agnostic `operator_status_condition_*` families (labelled `group` and `kind`); Nodes do
//! not.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use tokio::sync::watch;

use crate::apis::labels::{LABEL_EC2NODECLASS, LABEL_INITIALIZED, LABEL_NODEPOOL};
use crate::apis::{Condition, EC2NodeClass, NodeClaim, NodePool};
use crate::controllers::Context;
use crate::controllers::events::EventType;
use crate::controllers::kit::{Next, Options, Timer, run_singleton};
use crate::metrics::{LabelParts, Labels, SharedLabels, StatusFamilies, StatusMetrics};
use crate::state::ClusterState;

/// Name of the controller, in logs.
pub const CONTROLLER: &str = "operatorpkg.status";
/// How often every object is looked at (upstream requeues each one every 10 s).
pub const PERIOD: Duration = Duration::from_secs(10);

/// A kind of object whose conditions are exported.
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    /// API group, for the deprecated families.
    pub group: &'static str,
    /// Kind, for the deprecated families.
    pub kind: &'static str,
    /// The object labels whose values become extra series labels, with the label names
    /// Prometheus sees.
    pub extra: &'static [(&'static str, &'static str)],
    /// Whether the deprecated families are fed too.
    pub deprecated: bool,
}

/// NodeClaims.
pub const NODECLAIM: Kind = Kind {
    group: "karpenter.sh",
    kind: "NodeClaim",
    extra: &[
        (LABEL_EC2NODECLASS, "karpenter_k8s_aws_ec2nodeclass"),
        (LABEL_NODEPOOL, "karpenter_sh_nodepool"),
    ],
    deprecated: true,
};
/// NodePools.
pub const NODEPOOL: Kind = Kind { group: "karpenter.sh", kind: "NodePool", extra: &[], deprecated: true };
/// Nodes.
pub const NODE: Kind = Kind {
    group: "",
    kind: "Node",
    extra: &[
        (LABEL_EC2NODECLASS, "karpenter_k8s_aws_ec2nodeclass"),
        (LABEL_NODEPOOL, "karpenter_sh_nodepool"),
        (LABEL_INITIALIZED, "karpenter_sh_initialized"),
    ],
    deprecated: false,
};
/// EC2NodeClasses.
pub const EC2NODECLASS: Kind =
    Kind { group: "karpenter.k8s.aws", kind: "EC2NodeClass", extra: &[], deprecated: true };

/// A condition as the metrics see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Its type.
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    /// Its reason.
    pub reason: String,
    /// Its message.
    pub message: String,
    /// When its status last changed.
    pub since: Option<Timestamp>,
}

/// An object as the metrics see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Object {
    /// Its name (all four kinds are cluster-scoped).
    pub name: String,
    /// Its conditions.
    pub conditions: Vec<Seen>,
    /// The values of its kind's extra labels, in order.
    pub extra: Vec<String>,
    /// Its deletion timestamp.
    pub deleting_since: Option<Timestamp>,
    /// Its finalizers.
    pub finalizers: Vec<String>,
    /// Its UID, for events about it once it is gone.
    pub uid: String,
}

impl Object {
    fn of(
        kind: &Kind,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        conditions: Vec<Seen>,
    ) -> Self {
        let labels = meta.labels.as_ref();
        Object {
            name: meta.name.clone().unwrap_or_default(),
            conditions,
            extra: kind
                .extra
                .iter()
                .map(|(key, _)| labels.and_then(|l| l.get(*key)).cloned().unwrap_or_default())
                .collect(),
            deleting_since: meta.deletion_timestamp.as_ref().map(|t| t.0),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
        }
    }

    /// A Karpenter object (its conditions are [`Condition`]s).
    pub fn karpenter(
        kind: &Kind,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        conditions: &[Condition],
    ) -> Self {
        let seen = conditions
            .iter()
            .map(|c| Seen {
                type_: c.type_.clone(),
                status: format!("{:?}", c.status),
                reason: c.reason.clone(),
                message: c.message.clone(),
                since: c.last_transition_time.parse().ok(),
            })
            .collect();
        Object::of(kind, meta, seen)
    }

    /// A Node.
    pub fn node(node: &Node) -> Self {
        let seen = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .map(|c| Seen {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone().unwrap_or_default(),
                message: c.message.clone().unwrap_or_default(),
                since: c.last_transition_time.as_ref().map(|t| t.0),
            })
            .collect();
        Object::of(&NODE, node.meta(), seen)
    }
}

/// A transition seen between two looks at an object, told in an event on it: a condition that
/// changed status, or a finalizer that was removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The event's reason: the condition's type, or `Finalized`.
    pub reason: String,
    /// The event's message.
    pub message: String,
    /// The object's UID (the event still names it once the object is gone).
    pub uid: String,
}

/// Reason of the event about a removed finalizer.
pub const FINALIZED: &str = "Finalized";

/// The events about the finalizers `before` had and `now` lacks, as upstream's
/// `Finalized <finalizer>`.
fn finalized(before: &Object, now: &[String]) -> Vec<Transition> {
    before
        .finalizers
        .iter()
        .filter(|f| !now.contains(f))
        .map(|f| Transition {
            reason: FINALIZED.to_string(),
            message: format!("Finalized {f}"),
            uid: before.uid.clone(),
        })
        .collect()
}

/// What the metrics remember of one kind's objects between looks.
#[derive(Debug, Default)]
pub struct Recorder {
    seen: HashMap<String, Object>,
    parts: LabelParts,
}

/// The label parts of one object's per-object series.
struct ObjectLabels {
    /// `namespace` (empty: the four kinds are cluster-scoped) and `name`.
    head: Arc<Labels>,
    /// The kind's extra labels, last in the kind's own families.
    extra: Arc<Labels>,
    /// `group` and `kind`, last in the deprecated families.
    kind: Arc<Labels>,
}

impl ObjectLabels {
    fn new(kind: &Kind, object: &Object, parts: &mut LabelParts) -> Self {
        ObjectLabels {
            head: Arc::new(vec![("namespace", String::new()), ("name", object.name.clone())]),
            extra: parts.get(extra(kind, object)),
            kind: parts.get(vec![("group", kind.group.to_string()), ("kind", kind.kind.to_string())]),
        }
    }

    /// The labels of the series of condition `c`, in the kind's own families and the deprecated.
    fn condition(&self, c: &Seen, parts: &mut LabelParts) -> (SharedLabels, SharedLabels) {
        let condition = parts.get(vec![
            ("type", c.type_.clone()),
            ("status", c.status.clone()),
            ("reason", c.reason.clone()),
        ]);
        self.with(condition)
    }

    /// The labels of the object's termination series.
    fn termination(&self, parts: &mut LabelParts) -> (SharedLabels, SharedLabels) {
        self.with(parts.get(Vec::new()))
    }

    fn with(&self, middle: Arc<Labels>) -> (SharedLabels, SharedLabels) {
        (
            SharedLabels([self.head.clone(), middle.clone(), self.extra.clone()]),
            SharedLabels([self.head.clone(), middle, self.kind.clone()]),
        )
    }
}

impl Recorder {
    /// Looks at the kind's `objects` at `now`: sets, refreshes and removes their series in
    /// `families` (and the deprecated ones), and returns the transitions seen, by object name. An
    /// object seen before and not among `objects` is gone: its series go, and its termination
    /// time is observed when it was seen terminating.
    pub fn look(
        &mut self,
        kind: &Kind,
        metrics: &StatusMetrics,
        families: &StatusFamilies,
        objects: Vec<Object>,
        now: Timestamp,
    ) -> Vec<(String, Transition)> {
        let deprecated = kind.deprecated.then_some(&metrics.deprecated);
        let names: BTreeSet<String> = objects.iter().map(|o| o.name.clone()).collect();
        let gone: Vec<String> = self.seen.keys().filter(|name| !names.contains(*name)).cloned().collect();
        let mut transitions = Vec::new();
        for name in gone {
            if let Some(object) = self.seen.remove(&name) {
                forget(kind, families, deprecated, &object, now, &mut self.parts);
                // Its finalizers were removed for it to go.
                transitions.extend(finalized(&object, &[]).into_iter().map(|t| (name.clone(), t)));
            }
        }
        for mut object in objects {
            let before = self.seen.remove(&object.name);
            transitions.extend(
                record(kind, families, deprecated, before.as_ref(), &object, now, &mut self.parts)
                    .into_iter()
                    .map(|t| (object.name.clone(), t)),
            );
            // Only the conditions' new messages are told.
            for c in &mut object.conditions {
                c.message = String::new();
            }
            self.seen.insert(object.name.clone(), object);
        }
        self.parts.prune();
        transitions
    }
}

fn seconds_between(from: Option<Timestamp>, to: Timestamp) -> f64 {
    from.map_or(0.0, |from| to.duration_since(from).as_secs_f64())
}

fn extra(kind: &Kind, object: &Object) -> Labels {
    kind.extra.iter().map(|(_, name)| *name).zip(object.extra.iter().cloned()).collect()
}

/// Records one look at `object`, which was `before` at the previous look.
fn record(
    kind: &Kind,
    families: &StatusFamilies,
    deprecated: Option<&StatusFamilies>,
    before: Option<&Object>,
    object: &Object,
    now: Timestamp,
    parts: &mut LabelParts,
) -> Vec<Transition> {
    // Series of conditions that changed, or of labels that changed, go first.
    if let Some(before) = before {
        let was = ObjectLabels::new(kind, before, parts);
        for old in &before.conditions {
            let current = object.conditions.iter().find(|c| c.type_ == old.type_);
            let changed = current.is_none_or(|c| c.status != old.status || c.reason != old.reason);
            if changed || before.extra != object.extra {
                let (own, dep) = was.condition(old, parts);
                families.condition_count.remove(&own);
                families.condition_current_status_seconds.remove(&own);
                if let Some(d) = deprecated {
                    d.condition_count.remove(&dep);
                    d.condition_current_status_seconds.remove(&dep);
                }
            }
        }
        if before.extra != object.extra {
            let (own, _) = was.termination(parts);
            families.termination_current_time_seconds.remove(&own);
        }
    }
    let labels = ObjectLabels::new(kind, object, parts);
    for c in &object.conditions {
        let (own, dep) = labels.condition(c, parts);
        let age = seconds_between(c.since, now);
        families.condition_count.get_or_create(&own).set(1.0);
        families.condition_current_status_seconds.get_or_create(&own).set(age);
        if let Some(d) = deprecated {
            d.condition_count.get_or_create(&dep).set(1.0);
            d.condition_current_status_seconds.get_or_create(&dep).set(age);
        }
    }
    if let Some(since) = object.deleting_since {
        let (own, dep) = labels.termination(parts);
        let age = seconds_between(Some(since), now);
        families.termination_current_time_seconds.get_or_create(&own).set(age);
        if let Some(d) = deprecated {
            d.termination_current_time_seconds.get_or_create(&dep).set(age);
        }
    }
    let mut transitions = before.map(|b| finalized(b, &object.finalizers)).unwrap_or_default();
    for c in &object.conditions {
        let old = before.and_then(|b| b.conditions.iter().find(|o| o.type_ == c.type_));
        let old_status = old.map_or("Unknown", |o| o.status.as_str());
        if old_status == c.status {
            continue;
        }
        let mut labels: Labels =
            vec![("type", c.type_.clone()), ("status", c.status.clone()), ("reason", c.reason.clone())];
        labels.extend(extra(kind, object));
        families.condition_transitions.get_or_create(&labels).inc();
        if let Some(d) = deprecated {
            let dep = vec![
                ("type", c.type_.clone()),
                ("status", c.status.clone()),
                ("reason", c.reason.clone()),
                ("group", kind.group.to_string()),
                ("kind", kind.kind.to_string()),
            ];
            d.condition_transitions.get_or_create(&dep).inc();
        }
        let Some(old) = old else { continue };
        let kept = match (old.since, c.since) {
            (Some(from), Some(to)) => to.duration_since(from).as_secs_f64(),
            _ => 0.0,
        };
        let mut labels: Labels = vec![("type", old.type_.clone()), ("status", old.status.clone())];
        labels.extend(extra(kind, object));
        families.condition_transition_seconds.get_or_create(&labels).observe(kept);
        if let Some(d) = deprecated {
            let dep = vec![
                ("type", old.type_.clone()),
                ("status", old.status.clone()),
                ("group", kind.group.to_string()),
                ("kind", kind.kind.to_string()),
            ];
            d.condition_transition_seconds.get_or_create(&dep).observe(kept);
        }
        let message = if c.message.is_empty() { String::new() } else { format!(", Message: {}", c.message) };
        transitions.push(Transition {
            reason: c.type_.clone(),
            message: format!(
                "Status condition transitioned, Type: {}, Status: {} -> {}, Reason: {}{message}",
                c.type_, old.status, c.status, c.reason
            ),
            uid: object.uid.clone(),
        });
    }
    transitions
}

/// Removes the series of `object`, gone; observes how long it took to terminate.
fn forget(
    kind: &Kind,
    families: &StatusFamilies,
    deprecated: Option<&StatusFamilies>,
    object: &Object,
    now: Timestamp,
    parts: &mut LabelParts,
) {
    let labels = ObjectLabels::new(kind, object, parts);
    for c in &object.conditions {
        let (own, dep) = labels.condition(c, parts);
        families.condition_count.remove(&own);
        families.condition_current_status_seconds.remove(&own);
        if let Some(d) = deprecated {
            d.condition_count.remove(&dep);
            d.condition_current_status_seconds.remove(&dep);
        }
    }
    let (own, dep) = labels.termination(parts);
    families.termination_current_time_seconds.remove(&own);
    if let Some(d) = deprecated {
        d.termination_current_time_seconds.remove(&dep);
    }
    if let Some(since) = object.deleting_since {
        let took = seconds_between(Some(since), now);
        families.termination_duration_seconds.get_or_create(&extra(kind, object)).observe(took);
        if let Some(d) = deprecated {
            let dep = vec![("group", kind.group.to_string()), ("kind", kind.kind.to_string())];
            d.termination_duration_seconds.get_or_create(&dep).observe(took);
        }
    }
}

/// The four kinds' recorders.
#[derive(Debug, Default)]
struct Recorders {
    nodeclaims: Recorder,
    nodepools: Recorder,
    nodes: Recorder,
    nodeclasses: Recorder,
}

/// Runs the controller until `stop` turns true: a look at every object of the four kinds every
/// [`PERIOD`]. With `cluster_state` false (`DISABLE_CLUSTER_STATE_OBSERVABILITY`), only
/// EC2NodeClasses are looked at, as upstream.
pub async fn run(ctx: Context, state: ClusterState, cluster_state: bool, stop: watch::Receiver<bool>) {
    let recorders = Arc::new(tokio::sync::Mutex::new(Recorders::default()));
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), Timer, stop, || {
        let (ctx, state, recorders) = (ctx.clone(), state.clone(), recorders.clone());
        async move {
            let mut recorders = recorders.lock().await;
            pass(&ctx, &state, cluster_state, &mut recorders).await;
            Ok::<_, std::convert::Infallible>(Next::After(PERIOD))
        }
    })
    .await;
}

async fn pass(ctx: &Context, state: &ClusterState, cluster_state: bool, recorders: &mut Recorders) {
    let now = Timestamp::now();
    let status = &ctx.metrics.status;
    let classes = state.nodeclasses.state();
    let object = |c: &EC2NodeClass| Object::karpenter(&EC2NODECLASS, c.meta(), class_conditions(c));
    let events = look_at(
        &mut recorders.nodeclasses,
        &EC2NODECLASS,
        status,
        &status.ec2nodeclass,
        classes,
        object,
        now,
    );
    publish(ctx, events).await;
    if !cluster_state {
        return;
    }
    let object = |c: &NodeClaim| Object::karpenter(&NODECLAIM, c.meta(), c.conditions());
    let events = look_at(
        &mut recorders.nodeclaims,
        &NODECLAIM,
        status,
        &status.nodeclaim,
        state.nodeclaims.state(),
        object,
        now,
    );
    publish(ctx, events).await;
    let object = |p: &NodePool| Object::karpenter(&NODEPOOL, p.meta(), pool_conditions(p));
    let events = look_at(
        &mut recorders.nodepools,
        &NODEPOOL,
        status,
        &status.nodepool,
        state.nodepools.state(),
        object,
        now,
    );
    publish(ctx, events).await;
    let events =
        look_at(&mut recorders.nodes, &NODE, status, &status.node, state.nodes.state(), Object::node, now);
    publish(ctx, events).await;
}

/// Looks at `objects` of `kind` (each seen as `object` sees it) with `recorder`; returns the
/// Normal event about each transition seen: a reference to its object (or one named from `kind`
/// and what was last seen of it, when it is gone) and the transition. The objects are let go
/// before the events are sent: a pass with many transitions spends a while sending, and objects
/// held meanwhile would keep the versions the watches replaced them with alive beside them.
fn look_at<K: Resource<DynamicType = ()>>(
    recorder: &mut Recorder,
    kind: &Kind,
    metrics: &StatusMetrics,
    families: &StatusFamilies,
    objects: Vec<Arc<K>>,
    object: impl Fn(&K) -> Object,
    now: Timestamp,
) -> Vec<(ObjectReference, Transition)> {
    let seen = recorder.look(kind, metrics, families, objects.iter().map(|o| object(o)).collect(), now);
    if seen.is_empty() {
        return Vec::new();
    }
    let by_name: HashMap<&str, &K> =
        objects.iter().filter_map(|o| o.meta().name.as_deref().map(|name| (name, o.as_ref()))).collect();
    seen.into_iter()
        .map(|(name, t)| {
            let reference = by_name
                .get(name.as_str())
                .map(|o| o.object_ref(&()))
                .unwrap_or_else(|| kind.reference(&name, &t.uid));
            (reference, t)
        })
        .collect()
}

fn class_conditions(class: &EC2NodeClass) -> &[Condition] {
    class.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default()
}

fn pool_conditions(pool: &NodePool) -> &[Condition] {
    pool.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default()
}

/// Sends `events`, in order.
async fn publish(ctx: &Context, events: Vec<(ObjectReference, Transition)>) {
    for (reference, t) in events {
        ctx.events.publish(reference, EventType::Normal, &t.reason, t.message).await;
    }
}

impl Kind {
    /// A reference to the object `name` of this kind with `uid`.
    fn reference(&self, name: &str, uid: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some(if self.group.is_empty() {
                "v1".to_string()
            } else {
                format!("{}/v1", self.group)
            }),
            kind: Some(self.kind.to_string()),
            name: Some(name.to_string()),
            uid: (!uid.is_empty()).then(|| uid.to_string()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;
    use crate::metrics::Metrics;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn seen(type_: &str, status: &str, reason: &str, since: &str) -> Seen {
        Seen {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            since: Some(at(since)),
        }
    }

    fn claim(conditions: Vec<Seen>, deleting: Option<&str>) -> Object {
        Object {
            name: "c1".into(),
            conditions,
            extra: vec!["default".into(), "general".into()],
            deleting_since: deleting.map(at),
            finalizers: vec!["karpenter.sh/termination".into()],
            uid: "u1".into(),
        }
    }

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn objects_share_their_repeated_label_parts_until_no_series_holds_them() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let status = &metrics.status;
        let mut recorder = Recorder::default();
        let named = |name: &str| Object {
            name: name.into(),
            ..claim(vec![seen("Launched", "True", "Launched", "2026-01-01T00:00:00Z")], None)
        };
        let now = at("2026-01-01T00:00:30Z");
        recorder.look(&NODECLAIM, status, &status.nodeclaim, vec![named("c1"), named("c2")], now);
        // One condition part (in each claim's four series), one part of the kind's extra labels
        // (two series each) and one of group and kind (the deprecated two), each held once more
        // by the interner.
        let mut held: Vec<(String, usize)> = recorder
            .parts
            .0
            .iter()
            .map(|(labels, part)| {
                (labels.first().map(|(k, _)| k.to_string()).unwrap_or_default(), Arc::strong_count(part))
            })
            .collect();
        held.sort();
        assert_eq!(
            held,
            vec![
                ("group".to_string(), 5),
                ("karpenter_k8s_aws_ec2nodeclass".to_string(), 5),
                ("type".to_string(), 9)
            ]
        );
        let out = text(&registry);
        assert!(out.contains("operator_status_condition_count{namespace=\"\",name=\"c2\",type=\"Launched\",status=\"True\",reason=\"Launched\",group=\"karpenter.sh\",kind=\"NodeClaim\"} 1"), "{out}");
        // Both gone: their series go, and so do the parts.
        recorder.look(&NODECLAIM, status, &status.nodeclaim, Vec::new(), now);
        assert!(recorder.parts.0.is_empty(), "{:?}", recorder.parts);
        assert!(!text(&registry).contains("name=\"c1\""));
    }

    #[test]
    fn conditions_transitions_and_termination_are_exported_as_upstream() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let status = &metrics.status;
        let mut recorder = Recorder::default();
        let look = |recorder: &mut Recorder, object: Object, now: &str| {
            recorder.look(&NODECLAIM, status, &status.nodeclaim, vec![object], at(now))
        };
        // First look: Launched=True counts as a transition from Unknown; no event (nothing seen
        // before).
        let first = claim(vec![seen("Launched", "True", "Launched", "2026-01-01T00:00:00Z")], None);
        assert!(look(&mut recorder, first, "2026-01-01T00:00:30Z").is_empty());
        let out = text(&registry);
        let count = "operator_nodeclaim_status_condition_count{namespace=\"\",name=\"c1\",type=\"Launched\",status=\"True\",reason=\"Launched\",karpenter_k8s_aws_ec2nodeclass=\"default\",karpenter_sh_nodepool=\"general\"} 1";
        assert!(out.contains(count), "{out}");
        assert!(out.contains("operator_nodeclaim_status_condition_current_status_seconds{namespace=\"\",name=\"c1\",type=\"Launched\",status=\"True\",reason=\"Launched\",karpenter_k8s_aws_ec2nodeclass=\"default\",karpenter_sh_nodepool=\"general\"} 30"), "{out}");
        assert!(out.contains("operator_nodeclaim_status_condition_transitions_total{type=\"Launched\",status=\"True\",reason=\"Launched\",karpenter_k8s_aws_ec2nodeclass=\"default\",karpenter_sh_nodepool=\"general\"} 1"), "{out}");
        assert!(out.contains("operator_status_condition_count{namespace=\"\",name=\"c1\",type=\"Launched\",status=\"True\",reason=\"Launched\",group=\"karpenter.sh\",kind=\"NodeClaim\"} 1"), "{out}");

        // Ready goes Unknown -> True after 40 s: a transition, its duration, an event; the old
        // series goes.
        let before = claim(
            vec![
                seen("Launched", "True", "Launched", "2026-01-01T00:00:00Z"),
                seen("Ready", "Unknown", "AwaitingReconciliation", "2026-01-01T00:00:00Z"),
            ],
            None,
        );
        look(&mut recorder, before, "2026-01-01T00:00:35Z");
        let after = claim(
            vec![
                seen("Launched", "True", "Launched", "2026-01-01T00:00:00Z"),
                seen("Ready", "True", "Ready", "2026-01-01T00:00:40Z"),
            ],
            Some("2026-01-01T00:01:00Z"),
        );
        let told = look(&mut recorder, after, "2026-01-01T00:01:10Z");
        assert_eq!(told.len(), 1);
        assert_eq!(told[0].1.reason, "Ready");
        assert_eq!(
            told[0].1.message,
            "Status condition transitioned, Type: Ready, Status: Unknown -> True, Reason: Ready"
        );
        let out = text(&registry);
        assert!(
            !out.contains("type=\"Ready\",status=\"Unknown\",reason=\"AwaitingReconciliation\",karpenter"),
            "{out}"
        );
        assert!(out.contains("operator_nodeclaim_status_condition_transition_seconds_count{type=\"Ready\",status=\"Unknown\",karpenter_k8s_aws_ec2nodeclass=\"default\",karpenter_sh_nodepool=\"general\"} 1"), "{out}");
        assert!(out.contains("operator_nodeclaim_status_condition_transition_seconds_sum{type=\"Ready\",status=\"Unknown\",karpenter_k8s_aws_ec2nodeclass=\"default\",karpenter_sh_nodepool=\"general\"} 40"), "{out}");
        assert!(out.contains("operator_nodeclaim_termination_current_time_seconds{namespace=\"\",name=\"c1\",karpenter_k8s_aws_ec2nodeclass=\"default\",karpenter_sh_nodepool=\"general\"} 10"), "{out}");
        // An Unknown condition seen first is no transition.
        assert!(!out.contains("transitions_total{type=\"Ready\",status=\"Unknown\""), "{out}");

        // A finalizer removed: a Finalized event.
        let mut fewer = claim(
            vec![seen("Launched", "True", "Launched", "2026-01-01T00:00:00Z")],
            Some("2026-01-01T00:01:00Z"),
        );
        fewer.finalizers = vec![];
        let mut more = fewer.clone();
        more.finalizers = vec!["karpenter.sh/termination".into(), "example.com/hold".into()];
        look(&mut recorder, more, "2026-01-01T00:01:20Z");
        let mut held = fewer.clone();
        held.finalizers = vec!["example.com/hold".into()];
        let told = look(&mut recorder, held, "2026-01-01T00:01:30Z");
        let finalized: Vec<&str> =
            told.iter().filter(|(_, t)| t.reason == "Finalized").map(|(_, t)| t.message.as_str()).collect();
        assert_eq!(finalized, ["Finalized karpenter.sh/termination"]);

        // Gone: every series of the object goes, its termination took 90 s, and its last
        // finalizer is told, on the object as last seen.
        let told = recorder.look(&NODECLAIM, status, &status.nodeclaim, vec![], at("2026-01-01T00:02:30Z"));
        assert_eq!(
            told,
            [(
                "c1".to_string(),
                Transition {
                    reason: "Finalized".into(),
                    message: "Finalized example.com/hold".into(),
                    uid: "u1".into()
                }
            )]
        );
        let reference = NODECLAIM.reference("c1", "u1");
        assert_eq!(
            (reference.api_version.as_deref(), reference.kind.as_deref(), reference.uid.as_deref()),
            (Some("karpenter.sh/v1"), Some("NodeClaim"), Some("u1"))
        );
        assert_eq!(NODE.reference("n", "").api_version.as_deref(), Some("v1"));
        let out = text(&registry);
        assert!(!out.contains("name=\"c1\""), "{out}");
        assert!(out.contains("operator_nodeclaim_termination_duration_seconds_sum{karpenter_k8s_aws_ec2nodeclass=\"default\",karpenter_sh_nodepool=\"general\"} 90"), "{out}");
        assert!(
            out.contains(
                "operator_termination_duration_seconds_sum{group=\"karpenter.sh\",kind=\"NodeClaim\"} 90"
            ),
            "{out}"
        );
    }

    #[test]
    fn nodes_feed_no_deprecated_family_and_every_family_is_exported() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": {"karpenter.sh/nodepool": "general", "karpenter.sh/initialized": "true"}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
        .unwrap();
        let mut recorder = Recorder::default();
        let object = Object::node(&node);
        assert_eq!(object.extra, ["", "general", "true"]);
        recorder.look(&NODE, &metrics.status, &metrics.status.node, vec![object], at("2026-01-01T00:00:05Z"));
        let out = text(&registry);
        assert!(out.contains("operator_node_status_condition_count{namespace=\"\",name=\"n1\",type=\"Ready\",status=\"True\",reason=\"KubeletReady\",karpenter_k8s_aws_ec2nodeclass=\"\",karpenter_sh_nodepool=\"general\",karpenter_sh_initialized=\"true\"} 1"), "{out}");
        assert!(!out.contains("kind=\"Node\""), "{out}");
        let exported = crate::metrics::exported_names();
        for kind in ["nodeclaim", "nodepool", "node", "ec2nodeclass"] {
            for family in [
                "status_condition_count",
                "status_condition_current_status_seconds",
                "status_condition_transitions_total",
                "status_condition_transition_seconds_bucket",
                "termination_current_time_seconds",
                "termination_duration_seconds_bucket",
            ] {
                let name = format!("operator_{kind}_{family}");
                assert!(exported.contains(&name), "{name}");
                assert!(exported.contains(&format!("operator_{family}")), "operator_{family}");
            }
        }
    }
}
