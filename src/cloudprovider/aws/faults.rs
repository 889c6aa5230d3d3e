//! Fault injection for the EC2 client: an SDK interceptor that makes CreateFleet report
//! insufficient capacity for chosen instance types, so the provider's reaction (leave the
//! offering out, launch the next one) can be exercised against an emulator that never runs out.
//!
//! The interceptor rewrites a doomed CreateFleet into a harmless DescribeRegions call before it
//! is sent (so nothing is launched) and replaces the answer with a CreateFleet response whose
//! error set names every override of a failing type. It also records every CreateFleet request,
//! so tests can check what was asked for.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use aws_sdk_ec2::config::interceptors::{
    BeforeDeserializationInterceptorContextMut, BeforeTransmitInterceptorContextMut,
};
use aws_sdk_ec2::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::config_bag::{Storable, StoreReplace};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Instance types whose CreateFleet overrides fail with `InsufficientInstanceCapacity`.
#[derive(Clone, Debug, Default)]
pub struct FaultInjector {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    failing: BTreeSet<String>,
    injected: usize,
    requests: Vec<String>,
}

/// The CreateFleet answer to give instead of the real one.
#[derive(Clone, Debug)]
struct Replacement(String);

impl Storable for Replacement {
    type Storer = StoreReplace<Self>;
}

/// One override of a CreateFleet request: launch template, instance type, subnet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestedOverride {
    /// Launch template name.
    pub launch_template: String,
    /// Instance type.
    pub instance_type: String,
    /// Subnet.
    pub subnet_id: String,
}

impl FaultInjector {
    /// An injector that fails nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes every override of `instance_type` fail from now on.
    pub fn fail_instance_type(&self, instance_type: &str) {
        self.lock().failing.insert(instance_type.to_string());
    }

    /// Stops failing `instance_type`.
    pub fn heal_instance_type(&self, instance_type: &str) {
        self.lock().failing.remove(instance_type);
    }

    /// How many CreateFleet calls were answered with injected errors.
    pub fn injected(&self) -> usize {
        self.lock().injected
    }

    /// The query-protocol bodies of the CreateFleet calls seen so far, in order.
    pub fn create_fleet_requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Decodes `application/x-www-form-urlencoded` text.
fn form_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The overrides of a CreateFleet query-protocol body, in request order.
pub fn requested_overrides(body: &str) -> Vec<RequestedOverride> {
    let mut configs: std::collections::BTreeMap<(u32, u32), RequestedOverride> = Default::default();
    let mut templates: std::collections::BTreeMap<u32, String> = Default::default();
    for pair in body.split('&') {
        let Some((k, v)) = pair.split_once('=') else { continue };
        let (k, v) = (form_decode(k), form_decode(v));
        let parts: Vec<&str> = k.split('.').collect();
        match parts.as_slice() {
            ["LaunchTemplateConfigs", c, "LaunchTemplateSpecification", "LaunchTemplateName"] => {
                if let Ok(c) = c.parse() {
                    templates.insert(c, v);
                }
            }
            ["LaunchTemplateConfigs", c, "Overrides", o, field] => {
                let (Ok(c), Ok(o)) = (c.parse(), o.parse()) else { continue };
                let entry = configs.entry((c, o)).or_default();
                match *field {
                    "InstanceType" => entry.instance_type = v,
                    "SubnetId" => entry.subnet_id = v,
                    _ => {}
                }
            }
            _ => {}
        }
    }
    configs
        .into_iter()
        .map(|((c, _), mut o)| {
            o.launch_template = templates.get(&c).cloned().unwrap_or_default();
            o
        })
        .collect()
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A CreateFleet response without instances and one `InsufficientInstanceCapacity` error per
/// override.
pub fn insufficient_capacity_response(failed: &[RequestedOverride]) -> String {
    let mut items = String::new();
    for o in failed {
        items.push_str(&format!(
            "<item><launchTemplateAndOverrides><launchTemplateSpecification><launchTemplateName>{}</launchTemplateName><version>$Latest</version></launchTemplateSpecification><overrides><instanceType>{}</instanceType><subnetId>{}</subnetId></overrides></launchTemplateAndOverrides><errorCode>InsufficientInstanceCapacity</errorCode><errorMessage>We currently do not have sufficient {} capacity (injected).</errorMessage></item>",
            xml_escape(&o.launch_template),
            xml_escape(&o.instance_type),
            xml_escape(&o.subnet_id),
            xml_escape(&o.instance_type),
        ));
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CreateFleetResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>fault-injected</requestId><fleetId>fleet-injected</fleetId><errorSet>{items}</errorSet><fleetInstanceSet/></CreateFleetResponse>"
    )
}

impl Intercept for FaultInjector {
    fn name(&self) -> &'static str {
        "FaultInjector"
    }

    fn modify_before_transmit(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request_mut();
        let Some(body) = request.body().bytes().map(|b| String::from_utf8_lossy(b).into_owned()) else {
            return Ok(());
        };
        if !body.split('&').any(|p| p == "Action=CreateFleet") {
            return Ok(());
        }
        let overrides = requested_overrides(&body);
        let mut state = self.lock();
        state.requests.push(body.clone());
        // The fleet launches its first override when it can: fail when that one is doomed.
        if !overrides.first().is_some_and(|o| state.failing.contains(&o.instance_type)) {
            return Ok(());
        }
        let failed: Vec<RequestedOverride> =
            overrides.into_iter().filter(|o| state.failing.contains(&o.instance_type)).collect();
        state.injected += 1;
        cfg.interceptor_state().store_put(Replacement(insufficient_capacity_response(&failed)));
        let harmless = "Action=DescribeRegions&Version=2016-11-15";
        *request.body_mut() = SdkBody::from(harmless);
        request.headers_mut().insert("content-length", harmless.len().to_string());
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(Replacement(xml)) = cfg.load::<Replacement>().cloned() {
            let response = context.response_mut();
            response.headers_mut().remove("content-length");
            *response.body_mut() = SdkBody::from(xml);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fleet_overrides() {
        let body = "Action=CreateFleet&Version=2016-11-15&LaunchTemplateConfigs.1.LaunchTemplateSpecification.LaunchTemplateName=karpenter.k8s.aws%2Fabc&LaunchTemplateConfigs.1.Overrides.1.InstanceType=c5.large&LaunchTemplateConfigs.1.Overrides.1.SubnetId=subnet-1&LaunchTemplateConfigs.1.Overrides.2.InstanceType=m5.large&LaunchTemplateConfigs.1.Overrides.2.SubnetId=subnet-2";
        let got = requested_overrides(body);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].launch_template, "karpenter.k8s.aws/abc");
        assert_eq!((got[1].instance_type.as_str(), got[1].subnet_id.as_str()), ("m5.large", "subnet-2"));
        let xml = insufficient_capacity_response(&got[..1]);
        assert!(xml.contains("<instanceType>c5.large</instanceType><subnetId>subnet-1</subnetId>"));
        assert_eq!(form_decode("a%2Fb+c%"), "a/b c%");
    }
}
