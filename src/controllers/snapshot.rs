//! The cluster state as the decisions read it: a snapshot with the instance types the cloud
//! provider offers each NodePool.

use std::collections::BTreeMap;

use crate::cloudprovider::CloudProvider;
use crate::state::Snapshot;
use crate::util::error_chain;

/// `snapshot` with the instance types of each live NodePool, from `cloud`. A NodePool whose
/// types cannot be resolved (its node class is not ready, say) is logged and left out, and why
/// is kept in [`Snapshot::pool_errors`] for the decisions' reasons.
pub async fn with_instance_types_of_pools(
    snapshot: Snapshot,
    cloud: &dyn CloudProvider,
    controller: &str,
) -> Snapshot {
    let mut types = BTreeMap::new();
    let mut errors = BTreeMap::new();
    for np in snapshot.live_nodepools() {
        let name = np.metadata.name.clone().unwrap_or_default();
        match cloud.instance_types(np).await {
            Ok(found) => {
                types.insert(name, found);
            }
            Err(error) => {
                tracing::error!(
                    controller,
                    NodePool = %name,
                    error = %error_chain(&error),
                    "skipping, unable to resolve instance types"
                );
                errors.insert(name, error_chain(&error));
            }
        }
    }
    let mut snapshot = snapshot.with_instance_types(types);
    snapshot.pool_errors = errors;
    snapshot
}
