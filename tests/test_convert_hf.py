"""convert_hf's command line: which parameters to-hf exports (a run's newest checkpoint with its recorded config, a
config's run, else its load_parameters_path) and its one-line refusals."""

import pathlib

import pytest

from MaxText import convert_hf
from MaxText.checkpointing.hf import HFError
from tests.conftest import HF_TINY


def test_export_sources(hf_tiny_import, tmp_path):
  config_yml = hf_tiny_import / "config.yml"
  cfg, step_dir = convert_hf.export_source(config_yml)
  assert step_dir == pathlib.Path(cfg.load_parameters_path) and cfg.base_emb_dim == 64
  cfg, step_dir = convert_hf.export_source(hf_tiny_import)  # the import's directory: its checkpoints/0, config.yml
  assert step_dir == hf_tiny_import / "checkpoints" / "0" and cfg.vocab_size == 384
  cfg, _ = convert_hf.export_source(hf_tiny_import, ["base_output_directory=/elsewhere"])
  assert cfg.base_output_directory == "/elsewhere"
  with pytest.raises(HFError, match="is a Hugging Face directory already"):
    convert_hf.export_source(config_yml, [f"load_parameters_path={HF_TINY}"])
  with pytest.raises(HFError, match="nothing to export"):
    convert_hf.export_source(config_yml, ["load_parameters_path="])
  with pytest.raises(HFError, match="no checkpoints/<step> and no config.yml"):
    convert_hf.export_source(tmp_path)


@pytest.mark.parametrize(
  "argv, message",
  [
    (["to-hf"], "the following arguments are required"),
    (["to-hf", "x.yml", "out", "--dtype", "int8"], "invalid choice: 'int8'"),
    (["export", "a", "b"], "invalid choice: 'export'"),
  ],
)
def test_bad_command_lines_are_one_line_errors(capsys, argv, message):
  assert convert_hf.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
