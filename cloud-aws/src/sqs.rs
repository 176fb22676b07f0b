//! [`SqsQueue`]: one SQS queue, standard or FIFO (its name ends in `.fifo`), as a [`Queue`].
//!
//! SQS does what the trait promises by itself — visibility timeouts, `ApproximateReceiveCount`,
//! the redrive policy that moves a message to the dead-letter queue after N receives, FIFO
//! groups and deduplication — so this adapter only translates. Limits are SQS's: at most 10
//! messages per receive, a long poll of at most 20 s, visibility of at most 12 h (longer
//! requests are clamped, not refused).
//!
//! [`SqsQueue::delete_batch`] deletes up to ten messages a request.
//! [`SqsQueue::receive_lambda_batch`] receives the way Lambda's SQS event source does and
//! returns the event Lambda would deliver, so tests and the emulator pump call the real
//! handlers with real payloads.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName, QueueAttributeName};
use serde_json::{json, Value};

use super::error::Failure;
use super::runtime::AwsRuntime;
use cloud::queue::{Queue, QueueError, QueueStats, Received, SendOptions};

pub const MAX_RECEIVE_BATCH: usize = 10;
pub const MAX_WAIT: Duration = Duration::from_secs(20);
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// One queue by URL. Cheap to clone.
#[derive(Clone)]
pub struct SqsQueue {
    client: aws_sdk_sqs::Client,
    runtime: AwsRuntime,
    url: String,
    name: String,
    fifo: bool,
    arn: std::sync::Arc<OnceLock<String>>,
}

impl std::fmt::Debug for SqsQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsQueue").field("url", &self.url).finish()
    }
}

/// A batch as Lambda's SQS event source would deliver it.
#[derive(Debug, Clone)]
pub struct LambdaBatch {
    /// `{"Records": [...]}`, the shape of `aws_lambda_events::sqs::SqsEvent`.
    pub event: Value,
    /// The same messages, for deleting or releasing them afterwards.
    pub messages: Vec<Received>,
}

impl SqsQueue {
    pub fn new(client: aws_sdk_sqs::Client, runtime: AwsRuntime, url: &str) -> SqsQueue {
        let name = url.trim_end_matches('/').rsplit('/').next().unwrap_or(url).to_owned();
        let fifo = name.ends_with(".fifo");
        SqsQueue { client, runtime, url: url.to_owned(), name, fifo, arn: Default::default() }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn is_fifo(&self) -> bool {
        self.fifo
    }

    fn error<E>(&self, op: &str, error: SdkError<E, HttpResponse>) -> QueueError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let failure = Failure::of(&error);
        let message = format!("SQS {op} {}: {}", self.name, failure.message);
        let code = failure.code.as_str();
        if code == "AWS.SimpleQueueService.NonExistentQueue" || code == "QueueDoesNotExist" {
            return QueueError::NoSuchQueue { queue: self.name.clone() };
        }
        if code.contains("AccessDenied") || failure.status_is(403) {
            return QueueError::AccessDenied { queue: self.name.clone(), message };
        }
        let handle_op = op == "DeleteMessage" || op == "ChangeMessageVisibility";
        if handle_op
            && (code == "ReceiptHandleIsInvalid"
                || code == "AWS.SimpleQueueService.MessageNotInflight"
                || code == "MessageNotInflight"
                || code == "InvalidParameterValue")
        {
            return QueueError::InvalidReceiptHandle(message);
        }
        if failure.transient {
            return QueueError::Unavailable(message);
        }
        if op == "SendMessage" {
            return QueueError::InvalidMessage(message);
        }
        QueueError::Unavailable(message)
    }

    /// The queue's ARN (asked once).
    pub fn arn(&self) -> Result<String, QueueError> {
        if let Some(arn) = self.arn.get() {
            return Ok(arn.clone());
        }
        let attributes = self.attributes(&[QueueAttributeName::QueueArn])?;
        let arn = attributes.get(&QueueAttributeName::QueueArn).cloned().ok_or_else(|| {
            QueueError::Unavailable(format!("SQS GetQueueAttributes {}: no QueueArn in the answer", self.name))
        })?;
        Ok(self.arn.get_or_init(|| arn).clone())
    }

    /// The redrive policy's `maxReceiveCount`, if the queue has a dead-letter queue.
    pub fn max_receives(&self) -> Result<Option<u32>, QueueError> {
        let attributes = self.attributes(&[QueueAttributeName::RedrivePolicy])?;
        let Some(policy) = attributes.get(&QueueAttributeName::RedrivePolicy) else { return Ok(None) };
        let policy: Value = serde_json::from_str(policy)
            .map_err(|e| QueueError::Unavailable(format!("SQS queue {}: RedrivePolicy is not JSON: {e}", self.name)))?;
        // SQS writes the number as a number; some tools write it as a string.
        Ok(match &policy["maxReceiveCount"] {
            Value::Number(n) => n.as_u64().map(|n| n as u32),
            Value::String(s) => s.parse().ok(),
            _ => None,
        })
    }

    /// `GetQueueAttributes` for these names.
    pub fn attributes(&self, names: &[QueueAttributeName]) -> Result<HashMap<QueueAttributeName, String>, QueueError> {
        let request = self.client.get_queue_attributes().queue_url(&self.url).set_attribute_names(Some(names.to_vec()));
        let output = self.runtime.block_on(request.send()).map_err(|e| self.error("GetQueueAttributes", e))?;
        Ok(output.attributes.unwrap_or_default())
    }

    fn receive_messages(
        &self,
        max: usize,
        wait: Duration,
        visibility: Duration,
        attributes: Vec<MessageSystemAttributeName>,
    ) -> Result<Vec<Message>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let request = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max.min(MAX_RECEIVE_BATCH) as i32)
            .wait_time_seconds(wait.min(MAX_WAIT).as_secs() as i32)
            .visibility_timeout(whole_seconds(visibility.min(MAX_VISIBILITY)))
            .set_message_system_attribute_names(Some(attributes))
            .message_attribute_names("All");
        let output = self.runtime.block_on(request.send()).map_err(|e| self.error("ReceiveMessage", e))?;
        Ok(output.messages.unwrap_or_default())
    }

    /// `DeleteMessageBatch`, ten handles per request; returns the handles SQS did not delete,
    /// each with SQS's reason.
    pub fn delete_batch(&self, receipt_handles: &[String]) -> Result<Vec<(String, String)>, QueueError> {
        let mut failed = Vec::new();
        for chunk in receipt_handles.chunks(MAX_RECEIVE_BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, handle)| DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(handle).build())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| QueueError::InvalidReceiptHandle(format!("SQS DeleteMessageBatch {}: {e}", self.name)))?;
            let request = self.client.delete_message_batch().queue_url(&self.url).set_entries(Some(entries));
            let output = self.runtime.block_on(request.send()).map_err(|e| self.error("DeleteMessageBatch", e))?;
            for entry in output.failed {
                let handle = entry.id.parse::<usize>().ok().and_then(|i| chunk.get(i)).cloned().unwrap_or(entry.id);
                failed.push((handle, format!("{}: {}", entry.code, entry.message.unwrap_or_default())));
            }
        }
        Ok(failed)
    }

    /// Receives like Lambda's event source and builds the event it would deliver.
    pub fn receive_lambda_batch(&self, max: usize, wait: Duration, visibility: Duration) -> Result<LambdaBatch, QueueError> {
        let arn = self.arn()?;
        let region = arn.split(':').nth(3).unwrap_or_default().to_owned();
        let messages = self.receive_messages(max, wait, visibility, vec![MessageSystemAttributeName::All])?;
        let records: Vec<Value> = messages.iter().map(|m| lambda_record(m, &arn, &region)).collect();
        let received = messages.iter().map(received).collect();
        Ok(LambdaBatch { event: json!({ "Records": records }), messages: received })
    }
}

/// SQS takes whole seconds; a partial second rounds up, so a message is never hidden for less
/// than asked.
fn whole_seconds(duration: Duration) -> i32 {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    seconds.min(i32::MAX as u64) as i32
}

fn system_attribute(message: &Message, name: MessageSystemAttributeName) -> Option<&str> {
    message.attributes.as_ref()?.get(&name).map(String::as_str)
}

fn received(message: &Message) -> Received {
    let number = |name| system_attribute(message, name).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Received {
        message_id: message.message_id.clone().unwrap_or_default(),
        receipt_handle: message.receipt_handle.clone().unwrap_or_default(),
        body: message.body.clone().unwrap_or_default(),
        receive_count: number(MessageSystemAttributeName::ApproximateReceiveCount).min(u32::MAX as u64) as u32,
        sent_ms: number(MessageSystemAttributeName::SentTimestamp),
        group_id: system_attribute(message, MessageSystemAttributeName::MessageGroupId).map(str::to_owned),
        deduplication_id: system_attribute(message, MessageSystemAttributeName::MessageDeduplicationId).map(str::to_owned),
    }
}

/// One record of Lambda's SQS event (the field names and shapes Lambda uses).
fn lambda_record(message: &Message, arn: &str, region: &str) -> Value {
    let attributes: serde_json::Map<String, Value> = message
        .attributes
        .iter()
        .flatten()
        .map(|(name, value)| (name.as_str().to_owned(), Value::String(value.clone())))
        .collect();
    let message_attributes: serde_json::Map<String, Value> = message
        .message_attributes
        .iter()
        .flatten()
        .map(|(name, value)| {
            let binary = value.binary_value.as_ref().map(|b| {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD.encode(b.as_ref())
            });
            let attribute = json!({
                "stringValue": value.string_value,
                "binaryValue": binary,
                "stringListValues": [],
                "binaryListValues": [],
                "dataType": value.data_type,
            });
            (name.clone(), attribute)
        })
        .collect();
    json!({
        "messageId": message.message_id,
        "receiptHandle": message.receipt_handle,
        "body": message.body,
        "attributes": attributes,
        "messageAttributes": message_attributes,
        "md5OfBody": message.md5_of_body,
        "eventSource": "aws:sqs",
        "eventSourceARN": arn,
        "awsRegion": region,
    })
}

impl Queue for SqsQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn send(&self, body: &str, options: &SendOptions) -> Result<String, QueueError> {
        let mut request = self
            .client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .set_message_group_id(options.group_id.clone())
            .set_message_deduplication_id(options.deduplication_id.clone());
        if !options.delay.is_zero() {
            request = request.delay_seconds(whole_seconds(options.delay));
        }
        let output = self.runtime.block_on(request.send()).map_err(|e| self.error("SendMessage", e))?;
        Ok(output.message_id.unwrap_or_default())
    }

    fn receive(&self, max: usize, wait: Duration, visibility: Duration) -> Result<Vec<Received>, QueueError> {
        let attributes = vec![
            MessageSystemAttributeName::ApproximateReceiveCount,
            MessageSystemAttributeName::SentTimestamp,
            MessageSystemAttributeName::MessageGroupId,
            MessageSystemAttributeName::MessageDeduplicationId,
        ];
        Ok(self.receive_messages(max, wait, visibility, attributes)?.iter().map(received).collect())
    }

    fn change_visibility(&self, receipt_handle: &str, visibility: Duration) -> Result<(), QueueError> {
        let request = self
            .client
            .change_message_visibility()
            .queue_url(&self.url)
            .receipt_handle(receipt_handle)
            .visibility_timeout(whole_seconds(visibility.min(MAX_VISIBILITY)));
        self.runtime.block_on(request.send()).map_err(|e| self.error("ChangeMessageVisibility", e))?;
        Ok(())
    }

    fn delete(&self, receipt_handle: &str) -> Result<(), QueueError> {
        let request = self.client.delete_message().queue_url(&self.url).receipt_handle(receipt_handle);
        self.runtime.block_on(request.send()).map_err(|e| self.error("DeleteMessage", e))?;
        Ok(())
    }

    fn stats(&self) -> Result<QueueStats, QueueError> {
        let attributes = self.attributes(&[
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            QueueAttributeName::ApproximateNumberOfMessagesDelayed,
        ])?;
        let count = |name: QueueAttributeName| attributes.get(&name).and_then(|v| v.parse().ok()).unwrap_or(0);
        Ok(QueueStats {
            visible: count(QueueAttributeName::ApproximateNumberOfMessages),
            in_flight: count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
            delayed: count(QueueAttributeName::ApproximateNumberOfMessagesDelayed),
        })
    }
}
