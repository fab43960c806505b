r"""kill -9 trials of a training run: does the next run resume cleanly?

  python experiments/kill_trials.py --trials=20 --workdir=/tmp/kill_trials

A tiny model (one layer, d_model 32, the smallest vocabulary the tokenizer
allows, a checkpoint every CHECKPOINT_EVERY steps) is trained by
experiments/train.py in a subprocess on a small synthetic corpus. Each trial
kills the run with SIGKILL at a random step -- every other trial the moment a
checkpoint write is in progress (its temporary directory exists) -- and
restarts it. Checked, per trial:
  - the restarted run resumes from the newest complete checkpoint on disk
    (it says "resuming from step N"), never from a partial one (it would fail
    to restore, or end with other parameters);
  - the steps lost (last step logged before the kill minus the resumed step)
    are at most one checkpoint interval;
and per chain of kills, once a run completes: its state (parameters,
optimiser state, step) equals bit for bit that of a run never interrupted,
and metrics.jsonl holds every step 0..num_steps exactly once, each line whole.
Prints the counts; exits non-zero if any check failed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHECKPOINT_EVERY = 5
NUM_STEPS = 40
POLL_S = 0.002

# The run's config: configs/tiny.py with these keys replaced (one source for
# the command line and for the harness's own copy of the config).
OVERRIDES = {
    "data.vocab_size": 325, "data.seq_len": 32,
    "model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2,
    "model.num_kv_heads": 2, "model.head_dim": 16, "model.mlp_dim": 64,
    "model.max_len": 32,
    "train.batch_size": 4, "train.num_steps": NUM_STEPS,
    "train.warmup_steps": 2, "train.eval_every": 20, "train.eval_batches": 1,
    "train.checkpoint_every": CHECKPOINT_EVERY, "train.keep_checkpoints": 2,
}


@dataclasses.dataclass
class Counts:
  """What the trials found; `ok` when nothing went wrong."""

  trials: int = 0
  killed_during_write: int = 0
  chains_completed: int = 0
  max_steps_lost: int = 0
  interval: int = CHECKPOINT_EVERY
  over_one_interval_lost: int = 0
  wrong_resume_step: int = 0
  corrupt_chosen: int = 0  # a restart that failed, or ended with other state
  metrics_problems: int = 0

  @property
  def ok(self) -> bool:
    return not (self.over_one_interval_lost or self.wrong_resume_step
                or self.corrupt_chosen or self.metrics_problems)


def write_corpus(path: pathlib.Path) -> None:
  """A synthetic corpus, small enough that its tokenizer trains in a second."""
  rng = np.random.default_rng(0)
  words = [f"w{i}" for i in range(300)]
  path.write_text("\n\n".join(" ".join(rng.choice(words, 40))
                              for _ in range(1500)))


def config(corpus: pathlib.Path):
  """The run's ConfigDict (configs/tiny.py with OVERRIDES)."""
  spec = importlib.util.spec_from_file_location("tiny",
                                                ROOT / "configs" / "tiny.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config()
  for key, value in dict(OVERRIDES, **{"data.path": str(corpus)}).items():
    section, name = key.split(".")
    setattr(cfg[section], name, value)
  return cfg


def train_command(workdir: pathlib.Path, root: pathlib.Path) -> list[str]:
  flags = [f"--config.{k}={v}" for k, v in OVERRIDES.items()]
  return [sys.executable, str(ROOT / "experiments" / "train.py"),
          f"--workdir={workdir}", f"--data_dir={root / 'data'}",
          f"--config.data.path={root / 'corpus.txt'}", *flags]


def environment(root: pathlib.Path) -> dict:
  """Unbuffered output (a killed run's last lines are on disk); a shared
  persistent compilation cache (each restart compiles nothing)."""
  return dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu",
              JAX_COMPILATION_CACHE_DIR=str(root / "jax_cache"),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def complete_steps(workdir: pathlib.Path) -> list[int]:
  """Steps whose checkpoint directory got its final name (orbax renames the
  temporary directory only once the write is complete)."""
  directory = workdir / "checkpoints"
  if not directory.exists():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def write_in_progress(workdir: pathlib.Path) -> bool:
  directory = workdir / "checkpoints"
  return directory.exists() and any(
      "tmp" in p.name for p in directory.iterdir())


def logged_steps(workdir: pathlib.Path) -> list[int]:
  """Steps of the whole lines of metrics.jsonl, in order."""
  path = workdir / "metrics.jsonl"
  if not path.exists():
    return []
  steps = []
  for line in path.read_text().splitlines(keepends=True):
    if line.endswith("\n"):
      steps.append(json.loads(line)["step"])
  return steps


def run_until_killed(command, env, workdir, log, target_step, during_write,
                     rng) -> bool:
  """Starts a run and kills it once it has logged `target_step` (then: at the
  next checkpoint write if `during_write`, else after a random 0-20 ms).

  Returns:
    True if the run was killed, False if it finished first.
  Raises:
    RuntimeError: the run exited with an error.
  """
  with open(log, "a") as out:
    proc = subprocess.Popen(command, env=env, stdout=out, stderr=out)
    deadline = None
    while proc.poll() is None:
      steps = logged_steps(workdir)
      if deadline is None and steps and steps[-1] >= target_step:
        deadline = time.time() + (1e9 if during_write
                                  else rng.uniform(0, 0.02))
      if deadline is not None and (
          time.time() >= deadline or (during_write and
                                      write_in_progress(workdir))):
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True
      time.sleep(POLL_S)
  if proc.returncode != 0:
    raise RuntimeError(f"run exited with {proc.returncode}; see {log}")
  return False


def restore_state(cfg, workdir: pathlib.Path):
  """The final TrainState saved in `workdir`."""
  from lm_decoding.training import train as train_lib  # pylint: disable=g-import-not-at-top
  from lm_decoding.training import train_step  # pylint: disable=g-import-not-at-top
  from lm_decoding.training.checkpoints import Checkpoints  # pylint: disable=g-import-not-at-top
  model_cfg = train_lib.model_config(cfg)
  abstract = train_step.abstract_state(model_cfg,
                                      train_step.make_optimizer(cfg.train))
  with Checkpoints(str(workdir / "checkpoints")) as checkpoints:
    state, _ = checkpoints.restore(abstract)
  return state


def same_state(a, b) -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  return all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def resumed_step(log: pathlib.Path, start: int) -> int:
  """The step the run whose output starts at byte `start` of `log` resumed
  from (0: a fresh start)."""
  text = log.read_bytes()[start:].decode(errors="replace")
  marker = "resuming from step "
  if marker not in text:
    return 0
  return int(text.split(marker, 1)[1].split()[0])


def prepare(root: pathlib.Path) -> None:
  """Writes the corpus under `root` (once); runs there share its data cache,
  compilation cache and reference run."""
  root.mkdir(parents=True, exist_ok=True)
  if not (root / "corpus.txt").exists():
    write_corpus(root / "corpus.txt")


def reference_state(root: pathlib.Path):
  """The final state of a run never interrupted (trained once per root)."""
  reference = root / "reference"
  if complete_steps(reference)[-1:] != [NUM_STEPS]:
    subprocess.run(train_command(reference, root), env=environment(root),
                   check=True, capture_output=True, timeout=600)
  return restore_state(config(root / "corpus.txt"), reference)


def run_trials(root: pathlib.Path, trials: int, seed: int = 0,
               report=print) -> Counts:
  """Runs `trials` kills; chains of runs go under `root`/trials-`seed`."""
  prepare(root)
  cfg = config(root / "corpus.txt")
  env = environment(root)
  rng = np.random.default_rng(seed)
  expected_state = reference_state(root)
  counts, chain = Counts(), 0
  while counts.trials < trials:
    workdir = root / f"trials-{seed}" / f"chain{chain}"
    command, log = train_command(workdir, root), workdir.with_suffix(".log")
    workdir.parent.mkdir(parents=True, exist_ok=True)
    previous_logged, expected_resume = 0, 0
    while True:
      start = log.stat().st_size if log.exists() else 0
      try:
        if counts.trials < trials and previous_logged + 1 < NUM_STEPS:
          target = int(rng.integers(previous_logged + 1,
                                    min(previous_logged + 25, NUM_STEPS)))
          killed = run_until_killed(command, env, workdir, log, target,
                                    during_write=counts.trials % 2 == 0,
                                    rng=rng)
        else:  # enough kills: let the chain finish
          with open(log, "a") as out:
            subprocess.run(command, env=env, check=True, timeout=600,
                           stdout=out, stderr=subprocess.STDOUT)
          killed = False
      except (RuntimeError, subprocess.CalledProcessError):
        counts.corrupt_chosen += 1
        report(f"chain {chain}: a restart failed; see {log}")
        return counts
      got = resumed_step(log, start)
      if got != expected_resume:
        counts.wrong_resume_step += 1
        report(f"chain {chain}: resumed from {got}, expected "
               f"{expected_resume}")
      if not killed:
        break
      counts.trials += 1
      in_write = write_in_progress(workdir)
      counts.killed_during_write += in_write
      steps, logged = complete_steps(workdir), logged_steps(workdir)
      expected_resume = steps[-1] if steps else 0
      previous_logged = logged[-1] if logged else 0
      lost = previous_logged - expected_resume
      counts.max_steps_lost = max(counts.max_steps_lost, lost)
      counts.over_one_interval_lost += lost > CHECKPOINT_EVERY
      report(f"trial {counts.trials}: killed after step {previous_logged} "
             f"({'during a checkpoint write' if in_write else 'between writes'}"
             f"), complete checkpoints {steps}, steps lost {lost}")
    counts.chains_completed += 1
    if logged_steps(workdir) != list(range(NUM_STEPS + 1)):
      counts.metrics_problems += 1
      report(f"chain {chain}: metrics steps {logged_steps(workdir)}")
    if not same_state(restore_state(cfg, workdir), expected_state):
      counts.corrupt_chosen += 1
      report(f"chain {chain}: final state differs from the reference")
    chain += 1
  return counts


def main() -> None:
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--trials", type=int, default=20)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--workdir", required=True,
                      help="a fresh folder for the runs")
  args = parser.parse_args()
  counts = run_trials(pathlib.Path(args.workdir), args.trials, args.seed)
  print(json.dumps(dataclasses.asdict(counts), indent=2))
  print(f"trials {counts.trials}, killed during a checkpoint write "
        f"{counts.killed_during_write}, max steps lost {counts.max_steps_lost} "
        f"(interval {counts.interval}), corrupt checkpoints chosen "
        f"{counts.corrupt_chosen}, wrong resume steps "
        f"{counts.wrong_resume_step}, metrics problems "
        f"{counts.metrics_problems}")
  sys.exit(0 if counts.ok else 1)


if __name__ == "__main__":
  main()
