//! The drift hash of a spec: what a NodePool template or an EC2NodeClass hashes to, recorded on
//! each NodeClaim at launch and compared later to tell whether the claim drifted.
//!
//! The hash is of the spec's meaning, not of its spelling, as upstream's hashes are (which hash
//! slices as sets and leave zero values out): a list hashes the same in any order (taints,
//! block device mappings), and a field set to its zero value (`false`, `0`, `""`, `[]`, `{}`,
//! `null`) hashes as if it were absent. So reordering a NodePool's taints, or writing
//! `detailedMonitoring: false`, drifts no node.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The first 8 bytes of the SHA-256 of `value`'s normal form, as an integer.
pub fn drift_hash(value: Value) -> u64 {
    let normal = normalize(value).unwrap_or(Value::Null);
    let digest = Sha256::digest(normal.to_string().as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// `value` with zero values left out and arrays sorted; `None` when it is a zero value itself.
fn normalize(value: Value) -> Option<Value> {
    match value {
        Value::Null | Value::Bool(false) => None,
        Value::Number(n) if n.as_f64() == Some(0.0) => None,
        Value::String(s) if s.is_empty() => None,
        Value::Array(items) => {
            let mut items: Vec<Value> = items.into_iter().filter_map(normalize).collect();
            // Sorted by their text: the same members in any order give the same array.
            items.sort_by_cached_key(Value::to_string);
            (!items.is_empty()).then_some(Value::Array(items))
        }
        // serde_json's map keeps its keys sorted, so the text of an object is already canonical.
        Value::Object(fields) => {
            let fields: serde_json::Map<String, Value> =
                fields.into_iter().filter_map(|(k, v)| normalize(v).map(|v| (k, v))).collect();
            (!fields.is_empty()).then_some(Value::Object(fields))
        }
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn order_and_zero_values_do_not_change_the_hash() {
        let a =
            json!({"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}]});
        let b =
            json!({"taints": [{"effect": "NoExecute", "key": "b"}, {"key": "a", "effect": "NoSchedule"}]});
        assert_eq!(drift_hash(a.clone()), drift_hash(b));
        let zeros = json!({"taints": a["taints"], "startupTaints": [], "labels": {}, "monitoring": false,
            "userData": "", "size": 0, "kubelet": null, "nested": {"empty": []}});
        assert_eq!(drift_hash(a.clone()), drift_hash(zeros));
    }

    #[test]
    fn a_change_of_meaning_changes_the_hash() {
        let base = json!({"labels": {"team": "a"}, "taints": [{"key": "a"}]});
        for changed in [
            json!({"labels": {"team": "b"}, "taints": [{"key": "a"}]}),
            json!({"labels": {"team": "a"}, "taints": [{"key": "a"}, {"key": "b"}]}),
            json!({"labels": {"team": "a"}, "taints": [{"key": "a"}], "monitoring": true}),
            json!({"labels": {"team": "a"}, "taints": [{"key": "a"}], "size": 1}),
            // The same members, one of them twice, is another list.
            json!({"labels": {"team": "a"}, "taints": [{"key": "a"}, {"key": "a"}]}),
        ] {
            assert_ne!(drift_hash(base.clone()), drift_hash(changed.clone()), "{changed}");
        }
    }
}
