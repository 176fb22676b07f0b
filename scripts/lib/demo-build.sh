# The binaries `make demo` builds and the one feature they need: the worker's development NSM
# (the embedded default). `--features dev`, not `enclave-worker/dev`: enclave-worker names itself
# as a dev-dependency, so `enclave-worker/dev` would mean that dependency's feature and leave the
# worker built without an NSM (scripts/tests/demo-build.sh checks this).
# shellcheck disable=SC2034
DEMO_PACKAGES=(-p ephem-batch -p host-poller -p enclave-worker --features dev)
