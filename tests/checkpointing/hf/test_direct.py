"""load_parameters_path naming a Hugging Face directory: on 8 devices (fsdp 4 x tensor 2) every process reads only
the slices its devices hold, and the sharded arrays equal the imported checkpoint's."""

import subprocess
import sys
import textwrap

import pytest

from MaxText import config
from MaxText.checkpointing.hf import HFError, direct
from MaxText.checkpointing.hf.checkpoint import HFCheckpoint
from tests.conftest import HF_TINY, REPO, cpu_subprocess_env

SCRIPT = textwrap.dedent("""
    import sys, jax, numpy as np
    from MaxText import config
    from MaxText.checkpointing import parameters
    from MaxText.model.decoder import abstract_model
    from MaxText.runtime import sharding
    from MaxText.checkpointing.hf import checkpoint, importer
    def check(fused, tag):
      quiet = dict(fused_mlp=fused, log=lambda *_: None)
      out = importer.import_checkpoint(sys.argv[1], sys.argv[2] + "/imported" + tag, **quiet)
      direct_cfg = sys.argv[2] + "/direct" + tag
      importer.import_checkpoint(sys.argv[1], direct_cfg, direct=True, **quiet)
      cfg = config.load(direct_cfg + "/config.yml", ["ici_fsdp_parallelism=4", "ici_tensor_parallelism=2"])
      assert cfg.load_parameters_path == sys.argv[1] and cfg.fused_mlp == fused
      mesh = sharding.make_mesh(cfg)
      _, abstract, _ = abstract_model(cfg)
      shardings = sharding.param_shardings(abstract, mesh)
      template = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
      reads = []
      original = checkpoint.HFCheckpoint.read
      def read(self, name, index=None):
        a = original(self, name, index)
        reads.append((name, a.size, int(np.prod(self.info(name).shape))))
        return a
      checkpoint.HFCheckpoint.read = read
      loaded = parameters.load(cfg, cfg.load_parameters_path, template)
      checkpoint.HFCheckpoint.read = original
      imported = parameters.load(cfg, str(out.parent / "checkpoints" / "0"), template)
      def same(a, b, s):
        assert a.sharding == s and b.sharding == s, (a.sharding, s)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
      jax.tree.map(same, loaded, imported, shardings)
      gate = [r for r in reads if r[0] == "model.layers.0.mlp.gate_proj.weight"]
      assert gate and all(size * 8 == full for _, size, full in gate), gate  # one eighth per read
      embed = [r for r in reads if r[0] == "model.embed_tokens.weight"]
      assert embed and all(size * 8 == full for _, size, full in embed), embed
      return loaded, reads
    loaded, reads = check(False, "")
    fused, _ = check(True, "_fused")  # gate_proj and up_proj joined into one [emb, 2, mlp] kernel, read the same way
    mlp = fused["layers"]["mlp"]["gate_up"]["kernel"]
    for part, name in enumerate(("gate", "up")):
      np.testing.assert_array_equal(np.asarray(mlp)[:, :, part], np.asarray(loaded["layers"]["mlp"][name]["kernel"]))
    print("OK", len(reads), "reads")
""")


def test_direct_load_reads_each_devices_slices_and_equals_the_import(tmp_path):
  result = subprocess.run(
    [sys.executable, "-c", SCRIPT, str(HF_TINY), str(tmp_path)],
    cwd=REPO,
    env=cpu_subprocess_env(8),
    capture_output=True,
    text=True,
    check=False,
  )
  assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


def test_a_config_that_disagrees_with_config_json_is_refused(hf_tiny_import):
  cfg = config.load(hf_tiny_import / "config.yml", ["normalization_layer_epsilon=1e-5"])
  with (
    HFCheckpoint(HF_TINY) as hf,
    pytest.raises(HFError, match="normalization_layer_epsilon=1e-06 but the config has"),
  ):
    direct.check_agrees(cfg, hf)


def test_every_model_key_is_checked_against_config_json(hf_tiny_import):
  """The model keys are config.models.MODEL_KEYS, the activations among them (a Llama checkpoint is SwiGLU)."""
  gelu = config.load(hf_tiny_import / "config.yml", ["mlp_activations=[gelu,linear]", "override_model_config=true"])
  with HFCheckpoint(HF_TINY) as hf:
    direct.check_agrees(config.load(hf_tiny_import / "config.yml"), hf)
    with pytest.raises(HFError, match="mlp_activations=\\['silu', 'linear'\\] but the config has \\['gelu'"):
      direct.check_agrees(gelu, hf)
