//! Instance prices: on-demand from a static table (the Pricing API is a global service that
//! private clusters often cannot reach), spot from the EC2 spot price history per zone.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use aws_sdk_ec2::Client as Ec2Client;

use super::sdk_error;
use crate::apis::labels::{CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_SPOT};
use crate::cloudprovider::Result;

/// Hourly on-demand prices in USD of Linux instances (us-east-1), `instance_type,usd_per_hour`.
const ON_DEMAND_CSV: &str = include_str!("data/on-demand-prices.csv");

/// Parses the `instance_type,usd_per_hour` table, skipping the header and malformed lines.
pub fn parse_on_demand_csv(csv: &str) -> HashMap<String, f64> {
    csv.lines()
        .filter_map(|line| {
            let (name, price) = line.trim().split_once(',')?;
            let price: f64 = price.trim().parse().ok()?;
            (price.is_finite() && price > 0.0).then(|| (name.trim().to_string(), price))
        })
        .collect()
}

/// Known prices.
#[derive(Debug)]
pub struct Pricing {
    on_demand: RwLock<HashMap<String, f64>>,
    /// `(instance type, zone)` to the last spot price seen.
    spot: RwLock<HashMap<(String, String), f64>>,
}

impl Default for Pricing {
    fn default() -> Self {
        Pricing { on_demand: RwLock::new(parse_on_demand_csv(ON_DEMAND_CSV)), spot: RwLock::default() }
    }
}

impl Pricing {
    /// The price of `instance_type` in `zone` for `capacity_type`, if known.
    pub fn price(&self, instance_type: &str, zone: &str, capacity_type: &str) -> Option<f64> {
        match capacity_type {
            CAPACITY_TYPE_ON_DEMAND => self.on_demand_price(instance_type),
            CAPACITY_TYPE_SPOT => self
                .spot
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&(instance_type.to_string(), zone.to_string()))
                .copied(),
            _ => None,
        }
    }

    /// The on-demand price of `instance_type`, if known.
    pub fn on_demand_price(&self, instance_type: &str) -> Option<f64> {
        self.on_demand.read().unwrap_or_else(PoisonError::into_inner).get(instance_type).copied()
    }

    /// Sets an on-demand price (tests, or a later Pricing API refresh).
    pub fn set_on_demand_price(&self, instance_type: &str, price: f64) {
        self.on_demand
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(instance_type.to_string(), price);
    }

    /// Records spot prices; entries not mentioned keep their last known value.
    pub fn update_spot_prices(&self, prices: impl IntoIterator<Item = ((String, String), f64)>) {
        let mut spot = self.spot.write().unwrap_or_else(PoisonError::into_inner);
        for (key, price) in prices {
            if price.is_finite() && price > 0.0 {
                spot.insert(key, price);
            }
        }
    }

    /// Fetches the current spot prices of Linux instances for every type and zone and records
    /// them. On failure the last known prices stay in use.
    pub async fn refresh_spot_prices(&self, ec2: &Ec2Client) -> Result<usize> {
        let mut latest: HashMap<(String, String), (f64, i64)> = HashMap::new();
        let mut pages = ec2
            .describe_spot_price_history()
            .start_time(aws_smithy_types::DateTime::from(std::time::SystemTime::now()))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error("DescribeSpotPriceHistory", e))?;
            // Filtered here rather than with a product-description filter, which not every
            // EC2 implementation honours.
            for p in page
                .spot_price_history()
                .iter()
                .filter(|p| p.product_description().is_some_and(|d| d.as_str().starts_with("Linux/UNIX")))
            {
                let (Some(it), Some(zone), Some(price)) = (
                    p.instance_type(),
                    p.availability_zone(),
                    p.spot_price().and_then(|s| s.parse::<f64>().ok()),
                ) else {
                    continue;
                };
                let at = p.timestamp().map_or(0, |t| t.secs());
                let key = (it.as_str().to_string(), zone.to_string());
                match latest.get(&key) {
                    Some((_, seen)) if *seen > at => {}
                    _ => {
                        latest.insert(key, (price, at));
                    }
                }
            }
        }
        let n = latest.len();
        self.update_spot_prices(latest.into_iter().map(|(k, (p, _))| (k, p)));
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_table_has_common_types() {
        let p = Pricing::default();
        assert_eq!(p.on_demand_price("m5.large"), Some(0.096));
        assert_eq!(p.price("t3.medium", "us-west-2a", CAPACITY_TYPE_ON_DEMAND), Some(0.0416));
        assert_eq!(p.price("m5.large", "us-west-2a", CAPACITY_TYPE_SPOT), None);
        assert!(parse_on_demand_csv("instance_type,usd_per_hour\nx.large,abc\ny.large,0\n").is_empty());
    }

    #[test]
    fn spot_prices_keep_last_good_value() {
        let p = Pricing::default();
        let k = |z: &str| ("m5.large".to_string(), z.to_string());
        p.update_spot_prices([(k("a"), 0.03), (k("b"), 0.04)]);
        p.update_spot_prices([(k("a"), f64::NAN), (k("b"), 0.05)]);
        assert_eq!(p.price("m5.large", "a", CAPACITY_TYPE_SPOT), Some(0.03));
        assert_eq!(p.price("m5.large", "b", CAPACITY_TYPE_SPOT), Some(0.05));
        assert_eq!(p.price("m5.large", "b", "reserved"), None);
    }
}
