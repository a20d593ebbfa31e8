#!/usr/bin/env bash
# The MPI communicator across real processes (tests/comm/mpi_comm_test.cpp):
#   bash mpi_test.sh MPIEXEC TEST_BINARY
# 2, 3 and 4 ranks: every operation (split into groups too); then the faults: a rank that hangs and a
# rank that dies must each end the job with an error within 20 s.
set -uo pipefail
mpiexec="$1" bin="$2"
# Open MPI refuses root without these (CI runs as root); --oversubscribe: more
# ranks than cores is fine for a test.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
run() { timeout 60 "$mpiexec" --oversubscribe -n "$@"; }
fail=0
for n in 2 3 4; do
  run "$n" "$bin" ops || { echo "mpi_test: ops on $n ranks failed" >&2; fail=1; }
done
for mode in hang die; do
  start=$(date +%s)
  out=$(run 2 "$bin" "$mode" 2>&1)
  rc=$?
  secs=$(($(date +%s) - start))
  echo "$out" | tail -5
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$secs" -gt 20 ]; then
    echo "mpi_test: $mode: job ended with $rc after $secs s (want an error within 20 s)" >&2
    fail=1
  fi
  if [ "$mode" = hang ] && ! echo "$out" | grep -q "no answer from the other ranks"; then
    echo "mpi_test: hang: rank 0 did not report the timeout" >&2
    fail=1
  fi
  echo "mpi_test: $mode: the job ended with status $rc after $secs s"
done
exit $fail
