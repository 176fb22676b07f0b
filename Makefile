# The README's two commands are `make demo` and `make test`.
.PHONY: demo test test-rust test-cdk

demo:
	bash scripts/demo.sh

test: test-rust test-cdk

test-rust:
	bash scripts/test-rust.sh

test-cdk:
	bash cdk/scripts/test.sh
