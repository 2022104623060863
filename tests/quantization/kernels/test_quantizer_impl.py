"""quantization_kernels: auto picks the Pallas kernels only on NVIDIA GPUs, pallas where it can't run is one line,
xla is always there; the precision plan shows the choice."""

import jax
import pytest

from MaxText import precision, train
from MaxText.model import accounting
from MaxText.quantization.kernels import quantizer_impl
from MaxText.quantization.kernels.quantizer_impl import Kernels
from MaxText.quantization.errors import BackendError
from tests.conftest import REPO
from tests.trainer.test_train import SMALL

ON_NVIDIA = quantizer_impl.unavailable_reason() is None


def test_resolution(monkeypatch):
  assert quantizer_impl.resolve(Kernels.XLA) is Kernels.XLA
  assert quantizer_impl.resolve(Kernels.INTERPRET) is Kernels.INTERPRET
  auto = Kernels.PALLAS if ON_NVIDIA and jax.device_count() == 1 else Kernels.XLA
  assert quantizer_impl.resolve(Kernels.AUTO) is auto
  with pytest.raises(BackendError, match="quantization_kernels must be one of"):
    quantizer_impl.resolve("triton")
  assert quantizer_impl.unavailable_reason("cuda") is None
  assert "not on cpu" in quantizer_impl.unavailable_reason("cpu")
  # On a GPU: auto takes the kernels on one device only (they are not partitioned across a mesh yet).
  monkeypatch.setattr(quantizer_impl, "unavailable_reason", lambda platform=None: None)
  monkeypatch.setattr(jax, "device_count", lambda: 1)
  assert quantizer_impl.resolve(Kernels.AUTO) is Kernels.PALLAS
  monkeypatch.setattr(jax, "device_count", lambda: 8)
  assert quantizer_impl.resolve(Kernels.AUTO) is Kernels.XLA
  assert quantizer_impl.resolve(Kernels.PALLAS) is Kernels.PALLAS


@pytest.mark.skipif(ON_NVIDIA, reason="runs where the kernels cannot")
def test_pallas_where_it_cannot_run_is_one_line(capsys):
  base = [str(REPO / "configs" / "llama3_tiny.yml"), *SMALL, "quantization=te_nvfp4", "dry_run=true"]
  assert train.main(base + ["quantization_kernels=pallas"]) == 2
  err = capsys.readouterr().err
  assert err.strip() == (
    "error: quantization_kernels=pallas: the Pallas Triton quantization kernels run on NVIDIA "
    f"GPUs only, not on {jax.default_backend()}; use quantization_kernels=auto or xla"
  )


def test_the_plan_shows_who_quantizes():
  from tests.trainer.test_train_step import _cfg  # pylint: disable=import-outside-toplevel

  cfg = _cfg("quantization=te_nvfp4", "quantization_kernels=xla")
  text = precision.format_plan(precision.plan_from_config(cfg), cfg, accounting.gemm_flops(cfg))
  assert "gate                       0-1      te_nvfp4                 emulated  xla" in text
  assert "q                          0-1      bf16                     bf16      -" in text
