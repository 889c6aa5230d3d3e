//! The watch streams behind the caches: one per kind, objects trimmed of what no decision reads,
//! the Karpenter custom resources converted one object at a time so that one that does not parse
//! is logged with its name and skipped instead of stalling its whole watch. [`cache`] makes the
//! cache of one kind and the future that keeps it current.

use std::fmt::Debug;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{self as api, Node};
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, ObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Config, Event};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::apis::pod::Pod;

/// Drops what no decision reads, before an object is cached: managed fields and the
/// `kubectl.kubernetes.io/last-applied-configuration` annotation.
pub fn trim<K: Resource>(obj: &mut K) {
    let meta: &mut ObjectMeta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// The pod as the cache holds it: managed fields and the last applied configuration dropped
/// ([`trim`]), then made into the compact [`Pod`] (its spec's scheduling fields, container names,
/// resources, ports and restart policies, claim volumes; its phase, start time and conditions).
pub fn cached_pod(mut pod: api::Pod) -> Pod {
    trim(&mut pod);
    Pod::from(pod)
}

/// The watch of every pod, made into the compact [`Pod`] one event at a time.
pub fn pods(client: Client) -> Source<Pod> {
    let api: Api<api::Pod> = Api::all(client);
    Source::Converted(
        watcher::watcher(api, Config::default())
            .default_backoff()
            .map_ok(|ev| map_event(ev, cached_pod))
            .boxed(),
    )
}

/// `ev` with its object made into a `K` by `f`.
fn map_event<A, K>(ev: Event<A>, f: fn(A) -> K) -> Event<K> {
    match ev {
        Event::Apply(o) => Event::Apply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::InitDone => Event::InitDone,
    }
}

/// Drops the parts of a Node no decision reads: the images it holds (often the largest part of a
/// real node's status) and the kubelet's daemon endpoints.
pub fn trim_node(node: &mut Node) {
    trim(node);
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.daemon_endpoints = None;
    }
}

/// A watch of a built-in kind (validated by the API server, so always parsable) whose objects
/// `modify` trims before they are cached.
pub fn typed<K>(
    api: Api<K>,
    modify: fn(&mut K),
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher::watcher(api, Config::default()).default_backoff().modify(modify)
}

/// A watch of a custom resource that converts each object on its own: an object that does not
/// parse as `K` is logged and left out instead of failing the whole list. `cached` is the store
/// the stream feeds: the deletion of an object that no longer parses (edited into a shape the
/// types refuse, then deleted) removes the last copy that did, instead of leaving it cached.
pub fn lenient<K>(
    client: Client,
    cached: Store<K>,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
{
    let ar = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    watcher::watcher(api, Config::default()).default_backoff().filter_map(move |ev| {
        let kind = ar.kind.clone();
        let cached = cached.clone();
        async move {
            match ev {
                Err(e) => Some(Err(e)),
                Ok(ev) => convert_event::<K>(ev, &kind, &cached).map(Ok),
            }
        }
    })
}

/// Where the objects of a kind come from.
pub enum Source<K> {
    /// A built-in kind watched through the `Api`, each object trimmed by the function before it
    /// is cached: see [`typed`].
    Typed(Api<K>, fn(&mut K)),
    /// A custom resource of every namespace, converted one object at a time: see [`lenient`].
    Lenient(Client),
    /// A watch whose objects are already made into what the cache holds (see [`pods`]).
    Converted(BoxStream<'static, watcher::Result<Event<K>>>),
}

/// The cache of one kind, and the future that keeps it current (spawn or join it; it runs until
/// dropped): watches the kind from `source`, reports each event to `on_event` after the cache has
/// applied it, and logs the watch's errors under `kind`.
pub fn cache<K, F>(kind: &'static str, source: Source<K>, on_event: F) -> (Store<K>, BoxFuture<'static, ()>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
    F: FnMut(&Event<K>) + Send + 'static,
{
    reflect(kind, source, on_event, |_| false)
}

/// The cache of `source` and the future that drives it (see [`drive`]).
fn reflect<K, F, E>(
    kind: &'static str,
    source: Source<K>,
    on_event: F,
    on_error: E,
) -> (Store<K>, BoxFuture<'static, ()>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
    F: FnMut(&Event<K>) + Send + 'static,
    E: FnMut(&watcher::Error) -> bool + Send + 'static,
{
    let (store, writer) = reflector::store();
    let events = match source {
        Source::Typed(api, modify) => typed(api, modify).boxed(),
        Source::Lenient(client) => lenient(client, store.clone()).boxed(),
        Source::Converted(events) => events,
    };
    (store, drive(kind, reflector::reflector(writer, events), on_event, on_error))
}

/// [`cache`] for a kind the controller can do without: when this client may not list it (a 403,
/// as under upstream's chart, which grants fewer kinds), the returned flag turns true, the error
/// is logged once (not at every retry), and the watch keeps trying in the background with the
/// cache empty.
pub fn optional_cache<K, F>(
    kind: &'static str,
    source: Source<K>,
    on_event: F,
) -> (Store<K>, BoxFuture<'static, ()>, tokio::sync::watch::Receiver<bool>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
    F: FnMut(&Event<K>) + Send + 'static,
{
    let (forbidden_tx, forbidden) = tokio::sync::watch::channel(false);
    let on_error = move |error: &watcher::Error| {
        let refused = match error {
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => crate::util::api::is_forbidden(e),
            watcher::Error::WatchError(status) => status.code == 403,
            watcher::Error::NoResourceVersion => false,
        };
        if refused && !forbidden_tx.send_replace(true) {
            tracing::error!(kind, error = %error, "may not list the kind: running without it (grant list and watch on it to use it)");
        }
        refused
    };
    let (store, driven) = reflect(kind, source, on_event, on_error);
    (store, driven, forbidden)
}

/// Drives a reflector stream forever, reporting each event to `on_event` and logging errors
/// (the watcher retries with backoff on its own). Boxed where it is made: a watch's future is
/// large, and a dozen of them side by side outgrow a thread's stack in a debug build.
fn drive<K, S, F, E>(
    kind: &'static str,
    stream: S,
    mut on_event: F,
    mut on_error: E,
) -> BoxFuture<'static, ()>
where
    K: 'static,
    S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
    F: FnMut(&Event<K>) + Send + 'static,
    E: FnMut(&watcher::Error) -> bool + Send + 'static,
{
    Box::pin(async move {
        let stream = stream.inspect_ok(|ev| on_event(ev));
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            // An error `on_error` took care of is not logged again at every retry.
            if let Err(error) = item
                && !on_error(&error)
            {
                tracing::warn!(kind, error = %error, "watch failed, retrying");
            }
        }
    })
}

/// `obj` as a `K`, or `None` (logged with the object's name) when it does not parse. The object's
/// fields are moved into the typed object, not copied, and its managed fields never are.
pub fn convert<K: DeserializeOwned + Resource>(obj: DynamicObject, kind: &str) -> Option<K> {
    let DynamicObject { types, mut metadata, data } = obj;
    let name = metadata.name.clone().unwrap_or_default();
    metadata.managed_fields = None;
    let mut fields = match data {
        serde_json::Value::Object(fields) => fields,
        _ => serde_json::Map::new(),
    };
    match serde_json::to_value(metadata) {
        Ok(meta) => {
            fields.insert("metadata".to_string(), meta);
        }
        Err(e) => {
            tracing::error!(kind, name, error = %e, "skipping object that cannot be encoded");
            return None;
        }
    }
    if let Some(types) = types {
        fields.insert("apiVersion".to_string(), serde_json::Value::String(types.api_version));
        fields.insert("kind".to_string(), serde_json::Value::String(types.kind));
    }
    match serde_json::from_value::<K>(serde_json::Value::Object(fields)) {
        Ok(mut k) => {
            trim(&mut k);
            Some(k)
        }
        Err(e) => {
            tracing::error!(kind, name, error = %e, "skipping malformed object");
            None
        }
    }
}

fn convert_event<K>(ev: Event<DynamicObject>, kind: &str, cached: &Store<K>) -> Option<Event<K>>
where
    K: DeserializeOwned + Resource<DynamicType = ()> + Clone,
{
    Some(match ev {
        Event::Apply(o) => Event::Apply(convert(o, kind)?),
        Event::Delete(o) => {
            let mut key = ObjectRef::<K>::new(o.metadata.name.as_deref().unwrap_or_default());
            if let Some(ns) = o.metadata.namespace.as_deref() {
                key = key.within(ns);
            }
            match convert(o, kind) {
                Some(k) => Event::Delete(k),
                None => Event::Delete(cached.get(&key).map(|k| (*k).clone())?),
            }
        }
        Event::InitApply(o) => Event::InitApply(convert(o, kind)?),
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::resources::pod_requests;
    use crate::state::pods;

    #[test]
    fn custom_resources_convert_one_by_one_and_bad_ones_are_skipped() {
        use crate::apis::NodeClaim;
        let dynamic = |v: serde_json::Value| -> DynamicObject { serde_json::from_value(v).unwrap() };
        let good = dynamic(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "good", "managedFields": [{"manager": "karpenter"}],
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "keep": "me"}},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": []},
            "status": {"providerID": "kwok://good"}
        }));
        let claim: NodeClaim = convert(good, "NodeClaim").expect("a well-formed claim converts");
        assert_eq!(claim.metadata.name.as_deref(), Some("good"));
        assert_eq!(claim.status.unwrap().provider_id.as_deref(), Some("kwok://good"));
        assert!(claim.metadata.managed_fields.is_none());
        assert_eq!(claim.metadata.annotations.unwrap().keys().collect::<Vec<_>>(), ["keep"]);
        let bad = dynamic(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "bad"},
            "spec": {"requirements": "not a list"}
        }));
        assert!(convert::<NodeClaim>(bad.clone(), "NodeClaim").is_none());

        // A claim cached while it parsed, then deleted in a shape that does not: its deletion
        // removes the cached copy.
        let (store, mut writer) = kube::runtime::reflector::store::<NodeClaim>();
        let mut was_good: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": "bad"},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": []}}))
        .unwrap();
        was_good.metadata.resource_version = Some("1".into());
        writer.apply_watcher_event(&Event::Apply(was_good));
        assert_eq!(store.state().len(), 1);
        let Some(Event::Delete(deleted)) =
            convert_event::<NodeClaim>(Event::Delete(bad.clone()), "NodeClaim", &store)
        else {
            panic!("the deletion is passed on")
        };
        writer.apply_watcher_event(&Event::Delete(deleted));
        assert!(store.state().is_empty(), "the stale copy is gone");
        // Unknown to the cache as well: nothing to pass on.
        assert!(convert_event::<NodeClaim>(Event::Delete(bad.clone()), "NodeClaim", &store).is_none());
        // A malformed update is skipped: the last good copy stays until the object parses again.
        assert!(convert_event::<NodeClaim>(Event::Apply(bad), "NodeClaim", &store).is_none());
    }

    #[test]
    fn a_cached_pod_keeps_what_scheduling_and_draining_read() {
        let full: api::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "labels": {"app": "web"},
                "annotations": {"karpenter.sh/do-not-disrupt": "true",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "r1"}],
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {
                "nodeSelector": {"karpenter.sh/capacity-type": "spot"},
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}],
                "priorityClassName": "high", "priority": 1000, "terminationGracePeriodSeconds": 30,
                "overhead": {"cpu": "10m"},
                "initContainers": [{"name": "proxy", "image": "proxy", "restartPolicy": "Always",
                    "env": [{"name": "A", "value": "b"}], "resources": {"requests": {"cpu": "100m"}}}],
                "containers": [{"name": "app", "image": "app:1", "command": ["/app"], "args": ["--port", "80"],
                    "env": [{"name": "A", "value": "b"}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "livenessProbe": {"httpGet": {"path": "/", "port": 80}},
                    "ports": [{"containerPort": 80, "hostPort": 8080, "protocol": "TCP"}],
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
                "ephemeralContainers": [{"name": "debug", "image": "busybox"}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-web"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
                    {"name": "config", "configMap": {"name": "web"}},
                    {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]
            },
            "status": {"phase": "Pending", "nominatedNodeName": "n1",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
                "containerStatuses": [{"name": "app", "image": "app:1", "imageID": "", "ready": false, "restartCount": 0}],
                "podIPs": [{"ip": "10.0.0.1"}]}
        }))
        .unwrap();
        let trimmed = cached_pod(full.clone());

        // What decisions read is untouched.
        let requests = pod_requests(&trimmed);
        assert_eq!((requests.get("cpu"), requests.get("memory")), (1110, 1 << 30));
        let pod = &full;
        let (spec, full) = (trimmed.spec.as_ref().unwrap(), full.spec.as_ref().unwrap());
        assert_eq!(spec.node_selector, full.node_selector);
        assert_eq!(spec.affinity, full.affinity);
        assert_eq!(spec.tolerations, full.tolerations);
        assert_eq!(spec.topology_spread_constraints, full.topology_spread_constraints);
        assert_eq!(spec.priority_class_name, full.priority_class_name);
        assert_eq!(spec.termination_grace_period_seconds, full.termination_grace_period_seconds);
        assert_eq!(spec.containers[0].ports, full.containers[0].ports);
        assert_eq!(spec.init_containers.as_ref().unwrap()[0].restart_policy.as_deref(), Some("Always"));
        let volumes: Vec<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
        assert_eq!(volumes, ["data", "scratch"]);
        assert_eq!(trimmed.metadata.labels, pod.metadata.labels);
        assert_eq!(trimmed.metadata.owner_references, pod.metadata.owner_references);
        assert!(trimmed.metadata.annotations.as_ref().unwrap().contains_key("karpenter.sh/do-not-disrupt"));
        let status = trimmed.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        assert_eq!(status.conditions, pod.status.as_ref().unwrap().conditions);
        assert_eq!(status.nominated_node_name.as_deref(), Some("n1"));
        assert!(pods::is_provisionable(&trimmed));

        // The rest is gone.
        let written = serde_json::to_value(&trimmed).unwrap();
        let c = &written["spec"]["containers"][0];
        for gone in ["env", "command", "args", "image", "volumeMounts", "livenessProbe"] {
            assert!(c.get(gone).is_none(), "{gone}");
        }
        assert!(written["spec"].get("ephemeralContainers").is_none());
        assert!(
            written["status"].get("containerStatuses").is_none() && written["status"].get("podIPs").is_none()
        );
        assert!(trimmed.metadata.managed_fields.is_none());
        assert!(
            !trimmed
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key("kubectl.kubernetes.io/last-applied-configuration")
        );
    }
}
