//! Controllers only the AWS provider has: the EC2NodeClass status, the refresh of instance
//! types, prices and launch templates, and interruption (the SQS queue and EC2 status checks).

pub mod interruption;
pub mod nodeclass;
pub mod refresh;
