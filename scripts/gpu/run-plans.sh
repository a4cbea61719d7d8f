#!/usr/bin/env bash
# Runs proof plans one after another through hf-proof.py within SECONDS in all (one device call),
# and packs each plan's output folder into OUT/<plan>.tar.gz, one file a plan to bring back.
#   scripts/gpu/run-plans.sh OUT SECONDS PLAN.json...
# A run started before a plan's deadline may outlast it: the deadline is two minutes before the
# time left, and a hard stop ten seconds before it leaves the time to pack what ran.
set -u
out=$1; end=$(( $(date +%s) + $2 )); shift 2
for plan in "$@"; do
    name=$(basename "$plan" .json); name=${name#hf-proof-plan-}
    left=$(( end - $(date +%s) ))
    if (( left < 150 )); then echo "$name: not run (out of time)"; continue; fi
    work=$(mktemp -d)
    timeout $(( left - 10 )) python3 "$(dirname "$0")/hf-proof.py" "$plan" "$work/$name" $(( left - 120 )) 2>&1 \
        | tee "$work/$name.log"
    tar czf "$out/$name.tar.gz" -C "$work" .
done
