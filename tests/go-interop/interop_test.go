// Interoperability of the ledger's checkpoints, the witness's cosignatures and the Merkle
// proofs with the transparency ecosystem's Go code: golang.org/x/mod/sumdb/note (signed notes),
// github.com/transparency-dev/formats (checkpoints, cosignature/v1) and
// github.com/transparency-dev/merkle (RFC 6962 proofs). scripts/test-go-interop.sh runs it
// between the Rust side's `interop write` and `interop check`.
package interop

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/transparency-dev/formats/log"
	fnote "github.com/transparency-dev/formats/note"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"github.com/transparency-dev/merkle/testonly"
	"golang.org/x/mod/sumdb/note"
)

func dir(t *testing.T) string {
	d := os.Getenv("EPHEM_INTEROP_DIR")
	if d == "" {
		t.Fatal("EPHEM_INTEROP_DIR is not set (run scripts/test-go-interop.sh)")
	}
	return d
}

func read(t *testing.T, path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func hashes(t *testing.T, path string) [][]byte {
	var out [][]byte
	for _, l := range strings.Split(strings.TrimSpace(string(read(t, path))), "\n") {
		h, err := base64.StdEncoding.DecodeString(l)
		if err != nil || len(h) != 32 {
			t.Fatalf("%s: bad hash line %q", path, l)
		}
		out = append(out, h)
	}
	return out
}

func verifiers(t *testing.T, logVkey, witnessVkey string) (note.Verifier, note.Verifier) {
	logV, err := note.NewVerifier(strings.TrimSpace(logVkey))
	if err != nil {
		t.Fatalf("log key: %v", err)
	}
	witV, err := fnote.NewVerifierForCosignatureV1(strings.TrimSpace(witnessVkey))
	if err != nil {
		t.Fatalf("witness key: %v", err)
	}
	return logV, witV
}

// The known-answer cosignature of docs/protocol.md §8.12.
func TestKnownAnswerCosignature(t *testing.T) {
	logV, witV := verifiers(t,
		"ledger.ephem-batch.example/test+70925f2d+ASFS+NGbeR0kRTJC4V8uq2y3z/p7al7TAJeWDgaYgdsS",
		"witness.ephem-batch.example/w1+b80ae4a4+BMhAafoiFsbtwdUsqDqhHCZ91UQK+lJgkMpD69DKhqnP")
	msg := "ledger.ephem-batch.example/test\n1\nbjQLnP+zepicpUTmu3gKLHiQHT+zNzh2hRGjBhevoB0=\n\n" +
		"— ledger.ephem-batch.example/test cJJfLQiVydxAguHsxpLq3XHBN8KvlcoizxHEjLBCo5vQHw3CqRvGG/x1EfRXcubJk07udDRggTi26ihBD0EfhM5Bbwg=\n" +
		"— witness.ephem-batch.example/w1 uArkpAAAAABlU/EA6lAitav1iz5+gVauYt7YlQaVGh48bC6pFiS0IcItrMoAaSp6AYOKcoAOsNtL7oHS+B9dzmfOzeCrk7t8ae2XDQ==\n"
	n, err := note.Open([]byte(msg), note.VerifierList(logV, witV))
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Sigs) != 2 {
		t.Fatalf("%d signatures verified, want 2", len(n.Sigs))
	}
	ts, err := fnote.CoSigV1Timestamp(n.Sigs[1])
	if err != nil || ts.Unix() != 1700000000 {
		t.Fatalf("timestamp %v %v", ts, err)
	}
}

// What the Rust side wrote: checkpoints cosigned by our witness, proofs from our ledger.
func TestOurCheckpointsCosignaturesAndProofs(t *testing.T) {
	d := dir(t)
	logV, witV := verifiers(t, string(read(t, filepath.Join(d, "log.vkey"))), string(read(t, filepath.Join(d, "witness.vkey"))))
	roots := map[uint64][]byte{}
	for _, size := range []uint64{4, 10} {
		signed := read(t, filepath.Join(d, fmt.Sprintf("checkpoint.%d", size)))
		cp, _, n, err := log.ParseCheckpoint(signed, logV.Name(), logV, witV)
		if err != nil {
			t.Fatalf("checkpoint %d: %v", size, err)
		}
		if cp.Size != size {
			t.Fatalf("checkpoint %d has size %d", size, cp.Size)
		}
		var cosigned bool
		for _, s := range n.Sigs {
			if s.Name == witV.Name() && s.Hash == witV.KeyHash() {
				ts, err := fnote.CoSigV1Timestamp(s)
				cosigned = err == nil && ts.Unix() == 1750000000
			}
		}
		if !cosigned {
			t.Fatalf("checkpoint %d: no verified cosignature by %s", size, witV.Name())
		}
		roots[size] = cp.Hash
		// A flipped root must not verify under either key.
		bad := bytes.Replace(signed, []byte("\n"+base64.StdEncoding.EncodeToString(cp.Hash)), []byte("\n"+base64.StdEncoding.EncodeToString(make([]byte, 32))), 1)
		if _, err := note.Open(bad, note.VerifierList(logV, witV)); err == nil {
			t.Fatalf("checkpoint %d with another root verified", size)
		}
	}
	h := rfc6962.DefaultHasher
	if err := proof.VerifyConsistency(h, 4, 10, hashes(t, filepath.Join(d, "consistency.4.10")), roots[4], roots[10]); err != nil {
		t.Fatalf("consistency 4 -> 10: %v", err)
	}
	for _, i := range []uint64{0, 3, 9} {
		leaf, err := base64.StdEncoding.DecodeString(string(read(t, filepath.Join(d, fmt.Sprintf("leaf.%d", i)))))
		if err != nil {
			t.Fatal(err)
		}
		p := hashes(t, filepath.Join(d, fmt.Sprintf("inclusion.%d.10", i)))
		if err := proof.VerifyInclusion(h, i, 10, h.HashLeaf(leaf), p, roots[10]); err != nil {
			t.Fatalf("inclusion %d: %v", i, err)
		}
	}
}

type fixed struct{ b byte }

func (f fixed) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = f.b
	}
	return len(p), nil
}

// What Go writes for the Rust side's `interop check`: a log and a witness of Go's own.
func TestWriteGoArtifacts(t *testing.T) {
	out := filepath.Join(dir(t), "go")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	logSkey, logVkey, err := note.GenerateKey(fixed{1}, "go.log.example")
	if err != nil {
		t.Fatal(err)
	}
	witSkey, witVkey, err := note.GenerateKey(fixed{2}, "go.witness.example")
	if err != nil {
		t.Fatal(err)
	}
	witCosigVkey, err := fnote.VKeyToCosignatureV1(witVkey)
	if err != nil {
		t.Fatal(err)
	}
	logS, err := note.NewSigner(logSkey)
	if err != nil {
		t.Fatal(err)
	}
	witS, err := fnote.NewSignerForCosignatureV1(witSkey)
	if err != nil {
		t.Fatal(err)
	}
	tree := testonly.New(rfc6962.DefaultHasher)
	for i := 0; i < 10; i++ {
		tree.AppendData([]byte(fmt.Sprintf("leaf-%d", i)))
	}
	files := map[string][]byte{"log.vkey": []byte(logVkey + "\n"), "witness.vkey": []byte(witCosigVkey + "\n")}
	for _, size := range []uint64{4, 10} {
		cp := log.Checkpoint{Origin: "go.log.example", Size: size, Hash: tree.HashAt(size)}
		signed, err := note.Sign(&note.Note{Text: string(cp.Marshal())}, logS, witS)
		if err != nil {
			t.Fatal(err)
		}
		files[fmt.Sprintf("checkpoint.%d", size)] = signed
	}
	join := func(hs [][]byte) []byte {
		var b bytes.Buffer
		for _, h := range hs {
			b.WriteString(base64.StdEncoding.EncodeToString(h) + "\n")
		}
		return b.Bytes()
	}
	c, err := tree.ConsistencyProof(4, 10)
	if err != nil {
		t.Fatal(err)
	}
	files["consistency.4.10"] = join(c)
	for _, i := range []uint64{0, 3, 9} {
		p, err := tree.InclusionProof(i, 10)
		if err != nil {
			t.Fatal(err)
		}
		files[fmt.Sprintf("inclusion.%d.10", i)] = join(p)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
