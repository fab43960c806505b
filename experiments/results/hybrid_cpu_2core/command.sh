python experiments/compare_decoding.py --config=configs/tiny.py --workdir=/tmp/hybrid_job \
  --config.compare.output_lengths='(32,128)' --config.compare.batch_sizes='(1,8)' \
  --config.compare.decoders='("AR cached | ar | model=ar",
  "MDLM K={steps} | mdlm | model=mdlm | steps=32",
  "threshold tau={threshold} block={block_length} cache={kv_cache} | threshold | model=mdlm | threshold=0.9 block_length=32 kv_cache=dual",
  "speculative small draft gamma={gamma} | speculative | target=ar draft=draft_small | gamma=4",
  "prompt lookup gamma={gamma} | prompt_lookup | target=ar | gamma=4",
  "MDLM K={draft_steps} skeleton + AR polish p>={threshold} gamma={gamma} | skeleton_polish | target=ar draft=mdlm | draft_steps=32 threshold=0.01 gamma=8")'
