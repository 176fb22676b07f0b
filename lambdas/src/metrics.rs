//! The deployment's own metrics, as CloudWatch Embedded Metric Format (EMF) lines: a function
//! prints one JSON object per line on stdout, Lambda sends it to the function's log group, and
//! CloudWatch Logs turns it into metric values. No `cloudwatch:PutMetricData` is needed.
//!
//! `ledger-append` prints one [`ledgered_line`] per receipt it newly appends, so the dashboard's
//! jobs per minute and documents per second count each job once, however often its receipt is
//! delivered.

/// The CloudWatch namespace (the CDK app's dashboard reads the same one).
pub const NAMESPACE: &str = "EphemBatch";

/// One EMF line for one receipt newly in the ledger: `JobsLedgered` 1, `Documents` (records
/// embedded) and `DocumentsFailed` (records the enclave refused), without dimensions.
pub fn ledgered_line(timestamp_ms: u64, documents: u64, documents_failed: u64) -> String {
    let metric = |name: &str| serde_json::json!({ "Name": name, "Unit": "Count" });
    serde_json::json!({
        "_aws": {
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [[]],
                "Metrics": [metric("JobsLedgered"), metric("Documents"), metric("DocumentsFailed")],
            }],
        },
        "JobsLedgered": 1,
        "Documents": documents,
        "DocumentsFailed": documents_failed,
    })
    .to_string()
}

/// Prints [`ledgered_line`] on stdout (in a Lambda: into its log group).
pub fn emit_ledgered(timestamp_ms: u64, documents: u64, documents_failed: u64) {
    println!("{}", ledgered_line(timestamp_ms, documents, documents_failed));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledgered_receipt_is_one_emf_line() {
        let line = ledgered_line(1_761_955_200_000, 998, 2);
        assert!(!line.contains('\n'), "EMF needs the whole object on one line: {line}");
        let expected = r#"{
            "_aws": {
                "Timestamp": 1761955200000,
                "CloudWatchMetrics": [{
                    "Namespace": "EphemBatch",
                    "Dimensions": [[]],
                    "Metrics": [
                        {"Name": "JobsLedgered", "Unit": "Count"},
                        {"Name": "Documents", "Unit": "Count"},
                        {"Name": "DocumentsFailed", "Unit": "Count"}
                    ]
                }]
            },
            "JobsLedgered": 1,
            "Documents": 998,
            "DocumentsFailed": 2
        }"#;
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed, serde_json::from_str::<serde_json::Value>(expected).unwrap());
    }
}
