//! The messages of the interruption queue: the EventBridge events AWS sends about instances (spot
//! interruption warnings, rebalance recommendations, state changes, AWS Health scheduled
//! changes, capacity reservation interruptions), parsed into what Karpenter does about them.
//!
//! Parsing is pure and total: any body, however malformed, truncated or large, gives a
//! [`Message`] or a [`ParseError`], never a panic. Events of a kind Karpenter does not act on
//! (another source, another detail type, another version, a Health event that is not an EC2
//! scheduled change, a state change to `running`) are [`Kind::NoOp`], not errors, as upstream.

use std::fmt;

use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

/// The largest body parsed: SQS messages are at most 256 KiB.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// What a message says happened to its instances.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// EC2 will reclaim the spot instances in two minutes.
    SpotInterruption,
    /// EC2 recommends moving off the spot instances (they are at higher risk of interruption).
    RebalanceRecommendation,
    /// The instances are stopping or stopped.
    Stopping,
    /// The instances are shutting down or terminated.
    Terminating,
    /// AWS Health scheduled maintenance of the instances (EC2 `scheduledChange`).
    ScheduledChange,
    /// The capacity reservation the instances run in is being reclaimed.
    CapacityReservationInterruption,
    /// EC2's instance status check has failed for long enough (from DescribeInstanceStatus, not
    /// from the queue).
    InstanceStatus,
    /// EC2's system status check has failed for long enough (DescribeInstanceStatus).
    SystemStatus,
    /// EC2 scheduled an event (reboot, maintenance, retirement, stop) for the instance
    /// (DescribeInstanceStatus).
    EventStatus,
    /// Nothing Karpenter acts on.
    NoOp,
}

impl Kind {
    /// The `message_type` label of the interruption metrics, as upstream names it.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Kind::SpotInterruption => "spot_interrupted",
            Kind::RebalanceRecommendation => "rebalance_recommendation",
            Kind::Stopping => "instance_stopped",
            Kind::Terminating => "instance_terminated",
            Kind::ScheduledChange => "scheduled_change",
            Kind::CapacityReservationInterruption => "capacity_reservation_interrupted",
            Kind::InstanceStatus => "instance_status",
            Kind::SystemStatus => "system_status",
            Kind::EventStatus => "event_status",
            Kind::NoOp => "no_op",
        }
    }

    /// What Karpenter does about the message's instances.
    pub fn action(&self) -> Action {
        match self {
            Kind::SpotInterruption
            | Kind::Stopping
            | Kind::Terminating
            | Kind::ScheduledChange
            | Kind::EventStatus
            | Kind::CapacityReservationInterruption => Action::CordonAndDrain,
            Kind::InstanceStatus | Kind::SystemStatus => Action::ForcefulTermination,
            Kind::RebalanceRecommendation => Action::EventOnly,
            Kind::NoOp => Action::Nothing,
        }
    }

    /// The reason and message of the event told on the NodeClaim and Node before acting, as
    /// upstream words them, and whether it is a warning.
    pub fn event(&self) -> Option<(&'static str, &'static str, bool)> {
        match self {
            Kind::SpotInterruption => {
                Some(("SpotInterrupted", "Spot interruption warning was triggered", true))
            }
            Kind::RebalanceRecommendation => {
                Some(("SpotRebalanceRecommendation", "Spot rebalance recommendation was triggered", false))
            }
            Kind::Stopping => Some(("InstanceStopping", "Instance is stopping", true)),
            Kind::Terminating => Some(("InstanceTerminating", "Instance is terminating", true)),
            Kind::ScheduledChange | Kind::InstanceStatus | Kind::SystemStatus | Kind::EventStatus => {
                Some(("InstanceUnhealthy", "An unhealthy warning was triggered for the instance", true))
            }
            Kind::CapacityReservationInterruption => Some((
                "CapacityReservationInstanceInterrupted",
                "Capacity Reservation interruption warning was triggered",
                true,
            )),
            Kind::NoOp => None,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.metric_label())
    }
}

/// What is done about a message's instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Delete their NodeClaims (a normal drain, no disruption budget); the provisioner replaces
    /// the pods meanwhile.
    CordonAndDrain,
    /// Delete their NodeClaims with a termination deadline of now: the pods are deleted at once,
    /// PodDisruptionBudgets and do-not-disrupt notwithstanding (the instance is broken).
    ForcefulTermination,
    /// Only tell it (an event on the NodeClaim and Node).
    EventOnly,
    /// Nothing.
    Nothing,
}

/// A parsed message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// What happened.
    pub kind: Kind,
    /// The EventBridge event's id.
    pub id: String,
    /// The instances it is about (none for [`Kind::NoOp`]).
    pub instance_ids: Vec<String>,
    /// When the event happened (the envelope's `time`), for the queue-duration metric.
    pub time: Option<Timestamp>,
    /// The capacity reservation of a [`Kind::CapacityReservationInterruption`], when given.
    pub capacity_reservation_id: Option<String>,
}

/// Why a body is not a message.
#[derive(Debug, Error)]
pub enum ParseError {
    /// Larger than an SQS message can be.
    #[error("message of {0} bytes is larger than {MAX_BODY_BYTES}")]
    TooLarge(usize),
    /// Not a JSON object with the EventBridge envelope's fields.
    #[error("not an EventBridge event")]
    Envelope(#[source] serde_json::Error),
    /// An event Karpenter acts on, whose `detail` lacks what it needs.
    #[error("{kind} event {id:?}: {what}")]
    Detail {
        /// The kind the envelope announced.
        kind: Kind,
        /// The event's id.
        id: String,
        /// What is missing or malformed.
        what: String,
    },
}

/// The EventBridge envelope.
#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    version: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    source: String,
    #[serde(rename = "detail-type", default)]
    detail_type: String,
    #[serde(default)]
    time: Option<String>,
    #[serde(default)]
    detail: Value,
}

/// Parses a message body of the interruption queue.
pub fn parse(body: &str) -> Result<Message, ParseError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(ParseError::TooLarge(body.len()));
    }
    let envelope: Envelope = serde_json::from_str(body).map_err(ParseError::Envelope)?;
    let time = envelope.time.as_deref().and_then(|t| t.parse::<Timestamp>().ok());
    let message = |kind: Kind, instance_ids: Vec<String>| Message {
        kind,
        id: envelope.id.clone(),
        instance_ids,
        time,
        capacity_reservation_id: None,
    };
    if envelope.version != "0" {
        return Ok(message(Kind::NoOp, vec![]));
    }
    let detail = &envelope.detail;
    let fail =
        |kind: Kind, what: &str| ParseError::Detail { kind, id: envelope.id.clone(), what: what.to_string() };
    let instance = |kind: Kind| -> Result<Vec<String>, ParseError> {
        match detail.get("instance-id").and_then(Value::as_str) {
            Some(id) if !id.is_empty() => Ok(vec![id.to_string()]),
            _ => Err(fail(kind, "detail.instance-id is missing")),
        }
    };
    match (envelope.source.as_str(), envelope.detail_type.as_str()) {
        ("aws.ec2", "EC2 Spot Instance Interruption Warning") => {
            Ok(message(Kind::SpotInterruption, instance(Kind::SpotInterruption)?))
        }
        ("aws.ec2", "EC2 Instance Rebalance Recommendation") => {
            Ok(message(Kind::RebalanceRecommendation, instance(Kind::RebalanceRecommendation)?))
        }
        ("aws.ec2", "EC2 Instance State-change Notification") => {
            let kind = match detail.get("state").and_then(Value::as_str) {
                Some("stopping" | "stopped") => Kind::Stopping,
                Some("shutting-down" | "terminated") => Kind::Terminating,
                Some(_) => return Ok(message(Kind::NoOp, vec![])),
                None => return Err(fail(Kind::Terminating, "detail.state is missing")),
            };
            let ids = instance(kind.clone())?;
            Ok(message(kind, ids))
        }
        ("aws.ec2", "EC2 Capacity Reservation Instance Interruption Warning") => {
            let kind = Kind::CapacityReservationInterruption;
            let ids = instance(kind.clone())?;
            let mut m = message(kind, ids);
            m.capacity_reservation_id =
                detail.get("capacity-reservation-id").and_then(Value::as_str).map(str::to_string);
            Ok(m)
        }
        ("aws.health", "AWS Health Event") => {
            let service = detail.get("service").and_then(Value::as_str);
            let category = detail.get("eventTypeCategory").and_then(Value::as_str);
            if service != Some("EC2") || category != Some("scheduledChange") {
                return Ok(message(Kind::NoOp, vec![]));
            }
            let entities = detail
                .get("affectedEntities")
                .and_then(Value::as_array)
                .ok_or_else(|| fail(Kind::ScheduledChange, "detail.affectedEntities is missing"))?;
            let ids: Vec<String> = entities
                .iter()
                .filter_map(|e| e.get("entityValue").and_then(Value::as_str))
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .collect();
            Ok(message(Kind::ScheduledChange, ids))
        }
        _ => Ok(message(Kind::NoOp, vec![])),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Recorded shapes of the five EventBridge events (identifiers made up here).
    const SPOT: &str = r#"{"version":"0","id":"1e5527d7-bb36-4607-3370-4164db56a40e","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","account":"123456789012","time":"2026-11-24T12:00:00Z","region":"us-west-2","resources":["arn:aws:ec2:us-west-2a:instance/i-0b662ef9931388ba0"],"detail":{"instance-id":"i-0b662ef9931388ba0","instance-action":"terminate"}}"#;
    const REBALANCE: &str = r#"{"version":"0","id":"5d5555d5-dd55-5555-5555-5555dd55dd55","detail-type":"EC2 Instance Rebalance Recommendation","source":"aws.ec2","account":"123456789012","time":"2026-11-24T12:00:00Z","region":"us-west-2","resources":["arn:aws:ec2:us-west-2a:instance/i-0b662ef9931388ba0"],"detail":{"instance-id":"i-0b662ef9931388ba0"}}"#;
    const HEALTH: &str = r#"{"version":"0","id":"7bf73129-1428-4cd3-a780-95db273d1602","detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":"2026-11-24T12:00:00Z","region":"us-west-2","resources":["i-0b662ef9931388ba0","i-05a1f5a1f5a1f5a1f"],"detail":{"eventArn":"arn:aws:health:us-west-2::event/EC2/EC2_INSTANCE_RETIREMENT_SCHEDULED/EC2_INSTANCE_RETIREMENT_SCHEDULED_1","service":"EC2","eventTypeCode":"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED","eventTypeCategory":"scheduledChange","startTime":"Tue, 01 Dec 2026 12:00:00 GMT","endTime":"Tue, 01 Dec 2026 14:00:00 GMT","eventDescription":[{"language":"en_US","latestDescription":"A description"}],"affectedEntities":[{"entityValue":"i-0b662ef9931388ba0"},{"entityValue":"i-05a1f5a1f5a1f5a1f"}]}}"#;
    const CAPACITY: &str = r#"{"version":"0","id":"2c8a2d43-3fd5-4d9a-8c5f-1b8a7c1c2a11","detail-type":"EC2 Capacity Reservation Instance Interruption Warning","source":"aws.ec2","account":"123456789012","time":"2026-11-24T12:00:00Z","region":"us-west-2","resources":["arn:aws:ec2:us-west-2:123456789012:instance/i-0b662ef9931388ba0"],"detail":{"instance-id":"i-0b662ef9931388ba0","instance-action":"terminate","capacity-reservation-id":"cr-0123456789abcdef0"}}"#;

    fn state_change(state: &str) -> String {
        format!(
            r#"{{"version":"0","id":"7bf73129-1428-4cd3-a780-95db273d1602","detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","account":"123456789012","time":"2026-11-24T12:00:00Z","region":"us-west-2","resources":["arn:aws:ec2:us-west-2:123456789012:instance/i-0b662ef9931388ba0"],"detail":{{"instance-id":"i-0b662ef9931388ba0","state":"{state}"}}}}"#
        )
    }

    #[test]
    fn each_kind_of_event_is_understood() {
        let spot = parse(SPOT).unwrap();
        assert_eq!(spot.kind, Kind::SpotInterruption);
        assert_eq!(spot.instance_ids, ["i-0b662ef9931388ba0"]);
        assert_eq!(spot.time, Some("2026-11-24T12:00:00Z".parse().unwrap()));
        assert_eq!(spot.id, "1e5527d7-bb36-4607-3370-4164db56a40e");
        assert_eq!(spot.kind.action(), Action::CordonAndDrain);

        let rebalance = parse(REBALANCE).unwrap();
        assert_eq!(
            (rebalance.kind.clone(), rebalance.kind.action()),
            (Kind::RebalanceRecommendation, Action::EventOnly)
        );

        let health = parse(HEALTH).unwrap();
        assert_eq!(health.kind, Kind::ScheduledChange);
        assert_eq!(health.instance_ids, ["i-0b662ef9931388ba0", "i-05a1f5a1f5a1f5a1f"]);

        let capacity = parse(CAPACITY).unwrap();
        assert_eq!(capacity.kind, Kind::CapacityReservationInterruption);
        assert_eq!(capacity.capacity_reservation_id.as_deref(), Some("cr-0123456789abcdef0"));

        for (state, kind) in [
            ("stopping", Kind::Stopping),
            ("stopped", Kind::Stopping),
            ("shutting-down", Kind::Terminating),
            ("terminated", Kind::Terminating),
            ("running", Kind::NoOp),
            ("pending", Kind::NoOp),
        ] {
            let m = parse(&state_change(state)).unwrap();
            assert_eq!(m.kind, kind, "{state}");
            assert_eq!(m.instance_ids.is_empty(), kind == Kind::NoOp, "{state}");
        }
    }

    #[test]
    fn labels_and_events_are_upstreams() {
        assert_eq!(Kind::SpotInterruption.metric_label(), "spot_interrupted");
        assert_eq!(Kind::Stopping.metric_label(), "instance_stopped");
        assert_eq!(Kind::Terminating.metric_label(), "instance_terminated");
        assert_eq!(Kind::NoOp.metric_label(), "no_op");
        assert_eq!(Kind::SpotInterruption.event().unwrap().0, "SpotInterrupted");
        assert!(!Kind::RebalanceRecommendation.event().unwrap().2, "a rebalance is a Normal event");
        assert_eq!(
            Kind::ScheduledChange.event().unwrap().1,
            "An unhealthy warning was triggered for the instance"
        );
        assert!(Kind::NoOp.event().is_none());
    }

    #[test]
    fn events_karpenter_does_not_act_on_are_no_ops() {
        let other_version = SPOT.replace(r#""version":"0""#, r#""version":"1""#);
        let other_source = SPOT.replace("\"aws.ec2\"", "\"aws.autoscaling\"");
        let other_type =
            SPOT.replace("EC2 Spot Instance Interruption Warning", "EC2 Spot Instance Request Fulfillment");
        let other_service = HEALTH.replace(r#""service":"EC2""#, r#""service":"RDS""#);
        let other_category = HEALTH.replace("scheduledChange", "issue");
        for body in [other_version, other_source, other_type, other_service, other_category] {
            let m = parse(&body).unwrap();
            assert_eq!((m.kind.clone(), m.instance_ids.len()), (Kind::NoOp, 0), "{body}");
        }
    }

    #[test]
    fn malformed_messages_are_errors_that_name_the_problem() {
        assert!(matches!(parse(""), Err(ParseError::Envelope(_))));
        assert!(matches!(parse("not json"), Err(ParseError::Envelope(_))));
        assert!(matches!(parse("[1,2]"), Err(ParseError::Envelope(_))));
        assert!(matches!(parse(&SPOT[..SPOT.len() / 2]), Err(ParseError::Envelope(_))), "truncated");
        let no_instance = SPOT.replace("\"instance-id\":\"i-0b662ef9931388ba0\",", "");
        let err = parse(&no_instance).unwrap_err();
        assert!(
            err.to_string().contains("spot_interrupted") && err.to_string().contains("instance-id"),
            "{err}"
        );
        let no_state = state_change("x").replace(",\"state\":\"x\"", "");
        assert!(matches!(parse(&no_state), Err(ParseError::Detail { .. })));
        let huge = format!("{{\"pad\":\"{}\"}}", "x".repeat(MAX_BODY_BYTES));
        assert!(matches!(parse(&huge), Err(ParseError::TooLarge(_))));
    }

    /// Any JSON value: scalars, and arrays and objects of them nested a few levels, with keys
    /// drawn from the ones the parser reads so that the strategy reaches past the envelope.
    fn any_json() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            ".{0,12}".prop_map(Value::String),
            Just(Value::String("i-0b662ef9931388ba0".into())),
            Just(Value::String("EC2".into())),
            Just(Value::String("scheduledChange".into())),
        ];
        let key = prop_oneof![
            Just("instance-id".to_string()),
            Just("state".to_string()),
            Just("service".to_string()),
            Just("eventTypeCategory".to_string()),
            Just("affectedEntities".to_string()),
            Just("entityValue".to_string()),
            Just("instance-action".to_string()),
            ".{0,6}",
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(key.clone(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn arbitrary_json_never_panics(
            body in any_json(),
            detail in any_json(),
            detail_type in prop_oneof![
                Just("EC2 Spot Instance Interruption Warning".to_string()),
                Just("EC2 Instance Rebalance Recommendation".to_string()),
                Just("EC2 Instance State-change Notification".to_string()),
                Just("AWS Health Event".to_string()),
                Just("EC2 Capacity Reservation Instance Interruption Warning".to_string()),
            ],
        ) {
            // A whole body of any shape, and a well-formed envelope around any detail.
            let _ = parse(&body.to_string());
            let source = if detail_type == "AWS Health Event" { "aws.health" } else { "aws.ec2" };
            let envelope = serde_json::json!({"version": "0", "id": "x", "source": source,
                "detail-type": detail_type, "time": "2026-11-24T12:00:00Z", "detail": detail});
            let _ = parse(&envelope.to_string());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let body = String::from_utf8_lossy(&bytes);
            let _ = parse(&body);
        }

        #[test]
        fn arbitrary_envelopes_never_panic(
            version in prop_oneof![Just("0".to_string()), ".{0,3}"],
            source in prop_oneof![Just("aws.ec2".to_string()), Just("aws.health".to_string()), ".{0,12}"],
            detail_type in prop_oneof![
                Just("EC2 Spot Instance Interruption Warning".to_string()),
                Just("EC2 Instance State-change Notification".to_string()),
                Just("AWS Health Event".to_string()),
                Just("EC2 Capacity Reservation Instance Interruption Warning".to_string()),
                ".{0,20}",
            ],
            detail in prop_oneof![
                Just(serde_json::json!(null)),
                Just(serde_json::json!({"instance-id": 5, "state": ["x"]})),
                Just(serde_json::json!({"service": "EC2", "eventTypeCategory": "scheduledChange", "affectedEntities": [1, {"entityValue": null}]})),
                ".{0,16}".prop_map(|s| serde_json::json!({"instance-id": s, "state": s})),
            ],
            cut in 0usize..400,
        ) {
            let body = serde_json::json!({"version": version, "id": "x", "source": source,
                "detail-type": detail_type, "time": "2026-11-24T12:00:00Z", "detail": detail}).to_string();
            let _ = parse(&body);
            let _ = parse(&body[..body.floor_char_boundary(cut.min(body.len()))]);
        }
    }
}
