//! Generation of the CustomResourceDefinitions from the Rust types.
//!
//! The YAML under `crds/` (and in the Helm charts) is the output of [`render_all`]; a test fails
//! when the committed files and the types disagree.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use super::{CapacityBuffer, EC2NodeClass, NodeClaim, NodeOverlay, NodePool};

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
    /// The API server refused a CRD.
    #[error("applying CRD {name}")]
    Apply {
        /// CRD name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A CRD was not Established in time.
    #[error("CRD {name} not established within {timeout:?}")]
    NotEstablished {
        /// CRD name.
        name: String,
        /// How long it was given.
        timeout: std::time::Duration,
    },
}

/// Applies every CRD (server-side apply, as field manager `manager`) and waits until each is
/// Established, at most `timeout` each.
pub async fn install(
    client: &kube::Client,
    manager: &str,
    timeout: std::time::Duration,
) -> Result<(), CrdError> {
    use kube::api::{Api, Patch, PatchParams};
    use kube::runtime::wait::{await_condition, conditions};
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(manager).force();
    for crd in all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .map_err(|source| CrdError::Apply { name: name.clone(), source })?;
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        match tokio::time::timeout(timeout, established).await {
            Ok(Ok(_)) => {}
            _ => return Err(CrdError::NotEstablished { name, timeout }),
        }
    }
    Ok(())
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
    [NodePool::crd(), NodeClaim::crd(), EC2NodeClass::crd(), NodeOverlay::crd(), CapacityBuffer::crd()]
        .into_iter()
        .map(with_object_fields)
        .collect()
}

/// `crd` with the fields every object has (`apiVersion`, `kind`, `metadata`) in its schemas, as
/// upstream's CRDs list them.
fn with_object_fields(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
    let field = |type_: &str, description: &str| JSONSchemaProps {
        type_: Some(type_.to_string()),
        description: Some(description.to_string()),
        ..JSONSchemaProps::default()
    };
    for version in &mut crd.spec.versions {
        let Some(schema) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) else {
            continue;
        };
        let properties = schema.properties.get_or_insert_with(Default::default);
        properties
            .entry("apiVersion".into())
            .or_insert_with(|| field("string", "The versioned schema of this representation of an object."));
        properties
            .entry("kind".into())
            .or_insert_with(|| field("string", "The REST resource this object represents."));
        // The API server takes nothing but the type for metadata.
        properties.entry("metadata".into()).or_insert_with(|| JSONSchemaProps {
            type_: Some("object".to_string()),
            ..JSONSchemaProps::default()
        });
    }
    crd
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
