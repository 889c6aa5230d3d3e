//! Controllers only the AWS provider has: the EC2NodeClass status, the refresh of instance
//! types, prices and launch templates, interruption (the SQS queue and EC2 status checks), and
//! the instance-type metrics.

pub mod interruption;
pub mod metrics;
pub mod nodeclass;
pub mod refresh;
