//! Taints and tolerations.

use k8s_openapi::api::core::v1::Toleration;

use crate::apis::labels::TAINT_UNREGISTERED;
use crate::apis::{Taint, TaintEffect};

/// Taint the node lifecycle controller puts on nodes that are not ready.
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// Taint the node lifecycle controller puts on unreachable nodes.
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// Taint the cloud controller manager keeps until it has initialized the node.
pub const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Taint kubelet sets while the node's network is not configured.
pub const TAINT_NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";

/// Taints every new node carries for a short while and that will go away by themselves: they are
/// ignored when deciding whether a pod can run on a node that is not initialized yet.
pub const KNOWN_EPHEMERAL_TAINTS: &[(&str, TaintEffect)] = &[
    (TAINT_NOT_READY, TaintEffect::NoSchedule),
    (TAINT_UNREACHABLE, TaintEffect::NoSchedule),
    (TAINT_UNINITIALIZED, TaintEffect::NoSchedule),
    (TAINT_NETWORK_UNAVAILABLE, TaintEffect::NoSchedule),
    (TAINT_UNREGISTERED, TaintEffect::NoExecute),
];

/// Whether `taint` is one of [`KNOWN_EPHEMERAL_TAINTS`].
pub fn is_ephemeral(taint: &Taint) -> bool {
    KNOWN_EPHEMERAL_TAINTS.iter().any(|(k, e)| taint.key == *k && taint.effect == *e)
}

/// Whether `toleration` tolerates `taint`.
///
/// An empty effect matches every effect; operator `Exists` (or an empty key with `Exists`, which
/// tolerates everything) ignores the value; `Equal` (the default) compares it.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref()
        && !effect.is_empty()
        && effect != taint.effect.as_str()
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    let exists = toleration.operator.as_deref() == Some("Exists");
    if key.is_empty() {
        return exists;
    }
    if key != taint.key {
        return false;
    }
    if exists {
        return true;
    }
    toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
}

/// Describes a taint as `key=value:Effect`.
pub fn describe(taint: &Taint) -> String {
    match taint.value.as_deref() {
        Some(v) if !v.is_empty() => format!("{}={}:{}", taint.key, v, taint.effect.as_str()),
        _ => format!("{}:{}", taint.key, taint.effect.as_str()),
    }
}

/// Checks that `tolerations` tolerate every scheduling-relevant taint (`NoSchedule`, `NoExecute`);
/// returns the first untolerated one as `untolerated taint key=value:Effect`.
pub fn check_tolerated<'a>(
    taints: impl IntoIterator<Item = &'a Taint>,
    tolerations: &[Toleration],
) -> Result<(), String> {
    for taint in taints {
        if taint.effect == TaintEffect::PreferNoSchedule {
            continue;
        }
        if !tolerations.iter().any(|t| tolerates(t, taint)) {
            return Err(format!("untolerated taint {}", describe(taint)));
        }
    }
    Ok(())
}

/// Whether `tolerations` tolerate every `NoSchedule` and `NoExecute` taint of `taints`.
pub fn tolerates_all(taints: &[Taint], tolerations: &[Toleration]) -> bool {
    taints
        .iter()
        .all(|t| t.effect == TaintEffect::PreferNoSchedule || tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// Converts a Kubernetes taint (effect as a string); unknown effects are treated as `NoSchedule`.
pub fn from_k8s(t: &k8s_openapi::api::core::v1::Taint) -> Taint {
    let effect = match t.effect.as_str() {
        "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
        "NoExecute" => TaintEffect::NoExecute,
        _ => TaintEffect::NoSchedule,
    };
    Taint { key: t.key.clone(), value: t.value.clone(), effect, time_added: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn tol(key: Option<&str>, op: Option<&str>, value: Option<&str>, effect: Option<&str>) -> Toleration {
        Toleration {
            key: key.map(Into::into),
            operator: op.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: None,
        }
    }

    fn taint(key: &str, value: Option<&str>, effect: TaintEffect) -> Taint {
        Taint { key: key.into(), value: value.map(Into::into), effect, time_added: None }
    }

    #[rstest]
    #[case(tol(Some("a"), None, Some("1"), None), taint("a", Some("1"), TaintEffect::NoSchedule), true)]
    #[case(
        tol(Some("a"), Some("Equal"), Some("2"), None),
        taint("a", Some("1"), TaintEffect::NoSchedule),
        false
    )]
    #[case(tol(Some("a"), Some("Exists"), None, None), taint("a", Some("1"), TaintEffect::NoExecute), true)]
    #[case(
        tol(Some("a"), Some("Exists"), None, Some("NoExecute")),
        taint("a", Some("1"), TaintEffect::NoSchedule),
        false
    )]
    #[case(tol(None, Some("Exists"), None, None), taint("anything", None, TaintEffect::NoSchedule), true)]
    #[case(tol(Some(""), Some("Equal"), None, None), taint("anything", None, TaintEffect::NoSchedule), false)]
    #[case(tol(Some("b"), Some("Exists"), None, None), taint("a", None, TaintEffect::NoSchedule), false)]
    #[case(tol(Some("a"), None, None, Some("NoSchedule")), taint("a", None, TaintEffect::NoSchedule), true)]
    fn toleration_table(#[case] t: Toleration, #[case] taint: Taint, #[case] want: bool) {
        assert_eq!(tolerates(&t, &taint), want);
    }

    #[test]
    fn reports_untolerated_and_skips_prefer_no_schedule() {
        let taints = [
            taint("soft", None, TaintEffect::PreferNoSchedule),
            taint("dedicated", Some("gpu"), TaintEffect::NoSchedule),
        ];
        assert_eq!(
            check_tolerated(&taints, &[]),
            Err("untolerated taint dedicated=gpu:NoSchedule".to_string())
        );
        assert_eq!(check_tolerated(&taints, &[tol(Some("dedicated"), Some("Exists"), None, None)]), Ok(()));
        assert!(is_ephemeral(&taint(TAINT_NOT_READY, None, TaintEffect::NoSchedule)));
        assert!(!is_ephemeral(&taint(TAINT_NOT_READY, None, TaintEffect::NoExecute)));
    }
}
