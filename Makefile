# The README's two commands are `make demo` and `make test`.
.PHONY: demo test test-rust test-cdk test-aws

demo:
	bash scripts/demo.sh

test: test-rust test-cdk

test-rust:
	bash scripts/test-rust.sh

# Only the tests against the AWS emulator (moto, started and stopped by the script).
test-aws:
	bash scripts/test-rust.sh --aws

test-cdk:
	bash cdk/scripts/test.sh
