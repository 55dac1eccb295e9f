#!/usr/bin/env bash
# Instructions per launch of one `cargo bench --bench interpret` case, counted by valgrind's callgrind
# on the calling thread with every op on it (`--sequential`): a measure of the interpreter's own work
# that does not move with the machine's load, for changes too small for these noisy VMs' clocks.
#
#   scripts/instructions.sh [case, default ragged_paged_attention_decode]      (~3 minutes)
#
# Prints `<case> launches=N instructions/launch=M` and leaves the profile in
# target/instructions/callgrind.<case> (read it with `callgrind_annotate --inclusive=yes`). Run it at
# two commits to compare them. What it does not show: time (valgrind runs without AVX-512, so the bf16
# dots take their FMA path, and memory stalls cost nothing), the helper threads of a parallel run,
# and that this bench plans the kernel per launch where the JAX op keeps its plan (~7 M of the decode
# case's instructions).
set -euo pipefail
cd "$(dirname "$0")/.."
case="${1:-ragged_paged_attention_decode}"
command -v valgrind > /dev/null || { echo "valgrind is missing: scripts/setup.sh installs it" >&2; exit 1; }
bin=$(cargo bench --bench interpret --no-run --message-format=json 2> /dev/null \
  | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "interpret" and m.get("executable"):
        print(m["executable"])')
out=target/instructions
mkdir -p "$out"
valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.$case" --toggle-collect='*interpret_with*' \
  "$bin" --case "$case" --ours-only --quick --rounds 1 --sequential > "$out/$case.log" 2>&1 \
  || { tail -20 "$out/$case.log" >&2; exit 1; }
python3 - "$out/callgrind.$case" "$case" <<'PY'
import re, sys
path, case = sys.argv[1], sys.argv[2]
text = open(path).read()
total = int(re.search(r"^summary: (\d+)", text, re.M).group(1))
# Launches: the calls into the grid's entry (named once, then referred to by its number).
fid = re.search(r"^c?fn=\((\d+)\) kernel_runtime::interpret::grid::run$", text, re.M).group(1)
launches = sum(int(m.group(1)) for m in re.finditer(rf"^cfn=\({fid}\).*\ncalls=(\d+)", text, re.M))
print(f"{case} launches={launches} instructions/launch={total / launches / 1e6:.2f} M")
PY
