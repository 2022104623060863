"""Convergence parity: the same model, data and seed under several quantization modes; loss curves, a plot
and a table of gaps to the baseline (the first mode).

    python benchmarks/parity.py --config configs/llama3_tiny.yml --steps 1000 --out benchmarks/parity_tiny \\
        [--modes bf16,te_nvfp4,...] [key=value ...]

Each mode is a trainer run under OUT/runs/<mode> with checkpoints, so an interrupted harness rerun
with the same arguments resumes (finished modes are not rerun). Writes OUT/curves.json,
OUT/parity.md and OUT/parity.png. The table, per mode:
  final loss      mean training loss over the last 2% of steps (at least 10)
  gap             mean(mode - baseline) over the converged regime (last --converged fraction of steps),
                  in nats and in % of the baseline's mean there
  noise band      the baseline's step-to-step standard deviation over that regime: gaps well inside it
                  are not distinguishable from noise on this many steps
  gap spread      the standard deviation of the step-wise difference (mode - baseline) over that regime:
                  both see the same batches, so this paired spread is the tighter yardstick
  tokens ratio    steps the mode needs for its smoothed loss to reach the baseline's smoothed final loss,
                  over the steps the baseline needs (> 1 = needs more tokens; "> X" = not reached)
"""

import json
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import modes as modes_lib  # noqa: E402

DEFAULT_MODES = ["bf16", "te_fp8_currentscaling", "te_nvfp4", "te_nvfp4_no_rht", "mxfp4",
                 "te_nvfp4:disable_stochastic_rounding=true", "te_nvfp4:disable_2d_quantization=true",
                 "te_nvfp4:quantization_scope=all_dense"]


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
  """Rows of the parity table from {mode: per-step losses}; the first mode is the baseline."""
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
    rows.append({"mode": label, "final_loss": float(np.mean(losses[final])), "gap_nats": gap,
                 "gap_spread_nats": float(np.std(losses[tail] - base[tail])),
                 "gap_percent": 100.0 * gap / float(np.mean(base[tail])), "noise_band_nats": noise,
                 "tokens_ratio": steps / base_steps if steps else None,
                 "tokens_ratio_lower_bound": None if steps else n / base_steps})
  return rows


def markdown(rows, converged):
  base = rows[0]["mode"]
  lines = [f"| mode | final loss | gap to {base} (last {converged:.0%}) | gap % | noise band (baseline std) | "
           f"gap spread (paired std) | tokens to reach {base}'s final loss |", "|---|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    ratio = f"{r['tokens_ratio']:.2f}x" if r["tokens_ratio"] else f"> {r['tokens_ratio_lower_bound']:.2f}x"
    lines.append(f"| {r['mode']} | {r['final_loss']:.4f} | {r['gap_nats']:+.4f} | {r['gap_percent']:+.2f}% | "
                 f"±{r['noise_band_nats']:.4f} | ±{r['gap_spread_nats']:.4f} | {ratio} |")
  return "\n".join(lines)


def plot(curves, eval_curves, path, title):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  labels = list(curves)
  n = len(curves[labels[0]])
  window = max(1, n // 20)
  base_smooth = smooth(curves[labels[0]], window)
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 9), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
  for i, label in enumerate(labels):
    color = f"C{i}"
    steps = np.arange(n)
    top.plot(steps, curves[label], color=color, alpha=0.15, linewidth=0.5)
    top.plot(steps, smooth(curves[label], window), color=color, label=label, linewidth=1.2)
    if label in eval_curves and eval_curves[label]:
      es, ev = zip(*sorted(eval_curves[label].items()))
      top.plot(es, ev, "o", color=color, markersize=3)
    bottom.plot(steps, smooth(curves[label], window) - base_smooth, color=color, label=label)
  top.set_ylabel("training loss (nats); dots: eval loss")
  top.set_title(title)
  top.legend(fontsize=8)
  tail = np.concatenate([np.asarray(c[n // 3:]) for c in curves.values()])
  top.set_ylim(float(np.percentile(tail, 0.5)) - 0.1, float(np.max(smooth(curves[labels[0]], window)[n // 20:])) + 0.2)
  bottom.axhline(0, color="k", linewidth=0.5)
  bottom.set_ylabel(f"smoothed gap to {labels[0]} (nats)")
  bottom.set_xlabel("step")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def run_modes(config_path, overrides, modes, steps, out):
  """Train every mode (resuming unfinished ones); ({mode: losses}, {mode: {step: eval loss}}).

  Every mode's config is checked before the first trains; a run directory is reused only for the
  settings it was trained with (OUT/runs/<mode>/parity_settings.json), never relabelled.
  """
  configs = modes_lib.load_configs(config_path, [*overrides, f"steps={steps}", f"base_output_directory={out / 'runs'}",
                                                 f"checkpoint_period={max(10, steps // 10)}", "enable_checkpointing=true",
                                                 "max_num_checkpoints_to_keep=1", "enable_tensorboard=false"], modes)
  curves, evals = {}, {}
  for mode, (label, cfg) in zip(modes, configs):
    run_dir = out / "runs" / modes_lib.run_dir_name(mode)
    settings = {"config": str(config_path), "overrides": list(overrides), "mode": mode}
    _check_settings(run_dir, settings)
    records = modes_lib.read_metrics(run_dir)
    if len(records) < steps or any(s not in records for s in range(steps)):
      run_dir.mkdir(parents=True, exist_ok=True)
      (run_dir / "parity_settings.json").write_text(json.dumps(settings) + "\n", encoding="utf-8")
      print(f"=== {label}", flush=True)
      modes_lib.train_mode(cfg)
      records = modes_lib.read_metrics(run_dir)
    curves[mode] = [records[s]["loss"] for s in range(steps)]
    evals[mode] = {s: r["eval_loss"] for s, r in records.items() if "eval_loss" in r and s < steps}
  return curves, evals


def _check_settings(run_dir, settings):
  """A run directory from other settings (or of unknown ones) is an error, not a curve to relabel."""
  if not (run_dir / "metrics.jsonl").exists():
    return
  path = run_dir / "parity_settings.json"
  stored = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
  if stored != settings:
    was = (f"config {stored['config']} with overrides {' '.join(stored['overrides']) or '(none)'}" if stored
           else "unknown settings")
    modes_lib.fail(f"{run_dir} holds a {settings['mode']} run from {was}, not {settings['config']} with "
                   f"{' '.join(settings['overrides']) or '(none)'}; use another --out or delete {run_dir}")


def main(argv=None):
  parser = modes_lib.argument_parser(__doc__, DEFAULT_MODES, default_steps=1000)
  parser.add_argument("--converged", type=float, default=0.3, help="fraction of final steps for the gap")
  parser.add_argument("--out", default="parity_out")
  args, overrides = parser.parse_known_args(argv)
  if args.steps < 2 or not 0 < args.converged <= 1:
    modes_lib.fail("--steps must be >= 2 and --converged in (0, 1]")
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  curves, evals = run_modes(args.config, overrides, args.modes, args.steps, out)
  rows = analyse(curves, args.converged)
  info = modes_lib.machine()
  header = (f"parity: {' '.join([args.config, *overrides])}, {args.steps} steps; commit {info['commit']}, "
            f"{info['device']}")
  table = markdown(rows, args.converged)
  (out / "curves.json").write_text(json.dumps({"machine": info, "config": args.config, "overrides": overrides,
                                               "steps": args.steps, "losses": curves,
                                               "eval_losses": {m: {str(k): v for k, v in e.items()}
                                                               for m, e in evals.items()},
                                               "table": rows}, indent=1) + "\n", encoding="utf-8")
  (out / "parity.md").write_text(f"{header}\n\n{table}\n", encoding="utf-8")
  plot(curves, evals, out / "parity.png", header)
  print(f"\n{header}\n\n{table}\n\nwrote {out}/curves.json, parity.md, parity.png")
  return 0


if __name__ == "__main__":
  sys.exit(main())
