//! A message queue with SQS's semantics: at-least-once delivery, a visibility timeout during
//! which a received message is hidden from other consumers, `ChangeMessageVisibility` to extend
//! (or end) it, a receive count, a dead-letter queue after N receives, and for FIFO queues a
//! message group (in-order, one message of a group in flight at a time) and a deduplication id.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("queue {queue} does not exist")]
    NoSuchQueue { queue: String },
    /// The receipt handle is unknown or expired (the message was re-delivered or deleted).
    #[error("receipt handle is no longer valid: {0}")]
    InvalidReceiptHandle(String),
    #[error("message refused: {0}")]
    InvalidMessage(String),
    #[error("access to queue {queue} denied: {message}")]
    AccessDenied { queue: String, message: String },
    #[error("queue unavailable: {0}")]
    Unavailable(String),
}

impl QueueError {
    pub fn is_transient(&self) -> bool {
        matches!(self, QueueError::Unavailable(_))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendOptions {
    /// FIFO queues: the message group (required there). Standard queues: the tenant, for SQS
    /// fair queues (one tenant's backlog does not delay the others' messages).
    pub group_id: Option<String>,
    /// FIFO queues: a second send with the same id within five minutes is accepted but dropped.
    pub deduplication_id: Option<String>,
    /// Standard queues: hidden for this long after sending.
    pub delay: Duration,
}

/// A message as received: the handle is what `delete` and `change_visibility` take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub message_id: String,
    pub receipt_handle: String,
    pub body: String,
    /// How many times the message has been received, this time included (SQS
    /// `ApproximateReceiveCount`).
    pub receive_count: u32,
    pub sent_ms: u64,
    /// The message's group (FIFO queues; fair standard queues), if it has one.
    pub group_id: Option<String>,
    /// FIFO queues, where the queue reports it (SQS; a FIFO dead-letter queue reports the
    /// original message id here, not the sender's id).
    pub deduplication_id: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Messages available now.
    pub visible: u64,
    /// Received and not yet deleted or timed out.
    pub in_flight: u64,
    /// Sent with a delay that has not passed.
    pub delayed: u64,
}

pub trait Queue: Send + Sync {
    /// The queue's name (for messages and logs).
    fn name(&self) -> &str;
    /// Sends one message; returns its id (for a deduplicated FIFO send, the first message's id).
    fn send(&self, body: &str, options: &SendOptions) -> Result<String, QueueError>;
    /// Receives up to `max` messages, waiting up to `wait` for the first (long polling); each is
    /// hidden for `visibility`. A message past its queue's receive limit goes to the dead-letter
    /// queue instead of being returned.
    fn receive(&self, max: usize, wait: Duration, visibility: Duration) -> Result<Vec<Received>, QueueError>;
    /// Makes a received message visible again after `visibility` from now (zero: at once).
    fn change_visibility(&self, receipt_handle: &str, visibility: Duration) -> Result<(), QueueError>;
    fn delete(&self, receipt_handle: &str) -> Result<(), QueueError>;
    fn stats(&self) -> Result<QueueStats, QueueError>;
}
