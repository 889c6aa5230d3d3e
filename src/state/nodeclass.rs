//! Whether the node class a NodePool or NodeClaim references can launch nodes: the judgement every
//! cloud provider gives unless it says otherwise (`CloudProvider::node_class_readiness`), which
//! the NodePool status and the NodeClaim lifecycle ask, and the commands use directly.

use std::fmt;

use crate::apis::labels::AWS_GROUP;
use crate::apis::{ConditionStatus, EC2NodeClass, NodeClassReference};

/// The kind of node class this controller serves.
pub const KIND: &str = "EC2NodeClass";

/// Why a node class cannot launch nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeClassProblem {
    /// The reference names a kind this controller does not serve, or a class that does not exist.
    NotFound(String),
    /// The class exists but is not Ready (not resolved yet, or resolution failed), or is being
    /// deleted.
    NotReady(String),
}

impl fmt::Display for NodeClassProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeClassProblem::NotFound(m) | NodeClassProblem::NotReady(m) => f.write_str(m),
        }
    }
}

/// Whether `reference` names a kind of node class this controller serves.
pub fn is_served(reference: &NodeClassReference) -> bool {
    reference.group == AWS_GROUP && reference.kind == KIND
}

/// Whether `class`, the one `reference` names (`None`: it does not exist), can launch nodes.
pub fn readiness(
    reference: &NodeClassReference,
    class: Option<&EC2NodeClass>,
) -> Result<(), NodeClassProblem> {
    if !is_served(reference) {
        return Err(NodeClassProblem::NotFound(format!(
            "node class {}/{} {:?} is not an {KIND} of {AWS_GROUP}",
            reference.kind, reference.group, reference.name
        )));
    }
    let Some(class) = class else {
        return Err(NodeClassProblem::NotFound(format!("{KIND} {:?} not found", reference.name)));
    };
    if class.metadata.deletion_timestamp.is_some() {
        return Err(NodeClassProblem::NotReady(format!("{KIND} {:?} is being deleted", reference.name)));
    }
    let ready = class.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == ConditionStatus::True => Ok(()),
        Some(c) => Err(NodeClassProblem::NotReady(format!(
            "{KIND} {:?} is not ready: {}",
            reference.name, c.message
        ))),
        None => {
            Err(NodeClassProblem::NotReady(format!("{KIND} {:?} has not been resolved yet", reference.name)))
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn class(ready: Option<&str>) -> EC2NodeClass {
        let mut v = json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
            "spec": {"amiSelectorTerms": [{"alias": "al2023@latest"}], "role": "r",
                "subnetSelectorTerms": [{"tags": {"a": "b"}}], "securityGroupSelectorTerms": [{"tags": {"a": "b"}}]}});
        if let Some(status) = ready {
            v["status"] = json!({"conditions": [{"type": "Ready", "status": status, "reason": "x", "message": "no subnets",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn found_ready_or_why_not() {
        let r = NodeClassReference { group: AWS_GROUP.into(), kind: KIND.into(), name: "default".into() };
        assert_eq!(readiness(&r, Some(&class(Some("True")))), Ok(()));
        assert!(
            matches!(readiness(&r, Some(&class(Some("False")))), Err(NodeClassProblem::NotReady(m)) if m.contains("no subnets"))
        );
        assert!(matches!(readiness(&r, Some(&class(None))), Err(NodeClassProblem::NotReady(_))));
        assert!(matches!(readiness(&r, None), Err(NodeClassProblem::NotFound(_))));
        let other = NodeClassReference {
            group: "karpenter.kwok.sh".into(),
            kind: "KWOKNodeClass".into(),
            name: "default".into(),
        };
        assert!(matches!(readiness(&other, Some(&class(Some("True")))), Err(NodeClassProblem::NotFound(_))));
    }
}
