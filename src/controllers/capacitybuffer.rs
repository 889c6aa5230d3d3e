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
use crate::controllers::kit::{Next, Options, WatchedOrFed, run_singleton};
use crate::state::buffers::{BufferPlacement, chunk_requests, replicas, virtual_pods};
use crate::state::watches::{self, Source};
use crate::state::{ClusterState, Interest};

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "capacitybuffer";
/// How often buffers are resolved again when nothing they watch changes (a Deployment scaled).
const PERIOD: Duration = Duration::from_secs(30);
/// Changes within this time of each other are handled in one pass.
const SETTLE: Duration = Duration::from_millis(200);

/// The condition saying whether the buffer's chunk was resolved.
pub const READY_FOR_PROVISIONING: &str = "ReadyForProvisioning";
/// The condition saying whether the buffer's placeholders fit on existing capacity (written from
/// the provisioner's last pass).
pub const PROVISIONING: &str = "Provisioning";
/// Reasons of [`READY_FOR_PROVISIONING`] and [`PROVISIONING`], upstream's.
pub mod reasons {
    /// The chunk was resolved.
    pub const RESOLVED: &str = "Resolved";
    /// The `scalableRef` does not exist.
    pub const SCALABLE_REF_NOT_FOUND: &str = "ScalableRefNotFound";
    /// The `podTemplateRef` does not exist.
    pub const POD_TEMPLATE_NOT_FOUND: &str = "PodTemplateNotFound";
    /// Anything else that keeps the chunk from being resolved.
    pub const RESOLUTION_FAILED: &str = "ResolutionFailed";
    /// Every placeholder fits on existing capacity.
    pub const FITS_EXISTING_CAPACITY: &str = "FitsExistingCapacity";
    /// Some placeholders needed new NodeClaims, or fit nowhere.
    pub const REQUIRES_NEW_CAPACITY: &str = "RequiresNewCapacity";
    /// The chunk is not resolved.
    pub const NOT_READY_FOR_PROVISIONING: &str = "NotReadyForProvisioning";
    /// The buffer holds no chunk.
    pub const BUFFER_EMPTY: &str = "BufferEmpty";
    /// The warning event of a buffer whose placeholders fit nowhere (beyond upstream).
    pub const FAILED_SCHEDULING: &str = "FailedScheduling";
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
        // Its watches, and the provisioner placing the placeholders, wake it.
        let placed = state.feed().subscribe(Interest { buffers: true, ..Interest::default() });
        let wake = WatchedOrFed { watched: notify, fed: placed, settle: SETTLE };
        run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), wake, stop, || {
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
    let placements = state.buffers_placed().placements;
    for buffer in buffers.state() {
        let key = format!("{}/{}", buffer.namespace().unwrap_or_default(), buffer.name_any());
        if buffer.metadata.deletion_timestamp.is_some() {
            continue;
        }
        live.insert(key.clone());
        let resolved = resolve(&ctx.client, &buffer, Some(templates)).await;
        let (status, pods) = outcome(&buffer, resolved, placements.get(&key), now);
        if buffer.status.as_ref() != Some(&status) {
            write_status(ctx, &buffer, &status).await;
            if let Some((reason, message)) = warning(buffer.status.as_ref(), &status, placements.get(&key)) {
                ctx.events.warning(buffer.as_ref(), &reason, message).await;
            }
        }
        state.set_virtual_pods(&key, pods);
    }
    state.retain_virtual_pods(&live);
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

/// Resolves `buffer`'s chunk; its PodTemplate from `templates` when given (the controller's
/// cache), else listed by name.
async fn resolve(
    client: &kube::Client,
    buffer: &CapacityBuffer,
    templates: Option<&Store<PodTemplate>>,
) -> Result<Chunk, Unresolved> {
    let namespace = buffer.namespace().unwrap_or_default();
    match (&buffer.spec.pod_template_ref, &buffer.spec.scalable_ref) {
        (Some(LocalObjectRef { name }), _) => {
            let found = match templates {
                Some(templates) => templates.get(&ObjectRef::new(name).within(&namespace)),
                None => named::<PodTemplate>(client, &namespace, name).await?.map(Arc::new),
            };
            let pt = found.ok_or_else(|| {
                (reasons::POD_TEMPLATE_NOT_FOUND, format!("podtemplates {name:?} not found"))
            })?;
            Ok(Chunk {
                template: pt.template.clone().unwrap_or_default(),
                pod_template: Some((name.clone(), pt.metadata.generation.unwrap_or_default())),
                scalable_replicas: None,
            })
        }
        (None, Some(scalable)) => resolve_scalable(client, &namespace, scalable).await,
        (None, None) => {
            Err((reasons::RESOLUTION_FAILED, "Neither podTemplateRef nor scalableRef is set".to_string()))
        }
    }
}

/// The placeholder pods of `buffer` as the controller keeps them, for a tool that looks at the
/// cluster from outside: none unless the controller resolved the buffer (`ReadyForProvisioning`
/// True, so the gate is on), its chunk resolved again here.
pub async fn applied_placeholders(
    client: &kube::Client,
    buffer: &CapacityBuffer,
) -> Vec<Arc<crate::apis::pod::Pod>> {
    let applied = buffer
        .status
        .as_ref()
        .is_some_and(|s| crate::apis::common::is_true(&s.conditions, READY_FOR_PROVISIONING));
    if !applied || buffer.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let resolved = resolve(client, buffer, None).await;
    outcome(buffer, resolved, None, Timestamp::now()).1
}

/// The pod template and replicas of a Deployment, StatefulSet or ReplicaSet (group `apps`).
async fn resolve_scalable(
    client: &kube::Client,
    namespace: &str,
    r: &ScalableRef,
) -> Result<Chunk, Unresolved> {
    if !(r.api_group.is_empty() || r.api_group == "apps") {
        return Err((
            reasons::RESOLUTION_FAILED,
            format!("unsupported scalableRef API group {:?}", r.api_group),
        ));
    }
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

/// The status `buffer` should have and its placeholder pods, given how its chunk resolved and
/// where the provisioner's last pass placed its placeholders.
pub fn outcome(
    buffer: &CapacityBuffer,
    resolved: Result<Chunk, Unresolved>,
    placement: Option<&BufferPlacement>,
    now: Timestamp,
) -> (CapacityBufferStatus, Vec<Arc<crate::apis::pod::Pod>>) {
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
            if let Some(update) = provisioning(&status, placement) {
                set_condition(&mut status.conditions, PROVISIONING, update, generation, now);
            }
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
            if let Some(update) = provisioning(&status, placement) {
                set_condition(&mut status.conditions, PROVISIONING, update, generation, now);
            }
            (status, pods)
        }
    }
}

/// The [`PROVISIONING`] condition of a buffer with `status` (its [`READY_FOR_PROVISIONING`] and
/// `replicas` already worked out), as upstream's provisioner writes it: `None` leaves it as it
/// is (the last pass placed none of its placeholders, or not all of them yet).
pub fn provisioning(
    status: &CapacityBufferStatus,
    placement: Option<&BufferPlacement>,
) -> Option<ConditionUpdate> {
    if !crate::apis::common::is_true(&status.conditions, READY_FOR_PROVISIONING) {
        return Some(ConditionUpdate::false_(
            reasons::NOT_READY_FOR_PROVISIONING,
            "Buffer is not ReadyForProvisioning",
        ));
    }
    let desired = status.replicas.unwrap_or(0);
    if desired <= 0 {
        return Some(ConditionUpdate::false_(reasons::BUFFER_EMPTY, "Buffer has zero desired replicas"));
    }
    let placement = placement?;
    let (new, failed) = (placement.needing_new(), placement.failed);
    if new > 0 || failed > 0 {
        return Some(ConditionUpdate::false_(
            reasons::REQUIRES_NEW_CAPACITY,
            format!("{new}/{desired} virtual pods required new capacity, {failed} failed"),
        ));
    }
    (i64::try_from(placement.on_existing()).ok() == Some(i64::from(desired))).then(|| ConditionUpdate {
        message: format!("All {desired} virtual pods fit on existing capacity"),
        ..ConditionUpdate::true_(reasons::FITS_EXISTING_CAPACITY)
    })
}

/// The warning a status change from `before` to `after` calls for, told once per cause: the
/// chunk became unresolvable, or placeholders came to fit nowhere (with the first reason why).
fn warning(
    before: Option<&CapacityBufferStatus>,
    after: &CapacityBufferStatus,
    placement: Option<&BufferPlacement>,
) -> Option<(String, String)> {
    let was = |type_: &str| before.and_then(|s| condition(&s.conditions, type_)).cloned();
    if let Some(unready) =
        condition(&after.conditions, READY_FOR_PROVISIONING).filter(|c| c.status == ConditionStatus::False)
    {
        let before = was(READY_FOR_PROVISIONING);
        let news = before.is_none_or(|w| w.status != ConditionStatus::False || w.reason != unready.reason);
        return news.then(|| (unready.reason.clone(), unready.message.clone()));
    }
    let provisioning = condition(&after.conditions, PROVISIONING)?;
    let placement = placement.filter(|p| p.failed > 0)?;
    if was(PROVISIONING).is_some_and(|w| w.message == provisioning.message) {
        return None;
    }
    let desired = after.replicas.unwrap_or(0);
    let why = placement.error.as_deref().unwrap_or("no nodepool can run them");
    Some((
        reasons::FAILED_SCHEDULING.to_string(),
        format!("Failed to schedule {} of {desired} placeholder pod(s), {why}", placement.failed),
    ))
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
        let (status, pods) = outcome(&b, Ok(chunk), None, now);
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
        let (status, _) = outcome(&b, Ok(chunk), None, now);
        assert_eq!(
            (status.pod_template_ref.map(|r| r.name), status.pod_template_generation),
            (Some("chunk".into()), Some(7))
        );

        let (status, pods) = outcome(
            &b,
            Err((reasons::POD_TEMPLATE_NOT_FOUND, "podtemplates \"chunk\" not found".into())),
            None,
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
        let (status, pods) = outcome(&b, Ok(chunk), None, now);
        assert_eq!(status.replicas, Some(1));
        assert!(pods.is_empty());
    }

    fn placed(existing: usize, new: usize, failed: usize) -> BufferPlacement {
        BufferPlacement {
            existing: (existing > 0).then(|| ("n1".to_string(), existing)).into_iter().collect(),
            new_capacity: (new > 0).then(|| ("default".to_string(), new)).into_iter().collect(),
            failed,
            error: (failed > 0).then(|| "nodepool \"default\": incompatible requirements".to_string()),
        }
    }

    #[test]
    fn provisioning_follows_where_the_last_pass_put_the_placeholders() {
        let now = Timestamp::UNIX_EPOCH;
        let b = buffer(json!({"podTemplateRef": {"name": "chunk"}, "replicas": 3}));
        let chunk = || Chunk {
            template: template("1"),
            pod_template: Some(("chunk".into(), 1)),
            scalable_replicas: None,
        };
        let provisioning = |status: &CapacityBufferStatus| {
            let c = condition(&status.conditions, PROVISIONING).unwrap();
            (c.status, c.reason.clone(), c.message.clone())
        };

        // No pass placed them yet: no Provisioning condition.
        let (status, _) = outcome(&b, Ok(chunk()), None, now);
        assert!(condition(&status.conditions, PROVISIONING).is_none());

        let (status, _) = outcome(&b, Ok(chunk()), Some(&placed(1, 2, 0)), now);
        assert_eq!(
            provisioning(&status),
            (
                ConditionStatus::False,
                "RequiresNewCapacity".into(),
                "2/3 virtual pods required new capacity, 0 failed".into()
            )
        );
        let (status, _) = outcome(&b, Ok(chunk()), Some(&placed(3, 0, 0)), now);
        assert_eq!(
            provisioning(&status),
            (
                ConditionStatus::True,
                "FitsExistingCapacity".into(),
                "All 3 virtual pods fit on existing capacity".into()
            )
        );
        // Fewer placed than the buffer now holds (its replicas changed since the pass): as it was.
        let mut scaled = b.clone();
        scaled.status = Some(status.clone());
        scaled.spec.replicas = Some(4);
        let (after, _) = outcome(&scaled, Ok(chunk()), Some(&placed(3, 0, 0)), now);
        assert_eq!(provisioning(&after).1, "FitsExistingCapacity");

        let (status, _) = outcome(&b, Ok(chunk()), Some(&placed(0, 0, 3)), now);
        assert_eq!(provisioning(&status).2, "0/3 virtual pods required new capacity, 3 failed");

        let empty = buffer(json!({"podTemplateRef": {"name": "chunk"}, "replicas": 0}));
        let (status, _) = outcome(&empty, Ok(chunk()), None, now);
        assert_eq!(provisioning(&status).1, "BufferEmpty");
        let (status, _) =
            outcome(&b, Err((reasons::POD_TEMPLATE_NOT_FOUND, "gone".into())), Some(&placed(3, 0, 0)), now);
        assert_eq!(
            provisioning(&status),
            (
                ConditionStatus::False,
                "NotReadyForProvisioning".into(),
                "Buffer is not ReadyForProvisioning".into()
            )
        );
    }

    #[test]
    fn a_buffer_is_warned_once_per_cause() {
        let now = Timestamp::UNIX_EPOCH;
        let b = buffer(json!({"podTemplateRef": {"name": "chunk"}, "replicas": 2}));
        let chunk = || Chunk {
            template: template("64"),
            pod_template: Some(("chunk".into(), 1)),
            scalable_replicas: None,
        };
        let nowhere = placed(0, 0, 2);
        let (status, _) = outcome(&b, Ok(chunk()), Some(&nowhere), now);
        let (reason, message) = warning(None, &status, Some(&nowhere)).unwrap();
        assert_eq!(reason, "FailedScheduling");
        assert_eq!(
            message,
            "Failed to schedule 2 of 2 placeholder pod(s), nodepool \"default\": incompatible requirements"
        );
        assert_eq!(warning(Some(&status), &status, Some(&nowhere)), None, "told once");
        let (fits, _) = outcome(&b, Ok(chunk()), Some(&placed(2, 0, 0)), now);
        assert_eq!(warning(Some(&status), &fits, Some(&placed(2, 0, 0))), None);

        let (unresolved, _) = outcome(&b, Err((reasons::POD_TEMPLATE_NOT_FOUND, "gone".into())), None, now);
        assert_eq!(
            warning(Some(&fits), &unresolved, None),
            Some(("PodTemplateNotFound".to_string(), "gone".to_string()))
        );
        assert_eq!(warning(Some(&unresolved), &unresolved, None), None);
    }
}
