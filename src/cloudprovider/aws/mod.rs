//! The AWS cloud provider: EC2 instances launched with CreateFleet from launch templates that
//! Karpenter manages, configured by `EC2NodeClass`es.

pub mod amifamily;
pub mod cache;
pub mod catalog;
pub mod controllers;
pub mod embedded;
pub mod faults;
pub mod fleet;
pub mod instance;
pub mod instancestatus;
pub mod instancetype;
pub mod interruption;
mod launch;
pub mod launchtemplate;
pub mod nodeclass;
pub mod nodecost;
pub mod pricing;
pub mod provider;
pub mod reservations;
pub mod sqs;
pub mod unavailable;
pub mod userdata;
pub mod validation;

use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

pub use provider::{AwsClients, AwsCloudProvider, NodeClassStore, Options};

use super::CloudProviderError;

/// The SDK configuration loader every AWS client of the project starts from: the default
/// credential chain, region and endpoint resolution, and an HTTPS client on rustls with ring, the
/// same TLS stack as the Kubernetes client (so only one crypto library is linked).
pub fn config_loader() -> aws_config::ConfigLoader {
    aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(https_client())
}

/// The HTTPS client of every AWS client of the project (see [`config_loader`]).
pub fn https_client() -> aws_sdk_ec2::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https()
}

/// An EC2 client configuration with the SDK's retries off, for calls sent once: a CreateFleet
/// whose answer may be lost after EC2 acted, and the validation's dry runs (asked again by the
/// EC2NodeClass controller).
pub(crate) fn no_retries() -> aws_sdk_ec2::config::Builder {
    aws_sdk_ec2::config::Builder::default().retry_config(aws_sdk_ec2::config::retry::RetryConfig::disabled())
}

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
