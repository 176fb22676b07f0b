# The README's two commands are `make demo` and `make test`.
.PHONY: demo test test-demo-build test-rust test-python test-python-wheel test-cdk test-aws test-supply-chain test-lambda-glibc test-go-interop test-scitt-interop deny fuzz

demo:
	bash scripts/demo.sh

# test-supply-chain: the cargo-deny policy and a short pass of every fuzz target
# (docs/supply-chain.md, docs/fuzzing.md); EPHEM_CI_FUZZ=0 leaves the fuzz pass out.
# test-lambda-glibc: the Lambda binaries, linked by Zig against glibc 2.34, need no newer glibc
# symbol (scripts/tests/lambda-glibc.sh; docs/operations.md §1.4).
# test-go-interop: checkpoints, witness cosignatures and Merkle proofs against the transparency
# ecosystem's Go code, both ways (scripts/tests/go-interop.sh; docs/protocol.md §8.12).
# test-scitt-interop: the SCITT export verified by pycose (scripts/tests/scitt-interop.sh; §8.13).
test: test-demo-build test-rust test-python test-cdk test-supply-chain test-lambda-glibc test-go-interop test-scitt-interop

test-rust:
	bash scripts/test-rust.sh

# The Python SDK (python/, docs/python.md) against a local stack, with the extension module the
# workspace build makes.
test-python:
	bash scripts/test-python.sh

# The SDK's release wheel (maturin build --release), installed into a clean venv without Rust,
# running the README's Python example against a local stack; not in `make test` (a release build).
test-python-wheel:
	bash scripts/tests/python-wheel.sh

# Only the tests against the AWS emulator (moto, started and stopped by the script).
test-aws:
	bash scripts/test-rust.sh --aws

test-cdk:
	bash cdk/scripts/test.sh

test-supply-chain: deny
	@if [ "$${EPHEM_CI_FUZZ:-1}" = 0 ]; then echo "fuzz: skipped (EPHEM_CI_FUZZ=0)"; else bash scripts/fuzz.sh; fi

test-lambda-glibc:
	bash scripts/tests/lambda-glibc.sh

# The README's first command builds what it runs (scripts/tests/demo-build.sh; no build).
test-demo-build:
	bash scripts/tests/demo-build.sh

test-go-interop:
	bash scripts/tests/go-interop.sh

test-scitt-interop:
	bash scripts/tests/scitt-interop.sh

deny:
	bash scripts/deny.sh

# Every fuzz target for EPHEM_FUZZ_SECONDS (default 15) s; `scripts/fuzz.sh --long SECONDS` for longer.
fuzz:
	bash scripts/fuzz.sh
