//! The SQS event Lambda's event source mapping delivers for received messages: how the embedded
//! default and the emulator pump invoke the queue-fed handlers with events of the real shape.

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use cloud::{Queue, Received};

/// The event Lambda would deliver for these messages.
pub fn sqs_event(queue: &dyn Queue, received: &[Received]) -> SqsEvent {
    let records: Vec<serde_json::Value> = received
        .iter()
        .map(|m| {
            let mut attributes = serde_json::json!({
                "ApproximateReceiveCount": m.receive_count.to_string(),
                "SentTimestamp": m.sent_ms.to_string(),
            });
            if let Some(group) = &m.group_id {
                attributes["MessageGroupId"] = group.clone().into();
            }
            serde_json::json!({
                "messageId": m.message_id,
                "receiptHandle": m.receipt_handle,
                "body": m.body,
                "attributes": attributes,
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": format!("arn:aws:sqs:local:000000000000:{}", queue.name()),
                "awsRegion": "local",
            })
        })
        .collect();
    let records: Vec<SqsMessage> =
        records.into_iter().map(|r| serde_json::from_value(r).expect("the SQS message shape")).collect();
    let mut event = SqsEvent::default();
    event.records = records;
    event
}
