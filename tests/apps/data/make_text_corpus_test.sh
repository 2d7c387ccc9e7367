#!/usr/bin/env bash
# apps/data/make_text_corpus.py on this machine's corpus at a small cap (128 KiB, ~1 s): it
# prints sane numbers (Python source has a byte unigram entropy between 3 and 6 bits), writes
# the same bytes twice, refuses a cap that leaves a split empty, and belay's reader accepts
# what it wrote and agrees with its metadata (the hidden case of test_token_dataset.cpp).
#   usage: make_text_corpus_test.sh REPO_ROOT BELAY_TESTS
# Exit 77 (skipped) where there is no dpkg-query: the corpus is defined by Debian packages.
set -u
root=$1 belay_tests=$2
command -v dpkg-query >/dev/null || { echo "skipped: no dpkg-query (not a Debian system)"; exit 77; }
source "$root/tests/shell_test_lib.sh"
script=$root/apps/data/make_text_corpus.py

if python3 "$script" -o "$tmp/a.safetensors" --cap 131072 >"$tmp/out" 2>"$tmp/err"; then
  pass "the script runs: $(tr '\n' ';' <"$tmp/out")"
else
  fail "the script failed: $(cat "$tmp/err")"
fi
train=$(sed -nE 's/^train: ([0-9]+) files, ([0-9]+) tokens$/\2/p' "$tmp/out")
held=$(sed -nE 's/^heldout: ([0-9]+) files, ([0-9]+) tokens$/\2/p' "$tmp/out")
bits=$(sed -nE 's/^train unigram entropy: ([0-9.]+) bits per byte \(([0-9.]+) nats\)$/\1/p' "$tmp/out")
nats=$(sed -nE 's/^train unigram entropy: ([0-9.]+) bits per byte \(([0-9.]+) nats\)$/\2/p' "$tmp/out")
# The cap bounds the tokens taken; the held-out split is about a tenth of the files.
if [ -n "$train" ] && [ -n "$held" ] && [ "$held" -gt 0 ] && [ "$train" -gt "$held" ] &&
  [ $((train + held)) -le 131072 ] && [ $((train + held)) -gt 65536 ]; then
  pass "splits: train $train, held-out $held tokens (cap 131072)"
else
  fail "splits: train '$train', held-out '$held' tokens"
fi
if awk -v b="$bits" -v n="$nats" 'BEGIN { exit !(b > 3 && b < 6 && (n / b - log(2)) ^ 2 < 1e-6) }'; then
  pass "entropy $bits bits = $nats nats per byte"
else
  fail "entropy '$bits' bits, '$nats' nats per byte: not a byte entropy of source code"
fi
python3 "$script" -o "$tmp/b.safetensors" --cap 131072 >/dev/null 2>&1
if cmp -s "$tmp/a.safetensors" "$tmp/b.safetensors"; then pass "the same bytes twice"; else fail "two runs differ"; fi
python3 "$script" -o "$tmp/c.safetensors" --cap 100 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "leaves a split empty" "$tmp/err" && [ ! -e "$tmp/c.safetensors" ]; then
  pass "a cap too small is refused in one line: $(cat "$tmp/err")"
else
  fail "--cap 100: exit $rc, stderr: $(cat "$tmp/err")"
fi
if BELAY_TOKENS_FILE=$tmp/a.safetensors "$belay_tests" "[tokens_script]" >"$tmp/out" 2>&1; then
  pass "belay reads the file and agrees with its metadata"
else
  fail "belay's check of the file: $(tail -20 "$tmp/out")"
fi
exit $((fails != 0))
