"""Convergence parity: the same model, data and seeds under several quantization modes; loss curves, a plot
and a table of gaps to the baseline (the first mode), with confidence intervals over seeds.

    python benchmarks/parity.py --config configs/llama3_tiny.yml --steps 1000 --out benchmarks/parity_tiny \\
        [--modes bf16,te_nvfp4,...] [--seeds N] [--parallel K] [--eval-tokens T] [key=value ...]

Seed s (the config's seed, +1, ... for --seeds N) sets parameter init, data order and stochastic rounding
together, and every mode runs with the same seeds, so each seed gives one paired gap per mode. Each
(mode, seed) is a trainer run under OUT/runs/seed<s>/<mode> with checkpoints: rerunning the same command
resumes unfinished runs and keeps finished ones; SIGTERM or Ctrl-C stops cleanly (exit 0 or 130) and a
rerun resumes. --parallel K trains K runs at once as separate processes, each with 1/K of the CPU cores
and of the GPU memory (same numbers as one at a time). Writes OUT/curves.json, OUT/parity.md, OUT/parity.png.

The table, per mode (gaps paired: mode - baseline on the same seed):
  final loss      mean training loss over the last 2% of steps (at least 10), mean over seeds
  gap             mean(mode - baseline) over the converged regime (last --converged fraction of steps), in
                  nats and in % of the baseline's mean there; with N >= 2 seeds, its mean over seeds and the
                  95% confidence interval of that mean (Student t, N - 1 degrees of freedom, from the
                  per-seed gaps), and whether the interval excludes 0
  eval gap        the same for the held-out loss after the last step (the trainer's eval over
                  --eval-tokens tokens, or the whole eval split when it has fewer)
  With one seed the table also has:
  noise band      the baseline's step-to-step standard deviation over the converged regime
  gap spread      the standard deviation of the step-wise paired difference over that regime
  tokens ratio    steps the mode needs for its smoothed loss to reach the baseline's smoothed final loss,
                  over the steps the baseline needs (> 1 = needs more tokens; "> X" = not reached)
With N >= 2 a second table ranks each pair of non-baseline modes only where the paired interval of their
difference excludes 0.
"""

import itertools
import json
import math
import os
import pathlib
import signal
import sys
import textwrap

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import modes as modes_lib, packed, stats  # noqa: E402
from MaxText import config as config_lib, errors, storage  # noqa: E402
from MaxText.errors import UserError  # noqa: E402
from MaxText.runtime import environment, preemption  # noqa: E402

DEFAULT_MODES = [
  "bf16",
  "te_fp8_currentscaling",
  "te_nvfp4",
  "te_nvfp4_no_rht",
  "mxfp4",
  "te_nvfp4:disable_stochastic_rounding=true",
  "te_nvfp4:disable_2d_quantization=true",
  "te_nvfp4:quantization_scope=all_dense",
]
CONFIDENCE = 0.95
COST_HEAD = " tokens/s/device (vs baseline) | step memory/device, GiB (XLA) |"


def smooth(losses, window):
  """Trailing moving average (the first points average what exists so far)."""
  c = np.cumsum(np.insert(np.asarray(losses, np.float64), 0, 0.0))
  idx = np.arange(1, len(losses) + 1)
  lo = np.maximum(idx - window, 0)
  return (c[idx] - c[lo]) / (idx - lo)


def first_step_reaching(curve, target):
  hits = np.flatnonzero(curve <= target)
  return int(hits[0]) + 1 if hits.size else None


def analyse(curves: dict, converged=0.3):
  """Rows of the single-seed parity table from {mode: per-step losses}; the first mode is the baseline."""
  labels = list(curves)
  base = np.asarray(curves[labels[0]], np.float64)
  n = len(base)
  tail = slice(n - max(1, int(round(n * converged))), n)
  final = slice(n - max(10, n // 50), n) if n >= 10 else slice(0, n)
  window = max(1, n // 20)
  base_smooth = smooth(base, window)
  target = base_smooth[-1]
  base_steps = first_step_reaching(base_smooth, target)
  noise = float(np.std(base[tail]))
  rows = []
  for label in labels:
    losses = np.asarray(curves[label], np.float64)
    if len(losses) != n:
      raise ValueError(f"{label}: {len(losses)} steps, baseline {n}")
    gap = float(np.mean(losses[tail] - base[tail]))
    steps = first_step_reaching(smooth(losses, window), target)
    rows.append(
      {
        "mode": label,
        "final_loss": float(np.mean(losses[final])),
        "gap_nats": gap,
        "gap_spread_nats": float(np.std(losses[tail] - base[tail])),
        "gap_percent": 100.0 * gap / float(np.mean(base[tail])),
        "noise_band_nats": noise,
        "tokens_ratio": steps / base_steps if steps else None,
        "tokens_ratio_lower_bound": None if steps else n / base_steps,
      }
    )
  return rows


def _interval(values):
  mean, half = stats.mean_ci(values, CONFIDENCE)
  return {"mean": mean, "ci": half, "verdict": stats.verdict(mean, half), "per_seed": [float(v) for v in values]}


def analyse_seeds(curves: dict, final_evals=None, converged=0.3):
  """Rows of the table from {mode: {seed: losses}} and {mode: {seed: eval loss after the last step}}.

  Each row has the single-seed fields of the first seed's analysis (N = 1 keeps the old table) and, per
  quantity, {"mean", "ci" (95% half-width, None for one seed), "verdict", "per_seed"}: gap_nats,
  gap_percent, final_loss, eval_loss and eval_gap_nats / eval_gap_percent (None without eval losses).
  """
  labels = list(curves)
  seeds = list(curves[labels[0]])
  per_seed = [{r["mode"]: r for r in analyse({m: curves[m][s] for m in labels}, converged)} for s in seeds]
  evals = final_evals or {}
  have_eval = all(evals.get(m, {}).get(s) is not None for m in labels for s in seeds)
  rows = []
  for label in labels:
    row = dict(per_seed[0][label], seeds=seeds)
    for key in ("gap_nats", "gap_percent", "final_loss"):
      row[key + "_seeds"] = _interval([p[label][key] for p in per_seed])
    if have_eval:
      base = np.array([evals[labels[0]][s] for s in seeds], np.float64)
      mine = np.array([evals[label][s] for s in seeds], np.float64)
      row["eval_loss_seeds"] = _interval(mine)
      row["eval_gap_nats_seeds"] = _interval(mine - base)
      row["eval_gap_percent_seeds"] = _interval(100.0 * (mine - base) / base)
    rows.append(row)
  return rows


def pairwise(curves: dict, converged=0.3):
  """[(a, b, interval of gap(a) - gap(b))] for every pair of non-baseline modes, paired by seed."""
  labels = list(curves)
  seeds = list(curves[labels[0]])
  gaps = {m: [] for m in labels}
  for s in seeds:
    for r in analyse({m: curves[m][s] for m in labels}, converged):
      gaps[r["mode"]].append(r["gap_nats"])
  return [(a, b, _interval(np.subtract(gaps[a], gaps[b]))) for a, b in itertools.combinations(labels[1:], 2)]


def _fmt(interval, digits=4, unit=""):
  if interval["ci"] is None:
    return f"{interval['mean']:+.{digits}f}{unit}"
  return f"{interval['mean']:+.{digits}f}{unit} ± {interval['ci']:.{digits}f}"


def markdown(rows, converged):
  """The single-seed table (and the final eval loss where there is one)."""
  base = rows[0]["mode"]
  has_eval = "eval_loss_seeds" in rows[0]
  lines = [
    f"| mode | final loss | gap to {base} (last {converged:.0%}) | gap % | noise band (baseline std) | "
    f"gap spread (paired std) | tokens to reach {base}'s final loss |"
    + (" final eval loss | eval gap | eval gap % |" if has_eval else "")
    + (COST_HEAD if "step_memory_gib" in rows[0] else ""),
    "|---|---:|---:|---:|---:|---:|---:|"
    + ("---:|---:|---:|" if has_eval else "")
    + ("---:|---:|" if "step_memory_gib" in rows[0] else ""),
  ]
  for r in rows:
    ratio = f"{r['tokens_ratio']:.2f}x" if r["tokens_ratio"] else f"> {r['tokens_ratio_lower_bound']:.2f}x"
    line = (
      f"| {r['mode']} | {r['final_loss']:.4f} | {r['gap_nats']:+.4f} | {r['gap_percent']:+.2f}% | "
      f"±{r['noise_band_nats']:.4f} | ±{r['gap_spread_nats']:.4f} | {ratio} |"
    )
    if has_eval:
      line += (
        f" {r['eval_loss_seeds']['mean']:.4f} | {r['eval_gap_nats_seeds']['mean']:+.4f} | "
        f"{r['eval_gap_percent_seeds']['mean']:+.2f}% |"
      )
    if "step_memory_gib" in r:
      line += _cost_cells(r, rows[0])
    lines.append(line)
  return "\n".join(lines)


def _seeds_text(interval, digits=4):
  return ", ".join(f"{v:+.{digits}f}" for v in interval["per_seed"])


def markdown_seeds(rows, converged, pairs=()):
  """The N-seed table: mean gaps with 95% CIs and per-seed gaps, then the pairwise ranking."""
  base, n = rows[0]["mode"], len(rows[0]["seeds"])
  has_eval = "eval_loss_seeds" in rows[0]
  head = (
    f"| mode | final loss | gap to {base} (last {converged:.0%}), nats, mean ± 95% CI | gap % | "
    f"per-seed gaps | gap ≠ 0? |"
  )
  if has_eval:
    head += " final eval loss | eval gap, nats | eval gap % | per-seed eval gaps | eval gap ≠ 0? |"
  costs = "step_memory_gib" in rows[0]
  head += COST_HEAD if costs else ""
  lines = [
    f"{n} seeds {', '.join(map(str, rows[0]['seeds']))}; intervals: Student t, {n - 1} degrees of freedom, "
    f"over the per-seed paired gaps.",
    "",
    head,
    "|---|---:|---:|---:|---|---|" + ("---:|---:|---:|---|---|" if has_eval else "") + ("---:|---:|" if costs else ""),
  ]
  for r in rows:
    line = (
      f"| {r['mode']} | {r['final_loss_seeds']['mean']:.4f} | {_fmt(r['gap_nats_seeds'])} | "
      f"{_fmt(r['gap_percent_seeds'], 2, '%')} | {_seeds_text(r['gap_nats_seeds'])} | "
      f"{r['gap_nats_seeds']['verdict'] if r['mode'] != base else '-'} |"
    )
    if has_eval:
      line += (
        f" {r['eval_loss_seeds']['mean']:.4f} | {_fmt(r['eval_gap_nats_seeds'])} | "
        f"{_fmt(r['eval_gap_percent_seeds'], 2, '%')} | {_seeds_text(r['eval_gap_nats_seeds'])} | "
        f"{r['eval_gap_nats_seeds']['verdict'] if r['mode'] != base else '-'} |"
      )
    lines.append(line + (_cost_cells(r, rows[0]) if costs else ""))
  if pairs:
    lines += [
      "",
      "Pairwise (training gap of A minus that of B, paired by seed; a ranking only where the interval excludes 0):",
      "",
      "| A - B | nats, mean ± 95% CI | per seed | ranking |",
      "|---|---:|---|---|",
    ]
    for a, b, iv in pairs:
      rank = {"> 0": f"{b} better", "< 0": f"{a} better"}.get(iv["verdict"], "not separable")
      lines.append(f"| {a} - {b} | {_fmt(iv)} | {_seeds_text(iv)} | {rank} |")
  return "\n".join(lines)


def _mean_band(curves_by_seed, window):
  """Per step: mean over seeds of the smoothed curves and the 95% half-width (zeros for one seed)."""
  stack = np.stack([smooth(c, window) for c in curves_by_seed])
  n = stack.shape[0]
  if n == 1:
    return stack[0], np.zeros(stack.shape[1])
  half = stats.t_quantile(CONFIDENCE, n - 1) * np.std(stack, axis=0, ddof=1) / math.sqrt(n)
  return stack.mean(axis=0), half


def plot(curves, eval_curves, path, title):
  """Top: each mode's smoothed training loss (mean over seeds), eval dots; bottom: mean smoothed gap and CI band."""
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  labels = list(curves)
  seeds = list(curves[labels[0]])
  n = len(curves[labels[0]][seeds[0]])
  window, steps = max(1, n // 20), np.arange(n)
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 9), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
  base = [np.asarray(curves[labels[0]][s], np.float64) for s in seeds]
  for i, label in enumerate(labels):
    color, runs = f"C{i}", [np.asarray(curves[label][s], np.float64) for s in seeds]
    if len(seeds) == 1:
      top.plot(steps, runs[0], color=color, alpha=0.15, linewidth=0.5)
    top.plot(steps, _mean_band(runs, window)[0], color=color, label=label, linewidth=1.2)
    points = sorted((step, v) for s in seeds for step, v in eval_curves.get(label, {}).get(s, {}).items())
    if points:
      top.plot(*zip(*points), "o", color=color, markersize=3)
    gap, half = _mean_band([r - b for r, b in zip(runs, base)], window)
    bottom.plot(steps, gap, color=color, label=label)
    if len(seeds) > 1 and i:
      bottom.fill_between(steps, gap - half, gap + half, color=color, alpha=0.15, linewidth=0)
  top.set_ylabel(
    "training loss (nats), smoothed" + (f", mean of {len(seeds)} seeds" if len(seeds) > 1 else "") + "; dots: eval loss"
  )
  top.set_title(title, fontsize=9)
  top.legend(fontsize=8)
  tail = np.concatenate([np.asarray(curves[m][s][n // 3 :]) for m in labels for s in seeds])
  top.set_ylim(float(np.percentile(tail, 0.5)) - 0.1, float(np.max(_mean_band(base, window)[0][n // 20 :])) + 0.2)
  bottom.axhline(0, color="k", linewidth=0.5)
  bottom.set_ylabel(
    f"smoothed gap to {labels[0]} (nats)" + (f"\nmean over {len(seeds)} seeds, band: 95% CI" if len(seeds) > 1 else "")
  )
  bottom.set_xlabel("step")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


class Run:
  """One (mode, seed) trainer run: its config, trainer arguments and run directory under OUT/runs/seed<s>/."""

  def __init__(self, mode, seed, cfg, train_args, run_dir, settings):
    self.mode, self.seed, self.cfg, self.train_args, self.run_dir, self.settings = (
      mode,
      seed,
      cfg,
      train_args,
      run_dir,
      settings,
    )

  @property
  def label(self):
    return f"{self.mode} seed {self.seed}"

  def done(self, steps):
    records = modes_lib.read_metrics(self.run_dir)
    return all(s in records for s in range(steps))


def plan_runs(config_path, overrides, modes, steps, num_seeds, eval_tokens, out):
  """Every (mode, seed) Run, seed-major (a stop leaves whole pairs), all configs checked before any trains."""
  first = modes_lib.load_configs(config_path, overrides, modes[:1])[0][1]
  seeds = [first.seed + i for i in range(num_seeds)]
  eval_keys = []
  if first.eval_interval or first.grain_eval_files or first.eval_split:
    batch_tokens = _batch_tokens(first)
    eval_keys = [f"eval_interval={steps}", f"eval_steps={max(1, math.ceil(eval_tokens / batch_tokens))}"]
  runs = []
  for seed in seeds:
    base = out / "runs" / f"seed{seed}"
    fixed = [
      *eval_keys,
      *overrides,
      f"seed={seed}",
      f"steps={steps}",
      f"base_output_directory={base}",
      f"checkpoint_period={max(10, steps // 10)}",
      "enable_checkpointing=true",
      "max_num_checkpoints_to_keep=1",
      "enable_tensorboard=false",
    ]
    for mode, (_, cfg) in zip(modes, modes_lib.load_configs(config_path, fixed, modes)):
      train_args = [
        str(config_path),
        *fixed,
        f"run_name={modes_lib.run_dir_name(mode)}",
        *modes_lib.parse_mode(mode)[1],
      ]
      settings = {
        "config": str(config_path),
        "overrides": list(overrides),
        "mode": mode,
        "seed": seed,
        "steps": steps,
        "eval": eval_keys,
      }
      runs.append(Run(mode, seed, cfg, train_args, base / modes_lib.run_dir_name(mode), settings))
  return seeds, runs


def _batch_tokens(cfg):
  import jax  # pylint: disable=import-outside-toplevel

  try:
    return config_lib.RunShape.of(cfg, jax.device_count()).tokens_per_step
  except config_lib.ConfigError as e:
    modes_lib.fail(str(e))


def _check_settings(run):
  """A run directory from other settings (or of unknown ones) is an error, not a curve to relabel."""
  if not (run.run_dir / "metrics.jsonl").exists():
    return
  path = run.run_dir / "parity_settings.json"
  stored = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
  if stored != run.settings:
    want = run.settings
    was = (
      f"config {stored.get('config')} with overrides {' '.join(stored.get('overrides', [])) or '(none)'}, "
      f"{stored.get('steps', '?')} steps"
      if isinstance(stored, dict)
      else "unknown settings"
    )
    modes_lib.fail(
      f"{run.run_dir} holds a {want['mode']} run from {was}, not {want['config']} with "
      f"{' '.join(want['overrides']) or '(none)'}, {want['steps']} steps; use another --out or delete "
      f"{run.run_dir}"
    )


def _stopped(run_label):
  print(
    f"parity: {preemption.signal_name()} stopped {run_label}; rerun the same command to resume (finished runs "
    "are kept)",
    flush=True,
  )
  return preemption.exit_code()


def train_runs(runs, steps, parallel, environ=None):
  """Train every unfinished Run; None when all finished, else the exit code of a clean stop."""
  for run in runs:
    _check_settings(run)
  todo = [r for r in runs if not r.done(steps)]
  for run in todo:
    run.run_dir.mkdir(parents=True, exist_ok=True)
    (run.run_dir / "parity_settings.json").write_text(json.dumps(run.settings) + "\n", encoding="utf-8")
  with preemption.installed():
    if parallel > 1 and todo:
      return _train_packed(todo, steps, parallel, environ)
    for run in todo:
      if preemption.requested():  # between two runs: the next one has not started
        return _stopped(f"before {run.label}")
      print(f"=== {run.label}", flush=True)
      modes_lib.train_mode(run.cfg)
      if preemption.requested():
        return _stopped(run.label)
  return None


def _train_packed(todo, steps, parallel, environ):
  jobs = [packed.Job(run.label, run.train_args) for run in todo]
  stop_signal = lambda: signal.SIGINT if preemption.exit_code() == 130 else signal.SIGTERM
  codes = packed.run(jobs, parallel, preemption.requested, stop_signal, environ=environ)
  if preemption.requested():
    return _stopped(
      ", ".join(j.label for j in jobs if j.label in codes and not _run_of(todo, j).done(steps)) or "between runs"
    )
  for job in jobs:
    if codes.get(job.label, 0) != 0:
      modes_lib.fail(f"{job.label} exited with code {codes[job.label]}: {job.last_line.strip() or 'no output'}")
  return None


def _run_of(todo, job):
  return next(r for r in todo if r.label == job.label)


def collect(runs, steps, modes, seeds):
  """({mode: {seed: losses}}, {mode: {seed: {step: eval loss}}}, {mode: {seed: eval tokens of the last eval}},
  {mode: {seed: median tokens/s per device}})."""
  curves, evals, eval_tokens, speed = ({m: {} for m in modes} for _ in range(4))
  for run in runs:
    records = modes_lib.read_metrics(run.run_dir)
    missing = [s for s in range(steps) if s not in records]
    if missing:
      modes_lib.fail(f"{run.run_dir}/metrics.jsonl lacks step {missing[0]} of {steps}; rerun to resume it")
    curves[run.mode][run.seed] = [records[s]["loss"] for s in range(steps)]
    evals[run.mode][run.seed] = {s: r["eval_loss"] for s, r in records.items() if "eval_loss" in r and s < steps}
    eval_tokens[run.mode][run.seed] = records[steps - 1].get("eval_weights")
    # The median step: the steps that compiled (the first of each start, a resume's too) are a few outliers.
    speed[run.mode][run.seed] = float(np.median([records[s]["Tokens/s/device"] for s in range(steps)]))
  assert all(list(curves[m]) == seeds for m in modes)
  return curves, evals, eval_tokens, speed


def step_memory_gib(runs, modes):
  """{mode: GiB per device of its train step (XLA's memory analysis of the step compiled for this machine's
  devices: arguments, outputs and temporaries at their peak)}, one compile per mode."""
  import jax  # pylint: disable=import-outside-toplevel  (jax and the model load only where they are used)

  from MaxText.trainer import aot_step  # pylint: disable=import-outside-toplevel

  first = {}
  for run in runs:
    first.setdefault(run.mode, run.cfg)
  return {
    m: aot_step.compile_step(first[m], jax.devices(), compile_only=False).memory["peak_bytes"] / 2**30 for m in modes
  }


def measured(rows, speed, memory):
  """The table's rows with each mode's tokens/s per device (mean over seeds of each run's median step) and step
  memory beside its loss."""
  for row in rows:
    row["tokens_per_s_per_device"] = float(np.mean([speed[row["mode"]][s] for s in row["seeds"]]))
    row["step_memory_gib"] = memory[row["mode"]]
  return rows


def _cost_cells(row, base):
  ratio = row["tokens_per_s_per_device"] / base["tokens_per_s_per_device"]
  return f" {row['tokens_per_s_per_device']:,.0f} ({ratio:.2f}x) | {row['step_memory_gib']:.2f} |"


def scope_note(model, steps, device):
  """What the gaps may be compared with: the published recipe's figure is Llama 3 8B over 10k steps on GPUs."""
  published = "published recipe: NVFP4 within 0.026 nats of FP8, Llama 3 8B over 10k steps on GB200s"
  if model == "llama3-8b" and steps >= 10_000:
    return f"The gaps compare with the {published}."
  return f"A small-model check ({model}, {steps} steps on {device}): its gaps are not comparable with the {published}."


def write_outputs(out, args, overrides, seeds, collected, memory, cfg):
  curves, evals, eval_tokens, speed = collected
  final = {m: {s: e.get(args.steps - 1) for s, e in by_seed.items()} for m, by_seed in evals.items()}
  rows = measured(analyse_seeds(curves, final, args.converged), speed, memory)
  info = modes_lib.machine()
  tokens = sorted({int(t) for by_seed in eval_tokens.values() for t in by_seed.values() if t})
  header = (
    f"parity: {modes_lib.described(args.config, overrides)}, {args.steps} steps, {len(seeds)} seed(s); commit "
    f"{info['commit']}, {info['device']}" + (f"; final eval over {'/'.join(map(str, tokens))} tokens" if tokens else "")
  )
  if len(seeds) == 1:
    table = markdown(rows, args.converged)
  else:
    table = markdown_seeds(rows, args.converged, pairwise(curves, args.converged))
  model = cfg.model_name or pathlib.Path(args.config).stem
  table += (
    f"\n\n{scope_note(model, args.steps, info['device'])} Tokens/s: each run's median step, mean over seeds, "
    f"{args.parallel} run(s) at once; step memory: XLA's memory analysis of the compiled train step."
  )
  storage.write_text(
    out / "curves.json",
    json.dumps(
      {
        "machine": info,
        "config": modes_lib.recorded_path(args.config),
        "overrides": overrides,
        "steps": args.steps,
        "seeds": seeds,
        "losses": {m: {str(s): v for s, v in by_seed.items()} for m, by_seed in curves.items()},
        "eval_losses": {
          m: {str(s): {str(k): v for k, v in e.items()} for s, e in by_seed.items()} for m, by_seed in evals.items()
        },
        "eval_tokens": {m: {str(s): v for s, v in by_seed.items()} for m, by_seed in eval_tokens.items()},
        "table": rows,
      },
      indent=1,
    )
    + "\n",
  )
  storage.write_text(out / "parity.md", f"{header}\n\n{table}\n\n![loss curves and gaps](parity.png)\n")
  title = (
    textwrap.fill(header, 130)
    + "\n"
    + (
      f"mean smoothed gap over {len(seeds)} seeds with its 95% CI band"
      if len(seeds) > 1
      else "one seed: no confidence interval"
    )
  )
  plot(curves, evals, out / "parity.png", title)
  print(f"\n{header}\n\n{table}\n\nwrote {out}/curves.json, parity.md, parity.png", flush=True)


def main(argv=None):
  parser = modes_lib.argument_parser(__doc__, DEFAULT_MODES, default_steps=1000)
  parser.add_argument("--converged", type=float, default=0.3, help="fraction of final steps for the gap")
  parser.add_argument("--out", type=config_lib.absolute_path, default="parity_out")
  parser.add_argument("--seeds", type=int, default=1, help="seeds per mode (paired across modes)")
  parser.add_argument(
    "--parallel",
    type=int,
    default=1,
    help="(mode, seed) runs trained at once, each its own process with 1/K of the cores and GPU memory",
  )
  parser.add_argument("--eval-tokens", type=int, default=100_000, help="tokens of the final held-out eval")
  args, overrides = parser.parse_known_args(argv)
  if args.steps < 2 or not 0 < args.converged <= 1:
    modes_lib.fail("--steps must be >= 2 and --converged in (0, 1]")
  if args.seeds < 1 or args.parallel < 1 or args.eval_tokens < 1:
    modes_lib.fail("--seeds, --parallel and --eval-tokens must be >= 1")
  child_environ = dict(os.environ)
  if args.parallel > 1:  # this process only reads the device count and name: it takes no share of a GPU's memory
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  out = pathlib.Path(args.out)
  try:  # before jax starts (XLA aborts on a flag it doesn't know) and before any run trains
    environment.check()
    storage.check_output_dir(out, "--out")
  except UserError as e:
    modes_lib.fail(str(e))
  seeds, runs = plan_runs(args.config, overrides, args.modes, args.steps, args.seeds, args.eval_tokens, out)
  out.mkdir(parents=True, exist_ok=True)
  stopped = train_runs(runs, args.steps, args.parallel, child_environ)
  if stopped is not None:
    return stopped
  collected = collect(runs, args.steps, args.modes, seeds)
  memory = step_memory_gib(runs, args.modes)
  with preemption.deferred():  # the three files whole, or (a stop signal) as they were
    try:
      write_outputs(out, args, overrides, seeds, collected, memory, runs[0].cfg)
    except OSError as e:  # a full disk, a quota: one line (the runs are kept; rerunning writes the table)
      modes_lib.fail(str(errors.storage_fault(e) or e))
  return 0


if __name__ == "__main__":
  with preemption.exit_on_signals("stopped outside a run (none was cut short); rerun the same command to go on"):
    sys.exit(main())
