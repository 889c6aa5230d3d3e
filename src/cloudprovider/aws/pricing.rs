//! Instance prices: on-demand from a static table, replaced by the Pricing API's prices for the
//! region when that API answers (it is a global service that private clusters often cannot
//! reach), spot from the EC2 spot price history per zone.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use aws_sdk_ec2::Client as Ec2Client;
use aws_sdk_pricing::types::{Filter as PriceFilter, FilterType};
use serde::Deserialize;

use super::sdk_error;
use crate::apis::labels::{CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_SPOT};
use crate::cloudprovider::Result;

/// Hourly on-demand prices in USD of Linux instances (us-east-1), `instance_type,usd_per_hour`.
const ON_DEMAND_CSV: &str = include_str!("data/on-demand-prices.csv");

/// The region whose Pricing API endpoint serves `region`: the API has endpoints in a few regions
/// only.
pub fn pricing_api_region(region: &str) -> &'static str {
    if region.starts_with("ap-") {
        "ap-south-1"
    } else if region.starts_with("cn-") {
        "cn-northwest-1"
    } else if region.starts_with("eu-") {
        "eu-central-1"
    } else {
        "us-east-1"
    }
}

/// The currency prices of `region` are quoted in.
fn currency(region: &str) -> &'static str {
    if region.starts_with("cn-") { "CNY" } else { "USD" }
}

/// The parts of a Pricing API product document that matter here.
#[derive(Deserialize)]
struct Product {
    product: ProductInfo,
    #[serde(default)]
    terms: Terms,
}

#[derive(Deserialize)]
struct ProductInfo {
    attributes: Attributes,
}

#[derive(Deserialize)]
struct Attributes {
    #[serde(rename = "instanceType", default)]
    instance_type: String,
}

#[derive(Default, Deserialize)]
struct Terms {
    #[serde(rename = "OnDemand", default)]
    on_demand: HashMap<String, Term>,
}

#[derive(Deserialize)]
struct Term {
    #[serde(rename = "priceDimensions", default)]
    price_dimensions: HashMap<String, PriceDimension>,
}

#[derive(Deserialize)]
struct PriceDimension {
    #[serde(rename = "pricePerUnit", default)]
    price_per_unit: HashMap<String, String>,
}

/// Hourly on-demand prices from the `PriceList` documents of a GetProducts answer, in
/// `currency`. Documents that do not parse or name no instance type or price are skipped; the
/// second value counts those that did not parse.
pub fn parse_price_list<S: AsRef<str>>(documents: &[S], currency: &str) -> (HashMap<String, f64>, usize) {
    let mut prices = HashMap::new();
    let mut malformed = 0;
    for doc in documents {
        let Ok(product) = serde_json::from_str::<Product>(doc.as_ref()) else {
            malformed += 1;
            continue;
        };
        if product.product.attributes.instance_type.is_empty() {
            continue;
        }
        let price = product
            .terms
            .on_demand
            .values()
            .flat_map(|t| t.price_dimensions.values())
            .filter_map(|d| d.price_per_unit.get(currency)?.parse::<f64>().ok())
            .find(|p| p.is_finite() && *p > 0.0);
        if let Some(price) = price {
            prices.insert(product.product.attributes.instance_type, price);
        }
    }
    (prices, malformed)
}

/// GetProducts filters for Linux on-demand instances of `region` without pre-installed
/// software, plus the tenancy and product family.
fn product_filters(region: &str, tenancy: &str, family: &str) -> Vec<PriceFilter> {
    [
        ("regionCode", region),
        ("serviceCode", "AmazonEC2"),
        ("preInstalledSw", "NA"),
        ("operatingSystem", "Linux"),
        ("capacitystatus", "Used"),
        ("marketoption", "OnDemand"),
        ("tenancy", tenancy),
        ("productFamily", family),
    ]
    .into_iter()
    .filter_map(|(field, value)| {
        PriceFilter::builder().r#type(FilterType::TermMatch).field(field).value(value).build().ok()
    })
    .collect()
}

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

    /// Records on-demand prices; types not mentioned keep their last known price.
    pub fn update_on_demand_prices(&self, prices: impl IntoIterator<Item = (String, f64)>) {
        let mut on_demand = self.on_demand.write().unwrap_or_else(PoisonError::into_inner);
        for (name, price) in prices {
            if price.is_finite() && price > 0.0 {
                on_demand.insert(name, price);
            }
        }
    }

    /// Fetches the on-demand prices of Linux instances in `region` from the Pricing API (shared
    /// tenancy, and bare-metal types, which the API files under dedicated tenancy) and records
    /// them. On failure, or when the API knows no prices, the last known prices stay in use.
    pub async fn refresh_on_demand_prices(
        &self,
        client: &aws_sdk_pricing::Client,
        region: &str,
    ) -> Result<usize> {
        let mut found = HashMap::new();
        let mut malformed = 0;
        for (tenancy, family) in
            [("Shared", "Compute Instance"), ("Dedicated", "Compute Instance (bare metal)")]
        {
            let mut pages = client
                .get_products()
                .service_code("AmazonEC2")
                .set_filters(Some(product_filters(region, tenancy, family)))
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| sdk_error("GetProducts", e))?;
                let (prices, bad) = parse_price_list(page.price_list(), currency(region));
                malformed += bad;
                found.extend(prices);
            }
        }
        if malformed > 0 {
            tracing::warn!(count = malformed, "skipped Pricing API documents that did not parse");
        }
        if found.is_empty() {
            return Err(crate::cloudprovider::CloudProviderError::UnexpectedResponse {
                operation: "GetProducts",
                message: format!("no on-demand prices for {region}"),
            });
        }
        let n = found.len();
        self.update_on_demand_prices(found);
        Ok(n)
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

    /// A product document shaped as the Pricing API returns them.
    fn product(instance_type: &str, currency: &str, price: &str) -> String {
        serde_json::json!({
            "product": {
                "productFamily": "Compute Instance",
                "attributes": {"instanceType": instance_type, "operatingSystem": "Linux", "tenancy": "Shared"},
                "sku": "SKU1"
            },
            "serviceCode": "AmazonEC2",
            "terms": {"OnDemand": {"SKU1.JRTCKXETXF": {
                "offerTermCode": "JRTCKXETXF",
                "priceDimensions": {"SKU1.JRTCKXETXF.6YS6EN2CT7": {
                    "unit": "Hrs",
                    "pricePerUnit": {currency: price}
                }}
            }}}
        })
        .to_string()
    }

    #[test]
    fn price_list_documents_are_parsed() {
        let docs = vec![
            product("m5.large", "USD", "0.0960000000"),
            product("c5.large", "USD", "0.0000000000"),
            product("r5.large", "CNY", "0.9"),
            r#"{"product": {"attributes": {}}, "terms": {}}"#.to_string(),
            "not json".to_string(),
        ];
        let (prices, malformed) = parse_price_list(&docs, "USD");
        assert_eq!(prices, HashMap::from([("m5.large".to_string(), 0.096)]));
        assert_eq!(malformed, 1);
        let (prices, _) = parse_price_list(&docs, currency("cn-north-1"));
        assert_eq!(prices, HashMap::from([("r5.large".to_string(), 0.9)]));
    }

    #[test]
    fn the_pricing_api_is_asked_in_the_nearest_region_it_serves() {
        assert_eq!(pricing_api_region("us-west-2"), "us-east-1");
        assert_eq!(pricing_api_region("ap-northeast-1"), "ap-south-1");
        assert_eq!(pricing_api_region("eu-west-1"), "eu-central-1");
        assert_eq!(pricing_api_region("cn-north-1"), "cn-northwest-1");
    }

    /// Serves canned GetProducts answers over HTTP, one per request, and records the requests'
    /// bodies.
    async fn canned_server(answers: Vec<String>) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let answers = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from(answers)));
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (tx, answers) = (tx.clone(), answers.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let header_end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            let mut chunk = [0u8; 4096];
                            match conn.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..header_end]).to_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        while buf.len() < header_end + length {
                            let mut chunk = [0u8; 4096];
                            match conn.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let body: Vec<u8> = buf.drain(..header_end + length).skip(header_end).collect();
                        let target = head
                            .lines()
                            .find_map(|l| l.strip_prefix("x-amz-target:"))
                            .unwrap_or("")
                            .trim()
                            .to_string();
                        let _ = tx.send(format!("{target} {}", String::from_utf8_lossy(&body)));
                        let answer = answers.lock().unwrap().pop_front().unwrap_or_else(|| "{}".to_string());
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.1\r\ncontent-length: {}\r\n\r\n{answer}",
                            answer.len()
                        );
                        if conn.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, rx)
    }

    fn pricing_client(url: &str) -> aws_sdk_pricing::Client {
        let config = aws_sdk_pricing::Config::builder()
            .behavior_version(aws_sdk_pricing::config::BehaviorVersion::latest())
            .region(aws_sdk_pricing::config::Region::new("eu-central-1"))
            .endpoint_url(url)
            .http_client(crate::cloudprovider::aws::https_client())
            .credentials_provider(aws_sdk_pricing::config::Credentials::new(
                "AKID", "SECRET", None, None, "test",
            ))
            .build();
        aws_sdk_pricing::Client::from_conf(config)
    }

    #[tokio::test]
    async fn on_demand_prices_come_from_get_products() {
        let page = |docs: &[String], next: Option<&str>| {
            let mut v = serde_json::json!({"FormatVersion": "aws_v1", "PriceList": docs});
            if let Some(n) = next {
                v["NextToken"] = n.into();
            }
            v.to_string()
        };
        let (url, mut requests) = canned_server(vec![
            page(&[product("m5.large", "USD", "0.107")], Some("page-2")),
            page(&[product("c5.large", "USD", "0.097")], None),
            page(&[product("m5.metal", "USD", "5.376")], None),
        ])
        .await;
        let p = Pricing::default();
        let known_before = p.on_demand_price("t3.medium");
        let n = p.refresh_on_demand_prices(&pricing_client(&url), "eu-west-1").await.unwrap();
        assert_eq!(n, 3);
        assert_eq!(p.on_demand_price("m5.large"), Some(0.107), "the API's price replaces the table's");
        assert_eq!(p.on_demand_price("c5.large"), Some(0.097), "the second page is read");
        assert_eq!(p.on_demand_price("m5.metal"), Some(5.376), "bare-metal types are asked for");
        assert_eq!(
            p.on_demand_price("t3.medium"),
            known_before,
            "types the API did not mention keep their price"
        );

        let first = requests.recv().await.unwrap();
        assert!(first.starts_with("awspricelistservice.getproducts "), "{first}");
        let body: serde_json::Value = serde_json::from_str(first.split_once(' ').unwrap().1).unwrap();
        assert_eq!(body["ServiceCode"], "AmazonEC2");
        let filters: Vec<(String, String)> = body["Filters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["Field"].as_str().unwrap().to_string(), f["Value"].as_str().unwrap().to_string()))
            .collect();
        for want in [
            ("regionCode", "eu-west-1"),
            ("operatingSystem", "Linux"),
            ("tenancy", "Shared"),
            ("capacitystatus", "Used"),
        ] {
            assert!(filters.contains(&(want.0.to_string(), want.1.to_string())), "{want:?} in {filters:?}");
        }
        let second = requests.recv().await.unwrap();
        assert!(second.contains("page-2"), "{second}");
        let third = requests.recv().await.unwrap();
        assert!(third.contains("Compute Instance (bare metal)") && third.contains("Dedicated"), "{third}");
    }

    #[tokio::test]
    async fn an_empty_or_failed_answer_keeps_the_last_prices() {
        let (url, _requests) = canned_server(vec![
            serde_json::json!({"PriceList": []}).to_string(),
            serde_json::json!({"PriceList": []}).to_string(),
        ])
        .await;
        let p = Pricing::default();
        let err = p.refresh_on_demand_prices(&pricing_client(&url), "us-east-1").await.unwrap_err();
        assert!(err.to_string().contains("no on-demand prices"), "{err}");
        assert_eq!(p.on_demand_price("m5.large"), Some(0.096));

        // Nothing listens on this port any more.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        assert!(p.refresh_on_demand_prices(&pricing_client(&closed), "us-east-1").await.is_err());
        assert_eq!(p.on_demand_price("m5.large"), Some(0.096));
    }
}
