//! Fault injection for the EC2 client: an SDK interceptor that makes EC2 misbehave in the ways
//! the provider must survive, against an emulator that never does:
//!
//! - CreateFleet reports insufficient capacity for chosen instance types (the provider leaves the
//!   offering out and launches the next one). The doomed call is rewritten into a harmless
//!   DescribeRegions before it is sent, so nothing is launched, and the answer is replaced with a
//!   CreateFleet response whose error set names every override of a failing type.
//! - The next calls of an action are throttled (`503 RequestLimitExceeded`) or fail with
//!   `500 InternalError` before EC2 sees them (rewritten the same way).
//! - The answer of the next call of an action is lost: EC2 acts on the request, and the caller
//!   gets `500 InternalError` instead of the answer.
//!
//! Every CreateFleet request is recorded (but dry runs), so tests can check what was asked for.

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
    /// Errors to answer calls with before they are sent.
    errors: Vec<InjectedError>,
    /// Action → calls left whose answer is lost after EC2 acted.
    lost: Vec<(String, usize)>,
    /// Calls of each action seen, retries included.
    attempts: Vec<(String, usize)>,
}

/// Calls of an action to answer with an error before they are sent.
#[derive(Debug)]
struct InjectedError {
    action: String,
    code: &'static str,
    status: u16,
    left: usize,
}

/// The answer to give instead of the real one: HTTP status and body.
#[derive(Clone, Debug)]
struct Replacement(u16, String);

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

    /// How many CreateFleet calls were answered with injected insufficient-capacity errors.
    pub fn injected(&self) -> usize {
        self.lock().injected
    }

    /// Answers the next `times` calls of `action` (`DescribeSubnets`, `CreateFleet`, ...) with
    /// `503 RequestLimitExceeded`, without sending them.
    pub fn throttle(&self, action: &str, times: usize) {
        self.fail(action, "RequestLimitExceeded", 503, times);
    }

    /// Answers the next `times` calls of `action` with `500 InternalError`, without sending them.
    pub fn fail_with_server_error(&self, action: &str, times: usize) {
        self.fail(action, "InternalError", 500, times);
    }

    /// Answers the next `times` calls of `action` with the error `code` and HTTP `status`
    /// (`UnauthorizedOperation`, 403, ...), without sending them.
    pub fn fail(&self, action: &str, code: &'static str, status: u16, times: usize) {
        let error = InjectedError { action: action.to_string(), code, status, left: times };
        self.lock().errors.push(error);
    }

    /// Sends the next call of `action` to EC2 but answers it with `500 InternalError`, as when the
    /// answer is lost on its way back.
    pub fn lose_next_answer(&self, action: &str) {
        self.lock().lost.push((action.to_string(), 1));
    }

    /// Calls of `action` seen so far, each retry counted.
    pub fn attempts(&self, action: &str) -> usize {
        self.lock().attempts.iter().find(|(a, _)| a == action).map_or(0, |(_, n)| *n)
    }

    /// The query-protocol bodies of the CreateFleet calls seen so far, in order.
    pub fn create_fleet_requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The `Errors` document of EC2's query protocol.
fn error_response(code: &str, message: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code><Message>{}</Message></Error></Errors><RequestID>fault-injected</RequestID></Response>",
        xml_escape(code),
        xml_escape(message)
    )
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
        // The state outlives the attempt: a retry starts without the last attempt's answer.
        cfg.interceptor_state().unset::<Replacement>();
        let request = context.request_mut();
        let Some(body) = request.body().bytes().map(|b| String::from_utf8_lossy(b).into_owned()) else {
            return Ok(());
        };
        let Some(action) = body.split('&').find_map(|p| p.strip_prefix("Action=")).map(str::to_string) else {
            return Ok(());
        };
        let mut state = self.lock();
        match state.attempts.iter_mut().find(|(a, _)| *a == action) {
            Some((_, n)) => *n += 1,
            None => state.attempts.push((action.clone(), 1)),
        }
        let error = state.errors.iter_mut().find(|e| e.action == action && e.left > 0).map(|e| {
            e.left -= 1;
            (e.code, e.status)
        });
        if let Some((code, status)) = error {
            drop(state);
            let message = format!("injected {code} for {action}");
            replace(request, cfg, Replacement(status, error_response(code, &message)));
            return Ok(());
        }
        if let Some(lost) = state.lost.iter_mut().find(|(a, left)| *a == action && *left > 0) {
            lost.1 -= 1;
            // Sent as it is; only the answer is swapped.
            cfg.interceptor_state().store_put(Replacement(
                500,
                error_response("InternalError", &format!("the answer to {action} was lost")),
            ));
            if action == "CreateFleet" {
                state.requests.push(body);
            }
            return Ok(());
        }
        // A dry run launches nothing, so it is not recorded and never out of capacity.
        if action != "CreateFleet" || body.split('&').any(|p| p == "DryRun=true") {
            return Ok(());
        }
        let overrides = requested_overrides(&body);
        state.requests.push(body.clone());
        // The fleet launches its first override when it can: fail when that one is doomed.
        if !overrides.first().is_some_and(|o| state.failing.contains(&o.instance_type)) {
            return Ok(());
        }
        let failed: Vec<RequestedOverride> =
            overrides.into_iter().filter(|o| state.failing.contains(&o.instance_type)).collect();
        state.injected += 1;
        replace(request, cfg, Replacement(200, insufficient_capacity_response(&failed)));
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(Replacement(status, xml)) = cfg.load::<Replacement>().cloned() {
            let response = context.response_mut();
            response.headers_mut().remove("content-length");
            if let Ok(status) = status.try_into() {
                *response.status_mut() = status;
            }
            *response.body_mut() = SdkBody::from(xml);
        }
        Ok(())
    }
}

/// Rewrites `request` into a harmless DescribeRegions (so EC2 does nothing) whose answer is
/// replaced by `replacement`.
fn replace(
    request: &mut aws_sdk_ec2::config::http::HttpRequest,
    cfg: &mut ConfigBag,
    replacement: Replacement,
) {
    cfg.interceptor_state().store_put(replacement);
    let harmless = "Action=DescribeRegions&Version=2016-11-15";
    *request.body_mut() = SdkBody::from(harmless);
    request.headers_mut().insert("content-length", harmless.len().to_string());
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
