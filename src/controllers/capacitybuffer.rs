//! CapacityBuffer controller (`capacitybuffer`, `CapacityBuffer` gate): resolves each buffer's
//! chunk (its PodTemplate, or the pod template of its Deployment, StatefulSet or ReplicaSet),
//! computes how many chunks it holds ([`crate::state::buffers`]), writes its status
//! (`ReadyForProvisioning`, `replicas`, the template it used) as upstream, and hands its
//! placeholder pods to the cluster state: the provisioner launches capacity for them, and
//! consolidation and emptiness keep their room. Deleting a buffer releases its headroom.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{PodTemplate, PodTemplateSpec};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use tokio::sync::{Notify, watch};

use crate::apis::capacitybuffer::{ACTIVE_CAPACITY, LocalObjectRef, ScalableRef};
use crate::apis::common::{ConditionUpdate, condition, set_condition};
use crate::apis::{CapacityBuffer, CapacityBufferStatus, ConditionStatus};
use crate::controllers::Context;
use crate::controllers::kit::{Next, Options, Wake, run_singleton};
use crate::state::ClusterState;
use crate::state::buffers::{chunk_requests, replicas, virtual_pods};
use crate::state::watches::{self, Source};

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "capacitybuffer";
/// How often buffers are resolved again when nothing they watch changes (a Deployment scaled).
const PERIOD: Duration = Duration::from_secs(30);
/// Changes within this time of each other are handled in one pass.
const SETTLE: Duration = Duration::from_millis(200);

/// The condition saying whether the buffer's chunk was resolved.
pub const READY_FOR_PROVISIONING: &str = "ReadyForProvisioning";
/// Reasons of [`READY_FOR_PROVISIONING`], upstream's.
pub mod reasons {
    /// The chunk was resolved.
    pub const RESOLVED: &str = "Resolved";
    /// The `scalableRef` does not exist.
    pub const SCALABLE_REF_NOT_FOUND: &str = "ScalableRefNotFound";
    /// The `podTemplateRef` does not exist.
    pub const POD_TEMPLATE_NOT_FOUND: &str = "PodTemplateNotFound";
    /// Anything else that keeps the chunk from being resolved.
    pub const RESOLUTION_FAILED: &str = "ResolutionFailed";
}

/// Wakes at a change of a CapacityBuffer or a PodTemplate, once a burst has settled.
struct Changes(Arc<Notify>);

impl Wake for Changes {
    async fn changed(&mut self) {
        self.0.notified().await;
        tokio::time::sleep(SETTLE).await;
    }
}

/// Runs until `stop` turns true.
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    let notify = Arc::new(Notify::new());
    let on_buffer = {
        let n = notify.clone();
        move |_: &kube::runtime::watcher::Event<CapacityBuffer>| n.notify_one()
    };
    let on_template = {
        let n = notify.clone();
        move |_: &kube::runtime::watcher::Event<PodTemplate>| n.notify_one()
    };
    let (buffers, buffers_driver) = watches::cache::<CapacityBuffer, _>(
        "capacitybuffers",
        Source::Lenient(ctx.client.clone()),
        on_buffer,
    );
    let (templates, templates_driver) = watches::cache::<PodTemplate, _>(
        "podtemplates",
        Source::Typed(Api::all(ctx.client.clone()), watches::trim::<PodTemplate>),
        on_template,
    );
    let drivers = [tokio::spawn(buffers_driver), tokio::spawn(templates_driver)];
    let mut stopping = stop.clone();
    let listed = async {
        let _ = buffers.wait_until_ready().await;
        let _ = templates.wait_until_ready().await;
    };
    tokio::select! {
        _ = listed => {}
        _ = stopping.wait_for(|s| *s) => {}
    }
    if !*stop.borrow() {
        run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), Changes(notify), stop, || {
            reconcile(&ctx, &state, &buffers, &templates)
        })
        .await;
    }
    for driver in drivers {
        driver.abort();
    }
}

async fn reconcile(
    ctx: &Context,
    state: &ClusterState,
    buffers: &Store<CapacityBuffer>,
    templates: &Store<PodTemplate>,
) -> Result<Next, std::convert::Infallible> {
    let mut live = BTreeSet::new();
    let now = Timestamp::now();
    for buffer in buffers.state() {
        let key = format!("{}/{}", buffer.namespace().unwrap_or_default(), buffer.name_any());
        if buffer.metadata.deletion_timestamp.is_some() {
            continue;
        }
        live.insert(key.clone());
        let resolved = resolve(ctx, &buffer, templates).await;
        let (status, pods) = outcome(&buffer, resolved, now);
        if buffer.status.as_ref() != Some(&status) {
            write_status(ctx, &buffer, &status).await;
            // Told once, when the buffer turns unresolvable.
            let was = buffer.status.as_ref().and_then(|s| condition(&s.conditions, READY_FOR_PROVISIONING));
            if let Some(now_false) = condition(&status.conditions, READY_FOR_PROVISIONING)
                .filter(|c| c.status == ConditionStatus::False)
                && was.is_none_or(|w| w.status != ConditionStatus::False || w.reason != now_false.reason)
            {
                ctx.events.warning(buffer.as_ref(), &now_false.reason, now_false.message.clone()).await;
            }
        }
        state.set_virtual_pods(&key, pods);
    }
    for gone in state.buffers_with_virtual_pods().into_iter().filter(|k| !live.contains(k)) {
        state.set_virtual_pods(&gone, Vec::new());
    }
    Ok(Next::After(PERIOD))
}

/// A buffer's chunk: its template, where it came from, and its scalable's replicas.
pub struct Chunk {
    /// The pod template of one chunk.
    pub template: PodTemplateSpec,
    /// The PodTemplate it came from (name, generation), when the buffer names one.
    pub pod_template: Option<(String, i64)>,
    /// The `scalableRef`'s replicas, when the buffer names one.
    pub scalable_replicas: Option<i32>,
}

/// Why a buffer's chunk could not be resolved: a condition reason and message.
pub type Unresolved = (&'static str, String);

async fn resolve(
    ctx: &Context,
    buffer: &CapacityBuffer,
    templates: &Store<PodTemplate>,
) -> Result<Chunk, Unresolved> {
    let namespace = buffer.namespace().unwrap_or_default();
    match (&buffer.spec.pod_template_ref, &buffer.spec.scalable_ref) {
        (Some(LocalObjectRef { name }), _) => {
            let found = templates.get(&ObjectRef::new(name).within(&namespace));
            let pt = found.ok_or_else(|| {
                (reasons::POD_TEMPLATE_NOT_FOUND, format!("podtemplates {name:?} not found"))
            })?;
            Ok(Chunk {
                template: pt.template.clone().unwrap_or_default(),
                pod_template: Some((name.clone(), pt.metadata.generation.unwrap_or_default())),
                scalable_replicas: None,
            })
        }
        (None, Some(scalable)) => resolve_scalable(ctx, &namespace, scalable).await,
        (None, None) => {
            Err((reasons::RESOLUTION_FAILED, "Neither podTemplateRef nor scalableRef is set".to_string()))
        }
    }
}

/// The pod template and replicas of a Deployment, StatefulSet or ReplicaSet (group `apps`).
async fn resolve_scalable(ctx: &Context, namespace: &str, r: &ScalableRef) -> Result<Chunk, Unresolved> {
    if !(r.api_group.is_empty() || r.api_group == "apps") {
        return Err((
            reasons::RESOLUTION_FAILED,
            format!("unsupported scalableRef API group {:?}", r.api_group),
        ));
    }
    let client = &ctx.client;
    let found: Option<(Option<PodTemplateSpec>, Option<i32>)> = match r.kind.as_str() {
        "Deployment" => named::<Deployment>(client, namespace, &r.name)
            .await?
            .map(|d| d.spec.map(|s| (Some(s.template), s.replicas)).unwrap_or_default()),
        "StatefulSet" => named::<StatefulSet>(client, namespace, &r.name)
            .await?
            .map(|d| d.spec.map(|s| (Some(s.template), s.replicas)).unwrap_or_default()),
        "ReplicaSet" => named::<ReplicaSet>(client, namespace, &r.name)
            .await?
            .map(|d| d.spec.map(|s| (s.template, s.replicas)).unwrap_or_default()),
        other => return Err((reasons::RESOLUTION_FAILED, format!("unsupported kind {other:?}"))),
    };
    let (template, replicas) = found.ok_or_else(|| {
        let plural = format!("{}s", r.kind.to_lowercase());
        (reasons::SCALABLE_REF_NOT_FOUND, format!("{plural}.apps {:?} not found", r.name))
    })?;
    Ok(Chunk {
        template: template.unwrap_or_default(),
        pod_template: None,
        scalable_replicas: Some(replicas.unwrap_or(1)),
    })
}

/// The workload `name` of `namespace`, listed by name: the controller may list and watch
/// workloads, not get them.
async fn named<K>(client: &kube::Client, namespace: &str, name: &str) -> Result<Option<K>, Unresolved>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields(&format!("metadata.name={name}"));
    let list =
        api.list(&params).await.map_err(|e| (reasons::RESOLUTION_FAILED, crate::util::error_chain(&e)))?;
    Ok(list.items.into_iter().next())
}

/// The status `buffer` should have and its placeholder pods, given how its chunk resolved.
pub fn outcome(
    buffer: &CapacityBuffer,
    resolved: Result<Chunk, Unresolved>,
    now: Timestamp,
) -> (CapacityBufferStatus, Vec<Arc<k8s_openapi::api::core::v1::Pod>>) {
    let mut status = buffer.status.clone().unwrap_or_default();
    let generation = buffer.metadata.generation;
    status.provisioning_strategy = buffer.spec.provisioning_strategy.clone();
    match resolved {
        Err((reason, message)) => {
            set_condition(
                &mut status.conditions,
                READY_FOR_PROVISIONING,
                ConditionUpdate::false_(reason, message),
                generation,
                now,
            );
            (status, Vec::new())
        }
        Ok(chunk) => {
            let count = replicas(buffer, &chunk_requests(&chunk.template), chunk.scalable_replicas);
            status.pod_template_ref =
                chunk.pod_template.as_ref().map(|(name, _)| LocalObjectRef { name: name.clone() });
            status.pod_template_generation = chunk.pod_template.as_ref().map(|(_, g)| *g);
            status.replicas = Some(count);
            let ready = ConditionUpdate {
                message: "Pod template resolved successfully".to_string(),
                ..ConditionUpdate::true_(reasons::RESOLVED)
            };
            set_condition(&mut status.conditions, READY_FOR_PROVISIONING, ready, generation, now);
            let active = buffer.spec.provisioning_strategy.as_deref().is_none_or(|s| s == ACTIVE_CAPACITY);
            let pods = if active { virtual_pods(buffer, &chunk.template, count) } else { Vec::new() };
            (status, pods)
        }
    }
}

async fn write_status(ctx: &Context, buffer: &CapacityBuffer, status: &CapacityBufferStatus) {
    let namespace = buffer.namespace().unwrap_or_default();
    let name = buffer.name_any();
    let api: Api<CapacityBuffer> = Api::namespaced(ctx.client.clone(), &namespace);
    let patch = serde_json::json!({ "status": status });
    match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {}
        Err(error) if crate::util::api::is_not_found(&error) => {}
        Err(error) => {
            tracing::warn!(controller = CONTROLLER, CapacityBuffer = %format!("{namespace}/{name}"), error = %error, "updating capacitybuffer status")
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn buffer(spec: serde_json::Value) -> CapacityBuffer {
        serde_json::from_value(json!({"apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
            "metadata": {"name": "b", "namespace": "ns", "uid": "u", "generation": 4}, "spec": spec}))
        .unwrap()
    }

    fn template(cpu: &str) -> PodTemplateSpec {
        serde_json::from_value(
            json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}),
        )
        .unwrap()
    }

    #[test]
    fn a_resolved_buffer_is_ready_with_its_chunks_and_an_unresolved_one_has_none() {
        let now = Timestamp::UNIX_EPOCH;
        let b = buffer(json!({"scalableRef": {"kind": "Deployment", "name": "web"}, "percentage": 50}));
        let chunk = Chunk { template: template("1"), pod_template: None, scalable_replicas: Some(3) };
        let (status, pods) = outcome(&b, Ok(chunk), now);
        assert_eq!(status.replicas, Some(2));
        assert_eq!(pods.len(), 2);
        assert_eq!(status.provisioning_strategy.as_deref(), Some(ACTIVE_CAPACITY), "the default, echoed");
        let c = &status.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status, c.reason.as_str()),
            (READY_FOR_PROVISIONING, ConditionStatus::True, "Resolved")
        );
        assert_eq!(c.observed_generation, Some(4));

        let b = buffer(json!({"podTemplateRef": {"name": "chunk"}, "replicas": 1}));
        let chunk = Chunk {
            template: template("1"),
            pod_template: Some(("chunk".into(), 7)),
            scalable_replicas: None,
        };
        let (status, _) = outcome(&b, Ok(chunk), now);
        assert_eq!(
            (status.pod_template_ref.map(|r| r.name), status.pod_template_generation),
            (Some("chunk".into()), Some(7))
        );

        let (status, pods) = outcome(
            &b,
            Err((reasons::POD_TEMPLATE_NOT_FOUND, "podtemplates \"chunk\" not found".into())),
            now,
        );
        assert!(pods.is_empty());
        let c = &status.conditions[0];
        assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::False, "PodTemplateNotFound"));

        // Another strategy: resolved, but nothing provisioned for it.
        let b = buffer(
            json!({"podTemplateRef": {"name": "chunk"}, "replicas": 1, "provisioningStrategy": "example.com/other"}),
        );
        let chunk = Chunk {
            template: template("1"),
            pod_template: Some(("chunk".into(), 1)),
            scalable_replicas: None,
        };
        let (status, pods) = outcome(&b, Ok(chunk), now);
        assert_eq!(status.replicas, Some(1));
        assert!(pods.is_empty());
    }
}
