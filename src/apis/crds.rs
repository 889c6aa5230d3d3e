//! Generation of the CustomResourceDefinitions from the Rust types.
//!
//! The YAML under `crds/` (and in the Helm charts) is the output of [`render_all`]; a test fails
//! when the committed files and the types disagree.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use super::{EC2NodeClass, NodeClaim, NodePool};

/// Errors while rendering CRDs.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The CRD could not be serialized to YAML.
    #[error("failed to render CRD {name} as YAML")]
    Render {
        /// CRD name.
        name: String,
        /// The serializer's error.
        #[source]
        source: serde_saphyr::SerializeError,
    },
}

/// A rendered CRD: the file name it is published under and its YAML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedCrd {
    /// File name, as upstream names it (`<group>_<plural>.yaml`).
    pub file_name: String,
    /// The YAML document.
    pub yaml: String,
}

/// The CRDs of every kind this project serves, in a stable order.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![NodePool::crd(), NodeClaim::crd(), EC2NodeClass::crd()]
}

/// Renders every CRD as YAML with its file name.
pub fn render_all() -> Result<Vec<RenderedCrd>, CrdError> {
    all().into_iter().map(render).collect()
}

fn render(crd: CustomResourceDefinition) -> Result<RenderedCrd, CrdError> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let file_name = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
    let body = serde_saphyr::to_string(&crd).map_err(|source| CrdError::Render { name, source })?;
    Ok(RenderedCrd { file_name, yaml: format!("---\n{body}") })
}
