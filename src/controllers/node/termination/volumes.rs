//! The step of a node's termination between its drain and its instance: as upstream, the
//! instance goes only once the node's VolumeAttachments are gone, so that no volume is cut off
//! while still attached. Past the termination deadline the step is skipped.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::apis::pod::Pod;
use k8s_openapi::jiff::Timestamp;

use super::{Drained, Step, Termination, Terminator, WAIT_CAP, drain};
use crate::controllers::kit::Next;
use crate::state::ClusterState;

/// Waits for the VolumeAttachments of the drained node to be gone: stops the reconcile while some
/// are pending, unless the termination deadline has passed.
pub(super) fn wait_for_detachment(t: &Terminator, term: &Termination, drained: &Drained) -> Step {
    if drained.expired {
        return Step::Continue(());
    }
    let pending = pending_volume_attachments(&t.cluster, &term.name, &drained.pods, drained.now);
    if pending.is_empty() {
        return Step::Continue(());
    }
    tracing::info!(
        node = %term.name,
        nodeclaim = %term.claim_name,
        volumeattachments = ?pending,
        "waiting for volume attachments to be deleted"
    );
    Step::Stop(Next::After(t.wait(&term.name, WAIT_CAP)))
}

/// Names of the node's VolumeAttachments that must still go: see
/// [`drain::pending_volume_attachments`]. Volumes are ignored when they back a
/// PersistentVolumeClaim of a pod that stays on the node (see [`drain::claims_of_undrained_pods`]).
/// Both come from the shared caches (a watch), filtered by node: nothing is listed per reconcile.
fn pending_volume_attachments(
    cluster: &ClusterState,
    node: &str,
    pods: &[Arc<Pod>],
    now: Timestamp,
) -> Vec<String> {
    let attachments = cluster.volume_attachments_of(node);
    if attachments.is_empty() {
        return Vec::new();
    }
    let ignored: BTreeSet<String> = drain::claims_of_undrained_pods(pods, now)
        .into_iter()
        .filter_map(|(namespace, claim)| cluster.persistent_volume_claim(&namespace, &claim))
        .filter_map(|c| c.spec.as_ref().and_then(|s| s.volume_name.clone()))
        .collect();
    drain::pending_volume_attachments(&attachments, node, &ignored)
}
