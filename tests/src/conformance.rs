//! The semantics every backend of the cloud traits must have, written once: the AWS adapters
//! (against an emulator) and the local stand-ins run the same functions
//! (`tests/tests/aws_conformance.rs`). Each function takes fresh, empty resources.
//!
//! Timing is SQS's: visibility in whole seconds, and a standard queue may return fewer
//! messages than are available, so receives loop until they have what they expect.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cloud::kms::EncryptionContext;
use cloud::{Kms, KmsError, ObjectError, ObjectStore, PutCondition, Queue, QueueError, Received, SendOptions};
use sha2::{Digest, Sha256};

// --- object stores ----------------------------------------------------------------------------

pub fn objects_put_get_head_list_delete(s: &dyn ObjectStore) {
    let meta = s.put("jobs/a/input.sealed", b"hello", PutCondition::Overwrite).unwrap();
    assert_eq!((meta.key.as_str(), meta.size), ("jobs/a/input.sealed", 5));
    assert!(!meta.etag.is_empty());
    assert_eq!(s.get("jobs/a/input.sealed").unwrap(), b"hello");
    let head = s.head("jobs/a/input.sealed").unwrap().expect("head of a written object");
    assert_eq!((head.size, head.etag.as_str()), (5, meta.etag.as_str()));
    assert!(head.modified_ms + 60_000 > cloud::now_ms(), "modified {} is not recent", head.modified_ms);
    assert_eq!(s.head("jobs/a/nothing").unwrap(), None);
    assert!(matches!(s.get("jobs/b/x"), Err(ObjectError::NotFound { .. })));
    let mut text = String::new();
    s.reader("jobs/a/input.sealed").unwrap().read_to_string(&mut text).unwrap();
    assert_eq!(text, "hello");
    assert!(matches!(s.reader("jobs/nope").map(drop), Err(ObjectError::NotFound { .. })));

    s.put("jobs/b/x", b"1", PutCondition::Overwrite).unwrap();
    s.put("jobs/a/attempts/1/output.sealed", b"22", PutCondition::Overwrite).unwrap();
    s.put("jobsx", b"3", PutCondition::Overwrite).unwrap();
    let keys = |p: &str| s.list(p).unwrap().into_iter().map(|m| m.key).collect::<Vec<_>>();
    assert_eq!(keys(""), ["jobs/a/attempts/1/output.sealed", "jobs/a/input.sealed", "jobs/b/x", "jobsx"]);
    assert_eq!(keys("jobs/a/"), ["jobs/a/attempts/1/output.sealed", "jobs/a/input.sealed"]);
    assert_eq!(keys("jobs/a/in"), ["jobs/a/input.sealed"]);
    assert!(keys("nope/").is_empty());
    let listed = s.list("jobs/b/").unwrap();
    assert_eq!((listed[0].size, listed[0].etag.is_empty()), (1, false));

    s.delete("jobs/a/attempts/1/output.sealed").unwrap();
    s.delete("jobs/a/attempts/1/output.sealed").unwrap(); // missing: fine, as in S3
    s.delete("never/was").unwrap();
    assert_eq!(keys("jobs/a/"), ["jobs/a/input.sealed"]);
    assert!(matches!(s.put("", b"x", PutCondition::Overwrite), Err(ObjectError::InvalidKey { .. })));
}

/// More than one listing page (S3 pages at 1000 keys).
pub fn objects_list_pages(s: &dyn ObjectStore, count: usize) {
    for i in 0..count {
        s.put(&format!("many/{i:05}"), b"", PutCondition::Overwrite).unwrap();
    }
    let listed = s.list("many/").unwrap();
    assert_eq!(listed.len(), count);
    assert!(listed.windows(2).all(|w| w[0].key < w[1].key), "in key order");
}

/// `list_page` (S3 `StartAfter` + `MaxKeys`): a bounded pass from a point, in key order, only
/// under the prefix; fewer than asked means the end.
pub fn objects_list_page(s: &dyn ObjectStore) {
    for key in ["r/a", "r/b/1", "r/b/2", "r/c", "rx", "s/a"] {
        s.put(key, b"x", PutCondition::CreateOnly).unwrap();
    }
    let keys = |after: Option<&str>, max: usize| -> Vec<String> {
        s.list_page("r/", after, max).unwrap().into_iter().map(|m| m.key).collect()
    };
    assert_eq!(keys(None, 2), ["r/a", "r/b/1"]);
    assert_eq!(keys(Some("r/b/1"), 2), ["r/b/2", "r/c"]);
    assert_eq!(keys(Some("r/b"), 10), ["r/b/1", "r/b/2", "r/c"], "a point between keys");
    assert_eq!(keys(Some("r/c"), 10), Vec::<String>::new(), "the end");
    assert_eq!(keys(Some("a"), 1), ["r/a"], "a point before the prefix");
    assert_eq!(keys(None, 0), Vec::<String>::new());
    let page = s.list_page("r/b/", None, 10).unwrap();
    assert_eq!((page.len(), page[0].size, page[0].etag.is_empty()), (2, 1, false));
}

/// `list_page` across S3's 1,000-key pages: a pass that starts inside one page and continues
/// into the next (after [`objects_list_pages`] wrote `count` keys under `many/`).
pub fn objects_list_page_across_pages(s: &dyn ObjectStore, count: usize) {
    let start = count / 4;
    let after = format!("many/{start:05}");
    let page = s.list_page("many/", Some(&after), 1000).unwrap();
    let expected: Vec<String> = (start + 1..count).take(1000).map(|i| format!("many/{i:05}")).collect();
    assert_eq!(page.into_iter().map(|m| m.key).collect::<Vec<_>>(), expected);
    let tail = s.list_page("many/", Some(&format!("many/{:05}", count - 3)), 1000).unwrap();
    assert_eq!(tail.len(), 2, "fewer than asked: the end");
}

/// A server-side copy of `len` bytes (S3: `CopyObject`, or `UploadPartCopy` parts when the store
/// is set to copy that size in parts): the bytes of the version the caller checked, create-only
/// at the destination; a source swapped between the check and the copy is refused (If-Match)
/// and nothing appears at the destination.
pub fn objects_copy(s: &dyn ObjectStore, len: usize) {
    let data = pattern(len);
    let digest = |bytes: &[u8]| Sha256::digest(bytes).to_vec();
    let mut w = s.writer("stores/acme/shard.sealed", PutCondition::CreateOnly).unwrap();
    w.write_all(&data).unwrap();
    w.commit().unwrap();
    let checked = s.head("stores/acme/shard.sealed").unwrap().expect("the shard");

    let copied = s.copy("stores/acme/shard.sealed", "jobs/j/input.sealed", Some(&checked.etag), PutCondition::CreateOnly).unwrap();
    assert_eq!((copied.key.as_str(), copied.size), ("jobs/j/input.sealed", len as u64));
    assert!(!copied.etag.is_empty());
    assert_eq!(digest(&s.get("jobs/j/input.sealed").unwrap()), digest(&data));
    assert_eq!(s.head("jobs/j/input.sealed").unwrap().unwrap().size, len as u64);

    // Create-only: the input is there already, and stays as it was.
    let again = s.copy("stores/acme/shard.sealed", "jobs/j/input.sealed", None, PutCondition::CreateOnly);
    assert!(matches!(&again, Err(ObjectError::AlreadyExists { key }) if key == "jobs/j/input.sealed"), "{again:?}");

    // The shard is replaced after its header was checked: the copy of the checked version is
    // refused, naming the source, and nothing is written.
    s.put("stores/acme/shard.sealed", b"another shard altogether", PutCondition::Overwrite).unwrap();
    let stale = s.copy("stores/acme/shard.sealed", "jobs/k/input.sealed", Some(&checked.etag), PutCondition::CreateOnly);
    assert!(matches!(&stale, Err(ObjectError::PreconditionFailed { key }) if key == "stores/acme/shard.sealed"), "{stale:?}");
    assert_eq!(s.head("jobs/k/input.sealed").unwrap(), None);
    assert_eq!(digest(&s.get("jobs/j/input.sealed").unwrap()), digest(&data), "the earlier copy is untouched");

    // Without an etag the current version is copied; a missing source is named.
    let current = s.copy("stores/acme/shard.sealed", "jobs/k/input.sealed", None, PutCondition::Overwrite).unwrap();
    assert_eq!((current.size, s.get("jobs/k/input.sealed").unwrap()), (24, b"another shard altogether".to_vec()));
    let missing = s.copy("stores/acme/gone.sealed", "jobs/m/input.sealed", None, PutCondition::CreateOnly);
    assert!(matches!(&missing, Err(ObjectError::NotFound { key }) if key == "stores/acme/gone.sealed"), "{missing:?}");
}

pub fn objects_read_range(s: &dyn ObjectStore) {
    s.put("k", b"0123456789", PutCondition::Overwrite).unwrap();
    assert_eq!(s.read_range("k", 2, 3).unwrap(), b"234");
    assert_eq!(s.read_range("k", 8, 100).unwrap(), b"89");
    assert_eq!(s.read_range("k", 10, 5).unwrap(), b"");
    assert_eq!(s.read_range("k", 50, 5).unwrap(), b"");
    assert_eq!(s.read_range("k", 3, 0).unwrap(), b"");
    s.put("empty", b"", PutCondition::Overwrite).unwrap();
    assert_eq!(s.read_range("empty", 0, 10).unwrap(), b"");
    assert!(matches!(s.read_range("missing", 0, 1), Err(ObjectError::NotFound { .. })));
}

pub fn objects_conditional_writes(s: &dyn ObjectStore) {
    let first = s.put("r", b"first", PutCondition::CreateOnly).unwrap();
    assert!(matches!(s.put("r", b"second", PutCondition::CreateOnly), Err(ObjectError::AlreadyExists { .. })));
    assert_eq!(s.get("r").unwrap(), b"first");

    let second = s.put("r", b"second", PutCondition::IfMatch(first.etag.clone())).unwrap();
    assert_ne!(first.etag, second.etag);
    let stale = s.put("r", b"third", PutCondition::IfMatch(first.etag.clone()));
    assert!(matches!(stale, Err(ObjectError::PreconditionFailed { .. })), "{stale:?}");
    assert_eq!(s.get("r").unwrap(), b"second");
    let missing = s.put("missing", b"x", PutCondition::IfMatch(second.etag.clone()));
    assert!(matches!(missing, Err(ObjectError::NotFound { .. })), "{missing:?}");

    // Writers check when they start and again when they commit.
    assert!(matches!(s.writer("r", PutCondition::CreateOnly).map(drop), Err(ObjectError::AlreadyExists { .. })));
    let stale = s.writer("r", PutCondition::IfMatch(first.etag.clone())).map(drop);
    assert!(matches!(stale, Err(ObjectError::PreconditionFailed { .. })), "{stale:?}");
    let mut w = s.writer("r", PutCondition::IfMatch(second.etag.clone())).unwrap();
    w.write_all(b"from writer").unwrap();
    s.put("r", b"sneaked in", PutCondition::Overwrite).unwrap();
    assert!(matches!(w.commit(), Err(ObjectError::PreconditionFailed { .. })));
    assert_eq!(s.get("r").unwrap(), b"sneaked in");

    let mut w = s.writer("fresh", PutCondition::CreateOnly).unwrap();
    w.write_all(b"mine").unwrap();
    s.put("fresh", b"theirs", PutCondition::Overwrite).unwrap();
    assert!(matches!(w.commit(), Err(ObjectError::AlreadyExists { .. })));
    assert_eq!(s.get("fresh").unwrap(), b"theirs");
}

/// Several writers race to create one key: exactly one wins (the receipt commit).
pub fn objects_one_create_only_winner(open: &(dyn Fn() -> Arc<dyn ObjectStore> + Sync), rounds: usize, threads: usize) {
    for round in 0..rounds {
        let key = format!("jobs/j{round}/receipt.cose");
        let barrier = Arc::new(Barrier::new(threads));
        let winners: Vec<usize> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|i| {
                    let (s, barrier, key) = (open(), barrier.clone(), key.clone());
                    scope.spawn(move || {
                        barrier.wait();
                        match s.put(&key, format!("attempt {i}").as_bytes(), PutCondition::CreateOnly) {
                            Ok(_) => Some(i),
                            Err(ObjectError::AlreadyExists { .. }) => None,
                            Err(e) => panic!("{e}"),
                        }
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        assert_eq!(open().get(&key).unwrap(), format!("attempt {}", winners[0]).as_bytes());
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(2_654_435_761).rotate_right(13) as u8).collect()
}

/// A streamed write of `len` bytes (several parts for S3), read back whole, streamed and in
/// ranges; with `CreateOnly` checked at commit.
pub fn objects_streamed_write(s: &dyn ObjectStore, len: usize) {
    let data = pattern(len);
    let mut w = s.writer("big/output.sealed", PutCondition::CreateOnly).unwrap();
    for chunk in data.chunks(64 * 1024 + 7) {
        w.write_all(chunk).unwrap();
    }
    w.flush().unwrap();
    assert_eq!(s.head("big/output.sealed").unwrap(), None, "nothing visible before commit");
    let meta = w.commit().unwrap();
    assert_eq!(meta.size, len as u64);
    assert_eq!(s.head("big/output.sealed").unwrap().unwrap().size, len as u64);
    let digest = |bytes: &[u8]| Sha256::digest(bytes).to_vec();
    assert_eq!(digest(&s.get("big/output.sealed").unwrap()), digest(&data));
    let mut streamed = Vec::new();
    let mut reader = s.reader("big/output.sealed").unwrap();
    let mut buffer = vec![0u8; 10_000];
    loop {
        let n = reader.read(&mut buffer).unwrap();
        if n == 0 {
            break;
        }
        streamed.extend_from_slice(&buffer[..n]);
    }
    assert_eq!(digest(&streamed), digest(&data));
    let middle = len as u64 / 2;
    assert_eq!(s.read_range("big/output.sealed", middle, 1000).unwrap(), &data[middle as usize..middle as usize + 1000]);

    // The same key again, create-only: refused when it starts…
    assert!(matches!(s.writer("big/output.sealed", PutCondition::CreateOnly).map(drop), Err(ObjectError::AlreadyExists { .. })));
    // …and at commit when another write got there first, after all the parts went up.
    let mut w = s.writer("big/second.sealed", PutCondition::CreateOnly).unwrap();
    for chunk in data.chunks(1 << 20) {
        w.write_all(chunk).unwrap();
    }
    s.put("big/second.sealed", b"first", PutCondition::CreateOnly).unwrap();
    assert!(matches!(w.commit(), Err(ObjectError::AlreadyExists { .. })));
    assert_eq!(s.get("big/second.sealed").unwrap(), b"first");
}

/// A writer dropped without commit leaves nothing behind.
pub fn objects_abandoned_writer(s: &dyn ObjectStore, len: usize) {
    let mut w = s.writer("jobs/x/attempts/1/output.sealed", PutCondition::CreateOnly).unwrap();
    w.write_all(&pattern(len)).unwrap();
    drop(w);
    assert_eq!(s.head("jobs/x/attempts/1/output.sealed").unwrap(), None);
    assert!(s.list("jobs/").unwrap().is_empty());
    let mut w = s.writer("jobs/x/attempts/1/output.sealed", PutCondition::CreateOnly).unwrap();
    w.write_all(b"done").unwrap();
    assert_eq!(w.commit().unwrap().size, 4);
    assert_eq!(s.get("jobs/x/attempts/1/output.sealed").unwrap(), b"done");
}

// --- queues -----------------------------------------------------------------------------------

/// Receives until `count` messages arrived (SQS may return fewer than are available) or
/// `timeout` passed.
pub fn receive_n(q: &dyn Queue, count: usize, visibility: Duration, timeout: Duration) -> Vec<Received> {
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    while got.len() < count && Instant::now() < deadline {
        got.extend(q.receive(count - got.len(), Duration::from_secs(1), visibility).unwrap());
    }
    got
}

fn bodies(messages: &[Received]) -> BTreeSet<String> {
    messages.iter().map(|m| m.body.clone()).collect()
}

pub fn queue_visibility_and_delete(q: &dyn Queue) {
    let before = cloud::now_ms();
    q.send("a", &SendOptions::default()).unwrap();
    q.send("b", &SendOptions::default()).unwrap();
    let got = receive_n(q, 2, Duration::from_secs(30), Duration::from_secs(10));
    assert_eq!(bodies(&got), BTreeSet::from(["a".to_owned(), "b".to_owned()]));
    for m in &got {
        assert_eq!(m.receive_count, 1);
        assert!(m.sent_ms + 1000 >= before && m.sent_ms <= cloud::now_ms() + 1000, "sent_ms {}", m.sent_ms);
        assert!(!m.message_id.is_empty() && !m.receipt_handle.is_empty());
    }
    assert!(q.receive(10, Duration::ZERO, Duration::from_secs(30)).unwrap().is_empty(), "in flight: hidden");
    let stats = q.stats().unwrap();
    assert_eq!((stats.visible, stats.in_flight), (0, 2), "{stats:?}");

    // ChangeMessageVisibility(0) hands a message back at once.
    let a = got.iter().find(|m| m.body == "a").unwrap();
    q.change_visibility(&a.receipt_handle, Duration::ZERO).unwrap();
    let again = receive_n(q, 1, Duration::from_secs(30), Duration::from_secs(10));
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].body.as_str(), again[0].receive_count), ("a", 2));

    q.delete(&again[0].receipt_handle).unwrap();
    let b = got.iter().find(|m| m.body == "b").unwrap();
    q.delete(&b.receipt_handle).unwrap();
    let stats = q.stats().unwrap();
    assert_eq!((stats.visible, stats.in_flight), (0, 0), "{stats:?}");
}

/// A message nobody deletes comes back after its visibility timeout (a host that died).
pub fn queue_redelivery_after_visibility_timeout(q: &dyn Queue) {
    q.send("job", &SendOptions::default()).unwrap();
    let first = receive_n(q, 1, Duration::from_secs(1), Duration::from_secs(10));
    assert_eq!(first.len(), 1);
    let started = Instant::now();
    let second = receive_n(q, 1, Duration::from_secs(30), Duration::from_secs(15));
    assert_eq!(second.len(), 1, "not redelivered");
    assert!(started.elapsed() >= Duration::from_millis(500), "redelivered before its visibility timeout");
    assert_eq!((second[0].body.as_str(), second[0].receive_count), ("job", 2));
    // Extending the visibility (the host's heartbeat) keeps it hidden.
    q.change_visibility(&second[0].receipt_handle, Duration::from_secs(30)).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(q.receive(1, Duration::ZERO, Duration::from_secs(30)).unwrap().is_empty());
    q.delete(&second[0].receipt_handle).unwrap();
}

/// After `max_receives` receives without delete, the next receive moves the message to the
/// dead-letter queue instead of returning it.
pub fn queue_redrive(q: &dyn Queue, dlq: &dyn Queue, max_receives: u32) {
    q.send("poison", &SendOptions::default()).unwrap();
    for n in 1..=max_receives {
        let got = receive_n(q, 1, Duration::ZERO, Duration::from_secs(10));
        assert_eq!(got.len(), 1, "receive {n}");
        assert_eq!(got[0].receive_count, n);
    }
    assert!(q.receive(1, Duration::from_secs(1), Duration::ZERO).unwrap().is_empty(), "moved, not returned");
    let dead = receive_n(dlq, 1, Duration::from_secs(30), Duration::from_secs(10));
    assert_eq!(dead.len(), 1, "not in the dead-letter queue");
    assert_eq!(dead[0].body, "poison");
    dlq.delete(&dead[0].receipt_handle).unwrap();
}

/// FIFO: a group id is required, a repeated deduplication id is accepted and dropped, and a
/// group's next message waits while one is in flight.
pub fn fifo_groups_and_deduplication(q: &dyn Queue) {
    let missing = q.send("no group", &SendOptions::default());
    assert!(matches!(missing, Err(QueueError::InvalidMessage(_))), "{missing:?}");
    let in_group = |dedup: &str| SendOptions { group_id: Some("ledger".into()), deduplication_id: Some(dedup.into()), delay: Duration::ZERO };
    q.send("receipt 1", &in_group("job-1")).unwrap();
    q.send("receipt 1 again", &in_group("job-1")).unwrap();
    q.send("receipt 2", &in_group("job-2")).unwrap();

    let first = receive_n(q, 1, Duration::from_secs(30), Duration::from_secs(10));
    assert_eq!(first[0].body, "receipt 1");
    assert!(
        q.receive(10, Duration::from_secs(1), Duration::from_secs(30)).unwrap().is_empty(),
        "the group's next message waits while one is in flight"
    );
    q.delete(&first[0].receipt_handle).unwrap();
    let rest = receive_n(q, 2, Duration::from_secs(30), Duration::from_secs(5));
    assert_eq!(bodies(&rest), BTreeSet::from(["receipt 2".to_owned()]), "the duplicate is dropped");
    q.delete(&rest[0].receipt_handle).unwrap();
}

// --- KMS --------------------------------------------------------------------------------------

/// Encrypt/Decrypt and GenerateDataKey bind the encryption context; an unknown key is named.
pub fn kms_symmetric(kms: &dyn Kms, key_id: &str) {
    let context: EncryptionContext = [("model_id".to_owned(), "m".to_owned()), ("version".to_owned(), "1".to_owned())].into();
    let blob = kms.encrypt(key_id, b"data key", &context).unwrap();
    let opened = kms.decrypt(None, &blob, &context, None).unwrap();
    assert_eq!(opened.plaintext.unwrap().as_slice(), b"data key");
    assert!(opened.ciphertext_for_recipient.is_none());
    let opened = kms.decrypt(Some(key_id), &blob, &context, None).unwrap();
    assert_eq!(opened.plaintext.unwrap().as_slice(), b"data key");

    let other: EncryptionContext = [("model_id".to_owned(), "other".to_owned())].into();
    let wrong = kms.decrypt(None, &blob, &other, None);
    assert!(matches!(wrong, Err(KmsError::InvalidCiphertext(_))), "{wrong:?}");

    let key = kms.generate_data_key(key_id, &context, None).unwrap();
    let plaintext = key.plaintext.expect("plaintext without a Recipient");
    assert_eq!(plaintext.len(), 32);
    let again = kms.decrypt(None, &key.ciphertext_blob, &context, None).unwrap();
    assert_eq!(again.plaintext.unwrap().as_slice(), plaintext.as_slice());

    let missing = kms.encrypt("alias/does-not-exist", b"x", &context);
    assert!(matches!(missing, Err(KmsError::NotFound { .. })), "{missing:?}");
}
