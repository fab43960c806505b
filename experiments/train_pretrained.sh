#!/usr/bin/env bash
# Retrains the shipped pretrained set (lm_decoding/pretrained/) from scratch:
# AR, MDLM, BD3-LM and uniform diffusion (also self-conditioned) on the tiny config's backbone, the larger evaluator AR
# model with another seed, and the smaller AR drafts of speculative decoding
# (config.drafts), all on the bundled corpus with one tokenizer and one
# training budget (configs/tiny.py; member_recipes.member_configs, which
# train.py --member applies); then the diffusion members adapted from the
# new AR member (member_recipes.ADAPTED_MEMBERS, a tenth of its steps each) and
# their from-scratch controls at equal compute (member_recipes.CONTROL_MEMBERS).
# Each run resumes if interrupted; each manifest
# records its exact command.
#
#   bash experiments/train_pretrained.sh [WORKDIR [MEMBER ...]]
#
# CONFIG (default configs/tiny.py) and SET_DIR (default lm_decoding/pretrained)
# choose another set, e.g. the base set of configs/base.py (about an hour per
# member on 2 CPU cores); STORED_DTYPE how the exports are stored (default
# bfloat16, as both shipped sets are; int8 for the base evaluator; empty: as
# trained, float32):
#
#   CONFIG=configs/base.py SET_DIR=lm_decoding/pretrained/base \
#     bash experiments/train_pretrained.sh /tmp/base ar mdlm
#
# WORKDIR defaults to /tmp/pretrain. Without members the whole set is removed
# first, tokenizer included (the retrained tokenizer differs from the shipped
# one), and retrained. With members (ar mdlm bd3lm uniform uniform_sc evaluator
# draft_small draft_medium bd3lm4_from_ar bd3lm16_from_ar mdlm_from_ar bd3lm4_scratch
# bd3lm16_scratch mdlm_scratch) only those are
# retrained, on the set's own tokenizer
# (train.py --pretrained_tokenizer); each shipped member stays until its
# retrained one replaces it (the export swaps the folder in atomically), so a
# stopped run leaves the set whole. With DRY_RUN=1 the commands are printed,
# not run.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/pretrain}"
shift $(( $# > 0 ))
config="${CONFIG:-configs/tiny.py}"
set_dir="${SET_DIR:-lm_decoding/pretrained}"
# The adapted members come after 'ar', their parent (train.init_from).
all=(ar mdlm bd3lm uniform uniform_sc evaluator draft_small draft_medium
     bd3lm4_from_ar bd3lm16_from_ar mdlm_from_ar bd3lm4_scratch bd3lm16_scratch mdlm_scratch)
stored="${STORED_DTYPE-bfloat16}"
if [[ " bfloat16 int8 " != *" $stored "* && -n "$stored" ]]; then
  echo "STORED_DTYPE='$stored'; allowed: bfloat16, int8 or empty (as trained)" >&2
  exit 2
fi

run() {
  if [[ -n "${DRY_RUN:-}" ]]; then
    printf '%q ' "$@"; echo
  else
    "$@"
  fi
}

if (( $# > 0 )); then
  members=("$@")
  for name in "${members[@]}"; do
    if [[ " ${all[*]} " != *" $name "* ]]; then
      echo "unknown member '$name'; members: ${all[*]}" >&2; exit 2
    fi
  done
  if [[ ! -f "$set_dir/tokenizer.model" ]]; then
    echo "no $set_dir/tokenizer.model: retrain the whole set" >&2; exit 2
  fi
  extra=(--pretrained_tokenizer --export_dir="$set_dir")
else
  members=("${all[@]}")
  extra=(--export_dir="$set_dir")
  run rm -rf "${all[@]/#/$set_dir/}" "$set_dir/tokenizer.model"
fi
if [[ -n "$stored" ]]; then extra+=(--stored_dtype="$stored"); fi
for name in "${members[@]}"; do
  run python experiments/train.py --config="$config" --member="$name" \
      --workdir="$work/$name" --data_dir="$work/data" \
      --export_pretrained="$name" "${extra[@]}"
done
