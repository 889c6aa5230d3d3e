//! EC2 status checks of the cluster's instances (DescribeInstanceStatus): an instance whose
//! instance or system status check has failed for [`UNHEALTHY_THRESHOLD`] is terminated
//! forcefully; one with a scheduled event (reboot, maintenance, retirement, stop) is drained.
//!
//! [`assess`] is pure: statuses in, what to do about which instance out.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use aws_sdk_ec2::types::{
    Filter, InstanceStatus as Ec2Status, InstanceStatusSummary, StatusType, SummaryStatus,
};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::interruption::Kind;
use super::sdk_error;
use crate::cloudprovider::CloudProviderError;

/// How long a status check must have failed before its instance is terminated, as upstream.
pub const UNHEALTHY_THRESHOLD: Duration = Duration::from_secs(120);

/// The scheduled event codes that drain an instance, as upstream.
pub const EVENT_CODES: [&str; 5] =
    ["instance-reboot", "system-reboot", "system-maintenance", "instance-retirement", "instance-stop"];

/// One instance's checks, as DescribeInstanceStatus reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// The instance.
    pub instance_id: String,
    /// The instance status check.
    pub instance: Check,
    /// The system status check.
    pub system: Check,
    /// Codes of the instance's scheduled events.
    pub events: Vec<String>,
}

/// One status check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Check {
    /// Whether the check reports `impaired`.
    pub impaired: bool,
    /// The earliest `impairedSince` of its failed details, when EC2 gives one.
    pub failed_since: Option<Timestamp>,
}

/// An instance to act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unhealthy {
    /// The instance.
    pub instance_id: String,
    /// Why: [`Kind::InstanceStatus`], [`Kind::SystemStatus`] or [`Kind::EventStatus`].
    pub kind: Kind,
    /// Since when (for a failed check, when it failed; for an event, when first seen).
    pub since: Timestamp,
}

/// When each instance's problem was first seen, and whether it was counted (once it became
/// due), for checks EC2 reports without `impairedSince` and to count each problem once. Entries
/// of instances no longer reported are dropped.
pub type FirstSeen = HashMap<(String, &'static str), (Timestamp, bool)>;

/// What to do about `statuses` at `now`: at most one entry per instance, a failed instance or
/// system check (terminated forcefully) before a scheduled event (drained). Also returns the
/// problems that became due for the first time (instance and kind), for the metric counting
/// them once, as upstream counts only the problems it acts on: a check that fails for less
/// than [`UNHEALTHY_THRESHOLD`] and recovers is not counted. `first_seen` is updated.
pub fn assess(
    statuses: &[Status],
    first_seen: &mut FirstSeen,
    now: Timestamp,
) -> (Vec<Unhealthy>, Vec<Unhealthy>) {
    let threshold = SignedDuration::try_from(UNHEALTHY_THRESHOLD).unwrap_or(SignedDuration::from_mins(2));
    let mut act = Vec::new();
    let mut new = Vec::new();
    let mut current: FirstSeen = HashMap::new();
    for status in statuses {
        let mut problems: Vec<(Kind, Option<Timestamp>)> = Vec::new();
        if status.instance.impaired {
            problems.push((Kind::InstanceStatus, status.instance.failed_since));
        }
        if status.system.impaired {
            problems.push((Kind::SystemStatus, status.system.failed_since));
        }
        if status.events.iter().any(|code| EVENT_CODES.contains(&code.as_str())) {
            problems.push((Kind::EventStatus, None));
        }
        let mut chosen: Option<Unhealthy> = None;
        for (kind, since) in problems {
            let key = (status.instance_id.clone(), kind.metric_label());
            let (seen, counted) = first_seen.get(&key).copied().unwrap_or((now, false));
            let since = since.unwrap_or(seen);
            let entry = Unhealthy { instance_id: status.instance_id.clone(), kind: kind.clone(), since };
            let due = kind == Kind::EventStatus || now.duration_since(since) >= threshold;
            if due && !counted {
                new.push(entry.clone());
            }
            current.insert(key, (seen, counted || due));
            // Forceful termination (the checks, listed first) wins over a drain.
            if due && chosen.is_none() {
                chosen = Some(entry);
            }
        }
        act.extend(chosen);
    }
    *first_seen = current;
    (act, new)
}

/// The statuses of the account's instances with a problem: three DescribeInstanceStatus queries
/// (every page), as upstream's (instance check impaired, system check impaired, one of
/// [`EVENT_CODES`] scheduled), merged by instance. The caller keeps the cluster's.
pub async fn describe(ec2: &aws_sdk_ec2::Client) -> Result<Vec<Status>, CloudProviderError> {
    let filters = [
        Filter::builder().name("instance-status.status").values("impaired").build(),
        Filter::builder().name("system-status.status").values("impaired").build(),
        Filter::builder().name("event.code").set_values(Some(EVENT_CODES.map(String::from).to_vec())).build(),
    ];
    let mut statuses: BTreeMap<String, Status> = BTreeMap::new();
    for filter in filters {
        let mut token: Option<String> = None;
        loop {
            let out = ec2
                .describe_instance_status()
                .filters(filter.clone())
                .set_next_token(token.take())
                .send()
                .await
                .map_err(|e| sdk_error("DescribeInstanceStatus", e))?;
            for s in out.instance_statuses.unwrap_or_default().iter().filter_map(status) {
                statuses.entry(s.instance_id.clone()).or_insert(s);
            }
            match out.next_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => break,
            }
        }
    }
    Ok(statuses.into_values().collect())
}

fn status(s: &Ec2Status) -> Option<Status> {
    Some(Status {
        instance_id: s.instance_id.clone().filter(|id| !id.is_empty())?,
        instance: check(s.instance_status.as_ref()),
        system: check(s.system_status.as_ref()),
        events: s
            .events
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter_map(|e| e.code.as_ref().map(|c| c.as_str().to_string()))
            .collect(),
    })
}

fn check(summary: Option<&InstanceStatusSummary>) -> Check {
    let Some(summary) = summary else { return Check::default() };
    let failed_since = summary
        .details
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|d| d.status == Some(StatusType::Failed))
        .filter_map(|d| d.impaired_since.as_ref())
        .filter_map(|t| Timestamp::from_second(t.secs()).ok())
        .min();
    Check { impaired: summary.status == Some(SummaryStatus::Impaired), failed_since }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn impaired(since: Option<&str>) -> Check {
        Check { impaired: true, failed_since: since.map(t) }
    }

    #[test]
    fn failed_checks_act_after_two_minutes_events_at_once() {
        let now = t("2026-11-24T12:00:00Z");
        let statuses = vec![
            Status { instance_id: "i-ok".into(), ..Status::default() },
            Status {
                instance_id: "i-young".into(),
                instance: impaired(Some("2026-11-24T11:59:00Z")),
                ..Status::default()
            },
            Status {
                instance_id: "i-old".into(),
                system: impaired(Some("2026-11-24T11:57:00Z")),
                ..Status::default()
            },
            Status {
                instance_id: "i-event".into(),
                events: vec!["system-maintenance".into()],
                ..Status::default()
            },
            Status {
                instance_id: "i-other-event".into(),
                events: vec!["instance-launch".into()],
                ..Status::default()
            },
        ];
        let mut seen = FirstSeen::new();
        let (act, new) = assess(&statuses, &mut seen, now);
        let got: Vec<(&str, &Kind)> = act.iter().map(|u| (u.instance_id.as_str(), &u.kind)).collect();
        assert_eq!(got, [("i-old", &Kind::SystemStatus), ("i-event", &Kind::EventStatus)]);
        assert_eq!(new, act, "the problems acted on are counted, not the young one");
        // A minute later the young one is due and counted; the others are not counted again.
        let (act, new) = assess(&statuses, &mut seen, t("2026-11-24T12:01:00Z"));
        assert!(act.iter().any(|u| u.instance_id == "i-young" && u.kind == Kind::InstanceStatus), "{act:?}");
        let new: Vec<&str> = new.iter().map(|u| u.instance_id.as_str()).collect();
        assert_eq!(new, ["i-young"]);
        assert!(assess(&statuses, &mut seen, t("2026-11-24T12:02:00Z")).1.is_empty(), "each counted once");
        // A check that fails briefly and recovers is never counted.
        let brief = vec![Status {
            instance_id: "i-brief".into(),
            instance: impaired(Some("2026-11-24T12:01:30Z")),
            ..Status::default()
        }];
        let mut seen = FirstSeen::new();
        assert!(assess(&brief, &mut seen, t("2026-11-24T12:02:00Z")).1.is_empty());
        assert!(assess(&[], &mut seen, t("2026-11-24T12:03:00Z")).1.is_empty());
    }

    #[test]
    fn a_check_without_impaired_since_counts_from_when_it_was_first_seen() {
        let statuses =
            vec![Status { instance_id: "i-a".into(), instance: impaired(None), ..Status::default() }];
        let mut seen = FirstSeen::new();
        assert!(assess(&statuses, &mut seen, t("2026-11-24T12:00:00Z")).0.is_empty());
        assert!(assess(&statuses, &mut seen, t("2026-11-24T12:01:59Z")).0.is_empty());
        let (act, _) = assess(&statuses, &mut seen, t("2026-11-24T12:02:00Z"));
        assert_eq!(act.len(), 1);
        assert_eq!(act[0].since, t("2026-11-24T12:00:00Z"));
        // Recovered: forgotten, and a later failure starts again.
        assess(&[], &mut seen, t("2026-11-24T12:03:00Z"));
        assert!(seen.is_empty());
        assert!(assess(&statuses, &mut seen, t("2026-11-24T12:04:00Z")).0.is_empty());
    }

    #[test]
    fn ec2_answers_map_to_checks() {
        use aws_sdk_ec2::primitives::DateTime;
        use aws_sdk_ec2::types::{EventCode, InstanceStatusDetails, InstanceStatusEvent};
        let detail = |status: StatusType, since: Option<i64>| {
            InstanceStatusDetails::builder()
                .status(status)
                .set_impaired_since(since.map(DateTime::from_secs))
                .build()
        };
        let answer = Ec2Status::builder()
            .instance_id("i-a")
            .system_status(
                InstanceStatusSummary::builder()
                    .status(SummaryStatus::Impaired)
                    .details(detail(StatusType::Passed, Some(100)))
                    .details(detail(StatusType::Failed, Some(1_800_000_000)))
                    .details(detail(StatusType::Failed, Some(1_700_000_000)))
                    .build(),
            )
            .instance_status(InstanceStatusSummary::builder().status(SummaryStatus::Ok).build())
            .events(InstanceStatusEvent::builder().code(EventCode::SystemMaintenance).build())
            .build();
        let got = status(&answer).unwrap();
        assert_eq!(got.instance_id, "i-a");
        assert_eq!(
            got.system,
            Check { impaired: true, failed_since: Some(Timestamp::from_second(1_700_000_000).unwrap()) }
        );
        assert_eq!(got.instance, Check::default());
        assert_eq!(got.events, ["system-maintenance"]);
        assert!(status(&Ec2Status::builder().build()).is_none(), "no instance id");
    }

    #[test]
    fn a_failed_check_is_forceful_even_with_an_event() {
        let statuses = vec![Status {
            instance_id: "i-a".into(),
            instance: impaired(Some("2026-11-24T11:50:00Z")),
            events: vec!["instance-retirement".into()],
            ..Status::default()
        }];
        let (act, _) = assess(&statuses, &mut FirstSeen::new(), t("2026-11-24T12:00:00Z"));
        assert_eq!(act.len(), 1);
        assert_eq!(act[0].kind, Kind::InstanceStatus);
        assert_eq!(
            act[0].kind.action(),
            crate::cloudprovider::aws::interruption::Action::ForcefulTermination
        );
    }
}
