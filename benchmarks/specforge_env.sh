# Sourced by benchmarks/gpu_peer_specforge.sh and benchmarks/gpu_train_throughput.sh from the
# checkout root, with $cpu, $pieces and $work set. Off the CPU, SGLang's kit and Eyrie's
# dependencies go on PYTHONPATH (tests/e2e/gpu_env.sh). With pieces, SpecForge's wheels (cut by
# `scripts/gpu_packages.sh --specforge`) are joined, hash-checked and installed into
# /tmp/sf-site, which goes last on PYTHONPATH: the kit's torch and transformers stay first.
if [ -z "$cpu" ]; then
  # shellcheck source=tests/e2e/gpu_env.sh
  source tests/e2e/gpu_env.sh
fi
if [ -n "$pieces" ]; then
  scripts/gpu_join_pieces.sh "$pieces" "$work/wheels"
  python3 -m pip install -q --no-index --no-deps --target /tmp/sf-site "$work"/wheels/*.whl
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/sf-site
fi
