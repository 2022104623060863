"""The site's figures and results tables, drawn from data in the repository: the precision plan of a config (from
MaxText's own plan and FLOPs accounting), parity loss curves (benchmarks/*/curves.json, through benchmarks/parity.py's
own plot and tables), throughput bars (benchmarks/throughput*.json) and gpu_bench parts (benchmarks/results/**.json).

    python docs/_ext/figures.py OUT_DIR            # everything docs/_generated/ gets at build time, into OUT_DIR
    python docs/_ext/figures.py --readme-figure    # redraw docs/images/precision_plan.svg (README's picture)
"""

import io
import json
import pathlib
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

PLAN_CONFIG = "configs/gb200/llama3_8b_nvfp4.yml"  # the picture in README.md and the precision page
README_FIGURE = REPO / "docs" / "images" / "precision_plan.svg"
PARITY_RUNS = ("parity_tiny", "parity_tiny_seeds", "parity_tiny_4over6")
# A format's colour wherever a figure shows it: BF16 grey, FP8 orange, MX purple, NVFP4 green.
COLORS = {"bf16": "#b8bec6", "f32": "#8a939e", "fp8": "#f28e2b", "mx": "#9c6ade", "nvfp4": "#3a9d5d"}


def _svg_settings():
  """SVG output that is the same bytes for the same data and matplotlib (text kept as text, fixed ids, no date)."""
  plt.rcParams.update({"svg.hashsalt": "maxtext-nvfp4-docs", "svg.fonttype": "none", "font.size": 9})


def save_svg(fig, path):
  """`fig` as a reproducible SVG at `path` (the same bytes for the same data and matplotlib version)."""
  buf = io.StringIO()
  fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "docs/_ext/figures.py"}, bbox_inches="tight")
  plt.close(fig)
  pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
  pathlib.Path(path).write_text(buf.getvalue(), encoding="utf-8")


def _color(recipe_name):
  name = recipe_name or "bf16"
  for family in ("nvfp4", "mx", "fp8", "f32"):
    if family in name:
      return COLORS[family]
  return COLORS["bf16"]


def plan_grid(config_path, overrides=()):
  """(rows [(gemm label, [recipe per layer])], lm head recipe, {format: share of training FLOPs}, cfg) of a
  config's precision plan, as the trainer makes and prints it."""
  from MaxText import config as config_lib  # pylint: disable=import-outside-toplevel
  from MaxText import precision  # pylint: disable=import-outside-toplevel
  from MaxText.model import accounting  # pylint: disable=import-outside-toplevel

  cfg = config_lib.load(str(REPO / config_path), overrides)
  plan = precision.plan_from_config(cfg)
  per_layer = {}
  for start, stop, prec in plan.layer_ranges:
    for layer in range(start, stop):
      per_layer[layer] = prec
  layers = range(cfg.base_num_decoder_layers)
  rows = [(g, [per_layer[i][g].recipe.name or "bf16" for i in layers]) for g in ("q", "k", "v", "o")]
  rows.append(("attention core", ["bf16"] * len(layers)))
  rows += [(g, [per_layer[i][g].recipe.name or "bf16" for i in layers]) for g in ("gate", "up", "down")]
  head = "f32" if cfg.logits_dot_in_fp32 else "bf16"
  shares = precision.flops_share(plan, accounting.gemm_flops(cfg))
  return rows, head, shares, cfg


def precision_plan_figure(path, config_path=PLAN_CONFIG, overrides=()):
  """Every GEMM of every decoder layer coloured by its recipe, and the share of training FLOPs per format."""
  _svg_settings()
  rows, head, shares, cfg = plan_grid(config_path, overrides)
  n = cfg.base_num_decoder_layers
  fig, (grid, bar) = plt.subplots(
    2, 1, figsize=(9, 3.6), gridspec_kw={"height_ratios": [len(rows) + 1.2, 1.1], "hspace": 0.55}
  )
  labels = [label for label, _ in rows] + ["lm head"]
  for y, (_, recipes) in enumerate(rows):
    for x, recipe in enumerate(recipes):
      grid.add_patch(plt.Rectangle((x, y), 0.92, 0.84, color=_color(recipe), linewidth=0))
  grid.add_patch(plt.Rectangle((0, len(rows)), n - 0.08, 0.84, color=_color(head), linewidth=0))
  grid.set_xlim(-0.2, n)
  grid.set_ylim(len(labels) + 0.1, -0.2)
  grid.set_yticks([y + 0.42 for y in range(len(labels))], labels)
  grid.set_xticks([x + 0.46 for x in range(0, n, max(1, n // 16))], list(range(0, n, max(1, n // 16))))
  grid.set_xlabel("decoder layer")
  grid.tick_params(length=0)
  for side in grid.spines.values():
    side.set_visible(False)
  recipes = sorted({r for _, rs in rows for r in rs} | {head}, key=lambda r: (r != "bf16", r))
  handles = [plt.Rectangle((0, 0), 1, 1, color=_color(r)) for r in recipes]
  grid.legend(handles, recipes, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
  grid.set_title(f"precision plan of {config_path} (model {cfg.model_name}): the recipe of every GEMM", loc="left")
  left = 0.0
  for label, share in shares.items():
    bar.barh(0, share, left=left, color=_color(label), height=0.6)
    if share > 0.08:
      bar.text(left + share / 2, 0, f"{label} {share:.1%}", ha="center", va="center")
    left += share
  bar.set_xlim(0, 1)
  bar.set_yticks([])
  bar.set_xticks([0, 0.25, 0.5, 0.75, 1], ["0", "25%", "50%", "75%", "100%"])
  bar.set_title("share of the training step's FLOPs in each format", loc="left")
  for side in ("top", "right", "left"):
    bar.spines[side].set_visible(False)
  save_svg(fig, path)


def _parity_curves(record):
  """({mode: {seed: losses}}, {mode: {seed: {step: eval loss}}}, seeds) from a curves.json, either layout (one
  seed as plain lists, or per seed)."""
  seeds = record.get("seeds") or [0]
  losses = {m: v if isinstance(v, dict) else {"0": v} for m, v in record["losses"].items()}
  evals = {m: v if all(isinstance(x, dict) for x in v.values()) else {"0": v} for m, v in record["eval_losses"].items()}
  curves = {m: {int(s): by_seed[str(s)] for s in seeds} for m, by_seed in losses.items()}
  eval_curves = {
    m: {int(s): {int(k): x for k, x in by_seed.get(str(s), {}).items()} for s in seeds} for m, by_seed in evals.items()
  }
  return curves, eval_curves, seeds


def provenance(record, what):
  """One line: what was run where (config, overrides, commit, device, jax) from a benchmark JSON's own record."""
  m = record["machine"]
  overrides = " ".join(record.get("overrides") or [])
  return (
    f"{what}: `{record['config']}{' ' + overrides if overrides else ''}`; commit {m['commit']}, {m['device']}, "
    f"jax {m['jax']} (from the JSON)"
  )


def parity_section(curves_path, figure_path):
  """The figure (benchmarks/parity.py's plot of the committed curves) and the table parity.py writes, recomputed
  from the JSON; returns the Markdown that shows them."""
  from benchmarks import parity  # pylint: disable=import-outside-toplevel

  _svg_settings()
  record = json.loads(pathlib.Path(curves_path).read_text(encoding="utf-8"))
  curves, evals, seeds = _parity_curves(record)
  what = f"{record['steps']} steps, {len(seeds)} seed(s)"
  title = textwrap.fill(provenance(record, what).replace("`", "").replace(" (from the JSON)", ""), 130)
  parity.plot(curves, evals, figure_path, title)
  if len(seeds) == 1:
    table = parity.markdown(parity.analyse({m: c[seeds[0]] for m, c in curves.items()}), 0.3)
  else:
    final = {m: {s: e.get(record["steps"] - 1) for s, e in by_seed.items()} for m, by_seed in evals.items()}
    table = parity.markdown_seeds(parity.analyse_seeds(curves, final, 0.3), 0.3, parity.pairwise(curves, 0.3))
  return f"{provenance(record, what)}.\n\n![{curves_path.parent.name}]({figure_path.name})\n\n{table}\n"


def throughput_section(json_path, figure_path):
  """Bars of tokens/s/device per mode with the ratio to the first mode, from benchmarks/throughput.py's --json."""
  _svg_settings()
  record = json.loads(pathlib.Path(json_path).read_text(encoding="utf-8"))
  rows = record["rows"]
  fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(rows)))
  y = np.arange(len(rows))
  ax.barh(y, [r["tokens_per_device"] for r in rows], color=[_color(r["mode"]) for r in rows])
  for i, r in enumerate(rows):
    ax.text(r["tokens_per_device"], i, f"  {r['ratio']:.2f}x  ({r['median_s'] * 1000:.0f} ms/step)", va="center")
  ax.set_yticks(y, [r["mode"] for r in rows])
  ax.invert_yaxis()
  ax.set_xlabel("tokens/s/device (median step)")
  ax.set_xlim(0, max(r["tokens_per_device"] for r in rows) * 1.45)
  ax.set_title(
    textwrap.fill(provenance(record, "throughput").replace("`", "").replace(" (from the JSON)", ""), 100),
    loc="left",
    fontsize=8,
  )
  for side in ("top", "right"):
    ax.spines[side].set_visible(False)
  save_svg(fig, figure_path)
  table = [
    "| mode | median step (s) | TFLOP/s/device | tokens/s/device | ratio | final loss |",
    "|---|---:|---:|---:|---:|---:|",
  ]
  for r in rows:
    table.append(
      f"| {r['mode']} | {r['median_s']:.4f} | {r['tflops_per_device']:.3f} | {r['tokens_per_device']:.0f} | "
      f"{r['ratio']:.2f}x | {r['final_loss']:.4f} |"
    )
  return f"{provenance(record, 'throughput')}.\n\n![throughput]({figure_path.name})\n\n" + "\n".join(table) + "\n"


def gpu_bench_records(root=REPO / "benchmarks" / "results"):
  """Committed gpu_bench part JSONs (schema 1) under `root`, smoke runs left out, in path order."""
  out = []
  for path in sorted(pathlib.Path(root).rglob("*.json")):
    if "cpu-smoke" in path.parts:
      continue
    record = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(record, dict) and record.get("schema") == 1 and not record.get("smoke"):
      out.append((path, record))
  return out


def gpu_bench_section(path, record, figure_path, root=REPO):
  """A part's metrics table (gpu_bench.markdown, the harness's own) and bars of its ratio metrics per subject;
  `path` is named relative to `root`."""
  from benchmarks import gpu_bench  # pylint: disable=import-outside-toplevel

  _svg_settings()
  ratios = [m for m in record["metrics"] if m["unit"] in ("x", "%")]
  text = f"`{path.relative_to(root)}`: `{record['command']}`, started {record['started']}.\n\n"
  if ratios:
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.3 * len(ratios)))
    y = np.arange(len(ratios))
    colors = [COLORS["nvfp4"] if m["met"] else (COLORS["fp8"] if m["met"] is False else COLORS["bf16"]) for m in ratios]
    ax.barh(y, [m["value"] for m in ratios], color=colors)
    ax.set_yticks(
      y, [f"{m['name']}: {m['subject']}" + (f" (target {m['target']})" if m["target"] else "") for m in ratios]
    )
    ax.invert_yaxis()
    ax.set_title(f"gpu-bench {record['part']}, {record['machine']['device']}: green met, orange not met", loc="left")
    save_svg(fig, figure_path)
    text += f"![{record['part']}]({figure_path.name})\n\n"
  return text + gpu_bench.markdown(record) + "\n"


def generate(out_dir):
  """Every generated figure and results snippet into `out_dir` (docs/_generated at build time); returns the paths
  written."""
  out = pathlib.Path(out_dir)
  (out / "results").mkdir(parents=True, exist_ok=True)
  written = []
  precision_plan_figure(out / "results" / "precision_plan.svg")
  written.append(out / "results" / "precision_plan.svg")
  for name in PARITY_RUNS:
    text = parity_section(REPO / "benchmarks" / name / "curves.json", out / "results" / f"{name}.svg")
    (out / "results" / f"{name}.md").write_text(text, encoding="utf-8")
    written += [out / "results" / f"{name}.svg", out / "results" / f"{name}.md"]
  text = throughput_section(
    REPO / "benchmarks" / "throughput_tiny_cpu.json", out / "results" / "throughput_tiny_cpu.svg"
  )
  (out / "results" / "throughput_tiny_cpu.md").write_text(text, encoding="utf-8")
  written += [out / "results" / "throughput_tiny_cpu.svg", out / "results" / "throughput_tiny_cpu.md"]
  parts = gpu_bench_records()
  sections = [
    gpu_bench_section(p, r, out / "results" / f"gpu_{p.parent.name}_{p.stem}.svg".replace("/", "_")) for p, r in parts
  ]
  text = "\n".join(sections) if sections else "No gpu_bench JSON is committed under `benchmarks/results/` yet.\n"
  (out / "results" / "gpu_bench.md").write_text(text, encoding="utf-8")
  written.append(out / "results" / "gpu_bench.md")
  return written


if __name__ == "__main__":
  if sys.argv[1:] == ["--readme-figure"]:
    precision_plan_figure(README_FIGURE)
    print(README_FIGURE)
  else:
    for p in generate(sys.argv[1] if len(sys.argv) > 1 else REPO / "docs" / "_generated"):
      print(p)
