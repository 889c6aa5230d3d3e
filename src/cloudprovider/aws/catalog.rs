//! The region's instance-type catalog: DescribeInstanceTypes and DescribeInstanceTypeOfferings,
//! fetched together and cached for a refresh interval.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_ec2::Client as Ec2Client;
use aws_sdk_ec2::types::{Filter, LocationType};
use tokio::sync::Mutex;

use super::cache::Clock;
use super::instancetype::TypeInfo;
use super::sdk_error;
use crate::cloudprovider::Result;

/// How often instance types, their zones and prices are fetched again (as upstream).
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(12 * 60 * 60);

/// The instance types of the region and where each is offered.
#[derive(Debug, Default)]
pub struct CatalogData {
    /// Types running x86-64 or arm64 under HVM, by name.
    pub types: Vec<TypeInfo>,
    /// Instance type name to the zones it is offered in.
    pub zones: HashMap<String, BTreeSet<String>>,
}

impl CatalogData {
    /// The type named `name`.
    pub fn get(&self, name: &str) -> Option<&TypeInfo> {
        self.types.iter().find(|t| t.name == name)
    }
}

/// A cached catalog.
#[derive(Debug)]
pub struct Catalog {
    ec2: Ec2Client,
    refresh_interval: Duration,
    clock: Arc<dyn Clock>,
    state: Mutex<Option<(Arc<CatalogData>, Instant)>>,
}

impl Catalog {
    /// A catalog refreshed every `refresh_interval`.
    pub fn new(ec2: Ec2Client, refresh_interval: Duration, clock: Arc<dyn Clock>) -> Self {
        Catalog { ec2, refresh_interval, clock, state: Mutex::new(None) }
    }

    /// The catalog, fetched when missing or stale. When a refresh fails the previous catalog
    /// stays in use.
    pub async fn get(&self) -> Result<Arc<CatalogData>> {
        let mut state = self.state.lock().await;
        let now = self.clock.now();
        if let Some((data, at)) = state.as_ref()
            && now.duration_since(*at) < self.refresh_interval
        {
            return Ok(data.clone());
        }
        match fetch(&self.ec2).await {
            Ok(data) => {
                let data = Arc::new(data);
                *state = Some((data.clone(), now));
                Ok(data)
            }
            Err(e) => match state.as_mut() {
                Some((data, at)) => {
                    tracing::warn!(error = %e, "refreshing the instance-type catalog failed; keeping the old one");
                    // Not asked again on every use: the refresh controller retries with backoff.
                    *at = now;
                    Ok(data.clone())
                }
                None => Err(e),
            },
        }
    }

    /// The catalog fetched last, without asking EC2 (`None` before the first fetch).
    pub async fn current(&self) -> Option<Arc<CatalogData>> {
        self.state.lock().await.as_ref().map(|(data, _)| data.clone())
    }

    /// Fetches the catalog now, whatever its age. On failure the previous catalog stays in use
    /// and the error is returned.
    pub async fn refresh(&self) -> Result<Arc<CatalogData>> {
        let data = Arc::new(fetch(&self.ec2).await?);
        *self.state.lock().await = Some((data.clone(), self.clock.now()));
        Ok(data)
    }
}

/// Fetches the catalog.
pub async fn fetch(ec2: &Ec2Client) -> Result<CatalogData> {
    let mut types = Vec::new();
    let mut pages = ec2
        .describe_instance_types()
        .filters(
            Filter::builder()
                .name("processor-info.supported-architecture")
                .values("x86_64")
                .values("arm64")
                .build(),
        )
        .filters(Filter::builder().name("supported-virtualization-type").values("hvm").build())
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| sdk_error("DescribeInstanceTypes", e))?;
        types.extend(page.instance_types().iter().filter_map(TypeInfo::from_sdk));
    }
    types.sort_by(|a, b| a.name.cmp(&b.name));
    types.dedup_by(|a, b| a.name == b.name);

    let mut zones: HashMap<String, BTreeSet<String>> = HashMap::new();
    let mut pages = ec2
        .describe_instance_type_offerings()
        .location_type(LocationType::AvailabilityZone)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| sdk_error("DescribeInstanceTypeOfferings", e))?;
        for o in page.instance_type_offerings() {
            if let (Some(it), Some(zone)) = (o.instance_type(), o.location()) {
                zones.entry(it.as_str().to_string()).or_default().insert(zone.to_string());
            }
        }
    }
    Ok(CatalogData { types, zones })
}
