//! Keeps what the AWS provider knows of the region current: the instance types and the zones
//! they are offered in, on-demand prices (Pricing API) and spot prices (spot price history); and
//! deletes the launch templates no launch has used for an hour.
//!
//! Each is fetched when the controller starts and then every 12 hours (the launch-template sweep:
//! every 5 minutes). A fetch that fails keeps the last good data (for on-demand prices, at first
//! the static table) and is tried again with a backoff. With `ISOLATED_VPC` the Pricing API,
//! which has no private endpoint, is not asked.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;

use crate::cloudprovider::CloudProviderError;
use crate::cloudprovider::aws::AwsCloudProvider;
use crate::cloudprovider::aws::catalog::REFRESH_INTERVAL;
use crate::controllers::kit::{Backoff, Next, Options, Timer, run_singleton};

/// First delay before trying a failed fetch again.
const RETRY_BASE: Duration = Duration::from_secs(60);
/// Delay between two sweeps of unused launch templates.
const SWEEP_INTERVAL: Duration = Duration::from_secs(300);

/// One kind of data the controller keeps current.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    InstanceTypes,
    OnDemandPrices,
    SpotPrices,
    UnusedLaunchTemplates,
}

impl Kind {
    async fn fetch(self, provider: &AwsCloudProvider) -> Result<usize, CloudProviderError> {
        match self {
            Kind::InstanceTypes => provider.refresh_catalog().await,
            Kind::OnDemandPrices => provider.refresh_on_demand_prices().await,
            Kind::SpotPrices => provider.refresh_spot_prices().await,
            // Each deletion is logged as it happens.
            Kind::UnusedLaunchTemplates => Ok(provider.delete_unused_launch_templates().await?.len()),
        }
    }

    fn log(self, count: usize) {
        match self {
            Kind::InstanceTypes => tracing::debug!(count, "discovered instance types"),
            Kind::OnDemandPrices => tracing::debug!(instance_type_count = count, "updated on-demand pricing"),
            Kind::SpotPrices => tracing::debug!(
                offering_count = count,
                "updated spot pricing with instance types and offerings"
            ),
            Kind::UnusedLaunchTemplates => {}
        }
    }

    fn failure(self) -> &'static str {
        match self {
            Kind::InstanceTypes => "refreshing instance types, keeping the last known ones",
            Kind::OnDemandPrices => "refreshing on-demand pricing, keeping the last known prices",
            Kind::SpotPrices => "refreshing spot pricing, keeping the last known prices",
            Kind::UnusedLaunchTemplates => "deleting unused launch templates",
        }
    }

    /// The controller's name, in logs.
    fn controller(self) -> &'static str {
        match self {
            Kind::InstanceTypes => "providers.instancetype",
            Kind::OnDemandPrices => "providers.pricing.ondemand",
            Kind::SpotPrices => "providers.pricing.spot",
            Kind::UnusedLaunchTemplates => "providers.launchtemplate",
        }
    }

    /// The delay between two successful runs.
    fn interval(self) -> Duration {
        match self {
            Kind::UnusedLaunchTemplates => SWEEP_INTERVAL,
            _ => REFRESH_INTERVAL,
        }
    }
}

/// The delay before the next run of something done every `interval`, after `failures`
/// consecutive failures (0 after a success).
pub fn next_fetch(interval: Duration, failures: u32) -> Duration {
    if failures == 0 {
        return interval;
    }
    Backoff::new(RETRY_BASE, interval).delay(failures)
}

/// Runs the controller until `stop` turns true. `first_round` is told once every kind has been
/// fetched (or has failed) once, so that the first launches can wait for prices.
pub async fn run(
    provider: Arc<AwsCloudProvider>,
    isolated_vpc: bool,
    first_round: oneshot::Sender<()>,
    stop: watch::Receiver<bool>,
) {
    let mut kinds = vec![Kind::InstanceTypes, Kind::SpotPrices, Kind::UnusedLaunchTemplates];
    if isolated_vpc {
        tracing::info!("running in an isolated VPC, on-demand pricing information will not be updated");
    } else {
        kinds.push(Kind::OnDemandPrices);
    }
    let mut loops = JoinSet::new();
    let mut firsts = Vec::new();
    for kind in kinds {
        let (tx, rx) = oneshot::channel();
        firsts.push(rx);
        loops.spawn(keep_current(kind, provider.clone(), tx, stop.clone()));
    }
    loops.spawn(async move {
        for rx in firsts {
            let _ = rx.await;
        }
        let _ = first_round.send(());
    });
    while loops.join_next().await.is_some() {}
}

/// A fetch that failed; the last good data stays.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct RefreshError {
    what: &'static str,
    #[source]
    source: CloudProviderError,
}

/// Fetches `kind` until `stop` turns true; `first` is told after the first attempt.
async fn keep_current(
    kind: Kind,
    provider: Arc<AwsCloudProvider>,
    first: oneshot::Sender<()>,
    stop: watch::Receiver<bool>,
) {
    let first = std::sync::Mutex::new(Some(first));
    let options = Options::new(kind.controller()).backoff(Backoff::new(RETRY_BASE, kind.interval()));
    run_singleton(options, None, Timer, stop, || {
        let (provider, first) = (&provider, &first);
        async move {
            let result = kind.fetch(provider).await;
            if let Some(first) = first.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
                let _ = first.send(());
            }
            match result {
                Ok(count) => {
                    kind.log(count);
                    Ok(Next::After(kind.interval()))
                }
                Err(source) => Err(RefreshError { what: kind.failure(), source }),
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetches_twice_a_day_and_retries_failures_sooner() {
        let prices = Kind::SpotPrices.interval();
        assert_eq!(next_fetch(prices, 0), Duration::from_secs(12 * 3600));
        assert_eq!(next_fetch(prices, 1), Duration::from_secs(60));
        assert_eq!(next_fetch(prices, 2), Duration::from_secs(120));
        assert_eq!(next_fetch(prices, 10), Duration::from_secs(512 * 60));
        assert_eq!(next_fetch(prices, 11), REFRESH_INTERVAL);
        assert_eq!(next_fetch(prices, u32::MAX), REFRESH_INTERVAL);
        let sweep = Kind::UnusedLaunchTemplates.interval();
        assert_eq!(next_fetch(sweep, 0), Duration::from_secs(300));
        assert_eq!(next_fetch(sweep, 4), Duration::from_secs(300));
    }
}
