"""`ephem-batch serve` with the official `openai` client, as an application uses it: only the
base URL changes. The vectors are the batch path's; a fleet that fails the client's policy gets
nothing sent and an error naming the check."""

import os
import socket
import subprocess
import time

import numpy as np
import openai
import pytest

import ephem_batch

TEXTS = [
    "Which enclave image embedded this document?",
    "Queries are embedded by the same model as the corpus.",
    "zqx-openai-canary: the quarterly numbers are confidential.",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(stack, *extra: str):
    port = _free_port()
    process = subprocess.Popen(
        [os.path.join(stack.bin, "ephem-batch"), "--home", stack.home, "serve", "--listen", f"127.0.0.1:{port}", *extra],
        env=stack.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, port
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise AssertionError("serve did not listen within 60 s")


@pytest.fixture(scope="module")
def batch(client):
    ids, vectors = client.submit(TEXTS).wait().results()
    return vectors


def test_the_openai_client_gets_the_batch_vectors_through_serve(stack, batch):
    process, port = _serve(stack)
    try:
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="not-used")
        # The client asks for base64 by default; float is the other encoding.
        answer = api.embeddings.create(model=ephem_batch.DEFAULT_MODEL, input=TEXTS)
        online = np.array([d.embedding for d in answer.data], dtype=np.float32)
        floats = api.embeddings.create(model=ephem_batch.DEFAULT_MODEL, input=TEXTS, encoding_format="float")
        assert np.min(np.sum(online * batch, axis=1)) > 0.9999
        assert np.min(np.sum(np.array([d.embedding for d in floats.data], dtype=np.float32) * batch, axis=1)) > 0.9999
        assert answer.usage.prompt_tokens > 10
        assert ephem_batch.DEFAULT_MODEL in [m.id for m in api.models.list()]
        with pytest.raises(openai.NotFoundError):
            api.embeddings.create(model="nobody/no-such-model", input="x")
    finally:
        process.kill()
        process.wait()


def test_serve_refuses_to_send_when_the_fleet_fails_the_policy(stack):
    process, port = _serve(stack, "--fleet-key-arn", "arn:aws:kms:local:000000000000:key/0000-not-the-deployments")
    try:
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="not-used", max_retries=0)
        with pytest.raises(openai.APIStatusError) as raised:
            api.embeddings.create(model=ephem_batch.DEFAULT_MODEL, input="a query")
        assert raised.value.status_code == 503
        assert "fleet_kms_key" in str(raised.value)
    finally:
        process.kill()
        process.wait()
