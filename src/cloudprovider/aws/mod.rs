//! The AWS cloud provider: EC2 instances launched with CreateFleet from launch templates that
//! Karpenter manages, configured by `EC2NodeClass`es.

pub mod amifamily;
pub mod cache;
pub mod catalog;
pub mod embedded;
pub mod faults;
pub mod fleet;
pub mod instance;
pub mod instancetype;
pub mod launchtemplate;
pub mod nodeclass;
pub mod pricing;
pub mod provider;
pub mod userdata;

use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

pub use provider::{AwsClients, AwsCloudProvider, NodeClassStore, Options};

use super::CloudProviderError;

/// Converts an SDK error into [`CloudProviderError::Api`], keeping the error code.
pub(crate) fn sdk_error<E, R>(operation: &'static str, err: SdkError<E, R>) -> CloudProviderError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let code = err.code().unwrap_or_default().to_string();
    let message = match err.message() {
        Some(m) => m.to_string(),
        None => DisplayErrorContext(&err).to_string(),
    };
    CloudProviderError::Api { operation, code, message, source: Box::new(err) }
}
