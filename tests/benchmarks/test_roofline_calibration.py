"""benchmarks/roofline_calibration.py: a measured gpu-bench run scored against the predictions written before it,
metric by metric (same part, name and subject), inside or outside each predicted range; and the H100's measured
rows it checks the model on."""

import json

from benchmarks import roofline_calibration as rc


def test_a_measured_run_is_scored_against_its_predictions(tmp_path, capsys):
  predictions = tmp_path / "h200.json"
  metrics = [
    rc._metric("throughput-8b", "device time per step", "bf16", 200.0, "ms", 180.0, 230.0),  # pylint: disable=protected-access
    rc._metric("quantize", "time", "nvfp4 1x16 (x) [pallas]", 0.5, "ms"),  # pylint: disable=protected-access
    rc._metric("attention", "fwd+bwd per layer", "cudnn", 4.0, "ms", 3.5, 4.5),  # pylint: disable=protected-access
  ]
  predictions.write_text(json.dumps({"metrics": metrics}))
  measured = tmp_path / "measured"
  measured.mkdir()
  part = lambda rows: json.dumps({"metrics": [{"name": n, "subject": s, "value": v} for n, s, v in rows]})
  (measured / "throughput-8b.json").write_text(part([("device time per step", "bf16", 250.0), ("MFU", "bf16", 0.5)]))
  (measured / "quantize.json").write_text(part([("time", "nvfp4 1x16 (x) [pallas]", 0.6)]))
  rows = rc.score(measured, predictions)  # the attention part did not run: not scored
  assert rows == [
    ("throughput-8b", "device time per step", "bf16", 200.0, 250.0, 1.25, False),
    ("quantize", "time", "nvfp4 1x16 (x) [pallas]", 0.5, 0.6, 0.6 / 0.5, None),
  ]
  rc.print_score(rows)
  assert "| throughput-8b | device time per step | bf16 | 200 | 250 | 1.25 | False |" in capsys.readouterr().out


def test_the_measured_quantizer_rows_are_every_quantizer_the_h100_timed():
  rows = rc.measured_quantizer_ms()
  assert len(rows) == 26 and round(rows["nvfp4 RHT+SR (dy_t) [pallas]"], 4) == 1.0472
  assert not any(name.startswith("copy") for name in rows)


def test_the_predictions_of_the_gpu_the_run_names_are_found(tmp_path):
  predictions = tmp_path / "predictions"
  predictions.mkdir()
  (predictions / "h200.json").write_text(json.dumps({"metrics": []}))
  measured = tmp_path / "measured"
  measured.mkdir()
  (measured / "quantize.json").write_text(json.dumps({"machine": {"device": "1x NVIDIA H200 141GB HBM3e (gpu)"}}))
  assert rc.predictions_for(measured, predictions) == predictions / "h200.json"
  (measured / "quantize.json").write_text(json.dumps({"machine": {"device": "1x NVIDIA A100-SXM4-80GB (gpu)"}}))
  assert rc.predictions_for(measured, predictions) is None and rc.score(measured, predictions) == []
