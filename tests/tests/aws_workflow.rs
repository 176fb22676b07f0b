//! The Step Functions adapter (`cloud_aws::SfnWorkflow`) against the AWS emulator: executions
//! started and described, task tokens completed with SendTaskSuccess / SendTaskFailure, a
//! second completion reported as closed rather than failed, and the host's side of the
//! bulk-task hand-off over the emulator's S3 (every waiting run's slot listed and completed).
//!
//! What moto does and does not do here: its Step Functions execute states only after
//! `POST /moto-api/config {"stepfunctions":{"execute_state_machine":true}}` (this test sends
//! it), and a `.waitForTaskToken` task is tested on `sqs:sendMessage.waitForTaskToken`, which
//! moto executes — its Lambda tasks need Docker, which these machines lack, so the bulk
//! workflow's own definition is walked by `lambdas::asl_walk` instead. moto drops the `cause`
//! of SendTaskFailure (only `error` reaches the execution), answers a SendTaskSuccess on a
//! closed or timed-out token with `InvalidToken` (AWS also uses `TaskTimedOut`; both count as
//! closed), and accepts a SendTaskFailure on a token that already succeeded (AWS refuses it),
//! so the tests complete a closed token with SendTaskSuccess. The bulk workflow's own state
//! machine, as the CDK app's template creates it, is checked in `aws_stack.rs`.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use cloud_aws::{AwsClients, SfnWorkflow};
use cloud::workflow::{complete_bulk_task, complete_bulk_tasks, write_bulk_task, JobEnd};
use cloud::{Completion, ExecutionStatus, Executions, ObjectStore, Queue, TaskTokens, WorkflowError};
use protocol::envelope::JobId;
use serde_json::{json, Value};
use tests::aws::{clients, endpoint, fresh_stack, unique_prefix};

/// moto's switch that makes state machines run.
fn execute_state_machines(endpoint: &str) {
    let host = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let body = r#"{"stepfunctions":{"execute_state_machine":true}}"#;
    let mut stream = std::net::TcpStream::connect(host).expect("connect to the emulator");
    write!(
        stream,
        "POST /moto-api/config HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 20"), "moto-api config: {answer}");
}

/// A queue, and a state machine whose one task sends `{token, input}` to it and waits on the
/// token (a timeout is caught, so it ends SUCCEEDED with the error in its output).
fn waiting_machine(clients: &AwsClients, tag: &str, timeout_s: u32) -> (String, String) {
    let name = unique_prefix(tag);
    let queue = clients.runtime.block_on(clients.sqs.create_queue().queue_name(&name).send()).unwrap();
    let queue_url = queue.queue_url().unwrap().to_owned();
    let definition = json!({
        "StartAt": "Wait",
        "States": {
            "Wait": {
                "Type": "Task",
                "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
                "Parameters": {"QueueUrl": queue_url, "MessageBody": {"token.$": "$$.Task.Token", "input.$": "$"}},
                "TimeoutSeconds": timeout_s,
                "Catch": [{"ErrorEquals": ["States.Timeout"], "ResultPath": "$.error", "Next": "TimedOut"}],
                "End": true
            },
            "TimedOut": {"Type": "Pass", "End": true}
        }
    });
    let call = clients
        .sfn
        .create_state_machine()
        .name(&name)
        .definition(definition.to_string())
        .role_arn("arn:aws:iam::123456789012:role/ephem-test-workflow")
        .send();
    let machine = clients.runtime.block_on(call).unwrap();
    (machine.state_machine_arn().to_owned(), queue_url)
}

/// The token the waiting task sent for the execution whose input is `input`.
fn token_for(clients: &AwsClients, queue_url: &str, input: &Value) -> String {
    let queue = clients.queue(queue_url);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for message in queue.receive(10, Duration::from_secs(1), Duration::from_secs(30)).unwrap() {
            let body: Value = serde_json::from_str(&message.body).unwrap();
            if &body["input"] == input {
                queue.delete(&message.receipt_handle).unwrap();
                return body["token"].as_str().unwrap().to_owned();
            }
        }
        assert!(Instant::now() < deadline, "no task token for {input} on the queue");
    }
}

fn ended(workflow: &SfnWorkflow, execution: &str) -> cloud::Execution {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let described = workflow.describe(execution).unwrap();
        if described.status.is_done() {
            return described;
        }
        assert!(Instant::now() < deadline, "{execution} still running");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn aws_task_tokens_complete_waiting_executions() {
    let Some(endpoint) = endpoint() else { return };
    execute_state_machines(&endpoint);
    let clients = clients(&endpoint);
    let (machine, queue_url) = waiting_machine(&clients, "sfn", 300);
    let workflow = clients.step_functions(Some(&machine));

    // SendTaskSuccess: the execution succeeds with that output.
    let input = json!({"bulk_id": "b-ok", "prefix": "stores/x/"});
    let execution = workflow.start(&unique_prefix("ok"), &input.to_string()).unwrap();
    assert_eq!(workflow.describe(&execution).unwrap().status, ExecutionStatus::Running);
    let token = token_for(&clients, &queue_url, &input);
    let output = r#"{"job_id":"ab","receipt_key":"jobs/ab/receipt.cose"}"#;
    assert_eq!(workflow.succeed(&token, output).unwrap(), Completion::Completed);
    let done = ended(&workflow, &execution);
    assert_eq!(done.status, ExecutionStatus::Succeeded);
    assert_eq!(serde_json::from_str::<Value>(done.output.as_deref().unwrap()).unwrap(), serde_json::from_str::<Value>(output).unwrap());
    // A second completion (the other side of the hand-off) is told the task is closed. (moto
    // answers a SendTaskFailure on a succeeded token with success, so the second one here is a
    // SendTaskSuccess; AWS closes both.)
    assert!(matches!(workflow.succeed(&token, output).unwrap(), Completion::AlreadyClosed { .. }));

    // SendTaskFailure: the execution fails with that error.
    let input = json!({"bulk_id": "b-fail", "prefix": "stores/x/"});
    let execution = workflow.start(&unique_prefix("fail"), &input.to_string()).unwrap();
    let token = token_for(&clients, &queue_url, &input);
    assert_eq!(workflow.fail(&token, "EphemBatch.JobFailed", "stream: chunk 3").unwrap(), Completion::Completed);
    let done = ended(&workflow, &execution);
    assert_eq!((done.status, done.error.as_deref()), (ExecutionStatus::Failed, Some("EphemBatch.JobFailed")));
    // moto drops the cause; AWS keeps it.
    assert!(done.cause.as_deref().is_none_or(|c| c == "stream: chunk 3"), "{:?}", done.cause);

    assert!(matches!(workflow.succeed("not-a-token", "{}").unwrap(), Completion::AlreadyClosed { .. }));
    let missing = execution.rsplit_once(':').map(|(head, _)| format!("{head}:no-such-execution")).unwrap();
    assert!(matches!(workflow.describe(&missing), Err(WorkflowError::NotFound(_))), "{:?}", workflow.describe(&missing));
    let err = clients.step_functions(None).start("x", "{}").unwrap_err();
    assert!(matches!(err, WorkflowError::NotConfigured(_)), "{err}");
}

#[test]
fn aws_a_host_completes_the_token_a_bulk_run_left_under_the_job() {
    let Some(endpoint) = endpoint() else { return };
    execute_state_machines(&endpoint);
    let clients = clients(&endpoint);
    let outputs = fresh_stack(&clients, "sfh", 5);
    let jobs = clients.object_store(&outputs.values["JobsBucketName"], "");
    let (machine, queue_url) = waiting_machine(&clients, "sfh", 300);
    let workflow = clients.step_functions(Some(&machine));
    // A host's client: it has no state machine ARN, only tokens.
    let host = clients.step_functions(None);

    let job = JobId([0x5c; 16]);
    assert_eq!(complete_bulk_task(&jobs, &host, &job, &JobEnd::Committed).unwrap(), None, "no run waits: nothing to do");

    let input = json!({"bulk_id": "b-host"});
    let execution = workflow.start(&unique_prefix("host"), &input.to_string()).unwrap();
    let token = token_for(&clients, &queue_url, &input);
    write_bulk_task(&jobs, &job, "b-host", &token, cloud::now_ms()).unwrap();
    assert!(jobs.head(&cloud::layout::job_bulk_task(&job, "b-host")).unwrap().is_some());
    assert_eq!(complete_bulk_task(&jobs, &host, &job, &JobEnd::Committed).unwrap(), Some(Completion::Completed));
    let done = ended(&workflow, &execution);
    assert_eq!(done.status, ExecutionStatus::Succeeded);
    let output: Value = serde_json::from_str(done.output.as_deref().unwrap()).unwrap();
    assert_eq!(output, json!({"job_id": job.to_hex(), "receipt_key": cloud::layout::job_receipt(&job)}));
    // Again (a duplicate delivery): closed, not an error.
    assert!(matches!(complete_bulk_task(&jobs, &host, &job, &JobEnd::Committed).unwrap(), Some(Completion::AlreadyClosed { .. })));
}

/// Two bulk runs wait for the same job (each left its token in its own slot); the host that
/// ends the job lists the slots over the emulator's S3 and completes both executions.
#[test]
fn aws_a_jobs_end_completes_every_bulk_run_waiting_for_it() {
    let Some(endpoint) = endpoint() else { return };
    execute_state_machines(&endpoint);
    let clients = clients(&endpoint);
    let outputs = fresh_stack(&clients, "sf2", 5);
    let jobs = clients.object_store(&outputs.values["JobsBucketName"], "");
    let (machine, queue_url) = waiting_machine(&clients, "sf2", 300);
    let workflow = clients.step_functions(Some(&machine));
    let host = clients.step_functions(None);

    let job = JobId([0x2b; 16]);
    let executions: Vec<String> = ["b-first", "b-second"]
        .into_iter()
        .map(|bulk_id| {
            let input = json!({"bulk_id": bulk_id});
            let execution = workflow.start(&unique_prefix(bulk_id), &input.to_string()).unwrap();
            write_bulk_task(&jobs, &job, bulk_id, &token_for(&clients, &queue_url, &input), cloud::now_ms()).unwrap();
            execution
        })
        .collect();
    let done = complete_bulk_tasks(&jobs, &host, &job, &JobEnd::Committed).unwrap();
    let runs: Vec<(&str, &Completion)> = done.completed.iter().map(|(b, c)| (b.as_str(), c)).collect();
    assert_eq!(runs, [("b-first", &Completion::Completed), ("b-second", &Completion::Completed)]);
    for execution in &executions {
        assert_eq!(ended(&workflow, execution).status, ExecutionStatus::Succeeded, "{execution}");
    }
}

#[test]
fn aws_a_token_nobody_completes_times_out_and_a_late_completion_is_closed() {
    let Some(endpoint) = endpoint() else { return };
    execute_state_machines(&endpoint);
    let clients = clients(&endpoint);
    let (machine, queue_url) = waiting_machine(&clients, "sft", 2);
    let workflow = clients.step_functions(Some(&machine));
    let input = json!({"bulk_id": "b-late"});
    let execution = workflow.start(&unique_prefix("late"), &input.to_string()).unwrap();
    let token = token_for(&clients, &queue_url, &input);
    let done = ended(&workflow, &execution);
    assert_eq!(done.status, ExecutionStatus::Succeeded, "the timeout is caught");
    let output: Value = serde_json::from_str(done.output.as_deref().unwrap()).unwrap();
    assert_eq!(output["error"]["Error"], "States.Timeout");
    assert!(matches!(workflow.succeed(&token, "{}").unwrap(), Completion::AlreadyClosed { .. }));
}

/// A bulk run waits on a token for a job whose input `on-upload` then refuses: no host will
/// ever see that job, so the refusal completes the token with SendTaskFailure and the execution
/// ends at once instead of after the task's timeout.
#[test]
fn aws_a_refused_upload_fails_the_waiting_task_with_send_task_failure() {
    let Some(endpoint) = endpoint() else { return };
    execute_state_machines(&endpoint);
    let clients = clients(&endpoint);
    let outputs = fresh_stack(&clients, "sfr", 5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outputs.json");
    outputs.write(&path).unwrap();
    let settings = cloud_aws::AwsSettings::resolve_with(Some(&path), Some("aws"), |_| None).unwrap();
    let services = cloud_aws::AwsCloud::with_clients(clients.clone(), &settings, None).unwrap().services();
    let (machine, queue_url) = waiting_machine(&clients, "sfr", 300);
    let workflow = clients.step_functions(Some(&machine));

    let job = JobId([0x7e; 16]);
    let input = json!({"bulk_id": "b-refused"});
    let execution = workflow.start(&unique_prefix("refused"), &input.to_string()).unwrap();
    let token = token_for(&clients, &queue_url, &input);
    write_bulk_task(services.jobs.as_ref(), &job, "b-refused", &token, cloud::now_ms()).unwrap();

    // Not a sealed envelope at all: refused as `header`.
    let key = cloud::layout::job_input(&job);
    services.jobs.put(&key, b"not a sealed job", cloud::PutCondition::CreateOnly).unwrap();
    let event = lambdas::on_upload::object_created_event(&outputs.values["JobsBucketName"], &key, 16, "e");
    let outcomes = lambdas::on_upload::handle(&event, &services).unwrap();
    assert!(matches!(&outcomes[0], lambdas::on_upload::Outcome::Refused { check: "header", .. }), "{outcomes:?}");
    let done = ended(&workflow, &execution);
    assert_eq!((done.status, done.error.as_deref()), (ExecutionStatus::Failed, Some(cloud::workflow::JOB_FAILED_ERROR)));
    // moto drops the cause; AWS keeps it: the check's name first.
    assert!(done.cause.as_deref().is_none_or(|c| c.starts_with("header: ")), "{:?}", done.cause);
    // The event delivered again finds the token closed: no error.
    lambdas::on_upload::handle(&event, &services).unwrap();
}
