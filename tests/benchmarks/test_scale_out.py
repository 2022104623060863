"""benchmarks/scale_out.py's table: each row's collective data, its ratio to bf16's on the same mesh, the replicated
share and the peak, from the measured figures."""

from benchmarks import scale_out
from tests.conftest import REPO


def test_table_rows_and_ratios_to_bf16_on_the_same_mesh():
  results = {
    ("fsdp 8", "bf16"): {
      "replicated": 0.0007,
      "collectives": {"all-gather": 30e6, "all-reduce": 10e6},
      "peak_bytes": 2**21,
    },
    ("fsdp 8", "te_nvfp4"): {
      "replicated": 0.0007,
      "collectives": {"all-gather": 20e6, "reduce-scatter": 10e6},
      "peak_bytes": 3 * 2**20,
    },
  }
  lines = scale_out.table(results).splitlines()
  assert len(lines) == 4
  assert lines[2] == "| fsdp 8 | bf16 | 0.07% | 40.00 (all-gather 30.00, all-reduce 10.00) | 1.00x | 2.0 |"
  assert lines[3] == "| fsdp 8 | te_nvfp4 | 0.07% | 30.00 (all-gather 20.00, reduce-scatter 10.00) | 0.75x | 3.0 |"


def test_a_config_mistake_is_one_line(tmp_path, capsys):
  assert scale_out.main(["--config", str(tmp_path / "missing.yml")]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: config file not found") and err.count("\n") == 1
  assert scale_out.main(["--config", str(REPO / "configs" / "llama3_tiny.yml"), "no_such_key=1"]) == 2
  assert "no_such_key" in capsys.readouterr().err
