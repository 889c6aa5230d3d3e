//! Controllers only the AWS provider has: the EC2NodeClass status, and the refresh of instance
//! types, prices and launch templates.

pub mod nodeclass;
pub mod refresh;
