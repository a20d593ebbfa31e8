# Shared by the package tests (tests/install/*_package_test.sh,
# python_*_test.sh): the model, and the check that a package's greedy reply
# is token-identical to the C API's (bindings/tools/greedy_ref.c, as
# $EMBER_GREEDY_REF; the CTest environment sets it).
fail() { echo "FAIL: $*"; exit 1; }
PACKAGE_PROMPT="Name three colors."
PACKAGE_TOKENS=16

# Sets $model, or exits 77 (skip) without it, 1 when $CI is set.
find_model() {
  model="${EMBER_MODEL:-${EMBER_HOME:-$HOME/.cache/ember}/SmolLM2-135M-Instruct.Q4_1.gguf}"
  if [ ! -f "$model" ]; then
    [ -n "${CI:-}" ] && fail "model missing: $model (CI is set)"
    echo "SKIP: model not found at $model"
    exit 77
  fi
}

# check_greedy WHAT COMMAND...: COMMAND prints the greedy token ids of
# $PACKAGE_PROMPT (at most $PACKAGE_TOKENS) on its first line; they must equal
# the C API's.
check_greedy() {
  local what=$1 expected got
  shift
  [ -n "${EMBER_GREEDY_REF:-}" ] || fail "EMBER_GREEDY_REF not set (run through CTest)"
  expected=$("$EMBER_GREEDY_REF" "$model" "$PACKAGE_TOKENS" "$PACKAGE_PROMPT") || fail "greedy_ref"
  got=$("$@" | head -1) || fail "$what: the program failed"
  [ -n "$expected" ] || fail "greedy_ref printed no tokens"
  [ "$got" = "$expected" ] || fail "$what: greedy tokens [$got] differ from the C API's [$expected]"
  echo "$what: greedy tokens equal the C API's: $got"
}
