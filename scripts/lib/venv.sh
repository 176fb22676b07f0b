# Sourced by the scripts that keep a Python environment of their own.
#
# make_venv DIR [python3 -m venv options…]: creates the environment. `python3 -m venv` runs
# ensurepip to put pip in it and hides that run's output, so its failure says only "returned
# non-zero exit status 1". Here ensurepip then runs again where its output shows (a second try
# that also succeeds when the first failure was passing), and a failure ends with the space left
# on the environment's disk and in the temporary directory ensurepip unpacks into.
make_venv() {
    local dir=$1
    shift
    python3 -m venv "$@" "$dir" && return 0
    echo "venv: python3 -m venv $dir failed; pip's bootstrap (ensurepip) again, with its output:" >&2
    if [ -x "$dir/bin/python" ] && "$dir/bin/python" -m ensurepip --upgrade --default-pip >&2; then
        echo "venv: $dir made on the second try" >&2
        return 0
    fi
    echo "venv: could not make $dir; space left:" >&2
    df -h "$(dirname "$dir")" "${TMPDIR:-/tmp}" >&2 || true
    return 1
}
