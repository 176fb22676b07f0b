//! The operator against the fleet key (docs/protocol.md §7.3.1), end to end on the local stack.
//!
//! A tenant holds the image publisher's key and its signed policy, nothing else: no key ARN, no
//! stack outputs. The operator owns everything else — the stores, the hosts, the KMS account —
//! and here makes a key of its own that it may `Encrypt` under, wraps a P-256 key it generated,
//! writes the epoch record beside a genesis copied from the genuine epoch, and lets its host hand
//! the record to the genuine worker, which releases the key through real (local) KMS and
//! publishes a genuine document binding it. Every client refuses to seal to it, by name — also
//! when the operator's "stack outputs" name its own key.

use std::time::Duration;

use cloud::{layout, ObjectStore, PutCondition};
use p256::pkcs8::EncodePrivateKey;
use protocol::attestation::{AttestationDocument, UserDataBinding};
use protocol::fleet::{encryption_context, epoch_object_key, genesis_object_key, EpochRecord};
use tests::{json, short_corpus, wait_until, Serve, Stack};

/// The epoch every published document binds now.
fn published_epochs(store: &dyn ObjectStore) -> Vec<u64> {
    store
        .list(layout::ATTESTATIONS_CURRENT_PREFIX)
        .unwrap()
        .iter()
        .filter_map(|meta| {
            let document = AttestationDocument::parse_unverified(&store.get(&meta.key).ok()?).ok()?;
            UserDataBinding::decode(document.user_data.as_deref()?).ok().map(|b| b.epoch)
        })
        .collect()
}

#[test]
fn an_operator_key_released_by_the_genuine_worker_is_refused_by_every_client() {
    let stack = Stack::up_with(&[("EPHEM_RESCAN_S", std::ffi::OsStr::new("1"))]);
    let work = tempfile::tempdir().unwrap();
    let corpus = work.path().join("corpus.jsonl");
    short_corpus(&corpus, "genesis", 4);
    // The tenant's only trust inputs: the signed policy and the publisher's key.
    let policy = stack.home().join("dev/policy.json");
    let publisher = std::fs::read_to_string(stack.home().join("dev/image-publisher.pub")).unwrap();
    let trust = ["--policy", policy.to_str().unwrap(), "--publisher-key", publisher.trim()];
    let submit = |extra: &[&str]| {
        let mut args = vec!["submit", corpus.to_str().unwrap(), "--json"];
        args.extend_from_slice(&trust);
        args.extend_from_slice(extra);
        stack.cli(&args)
    };

    // Honest: the epoch the worker created carries its genesis; submit, verify and an online
    // query pass on the policy and the publisher key alone.
    let mut args = vec!["submit", corpus.to_str().unwrap(), "--wait", "--json", "-o"];
    let out_file = work.path().join("out.jsonl");
    args.push(out_file.to_str().unwrap());
    args.extend_from_slice(&trust);
    let report = json(&stack.ok(&args));
    let job = report["job_id"].as_str().unwrap().to_owned();
    let mut verify = vec!["verify", job.as_str(), "--json"];
    verify.extend_from_slice(&trust);
    let verification = json(&stack.ok(&verify));
    assert!(verification["checks"].as_array().unwrap().iter().all(|c| c["passed"] == true), "{verification}");
    {
        let serve = Serve::start(&stack, &trust);
        let (status, answer) = serve.embeddings(&serde_json::json!({"model": "sentence-transformers/all-MiniLM-L6-v2", "input": ["a query"]}));
        assert_eq!(status, 200, "{answer}");
    }

    // The operator: its own key, a P-256 key it knows wrapped under it, a record for the next
    // epoch, and the genuine genesis copied beside it (the host offers only epochs with one).
    let local = cloud_local::LocalCloud::open(stack.home()).unwrap();
    let services = local.services();
    let kms = local.kms();
    let operator_key = kms.create_key(cloud_local::LocalKeyPolicy::unrestricted(), "the operator's").unwrap();
    let genuine = lambdas::fleet_epochs::epochs(&services).unwrap().last().cloned().expect("the worker created an epoch");
    let epoch = genuine.epoch + 1;
    let not_after_ms = cloud::now_ms() + 7 * 24 * 3600 * 1000;
    let secret = p256::SecretKey::from_slice(&[0x42; 32]).unwrap();
    let pkcs8 = secret.to_pkcs8_der().unwrap();
    let wrapped = cloud::Kms::encrypt(&*kms, &operator_key, pkcs8.as_bytes(), &encryption_context(epoch, not_after_ms)).unwrap();
    let point = p256::elliptic_curve::sec1::ToSec1Point::to_sec1_point(&secret.public_key(), false);
    let record = EpochRecord {
        epoch,
        not_after_ms,
        kms_key_id: operator_key.clone(),
        public_key: hex::encode(point.as_bytes()),
        wrapped_private_key: hex::encode(&wrapped),
    };
    let store = &services.attestations;
    store.put(&epoch_object_key(epoch), record.to_json().as_bytes(), PutCondition::CreateOnly).unwrap();
    let copied = store.get(&genesis_object_key(genuine.epoch)).unwrap();
    store.put(&genesis_object_key(epoch), &copied, PutCondition::CreateOnly).unwrap();
    wait_until("the genuine worker to publish the operator's epoch", Duration::from_secs(90), || {
        published_epochs(store.as_ref()).contains(&epoch)
    });

    // submit: refused. Where the outputs name the genuine key the binding's KMS key differs
    // (`fleet_kms_key`); where the operator's outputs name its own key, only the genesis stops it.
    for (extra, check) in [(&[][..], "fleet_kms_key"), (&["--fleet-key-arn", operator_key.as_str()][..], "fleet_key_genesis")] {
        let out = submit(extra);
        assert!(!out.status.success(), "submit sealed to the operator's key ({extra:?}):\n{}", stack.describe(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(check), "{extra:?}: {stderr}");
    }
    // serve: no request leaves for the operator's key.
    let mut serve_args = trust.to_vec();
    serve_args.extend_from_slice(&["--fleet-key-arn", operator_key.as_str()]);
    let serve = Serve::start(&stack, &serve_args);
    let (status, answer) = serve.embeddings(&serde_json::json!({"model": "sentence-transformers/all-MiniLM-L6-v2", "input": ["a secret query"]}));
    assert_ne!(status, 200, "{answer}");
    assert!(answer.to_string().contains("fleet_key_genesis"), "{answer}");
}
