"""``Job.to_parquet``, ``client.ledger.prove`` and ``ephem_batch.verify_bundle`` against the
local stack. The bundle tests play the holder of a bundle who alters it: every alteration must
be refused by the library's check that it breaks, named in ``VerificationError.check``."""

import base64
import glob
import hashlib
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

import ephem_batch
from ephem_batch import ConfigurationError, VerificationError

TEXTS = [
    "Parquet files keep one column per field.",
    "An inclusion proof ties a receipt to a signed checkpoint.",
    "Salted herring on rye at the harbour market.",
]


@pytest.fixture(scope="module")
def jobs(client):
    """Two completed jobs (the second one later in the ledger)."""
    return client.submit(TEXTS).wait(), client.submit(TEXTS[:1]).wait()


def _dev_root(stack):
    return os.path.join(stack.home, "enclave", "dev-root.pem")


def test_to_parquet_has_ids_vectors_and_tokens(client, stack, jobs, tmp_path):
    job = jobs[0]
    out = tmp_path / "vectors.parquet"
    written = job.to_parquet(out)
    assert written == {"path": str(out), "rows": len(TEXTS), "dimensions": 384}
    table = pq.read_table(out)
    assert table.column_names == ["id", "vector", "tokens"]
    assert table.schema.metadata[b"ephem_batch.job_id"] == job.id.encode()
    ids, vectors = job.results()
    assert table.column("id").to_pylist() == ids
    stored = np.array(table.column("vector").to_pylist(), dtype=np.float32)
    np.testing.assert_array_equal(stored, vectors)
    # The tokens are the CLI's for the same job, and the receipt's total.
    cli = tmp_path / "cli.jsonl"
    stack.cli("results", job.id, "-o", str(cli))
    tokens = [json.loads(line)["tokens"] for line in cli.read_text().splitlines()]
    assert table.column("tokens").to_pylist() == tokens and all(t > 2 for t in tokens)
    assert sum(tokens) == job.summary()["tokens"]
    # No plaintext intermediate is left in the job's directory.
    assert not glob.glob(os.path.join(stack.home, "client", "jobs", job.id, "parquet-source*"))


def test_to_parquet_refuses_a_tampered_output_and_writes_nothing(client, stack, tmp_path):
    job = client.submit(TEXTS[1:]).wait()
    found = [p for p in glob.glob(os.path.join(stack.home, "objects", "**", "output.sealed"), recursive=True) if job.id in p]
    assert len(found) == 1
    data = bytearray(open(found[0], "rb").read())
    data[-10] ^= 0x40
    os.chmod(found[0], 0o600)
    open(found[0], "wb").write(bytes(data))
    out = tmp_path / "tampered.parquet"
    with pytest.raises(VerificationError) as raised:
        job.to_parquet(out)
    assert raised.value.check == "output_sha256"
    assert not out.exists()


def test_a_proof_bundle_verifies_offline(client, stack, jobs):
    job = jobs[0]
    bundle = client.ledger.prove(job)
    assert bundle.job_id == job.id and os.path.isfile(bundle)
    assert bundle.ledger_key.startswith("ephem-batch.local/ledger+")
    result = ephem_batch.verify_bundle(bundle, ledger_key=bundle.ledger_key, development_root=_dev_root(stack), job=job)
    assert result.valid and result.check is None
    assert result.job_id == job.id
    assert result.proven["ok_count"] == len(TEXTS) and result.proven["tokens"] == job.summary()["tokens"]
    # The key as a file, as published: the same answer.
    key_file = os.path.join(stack.home, "ledger", "ledger.pub")
    assert ephem_batch.verify_bundle(bundle.path, ledger_key=key_file, development_root=_dev_root(stack)).valid


def _tampered(path, tmp_path, name, change):
    bundle = json.load(open(path))
    change(bundle)
    out = tmp_path / name
    out.write_text(json.dumps(bundle))
    return str(out)


def test_a_tampered_bundle_is_refused_naming_the_check(client, stack, jobs, tmp_path):
    first = client.ledger.prove(jobs[0], tmp_path / "first.json")
    second = client.ledger.prove(jobs[1], tmp_path / "second.json")
    key, root = first.ledger_key, _dev_root(stack)

    def refused(path, **options):
        options.setdefault("ledger_key", key)
        options.setdefault("development_root", root)
        with pytest.raises(VerificationError) as raised:
            ephem_batch.verify_bundle(path, **options)
        assert raised.value.failed == [(raised.value.check, raised.value.verification.message)]
        assert not raised.value.verification.valid
        return raised.value.check

    other = json.load(open(second))

    def swap_receipt(b):  # another job's genuine receipt and document under this entry's proof
        b["receipt"], b["attestation_document"] = other["receipt"], other["attestation_document"]

    assert refused(_tampered(first, tmp_path, "receipt.json", swap_receipt)) == "inclusion"

    def move_entry(b):
        b["leaf_index"] = other["leaf_index"]

    assert refused(_tampered(first, tmp_path, "index.json", move_entry)) == "inclusion"

    def forge_root(b):  # the checkpoint's root replaced: its signature no longer covers it
        lines = b["checkpoint"].split("\n")
        lines[2] = base64.b64encode(hashlib.sha256(b"forged").digest()).decode()
        b["checkpoint"] = "\n".join(lines)

    assert refused(_tampered(first, tmp_path, "root.json", forge_root)) == "checkpoint"

    def grow_tree(b):
        b["tree_size"] = b["tree_size"] + 1

    assert refused(_tampered(first, tmp_path, "size.json", grow_tree)) == "tree_size"
    assert refused(_tampered(first, tmp_path, "form.json", lambda b: b.pop("receipt"))) == "bundle"

    # A genuine bundle of another job, where this one's was asked for.
    assert refused(second, job=jobs[0]) == "job"
    # Another ledger's key (this key's bytes under another name): the checkpoint is not its.
    _name, _id, material = key.split("+", 2)
    raw = base64.b64decode(material)
    alias = "attacker.example/ledger"
    alias_id = hashlib.sha256(alias.encode() + b"\n" + raw).digest()[:4].hex()
    assert refused(first, ledger_key=f"{alias}+{alias_id}+{material}") == "checkpoint"
    # Without the development root, the AWS root: a development document is refused.
    assert refused(first, development_root=None) == "attestation"
    # raise_on_failure=False answers instead of raising.
    answer = ephem_batch.verify_bundle(second, ledger_key=key, development_root=root, job=jobs[0], raise_on_failure=False)
    assert not answer.valid and answer.check == "job" and jobs[1].id in answer.message


def test_verify_bundle_option_errors_are_configuration_errors(client, stack, jobs, tmp_path):
    bundle = client.ledger.prove(jobs[0], tmp_path / "b.json")
    with pytest.raises(ConfigurationError):
        ephem_batch.verify_bundle(bundle, ledger_key="not a key", development_root=_dev_root(stack))
    with pytest.raises(ConfigurationError):
        ephem_batch.verify_bundle(bundle, ledger_key=bundle.ledger_key, root=str(tmp_path / "no-such.pem"))
    with pytest.raises(ephem_batch.EphemBatchError):
        ephem_batch.verify_bundle(tmp_path / "missing.json", ledger_key=bundle.ledger_key)
    with pytest.raises(ephem_batch.EphemBatchError):
        client.ledger.prove("0" * 32, tmp_path / "none.json")


def test_one_record_is_proven_alone_and_a_changed_vector_is_refused(client, stack, jobs, tmp_path):
    job = jobs[0]
    ids, vectors = job.results()
    proof = client.ledger.prove_record(job, ids[1], tmp_path / "record.json")
    assert (proof.index, proof.records) == (1, len(TEXTS))
    key = client.ledger.prove(job).ledger_key
    result = ephem_batch.verify_record(proof, ledger_key=key, development_root=_dev_root(stack))
    assert result.valid and result.proven["id"] == ids[1] and result.proven["text"] == TEXTS[1]
    assert np.allclose(np.array(result.proven["vector"], dtype=np.float32), vectors[1], atol=1e-6)
    # Nothing of the other texts is in the bundle.
    text = open(proof.path).read()
    assert all(t not in text and base64.b64encode(t.encode()).decode() not in text for t in (TEXTS[0], TEXTS[2]))
    # One bit of the vector changed.
    bundle = json.loads(text)
    raw = bytearray(base64.b64decode(bundle["output_record"]))
    raw[-1] ^= 1
    bundle["output_record"] = base64.b64encode(bytes(raw)).decode()
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(bundle))
    with pytest.raises(VerificationError) as raised:
        ephem_batch.verify_record(tampered, ledger_key=key, development_root=_dev_root(stack))
    assert raised.value.check == "record_inclusion"
