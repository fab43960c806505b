#!/usr/bin/env bash
# Retrains the shipped pretrained set (lm_decoding/pretrained/) from scratch:
# AR, MDLM and BD3-LM on the tiny config's backbone, the larger evaluator AR
# model with another seed, and the smaller AR drafts of speculative decoding
# (config.drafts), all on the bundled corpus with one tokenizer and one
# training budget (configs/tiny.py; pretrained.member_configs). Each run
# resumes if interrupted; each manifest records its exact command.
#
#   bash experiments/train_pretrained.sh [WORKDIR [MEMBER ...]]
#
# WORKDIR defaults to /tmp/pretrain. Without members the whole set is removed,
# tokenizer included, and retrained. With members (ar mdlm bd3lm evaluator
# draft_small draft_medium) only those are removed and retrained, on the set's
# own tokenizer (train.py --pretrained_tokenizer); the other members and the
# tokenizer stay as they are. With DRY_RUN=1 the commands are printed, not run.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/pretrain}"
shift $(( $# > 0 ))
set_dir=lm_decoding/pretrained
all=(ar mdlm bd3lm evaluator draft_small draft_medium)

# The flags that turn configs/tiny.py into member $1's config.
member_flags() {
  case "$1" in
    ar) flags=(--config.train.objective=ar) ;;
    mdlm) flags=(--config.train.objective=mdlm) ;;
    bd3lm) flags=(--config.train.objective=bd3lm) ;;
    evaluator) flags=(--config.train.objective=ar --config.seed=1
        --config.model.d_model=192 --config.model.num_heads=6
        --config.model.num_kv_heads=6 --config.model.mlp_dim=768) ;;
    draft_small) flags=(--config.train.objective=ar
        --config.model.d_model=64 --config.model.num_layers=1
        --config.model.num_heads=2 --config.model.num_kv_heads=2
        --config.model.mlp_dim=256) ;;
    draft_medium) flags=(--config.train.objective=ar
        --config.model.num_layers=1) ;;
    *) echo "unknown member '$1'; members: ${all[*]}" >&2; exit 2 ;;
  esac
}

run() {
  if [[ -n "${DRY_RUN:-}" ]]; then
    printf '%q ' "$@"; echo
  else
    "$@"
  fi
}

if (( $# > 0 )); then
  members=("$@")
  for name in "${members[@]}"; do member_flags "$name"; done
  if [[ ! -f "$set_dir/tokenizer.model" ]]; then
    echo "no $set_dir/tokenizer.model: retrain the whole set" >&2; exit 2
  fi
  extra=(--pretrained_tokenizer)
  remove=("${members[@]/#/$set_dir/}")
else
  members=("${all[@]}")
  extra=()
  remove=("${all[@]/#/$set_dir/}" "$set_dir/tokenizer.model")
fi
run rm -rf "${remove[@]}"
for name in "${members[@]}"; do
  member_flags "$name"
  run python experiments/train.py --config=configs/tiny.py \
      --workdir="$work/$name" --data_dir="$work/data" \
      --export_pretrained="$name" ${extra[@]+"${extra[@]}"} "${flags[@]}"
done
