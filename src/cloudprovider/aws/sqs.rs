//! The interruption queue on SQS: found by name, read with long polling, messages deleted once
//! handled.

use std::time::Duration;

use aws_sdk_sqs::types::MessageSystemAttributeName;

use super::sdk_error;
use crate::cloudprovider::CloudProviderError;

/// Messages asked for per receive (SQS's maximum).
pub const MAX_MESSAGES: i32 = 10;
/// How long a receive waits for a message before answering empty (SQS's maximum).
pub const WAIT: Duration = Duration::from_secs(20);
/// How long a received message stays hidden from other receives; one not deleted by then (its
/// handling failed) is delivered again.
pub const VISIBILITY_TIMEOUT: Duration = Duration::from_secs(20);

/// A message as received.
#[derive(Clone, Debug)]
pub struct Received {
    /// SQS's id of the message.
    pub message_id: String,
    /// What deletes it.
    pub receipt_handle: String,
    /// Its body (an EventBridge event, for a well-formed message).
    pub body: String,
}

/// The queue.
#[derive(Clone, Debug)]
pub struct Queue {
    client: aws_sdk_sqs::Client,
    name: String,
    url: String,
}

impl Queue {
    /// The queue named `name` (or, when `name` is already a queue URL, that queue).
    pub async fn find(client: aws_sdk_sqs::Client, name: &str) -> Result<Self, CloudProviderError> {
        let url = if name.starts_with("https://") || name.starts_with("http://") {
            name.to_string()
        } else {
            client
                .get_queue_url()
                .queue_name(name)
                .send()
                .await
                .map_err(|e| sdk_error("GetQueueUrl", e))?
                .queue_url
                .ok_or_else(|| {
                    CloudProviderError::Config(format!("GetQueueUrl answered no URL for queue {name}"))
                })?
        };
        Ok(Queue { client, name: name.to_string(), url })
    }

    /// The name the queue was asked by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The queue's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Waits up to [`WAIT`] for up to [`MAX_MESSAGES`] messages. Messages without a receipt
    /// handle (which could never be deleted) are left out.
    pub async fn receive(&self) -> Result<Vec<Received>, CloudProviderError> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(MAX_MESSAGES)
            .visibility_timeout(VISIBILITY_TIMEOUT.as_secs() as i32)
            .wait_time_seconds(WAIT.as_secs() as i32)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .send()
            .await
            .map_err(|e| sdk_error("ReceiveMessage", e))?;
        Ok(out
            .messages
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| {
                Some(Received {
                    message_id: m.message_id.unwrap_or_default(),
                    receipt_handle: m.receipt_handle?,
                    body: m.body.unwrap_or_default(),
                })
            })
            .collect())
    }

    /// Deletes a received message.
    pub async fn delete(&self, message: &Received) -> Result<(), CloudProviderError> {
        self.client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(&message.receipt_handle)
            .send()
            .await
            .map_err(|e| sdk_error("DeleteMessage", e))?;
        Ok(())
    }
}
