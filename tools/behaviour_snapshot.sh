#!/usr/bin/env bash
# A refactor's proof: ~45 belay commands (training runs in every precision, faults, resume,
# rollback, GPT, bad options, --help, validate, sample, accum-check, finfo, export, plot),
# each one's stdout, stderr, exit code and the files it wrote, hashed into one listing.
# Run it on the build before a change and after; `diff` the two listings: a refactor
# that changes no behaviour leaves them byte-identical.
# What varies from run to run by nature (wall times, tokens/s, temporary paths) is masked
# in stdout/stderr before hashing; files (CSV, checkpoints, JSON, SVG) are hashed as they are.
#   usage: tools/behaviour_snapshot.sh path/to/belay OUT_DIR    (writes OUT_DIR/listing.txt)
set -uo pipefail
belay=$(readlink -f "$1")
out=$(mkdir -p "$2" && cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
listing=$out/listing.txt
: >"$listing"
export OMP_NUM_THREADS=1 BELAY_CPU_ISA=${BELAY_CPU_ISA:-baseline}
# The tokens file the build makes, at one relative path from every command's folder (the
# path is in the output and the checkpoints' settings).
cp "$(dirname "$belay")/data/text.safetensors" "$work/text.safetensors"
tokens=../text.safetensors

# Masks what is not behaviour: times, rates, the scratch directory's name.
mask() {
  sed -E -e "s#$work#WORK#g" -e "s#$belay#BELAY#g" \
    -e 's/[0-9.]+(e[+-]?[0-9]+)?(k|M)? tokens\/s/N tokens\/s/g' \
    -e 's/[0-9.]+ (ms|s)\b/N \1/g' -e 's/[0-9.]+ steps\/s/N steps\/s/g' -e 's/[0-9.]+ ?(ms|s)\/step/N \1\/step/g'
}

# run NAME ARGS...: one command in its own folder; its outputs and files into the listing.
run() {
  local name=$1
  shift
  local dir=$work/$name
  mkdir -p "$dir"
  (cd "$dir" && "$belay" "$@" >stdout.raw 2>stderr.raw; echo $? >rc)
  {
    echo "== $name: belay $*"
    echo "rc $(cat "$dir/rc")"
    echo "stdout $(mask <"$dir/stdout.raw" | sha256sum | cut -c1-16)"
    echo "stderr $(mask <"$dir/stderr.raw" | sha256sum | cut -c1-16)"
    (cd "$dir" && find . -type f ! -name stdout.raw ! -name stderr.raw ! -name rc | sort | while read -r f; do
      echo "file $f $(sha256sum <"$f" | cut -c1-16)"
    done)
  } >>"$listing"
  mask <"$dir/stdout.raw" >"$out/$name.stdout"
  mask <"$dir/stderr.raw" >"$out/$name.stderr"
}

# Training runs: the demo, every dtype, the belts and their faults.
run demo train --steps 60 --csv run.csv
run fp16_spikes train --dtype fp16 --steps 60 --spike 10:1e8 --spike 30:1e30 --inject-inf 20 --csv run.csv --clip 1
run bf16_accum train --dtype bf16 --batch 32 --micro-batch 8 --steps 40 --csv run.csv
run fp16_grads_compute train --dtype fp16 --grad-dtype compute --steps 30 --csv run.csv --show-steps
run unfused train --dtype fp16 --unfused --clip 0.5 --steps 30 --csv run.csv
run clip_value train --clip-mode value --clip 0.01 --steps 20 --csv run.csv
run mlp_bf16 train --model mlp --hidden 32 --layers 3 --dtype bf16 --steps 40 --csv run.csv
run sgd_cosine train --optimizer sgd --schedule cosine --warmup 5 --steps 40 --lr 0.05 --csv run.csv
run scaler_knobs train --dtype fp16 --init-scale 1e30 --growth-interval 5 --hysteresis 2 --steps 30 --csv run.csv
run anomaly train --dtype fp16 --detect-anomaly --inject-inf 3 --steps 10
run fp32_ops train --model mlp --dtype fp16 --fp32-ops linear --steps 10 --csv run.csv
run checkpoint train --steps 40 --checkpoint ck.safetensors --checkpoint-every 10 --csv run.csv
# Stop and resume: the resumed run's files beside the uninterrupted one's (demo-like).
run stop_at train --dtype fp16 --steps 40 --stop-at 20 --checkpoint ck.safetensors --csv run.csv
mkdir -p "$work/resume" && cp "$work/stop_at/ck.safetensors" "$work/stop_at/run.csv" "$work/resume/"
run resume train --dtype fp16 --steps 40 --resume ck.safetensors --checkpoint ck.safetensors --csv run.csv
run resume_new_policy_refused train --dtype bf16 --steps 40 --resume ../stop_at/ck.safetensors
# Rollback policies and the skip-rate stop.
run rollback_stop train --dtype fp16 --steps 40 --inject-inf 10 --inject-inf 11 --inject-inf 12 --inject-inf 13 --inject-inf 14 --rollback-on skip-rate --rollback-skip-window 4 --rollback-skip-rate 0.5 --csv run.csv
run rollback_lower_lr train --dtype fp16 --steps 40 --spike 12:1e30 --spike 13:1e30 --spike 14:1e30 --rollback-on nonfinite-loss,skip-rate --rollback-skip-window 4 --rollback-skip-rate 0.5 --rollback-policy lower-lr 0.5 --csv run.csv
run skip_rate_stop train --dtype fp16 --steps 40 --inject-inf 5 --inject-inf 6 --inject-inf 7 --inject-inf 8 --max-skip-rate 0.5 --skip-window 4 --skip-patience 2 --csv run.csv
# The GPT, tiny, on the corpus the build makes.
run gpt train --model gpt --data "$tokens" --layers 1 --width 32 --heads 2 --context 16 --batch 4 --steps 12 --eval-every 6 --eval-windows 4 --csv run.csv --checkpoint gpt.safetensors
run gpt_fp16 train --model gpt --data "$tokens" --layers 1 --width 32 --heads 2 --context 16 --batch 4 --steps 8 --dtype fp16 --inject-inf 3 --micro-batch 2 --csv run.csv
run sample sample --checkpoint ../gpt/gpt.safetensors --prompt "def " --tokens 40 --seed 1
run sample_greedy sample --checkpoint ../gpt/gpt.safetensors --prompt "x" --tokens 20 --temperature 0
run validate_gpt validate --checkpoint ../gpt/gpt.safetensors --data "$tokens" --dtype bf16 --windows 4 --json v.json
# Bad options: one line, exit 2.
run bad_steps train --steps 0
run bad_steps_word train --steps many
run bad_dtype train --dtype fp8
run bad_model train --model transformer
run bad_warmup train --warmup 5 --steps 10
run bad_grad_dtype train --grad-dtype fp64
run bad_clip_mode train --clip-mode both
run bad_rollback_on train --rollback-on sometimes
run bad_rollback_policy train --rollback-policy lower-lr
run bad_spike train --spike 12
run bad_option train --frobnicate
run bad_fp32_ops train --fp32-ops nothing
run bad_eval_every train --eval-every 5
run bad_mlp_layers train --model mlp --layers 1
run bad_gpt_heads train --model gpt --data "$tokens" --width 30 --heads 4 --steps 1
run bad_device train --device tpu
# Help, info, the other subcommands.
run help --help
run train_help train --help
run validate_help validate --help
run finfo finfo 1e-8 70000 0.1
run validate_mlp validate --model mlp --rows 64 --json v.json
run validate_train validate --train 20 --rows 64 --dtype fp16
run accum_check accum-check --model mlp --batch 16
run export export --checkpoint ../checkpoint/ck.safetensors --out w.safetensors
run plot plot ../demo/run.csv ../fp16_spikes/run.csv -o p.svg
echo "$(grep -c '^== ' "$listing") commands; listing: $listing"
