"""The Python SDK against the local stack: submit, wait, results, errors, verify, ledger."""

import base64
import glob
import hashlib
import json
import os
import shutil
import time

import numpy as np
import pytest

import ephem_batch
from ephem_batch import ConfigurationError, VerificationError

TEXTS = [
    "Confidential embeddings are computed inside a measured enclave.",
    "The receipt names the attestation document of the enclave that ran the job.",
    "A harbour lantern glows over the granite quay at dusk.",
    "Receipts are appended to a hash-chained, Merkle-proven ledger.",
    "Copper kettles and saffron buns for the falcon keepers.",
]

EVERY_CHECK = {
    "receipt",
    "receipt_attestation",
    "job_id",
    "model",
    "options",
    "result_key",
    "fleet_key",
    "records",
    "input_sha256",
    "output_sha256",
    "record_ids",
    "commitment",
    "ledger",
}


def _object(stack, job, name):
    """A job's object in the local object store (the host side of the stack)."""
    found = [p for p in glob.glob(os.path.join(stack.home, "objects", "**", name), recursive=True) if job.id in p]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def done_job(client):
    """A job from a list of strings, completed (its results not yet opened)."""
    return client.submit(TEXTS).wait()


def test_submit_from_a_list_gives_unit_vectors(client, done_job):
    assert done_job.records == len(TEXTS)
    status = done_job.status()
    assert status.state == "completed" and status.receipt_committed and status.ledger_index is not None
    ids, vectors = done_job.results()
    assert ids == [str(i) for i in range(len(TEXTS))]
    assert isinstance(vectors, np.ndarray)
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # Related sentences are nearer than unrelated ones: real embeddings, not noise.
    sims = vectors @ vectors.T
    assert sims[1, 3] > sims[1, 4]
    assert done_job.errors() == []
    summary = done_job.summary()
    assert summary["records"] == len(TEXTS) and summary["dimensions"] == 384


def test_verify_names_every_check(done_job):
    verification = done_job.verify()
    assert verification.passed
    assert {c.name for c in verification} == EVERY_CHECK
    assert verification.development_root
    assert verification["ledger"].passed and "entry" in verification["ledger"].detail


def test_results_from_a_file_equal_the_clis(client, stack, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    records = [{"id": f"doc-{i}", "text": f"Record {i}: {t}"} for i, t in enumerate(TEXTS * 2)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    job = client.submit(str(corpus))
    job.wait(progress=True)
    ids, vectors = job.results()
    assert ids == [r["id"] for r in records]

    out = tmp_path / "cli.jsonl"
    stack.cli("results", job.id, "-o", str(out))
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert [l["id"] for l in lines] == ids
    cli_vectors = np.array([l["embedding"] for l in lines], dtype=np.float32)
    np.testing.assert_array_equal(cli_vectors, vectors)
    # A job found again by its id (another notebook, later) gives the same.
    again_ids, again = client.job(job.id).results(mmap=True)
    assert again_ids == ids
    np.testing.assert_array_equal(np.asarray(again), vectors)


def test_a_bad_line_lands_in_errors_and_the_job_goes_on(client):
    source = [
        {"id": "good-1", "text": "An ordinary sentence."},
        {"id": "no-text", "text": 42},
        {"id": "good-2", "text": "Another ordinary sentence."},
        {"id": "good-1", "text": "A duplicate id."},
    ]
    job = client.submit(source)
    assert job.records == 2
    ids, vectors = job.wait().results()
    assert ids == ["good-1", "good-2"] and vectors.shape == (2, 384)
    errors = job.errors()
    assert len(errors) == 2, errors
    assert {e.get("id") for e in errors} == {"no-text", "good-1"}
    job.verify()


def test_a_tampered_output_fails_verify_naming_the_check(client, stack):
    job = client.submit(TEXTS[:2]).wait()
    path = _object(stack, job, "output.sealed")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01
    os.chmod(path, 0o600)
    open(path, "wb").write(bytes(data))
    with pytest.raises(VerificationError) as raised:
        job.verify()
    assert raised.value.check == "output_sha256"
    assert ("output_sha256" in dict(raised.value.failed))
    assert raised.value.verification is not None and not raised.value.verification.passed
    # results() refuses too, and writes nothing.
    with pytest.raises(VerificationError) as raised:
        job.results()
    assert raised.value.check == "output_sha256"
    assert not glob.glob(os.path.join(stack.home, "client", "jobs", job.id, "embeddings.*"))


def test_a_receipt_from_another_job_fails_verify_naming_the_check(client, stack, done_job):
    job = client.submit(TEXTS[2:4]).wait()
    theirs = _object(stack, done_job, "receipt.cose")
    ours = _object(stack, job, "receipt.cose")
    os.chmod(ours, 0o600)
    shutil.copyfile(theirs, ours)
    verification = job.verify(raise_on_failure=False)
    assert not verification.passed
    assert verification["receipt_attestation"].passed, "a genuine receipt, of another job"
    with pytest.raises(VerificationError) as raised:
        job.verify()
    assert raised.value.check == "job_id"
    with pytest.raises(VerificationError):
        job.results()


def test_results_need_the_key_they_were_sealed_to(client, stack):
    job = client.submit(TEXTS[:1]).wait()
    key = os.path.join(stack.home, "client", "result.key")
    saved = open(key, "rb").read()
    try:
        os.chmod(key, 0o600)
        with open(key, "w") as f:
            f.write(os.urandom(32).hex())
        with pytest.raises(VerificationError) as raised:
            job.results()
        assert raised.value.check == "output_sha256"
    finally:
        with open(key, "wb") as f:
            f.write(saved)
    ids, vectors = job.results()
    assert vectors.shape == (1, 384)


def test_the_ledger_query_returns_the_jobs_row(client, done_job):
    rows = client.ledger.query(job=done_job, dataframe=False)
    assert len(rows) == 1
    row = rows[0]
    assert row["job_id"] == done_job.id
    assert row["ok_count"] == len(TEXTS) and row["failed_count"] == 0
    assert row["model_id"] == ephem_batch.DEFAULT_MODEL
    assert row["verdict"] in ("verified", "not_checkpointed"), row
    everything = client.ledger.query(dataframe=False)
    assert any(r["job_id"] == done_job.id for r in everything)
    assert client.ledger.query(model="no/such-model", dataframe=False) == []


def test_embed_goes_online_and_equals_the_batch_path(client, done_job):
    ids, batch = done_job.results()
    online = client.embed(TEXTS)
    assert online.shape == batch.shape and online.dtype == np.float32
    assert np.min(np.sum(online * batch, axis=1)) > 0.9999
    assert client.embed("one text").shape == (1, 384)
    # The enclave's usage receipts for these requests reach the ledger (collected every 2 s here).
    deadline = time.monotonic() + 60
    while True:
        usage = client.ledger.query(kind="usage", dataframe=False)
        if sum(row["ok_count"] for row in usage) >= len(TEXTS) + 1 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert sum(row["ok_count"] for row in usage) >= len(TEXTS) + 1, usage
    assert all(row["kind"] == "usage" and row["verdict"] != "invalid" for row in usage), usage
    assert all(row["kind"] == "job" for row in client.ledger.query(kind="job", dataframe=False))


def test_embedded_usage_reconciles_with_the_ledger(client):
    """embed logs where each answer was accounted; once the receipts are in the ledger every
    account of the log is matched (the local stack collects usage every 2 s)."""
    client.embed(["reconcile me", "and me"])
    deadline = time.time() + 60
    while True:
        found = client.ledger.reconcile_usage()
        outcomes = {p["outcome"] for p in found["periods"]}
        if found["exchanges"] and outcomes == {"matched"}:
            break
        assert outcomes <= {"matched", "pending"}, found
        assert time.time() < deadline, found
        time.sleep(1)
    assert found["passed"] is True


def test_embed_refuses_a_fleet_that_fails_the_policy_and_sends_nothing(stack):
    other = ephem_batch.Client(home=stack.home, backend="local", fleet_key_arn="arn:aws:kms:local:000000000000:key/0000-not-the-deployments")
    with pytest.raises(ephem_batch.OnlineError) as raised:
        other.embed(["a query"])
    assert raised.value.check == "attestation" and raised.value.status == 503
    assert "fleet_kms_key" in str(raised.value)


def test_configuration_errors_are_exceptions(client, tmp_path):
    with pytest.raises(ConfigurationError):
        ephem_batch.Client(home=client.home, backend="gcp")
    with pytest.raises(ConfigurationError) as raised:
        ephem_batch.Client(home=str(tmp_path))
    assert "one backend per process" in str(raised.value)
    with pytest.raises(ephem_batch.EphemBatchError):
        client.job("0" * 32)
    with pytest.raises(ephem_batch.EphemBatchError):
        client.job("not-a-job")
    # What the model's signed manifest does not offer is refused before anything is sealed.
    with pytest.raises(ephem_batch.EphemBatchError) as raised:
        client.submit(["x"], dimensions=128)
    assert "dimensions 128" in str(raised.value) and "[384]" in str(raised.value)
    with pytest.raises(ephem_batch.EphemBatchError) as raised:
        client.submit(["x"], prompt="query")
    assert "prompt \"query\"" in str(raised.value)


def test_an_epoch_whose_genesis_does_not_vouch_for_its_key_is_refused_and_nothing_is_sent(stack):
    """The operator edits the stored genesis of every epoch (here: the epoch it names), as it
    would to pass off a key of its own: submit and embed refuse before sealing anything. A fresh
    client verifies afresh (no target cached); the geneses are restored afterwards."""
    geneses = glob.glob(os.path.join(stack.home, "**", "fleet-genesis", "epoch-*.json"), recursive=True)
    assert geneses, "the worker stored a genesis"
    originals = {}
    try:
        for path in geneses:
            with open(path) as f:
                originals[path] = f.read()
            genesis = json.loads(originals[path])
            genesis["epoch"] += 100
            with open(path, "w") as f:
                json.dump(genesis, f)
        client = ephem_batch.Client(home=stack.home, backend="local")
        with pytest.raises(Exception) as raised:
            client.submit(TEXTS[:1])
        assert "fleet_key_genesis" in str(raised.value)
        with pytest.raises(ephem_batch.OnlineError) as raised:
            client.embed(["a query"])
        assert "fleet_key_genesis" in str(raised.value)
    finally:
        for path, text in originals.items():
            with open(path, "w") as f:
                f.write(text)


def test_a_corpus_that_cannot_be_submitted_is_a_value_error_naming_it(client, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    refused = tmp_path / "refused.jsonl"
    refused.write_text("not json\n")
    cases = [
        (str(tmp_path / "missing.jsonl"), "missing.jsonl: no such file"),
        (str(tmp_path), "is a directory, not a corpus file"),
        (str(empty), "empty.jsonl is empty: a corpus needs at least one record"),
        (str(refused), "refused.jsonl holds no record: all 1 of its lines were refused"),
        ([], "the records given is empty"),
    ]
    jobs = os.path.join(client.home, "client", "jobs")
    before = sorted(os.listdir(jobs)) if os.path.isdir(jobs) else []
    for source, said in cases:
        with pytest.raises(ValueError) as raised:
            client.submit(source)
        assert said in str(raised.value), str(raised.value)
        assert "\n" not in str(raised.value)
    # Nothing was sealed for any of them.
    assert (sorted(os.listdir(jobs)) if os.path.isdir(jobs) else []) == before


def _stranger(key: str) -> str:
    """A witness key nobody asked to cosign: the stack's witness's public key under another name
    (so another key id)."""
    _name, _id, raw = key.split("+", 2)
    name = "witness.example/stranger"
    key_id = hashlib.sha256(name.encode() + b"\n" + base64.b64decode(raw)).digest()[:4].hex()
    return f"{name}+{key_id}+{raw}"


def test_results_and_verify_take_the_witness_settings(stack):
    """`dev up` runs a witness that cosigns each checkpoint of the stack's ledger. A client given
    its key gets its results and a ledger check naming it; a client that also requires a witness
    which never cosigned gets nothing written and a refusal naming `witness_quorum`; a client
    without witnesses is told the checkpoint is signed by the operator's key only."""
    with open(os.path.join(stack.home, "run", "witness.url")) as f:
        key = f.read().strip().rsplit("@", 1)[0]
    witnessed = ephem_batch.Client(home=stack.home, backend="local", witnesses=[key])
    strict = ephem_batch.Client(home=stack.home, backend="local", witnesses=[key, _stranger(key)], witness_quorum=2)
    job = witnessed.submit(TEXTS[:2]).wait()
    with pytest.raises(VerificationError) as raised:
        strict.job(job.id).results()
    assert raised.value.check == "ledger" and "witness_quorum" in str(raised.value), str(raised.value)
    assert not os.path.exists(os.path.join(stack.home, "client", "jobs", job.id, "embeddings.npy")), "nothing written"
    assert strict.job(job.id).verify(raise_on_failure=False)["ledger"].detail.startswith("witness_quorum")

    ids, vectors = witnessed.job(job.id).results()
    assert ids == ["0", "1"] and vectors.shape == (2, 384)
    ledger = witnessed.job(job.id).verify()["ledger"]
    assert ledger.passed and f"cosigned by {key.split('+')[0]}" in ledger.detail, ledger.detail
    plain = ephem_batch.Client(home=stack.home, backend="local")
    assert "signed by the operator's key only" in plain.job(job.id).verify()["ledger"].detail
